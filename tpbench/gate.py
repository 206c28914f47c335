"""Performance gates: compare runs, call a verdict per case, turn it into an exit code; exports.

A gate that fires on noise gets switched off, so a regression is called only on strong evidence:
per case, the ratio of medians candidate/baseline computed over *repeats* (steps within a repeat
are not independent), with a bootstrap confidence interval whose lower end must exceed
1 + threshold. Verdicts:

- ``regression``   CI lower bound > 1 + threshold
- ``improvement``  CI upper bound < 1 − threshold
- ``pass``         CI inside [1 − threshold, 1 + threshold]: any change is within tolerance
- ``inconclusive`` the CI straddles a threshold (too wide to decide), or too few repeats
- ``incomparable`` the environments differ in what matters (``environment.COMPARABLE_KEYS``) or
                   the case ran on a different world (world size, backend, device)
- ``missing``      the candidate's case has no counterpart in the baseline, or no data

Exit codes: 0 pass or improvement, 1 regression, 3 incomparable or missing, 4 inconclusive with
``fail_on_inconclusive`` (0 otherwise); a regression outranks the rest when verdicts are mixed.

Each side may be several runs (several stored baselines; the rounds of ``tpbench gate``). Their
repeats are pooled for the point estimate and the interval comes from a two-stage bootstrap
(runs, then repeats within runs), so the spread *between* runs, the main source of false alarms
with stored baselines, widens the interval. A single candidate run against several baselines is
judged against their spread: its draws are also scaled by the baselines' run-to-run effects
(``analysis.stats.hierarchical_ratio_ci``). The rounds of ``tpbench gate`` are paired (round i of
both sides ran back to back): each round gives one log ratio of run medians, in which whatever
the machine was doing then cancels, and the interval is Student's t over the rounds, calibrated
for the handful of rounds a gate has (``analysis.stats.paired_ratio_ci``).

``run_gate`` runs baseline and candidate in the same job, rounds interleaved, each side through
its own ``tpbench`` command in a subprocess (a Python environment, a source tree, or any command
prefix): that is how two versions of the code under test are measured side by side, and why this
module never imports the worker or the launcher.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from tpbench import store
from tpbench.analysis.stats import (
    CONFIDENCE, bootstrap_ci, hierarchical_ratio_ci, paired_ratio_ci, repeat_medians, slowest_rank)
from tpbench.environment import COMPARABLE_KEYS
from tpbench.suite import Case, varying_keys

PASS, REGRESSION, IMPROVEMENT, INCONCLUSIVE, INCOMPARABLE, MISSING = (
    "pass", "regression", "improvement", "inconclusive", "incomparable", "missing")
EXIT_PASS, EXIT_REGRESSION, EXIT_USAGE, EXIT_INCOMPARABLE, EXIT_INCONCLUSIVE = 0, 1, 2, 3, 4

# Fewer per-repeat values than this on a side and no bootstrap interval means anything.
MIN_REPEATS = 3
# Parameters that do not change what a case measures, so runs that differ in them still compare:
# how many repeats, how long to wait, what is captured after the timed steps, and the injected
# slowdown (which exists precisely to be compared against a run without it).
IGNORED_FOR_MATCHING = frozenset({"case_id", "timeout_s", "repeats", "slowdown_pct", "profiler_steps", "nvml_interval_ms"})
# Parameters of the world a case ran on: a case that matches on everything else but these is the
# same case on another machine shape, which is incomparable rather than missing.
WORLD_KEYS = ("world_size", "backend", "device", "ranks_per_node")


class GateError(ValueError):
    """A gate that cannot be set up as asked (bad threshold, unknown metric, side not found): exit 2."""


class SideError(RuntimeError):
    """A side's sweep failed or left no run behind, so there is nothing to compare: exit 3."""


