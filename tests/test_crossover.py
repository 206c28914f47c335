"""Crossover estimation on synthetic data whose answer is known, and the pairing of cases into points."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from tpbench.analysis import crossover
from tpbench.analysis.crossover import INTERLEAVED, REFERENCE, SEQUENTIAL
from tpbench.analysis.stats import case_ratio


def synthetic_points(xs, ratio_of_x, *, repeats=6, noise=0.03, drift=0.0, paired=False, seed=1) -> pd.DataFrame:
    """``ratio_points``-shaped rows: sequential repeats around 100 ms, interleaved ones around
    100·ratio(x), each repeat off by a lognormal ``noise`` of its own and, when ``drift``, by a
    lognormal drift its round shares with the other case (a busy machine); the CI columns come from
    stats.case_ratio, paired by round when ``paired``."""
    rng = np.random.default_rng(seed)
    rows = []
    for x in xs:
        shared = np.exp(rng.normal(0, drift, repeats))
        b = 100 * shared * np.exp(rng.normal(0, noise, repeats))
        c = 100 * ratio_of_x(x) * shared * np.exp(rng.normal(0, noise, repeats))
        est = case_ratio(dict(enumerate(b)), dict(enumerate(c)), paired=paired)
        rows.append(
            {
                "comm_compute": x,
                "ratio": est.ratio,
                "ratio_lo": est.lo,
                "ratio_hi": est.hi,
                "half_width": est.half_width,
                "paired": paired,
                "sequential_reps": b.tolist(),
                "interleaved_reps": c.tolist(),
            }
        )
    return pd.DataFrame(rows)


XS = [0.25, 0.5, 1, 2, 4, 8, 16]


def test_finds_a_known_crossover_with_an_interval_that_covers_it():
    x0 = 3.0
    pts = synthetic_points(XS, lambda x: (x / x0) ** 0.15)
    est = crossover.estimate_crossover(pts)
    assert est.x == pytest.approx(x0, rel=0.25)
    assert est.lo < est.x < est.hi and est.hi / est.lo < 4
    # Over repeated experiments the interval covers the truth about as often as it says (a percentile
    # bootstrap over 6 rounds runs a little narrow: 90% of 60 seeds when measured).
    covered = [
        (e.lo < x0 < e.hi)
        for e in (
            crossover.estimate_crossover(synthetic_points(XS, lambda x: (x / x0) ** 0.15, seed=k)) for k in range(40)
        )
    ]
    assert np.mean(covered) >= 0.85
    assert est.slope > 0 and est.slope_lo > 0
    assert est.crossing_share > 0.95 and len(est.interleaved_at) >= 2 and len(est.sequential_at) >= 2
    assert est.placed and est.low_side == "interleaved" and est.fit_placed
    text = est.sentence()
    assert re.match(rf"Interleaved wins below comm:compute ≈ {est.x:.2g} \[{est.lo:.2g}, {est.hi:.2g}\]", text)
    assert f"interleaved clearly faster at {len(est.interleaved_at)} point(s) (comm:compute 0.25–" in text
    assert f"each resolving ±{est.half_width:.1%} or better" in text
    assert est.ratio_at(np.array([est.x]))[0] == pytest.approx(1.0)  # the plotted line crosses 1 at the estimate


def test_interval_widens_with_noise_and_still_covers_the_truth():
    x0 = 2.0
    quiet = crossover.estimate_crossover(synthetic_points([0.5, 1, 2, 4, 8], lambda x: (x / x0) ** 0.2, noise=0.01))
    loud = crossover.estimate_crossover(synthetic_points([0.5, 1, 2, 4, 8], lambda x: (x / x0) ** 0.2, noise=0.08))
    assert loud.hi / loud.lo > quiet.hi / quiet.lo
    assert loud.lo < x0 < loud.hi


def test_the_refit_resamples_rounds_together_when_the_pair_ran_together():
    """Rounds drift by 30% together: paired by round the drift cancels in each point and in each
    bootstrap refit; resampled as independent repeats it would swamp the 15% effect."""
    x0 = 2.0
    kw = dict(noise=0.01, drift=0.3, repeats=8)
    paired = crossover.estimate_crossover(synthetic_points(XS, lambda x: (x / x0) ** 0.15, paired=True, **kw))
    unpaired = crossover.estimate_crossover(synthetic_points(XS, lambda x: (x / x0) ** 0.15, paired=False, **kw))
    assert paired.placed and paired.lo < x0 < paired.hi and paired.hi / paired.lo < 2
    assert paired.half_width < 0.03 < unpaired.half_width
    assert not unpaired.placed or unpaired.hi / unpaired.lo > 3 * paired.hi / paired.lo


def test_a_fitted_crossing_without_points_that_differ_is_not_a_crossover():
    """The issue's case: the line through noisy points crosses 1 inside the range, but no single
    point differs from 1. No winner is named on either side; the statement bounds the difference."""
    pts = synthetic_points([1.4, 3, 6, 12, 19], lambda x: (x / 5) ** 0.01, noise=0.03, repeats=4, seed=2)
    est = crossover.estimate_crossover(pts)
    assert est.x is not None  # the line crosses 1 inside the range
    assert not est.interleaved_at and not est.sequential_at and not est.placed
    spread = max(np.maximum(pts["ratio_hi"] - 1, 1 - pts["ratio_lo"]))
    assert est.spread == pytest.approx(spread)
    # Every interval inside the threshold the verdicts judge by: the hooks are alike here.
    assert est.sentence(threshold=0.1) == (
        f"No crossover within comm:compute 1.4–19: interleaved and sequential within ±{spread:.1%} at every "
        "measured point (5 points)."
    )
    # Wider than the ±5 % the report judges by: no crossover is ruled out either.
    assert est.sentence().startswith("No crossover placed within comm:compute 1.4–19, and none ruled out: not resolved")


def test_intervals_too_wide_to_resolve_anything_say_so_and_what_would_resolve_them():
    """Two noisy repeats a point: the report said "interleaved and sequential within ±159.6% at every
    measured point", a bound that tells a user nothing and reads as "no crossover". Now: not
    resolved, with the widest interval and at most about how many times the rounds would resolve
    the verdicts' ±5 % (an interval narrows as 1/√rounds)."""
    pts = synthetic_points([1.4, 3, 6, 12, 19], lambda x: 1.0, noise=0.25, repeats=3, seed=2)
    est = crossover.estimate_crossover(pts)
    assert not est.interleaved_at and not est.sequential_at and est.spread > 1
    times = int(np.ceil((np.log1p(est.half_width) / np.log1p(0.05)) ** 2))
    assert est.sentence() == (
        "No crossover placed within comm:compute 1.4–19, and none ruled out: not resolved, no point tells the hooks "
        f"apart (5 points; the widest interval could only resolve ±{est.half_width:.1%} (its half-width, the table's "
        f"resolves); at most about {times} times the rounds run would resolve ±5%, e.g. sweep --target-ci 5%)."
    )
    assert "within ±" not in est.sentence()


