"""torch.profiler Chrome traces → interval DataFrames: what ran on which lane, when, per rank and step.

Parsing is kept apart from analysis, as in Holistic Trace Analysis: this module turns trace files
into plain DataFrames (``Timeline.intervals``, ``Timeline.steps`` and ``Timeline.marks``) and
``overlap``, ``bandwidth`` and ``whatif`` are pure functions over them. It is the one reader of
trace files: one pass over a trace gives all three.

Lanes (one per interval):

- ``comm``: NCCL kernels (name ``^nccl``) on GPU traces; ``gloo:*`` ranges on the process group's
  threads on any trace (Gloo with CUDA tensors still communicates on CPU threads).
- ``compute``: on traces with GPU kernels, every other kernel; on CPU-only traces, the outermost
  ``aten::`` ops of the training thread (the one that carries ``ProfilerStep#N``) and those run
  inside an optimizer range on any thread (a ZeRO hook may step the optimizer in a future's
  callback). ``aten::`` ops nested inside a ``gloo:*`` range belong to the collective and are dropped.
  A ``tpbench.burn`` range (``slowdown_kind = "cpu"``'s planted CPU work, which runs no aten op)
  is compute too, on any trace.
- ``memcpy``: GPU memcpy/memset.
- ``optimizer``: the ``tpbench.optimizer`` phase and the ZeRO hooks' ``tpbench.zero.step[bucket=K]`` /
  ``tpbench.zero.broadcast[bucket=K]`` ranges (GPU annotations on GPU traces). These are context,
  not extra work: the work inside them is already in ``compute`` or ``comm``.
- ``other``: ``aten::`` work of CPU-only traces on threads that are neither training nor inside a
  collective or optimizer range.

The bytes are read by ``trace_events`` (a streaming reader: traces reach hundreds of MB); this
module gives the collected events their meaning: lanes, steps and marks.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tpbench.analysis.overlap import union
from tpbench.analysis.trace_events import KERNEL_COMM, TraceEvents, canonical_collective, scan

LANES = ("compute", "comm", "optimizer", "memcpy", "other")
INTERVAL_COLUMNS = (
    "rank",
    "step",
    "lane",
    "stream_or_thread",
    "name",
    "start_ns",
    "end_ns",
    "bytes",
    "collective",
    "process_group",
    "group_size",
    "group_size_unknown",
)
STEP_COLUMNS = ("rank", "step", "start_ns", "end_ns")
MARK_COLUMNS = ("rank", "kind", "tid", "start_ns", "end_ns", "index", "collective")
MARK_KINDS = ("step", "issue", "zero_step", "forward")

_RANK_RE = re.compile(r"rank[_-]?(\d+)")
_ZERO_STEP_RE = re.compile(r"tpbench\.zero\.step\[bucket=(\d+)\]")

# Element sizes for the dtype spellings that appear in traces: c10 ScalarType names (NCCL
# metadata) and C++ type names (``Input type`` of recorded ops).
DTYPE_BYTES: dict[str, int] = {
    "Float": 4,
    "float": 4,
    "Double": 8,
    "double": 8,
    "Half": 2,
    "c10::Half": 2,
    "BFloat16": 2,
    "c10::BFloat16": 2,
    "Long": 8,
    "long int": 8,
    "int64_t": 8,
    "Int": 4,
    "int": 4,
    "Short": 2,
    "short int": 2,
    "Char": 1,
    "signed char": 1,
    "Byte": 1,
    "unsigned char": 1,
    "Bool": 1,
    "bool": 1,
    "ComplexFloat": 8,
    "c10::complex<float>": 8,
    "ComplexDouble": 16,
    "c10::complex<double>": 16,
    "Float8_e4m3fn": 1,
    "c10::Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
    "c10::Float8_e5m2": 1,
}


@dataclass(frozen=True)
class Timeline:
    """The parsed form of one case's traces.

    ``intervals``: one row per interval, columns ``INTERVAL_COLUMNS``; ``step`` is the profiler step
    whose span contains ``start_ns`` (-1 if none): overlap analysis clips intervals to step spans
    itself, so an interval that crosses a boundary counts in both steps. ``bytes`` (payload as
    nccl-tests counts it), ``collective`` (canonical: allreduce, broadcast, allgather,
    reduce_scatter, ...), ``process_group`` and ``group_size`` are set on ``comm`` rows only.
    ``group_size_unknown`` is True on a ``comm`` row whose size the trace does not give although it
    names process groups, of several sizes (``_only_group``): no count of ranks may stand in for it.

    ``steps``: one row per (rank, ``ProfilerStep#N``), columns ``STEP_COLUMNS``.

    ``marks``: what a what-if skeleton needs beyond the intervals, columns ``MARK_COLUMNS``: each
    ``ProfilerStep#N`` span with its thread (kind ``step``, ``index`` the step number), each
    ``c10d::*`` op that issues a costed collective (``issue``, with its ``collective``) and each
    ZeRO hook's ``tpbench.zero.step[bucket=K]`` range (``zero_step``, ``index`` K), and each
    step's ``tpbench.forward`` range (``forward``: the traced forward pass, ``whatif.forward_times``).
    """

    intervals: pd.DataFrame
    steps: pd.DataFrame
    marks: pd.DataFrame


def read_traces(source: str | Path | Sequence[str | Path]) -> Timeline:
    """Parse a folder of per-rank traces (``rank<r>.json[.gz]``, as the store writes them) or a list of files."""
    if isinstance(source, (str, Path)) and Path(source).is_dir():
        paths = sorted(p for p in Path(source).iterdir() if p.name.endswith((".json", ".json.gz")))
    elif isinstance(source, (str, Path)):
        paths = [Path(source)]
    else:
        paths = [Path(p) for p in source]
    if not paths:
        raise FileNotFoundError(f"no trace files (*.json, *.json.gz) in {source}")
    parts = [read_trace(p, alone=len(paths) == 1) for p in paths]
    return Timeline(
        intervals=_concat([t.intervals for t in parts]).sort_values(["rank", "start_ns"], ignore_index=True),
        steps=pd.concat([t.steps for t in parts], ignore_index=True).sort_values(["rank", "step"], ignore_index=True),
        marks=pd.concat([t.marks for t in parts], ignore_index=True),
    )


def read_trace(path: str | Path, rank: int | None = None, alone: bool = True) -> Timeline:
    """Parse one rank's trace file.

    The rank comes from ``rank`` if given, else the trace's ``distributedInfo``, else a
    ``rank<r>`` in the file name, else (``alone``: this file is the whole job's only trace) 0,
    with a warning, as Holistic Trace Analysis assumes. A trace without ``ProfilerStep#N``
    is analysed as one step, numbered 0, from its first interval to its last (with a warning).
    """
    events = TraceEvents()
    meta = scan(Path(path), events)
    dist = meta.get("distributedInfo") or {}
    if rank is None:
        rank = dist.get("rank")
    if rank is None:
        m = _RANK_RE.search(Path(path).name)
        if m is None and not alone:
            raise ValueError(
                f"{path}: no rank given, none in distributedInfo or in the file name "
                "(with several traces each must name its rank)"
            )
        if m is None:
            warnings.warn(f"{path}: no rank in distributedInfo or in the file name; taken as rank 0", stacklevel=2)
        rank = int(m.group(1)) if m else 0
    if not events.steps:
        warnings.warn(
            f"{path}: no ProfilerStep#N in the trace; the whole trace is analysed as one step (step 0)", stacklevel=2
        )
    return _timeline(events, int(rank), dist)


# --------------------------------------------------------------------------- lanes


def _timeline(ev: TraceEvents, rank: int, dist: dict[str, Any]) -> Timeline:
    """The lanes, steps and marks of one rank's collected events."""
    pg_name, pg_size, size_unknown = _only_group(dist)
    names = list(ev.names)
    parts = [_gloo_part(ev, pg_name, pg_size, size_unknown), _burn_part(ev.burns)]
    if len(ev.kernels):
        parts += [_kernel_part(ev, names, pg_name, pg_size, size_unknown), _ranges_part(ev.gpu_ranges, "stream")]
    else:
        train_tid = _training_thread(ev.steps, ev.aten["tid"])
        parts += [_aten_part(ev, names, train_tid), _ranges_part(ev.cpu_ranges, "thread")]
    steps = _steps_frame(rank, ev.steps) if ev.steps else _whole_trace_step(rank, parts)
    return Timeline(intervals=_frame(rank, parts, steps), steps=steps, marks=_marks(ev, rank))


def _marks(ev: TraceEvents, rank: int) -> pd.DataFrame:
    zero = [
        (tid, ts, dur, int(m.group(1))) for tid, ts, dur, name in ev.cpu_ranges if (m := _ZERO_STEP_RE.fullmatch(name))
    ]
    rows = (
        [("step", tid, ts, dur, step, None) for step, tid, ts, dur in ev.steps]
        + [("issue", tid, ts, dur, -1, coll) for tid, ts, dur, coll in ev.issues]
        + [("zero_step", tid, ts, dur, bucket, None) for tid, ts, dur, bucket in zero]
        + [("forward", tid, ts, dur, -1, None) for tid, ts, dur in ev.forwards]
    )
    start, end = _rows_span(rows, 2, 3)
    return pd.DataFrame(
        {
            "rank": np.full(len(rows), rank, dtype=np.int32),
            "kind": [r[0] for r in rows],
            "tid": np.array([r[1] for r in rows], dtype=np.int64),
            "start_ns": start,
            "end_ns": end,
            "index": np.array([r[4] for r in rows], dtype=np.int64),
            "collective": [r[5] for r in rows],
        },
        columns=list(MARK_COLUMNS),
    )


def _gloo_part(ev: TraceEvents, pg_name: str | None, pg_size: int | None, size_unknown: bool) -> pd.DataFrame:
    rows = ev.gloo
    collective = [canonical_collective(r[3][len("gloo:") :]) for r in rows]
    return _part(
        "comm",
        [f"thread {r[0]}" for r in rows],
        [r[3] for r in rows],
        *_rows_span(rows, 1, 2),
        nbytes=[_gloo_bytes(r[4], r[5], c, pg_size) for r, c in zip(rows, collective)],
        collective=collective,
        process_group=[pg_name] * len(rows),
        group_size=[pg_size] * len(rows),
        group_size_unknown=[size_unknown] * len(rows),
    )


def _aten_part(ev: TraceEvents, names: list[str], train_tid: int | None) -> pd.DataFrame:
    """Outermost aten ops per thread, each put in compute, other or (inside a collective) dropped."""
    tid = ev.aten["tid"]
    start, end = _ns_span(ev.aten["ts"], ev.aten["dur"])
    order = np.lexsort((-end, start, tid))
    tid, start, end = tid[order], start[order], end[order]
    name = ev.aten["name"][order]
    keep = np.zeros(len(tid), dtype=bool)
    lane = np.empty(len(tid), dtype=np.int8)
    gloo = _merged_by_thread([(r[0], r[1], r[2]) for r in ev.gloo])
    opt = _merged_by_thread([(r[0], r[1], r[2]) for r in ev.cpu_ranges])
    compute, other = LANES.index("compute"), LANES.index("other")
    # Where each thread's ops begin, and the end; none at all where the trace holds no op.
    bounds = np.flatnonzero(np.r_[True, tid[1:] != tid[:-1], True]) if len(tid) else np.zeros(1, dtype=np.int64)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        t = int(tid[lo])
        s, e = start[lo:hi], end[lo:hi]
        reach = np.maximum.accumulate(e)
        outer = np.r_[True, s[1:] >= reach[:-1]]
        keep[lo:hi] = outer & ~_inside(s, gloo.get(t))
        lane[lo:hi] = np.where((t == train_tid) | _inside(s, opt.get(t)), compute, other)
    return _part(
        pd.Categorical.from_codes(lane[keep], LANES),
        _labels("thread", tid[keep]),
        pd.Categorical.from_codes(name[keep], names),
        start[keep],
        end[keep],
    )


def _kernel_part(
    ev: TraceEvents, names: list[str], pg_name: str | None, pg_size: int | None, size_unknown: bool
) -> pd.DataFrame:
    """GPU kernels, memcpys and memsets; an NCCL kernel's collective metadata comes from its own
    args, else from the ``record_param_comms`` op that launched it, else (older torch versions
    record none) from the kernel's name, with the process group as ``_only_group`` names it."""
    k = ev.kernels
    start, end = _ns_span(k["ts"], k["dur"])
    kind = k["kind"]
    name = pd.Categorical.from_codes(k["name"], names)
    n = len(kind)
    nbytes: list[int | None] = [None] * n
    collective: list[str | None] = [None] * n
    group: list[str | None] = [None] * n
    size: list[int | None] = [None] * n
    unknown = [False] * n
    launch_meta = _launch_metadata(ev)
    corr = k["corr"]
    for i in np.flatnonzero(kind == KERNEL_COMM).tolist():
        meta = ev.nccl_meta.get(int(corr[i])) or launch_meta.get(int(corr[i])) or {}
        label = meta.get("Collective name")
        collective[i] = canonical_collective(str(label)) if label is not None else _collective_from_kernel(name[i])
        nbytes[i] = _nccl_bytes(meta)
        group[i] = str(meta["Process Group Name"]) if meta.get("Process Group Name") is not None else pg_name
        size[i] = meta.get("Group size") or pg_size
        unknown[i] = size[i] is None and size_unknown
    lane_codes = np.array([LANES.index(x) for x in ("compute", "comm", "memcpy")], dtype=np.int8)[kind]
    return _part(
        pd.Categorical.from_codes(lane_codes, LANES),
        _labels("stream", k["stream"]),
        name,
        start,
        end,
        nbytes=nbytes,
        collective=collective,
        process_group=group,
        group_size=size,
        group_size_unknown=unknown,
    )


def _launch_metadata(ev: TraceEvents) -> dict[int, dict[str, Any]]:
    """Correlation id → collective metadata of the ``record_param_comms`` op around its launch.

    Older traces put the metadata only on that CPU op, not on the NCCL kernel it launched.
    """
    if not ev.comms or not len(ev.launches):
        return {}
    ranges: dict[int, list[tuple[float, float, dict[str, Any]]]] = {}
    for tid, ts, dur, meta in ev.comms:
        ranges.setdefault(tid, []).append((ts, ts + dur, meta))
    out: dict[int, dict[str, Any]] = {}
    for tid, rs in ranges.items():
        rs.sort(key=lambda r: r[0])
        starts, ends = np.array([r[0] for r in rs]), np.array([r[1] for r in rs])
        mask = ev.launches["tid"] == tid
        ts, corr = ev.launches["ts"][mask], ev.launches["corr"][mask]
        idx = np.searchsorted(starts, ts, side="right") - 1
        inside = (idx >= 0) & (ts <= ends[np.maximum(idx, 0)])
        for c, i in zip(corr[inside].tolist(), idx[inside].tolist()):
            out[c] = rs[i][2]
    return out


# --------------------------------------------------------------------------- helpers


def _collective_from_kernel(name: str) -> str:
    """``ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)`` → ``allreduce``: the fallback without metadata."""
    parts = name.split("(")[0].split("_")
    return canonical_collective(parts[1]) if len(parts) > 1 else canonical_collective(name)


def _nccl_bytes(meta: dict[str, Any]) -> int | None:
    """nccl-tests' payload: the larger of input and output (allgather: output; reduce_scatter: input)."""
    size = DTYPE_BYTES.get(str(meta.get("dtype")))
    counts = [c for c in (meta.get("In msg nelems"), meta.get("Out msg nelems")) if isinstance(c, int)]
    if size is None or not counts:
        return None
    return max(counts) * size


def _gloo_bytes(dims: Any, types: Any, collective: str, group_size: int | None) -> int | None:
    """Payload of a ``gloo:*`` range from its recorded inputs, counted as nccl-tests counts it.

    Gloo records the op's input tensors: for allgather the payload is the gathered output, so
    ``group_size`` times the input.
    """
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    total = 0
    for shape, dtype in zip(dims, types):
        size = DTYPE_BYTES.get(dtype)
        if size is None or not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            continue
        total += int(np.prod(shape, dtype=np.int64)) * size
    if total == 0:
        return None
    if collective == "allgather":
        return total * group_size if group_size else None
    return total


def _only_group(dist: dict[str, Any]) -> tuple[str | None, int | None, bool]:
    """Gloo ranges carry no process group: name it only when the trace has exactly one.

    With several groups the name stays unknown; the size is still known when all share it. When
    their sizes differ (post-local SGD after its switch: node subgroups beside the world) the size
    is unknown, and the third value says so: the ranks that ran an instance cannot stand in, as two
    node subgroups' all-reduces pair into one instance seen on every rank. A trace that names no
    groups (older torch, ROCm) leaves that guess to ``bandwidth.collective_bandwidth``.
    """
    groups = dist.get("pg_config") or []
    if not groups:
        return None, dist.get("world_size"), False
    sizes = {g.get("pg_size") for g in groups}
    several = len(sizes) > 1
    name = str(groups[0].get("pg_name")) if len(groups) == 1 else None
    return name, None if several else sizes.pop(), several


def _training_thread(steps: list[tuple[int, int, float, float]], aten_tids: np.ndarray) -> int | None:
    """The thread that carries ``ProfilerStep#N``, else the one with the most aten ops."""
    tids, counts = np.unique([s[1] for s in steps] if steps else aten_tids, return_counts=True)
    return int(tids[np.argmax(counts)]) if len(tids) else None


def _ns_span(ts_us: np.ndarray, dur_us: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Trace microseconds (float) → integer nanoseconds, start and end.

    Whole and fractional microseconds are converted apart: older traces carry epoch timestamps
    (~1.7e15 µs), and ``ts * 1e3`` in float64 would round those to 256 ns."""
    ts_us, dur_us = np.asarray(ts_us, dtype=np.float64), np.asarray(dur_us, dtype=np.float64)
    whole = np.floor(ts_us)
    start = whole.astype(np.int64) * 1000 + np.rint((ts_us - whole) * 1e3).astype(np.int64)
    return start, start + np.rint(dur_us * 1e3).astype(np.int64)


def _rows_span(rows: Sequence[tuple[Any, ...]], ts: int, dur: int) -> tuple[np.ndarray, np.ndarray]:
    """``_ns_span`` of the ``ts`` and ``dur`` fields (µs) of tuples."""
    return _ns_span(
        np.array([r[ts] for r in rows], dtype=np.float64), np.array([r[dur] for r in rows], dtype=np.float64)
    )


def _merged_by_thread(rows: Iterable[tuple[int, float, float]]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per thread, the union of (thread, ts µs, dur µs) ranges as sorted disjoint ns arrays."""
    by: dict[int, list[tuple[float, float]]] = {}
    for tid, ts, dur in rows:
        by.setdefault(tid, []).append((ts, dur))
    return {tid: union(*_ns_span(*np.array(spans).T)) for tid, spans in by.items()}


def _inside(t: np.ndarray, merged: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """Whether each time in ``t`` falls inside one of the disjoint ranges ``merged``."""
    if merged is None or not len(merged[0]):
        return np.zeros(len(t), dtype=bool)
    starts, ends = merged
    i = np.searchsorted(starts, t, side="right") - 1
    return (i >= 0) & (t < ends[np.maximum(i, 0)])


def _burn_part(rows: list[tuple[int, float, float, str]]) -> pd.DataFrame:
    """The planted CPU burn's ranges, as compute of their thread."""
    return _part("compute", [f"thread {r[0]}" for r in rows], [r[3] for r in rows], *_rows_span(rows, 1, 2))


def _ranges_part(rows: list[tuple[int, float, float, str]], where: str) -> pd.DataFrame:
    """Optimizer-lane ranges from (thread or stream, ts µs, dur µs, name) rows."""
    return _part(
        "optimizer",
        [f"{where} {r[0]}" for r in rows],
        [r[3] for r in rows],
        *_rows_span(rows, 1, 2),
    )


def _labels(where: str, ids: np.ndarray) -> pd.Categorical:
    """``thread 4886`` / ``stream 7`` labels for many rows, formatted once per distinct id."""
    uniq, codes = np.unique(ids, return_inverse=True)
    return pd.Categorical.from_codes(codes.reshape(-1), [f"{where} {u}" for u in uniq.tolist()])


def _part(
    lane: str | pd.Categorical,
    where: Sequence[str] | pd.Categorical,
    name: Sequence[str] | pd.Categorical,
    start: np.ndarray,
    end: np.ndarray,
    *,
    nbytes: Sequence[int | None] | None = None,
    collective: Sequence[str | None] | None = None,
    process_group: Sequence[str | None] | None = None,
    group_size: Sequence[int | None] | None = None,
    group_size_unknown: Sequence[bool] | None = None,
) -> pd.DataFrame:
    """One lane's intervals in the frame's column types; collective columns stay NA unless given."""
    n = len(start)
    none = np.ones(n, dtype=bool)
    return pd.DataFrame(
        {
            "lane": lane
            if isinstance(lane, pd.Categorical)
            else pd.Categorical.from_codes(np.full(n, LANES.index(lane), np.int8), LANES),
            "stream_or_thread": _strings(where),
            "name": _strings(name),
            "start_ns": start,
            "end_ns": end,
            "bytes": pd.array(nbytes, dtype="Int64")
            if nbytes is not None
            else pd.arrays.IntegerArray(np.zeros(n, np.int64), none),
            "collective": _strings(collective if collective is not None else np.full(n, None)),
            "process_group": _strings(process_group if process_group is not None else np.full(n, None)),
            "group_size": pd.array(group_size, dtype="Int64")
            if group_size is not None
            else pd.arrays.IntegerArray(np.zeros(n, np.int64), none),
            "group_size_unknown": np.array(group_size_unknown if group_size_unknown is not None else np.zeros(n), bool),
        }
    )


def _whole_trace_step(rank: int, parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Step 0 spanning every interval: how a trace without ``ProfilerStep#N`` is analysed (as HTA does)."""
    starts = [p["start_ns"].min() for p in parts if len(p)]
    ends = [p["end_ns"].max() for p in parts if len(p)]
    return pd.DataFrame(
        {
            "rank": np.full(1 if starts else 0, rank, dtype=np.int32),
            "step": np.zeros(1 if starts else 0, dtype=np.int64),
            "start_ns": np.array([min(starts)] if starts else [], dtype=np.int64),
            "end_ns": np.array([max(ends)] if ends else [], dtype=np.int64),
        }
    )


def _steps_frame(rank: int, steps: list[tuple[int, int, float, float]]) -> pd.DataFrame:
    rows = sorted(steps)
    start, end = _rows_span(rows, 2, 3)
    return pd.DataFrame(
        {
            "rank": np.full(len(rows), rank, dtype=np.int32),
            "step": np.array([s[0] for s in rows], dtype=np.int64),
            "start_ns": start,
            "end_ns": end,
        }
    )


def _strings(values: Sequence[str | None] | pd.Categorical) -> pd.Categorical:
    """A categorical of strings whose categories always have the string dtype, even when empty
    or all missing, so parts concatenate into one categorical column."""
    cat = values if isinstance(values, pd.Categorical) else pd.Categorical(values)
    return pd.Categorical.from_codes(cat.codes, categories=pd.Index(cat.categories, dtype=str))


def _frame(rank: int, parts: list[pd.DataFrame], steps: pd.DataFrame) -> pd.DataFrame:
    """Stack the lane parts in time order; tag each interval with its rank and starting step."""
    df = _concat(parts).sort_values("start_ns", kind="stable", ignore_index=True)
    start = df["start_ns"].to_numpy()
    steps = steps.sort_values("start_ns")
    st_start, st_end = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    i = np.searchsorted(st_start, start, side="right") - 1
    inside = (i >= 0) & (start < st_end[np.maximum(i, 0)]) if len(steps) else np.zeros(len(start), dtype=bool)
    step = np.full(len(start), -1, dtype=np.int64)
    step[inside] = steps["step"].to_numpy()[i[inside]]
    df.insert(0, "step", step)
    df.insert(0, "rank", np.full(len(df), rank, dtype=np.int32))
    return df[list(INTERVAL_COLUMNS)]


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """``pd.concat`` that keeps categorical columns categorical when the parts' categories differ."""
    out = pd.concat(frames, ignore_index=True)
    for c in ("stream_or_thread", "name", "collective", "process_group"):
        out[c] = pd.api.types.union_categoricals(
            [f[c] for f in frames], sort_categories=True
        ).remove_unused_categories()
    out["lane"] = pd.Categorical(out["lane"], categories=LANES)
    return out
