"""Where a step's time went, and where a change of it came from: parts that add up by construction.

Per rank and traced step, every nanosecond of the step's span is given to exactly one part, by
priority (docs/explain.md):

- ``optimizer``: compute inside an optimizer range (``tpbench.optimizer``, ZeRO's ``tpbench.zero.*``);
- ``compute``: the rest of the work that is not communication (compute, memcpy and other lanes);
- ``straggler_wait``: communication nothing hid, while this rank waited inside a collective for a
  late peer. A collective instance (matched across ranks by its order within process group and
  kind, as ``bandwidth`` matches them) lasts at least as long as the transfer on every rank; what
  this rank spent beyond the shortest rank's duration is waiting, taken from its start (an early
  rank enters first and waits for the last one to arrive);
- ``exposed_comm``: the rest of the communication nothing hid, split by collective kind (and by DDP
  bucket where the bucket is known) in ``detail`` columns that sum to it;
- ``idle``: nothing ran.

So per rank-step the parts sum to its span exactly (|A| − |A ∩ B| and |A ∪ B| − |B|, over unions
of intervals clipped to the step). A step's time is the mean span over ranks: the ranks of a DDP
world move in lockstep, so over consecutive steps every rank's spans add up to the same elapsed
time, while the slowest span of one step is inflated by where each rank's step boundary fell.
Its parts are the means over ranks, with one exception that makes ``straggler_wait`` what a
straggler costs the step: ``compute`` is the least-loaded rank's, and the other ranks' compute
beyond it (the work their peers wait for) joins the waiting. With one rank slowed by X in a world
of two, waiting gains X/2 on one rank and compute X/2 on the other: ``straggler_wait`` +X,
``compute`` +0. The parts of each step sum to its time exactly. A change between two cases is
then, per part, the difference of mean per-step values, with Welch's t interval over the traced
steps (the steps of two cases are not paired); the changes of the parts sum to the change of the
step time exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tpbench.analysis.bandwidth import ROOTED
from tpbench.analysis.overlap import clip_to_steps, union_per_step
from tpbench.analysis.stats import CONFIDENCE, unpaired_difference

PARTS = ("compute", "exposed_comm", "optimizer", "idle", "straggler_wait")
DETAIL = "exposed_comm:"  # prefix of the detail columns: exposed_comm:allreduce, exposed_comm:bucket 0
_WORK = ("compute", "memcpy", "other")


@dataclass(frozen=True)
class Component:
    """One part's change, candidate − baseline, in ms per step, with its interval."""

    name: str
    delta_ms: float
    lo: float
    hi: float


@dataclass(frozen=True)
class Explanation:
    """A case's step-time change split into ``PARTS`` (``components``, summing to ``delta_ms``) and
    the exposed communication's split (``detail``: by collective kind, by DDP bucket where known)."""

    base_ms: float
    cand_ms: float
    delta_ms: float
    lo: float
    hi: float
    base_steps: int
    cand_steps: int
    components: list[Component]
    detail: list[Component] = field(default_factory=list)

    @property
    def top(self) -> Component:
        """The part that moved most in the direction of the change (the largest slowdown of a
        slower case, the largest saving of a faster one)."""
        sign = 1.0 if self.delta_ms >= 0 else -1.0
        return max(self.components, key=lambda c: sign * c.delta_ms)

    @property
    def top_detail(self) -> Component | None:
        """The collective kind or bucket whose exposed time moved most, in the change's direction."""
        sign = 1.0 if self.delta_ms >= 0 else -1.0
        return max(self.detail, key=lambda c: sign * c.delta_ms) if self.detail else None

    @property
    def residual_ms(self) -> float:
        """``delta_ms`` less the parts' sum: zero up to rounding, by construction."""
        return self.delta_ms - sum(c.delta_ms for c in self.components)


def rank_step_parts(intervals: pd.DataFrame, steps: pd.DataFrame, buckets: int | None = None) -> pd.DataFrame:
    """One row per (rank, step): ``span_ns`` and each of ``PARTS`` in ns (summing to the span),
    plus ``DETAIL`` columns splitting ``exposed_comm``.

    ``intervals``: ``Timeline.intervals``' columns (rank, lane, start_ns, end_ns, collective,
    process_group); ``steps``: rank, step, start_ns, end_ns. ``buckets``: how many gradient buckets
    DDP built (``ddp_buckets``), when known: then a step whose allreduces on one group number
    exactly that many has its i-th allreduce named ``bucket i`` (DDP reduces buckets in index order).
    """
    waits = _waits(intervals)
    out = []
    for rank, st in steps.groupby("rank", sort=True):
        iv = intervals[intervals["rank"] == rank]
        out.append(_rank_parts(iv, waits.loc[iv.index], st.sort_values("start_ns"), buckets))
    if not out:
        return pd.DataFrame(columns=["rank", "step", "span_ns", *PARTS])
    return pd.concat(out, ignore_index=True).fillna(0).sort_values(["rank", "step"], ignore_index=True)