def test_an_unresolved_point_is_said_by_its_half_width_as_the_table_beside_it_says_it():
    """suites/zero.toml on 3 repeats: a point's interval [0.06, 36.6] read "intervals up to ±3563.1%" (how far
    it reaches above 1) in the sentence while the table under it, in the same "±", gave its half-width,
    ±2362.0%. The sentence now gives the half-width and names it."""
    pts = synthetic_points([1.4, 3, 6], lambda x: 1.0, noise=0.01)
    pts.loc[1, ["ratio_lo", "ratio_hi"]] = (0.06, 36.6)
    pts.loc[1, "half_width"] = np.sqrt(36.6 / 0.06) - 1  # stats.half_width: ±2370%
    text = crossover.estimate_crossover(pts).sentence()
    assert "could only resolve ±2369.8% (its half-width, the table's resolves)" in text
    assert "3560" not in text
    assert "at most about 4320 times the rounds run would resolve ±5%" in text  # (log 24.7 / log 1.05)²


def test_one_hook_faster_everywhere_is_said_as_such():
    pts = synthetic_points([0.5, 1, 2, 4], lambda x: 1.2 + 0.02 * x, noise=0.01)  # sequential always faster
    est = crossover.estimate_crossover(pts)
    assert est.x is None and len(est.sequential_at) == 4 and not est.placed
    assert est.sentence().startswith(
        "Sequential faster at every measured point (comm:compute 0.5–4, 4 points, interleaved/sequential 1.2"
    )
    assert est.sentence().endswith("no crossover within it.")
    # Its ratios two decimals, as the table under it and every ratio of the report: it read "1.210–1.280".
    assert re.search(r"interleaved/sequential 1\.\d\d–1\.\d\d\)", est.sentence()), est.sentence()


