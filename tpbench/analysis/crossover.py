"""Interleaved vs sequential ZeRO hook: the step-time ratio against the communication:computation
ratio, and where it crosses 1.

PyTorch's docs say ``hook_with_zero_step_interleaved`` is preferable when communication is fast
relative to computation and ``hook_with_zero_step`` when it is slow. This module measures where
that line falls: each (link, bucket size, ...) gives a point

- x: the comm:compute ratio of the no-overlap reference case (``zero_no_overlap``; the sequential
  hook's when the run has no reference): its per-step communication time over its per-step
  compute time, both medians over the traced steps (``comm_ms`` / ``compute_ms`` of the summary).
  Without overlap, the communication figure is what the link costs, not what was left exposed.
  The reference matches the pair on every parameter it has, ``comm_hook`` included, so a pair
  wrapping a compression hook sits at its own, compressed, comm:compute.
- y: interleaved / sequential step time, a ratio of medians of per-repeat medians with a
  t interval (``stats.unpaired_ratio``): repeats are the independent unit.

The crossover is where a straight line through log y against log x crosses zero, weighted by
each point's bootstrap variance, so a point measured while the machine was busy counts less. Its
CI comes from refitting on bootstrap resamples of every point's repeats. A line is a summary, not
a law: the report shows the points, so a curve that bends is seen. When the fitted line does not
cross 1 inside the measured range of x, that is the answer, stated with the numbers.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tpbench.algorithms import INTERLEAVED, SEQUENTIAL
from tpbench.algorithms import NO_OVERLAP as REFERENCE
from tpbench.analysis.stats import BOOTSTRAP_SAMPLES, CONFIDENCE, repeat_values, unpaired_ratio

_NOT_PARAMS = ("case_id", "algorithm", "label", "status", "error", "detail")


def ratio_points(cases: pd.DataFrame, steps: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """One row per pair of finished sequential/interleaved cases that differ only in algorithm.

    ``cases``: the store's per-case table (parameters, status); ``steps``: per-step rows;
    ``summary``: per-case figures with ``comm_ms`` and ``compute_ms``. Columns: the pair's
    parameters, ``sequential_case``, ``interleaved_case``, ``comm_compute`` and the algorithm it
    was measured on (``comm_compute_from``), the sequential case's ``allreduce_bytes_per_step``
    (from the traces; it differs by wrapped hook), ``sequential_ms``/``interleaved_ms`` (medians of
    repeat medians), ``ratio``, ``ratio_lo``, ``ratio_hi`` and the per-repeat medians of both
    (``sequential_reps``, ``interleaved_reps``) for bootstraps downstream.
    """
    done = cases[cases["status"] == "done"] if "status" in cases else cases
    params = [c for c in done.columns if c not in _NOT_PARAMS]
    reps = repeat_values(steps) if not steps.empty else pd.DataFrame(columns=["case_id", "repeat", "step_ms"])
    by_case = {cid: g["step_ms"].to_numpy() for cid, g in reps.groupby("case_id")}
    figures = summary.set_index("case_id") if "case_id" in summary else pd.DataFrame()
    seq = done[done["algorithm"] == SEQUENTIAL]
    inter = done[done["algorithm"] == INTERLEAVED]
    refs = done[done["algorithm"] == REFERENCE]
    rows = []
    for s in seq.to_dict("records"):
        twin = inter[_matches(inter, s, params, strict=True)]
        if twin.empty or s["case_id"] not in by_case:
            continue
        i = twin.iloc[0].to_dict()
        if i["case_id"] not in by_case:
            continue
        b, c = by_case[s["case_id"]], by_case[i["case_id"]]
        est = unpaired_ratio(b, c)
        ratio, lo, hi = est.ratio, est.lo, est.hi
        ref = refs[_matches(refs, s, params, strict=False)]
        source = ref.iloc[0]["case_id"] if len(ref) else s["case_id"]
        rows.append(
            {
                **{k: s[k] for k in params},
                "sequential_case": s["case_id"],
                "interleaved_case": i["case_id"],
                "comm_compute": _comm_compute(figures, source),
                "comm_compute_from": REFERENCE if len(ref) else SEQUENTIAL,
                "allreduce_bytes_per_step": _figure(figures, s["case_id"], "allreduce_bytes_per_step"),
                "sequential_ms": float(np.median(b)),
                "interleaved_ms": float(np.median(c)),
                "ratio": ratio,
                "ratio_lo": lo,
                "ratio_hi": hi,
                "sequential_reps": b.tolist(),
                "interleaved_reps": c.tolist(),
            }
        )
    return pd.DataFrame(rows)


def _matches(frame: pd.DataFrame, row: dict, params: list[str], strict: bool) -> pd.Series:
    """Rows of ``frame`` equal to ``row`` on ``params``. Not strict: a parameter the candidate
    leaves unset (collapsed for its algorithm, like ``shard_buckets`` for ``zero_no_overlap``)
    matches any value."""
    mask = pd.Series(True, index=frame.index)
    for k in params:
        col = frame[k].astype(object)
        unset = col.isna()
        same = col.map(functools.partial(_same, b=row[k]))
        mask &= same | (unset & (not strict)) | (unset & _isna(row[k]))
    return mask


def _same(a: object, b: object) -> bool:
    return (_isna(a) and _isna(b)) or (not _isna(a) and not _isna(b) and a == b)


def _isna(v: object) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _figure(figures: pd.DataFrame, case_id: str, column: str) -> float:
    return (
        float(figures.loc[case_id, column]) if case_id in figures.index and column in figures.columns else float("nan")
    )


def _comm_compute(figures: pd.DataFrame, case_id: str) -> float:
    if case_id not in figures.index or not {"comm_ms", "compute_ms"} <= set(figures.columns):
        return float("nan")
    comm, compute = figures.loc[case_id, "comm_ms"], figures.loc[case_id, "compute_ms"]
    return float(comm / compute) if compute and compute > 0 else float("nan")


@dataclass(frozen=True)
class Crossover:
    """Where interleaved/sequential crosses 1, as comm:compute, from a log–log line fit.

    ``x`` is None when the fitted line does not cross 1 inside the measured range
    [``x_min``, ``x_max``]; ``lo``/``hi`` are the bootstrap interval's ends and may fall outside
    the range (then the data cannot place the crossover that precisely). ``slope`` is
    d log(ratio) / d log(comm:compute): positive means interleaved wins below the crossover, as
    PyTorch's documentation has it. ``crossing_share``: the share of bootstrap refits whose root
    lies in the measured range. ``wins_below``/``wins_above``: points whose ratio CI lies wholly
    below/above 1.
    """

    x: float | None
    lo: float
    hi: float
    intercept: float
    slope: float
    slope_lo: float
    slope_hi: float
    x_min: float
    x_max: float
    ratio_min: float
    ratio_max: float
    crossing_share: float
    points: int
    wins_below: int
    wins_above: int

    def ratio_at(self, comm_compute: np.ndarray) -> np.ndarray:
        """The fitted line, interleaved/sequential at these comm:compute ratios (for plotting)."""
        return np.exp(self.intercept + self.slope * np.log(np.asarray(comm_compute, dtype=float)))

    def sentence(self) -> str:
        """The finding in words, with its numbers."""
        span = f"comm:compute {self.x_min:.2g}–{self.x_max:.2g}"
        if self.x is None:
            where = "above" if self.ratio_min > 1 else "below" if self.ratio_max < 1 else "around"
            who = {
                "above": "the sequential hook was never slower",
                "below": "the interleaved hook was never slower",
                "around": "neither hook wins consistently",
            }[where]
            return (
                f"No crossover observed over {span} ({self.points} points): interleaved/sequential stays {where} 1 "
                f"(ratios {self.ratio_min:.2f}–{self.ratio_max:.2f}); {who} in the fit."
            )
        first, second = ("interleaved", "sequential") if self.slope > 0 else ("sequential", "interleaved")
        evidence = (
            f"{self.wins_below} point(s) significantly below 1 and {self.wins_above} significantly above"
            if self.wins_below or self.wins_above
            else "no single point differs from 1 significantly"
        )
        return (
            f"{first.capitalize()} wins below comm:compute ≈ {self.x:.2g} [{self.lo:.2g}, {self.hi:.2g}] "
            f"({CONFIDENCE:.0%} CI), {second} above it; measured over {span}, {self.points} points, {evidence}; "
            f"{self.crossing_share:.0%} of bootstrap refits cross 1 inside the measured range."
        )


def _wls(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted least-squares line(s) y = a + s·x; ``y`` is (points,) or (points, samples)."""
    sw = w.sum()
    xm = (w * x).sum() / sw
    ym = np.tensordot(w, y, axes=(0, 0)) / sw
    dx = x - xm
    dy = y - ym
    s = np.tensordot(w * dx, dy, axes=(0, 0)) / (w * dx * dx).sum()
    return ym - s * xm, s


