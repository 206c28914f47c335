"""Per step and rank: how much communication ran, how much of it compute hid, how long nothing ran.

Definitions (docs/analysis.md), over the intervals of one rank clipped to one
step's span:

- ``compute_ns`` = |∪ compute|, ``comm_ns`` = |∪ comm|, ``overlap_ns`` = |∪comm ∩ ∪compute|
- ``exposed_comm_ns`` = comm − overlap: communication nothing hid
- ``idle_ns`` = span − |∪ work|, work being every lane but ``optimizer`` (whose ranges only say
  which work belongs to the optimizer; the work itself is already compute or comm)
- ``overlap_pct`` = 100 · overlap / comm, as Holistic Trace Analysis defines its
  communication/computation overlap, so the numbers can be compared with it (``hta_overlap_pct``:
  per rank over HTA's window of steps).

Everything here is numpy over sorted arrays: traces have millions of intervals, and an interval
may nest in another on one thread or overlap others across streams and threads, which unions
(not sums of durations) handle. Intervals that cross a step boundary count in each step for the
part inside it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

STEP_OVERLAP_COLUMNS = (
    "rank",
    "step",
    "span_ns",
    "compute_ns",
    "comm_ns",
    "overlap_ns",
    "exposed_comm_ns",
    "idle_ns",
    "optimizer_ns",
    "overlap_pct",
)
_WORK_LANES = ("compute", "comm", "memcpy", "other")


def union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals into sorted, disjoint ones (touching intervals become one)."""
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    if not len(start):
        return start, end
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    first = np.r_[True, s[1:] > reach[:-1]]
    last = np.r_[first[1:], True]
    return s[first], reach[last]


def covered_before(us: np.ndarray, ue: np.ndarray, cum: np.ndarray, t: np.ndarray) -> np.ndarray:
    """|(∪ [us, ue)) ∩ (−∞, t)| for each t, the pieces sorted and disjoint, ``cum`` their
    cumulative lengths (``cum[i]``: the first i pieces)."""
    if not len(us):
        return np.zeros(len(t))
    i = np.searchsorted(us, t, side="right")  # pieces starting at or before t
    inside = np.where(i > 0, np.clip(t - us[np.maximum(i - 1, 0)], 0, None), 0)
    last = np.where(i > 0, ue[np.maximum(i - 1, 0)] - us[np.maximum(i - 1, 0)], 0)
    return np.where(i > 0, cum[np.maximum(i - 1, 0)] + np.minimum(inside, last), 0)