def test_one_hook_faster_at_some_points_and_no_difference_at_the_others():
    pts = synthetic_points([0.5, 1, 2, 4], lambda x: 0.8 if x < 1.5 else 1.0, noise=0.01)
    est = crossover.estimate_crossover(pts)
    assert est.interleaved_at == (0.5, 1.0) and not est.sequential_at and not est.placed
    text = est.sentence()
    assert text.startswith(
        "No crossover placed within comm:compute 0.5–4: interleaved clearly faster at 2 of 4 points "
        "(comm:compute 0.5–1), no clear difference at the other 2, sequential never clearly faster"
    )
    # The points with no clear difference resolve ±5 % (noise 1 %): the bound over every point stands.
    assert est.open_spread < 0.05 and f"every interval within ±{est.spread:.1%})." in text
    loud = crossover.estimate_crossover(
        synthetic_points([0.5, 1, 2, 4], lambda x: 0.5 if x < 1.5 else 1.0, noise=0.1, repeats=3)
    )
    assert loud.interleaved_at == (0.5, 1.0) and not loud.sequential_at and loud.open_spread > 0.05
    said = f"the widest interval could only resolve ±{loud.open_half_width:.1%} (its half-width"
    assert said in loud.sentence()  # the others unresolved


def test_wins_that_interleave_along_comm_compute_place_no_crossover():
    pts = synthetic_points([0.5, 1, 2, 4], lambda x: {0.5: 0.8, 1: 1.25, 2: 0.8, 4: 1.25}[x], noise=0.01)
    est = crossover.estimate_crossover(pts)
    assert est.interleaved_at == (0.5, 2.0) and est.sequential_at == (1.0, 4.0) and not est.placed
    assert est.sentence().startswith(
        "No crossover placed within comm:compute 0.5–4: interleaved is clearly faster at 2 point(s) "
        "(comm:compute 0.5–2) and sequential at 2 (1–4), but their wins interleave"
    )


def test_a_crossover_the_points_place_but_the_line_misses_is_given_as_the_gap():
    """A curve that bends: interleaved clearly faster at the first point only, sequential clearly
    faster from the second, and most points far to the right pull the straight line's crossing
    out of the gap between them. The crossover is stated from the points, not the line."""
    ratios = {0.25: 0.97, 0.5: 1.06, 1: 1.08, 2: 1.08, 4: 1.08, 8: 1.08, 16: 1.08}
    pts = synthetic_points(XS, ratios.__getitem__, noise=0.003, repeats=8)
    est = crossover.estimate_crossover(pts)
    assert est.placed and est.low_side == "interleaved" and est.gap == (0.25, 0.5)
    assert not est.fit_placed
    assert est.sentence().startswith(
        "Interleaved wins below comm:compute somewhere in 0.25–0.5 (the fitted line crosses elsewhere), "
        "sequential above it: interleaved clearly faster at 1 point(s) (comm:compute 0.25), sequential at 6 (0.5–16)"
    )


def test_reversed_direction_is_reported_as_such():
    pts = synthetic_points([0.25, 1, 4, 16], lambda x: (x / 2.0) ** -0.2)  # interleaved wins when comm is slow
    est = crossover.estimate_crossover(pts)
    assert est.slope < 0 and est.x == pytest.approx(2.0, rel=0.3)
    assert est.low_side == "sequential"
    assert est.sentence().startswith("Sequential wins below comm:compute ≈ ")


def test_points_with_one_repeat_have_no_interval_and_name_nothing():
    pts = synthetic_points([0.5, 1, 2], lambda x: 0.5 * x, repeats=1)
    est = crossover.estimate_crossover(pts)
    assert not est.interleaved_at and not est.sequential_at
    assert est.sentence() == (
        "No crossover placed within comm:compute 0.5–2: one repeat per point, so no point has an interval (3 points)."
    )


def test_needs_two_distinct_ratios():
    with pytest.raises(ValueError, match="two points"):
        crossover.estimate_crossover(synthetic_points([1.0, 1.0], lambda x: 1.0))


