"""Headline verdicts in words, each with its confidence interval.

A comparison pairs two cases of one run that differ only in what is being compared (the
algorithm, or the hook's implementation) and agree on every other parameter that varies, e.g.
the interleaved and the sequential ZeRO hook at 4 MB buckets on loopback. Its number is
``stats.case_ratio`` of the two cases' per-repeat values (repeats are the independent unit):
paired by round when the two ran in the same world (``suite.ran_together``: repeat i of each
measured next to each other, so whatever the machine did then cancels in their ratio), else
unpaired. Its verdict is ``tpbench.verdict``'s, the words ``tpbench compare`` prints for the same
interval: a direction only when the interval excludes 1, judged against the ±5% threshold
("slower: +9.0% [+1.0%, +17.6%], not shown beyond the ±5% threshold"); every statement also says
its half-width, what the run could resolve. A case with a single repeat has no interval and is
never called.

Parameters that do not apply to one side (``shard_buckets`` for ``zero_no_overlap``, collapsed
to None by the suite) are not matched on: each sharded and unsharded hook case is compared with
the same ``zero_no_overlap`` case.
"""

from __future__ import annotations

import collections
import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd

from tpbench import compare as engine
from tpbench import verdict
from tpbench.algorithms import (
    ALGORITHMS,
    COMPARED_PAIRS,
    LOCALSGD,
    NO_OVERLAP,
    PACKED,
    TUNING_KEYS,
    ZERO_HOOKS,
    is_plain_ddp,
    named_keys,
)
from tpbench.analysis import convergence
from tpbench.analysis.stats import CONFIDENCE, Ratio, case_ratio, geometric_mean
from tpbench.environment import COMPARABLE_KEYS
from tpbench.record import label_value
from tpbench.report.data import ReportData, context_text, sentence_start
from tpbench.suite import DDP_DEFAULT, ran_together

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


def _no_overlap(packed: bool) -> Callable[[dict[str, Any]], bool]:
    """zero_no_overlap with its broadcasts packed (``parameters_as_bucket_view``) or not; a run from
    before the key reads as unpacked, which is what it ran."""
    return lambda row: row["algorithm"] == NO_OVERLAP and bool(_present(row.get(PACKED)) and row[PACKED]) == packed


# zero_no_overlap by how it broadcasts, in sentences: PyTorch's default and parameters_as_bucket_view.
UNPACKED_WORD = f"{NO_OVERLAP} (per-parameter broadcasts)"
PACKED_WORD = f"{NO_OVERLAP} (packed broadcasts)"


def _zero_kind(candidate: str, baseline: str) -> Kind:
    """A pair of ``COMPARED_PAIRS``; against zero_no_overlap that is its unpacked default (one broadcast
    per parameter), named so, so that a run with both baselines compares each hook case with one of
    them here and says which."""
    kind = _algorithms(candidate, baseline)
    if baseline != NO_OVERLAP:
        return kind
    return Kind(kind.key, kind.candidate, UNPACKED_WORD, kind.is_candidate, _no_overlap(False), kind.sides | {PACKED})


# Where the hooks' advantage over zero_no_overlap comes from: packing its broadcasts (packed /
# unpacked zero_no_overlap) and overlap itself (each hook / packed zero_no_overlap).
PACKING_KIND = Kind(
    f"{PACKED_WORD} / {UNPACKED_WORD}",
    PACKED_WORD,
    UNPACKED_WORD,
    _no_overlap(True),
    _no_overlap(False),
    frozenset({"algorithm", PACKED}),
)
OVERLAP_KINDS = tuple(
    Kind(
        f"{SHORT.get(h, h)} / {PACKED_WORD}",
        SHORT.get(h, h),
        PACKED_WORD,
        _algorithm(h),
        _no_overlap(True),
        frozenset({"algorithm", PACKED}),
    )
    for h in ZERO_HOOKS
)
# The first is the headline (interleaved / sequential); the rest are folded below it.
ZERO_KINDS = (*(_zero_kind(c, b) for c, b in COMPARED_PAIRS), PACKING_KIND, *OVERLAP_KINDS)

