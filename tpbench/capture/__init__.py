"""Capture: what a rank observes beside its step times — NVML telemetry, clocks, the transport.

Each rank hands the worker one ``RankCapture`` per repeat; the worker gathers them on rank 0 with
the step times, and rank 0 persists them here: a repeat's samples as a part file as soon as the
repeat ends (repeats of different cases are interleaved, so a world that dies late must not take
earlier repeats with it), and at the case's last repeat the case's entry for run.json (``nvml``,
``clock_sync`` and the raw transport observations, which the launcher compares with the asked
profile because only it knows the resolved profile). The launcher's recorder merges the parts
into ``nvml.parquet`` on the trace clock when it finishes the case (``store.finish_case``).

nvml.parquet columns (one row per sample): rank, repeat, step (-1 outside steps), phase
(warmup | timed | profile | idle), t_ns (sampler clock: CLOCK_MONOTONIC ns), ts_us (the rank's
trace clock, comparable with its trace's ``ts``; NaN without a profiled window), query_ms (what
the NVML calls of that sample took), then ``nvml.METRICS``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tpbench import store
from tpbench.capture import nvml, transport
from tpbench.record import TraceWindow

NVML_FILE = store.NVML_FILE


@dataclass
class RankCapture:
    """One rank's capture for one repeat (pickled to rank 0 with the step times)."""

    rank: int
    nvml: dict[str, Any]  # the GPU and metric sources, or {"unavailable": reason}
    samples: pd.DataFrame | None = None
    sampler_error: str | None = None
    clock: nvml.ClockSync | None = None  # profiled repeats only
    transport: transport.NcclRank | transport.GlooRank | None = None  # a case's last repeat only
    trace: TraceWindow | None = None  # profiled repeats only


# A trace window is traced again, up to the case's ``trace_windows`` windows in all, when on some
# rank its forward passes, its steps or its training thread's CPU time ran at under ``SPEED_FLOOR``
# of their timed speed; the window furthest above the floor is kept. The floor is the what-if's bound
# on a traced host (its ``COMPUTE_FACTOR``: tracing may double host work, and a window that ran slower
# is refused as unrepresentative), so a window is traced again exactly where the what-if could not use
# it; it is written out here so that rank processes need not load the what-if, and a test keeps the
# two equal. The thread's CPU time is there for steps that are mostly waiting on a shaped link: a
# window whose backward ran at half speed moves such a step by a few per cent and its forward passes
# not at all, yet its compute, which a faster link's projection keeps whole, is doubled (a ddp
# window at 500 Mbit/s, thread at ×0.43 where the same case's windows on other links ran at
# ×0.75–0.91, projected loopback 72 % slow). On the 2-core machine an undisturbed window's forward
# passes run at 0.6–1.2 of their timed speed (a few ops, each a few µs of the profiler's; a ZeRO
# hook's rank 0 runs its forward beside the previous step's broadcasts), its steps at 0.6–0.95 and
# its thread at 0.6–0.95, a ZeRO hook's at 0.37–0.66 (the tracer's cost on its many small ops: such
# a case may trace all its windows); windows a neighbour or the hypervisor took half the machine
# from ran them at 0.3 (docs/interconnects.md).
SPEED_FLOOR = 0.5


def speed(timed_ms: float, traced_ms: float) -> float:
    """A timed median over its traced one (NaN where either is not a time)."""
    return timed_ms / traced_ms if timed_ms > 0 and traced_ms > 0 else math.nan


def window_score(forward_speed: float, step_speed: float, thread_speed: float) -> float:
    """How far a window lies above the floor, by the slowest of its three speeds: under 1, traced
    again (NaN: not measured, as on GPU ranks, whose host clock times kernel launches; such a window
    is never traced again)."""
    speeds = (forward_speed, step_speed, thread_speed)
    if any(math.isnan(x) for x in speeds):
        return math.nan
    return min(speeds) / SPEED_FLOOR


def retrace(scores: list[float], windows: int) -> bool:
    """Whether to trace another window after windows of these ``window_score``s, of ``windows`` at most."""
    return len(scores) < windows and scores[-1] < 1