def parse_threshold(text: str) -> float:
    """``5%`` or ``0.05`` → 0.05. A fraction, because the verdict compares ratios with 1 ± it."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise GateError(f"--threshold {text}: expected a percentage like 5% or a fraction like 0.05") from None
    if not 0 <= value < 1:
        raise GateError(f"--threshold {text}: expected a value in [0%, 100%)")
    return value


def judge(lo: float, hi: float, threshold: float) -> str:
    """The verdict of one ratio interval (see the module docstring)."""
    if lo > 1 + threshold:
        return REGRESSION
    if hi < 1 - threshold:
        return IMPROVEMENT
    if lo >= 1 - threshold and hi <= 1 + threshold:
        return PASS
    return INCONCLUSIVE


@dataclass(frozen=True)
class CaseResult:
    """One candidate case judged against the baseline."""

    case_id: str
    label: str
    verdict: str
    reason: str = ""
    baseline_median: float | None = None
    candidate_median: float | None = None
    ratio: float | None = None
    ci_lo: float | None = None
    ci_hi: float | None = None
    baseline_repeats: int = 0
    candidate_repeats: int = 0
    baseline_runs: int = 0
    candidate_runs: int = 0


@dataclass(frozen=True)
class Comparison:
    """Everything a gate decided, ready to render as text, Markdown or JSON."""

    metric: str
    threshold: float
    confidence: float
    fail_on_inconclusive: bool
    baseline_runs: list[str]
    candidate_runs: list[str]
    environment_differences: list[str]
    cases: list[CaseResult]
    paired: bool = False
    baseline_commits: list[str] = field(default_factory=list)
    candidate_commits: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """The worst verdict: a confirmed regression outranks not being able to judge some case."""
        found = {c.verdict for c in self.cases}
        for v in (REGRESSION, INCOMPARABLE, MISSING, INCONCLUSIVE, IMPROVEMENT):
            if v in found:
                return v
        return PASS

    @property
    def exit_code(self) -> int:
        return {
            REGRESSION: EXIT_REGRESSION,
            INCOMPARABLE: EXIT_INCOMPARABLE,
            MISSING: EXIT_INCOMPARABLE,
            INCONCLUSIVE: EXIT_INCONCLUSIVE if self.fail_on_inconclusive else EXIT_PASS,
        }.get(self.verdict, EXIT_PASS)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"verdict": self.verdict, "exit_code": self.exit_code}


# ---------------------------------------------------------------- comparing runs


@dataclass(frozen=True)
class _RunData:
    """What the comparison needs of one run: its cases and per-repeat values of the metric."""

    dir: Path
    environment: dict[str, Any]
    params: dict[str, dict[str, Any]]  # case_id → params
    status: dict[str, str]  # case_id → status
    values: dict[str, np.ndarray]  # case_id → per-repeat medians of the metric (done cases)


def _read_run(run_dir: Path, metric: str) -> _RunData:
    loaded = store.load(run_dir)
    values: dict[str, np.ndarray] = {}
    if not loaded.steps.empty:
        if metric not in loaded.steps.columns:
            numeric = sorted(c for c in loaded.steps.select_dtypes("number").columns if c not in ("repeat", "rank", "step"))
            raise GateError(f"--metric {metric}: not recorded in {run_dir}; expected one of {', '.join(numeric)}")
        per_repeat = repeat_medians(loaded.steps, metric).dropna(subset=[metric])
        values = {cid: g[metric].to_numpy(dtype=float) for cid, g in per_repeat.groupby("case_id")}
    cases = loaded.meta["cases"]
    return _RunData(
        Path(run_dir), loaded.environment,
        {cid: entry["params"] for cid, entry in cases.items()},
        {cid: entry["status"] for cid, entry in cases.items()},
        values,
    )


def _same(a: dict[str, Any], b: dict[str, Any], ignore: frozenset[str]) -> bool:
    """Equal on the keys both have: a key added by a newer tpbench must not orphan every case."""
    return all(a[k] == b[k] for k in a.keys() & b.keys() if k not in ignore)


def _counterpart(params: dict[str, Any], case_id: str, run: _RunData) -> tuple[str | None, str]:
    """The baseline run's case that measures the same thing, or why there is none."""
    if case_id in run.params:
        return case_id, ""
    for cid, p in run.params.items():
        if _same(params, p, IGNORED_FOR_MATCHING):
            return cid, ""
    for cid, p in run.params.items():
        if _same(params, p, IGNORED_FOR_MATCHING | frozenset(WORLD_KEYS)):
            diff = ", ".join(f"{k} {p.get(k)} vs {params.get(k)}" for k in WORLD_KEYS if p.get(k) != params.get(k))
            return None, f"different world: {diff}"
    return None, ""


