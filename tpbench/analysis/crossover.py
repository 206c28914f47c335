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
- y: interleaved / sequential step time by ``stats.case_ratio`` over per-repeat values. The two
  cases agree on every parameter but the algorithm, so on their world too: they ran round by round
  and the ratio is paired by round (the geometric mean of per-round ratios, t interval over rounds).

A crossover is named only when the data place it: at least one point where interleaved is clearly
faster (interval below 1) and one where sequential is (interval above 1), every clear win of one on
the low side of every clear win of the other. Then the value given is where a straight line through
log y against log x crosses zero (weighted by each point's bootstrap variance, so a point measured
while the machine was busy counts less), with a CI from refitting on bootstrap resamples of the
rounds (each round's pair kept together), or, when the line crosses elsewhere, the gap between the
last clear win of one and the first of the other. Otherwise the statement says what the points do
show: one hook faster at every point, or both within ±x% at every point (every interval inside
[1−x, 1+x]), with the measured range of x. A line is a summary, not a law: the report shows the
points, so a curve that bends is seen.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tpbench.algorithms import INTERLEAVED, SEQUENTIAL
from tpbench.algorithms import NO_OVERLAP as REFERENCE
from tpbench.analysis.stats import BOOTSTRAP_SAMPLES, CONFIDENCE, case_ratio, half_width, repeat_values

# The change below which two hooks count as alike: the report's verdict threshold (``verdict.THRESHOLD``,
# which analysis/ does not import); wider intervals at no clear win are unresolved.
RESOLVED = 0.05
_NOT_PARAMS = ("case_id", "algorithm", "label", "status", "error", "detail")


def ratio_points(cases: pd.DataFrame, steps: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """One row per pair of finished sequential/interleaved cases that differ only in algorithm.

    ``cases``: the store's per-case table (parameters, status); ``steps``: per-step rows;
    ``summary``: per-case figures with ``comm_ms`` and ``compute_ms``. Columns: the pair's
    parameters, ``sequential_case``, ``interleaved_case``, ``comm_compute`` and the algorithm it
    was measured on (``comm_compute_from``), the sequential case's ``allreduce_bytes_per_step``
    (from the traces; it differs by wrapped hook), ``sequential_ms``/``interleaved_ms`` (medians of
    per-repeat values), ``ratio``, ``ratio_lo``, ``ratio_hi``, ``half_width`` (``stats.case_ratio``;
    NaN with one repeat, which has no interval), ``paired`` and the per-repeat values of both
    (``sequential_reps``, ``interleaved_reps``; when paired, the rounds both ran, in the same
    order) for the bootstrap downstream.
    """
    done = cases[cases["status"] == "done"] if "status" in cases else cases
    params = [c for c in done.columns if c not in _NOT_PARAMS]
    reps = repeat_values(steps) if not steps.empty else pd.DataFrame(columns=["case_id", "repeat", "step_ms"])
    by_case = {
        cid: dict(zip(g["repeat"].astype(int), g["step_ms"].astype(float))) for cid, g in reps.groupby("case_id")
    }
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
        # Equal on every parameter but the algorithm, world keys included: the pair ran together
        # (``suite.ran_together``; analysis/ does not import the suite).
        est = case_ratio(b, c, paired=True)
        paired = est.method == "paired"
        rounds = sorted(set(b) & set(c)) if paired else None
        ref = _reference(refs, s, params)
        source = ref.iloc[0]["case_id"] if len(ref) else s["case_id"]
        rows.append(
            {
                **{k: s[k] for k in params},
                "sequential_case": s["case_id"],
                "interleaved_case": i["case_id"],
                "comm_compute": _comm_compute(figures, source),
                "comm_compute_from": REFERENCE if len(ref) else SEQUENTIAL,
                "allreduce_bytes_per_step": _figure(figures, s["case_id"], "allreduce_bytes_per_step"),
                "sequential_ms": float(np.median(list(b.values()))),
                "interleaved_ms": float(np.median(list(c.values()))),
                "ratio": est.ratio,
                "ratio_lo": est.lo,
                "ratio_hi": est.hi,
                "half_width": est.half_width,
                "paired": paired,
                "sequential_reps": [b[k] for k in rounds] if paired else list(b.values()),
                "interleaved_reps": [c[k] for k in rounds] if paired else list(c.values()),
            }
        )
    return pd.DataFrame(rows)


def _reference(refs: pd.DataFrame, row: dict, params: list[str]) -> pd.DataFrame:
    """The no-overlap cases that match ``row`` (a sequential case), PyTorch's default first: where
    both are swept, per-parameter broadcasts (``parameters_as_bucket_view`` false) before packed."""
    found = refs[_matches(refs, row, params, strict=False)]
    if "parameters_as_bucket_view" in found:
        found = found.sort_values("parameters_as_bucket_view", key=lambda c: c.astype(bool), kind="stable")
    return found


def _matches(frame: pd.DataFrame, row: dict, params: list[str], strict: bool) -> pd.Series:
    """Rows of ``frame`` equal to ``row`` on ``params``. Not strict: a parameter unset on either side
    (collapsed for its algorithm, like ``shard_buckets`` for ``zero_no_overlap`` and
    ``parameters_as_bucket_view`` for the ZeRO hooks) matches any value."""
    mask = pd.Series(True, index=frame.index)
    for k in params:
        col = frame[k].astype(object)
        unset = col.isna()
        same = col.map(functools.partial(_same, b=row[k]))
        mask &= same | ((unset | _isna(row[k])) & (not strict)) | (unset & _isna(row[k]))
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
    """Where interleaved/sequential crosses 1, as comm:compute, if the data place it.

    The fit: ``x`` is where the log–log line crosses 1, None when it does not inside the measured
    range [``x_min``, ``x_max``]; ``lo``/``hi`` are its bootstrap interval's ends and may fall
    outside the range. ``slope`` is d log(ratio) / d log(comm:compute): positive means interleaved
    wins below the crossing, as PyTorch's documentation has it. ``crossing_share``: the share of
    bootstrap refits whose root lies in the measured range.

    The points: ``interleaved_at``/``sequential_at`` are the comm:compute of the points whose
    interval lies wholly below/above 1 (that hook clearly faster); ``spread``: the smallest x with
    every point's interval inside [1−x, 1+x]; ``half_width``: the largest interval half-width (both
    NaN when no point has an interval); ``open_spread`` and ``open_half_width``: ``spread`` and
    ``half_width`` over the points that are no clear win. Points with one repeat have no interval and
    count for neither.
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
    interleaved_at: tuple[float, ...]
    sequential_at: tuple[float, ...]
    spread: float
    half_width: float
    open_spread: float  # ``spread`` over the points with no clear win alone (NaN: none)
    open_half_width: float  # ``half_width`` over the same points

    def ratio_at(self, comm_compute: np.ndarray) -> np.ndarray:
        """The fitted line, interleaved/sequential at these comm:compute ratios (for plotting)."""
        return np.exp(self.intercept + self.slope * np.log(np.asarray(comm_compute, dtype=float)))

    @property
    def low_side(self) -> str | None:
        """The hook whose clear wins all lie below every clear win of the other: the data place a
        crossover between them. None when either hook has no clear win or their wins interleave."""
        if not self.interleaved_at or not self.sequential_at:
            return None
        if max(self.interleaved_at) < min(self.sequential_at):
            return "interleaved"
        if max(self.sequential_at) < min(self.interleaved_at):
            return "sequential"
        return None

    @property
    def placed(self) -> bool:
        return self.low_side is not None

    @property
    def gap(self) -> tuple[float, float] | None:
        """Where the placed crossover lies by the points alone: from the low side's last clear win
        to the high side's first."""
        if self.low_side is None:
            return None
        low, high = (
            (self.interleaved_at, self.sequential_at)
            if self.low_side == "interleaved"
            else (self.sequential_at, self.interleaved_at)
        )
        return max(low), min(high)

    @property
    def fit_placed(self) -> bool:
        """The fitted line's crossing lies where the points place the crossover (the figure marks it then)."""
        gap = self.gap
        return gap is not None and self.x is not None and gap[0] <= self.x <= gap[1]

    def sentence(self, threshold: float = RESOLVED) -> str:
        """The finding in words, with its numbers: a crossover only where the points place it.
        ``threshold``: the change the report's verdicts judge by; points whose intervals reach
        beyond it at no clear win are said to be unresolved, not "within ±x%"."""
        span = f"comm:compute {_range((self.x_min, self.x_max))}"
        measured = f"{self.points} points, each resolving ±{self.half_width:.1%} or better"
        inter, seq, n = len(self.interleaved_at), len(self.sequential_at), self.points
        if self.placed:
            low = self.low_side
            high = "sequential" if low == "interleaved" else "interleaved"
            low_at, high_at = (
                (self.interleaved_at, self.sequential_at)
                if low == "interleaved"
                else (self.sequential_at, self.interleaved_at)
            )
            if self.fit_placed:
                where = (
                    f"≈ {self.x:.2g} [{self.lo:.2g}, {self.hi:.2g}] "
                    f"({CONFIDENCE:.0%} CI of the fitted line's crossing; "
                    f"{self.crossing_share:.0%} of bootstrap refits cross inside the measured range)"
                )
            else:
                gap = self.gap
                where = f"somewhere in {_range(gap)} (the fitted line crosses elsewhere)"
            return (
                f"{low.capitalize()} wins below comm:compute {where}, {high} above it: {low} clearly faster at "
                f"{len(low_at)} point(s) (comm:compute {_range(low_at)}), {high} at {len(high_at)} "
                f"({_range(high_at)}); measured over {span}, {measured}."
            )
        if inter and seq:
            return (
                f"No crossover placed within {span}: interleaved is clearly faster at {inter} point(s) (comm:compute "
                f"{_range(self.interleaved_at)}) and sequential at {seq} ({_range(self.sequential_at)}), but their "
                f"wins interleave along comm:compute, so no single crossing separates them ({measured})."
            )
        if not math.isfinite(self.half_width):
            return f"No crossover placed within {span}: one repeat per point, so no point has an interval ({n} points)."
        if not inter and not seq:
            if self.spread > threshold:
                return (
                    f"No crossover placed within {span}, and none ruled out: not resolved, no point tells the "
                    f"hooks apart ({n} points; {self._unresolved(threshold, self.open_half_width)})."
                )
            return (
                f"No crossover within {span}: interleaved and sequential within ±{self.spread:.1%} at every "
                f"measured point ({n} points)."
            )
        who, at = ("interleaved", self.interleaved_at) if inter else ("sequential", self.sequential_at)
        other = "sequential" if inter else "interleaved"
        by = f"interleaved/sequential {self.ratio_min:.2f}–{self.ratio_max:.2f}"  # two decimals, as the table
        if len(at) == n:
            return (
                f"{who.capitalize()} faster at every measured point ({span}, {n} points, {by}); no crossover within it."
            )
        wide = self.open_spread > threshold
        rest = (
            self._unresolved(threshold, self.open_half_width) if wide else f"every interval within ±{self.spread:.1%}"
        )
        return (
            f"No crossover placed within {span}: {who} clearly faster at {len(at)} of {n} points (comm:compute "
            f"{_range(at)}), no clear difference at the other {n - len(at)}, {other} never clearly faster "
            f"({by}; {rest})."
        )

    @staticmethod
    def _unresolved(threshold: float, half_width: float) -> str:
        """What the widest interval holding no change leaves open, as its half-width (``half_width``),
        the "resolves" the table under the sentence and every verdict give (not how far the interval
        reaches from 1: [0.06, 36.6] reaches +3560% but resolves ±2370%, and the two read alike as "±"),
        and about what would close it: the half-width shrinks as 1/√rounds in log space (faster while
        the rounds are few, as the t quantile falls), so the rounds to resolve ±``threshold`` are at
        most about (log(1 + half_width) / log(1 + threshold))² times those run."""
        times = math.ceil((math.log1p(half_width) / math.log1p(threshold)) ** 2)
        pct = half_width * 100
        wide = f"±{pct:.3g}%" if pct >= 1e5 else f"±{pct:.1f}%"
        return (
            f"the widest interval could only resolve {wide} (its half-width, the table's resolves); at most about "
            f"{times} times the rounds run would resolve ±{threshold:.0%}, e.g. sweep --target-ci {threshold:.0%}"
        )


def _range(xs: tuple[float, ...]) -> str:
    lo, hi = min(xs), max(xs)
    return f"{lo:.2g}" if f"{lo:.2g}" == f"{hi:.2g}" else f"{lo:.2g}–{hi:.2g}"


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

    Each bootstrap sample redraws every point's per-repeat values as the ratio was formed: a paired
    point (``paired``) redraws rounds, each round's pair of values together, and takes the mean log
    ratio; an unpaired one redraws each side's repeats on their own. The line is refitted with the
    same weights, and the root's percentile interval is the CI. Needs at least two points with
    distinct, finite comm:compute.
    """
    pts = points[np.isfinite(points["comm_compute"]) & (points["comm_compute"] > 0)]
    if len(pts) < 2 or pts["comm_compute"].nunique() < 2:
        raise ValueError("a crossover needs at least two points with distinct comm:compute ratios")
    rng = np.random.default_rng(seed)
    x = np.log(pts["comm_compute"].to_numpy(dtype=float))
    paired = pts["paired"] if "paired" in pts else pd.Series(False, index=pts.index)
    draws = np.empty((len(pts), samples))
    for j, (b, c, pair) in enumerate(zip(pts["sequential_reps"], pts["interleaved_reps"], paired)):
        b, c = np.log(np.asarray(b, dtype=float)), np.log(np.asarray(c, dtype=float))
        if pair:
            d = c - b
            draws[j] = d[rng.integers(0, d.size, size=(samples, d.size))].mean(axis=1)
        else:
            cs = c[rng.integers(0, c.size, size=(samples, c.size))].mean(axis=1)
            draws[j] = cs - b[rng.integers(0, b.size, size=(samples, b.size))].mean(axis=1)
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
    cc, r_lo, r_hi = (pts[k].to_numpy(dtype=float) for k in ("comm_compute", "ratio_lo", "ratio_hi"))
    widths = (
        pts["half_width"].to_numpy(dtype=float)
        if "half_width" in pts
        else np.array([half_width(a, b) for a, b in zip(r_lo, r_hi)])
    )
    # A point without an interval (one repeat) is never a clear win, and bounds nothing.
    known = np.isfinite(widths)
    reach = np.maximum(r_hi - 1, 1 - r_lo)  # how far from no change each point's interval reaches
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
        interleaved_at=tuple(float(v) for v in cc[known & (r_hi < 1)]),
        sequential_at=tuple(float(v) for v in cc[known & (r_lo > 1)]),
        spread=float(np.max(reach[known])) if known.any() else math.nan,
        half_width=float(np.max(widths[known])) if known.any() else math.nan,
        open_spread=float(np.max(reach[open_])) if (open_ := known & (r_lo <= 1) & (r_hi >= 1)).any() else math.nan,
        open_half_width=float(np.max(widths[open_])) if open_.any() else math.nan,
    )
