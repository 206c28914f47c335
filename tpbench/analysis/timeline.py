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
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
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
MARK_COLUMNS = ("rank", "kind", "tid", "start_ns", "end_ns", "index", "collective")
MARK_KINDS = ("step", "issue", "zero_step")
# The collectives a what-if replay costs (its issues): the others move no modelled payload.
COSTED_COLLECTIVES = ("allreduce", "broadcast", "allgather", "reduce_scatter", "alltoall", "reduce")

_CHUNK_BYTES = 8 << 20
_EVENT_SEPARATOR = b"},\n  {"
_STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")
_RANK_RE = re.compile(r"rank[_-]?(\d+)")
_ZERO_STEP_RE = re.compile(r"tpbench\.zero\.step\[bucket=(\d+)\]")
_COMPUTE, _COMM, _MEMCPY = 0, 1, 2  # kernel kinds
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

    ``marks``: what a what-if skeleton needs beyond the intervals, columns ``MARK_COLUMNS``: each
    ``ProfilerStep#N`` span with its thread (kind ``step``, ``index`` the step number), each
    ``c10d::*`` op that issues a costed collective (``issue``, with its ``collective``) and each
    ZeRO hook's ``tpbench.zero.step[bucket=K]`` range (``zero_step``, ``index`` K).
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
    acc = _Accumulator()
    meta = _scan(Path(path), acc)
    dist = meta.get("distributedInfo") or {}
    if rank is None:
        rank = dist.get("rank")
    if rank is None:
        m = _RANK_RE.search(Path(path).name)
        if m is None and not alone:
            raise ValueError(f"{path}: no rank given, none in distributedInfo or in the file name "
                             "(with several traces each must name its rank)")
        if m is None:
            warnings.warn(f"{path}: no rank in distributedInfo or in the file name; taken as rank 0", stacklevel=2)
        rank = int(m.group(1)) if m else 0
    if not acc.steps:
        warnings.warn(f"{path}: no ProfilerStep#N in the trace; the whole trace is analysed as one step (step 0)",
                      stacklevel=2)
    return acc.finish(int(rank), dist)


# --------------------------------------------------------------------------- streaming decode


def _open(path: Path) -> BinaryIO:
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")  # noqa: SIM115


def _scan(path: Path, acc: _Accumulator) -> dict[str, Any]:
    """Feed the ``traceEvents`` array to ``acc`` a few MB at a time; return the other top-level keys.

    torch.profiler writes one event per block, each opening on a line of its own indented by two
    spaces, so ``},\n  {`` is an event boundary and nothing else (JSON strings hold no raw newline).
    Other layouts are cut after any ``}`` followed by ``,`` and ``{``; should such a cut fall inside
    a nested value, the piece fails to decode and is extended with the next chunk, so any valid
    JSON is read correctly, only more slowly.
    """
    key = b'"traceEvents"'
    with _open(path) as f:
        head = b""
        while (at := head.find(key)) < 0:
            data = f.read(_CHUNK_BYTES)
            if not data:
                return orjson.loads(head)
            head += data
        meta = orjson.loads(head[:at] + b'"traceEvents": []}')
        del meta["traceEvents"]
        while (open_at := head.find(b"[", at)) < 0:
            head += f.read(_CHUNK_BYTES)
        pending = head[open_at + 1 :]
        del head
        while True:
            data = f.read(_CHUNK_BYTES)
            pending += data
            if (cut := pending.rfind(_EVENT_SEPARATOR)) >= 0:
                if acc.take_piece(pending[: cut + 1], layout_known=True):
                    pending = pending[cut + 2 :]
            elif (cut := _last_boundary(pending)) > 0 and acc.take_piece(pending[:cut], layout_known=False):
                pending = pending[cut + 1 :]
            if not data:
                break
        rest = orjson.loads(b'{"traceEvents": [' + pending)
        acc.take(rest.pop("traceEvents"))
        meta.update(rest)
    return meta


def _last_boundary(buf: bytes) -> int:
    """Index of the last ``,`` that separates two objects (``}`` ws* ``,`` ws* ``{``), or -1."""
    end = len(buf)
    while (comma := buf.rfind(b",", 0, end)) > 0:
        i = comma - 1
        while i > 0 and buf[i] in b" \t\r\n":
            i -= 1
        if buf[i] == ord("}") and buf[comma + 1 : comma + 64].lstrip().startswith(b"{"):
            return comma
        end = comma
    return -1