def _frames(spec: dict, **reference_keys: object) -> tuple[list[dict], list[dict], list[dict]]:
    """Cases, steps and summary rows of ``spec``, (algorithm, link[, tag]) → (per-repeat medians, comm_ms,
    compute_ms); the hooks have ``shard_buckets``/``impl`` set and the reference ``reference_keys``
    (a key a tag names takes the tag's value), the others collapsed (None)."""
    cases, steps, summary = [], [], []
    for i, (key, (reps, comm, compute)) in enumerate(spec.items()):
        alg, link = key[:2]
        cid = f"c{i}"
        hook = alg in (SEQUENTIAL, INTERLEAVED)
        own = {k: (key[2] if len(key) > 2 else v) for k, v in reference_keys.items()}
        cases.append(
            {
                "case_id": cid,
                "algorithm": alg,
                "interconnect": link,
                "bucket_cap_mb": 2.0,
                "shard_buckets": False if hook else None,
                "impl": "tpbench" if hook else None,
                **{k: (v if alg == REFERENCE else None) for k, v in own.items()},
                "status": "done",
            }
        )
        for r, m in enumerate(reps):
            for s in range(5):  # odd number of steps: the repeat's median is exactly m
                steps.append(
                    {"case_id": cid, "repeat": r, "rank": 0, "step": s, "phase": "timed", "step_ms": m + (s - 2)}
                )
        summary.append({"case_id": cid, "comm_ms": comm, "compute_ms": compute})
    return cases, steps, summary


def test_ratio_points_pair_cases_and_take_comm_compute_from_the_reference():
    """Two links × one bucket size; the reference has ``shard_buckets``/``impl`` collapsed (None)."""
    spec = {  # (algorithm, link) → (per-repeat medians, comm_ms, compute_ms)
        (REFERENCE, "loopback"): ([50, 52, 51], 10.0, 20.0),
        (SEQUENTIAL, "loopback"): ([40, 41, 42], 12.0, 20.0),
        (INTERLEAVED, "loopback"): ([36, 37, 38], 13.0, 20.0),
        (REFERENCE, "tcp-1gbit"): ([90, 92, 91], 60.0, 20.0),
        (SEQUENTIAL, "tcp-1gbit"): ([80, 81, 82], 61.0, 20.0),
        (INTERLEAVED, "tcp-1gbit"): ([88, 89, 90], 62.0, 20.0),
        ("ddp", "loopback"): ([30, 30, 30], 5.0, 20.0),  # not part of any point
    }
    cases, steps, summary = _frames(spec)
    pts = crossover.ratio_points(pd.DataFrame(cases), pd.DataFrame(steps), pd.DataFrame(summary))
    assert list(pts["interconnect"]) == ["loopback", "tcp-1gbit"]
    assert list(pts["comm_compute"]) == [0.5, 3.0]  # the reference's figures, not the hooks'
    assert set(pts["comm_compute_from"]) == {REFERENCE}
    assert pts["ratio"].tolist() == pytest.approx([37 / 41, 89 / 81], rel=1e-3)  # geometric means of the repeats
    assert (pts["ratio_lo"] <= pts["ratio"]).all() and (pts["ratio"] <= pts["ratio_hi"]).all()
    # The pair shares a world (equal on every parameter but the algorithm): paired by round.
    assert pts["paired"].all() and pts.loc[0, "sequential_reps"] == [40, 41, 42]
    # Without the reference, comm:compute falls back to the sequential case.
    no_ref = pd.DataFrame(cases)[lambda d: d["algorithm"] != REFERENCE]
    pts2 = crossover.ratio_points(no_ref, pd.DataFrame(steps), pd.DataFrame(summary))
    assert list(pts2["comm_compute"]) == [0.6, 3.05] and set(pts2["comm_compute_from"]) == {SEQUENTIAL}


def test_the_reference_is_found_beside_a_key_the_hooks_leave_unset():
    """``parameters_as_bucket_view`` is set on zero_no_overlap and collapsed (None) on the ZeRO hooks, as
    every suite since that key records it: the reference still matches (it was missed, and comm:compute
    silently taken from the sequential hook), the per-parameter one (PyTorch's default) before the packed."""
    spec = {
        (REFERENCE, "loopback", True): ([45, 46, 47], 8.0, 20.0),  # packed: listed first, not picked
        (REFERENCE, "loopback", False): ([50, 52, 51], 10.0, 20.0),
        (SEQUENTIAL, "loopback"): ([40, 41, 42], 12.0, 20.0),
        (INTERLEAVED, "loopback"): ([36, 37, 38], 13.0, 20.0),
        (REFERENCE, "tcp-1gbit", False): ([90, 92, 91], 60.0, 20.0),
        (SEQUENTIAL, "tcp-1gbit"): ([80, 81, 82], 61.0, 20.0),
        (INTERLEAVED, "tcp-1gbit"): ([88, 89, 90], 62.0, 20.0),
    }
    cases, steps, summary = _frames(spec, parameters_as_bucket_view=False)
    pts = crossover.ratio_points(pd.DataFrame(cases), pd.DataFrame(steps), pd.DataFrame(summary))
    assert list(pts["comm_compute"]) == [0.5, 3.0] and set(pts["comm_compute_from"]) == {REFERENCE}
