"""``tpbench explain``: where a step-time change between two cases went, from their traced steps.

The cases are matched as ``tpbench compare`` matches them (``compare.counterpart`` across runs,
``compare.within_run``'s pairs for ``--pair`` within one run); the parts come from the derived
tables the sweep wrote (``intervals``, ``marks``, ``ddp_buckets``), never from the raw traces
again, and are computed by ``analysis.explain``. ``run`` returns what the command prints.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from tpbench import compare, store
from tpbench.analysis import explain as parts
from tpbench.analysis.stats import CONFIDENCE
from tpbench.environment import COMPARABLE_KEYS


class ExplainError(ValueError):
    """An explain that cannot be done as asked (bad --pair, one run given twice): exit 2, with what to do."""


class Unanswerable(ValueError):
    """The runs, not the arguments, cannot answer: no case of one has a finished counterpart in the
    other, or no matched case has analysed traces on both sides (exit 3, as ``compare``'s missing cases
    and ``whatif``'s run without traces); the message says what is missing and how to get it."""


# What explain reads of a case's analysed traces (``traced_steps``).
TABLES = ("intervals", "marks")
NO_TRACED_STEPS = "no traced steps"


@dataclass(frozen=True)
class Measured:
    """What ``compare`` measured of a matched case, in ms per step: each side's compared value
    (``CaseResult.baseline_compared`` and ``candidate_compared``, whose ratio is compare's ratio) and
    the change's interval (compare's ratio interval times the baseline's value; NaN where compare has
    none). Explain's step-time line is this figure, point and interval together, so that it never calls
    "faster" what compare, from every timed repeat and paired by round where it can, calls no
    difference: the traced steps alone are few, and unpaired."""

    base_ms: float
    cand_ms: float
    lo_ms: float = math.nan
    hi_ms: float = math.nan

    @classmethod
    def of(cls, r: compare.CaseResult) -> Measured:
        b, c = r.baseline_compared, r.candidate_compared
        if b is None or c is None:
            return cls(math.nan, math.nan)
        if r.half_width is None or r.ci_lo is None or r.ci_hi is None:  # too few repeats for an interval
            return cls(b, c)
        return cls(b, c, b * (r.ci_lo - 1), b * (r.ci_hi - 1))

    @property
    def delta_ms(self) -> float:
        return self.cand_ms - self.base_ms


@dataclass(frozen=True)
class CaseExplanation:
    """One matched case: the change the timed steps measured (``timed_delta_ms``: ``compare``'s
    figure, ``Measured``) split into parts (``explanation``: each side's traced steps scaled to its
    compared step, ``analysis.explain.scaled``; its step-time interval is compare's),
    and the traced steps' own change (``traced``), unscaled, to check the traces against; ``buckets``:
    how many gradient buckets DDP built on each side, where recorded (what a bucket-size change did)."""

    case_id: str
    label: str
    base_case: str
    cand_case: str
    explanation: parts.Explanation
    timed_delta_ms: float
    traced: parts.Explanation
    buckets: tuple[int | None, int | None] = (None, None)

    @property
    def top(self) -> str:
        return parts.sentence(self.explanation)

    @property
    def unlike_timed(self) -> str:
        """Why the parts may not describe the timed steps, or "": the traced change is off the timed
        one by more than 20 % (the profiler's overhead, or a busy machine, slowed one side's traced
        steps more than the other's), so the traces' composition is a weaker guide to it."""
        traced, timed = self.traced.delta_ms, self.timed_delta_ms
        if not math.isfinite(timed) or timed == 0 or abs(traced - timed) <= 0.2 * abs(timed):
            return ""
        # A ratio to a timed change near zero reads 1000s of per cent: the two figures then say it.
        ratio = traced / timed
        off = f"{ratio:.0%} of the timed one (" if 0 < ratio <= 5 else "off the timed one ("
        return (
            f"the traced change is {off}{traced:+.2f} vs {timed:+.2f} ms): the "
            "traced steps did not run as the timed ones (profiler overhead, a busy machine); the parts are their "
            "composition scaled to the timed steps"
        )

    def to_dict(self) -> dict[str, Any]:
        e = self.explanation
        return {
            "case_id": self.case_id,
            "label": self.label,
            "delta_ms": e.delta_ms,
            "lo": e.lo,
            "hi": e.hi,
            "top": e.top.name,
            "sentence": self.top,
            "components": [asdict(c) for c in e.components],
            "exposed_comm_detail": [asdict(c) for c in e.detail],
            "base_case": self.base_case,
            "cand_case": self.cand_case,
            "base_ms": e.base_ms,
            "cand_ms": e.cand_ms,
            "traced_steps": [e.base_steps, e.cand_steps],
            "timed_delta_ms": self.timed_delta_ms,
            "traced_delta_ms": self.traced.delta_ms,
            "traced_components": [asdict(c) for c in self.traced.components],
            "residual_ms": e.residual_ms,
            "unlike_timed": self.unlike_timed,
            "ddp_buckets": list(self.buckets),
        }


@dataclass(frozen=True)
class Report:
    """Every explained case, and the matched cases left out (``skipped``: case → why);
    ``environment_differences``: what makes the two runs incomparable (``compare``'s rule,
    ``compare.runs_environment_differences``), empty when they are comparable or within one run;
    ``ignored_environment_differences``: those ``--ignore-env`` set aside, still said, as ``compare``
    says them: runs of two torch versions explained as comparable must not read as one environment.
    ``suites_differ``: compare's line for runs of two suites (``compare.suites_apart``), or "": their
    shared cases are explained, and a reader should know the runs were not of one suite."""

    baseline: str
    candidate: str
    cases: list[CaseExplanation]
    skipped: dict[str, str] = field(default_factory=dict)
    environment_differences: list[str] = field(default_factory=list)
    ignored_environment_differences: list[str] = field(default_factory=list)
    suites_differ: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "candidate": self.candidate,
            "cases": [c.to_dict() for c in self.cases],
            "skipped": self.skipped,
            "environment_differences": self.environment_differences,
            "ignored_environment_differences": self.ignored_environment_differences,
            "suites_differ": self.suites_differ,
        }


