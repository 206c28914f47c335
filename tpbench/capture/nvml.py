"""NVML telemetry: a sampler thread per rank, for that rank's own GPU, placed on the trace's clock.

Why a thread and so few metrics: an NVML query costs milliseconds on a real GPU machine, and the
sampler must not slow the timed steps it runs beside. Each sample makes four NVML calls —
utilisation, memory, SM clock, and one batched ``nvmlDeviceGetFieldValues`` for power, PCIe and
NVLink byte counters — and the thread sleeps on an ``Event`` in between. ctypes releases the GIL
during each call, so the training thread only loses the few microseconds of Python around them.
Counters are turned into rates (MB/s, 1 MB = 1e6 bytes) after sampling, not in the thread.
Where a driver lacks a field, the slower equivalent call is used once chosen at open time
(``nvmlDeviceGetPowerUsage``; ``nvmlDeviceGetPcieThroughput``, which itself samples for ~20 ms);
what was chosen is reported in ``Gpu.sources``.

Clocks. The sampler stamps each sample with ``time.perf_counter_ns()`` (CLOCK_MONOTONIC on Linux),
the clock the worker already uses for step boundaries, so tagging samples with their step costs
the timed loop nothing. torch.profiler (Kineto) stamps CPU and GPU events in Unix time (it
converts its TSC-based approximate clock to CLOCK_REALTIME) and writes each trace event's ``ts`` in
µs relative to the trace's ``baseTimeNanoseconds``: Unix µs = ts + baseTimeNanoseconds / 1000.
Rather than trust that, the worker measures the offset in every profiled window: it opens an
empty ``record_function(CLOCK_PROBE)`` between two sampler-clock reads (a few times, keeping the
tightest) and reads the probe's start back from the profiler's results (``ClockSync``). Then
``ts_us = t_ns / 1000 + offset_us`` puts a sample on the same axis as that rank's trace events,
within ``uncertainty_us`` at the probe. Far from the probe, NTP slewing of CLOCK_REALTIME against
CLOCK_MONOTONIC (typically tens of ppm) adds its drift; samples inside the traced window, the ones
drawn over a trace, are exact to µs.
"""

from __future__ import annotations

import contextlib
import gzip
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pynvml

CLOCK_PROBE = "tpbench.clock_sync"

# Sample columns, in the order Gpu.read returns them (before counters become rates).
METRICS = (
    "gpu_util_pct",
    "mem_util_pct",
    "mem_used_mb",
    "power_w",
    "sm_clock_mhz",
    "pcie_tx_mb_s",
    "pcie_rx_mb_s",
    "nvlink_tx_mb_s",
    "nvlink_rx_mb_s",
)
COLUMNS = ("rank", "repeat", "step", "phase", "t_ns", "ts_us", "query_ms", *METRICS)

# nvmlFieldValue_t.valueType → the union member holding the value.
_VALUE_MEMBER = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}
# NVLink byte counters, newest first: (tx field, rx field, bytes per unit).
_NVLINK_COUNTERS = (
    (pynvml.NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES, pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_BYTES, 1),
    (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 1024),
)


@dataclass(frozen=True)
class Unavailable:
    """Why this rank has no NVML telemetry (a CPU case, no driver, no library...)."""

    reason: str


