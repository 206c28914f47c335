"""Repeats that ran on a busy machine, from the load each repeat recorded (``capture.machine_load``).

A repeat is flagged when, over its timed steps, the machine had more demand than cores (1-minute
load average above the core count; the world's own ranks count in it), a hypervisor took more
than ``STEAL_PCT_NOISY`` % of the CPUs (steal), or other tasks wanted a CPU while the world's ranks
waited, more of them than the cores the world leaves spare. Its step time is shown against its
case's median so a reader sees whether the load cost anything.
"""

from __future__ import annotations

import pandas as pd

from tpbench.analysis.stats import repeat_values

LOAD_COLUMNS = ("load1", "steal_pct", "runnable")
STEAL_PCT_NOISY = 5.0


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
    reasons = [
        _why(row, cpu_count, max(cpu_count - ranks_per_node.get(row["case_id"], 0), 0))
        for row in out.to_dict("records")
    ]
    return out.assign(why=reasons, noisy=[bool(r) for r in reasons])


def _why(row: dict, cpu_count: int, spare: int) -> str:
    """Why a repeat counts as noisy, in words; empty when it does not."""
    why = []
    if row.get("load1", 0) > cpu_count:
        why.append(f"load {row['load1']:.2f} > {cpu_count} cores")
    if row.get("steal_pct", 0) > STEAL_PCT_NOISY:
        why.append(f"steal {row['steal_pct']:.0f}%")
    if row.get("runnable", 0) >= spare + 1:
        why.append(f"other tasks runnable: {row['runnable']:g} (spare cores: {spare})")
    return "; ".join(why)