def traced_steps(run_dir: Path, case_id: str) -> pd.DataFrame | None:
    """``analysis.explain.step_parts`` of one stored case, or None when it has no traced steps."""
    intervals = store.read_case_table(run_dir, case_id, "intervals")
    marks = store.read_case_table(run_dir, case_id, "marks")
    if intervals is None or marks is None:
        return None
    steps = marks[marks["kind"] == "step"].rename(columns={"index": "step"})[["rank", "step", "start_ns", "end_ns"]]
    if steps.empty:
        return None
    return parts.step_parts(parts.rank_step_parts(intervals, steps, bucket_count(run_dir, case_id)))


def bucket_count(run_dir: Path, case_id: str) -> int | None:
    """How many gradient buckets DDP built for the case (its ``ddp_buckets`` table), or None."""
    buckets = store.read_case_table(run_dir, case_id, "ddp_buckets")
    return len(buckets) if buckets is not None and len(buckets) else None


Matched = tuple[str, str, str, Measured]  # (base case, candidate case, label, what compare measured)


def explain_cases(
    base_dir: Path,
    cand_dir: Path,
    matched: Sequence[Matched],
    *,
    confidence: float = CONFIDENCE,
) -> tuple[list[CaseExplanation], dict[str, str]]:
    """Explain each matched case; a case without traces on either side goes to the second value
    with the reason."""
    out, skipped = [], {}
    for base_case, cand_case, label, measured in matched:
        b, c = traced_steps(base_dir, base_case), traced_steps(cand_dir, cand_case)
        missing = [
            _missing(side, d, cid)
            for side, cid, d, t in (("baseline", base_case, base_dir, b), ("candidate", cand_case, cand_dir, c))
            if t is None
        ]
        if missing:
            skipped[label] = "; ".join(missing)
            continue
        traced = parts.explain(b, c, confidence=confidence)
        e = parts.explain(parts.scaled(b, measured.base_ms), parts.scaled(c, measured.cand_ms), confidence=confidence)
        if math.isfinite(measured.delta_ms):  # compare's interval; the traced steps' only without timed ones
            e = replace(e, lo=measured.lo_ms, hi=measured.hi_ms)
        buckets = (bucket_count(base_dir, base_case), bucket_count(cand_dir, cand_case))
        out.append(CaseExplanation(cand_case, label, base_case, cand_case, e, measured.delta_ms, traced, buckets))
    return out, skipped


def _missing(side: str, run_dir: Path, case_id: str) -> str:
    """Why one side of a matched case has no traced steps: its analysed tables lost (named), or no traces."""
    lost = store.lost_tables(run_dir, case_id, TABLES)
    return f"{side} case {case_id}: {lost}" if lost else f"{NO_TRACED_STEPS} ({side} case {case_id} in {run_dir})"


