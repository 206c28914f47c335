"""The answer a tune's races give: the recommendation across worlds, each arm's status and ratio to
it, the claim and its margin, the cost against the grid's, and what would decide what is left.

``tpbench.tune`` runs the races (``racing.Race``, one per world) and hands them here once they end;
``result`` reads nothing but the races, the run (its stored repeats and its suite's path) and its
summary, so that a resumed or replayed race gives the same answer. docs/tune.md says what each
status and sentence means.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Collection, Mapping

import numpy as np
import pandas as pd

from tpbench import store, sweep, verdict
from tpbench.analysis import convergence
from tpbench.analysis.convergence import LEVEL_NATS, nats_apart
from tpbench.analysis.stats import (
    Ratio,
    averaging_window,
    case_ratio,
    slowest_rank,
    spent_confidence,
    unpaired_ratio,
)
from tpbench.racing import (
    ALL_TIED,
    BUDGET,
    MAX_ROUNDS,
    ONE_LEFT,
    Options,
    Race,
    geomean,
    settling_rounds,
    supported_epsilon,
    within_epsilon,
)
from tpbench.suite import Case, labels, varying_keys
from tpbench.tune_record import TuneArm, TuneResult, eliminated_vs

RECOMMENDED, TIED, ELIMINATED, UNRESOLVED, FAILED = "recommended", "tied", "eliminated", "unresolved", "failed"
# Traced steps per setting (at least; whole averaging windows for post-local SGD), in one window
# after its one timed repeat (``gate --explain`` traces as many): ``tune --trace``'s sweep
# (``tune_trace``) and the one ``trace_step`` names.
TRACE_STEPS = 5


def trace_steps(windows: list[int]) -> int:
    """At least ``TRACE_STEPS`` traced steps, made of whole averaging windows of each setting whose
    ``averaging_window`` is in ``windows`` (post-local SGD averages every averaging_period-th step),
    so that the traced steps hold that periodic cost as often as the timed ones do."""
    window = math.lcm(*windows)
    return window * math.ceil(TRACE_STEPS / window)


def result(
    run: store.Run, cases: list[Case], races: list[Race], options: Options, wall_s: float, summary: pd.DataFrame
) -> TuneResult:
    """The recommendation across worlds, each arm's status and ratio to it, the claim and the cost;
    ``summary``: the finalized run's, for the held-out loss each arm ends at."""
    n_arms = len(cases)
    across = spent_confidence(options.confidence, 1, n_arms - 1)
    winners = [(r, r.leader()) for r in races if r.leader() is not None]
    best_race, best = min(winners, key=lambda w: geomean(w[0].judged(w[1]))) if winners else (None, None)
    status = _statuses(races, best_race, best, options.epsilon, across)
    ratios = _ratios_to_best(cases, races, best_race, best, across) if best is not None else {}
    if best is not None:
        status[best] = RECOMMENDED
    arms = _arms(cases, races, status, ratios, summary)
    order = {RECOMMENDED: 0, TIED: 1, UNRESOLVED: 2, ELIMINATED: 3, FAILED: 4}
    arms.sort(key=lambda x: (order[x.status], x.ratio if x.ratio is not None else math.inf))
    counts = {s: sum(x.status == s for x in arms) for s in order}
    rec = next((x for x in arms if x.status == RECOMMENDED), None)
    # Every arm failed: nothing was raced, and nothing is recommended (exit 1, as a failed sweep).
    state = FAILED if rec is None else UNRESOLVED if counts[UNRESOLVED] else TIED if counts[TIED] else RECOMMENDED
    across_rounds = _across_rounds(races, best_race, best, options.epsilon, across) if best is not None else 0
    # Only an unresolved tune has rounds left to decide: a world whose own race is open (its arms all
    # eliminated unpaired) does not make a decided tune's claim open.
    open_races = [r for r in races if r.decided is None]
    more = _more_rounds(open_races, rec.rounds, across_rounds) if rec and state == UNRESOLVED else None
    seconds = _round_seconds(run, cases)
    timed_s, grid_timed_s = _timed(seconds, {a: r.rounds for r in races for a in r.arms})
    shown = supported_epsilon(ratios.get(a.case_id) for a in arms if a.status in (TIED, UNRESOLVED)) if rec else None
    claim = _claim(rec, state, counts, n_arms, options, races, more, shown)
    # The rounds the command that would decide it is given: those the estimate asks for, or, where the
    # budget ended the race before its first look (no interval, no estimate), the suite's own.
    total = None
    if rec and more:
        total = rec.rounds + more
    elif rec and _unjudged(races, options):
        total = _suite_rounds(races)
    step = _next_step(run, races, rec, total, options, wall_s) if state == UNRESOLVED else None
    decide_s = _decide_wall_s(arms, seconds, total, wall_s, timed_s) if step and total else None
    trace = _trace_step(run, arms, {c.case_id: averaging_window(c.params()) for c in cases})
    samples = {c.case_id: c.world_size * c.batch_size for c in cases}
    world_of = {a: r.world for r in races for a in r.arms}
    notes = (
        _work_note(rec, arms, samples, options.metric),
        _training_note(rec, arms, options, _reach(run, arms, summary), _steps_apart(summary, arms, cases), world_of),
    )
    note = " ".join(n for n in notes if n) or None
    return TuneResult(
        run_dir=str(run.dir),
        state=state,
        recommended=rec,
        claim=claim,
        arms=arms,
        epsilon=options.epsilon,
        confidence=options.confidence,
        metric=options.metric,
        wall_s=wall_s,
        timed_s=timed_s,
        grid_timed_s=grid_timed_s,
        rounds_to_decide=more,
        supported_epsilon=shown,
        next_step=step,
        decide_wall_s=decide_s,
        next_repeats=_next_repeats(total, races) if step and total else None,
        trace_step=trace,
        training_note=note,
        worlds=_world_lines(races, {a.case_id: a.label for a in arms}, options.epsilon),
    )


