"""A run in the formats other benchmark tools read: pytest-benchmark's saved runs and
github-action-benchmark's ``customSmallerIsBetter`` input (``tpbench export``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from tpbench import store
from tpbench.analysis.stats import CONFIDENCE, bootstrap_ci, per_step, range_confidence, repeat_values, windows_of
from tpbench.compare import GateError, swept_keys
from tpbench.suite import CASE_KEYS, Case, SuiteError, measured_overrides, parse, with_overrides

EXPORT_FORMATS = ("pytest-benchmark", "custom-smaller-is-better")
# What a case's numbers are (``--metric``): wall time per step, or the ranks' CPU time per step.
EXPORT_METRICS = ("step_ms", "cpu_ms")
# The pytest-benchmark storage layout we write (unchanged in what `pytest-benchmark compare` reads since 3.x).
PYTEST_BENCHMARK_VERSION = "5.1.0"


@dataclass(frozen=True)
class Export:
    document: Any
    skipped: list[str]  # labels of cases without data (failed, pending)

    @property
    def text(self) -> str:
        """The document as it is printed or written: indented JSON, no NaN."""
        return json.dumps(self.document, indent=2, allow_nan=False) + "\n"

    def write(self, path: Path) -> Path:
        """Write the document to the file the user named (``export -o``; see ``store.write_output``)."""
        return store.write_output(path, self.text.encode())


def _export_cases(
    loaded: store.Loaded, metric: str, metric_name: str
) -> tuple[list[tuple[Case, str, np.ndarray, np.ndarray]], list[str]]:
    """Done cases with their label, per-step values of ``metric`` (ms: ``step_ms`` the slowest rank's,
    ``cpu_ms`` the mean over ranks) and per-repeat values (ms, ``stats.repeat_values``: the values the
    gate, the report and, for ``step_ms``, the summary's ``median_ms`` use). ``metric_name``: how a
    run without ``metric`` names it (``export_run``)."""
    params = {cid: c.params for cid, c in loaded.record.cases.items()}
    names = dict(zip(loaded.cases["case_id"], loaded.cases["label"]))
    if not loaded.steps.empty and (metric not in loaded.steps or loaded.steps[metric].isna().all()):
        raise GateError(f"{loaded.run_dir}: {metric_name} {metric} was not recorded in this run's steps")
    steps = per_step(loaded.steps, metric) if not loaded.steps.empty else None
    per_repeat = repeat_values(loaded.steps, metric, windows_of(params)) if steps is not None else None
    out, skipped = [], []
    for cid, p in params.items():
        # A step without a value (NaN) is not a measurement: JSON has no NaN, and statistics skip it.
        data = steps[(steps["case_id"] == cid) & steps[metric].notna()] if steps is not None else None
        if data is None or data.empty:
            skipped.append(names[cid])
            continue
        reps = per_repeat[per_repeat["case_id"] == cid][metric].dropna().to_numpy()
        out.append((Case.from_params(p), names[cid], data[metric].to_numpy(dtype=float), reps))
    if not out:
        # An empty document exits 0 and a CI job would upload it: refused, as compare refuses nothing to compare.
        said = store.states_words(loaded.run_dir, (c.status for c in loaded.record.cases.values()))
        raise GateError(f"{loaded.run_dir}: nothing to export: no case has timed steps ({said})")
    return out, skipped


def export_pytest_benchmark(run_dir: str | Path, metric: str = "step_ms", metric_name: str = "metric") -> Export:
    """pytest-benchmark's saved-run JSON: one benchmark per case over its timed steps, in seconds.

    Benchmarks are named ``ALGORITHM[key=value-…]`` after the keys the suite sweeps (``_grid_keys``:
    a case keeps its name whichever cases finished or a ``--filter`` kept), then the run's
    ``--set`` of what the case measures (``_set_params``: runs of one suite at other settings must
    not save benchmarks of one name), grouped by suite, with those keys under ``params``, so
    ``pytest-benchmark compare`` and its ``--group-by`` options work on tpbench runs. With ``metric``
    ``cpu_ms`` the group is ``SUITE (cpu_ms)``: a comparison must not set CPU time against another
    run's wall time.
    """
    loaded = store.load(run_dir)
    env = loaded.environment
    suite = loaded.record.suite.name
    cases, skipped = _export_cases(loaded, metric, metric_name)
    keys = _grid_keys(loaded)
    group = suite if metric == "step_ms" else f"{suite} ({metric})"
    sets = measured_overrides(loaded.record.suite.overrides)
    shown = {"algorithm", *keys}
    benchmarks = [_pytest_benchmark(loaded, group, keys, _set_params(c[0], sets, shown), metric, *c) for c in cases]
    git = env.get("git") or {}
    document = {
        "machine_info": {
            "node": env.get("hostname"),
            "processor": env.get("cpu_model"),
            "python_version": env.get("python"),
            "platform": env.get("platform"),
            "cpu": {"brand_raw": env.get("cpu_model"), "count": env.get("cpu_count")},
            "tpbench_environment": env,
        },
        "commit_info": {
            "id": git.get("commit") or "unversioned",
            "dirty": bool(git.get("dirty")),
            "project": "tpbench",
            "branch": None,
            "time": None,
            "author_time": None,
        },
        "benchmarks": benchmarks,
        "datetime": loaded.record.created,
        "version": PYTEST_BENCHMARK_VERSION,
    }
    return Export(document, skipped)


def _pytest_benchmark(
    loaded: store.Loaded,
    suite: str,
    keys: list[str],
    sets: Mapping[str, str],
    metric: str,
    case: Case,
    label: str,
    ms: np.ndarray,
    reps: np.ndarray,
) -> dict[str, Any]:
    """One case as a pytest-benchmark benchmark: its timed steps' statistics in seconds (``suite``:
    its group; ``keys``: the keys the suite sweeps; ``sets``: the run's ``--set`` that its name adds)."""
    s = np.sort(ms / 1e3)
    q1, q3 = (float(np.quantile(s, q)) for q in (0.25, 0.75))
    iqr = q3 - q1
    mean, std = float(s.mean()), float(s.std(ddof=1)) if s.size > 1 else 0.0
    inside = s[(s >= q1 - 1.5 * iqr) & (s <= q3 + 1.5 * iqr)]
    # A key that does not apply to the case (None: shard_buckets of DDP) is left out, as in its label.
    params = {k: getattr(case, k) for k in keys if k != "algorithm" and getattr(case, k) is not None} | dict(sets)
    param = "-".join(f"{k}={v}" for k, v in params.items())
    name = case.algorithm + (f"[{param}]" if param else "")
    return {
        "group": suite,
        "name": name,
        "fullname": f"{suite}::{name}",
        "params": params or None,
        "param": param or None,
        "extra_info": {
            "case_id": case.case_id,
            "label": label,
            "run_id": loaded.record.run_id,
            "metric": metric,
            "repeat_medians_ms": reps.tolist(),
            "case": case.params(),
        },
        "options": {
            "timer": "tpbench",
            "warmup": case.warmup_steps,
            "min_rounds": case.steps,
            "disable_gc": False,
            "max_time": None,
            "min_time": None,
            "precision": None,
            "confidence": None,
        },
        "stats": {
            "min": float(s[0]),
            "max": float(s[-1]),
            "mean": mean,
            "stddev": std,
            "rounds": int(s.size),
            "median": float(np.median(s)),
            "iqr": iqr,
            "q1": q1,
            "q3": q3,
            "iqr_outliers": int(s.size - inside.size),
            "stddev_outliers": int(((s < mean - std) | (s > mean + std)).sum()),
            "outliers": f"{int(((s < mean - std) | (s > mean + std)).sum())};{int(s.size - inside.size)}",
            "ld15iqr": float(inside[0]),
            "hd15iqr": float(inside[-1]),
            "ops": 1 / mean,
            "total": float(s.sum()),
            "data": s.tolist(),
            "iterations": 1,
        },
    }


def _interval(lo: float, hi: float) -> str:
    """An interval as an entry's ``range`` and its ``extra`` write it: "[16.64, 40.58]"."""
    return f"[{lo:.4g}, {hi:.4g}]"


def _interval_words(lo: float, hi: float, repeats: int) -> str:
    """The median's interval in an entry's ``extra``: with 2 to 5 repeats it is their range, which holds
    the median with less than 95 % confidence (``stats.range_confidence``), and the entry says so
    rather than "95% CI" (the report's step-time caption does alike)."""
    if range_confidence(repeats) < CONFIDENCE:
        return f"range {_interval(lo, hi)} ms (holds the median with {100 * range_confidence(repeats):.4g}% confidence)"
    return f"{CONFIDENCE:.0%} CI {_interval(lo, hi)} ms"


def export_custom_smaller_is_better(
    run_dir: str | Path, metric: str = "step_ms", metric_name: str = "metric"
) -> Export:
    """github-action-benchmark's ``customSmallerIsBetter`` input: [{name, unit, value, range, extra}].

    The value is the median of the per-repeat medians (what the gate compares), the range its
    bootstrap CI, ``[lo, hi]`` as ``extra`` says it, so a dashboard shows the same number the gate
    judged. The format has no field for a version, so ``extra`` names the tpbench (and torch) that
    measured the run: a dashboard's step between two points may be a change of tpbench, not of the
    code. A run made with ``--set`` names it (``_settings``), so that runs of one suite at other
    settings are series apart. With ``metric`` ``cpu_ms`` each name ends in `` [cpu_ms]``: a chart
    of CPU time is not wall time's.
    """
    loaded = store.load(run_dir)
    suite = loaded.record.suite.name
    cases, skipped = _export_cases(loaded, metric, metric_name)
    env = loaded.environment
    tag = "" if metric == "step_ms" else f" [{metric}]"
    sets = measured_overrides(loaded.record.suite.overrides)
    keys = _grid_keys(loaded)
    shown = {"algorithm", *keys}  # what each case's label already says
    labels = [case.label(keys) for case, *_ in cases]
    if len(set(labels)) < len(labels):  # cases told apart only by workload parameters: the run's labels
        labels = [label for _, label, *_ in cases]
    entries = []
    for (case, _label, _ms, reps), label in zip(cases, labels):
        lo, hi = bootstrap_ci(reps)
        # The interval itself: github-action-benchmark shows the range verbatim beside the value, and
        # a median's interval is lopsided where the repeats are, so "± half-width" would misplace it.
        # One repeat has no interval: no range (the format's field is optional), rather than "± 0".
        ranged = {"range": _interval(lo, hi)} if np.isfinite(lo) else {}
        ci = _interval_words(lo, hi, reps.size) if ranged else "no CI (one repeat)"
        entries.append(
            {
                "name": f"{suite}/{label}{_settings(_set_params(case, sets, shown))}{tag}",
                "unit": "ms",
                "value": round(float(np.median(reps)), 6),
                **ranged,
                "extra": (
                    f"{ci} over {reps.size} repeats; case {case.case_id}; "
                    f"run {loaded.record.run_id}; tpbench {env.get('tpbench')}; torch {env.get('torch')}; "
                    f"{case.world_size}×{case.backend}/{case.device}"
                ),
            }
        )
    return Export(entries, skipped)


def _grid_keys(loaded: store.Loaded) -> list[str]:
    """The keys a series name shows: those the suite's grid sweeps (after ``--set``), in schema order,
    not those that vary among the cases a ``--filter`` kept. Named by the kept cases, runs of one
    suite with ``--filter bucket_cap_mb=1`` and ``=4`` both exported "zero/hook_with_zero_step", one
    series of two settings, and a case's name changed with the filter beside it. A suite text this
    tpbench no longer parses falls back to the run's own varying keys, but for workload parameters
    (``workload.KEY``): they vary only beside ``workload``, which names the case already, and
    ``Case`` has no attribute of theirs (two workloads sharing a key, mlp's and resnet's ``classes``)."""
    source = loaded.record.suite
    try:
        grid = with_overrides(parse(source.text, source.path or "<suite>"), source.overrides)
    except SuiteError:
        return [k for k in swept_keys(loaded.record) if not k.startswith("workload.")]
    swept = {k for k, values in grid.sweep.items() if len(values) > 1}
    return [k for k in CASE_KEYS if k in swept]


def _set_params(case: Case, sets: Mapping[str, str], shown: set[str]) -> dict[str, str]:
    """The run's ``--set`` of what ``case`` measures (``suite.measured_overrides``), key → value as
    the command line writes it, for each format's names to end in; empty without: a name without it
    is the name a run without --set exports, which dashboards keep their series by. A key the name
    already shows (``shown``), or one moot for the case (None: shard_buckets for DDP), tells no
    series apart and is left out."""
    return {k: v for k, v in sets.items() if k not in shown and getattr(case, k, "") is not None}


def _settings(said: Mapping[str, str]) -> str:
    """A ``customSmallerIsBetter`` name's end for ``_set_params``: " (--set bucket_cap_mb=4,
    shard_buckets=true)", or "" without."""
    return f" (--set {', '.join(f'{k}={v}' for k, v in said.items())})" if said else ""


def export_run(run_dir: str | Path, fmt: str, metric: str = "step_ms", metric_name: str = "metric") -> Export:
    """``run_dir`` in the format ``fmt`` (``EXPORT_FORMATS``). Its errors name the parameters, as
    ``compare.compare``'s do; ``metric_name`` is how a run that did not record ``metric`` names it,
    ``--metric`` for ``tpbench export``, whose choices refuse an unknown format or metric first."""
    if metric not in EXPORT_METRICS:
        raise GateError(f"metric {metric!r}: expected one of {', '.join(EXPORT_METRICS)}")
    if fmt == "pytest-benchmark":
        return export_pytest_benchmark(run_dir, metric, metric_name)
    if fmt == "custom-smaller-is-better":
        return export_custom_smaller_is_better(run_dir, metric, metric_name)
    raise GateError(f"fmt {fmt!r}: expected one of {', '.join(EXPORT_FORMATS)}")
