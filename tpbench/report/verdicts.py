"""Headline verdicts in words, each with its confidence interval.

A comparison pairs two cases of one run that differ only in what is being compared (the
algorithm, or the hook's implementation) and agree on every other parameter that varies, e.g.
the interleaved and the sequential ZeRO hook at 4 MB buckets on loopback. Its number is the
ratio of median step times, candidate / baseline, with the bootstrap interval of
``analysis.stats.unpaired_ratio`` over per-repeat values: repeats are the independent unit. A
difference is called only when the interval excludes 1; a case with a single repeat has no
interval and is never called.

Parameters that do not apply to one side (``shard_buckets`` for ``zero_no_overlap``, collapsed
to None by the suite) are not matched on: each sharded and unsharded hook case is compared with
the same ``zero_no_overlap`` case.
"""

from __future__ import annotations

import collections
import json
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pandas as pd

from tpbench import compare as engine
from tpbench.algorithms import ALGORITHMS, COMPARED_PAIRS, LOCALSGD, TUNING_KEYS, is_plain_ddp
from tpbench.analysis import convergence
from tpbench.analysis.stats import unpaired_ratio
from tpbench.environment import COMPARABLE_KEYS
from tpbench.report.data import ReportData, context_text

# Short words for algorithms in sentences; the report spells them out once beside the verdicts.
SHORT = {a.name: a.short for a in ALGORITHMS.values() if a.short}


@dataclass(frozen=True)
class Kind:
    """One kind of comparison: which rows are candidates, which are baselines, and which
    parameters define the two sides (and so are not matched on)."""

    key: str
    candidate: str
    baseline: str
    is_candidate: Callable[[dict[str, Any]], bool]
    is_baseline: Callable[[dict[str, Any]], bool]
    sides: frozenset[str]


def _algorithm(name: str) -> Callable[[dict[str, Any]], bool]:
    return lambda row: row["algorithm"] == name


def _algorithms(candidate: str, baseline: str) -> Kind:
    c, b = SHORT.get(candidate, candidate), SHORT.get(baseline, baseline)
    return Kind(f"{c} / {b}", c, b, _algorithm(candidate), _algorithm(baseline), frozenset({"algorithm"}))


ZERO_KINDS = tuple(_algorithms(candidate, baseline) for candidate, baseline in COMPARED_PAIRS)

LOCALSGD_KIND = Kind(
    "post-local SGD / DDP",
    "post-local SGD",
    "DDP",
    lambda row: row["algorithm"] == LOCALSGD and not is_plain_ddp(row),
    is_plain_ddp,
    # Post-local SGD's own parameters define the sides; impl is matched on like any other key.
    frozenset({"algorithm"}) | ALGORITHMS[LOCALSGD].uses - {"impl"},
)


def impl_kinds(data: ReportData) -> list[Kind]:
    """PyTorch's own hook against tpbench's, for each algorithm that ran both."""
    done = data.done
    if "impl" not in done:
        return []
    both = done.groupby("algorithm")["impl"].agg(lambda s: {"torch", "tpbench"} <= set(s.dropna()))
    return [
        Kind(
            f"{a}: torch / tpbench",
            f"PyTorch's {a}",
            f"tpbench's {a}",
            lambda row, a=a: row["algorithm"] == a and row.get("impl") == "torch",
            lambda row, a=a: row["algorithm"] == a and row.get("impl") == "tpbench",
            frozenset({"impl"}),
        )
        for a in sorted(both[both].index)
    ]


@dataclass(frozen=True)
class Comparison:
    kind: Kind
    run_id: str
    candidate: dict[str, Any]
    baseline: dict[str, Any]
    context: dict[str, Any]  # the parameters both sides share (matched on)
    variant: dict[str, Any]  # candidate parameters the baseline lacks, e.g. shard_buckets against zero_no_overlap
    ratio: float
    lo: float
    hi: float
    repeats: int  # the fewer repeats of the two sides

    @property
    def name(self) -> str:
        """The candidate in words: "sequential", or "sequential (shard_buckets=True)"."""
        extra = ", ".join(f"{k}={v}" for k, v in self.variant.items())
        return f"{self.kind.candidate} ({extra})" if extra else self.kind.candidate

    @property
    def verdict(self) -> str:
        """faster / slower (the candidate, with the interval excluding 1), unclear, or single (no interval)."""
        if self.repeats < 2:
            return "single"
        if self.hi < 1:
            return "faster"
        if self.lo > 1:
            return "slower"
        return "unclear"