def _world_lines(races: list[Race], names: dict[str, str], epsilon: float) -> list[str]:
    """Each world's own answer, where the arms span worlds (another link, world size or backend):
    the claim across worlds sets a setting against another machine's and mostly says which link or
    world is faster, while a world's race says which setting to use on it, on the same intervals
    (paired by round, at the confidence spent over every arm of the tune)."""
    if len(races) < 2:
        return []
    lines = []
    for r in races:
        leader = r.leader()
        if leader is None:  # no round judged: the budget ended first, or every setting failed
            failed = len(r.failed) == len(r.arms)
            why = "failed" if failed else "not raced: the budget was spent before their world started"
            lines.append(f"{', '.join(names[a] for a in r.arms)}: {why}")
            continue
        n, out = len(r.arms) - len(r.failed), len(r.eliminated)
        if n == 1:
            said = "the only setting in its world"
        elif r.decided == ONE_LEFT:
            said = f"the best of {n} in its world"
        elif r.decided == ALL_TIED:
            said = f"within {verdict.percent(epsilon)} of the best of {n} in its world, tied with {len(r.retired)}"
        else:
            said = f"the best guess of {n} in its world, unresolved"
        lines.append(f"{names[leader]}: {said}" + (f"; {out} eliminated" if out else ""))
    return lines