def run(
    runs: Sequence[str | Path],
    *,
    pairs: Sequence[str] = (),
    confidence: float = CONFIDENCE,
    ignore_env: Sequence[str] = (),
) -> Report:
    """``tpbench explain BASE CAND`` (two runs, their cases matched by identity) or ``tpbench
    explain RUN --pair KEY=A..B`` (two cases of one run). Raises ``ExplainError`` for arguments
    that name nothing to explain (one run given twice, as ``compare`` refuses it), and
    ``Unanswerable`` when no case is matched or no matched case has traces on both sides. Two runs
    whose environments differ, beyond the ``ignore_env`` keys, are explained with the differences in
    ``Report.environment_differences``."""
    if len(runs) == 1:
        if not pairs:
            raise ExplainError(
                f"{runs[0]}: one run given; expected two runs (BASE CAND) or one run with --pair "
                "KEY=BASELINE..CANDIDATE (two of its cases)"
            )
        if ignore_env:  # the cases of one run share its environment: there is nothing to ignore
            raise ExplainError(f"--ignore-env: {compare.IGNORE_ENV_WITHIN_RUN}")
        try:
            within = compare.within_run(runs[0], pairs=pairs)
        except compare.GateError as e:
            raise ExplainError(str(e)) from None
        matched = [(p.baseline_case, p.candidate_case, p.result.label, Measured.of(p.result)) for p in within.pairs]
        base_dir = cand_dir = Path(within.run)
        differs: list[str] = []
        ignored: list[str] = []
        suites = ""
        unmatched: dict[str, str] = {}
    elif len(runs) == 2:
        if pairs:
            raise ExplainError("--pair: only with a single RUN_DIR (two cases of one run)")
        base_dir, cand_dir = Path(runs[0]), Path(runs[1])
        try:
            matched, differs, ignored, suites, unmatched = _matched(base_dir, cand_dir, ignore_env)
        except compare.GateError as e:
            raise ExplainError(str(e)) from None
    else:
        raise ExplainError(f"explain takes BASE_RUN CAND_RUN, or one RUN_DIR with --pair; got {len(runs)} runs")
    if not matched:  # the two runs share no finished case: the runs cannot answer (compare: missing, exit 3)
        raise Unanswerable(
            f"nothing to explain: no finished case of {cand_dir} has a finished counterpart in {base_dir} (matched by "
            "their parameters, as compare matches them); two cases of one run side by side: tpbench explain RUN_DIR "
            "--pair KEY=BASELINE..CANDIDATE" + (f"; {suites}" if suites else "")
        )
    cases, skipped = explain_cases(base_dir, cand_dir, matched, confidence=confidence)
    skipped |= unmatched
    if not cases:
        why = "; ".join(f"{k}: {v}" for k, v in skipped.items()) or "no matched finished cases"
        untraced = any(NO_TRACED_STEPS in v for v in skipped.values()) or not skipped
        raise Unanswerable(
            f"nothing to explain: {why}"
            + (
                ". Traces come from the traced steps after each case's timed ones: sweep with "
                "capture.profiler_steps >= 2 (e.g. --set capture.profiler_steps=5)"
                if untraced
                else ""
            )
        )
    return Report(str(base_dir), str(cand_dir), cases, skipped, differs, ignored, suites)


def annotate(
    result: compare.Comparison | compare.WithinRun, traced: tuple[Path, Path] | None = None
) -> compare.Comparison | compare.WithinRun:
    """The comparison with each regression's top contributor (``CaseResult.top_contributor``: the
    sentence of its explanation) where both of its cases have traced steps; unchanged elsewhere.
    Runs compared: the first baseline run against the first candidate run, or ``traced`` (the
    baseline's and the candidate's runs traced after the verdict, ``gate --explain``)."""
    if isinstance(result, compare.WithinRun):
        run_dir = Path(result.run)
        step = _step_times(result)
        pairs = []
        for p in result.pairs:
            measured = step.get((p.baseline_case, p.candidate_case))
            pairs.append(replace(p, result=_named(p.result, run_dir, p.baseline_case, run_dir, measured)))
        return replace(result, pairs=pairs)
    regressed = {r.case_id for r in result.cases if r.verdict == compare.REGRESSION}
    if not regressed:
        return result
    base_dir, cand_dir = traced or (Path(result.baseline_runs[0]), Path(result.candidate_runs[0]))
    others = {cand: other for other, cand, _, _ in matched_across(base_dir, cand_dir) if cand in regressed}
    step = _step_times_across(result)
    cases = [
        _named(r, base_dir, others[r.case_id], cand_dir, step.get(r.case_id)) if r.case_id in others else r
        for r in result.cases
    ]
    return replace(result, cases=cases)