def compare(data: ReportData, kind: Kind) -> list[Comparison]:
    """Every matched (candidate, baseline) pair of ``kind`` within each run."""
    out = []
    done = data.done
    for run_id, rows in done.groupby("run_id", sort=False):
        records = rows.to_dict("records")
        cands = [r for r in records if kind.is_candidate(r)]
        bases = [r for r in records if kind.is_baseline(r)]
        if not cands or not bases:
            continue
        keys = [
            k
            for k in data.context_keys
            if k not in kind.sides and any(_present(r.get(k)) for r in cands) and any(_present(r.get(k)) for r in bases)
        ]
        variant = [
            k
            for k in data.context_keys
            if k not in kind.sides and k not in keys and any(_present(r.get(k)) for r in cands)
        ]
        by_key: dict[str, list[dict[str, Any]]] = {}
        for b in bases:
            by_key.setdefault(_key(b, keys), []).append(b)
        for c in cands:
            for b in by_key.get(_key(c, keys), []):
                base_reps, cand_reps = _repeats(b), _repeats(c)
                est = unpaired_ratio(base_reps, cand_reps)
                ratio, lo, hi = est.ratio, est.lo, est.hi
                out.append(
                    Comparison(
                        kind,
                        run_id,
                        c,
                        b,
                        {k: c.get(k) for k in keys},
                        {k: c.get(k) for k in variant if _present(c.get(k))},
                        ratio,
                        lo,
                        hi,
                        min(len(base_reps), len(cand_reps)),
                    )
                )
    return out


def _present(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and np.isnan(v))


def _key(row: dict[str, Any], keys: list[str]) -> str:
    return json.dumps([row.get(k) for k in keys], default=str)


def _repeats(row: dict[str, Any]) -> np.ndarray:
    reps = row.get("repeat_medians_ms")
    if reps is None or (isinstance(reps, float) and np.isnan(reps)):
        return np.array([row["median_ms"]], dtype=float)
    return np.asarray(reps, dtype=float)


# --- words -------------------------------------------------------------------------------------


def _pct(x: float) -> str:
    """A magnitude in percent: whole numbers, with one decimal below 10% so small effects don't read as 0%."""
    v = abs(x) * 100
    return f"{v:.1f}%" if v < 9.95 else f"{v:.0f}%"


def _signed(ratio: float, lo: float | None = None, hi: float | None = None) -> str:
    """A ratio as a signed change, "+3% [-1%, +8%]" (the interval when given)."""

    def one(r: float) -> str:
        return ("+" if r >= 1 else "-") + _pct(r - 1)

    return one(ratio) + (f" [{one(lo)}, {one(hi)}]" if lo is not None and hi is not None else "")


def change_text(c: Comparison) -> str:
    """The change as text: "12% [8%, 15%] faster", "5% [2%, 9%] slower", or a signed change with its interval."""
    if c.verdict == "faster":
        return f"{_pct(1 - c.ratio)} [{_pct(1 - c.hi)}, {_pct(1 - c.lo)}] faster"
    if c.verdict == "slower":
        return f"{_pct(c.ratio - 1)} [{_pct(c.lo - 1)}, {_pct(c.hi - 1)}] slower"
    if c.verdict == "single":
        return f"{_signed(c.ratio)} step time (one repeat: no interval)"
    return f"{_signed(c.ratio, c.lo, c.hi)} step time, not a clear difference"


def sentence(c: Comparison, keys: list[str]) -> str:
    ctx = context_text(c.context, keys)
    ctx = f" {ctx}" if ctx else ""
    name, base = c.name, c.kind.baseline
    if c.verdict in ("faster", "slower"):
        return f"{name} is {change_text(c)} than {base}{ctx}."
    return f"{name} vs {base}{ctx}: {change_text(c)}."