def _statuses(races: list[Race], best_race: Race | None, best: str | None, eps: float, across: float) -> dict[str, str]:
    """Each arm's status but the recommended one's: eliminated or failed in its world; in the best
    arm's world tied with it (or unresolved); in another world, its winner's outcome against the
    best arm, unpaired at the confidence spent ``across`` the arms."""
    status: dict[str, str] = {}
    for r in races:
        for a in r.eliminated:
            status[a] = ELIMINATED
        for a in r.failed:
            status[a] = FAILED
        decided = r.decided is not None
        if r is best_race:
            for a in r.live:
                if a != best:
                    status[a] = TIED if decided else UNRESOLVED
            for a in r.retired:  # checked against this leader after the last round: safe from it
                status[a] = TIED
            continue
        winner = r.leader()
        if winner is None:
            continue
        w = _unpaired_to(best_race, best, r, winner, across)  # a leader has judged rounds: never None
        # The world's arms left share its winner's outcome: they are tied with it (or undecided),
        # unless an arm's own interval against the best shows it slower. Without an interval (a
        # value a side) nothing is decided.
        known = w.method != "single"
        tied = decided and known and within_epsilon(w, eps)
        for a in [*r.live, *r.retired]:
            own = w if a == winner else _unpaired_to(best_race, best, r, a, across)
            out = (known and w.lo > 1) or (own is not None and own.method != "single" and own.lo > 1)
            status[a] = ELIMINATED if out else TIED if tied else UNRESOLVED
    return status


def _ratios_to_best(
    cases: list[Case], races: list[Race], best_race: Race, best: str, across: float
) -> dict[str, Ratio]:
    """Each other arm's ratio to the best one: in the best arm's world the race's own interval (for
    an arm still in it, the one it was tied or left unresolved by; for one that went, over its
    rounds); unpaired elsewhere."""
    ratios: dict[str, Ratio] = dict(best_race.intervals(best))
    for c in cases:
        a = c.case_id
        if a == best:
            continue
        home = next(r for r in races if a in r.arms)
        if a in ratios:
            continue
        if home is best_race:
            if best_race.judged(a):
                ratios[a] = best_race.interval(best, a)
        elif (r := _unpaired_to(best_race, best, home, a, across)) is not None:
            ratios[a] = r
    return ratios


def _unpaired_to(best_race: Race, best: str, race: Race, arm: str, across: float) -> Ratio | None:
    """``arm`` (of another world) / the best arm, unpaired at the confidence spent ``across`` the
    arms; None where the arm ran no round."""
    if not race.judged(arm):
        return None
    return unpaired_ratio(
        np.fromiter(best_race.judged(best).values(), float),
        np.fromiter(race.judged(arm).values(), float),
        confidence=across,
    )


def _across_rounds(races: list[Race], best_race: Race, best: str, eps: float, across: float) -> int:
    """About how many rounds each world would need to decide its winner against the best arm,
    unpaired (``racing.settling_rounds``; 0 where every such comparison is decided). One look, so
    no quantile grows."""
    need = 0
    for r in races:
        winner = r.leader()
        if r is best_race or winner is None:
            continue
        w = _unpaired_to(best_race, best, r, winner, across)
        if w is None or w.method == "single" or w.lo > 1 or within_epsilon(w, eps):
            continue
        need = max(need, settling_rounds(w, eps))
    return need


def _arms(
    cases: list[Case], races: list[Race], status: dict[str, str], ratios: dict[str, Ratio], summary: pd.DataFrame
) -> list[TuneArm]:
    """Each arm as the result shows it, in the grid's order."""
    convergence = summary.set_index("case_id") if "final_heldout_loss" in summary else None
    names = labels([cases])[0]
    swept = varying_keys(cases)
    arms = []
    for c in cases:
        a, rr = c.case_id, ratios.get(c.case_id)
        home = next(r for r in races if a in r.arms)
        retired_at = home.retired.get(a, home.retired_then_out.get(a))
        stopped_at = retired_at or home.eliminated.get(a) or home.rounds
        arms.append(
            TuneArm(
                case_id=a,
                label=names[a],
                params={k: c.params()[k] for k in swept},
                status=status.get(a, UNRESOLVED),
                rounds=len(home.judged(a)),
                ratio=float(rr.ratio) if rr else None,
                lo=float(rr.lo) if rr and rr.method != "single" else None,
                hi=float(rr.hi) if rr and rr.method != "single" else None,
                eliminated_at=home.eliminated.get(a),
                retired_at=retired_at,
                eliminated_vs=eliminated_vs(home.history, a),
                **_converged(convergence, a),
                sat_out=0 if a in home.failed else stopped_at - len(home.judged(a)),
            )
        )
    return arms


