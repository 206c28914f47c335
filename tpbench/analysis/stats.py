"""Step-time statistics: medians with bootstrap confidence intervals over repeats.

A repeat is the independent unit: steps within one repeat share a warm-up, a bucket rebuild and
whatever the machine was doing at the time, so they are correlated and a CI over steps would be
far too narrow. Each repeat is reduced to its median (of the slowest rank's step times) and the
bootstrap resamples those.
"""

from __future__ import annotations

import math
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
        per_step = (
            steps[steps["phase"] == "timed"].groupby(["case_id", "repeat", "step"], as_index=False)[metric].mean()
        )
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
    baseline: np.ndarray,
    candidate: np.ndarray,
    *,
    samples: int = BOOTSTRAP_SAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
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
    per_step = (
        slowest_rank(steps) if not steps.empty else pd.DataFrame(columns=["case_id", "repeat", "step", "step_ms"])
    )
    by_case = dict(tuple(per_step.groupby("case_id"))) if not per_step.empty else {}
    memory_cols = [c for c in ("peak_rss_mb", "peak_allocated_mb", "peak_reserved_mb") if c in steps]
    # One groupby for every case's memory peaks: filtering the steps table per case is quadratic.
    peaks = steps.groupby("case_id")[memory_cols].max().to_dict("index") if memory_cols and not steps.empty else {}
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
            row |= {f"max_{col}": float(v) for col, v in peaks.get(case["case_id"], {}).items()}
        rows.append(row)
    return pd.DataFrame(rows)


def _two_stage_medians(groups: list[np.ndarray], pick: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap medians of pooled groups: ``pick`` (samples × groups) says which groups (runs)
    each sample draws; values are then resampled within each drawn group.

    Padded to a (groups × longest) table so one vectorised draw serves every sample; positions past
    a drawn group's own length are masked, so each group keeps its size.
    """
    samples = pick.shape[0]
    sizes = np.array([g.size for g in groups])
    width = int(sizes.max())
    table = np.full((len(groups), width), np.nan)
    for i, g in enumerate(groups):
        table[i, : g.size] = g
    n = sizes[pick][..., None]
    within = (rng.random((samples, len(groups), width)) * n).astype(int)
    values = np.where(np.arange(width) < n, table[pick[..., None], within], np.nan)
    return np.nanmedian(values.reshape(samples, -1), axis=1)


def run_effects(groups: list[np.ndarray]) -> np.ndarray:
    """Each run's median relative to the median of the run medians: how far one run lands by chance."""
    medians = np.array([np.median(g) for g in groups])
    return medians / np.median(medians)


def hierarchical_ratio_ci(
    baseline: list[np.ndarray],
    candidate: list[np.ndarray],
    *,
    samples: int = BOOTSTRAP_SAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Ratio of medians candidate/baseline when each side is several runs of per-repeat values.

    Repeats of one run share a process start, a machine state and (for stored baselines) a job, so
    runs differ more than repeats do. A side of two or more runs is bootstrapped in two stages
    (resample runs, then repeats within each drawn run), which carries that between-run spread
    into the interval and slightly overstates it, as suits a gate that must not cry wolf.

    A side of one run cannot show its own between-run spread. When the other side has several
    runs, the single run is judged against their spread: each bootstrap draw of its repeats is
    also scaled by one of the other side's run effects (``run_effects``), i.e. the candidate is
    treated as one more run that could have landed anywhere the baselines did. With one run on
    each side only the repeats are resampled (``ratio_ci``), and between-run noise is not in the
    interval at all; the gate documents that stored single baselines are the weakest evidence.
    The point estimate pools all repeats of each side. Runs made in pairs: ``paired_ratio_ci``.
    """
    b = [np.asarray(g, dtype=float) for g in baseline if len(g)]
    c = [np.asarray(g, dtype=float) for g in candidate if len(g)]
    if not b or not c:
        raise ValueError("hierarchical_ratio_ci needs at least one value on each side")
    point = float(np.median(np.concatenate(c)) / np.median(np.concatenate(b)))
    if sum(g.size for g in b) < 2 and sum(g.size for g in c) < 2:
        return point, point, point
    rng = np.random.default_rng(seed)
    cs = _two_stage_medians(c, rng.integers(0, len(c), size=(samples, len(c))), rng)
    bs = _two_stage_medians(b, rng.integers(0, len(b), size=(samples, len(b))), rng)
    if len(c) == 1 and len(b) >= 2:
        cs = cs * rng.choice(run_effects(b), size=samples)
    elif len(b) == 1 and len(c) >= 2:
        bs = bs * rng.choice(run_effects(c), size=samples)
    r = cs / bs
    alpha = (1 - confidence) / 2
    return point, float(np.quantile(r, alpha)), float(np.quantile(r, 1 - alpha))


def t_quantile(p: float, df: int) -> float:
    """Quantile of Student's t (p >= 0.5), by integrating its density: numpy only, 1e-4 accurate."""
    x = np.linspace(0.0, 200.0, 400_001)
    log_pdf = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    pdf = np.exp(log_pdf - (df + 1) / 2 * np.log1p(x * x / df))
    cdf = 0.5 + np.concatenate([[0.0], np.cumsum((pdf[1:] + pdf[:-1]) / 2 * np.diff(x))])
    return float(np.interp(p, cdf, x))


def paired_ratio_ci(
    baseline: list[np.ndarray], candidate: list[np.ndarray], *, confidence: float = CONFIDENCE
) -> tuple[float, float, float]:
    """Ratio candidate/baseline from runs made in pairs (round i of each side back to back).

    Whatever the machine was doing during a round hit both of its runs, so each round gives one
    log ratio of run medians, ``d_i = log(median(c_i) / median(b_i))``, in which that shared state
    cancels; the estimate is ``exp(mean(d))`` with a Student t interval over the rounds.

    Why not the bootstrap used elsewhere: the unit here is the round, and a gate has 3 to 10 of
    them. A percentile bootstrap over so few values is far too narrow (it cannot reach past the
    most extreme round), while t with n−1 degrees of freedom is exact for normal log ratios and
    widens honestly when rounds are few or disagree. Simulated on rounds with large shared drift,
    pooling the repeats of all rounds lost most of the power the pairing should give; this keeps it.
    Needs at least two pairs.
    """
    if len(baseline) != len(candidate) or len(baseline) < 2:
        raise ValueError(f"paired_ratio_ci needs at least two pairs of runs, got {len(baseline)} and {len(candidate)}")
    d = np.log([np.median(c) / np.median(b) for b, c in zip(baseline, candidate)])
    half = t_quantile(1 - (1 - confidence) / 2, d.size - 1) * float(np.std(d, ddof=1)) / math.sqrt(d.size)
    mean = float(np.mean(d))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)
