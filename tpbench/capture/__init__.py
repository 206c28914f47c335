"""Capture: what a rank observes beside its step times — NVML telemetry, clocks, the transport.

Each rank hands the worker one ``RankCapture`` per repeat; the worker gathers them on rank 0 with
the step times, and rank 0 persists them here: a repeat's samples as a part file as soon as the
repeat ends (repeats of different cases are interleaved, so a world that dies late must not take
earlier repeats with it), and at the case's last repeat ``nvml.parquet`` plus the case's entry
for run.json (``nvml``, ``clock_sync`` and the raw transport observations, which the launcher
compares with the asked profile because only it knows the resolved profile).

nvml.parquet columns (one row per sample): rank, repeat, step (-1 outside steps), phase
(warmup | timed | profile | idle), t_ns (sampler clock: CLOCK_MONOTONIC ns), ts_us (the rank's
trace clock, comparable with its trace's ``ts``; NaN without a profiled window), query_ms (what
the NVML calls of that sample took), then ``nvml.METRICS``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tpbench import store
from tpbench.capture import nvml, transport

NVML_FILE = "nvml.parquet"
_NVML_PARTS = "nvml-parts"


@dataclass
class RankCapture:
    """One rank's capture for one repeat (pickled to rank 0 with the step times)."""

    rank: int
    nvml: dict[str, Any]  # the GPU and metric sources, or {"unavailable": reason}
    samples: pd.DataFrame | None = None
    sampler_error: str | None = None
    clock: nvml.ClockSync | None = None  # profiled repeats only
    transport: transport.NcclRank | transport.GlooRank | None = None  # a case's last repeat only


def nvml_status(gpu: nvml.Gpu | nvml.Unavailable) -> dict[str, Any]:
    if isinstance(gpu, nvml.Unavailable):
        return {"unavailable": gpu.reason}
    return {"gpu": gpu.name, "nvml_index": gpu.index, "sources": gpu.sources}


def write_repeat(run_dir: Path, case_id: str, repeat: int, captures: list[RankCapture]) -> None:
    frames = [c.samples for c in captures if c.samples is not None and not c.samples.empty]
    if frames:
        store.atomic_write_parquet(store.case_dir(run_dir, case_id) / _NVML_PARTS / f"r{repeat:04d}.parquet",
                                   pd.concat(frames, ignore_index=True))


def finish_case(run_dir: Path, case_id: str, interval_ms: int, backend: str, captures: list[RankCapture]) -> dict[str, Any]:
    """Merge the case's samples into nvml.parquet (on the trace clock) and return its run.json info.

    ``captures`` are the ranks' captures of the case's last repeat, the one that was profiled.
    """
    clocks = {c.rank: c.clock for c in captures}
    parts_dir = store.case_dir(run_dir, case_id) / _NVML_PARTS
    parts = sorted(parts_dir.glob("r*.parquet"))
    samples = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True) if parts else pd.DataFrame(columns=nvml.COLUMNS)
    for rank, clock in clocks.items():
        if clock is not None:
            mine = samples["rank"] == rank
            samples.loc[mine, "ts_us"] = samples.loc[mine, "t_ns"] / 1e3 + clock.offset_us
    if parts:
        store.atomic_write_parquet(store.case_dir(run_dir, case_id) / NVML_FILE, samples)
        for p in parts:
            p.unlink()
        parts_dir.rmdir()
    return {
        "nvml": _nvml_entry(samples, interval_ms, captures),
        "clock_sync": {str(r): dataclasses.asdict(c) if c else None for r, c in clocks.items()},
        "transport": {"backend": backend, "ranks": [dataclasses.asdict(c.transport) for c in captures if c.transport]},
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
    return {"available": available, "reason": "; ".join(reasons) or None, "interval_ms": interval_ms,
            "file": NVML_FILE if available else None, "ranks": ranks}
