"""The machine's load over a repeat's timed steps: what else wanted the CPUs while they ran.

Read from the kernel outside the timed steps, by each node's local rank 0, once as they start and
once as they end, each time while the world's other ranks wait asleep at a barrier: the 1-minute
load average at the end (the world's own ranks count in it), CPU steal over the window (time a
hypervisor gave this machine's CPUs to other guests; NaN where the kernel does not report it),
and the other tasks runnable (``procs_running`` less the reading rank), the mean of the two reads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
# Columns of the aggregate "cpu" line up to steal: user nice system idle iowait irq softirq steal
# (guest time is already counted in user, so it is left out of the total).
_STEAL_FIELD = 7

NAN = float("nan")
# How long the reading rank waits for its peers to fall asleep at the barrier before it reads.
SETTLE_S = 0.005


@dataclass(frozen=True)
class CpuSnapshot:
    """One read of /proc/stat: cumulative CPU ticks (all CPUs), steal among them (None: not
    reported), and the tasks runnable at that moment (None: not reported)."""

    total: int
    steal: int | None
    runnable: int | None


def parse_proc_stat(text: str) -> CpuSnapshot | None:
    """A snapshot from /proc/stat's text; None when it has no aggregate ``cpu`` line."""
    total, steal, runnable = None, None, None
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            ticks = [int(v) for v in fields[1 : _STEAL_FIELD + 2]]
            total = sum(ticks)
            steal = ticks[_STEAL_FIELD] if len(ticks) > _STEAL_FIELD else None
        elif len(fields) == 2 and fields[0] == "procs_running":
            runnable = int(fields[1])
    return None if total is None else CpuSnapshot(total, steal, runnable)


def snapshot(path: Path = PROC_STAT) -> CpuSnapshot | None:
    """This machine's snapshot now; None where there is no /proc/stat (not Linux)."""
    try:
        return parse_proc_stat(path.read_text())
    except (OSError, ValueError):
        return None


def over_window(start: CpuSnapshot | None, end: CpuSnapshot | None) -> dict[str, float]:
    """The per-repeat columns ``load1``, ``steal_pct`` and ``runnable`` (other tasks) for the window
    between two snapshots of this machine, read by the rank that reads them (NaN for what the
    machine does not report, and all NaN on ranks that read nothing)."""
    if start is None and end is None:
        return {"load1": NAN, "steal_pct": NAN, "runnable": NAN}
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        load1 = NAN
    steal_pct = NAN
    if start and end and start.steal is not None and end.steal is not None and end.total > start.total:
        steal_pct = 100 * (end.steal - start.steal) / (end.total - start.total)
    counts = [s.runnable - 1 for s in (start, end) if s is not None and s.runnable is not None]
    return {"load1": load1, "steal_pct": steal_pct, "runnable": sum(counts) / len(counts) if counts else NAN}