def _converged(convergence: pd.DataFrame | None, arm: str) -> dict[str, float | None]:
    """The arm's final held-out loss and time to the target loss from the run's summary (None
    where not measured: JSON has no NaN), by the arm's field names."""
    if convergence is None or arm not in convergence.index:
        return {"heldout_loss": None, "time_to_target_s": None}
    row = convergence.loc[arm]
    taken = {"heldout_loss": "final_heldout_loss", "time_to_target_s": "time_to_target_s"}
    return {k: None if pd.isna(row.get(col)) else float(row[col]) for k, col in taken.items()}


def _reach(run: store.Run, arms: list[TuneArm], summary: pd.DataFrame) -> dict[str, dict[int, float]] | None:
    """Each arm's training seconds to the target loss per round it ran (``convergence.reach_by_repeat``;
    NaN in a round that never reached it), None where the workload knows no target: what the note's
    time-to-target intervals pair by round."""
    if not ("target_loss" in summary and bool(summary["target_loss"].notna().any())):
        return None
    return {a.case_id: convergence.reach_by_repeat(store.case_steps(run.dir, a.case_id)) for a in arms}


def _steps_apart(summary: pd.DataFrame, arms: list[TuneArm], cases: list[Case]) -> str | None:
    """How often the held-out loss was evaluated ("every 10 steps"), where the arms reach the target
    loss after different numbers of steps (or some never do), else None: their updates differ, so
    time per step alone does not rank their time to the target, and the steps are only as fine as
    the evaluations. Settings that compute the same update (DDP and the ZeRO variants) reach it at
    the same step."""
    if "steps_to_target" not in summary:
        return None
    ids = [a.case_id for a in arms if a.status != FAILED]
    if summary[summary["case_id"].isin(ids)]["steps_to_target"].nunique(dropna=False) <= 1:
        return None
    every = sorted({c.eval_every for c in cases if c.case_id in ids})
    return f"every {' or '.join(map(str, every))} steps"


def _training_note(
    rec: TuneArm | None,
    arms: list[TuneArm],
    options: Options,
    reach: dict[str, dict[int, float]] | None,
    apart: str | None,
    world_of: Mapping[str, int],
) -> str | None:
    """Said where the settings do not train alike (post-local SGD averaging now and then, a hook
    that compresses gradients): the race compared the time of a step, which says nothing of how
    far the step takes the model. When the recommended setting's held-out loss ends more than
    ``LEVEL_NATS`` above the lowest one's, the faster steps may have bought a worse model, and the
    claim alone would hide it: the note gives both losses. Where the workload knows its target loss
    and the settings reach it at different steps (``apart``) or end apart, it names the setting
    that reaches it soonest, with intervals (``_to_target``; ``apart`` says how often the held-out loss
    was evaluated, which is how fine the steps are): a user who trains to a loss chooses by
    that, and a bare "soonest" would claim more than a few noisy rounds show. Settings that compute
    the same update (DDP and the ZeRO variants) end level, reach the target together and get no note."""
    scored = [a for a in arms if a.heldout_loss is not None and a.status != FAILED]
    if rec is None or rec.heldout_loss is None or len(scored) < 2:
        return None
    low = min(scored, key=lambda a: a.heldout_loss)
    gap = rec.heldout_loss - low.heldout_loss
    if gap <= LEVEL_NATS and not (apart and reach):
        return None
    said = "The settings do not train alike"
    if gap > LEVEL_NATS:
        said += (
            f": the recommended one's held-out loss ends at {rec.heldout_loss:.3f}, "
            f"{nats_apart(gap)} nats above the lowest ({low.label}, {low.heldout_loss:.3f})"
        )
    else:
        said += f" (they reach the target loss after different numbers of steps, the held-out loss evaluated {apart})"
    if reach:
        said += ". " + _to_target(rec, scored, reach, options.confidence, world_of)
    return (
        f"{said}. The race compared {options.metric} alone, which does not count how far a step takes the "
        "model: weigh the two (the report's Convergence section has the curves)."
    )


