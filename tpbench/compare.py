"""The comparison engine: match the cases of runs, put an interval on each change, call a verdict.

``tpbench compare``, ``tpbench gate`` and the report's "Across runs" section all call ``compare_runs``:
one rule for which cases match (``suite.identity``: runs that differ only in budget keys such as
``repeats`` match case by case), one interval and one set of verdict words.

A gate that fires on noise gets switched off, so a regression is called only on strong evidence:
per case, the ratio of medians candidate/baseline computed over *repeats* (steps within a repeat
are not independent), with a bootstrap confidence interval whose lower end must exceed
1 + threshold. Each interval's verdict and its words come from ``tpbench.verdict`` (the one
vocabulary the report uses too): ``regression``, ``improvement``, ``pass``, ``inconclusive`` (the
CI straddles a threshold, or too few repeats), with the direction ("slower, not shown beyond the
±5% threshold") in ``CaseResult.words``. The engine adds:

- ``incomparable`` the environments differ in what matters (``environment.COMPARABLE_KEYS``), the
                   case ran on a different world (world size, backend, device), or post-local SGD
                   switched within its timed steps and the sides timed other steps
                   (``timed_steps_differences``; other ``steps`` or ``warmup_steps`` are a note)
- ``missing``      the candidate's case has no counterpart in the baseline, or no data

Exit codes: 0 pass or improvement, 1 regression, 3 incomparable or missing, 4 inconclusive with
``fail_on_inconclusive`` (0 otherwise); a regression outranks the rest when verdicts are mixed.

Each side may be several runs (several stored baselines; the rounds of ``tpbench gate``). Their
repeats are pooled for the point estimate and the interval comes from a two-stage bootstrap
(runs, then repeats within runs), so the spread *between* runs, the main source of false alarms
with stored baselines, widens the interval. A single candidate run against several baselines is
judged against their spread: its draws are also scaled by the baselines' run-to-run effects
(``analysis.stats.hierarchical_ratio_ci``).

Runs made side by side are paired (``pairing``): "repeats" for the two runs of a lockstep gate
(repeat i of a case on one side ran right before or after repeat i on the other), "rounds" for
gate rounds of whole sweeps (run i of each side back to back). Each pair gives one log ratio, in
which whatever the machine was doing then cancels, and the interval is Student's t over the pairs
(``analysis.stats.paired_ratio``). Every result carries its half-width: the smallest change the
comparison could have seen, stated beside every verdict.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from tpbench import store
from tpbench.algorithms import COMPARED_PAIRS, LOCALSGD, is_plain_ddp, timed_before_switch
from tpbench.analysis import convergence
from tpbench.analysis.stats import (
    CONFIDENCE,
    Ratio,
    case_ratio,
    hierarchical_ratio_ci,
    metric_columns,
    paired_ratio,
    repeat_values,
    windows_of,
)
from tpbench.environment import COMPARABLE_KEYS, commit_text
from tpbench.record import ADDED_KEYS, RunRecord
from tpbench.suite import Case, SuiteError, identity, labels, ran_together, select, value_text, varying_keys
from tpbench.verdict import IMPROVEMENT as IMPROVEMENT
from tpbench.verdict import INCONCLUSIVE as INCONCLUSIVE
from tpbench.verdict import MIN_REPEATS as MIN_REPEATS
from tpbench.verdict import PASS as PASS
from tpbench.verdict import REGRESSION as REGRESSION
from tpbench.verdict import THRESHOLD, Verdict
from tpbench.verdict import judge as judge
from tpbench.verdict import of as verdict_of

INCOMPARABLE, MISSING = "incomparable", "missing"
# Verdicts from worst to best, the order tallies list them in.
VERDICTS = (REGRESSION, INCOMPARABLE, MISSING, INCONCLUSIVE, IMPROVEMENT, PASS)
EXIT_PASS, EXIT_REGRESSION, EXIT_USAGE, EXIT_INCOMPARABLE, EXIT_INCONCLUSIVE = 0, 1, 2, 3, 4

# Parameters of the world a case ran on: a case that matches on everything else but these is the
# same case on another machine shape, which is incomparable rather than missing.
WORLD_KEYS = ("world_size", "backend", "device", "ranks_per_node")
# The budget keys that set which steps of a repeat are timed. Runs that differ in them still match
# case by case (a step's time does not depend on how many are timed), and the note says so; but
# post-local SGD that switches within its timed steps times another mix of steps under them.
TIMED_KEYS = ("warmup_steps", "steps")


class GateError(ValueError):
    """A gate that cannot be set up as asked (bad threshold, unknown metric, side not found): exit 2."""


# Why ``--ignore-env`` is refused beside one run (``compare RUN``, ``explain RUN --pair``): a run records
# one environment, which all its cases share, so the option would ignore nothing, and taking it
# without a word would let a reader think it did something.
IGNORE_ENV_WITHIN_RUN = "only when runs are compared, not the cases of one run (they share its environment)"


def parse_threshold(text: str) -> float:
    """``5%`` or ``0.05`` → 0.05. A fraction, because the verdict compares ratios with 1 ± it."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise GateError(f"--threshold {text}: expected a percentage like 5% or a fraction like 0.05") from None
    if not math.isfinite(value):
        # float() reads "nan" and "inf": said as out of range, "(a bare number is a fraction: nan%)" read as if
        # NaN were a number, and the hint was for a 5 meant as 5 %.
        raise GateError(
            f"--threshold {text}: not a finite number; expected a percentage like 5% or a fraction like 0.05"
        )
    if not 0 <= value < 1:
        # A bare 5 reads as 500 %: the message says so, since the 5 % it is likely meant as would
        # otherwise go unexplained.
        read = "" if raw.endswith("%") else f" (a bare number is a fraction: {100 * value:g}%)"
        raise GateError(f"--threshold {text}{read}: expected a value in [0%, 100%), like 5% or 0.05")
    return value


