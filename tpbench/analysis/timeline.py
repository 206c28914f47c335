"""torch.profiler Chrome traces → interval DataFrames: what ran on which lane, when, per rank and step.

Parsing is kept apart from analysis, as in Holistic Trace Analysis: this module turns trace files
into two plain DataFrames (``Timeline.intervals`` and ``Timeline.steps``) and ``overlap`` and
``bandwidth`` are pure functions over them.

Lanes (one per interval):

- ``comm``: NCCL kernels (name ``^nccl``) on GPU traces; ``gloo:*`` ranges on the process group's
  threads on any trace (Gloo with CUDA tensors still communicates on CPU threads).
- ``compute``: on traces with GPU kernels, every other kernel; on CPU-only traces, the outermost
  ``aten::`` ops of the training thread (the one that carries ``ProfilerStep#N``) and those run
  inside an optimizer range on any thread (a ZeRO hook may step the optimizer in a future's
  callback). ``aten::`` ops nested inside a ``gloo:*`` range belong to the collective and are dropped.
- ``memcpy``: GPU memcpy/memset.
- ``optimizer``: the ``tpbench.optimizer`` phase and the ZeRO hooks' ``tpbench.zero.step[bucket=K]`` /
  ``tpbench.zero.broadcast[bucket=K]`` ranges (GPU annotations on GPU traces). These are context,
  not extra work: the work inside them is already in ``compute`` or ``comm``.
- ``other``: ``aten::`` work of CPU-only traces on threads that are neither training nor inside a
  collective or optimizer range.

Why a streaming reader: real traces reach hundreds of MB, and ``json.load`` of one builds Python
dicts for every event (several GB). The ``traceEvents`` array is decoded a chunk at a time with
orjson, the few fields the analyses need go into compact typed arrays, and each chunk's dicts are
dropped before the next chunk is read.
"""

from __future__ import annotations

import gzip
import re
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import orjson
import pandas as pd

from tpbench.analysis.overlap import union

LANES = ("compute", "comm", "optimizer", "memcpy", "other")
INTERVAL_COLUMNS = (
    "rank", "step", "lane", "stream_or_thread", "name", "start_ns", "end_ns",
    "bytes", "collective", "process_group", "group_size",
)
STEP_COLUMNS = ("rank", "step", "start_ns", "end_ns")

_CHUNK_BYTES = 8 << 20
_STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")
_RANK_RE = re.compile(r"rank[_-]?(\d+)")
_COMM_META = ("Collective name", "In msg nelems", "Out msg nelems", "dtype", "Process Group Name", "Group size")

