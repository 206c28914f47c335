"""Skeletons: a case's traced steps reduced to what the replay (``replay.simulate``) needs.

Per profiled step and rank, the training thread's work between communication events, the points
where it issues a collective (where the collective began, inside its issue op) and the points where
it waits for one. The dependency rules are read from markers every algorithm leaves, not from its
name:

- compute inside ``tpbench.zero.step[bucket=K]`` waits for the K-th all-reduce of the step (the
  ZeRO hooks step a bucket once it is reduced: sequentially in the last bucket's hook, or bucket
  K-1 in bucket K's hook when interleaved on Gloo);
- after the last issue of a collective kind, outside such a range, the thread waits for all
  collectives of that kind (DDP's finalize waits for every all-reduce, copying each bucket's
  gradients as it arrives; the ZeRO hooks and ``ZeroRedundancyOptimizer.step`` wait for their
  broadcasts) where it blocked: before the compute that follows its longest idle stretch, up to
  the first compute past the rank's last interval of that kind (autograd's last small ops often
  run right after the last issue, beside the collective); where the thread went on there while
  some were still in flight, for those one by one (``_waits_in_turn``);
- a step ends when its thread is done and every collective has finished.

Time on the thread between events is kept as work (compute, Python, dispatch), except the gap
before the first event after a ``Wait``: that gap was spent blocked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tpbench.analysis.overlap import covered_before, union
from tpbench.analysis.replay import CollectiveSpec, Issue, Key, Op, StepSkeleton, Wait, Work
from tpbench.analysis.timeline import MARK_KINDS


class NotModelled(ValueError):
    """A case's traces cannot be made into a replayable model (its ranks disagree, a size is
    missing, nothing was communicated): that case is refused with this reason, the run's other
    cases are still modelled."""


@dataclass
class TraceMarks:
    """One rank's marks (``timeline.Timeline.marks``), as the skeleton walks them: step spans with
    their thread, the training thread's collective issues (``c10d::*`` ops) and ZeRO step ranges (ns)."""

    rank: int
    steps: list[tuple[int, int, int, int]]  # (step, tid, start, end)
    issues: list[tuple[int, int, int, str]]  # (tid, start, end, collective)
    zero_steps: list[tuple[int, int, int, int]]  # (tid, start, end, bucket)


def _rows(marks: pd.DataFrame, *columns: str) -> list[tuple]:
    """``marks``' ``columns`` as sorted tuples: integers, but a collective's name."""
    return sorted(zip(*(marks[c] if c == "collective" else marks[c].astype(int) for c in columns)))


def marks_from_table(table: pd.DataFrame) -> list[TraceMarks]:
    """Each rank's marks from a ``timeline.Timeline.marks`` table (as the store keeps it)."""
    out = []
    for rank, g in table.groupby("rank", sort=True):
        by = {k: g[g["kind"] == k] for k in MARK_KINDS}
        out.append(
            TraceMarks(
                int(rank),
                _rows(by["step"], "index", "tid", "start_ns", "end_ns"),
                _rows(by["issue"], "tid", "start_ns", "end_ns", "collective"),
                _rows(by["zero_step"], "tid", "start_ns", "end_ns", "index"),
            )
        )
    return out


