"""torch.profiler Chrome traces, byte level: the events that ``timeline`` gives meaning to.

``scan`` feeds a trace file's ``traceEvents`` to a ``TraceEvents``, which keeps only what the lanes,
steps, marks and collective metadata need. Why a streaming reader: real traces reach hundreds of
MB, and ``json.load`` of one builds Python dicts for every event (several GB). The array is
decoded a chunk at a time, the few fields needed go into compact typed arrays, and each chunk's
dicts are dropped before the next chunk is read.
"""

from __future__ import annotations

import gzip
import re
import zlib
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import orjson

# The collectives a what-if replay costs (its issues): the others move no modelled payload.
COSTED_COLLECTIVES = ("allreduce", "broadcast", "allgather", "reduce_scatter", "alltoall", "reduce")
_CHUNK_BYTES = 8 << 20
_EVENT_SEPARATOR = b"},\n  {"
_STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")
KERNEL_COMPUTE, KERNEL_COMM, KERNEL_MEMCPY = 0, 1, 2  # kernel kinds
# The range around ``slowdown_kind = "cpu"``'s burn in a traced step (``worker``): CPU work of the
# training thread without an aten op in it, which the timeline counts as compute.
BURN_RANGE = "tpbench.burn"
# The range around a traced step's forward pass (``worker.train_step``): its span against the timed
# steps' ``forward_ms`` is how much the tracer slowed this host (``whatif.forward_times``).
FORWARD_RANGE = "tpbench.forward"
_COMM_META = ("Collective name", "In msg nelems", "Out msg nelems", "dtype", "Process Group Name", "Group size")


# --------------------------------------------------------------------------- streaming decode


def _open(path: Path) -> BinaryIO:
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")


class TraceUnreadable(ValueError):
    """A trace file that is not a whole Chrome trace: cut short, damaged, or not gzip or JSON at all.
    Its message names the file, so that a sweep can say which of a run's files to deal with."""


def scan(path: Path, acc: TraceEvents) -> dict[str, Any]:
    """``_scan``, with a file that cannot be decoded (a copy cut short, a damaged disk) raised as
    ``TraceUnreadable`` naming it, not as the decoder's error, which names no file."""
    try:
        meta = _scan(path, acc)
    except (orjson.JSONDecodeError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise TraceUnreadable(f"{path}: not a whole Chrome trace, cut short or damaged ({e})") from e
    if not isinstance(meta, dict):
        raise TraceUnreadable(f"{path}: not a Chrome trace (its JSON is a {type(meta).__name__}, not an object)")
    return meta


def _scan(path: Path, acc: TraceEvents) -> Any:
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
        _X
        + g(cats)
        + rb'",\s*"name":\s*'
        + g(_STR)
        + rb',\s*"pid":\s*(?:"[^"]*"|-?\d+),\s*"tid":\s*'
        + g(rb'"[^"]*"|-?\d+')
        + rb',\s*"ts":\s*'
        + g(_NUM)
        + rb',\s*"dur":\s*'
        + g(_NUM)
    )


def _arg(key: bytes) -> bytes:
    """Look ahead, within a flat args object, for an integer argument ``key``."""
    return rb'(?=[^{}]*?"' + key + rb'":\s*(-?\d+))'