# --------------------------------------------------------------------------- per-event collection
#
# The fast path reads torch.profiler's event layout ("ph", "cat", "name", "pid", "tid", "ts", "dur",
# then "args") with regular expressions over the raw bytes, so the bulk of a trace (CPU ops and
# kernels, whose args hold shapes and strides nobody here needs) never becomes Python objects:
# the captured fields go straight into numpy arrays. Only the few events whose arguments matter
# (annotations, collectives, NCCL kernels) are decoded as JSON. Every piece is checked: if the
# expressions do not account for every complete event in it, the piece is decoded as JSON instead.
# The expressions start with the literal ``"ph": "X",`` so the regex engine can skip ahead to it.

_STR = rb'"[^"\\]*(?:\\.[^"\\]*)*"'  # a JSON string, quotes included
_NUM = rb"-?[\d.]+(?:[eE][-+]?\d+)?"
_X = rb'"ph": "X",\s*"cat":\s*"'


def _head(cats: bytes, capture: bool = True) -> bytes:
    """An X event's fields up to ``dur``; with ``capture``: cat, name (JSON-quoted), tid, ts, dur."""
    def g(p: bytes) -> bytes:
        return (b"(" if capture else b"(?:") + p + b")"

    return (
        _X + g(cats) + rb'",\s*"name":\s*' + g(_STR) + rb',\s*"pid":\s*(?:"[^"]*"|-?\d+),\s*"tid":\s*'
        + g(rb'"[^"]*"|-?\d+') + rb',\s*"ts":\s*' + g(_NUM) + rb',\s*"dur":\s*' + g(_NUM)
    )


def _arg(key: bytes) -> bytes:
    """Look ahead, within a flat args object, for an integer argument ``key``."""
    return rb'(?=[^{}]*?"' + key + rb'":\s*(-?\d+))'


_HEADS = re.compile(_head(rb'[^"]*'))
_TRACE_SPANS = re.compile(rb'"ph":\s*"X",\s*"cat":\s*"Trace"')
_KERNEL_ARGS = re.compile(
    _head(rb"kernel|gpu_memcpy|gpu_memset", capture=False) + rb',\s*"args":\s*\{' + _arg(b"stream") + _arg(b"correlation")
)
_LAUNCH_ARGS = re.compile(_head(rb"cuda_runtime|cuda_driver", capture=False) + rb'(?:,\s*"args":\s*\{' + _arg(b"correlation") + b")?")
_SPECIAL = re.compile(  # whole objects, for JSON decoding
    rb'\{\s*' + _X + rb'(?:user_annotation"|gpu_user_annotation"|'
    rb'cpu_op",\s*"name":\s*"(?:record_param_comms|ProfilerStep|c10d::)[^"\\]*(?:\\.[^"\\]*)*"|'
    rb'kernel",\s*"name":\s*"nccl[^"\\]*(?:\\.[^"\\]*)*")'
    rb'(?:[^{}"]|' + _STR + rb'|\{(?:[^{}"]|' + _STR + rb")*\})*\}"
)

# What a name says about its event, by its start: precomputed once per distinct name.
_PLAIN, _ATEN, _NCCL, _MEMORY, _STEP_OR_COMMS = 0, 1, 2, 3, 4


def _name_class(name: str) -> int:
    if name.startswith("aten::"):
        return _ATEN
    if name.startswith("nccl"):
        return _NCCL
    if name.startswith(("Memcpy", "Memset")):
        return _MEMORY
    if name.startswith(("record_param_comms", "ProfilerStep", "c10d::")):
        return _STEP_OR_COMMS
    return _PLAIN


def _kernel_kinds(is_kernel: np.ndarray, name_class: np.ndarray) -> np.ndarray:
    """GPU events → _COMPUTE / _COMM (``^nccl``) / _MEMCPY (memcpy, memset events or names)."""
    memory = ~is_kernel | (name_class == _MEMORY)
    return np.where(memory, _MEMCPY, np.where(name_class == _NCCL, _COMM, _COMPUTE)).astype(np.int8)


