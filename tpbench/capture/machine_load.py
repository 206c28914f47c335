"""The machine's load over a repeat's timed steps: what else used the CPUs while they ran.

Read from the kernel outside the timed steps, by each node's local rank 0, once as they start and
once as they end, each time while the world's other ranks wait asleep at a barrier. The evidence is
``other_cores``: the CPU the machine's *other* processes used over the window, in cores, exactly the
machine's busy CPU time less the CPU time the node's own rank processes used in the same window
(every thread of each, and its waited children: ``own_cpu_s``, read by each rank at the same two
barriers). Busy time is the window's CPU capacity (its length times the CPUs) less the idle, iowait
and steal time ``/proc/stat`` reports, not the sum of its busy columns: a tickless kernel accounts
idle time exactly but busy time by sampling at the clock tick, which misses the short bursts of a
rank that computes and waits by turns (on the 2-core development VM the busy columns came to about
0.2 cores less than the ranks' own exact CPU time). The 1-minute load average is
no evidence (it counts the world's own ranks, so every 2-rank world on 2 cores looks busy); it is
recorded beside CPU steal over the window (time a hypervisor gave this machine's CPUs to other
guests; NaN where the kernel does not report it) and the other tasks runnable (``procs_running``
less the reading rank, the mean of the two reads).

``/proc/stat`` counts in clock ticks (``SC_CLK_TCK``, usually 100 a second) per CPU, so its busy
time is exact to about one tick per CPU: ``other_cores_res``, ``cpu_count / (ticks/s × window)``
(0.02 cores for a one-second window on 2 CPUs), is recorded with it so that a short window is not
taken for load.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
# Columns of the aggregate "cpu" line: user nice system idle iowait irq softirq steal (guest time is
# already counted in user, so it is left out of the total).
_IDLE_FIELDS = (3, 4)
_STEAL_FIELD = 7

NAN = float("nan")
# How long the reading rank waits for its peers to fall asleep at the barrier before it reads.
SETTLE_S = 0.005
LOAD_KEYS = ("load1", "steal_pct", "runnable", "busy_cores", "other_cores", "other_cores_res")


@dataclass(frozen=True)
class CpuSnapshot:
    """One read of /proc/stat: cumulative CPU ticks (all CPUs), the idle and iowait ones among
    them, steal (None: not reported), the tasks runnable at that moment (None: not reported); with
    the monotonic time of the read, the CPUs counted and the 1-minute load average (NaN: none)."""

    total: int
    idle: int
    steal: int | None
    runnable: int | None
    cpus: int = 1
    at: float = NAN
    load1: float = NAN


def parse_proc_stat(text: str) -> CpuSnapshot | None:
    """A snapshot from /proc/stat's text (``at`` and ``load1`` left unset); None when it has no
    aggregate ``cpu`` line."""
    total, idle, steal, runnable, cpus = None, 0, None, None, 0
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            ticks = [int(v) for v in fields[1 : _STEAL_FIELD + 2]]
            total = sum(ticks)
            steal = ticks[_STEAL_FIELD] if len(ticks) > _STEAL_FIELD else None
            idle = sum(ticks[i] for i in _IDLE_FIELDS)
        elif fields and fields[0].startswith("cpu") and fields[0][3:].isdigit():
            cpus += 1
        elif len(fields) == 2 and fields[0] == "procs_running":
            runnable = int(fields[1])
    return None if total is None else CpuSnapshot(total, idle, steal, runnable, max(cpus, 1))


def snapshot(path: Path = PROC_STAT) -> CpuSnapshot | None:
    """This machine's snapshot now; None where there is no /proc/stat (not Linux)."""
    try:
        snap = parse_proc_stat(path.read_text())
    except (OSError, ValueError):
        return None
    if snap is None:
        return None
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        load1 = NAN
    return CpuSnapshot(snap.total, snap.idle, snap.steal, snap.runnable, snap.cpus, time.monotonic(), load1)


def own_cpu_s() -> float:
    """This process's CPU time so far, in seconds: every thread's (``process_time``), plus the
    children it has waited for (``os.times``)."""
    t = os.times()
    return time.process_time() + t.children_user + t.children_system


def over_window(
    start: CpuSnapshot | None, end: CpuSnapshot | None, world_cpu_s: float, ticks_per_s: float | None = None
) -> dict[str, float]:
    """The per-repeat columns (``LOAD_KEYS``) for the window between two snapshots of one machine,
    given the CPU seconds its rank processes used in that window (``world_cpu_s``): ``busy_cores``
    (the whole machine's busy CPU over the window, in cores), ``other_cores`` (that less the
    world's own), ``other_cores_res`` (what one tick per CPU is worth, see the module docstring),
    NaN for what the machine does not report, and all NaN on ranks that read nothing. Within a
    tick per CPU, ``other_cores`` may be a little below zero (the ranks' CPU time is exact)."""
    out = dict.fromkeys(LOAD_KEYS, NAN)
    if start is None or end is None:
        return out
    out["load1"] = end.load1
    if start.steal is not None and end.steal is not None and end.total > start.total:
        out["steal_pct"] = 100 * (end.steal - start.steal) / (end.total - start.total)
    counts = [s.runnable - 1 for s in (start, end) if s.runnable is not None]
    out["runnable"] = sum(counts) / len(counts) if counts else NAN
    window = end.at - start.at
    if window > 0:
        hz = ticks_per_s or os.sysconf("SC_CLK_TCK")
        away = (end.idle - start.idle) + ((end.steal or 0) - (start.steal or 0))
        busy = end.cpus - away / hz / window
        out |= {
            "busy_cores": busy,
            "other_cores": busy - world_cpu_s / window,
            "other_cores_res": end.cpus / (hz * window),
        }
    return out