_HEADS = re.compile(_head(rb'[^"]*'))
_TRACE_SPANS = re.compile(rb'"ph":\s*"X",\s*"cat":\s*"Trace"')
_KERNEL_ARGS = re.compile(
    _head(rb"kernel|gpu_memcpy|gpu_memset", capture=False)
    + rb',\s*"args":\s*\{'
    + _arg(b"stream")
    + _arg(b"correlation")
)
_LAUNCH_ARGS = re.compile(
    _head(rb"cuda_runtime|cuda_driver", capture=False) + rb'(?:,\s*"args":\s*\{' + _arg(b"correlation") + b")?"
)
_SPECIAL = re.compile(  # whole objects, for JSON decoding
    rb"\{\s*" + _X + rb'(?:user_annotation"|gpu_user_annotation"|'
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
    """GPU events → KERNEL_COMPUTE / KERNEL_COMM (``^nccl``) / KERNEL_MEMCPY (memcpy, memset events or names)."""
    memory = ~is_kernel | (name_class == _MEMORY)
    return np.where(memory, KERNEL_MEMCPY, np.where(name_class == _NCCL, KERNEL_COMM, KERNEL_COMPUTE)).astype(np.int8)


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


class TraceEvents:
    """Keeps, from a stream of trace events, only what the lanes, steps and collective metadata need.

    Bulk events (aten ops, kernels, launches) go into numpy columns; rare ones (ranges,
    collectives, steps) keep their few arguments in tuples.
    """

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.name_classes: list[int] = []  # _name_class of each name, by code
        self.quoted: dict[bytes, int] = {}  # JSON-quoted name → code
        self.aten = _Columns(tid=np.int64, ts=np.float64, dur=np.float64, name=np.int64)
        self.kernels = _Columns(
            stream=np.int64, ts=np.float64, dur=np.float64, name=np.int64, kind=np.int8, corr=np.int64
        )
        self.launches = _Columns(corr=np.int64, tid=np.int64, ts=np.float64)  # correlation → (thread, time)
        self.nccl_meta: dict[int, dict[str, Any]] = {}  # kernel correlation → metadata from its own args
        self.comms: list[tuple[int, float, float, dict[str, Any]]] = []  # record_param_comms
        self.gloo: list[tuple[int, float, float, str, Any, Any]] = []
        self.cpu_ranges: list[tuple[int, float, float, str]] = []  # optimizer ranges
        self.gpu_ranges: list[tuple[int, float, float, str]] = []
        self.burns: list[tuple[int, float, float, str]] = []  # BURN_RANGE ranges
        self.forwards: list[tuple[int, float, float]] = []  # FORWARD_RANGE ranges (tid, ts, dur)
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
            (cat == b"user_annotation")
            | (cat == b"gpu_user_annotation")
            | (is_cpu & (cls == _STEP_OR_COMMS))
            | (is_kernel & (cls == _NCCL))
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
            self.kernels.add(
                stream=stream_corr[:, 0],
                ts=ts[is_gpu],
                dur=dur[is_gpu],
                name=code[is_gpu],
                kind=kind,
                corr=stream_corr[:, 1],
            )
        if is_launch.any():
            corr = np.array(launch_args)
            has = corr != b""
            self.launches.add(
                corr=corr[has].astype(np.int64), tid=tid[is_launch][has].astype(np.int64), ts=ts[is_launch][has]
            )
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
                gpu.append(
                    (
                        args.get("stream", e.get("tid", -1)),
                        e["ts"],
                        e["dur"],
                        self.code(name),
                        cat == "kernel",
                        args.get("correlation", -1),
                    )
                )
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
        elif cat == "user_annotation" and name == BURN_RANGE:
            self.burns.append((e["tid"], e["ts"], e["dur"], name))
        elif cat == "user_annotation" and name == FORWARD_RANGE:
            self.forwards.append((e["tid"], e["ts"], e["dur"]))
        elif cat == "user_annotation" and _is_optimizer_range(name):
            self.cpu_ranges.append((e["tid"], e["ts"], e["dur"], name))
        elif cat in ("user_annotation", "cpu_op") and (m := _STEP_RE.match(name)):
            self.steps.append((int(m.group(1)), e["tid"], e["ts"], e["dur"]))
        elif cat == "cpu_op" and name.startswith("c10d::"):
            if (collective := canonical_collective(name[len("c10d::") :])) in COSTED_COLLECTIVES:
                self.issues.append((e["tid"], e["ts"], e["dur"], collective))
        elif cat == "cpu_op" and name == "record_param_comms":
            args = e.get("args", {})
            # Older torch versions record no collective metadata here: keep only what is there.
            self.comms.append(
                (e["tid"], e["ts"], e["dur"], {k: args[k] for k in _COMM_META if args.get(k) is not None})
            )
        elif cat == "gpu_user_annotation" and _is_optimizer_range(name):
            self.gpu_ranges.append((e.get("args", {}).get("stream", e["tid"]), e["ts"], e["dur"], name))
        elif cat == "kernel" and "Collective name" in (args := e.get("args", {})):
            self.nccl_meta[args.get("correlation", -1)] = {k: args.get(k) for k in _COMM_META}


# --------------------------------------------------------------------------- names


def _is_optimizer_range(name: str) -> bool:
    return name == "tpbench.optimizer" or name.startswith("tpbench.zero.")


def canonical_collective(name: str) -> str:
    """``all_reduce``, ``allreduce_coalesced``, ``_allgather_base``, ``AllReduce`` … → one spelling."""
    n = name.replace("_", "").lower()
    for key, canon in (
        ("allreduce", "allreduce"),
        ("allgather", "allgather"),
        ("reducescatter", "reduce_scatter"),
        ("alltoall", "alltoall"),
        ("broadcast", "broadcast"),
        ("reduce", "reduce"),
        ("gather", "gather"),
        ("scatter", "scatter"),
        ("sendrecv", "sendrecv"),
        ("send", "send"),
        ("recv", "recv"),
        ("barrier", "barrier"),
    ):
        if key in n:
            return canon
    return n