def _work_note(rec: TuneArm | None, arms: list[TuneArm], samples: dict[str, int], metric: str) -> str | None:
    """Said where the settings do not take the same samples a step (``batch_size`` is per rank, so
    a world of 2 ranks takes twice a world of 1's): the race ranked time per step, and a setting
    slower per step may train faster per sample. Each such arm's ratio to the recommended one per
    sample is its ratio per step times the recommended arm's samples over its own, interval and all."""
    if rec is None or len({samples[a.case_id] for a in arms}) < 2:
        return None
    mine = samples[rec.case_id]
    per_sample = [
        f"{a.label} ×{a.ratio * f:.2f} [{a.lo * f:.2f}, {a.hi * f:.2f}]"
        for a in arms
        if a is not rec and a.ratio is not None and a.lo is not None and (f := mine / samples[a.case_id]) != 1
    ]
    said = (
        f"The settings do not take the same samples a step (batch_size per rank × world_size: {mine} for the "
        f"recommended one, {', '.join(str(n) for n in sorted(set(samples.values()) - {mine}))} for others), and "
        f"the race compared time per step ({metric})."
    )
    if per_sample:
        said += " Per sample, against the recommended one: " + "; ".join(per_sample) + "."
    return said


def _to_target(
    rec: TuneArm,
    scored: list[TuneArm],
    reach: dict[str, dict[int, float]],
    confidence: float,
    world_of: Mapping[str, int],
) -> str:
    """Which setting reaches the workload's target loss in the least training time (ranked by the
    geometric mean over its rounds, the statistic its ratios compare), against the recommended one and
    the next soonest, each a ratio with its interval: paired by round within a world, Welch's across
    worlds (``world_of``: each arm's race), at the confidence that holds for the soonest against every
    other setting together (Bonferroni). What a user who trains to a loss, not for a number of steps,
    would choose by, and how sure the few rounds a tune gives each setting make it. Its times are
    medians over rounds, as the table's "to target s (median)" and the report's soonest-to-target line
    give them; where a setting it is set against has the lower median, it says the rank is by the
    geometric mean."""
    times = {a.case_id: reach.get(a.case_id, {}) for a in scored}
    reached = [a for a in scored if times[a.case_id] and not any(math.isnan(t) for t in times[a.case_id].values())]
    if not reached:
        return "Time to the target loss: none reaches it in every round it ran"
    ranked = sorted(reached, key=lambda a: geomean(times[a.case_id]))
    soonest = ranked[0]
    each = spent_confidence(confidence, 1, len(scored) - 1)

    def median(arm: TuneArm) -> float:
        return float(np.median(list(times[arm.case_id].values())))

    def against(other: TuneArm) -> str:
        paired = world_of[other.case_id] == world_of[soonest.case_id]
        est = case_ratio(times[other.case_id], times[soonest.case_id], paired=paired, confidence=each)
        said = verdict.of(est)
        how = f" (resolves {verdict.half_width_pct(est.half_width)})" if est.has_interval else ""
        return f"({median(other):.3g} s): {said.text}{'' if said.says_resolution else how}"

    runner = next((a for a in ranked[1:] if a is not rec), None)
    shown = [a for a in (rec, runner) if a is not None and a is not soonest and a in reached]
    mine = "the recommended one" if soonest is rec else soonest.label
    head = (
        f"Time to the target loss (training seconds, medians over rounds; intervals at "
        f"{verdict.percent(each)} each, so that the soonest against all {len(scored) - 1} others holds at "
        f"{verdict.percent(confidence)})"
    )
    # Any setting with a lower median (the table's "to target s (median)" column shows them all), named where
    # this note does not set it against the soonest.
    lower = min(reached, key=median)
    first = ""
    if median(lower) < median(soonest):
        first = "; first by the geometric mean over rounds, which the ratios compare"
        if lower not in shown:
            first += f"; the lowest median is {lower.label}'s, {median(lower):.3g} s"
    parts = [f"{head}: {mine} reaches it soonest ({median(soonest):.3g} s of training{first})"]
    if soonest is not rec:
        parts.append(
            f"against the recommended one {against(rec)}"
            if rec in reached
            else "the recommended one does not reach it in every round it ran"
        )
    if runner is not None:
        parts.append(f"against the next soonest, {runner.label} {against(runner)}")
    return "; ".join(parts)


