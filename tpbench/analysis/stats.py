"""Step-time statistics: medians with bootstrap confidence intervals over repeats.

A repeat is the independent unit: steps within one repeat share a warm-up, a bucket rebuild and
whatever the machine was doing at the time, so they are correlated and a CI over steps would be
far too narrow. Each repeat is reduced to its median (of the slowest rank's step times) and the
bootstrap resamples those.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

BOOTSTRAP_SAMPLES = 4000
CONFIDENCE = 0.95


def slowest_rank(steps: pd.DataFrame) -> pd.DataFrame:
    """Timed steps only, one row per (case_id, repeat, step): a step lasts as long as its slowest rank."""
    timed = steps[steps["phase"] == "timed"]
    return timed.groupby(["case_id", "repeat", "step"], as_index=False, sort=True)["step_ms"].max()


def repeat_medians(steps: pd.DataFrame, metric: str = "step_ms") -> pd.DataFrame:
    """One row per (case_id, repeat) with the median of ``metric`` over that repeat's timed steps."""
    if metric == "step_ms":
        per_step = slowest_rank(steps)
    else:
        per_step = steps[steps["phase"] == "timed"].groupby(["case_id", "repeat", "step"], as_index=False)[metric].mean()
    return per_step.groupby(["case_id", "repeat"], as_index=False)[metric].median()


def bootstrap_ci(
    values: np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray] = lambda a: np.median(a, axis=-1),
    *,
    samples: int = BOOTSTRAP_SAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic`` over ``values`` (seeded: reports are reproducible)."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return (float("nan"), float("nan"))
    if values.size == 1:
        return (float(values[0]), float(values[0]))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, values.size, size=(samples, values.size))
    stats = statistic(values[idx])
    alpha = (1 - confidence) / 2
    return (float(np.quantile(stats, alpha)), float(np.quantile(stats, 1 - alpha)))


def ratio_ci(
    baseline: np.ndarray, candidate: np.ndarray, *, samples: int = BOOTSTRAP_SAMPLES, confidence: float = CONFIDENCE, seed: int = 0
) -> tuple[float, float, float]:
    """Ratio of medians candidate/baseline over per-repeat values, with a bootstrap interval.

    Both sides are resampled independently (their repeats are not paired).
    """
    b = np.asarray(baseline, dtype=float)
    c = np.asarray(candidate, dtype=float)
    point = float(np.median(c) / np.median(b))
    if b.size < 2 and c.size < 2:
        return point, point, point
    rng = np.random.default_rng(seed)
    bs = np.median(b[rng.integers(0, b.size, size=(samples, b.size))], axis=1)
    cs = np.median(c[rng.integers(0, c.size, size=(samples, c.size))], axis=1)
    r = cs / bs
    alpha = (1 - confidence) / 2
    return point, float(np.quantile(r, alpha)), float(np.quantile(r, 1 - alpha))


def summarize(steps: pd.DataFrame, cases: pd.DataFrame) -> pd.DataFrame:
    """One row per case: the case's parameters and status, step-time medians, spreads and CIs.

    ``cases`` is the store's per-case table (params + status); failed cases keep a row with
    their error and no numbers, so a summary never silently drops a case.
    """
    rows = []
    per_step = slowest_rank(steps) if not steps.empty else pd.DataFrame(columns=["case_id", "repeat", "step", "step_ms"])
    by_case = dict(tuple(per_step.groupby("case_id"))) if not per_step.empty else {}
    for case in cases.to_dict("records"):
        row = dict(case)
        data = by_case.get(case["case_id"])
        if data is not None and len(data):
            reps = data.groupby("repeat")["step_ms"].median().to_numpy()
            ms = data["step_ms"].to_numpy()
            median = float(np.median(ms))
            lo, hi = bootstrap_ci(reps)
            row |= {
                "median_ms": median,
                "p10_ms": float(np.quantile(ms, 0.1)),
                "p90_ms": float(np.quantile(ms, 0.9)),
                "ci_lo_ms": lo,
                "ci_hi_ms": hi,
                "repeat_medians_ms": reps.tolist(),
                "samples_per_s": case["batch_size"] * case["world_size"] / (median / 1e3),
                "timed_steps": int(len(ms)),
            }
            mine = steps[steps["case_id"] == case["case_id"]]
            for col in ("peak_rss_mb", "peak_allocated_mb", "peak_reserved_mb"):
                if col in mine:
                    row[f"max_{col}"] = float(mine[col].max())
        rows.append(row)
    return pd.DataFrame(rows)
