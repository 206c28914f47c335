"""Bandwidth per collective, as nccl-tests defines it, from the ``comm`` intervals of all ranks.

- algbw = bytes / time, in GB/s with GB = 1e9 (nccl-tests' own unit).
- busbw = algbw × a factor that makes collectives comparable with the link's peak:
  2(n−1)/n for allreduce, (n−1)/n for allgather, reduce_scatter and alltoall, 1 for broadcast,
  reduce and point-to-point.
- time is the collective's *minimum* duration across ranks: a rank that arrives early waits for
  its peers inside the collective, so only the last to arrive measures the transfer itself. A
  rooted collective (``ROOTED``: broadcast, reduce, point-to-point) is timed on its *slowest* rank
  instead: its root may end as soon as its bytes are handed to the transport (on Gloo a broadcast's
  root returns once they are in the socket's buffer: 589 KB broadcasts read 2.41 GB/s of busbw on
  a 0.125 GB/s link), while a receiver cannot end before they have crossed. That time also holds
  any wait for a late root, so it errs low, never above the link.

Instances are matched across ranks by their order within (process group, collective): every rank
of a group issues its collectives in the same order, which is what makes the collective work.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

COLLECTIVE_BANDWIDTH_COLUMNS = (
    "process_group",
    "collective",
    "instance",
    "step",
    "bytes",
    "group_size",
    "ranks",
    "time_ns",
    "slowest_ns",
    "algbw_gbps",
    "busbw_gbps",
)


# Collectives whose data flows from or to one rank: timed on the slowest rank (see the module's docstring).
ROOTED = frozenset({"broadcast", "reduce", "scatter", "gather", "send", "recv"})


def busbw_factor(collective: str, n: int | None) -> float:
    """nccl-tests' bus-bandwidth factor for ``n`` ranks (NaN for collectives it does not define).

    ``n`` None: the group size is unknown, and so is the factor, except where it is 1 for any ``n``."""
    if n is not None and n < 1:
        return float("nan")
    if collective in ("broadcast", "reduce", "send", "recv", "sendrecv"):
        return 1.0
    if n is None:
        return float("nan")
    if collective == "allreduce":
        return 2 * (n - 1) / n
    if collective in ("allgather", "reduce_scatter", "alltoall"):
        return (n - 1) / n
    return float("nan")


def collective_bandwidth(intervals: pd.DataFrame, group_size: int | None = None) -> pd.DataFrame:
    """One row per collective instance, columns ``COLLECTIVE_BANDWIDTH_COLUMNS``.

    ``intervals`` is ``Timeline.intervals`` (only ``comm`` rows with a ``collective`` are used).
    ``instance`` counts from 0 within (process group, collective); ``step`` is the earliest step
    any rank ran it in; ``ranks`` how many ranks' traces have it; ``time_ns`` the minimum duration
    across ranks (the maximum for a ``ROOTED`` collective) and ``slowest_ns`` the maximum.
    ``group_size`` falls back to the number of ranks seen when the trace names no process groups;
    it is NA where the trace names groups of several sizes but not this collective's
    (``group_size_unknown``: a Gloo range in post-local SGD after its switch, where two node
    subgroups' all-reduces pair into one instance seen on every rank). Bandwidths are NaN where bytes
    are unknown, busbw also where the group size is (but for collectives whose factor is 1).
    ``group_size``: the size of every collective's group where the caller knows it from the case's
    settings (``algorithms.world_group_size``: a DDP case in a world that also holds post-local SGD's
    subgroups), for the instances whose trace leaves it unknown.
    """
    comm = intervals[(intervals["lane"] == "comm") & intervals["collective"].notna()]
    if comm.empty:
        return _empty()
    df = pd.DataFrame(
        {
            "rank": comm["rank"].to_numpy(),
            "process_group": comm["process_group"].astype(object).fillna("").to_numpy(),
            "collective": comm["collective"].astype(object).to_numpy(),
            "start_ns": comm["start_ns"].to_numpy(),
            "dur_ns": (comm["end_ns"] - comm["start_ns"]).to_numpy(),
            "step": comm["step"].to_numpy(),
            "bytes": comm["bytes"].to_numpy(dtype="float64", na_value=np.nan),
            "group_size": comm["group_size"].to_numpy(dtype="float64", na_value=np.nan),
            "size_unknown": comm["group_size_unknown"].to_numpy(dtype=bool),
        }
    ).sort_values(["rank", "start_ns"], kind="stable")
    df["instance"] = df.groupby(["rank", "process_group", "collective"], sort=False).cumcount()
    g = df.groupby(["process_group", "collective", "instance"], sort=False)
    out = g.agg(
        step=("step", "min"),
        bytes=("bytes", "max"),
        group_size=("group_size", "max"),
        size_unknown=("size_unknown", "any"),
        ranks=("rank", "nunique"),
        time_ns=("dur_ns", "min"),
        slowest_ns=("dur_ns", "max"),
        first_ns=("start_ns", "min"),
    ).reset_index()
    guess = out["ranks"].where(~out["size_unknown"], group_size)
    out["group_size"] = out["group_size"].fillna(guess).astype("Int64")
    out["time_ns"] = out["time_ns"].where(~out["collective"].isin(ROOTED), out["slowest_ns"])
    seconds = out["time_ns"].to_numpy(dtype=np.float64) / 1e9
    with np.errstate(divide="ignore", invalid="ignore"):
        out["algbw_gbps"] = np.where(seconds > 0, out["bytes"].to_numpy() / 1e9 / seconds, np.nan)
    factors = np.array(
        [busbw_factor(c, None if pd.isna(n) else int(n)) for c, n in zip(out["collective"], out["group_size"])]
    )
    out["busbw_gbps"] = out["algbw_gbps"] * factors
    out["bytes"] = out["bytes"].astype("Int64")
    out["process_group"] = out["process_group"].replace("", None)
    out = out.sort_values("first_ns", ignore_index=True)
    return out[list(COLLECTIVE_BANDWIDTH_COLUMNS)]


def _empty() -> pd.DataFrame:
    types = {
        "process_group": object,
        "collective": object,
        "bytes": "Int64",
        "group_size": "Int64",
        "algbw_gbps": float,
        "busbw_gbps": float,
    }
    return pd.DataFrame({c: pd.Series(dtype=types.get(c, "int64")) for c in COLLECTIVE_BANDWIDTH_COLUMNS})


def bytes_per_step(collectives: pd.DataFrame, steps: list[int]) -> dict[str, float]:
    """Collective payload per profiled step, as nccl-tests counts it (an all-reduce of B bytes is B):
    ``allreduce_bytes_per_step`` (the gradients DDP's hook sends) and ``comm_bytes_per_step`` (every
    collective, e.g. also ZeRO's parameter broadcasts). The mean over ``steps`` (a step without a
    collective counts as 0), so periodic traffic such as model averaging is spread over its period.
    ``collectives``: ``collective_bandwidth``'s table; NaN where bytes are unknown."""
    if not steps:
        return {}
    mine = collectives[collectives["step"].isin(steps)]
    payload = mine["bytes"].astype("float64")
    allreduce = payload[mine["collective"] == "allreduce"]
    return {
        "allreduce_bytes_per_step": _total(allreduce) / len(steps),
        "comm_bytes_per_step": _total(payload) / len(steps),
    }


def _total(payload: pd.Series) -> float:
    return float(payload.sum()) if payload.notna().all() else float("nan")
