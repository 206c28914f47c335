"""What does a race cost, given its arms' gaps and its rounds' noise? (docs/tune.md, "The cost target")

``tpbench tune``'s cost share, ``timed_s / grid_timed_s``, is set by how far each arm is from the
best and by the fixed rounds every arm runs before the first decision, not by the rule's constants.
This runs the tune's own race (``racing.Race``: elimination, retirement, the spent confidence) on
synthetic rounds, many times over, so that the share's distribution can be read for a given
suite: a round's value per arm is ``base · ratio · exp(round effect + noise)``, the noise of one
standard deviation per value (``--sd`` is that of a round's log ratio between two arms, which is
what ``benchmarks/round_noise.py`` and a tune's own rounds measure; a value's is ``sd / √2``).
Nothing is measured on the machine: the figures are the rule's, for the gaps and noise given.

Usage::

    python benchmarks/race_cost.py [--ratios 1,1.036,...] [--sd 0.08] [--races 200] [--epsilon 0.02]
        [--repeats 300] [--min-rounds 3] [--seed 0]

Prints, per setting, the cost share's median and 10th/90th percentiles, how often it is at most
0.5 and 0.35, the recommended arm's rounds, how often the recommendation was more than epsilon
slower than the best (the claim's error rate, which the rule bounds by 1 − confidence), and how often
the race ran out of rounds (unresolved: the loaded check fails however low its share).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import numpy as np

from tpbench import racing

# Suites/tune-planted.toml's seven arms as measured beside one busy loop on the 2-core machine
# (30 rounds of every arm, steps interleaved; docs/tune.md).
LOADED_RATIOS = (1.0, 1.036, 1.059, 1.102, 1.133, 1.212, 1.349)


@dataclass(frozen=True)
class Outcome:
    share: float  # timed seconds over the grid's (every arm for the recommended arm's rounds)
    rounds: int  # the recommended arm's
    wrong: bool  # the recommended arm is more than epsilon slower than the best
    resolved: bool  # ended with one arm left or tied, not out of rounds (an unresolved tune recommends nothing)


def race_once(
    ratios: tuple[float, ...], sd: float, rng: np.random.Generator, options: racing.Options, repeats: int
) -> Outcome:
    """One race of synthetic rounds; each arm's cost per round is proportional to its ratio."""
    arms = [f"arm{i}" for i in range(len(ratios))]
    race = racing.Race(arms, repeats, options, comparisons=len(arms) - 1)
    ran = dict.fromkeys(arms, 0)
    while race.ended is None:
        block = rng.normal(0.0, sd)  # a slow round slows every arm alike: pairing removes it
        for a in list(race.live):
            i = arms.index(a)
            race.record(a, race.rounds, ratios[i] * math.exp(block + rng.normal(0.0, sd / math.sqrt(2))))
            ran[a] += 1
        race.close_round()
    best = arms.index(race.leader())
    rounds = ran[arms[best]]
    timed = sum(ran[a] * r for a, r in zip(arms, ratios))
    wrong = ratios[best] > min(ratios) * (1 + options.epsilon)
    return Outcome(timed / (rounds * sum(ratios)), rounds, wrong, race.ended != racing.MAX_ROUNDS)


def summary(outcomes: list[Outcome]) -> str:
    share = np.array([o.share for o in outcomes])
    rounds = np.array([o.rounds for o in outcomes])
    p10, p50, p90 = np.quantile(share, [0.1, 0.5, 0.9])
    return (
        f"share median {p50:.2f} (p10 {p10:.2f}, p90 {p90:.2f}); <= 0.5 in {np.mean(share <= 0.5):.0%}, "
        f"<= 0.35 in {np.mean(share <= 0.35):.0%}; rounds median {np.median(rounds):.0f} "
        f"({rounds.min()}-{rounds.max()}); wrong {sum(o.wrong for o in outcomes)}/{len(outcomes)}; "
        f"out of rounds {sum(not o.resolved for o in outcomes)}/{len(outcomes)}; resolved with a share <= 0.5 "
        f"(the loaded check's cost part) {np.mean([o.resolved and o.share <= 0.5 for o in outcomes]):.0%}"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ratios", default=",".join(map(str, LOADED_RATIOS)), help="each arm's true ratio to the best")
    p.add_argument("--sd", type=float, default=0.08, help="standard deviation of a round's log ratio")
    p.add_argument("--races", type=int, default=200)
    p.add_argument("--epsilon", type=float, default=0.02)
    p.add_argument("--repeats", type=int, default=300, help="the most rounds (suites/tune-planted.toml's repeats)")
    p.add_argument("--min-rounds", type=int, default=racing.MIN_ROUNDS)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    # Checked here, in argparse's one line and exit 2: a word in --ratios, an --epsilon out of range or
    # --races 0 used to end in a traceback (the last after every race had run).
    try:
        ratios = tuple(float(x) for x in a.ratios.split(","))
    except ValueError:
        p.error(f"--ratios {a.ratios}: expected numbers separated by commas, like 1,1.05,1.2")
    for name in ("races", "repeats"):
        if getattr(a, name) < 1:
            p.error(f"--{name} {getattr(a, name)}: expected at least 1")
    options = racing.Options(epsilon=a.epsilon, min_rounds=a.min_rounds)
    try:
        options.check()
    except racing.TuneError as e:
        p.error(str(e))
    rng = np.random.default_rng(a.seed)
    outcomes = [race_once(ratios, a.sd, rng, options, a.repeats) for _ in range(a.races)]
    print(f"ratios {ratios}, sd {a.sd}, epsilon {a.epsilon}, repeats {a.repeats}, min rounds {a.min_rounds}:")
    print(summary(outcomes))


if __name__ == "__main__":
    main()