def _claim(
    rec: TuneArm | None,
    state: str,
    counts: dict[str, int],
    n: int,
    options: Options,
    races: list[Race],
    more: int | None,
    shown: float | None,
) -> str:
    """The one sentence: which setting, how close to the best, how sure, and what the others did."""
    if rec is None:
        return f"no recommendation: every one of the {n} settings failed"
    conf = f"{verdict.percent(options.confidence)} confidence"
    gone = f"{counts[ELIMINATED]} eliminated"
    failed = f", {counts[FAILED]} failed" if counts[FAILED] else ""
    if state == RECOMMENDED:
        return f"{rec.label}: the best of {n} settings, {conf}; {gone}{failed}"
    if state == TIED:
        return (
            f"{rec.label}: within {verdict.percent(options.epsilon)} of the best of {n} settings, {conf}; "
            f"tied with {counts[TIED]}, {gone}{failed}"
        )
    # Why the rounds stopped: those of the worlds whose race is open, else (the worlds' winners not
    # told apart, unpaired) of any world.
    why = (
        sorted({r.ended for r in races if r.decided is None} - {None})
        or sorted({r.ended for r in races} - {None, ONE_LEFT, ALL_TIED})
        or [MAX_ROUNDS]
    )
    then = f"; about {more} more round{'' if more == 1 else 's'} would decide it" if more else ""
    # The margin as a change without its sign: "5.7%", "0.04%" (not "0.0%"), "3.66e+56%" at ten nines.
    resolved = (
        f"; the rounds run show it within {verdict.signed_pct(1 + shown)[1:]} of the best" if shown is not None else ""
    )
    tied = f"tied with {counts[TIED]}, " if counts[TIED] else ""
    # A budget spent before the first look: "may still be ... at 95% confidence" alone reads as judged.
    ran = max((r.rounds for r in races), default=0)
    early = (
        f"; nothing was judged: the budget ran out after {ran} round{'' if ran == 1 else 's'}, before the "
        f"{options.min_rounds} the race judges from (--min-rounds)"
        if _unjudged(races, options)
        else ""
    )
    # "most rounds run", the race's own word, read as "most of the rounds": say all, and how many.
    why = [f"all {_suite_rounds(races)} rounds run" if w == MAX_ROUNDS else w for w in why]
    return (
        # One-sided, as the tie (docs/tune.md, "The rule"): an arm left open is one that may be more than
        # epsilon faster; one that may only be slower is no threat to the claim ("±" read as two-sided).
        f"{rec.label}: the best guess of {n} settings, unresolved ({', '.join(why)}): {counts[UNRESOLVED]} "
        f"may still be over {verdict.percent(options.epsilon)} faster at {conf}, "
        f"{tied}{gone}{failed}{resolved}{then}{early}"
    )


def _unjudged(races: list[Race], options: Options) -> bool:
    """The budget ended the race before its first look (``--min-rounds``): nothing was judged."""
    ran = max((r.rounds for r in races), default=0)
    return any(r.ended == BUDGET for r in races) and ran < options.min_rounds


def _suite_rounds(races: list[Race]) -> int:
    """The most rounds the races were allowed (the suite's ``repeats``)."""
    return max((r.max_rounds for r in races), default=0)


