"""The summary's point and its interval are of one statistic (``stats.summarize``): the median of
the per-repeat values, which for post-local SGD are period-aware, and its bootstrap interval."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tpbench.analysis.stats import repeat_values, summarize


def _steps(repeats: int = 6, steps: int = 16, period: int = 4) -> pd.DataFrame:
    """Post-local SGD's shape: every ``period``-th step also averages the model and costs 3× a
    plain one, so the median over steps drops that cost and the period-aware value keeps it."""
    rng = np.random.default_rng(0)
    rows = [
        {
            "case_id": "lsgd",
            "repeat": r,
            "rank": rank,
            "step": s,
            "phase": "timed",
            "step_ms": (30.0 if s % period == period - 1 else 10.0) * (1 + 0.02 * rng.standard_normal()),
        }
        for r in range(repeats)
        for rank in (0, 1)
        for s in range(steps)
    ]
    return pd.DataFrame(rows)


def test_the_point_is_the_statistic_its_interval_is_of():
    cases = pd.DataFrame(
        [
            {
                "case_id": "lsgd",
                "algorithm": "post_localSGD_hook",
                "start_localSGD_iter": 0,
                "averaging_period": 4,
                "batch_size": 8,
                "world_size": 2,
                "status": "done",
            }
        ]
    )
    steps = _steps()
    (row,) = summarize(steps, cases).to_dict("records")
    values = repeat_values(steps, windows={"lsgd": 4})["step_ms"]
    assert row["median_ms"] == np.median(values) and row["repeat_medians_ms"] == values.tolist()
    assert row["ci_lo_ms"] <= row["median_ms"] <= row["ci_hi_ms"]
    # The period-aware value holds the averaging step's cost (mean of 10, 10, 10, 30 = 15 ms); the
    # pooled median over steps, kept under its own name, does not, and lies outside the interval.
    assert abs(row["median_ms"] - 15.0) < 0.5 and abs(row["step_median_ms"] - 10.0) < 0.5
    assert row["step_median_ms"] < row["ci_lo_ms"]
    assert row["samples_per_s"] == 8 * 2 / (row["median_ms"] / 1e3)
