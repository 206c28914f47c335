"""The racing rule of ``tpbench tune``, over values alone: no world, no file, no clock.

After each round, once ``min_rounds`` have run, the leader is the live arm with the lowest
geometric mean; an arm whose ratio to the leader is clearly above 1 is eliminated, and one that can
no longer be more than epsilon faster than the leader is retired: it runs no more rounds, and
comes back should a new leader no longer be safe from it over the rounds it ran. Every interval is
paired by round at the confidence the whole race spends, its residual variance pooled over every
value of the world's arms (``stats.blocked_ratios``: the rounds are blocks): the miss probability
split uniformly over the looks the race may take and over the arms other than the best (a
Bonferroni union bound), so the race may look after every round. Why that is valid, and what else
was weighed: docs/tune.md, "The rule".

``tune`` feeds a ``Race`` each world's rounds as they come in and builds the tune's answer from it;
``benchmarks/race_cost.py`` feeds it synthetic rounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Iterable, Mapping

from tpbench.analysis.stats import Ratio, blocked_ratios, geometric_mean, spent_confidence, spent_miss

# Rounds every arm runs before the first elimination or retirement. The pooled variance has (arms − 1)(rounds − 1)
# degrees of freedom, 12 for 7 arms at 3 rounds; an earlier look rests on 1 per pair of arms and
# spends its share of the error on a look that can decide next to nothing.
MIN_ROUNDS = 3
METRICS = ("step_ms", "cpu_ms")
# Why a world's race ended.
ONE_LEFT, ALL_TIED, MAX_ROUNDS, BUDGET = "one arm left", "tied within epsilon", "most rounds run", "budget spent"


class TuneError(ValueError):
    """Bad tune options or a suite that cannot be raced: exit 2."""


@dataclass(frozen=True)
class Options:
    epsilon: float = 0.02  # a fraction: the claim is "no more than epsilon slower than the best"
    confidence: float = 0.95
    budget_s: float | None = None  # wall seconds for the whole tune (None: only the rounds bound it)
    metric: str = "step_ms"
    min_rounds: int = MIN_ROUNDS

    def check(self, typed: Mapping[str, str] | None = None) -> None:
        """One line naming the option and what was expected (``TuneError``). ``typed``: the command
        line's text of ``epsilon`` and ``confidence``, echoed as typed ("--confidence -5%", not the
        -0.05 it reads as); without it (options from tune.json) each value as read."""
        typed = typed or {}
        if not (math.isfinite(self.epsilon) and 0 < self.epsilon < 1):
            raise TuneError(
                f"--epsilon {_as_given(self.epsilon, typed.get('epsilon'))}: expected a margin above 0 and below 1, "
                "like 0.02 (or 2%)"
            )
        if not (math.isfinite(self.confidence) and 0.5 < self.confidence < 1):
            raise TuneError(
                f"--confidence {_as_given(self.confidence, typed.get('confidence'))}: expected a number above 0.5 "
                "and below 1, like 0.95 (or 95%)"
            )
        if self.budget_s is not None and not (math.isfinite(self.budget_s) and self.budget_s > 0):
            raise TuneError(f"--budget-s {self.budget_s:g}: expected a number of seconds > 0")
        if self.metric not in METRICS:
            raise TuneError(f"--metric {self.metric}: expected one of {', '.join(METRICS)}")
        if self.min_rounds < 2:
            raise TuneError(f"--min-rounds {self.min_rounds}: expected at least 2 (an interval needs two rounds)")


def _as_given(value: float, typed: str | None) -> str:
    """An option's fraction in a message: as typed, or as read where nothing was typed, with the
    percentage it reads as unless that is what was typed ("2 (200%)": a bare number is a fraction)."""
    text = (typed or f"{value:g}").strip()
    return text if text.endswith("%") else f"{text} ({100 * value:g}%)"


class Race:
    """The arms of one world raced round by round: values in, eliminations and an ending out.

    ``comparisons``: the arms of the whole tune less one (the union bound covers every interval
    that involves the true best arm, whichever world it is in); ``looks``: the rounds at which the
    race may decide, ``max_rounds - min_rounds + 1``.
    """

    def __init__(
        self,
        arms: list[str],
        max_rounds: int,
        options: Options,
        comparisons: int,
        world: int = 0,
        runs_on: bool = False,
    ) -> None:
        self.arms = list(arms)
        self.world = world
        # One world of several: its race decided, its winner still runs the world's rounds, which the
        # comparison with the other worlds' winners (unpaired: no round cancels the drift) needs.
        self.runs_on = runs_on
        self.max_rounds = max_rounds
        self.min_rounds = min(options.min_rounds, max_rounds)
        self.options = options
        self.comparisons = max(1, comparisons)
        self.values: dict[str, dict[int, float]] = {a: {} for a in arms}
        self.live = list(arms)  # the arms that run the next round
        self.eliminated: dict[str, int] = {}  # arm → the round (1-based) after which it went
        self.retired: dict[str, int] = {}  # arm → the round after which it stopped, tied with the leader
        self.retired_then_out: dict[str, int] = {}  # a retired arm eliminated later → the round it had stopped
        self.failed: set[str] = set()
        self.rounds = 0  # complete rounds judged
        self.decided: str | None = None  # ONE_LEFT or ALL_TIED once the arms left are down to the leader
        self.ended: str | None = None
        self.history: list[dict[str, Any]] = []

    @property
    def looks(self) -> int:
        return self.max_rounds - self.min_rounds + 1

    def record(self, arm: str, round_index: int, value: float) -> None:
        if arm in self.values:
            self.values[arm][round_index] = float(value)

    def drop(self, arm: str) -> None:
        """An arm whose case failed leaves the race (it is reported as failed)."""
        if arm in self.live:
            self.live.remove(arm)
            self.failed.add(arm)

    def round_complete(self) -> bool:
        return self.ended is None and bool(self.live) and all(self.rounds in self.values[a] for a in self.live)

    def judged(self, arm: str) -> dict[int, float]:
        """The arm's values of the rounds judged so far (a replay holds later ones already)."""
        return {r: v for r, v in self.values[arm].items() if r < self.rounds}

    def interval(self, base: str, arm: str) -> Ratio:
        """``arm`` / ``base`` over the judged rounds both ran, at the race's spent confidence
        (``stats.blocked_ratios``: the variance pooled over every value of every arm judged so
        far): for an arm that went, over the rounds it ran, against whichever arm is ``base``."""
        return self._ratios(base)[arm]

    def intervals(self, leader: str) -> dict[str, Ratio]:
        """Every arm still in the race (live or retired) / ``leader``: the ratios the round is
        judged by."""
        if not all(self.judged(a) for a in self.live):
            return {}
        ratios = self._ratios(leader)
        return {a: ratios[a] for a in [*self.live, *self.retired] if a != leader}

    def _ratios(self, base: str) -> dict[str, Ratio]:
        judged = {a: self.judged(a) for a in self.arms if a not in self.failed and self.judged(a)}
        if len(judged) < 2 or base not in judged:
            return {}
        confidence = spent_confidence(self.options.confidence, self.looks, self.comparisons)
        return blocked_ratios(judged, base, confidence=confidence)

    def leader(self) -> str | None:
        """The live arm with the lowest geometric mean over the rounds it ran; None before a round
        was judged (a world the budget ended before it started has no leader to compare)."""
        ran = [a for a in self.live if self.judged(a)]
        return min(ran, key=lambda a: geomean(self.judged(a))) if ran else None

    def close_round(self) -> dict[str, Any]:
        """Judge the round just completed: eliminate, retire, bring back, maybe end; returns the
        round's history entry.

        An arm clearly slower than the leader is eliminated. One that can no longer be more than
        epsilon faster than it is retired: the claim is already safe from it, so it costs nothing
        more. The claim is about the leader at the end, though, and the leader may change; a
        retired arm is therefore checked after every round against the leader of that round, over
        the rounds it ran, and runs again from the next round once that leader is not safe from it.
        The race ends tied when the leader alone is left running.

        A retired arm is still eliminated once its interval shows it slower: its rounds are fixed,
        but the variance they are judged by is pooled over every value the race has, so its
        interval narrows as the others run (an arm far slower than the leader, retired at the first
        look with a low end just under 1, is shown slower a few rounds later)."""
        self.rounds += 1
        leader = self.leader()
        eps = self.options.epsilon
        intervals = self.intervals(leader) if self.rounds >= 2 and leader is not None else {}
        gone: list[str] = []
        retired: list[str] = []
        back: list[str] = []
        if self.rounds >= self.min_rounds:
            gone = [a for a, r in intervals.items() if r.lo > 1]
            retired = [a for a in self.live if a in intervals and a not in gone and within_epsilon(intervals[a], eps)]
            back = [a for a in self.retired if a not in gone and not within_epsilon(intervals[a], eps)]
            for a in gone:
                if a in self.live:
                    self.live.remove(a)
                else:
                    self.retired_then_out[a] = self.retired.pop(a)
                self.eliminated[a] = self.rounds
            for a in retired:
                self.live.remove(a)
                self.retired[a] = self.rounds
            for a in back:
                del self.retired[a]
                self.live.append(a)
        # A world of one arm (or one left by failures) still runs the minimum rounds, and with
        # ``runs_on`` all its rounds: its winner is compared with other worlds' unpaired, and one
        # value a side makes no interval.
        alone = len(self.live) == 1 and self.rounds >= self.min_rounds
        self.decided = (ALL_TIED if self.retired else ONE_LEFT) if alone else None
        if self.decided and not self.runs_on:
            self.ended = self.decided
        elif self.rounds >= self.max_rounds:
            self.ended = MAX_ROUNDS
        entry = {
            "world": self.world,
            "round": self.rounds,
            "leader": leader,
            "live": list(self.live),
            "eliminated": gone,
            "retired": retired,
            "back": back,
            "intervals": {a: [r.ratio, r.lo, r.hi] for a, r in intervals.items()},
            "ended": self.ended,
        }
        self.history.append(entry)
        return entry

    def end(self, why: str) -> None:
        if self.ended is None:
            self.ended = why

    def replay(self, values: dict[str, dict[int, float]], ended: str | None = None) -> None:
        """Rebuild the race from stored values, round by round, as it was run; ``ended``: how the
        saved race ended where that was not a consequence of the values (the budget)."""
        for arm, per_round in values.items():
            for r, v in per_round.items():
                self.record(arm, r, v)
        while self.round_complete():
            self.close_round()
        if ended == BUDGET:
            self.end(BUDGET)

    def rounds_to_decide(self, max_rounds: int | None = None) -> int | None:
        """About how many more rounds would decide every arm still in the race: an interval
        narrows as 1/√n, and each arm needs its half-width (in logs) below the larger of its
        distance above 1 (to be eliminated) and its distance above 1 / (1 + epsilon) (to be tied).

        ``max_rounds``: the same for a race allowed that many rounds instead (a tune raced again with
        more repeats), whose intervals spend the confidence over more looks: each is wider by the
        ratio of the two spent confidences' normal quantiles."""
        widen = 1.0 if max_rounds is None else self._quantile(max_rounds) / self._quantile(self.max_rounds)
        leader = self.leader()
        need = 0
        for r in (self.intervals(leader) if leader is not None else {}).values():
            if r.method != "paired" or r.n < 2:
                continue
            need = max(need, settling_rounds(r, self.options.epsilon, widen) - r.n)
        return need or None

    def _quantile(self, max_rounds: int) -> float:
        """The normal quantile of the interval a race allowed ``max_rounds`` rounds would build."""
        looks = max(1, max_rounds - self.min_rounds + 1)
        return -NormalDist().inv_cdf(spent_miss(self.options.confidence, looks, self.comparisons) / 2)