def environment_differences(baseline: dict[str, Any], candidate: dict[str, Any], ignore: Iterable[str] = ()) -> list[str]:
    """The comparable keys on which two fingerprints differ, as 'key: baseline vs candidate'."""
    skip = set(ignore)
    return [f"{k}: {baseline.get(k)} vs {candidate.get(k)}" for k in COMPARABLE_KEYS
            if k not in skip and baseline.get(k) != candidate.get(k)]


def _commit(env: dict[str, Any]) -> str:
    git = env.get("git") or {}
    commit = (git.get("commit") or "unknown")[:10]
    return commit + ("+dirty" if git.get("dirty") else "")


def compare_runs(
    baseline: Sequence[str | Path],
    candidate: Sequence[str | Path],
    *,
    metric: str = "step_ms",
    threshold: float = 0.05,
    fail_on_inconclusive: bool = False,
    ignore_env: Iterable[str] = (),
    confidence: float = CONFIDENCE,
    paired: bool = False,
) -> Comparison:
    """Judge every case of the candidate run(s) against the baseline run(s).

    Lower is better for every metric (times, memory). ``paired``: baseline run i and candidate
    run i ran back to back (gate rounds; see ``paired_ratio_ci``). Broken run directories raise
    ``store.StoreError`` naming the file; an unknown metric raises ``GateError``.
    """
    if not baseline or not candidate:
        raise GateError("compare needs at least one baseline run and one candidate run")
    if paired and len(baseline) != len(candidate):
        raise GateError(f"paired comparison needs as many baseline as candidate runs, got {len(baseline)} and {len(candidate)}")
    unknown = set(ignore_env) - set(COMPARABLE_KEYS)
    if unknown:
        raise GateError(f"--ignore-env {', '.join(sorted(unknown))}: expected one of {', '.join(COMPARABLE_KEYS)}")
    base = [_read_run(Path(d), metric) for d in baseline]
    cand = [_read_run(Path(d), metric) for d in candidate]
    env_diff = sorted({f"{Path(b.dir).name} vs {Path(c.dir).name}: {d}"
                       for b in base for c in cand for d in environment_differences(b.environment, c.environment, ignore_env)}
                      | {f"candidate runs {Path(cand[0].dir).name} vs {Path(c.dir).name}: {d}"
                         for c in cand[1:] for d in environment_differences(cand[0].environment, c.environment, ignore_env)})
    ref = cand[0]
    labels = _labels(ref.params)
    results = [
        _judge_case(cid, labels[cid], ref.params[cid], base, cand, threshold, confidence, bool(env_diff), paired)
        for cid in ref.params
    ]
    return Comparison(
        metric, threshold, confidence, fail_on_inconclusive,
        [str(b.dir) for b in base], [str(c.dir) for c in cand], env_diff, results, paired,
        sorted({_commit(b.environment) for b in base}), sorted({_commit(c.environment) for c in cand}),
    )


def _labels(params: dict[str, dict[str, Any]]) -> dict[str, str]:
    cases = [Case.from_params(p) for p in params.values()]
    keys = [k for k in varying_keys(cases) if k not in IGNORED_FOR_MATCHING]
    return {c.case_id: c.label(keys) for c in cases}