# Element sizes for the dtype spellings that appear in traces: c10 ScalarType names (NCCL
# metadata) and C++ type names (``Input type`` of recorded ops).
DTYPE_BYTES: dict[str, int] = {
    "Float": 4, "float": 4, "Double": 8, "double": 8, "Half": 2, "c10::Half": 2,
    "BFloat16": 2, "c10::BFloat16": 2, "Long": 8, "long int": 8, "int64_t": 8, "Int": 4, "int": 4,
    "Short": 2, "short int": 2, "Char": 1, "signed char": 1, "Byte": 1, "unsigned char": 1,
    "Bool": 1, "bool": 1, "ComplexFloat": 8, "c10::complex<float>": 8, "ComplexDouble": 16,
    "c10::complex<double>": 16, "Float8_e4m3fn": 1, "c10::Float8_e4m3fn": 1, "Float8_e5m2": 1,
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

    ``steps``: one row per (rank, ``ProfilerStep#N``), columns ``STEP_COLUMNS``.
    """

    intervals: pd.DataFrame
    steps: pd.DataFrame


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
    parts = [read_trace(p) for p in paths]
    return Timeline(
        intervals=_concat([t.intervals for t in parts]).sort_values(["rank", "start_ns"], ignore_index=True),
        steps=pd.concat([t.steps for t in parts], ignore_index=True).sort_values(["rank", "step"], ignore_index=True),
    )


def read_trace(path: str | Path, rank: int | None = None) -> Timeline:
    """Parse one rank's trace file.

    The rank comes from ``rank`` if given, else the trace's ``distributedInfo``, else a
    ``rank<r>`` in the file name.
    """
    acc = _Accumulator()
    meta = _scan(Path(path), acc.take)
    dist = meta.get("distributedInfo") or {}
    if rank is None:
        rank = dist.get("rank")
    if rank is None:
        m = _RANK_RE.search(Path(path).name)
        if m is None:
            raise ValueError(f"{path}: no rank given, none in distributedInfo or in the file name")
        rank = int(m.group(1))
    return acc.finish(int(rank), dist)


# --------------------------------------------------------------------------- streaming decode


def _open(path: Path) -> BinaryIO:
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")  # noqa: SIM115


def _scan(path: Path, on_events: Any) -> dict[str, Any]:
    """Feed ``traceEvents`` to ``on_events`` in lists of a few MB; return the other top-level keys.

    The array is cut after a ``}`` that is followed by ``,`` and ``{`` (an event boundary in
    torch.profiler's output). Should such a cut fall inside a nested value, the piece fails to
    decode and is simply extended with the next chunk, so any valid JSON layout is read correctly.
    """
    key = b'"traceEvents"'
    with _open(path) as f:
        buf = b""
        while (at := buf.find(key)) < 0:
            data = f.read(_CHUNK_BYTES)
            if not data:
                return orjson.loads(buf)
            buf += data
        meta = orjson.loads(buf[:at] + b'"traceEvents": []}')
        del meta["traceEvents"]
        while (open_at := buf.find(b"[", at)) < 0:
            buf += f.read(_CHUNK_BYTES)
        buf = buf[open_at + 1 :]
        pending = b""
        while data := f.read(_CHUNK_BYTES):
            pending += data
            cut = _last_boundary(pending)
            if cut < 0:
                continue
            try:
                events = orjson.loads(b"[" + buf + pending[:cut] + b"]")
            except orjson.JSONDecodeError:
                continue
            on_events(events)
            del events
            buf, pending = b"", pending[cut + 1 :]
        rest = orjson.loads(b'{"traceEvents": [' + buf + pending)
        on_events(rest.pop("traceEvents"))
        meta.update(rest)
    return meta


def _last_boundary(buf: bytes) -> int:
    """Index of the last ``,`` that separates two objects (``}`` ws* ``,`` ws* ``{``), or -1."""
    end = len(buf)
    while (comma := buf.rfind(b",", 0, end)) > 0:
        before = buf[:comma].rstrip()
        after = buf[comma + 1 : comma + 64].lstrip()
        if before.endswith(b"}") and after.startswith(b"{"):
            return comma
        end = comma
    return -1


# --------------------------------------------------------------------------- per-event collection


@dataclass
class _Spans:
    """Typed column arrays for one kind of interval: small per row, appendable, numpy-viewable."""

    tid: array = field(default_factory=lambda: array("q"))
    ts: array = field(default_factory=lambda: array("d"))
    dur: array = field(default_factory=lambda: array("d"))
    name: array = field(default_factory=lambda: array("l"))

    def add(self, tid: int, ts: float, dur: float, name: int) -> None:
        self.tid.append(tid)
        self.ts.append(ts)
        self.dur.append(dur)
        self.name.append(name)

    def ns(self) -> tuple[np.ndarray, np.ndarray]:
        ts = np.frombuffer(self.ts, dtype=np.float64)
        dur = np.frombuffer(self.dur, dtype=np.float64)
        return np.rint(ts * 1e3).astype(np.int64), np.rint((ts + dur) * 1e3).astype(np.int64)

    def __len__(self) -> int:
        return len(self.ts)


class _Accumulator:
    """Keeps, from a stream of trace events, only what the lanes, steps and collective metadata need.

    Bulk events (aten ops, kernels, launches) go into typed arrays; rare ones (ranges, collectives)
    keep their few arguments in tuples.
    """

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.aten = _Spans()  # CPU ``aten::`` ops
        self.kernels = _Spans()  # tid = stream
        self.kernel_kind = array("b")  # 0 compute, 1 comm, 2 memcpy
        self.kernel_corr = array("q")
        self.launch_corr = array("q")  # CUDA runtime launches: correlation → (thread, time)
        self.launch_tid = array("q")
        self.launch_ts = array("d")
        self.nccl_meta: dict[int, dict[str, Any]] = {}  # kernel row → metadata from its own args
        self.comms: list[tuple[int, float, float, str, dict[str, Any]]] = []  # record_param_comms
        self.gloo: list[tuple[int, float, float, str, Any, Any]] = []
        self.cpu_ranges: list[tuple[int, float, float, str]] = []  # optimizer ranges
        self.gpu_ranges: list[tuple[int, float, float, str]] = []
        self.steps: list[tuple[int, int, float, float]] = []  # (step, tid, ts, dur)

    def code(self, name: str) -> int:
        c = self.names.get(name)
        if c is None:
            c = self.names[name] = len(self.names)
        return c

    def take(self, events: list[dict[str, Any]]) -> None:
        for e in events:
            if e.get("ph") != "X":
                continue
            cat = e.get("cat")
            name = e.get("name", "")
            if cat == "cpu_op":
                if name.startswith("aten::"):
                    self.aten.add(e["tid"], e["ts"], e["dur"], self.code(name))
                elif name == "record_param_comms":
                    args = e.get("args", {})
                    self.comms.append((e["tid"], e["ts"], e["dur"], name, {k: args.get(k) for k in _COMM_META}))
                elif name.startswith("ProfilerStep"):
                    self._step(e, name)
            elif cat == "kernel" or cat == "gpu_memcpy" or cat == "gpu_memset":
                self._kernel(e, cat, name)
            elif cat == "cuda_runtime" or cat == "cuda_driver":
                corr = e.get("args", {}).get("correlation")
                if corr is not None:
                    self.launch_corr.append(corr)
                    self.launch_tid.append(e["tid"])
                    self.launch_ts.append(e["ts"])
            elif cat == "user_annotation":
                if name.startswith("gloo:"):
                    args = e.get("args", {})
                    self.gloo.append((e["tid"], e["ts"], e["dur"], name, args.get("Input Dims"), args.get("Input type")))
                elif _is_optimizer_range(name):
                    self.cpu_ranges.append((e["tid"], e["ts"], e["dur"], name))
                elif name.startswith("ProfilerStep"):
                    self._step(e, name)
            elif cat == "gpu_user_annotation" and _is_optimizer_range(name):
                self.gpu_ranges.append((e["args"].get("stream", e["tid"]), e["ts"], e["dur"], name))

    def _step(self, e: dict[str, Any], name: str) -> None:
        m = _STEP_RE.match(name)
        if m:
            self.steps.append((int(m.group(1)), e["tid"], e["ts"], e["dur"]))

    def _kernel(self, e: dict[str, Any], cat: str, name: str) -> None:
        args = e.get("args", {})
        if cat != "kernel" or name.startswith(("Memcpy", "Memset")):
            kind = 2
        elif name.startswith("nccl"):
            kind = 1
            if "Collective name" in args:
                self.nccl_meta[len(self.kernels)] = {k: args.get(k) for k in _COMM_META}
        else:
            kind = 0
        self.kernels.add(args.get("stream", e.get("tid", -1)), e["ts"], e["dur"], self.code(name))
        self.kernel_kind.append(kind)
        self.kernel_corr.append(args.get("correlation", -1))

    # ----------------------------------------------------------------------- to DataFrames

    def finish(self, rank: int, dist: dict[str, Any]) -> Timeline:
        steps = _steps_frame(rank, self.steps)
        train_tid = _training_thread(self.steps, self.aten)
        pg_name, pg_size = _only_group(dist)
        names = np.array(list(self.names), dtype=object)
        parts = [self._gloo_part(pg_name, pg_size)]
        if len(self.kernels):
            parts += [self._kernel_part(names), _ranges_part(self.gpu_ranges, "optimizer", "stream")]
        else:
            parts += [self._aten_part(names, train_tid), _ranges_part(self.cpu_ranges, "optimizer", "thread")]
        frame = _frame(rank, [p for p in parts if len(p["start_ns"])], steps)
        return Timeline(intervals=frame, steps=steps)

    def _gloo_part(self, pg_name: str | None, pg_size: int | None) -> dict[str, Any]:
        rows = self.gloo
        start = np.array([_ns(r[1]) for r in rows], dtype=np.int64)
        end = np.array([_ns(r[1] + r[2]) for r in rows], dtype=np.int64)
        collective = [canonical_collective(r[3][len("gloo:") :]) for r in rows]
        nbytes = [_gloo_bytes(r[4], r[5], c, pg_size) for r, c in zip(rows, collective)]
        return {
            "lane": ["comm"] * len(rows), "stream_or_thread": [f"thread {r[0]}" for r in rows],
            "name": [r[3] for r in rows], "start_ns": start, "end_ns": end, "bytes": nbytes,
            "collective": collective, "process_group": [pg_name] * len(rows), "group_size": [pg_size] * len(rows),
        }

    def _aten_part(self, names: np.ndarray, train_tid: int | None) -> dict[str, Any]:
        """Outermost aten ops per thread, each put in compute, other or (inside a collective) dropped."""
        tid = np.frombuffer(self.aten.tid, dtype=np.int64)
        start, end = self.aten.ns()
        order = np.lexsort((-end, start, tid))
        tid, start, end = tid[order], start[order], end[order]
        name = np.frombuffer(self.aten.name, dtype=np.int_)[order]
        keep = np.zeros(len(tid), dtype=bool)
        lane = np.empty(len(tid), dtype=object)
        gloo = _merged_by_thread([(r[0], r[1], r[2]) for r in self.gloo])
        opt = _merged_by_thread([(r[0], r[1], r[2]) for r in self.cpu_ranges])
        bounds = np.flatnonzero(np.r_[True, tid[1:] != tid[:-1], True])
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            t = int(tid[lo])
            s, e = start[lo:hi], end[lo:hi]
            reach = np.maximum.accumulate(e)
            outer = np.r_[True, s[1:] >= reach[:-1]]
            in_comm = _inside(s, gloo.get(t))
            in_opt = _inside(s, opt.get(t))
            keep[lo:hi] = outer & ~in_comm
            lane[lo:hi] = np.where((t == train_tid) | in_opt, "compute", "other")
        n = int(keep.sum())
        return {
            "lane": lane[keep], "stream_or_thread": np.array([f"thread {t}" for t in tid[keep]], dtype=object),
            "name": names[name[keep]], "start_ns": start[keep], "end_ns": end[keep], "bytes": [None] * n,
            "collective": [None] * n, "process_group": [None] * n, "group_size": [None] * n,
        }

    def _kernel_part(self, names: np.ndarray) -> dict[str, Any]:
        start, end = self.kernels.ns()
        kind = np.frombuffer(self.kernel_kind, dtype=np.int8)
        stream = np.frombuffer(self.kernels.tid, dtype=np.int64)
        name = names[np.frombuffer(self.kernels.name, dtype=np.int_)]
        n = len(kind)
        nbytes: list[int | None] = [None] * n
        collective: list[str | None] = [None] * n
        group: list[str | None] = [None] * n
        size: list[int | None] = [None] * n
        launch_meta = self._launch_metadata()
        corr = np.frombuffer(self.kernel_corr, dtype=np.int64)
        for i in np.flatnonzero(kind == 1):
            meta = self.nccl_meta.get(int(i)) or launch_meta.get(int(corr[i]))
            if meta is None:
                collective[i] = _collective_from_kernel(name[i])
                continue
            collective[i] = canonical_collective(str(meta["Collective name"]))
            nbytes[i] = _nccl_bytes(meta)
            group[i] = None if meta.get("Process Group Name") is None else str(meta["Process Group Name"])
            size[i] = meta.get("Group size")
        lane = np.array(["compute", "comm", "memcpy"], dtype=object)[kind]
        labels = {s: f"stream {s}" for s in np.unique(stream).tolist()}
        return {
            "lane": lane, "stream_or_thread": np.array([labels[s] for s in stream.tolist()], dtype=object),
            "name": name, "start_ns": start, "end_ns": end, "bytes": nbytes,
            "collective": collective, "process_group": group, "group_size": size,
        }

    def _launch_metadata(self) -> dict[int, dict[str, Any]]:
        """Correlation id → collective metadata of the ``record_param_comms`` op around its launch.

        Older traces put the metadata only on that CPU op, not on the NCCL kernel it launched.
        """
        if not self.comms or not len(self.launch_corr):
            return {}
        ranges: dict[int, list[tuple[float, float, dict[str, Any]]]] = {}
        for tid, ts, dur, _, meta in self.comms:
            ranges.setdefault(tid, []).append((ts, ts + dur, meta))
        out: dict[int, dict[str, Any]] = {}
        for tid, rs in ranges.items():
            rs.sort(key=lambda r: r[0])
            starts = np.array([r[0] for r in rs])
            mask = np.frombuffer(self.launch_tid, dtype=np.int64) == tid
            ts = np.frombuffer(self.launch_ts, dtype=np.float64)[mask]
            corr = np.frombuffer(self.launch_corr, dtype=np.int64)[mask]
            idx = np.searchsorted(starts, ts, side="right") - 1
            for c, t, i in zip(corr.tolist(), ts.tolist(), idx.tolist()):
                if i >= 0 and t <= rs[i][1]:
                    out[c] = rs[i][2]
        return out


# --------------------------------------------------------------------------- helpers


def _is_optimizer_range(name: str) -> bool:
    return name == "tpbench.optimizer" or name.startswith("tpbench.zero.")


def _ns(us: float) -> int:
    return round(us * 1e3)


def canonical_collective(name: str) -> str:
    """``all_reduce``, ``allreduce_coalesced``, ``_allgather_base``, ``AllReduce`` … → one spelling."""
    n = name.replace("_", "").lower()
    for key, canon in (
        ("allreduce", "allreduce"), ("allgather", "allgather"), ("reducescatter", "reduce_scatter"),
        ("alltoall", "alltoall"), ("broadcast", "broadcast"), ("reduce", "reduce"), ("gather", "gather"),
        ("scatter", "scatter"), ("send", "send"), ("recv", "recv"), ("barrier", "barrier"),
    ):
        if key in n:
            return canon
    return n


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


def _only_group(dist: dict[str, Any]) -> tuple[str | None, int | None]:
    """Gloo ranges carry no process group: name it only when the trace has exactly one.

    With several groups the name stays unknown; the size is still known when all share it.
    """
    groups = dist.get("pg_config") or []
    sizes = {g.get("pg_size") for g in groups}
    size = sizes.pop() if len(sizes) == 1 else dist.get("world_size") if not groups else None
    name = str(groups[0].get("pg_name")) if len(groups) == 1 else None
    return name, size


def _training_thread(steps: list[tuple[int, int, float, float]], aten: _Spans) -> int | None:
    """The thread that carries ``ProfilerStep#N``, else the one with the most aten ops."""
    if steps:
        tids, counts = np.unique([s[1] for s in steps], return_counts=True)
        return int(tids[np.argmax(counts)])
    if len(aten):
        tids, counts = np.unique(np.frombuffer(aten.tid, dtype=np.int64), return_counts=True)
        return int(tids[np.argmax(counts)])
    return None


def _merged_by_thread(rows: Iterable[tuple[int, float, float]]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per thread, the union of ranges as sorted disjoint (start_ns, end_ns) arrays."""
    by: dict[int, list[tuple[float, float]]] = {}
    for tid, ts, dur in rows:
        by.setdefault(tid, []).append((ts, ts + dur))
    out = {}
    for tid, spans in by.items():
        s = np.rint(np.array([a for a, _ in spans]) * 1e3).astype(np.int64)
        e = np.rint(np.array([b for _, b in spans]) * 1e3).astype(np.int64)
        out[tid] = union(s, e)
    return out


def _inside(t: np.ndarray, merged: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """Whether each time in ``t`` falls inside one of the disjoint ranges ``merged``."""
    if merged is None or not len(merged[0]):
        return np.zeros(len(t), dtype=bool)
    starts, ends = merged
    i = np.searchsorted(starts, t, side="right") - 1
    return (i >= 0) & (t < ends[np.maximum(i, 0)])


def _ranges_part(rows: list[tuple[int, float, float, str]], lane: str, where: str) -> dict[str, Any]:
    n = len(rows)
    return {
        "lane": [lane] * n, "stream_or_thread": [f"{where} {r[0]}" for r in rows], "name": [r[3] for r in rows],
        "start_ns": np.array([_ns(r[1]) for r in rows], dtype=np.int64),
        "end_ns": np.array([_ns(r[1] + r[2]) for r in rows], dtype=np.int64),
        "bytes": [None] * n, "collective": [None] * n, "process_group": [None] * n, "group_size": [None] * n,
    }


def _steps_frame(rank: int, steps: list[tuple[int, int, float, float]]) -> pd.DataFrame:
    rows = sorted(steps)
    return pd.DataFrame({
        "rank": np.full(len(rows), rank, dtype=np.int32),
        "step": np.array([s[0] for s in rows], dtype=np.int64),
        "start_ns": np.array([_ns(s[2]) for s in rows], dtype=np.int64),
        "end_ns": np.array([_ns(s[2] + s[3]) for s in rows], dtype=np.int64),
    })


def _frame(rank: int, parts: list[dict[str, Any]], steps: pd.DataFrame) -> pd.DataFrame:
    """Concatenate lane parts into the interval frame: categoricals for the repeated strings."""
    cols: dict[str, Any] = {}
    for c in INTERVAL_COLUMNS[2:]:
        vals = [np.asarray(p[c], dtype=object) if not isinstance(p[c], np.ndarray) else p[c] for p in parts]
        cols[c] = np.concatenate(vals) if vals else np.array([], dtype=object)
    start = cols["start_ns"].astype(np.int64)
    order = np.argsort(start, kind="stable")
    start = start[order]
    step_start = steps["start_ns"].to_numpy()
    step_end = steps["end_ns"].to_numpy()
    i = np.searchsorted(step_start, start, side="right") - 1
    inside = (i >= 0) & (start < step_end[np.maximum(i, 0)]) if len(step_start) else np.zeros(len(start), bool)
    step = np.where(inside, steps["step"].to_numpy()[np.maximum(i, 0)] if len(step_start) else -1, -1)
    return pd.DataFrame({
        "rank": np.full(len(start), rank, dtype=np.int32),
        "step": step.astype(np.int64),
        "lane": pd.Categorical(cols["lane"][order], categories=LANES),
        "stream_or_thread": pd.Categorical(cols["stream_or_thread"][order]),
        "name": pd.Categorical(cols["name"][order]),
        "start_ns": start,
        "end_ns": cols["end_ns"].astype(np.int64)[order],
        "bytes": pd.array(cols["bytes"][order], dtype="Int64"),
        "collective": pd.Categorical(cols["collective"][order]),
        "process_group": pd.Categorical(cols["process_group"][order]),
        "group_size": pd.array(cols["group_size"][order], dtype="Int64"),
    })


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """``pd.concat`` that keeps categorical columns categorical when ranks differ in categories."""
    if len(frames) == 1:
        return frames[0]
    out = pd.concat(frames, ignore_index=True)
    for c in ("stream_or_thread", "name", "collective", "process_group"):
        out[c] = pd.api.types.union_categoricals([f[c] for f in frames], ignore_order=True)
    out["lane"] = pd.Categorical(out["lane"], categories=LANES)
    return out