def step_overlap(intervals: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Overlap metrics per (rank, step), columns ``STEP_OVERLAP_COLUMNS`` (times in ns).

    ``intervals`` and ``steps`` are ``Timeline.intervals`` / ``Timeline.steps`` (or hand-built
    frames with their columns ``rank, lane, start_ns, end_ns`` and ``rank, step, start_ns, end_ns``).
    ``overlap_pct`` is NaN for a step without communication.
    """
    by_rank = dict(tuple(intervals.groupby("rank", sort=False, observed=True)))
    out = [_rank_overlap(by_rank.get(rank, intervals.iloc[:0]), st) for rank, st in steps.groupby("rank", sort=True)]
    if not out:
        return pd.DataFrame(
            {c: pd.Series(dtype="float64" if c == "overlap_pct" else "int64") for c in STEP_OVERLAP_COLUMNS}
        )
    return pd.concat(out, ignore_index=True).sort_values(["rank", "step"], ignore_index=True)


def overlap_totals(per_step: pd.DataFrame, by: Sequence[str] = ("rank",)) -> pd.DataFrame:
    """Sum ``step_overlap`` rows over steps (per ``by``), with ``overlap_pct`` as a ratio of sums.

    A ratio of sums, not a mean of per-step percentages, is what HTA reports for a whole trace,
    and it weighs each step by how much it communicated.
    """
    cols = [c for c in STEP_OVERLAP_COLUMNS if c.endswith("_ns")]
    if by:
        sums = per_step.groupby(list(by), sort=True)[cols].sum().reset_index()
    else:
        sums = per_step[cols].sum().to_frame().T.astype("int64")
    sums["overlap_pct"] = _pct(sums["overlap_ns"].to_numpy(), sums["comm_ns"].to_numpy())
    return sums


def hta_overlap_pct(per_step: pd.DataFrame) -> pd.Series:
    """Overlap % per rank (indexed by rank) over Holistic Trace Analysis' window: every profiled
    step but the last, when a rank has more than one (HTA drops the kernels launched from the last
    ``ProfilerStep`` on), as a ratio of sums, as HTA reports it per rank.

    What still differs from HTA: tpbench counts work in the step spans it runs in (each interval
    clipped to them), HTA by when its kernel was launched, over the whole trace (kernels launched
    before the first step, or running past the last counted step's end, count in full there).
    """
    steps = per_step.groupby("rank")["step"]
    window = (per_step["step"] < steps.transform("max")) | (steps.transform("size") == 1)
    return overlap_totals(per_step[window], by=("rank",)).set_index("rank")["overlap_pct"]


def _rank_overlap(iv: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    steps = steps.sort_values("start_ns")
    st_start = steps["start_ns"].to_numpy(np.int64)
    st_end = steps["end_ns"].to_numpy(np.int64)
    n = len(steps)
    if np.any(st_start[1:] < st_end[:-1]):
        raise ValueError(
            f"steps of rank {steps['rank'].iloc[0]} overlap in time; expected one ProfilerStep after another"
        )
    idx, s, e = clip_to_steps(iv["start_ns"].to_numpy(np.int64), iv["end_ns"].to_numpy(np.int64), st_start, st_end)
    lane = iv["lane"].to_numpy(dtype=object)[idx[1]] if len(idx[1]) else np.array([], dtype=object)
    step_of = idx[0]

    def per_step(mask: np.ndarray) -> np.ndarray:
        return union_per_step(step_of[mask], s[mask], e[mask], n)

    is_comp = lane == "compute"
    is_comm = lane == "comm"
    compute = per_step(is_comp)
    comm = per_step(is_comm)
    both = per_step(is_comp | is_comm)
    overlap = compute + comm - both
    work = per_step(np.isin(lane, _WORK_LANES))
    span = st_end - st_start
    return pd.DataFrame(
        {
            "rank": np.full(n, steps["rank"].iloc[0] if n else 0, dtype=np.int64),
            "step": steps["step"].to_numpy(np.int64),
            "span_ns": span,
            "compute_ns": compute,
            "comm_ns": comm,
            "overlap_ns": overlap,
            "exposed_comm_ns": comm - overlap,
            "idle_ns": span - work,
            "optimizer_ns": per_step(lane == "optimizer"),
            "overlap_pct": _pct(overlap, comm),
        }
    )


def clip_to_steps(
    start: np.ndarray, end: np.ndarray, st_start: np.ndarray, st_end: np.ndarray
) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray, np.ndarray]:
    """Cut intervals at step boundaries: one piece per (interval, step it touches).

    Steps must be sorted and disjoint. Returns ((step index, interval index), piece start, piece end).
    """
    first = np.searchsorted(st_end, start, side="right")  # first step ending after the start
    last = np.searchsorted(st_start, end, side="left") - 1  # last step starting before the end
    count = np.maximum(last - first + 1, 0)
    which = np.repeat(np.arange(len(start)), count)
    offset = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    step = np.repeat(first, count) + offset
    s = np.maximum(start[which], st_start[step])
    e = np.minimum(end[which], st_end[step])
    keep = e > s
    return (step[keep], which[keep]), s[keep], e[keep]


def union_per_step(step: np.ndarray, s: np.ndarray, e: np.ndarray, n_steps: int) -> np.ndarray:
    """|∪| of the pieces of each step at once: pieces never cross steps, so merge with a forced
    break wherever the step changes."""
    if not len(s):
        return np.zeros(n_steps, dtype=np.int64)
    order = np.lexsort((s, step))
    step, s, e = step[order], s[order], e[order]
    reach = np.maximum.accumulate(e)
    new_step = np.r_[True, step[1:] != step[:-1]]
    first = new_step | np.r_[True, s[1:] > reach[:-1]]
    # Within a step, reach is the running max from that step on: steps are disjoint and sorted in
    # time, so pieces of earlier steps never reach into a later one.
    last = np.r_[first[1:], True]
    lengths = reach[last] - s[first]
    return np.bincount(step[first], weights=lengths, minlength=n_steps).astype(np.int64)


def _pct(part: np.ndarray, whole: np.ndarray) -> np.ndarray:
    whole = np.asarray(whole, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(whole > 0, 100.0 * np.asarray(part, dtype=np.float64) / whole, np.nan)