def _judge_case(case_id: str, label: str, params: dict[str, Any], base: list[_RunData], cand: list[_RunData],
                threshold: float, confidence: float, env_differs: bool, paired: bool) -> CaseResult:
    cand_per_run = [r.values.get(case_id) for r in cand]
    base_per_run: list[np.ndarray | None] = []
    world_diff = ""
    for run in base:
        cid, why = _counterpart(params, case_id, run)
        base_per_run.append(run.values.get(cid) if cid is not None else None)
        world_diff = world_diff or why
    if paired:  # keep the rounds where both sides have data, so pairs stay aligned
        both = [(b, c) for b, c in zip(base_per_run, cand_per_run) if b is not None and c is not None]
        base_values, cand_values = [b for b, _ in both], [c for _, c in both]
    else:
        base_values = [v for v in base_per_run if v is not None]
        cand_values = [v for v in cand_per_run if v is not None]
    n_b, n_c = sum(v.size for v in base_values), sum(v.size for v in cand_values)
    common = {"case_id": case_id, "label": label, "baseline_repeats": n_b, "candidate_repeats": n_c,
              "baseline_runs": len(base_values), "candidate_runs": len(cand_values)}
    if not any(v is not None for v in cand_per_run):
        states = sorted({r.status.get(case_id, "absent") for r in cand})
        return CaseResult(verdict=MISSING, reason=f"no candidate data (case {'/'.join(states)})", **common)
    if not any(v is not None for v in base_per_run):
        if world_diff:
            return CaseResult(verdict=INCOMPARABLE, reason=world_diff, **common)
        return CaseResult(verdict=MISSING, reason="no baseline data for this case", **common)
    if not base_values:
        return CaseResult(verdict=MISSING, reason="no round has data on both sides", **common)
    if np.median(np.concatenate(base_values)) <= 0:
        return CaseResult(verdict=INCONCLUSIVE, reason="baseline median is 0: no ratio", **common)
    if paired and len(base_values) >= 2:
        ratio, lo, hi = paired_ratio_ci(base_values, cand_values, confidence=confidence)
    else:
        ratio, lo, hi = hierarchical_ratio_ci(base_values, cand_values, confidence=confidence)
    numbers = {"baseline_median": float(np.median(np.concatenate(base_values))),
               "candidate_median": float(np.median(np.concatenate(cand_values))),
               "ratio": ratio, "ci_lo": lo, "ci_hi": hi}
    if env_differs:
        return CaseResult(verdict=INCOMPARABLE, reason="environments differ (see above)", **common, **numbers)
    if min(n_b, n_c) < MIN_REPEATS:
        return CaseResult(verdict=INCONCLUSIVE, reason=f"too few repeats ({n_b} baseline, {n_c} candidate; need {MIN_REPEATS} a side)",
                          **common, **numbers)
    return CaseResult(verdict=judge(lo, hi, threshold), **common, **numbers)


# ---------------------------------------------------------------- rendering


def _pct(x: float | None) -> str:
    return "" if x is None or not math.isfinite(x) else f"{(x - 1) * 100:+.1f}%"


def _num(x: float | None) -> str:
    return "" if x is None or not math.isfinite(x) else f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def _rows(c: Comparison) -> list[list[str]]:
    rows = []
    for r in c.cases:
        ci = f"[{_pct(r.ci_lo)}, {_pct(r.ci_hi)}]" if r.ci_lo is not None else ""
        reps = f"{r.baseline_repeats}/{r.candidate_repeats}"
        rows.append([r.label, _num(r.baseline_median), _num(r.candidate_median), _pct(r.ratio), ci, reps, r.verdict, r.reason])
    return rows


def _header(c: Comparison) -> list[str]:
    return ["case", f"baseline {c.metric}", f"candidate {c.metric}", "change", f"{c.confidence:.0%} CI", "repeats b/c", "verdict", "note"]


def _preamble(c: Comparison) -> list[str]:
    lines = [
        f"metric {c.metric} (lower is better), threshold ±{c.threshold:.1%}, "
        + (f"{c.confidence:.0%} t interval of the ratio over paired rounds (geometric mean of per-round ratios of medians)"
           if c.paired else f"{c.confidence:.0%} bootstrap CI of the ratio of medians over repeats"),
        f"baseline: {len(c.baseline_runs)} run(s), commit {', '.join(c.baseline_commits)}",
        f"candidate: {len(c.candidate_runs)} run(s), commit {', '.join(c.candidate_commits)}",
    ]
    lines += [f"environment differs: {d}" for d in c.environment_differences]
    return lines


def _footer(c: Comparison) -> str:
    counts = {}
    for r in c.cases:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
    tally = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
    return f"verdict: {c.verdict} ({tally}); exit code {c.exit_code}"


def render_text(c: Comparison) -> str:
    """A plain aligned table (no colour: it ends up in CI logs)."""
    table = [_header(c)] + _rows(c)
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    right = {1, 2, 3, 4, 5}
    lines = _preamble(c) + [""]
    for row in table:
        cells = [cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines + ["", _footer(c)]) + "\n"