def group_sentences(comparisons: list[Comparison], prefix: str = "") -> list[str]:
    """One line per kind and setting; bucket sizes of one setting are folded into that line
    ("interleaved is faster than sequential at 1, 4 MB buckets on loopback (most: 15% [8%, 20%]
    at 4 MB); sequential wins at 25 MB (by 5% [2%, 9%])")."""
    groups: dict[tuple, list[Comparison]] = {}
    for c in comparisons:
        rest = tuple(
            (k, json.dumps(v, default=str)) for k, v in (c.context | c.variant).items() if k != "bucket_cap_mb"
        )
        groups.setdefault((c.kind.key, c.run_id, rest), []).append(c)
    lines = []
    for group in groups.values():
        keys = list(group[0].context)
        if len(group) == 1 or "bucket_cap_mb" not in keys:
            lines += [prefix + sentence(c, keys) for c in group]
            continue
        rest_keys = [k for k in keys if k != "bucket_cap_mb"]
        ctx = context_text(group[0].context, rest_keys)
        ctx = f" {ctx}" if ctx else ""
        name, base = group[0].name, group[0].kind.baseline
        parts = []
        faster = sorted((c for c in group if c.verdict == "faster"), key=lambda c: c.ratio)
        slower = sorted((c for c in group if c.verdict == "slower"), key=lambda c: -c.ratio)
        other = [c for c in group if c.verdict in ("unclear", "single")]
        if faster:
            best = faster[0]
            parts.append(
                f"{name} is faster than {base} at {_sizes(faster, group)}{ctx} "
                f"(most: {change_text(best).removesuffix(' faster')} at {_mb(best)})"
            )
        if slower:
            worst = slower[0]
            parts.append(
                f"{base} wins at {_sizes(slower, group)}{ctx if not faster else ''} "
                f"({name} up to {change_text(worst)} at {_mb(worst)})"
            )
        if other:
            head = "" if parts else f"{name} vs {base}{ctx}: "
            parts.append(f"{head}no clear difference at {_sizes(other, group)}")
        lines.append(prefix + "; ".join(parts) + ".")
    return lines


def _mb(c: Comparison) -> str:
    return f"{c.context['bucket_cap_mb']:g} MB"


def _sizes(cs: list[Comparison], of: list[Comparison]) -> str:
    """The bucket sizes of ``cs`` in words; "every bucket size (1–25 MB)" when they are all of ``of``."""
    sizes = sorted({float(c.context["bucket_cap_mb"]) for c in cs})
    every = sorted({float(c.context["bucket_cap_mb"]) for c in of})
    if sizes == every and len(sizes) > 2:
        return f"every bucket size ({sizes[0]:g}–{sizes[-1]:g} MB)"
    return ", ".join(f"{s:g}" for s in sizes) + " MB buckets"


def _knobs(row: dict[str, Any], data: ReportData) -> str:
    """A case by what the user would set: the algorithm and its tuning parameters (the setting is already said)."""
    knobs = [f"{k}={row[k]}" for k in data.context_keys if k in TUNING_KEYS - {"impl"} and _present(row.get(k))]
    return " ".join([row["algo"], *knobs])