def estimate_crossover(
    points: pd.DataFrame, *, samples: int = BOOTSTRAP_SAMPLES, confidence: float = CONFIDENCE, seed: int = 0
) -> Crossover:
    """Fit log(ratio) = a + s·log(comm:compute) over ``ratio_points`` rows and find the root.

    Each bootstrap sample redraws every point's repeats (both cases independently), recomputes
    its ratio of medians and refits the line with the same weights; the root's percentile
    interval is the CI. Needs at least two points with distinct, finite comm:compute.
    """
    pts = points[np.isfinite(points["comm_compute"]) & (points["comm_compute"] > 0)]
    if len(pts) < 2 or pts["comm_compute"].nunique() < 2:
        raise ValueError("a crossover needs at least two points with distinct comm:compute ratios")
    rng = np.random.default_rng(seed)
    x = np.log(pts["comm_compute"].to_numpy(dtype=float))
    draws = np.empty((len(pts), samples))
    for j, (b, c) in enumerate(zip(pts["sequential_reps"], pts["interleaved_reps"])):
        b, c = np.asarray(b, dtype=float), np.asarray(c, dtype=float)
        bs = np.median(b[rng.integers(0, b.size, size=(samples, b.size))], axis=1)
        cs = np.median(c[rng.integers(0, c.size, size=(samples, c.size))], axis=1)
        draws[j] = np.log(cs / bs)
    y = np.log(pts["ratio"].to_numpy(dtype=float))
    # A point whose repeats never moved has zero variance; floor it at a 1% spread so one
    # lucky point cannot take all the weight.
    w = 1.0 / np.maximum(draws.var(axis=1), 0.01**2)
    a, s = _wls(x, y, w)
    a_b, s_b = _wls(x, draws, w)
    with np.errstate(divide="ignore", invalid="ignore"):
        roots = np.where(s_b != 0, -a_b / s_b, np.nan)
    root = -a / s if s != 0 else float("nan")
    alpha = (1 - confidence) / 2
    finite = roots[np.isfinite(roots)]
    lo, hi = np.quantile(finite, [alpha, 1 - alpha]) if finite.size else (np.nan, np.nan)
    x_lo, x_hi = x.min(), x.max()
    inside = bool(np.isfinite(root) and x_lo <= root <= x_hi)
    slope_lo, slope_hi = np.quantile(s_b, [alpha, 1 - alpha])
    return Crossover(
        x=float(np.exp(root)) if inside else None,
        lo=float(np.exp(lo)),
        hi=float(np.exp(hi)),
        intercept=float(a),
        slope=float(s),
        slope_lo=float(slope_lo),
        slope_hi=float(slope_hi),
        x_min=float(np.exp(x_lo)),
        x_max=float(np.exp(x_hi)),
        ratio_min=float(pts["ratio"].min()),
        ratio_max=float(pts["ratio"].max()),
        crossing_share=float(np.mean((roots >= x_lo) & (roots <= x_hi))),
        points=len(pts),
        wins_below=int((pts["ratio_hi"] < 1).sum()),
        wins_above=int((pts["ratio_lo"] > 1).sum()),
    )