def kept_window(scores: list[float]) -> int:
    """The window to keep: the one furthest above the floor (the last where none was measured)."""
    measured = [k for k, x in enumerate(scores) if x == x]
    return max(measured, key=lambda k: scores[k]) if measured else len(scores) - 1


def kept_text(window: TraceWindow) -> str | None:
    """What a case's trace windows came to, as the sweep says it once per case traced again: the
    window kept and its speeds, and whether it too ran below the floor, where the what-if may
    refuse the case (its bound on a traced host). None where one window was traced: nothing to say."""
    if window.windows < 2:
        return None
    k = window.kept
    speeds = [_at(x, k) for x in (window.forward_speed, window.step_speed, window.thread_speed)]
    f, st, th = (f"×{x:.2f}" for x in speeds)
    parts = f"its forward passes at {f} of their timed speed, its steps at {st}, its training thread's CPU time at {th}"
    if window_score(*speeds) >= 1:
        before = window.windows - 1
        ran = f"{before} window before it ran" if before == 1 else f"the {before} windows before it ran"
        return f"window {k + 1} of {window.windows} kept: {parts} ({ran} below half speed)"
    return (
        f"all {window.windows} windows below half speed; the fastest kept, window {k + 1}: {parts} "
        "(the what-if may refuse the case)"
    )


def _at(values: tuple[float | None, ...], k: int) -> float:
    """The ``k``-th window's speed, NaN where not measured."""
    return values[k] if k < len(values) and values[k] is not None else math.nan


def nvml_status(gpu: nvml.Gpu | nvml.Unavailable) -> dict[str, Any]:
    if isinstance(gpu, nvml.Unavailable):
        return {"unavailable": gpu.reason}
    return {"gpu": gpu.name, "nvml_index": gpu.index, "sources": gpu.sources}


def write_repeat(run_dir: Path, case_id: str, repeat: int, captures: list[RankCapture]) -> None:
    frames = [c.samples for c in captures if c.samples is not None and not c.samples.empty]
    if frames:
        store.atomic_write_parquet(
            store.case_dir(run_dir, case_id) / store.NVML_PARTS / f"r{repeat:04d}.parquet",
            pd.concat(frames, ignore_index=True),
        )


def case_info(
    run_dir: Path, case_id: str, interval_ms: int, backend: str, captures: list[RankCapture]
) -> dict[str, Any]:
    """The case's entry for run.json, from its telemetry parts so far (read, not merged: the
    recorder finishes the case directory, ``store.finish_case``, with the clock offsets given here).

    ``captures`` are the ranks' captures of the case's last repeat, the one that was profiled.
    """
    parts = sorted((store.case_dir(run_dir, case_id) / store.NVML_PARTS).glob("r*.parquet"))
    samples = (
        pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
        if parts
        else pd.DataFrame(columns=nvml.COLUMNS)
    )
    return {
        "nvml": _nvml_entry(samples, interval_ms, captures),
        "clock_sync": {str(c.rank): dataclasses.asdict(c.clock) if c.clock else None for c in captures},
        "transport": {"backend": backend, "ranks": [dataclasses.asdict(c.transport) for c in captures if c.transport]},
        "trace": next((c.trace.to_json() for c in captures if c.trace), None),
    }


def _nvml_entry(samples: pd.DataFrame, interval_ms: int, captures: list[RankCapture]) -> dict[str, Any]:
    ranks: dict[str, Any] = {}
    for c in captures:
        mine = samples[samples["rank"] == c.rank]
        entry = dict(c.nvml)
        if "unavailable" not in entry:
            gaps = mine.sort_values(["repeat", "t_ns"]).groupby("repeat")["t_ns"].diff().dropna() / 1e6
            entry |= {
                "samples": len(mine),
                "median_interval_ms": float(gaps.median()) if len(gaps) else None,
                "median_query_ms": float(mine["query_ms"].median()) if len(mine) else None,
                "error": c.sampler_error,
            }
        ranks[str(c.rank)] = entry
    available = any("unavailable" not in e for e in ranks.values())
    reasons = sorted({e["unavailable"] for e in ranks.values() if "unavailable" in e})
    return {
        "available": available,
        "reason": "; ".join(reasons) or None,
        "interval_ms": interval_ms,
        "file": NVML_FILE if available else None,
        "ranks": ranks,
    }