def _rank_step_ops(
    marks: TraceMarks, step: tuple[int, int, int, int], intervals: pd.DataFrame
) -> tuple[list[Op], list[tuple[Key, float | None]]]:
    """One rank's ops for one step and its collectives (key, bytes) in issue order."""
    _, tid, s0, s1 = step
    mine = intervals[intervals["rank"] == marks.rank]
    compute = mine[
        (mine["lane"] == "compute")
        & (mine["stream_or_thread"] == f"thread {tid}")
        & (mine["start_ns"] >= s0)
        & (mine["start_ns"] < s1)
    ]
    comm = mine[(mine["lane"] == "comm") & (mine["start_ns"] >= s0) & (mine["start_ns"] < s1)].sort_values("start_ns")
    by_kind = comm.groupby(comm["collective"].astype(str), sort=False)
    sizes = {c: g["bytes"].tolist() for c, g in by_kind}
    began = {c: g["start_ns"].tolist() for c, g in by_kind}
    ranges = [(a, b, k) for t, a, b, k in marks.zero_steps if t == tid and s0 <= a < s1]

    def bucket_of(start: int) -> int | None:
        return next((k for a, b, k in ranges if a <= start < b), None)

    events: list[tuple[int, int, Key | None, int | None]] = [
        (int(a), int(b), None, bucket_of(int(a))) for a, b in zip(compute["start_ns"], compute["end_ns"])
    ]
    counts: dict[str, int] = {}
    colls: list[tuple[Key, float | None]] = []
    # Where each collective began, within its issue op: the thread's time in the op up to there is
    # work before the issue (copies into Gloo's buffers), the rest ran while it was in flight (the
    # op may block for milliseconds while Gloo's threads take the cores).
    issued_at: dict[Key, int] = {}
    for t, a, b, coll in marks.issues:
        if t == tid and s0 <= a < s1:
            k = counts.get(coll, 0)
            counts[coll] = k + 1
            got = sizes.get(coll, [])
            nbytes = got[k] if k < len(got) and not pd.isna(got[k]) else None
            events.append((a, b, (coll, k), None))
            colls.append(((coll, k), nbytes))
            start = began.get(coll, [])
            issued_at[(coll, k)] = min(max(int(start[k]), a), b) if k < len(start) else b
    events.sort(key=lambda e: (e[0], e[2] is None))
    last_issue = {key[0]: i for i, (_, _, key, _) in enumerate(events) if key is not None}
    # Where the thread waits for a kind: before the compute after its last issue that follows the
    # longest idle stretch of the thread, up to the first compute that starts once this rank's last
    # collective of that kind has ended. Compute just after the last issue often ran beside the
    # collective (autograd's last ops, a hook's bookkeeping) and the thread blocked later; and a
    # gloo range may end after the thread already went on (its end is recorded after the future
    # completes), so the first compute past it can come after the blocked stretch. Where the thread
    # went on while some were still in flight, it waited for them one by one (``_waits_in_turn``).
    comm_end = comm.groupby(comm["collective"].astype(str))["end_ns"].max().to_dict()
    ended = {(c, k): int(e) for c, g in by_kind for k, e in enumerate(g["end_ns"])}
    reach = np.maximum.accumulate([s0] + [b for _, b, _, _ in events])  # reach[j]: thread busy up to, before j
    gate: dict[str, int | None] = {}
    in_turn: dict[int, list[Key]] = {}  # compute event → the collectives it waits for first
    for kind, last in last_issue.items():
        candidates, past_end = [], None
        for j in range(last + 1, len(events)):
            if events[j][2] is None:
                candidates.append(j)
                if events[j][0] >= comm_end.get(kind, 0):
                    past_end = j
                    break
        longest = max(candidates, key=lambda j: events[j][0] - reach[j], default=None)
        keys = [k for k, _ in colls if k[0] == kind]
        gate[kind], partial = _waits_in_turn(events, reach, candidates, longest, past_end, keys, ended)
        for j, got in partial.items():
            in_turn.setdefault(j, []).extend(got)
    waited_buckets: set[int] = set()
    waited_kinds: set[str] = set()
    waited: set[Key] = set()
    # Every span the thread's work is cut at starts and ends at s0 or at an event's start or end:
    # how much of the rank's communication lies before each, in one pass.
    us, ue = union(comm["start_ns"].to_numpy(), comm["end_ns"].to_numpy())
    cuts = np.unique([s0, *(t for a, b, _, _ in events for t in (a, b)), *issued_at.values()])
    covered = dict(zip(cuts.tolist(), covered_before(us, ue, np.r_[0, np.cumsum(ue - us)], cuts).tolist()))

    def beside(x: int, y: int) -> float:  # ns of [x, y) during this rank's communication
        return float(covered[y] - covered[x])

    ops: list[Op] = []
    pending, pending_beside, cursor = 0.0, 0.0, s0
    for i, (a, b, key, bucket) in enumerate(events):
        waits: list[Key] = []
        if key is None and bucket is not None and bucket not in waited_buckets:
            waited_buckets.add(bucket)
            waits.append(("allreduce", bucket))
        if key is None and bucket is None:
            waits += [k for k in in_turn.get(i, ()) if k not in waited]
            for kind, at in gate.items():
                if at is not None and i >= at and kind not in waited_kinds:
                    waited_kinds.add(kind)
                    waits += [k for k, _ in colls if k[0] == kind and k not in waited and k not in waits]
            waited.update(waits)
        if waits:
            if pending:
                ops.append(Work(pending / 1e9, pending_beside / 1e9))
                pending = pending_beside = 0.0
            ops.append(Wait(tuple(waits)))
        elif a > cursor:
            pending += a - cursor
            pending_beside += beside(cursor, a)
        cursor = max(cursor, a)
        for n, end in enumerate((b,) if key is None else (issued_at[key], b)):
            if end > cursor:
                pending += end - cursor
                pending_beside += beside(cursor, end)
            cursor = max(cursor, end)
            if key is not None and n == 0:
                ops.append(Work(pending / 1e9, pending_beside / 1e9))
                pending = pending_beside = 0.0
                ops.append(Issue(key))
    if pending:
        ops.append(Work(pending / 1e9, pending_beside / 1e9))
    return ops, colls