@dataclass
class Gpu:
    """An opened NVML device and the metric sources chosen for it, once, at open time."""

    lib: Any
    handle: Any
    index: int
    name: str
    power_field: bool
    pcie_counters: bool
    nvlink_links: tuple[int, ...]
    nvlink_unit_bytes: int
    fields: list[Any] = field(default_factory=list)

    @property
    def sources(self) -> dict[str, str]:
        """Where each metric comes from on this GPU: the report and run.json say so."""
        return {
            "power_w": "field POWER_INSTANT" if self.power_field else "nvmlDeviceGetPowerUsage",
            "pcie": "field PCIE_COUNT_{TX,RX}_BYTES" if self.pcie_counters else "nvmlDeviceGetPcieThroughput",
            "nvlink": f"byte counters of {len(self.nvlink_links)} active link(s)"
            if self.nvlink_links
            else "none (no active NVLink, or no byte counters)",
        }

    def read(self) -> tuple[float, ...]:
        """One raw sample in METRICS order; PCIe/NVLink are cumulative byte counters where the
        driver has them (``rates`` turns them into MB/s), else MB/s already."""
        lib, h = self.lib, self.handle
        util = lib.nvmlDeviceGetUtilizationRates(h)
        mem = lib.nvmlDeviceGetMemoryInfo(h)
        sm = lib.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
        values = [_value(v) for v in lib.nvmlDeviceGetFieldValues(h, self.fields)] if self.fields else []
        it = iter(values)
        power_mw = next(it) if self.power_field else lib.nvmlDeviceGetPowerUsage(h)
        if self.pcie_counters:
            pcie_tx, pcie_rx = next(it), next(it)
        else:  # KB/s (1024 bytes) averaged over the call's own ~20 ms window
            pcie_tx = lib.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_TX_BYTES) * 1024 / 1e6
            pcie_rx = lib.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_RX_BYTES) * 1024 / 1e6
        nv_tx = nv_rx = float("nan")
        if self.nvlink_links:
            link_values = list(it)
            nv_tx = sum(link_values[0::2]) * self.nvlink_unit_bytes
            nv_rx = sum(link_values[1::2]) * self.nvlink_unit_bytes
        return (
            float(util.gpu),
            float(util.memory),
            mem.used / 2**20,
            power_mw / 1e3,
            float(sm),
            pcie_tx,
            pcie_rx,
            nv_tx,
            nv_rx,
        )


def _value(v: Any) -> float:
    if v.nvmlReturn != pynvml.NVML_SUCCESS:
        return float("nan")
    return float(getattr(v.value, _VALUE_MEMBER[v.valueType]))


def _field_ok(lib: Any, handle: Any, fields: list[Any]) -> list[bool]:
    try:
        return [v.nvmlReturn == pynvml.NVML_SUCCESS for v in lib.nvmlDeviceGetFieldValues(handle, fields)]
    except lib.NVMLError:
        return [False] * len(fields)


def _active_links(lib: Any, handle: Any) -> tuple[int, ...]:
    links = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if lib.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED:
                links.append(link)
        except lib.NVMLError:
            break  # NotSupported (no NVLink) or InvalidArgument (past the last link)
    return tuple(links)


def open_device(lib: Any, *, uuid: str | None = None, index: int = 0) -> Gpu:
    """Initialise NVML through ``lib`` (``pynvml`` or a stand-in) and choose the metric sources.

    Raises ``lib.NVMLError`` when NVML itself is unusable; ``open_gpu`` turns that into
    ``Unavailable``.
    """
    lib.nvmlInit()
    handle = None
    if uuid is not None:
        with contextlib.suppress(lib.NVMLError):
            handle = lib.nvmlDeviceGetHandleByUUID(uuid)
    if handle is None:
        handle = lib.nvmlDeviceGetHandleByIndex(index)
    with contextlib.suppress(lib.NVMLError):
        index = lib.nvmlDeviceGetIndex(handle)
    name = lib.nvmlDeviceGetName(handle)
    name = name.decode() if isinstance(name, bytes) else str(name)
    power, tx, rx = _field_ok(
        lib,
        handle,
        [
            pynvml.NVML_FI_DEV_POWER_INSTANT,
            pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
            pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
        ],
    )
    links = _active_links(lib, handle)
    unit, nvlink_fields = 1, []
    for tx_field, rx_field, unit_bytes in _NVLINK_COUNTERS if links else ():
        candidate = [(f, link) for link in links for f in (tx_field, rx_field)]
        if all(_field_ok(lib, handle, candidate[:2])):
            unit, nvlink_fields = unit_bytes, candidate
            break
    if not nvlink_fields:
        links = ()  # no NVLink, or links without byte counters: nothing to sample
    fields = (
        ([pynvml.NVML_FI_DEV_POWER_INSTANT] if power else [])
        + ([pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES] if tx and rx else [])
        + nvlink_fields
    )
    return Gpu(lib, handle, index, name, power, tx and rx, links, unit, fields)


