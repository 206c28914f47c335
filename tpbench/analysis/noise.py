"""Repeats that ran on a busy machine, from the load each repeat recorded (``capture.machine_load``).

A repeat is flagged when, over its timed steps, the machine's *other* processes (everything but
the world's own ranks on that machine) used more CPU than the cores the world leaves spare there,
by more than ``OTHER_CORES_NOISY`` cores beyond what the window can resolve (``other_cores_res``,
a clock tick per CPU), or a hypervisor took more than ``STEAL_PCT_NOISY`` % of the CPUs (steal).
The 1-minute load average and the runnable tasks at the two reads are shown, never judged: the
load average counts the world's own ranks (a 2-rank world on 2 cores always looks busy by it) and
two instants say little about a window. Runs recorded before ``other_cores`` are judged by steal
alone. Each flagged repeat's step time is shown against its case's median so a reader sees
whether the load cost anything.
"""

from __future__ import annotations

import math

import pandas as pd

from tpbench.analysis.stats import repeat_values

LOAD_COLUMNS = ("load1", "steal_pct", "runnable", "busy_cores", "other_cores", "other_cores_res")
STEAL_PCT_NOISY = 5.0
# Other processes' CPU beyond the spare cores, in cores, that makes a repeat noisy: a third of a
# core taken from a rank is a third of its step time at stake. On an idle machine the daemons and
# the sweeping process itself use a few hundredths.
OTHER_CORES_NOISY = 0.3


def noisy_repeats(steps: pd.DataFrame, cpu_count: int, ranks_per_node: dict[str, int]) -> pd.DataFrame:
    """One row per (case_id, repeat) of ``steps`` (one run's) with the load it recorded (the
    highest any node reported), ``relative`` (its median step time over its case's median of
    repeat medians), ``noisy`` and ``why``. ``ranks_per_node``: case id → ranks each node ran.
    Empty when the steps recorded no load (runs from before it was recorded)."""
    cols = [c for c in LOAD_COLUMNS if c in steps]
    if steps.empty or not cols:
        return pd.DataFrame()
    timed = steps[steps["phase"] == "timed"]
    load = timed.groupby(["case_id", "repeat"], as_index=False)[cols].max()
    medians = repeat_values(steps)
    medians["relative"] = medians["step_ms"] / medians.groupby("case_id")["step_ms"].transform("median")
    out = load.merge(medians, on=["case_id", "repeat"])
    reasons = [_why(row, max(cpu_count - ranks_per_node.get(row["case_id"], 0), 0)) for row in out.to_dict("records")]
    return out.assign(why=reasons, noisy=[bool(r) for r in reasons])


def _why(row: dict, spare: int) -> str:
    """Why a repeat counts as noisy, in words; empty when it does not."""
    why = []
    other, res = row.get("other_cores", math.nan), row.get("other_cores_res", math.nan)
    if other - (res if res == res else 0.0) > spare + OTHER_CORES_NOISY:
        why.append(f"other processes used {other:.2f} cores (spare cores: {spare})")
    if row.get("steal_pct", 0) > STEAL_PCT_NOISY:
        why.append(f"steal {row['steal_pct']:.0f}%")
    return "; ".join(why)