def settling_rounds(r: Ratio, eps: float, widen: float = 1.0) -> int:
    """About how many values a side in all would decide ``r`` (an arm / the leader, or a world's
    winner / the best arm): an interval narrows as 1/√n, and it decides once its half-width (in
    logs, times ``widen``) is below the ratio's distance above 1 (eliminated) or above
    1 / (1 + eps) (tied); the tie comes first. A ratio more than eps below 1: twice its values."""
    hw = widen * (math.log(r.hi) - math.log(r.lo)) / 2
    target = math.log(r.ratio) + math.log(1 + eps)
    return math.ceil(r.n * (hw / target) ** 2) if target > 0 else 2 * r.n


def within_epsilon(r: Ratio, eps: float) -> bool:
    """Whether ``r`` (an arm / the leader) shows the leader at most ``eps`` slower than the arm.

    One-sided on purpose: the claim is "within epsilon of the best", which an arm that may be
    much slower than the leader does not threaten; only one that may be more than epsilon faster
    does. Asking for ``hi <= 1 + eps`` as well would keep racing arms the claim is already safe
    from, until the budget ends unresolved.
    """
    return r.lo >= 1 / (1 + eps)


def supported_epsilon(ratios: Iterable[Ratio | None]) -> float | None:
    """The smallest margin the intervals of the arms left (each one / the leader) support: the
    leader is at most this much slower than the best of them. None when an arm has no interval.

    It holds at the race's confidence although it is read off the data: the claim fails only if
    the true best arm's interval misses on its low side, the event the race's confidence already
    bounds, and otherwise the leader / best <= 1 / lo of that arm <= 1 + this. So an unresolved
    tune can still say what it resolved: "within 9 % of the best", where ±2 % was asked.
    """
    worst = 1.0
    for r in ratios:
        if r is None or r.method == "single" or not r.lo > 0:
            return None
        worst = min(worst, r.lo)
    return 1 / worst - 1


def geomean(values: dict[int, float]) -> float:
    """An arm's geometric mean over its rounds; none ranks last (``inf``)."""
    return geometric_mean(values.values()) if values else math.inf
