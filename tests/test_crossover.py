"""Crossover estimation on synthetic data whose answer is known, and the pairing of cases into points."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from tpbench.analysis import crossover
from tpbench.analysis.crossover import INTERLEAVED, REFERENCE, SEQUENTIAL


def synthetic_points(xs, ratio_of_x, *, repeats=6, noise=0.03, seed=1) -> pd.DataFrame:
    """``ratio_points``-shaped rows: sequential repeats around 100 ms, interleaved ones around
    100·ratio(x), each repeat off by a lognormal ``noise``; the CI columns come from stats.unpaired_ratio."""
    from tpbench.analysis.stats import unpaired_ratio

    rng = np.random.default_rng(seed)
    rows = []
    for x in xs:
        b = 100 * np.exp(rng.normal(0, noise, repeats))
        c = 100 * ratio_of_x(x) * np.exp(rng.normal(0, noise, repeats))
        est = unpaired_ratio(b, c)
        r, lo, hi = est.ratio, est.lo, est.hi
        rows.append(
            {
                "comm_compute": x,
                "ratio": r,
                "ratio_lo": lo,
                "ratio_hi": hi,
                "sequential_reps": b.tolist(),
                "interleaved_reps": c.tolist(),
            }
        )
    return pd.DataFrame(rows)


def test_finds_a_known_crossover_with_an_interval_that_covers_it():
    x0 = 3.0
    pts = synthetic_points([0.25, 0.5, 1, 2, 4, 8, 16], lambda x: (x / x0) ** 0.15)
    est = crossover.estimate_crossover(pts)
    assert est.x == pytest.approx(x0, rel=0.25)
    assert est.lo < x0 < est.hi and est.hi / est.lo < 4
    assert est.slope > 0 and est.slope_lo > 0
    assert est.crossing_share > 0.95 and est.wins_below >= 2 and est.wins_above >= 2
    assert re.match(
        rf"Interleaved wins below comm:compute ≈ {est.x:.2g} \[{est.lo:.2g}, {est.hi:.2g}\]", est.sentence()
    )
    assert est.ratio_at(np.array([est.x]))[0] == pytest.approx(1.0)  # the plotted line crosses 1 at the estimate


def test_interval_widens_with_noise_and_still_covers_the_truth():
    x0 = 2.0
    quiet = crossover.estimate_crossover(synthetic_points([0.5, 1, 2, 4, 8], lambda x: (x / x0) ** 0.2, noise=0.01))
    loud = crossover.estimate_crossover(synthetic_points([0.5, 1, 2, 4, 8], lambda x: (x / x0) ** 0.2, noise=0.08))
    assert loud.hi / loud.lo > quiet.hi / quiet.lo
    assert loud.lo < x0 < loud.hi


def test_no_crossover_inside_the_measured_range_is_said_with_numbers():
    pts = synthetic_points([0.5, 1, 2, 4], lambda x: 1.2 + 0.02 * x)  # sequential always faster
    est = crossover.estimate_crossover(pts)
    assert est.x is None
    text = est.sentence()
    assert text.startswith("No crossover observed over comm:compute 0.5–4 (4 points)")
    assert "stays above 1" in text and "1.2" in text


def test_reversed_direction_is_reported_as_such():
    pts = synthetic_points([0.25, 1, 4, 16], lambda x: (x / 2.0) ** -0.2)  # interleaved wins when comm is slow
    est = crossover.estimate_crossover(pts)
    assert est.slope < 0 and est.x == pytest.approx(2.0, rel=0.3)
    assert est.sentence().startswith("Sequential wins below comm:compute ≈ ")


def test_needs_two_distinct_ratios():
    with pytest.raises(ValueError, match="two points"):
        crossover.estimate_crossover(synthetic_points([1.0, 1.0], lambda x: 1.0))


def test_ratio_points_pair_cases_and_take_comm_compute_from_the_reference():
    """Two links × one bucket size; the reference has ``shard_buckets``/``impl`` collapsed (None)."""
    cases, steps, summary = [], [], []
    spec = {  # (algorithm, link) → (per-repeat medians, comm_ms, compute_ms)
        (REFERENCE, "loopback"): ([50, 52, 51], 10.0, 20.0),
        (SEQUENTIAL, "loopback"): ([40, 41, 42], 12.0, 20.0),
        (INTERLEAVED, "loopback"): ([36, 37, 38], 13.0, 20.0),
        (REFERENCE, "tcp-1gbit"): ([90, 92, 91], 60.0, 20.0),
        (SEQUENTIAL, "tcp-1gbit"): ([80, 81, 82], 61.0, 20.0),
        (INTERLEAVED, "tcp-1gbit"): ([88, 89, 90], 62.0, 20.0),
        ("ddp", "loopback"): ([30, 30, 30], 5.0, 20.0),  # not part of any point
    }
    for i, ((alg, link), (reps, comm, compute)) in enumerate(spec.items()):
        cid = f"c{i}"
        hook = alg in (SEQUENTIAL, INTERLEAVED)
        cases.append(
            {
                "case_id": cid,
                "algorithm": alg,
                "interconnect": link,
                "bucket_cap_mb": 2.0,
                "shard_buckets": False if hook else None,
                "impl": "tpbench" if hook else None,
                "status": "done",
            }
        )
        for r, m in enumerate(reps):
            for s in range(5):  # odd number of steps: the repeat's median is exactly m
                steps.append(
                    {"case_id": cid, "repeat": r, "rank": 0, "step": s, "phase": "timed", "step_ms": m + (s - 2)}
                )
        summary.append({"case_id": cid, "comm_ms": comm, "compute_ms": compute})
    pts = crossover.ratio_points(pd.DataFrame(cases), pd.DataFrame(steps), pd.DataFrame(summary))
    assert list(pts["interconnect"]) == ["loopback", "tcp-1gbit"]
    assert list(pts["comm_compute"]) == [0.5, 3.0]  # the reference's figures, not the hooks'
    assert set(pts["comm_compute_from"]) == {REFERENCE}
    assert pts["ratio"].tolist() == pytest.approx([37 / 41, 89 / 81], rel=1e-3)  # geometric means of the repeats
    assert (pts["ratio_lo"] <= pts["ratio"]).all() and (pts["ratio"] <= pts["ratio_hi"]).all()
    assert pts.loc[0, "sequential_reps"] == [40, 41, 42]
    # Without the reference, comm:compute falls back to the sequential case.
    no_ref = pd.DataFrame(cases)[lambda d: d["algorithm"] != REFERENCE]
    pts2 = crossover.ratio_points(no_ref, pd.DataFrame(steps), pd.DataFrame(summary))
    assert list(pts2["comm_compute"]) == [0.6, 3.05] and set(pts2["comm_compute_from"]) == {SEQUENTIAL}