_MARK = {REGRESSION: "🔴 **regression**", IMPROVEMENT: "🟢 improvement", PASS: "✅ pass",
         INCONCLUSIVE: "⚪ inconclusive", INCOMPARABLE: "⚠️ incomparable", MISSING: "⚠️ missing"}


def render_markdown(c: Comparison) -> str:
    """For CI job summaries and PR comments: a headline, the table, the method in one line."""
    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    lines = [f"### tpbench gate: {_MARK[c.verdict]}", ""]
    lines += [f"- {esc(line)}" for line in _preamble(c)]
    header = _header(c)
    lines += ["", "| " + " | ".join(header) + " |", "|" + "|".join(["---", *["---:"] * 5, "---", "---"]) + "|"]
    for row, r in zip(_rows(c), c.cases):
        row[6] = _MARK[r.verdict]
        lines.append("| " + " | ".join(esc(x) for x in row) + " |")
    lines += ["", f"{_footer(c)}.", ""]
    return "\n".join(lines)


def render_json(c: Comparison) -> str:
    return json.dumps(c.to_dict(), indent=2, allow_nan=False, default=_json_default) + "\n"


def _json_default(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"{type(x).__name__} is not JSON serializable")


RENDERERS = {"text": render_text, "md": render_markdown, "json": render_json}


# ---------------------------------------------------------------- same-job gate


@dataclass(frozen=True)
class Side:
    """How to run one side's ``tpbench``: a command prefix, extra environment, a working directory."""

    name: str
    spec: str
    kind: str  # "python", "venv", "source" or "command"
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None


def resolve_side(name: str, spec: str, work_dir: Path) -> Side:
    """Interpret ``--baseline``/``--candidate``.

    A python executable or a venv directory runs ``python -m tpbench`` of that environment; a
    source tree (a directory with pyproject.toml) runs this interpreter with the tree first on
    PYTHONPATH. Both run in ``work_dir``, never in the caller's directory: ``python -m`` puts the
    working directory first on sys.path, and a checkout there would shadow the side's own code
    (a source tree runs in its own root for the same reason). Anything else is a command prefix
    such as ``"uv run tpbench"``.
    """
    path = Path(spec).expanduser()
    if path.is_file() and os.access(path, os.X_OK):
        return Side(name, spec, "python", (str(path.absolute()), "-m", "tpbench"), cwd=work_dir)
    if path.is_dir() and (path / "pyvenv.cfg").exists():
        python = path / "bin" / "python"
        if not python.exists():
            raise GateError(f"--{name} {spec}: a virtual environment without bin/python")
        return Side(name, spec, "venv", (str(python.absolute()), "-m", "tpbench"), cwd=work_dir)
    if path.is_dir() and (path / "pyproject.toml").exists():
        if not (path / "tpbench" / "__init__.py").exists():
            raise GateError(f"--{name} {spec}: a source tree without a tpbench package")
        tree = str(path.resolve())
        pythonpath = os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH", "")) if p)
        return Side(name, spec, "source", (sys.executable, "-m", "tpbench"), {"PYTHONPATH": pythonpath}, cwd=Path(tree))
    if path.exists():
        raise GateError(f"--{name} {spec}: expected a python executable, a venv, a source tree with pyproject.toml, or a command")
    argv = tuple(shlex.split(spec))
    if not argv or shutil.which(argv[0]) is None:
        raise GateError(f"--{name} {spec}: no such file, directory or command")
    return Side(name, spec, "command", argv)


@dataclass(frozen=True)
class GateRun:
    """The run directories a gate produced, per side, in round order."""

    out: Path
    baseline: list[Path]
    candidate: list[Path]


def sweep_command(side: Side, suite: Path, out: Path, overrides: Sequence[str], filters: Sequence[str]) -> list[str]:
    return [*side.argv, "sweep", str(suite), "--no-report", "--out", str(out),
            *(a for o in overrides for a in ("--set", o)), *(a for f in filters for a in ("--filter", f))]