@dataclass(frozen=True)
class CaseResult:
    """One candidate case judged against the baseline."""

    case_id: str
    label: str
    verdict: str
    reason: str = ""
    baseline_median: float | None = None
    candidate_median: float | None = None
    # Each side's value whose ratio ``ratio`` is (``stats.Ratio.sides``): the geometric mean over
    # the pairs or repeats a t interval rests on, the median of the pooled repeats for a bootstrap's.
    # The tables show these, so that a side's two numbers and the change between them agree.
    baseline_compared: float | None = None
    candidate_compared: float | None = None
    ratio: float | None = None
    ci_lo: float | None = None
    ci_hi: float | None = None
    baseline_repeats: int = 0
    candidate_repeats: int = 0
    baseline_runs: int = 0
    candidate_runs: int = 0
    # Half the interval's width as a fraction of the ratio: the smallest change this case could
    # have told from none ("resolves ±4%"); None without an interval.
    half_width: float | None = None
    pairs: int = 0  # the pairs a paired interval rests on (0: unpaired)
    # The verdict in the words every output uses (``verdict.Verdict.words``): "slower, not shown
    # beyond the ±5% threshold"; empty without numbers (missing, incomparable by world).
    words: str = ""
    # A regression's top contributor in one sentence (``tpbench.explain.annotate``), where both
    # sides have traced steps; empty otherwise.
    top_contributor: str = ""
    # Within one run, where the two cases reach the workload's target loss after different numbers of
    # steps (``_training``): each side's steps and seconds to it; empty otherwise.
    training: str = ""


PAIRINGS = ("none", "rounds", "repeats")


class _Verdicts:
    """The overall verdict and exit code of a set of case results, and the dict rendered as JSON:
    the same for runs compared (``Comparison``) and cases within one run (``WithinRun``)."""

    cases: list[CaseResult]
    fail_on_inconclusive: bool

    @property
    def verdict(self) -> str:
        """The worst verdict: a confirmed regression outranks not being able to judge some case."""
        return worst_verdict(c.verdict for c in self.cases)

    @property
    def exit_code(self) -> int:
        return exit_code_of(self.verdict, self.fail_on_inconclusive)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"verdict": self.verdict, "exit_code": self.exit_code}


@dataclass(frozen=True)
class GateAnswer:
    """A lockstep gate's answer with ``--target-ci`` (``gate.answers``, as Chromium's Pinpoint
    answers): "same", "different" or "unknown", overall and per case id, beside the verdict, which
    stays ``compare``'s at the threshold. Carried by the ``Comparison`` so that every format says it."""

    answer: str
    answers: dict[str, str]  # case id → that case's answer
    target_ci: float  # the target half-width, a fraction
    stopped: str  # why the gate stopped (gate.json's ``stopped``)

    @property
    def line(self) -> str:
        """The answer in one line, as the gate prints it on stderr and the Markdown summary lists it."""
        return (
            f"Gate answer: {self.answer} (each case's pairs by the sequential rule, target "
            f"±{self.target_ci:.1%}; {self.stopped})"
        )


@dataclass(frozen=True)
class Comparison(_Verdicts):
    """Everything a gate decided, ready to render as text, Markdown or JSON."""

    metric: str
    threshold: float
    confidence: float
    fail_on_inconclusive: bool
    baseline_runs: list[str]
    candidate_runs: list[str]
    environment_differences: list[str]
    cases: list[CaseResult]
    pairing: str = "none"
    baseline_commits: list[str] = field(default_factory=list)
    candidate_commits: list[str] = field(default_factory=list)
    # The differences ``ignore_env`` let through: judged as comparable, but said, so that a verdict
    # across torch versions does not read as one within a single version.
    ignored_environment_differences: list[str] = field(default_factory=list)
    answer: GateAnswer | None = None  # a gate's with --target-ci; None for compare and gates without
    # Labels of the baseline's cases the candidate has no case for (another --filter): not judged, so
    # not in ``cases`` and not in the verdict, but said, where they were left out without a word.
    not_in_candidate: list[str] = field(default_factory=list)
    # Where the two sides' runs are of suites of other names: the line that says so (``suites_apart``),
    # else "". Without it every case of a smoke run against a gate run read "no baseline data", unexplained.
    suites_differ: str = ""

    def bootstrap_repeats(self) -> list[int]:
        """The fewer repeats of a side of each case judged by the bootstrap of one run a side with an
        interval (``tpbench compare A B``, the report's Across runs), for ``verdict.few_repeats_ratio_note``:
        their "95%" heading, which 3 repeats a side do not hold. Empty for paired comparisons."""
        if self.pairing != "none":
            return []
        return [
            min(r.baseline_repeats, r.candidate_repeats)
            for r in self.cases
            if r.ci_lo is not None and r.baseline_runs == 1 and r.candidate_runs == 1
        ]

    def to_dict(self) -> dict[str, Any]:
        """The JSON document: with a gate's answer, its ``answer``, ``answers`` (per case id) and
        ``target_ci`` at the top level; without one, no such keys."""
        doc = super().to_dict()
        del doc["answer"]
        if self.answer is None:
            return doc
        return doc | {"answer": self.answer.answer, "answers": self.answer.answers, "target_ci": self.answer.target_ci}


# ---------------------------------------------------------------- comparing runs