class _Columns:
    """Numeric columns gathered a chunk at a time and concatenated once, at the end."""

    def __init__(self, **dtypes: type) -> None:
        self.dtypes = dtypes
        self.chunks: dict[str, list[np.ndarray]] = {k: [] for k in dtypes}

    def add(self, **cols: Any) -> None:
        for k, v in cols.items():
            self.chunks[k].append(np.asarray(v, dtype=self.dtypes[k]))

    def __getitem__(self, k: str) -> np.ndarray:
        parts = self.chunks[k]
        if len(parts) != 1:
            parts[:] = [np.concatenate(parts) if parts else np.array([], dtype=self.dtypes[k])]
        return parts[0]

    def __len__(self) -> int:
        return sum(len(c) for c in self.chunks[next(iter(self.chunks))])


class _Accumulator:
    """Keeps, from a stream of trace events, only what the lanes, steps and collective metadata need.

    Bulk events (aten ops, kernels, launches) go into numpy columns; rare ones (ranges,
    collectives, steps) keep their few arguments in tuples.
    """

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.name_classes: list[int] = []  # _name_class of each name, by code
        self.quoted: dict[bytes, int] = {}  # JSON-quoted name → code
        self.aten = _Columns(tid=np.int64, ts=np.float64, dur=np.float64, name=np.int64)
        self.kernels = _Columns(stream=np.int64, ts=np.float64, dur=np.float64, name=np.int64, kind=np.int8, corr=np.int64)
        self.launches = _Columns(corr=np.int64, tid=np.int64, ts=np.float64)  # correlation → (thread, time)
        self.nccl_meta: dict[int, dict[str, Any]] = {}  # kernel correlation → metadata from its own args
        self.comms: list[tuple[int, float, float, dict[str, Any]]] = []  # record_param_comms
        self.gloo: list[tuple[int, float, float, str, Any, Any]] = []
        self.cpu_ranges: list[tuple[int, float, float, str]] = []  # optimizer ranges
        self.gpu_ranges: list[tuple[int, float, float, str]] = []
        self.steps: list[tuple[int, int, float, float]] = []  # (step, tid, ts, dur)
        self.issues: list[tuple[int, float, float, str]] = []  # c10d:: ops issuing a costed collective

    def code(self, name: str) -> int:
        c = self.names.get(name)
        if c is None:
            c = self.names[name] = len(self.names)
            self.name_classes.append(_name_class(name))
        return c

    def take_piece(self, piece: bytes, layout_known: bool) -> bool:
        """Take the events in ``piece`` (events separated by commas); False if it does not decode
        (a cut inside a nested value), in which case nothing was taken.

        ``layout_known``: the piece was cut at torch.profiler's event boundaries, so the fast path
        may read it (it checks the piece's events against its expressions, not the JSON syntax).
        """
        if layout_known and self._take_fast(piece):
            return True
        try:
            events = orjson.loads(b"[" + piece + b"]")
        except orjson.JSONDecodeError:
            return False
        self.take(events)
        return True

    def _take_fast(self, piece: bytes) -> bool:
        heads = [h for h in _HEADS.findall(piece) if h[0] != b"Trace"]
        # The profiler's top-level span (cat "Trace", nothing here needs it) comes in other field
        # orders too (older Kineto: ph, cat, ts, dur, pid, tid, name): it is left out of the count.
        spans = len(_TRACE_SPANS.findall(piece))
        if len(heads) != piece.count(b'"ph": "X"') + piece.count(b'"ph":"X"') - spans:
            return False
        if not heads:
            return True
        cat_t, quoted, tid_t, ts_t, dur_t = zip(*heads)
        cat = np.array(cat_t)
        code = self._quoted_codes(quoted)
        cls = np.array(self.name_classes, dtype=np.int8)[code]
        is_cpu, is_kernel = cat == b"cpu_op", cat == b"kernel"
        is_aten = is_cpu & (cls == _ATEN)
        is_gpu = is_kernel | (cat == b"gpu_memcpy") | (cat == b"gpu_memset")
        is_launch = (cat == b"cuda_runtime") | (cat == b"cuda_driver")
        is_special = (
            (cat == b"user_annotation") | (cat == b"gpu_user_annotation")
            | (is_cpu & (cls == _STEP_OR_COMMS)) | (is_kernel & (cls == _NCCL))
        )
        kernel_args = _KERNEL_ARGS.findall(piece) if is_gpu.any() else []
        launch_args = _LAUNCH_ARGS.findall(piece) if is_launch.any() else []
        specials = _SPECIAL.findall(piece) if is_special.any() else []
        if (len(kernel_args), len(launch_args), len(specials)) != (is_gpu.sum(), is_launch.sum(), is_special.sum()):
            return False
        try:
            special_events = orjson.loads(b"[" + b",".join(specials) + b"]")
        except orjson.JSONDecodeError:
            return False
        ts, dur, tid = np.array(ts_t).astype(np.float64), np.array(dur_t).astype(np.float64), np.array(tid_t)
        if is_aten.any():
            self.aten.add(tid=tid[is_aten].astype(np.int64), ts=ts[is_aten], dur=dur[is_aten], name=code[is_aten])
        if is_gpu.any():
            kind = _kernel_kinds(is_kernel[is_gpu], cls[is_gpu])
            stream_corr = np.array(kernel_args).astype(np.int64)
            self.kernels.add(stream=stream_corr[:, 0], ts=ts[is_gpu], dur=dur[is_gpu], name=code[is_gpu], kind=kind,
                             corr=stream_corr[:, 1])
        if is_launch.any():
            corr = np.array(launch_args)
            has = corr != b""
            self.launches.add(corr=corr[has].astype(np.int64), tid=tid[is_launch][has].astype(np.int64),
                              ts=ts[is_launch][has])
        for e in special_events:
            self._special(e)
        return True

    def _quoted_codes(self, quoted: tuple[bytes, ...]) -> np.ndarray:
        """Name codes for JSON-quoted names; each distinct one is decoded once per trace."""
        for q in set(quoted).difference(self.quoted):
            self.quoted[q] = self.code(orjson.loads(q))
        return np.fromiter(map(self.quoted.__getitem__, quoted), dtype=np.int64, count=len(quoted))

    def take(self, events: list[dict[str, Any]]) -> None:
        """The general path: decoded events of any layout."""
        aten: list[tuple[int, float, float, int]] = []
        gpu: list[tuple[int, float, float, int, bool, int]] = []
        launches: list[tuple[int, int, float]] = []
        for e in events:
            if e.get("ph") != "X":
                continue
            cat, name = e.get("cat"), e.get("name", "")
            if cat == "cpu_op" and name.startswith("aten::"):
                aten.append((e["tid"], e["ts"], e["dur"], self.code(name)))
            elif cat in ("kernel", "gpu_memcpy", "gpu_memset"):
                args = e.get("args", {})
                gpu.append((args.get("stream", e.get("tid", -1)), e["ts"], e["dur"], self.code(name), cat == "kernel",
                            args.get("correlation", -1)))
                self._special(e)  # an NCCL kernel's metadata
            elif cat in ("cuda_runtime", "cuda_driver"):
                if (corr := e.get("args", {}).get("correlation")) is not None:
                    launches.append((corr, e["tid"], e["ts"]))
            else:
                self._special(e)
        if aten:
            self.aten.add(**dict(zip(("tid", "ts", "dur", "name"), zip(*aten))))
        if gpu:
            stream, ts, dur, code, is_kernel, corr = (np.array(c) for c in zip(*gpu))
            kind = _kernel_kinds(is_kernel, np.array(self.name_classes, dtype=np.int8)[code])
            self.kernels.add(stream=stream, ts=ts, dur=dur, name=code, kind=kind, corr=corr)
        if launches:
            self.launches.add(**dict(zip(("corr", "tid", "ts"), zip(*launches))))

    def _special(self, e: dict[str, Any]) -> None:
        """The rare events whose arguments matter: steps, ranges, collectives' metadata."""
        cat, name = e.get("cat"), e.get("name", "")
        if cat == "user_annotation" and name.startswith("gloo:"):
            args = e.get("args", {})
            self.gloo.append((e["tid"], e["ts"], e["dur"], name, args.get("Input Dims"), args.get("Input type")))
        elif cat == "user_annotation" and _is_optimizer_range(name):
            self.cpu_ranges.append((e["tid"], e["ts"], e["dur"], name))
        elif cat in ("user_annotation", "cpu_op") and (m := _STEP_RE.match(name)):
            self.steps.append((int(m.group(1)), e["tid"], e["ts"], e["dur"]))
        elif cat == "cpu_op" and name.startswith("c10d::"):
            if (collective := canonical_collective(name[len("c10d::"):])) in COSTED_COLLECTIVES:
                self.issues.append((e["tid"], e["ts"], e["dur"], collective))
        elif cat == "cpu_op" and name == "record_param_comms":
            args = e.get("args", {})
            # Older torch versions record no collective metadata here: keep only what is there.
            self.comms.append((e["tid"], e["ts"], e["dur"], {k: args[k] for k in _COMM_META if args.get(k) is not None}))
        elif cat == "gpu_user_annotation" and _is_optimizer_range(name):
            self.gpu_ranges.append((e.get("args", {}).get("stream", e["tid"]), e["ts"], e["dur"], name))
        elif cat == "kernel" and "Collective name" in (args := e.get("args", {})):
            self.nccl_meta[args.get("correlation", -1)] = {k: args.get(k) for k in _COMM_META}

    # ----------------------------------------------------------------------- to DataFrames

    def finish(self, rank: int, dist: dict[str, Any]) -> Timeline:
        pg_name, pg_size = _only_group(dist)
        names = list(self.names)
        parts = [self._gloo_part(pg_name, pg_size)]
        if len(self.kernels):
            parts += [self._kernel_part(names, pg_name, pg_size), _ranges_part(self.gpu_ranges, "stream")]
        else:
            train_tid = _training_thread(self.steps, self.aten["tid"])
            parts += [self._aten_part(names, train_tid), _ranges_part(self.cpu_ranges, "thread")]
        steps = _steps_frame(rank, self.steps) if self.steps else _whole_trace_step(rank, parts)
        return Timeline(intervals=_frame(rank, parts, steps), steps=steps, marks=self._marks(rank))

    def _marks(self, rank: int) -> pd.DataFrame:
        zero = [(tid, ts, dur, int(m.group(1))) for tid, ts, dur, name in self.cpu_ranges
                if (m := _ZERO_STEP_RE.fullmatch(name))]
        rows = ([("step", tid, ts, dur, step, None) for step, tid, ts, dur in self.steps]
                + [("issue", tid, ts, dur, -1, coll) for tid, ts, dur, coll in self.issues]
                + [("zero_step", tid, ts, dur, bucket, None) for tid, ts, dur, bucket in zero])
        start, end = _rows_span(rows, 2, 3)
        return pd.DataFrame({
            "rank": np.full(len(rows), rank, dtype=np.int32), "kind": [r[0] for r in rows],
            "tid": np.array([r[1] for r in rows], dtype=np.int64), "start_ns": start, "end_ns": end,
            "index": np.array([r[4] for r in rows], dtype=np.int64), "collective": [r[5] for r in rows],
        }, columns=list(MARK_COLUMNS))

    def _gloo_part(self, pg_name: str | None, pg_size: int | None) -> pd.DataFrame:
        rows = self.gloo
        collective = [canonical_collective(r[3][len("gloo:") :]) for r in rows]
        return _part(
            "comm", [f"thread {r[0]}" for r in rows], [r[3] for r in rows], *_rows_span(rows, 1, 2),
            nbytes=[_gloo_bytes(r[4], r[5], c, pg_size) for r, c in zip(rows, collective)],
            collective=collective, process_group=[pg_name] * len(rows), group_size=[pg_size] * len(rows),
        )

    def _aten_part(self, names: list[str], train_tid: int | None) -> pd.DataFrame:
        """Outermost aten ops per thread, each put in compute, other or (inside a collective) dropped."""
        tid = self.aten["tid"]
        start, end = _ns_span(self.aten["ts"], self.aten["dur"])
        order = np.lexsort((-end, start, tid))
        tid, start, end = tid[order], start[order], end[order]
        name = self.aten["name"][order]
        keep = np.zeros(len(tid), dtype=bool)
        lane = np.empty(len(tid), dtype=np.int8)
        gloo = _merged_by_thread([(r[0], r[1], r[2]) for r in self.gloo])
        opt = _merged_by_thread([(r[0], r[1], r[2]) for r in self.cpu_ranges])
        compute, other = LANES.index("compute"), LANES.index("other")
        bounds = np.flatnonzero(np.r_[True, tid[1:] != tid[:-1], True])
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            t = int(tid[lo])
            s, e = start[lo:hi], end[lo:hi]
            reach = np.maximum.accumulate(e)
            outer = np.r_[True, s[1:] >= reach[:-1]]
            keep[lo:hi] = outer & ~_inside(s, gloo.get(t))
            lane[lo:hi] = np.where((t == train_tid) | _inside(s, opt.get(t)), compute, other)
        return _part(
            pd.Categorical.from_codes(lane[keep], LANES), _labels("thread", tid[keep]),
            pd.Categorical.from_codes(name[keep], names), start[keep], end[keep],
        )

    def _kernel_part(self, names: list[str], pg_name: str | None, pg_size: int | None) -> pd.DataFrame:
        """GPU kernels, memcpys and memsets; an NCCL kernel's collective metadata comes from its own
        args, else from the ``record_param_comms`` op that launched it, else (older torch versions
        record none) from the kernel's name, with the process group as ``_only_group`` names it."""
        k = self.kernels
        start, end = _ns_span(k["ts"], k["dur"])
        kind = k["kind"]
        name = pd.Categorical.from_codes(k["name"], names)
        n = len(kind)
        nbytes: list[int | None] = [None] * n
        collective: list[str | None] = [None] * n
        group: list[str | None] = [None] * n
        size: list[int | None] = [None] * n
        launch_meta = self._launch_metadata()
        corr = k["corr"]
        for i in np.flatnonzero(kind == _COMM).tolist():
            meta = self.nccl_meta.get(int(corr[i])) or launch_meta.get(int(corr[i])) or {}
            label = meta.get("Collective name")
            collective[i] = canonical_collective(str(label)) if label is not None else _collective_from_kernel(name[i])
            nbytes[i] = _nccl_bytes(meta)
            group[i] = str(meta["Process Group Name"]) if meta.get("Process Group Name") is not None else pg_name
            size[i] = meta.get("Group size") or pg_size
        lane_codes = np.array([LANES.index(x) for x in ("compute", "comm", "memcpy")], dtype=np.int8)[kind]
        return _part(
            pd.Categorical.from_codes(lane_codes, LANES), _labels("stream", k["stream"]),
            name, start, end, nbytes=nbytes, collective=collective, process_group=group, group_size=size,
        )

    def _launch_metadata(self) -> dict[int, dict[str, Any]]:
        """Correlation id → collective metadata of the ``record_param_comms`` op around its launch.

        Older traces put the metadata only on that CPU op, not on the NCCL kernel it launched.
        """
        if not self.comms or not len(self.launches):
            return {}
        ranges: dict[int, list[tuple[float, float, dict[str, Any]]]] = {}
        for tid, ts, dur, meta in self.comms:
            ranges.setdefault(tid, []).append((ts, ts + dur, meta))
        out: dict[int, dict[str, Any]] = {}
        for tid, rs in ranges.items():
            rs.sort(key=lambda r: r[0])
            starts, ends = np.array([r[0] for r in rs]), np.array([r[1] for r in rs])
            mask = self.launches["tid"] == tid
            ts, corr = self.launches["ts"][mask], self.launches["corr"][mask]
            idx = np.searchsorted(starts, ts, side="right") - 1
            inside = (idx >= 0) & (ts <= ends[np.maximum(idx, 0)])
            for c, i in zip(corr[inside].tolist(), idx[inside].tolist()):
                out[c] = rs[i][2]
        return out