def run_gate(
    suite: str | Path,
    baseline: Side,
    candidate: Side,
    out: Path,
    *,
    rounds: int = 3,
    overrides: Sequence[str] = (),
    filters: Sequence[str] = (),
    candidate_overrides: Sequence[str] = (),
) -> GateRun:
    """Sweep the suite with both sides in this job, alternating, ``rounds`` times each.

    The order alternates between rounds (AB BA AB …): machine drift that is linear in time then
    falls on both sides equally instead of always on the one that goes second. Each sweep's
    output goes to stderr so that stdout stays clean for the table. ``candidate_overrides`` are
    ``--set`` values for the candidate only (e.g. ``slowdown_pct=10`` to check the gate itself).
    """
    if rounds < 1:
        raise GateError(f"--rounds {rounds}: expected at least 1")
    suite = Path(suite).absolute()
    if not suite.is_file():
        raise GateError(f"{suite}: no such suite file")
    out = Path(out).absolute()
    runs: dict[str, list[Path]] = {"baseline": [], "candidate": []}
    for r in range(rounds):
        for side in ((baseline, candidate) if r % 2 == 0 else (candidate, baseline)):
            root = out / side.name / f"round{r + 1:02d}"
            root.mkdir(parents=True, exist_ok=True)
            extra = list(candidate_overrides) if side is candidate else []
            cmd = sweep_command(side, suite, root, [*overrides, *extra], filters)
            print(f"tpbench gate: round {r + 1}/{rounds}, {side.name}: {shlex.join(cmd)}", file=sys.stderr, flush=True)
            proc = subprocess.run(cmd, env=os.environ | side.env, cwd=side.cwd, stdout=sys.stderr.fileno(), stdin=subprocess.DEVNULL)
            found = list(store.iter_runs(root))
            # Exit 1 means some case failed: the run still exists and the comparison reports the case.
            if proc.returncode not in (0, 1) or len(found) != 1:
                raise SideError(f"{side.name} ({side.spec}), round {r + 1}: `{shlex.join(cmd)}` exited with {proc.returncode}"
                                f" and left {len(found)} run(s) in {root}; its output is above")
            runs[side.name].append(found[0])
    return GateRun(out, runs["baseline"], runs["candidate"])


# ---------------------------------------------------------------- exports


EXPORT_FORMATS = ("pytest-benchmark", "custom-smaller-is-better")
# The pytest-benchmark storage layout we write (unchanged in what `pytest-benchmark compare` reads since 3.x).
PYTEST_BENCHMARK_VERSION = "5.1.0"


@dataclass(frozen=True)
class Export:
    document: Any
    skipped: list[str]  # labels of cases without data (failed, pending)


def _export_cases(loaded: store.Loaded) -> tuple[list[tuple[Case, str, np.ndarray, np.ndarray]], list[str]]:
    """Done cases with their label, per-step times (slowest rank, ms) and per-repeat medians (ms)."""
    params = {cid: e["params"] for cid, e in loaded.meta["cases"].items()}
    labels = _labels(params)
    per_step = slowest_rank(loaded.steps) if not loaded.steps.empty else None
    out, skipped = [], []
    for cid, p in params.items():
        data = per_step[per_step["case_id"] == cid] if per_step is not None else None
        if data is None or data.empty:
            skipped.append(labels[cid])
            continue
        reps = data.groupby("repeat")["step_ms"].median().to_numpy()
        out.append((Case.from_params(p), labels[cid], data["step_ms"].to_numpy(dtype=float), reps))
    return out, skipped