def step_parts(per_rank: pd.DataFrame) -> pd.DataFrame:
    """One row per step: ``step_ns`` (the mean span over ranks) and the parts (means over ranks),
    which sum to ``step_ns``, with the imbalance of compute moved into ``straggler_wait``:
    ``compute`` is the least-loaded rank's, and the rest of the mean (the late ranks' extra work,
    which the others wait for) joins their waiting (module docstring)."""
    if per_rank.empty:
        return pd.DataFrame(columns=["step", "step_ns", *PARTS])
    by_step = per_rank.drop(columns=["rank"]).groupby("step", sort=True)
    mean = by_step.mean()
    least = by_step["compute"].min()
    mean["straggler_wait"] += mean["compute"] - least
    mean["compute"] = least
    return mean.rename(columns={"span_ns": "step_ns"}).reset_index()


def scaled(steps: pd.DataFrame, step_ms: float) -> pd.DataFrame:
    """``step_parts`` rescaled so that their mean step is ``step_ms``: the traced steps'
    composition applied to the timed steps' time.

    Traced steps carry the profiler's overhead, which differs between cases (more ops, more
    overhead; a busier machine while tracing), so two cases' traced change need not be the change
    their timed steps measured. Scaling each side's parts to its own timed step keeps what the
    trace knows (where the time went, step by step) and makes the parts add up to the measured
    change. Unchanged where ``step_ms`` is not a positive number."""
    mean_ns = float(steps["step_ns"].mean()) if len(steps) else 0.0
    if not (math.isfinite(step_ms) and step_ms > 0 and mean_ns > 0):
        return steps
    cols = ["step_ns", *(c for c in steps.columns if c in PARTS or c.startswith(DETAIL))]
    return steps.assign(**{c: steps[c] * (step_ms * 1e6 / mean_ns) for c in cols})


def explain(base: pd.DataFrame, cand: pd.DataFrame, *, confidence: float = CONFIDENCE) -> Explanation:
    """The change from ``base`` to ``cand`` (``step_parts`` of each), part by part, in ms."""
    if base.empty or cand.empty:
        raise ValueError("explain needs traced steps on both sides")

    def diff(col: str) -> Component:
        b = base[col].to_numpy(float) / 1e6 if col in base else np.zeros(len(base))
        c = cand[col].to_numpy(float) / 1e6 if col in cand else np.zeros(len(cand))
        return Component(col, *unpaired_difference(b, c, confidence=confidence))

    total = diff("step_ns")
    details = sorted({c for c in (*base.columns, *cand.columns) if c.startswith(DETAIL)}, key=_detail_order)
    return Explanation(
        base_ms=float(base["step_ns"].mean()) / 1e6,
        cand_ms=float(cand["step_ns"].mean()) / 1e6,
        delta_ms=total.delta_ms,
        lo=total.lo,
        hi=total.hi,
        base_steps=len(base),
        cand_steps=len(cand),
        components=[diff(p) for p in PARTS],
        detail=[Component(d[len(DETAIL) :], *_astuple(diff(d))) for d in details],
    )