# --------------------------------------------------------------------------- helpers


def _is_optimizer_range(name: str) -> bool:
    return name == "tpbench.optimizer" or name.startswith("tpbench.zero.")


def canonical_collective(name: str) -> str:
    """``all_reduce``, ``allreduce_coalesced``, ``_allgather_base``, ``AllReduce`` … → one spelling."""
    n = name.replace("_", "").lower()
    for key, canon in (
        ("allreduce", "allreduce"), ("allgather", "allgather"), ("reducescatter", "reduce_scatter"),
        ("alltoall", "alltoall"), ("broadcast", "broadcast"), ("reduce", "reduce"), ("gather", "gather"),
        ("scatter", "scatter"), ("sendrecv", "sendrecv"), ("send", "send"), ("recv", "recv"), ("barrier", "barrier"),
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
    if not groups:
        return None, dist.get("world_size")
    sizes = {g.get("pg_size") for g in groups}
    size = sizes.pop() if len(sizes) == 1 else None
    name = str(groups[0].get("pg_name")) if len(groups) == 1 else None
    return name, size


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
    return _ns_span(np.array([r[ts] for r in rows], dtype=np.float64), np.array([r[dur] for r in rows], dtype=np.float64))


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


def _ranges_part(rows: list[tuple[int, float, float, str]], where: str) -> pd.DataFrame:
    """Optimizer-lane ranges from (thread or stream, ts µs, dur µs, name) rows."""
    return _part(
        "optimizer", [f"{where} {r[0]}" for r in rows], [r[3] for r in rows], *_rows_span(rows, 1, 2),
    )


def _labels(where: str, ids: np.ndarray) -> pd.Categorical:
    """``thread 4886`` / ``stream 7`` labels for many rows, formatted once per distinct id."""
    uniq, codes = np.unique(ids, return_inverse=True)
    return pd.Categorical.from_codes(codes.reshape(-1), [f"{where} {u}" for u in uniq.tolist()])


def _part(
    lane: str | pd.Categorical, where: Sequence[str] | pd.Categorical, name: Sequence[str] | pd.Categorical,
    start: np.ndarray, end: np.ndarray, *, nbytes: Sequence[int | None] | None = None,
    collective: Sequence[str | None] | None = None, process_group: Sequence[str | None] | None = None,
    group_size: Sequence[int | None] | None = None,
) -> pd.DataFrame:
    """One lane's intervals in the frame's column types; collective columns stay NA unless given."""
    n = len(start)
    none = np.ones(n, dtype=bool)
    return pd.DataFrame({
        "lane": lane if isinstance(lane, pd.Categorical) else pd.Categorical.from_codes(np.full(n, LANES.index(lane), np.int8), LANES),
        "stream_or_thread": _strings(where),
        "name": _strings(name),
        "start_ns": start,
        "end_ns": end,
        "bytes": pd.array(nbytes, dtype="Int64") if nbytes is not None else pd.arrays.IntegerArray(np.zeros(n, np.int64), none),
        "collective": _strings(collective if collective is not None else np.full(n, None)),
        "process_group": _strings(process_group if process_group is not None else np.full(n, None)),
        "group_size": pd.array(group_size, dtype="Int64") if group_size is not None else pd.arrays.IntegerArray(np.zeros(n, np.int64), none),
    })


def _whole_trace_step(rank: int, parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Step 0 spanning every interval: how a trace without ``ProfilerStep#N`` is analysed (as HTA does)."""
    starts = [p["start_ns"].min() for p in parts if len(p)]
    ends = [p["end_ns"].max() for p in parts if len(p)]
    return pd.DataFrame({
        "rank": np.full(1 if starts else 0, rank, dtype=np.int32),
        "step": np.zeros(1 if starts else 0, dtype=np.int64),
        "start_ns": np.array([min(starts)] if starts else [], dtype=np.int64),
        "end_ns": np.array([max(ends)] if ends else [], dtype=np.int64),
    })


def _steps_frame(rank: int, steps: list[tuple[int, int, float, float]]) -> pd.DataFrame:
    rows = sorted(steps)
    start, end = _rows_span(rows, 2, 3)
    return pd.DataFrame({
        "rank": np.full(len(rows), rank, dtype=np.int32),
        "step": np.array([s[0] for s in rows], dtype=np.int64),
        "start_ns": start,
        "end_ns": end,
    })


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
        out[c] = pd.api.types.union_categoricals([f[c] for f in frames], sort_categories=True).remove_unused_categories()
    out["lane"] = pd.Categorical(out["lane"], categories=LANES)
    return out