# An idle stretch of the thread shorter than this is dispatch, not a wait; a collective counts as
# ended by a compute that starts up to END_SLACK_NS before its recorded end (a gloo range's end is
# recorded after its future completes, once the thread may already have gone on).
IDLE_NS = 100_000
END_SLACK_NS = 1_000_000


def _waits_in_turn(
    events: list[tuple[int, int, Key | None, int | None]],
    reach: np.ndarray,
    candidates: list[int],
    longest: int | None,
    past_end: int | None,
    keys: list[Key],
    ended: Mapping[Key, int],
) -> tuple[int | None, dict[int, list[Key]]]:
    """Where a kind's collectives are waited for after its last issue: the compute that waits for
    all of them, and the computes before it that wait for some.

    DDP's finalize (the ZeRO hooks run inside it) waits for its buckets one by one and copies each
    bucket's gradients as it arrives, so the thread blocks, works, blocks again. The trace shows
    which: when the compute after the longest idle stretch (``longest``) starts while some of the
    kind's collectives are still in flight, it waits only for those that had ended; so does each
    compute after an idle stretch of the thread (``IDLE_NS``) among ``candidates``, for those ended
    by its start; and the first compute past the kind's last end (``past_end``; None: there is
    none, the step's end waits) waits for all. Otherwise ``longest`` waits for all, and only the
    computes before it for some. Waiting for all at ``longest`` in every case put every copy after
    the last collective (a 0.5 MB ``zero_no_overlap`` step replayed 12 % slow)."""
    partial = {}
    for j in candidates:
        if j != past_end and events[j][0] - reach[j] >= IDLE_NS:
            got = [k for k in keys if ended.get(k, math.inf) <= events[j][0] + END_SLACK_NS]
            if 0 < len(got) < len(keys):
                partial[j] = got
    if longest in partial:
        return past_end, partial
    return longest, {j: got for j, got in partial.items() if longest is None or j < longest}


def skeletons(marks: Sequence[TraceMarks], intervals: pd.DataFrame) -> list[StepSkeleton]:
    """One skeleton per profiled step that every rank has, built from each rank's marks and the
    case's stored intervals (``timeline`` columns). Collective sizes come from the comm intervals
    (the k-th of a kind in the step on that rank); a size no rank recorded raises ``ValueError``."""
    marks = sorted(marks, key=lambda m: m.rank)
    by_rank = [{s[0]: s for s in m.steps} for m in marks]
    common = sorted(set.intersection(*(set(b) for b in by_rank))) if by_rank else []
    out = []
    for step in common:
        ops, colls = zip(*(_rank_step_ops(m, b[step], intervals) for m, b in zip(marks, by_rank)))
        keys = [k for k, _ in colls[0]]
        for r, c in enumerate(colls):
            if sorted(k for k, _ in c) != sorted(keys):
                raise NotModelled(
                    f"step {step}: rank {marks[r].rank} issued different collectives than rank {marks[0].rank}"
                )
        sizes: dict[Key, float] = {}
        for c in colls:
            for k, b in c:
                if b is not None:
                    sizes[k] = max(sizes.get(k, 0.0), float(b))
        missing = [k for k in keys if k not in sizes]
        if missing:
            raise NotModelled(
                f"step {step}: no size recorded for collectives {missing[:3]}{'…' if len(missing) > 3 else ''}; "
                "traces need the profiler's record_shapes=True"
            )
        specs = tuple(CollectiveSpec(k, sizes[k], len(marks)) for k in keys)
        measured = max(b[step][3] - b[step][2] for b in by_rank) / 1e9
        out.append(StepSkeleton(step, tuple(tuple(o) for o in ops), specs, measured))
    return out
