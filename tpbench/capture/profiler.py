"""The profiler window: a few traced steps per case, after its timed steps, one trace per rank
(a window the machine disturbed is traced again by the worker, ``capture.retrace``).

Tracing happens only here, after timing, so it never perturbs a timed step. The trace is the
plain torch.profiler Chrome export (``distributedInfo`` included), gzipped, one file per rank in
one folder: the layout Perfetto and Holistic Trace Analysis read unchanged.
"""

from __future__ import annotations

import contextlib
import ctypes
import gzip
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from tpbench.capture import nvml

# glibc's mallopt parameters, and the sizes set: the least mmap threshold (its default before it
# adapts) while tracing; afterwards the most it adapts to (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit) and
# the trim threshold its adaptation sets beside it (twice that).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_TRACING_MMAP_BYTES = 128 << 10
_UNTRACED_MMAP_BYTES = 32 << 20


@contextlib.contextmanager
def heap_apart_from_tracer(device: torch.device) -> Iterator[None]:
    """On CPU ranks (glibc), serve large host allocations by mmap while the tracer runs.

    ``record_shapes`` keeps small allocations per op for the whole window; glibc carves them out of
    the chunks just freed by the step's tensors, so a freed 1 MiB tensor no longer fits its own
    hole and the next one extends the heap: 18 MiB of fresh pages per optimizer step of a 512-wide
    MLP under Adam, 4,096 page faults. On the 2-core VM they cost little for 13-20 traced steps,
    then about 27 µs each (why, on the VM's side, is not pinned down): the same traced ops then
    ran 20× slower for the rest of the world (``aten::sqrt`` of 512 × 512 at 8 ms instead of 0.4),
    a window no retrace mends (docs/whatif-runs.md). Mapped and unmapped, a tensor's pages are the
    ones just freed, so faults stay cheap and the heap does not grow.

    Setting a threshold ends glibc's adaptation of both; afterwards they are where that adaptation
    ends at most (a tensor under 32 MiB from the heap, which keeps up to 64 MiB free), so the timed
    steps that follow, of this case or the world's next ones, are not trimmed under (with the trim
    threshold left as it stood, a 16 MiB tensor larger than any before was trimmed away and faulted
    back in, 4,064 pages, at every allocation: tests/test_capture_sweep.py). They are not quite
    the steps before the world's first trace: a later case whose tensors are larger than any before
    took 3-51 faults a step where glibc's own adaptation, untraced, left 3,200-7,200 (and the
    trace without this guard 9,100-12,400; docs/whatif-runs.md). Nothing changes on GPU ranks
    (tensors in device memory) or without glibc."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None) if device.type == "cpu" else None
    if mallopt is None:
        yield
        return
    mallopt(_M_MMAP_THRESHOLD, _TRACING_MMAP_BYTES)
    try:
        yield
    finally:
        mallopt(_M_MMAP_THRESHOLD, _UNTRACED_MMAP_BYTES)
        mallopt(_M_TRIM_THRESHOLD, 2 * _UNTRACED_MMAP_BYTES)


def trace_steps(
    run_step: Callable[[int], None], steps: int, first_step: int, device: torch.device, out: Path
) -> tuple[nvml.ClockSync | None, list[nvml.Span]]:
    """Run ``run_step(step)`` for one untraced warm-up step and ``steps`` traced ones; write ``out``.

    Returns the offset between the NVML sampler's clock and this trace's clock (measured by probe
    ranges in the first traced step) and the traced steps' spans, for tagging samples.
    ``repeat=1``: without it the schedule starts a new cycle after the active steps, and the export
    (which covers only the last cycle) would hold no step at all. ``record_shapes`` gives the
    collectives' sizes (bytes) on Gloo ranges and c10d ops.
    """
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    out.parent.mkdir(parents=True, exist_ok=True)
    starts: list[float] = []
    ends: list[float] = []
    tmp = out.with_suffix(".tmp.json")
    part = out.with_name(out.name + ".part")
    leftovers = (tmp, tmp.with_name(tmp.name + ".tmp"), part)
    for leftover in leftovers:  # of a rank killed while it exported (the launcher retries the trace)
        leftover.unlink(missing_ok=True)
    window = schedule(wait=0, warmup=1, active=steps, repeat=1)
    with heap_apart_from_tracer(device), profile(activities=activities, schedule=window, record_shapes=True) as prof:
        for i in range(steps + 1):
            if i == 1:
                brackets = nvml.clock_probe()
            starts.append(time.perf_counter())
            run_step(first_step + i)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            ends.append(time.perf_counter())
            prof.step()
    try:
        prof.export_chrome_trace(str(tmp))
        with open(tmp, "rb") as src, gzip.open(part, "wb", compresslevel=3) as dst:
            shutil.copyfileobj(src, dst)
        os.replace(part, out)
    finally:
        # A full disk can stop the export or the gzip half-way: none of their files may stay
        # (the exporter writes its own ``<tmp>.tmp`` before renaming it onto ``tmp``).
        for leftover in leftovers:
            leftover.unlink(missing_ok=True)
    spans = nvml.step_spans(starts, ends, 0, first_step=first_step, phase="profile")
    return nvml.clock_sync(prof, brackets, out), spans