def fastest_lines(data: ReportData) -> list[str]:
    """Per run and setting: the fastest case, its interval, and how sure we are that it beats the runner-up."""
    done = data.done
    setting = [k for k in data.context_keys if k not in TUNING_KEYS]
    lines = []
    for _, grp in done.groupby(["run_id", *setting], dropna=False, sort=False):
        # Ranked by the statistic the ratio below compares (median of per-repeat medians), so the
        # fastest is never "slower" than its runner-up.
        grp = grp.assign(_rank=[float(np.median(_repeats(r))) for r in grp.to_dict("records")]).sort_values("_rank")
        best = grp.iloc[0].to_dict()
        where = context_text(best, setting)
        head = f"[{best['run']}] " if data.multi else ""
        line = (
            f"{head}Fastest{' ' + where if where else ''}: {_knobs(best, data)} at {best['median_ms']:.3g} ms/step "
            f"[{best['ci_lo_ms']:.3g}, {best['ci_hi_ms']:.3g}]"
        )
        if len(grp) > 1:
            second = grp.iloc[1].to_dict()
            est = unpaired_ratio(_repeats(second), _repeats(best))
            ratio, lo, hi = est.ratio, est.lo, est.hi
            if min(len(_repeats(best)), len(_repeats(second))) < 2:
                line += f"; runner-up {_knobs(second, data)} (one repeat: no interval)"
            elif hi < 1:
                line += (
                    f", {_pct(1 - ratio)} [{_pct(1 - hi)}, {_pct(1 - lo)}] "
                    f"faster than the runner-up {_knobs(second, data)}"
                )
            else:
                line += (
                    f", not clearly ahead of the runner-up {_knobs(second, data)} ({_signed(ratio, lo, hi)} step time)"
                )
        lines.append(line + ".")
    return lines


# --- convergence (post-local SGD) ----------------------------------------------------------------


@dataclass(frozen=True)
class ConvergenceVerdict:
    comparison: Comparison
    reach_ratio: tuple[float, float, float] | None  # time to target, candidate / baseline, with CI
    cand_reached: int  # repeats of the candidate that reached the target
    base_reached: int
    cand_time_s: float
    base_time_s: float
    final_delta: float  # median final held-out loss, candidate − baseline (nats)
    repeats: int


def convergence_verdicts(data: ReportData) -> list[ConvergenceVerdict]:
    """Post-local SGD against DDP: training time to the target loss (ratio with CI over repeats),
    and where the held-out loss ends."""
    steps = data.steps()
    if steps.empty or "heldout_loss" not in steps or "target_loss" not in data.cases:
        return []
    out = []
    for c in compare(data, LOCALSGD_KIND):
        cand, base = c.candidate, c.baseline
        target = cand.get("target_loss")
        if not _present(target):
            continue
        ct = reach_times(steps, c.run_id, cand["case_id"], target)
        bt = reach_times(steps, c.run_id, base["case_id"], target)
        ratio = None
        if ct.notna().all() and bt.notna().all() and len(ct) and len(bt):
            est = unpaired_ratio(bt.to_numpy(), ct.to_numpy())
            ratio = (est.ratio, est.lo, est.hi)
        out.append(
            ConvergenceVerdict(
                c,
                ratio,
                int(ct.notna().sum()),
                int(bt.notna().sum()),
                float(ct.median()),
                float(bt.median()),
                float(cand["final_heldout_loss"] - base["final_heldout_loss"]),
                min(len(ct), len(bt)),
            )
        )
    return out


def reach_times(steps: pd.DataFrame, run_id: str, case_id: str, target: float) -> pd.Series:
    """Per repeat: training seconds until the held-out loss first reaches ``target`` (NaN: never)."""
    mine = steps[(steps["run_id"] == run_id) & (steps["case_id"] == case_id)]
    curves = convergence.curves(mine.drop(columns="run_id")).dropna(subset=["heldout_loss"])
    hit = curves[curves["heldout_loss"] <= target]
    first = hit.groupby("repeat")["train_time_s"].min()
    return first.reindex(sorted(curves["repeat"].unique()))