def _more_rounds(races: list[Race], rounds: int, across: int = 0) -> int | None:
    """About how many rounds beyond ``rounds`` (the recommended arm's) a race of these settings
    would need to decide the ``races`` still open (``Race.rounds_to_decide``) and the worlds'
    winners against the best (``across``: ``_across_rounds``). The race would be a fresh one given
    that many rounds in all (or its suite's repeats, if more), spending its confidence over more
    looks than these did: the estimate is asked again for a race that long until it settles. None
    without one."""
    total = max([across, *(r.rounds + n for r in races if (n := r.rounds_to_decide()))])
    if not total:
        return None
    for _ in range(20):  # the quantile grows as the log of the looks: a few steps settle it
        again = max([across, *(r.rounds + (r.rounds_to_decide(max(total, r.max_rounds)) or 0) for r in races)])
        if again <= total:
            break
        total = again
    return total - rounds if total > rounds else None


def _next_step(
    run: store.Run, races: list[Race], rec: TuneArm | None, rounds: int | None, options: Options, wall_s: float
) -> str | None:
    """What to run to decide an unresolved tune: the same suite raced afresh for about ``rounds``,
    those the estimate says would decide it (``_more_rounds``), or the suite's own where the budget
    ended it before anything was judged (at least the repeats it had), and, where the budget ended
    it, the wall time those rounds took here, scaled. Afresh, because the rounds run here were
    judged at the confidence this tune's rounds and budget spent: a race that went on with more
    would look more often than its intervals allowed for. None without ``rounds``."""
    if rec is None or not rounds:
        return None
    ended = {r.ended for r in races}
    own = _own_sets(run, ["repeats"])
    parts = [f"tpbench tune {run.record.suite.command_path}", *own, *_own_out(run), *_own_launcher(run)]
    parts += [f"--filter {shlex.quote(f)}" for f in run.record.suite.filters]
    parts.append(f"--set repeats={_next_repeats(rounds, races)}")
    defaults = Options()
    if options.epsilon != defaults.epsilon:
        parts.append(f"--epsilon {verdict.percent(options.epsilon)}")
    if options.confidence != defaults.confidence:
        parts.append(f"--confidence {verdict.percent(options.confidence)}")
    if options.metric != defaults.metric:
        parts.append(f"--metric {options.metric}")
    if options.min_rounds != defaults.min_rounds:
        parts.append(f"--min-rounds {options.min_rounds}")
    if BUDGET in ended or options.budget_s is not None:
        parts.append(f"--budget-s {math.ceil(wall_s * rounds / max(rec.rounds, 1))}")
    return " ".join(parts)


def _next_repeats(rounds: int, races: list[Race]) -> int:
    """The most rounds ``_next_step``'s race is given: the ``rounds`` the estimate asks for, or the
    suite's own repeats where those are more (a tune the budget ended early), which the estimate's
    looks were already counted over (``_more_rounds``)."""
    return max(rounds, _suite_rounds(races))


def traced_arms(arms: list[TuneArm]) -> list[TuneArm]:
    """The arms whose time a trace should split: the recommended one and its closest rival (the tied
    or unresolved arm nearest it, else the runner-up among the eliminated: why it is slower is then
    the question), where there is one; none where nothing is recommended."""
    rec = next((a for a in arms if a.status == RECOMMENDED), None)
    if rec is None:
        return []
    close = [a for a in arms if a.status in (TIED, UNRESOLVED) and a.ratio is not None]
    out = [a for a in arms if a.status == ELIMINATED and a.ratio is not None]
    rival = min(close or out, key=lambda a: a.ratio, default=None)
    return [rec] if rival is None else [rec, rival]


