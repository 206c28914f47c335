"""How often does ``tpbench compare``'s interval of two single runs hold the true ratio? (docs/gates.md)

Two runs compared repeat by repeat, one run a side and not paired (``tpbench compare A B`` of two
sweeps), get the bootstrap interval of the ratio of medians (``stats.hierarchical_ratio_ci``).
A percentile bootstrap of a median draws from the few values there are, so with few repeats its
interval is too narrow for its label: this draws both sides' repeats from one log-normal
distribution (true ratio 1), many times, and counts how often the interval holds 1. Nothing is
measured on the machine: the figures are the interval's, for the noise given (the coverage hardly
depends on ``--sd``, the interval scaling with it).

Usage::

    python benchmarks/ratio_coverage.py [--repeats 2,3,4,5,6,8,12] [--trials 1000] [--sd 0.1] [--seed 0]

Prints one line per number of repeats a side: the share of intervals that held the true ratio.
"""

from __future__ import annotations

import argparse

import numpy as np

from tpbench.analysis.stats import CONFIDENCE, hierarchical_ratio_ci


def coverage(repeats: int, trials: int, sd: float, seed: int) -> float:
    """The share of ``trials`` bootstrap intervals of two single runs of ``repeats`` each that hold 1."""
    rng = np.random.default_rng(seed)
    held = 0
    for i in range(trials):
        base, cand = rng.lognormal(0.0, sd, repeats), rng.lognormal(0.0, sd, repeats)
        r = hierarchical_ratio_ci([base], [cand], samples=2000, seed=i)
        held += r.lo <= 1.0 <= r.hi
    return held / trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", default="2,3,4,5,6,8,12", help="repeats a side, comma-separated")
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--sd", type=float, default=0.1, help="the standard deviation of a repeat's log value")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"labelled {CONFIDENCE:.0%}; {args.trials} trials a line, sd {args.sd:g}")
    for n in (int(x) for x in args.repeats.split(",")):
        print(f"{n} repeats a side: held {coverage(n, args.trials, args.sd, args.seed):.1%}")


if __name__ == "__main__":
    main()