LOCALSGD_KIND = Kind(
    "post-local SGD / DDP",
    "post-local SGD",
    "DDP",
    lambda row: row["algorithm"] == LOCALSGD and not is_plain_ddp(row),
    is_plain_ddp,
    # Post-local SGD's own parameters define the sides; impl is matched on like any other key, and so is
    # ranks_per_node, which DDP keeps where the workload splits its data by node (``shards_by_node``).
    frozenset({"algorithm"}) | ALGORITHMS[LOCALSGD].uses - {"impl", "ranks_per_node"},
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
    est: Ratio  # candidate / baseline of the report's metric (``stats.case_ratio``)
    what: str = "step time"  # that metric in words (``ReportData.what``)
    # Where the candidate matched several baselines (``ddp`` and post-local SGD that never switches, both
    # "DDP"): what tells this one apart, "algorithm=ddp"; empty where it matched one.
    baseline_named: str = ""

    @property
    def ratio(self) -> float:
        return self.est.ratio

    @property
    def lo(self) -> float:
        return self.est.lo

    @property
    def hi(self) -> float:
        return self.est.hi

    @property
    def name(self) -> str:
        """The candidate in words: "sequential", or "sequential (shard_buckets=True)"."""
        extra = ", ".join(f"{k}={v}" for k, v in self.variant.items())
        return f"{self.kind.candidate} ({extra})" if extra else self.kind.candidate

    @property
    def said(self) -> verdict.Verdict:
        """The verdict of its interval, as ``tpbench compare`` states it for the same two cases."""
        return judged(self.est, self.baseline, self.candidate)

    @property
    def verdict(self) -> str:
        """The candidate's direction (``verdict.FASTER``, ``SLOWER``, ``NO_DIFFERENCE``, ``NO_INTERVAL``)."""
        return self.said.direction


def judged(est: Ratio, baseline: dict[str, Any], candidate: dict[str, Any]) -> verdict.Verdict:
    """``verdict.of`` for two cases of one run (each side's repeats decide whether it may be judged)."""
    return verdict.of(est, baseline_n=len(repeat_values(baseline)), candidate_n=len(repeat_values(candidate)))


def case_estimate(baseline: dict[str, Any], candidate: dict[str, Any]) -> Ratio:
    """candidate / baseline step time of two cases of one run, by the one rule (``stats.case_ratio``)."""
    return case_ratio(repeat_values(baseline), repeat_values(candidate), paired=ran_together(baseline, candidate))


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
            matched = by_key.get(_key(c, keys), [])
            for b in matched:
                out.append(
                    Comparison(
                        kind,
                        run_id,
                        c,
                        b,
                        {k: c.get(k) for k in keys},
                        {k: c.get(k) for k in variant if _present(c.get(k))},
                        case_estimate(b, c),
                        data.what,
                        _told_apart(b, matched, list(dict.fromkeys(["algorithm", *data.context_keys]))),
                    )
                )
    return out


def _told_apart(baseline: dict[str, Any], matched: list[dict[str, Any]], keys: list[str]) -> str:
    """``baseline``'s values of the ``keys`` on which the baselines ``matched`` to one candidate differ
    ("algorithm=ddp"), so that the candidate's lines against each say which they are against; empty
    for a lone baseline, whose name already says it."""
    if len(matched) < 2:
        return ""
    differ = [k for k in keys if len({json.dumps(b.get(k), default=str) for b in matched}) > 1]
    return " ".join(f"{k}={baseline[k]}" for k in differ if _present(baseline.get(k)))


def _present(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and np.isnan(v))


def _key(row: dict[str, Any], keys: list[str]) -> str:
    return json.dumps([row.get(k) for k in keys], default=str)


def repeat_values(row: dict[str, Any]) -> dict[int, float]:
    """A case's per-repeat values (summary's ``repeat_medians_ms``) keyed by repeat (``repeat_ids``;
    their positions for a summary without them); its median alone when it has no per-repeat values."""
    reps = row.get("repeat_medians_ms")
    if reps is None or (isinstance(reps, float) and np.isnan(reps)):
        return {0: float(row["median_ms"])}
    ids = row.get("repeat_ids")
    ids = range(len(reps)) if ids is None or (isinstance(ids, float) and np.isnan(ids)) else ids
    return {int(i): float(v) for i, v in zip(ids, reps)}


# --- words -------------------------------------------------------------------------------------


def resolution(ests: Iterable[Ratio]) -> str:
    """What one or several comparisons could resolve: "this run resolves ±4.0%" (the interval's
    half-width, the smallest difference it could have told from none), for several the largest
    ("±4.0% or better at each"); "one repeat: no interval" where there is none."""
    ests = list(ests)
    widths = [e.half_width for e in ests if e.has_interval]
    if not widths:
        return "one repeat: no interval"
    text = f"this run resolves {verdict.half_width_pct(max(widths))}" + (
        " or better at each" if len(widths) > 1 else ""
    )
    missing = len(ests) - len(widths)
    return text + (f", {missing} with one repeat and no interval" if missing else "")


def resolved(said: verdict.Verdict, est: Ratio) -> str:
    """What follows a verdict in full: its resolution in parentheses, "(this run resolves ±x%)",
    or nothing where its clause said it already ("no difference shown: …, could only resolve ±x%")."""
    return "" if said.says_resolution else f" ({resolution([est])})"


def change_text(c: Comparison) -> str:
    """The verdict in full (``verdict.Verdict.text``), of the comparison's metric: "slower: +9.0%
    [+1.0%, +17.6%], not shown beyond the ±5% threshold"."""
    return c.said.text


def sentence(c: Comparison, keys: list[str]) -> str:
    ctx = context_text(c.context, keys)
    ctx = f" {ctx}" if ctx else ""
    return f"{c.name} vs {c.kind.baseline}{ctx}, {c.what}: {change_text(c)}{resolved(c.said, c.est)}."


def group_sentences(comparisons: list[Comparison], prefix: str = "") -> list[str]:
    """One line per kind and setting; bucket sizes of one setting are folded into that line, one
    part per verdict (its words, ``verdict.Verdict.words``), each with its largest change and the
    largest half-width among its sizes ("interleaved vs sequential on loopback, step time, at 1, 4 MB
    buckets: faster, beyond the ±5% threshold (most: -15.0% [-20.0%, -8.0%] at 4 MB; this run
    resolves ±6.0% or better at each); at 25 MB buckets: slower, not shown beyond the ±5% threshold
    (...)")."""
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
        head = f"{group[0].name} vs {group[0].kind.baseline}{' ' + ctx if ctx else ''}, {group[0].what}, "
        by_verdict: dict[tuple[str, str], list[Comparison]] = {}
        for c in sorted(group, key=lambda c: _ORDER.index(c.verdict)):
            by_verdict.setdefault((c.verdict, c.said.call), []).append(c)
        parts = []
        for cs in by_verdict.values():
            most = max(cs, key=lambda c: abs(np.log(c.ratio)))
            where = f"most: {most.said.change} at {_mb(most)}" if len(cs) > 1 else most.said.change
            # One verdict's clause may hold a number ("could only resolve ±9.3%"): the widest's.
            widest = max(cs, key=lambda c: c.est.half_width if c.est.has_interval else 0.0)
            parts.append(f"at {_sizes(cs, group)}: {widest.said.words} ({where}; {resolution(c.est for c in cs)})")
        lines.append(prefix + head + "; ".join(parts) + ".")
    return lines


# The order of a folded line's parts: called differences first.
_ORDER = (verdict.FASTER, verdict.SLOWER, verdict.NO_DIFFERENCE, verdict.NO_INTERVAL)


def _mb(c: Comparison) -> str:
    return mb_text(c.context["bucket_cap_mb"])


def _sizes(cs: list[Comparison], of: list[Comparison]) -> str:
    """The bucket sizes of ``cs`` in words; "every bucket size (1–25 MB)" when they are all of ``of``
    (DDP's own bucketing, ``bucket_cap_mb = "default"``, said by name after the numbers)."""
    sizes = sorted({c.context["bucket_cap_mb"] for c in cs}, key=_mb_order)
    every = sorted({c.context["bucket_cap_mb"] for c in of}, key=_mb_order)
    numbers = [float(s) for s in sizes if s != DDP_DEFAULT]
    if sizes == every and len(sizes) > 2 and len(numbers) == len(sizes):
        return f"every bucket size ({numbers[0]:g}–{numbers[-1]:g} MB)"
    words = [", ".join(f"{s:g}" for s in numbers) + " MB buckets"] if numbers else []
    return " and ".join(words + ([mb_text(DDP_DEFAULT)] if len(numbers) < len(sizes) else []))


def _mb_order(v: Any) -> tuple[int, float]:
    return (1, 0.0) if v == DDP_DEFAULT else (0, float(v))


def mb_text(v: Any) -> str:
    """A ``bucket_cap_mb`` in words: "4 MB", or DDP's own bucketing for "default"."""
    return "DDP's default buckets (25 MB, 1 MB first)" if v == DDP_DEFAULT else f"{float(v):g} MB"


@dataclass(frozen=True)
class Attribution:
    """One ZeRO hook case's step time against unpacked zero_no_overlap (``whole``, X) split into what
    packing zero_no_overlap's broadcasts gives (``packing``, Y: packed / unpacked zero_no_overlap) and
    what the hook itself gives beyond it (``hook``, Z: the hook / packed zero_no_overlap), X = Y·Z up
    to the rounds each pair shares, each with its own interval (``case_estimate``)."""

    whole: Comparison
    packing: Comparison
    hook: Comparison


def attributions(comparisons: dict[str, list[Comparison]]) -> list[Attribution]:
    """Per ZeRO hook case and setting (bucket size above all), only where the run has both baselines."""
    packing = {(c.run_id, c.baseline["case_id"]): c for c in comparisons.get(PACKING_KIND.key, [])}
    overlap = {
        (c.run_id, c.candidate["case_id"], c.baseline["case_id"]): c
        for k in OVERLAP_KINDS
        for c in comparisons.get(k.key, [])
    }
    out = []
    for hook in ZERO_HOOKS:
        for x in comparisons.get(_zero_kind(hook, NO_OVERLAP).key, []):
            y = packing.get((x.run_id, x.baseline["case_id"]))
            z = y and overlap.get((x.run_id, x.candidate["case_id"], y.candidate["case_id"]))
            if y and z:
                out.append(Attribution(x, y, z))
    return out


# What the hook itself is, per verdict direction, as words that follow "the hook itself is": the
# directions' own names would read "the hook itself is no difference shown in 4 of the 4 settings".
_HOOK_CALLED = {
    verdict.FASTER: "faster",
    verdict.SLOWER: "slower",
    verdict.NO_DIFFERENCE: "not shown to differ",
    verdict.NO_INTERVAL: "not judged (one repeat, no interval)",
}


def attribution_lines(attrs: list[Attribution], prefix: Callable[[str], str] = lambda run: "") -> list[str]:
    """One sentence per run: the range of the hooks' ratio against per-parameter broadcasts, how much
    of it packing gives and how much the hooks themselves, with how many of the latter were shown
    faster or slower (each setting's figures, with intervals, are in ``attribution_table``). Said
    once, not per setting: on suites/zero.toml the twelve settings' sentences differed only in
    their numbers, and the finding is the pattern across them."""
    by_run: dict[str, list[Attribution]] = {}
    for a in attrs:
        by_run.setdefault(a.whole.run_id, []).append(a)
    lines = []
    for run_id, group in by_run.items():
        calls = collections.Counter(a.hook.said.direction for a in group)
        parts = [f"{words} in {calls[d]}" for d, words in _HOOK_CALLED.items() if calls[d]]
        shown = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
        n = len(group)
        lines.append(
            prefix(run_id) + f"Of the ZeRO hooks' {_span(a.whole for a in group)} {group[0].whole.what} against "
            f"{UNPACKED_WORD}, {_span(a.packing for a in group)} comes from packing the broadcasts ({NO_OVERLAP} "
            f"with {PACKED} = true) and {_span(a.hook for a in group)} from the hooks themselves (each hook against "
            f"{PACKED_WORD}: the step overlapped with backward, and stepped bucket by bucket over the hook's own "
            f"partition of the parameters, whose balance the ZeRO memory section shows); the hook itself is "
            f"{shown} of the {n} setting{'' if n == 1 else 's'} (the table below, each with its interval)."
        )
    return lines


def _span(comparisons: Iterable[Comparison]) -> str:
    """The range of the ratios: "0.28–0.35×" ("0.35×" when they round alike)."""
    ratios = [c.ratio for c in comparisons]
    lo, hi = f"{min(ratios):.2f}", f"{max(ratios):.2f}"
    return f"{lo}×" if lo == hi else f"{lo}–{hi}×"


def attribution_table(attrs: list[Attribution], tags: dict[str, str] | None = None) -> pd.DataFrame:
    """Each hook setting's three ratios with their intervals, and what the hook itself is shown to
    do against packed zero_no_overlap; ``tags``: a column naming the run where a report holds several."""
    rows = []
    for a in attrs:
        ctx = context_text(a.whole.context, list(a.whole.context))
        row = {"run": tags[a.whole.run_id]} if tags else {}
        rows.append(
            row
            | {
                "hook": a.whole.name,
                "setting": ctx,
                f"against {UNPACKED_WORD}": _times(a.whole.est),
                "from packing": _times(a.packing.est),
                "from the hook itself": _times(a.hook.est),
                "the hook itself": a.hook.said.words,
            }
        )
    table = pd.DataFrame(rows)
    # A suite swept at one bucket size leaves every setting blank: a column of nothing is noise.
    return table.drop(columns="setting") if len(table) and not table["setting"].astype(bool).any() else table


def _times(est: Ratio) -> str:
    """A ratio as a factor with its interval: "0.35× [0.33, 0.38]" ("0.35×, one repeat" without one)."""
    if not est.has_interval:
        return f"{est.ratio:.2f}× (one repeat, no interval)"
    return f"{est.ratio:.2f}× [{est.lo:.2f}, {est.hi:.2f}]"


def _knobs(row: dict[str, Any], data: ReportData) -> str:
    """A case by what the user would set: its name (``display_name``: "DDP" for post-local SGD that never
    switches, as every post-local SGD verdict names it) and its tuning parameters (the setting is already said)."""
    said = named_keys(row["algo"]) | {"impl"}
    keys = [k for k in data.context_keys if k in TUNING_KEYS - said and _present(row.get(k))]
    name = row["algo"]
    knobs = [f"{k}={label_value(row[k])}" for k in keys]
    return " ".join([name, *knobs])


def _median_interval(case: dict) -> str:
    """A case's median and its interval as the Verdicts print them: "17.0 ms/step [15.8, 18.6]", or
    "17.0 ms/step (one repeat, no interval)"."""
    lo, hi, median = case["ci_lo_ms"], case["ci_hi_ms"], case["median_ms"]
    if pd.isna(lo) or pd.isna(hi):
        return f"{verdict.ms(median)} ms/step (one repeat, no interval)"
    m, low, high = verdict.ms_interval(median, lo, hi)
    return f"{m} ms/step [{low}, {high}]"


def _tuned_runs(data: ReportData) -> set[str]:
    """The runs ``tpbench tune`` raced (they have tune.json)."""
    return {r.record.run_id for r in data.runs if r.tune is not None}


def _tuned_lines(data: ReportData, tuned: set[str]) -> list[str]:
    """A tune's arms are the settings its user asked to race, whatever keys tell them apart: a
    planted ``slowdown_pct`` is not a tuning knob, and grouped by it every arm would stand alone.
    The tune's Recommendation compares them, in step time and, where they train apart, in time to the
    target loss, at the confidence its race spent; a second ranking here, on other intervals, could
    disagree with it: point to it instead. The lines against DDP stay, at 95 % each: the line says so, since
    the note's interval for the same pair is wider (98.75 % each where it sets the soonest of 5 settings
    against the 4 others), and a difference resolved here read as contradicted there."""
    lines = []
    for run_id in sorted(tuned):
        arms = data.done[data.done["run_id"] == run_id]
        if arms.empty:
            continue
        head = f"[{arms['run'].iloc[0]}] " if data.multi else ""
        lines.append(
            f"{head}The {len(arms)} settings this tune raced: compared in its Recommendation above, at the confidence "
            f"its race spent, which its intervals state; each interval here is {verdict.percent(CONFIDENCE)} on its "
            "own, so a difference resolved here may be unresolved there."
        )
    return lines


def fastest_lines(data: ReportData, alone: bool = True) -> list[str]:
    """Per run and setting: the fastest case, its interval, and how sure we are that it beats the
    runner-up; ``alone``: also for a setting of one case (its time, and that it is alone there: a
    suite that sweeps a key outside the tuning knobs, a tune's planted slowdown, makes every case
    a setting of its own, and "fastest" among one would claim a ranking there is none of)."""
    done = data.done
    setting = [k for k in data.context_keys if k not in TUNING_KEYS]
    tuned = _tuned_runs(data)
    lines = _tuned_lines(data, tuned)
    done = done[~done["run_id"].isin(tuned)]
    # A list-valued key (``slowdown_ranks = [1]``) groups by its JSON text: a list is not hashable.
    by = [done[k].map(lambda v: json.dumps(v) if isinstance(v, list) else v) for k in ["run_id", *setting]]
    for grp in _in_suite_order(data, [g for _, g in done.groupby(by, dropna=False, sort=False)]):
        if len(grp) == 1 and not alone:
            continue
        # Ranked by the statistic the ratio below compares (geometric mean of per-repeat values),
        # so the fastest is never "slower" than its runner-up.
        records = grp.to_dict("records")
        grp = grp.assign(_rank=[geometric_mean(repeat_values(r).values()) for r in records]).sort_values("_rank")
        best = grp.iloc[0].to_dict()
        where = context_text(best, setting)
        head = f"[{best['run']}] " if data.multi else ""
        if data.metric == "step_ms":
            at = _median_interval(best)
        else:
            at = f"{verdict.ms(best['_rank'])} ms {data.what} (geometric mean over repeats)"
        if len(grp) == 1:
            place = sentence_start(where or "this run")
            lines.append(f"{head}{place}: {_knobs(best, data)} at {at}, the only case there.")
            continue
        second = grp.iloc[1].to_dict()
        runner_up = _knobs(second, data)
        if data.metric == "step_ms":
            at += _lowest_median(grp, best, second, data)
            runner_up += _next_lowest_median(grp, second, data)
        est = case_estimate(second, best)
        said = judged(est, second, best)
        lines.append(
            f"{head}Fastest{' ' + where if where else ''}: {_knobs(best, data)} at {at}; against the runner-up "
            f"{runner_up}, {data.what}: {said.text}{resolved(said, est)}{_trains_worse(grp, best, data)}"
            f"{_update_unmeasured(best, second)}."
        )
    return lines


def _trains_worse(grp: pd.DataFrame, best: dict[str, Any], data: ReportData) -> str:
    """Where the fastest case's final held-out loss ends more than ``LEVEL_NATS`` above the lowest of its
    setting (post-local SGD's settings, a compressing hook): a faster step is not a better setting, as the
    tune's note says of its recommended one. Of suites/localsgd.toml the Fastest line named a setting that
    ended 0.0055 nats above DDP's, and said nothing of it."""
    if "final_heldout_loss" not in grp or not _present(best.get("final_heldout_loss")):
        return ""
    scored = grp[grp["final_heldout_loss"].notna()]
    low = scored.loc[scored["final_heldout_loss"].idxmin()].to_dict()
    mine, lowest = float(best["final_heldout_loss"]), float(low["final_heldout_loss"])
    if mine - lowest <= convergence.LEVEL_NATS:
        return ""
    return (
        f"; its held-out loss ends at {mine:.3f}, {convergence.nats_apart(mine - lowest)} nats above the lowest "
        f"({_knobs(low, data)}, {lowest:.3f}): its faster step does not train as far"
    )


def _update_unmeasured(best: dict[str, Any], second: dict[str, Any]) -> str:
    """Where the fastest case and its runner-up differ in a key that changes the update
    (``compare.UPDATE_KEYS``: a communication hook, post-local SGD's settings) and no held-out loss was
    evaluated: the faster step may be bought with a worse model, and nothing measured tells, as
    ``tpbench compare`` says of such a pair. suites/compression.toml's line named an fp16 hook fastest bare."""
    if _present(best.get("final_heldout_loss")):
        return ""
    keys = [
        k for k in engine.UPDATE_KEYS if k in best and k in second and label_value(best[k]) != label_value(second[k])
    ]
    if not keys:
        return ""
    verb = "changes" if len(keys) == 1 else "change"
    return (
        f"; it may not train alike: {' and '.join(keys)} {verb} the update, and no held-out loss was evaluated "
        "(eval_every = 0), so how far a step takes the model is not measured"
    )


def _in_suite_order(data: ReportData, groups: list[pd.DataFrame]) -> list[pd.DataFrame]:
    """``groups`` of cases, run by run, in the order the suite lists its swept values: that of each
    group's first case in its run's record (the expansion's). The report's table sorts the values
    (4, 8, 16; loopback before tcp-1gbit), which put the lines of ``batch_size = [16, 4, 8]`` or of
    the worlds a suite lists slowest link first in another order than the suite's."""
    place = {(r.record.run_id, cid): (i, j) for i, r in enumerate(data.runs) for j, cid in enumerate(r.record.cases)}
    return sorted(groups, key=lambda g: min(place[(rid, cid)] for rid, cid in zip(g["run_id"], g["case_id"])))


def _lowest_median(grp: pd.DataFrame, best: dict[str, Any], second: dict[str, Any], data: ReportData) -> str:
    """Where the case with the lowest median is another than the fastest: say so, and why the line
    names this one. The sweep's table sorts by the median; a line naming another case than the
    table's top row, unexplained, reads as a mistake (on suites/zero.toml the two differed by a
    hook 1.6 % ahead in the paired ratio and 5 % behind in the median)."""
    low = grp.loc[grp["median_ms"].idxmin()].to_dict()
    if low["case_id"] == best["case_id"] or low["median_ms"] >= best["median_ms"]:
        return ""
    whose = "the runner-up's" if low["case_id"] == second["case_id"] else f"{_knobs(low, data)}'s"
    return (
        f" (first by the geometric mean over repeats, which the ratio compares; the lowest median is {whose}, "
        f"{verdict.ms(low['median_ms'])} ms/step)"
    )


def _next_lowest_median(grp: pd.DataFrame, second: dict[str, Any], data: ReportData) -> str:
    """Where the fastest has the lowest median but the runner-up not the next lowest: say which
    has, as ``_lowest_median`` does for the fastest. The front door named a runner-up second by the
    geometric mean under a table whose second row, by median, was another case, unexplained."""
    if grp["median_ms"].idxmin() != grp.index[0]:
        return ""  # the fastest's own note names the lowest median
    rest = grp.iloc[1:]
    low = rest.loc[rest["median_ms"].idxmin()].to_dict()
    if low["case_id"] == second["case_id"] or low["median_ms"] >= second["median_ms"]:
        return ""
    return (
        " (second by the geometric mean over repeats, which the ratio compares; the next lowest median is "
        f"{_knobs(low, data)}'s, {verdict.ms(low['median_ms'])} ms/step)"
    )


# --- convergence (post-local SGD) ----------------------------------------------------------------


@dataclass(frozen=True)
class ConvergenceVerdict:
    comparison: Comparison
    reach_ratio: Ratio | None  # training time to target, candidate / baseline (``stats.case_ratio`` over repeats)
    cand_reached: int  # repeats of the candidate that reached the target
    base_reached: int
    cand_repeats: int  # repeats with a held-out loss, reaching or not
    base_repeats: int
    cand_time_s: float
    base_time_s: float
    final_delta: float  # median final held-out loss, candidate − baseline (nats)
    final_at: str = ""  # where that loss is not the trained model's, the step it was evaluated at (``last_evaluated``)


def convergence_verdicts(data: ReportData) -> list[ConvergenceVerdict]:
    """Post-local SGD against DDP: training time to the target loss (ratio with CI over repeats,
    paired by round when the two ran in one world), and where the held-out loss ends."""
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
            ratio = case_ratio(bt.to_dict(), ct.to_dict(), paired=ran_together(base, cand))
        out.append(
            ConvergenceVerdict(
                c,
                ratio,
                int(ct.notna().sum()),
                int(bt.notna().sum()),
                len(ct),
                len(bt),
                float(ct.median()),
                float(bt.median()),
                float(cand["final_heldout_loss"] - base["final_heldout_loss"]),
                last_evaluated(data, c),
            )
        )
    return out


def evaluated_to(data: ReportData, row: dict[str, Any]) -> tuple[int, int] | None:
    """A case's last held-out evaluation, in steps trained, and the steps it trained (warm-up and timed:
    the worker counts ``eval_every`` from the first); None where it evaluated none. Where ``eval_every``
    does not divide the steps trained, the "final" held-out loss is that evaluation's, not the trained
    model's."""
    steps = data.steps()
    mine = steps[(steps["run_id"] == row["run_id"]) & (steps["case_id"] == row["case_id"])]
    held = mine["step"][mine["heldout_loss"].notna()] if "heldout_loss" in mine else mine["step"].iloc[:0]
    if held.empty:
        return None
    return int(held.max()) + 1, int(row["warmup_steps"]) + int(row["steps"])


def last_evaluated(data: ReportData, c: Comparison) -> str:
    """Where either side's final held-out loss is not its trained model's (``evaluated_to``), the step
    of that evaluation: "last evaluated at step 30 of the 40 trained"; empty where both were evaluated
    at the end of training, or either at no step (no loss is compared then)."""
    cand, base = evaluated_to(data, c.candidate), evaluated_to(data, c.baseline)
    if cand is None or base is None or (cand[0] == cand[1] and base[0] == base[1]):
        return ""
    if cand == base:
        return f"last evaluated at step {cand[0]} of the {cand[1]} trained"
    return f"last evaluated at step {cand[0]} of its {cand[1]} trained, DDP's at step {base[0]} of its {base[1]}"


def reach_times(steps: pd.DataFrame, run_id: str, case_id: str, target: float) -> pd.Series:
    """Per repeat: training seconds until the held-out loss first reaches ``target`` (NaN: never)."""
    mine = steps[(steps["run_id"] == run_id) & (steps["case_id"] == case_id)]
    curves = convergence.curves(mine.drop(columns="run_id")).dropna(subset=["heldout_loss"])
    hit = curves[curves["heldout_loss"] <= target]
    first = hit.groupby("repeat")["train_time_s"].min()
    return first.reindex(sorted(curves["repeat"].unique()))


def soonest_lines(data: ReportData) -> list[str]:
    """Per run and setting where a target loss is known: the case that reaches it in the least
    training time against its runner-up, with the interval of their ratio. Post-local SGD's settings
    (when to switch, how often to average) train differently, so the fastest step says nothing of
    which reaches the target soonest, the question a user who trains to a loss asks; each setting
    against DDP alone leaves it to the reader to set them against each other. Ranked by the
    geometric mean over repeats, the statistic the ratio compares, so the soonest is never "slower"
    than its runner-up; its times are given as medians, as every other time to the target is."""
    steps = data.steps()
    if steps.empty or "heldout_loss" not in steps or "target_loss" not in data.done:
        return []
    setting = [k for k in data.context_keys if k not in TUNING_KEYS]
    # A tune's note ranks its arms by time to the target at the confidence its race spent: a soonest
    # line here, at 95 %, set the same pair beside it on a narrower interval (``_tuned_lines``).
    done = data.done[data.done["target_loss"].notna() & ~data.done["run_id"].isin(_tuned_runs(data))]
    by = [done[k].map(lambda v: json.dumps(v) if isinstance(v, list) else v) for k in ["run_id", *setting]]
    lines = []
    for _, grp in done.groupby(by, dropna=False, sort=False):
        if len(grp) < 2:
            continue
        times = {
            r["case_id"]: reach_times(steps, r["run_id"], r["case_id"], r["target_loss"])
            for r in grp.to_dict("records")
        }
        rows = [r for r in grp.to_dict("records") if len(t := times[r["case_id"]]) and t.notna().all()]
        rows.sort(key=lambda r: geometric_mean(times[r["case_id"]]))
        lines += _soonest_line(data, grp, rows, times, setting)
    return lines


def _soonest_line(
    data: ReportData, grp: pd.DataFrame, rows: list[dict[str, Any]], times: dict[str, pd.Series], setting: list[str]
) -> list[str]:
    """One setting's soonest-to-target sentence (``soonest_lines``); nothing where no case reaches it."""
    if not rows:
        return []
    best = rows[0]
    where = context_text(best, setting)
    head = f"[{best['run']}] " if data.multi else ""
    missed = len(grp) - len(rows)
    tail = f" ({missed} of the {len(grp)} cases do not reach it in every repeat)" if missed else ""
    # Times are medians over repeats, as the post-local SGD lines beside it and the Time to target table
    # give them; the rank is by the geometric mean, the statistic the ratio compares.
    mine = times[best["case_id"]]
    at = f"{mine.median():.3g} s of training (median over repeats)"
    if len(rows) == 1:
        place = " " + where if where else ""
        return [f"{head}Only {_knobs(best, data)} reaches the target loss{place} in every repeat, in {at}{tail}."]
    second = rows[1]
    theirs = times[second["case_id"]]
    first_note = _soonest_median_note(data, rows, times)
    at += first_note
    runner_up = f"{theirs.median():.3g} s" + ("" if first_note else _soonest_median_note(data, rows[1:], times, True))
    est = case_ratio(theirs.to_dict(), mine.to_dict(), paired=ran_together(second, best))
    said = verdict.of(est, baseline_n=len(theirs), candidate_n=len(mine))
    return [
        f"{head}Soonest to the target loss{' ' + where if where else ''}: {_knobs(best, data)} in {at}; against the "
        f"runner-up {_knobs(second, data)} ({runner_up}), time to the target: "
        f"{said.text}{resolved(said, est)}{tail}."
    ]


def _soonest_median_note(
    data: ReportData, rows: list[dict[str, Any]], times: dict[str, pd.Series], runner_up: bool = False
) -> str:
    """Where the first of ``rows`` (ranked by the geometric mean) lacks the lowest median time to the target
    among them: that it is first by the geometric mean, and which case has the lowest median, as the Fastest
    line says of step times (``_lowest_median``, ``_next_lowest_median``). The Time to target table gives
    medians: on suites/localsgd.toml the runner-up read 2.27 s beside a third setting's 2.12 s, unexplained.
    ``runner_up``: ``rows`` are the runner-up and those after it, said only where the soonest itself had the
    lowest median (its own note names the lowest otherwise)."""
    median = {r["case_id"]: float(times[r["case_id"]].median()) for r in rows}
    first = rows[0]
    low = min(rows, key=lambda r: median[r["case_id"]])
    if median[low["case_id"]] >= median[first["case_id"]]:
        return ""
    if runner_up:
        return (
            "; second by the geometric mean over repeats, which the ratio compares; the next lowest median is "
            f"{_knobs(low, data)}'s, {median[low['case_id']]:.3g} s"
        )
    if low is rows[1]:
        return "; first by the geometric mean over repeats, which the ratio compares"
    return (
        "; first by the geometric mean over repeats, which the ratio compares; the lowest median is "
        f"{_knobs(low, data)}'s, {median[low['case_id']]:.3g} s"
    )


def _localsgd_who(c: Comparison, keys: list[str]) -> str:
    """The post-local SGD case in words: "post-local SGD (start_localSGD_iter=0 averaging_period=4)",
    then any other post-local SGD key among ``keys`` (the run's varying keys, ``ReportData.context_keys``)
    and what the candidate sets that DDP lacks: two cases that differ only in
    post_local_gradient_allreduce read alike otherwise. Then the context both sides share, and, in a
    run with both forms of plain DDP, which one this line is against (``Comparison.baseline_named``)."""
    always = ("start_localSGD_iter", "averaging_period")
    own = [k for k in keys if k in LOCALSGD_KIND.sides and k not in always and k != "algorithm"]
    named = dict.fromkeys((*always, *own, *c.variant))
    setting = " ".join(f"{k}={c.candidate.get(k)}" for k in named if _present(c.candidate.get(k)))
    ctx = context_text(c.context, [k for k in keys if k not in LOCALSGD_KIND.sides])
    against = f"; against DDP run as {c.baseline_named}" if c.baseline_named else ""
    return f"post-local SGD ({setting}{', ' + ctx if ctx else ''}{against})"


def step_time_only_sentences(
    data: ReportData, conv: list[ConvergenceVerdict], keys: list[str], tags: dict[str, str] | None = None
) -> list[str]:
    """Post-local SGD against DDP where it has no convergence verdict (no held-out loss, or no known
    optimum to set a target by): its step time, a comparison the report states for every such pair,
    and why the loss side is missing or, without a target, where its held-out loss ends. ``tags``:
    each run's tag, to prefix the lines of a report of several runs."""
    judged = {(v.comparison.run_id, v.comparison.candidate["case_id"]) for v in conv}
    lines = []
    for c in compare(data, LOCALSGD_KIND):
        if (c.run_id, c.candidate["case_id"]) in judged:
            continue
        cand, base = c.candidate.get("final_heldout_loss"), c.baseline.get("final_heldout_loss")
        at = last_evaluated(data, c)
        loss = (
            f"it {_ends(float(cand - base))} (no target: the workload knows no optimal loss{'; ' + at if at else ''})"
            if _present(cand) and _present(base)
            else "no held-out loss was evaluated (eval_every), so how far its steps take the model is not measured"
        )
        tag = f"[{tags[c.run_id]}] " if tags else ""
        lines.append(f"{tag}{_localsgd_who(c, keys)}: {_steps_phrase(c)}; {loss}.")
    return lines


def convergence_sentence(v: ConvergenceVerdict, keys: list[str]) -> str:
    c = v.comparison
    who = _localsgd_who(c, keys)
    ends = _ends(v.final_delta) + (f" ({v.final_at})" if v.final_at else "")
    sooner = False
    if v.reach_ratio is not None:
        est = v.reach_ratio
        reach = f"reaches the target in {v.cand_time_s:.3g} s of training vs DDP's {v.base_time_s:.3g} s"
        if est.has_interval:
            tt = verdict.of(est, baseline_n=v.base_reached, candidate_n=v.cand_reached)
            sooner = tt.direction == verdict.FASTER
            reach += f", time to the target: {tt.text}{resolved(tt, est)}"
        else:
            reach += f" ({resolution([est])})"
    else:
        reach = _reach_counted(v)
    join = " but " if ((sooner or "which DDP" in reach) and v.final_delta > convergence.LEVEL_NATS) else " and "
    return f"{who} {reach}{join}{ends}; {_steps_phrase(c)}."


def _reach_counted(v: ConvergenceVerdict) -> str:
    """Where a repeat on either side missed the target: a side reaches it only if every repeat does
    (the Time to target table's rule, whose cell is blank otherwise), so a time is given only for a
    side that did in all its repeats, and a side that did in some is counted, not timed."""
    if v.cand_reached == 0:
        mine = "never reaches the target"
    elif v.cand_reached == v.cand_repeats:
        mine = f"reaches the target in {v.cand_time_s:.3g} s of training"
    else:
        mine = f"reaches the target in only {v.cand_reached} of its {v.cand_repeats} repeats"
    if v.base_reached == 0:
        return f"{mine}, which DDP never does" if v.cand_reached else f"{mine} (nor does DDP)"
    if v.base_reached == v.base_repeats:
        return f"{mine} (DDP does, in {v.base_time_s:.3g} s)"
    return f"{mine} (DDP in only {v.base_reached} of its {v.base_repeats} repeats)"


def _steps_phrase(c: Comparison) -> str:
    return f"its {c.what} against DDP's, {change_text(c)}{resolved(c.said, c.est)}"


def _ends(delta: float) -> str:
    """Its final held-out loss against DDP's, in three decimals (``convergence.nats_apart``): the level
    band is 0.005 nats, which two decimals would blur (0.0052 as "0.01"), and "DDP's", not "it", which can
    be read as the target; on the level band is level, as the tune's note has it."""
    return convergence.ends_against(delta, "DDP")


# --- several runs -----------------------------------------------------------------------------


def run_data(data: ReportData, metric: str | None = None) -> list[engine.RunData]:
    """What ``tpbench compare`` needs of each run of a report of several (none for one run), by
    ``metric`` (the report's own by default): read once, for the verdicts and the waterfalls alike."""
    if not data.multi:
        return []
    return [engine.RunData.of(run, metric or data.metric) for run in data.runs]


def against_first_run(sides: list[engine.RunData]) -> list[engine.Comparison]:
    """Each later run against the first (``run_data``), by the comparison engine of ``tpbench
    compare``: the same matching (by case identity), interval and verdicts. Environments are not held
    against the runs here (a report of several runs is usually made to see what a new torch or driver
    does); the report's environment table shows what differs."""
    return [
        engine.compare_runs([sides[0]], [side], metric=side.metric, ignore_env=COMPARABLE_KEYS) for side in sides[1:]
    ]


def run_tag(data: ReportData, run_dir: str) -> str:
    return data.tags[next(r.record.run_id for r in data.runs if str(r.run_dir) == run_dir)]


def case_label(data: ReportData, c: engine.Comparison, case_id: str) -> str:
    """The report's one label of a candidate case."""
    rid = next(r.record.run_id for r in data.runs if str(r.run_dir) == c.candidate_runs[0])
    row = data.cases[(data.cases["run_id"] == rid) & (data.cases["case_id"] == case_id)]
    return row["label"].iloc[0] if len(row) else case_id


def _ratios_and_widths(judged: list[engine.CaseResult]) -> str:
    """The judged cases' step-time ratios and what their intervals resolve, as a summary where there
    are several; one case (suites/gate.toml's) gets its own figures: a median and range of one ratio
    read "1.00 (range 1.00–1.00)", and its interval "±43.6% to ±43.6% (median ±43.6%)"."""
    ratios = np.array([r.ratio for r in judged])
    widths = sorted(r.half_width for r in judged if r.half_width is not None and np.isfinite(r.half_width))
    if len(judged) == 1:
        words = f"; step-time ratio {ratios[0]:.2f}"
        if not widths:
            return words + "; no interval (too few repeats)"
        return words + f"; its interval resolves {verdict.half_width_pct(widths[0])}"
    # Two decimals for all three: three significant figures wrote "range 1.14–1.2", and "1 (range 1–1)".
    words = f"; median step-time ratio {np.median(ratios):.2f} (range {ratios.min():.2f}–{ratios.max():.2f})"
    if not widths:
        return words + "; no case has an interval (too few repeats)"
    return words + (
        f"; the intervals resolve {verdict.half_width_pct(widths[0])} to {verdict.half_width_pct(widths[-1])} "
        f"(median {verdict.half_width_pct(float(np.median(widths)))})"
    )


def across_runs_lines(data: ReportData, comps: list[engine.Comparison]) -> list[str]:
    """Per later run: the tally of verdicts against the first run, the ratios and what the intervals
    resolve (``CaseResult.half_width``) of the cases judged, and the largest change called. An
    incomparable case's ratio is left out: it measured something else (post-local SGD timed across
    its switch otherwise, ``compare.timed_steps_differences``), not a change. Cases missing on one
    side (another ``--filter`` or batch size, a failed or pending case) are counted apart from the
    common ones, so the tally adds up to the cases it says it is over, and a run with no case that
    has data in both says so rather than go unmentioned."""
    lines = []
    for c in comps:
        pair = f"Run {run_tag(data, c.candidate_runs[0])} against run {run_tag(data, c.baseline_runs[0])}"
        common = [r for r in c.cases if r.verdict != engine.MISSING]
        n_missing = len(c.cases) - len(common)
        missing = f"; {n_missing} case(s) missing on one side (the Across runs table says why)" if n_missing else ""
        if not common:
            lines.append(f"{pair}: no case has data in both runs{missing}.")
            continue
        judged = [r for r in common if r.ratio is not None and r.verdict != engine.INCOMPARABLE]
        counts = collections.Counter(r.verdict for r in common)
        tally = ", ".join(f"{counts[v]} {v}" for v in engine.VERDICTS if counts[v])
        line = f"{pair}, over {len(common)} common case(s): {tally} (threshold ±{c.threshold:.0%})"
        if not judged:
            lines.append(line + missing + ".")
            continue
        line += _ratios_and_widths(judged)
        called = [r for r in judged if r.verdict in (engine.REGRESSION, engine.IMPROVEMENT)]
        if called:
            big = max(called, key=lambda r: abs(np.log(r.ratio)))
            change = verdict.change(big.ratio, big.ci_lo, big.ci_hi)
            line += (
                f"; largest change: {case_label(data, c, big.case_id)}, {change} ({big.verdict}: {big.words}; "
                f"resolves {verdict.half_width_pct(big.half_width)})"
            )
        lines.append(line + missing + ".")
    return lines