def open_gpu(device: Any, lib: Any = pynvml) -> Gpu | Unavailable:
    """The NVML device behind a ``torch.device``, or why there is none. Never raises: a machine
    without NVML or GPUs runs every case, with telemetry recorded as unavailable."""
    if getattr(device, "type", None) != "cuda":
        return Unavailable("the case runs on CPU: no GPU to sample")
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    # CUDA and NVML number GPUs differently under CUDA_VISIBLE_DEVICES; the UUID is common ground.
    uuid = None
    with contextlib.suppress(Exception):
        uuid = "GPU-" + str(torch.cuda.get_device_properties(index).uuid)
    try:
        return open_device(lib, uuid=uuid, index=index)
    except (lib.NVMLError, OSError) as e:
        return Unavailable(f"NVML unavailable: {e}")


@dataclass(frozen=True)
class Span:
    """One step of a repeat on the sampler clock: samples in (start_ns, end_ns] belong to it."""

    start_ns: int
    end_ns: int
    step: int
    phase: str  # "warmup" | "timed" | "profile"


def step_spans(
    starts_s: Sequence[float], ends_s: Sequence[float], warmup_steps: int, first_step: int = 0, phase: str | None = None
) -> list[Span]:
    """Spans of steps that started at ``starts_s[i]`` and ended at ``ends_s[i]`` (perf_counter
    seconds). Each step's own start, not the previous step's end: in a round whose steps are
    interleaved, another arm's step runs between two of this arm's."""
    steps = range(first_step, first_step + len(ends_s))
    return [
        Span(int(s * 1e9), int(e * 1e9), step, phase or ("warmup" if step < warmup_steps else "timed"))
        for step, s, e in zip(steps, starts_s, ends_s)
    ]