def _step_times_across(result: compare.Comparison) -> dict[str, Measured]:
    """What the step time measured of each candidate case of ``result``'s runs (judged as ``result``
    was: the same runs, pairing and confidence), where ``result`` judged another metric (``compare A B
    --metric cpu_ms``, ``gate --metric cpu_ms --explain``): scaled to the CPU time's change, the sentence
    read "+4.42 ms per step slower" of a step whose time the timed runs measured otherwise. Empty for
    a comparison of the step time itself. Every environment key is ignored here: ``result`` already
    judged the runs comparable (a regression), and only the figures are read."""
    if result.metric == "step_ms":
        return {}
    steps = compare.compare_runs(
        result.baseline_runs,
        result.candidate_runs,
        confidence=result.confidence,
        pairing=result.pairing,
        ignore_env=COMPARABLE_KEYS,
    )
    return {r.case_id: Measured.of(r) for r in steps.cases}


def _step_times(within: compare.WithinRun) -> dict[tuple[str, str], Measured]:
    """What the step time measured of each regressed pair of ``within`` (baseline case, candidate case),
    where ``within`` judged another metric (``--metric cpu_ms``): the parts split the step time, and
    scaled to the pair's CPU time they would say "+1.16 ms per step slower" of a step that grew by
    9.8 ms. Empty for a comparison of the step time itself: its own figures."""
    regressed = [p for p in within.pairs if p.result.verdict == compare.REGRESSION]
    if within.metric == "step_ms" or not regressed:
        return {}
    steps = compare.within_run(within.run, pairs=[p.selector for p in regressed])
    return {(p.baseline_case, p.candidate_case): Measured.of(p.result) for p in steps.pairs}


def _named(
    r: compare.CaseResult, base_dir: Path, base_case: str, cand_dir: Path, measured: Measured | None = None
) -> compare.CaseResult:
    """``r`` with its top contributor, when it is a regression and both cases have traced steps;
    ``measured``: the step time's figures where ``r`` judged another metric (default: ``r``'s own)."""
    if r.verdict != compare.REGRESSION:
        return r
    found, _ = explain_cases(base_dir, cand_dir, [(base_case, r.case_id, r.label, measured or Measured.of(r))])
    return replace(r, top_contributor=found[0].top) if found else r


def matched_across(base_dir: Path, cand_dir: Path) -> list[Matched]:
    """The finished candidate cases with a counterpart in the baseline (``compare.counterpart``),
    each with what ``compare`` measured of it."""
    return _matched(base_dir, cand_dir)[0]


def _matched(
    base_dir: Path, cand_dir: Path, ignore_env: Sequence[str] = ()
) -> tuple[list[Matched], list[str], list[str], str, dict[str, str]]:
    """``matched_across``, the environment differences that make the runs incomparable, those
    ``ignore_env`` set aside, the line saying the runs are of two suites, or "", and the candidate's
    cases compare calls missing, label → compare's reason (``compare.compare_runs``, whose
    ``GateError`` for a run given twice or an unknown ``ignore_env`` key passes through). Those are
    said beside the explained ones: a case left out without a word read as one explain had covered."""
    base_data, cand_data = compare.RunData.of(base_dir), compare.RunData.of(cand_dir)
    comparison = compare.compare_runs([base_data], [cand_data], ignore_env=ignore_env)
    matched = matched_in(comparison, base_data, cand_data)
    differs, ignored = comparison.environment_differences, comparison.ignored_environment_differences
    unmatched = {r.label: f"missing: {r.reason}" for r in comparison.cases if r.verdict == compare.MISSING}
    return matched, differs, ignored, comparison.suites_differ, unmatched


def matched_in(comparison: compare.Comparison, base: compare.RunData, cand: compare.RunData) -> list[Matched]:
    """``matched_across`` from a step-time comparison already made of ``base`` and ``cand``: a report
    of several runs judges them once and draws its verdicts and its waterfalls from that one result."""
    if comparison.metric != "step_ms":
        raise ValueError(f"explain splits the step time; the comparison is of {comparison.metric}")
    judged = {r.case_id: r for r in comparison.cases}
    out = []
    for cid, params in cand.params.items():
        other, _ = compare.counterpart(params, cid, base)
        if other is None or cand.status[cid] != store.DONE or base.status[other] != store.DONE:
            continue
        out.append((other, cid, judged[cid].label, Measured.of(judged[cid])))
    return out
