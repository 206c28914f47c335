"""Interference: how much slower compute runs while a collective is in flight, from a case's traces.

Where ranks and Gloo share a few cores, Gloo's threads copy and sum on the cores compute needs (Echo
models the same effect for GPU kernels beside NCCL's). The same op is timed beside a collective and
alone across a case's traced steps (``interference_pairs``); the ratio of their totals is the
factor (``interference``) the what-if's replay stretches overlapped compute by. A case whose own
ops do not pin it takes the factor pooled over the run's cases on its backend, device and link
where the pool does pin it, or is at least tighter (``chosen_interference``); a factor that stays
unpinned is *unresolved*, and the projections' intervals hold its ends (``whatif.CaseModel``). On
fabrics where communication leaves the CPU (NCCL on GPUs) it comes out near 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tpbench.analysis.overlap import covered_before, union
from tpbench.analysis.stats import BOOTSTRAP_SAMPLES, CONFIDENCE

# A compute op counts as run beside a collective when at least this share of it overlapped the
# rank's communication, and as run alone when none of it did; ops in between are left out.
BESIDE_SHARE = 0.5
# Matched ops a case needs for an interference factor of its own; with fewer, the factor pooled
# over the run's cases on the same backend, device and link is used (``Interference.source``)...
MIN_MATCHED_OPS = 30
# ... and they must pin it to this relative half-width (its 95 % interval), else it is pooled.
INTERFERENCE_PRECISION = 0.10
INTERFERENCE_PAIR_COLUMNS = ("beside_ns", "alone_ns")


def interference_pairs(intervals: pd.DataFrame) -> pd.DataFrame:
    """The same compute op timed beside a collective and alone, from one case's traced steps.

    An op is "the same" across steps when it has the same rank, thread or stream, name and
    position among that lane's compute intervals of its step: the steps of a training loop repeat
    their ops, and only which of them a collective overlaps changes from step to step (a bucket's
    all-reduce ends earlier or later). Per op seen both ways: the median duration beside a
    collective (``BESIDE_SHARE`` of it overlapping the rank's comm intervals) and alone (none of
    it overlapping), in ns. Columns ``INTERFERENCE_PAIR_COLUMNS``; empty when nothing matched."""
    out = []
    for _, g in intervals.groupby("rank", sort=True):
        comm = g[g["lane"] == "comm"]
        comp = g[g["lane"] == "compute"].sort_values("start_ns", kind="stable")
        if comm.empty or comp.empty:
            continue
        us, ue = union(comm["start_ns"].to_numpy(), comm["end_ns"].to_numpy())
        a, b = comp["start_ns"].to_numpy(), comp["end_ns"].to_numpy()
        dur = (b - a).astype(float)
        # Each op's overlap with the rank's comm: covered length up to its end minus up to its start.
        cum = np.r_[0, np.cumsum(ue - us)]
        share = np.where(
            dur > 0, (covered_before(us, ue, cum, b) - covered_before(us, ue, cum, a)) / np.maximum(dur, 1), 0.0
        )
        key = comp.assign(pos=comp.groupby(["stream_or_thread", "step"], observed=True).cumcount())
        frame = pd.DataFrame(
            {
                "lane": key["stream_or_thread"].astype(str).to_numpy(),
                "name": key["name"].astype(str).to_numpy(),
                "pos": key["pos"].to_numpy(),
                "dur": dur,
                "share": share,
            }
        )
        frame = frame[frame["dur"] > 0]
        keys = ["lane", "name", "pos"]
        beside = frame[frame["share"] >= BESIDE_SHARE].groupby(keys)["dur"].median()
        alone = frame[frame["share"] == 0].groupby(keys)["dur"].median()
        both = pd.concat([beside.rename("beside_ns"), alone.rename("alone_ns")], axis=1, join="inner")
        out.append(both.reset_index(drop=True))
    if not out:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in INTERFERENCE_PAIR_COLUMNS})
    return pd.concat(out, ignore_index=True)[list(INTERFERENCE_PAIR_COLUMNS)]


@dataclass(frozen=True)
class Interference:
    """How much slower compute runs while a collective is in flight: the matched ops' total time
    beside a collective over their total time alone (``interference_pairs``), with its 95 %
    bootstrap interval over ops. ``source``: "case" (its own ops) or "pooled" (the run's cases on
    the same backend, device and link, when the case's own do not pin it: ``chosen_interference``);
    ``ops``: the matched ops it rests on (0: none anywhere, factor 1)."""

    factor: float = 1.0
    lo: float = 1.0
    hi: float = 1.0
    ops: int = 0
    source: str = "none"

    @property
    def resolved(self) -> bool:
        """Whether at least ``MIN_MATCHED_OPS`` ops pin the factor to ±``INTERFERENCE_PRECISION`` (its
        95 % interval): then the replay may take it as known. An unresolved factor is a guess whose
        interval the projections must carry."""
        return self.ops >= MIN_MATCHED_OPS and self.half_width <= INTERFERENCE_PRECISION

    @property
    def half_width(self) -> float:
        """The 95 % interval's half-width over the factor; infinite where no op was matched (a
        factor of 1 then is no measurement, however narrow its interval of none)."""
        return (self.hi - self.lo) / 2 / self.factor if self.ops and self.factor > 0 else float("inf")

    @property
    def replay_factor(self) -> float:
        """The stretch the replay applies: the estimate, or 1 below 1. Nothing on a host makes
        compute faster while a collective runs; an estimate under 1 is timing noise, and a
        stretch under 1 would let a slower fabric project a shorter step."""
        return max(1.0, self.factor)


def interference(pairs: pd.DataFrame, source: str = "case") -> Interference:
    """``Interference`` from matched ops (``interference_pairs``): the ratio of total times, which
    weighs each op by its length as the step does (a 5 µs op's jitter does not swing it)."""
    if pairs.empty:
        return Interference()
    beside, alone = pairs["beside_ns"].to_numpy(float), pairs["alone_ns"].to_numpy(float)
    idx = np.random.default_rng(0).integers(0, len(pairs), size=(BOOTSTRAP_SAMPLES, len(pairs)))
    ratios = beside[idx].sum(axis=1) / alone[idx].sum(axis=1)
    lo, hi = np.quantile(ratios, [(1 - CONFIDENCE) / 2, (1 + CONFIDENCE) / 2])
    return Interference(float(beside.sum() / alone.sum()), float(lo), float(hi), len(pairs), source)


def chosen_interference(own: Interference, pooled: Interference | None) -> Interference:
    """A case's own factor when it is ``resolved``; else the pooled one where that is resolved or at
    least tighter than the case's own; else the case's own.

    Pooling buys precision: more matched ops than one case's. A pool whose interval is no tighter than
    the case's own buys none (a pooled ×1.57 [0.13, 14.32] against a case's as loose), and replaying
    its point as if known would hide the case's own evidence behind a number no better pinned. Either
    way the chosen factor may stay unresolved, and then the projections' intervals carry it
    (``whatif.CaseModel.step_interval_ms``)."""
    if own.resolved or pooled is None:
        return own
    return pooled if pooled.resolved or pooled.half_width < own.half_width else own