def export_pytest_benchmark(run_dir: str | Path) -> Export:
    """pytest-benchmark's saved-run JSON: one benchmark per case over its timed steps, in seconds.

    Benchmarks are named ``ALGORITHM[key=value-…]`` after the keys that vary in the suite, grouped
    by suite, with the case parameters under ``params``, so ``pytest-benchmark compare`` and its
    ``--group-by`` options work on tpbench runs.
    """
    loaded = store.load(run_dir)
    env = loaded.environment
    suite = loaded.meta["suite"]["name"]
    cases, skipped = _export_cases(loaded)
    keys = [k for k in varying_keys([c for c, *_ in cases]) if k not in IGNORED_FOR_MATCHING]
    benchmarks = []
    for case, label, ms, reps in cases:
        s = np.sort(ms / 1e3)
        q1, q3 = (float(np.quantile(s, q)) for q in (0.25, 0.75))
        iqr = q3 - q1
        mean, std = float(s.mean()), float(s.std(ddof=1)) if s.size > 1 else 0.0
        inside = s[(s >= q1 - 1.5 * iqr) & (s <= q3 + 1.5 * iqr)]
        param = "-".join(f"{k}={getattr(case, k)}" for k in keys if k != "algorithm")
        name = case.algorithm + (f"[{param}]" if param else "")
        benchmarks.append({
            "group": suite, "name": name, "fullname": f"{suite}::{name}",
            "params": {k: getattr(case, k) for k in keys if k != "algorithm"} or None,
            "param": param or None,
            "extra_info": {"case_id": case.case_id, "label": label, "run_id": loaded.meta["run_id"],
                           "repeat_medians_ms": reps.tolist(), "case": case.params()},
            "options": {"timer": "tpbench", "warmup": case.warmup_steps, "min_rounds": case.steps, "disable_gc": False,
                        "max_time": None, "min_time": None, "precision": None, "confidence": None},
            "stats": {
                "min": float(s[0]), "max": float(s[-1]), "mean": mean, "stddev": std, "rounds": int(s.size),
                "median": float(np.median(s)), "iqr": iqr, "q1": q1, "q3": q3,
                "iqr_outliers": int(s.size - inside.size),
                "stddev_outliers": int(((s < mean - std) | (s > mean + std)).sum()),
                "outliers": f"{int(((s < mean - std) | (s > mean + std)).sum())};{int(s.size - inside.size)}",
                "ld15iqr": float(inside[0]), "hd15iqr": float(inside[-1]),
                "ops": 1 / mean, "total": float(s.sum()), "data": s.tolist(), "iterations": 1,
            },
        })
    git = env.get("git") or {}
    document = {
        "machine_info": {
            "node": env.get("hostname"), "processor": env.get("cpu_model"), "python_version": env.get("python"),
            "platform": env.get("platform"), "cpu": {"brand_raw": env.get("cpu_model"), "count": env.get("cpu_count")},
            "tpbench_environment": env,
        },
        "commit_info": {"id": git.get("commit") or "unversioned", "dirty": bool(git.get("dirty")),
                        "project": "tpbench", "branch": None, "time": None, "author_time": None},
        "benchmarks": benchmarks,
        "datetime": loaded.meta.get("created"),
        "version": PYTEST_BENCHMARK_VERSION,
    }
    return Export(document, skipped)


def export_custom_smaller_is_better(run_dir: str | Path) -> Export:
    """github-action-benchmark's ``customSmallerIsBetter`` input: [{name, unit, value, range, extra}].

    The value is the median of the per-repeat medians (what the gate compares), the range the
    half-width of its bootstrap CI, so a dashboard shows the same number the gate judged.
    """
    loaded = store.load(run_dir)
    suite = loaded.meta["suite"]["name"]
    cases, skipped = _export_cases(loaded)
    env = loaded.environment
    entries = []
    for case, label, _ms, reps in cases:
        lo, hi = bootstrap_ci(reps)
        entries.append({
            "name": f"{suite}/{label}",
            "unit": "ms",
            "value": round(float(np.median(reps)), 6),
            "range": f"± {round((hi - lo) / 2, 6)}",
            "extra": (f"{CONFIDENCE:.0%} CI [{lo:.4g}, {hi:.4g}] ms over {reps.size} repeats; case {case.case_id}; "
                      f"run {loaded.meta['run_id']}; torch {env.get('torch')}; {case.world_size}×{case.backend}/{case.device}"),
        })
    return Export(entries, skipped)


def export_run(run_dir: str | Path, fmt: str) -> Export:
    if fmt == "pytest-benchmark":
        return export_pytest_benchmark(run_dir)
    if fmt == "custom-smaller-is-better":
        return export_custom_smaller_is_better(run_dir)
    raise GateError(f"--format {fmt}: expected one of {', '.join(EXPORT_FORMATS)}")