class Sampler:
    """Samples one GPU every ``interval_ms`` on a daemon thread until ``stop``."""

    def __init__(self, gpu: Gpu, interval_ms: int, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.gpu = gpu
        self.interval_ns = int(interval_ms * 1e6)
        self.clock = clock
        self.error: str | None = None
        # The thread's own CPU time and lifetime, so its cost can be stated without timing noise.
        self.cpu_ns = 0
        self.wall_ns = 0
        self._rows: list[tuple[float, ...]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tpbench-nvml", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        cpu0, wall0 = time.thread_time_ns(), time.perf_counter_ns()
        try:
            self._loop()
        finally:
            self.cpu_ns = time.thread_time_ns() - cpu0
            self.wall_ns = time.perf_counter_ns() - wall0

    def _loop(self) -> None:
        due = self.clock()
        while not self._stop.is_set():
            t0 = self.clock()
            try:
                values = self.gpu.read()
            except self.gpu.lib.NVMLError as e:  # e.g. GPU lost: keep what we have, say why
                self.error = f"NVML query failed after {len(self._rows)} samples: {e}"
                return
            t1 = self.clock()
            self._rows.append(((t0 + t1) // 2, (t1 - t0) / 1e6, *values))
            # Fixed-rate schedule; ticks missed while a query ran long are skipped, not bunched.
            due += self.interval_ns
            now = self.clock()
            if due < now:
                due = now
            self._stop.wait((due - now) / 1e9)

    def stop(self) -> list[tuple[float, ...]]:
        """Stop and return the raw samples: (t_ns, query_ms, *METRICS as read)."""
        self._stop.set()
        self._thread.join()
        return self._rows


def start_sampler(gpu: Gpu | Unavailable, interval_ms: int) -> Sampler | None:
    return Sampler(gpu, interval_ms).start() if isinstance(gpu, Gpu) else None


def samples_frame(
    gpu: Gpu, rows: list[tuple[float, ...]], spans: Sequence[Span], rank: int, repeat: int
) -> pd.DataFrame:
    """Raw samples → rows of nvml.parquet (without ``ts_us``, which needs the case's clock sync).

    Counters become rates over the interval since the previous sample (the first sample of a
    repeat has none: NaN), and each sample is tagged with the step whose span holds it (-1 and
    phase "idle" outside any step: model building, barriers, result gathering).
    """
    df = pd.DataFrame(rows, columns=["t_ns", "query_ms", *METRICS])
    df["t_ns"] = df["t_ns"].astype("int64")
    dt_s = df["t_ns"].diff() / 1e9
    counters = (["pcie_tx_mb_s", "pcie_rx_mb_s"] if gpu.pcie_counters else []) + (
        ["nvlink_tx_mb_s", "nvlink_rx_mb_s"] if gpu.nvlink_links else []
    )
    for col in counters:
        delta = df[col].diff()
        df[col] = (delta / 1e6 / dt_s).where(delta >= 0)  # a counter reset is a gap, not a negative rate
    df["step"], df["phase"] = _tag(df["t_ns"].to_numpy(), spans)
    df["rank"], df["repeat"] = rank, repeat
    df["ts_us"] = np.nan
    return df[list(COLUMNS)]


def _tag(t_ns: np.ndarray, spans: Sequence[Span]) -> tuple[np.ndarray, np.ndarray]:
    step = np.full(len(t_ns), -1, dtype="int64")
    phase = np.full(len(t_ns), "idle", dtype=object)
    for s in spans:
        inside = (t_ns > s.start_ns) & (t_ns <= s.end_ns)
        step[inside] = s.step
        phase[inside] = s.phase
    return step, phase


@dataclass(frozen=True)
class ClockSync:
    """``trace ts (µs) = sampler t_ns / 1000 + offset_us`` for one rank's trace.

    ``probe_ns`` is the sampler-clock midpoint of the probe, ``uncertainty_us`` half the window
    it was bracketed in; ``trace_base_ns`` is the trace's ``baseTimeNanoseconds`` (ts + base/1000
    is Unix time in µs).
    """

    offset_us: float
    uncertainty_us: float
    probe_ns: int
    trace_base_ns: int


def clock_probe(n: int = 5, clock: Callable[[], int] = time.perf_counter_ns) -> list[tuple[int, int]]:
    """Inside a profiled step: ``n`` empty ``record_function(CLOCK_PROBE)`` ranges, each opened
    between two sampler-clock reads; the profiler stamps each start inside its bracket. Several,
    because a preempted thread or a first-call initialisation can widen one bracket to
    milliseconds; ``clock_sync`` keeps the tightest."""
    from torch.autograd.profiler import record_function

    brackets = []
    for _ in range(n):
        rf = record_function(CLOCK_PROBE)
        t0 = clock()
        rf.__enter__()
        t1 = clock()
        rf.__exit__(None, None, None)
        brackets.append((t0, t1))
    return brackets


_BASE_RE = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d+)')


def trace_base_ns(trace_path: Path) -> int:
    """A trace's ``baseTimeNanoseconds``. Kineto writes it in the header, before ``traceEvents``,
    so only the first few KB are read, never the (possibly huge) event list."""
    opener = gzip.open if str(trace_path).endswith(".gz") else open
    with opener(trace_path, "rb") as f:
        head = f.read(1 << 16)
    m = _BASE_RE.search(head)
    if m is None:
        raise ValueError(f"{trace_path}: no baseTimeNanoseconds in the trace header")
    return int(m.group(1))


def clock_sync(profiler: Any, brackets: Sequence[tuple[int, int]], trace_path: Path) -> ClockSync | None:
    """Offset between the sampler clock and the trace clock, from the tightest probe's start.

    ``profiler`` is the finished ``torch.profiler.profile``; its Kineto results hold the very
    events the trace was exported from (start times in Unix ns). None when the probes are
    missing (a profiler built without CPU activity).
    """
    results = getattr(getattr(profiler, "profiler", None), "kineto_results", None)
    if results is None:
        return None
    starts = sorted(e.start_ns() for e in results.events() if e.name() == CLOCK_PROBE)
    if len(starts) != len(brackets):
        return None
    start_ns, (t0, t1) = min(zip(starts, brackets), key=lambda sb: sb[1][1] - sb[1][0])
    base = trace_base_ns(trace_path)
    mid = (t0 + t1) // 2
    return ClockSync(
        offset_us=(start_ns - base) / 1e3 - mid / 1e3,
        uncertainty_us=(t1 - t0) / 2e3,
        probe_ns=mid,
        trace_base_ns=base,
    )
