"""What ZeRO saves, from the exact per-rank figures of ``tpbench.accounting`` (tables ``memory``
and ``partition``): pure functions over those frames."""

from __future__ import annotations

import pandas as pd

KEYS = ["run_id", "case_id"]


def per_case(memory: pd.DataFrame, partition: pd.DataFrame) -> pd.DataFrame:
    """One row per case: optimizer state per rank against plain DDP's, and the step-work balance.

    ``ddp_state_bytes`` is what plain DDP holds on every rank: the whole optimizer state. For a
    case that shards it (one with a ``partition``), that is the sum over ranks (the shards are
    disjoint and together cover every parameter, each with the same state as under DDP); for
    any other case each rank already holds all of it. ``imbalance`` is max / mean over ranks of
    the parameters each rank steps: 1 is even, the world size is one rank doing the whole step.
    """
    if memory.empty:
        return pd.DataFrame()
    out = (
        memory.groupby(KEYS)
        .agg(
            ranks=("rank", "size"),
            state_max_bytes=("optimizer_state_bytes", "max"),
            state_min_bytes=("optimizer_state_bytes", "min"),
            state_total_bytes=("optimizer_state_bytes", "sum"),
            stepped_max=("stepped_params", "max"),
            stepped_min=("stepped_params", "min"),
            stepped_mean=("stepped_params", "mean"),
            stepped_total=("stepped_params", "sum"),
            param_bytes=("param_bytes", "max"),
            grad_bytes=("grad_bytes", "max"),
        )
        .reset_index()
    )
    sharded = set(map(tuple, partition[KEYS].drop_duplicates().to_numpy())) if not partition.empty else set()
    out["sharded"] = [k in sharded for k in zip(out["run_id"], out["case_id"])]
    out["ddp_state_bytes"] = out["state_total_bytes"].where(out["sharded"], out["state_max_bytes"])
    out["state_saved_pct"] = 100 * (1 - out["state_max_bytes"] / out["ddp_state_bytes"])
    out["imbalance"] = out["stepped_max"] / out["stepped_mean"]
    out["busiest_share_pct"] = 100 * out["stepped_max"] / out["stepped_total"]
    if not partition.empty:
        buckets = partition.dropna(subset=["bucket"]).groupby(KEYS)["bucket"].nunique().rename("buckets")
        out = out.merge(buckets.reset_index(), on=KEYS, how="left")
    else:
        out["buckets"] = pd.NA
    return out