def sentence(e: Explanation) -> str:
    """The top contributor in one sentence, with its share of the change and both intervals."""
    top = e.top
    if not math.isfinite(e.delta_ms):
        return "The step time's change could not be computed."
    what = top.name.replace("_", " ")
    interval = "no interval: too few timed repeats"
    if math.isfinite(e.lo) and math.isfinite(e.hi):
        interval = f"95% CI {e.lo:+.2f} to {e.hi:+.2f}"
    # No change resolved (a part's share of it would read 1000s of per cent), or none at all, as of a
    # run against its copy: the figure is the timed steps', and its interval still bounds the change.
    if e.delta_ms == 0 or e.lo <= 0 <= e.hi:
        if all(abs(c.delta_ms) < 0.005 for c in e.components):  # every part reads +0.00: none to name
            return f"{e.delta_ms:+.2f} ms per step, no change resolved ({interval}); no part moved by 0.01 ms or more."
        said = (
            f"{e.delta_ms:+.2f} ms per step, no change resolved ({interval}); the part "
            f"that moved most: {what}, {top.delta_ms:+.2f} ms (95% CI {top.lo:+.2f} to {top.hi:+.2f})"
        )
        best = _largest_resolved(e)
        if best is not None and best is not top:  # parts that cancel: one shown, the sum not
            said += f"; of the parts resolved, {_moved(best)}"
        return said + "."
    direction = "slower" if e.delta_ms > 0 else "faster"
    if top.lo <= 0 <= top.hi:  # the change is resolved, but its largest part is not: no "mostly" on it
        return f"{e.delta_ms:+.2f} ms per step {direction} ({interval}); {_unresolved_top(e)}"
    share = 100 * top.delta_ms / e.delta_ms
    sub = e.top_detail if top.name == "exposed_comm" else None
    if sub is not None and sub.delta_ms * e.delta_ms > 0:
        if f"{sub.delta_ms:+.2f}" == f"{top.delta_ms:+.2f}":  # all of it: its figure would be said twice
            what += f" ({sub.name})"
        elif abs(sub.delta_ms) >= 0.5 * abs(top.delta_ms) or len(e.detail) < 3:
            what += f" (mostly {sub.name}, {sub.delta_ms:+.2f} ms)"
        else:  # smaller buckets: many collectives, each a little slower, none of them "mostly"
            spread = f"spread over {len(e.detail)} {detail_noun(e.detail)}"
            what += f" ({spread}; the largest, {sub.name}, {sub.delta_ms:+.2f} ms)"
    lead = "mostly" if share > 50 else "most of all"  # "mostly" is more than half of it
    return (
        f"{e.delta_ms:+.2f} ms per step {direction} ({interval}), {lead} {what}: "
        f"{top.delta_ms:+.2f} ms ({share:.0f}% of the change, 95% CI {top.lo:+.2f} to {top.hi:+.2f})."
    )


def _unresolved_top(e: Explanation) -> str:
    """The clause for a resolved change whose largest part is not resolved over the traced steps.

    Another part may be (a steady +1.9 ms of compute beside a straggler wait that swung by ±12 ms):
    "no part's change is resolved" would then deny the one part the traced steps do show, so the
    clause names the largest resolved part instead, without calling it the cause."""
    top = e.top
    moved = f"{top.name.replace('_', ' ')}, {top.delta_ms:+.2f} ms (95% CI {top.lo:+.2f} to {top.hi:+.2f})"
    best = _largest_resolved(e)
    if best is None:
        return f"no part's change is resolved over the traced steps: the part that moved most, {moved}."
    unresolved = f"the part that moved most, {moved}, is not resolved over the traced steps"
    return f"{unresolved}; of the parts resolved, {_moved(best)}."


def _largest_resolved(e: Explanation) -> Component | None:
    """The part whose own interval excludes no change and that moved most, or None."""
    resolved = [c for c in e.components if c.lo > 0 or c.hi < 0]
    return max(resolved, key=lambda c: abs(c.delta_ms)) if resolved else None


def _moved(c: Component) -> str:
    """ "compute moved most: +1.90 ms (95% CI +1.20 to +2.60)"."""
    return f"{c.name.replace('_', ' ')} moved most: {c.delta_ms:+.2f} ms (95% CI {c.lo:+.2f} to {c.hi:+.2f})"


def detail_noun(detail: list[Component]) -> str:
    """What a run of the exposed communication's split is: buckets, or kinds and buckets mixed."""
    return "buckets" if all(d.name.startswith("bucket ") for d in detail) else "collectives and buckets"


# --------------------------------------------------------------------------- helpers


def _detail_order(column: str) -> tuple[int, int, str]:
    """Collective kinds by name, then buckets by index (bucket 2 before bucket 10)."""
    name = column[len(DETAIL) :]
    if name.startswith("bucket ") and name[7:].isdigit():
        return (1, int(name[7:]), "")
    return (0, 0, name)


def _astuple(c: Component) -> tuple[float, float, float]:
    return c.delta_ms, c.lo, c.hi


def _waits(intervals: pd.DataFrame) -> pd.Series:
    """Per comm interval, the ns it waited for a late peer: its duration less the shortest
    duration of the same collective instance over ranks (0 for everything else). A rooted
    collective's (``bandwidth.ROOTED``) shortest is its root's, which on Gloo returns once its bytes
    are in the socket's buffer: against it every receiver's transfer read as waiting for a late
    peer (4 ms of a 5 ms broadcast, all ranks started together). It is measured against the
    fastest of the other ranks instead, and a rank faster than that waited for nobody."""
    comm = intervals[(intervals["lane"] == "comm") & intervals["collective"].notna()]
    wait = pd.Series(0, index=intervals.index, dtype="int64")
    if comm.empty:
        return wait
    key = pd.DataFrame(
        {
            "rank": comm["rank"].to_numpy(),
            "pg": comm["process_group"].astype(object).fillna("").to_numpy(),
            "coll": comm["collective"].astype(object).to_numpy(),
            "start": comm["start_ns"].to_numpy(),
            "dur": (comm["end_ns"] - comm["start_ns"]).to_numpy(),
        },
        index=comm.index,
    ).sort_values(["rank", "start"], kind="stable")
    key["instance"] = key.groupby(["rank", "pg", "coll"], sort=False).cumcount()
    instance = ["pg", "coll", "instance"]
    shortest = key.groupby(instance, sort=False)["dur"].transform("min")
    rooted = key["coll"].isin(ROOTED)
    if rooted.any():
        by_dur = key[rooted].sort_values([*instance, "dur"], kind="stable")
        place = by_dur.groupby(instance, sort=False).cumcount()
        alone = by_dur.groupby(instance, sort=False)["dur"].transform("size") == 1
        second = by_dur[(place == 1) | alone].set_index(instance)["dur"].rename("second")
        shortest = shortest.where(~rooted, key.join(second, on=instance)["second"])
    wait.loc[key.index] = (key["dur"] - shortest).clip(lower=0).to_numpy()
    return wait