@dataclass(frozen=True)
class RunData:
    """What the comparison needs of one run: its cases and per-repeat values of the metric."""

    dir: Path
    environment: dict[str, Any]
    params: dict[str, dict[str, Any]]  # case_id → params
    status: dict[str, str]  # case_id → status
    values: dict[str, dict[int, float]]  # case_id → repeat → that repeat's value (stats.repeat_values)
    labels: dict[str, str]  # case_id → label (``store.Loaded.cases``)
    metric: str = "step_ms"  # what ``values`` hold
    run_id: str = ""  # run.json's: a copy of a run in another folder keeps it
    suite: str = ""  # the name of the suite it ran (run.json's)

    @classmethod
    def of(cls, run: RunData | store.Loaded | str | Path, metric: str = "step_ms") -> RunData:
        """What the comparison needs of ``run``; one read already for ``metric`` is kept as it is."""
        if isinstance(run, RunData) and run.metric == metric:
            return run
        run = run.dir if isinstance(run, RunData) else run
        loaded = run if isinstance(run, store.Loaded) else store.load(run)
        values: dict[str, dict[int, float]] = {}
        cases = loaded.record.cases
        if not loaded.steps.empty:
            numeric = metric_columns(loaded.steps)
            if metric not in numeric:
                raise GateError(
                    f"--metric {metric}: not recorded in {loaded.run_dir}; expected one of {', '.join(numeric)}"
                )
            windows = windows_of({cid: c.params for cid, c in cases.items()})
            per_repeat = repeat_values(loaded.steps, metric, windows).dropna(subset=[metric])
            values = {
                cid: dict(zip(g["repeat"].astype(int), g[metric].astype(float)))
                for cid, g in per_repeat.groupby("case_id")
            }
        return cls(
            Path(loaded.run_dir),
            dict(loaded.environment),
            {cid: dict(c.params) for cid, c in cases.items()},
            {cid: c.status for cid, c in cases.items()},
            values,
            dict(zip(loaded.cases["case_id"], loaded.cases["label"])),
            metric,
            loaded.record.run_id,
            loaded.record.suite.name,
        )


def _same(a: dict[str, Any], b: dict[str, Any], ignore: Iterable[str] = ()) -> bool:
    """Equal identities on the keys both have (a key added by a newer tpbench must not orphan every
    case), and no added key (``ADDED_KEYS``) on one side only: the identity leaves an added key out
    at its old behaviour, so a case that has it ran another setting of it, and matched on the keys
    both have a packed ``zero_no_overlap`` (``parameters_as_bucket_view = true``) would be judged
    against the unpacked one, or an fp16 ``comm_hook`` against all-reduce."""
    ia, ib = identity(a), identity(b)
    if (ia.keys() ^ ib.keys()) & ADDED_KEYS.keys() - set(ignore):
        return False
    return all(ia[k] == ib[k] for k in ia.keys() & ib.keys() if k not in ignore)


def counterpart(params: dict[str, Any], case_id: str, run: RunData) -> tuple[str | None, str]:
    """The case of ``run`` that measures the same thing (the same stored id, else the same
    identity), or None and why not (the same case on another world is named as such)."""
    if case_id in run.params and _same(params, run.params[case_id]):
        return case_id, ""
    same = [cid for cid, p in run.params.items() if _same(params, p)]
    if same:  # a run that sweeps a budget key has several: the one timed as this case is, if any
        return next((cid for cid in same if _timed(run.params[cid]) == _timed(params)), same[0]), ""
    for p in run.params.values():
        if _same(params, p, WORLD_KEYS):
            diff = ", ".join(f"{k} {p.get(k)} vs {params.get(k)}" for k in WORLD_KEYS if p.get(k) != params.get(k))
            return None, f"different world: {diff}"
    return None, ""