def _trace_step(run: store.Run, arms: list[TuneArm], windows: Mapping[str, int]) -> str | None:
    """The sweep that shows where the recommended arm's time goes, beside its closest rival's
    (``traced_arms``): a tune traces nothing, and a sweep of the two traces both, so that its report
    splits their steps into compute, exposed communication and idle and ``whatif`` can replay them.
    Selected by case id, which the budget keys do not change; with ``--trace``'s budget (one repeat,
    ``trace_steps`` traced steps in one window; ``windows``: each arm's ``averaging_window``), since
    the suite's own may trace nothing (``capture.profiler_steps = 0``, tune-planted's) after hundreds
    of repeats."""
    traced = traced_arms(arms)
    if not traced:
        return None
    ids = "|".join(a.case_id for a in traced)
    steps = trace_steps([windows.get(a.case_id, 1) for a in traced])
    budget = ["repeats=1", f"capture.profiler_steps={steps}", "capture.trace_windows=1"]
    # Quoted: | is a shell pipe.
    return " ".join(
        [
            f"tpbench sweep {run.record.suite.command_path}",
            *_own_sets(run, [b.partition("=")[0] for b in budget]),
            *_own_out(run),
            *_own_launcher(run),
            f"--filter {shlex.quote('id=' + ids)}",
            *(f"--set {b}" for b in budget),
        ]
    )


def _own_sets(run: store.Run, given: Collection[str]) -> list[str]:
    """The tune's own ``--set`` but those of the keys ``given`` (the command sets its own: its rounds,
    its traced steps; a key set twice to two values is refused), for a command that must make the
    same settings: another key's value changes the case ids."""
    sets = (s for s in run.record.suite.overrides if s.partition("=")[0].strip() not in given)
    return [f"--set {shlex.quote(s)}" for s in sets]


def _own_out(run: store.Run) -> list[str]:
    """The tune's own results root, where it is not the default ``results``: pasted without it, a
    command the tune suggests wrote its run under ./results, apart from this one."""
    root = Path(run.dir).parent.parent
    return [] if root.resolve() == Path("results").resolve() else [f"--out {shlex.quote(str(root))}"]


def _own_launcher(run: store.Run) -> list[str]:
    """The tune's own torchrun options (none for the local launcher), so that a command it suggests
    runs "under the same launcher", as it says: pasted without them after a torchrun tune, it ran its
    worlds locally, and where the suite's sizes are "auto" made other case ids (no case matched)."""
    launcher = sweep.launcher_of(run.record)
    return [] if launcher is None else [shlex.join(launcher.options())]


def _round_seconds(run: store.Run, cases: list[Case]) -> dict[str, pd.Series]:
    """Each arm's timed-step seconds per round it ran (slowest rank per step); arms without steps left out."""
    out = {}
    for c in cases:
        rows = store.case_steps(run.dir, c.case_id)
        if not rows.empty:
            out[c.case_id] = slowest_rank(rows.assign(case_id=c.case_id)).groupby("repeat")["step_ms"].sum() / 1e3
    return out


def _timed(seconds: Mapping[str, pd.Series], rounds: Mapping[str, int]) -> tuple[float, float]:
    """The timed-step seconds the tune ran (every arm and round, ``_round_seconds``), and what the
    grid would have timed: each arm's mean per round times the ``rounds`` its world's race ran. In
    one world those are the recommended arm's rounds; across worlds, each world's own, so that the
    tune's share stays at most 1 where the budget cut one world short of another."""
    timed = sum(float(s.sum()) for s in seconds.values())
    return timed, sum(float(s.mean()) * rounds.get(a, 0) for a, s in seconds.items())


def _decide_wall_s(
    arms: list[TuneArm], seconds: Mapping[str, pd.Series], rounds: int, wall_s: float, timed_s: float
) -> float | None:
    """At most about how long, in wall time here, the race ``_next_step`` names would take: each arm
    still in reach of the recommended one (and that one) timed for all ``rounds`` rounds at its mean
    per round, each arm this race decided for the rounds it ran here (its gap, which decided it,
    stays), the whole scaled by this tune's wall time over its timed steps (start-up, models, the
    race's own work). A race that decides sooner, or retires an arm on the way, takes less: the
    front door's said 6 min and took 4 (docs/tune.md). None without timed steps."""
    if not timed_s or not seconds:
        return None
    live = (RECOMMENDED, UNRESOLVED)
    timed = sum(
        float(seconds[a.case_id].mean()) * (rounds if a.status in live else a.rounds)
        for a in arms
        if a.case_id in seconds
    )
    return timed * wall_s / timed_s