Spans = tuple[np.ndarray, np.ndarray]  # (start_ns, end_ns) of some intervals


def _rank_parts(iv: pd.DataFrame, wait: pd.Series, steps: pd.DataFrame, buckets: int | None) -> pd.DataFrame:
    """``rank_step_parts`` of one rank: ``iv`` its intervals, ``wait`` their waits, ``steps`` its steps."""
    st_start, st_end = steps["start_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64)
    n = len(steps)
    lane = iv["lane"].astype(object).to_numpy()
    start, end = iv["start_ns"].to_numpy(np.int64), iv["end_ns"].to_numpy(np.int64)
    is_comm, is_work = lane == "comm", np.isin(lane, _WORK)
    # Each comm interval as its wait [start, start + wait) and its transfer [start + wait, end).
    split = start + wait.to_numpy(np.int64)
    work: Spans = (start[is_work], end[is_work])
    waiting: Spans = (start[is_comm], split[is_comm])
    transfer: Spans = (split[is_comm], end[is_comm])
    compute: Spans = (start[lane == "compute"], end[lane == "compute"])
    optimizer: Spans = (start[lane == "optimizer"], end[lane == "optimizer"])

    def u(*parts: Spans) -> np.ndarray:
        """|∪ parts| per step, each interval clipped to the steps it touches."""
        (step, _), s, e = clip_to_steps(
            np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), st_start, st_end
        )
        return union_per_step(step, s, e, n)

    w = u(work)
    in_optimizer = u(compute) + u(optimizer) - u(compute, optimizer)  # |compute ∩ optimizer ranges|
    with_wait = u(work, waiting)
    busy = u(work, waiting, transfer)
    span = st_end - st_start
    out = pd.DataFrame(
        {
            "rank": np.full(n, int(steps["rank"].iloc[0])),
            "step": steps["step"].to_numpy(np.int64),
            "span_ns": span,
            "compute": w - in_optimizer,
            "optimizer": in_optimizer,
            "straggler_wait": with_wait - w,
            "exposed_comm": busy - with_wait,
            "idle": span - busy,
        }
    )
    if is_comm.any():
        # Each label's exposed transfer, |label ∪ work ∪ wait| − |work ∪ wait|, scaled per step so the
        # labels sum to exposed_comm (two collectives exposed at once would count twice).
        labels = _labels(iv[is_comm], buckets)
        raw = {
            DETAIL + label: u(work, waiting, (transfer[0][labels == label], transfer[1][labels == label])) - with_wait
            for label in sorted(set(labels))
        }
        total = np.sum(list(raw.values()), axis=0)
        scale = np.divide(out["exposed_comm"].to_numpy(float), total, out=np.zeros(n), where=total > 0)
        for col, v in raw.items():
            out[col] = v * scale
    return out


def _labels(comm: pd.DataFrame, buckets: int | None) -> np.ndarray:
    """Each comm interval's label: its collective kind, or ``bucket i`` for the i-th allreduce of
    a step when the step has exactly ``buckets`` allreduces on that group."""
    kind = comm["collective"].astype(object).fillna("other").to_numpy()
    labels = kind.copy()
    if not buckets:
        return labels
    ar = comm[kind == "allreduce"].sort_values("start_ns")
    if ar.empty:
        return labels
    grp = [ar["step"].to_numpy(), ar["process_group"].astype(object).fillna("").to_numpy()]
    keys = pd.DataFrame({"step": grp[0], "pg": grp[1]}, index=ar.index)
    nth = keys.groupby(["step", "pg"], sort=False).cumcount()
    count = keys.groupby(["step", "pg"], sort=False)["step"].transform("size")
    named = pd.Series(labels, index=comm.index)
    known = count == buckets
    named.loc[nth.index[known]] = [f"bucket {int(i)}" for i in nth[known]]
    return named.to_numpy()