def convergence_sentence(v: ConvergenceVerdict, keys: list[str]) -> str:
    c = v.comparison
    setting = " ".join(
        f"{k}={c.candidate.get(k)}" for k in ("start_localSGD_iter", "averaging_period") if _present(c.candidate.get(k))
    )
    ctx = context_text(c.context, keys)
    who = f"post-local SGD ({setting}{', ' + ctx if ctx else ''})"
    ends = _ends(v.final_delta)
    if v.reach_ratio is not None:
        r, lo, hi = v.reach_ratio
        if v.repeats < 2:
            reach = (
                f"reaches the target in {v.cand_time_s:.3g} s of training vs DDP's {v.base_time_s:.3g} s "
                "(one repeat: no interval)"
            )
        elif hi < 1:
            reach = f"reaches the target in {_pct(1 - r)} [{_pct(1 - hi)}, {_pct(1 - lo)}] less training time than DDP"
        elif lo > 1:
            reach = (
                f"needs {_pct(r - 1)} [{_pct(lo - 1)}, {_pct(hi - 1)}] more training time than DDP to reach the target"
            )
        else:
            reach = f"reaches the target in about the same training time as DDP ({_signed(r, lo, hi)})"
    elif v.cand_reached == 0:
        reach = "never reaches the target" + (
            f" (DDP does, in {v.base_time_s:.3g} s)" if v.base_reached else " (nor does DDP)"
        )
    elif v.base_reached == 0:
        reach = f"reaches the target in {v.cand_time_s:.3g} s of training, which DDP never does"
    else:
        reach = f"reaches the target in only {v.cand_reached} of its repeats (DDP: {v.base_reached})"
    join = " but " if (("less" in reach or "which DDP" in reach) and v.final_delta > 0.005) else " and "
    return f"{who} {reach}{join}{ends}; {_steps_phrase(c)}."


def _steps_phrase(c: Comparison) -> str:
    if c.verdict in ("faster", "slower"):
        return f"its steps are {change_text(c)} than DDP's"
    if c.verdict == "single":
        return f"its step time differs by {_signed(c.ratio)} from DDP's (one repeat: no interval)"
    return f"its step time is not clearly different from DDP's ({_signed(c.ratio, c.lo, c.hi)})"


def _ends(delta: float) -> str:
    if abs(delta) < 0.005:
        return "ends level with it (held-out loss within 0.005 nats)"
    return f"ends {abs(delta):.2f} nats {'above' if delta > 0 else 'below'} it"


# --- several runs -----------------------------------------------------------------------------


def against_first_run(data: ReportData) -> list[engine.Comparison]:
    """Each later run against the first, by the comparison engine of ``tpbench compare``: the same
    matching (by case identity), interval and verdicts. Environments are not held against the
    runs here (a report of several runs is usually made to see what a new torch or driver does);
    the report's environment table shows what differs."""
    if not data.multi:
        return []
    return [engine.compare_runs([data.runs[0]], [run], ignore_env=COMPARABLE_KEYS) for run in data.runs[1:]]


def run_tag(data: ReportData, run_dir: str) -> str:
    return data.tags[next(r.meta["run_id"] for r in data.runs if str(r.run_dir) == run_dir)]


def case_label(data: ReportData, c: engine.Comparison, case_id: str) -> str:
    """The report's one label of a candidate case."""
    rid = next(r.meta["run_id"] for r in data.runs if str(r.run_dir) == c.candidate_runs[0])
    row = data.cases[(data.cases["run_id"] == rid) & (data.cases["case_id"] == case_id)]
    return row["label"].iloc[0] if len(row) else case_id


def across_runs_lines(data: ReportData, comps: list[engine.Comparison]) -> list[str]:
    lines = []
    for c in comps:
        judged = [r for r in c.cases if r.ratio is not None]
        if not judged:
            continue
        counts = collections.Counter(r.verdict for r in c.cases)
        ratios = np.array([r.ratio for r in judged])
        tally = ", ".join(f"{counts[v]} {v}" for v in engine.VERDICTS if counts[v])
        line = (
            f"Run {run_tag(data, c.candidate_runs[0])} against run {run_tag(data, c.baseline_runs[0])}, over "
            f"{len(judged)} common case(s): {tally} (threshold ±{c.threshold:.0%}); median step-time ratio "
            f"{np.median(ratios):.3g} (range {ratios.min():.3g}–{ratios.max():.3g})"
        )
        called = [r for r in judged if r.verdict in (engine.REGRESSION, engine.IMPROVEMENT)]
        if called:
            big = max(called, key=lambda r: abs(np.log(r.ratio)))
            change = _signed(big.ratio, big.ci_lo, big.ci_hi)
            line += f"; largest change: {case_label(data, c, big.case_id)}, {change} ({big.verdict})"
        lines.append(line + ".")
    return lines