def _timed(params: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(params.get(k) for k in TIMED_KEYS)


def timed_steps_differences(base: Sequence[Mapping[str, Any]], cand: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """How the matched cases of the two sides differ in which steps they time, as (note, why they
    are incomparable), each "" when there is nothing to say. The note names the keys ("steps 8 vs
    40"): each side's per-step values are still compared. Incomparable: post-local SGD whose timed
    steps hold another number of steps before its switch, or as many of another total
    (``algorithms.timed_before_switch``): each side times another mix of global and local SGD."""

    def values(side: Sequence[Mapping[str, Any]], key: str) -> str:
        return "/".join(str(v) for v in dict.fromkeys(p.get(key) for p in side))

    keys = [k for k in TIMED_KEYS if len({p.get(k) for p in [*base, *cand]}) > 1]
    note = ", ".join(f"{k} {values(base, k)} vs {values(cand, k)}" for k in keys)
    mixes = {(timed_before_switch(dict(p)), p.get("steps")) for p in [*base, *cand]}
    if not note or len(mixes) < 2 or not any(before for before, _ in mixes):
        return (f"timed steps differ: {note}" if note else ""), ""

    def mix(side: Sequence[Mapping[str, Any]]) -> str:
        return "/".join(dict.fromkeys(f"{timed_before_switch(dict(p))} of {p.get('steps')}" for p in side))

    return "", (
        f"timed steps differ: {note}; the switch to local SGD comes after {mix(base)} timed steps in the "
        f"baseline, {mix(cand)} in the candidate: each side times another mix of global and local steps"
    )


def environment_differences(
    baseline: dict[str, Any], candidate: dict[str, Any], ignore: Iterable[str] = ()
) -> list[str]:
    """The comparable keys on which two fingerprints differ, as 'key: baseline vs candidate'. A key
    only one of them records is unknown on one side, not a difference: a stored run.json without a
    key compared since (``gpu_count``) stays comparable."""
    skip = set(ignore)
    return [
        f"{k}: {baseline.get(k)} vs {candidate.get(k)}"
        for k in COMPARABLE_KEYS
        if k not in skip and k in baseline and k in candidate and baseline[k] != candidate[k]
    ]


def check_ignore_env(ignore_env: Iterable[str]) -> None:
    """``GateError`` for an ``--ignore-env`` key that is no fingerprint key: ignoring it would ignore nothing."""
    unknown = set(ignore_env) - set(COMPARABLE_KEYS)
    if unknown:
        raise GateError(f"--ignore-env {', '.join(sorted(unknown))}: expected one of {', '.join(COMPARABLE_KEYS)}")


def check_distinct(base: Sequence[RunData], cand: Sequence[RunData]) -> None:
    """``GateError`` for a run given on both sides: every ratio is exactly 1 with an interval, which
    reads as a verdict but is a typo (``compare`` and ``explain`` refuse it alike). Or twice on one
    side: pooled as two runs, its copies agree exactly and narrow the run-to-run spread the
    interval rests on (the report refuses a run given twice too). A copy of a run in another folder
    (the same run id) on the same side is refused alike: pooled, it would count the run's repeats twice.
    A run against its copy stays allowed: an A/A check of the comparison itself."""
    for side in (base, cand):
        dirs = [str(Path(r.dir).resolve()) for r in side]
        twice = sorted({d for d in dirs if dirs.count(d) > 1})
        if twice:
            raise GateError(f"{', '.join(twice)}: given twice; each run counts once among the runs pooled")
        first: dict[str, RunData] = {}
        for r in side:
            if r.run_id and (seen := first.setdefault(r.run_id, r)) is not r:
                raise GateError(
                    f"{r.dir}: the same run as {seen.dir} (run id {r.run_id}, a copy); each run counts once "
                    "among the runs pooled"
                )
    both = sorted({str(Path(b.dir).resolve()) for b in base} & {str(Path(c.dir).resolve()) for c in cand})
    if both:
        raise GateError(
            f"{', '.join(both)}: given as both baseline and candidate; a run compared with itself shows nothing"
        )


def runs_environment_differences(
    base: Sequence[RunData], cand: Sequence[RunData], ignore_env: Iterable[str] = ()
) -> list[str]:
    """Every comparable key on which a baseline run differs from a candidate run, or the candidate
    runs from each other, as 'RUN vs RUN: key: a vs b': what makes runs incomparable (``compare``'s
    verdict, ``explain``'s note), the ``ignore_env`` keys left out."""
    across = {
        f"{Path(b.dir).name} vs {Path(c.dir).name}: {d}"
        for b in base
        for c in cand
        for d in environment_differences(b.environment, c.environment, ignore_env)
    }
    among = {
        f"candidate runs {Path(cand[0].dir).name} vs {Path(c.dir).name}: {d}"
        for c in cand[1:]
        for d in environment_differences(cand[0].environment, c.environment, ignore_env)
    }
    return sorted(across | among)


def compare_runs(
    baseline: Sequence[RunData | store.Loaded | str | Path],
    candidate: Sequence[RunData | store.Loaded | str | Path],
    *,
    metric: str = "step_ms",
    threshold: float = THRESHOLD,
    fail_on_inconclusive: bool = False,
    ignore_env: Iterable[str] = (),
    confidence: float = CONFIDENCE,
    pairing: str = "none",
) -> Comparison:
    """Judge every case of the candidate run(s) against the baseline run(s).

    Lower is better for every metric (times, memory). ``pairing`` (see the module docstring):
    "none", "rounds" (baseline run i and candidate run i ran back to back) or "repeats" (one run a
    side, made in lockstep). Broken run directories raise ``store.StoreError`` naming the file; an
    unknown metric raises ``GateError``.
    """
    if not baseline or not candidate:
        raise GateError("compare needs at least one baseline run and one candidate run")
    if pairing not in PAIRINGS:
        raise GateError(f"pairing {pairing!r}: expected one of {', '.join(PAIRINGS)}")
    if pairing == "rounds" and len(baseline) != len(candidate):
        raise GateError(
            f"paired comparison needs as many baseline as candidate runs, got {len(baseline)} and {len(candidate)}"
        )
    if pairing == "repeats" and not len(baseline) == len(candidate) == 1:
        raise GateError(f"pairing by repeats needs one run a side, got {len(baseline)} and {len(candidate)}")
    check_ignore_env(ignore_env)
    base, cand = _labelled_together(
        [RunData.of(d, metric) for d in baseline], [RunData.of(d, metric) for d in candidate]
    )
    check_distinct(base, cand)
    env_diff = runs_environment_differences(base, cand, ignore_env)
    ignored = sorted(set(runs_environment_differences(base, cand)) - set(env_diff))
    ref = cand[0]
    results = [
        _judge_case(cid, ref.labels[cid], ref.params[cid], base, cand, threshold, confidence, bool(env_diff), pairing)
        for cid in ref.params
    ]
    return Comparison(
        metric,
        threshold,
        confidence,
        fail_on_inconclusive,
        [str(b.dir) for b in base],
        [str(c.dir) for c in cand],
        env_diff,
        results,
        pairing,
        sorted({commit_text(b.environment) for b in base}),
        sorted({commit_text(c.environment) for c in cand}),
        ignored,
        not_in_candidate=not_in_candidate(base, ref),
        suites_differ=suites_apart(base, cand),
    )


def suites_apart(base: Sequence[RunData], cand: Sequence[RunData]) -> str:
    """The line saying that the baseline's runs are of other suites than the candidate's (no name on
    both sides), and whether any candidate case has a baseline case at all, or "". Runs of two suites
    rarely share a case, and each case alone reads "no baseline data for this case": the why is the suites."""
    b, c = sorted({r.suite for r in base}), sorted({r.suite for r in cand})
    if not all([*b, *c]) or set(b) & set(c):
        return ""
    said = f"the baseline ran {_suites(b)}, the candidate {_suites(c)}"
    shared = any(counterpart(p, cid, r)[0] is not None for cr in cand for cid, p in cr.params.items() for r in base)
    return said + ("" if shared else ": no case is in both")


def _suites(names: Sequence[str]) -> str:
    return f"suite{'s' if len(names) > 1 else ''} {', '.join(names)}"


def _labelled_together(base: list[RunData], cand: list[RunData]) -> tuple[list[RunData], list[RunData]]:
    """``base`` and ``cand`` with their cases labelled as one (``suite.labels``, as the report of
    several runs does), not each run by the keys that vary among its own cases: a candidate run at
    ``--filter bucket_cap_mb=1`` labelled its cases without ``bucket_cap_mb``, which then named none
    of the full baseline's three cases of that setting, beside a list of baseline cases it lacked
    that did say it."""
    runs = [*base, *cand]
    names = labels([[Case.from_params(p) for p in r.params.values()] for r in runs])
    out = [replace(r, labels=n) for r, n in zip(runs, names)]
    return out[: len(base)], out[len(base) :]


def not_in_candidate(base: Sequence[RunData], ref: RunData) -> list[str]:
    """The labels of the baseline runs' cases that no case of the candidate ``ref`` measures
    (``counterpart``), in the runs' order, each once: the cases are judged from the candidate's
    side, so these would go unmentioned."""
    return list(
        dict.fromkeys(
            run.labels[cid] for run in base for cid, p in run.params.items() if counterpart(p, cid, ref)[0] is None
        )
    )


def _judge_case(
    case_id: str,
    label: str,
    params: dict[str, Any],
    base: list[RunData],
    cand: list[RunData],
    threshold: float,
    confidence: float,
    env_differs: bool,
    pairing: str,
) -> CaseResult:
    cand_per_run = [r.values.get(case_id) for r in cand]
    base_per_run: list[dict[int, float] | None] = []
    base_params: list[dict[str, Any]] = []
    world_diff = ""
    for run in base:
        cid, why = counterpart(params, case_id, run)
        base_per_run.append(run.values.get(cid) if cid is not None else None)
        base_params += [run.params[cid]] if cid is not None else []
        world_diff = world_diff or why
    if pairing == "rounds":  # keep the rounds where both sides have data, so pairs stay aligned
        both = [(b, c) for b, c in zip(base_per_run, cand_per_run) if b and c]
        base_values, cand_values = [b for b, _ in both], [c for _, c in both]
    else:
        base_values = [v for v in base_per_run if v]
        cand_values = [v for v in cand_per_run if v]
    n_b, n_c = sum(len(v) for v in base_values), sum(len(v) for v in cand_values)
    common = {
        "case_id": case_id,
        "label": label,
        "baseline_repeats": n_b,
        "candidate_repeats": n_c,
        "baseline_runs": len(base_values),
        "candidate_runs": len(cand_values),
    }
    if not any(cand_per_run):
        states = sorted({r.status.get(case_id, "absent") for r in cand})
        return CaseResult(verdict=MISSING, reason=f"no candidate data (case {'/'.join(states)})", **common)
    if not any(base_per_run):
        if world_diff:
            return CaseResult(verdict=INCOMPARABLE, reason=world_diff, **common)
        return CaseResult(verdict=MISSING, reason=_no_baseline_data(params, case_id, base), **common)
    if not base_values:
        return CaseResult(verdict=MISSING, reason="no round has data on both sides", **common)
    if pairing == "repeats" and not base_values[0].keys() & cand_values[0].keys():
        return CaseResult(verdict=MISSING, reason="no repeat ran on both sides", **common)
    b_all = np.concatenate([list(v.values()) for v in base_values])
    c_all = np.concatenate([list(v.values()) for v in cand_values])
    if why := _no_ratio(b_all, c_all, pairing):
        return CaseResult(verdict=INCONCLUSIVE, reason=why, **common)
    est = _estimate(base_values, cand_values, pairing, confidence)
    numbers = {
        "baseline_median": float(np.median(b_all)),
        "candidate_median": float(np.median(c_all)),
        "baseline_compared": est.sides[0],
        "candidate_compared": est.sides[1],
        "ratio": est.ratio,
        "ci_lo": est.lo,
        "ci_hi": est.hi,
        "half_width": est.half_width if est.has_interval else None,
        "pairs": est.n if pairing != "none" else 0,
    }
    said = verdict_of(est, threshold, baseline_n=n_b, candidate_n=n_c)
    note, unlike = timed_steps_differences(base_params, [r.params[case_id] for r in cand if case_id in r.params])
    if env_differs or unlike:
        why = "; ".join(w for w in ("environments differ (see above)" if env_differs else "", unlike or note) if w)
        return CaseResult(verdict=INCOMPARABLE, reason=why, words=said.words, **common, **numbers)
    one_pair = ONE_PAIR.format(PAIRED_UNITS[pairing]) if pairing != "none" and not est.has_interval else ""
    reason = "; ".join(w for w in (_too_few(said), one_pair, note) if w)
    return CaseResult(verdict=said.call, reason=reason, words=said.words, **common, **numbers)


def _no_baseline_data(params: dict[str, Any], case_id: str, base: list[RunData]) -> str:
    """Why a case has no baseline values: its baseline case's status where a baseline run has it
    (failed, pending: an interrupted run, to ``--resume``), as the candidate side says of its own,
    else that no baseline run has such a case."""
    ids = [(run, counterpart(params, case_id, run)[0]) for run in base]
    states = sorted({run.status.get(cid, "absent") for run, cid in ids if cid is not None})
    return f"no baseline data (case {'/'.join(states)})" if states else "no baseline data for this case"


def _no_ratio(b_all: np.ndarray, c_all: np.ndarray, pairing: str) -> str:
    """Why a case's sides give no ratio (a metric that counts nothing: steal_pct, gc_collections at 0),
    else "". Unpaired, the bootstrap compares medians: a candidate's at 0 would read "faster: -100.0%
    [-100.0%, -100.0%]" with a NaN half-width, which ``--format json`` cannot write. Paired, each pair's
    log ratio needs both values above 0."""
    for side, values in (("baseline", b_all), ("candidate", c_all)):
        if pairing == "none" and np.median(values) <= 0:
            return f"{side} median is 0: no ratio"
        if pairing != "none" and values.min() <= 0:
            return f"a {side} repeat's value is {values.min():g}: no ratio"
    return ""


# The reason of a paired case with a single pair (a lockstep gate's budget spent after one round, a
# rounds gate of one round): the pair's ratio stands alone, unjudged, where an unpaired interval
# would have judged the repeats under a heading that says they were paired.
ONE_PAIR = "1 pair (the one {} both sides ran): a paired interval needs 2"
PAIRED_UNITS = {"repeats": "repeat", "rounds": "round"}


def _too_few(said: Verdict) -> str:
    """The reason of a case too few repeats leave unjudged (the clause itself), else ""."""
    return said.clause if said.clause.startswith("too few") else ""


def _estimate(base: list[dict[int, float]], cand: list[dict[int, float]], pairing: str, confidence: float) -> Ratio:
    """The ratio and interval of one case under the comparison's pairing (module docstring).
    Paired, only the pairs count, however few: a lockstep gate stopped by its budget after one
    round, or a rounds gate of one round, would otherwise be judged by an unpaired interval under a
    heading that says "paired" (``_judge_case`` has checked that at least one pair exists)."""
    if pairing == "repeats":
        return paired_ratio(base[0], cand[0], confidence=confidence)
    if pairing == "rounds":
        medians = [(float(np.median(list(b.values()))), float(np.median(list(c.values())))) for b, c in zip(base, cand)]
        return paired_ratio(
            {i: m for i, (m, _) in enumerate(medians)},
            {i: m for i, (_, m) in enumerate(medians)},
            confidence=confidence,
        )
    return hierarchical_ratio_ci(
        [np.array(list(v.values())) for v in base], [np.array(list(v.values())) for v in cand], confidence=confidence
    )


# ---------------------------------------------------------------- comparing the cases of one run


@dataclass(frozen=True)
class CasePair:
    """Two cases of one run that differ in exactly one swept key, the candidate judged against the
    baseline (``result``: the same verdict, interval and half-width as a case of ``compare_runs``).

    ``context``: the other swept keys, as both cases have them (a key moot for the baseline, e.g.
    ``shard_buckets`` against ``zero_no_overlap``, is the candidate's). ``method``: "paired" (the
    two ran round by round in one world: one log ratio per round), "unpaired" or "single"."""

    key: str
    baseline_value: Any
    candidate_value: Any
    context: dict[str, Any]
    baseline_case: str
    candidate_case: str
    method: str
    result: CaseResult

    @property
    def selector(self) -> str:
        """How ``--pair`` names it: ``key=baseline..candidate``."""
        return f"{self.key}={value_text(self.baseline_value)}..{value_text(self.candidate_value)}"


@dataclass(frozen=True)
class WithinRun(_Verdicts):
    """Every comparison of cases within one run (``within_run``), ready to render."""

    run: str
    metric: str
    threshold: float
    confidence: float
    fail_on_inconclusive: bool
    commit: str
    keys: list[str]  # the swept keys pairs may differ in
    pairs: list[CasePair]

    @property
    def cases(self) -> list[CaseResult]:
        return [p.result for p in self.pairs]


def worst_verdict(verdicts: Iterable[str]) -> str:
    """The verdict a set of results is summed up by: a regression outranks not being able to judge."""
    found = set(verdicts)
    return next((v for v in VERDICTS[:-1] if v in found), PASS)


def exit_code_of(verdict: str, fail_on_inconclusive: bool) -> int:
    """The exit code of ``compare``/``gate`` for an overall verdict (module docstring)."""
    return {
        REGRESSION: EXIT_REGRESSION,
        INCOMPARABLE: EXIT_INCOMPARABLE,
        MISSING: EXIT_INCOMPARABLE,
        INCONCLUSIVE: EXIT_INCONCLUSIVE if fail_on_inconclusive else EXIT_PASS,
    }.get(verdict, EXIT_PASS)


def swept_keys(record: RunRecord) -> list[str]:
    """The keys that vary among a run's cases: what a suite sweeps (budget keys included when it
    sweeps them), ``repeats`` as planned (``RunRecord.planned_params``)."""
    return varying_keys([Case.from_params(record.planned_params(cid)) for cid in record.cases])


def _differing(a: Mapping[str, Any], b: Mapping[str, Any], keys: list[str]) -> list[str]:
    """The keys on which two cases differ, a key moot for one of them (None) aside: collapsed by
    the suite, it says nothing about what the two measure (the report's rule, ``verdicts.compare``).
    A workload's parameters (``workload.KEY``) are not keys of their own: set per workload, never
    swept, they differ only beside ``workload`` (mlp's and resnet's ``classes``), and counted apart
    no two workloads would ever differ in one key."""
    return [
        k
        for k in keys
        if not k.startswith("workload.") and a.get(k) is not None and b.get(k) is not None and a.get(k) != b.get(k)
    ]


def any_comparable(cases: Sequence[Case]) -> bool:
    """Whether two of ``cases`` differ in exactly one of the keys that vary among them: a pair
    ``within_run`` would compare once both are done."""
    keys = varying_keys(list(cases))
    params = [c.params() for c in cases]
    return any(len(_differing(a, b, keys)) == 1 for i, a in enumerate(params) for b in params[i + 1 :])


def orient(key: str, a: Mapping[str, Any], b: Mapping[str, Any], order: Sequence[Any]) -> tuple[Any, Any]:
    """(baseline, candidate) of two cases differing in ``key``: post-local SGD against plain DDP,
    the ZeRO hooks as ``algorithms.COMPARED_PAIRS`` has them (interleaved against sequential, each
    against ``zero_no_overlap``), False before True, the smaller number first, else the order the
    run's cases have the values in (``order``: the suite's)."""
    if is_plain_ddp(a) != is_plain_ddp(b):
        return (a, b) if is_plain_ddp(a) else (b, a)
    va, vb = a[key], b[key]
    if key == "algorithm":
        if (vb, va) in COMPARED_PAIRS:
            return a, b
        if (va, vb) in COMPARED_PAIRS:
            return b, a
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (va, vb))
    if isinstance(va, bool) and isinstance(vb, bool):
        first = not va
    elif numeric:
        first = va < vb
    else:
        first = order.index(va) < order.index(vb)
    return (a, b) if first else (b, a)


def within_run(
    run: store.Loaded | str | Path,
    *,
    metric: str = "step_ms",
    threshold: float = THRESHOLD,
    confidence: float = CONFIDENCE,
    fail_on_inconclusive: bool = False,
    pairs: Sequence[str] | None = None,
    filters: Sequence[str] = (),
) -> WithinRun:
    """Judge every pair of done cases of one run that differ in exactly one swept key.

    Per repeat the value of ``metric`` (``stats.repeat_values``); the ratio candidate/baseline of
    two cases by ``stats.case_ratio``, paired by round when they shared a world
    (``suite.ran_together``); the verdict by ``judge`` with ``threshold``, as for runs. ``pairs``
    keeps only the comparisons named ``key=BASELINE..CANDIDATE`` (``select_pairs``); ``filters``
    keeps the cases ``suite.select`` keeps (``--filter``). Raises ``GateError`` for a selector or
    filter naming what the run does not have.
    """
    loaded = run if isinstance(run, store.Loaded) else store.load(run)
    data = RunData.of(loaded, metric)
    keys = swept_keys(loaded.record)
    done = [cid for cid in data.params if data.status[cid] == store.DONE and data.values.get(cid)]
    try:
        # As sweep's --filter: a value no finished case has is named, not silently left out.
        finished = [Case.from_params(data.params[cid]) for cid in done]
        kept = {c.case_id for c in select(finished, filters, where=str(loaded.run_dir))}
    except SuiteError as e:
        raise GateError(str(e)) from None
    if filters and not kept:
        raise GateError(f"--filter {' '.join(filters)}: matches no finished case of {loaded.run_dir}")
    done = [cid for cid in done if cid in kept]
    # Values in the run's order, by their JSON text: a bucket_cap_mb_list value is a list.
    order = {k: list({json.dumps(p.get(k)): p.get(k) for p in data.params.values()}.values()) for k in keys}
    found: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    for i, x in enumerate(done):
        for y in done[i + 1 :]:
            px, py = data.params[x], data.params[y]
            diff = _differing(px, py, keys)
            if len(diff) == 1:
                found.append((diff[0], *orient(diff[0], px, py, order[diff[0]])))
    found.sort(key=lambda m: (keys.index(m[0]), done.index(m[1]["case_id"]), done.index(m[2]["case_id"])))
    if pairs:
        found = select_pairs(found, pairs, keys, order)
    reach = _reach(loaded)
    judged = [_pair(key, base, cand, keys, data, threshold, confidence) for key, base, cand in found]
    judged = [replace(p, result=replace(p.result, training=_training(p, reach, data.params))) for p in judged]
    return WithinRun(
        str(loaded.run_dir),
        metric,
        threshold,
        confidence,
        fail_on_inconclusive,
        commit_text(loaded.environment),
        keys,
        judged,
    )


@dataclass(frozen=True)
class _Trained:
    """How far a case of one run trained, from the run's summary: medians over its repeats."""

    steps: float  # to the target loss (NaN: a repeat never reached it, or the workload knows no target)
    seconds: float  # of training to it
    final: float  # the final held-out loss, nats (NaN: none evaluated)
    eval_every: int  # the held-out loss's evaluations, every that many steps: how fine ``steps`` is


def _reach(loaded: store.Loaded) -> dict[str, _Trained]:
    """Each case's ``_Trained``; empty where the workload evaluates no held-out loss."""
    summary = loaded.summary
    if "final_heldout_loss" not in summary:
        return {}
    rows = summary.reindex(columns=["case_id", "steps_to_target", "time_to_target_s", "final_heldout_loss"])
    cases = loaded.cases
    every = dict(zip(cases["case_id"], cases["eval_every"])) if "eval_every" in cases else {}
    return {
        r["case_id"]: _Trained(
            float(r["steps_to_target"]),
            float(r["time_to_target_s"]),
            float(r["final_heldout_loss"]),
            int(every.get(r["case_id"], 0)),
        )
        for r in rows.to_dict("records")
    }


def _training(p: CasePair, reach: Mapping[str, _Trained], params: Mapping[str, Mapping[str, Any]]) -> str:
    """Said of a pair that does not train alike (post-local SGD's settings, a compressing hook): its cases
    reach the target loss after different numbers of steps, or their final held-out losses end more than
    ``convergence.LEVEL_NATS`` apart, the level band the report's post-local SGD lines and the tune's note
    judge by (in their words: ``convergence.ends_against``). Their updates differ, so the step time the
    verdict compares does not rank how far each trains: a faster step may reach the loss later, or end
    worse. Cases that compute the same update (DDP and the ZeRO variants) train alike and get nothing.
    The steps are only as fine as ``eval_every``, which the line gives, as the report's table caption does."""
    base, cand = reach.get(p.baseline_case), reach.get(p.candidate_case)
    if base is None or cand is None:
        return _unmeasured(p, params)
    reached = not all(math.isnan(v) for v in (base.steps, cand.steps))
    delta = cand.final - base.final
    if not ((reached and base.steps != cand.steps) or abs(delta) > convergence.LEVEL_NATS):
        return ""

    said = []
    if reached:
        every = f"{base.eval_every}" if base.eval_every == cand.eval_every else f"{base.eval_every} → {cand.eval_every}"
        said.append(f"to the target loss {_reached(base, cand)} (held-out loss evaluated every {every} steps)")
    if not math.isnan(delta):
        said.append(f"the candidate {convergence.ends_against(delta, 'the baseline')}")
    return (
        f"does not train alike (medians over repeats): {'; '.join(said)}; the step time compared does not count "
        "how far a step takes the model (the report's Convergence section has the curves)"
    )


# Keys whose values change the update a step computes: a communication hook (fp16 or bf16 compression rounds the
# gradients; a hook of one's own may do anything) and post-local SGD's settings. The other keys (bucket sizes, the
# ZeRO variants, links) compute the same update.
UPDATE_KEYS = (
    "comm_hook",
    "comm_hook_state",
    "start_localSGD_iter",
    "averaging_period",
    "post_local_gradient_allreduce",
)


def _unmeasured(p: CasePair, params: Mapping[str, Mapping[str, Any]]) -> str:
    """Said of a pair whose one key changes the update (``UPDATE_KEYS``, or ``algorithm`` where one side is
    post-local SGD that switches: ``params`` are the run's cases') where the run evaluated no held-out loss:
    the step time compared may be bought with a worse model, and nothing measured tells (the report says the
    same of post-local SGD without a held-out loss)."""
    sides = (params[p.baseline_case], params[p.candidate_case])
    averages = p.key == "algorithm" and any(s["algorithm"] == LOCALSGD and not is_plain_ddp(s) for s in sides)
    if p.key not in UPDATE_KEYS and not averages:
        return ""
    what = "algorithm (post-local SGD's averaging)" if averages else p.key
    return (
        f"may not train alike: {what} changes the update, and no held-out loss was evaluated (eval_every = 0), so "
        "how far a step takes the model is not measured; the step time compared does not count it"
    )


def _reached(base: _Trained, cand: _Trained) -> str:
    """Each side's steps and seconds to the target: "after 30 → 40 steps, 1.82 → 2.22 s of training";
    where one side never reached it, each side apart ("after 40 → never steps" read as a count)."""
    if not (math.isnan(base.steps) or math.isnan(cand.steps)):
        return f"after {base.steps:.0f} → {cand.steps:.0f} steps, {base.seconds:.3g} → {cand.seconds:.3g} s of training"
    side = [
        "never" if math.isnan(t.steps) else f"after {t.steps:.0f} steps ({t.seconds:.3g} s of training)"
        for t in (base, cand)
    ]
    return f"{side[0]} for the baseline, {side[1]} for the candidate"


def _pair(
    key: str,
    base: Mapping[str, Any],
    cand: Mapping[str, Any],
    keys: list[str],
    data: RunData,
    threshold: float,
    confidence: float,
) -> CasePair:
    b, c = data.values[base["case_id"]], data.values[cand["case_id"]]
    context = {k: cand.get(k) if cand.get(k) is not None else base.get(k) for k in keys if k != key}
    context = {k: v for k, v in context.items() if v is not None}
    label = f"{key}: {value_text(base[key])} → {value_text(cand[key])}"
    if context:
        label += " (" + " ".join(f"{k}={value_text(v)}" for k, v in context.items()) + ")"
    sides = {
        "case_id": cand["case_id"],
        "label": label,
        "baseline_median": float(np.median(list(b.values()))),
        "candidate_median": float(np.median(list(c.values()))),
        "baseline_repeats": len(b),
        "candidate_repeats": len(c),
        "baseline_runs": 1,
        "candidate_runs": 1,
    }
    if (least := min(*b.values(), *c.values())) <= 0:
        # The interval is over log ratios: a repeat that counted nothing (gc_collections, steal_pct at 0)
        # has none, and dividing by it stopped the whole comparison with a ZeroDivisionError.
        result = CaseResult(verdict=INCONCLUSIVE, reason=f"a repeat's {data.metric} is {least:g}: no ratio", **sides)
        return CasePair(key, base[key], cand[key], context, base["case_id"], cand["case_id"], "single", result)
    est = case_ratio(b, c, paired=ran_together(base, cand), confidence=confidence)
    numbers = sides | {
        "baseline_compared": est.sides[0],
        "candidate_compared": est.sides[1],
        "ratio": est.ratio,
        "ci_lo": est.lo,
        "ci_hi": est.hi,
        "half_width": est.half_width if est.has_interval else None,
        "pairs": est.n if est.method == "paired" else 0,
    }
    said = verdict_of(est, threshold, baseline_n=len(b), candidate_n=len(c))
    result = CaseResult(verdict=said.call, reason=_too_few(said), words=said.words, **numbers)
    return CasePair(key, base[key], cand[key], context, base["case_id"], cand["case_id"], est.method, result)


Matched = tuple[str, dict[str, Any], dict[str, Any]]  # (key, baseline params, candidate params)


def _spelled(text: str) -> str:
    """A value typed in ``--pair`` as ``value_text`` spells the run's: 1.0 is 1."""
    try:
        return value_text(float(text))
    except ValueError:
        return text.strip()


def select_pairs(
    found: list[Matched], selectors: Sequence[str], keys: list[str], order: Mapping[str, list[Any]]
) -> list[Matched]:
    """The comparisons ``--pair key=BASELINE..CANDIDATE`` names (one per context of the other
    keys), oriented as named: the sides are swapped where the selector reverses ``orient``'s. A
    key or value the run does not sweep, or two values no two done cases differ in alone, is a
    ``GateError`` saying what exists."""
    kept: list[Matched] = []
    for sel in selectors:
        key, eq, values = sel.partition("=")
        base_text, dots, cand_text = (_spelled(v) for v in values.partition(".."))
        key = key.strip()
        if not eq or not dots or not key or not base_text or not cand_text:
            raise GateError(f"--pair {sel}: expected KEY=BASELINE..CANDIDATE, e.g. algorithm=ddp..zero_no_overlap")
        if key not in keys:
            raise GateError(f"--pair {sel}: {key!r} is not swept in this run; swept: {', '.join(keys) or 'nothing'}")
        have = [value_text(v) for v in order[key] if v is not None]
        for v in (base_text, cand_text):
            if v not in have:
                raise GateError(f"--pair {sel}: {key} has no value {v!r} in this run; it has {', '.join(have)}")
        mine = []
        for k, b, c in found:
            sides = (value_text(b[k]), value_text(c[k]))
            if k == key and sides in ((base_text, cand_text), (cand_text, base_text)):
                mine.append((k, b, c) if sides == (base_text, cand_text) else (k, c, b))
        if not mine:
            named = sorted({f"{k}={value_text(b[k])}..{value_text(c[k])}" for k, b, c in found if k == key})
            raise GateError(
                f"--pair {sel}: no two done cases differ only in {key} with these values; "
                f"comparisons of {key} in this run: {', '.join(named) or 'none'}"
            )
        kept += [m for m in mine if m not in kept]
    return kept
