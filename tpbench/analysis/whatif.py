"""What-if: project a measured step onto a fabric that is not here.

Pure functions over a case's analysed tables (``timeline``'s intervals and marks, the overlap
table, step rows): ``tpbench.whatif_run`` reads them from the store and resolves the links;
``whatif_validation`` projects a run's cases and checks the model against their twins on other links.

A measured case is reduced to a *skeleton* per profiled step (``skeletons``): for each rank, the
training thread's work between communication events, the points where it issues a collective and
the points where the hook's dependency structure makes it wait for one. ``replay.simulate`` replays
it with collective durations from an α–β model of a fabric (``replay``), so the measured compute
timeline stays and only the communication changes.

Why a skeleton of the measured thread rather than a formula: how much communication a hook hides
depends on *when* each bucket is issued and what waits for it, and that is in the trace.

Interference. Where ranks and Gloo share a few cores, compute runs slower while a collective is
in flight. It is measured per case on the run's own traces (``interference``: the same op's time
beside a collective over its time alone) and used in the replay: work runs 1/κ as fast while the
channel is busy, after each work's traced stretch beside communication is taken out. So a faster
fabric also gives compute back its cores.

Projections are projections: this machine's compute with another fabric's communication.

Calibration, and the bounds it gives. The case's own path is fitted on its traced steps'
communication, one bandwidth per collective kind (``fit_host_path``); a factor on the traced host
then makes the replay on that path match the timed steps (traced steps carry the profiler's
overhead): the factor nearest 1 whose replay lies within the timed median's 95 % interval, and not
above the median; above 1, raising the replay by no more than the timed median over the traced one
(the model's own miss of its traced steps is not the host's). On CPU ranks it scales the path too
(communication there is host work the tracer slowed as well); elsewhere only compute. Where only
compute is scaled and the traced steps ran slower than the timed ones, the modelled communication
alone can exceed the timed step: matching it is then only possible by shrinking compute, and a
factor clipped at some floor (0.05, say) projects steps at a twentieth of the case's compute onto
any fast fabric. So the factor is never clipped: a case whose fit needs a factor outside
``COMPUTE_FACTOR``, or none at all (the traced steps are then unrepresentative of the timed ones),
is refused with the reason, as is one whose replay misses its own traced steps
(``REPLAY_RESIDUAL``).

For a case that is not refused, the replay is non-decreasing in the compute factor and, in the
property tests, in every collective's cost (``replay``: why). Hence a projection is never below
the case's compute critical path (the replay with free communication, which stretches nothing:
``CaseModel.critical_path_ms``), and, since the factor is chosen so the replay on the measured
(scaled) path is no slower than the timed step, a projection onto a fabric that is no slower than
that path on every collective never exceeds the timed step (asserted over random skeletons,
interference and fabrics).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from tpbench.analysis.bandwidth import busbw_factor
from tpbench.analysis.interference import Interference, interference, interference_pairs
from tpbench.analysis.replay import FREE, Fabric, StepSkeleton, fabric_cost, median_step_s, simulate, step_replays_s
from tpbench.analysis.skeletons import NotModelled, marks_from_table, skeletons
from tpbench.analysis.stats import BOOTSTRAP_SAMPLES, CONFIDENCE, averaging_window, bootstrap_ci, repeat_values

# --------------------------------------------------------------------------- calibration


def fit_host_path(
    skels: Sequence[StepSkeleton],
    overlap: pd.DataFrame,
    intervals: pd.DataFrame | None = None,
    name: str = "as measured",
) -> Fabric:
    """The path a case's collectives actually took: per step, the bytes its collectives move
    (busbw convention) over the time communication was busy (the union of comm intervals, least
    across ranks: the other ranks' excess is waiting for peers); the median over steps.

    With the case's ``intervals``, the same per collective kind (``Fabric.by_collective``), the
    busy time split among kinds in issue order (``_busy_by_kind``: Gloo posts a bucket's broadcast
    beside the next bucket's all-reduce, and it waits behind it). One
    bandwidth for all kinds misprices whichever is cheaper per byte: on Gloo a 4 MB broadcast is
    a plain send of about a millisecond, a 4 MB all-reduce several (it also sums on the CPU), and
    a path fitted on both replays the broadcast at the all-reduce's cost. Splitting keeps the
    kinds' times adding up to the union, which a serial channel replays.

    Latency is folded into the bandwidth (α = 0): one case has too few message sizes to separate
    them, and that is enough to replay it and to serve as an emulated link's floor."""
    if overlap is None or overlap.empty:
        raise NotModelled("no per-step overlap table: the case has no traces")

    def wire(sk: StepSkeleton, kind: str | None = None) -> float:
        return sum(c.nbytes * busbw_factor(c.key[0], c.group_size) for c in sk.collectives if kind in (None, c.key[0]))

    def median_rate(busy: Mapping[int, float], kind: str | None = None) -> float | None:
        ratios = [
            wire(sk, kind) / (busy[sk.step] / 1e9) for sk in skels if busy.get(sk.step, 0) > 0 and wire(sk, kind) > 0
        ]
        return float(np.median(ratios)) if ratios else None

    overall = median_rate(overlap.groupby("step")["comm_ns"].min().to_dict())
    if overall is None:
        raise NotModelled(
            "no traced step moved bytes through a collective (a world of one rank communicates nothing): "
            "there is no link to fit or to swap"
        )
    by_kind: list[tuple[str, float]] = []
    if intervals is not None:
        comm = intervals[intervals["lane"] == "comm"]
        split: dict[int, dict[str, float]] = {}  # step → kind → ns, from the rank least busy in it
        for (_, step), g in comm.groupby(["rank", "step"], sort=True):
            shares = _busy_by_kind(g)
            if step not in split or sum(shares.values()) < sum(split[step].values()):
                split[step] = shares
        for kind in sorted({k for shares in split.values() for k in shares}):
            rate = median_rate({step: shares.get(kind, 0.0) for step, shares in split.items()}, kind)
            if rate is not None:
                by_kind.append((kind, rate))
    return Fabric(name, 0.0, overall, description="fitted on the measured case", by_collective=tuple(by_kind))


def _busy_by_kind(comm: pd.DataFrame) -> dict[str, float]:
    """The union of one rank's comm intervals split among collective kinds (ns): each stretch of
    it to the oldest collective in flight then. Collectives cross the link one after another in
    issue order; one posted behind another (a broadcast's receive posted while an all-reduce
    runs) waits, and is not moving data, until those before it are done."""
    order = comm.sort_values("start_ns", kind="stable")
    starts, ends = order["start_ns"].to_numpy(np.int64), order["end_ns"].to_numpy(np.int64)
    kinds = order["collective"].astype(str).to_numpy()
    out: dict[str, float] = {}
    covered = -(2**62)  # time up to which the union has been handed out
    for i in range(len(starts)):
        # Interval i gets what it covers past everything older: older ones are done by `covered`.
        got = ends[i] - max(starts[i], covered)
        if got > 0:
            out[kinds[i]] = out.get(kinds[i], 0.0) + float(got)
            covered = ends[i]
    return out


def calibrate(
    skels: Sequence[StepSkeleton],
    path: Fabric,
    measured_s: float,
    lowest_s: float | None = None,
    interference: float = 1.0,
    scale_path: bool = False,
    bounds: tuple[float, float] = (0.01, 100.0),
    wire: Fabric | None = None,
    raise_limit: float = math.inf,
) -> float | None:
    """The factor on the traced host, nearest 1, whose replay of the traced steps on their own
    path lands in [``lowest_s``, ``measured_s``] (default: exactly ``measured_s``), or None when
    no factor within ``bounds`` does; a factor above 1 raises the replay at most ``raise_limit``-fold.

    What tracing slows is the host: torch.profiler records every op with its shapes, which on a
    step of many small ops can double its host work. The factor scales the thread work, and with
    ``scale_path`` the case's own path too (``scaled_path``): where communication is host work
    as well (Gloo on CPU ranks: its copies and sums run on the same few cores, also on a shaped
    link), the tracer's CPU time slowed it as much. Scaling compute alone there would put all of
    the tracer's cost on the part that is not communication: on a step of mostly communication
    the factor falls to ×0.3, or no factor fits at all. Where communication leaves the host (NCCL on GPUs), tracing
    does not slow it, and only compute is scaled.

    Timed steps are the truth, but only up to their noise: the band is the timed median's 95 %
    interval below the median. Any factor whose replay lands in it agrees with the data, so the
    one nearest 1 is kept: when communication dominates the step (a slow link), the timed step
    pins compute only loosely, and fitting it exactly would pass the timing noise, amplified, to
    the compute of every projection. The band's top is the median itself: then any fabric at
    least as fast as the (scaled) path on every collective replays no slower than the measured step.

    The replay is continuous and non-decreasing in the factor (every time in ``simulate`` is a
    sum or a maximum of work and collective costs), so a bisection finds the band's edge; with
    ``scale_path`` on an unshaped link it is the factor times the replay at 1 (the fitted path has
    no latency term, so every time scales), and the edge is a ratio. Given a shaped link's wire
    (``wire``, an ``emulated_link`` without floor) the host's part scales and the wire does not
    (``host_scaled``).

    None (without ``scale_path``, or behind a wire) has two causes, and both mean the model cannot explain the
    timed step by its compute: the replay with compute shrunk to ``bounds[0]`` is still slower
    (communication on the measured path alone, as fitted on the traced steps, exceeds the timed
    step), or with ``bounds[1]`` still faster. Clipping the factor instead would shrink compute
    to nothing and project steps far shorter than the case's own compute.

    A factor above 1 says the untraced host was slower than the traced one, which tracing never
    makes it: all the timed steps can show of that is their median over the traced steps'
    (``raise_limit``, from ``calibrated``), the machine busier while timing. Where the replay
    falls further short of the timed steps, because it falls short of its own traced steps (the
    model's residual, which the refusal bounds and the interval carries), the rest is the
    model's error, not the host's: put on the host, it comes back at full size wherever the host
    is most of the step (a loopback case predicted from its 500 Mbit/s twin at ×1.12: +20 %). So
    the factor raises the replay by ``raise_limit`` at most, and the replay on the case's own
    link stays below its timed steps by that residual."""
    lowest_s = measured_s if lowest_s is None else min(lowest_s, measured_s)

    def replay(c: float) -> float:
        return median_step_s(skels, host_scaled(path, c, wire) if scale_path else path, c, interference)

    at_one = replay(1.0)
    if at_one < lowest_s:
        lowest_s = min(lowest_s, at_one * max(1.0, raise_limit))
    if lowest_s <= at_one <= measured_s:
        return 1.0
    if scale_path and wire is None and at_one > 0:  # every time scales: the edge is a ratio
        return (measured_s if at_one > measured_s else lowest_s) / at_one
    if at_one > measured_s:
        return _edge(lambda c: replay(c) <= measured_s, bounds[0], 1.0)
    return _edge(lambda c: replay(c) >= lowest_s, bounds[1], 1.0)


def _edge(inside: Callable[[float], bool], ok: float, bad: float) -> float | None:
    """The edge nearest ``bad`` of the factors where the monotone ``inside`` holds, by bisection
    between ``ok`` (where it should hold; None if it does not) and ``bad`` (where it does not)."""
    if not inside(ok):
        return None
    for _ in range(40):  # the bracket shrinks to a ratio of 1 + 1e-11
        mid = math.sqrt(ok * bad)
        if inside(mid):
            ok = mid
        else:
            bad = mid
    return ok


def scaled_path(path: Fabric, factor: float) -> Fabric:
    """``path`` with every collective ``factor`` times as long (``calibrate``)."""
    return dataclasses.replace(
        path, beta_Bps=path.beta_Bps / factor, by_collective=tuple((k, b / factor) for k, b in path.by_collective)
    )


def host_scaled(path: Fabric, factor: float, wire: Fabric | None = None) -> Fabric:
    """A CPU rank's own path on a host ``factor`` times as fast: the path as traced, scaled, and
    on a shaped link behind its wire (``emulated_link``), which the host's speed does not change."""
    scaled = scaled_path(path, factor)
    return scaled if wire is None else dataclasses.replace(wire, name=path.name, floor=scaled)


# --------------------------------------------------------------------------- when to refuse

# The host factor (timed host over traced host, ``calibrate``) must lie in this range. Tracing only
# adds host overhead, so the untraced host is faster than the traced one: torch.profiler records
# every op with its shapes, microseconds each, which on a step of many small ops (a small model on
# a CPU) can double its host work, hence 0.5. Nothing makes the untraced host slower than traced
# but noise: the traced steps run right after the timed ones, same model and data; 1.5 leaves room
# for a loaded machine. A factor beyond says the traced steps are not the timed steps' kind (the
# machine's load changed between them) or the skeleton misses a dependency, and a projection
# would carry that error at full size. Bounding it also bounds the compute critical path:
# at least half the traced compute.
COMPUTE_FACTOR = (0.5, 1.5)
# A factor read from the training thread's CPU time (``_host_factor``) may go lower: that time is
# the thread's own work (a CPU the hypervisor or a neighbour took is not in it), so its speed is
# the tracer's cost on the thread's ops, which on a ZeRO hook's or DDP's many small ops can more
# than double it. Kept trace windows of whatif.toml's cases on shaped links ran their threads at
# ×0.38–0.49 in every window traced again while their forward passes said ×0.76–1.05; at the
# thread's factor their compute matched the same case's on the other links (run 37's ddp twin at
# 500 Mbit/s, ×0.43: loopback projected +6.8 % where the forward passes' factor gave +71.6 %).
# Below about a third, the tracer tripled the thread's work, and the case is refused.
THREAD_FACTOR_FLOOR = 0.35
# The replay of each traced step on its own fitted path, before calibration, against that same
# step, the median over the steps (``Fit.miss``): the model's error on its own input (the residual
# on the measured link). The validation's target is 15 % mean error; a model that misses the very
# steps it was built from by more than 20 % has no business predicting other links.
REPLAY_RESIDUAL = 0.20
# The compute factors a projection's interval tabulates replays at (``CaseModel.step_interval_ms``):
# log-spaced over the factors a fit may take, about 3.5 % apart (a replay is close to linear in the
# factor between two points; each point is a replay of every traced step per fabric).
_FACTOR_GRID = np.geomspace(THREAD_FACTOR_FLOOR, COMPUTE_FACTOR[1], 43)
# How well the traced steps' median must be known for the compute factor to rest on it rather than
# on which steps happened to be traced: the validation's 5 % accuracy target.
TRACED_MEDIAN_TARGET = 0.05


# On a shaped link where communication alone, as fitted, is at least this share of the timed step,
# the timed step cannot pin the host factor: the wire's time does not scale with the host, any
# factor over most of the range lands the replay in the timed median's interval, and calibration
# keeps the one nearest 1, often 1 itself. The host factor is then the forward passes'
# (``forward_times``), which issue none of the step's collectives, or the training thread's CPU
# time where that ran slower (``calibrated``).
MOSTLY_COMMUNICATION = 0.5


def forward_times(step_rows: pd.DataFrame, marks: pd.DataFrame | None) -> tuple[float, float]:
    """The forward pass, (timed, traced) in ms: per rank the median over its timed steps
    (``forward_ms``, which CPU ranks record) and over its traced steps' forward ranges (marks of
    kind ``forward``), then the mean over ranks; NaN where there is none (GPU ranks, a run older
    than either). The forward pass issues none of its step's collectives, so their ratio is how
    much faster the host ran untraced than traced, whatever share of the step the link takes (though
    a ZeRO hook's rank 0 ran its forward passes slower than rank 1 at 2.5 Gbit/s, for a reason not
    measured: docs/interconnects.md)."""
    timed_ms = traced_ms = pd.Series(dtype=float)
    if "forward_ms" in step_rows:
        timed = step_rows[step_rows["phase"] == "timed"]
        timed_ms = timed.groupby("rank")["forward_ms"].median().dropna()
    if marks is not None and len(marks):
        fwd = marks[marks["kind"] == "forward"]
        traced_ms = ((fwd["end_ns"] - fwd["start_ns"]) / 1e6).groupby(fwd["rank"]).median()
    return (
        float(timed_ms.mean()) if len(timed_ms) else math.nan,
        float(traced_ms.mean()) if len(traced_ms) else math.nan,
    )


@dataclass(frozen=True)
class Fit:
    """What calibration saw, in ms: the traced steps' span, their replay on the fitted path at
    traced compute, the same replay with compute shrunk to nothing (communication alone), the
    timed median, and the factor nearest 1 that matches the timed steps (None: none does; see
    ``calibrate``), on thread work and, with ``scales_path``, on the case's own path too."""

    traced_ms: float
    replay_ms: float
    comm_only_ms: float
    measured_ms: float
    factor: float | None
    scales_path: bool = False
    wire: Fabric | None = None  # the case's link's shaped wire (``emulated_link``; None: unshaped)
    traced_steps: int = 0  # how many traced steps the fit rests on
    raise_limit: float = math.inf  # the timed median over the traced one, at least 1 (``calibrate``)
    traced_half_width: float = math.nan  # their median's 95 % CI half-width, over the median
    factor_source: str = "timed steps"  # or "forward passes", "training thread" (``MOSTLY_COMMUNICATION``)
    # Where the forward passes decide (``calibrated``): their median (timed, traced) ms, else NaN.
    forward_ms: tuple[float, float] = (math.nan, math.nan)
    # The training thread's CPU time per step, timed over traced (the kept trace window's,
    # ``record.TraceWindow``; NaN where not recorded): below ``COMPUTE_FACTOR`` the tracer itself
    # more than doubled the thread's work, and no number of traced steps takes that back.
    thread_speed: float = math.nan
    # The model's own error on its input, relative: the median over the traced steps of each one's
    # replay against that step's own span. Step by step, because a median replay set against a
    # median traced span compares two different steps wherever the replay does not keep the steps'
    # order, and three steps scattering by ±15 % then swing it by as much as the model's error.
    miss: float = dataclasses.field(kw_only=True)
    # How well the traced steps pin ``miss``: its 95 % bootstrap interval over the steps (NaN under
    # two). Three steps that scatter on a busy machine move it by their draw as much as the model
    # does, and only this tells a refusal that more traced steps could lift from one they could not.
    miss_interval: tuple[float, float] = dataclasses.field(default=(math.nan, math.nan), kw_only=True)
    # The host factors of the readings of the tracer's cost not taken (``_host_factor``): on a step of
    # mostly communication, the timed steps' own factor and the forward passes', where a lower one
    # replaced them. None of them is reliably right there, so the interval holds their projections.
    readings: tuple[float, ...] = ()

    @property
    def least_factor(self) -> float:
        """The least host factor this fit may take: ``THREAD_FACTOR_FLOOR`` for the training
        thread's, which reads the tracer's cost directly, else ``COMPUTE_FACTOR``'s."""
        return THREAD_FACTOR_FLOOR if self.factor_source == "training thread" else COMPUTE_FACTOR[0]

    def steps_enough(self, target: float = TRACED_MEDIAN_TARGET) -> int | None:
        """The traced steps whose median would be known to ±``target``, or None when these are
        enough already (or unknown): a median's interval narrows as 1/√n."""
        if not self.traced_steps or not math.isfinite(self.traced_half_width) or self.traced_half_width <= target:
            return None
        return math.ceil(self.traced_steps * (self.traced_half_width / target) ** 2)

    def _steps_advice(self) -> str:
        """Whether more traced steps could lift the refusal: not where the tracer's own cost made it
        (``thread_speed``), and only when the fit, moved across the traced median's own interval,
        could come within bounds (a traced median off by h moves the factor and the modelled
        communication by about as much)."""
        h = self.traced_half_width
        low, high = self.least_factor, COMPUTE_FACTOR[1]
        if self.factor is not None and self.factor < low and self.thread_speed < low:
            return (
                f"; the training thread's CPU time traced at ×{self.thread_speed:.2f} of its timed: the tracer's own "
                "cost on these ops, which more traced steps would not change"
            )
        if not self.traced_steps or not math.isfinite(h):
            return ""
        if self.factor is None:
            reachable = self.comm_only_ms * (1 - h) <= self.measured_ms
        else:
            reachable = self.factor / (1 - min(h, 0.99)) >= low if self.factor < low else self.factor / (1 + h) <= high
        known = f"the {self.traced_steps} traced steps' median is known to ±{h:.0%}"
        need = self.steps_enough()
        if need is None:
            return f"; {known}, so more traced steps would not change this"
        if not reachable:
            return f"; {known}, and anywhere in that interval the fit would still be refused: more would not help"
        return (
            f"; {known}: about {need} traced steps (capture.profiler_steps = {need}) would pin it to "
            f"±{TRACED_MEDIAN_TARGET:.0%}"
        )

    def _miss_advice(self) -> str:
        """What would lift a refusal for the model's own miss (``REPLAY_RESIDUAL``). Where the miss's
        interval over the traced steps (``miss_interval``) reaches within the limit, the draw of a few
        scattered steps may have made it: the sweep again with nothing else running and more traced
        steps, as many as would pin it to ±``TRACED_MEDIAN_TARGET`` (an interval narrows as 1/√n).
        Where all of it lies beyond, more steps would not: the replay does not describe the case."""
        n, (lo, hi) = self.traced_steps, self.miss_interval
        half = (hi - lo) / 2
        again = "sweep again with nothing else running on the machine"
        if n < 2 or not math.isfinite(half):
            need = max(5, n + 1)
            return f"; it rests on {n} traced step(s): {again} and --set capture.profiler_steps={need}"
        known = f"over its {n} traced steps the miss lies in [{lo:+.0%}, {hi:+.0%}] (95% interval)"
        if lo > REPLAY_RESIDUAL or hi < -REPLAY_RESIDUAL:
            return (
                f"; {known}, all of it beyond the limit: more traced steps would not lift it, the replay does not "
                "describe this case's steps (the run's other cases are still projected)"
            )
        if half <= TRACED_MEDIAN_TARGET:
            return (
                f"; {known}, near the limit: more traced steps would hardly move it, a quieter machine might: {again}"
            )
        need = math.ceil(n * (half / TRACED_MEDIAN_TARGET) ** 2)
        return (
            f"; {known}, within the limit in part, so the draw of scattered steps may have made it: {again} and "
            f"--set capture.profiler_steps={need}, which would pin it to ±{TRACED_MEDIAN_TARGET:.0%}"
        )

    def refusal(self) -> str | None:
        """Why this case's projections would not be trustworthy, or None when they are; with what
        would lift the refusal, where anything would."""
        if abs(self.miss) > REPLAY_RESIDUAL:
            return (
                f"the model does not reproduce its own traced steps (each step's replay off its span by a median "
                f"{self.miss:+.0%}, limit ±{REPLAY_RESIDUAL:.0%}; median replay {self.replay_ms:.1f} ms, traced "
                f"{self.traced_ms:.1f} ms)" + self._miss_advice()
            )
        unlike = f"traced steps ({self.traced_ms:.1f} ms) unrepresentative of timed steps ({self.measured_ms:.1f} ms)"
        if self.factor is None:
            if self.comm_only_ms > self.measured_ms:
                return (
                    f"{unlike}: the modelled communication on the measured link alone ({self.comm_only_ms:.1f} ms) "
                    "exceeds the timed step, so no compute factor fits" + self._steps_advice()
                )
            return f"{unlike}: no compute factor makes the replay match them" + self._steps_advice()
        timed, traced = self.forward_ms
        if traced > 0 and not COMPUTE_FACTOR[0] <= timed / traced <= COMPUTE_FACTOR[1]:
            return (
                f"{unlike}: their forward passes took {traced:.2f} ms against {timed:.2f} ms timed, a host factor of "
                f"×{timed / traced:.2f} (limit ×{COMPUTE_FACTOR[0]:.2f}–{COMPUTE_FACTOR[1]:.2f}): the machine was "
                "busier while tracing"
            )
        if not self.least_factor <= self.factor <= COMPUTE_FACTOR[1]:
            what = "compute and the host's own communication" if self.scales_path else "compute"
            return (
                f"{unlike}: {what} would have to be scaled ×{_past_limit(self.factor, self.least_factor)} to match "
                f"them (limit ×{self.least_factor:.2f}–{COMPUTE_FACTOR[1]:.2f})" + self._steps_advice()
            )
        return None


def _past_limit(factor: float, low: float) -> str:
    """A refused factor, with the decimals that keep it off its limit's ends: at two, ×1.505 read
    "×1.50" beside "limit ×0.50–1.50", a factor the reader sees inside the limit it was refused for."""
    for digits in range(2, 6):
        text = f"{factor:.{digits}f}"
        if not low <= float(text) <= COMPUTE_FACTOR[1]:
            return text
    return f"{factor:.6g}"


# --------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class CaseModel:
    """A measured case made replayable: its skeletons, its own path as traced, the host factor
    and what calibration saw (``fit``), and how communication slows compute (``interference``).
    ``refused`` says why its projections are withheld, or is None."""

    case_id: str
    params: Mapping[str, Any]
    skeletons: list[StepSkeleton]
    path: Fabric
    fit: Fit
    measured_ms: float
    ci_ms: tuple[float, float]
    refused: str | None
    reps_ms: np.ndarray = field(default_factory=lambda: np.array([]))  # the timed repeats' values
    interference: Interference = field(default_factory=Interference)
    forward_ms: float = math.nan  # the timed steps' forward pass (``forward_times``): the host's speed here

    @property
    def compute_scale(self) -> float:
        return self.fit.factor if self.fit.factor is not None else float("nan")

    @cached_property
    def host_path(self) -> Fabric:
        """The case's own path untraced: as fitted on the traced steps, scaled by the host factor
        (``calibrate``). On it the replay is the timed step (short of it by the model's own miss, where
        that is what a factor above 1 would have to hide); it is what this host's link is."""
        return scaled_path(self.path, self.compute_scale) if self.fit.scales_path and self.fit.factor else self.path

    def step_ms(self, fabric: Fabric) -> float:
        """The projected step on ``fabric`` (median over traced steps), NaN when refused."""
        if self.refused is not None:
            return float("nan")
        return median_step_s(self.skeletons, fabric, self.compute_scale, self.interference.replay_factor) * 1e3

    def step_interval_ms(self, fabric: Fabric) -> tuple[float, float]:
        """The projection's 95 % interval on ``fabric``: the fit redone on bootstrap resamples of
        what it rests on, the traced steps and the timed repeats together.

        Each resample's host factor follows the point's rule (``calibrate``): the point's factor
        while the scaled replay of the resampled steps on the case's own path (median over steps)
        lies between the timed interval's low end and the resampled timed median, else the factor
        that puts it on the nearer of the two, within ``COMPUTE_FACTOR``; its projection is the
        resampled steps' replay on ``fabric`` at that factor. Where the factor came from the forward
        passes or the training thread (``calibrated``: a step the timed medians cannot pin it on,
        which would move every resample to the band's edge, away from the point's own reading),
        each resample keeps it. Refitting each resample keeps the
        physical bounds inside the interval: on a fabric no slower than the scaled own path a
        resample projects no slower than its own timed median. Replays on ``fabric`` are
        tabulated on a grid of factors (each is monotone in the factor) and read between its points. The
        interval holds the projection itself; NaN when refused.

        Then the model's own error is added: its replay of the very steps it was built from misses
        them by r (``Fit.miss``, step by step; calibration absorbs that on the case's own link, not
        on another), so the interval is widened to [lo·(1 − |r|), hi·(1 + |r|)]. It also holds the
        projections at the other readings of the host: the timed steps' (``other_factor``) and,
        where the forward passes or the training thread set the factor, the readings that were not
        taken (``Fit.readings``), and where the interference is unresolved (``Interference.resolved``),
        the projections at the ends of its interval (``_interference_readings``). It stays within the
        physical bounds: not below the replay of any
        traced step with free communication at the least factor allowed, and, on a fabric no slower
        than the case's own link, not above the timed median's interval."""
        if self.refused is not None or len(self.reps_ms) < 2:
            # One timed repeat: its median has no interval, and the scatter a measured median would
            # carry, which the interval holds, is unknown; an interval without it claimed 95 %.
            return (math.nan, math.nan)
        rng = np.random.default_rng(0)
        steps = rng.integers(0, len(self.skeletons), size=(BOOTSTRAP_SAMPLES, len(self.skeletons)))
        reps = rng.integers(0, len(self.reps_ms), size=(BOOTSTRAP_SAMPLES, len(self.reps_ms)))
        target = np.median(self.reps_ms[reps], axis=1)
        own = np.median(self._own_replays[steps], axis=1)  # resample × factor
        there = np.median(self._replays(fabric)[steps], axis=1)
        floor, point_factor = self.ci_ms[0], self.compute_scale
        pinned = self.fit.factor_source == "timed steps"
        projected = []
        for t, o, f in zip(target, own, there):
            if not pinned:  # the forward passes' or the thread's factor: the timed step does not pin it
                projected.append(np.interp(point_factor, _FACTOR_GRID, f))
                continue
            # The point's rule on the resample: keep its factor while the replay stays in the band
            # [the timed interval's low end, the resampled median]; else move to the nearer edge,
            # raising the replay above its own at 1 by ``raise_limit`` at most.
            at = np.interp(point_factor, _FACTOR_GRID, o)
            band = min(t, max(floor, at))
            if band > at:
                band = max(at, min(band, np.interp(1.0, _FACTOR_GRID, o) * self.fit.raise_limit))
            c = max(np.interp(band, o, _FACTOR_GRID), self.fit.least_factor) if not floor <= at <= t else point_factor
            projected.append(np.interp(c, _FACTOR_GRID, f))
        # A measured median there would carry the timed repeats' own scatter, in ms: it comes from
        # the host (compute, the host's part of communication), not from a wire's steady rate, so
        # it stays as many ms on a fabric where the step is longer or shorter. Each resample is
        # also moved by an independent resample's median less the point's.
        noise = np.median(self.reps_ms[rng.integers(0, len(self.reps_ms), size=reps.shape)], axis=1)
        projected = np.asarray(projected) + noise - self.measured_ms
        lo, hi = np.quantile(projected, [(1 - CONFIDENCE) / 2, (1 + CONFIDENCE) / 2])
        miss = abs(self.fit.miss)
        lo, hi = max(lo * (1 - miss), self._least_ms), hi * (1 + miss)
        kappa = self.interference.replay_factor
        readings = [(f, kappa) for f in (self.other_factor, *self.fit.readings) if f is not None]
        for factor, k in readings + list(self._interference_readings):
            other = median_step_s(self.skeletons, fabric, factor, k) * 1e3
            lo, hi = min(lo, other), max(hi, other)
        if self.no_slower_than_measured(fabric):
            hi = min(hi, max(self.ci_ms[1], lo))
        point = self.step_ms(fabric)
        return (min(float(lo), point), max(float(hi), point))

    @cached_property
    def other_factor(self) -> float | None:
        """Where calibration scales the path with compute (CPU ranks): the factor of the other
        reading of the timed steps, on a shaped link the host's part of communication scaled and
        the wire not (``host_scaled``), on an unshaped one compute alone. None where calibration
        does not scale the path, or no factor within ``COMPUTE_FACTOR`` fits."""
        if not (self.fit.scales_path and self.fit.factor):
            return None
        wire = self.fit.wire
        return calibrate(
            self.skeletons,
            self.path,
            self.measured_ms / 1e3,
            self.ci_ms[0] / 1e3,
            self.interference.replay_factor,
            scale_path=wire is not None,
            bounds=COMPUTE_FACTOR,
            wire=wire,
            raise_limit=self.fit.raise_limit,
        )

    @cached_property
    def _interference_readings(self) -> tuple[tuple[float, float], ...]:
        """Where the interference is unresolved (``Interference.resolved``: neither the case's own ops
        nor the run's pool pin it), the (host factor, κ) of each end of its interval: the timed steps
        agree with any κ in it as well as with the point, so the interval holds their projections.
        Where the timed steps set the host factor, it is refitted at that κ (``calibrate``, as for the
        point): a larger κ leaves less of the timed step to compute. An end at which no factor within
        bounds matches the timed steps is ruled out by them and left out. Empty where resolved."""
        if self.interference.resolved or self.fit.factor is None:
            return ()
        out = []
        for kappa in {max(1.0, self.interference.lo), max(1.0, self.interference.hi)} - {
            self.interference.replay_factor
        }:
            factor: float | None = self.compute_scale
            if self.fit.factor_source == "timed steps":
                measured, low = self.measured_ms / 1e3, self.ci_ms[0] / 1e3
                raise_limit = self.fit.raise_limit
                factor = calibrate(
                    self.skeletons, self.path, measured, low, kappa, self.fit.scales_path, raise_limit=raise_limit
                )
            if factor is not None and self.fit.least_factor <= factor <= COMPUTE_FACTOR[1]:
                out.append((factor, kappa))
        return tuple(sorted(out))

    @cached_property
    def _least_ms(self) -> float:
        """The shortest step any factor allows: a traced step's replay with free communication and
        compute at the least factor the fit may take (``Fit.least_factor``), at each interference the
        interval holds (``_interference_readings``: a larger one takes more of the traced work beside
        communication out as the tracer's stretch)."""
        free, least = fabric_cost(FREE), self.fit.least_factor
        kappas = {self.interference.replay_factor, *(k for _, k in self._interference_readings)}
        return min(simulate(sk, free, least, k).step_s for sk in self.skeletons for k in kappas) * 1e3

    @cached_property
    def _own_replays(self) -> np.ndarray:
        """Each traced step's replay on its own path (ms) at each factor of ``_FACTOR_GRID``, the
        path scaled with it where calibration scales it (then the replay is the factor times the
        replay at 1: the fitted path has no latency term, and every time scales)."""
        if not self.fit.scales_path:
            return self._replays(self.path)
        at_one = step_replays_s(self.skeletons, self.path, 1.0, self.interference.replay_factor) * 1e3
        return np.outer(at_one, _FACTOR_GRID)

    def _replays(self, fabric: Fabric) -> np.ndarray:
        """Each traced step's replay on ``fabric`` (ms) at each factor of ``_FACTOR_GRID``."""
        cost = fabric_cost(fabric)
        kappa = self.interference.replay_factor
        return np.array([[simulate(sk, cost, c, kappa).step_s * 1e3 for c in _FACTOR_GRID] for sk in self.skeletons])

    def critical_path_ms(self) -> float:
        """The case's compute critical path: its replay with communication that costs nothing.
        Every projection is at least this (the replay is non-decreasing in collective costs)."""
        return self.step_ms(FREE)

    def no_slower_than_measured(self, fabric: Fabric) -> bool:
        """Whether ``fabric`` costs no more than the measured path (``host_path``) for every
        collective of the case: then its projection is at most the timed step (calibration puts
        the replay on that path no slower than it, and the replay is monotone in costs)."""
        fast, here = fabric_cost(fabric), fabric_cost(self.host_path)
        return all(fast(c) <= here(c) for sk in self.skeletons for c in sk.collectives)


def calibrated(
    case_id: str,
    params: Mapping[str, Any],
    skels: list[StepSkeleton],
    path: Fabric,
    reps_ms: np.ndarray,
    interference: Interference | None = None,
    comm_on_host: bool = False,
    wire: Fabric | None = None,
    forward: tuple[float, float] = (math.nan, math.nan),
    thread_speed: float = math.nan,
) -> CaseModel:
    """Calibrate a case's skeletons on its path against its per-repeat median step times (ms),
    its replays stretching compute beside communication by ``interference`` (default: none).
    ``comm_on_host``: the case's communication is host work that tracing slows as it slows
    compute (ranks on CPUs: Gloo copies and sums there): the factor scales the path too
    (``calibrate``); ``wire``: its link's shaped wire (None: unshaped), for the
    interval's other reading of the timed steps (``CaseModel.other_factor``).

    ``forward`` (the forward pass timed and traced, in ms) and ``thread_speed`` give the host
    factor on a step of mostly communication (``_host_factor``)."""
    interference = interference or Interference()
    kappa = interference.replay_factor
    measured = float(np.median(reps_ms))
    ci = _timed_band(reps_ms)
    traced = np.array([sk.measured_s for sk in skels]) * 1e3
    traced_lo, traced_hi = bootstrap_ci(traced) if len(traced) > 1 else (math.nan, math.nan)
    limit = max(1.0, measured / float(np.median(traced)))
    replays = step_replays_s(skels, path, 1.0, kappa) * 1e3
    fit = Fit(
        traced_ms=float(np.median(traced)),
        replay_ms=float(np.median(replays)),
        comm_only_ms=median_step_s(skels, path, 0.0) * 1e3,
        measured_ms=measured,
        factor=calibrate(skels, path, measured / 1e3, ci[0] / 1e3, kappa, comm_on_host, raise_limit=limit),
        scales_path=comm_on_host,
        wire=wire,
        traced_steps=len(traced),
        raise_limit=limit,
        traced_half_width=(traced_hi - traced_lo) / 2 / float(np.median(traced)),
        thread_speed=thread_speed,
        miss=float(np.median(replays / traced - 1)),
        miss_interval=bootstrap_ci(replays / traced - 1),
    )
    mostly_comm = fit.comm_only_ms >= MOSTLY_COMMUNICATION * measured
    if wire is not None and comm_on_host and fit.factor is not None and mostly_comm:
        fit = _host_factor(fit, forward)
    return CaseModel(
        case_id,
        dict(params),
        skels,
        path,
        fit,
        measured,
        ci,
        fit.refusal(),
        np.asarray(reps_ms, float),
        interference,
        forward[0],
    )


def _host_factor(fit: Fit, forward: tuple[float, float]) -> Fit:
    """The host factor of a case on a shaped link whose step is mostly communication
    (``MOSTLY_COMMUNICATION``), its host's work on that link (``calibrated``'s ``comm_on_host``).

    ``forward``: the forward pass timed and traced, in ms (``forward_times``). Their ratio is the
    host factor: the timed step cannot show how much faster the host ran untraced there, and the
    factor nearest 1 it allows keeps the tracer's cost in compute, which comes back at full size on
    a link where compute is most of the step. (On an unshaped link the whole step is host work and
    scales with it: the timed step pins the factor.) Only a ratio below 1 is taken: tracing never
    makes a host faster, and a forward pass of a few ms over a few traced steps that ran faster
    traced than timed is the machine's drift, not the tracer. A ratio outside ``COMPUTE_FACTOR``
    refuses the case, as a calibrated factor there would: the traced steps ran on a host of another
    kind than the timed ones (busier while tracing), and their compute, which the timed step cannot
    correct there, would come back at full size in every projection.

    ``thread_speed`` (``Fit.thread_speed``): the training thread's CPU time per step, timed over
    traced. On such a step, where it lies below the factor the forward passes (or the timed steps)
    gave, it is the factor: a forward pass is a few large ops, and the tracer costs most on many
    small ones (a ZeRO hook's optimizer step: its twin at 500 Mbit/s traced its thread at ×0.63 and
    its forward passes at ×0.87, where the timed steps pin the same hook's factor at ×0.68 on
    loopback). It may go down to ``THREAD_FACTOR_FLOOR``; below, the case is refused, the refusal
    naming the tracer's cost (a window that ran under half speed was traced again first, and the
    best kept: ``capture.retrace``)."""
    by_forward = forward[0] / forward[1] if forward[1] > 0 else math.nan
    readings = [fit.factor]
    fit = dataclasses.replace(fit, forward_ms=forward)  # out of bounds, a refusal (``Fit.refusal``)
    if COMPUTE_FACTOR[0] <= by_forward < 1:
        fit = dataclasses.replace(fit, factor=by_forward, factor_source="forward passes")
        readings.append(by_forward)
    if fit.factor is not None and fit.thread_speed < fit.factor:
        fit = dataclasses.replace(fit, factor=fit.thread_speed, factor_source="training thread")
    return dataclasses.replace(fit, readings=tuple(f for f in readings if f != fit.factor))


def case_model(
    case_id: str,
    params: Mapping[str, Any],
    intervals: pd.DataFrame | None,
    overlap: pd.DataFrame,
    marks: pd.DataFrame | None,
    step_rows: pd.DataFrame,
    beside_comm: Interference | None = None,
    comm_on_host: bool = False,
    wire: Fabric | None = None,
    thread_speed: float = math.nan,
) -> CaseModel:
    """One finished case's model, calibrated from its analysed tables (intervals, overlap, marks);
    ``beside_comm`` (its interference: default its own matched ops' factor, ``interference``),
    ``comm_on_host``, ``wire`` and ``thread_speed`` as in ``calibrated``."""
    if intervals is None or marks is None:
        raise NotModelled(_untraced(case_id, params))
    skels = skeletons(marks_from_table(marks), intervals)
    if not skels:
        raise NotModelled(f"case {case_id}: no profiled step common to all ranks")
    reps = _repeat_ms(case_id, params, step_rows)
    kappa = beside_comm or interference(interference_pairs(intervals))
    path = fit_host_path(skels, overlap, intervals)
    forward = forward_times(step_rows, marks)
    return calibrated(case_id, params, skels, path, reps, kappa, comm_on_host, wire, forward, thread_speed)


def _untraced(case_id: str, params: Mapping[str, Any]) -> str:
    """Why a case has no analysed traces, and what would give them. A case its record says was traced
    (``profiler_steps`` > 0) had them deleted, traces and tables alike (with its traces there, its
    reader names the missing tables instead): "profiler_steps = 0" would be untrue of it."""
    traced = params.get("profiler_steps")
    if isinstance(traced, numbers.Real) and traced > 0:  # NaN (a record without the key) is not > 0
        return (
            f"case {case_id} has no analysed traces, though it was traced (capture.profiler_steps = {int(traced)}): "
            "its traces and the tables derived from them are gone from the run; sweep it again to project it"
        )
    return (
        f"case {case_id} has no analysed traces (capture.profiler_steps = 0, or a run older than its marks table); "
        "sweep it with traced steps to project it, e.g. --set capture.profiler_steps=3"
    )


def _repeat_ms(case_id: str, params: Mapping[str, Any], step_rows: pd.DataFrame) -> np.ndarray:
    """The case's timed repeats' values as the rest of the run measures them (``repeat_values``,
    period-aware: a post-local SGD case's "measured" column read 22.9 ms where its step time said 24.3)."""
    windows = {case_id: averaging_window(params)}
    return repeat_values(step_rows.assign(case_id=case_id), windows=windows)["step_ms"].to_numpy()


def refused_model(case_id: str, params: Mapping[str, Any], step_rows: pd.DataFrame, reason: str) -> CaseModel:
    """A case whose traces make no model (``NotModelled``): its measured step and the reason, no
    skeletons, no projection. It takes the place of its model, so the run's other cases are still
    projected and validated, and this one is listed as refused like any other."""
    reps = _repeat_ms(case_id, params, step_rows)
    measured = float(np.median(reps))
    fit = Fit(math.nan, math.nan, math.nan, measured, None, miss=math.nan)
    return CaseModel(case_id, dict(params), [], FREE, fit, measured, _timed_band(reps), reason, reps)


def _timed_band(reps_ms: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """The timed median's 95 % interval that calibration fits into (``calibrate``'s band): one
    repeat has no interval, and its band is then the value itself (the replay fits it exactly)."""
    if len(reps_ms) < 2:
        value = float(np.median(reps_ms))
        return (value, value)
    return bootstrap_ci(reps_ms)


PROJECTION_COLUMNS = (
    "case_id",
    "fabric",
    "measured_ms",
    "compute_ms",
    "projected_ms",
    "predicted_lo_ms",
    "predicted_hi_ms",
    "speedup",
    "comm_share",
    "no_slower_than_measured",
    "interference",
    "interference_lo",
    "interference_hi",
    "interference_ops",
    "interference_source",
    "host_factor",
    "host_factor_source",
    "own_miss_pct",
    "refused",
)


def project(models: Sequence[CaseModel], fabrics: Mapping[str, Fabric]) -> pd.DataFrame:
    """Projected step time of each case on each fabric, next to what was measured here.

    Columns ``PROJECTION_COLUMNS``: compute_ms is the case's compute critical path (a lower bound
    of every projection); speedup = measured / projected; comm_share = projected communication
    on the critical path (step minus compute_ms) over the step; predicted_lo_ms/predicted_hi_ms
    the projection's 95 % interval (``CaseModel.step_interval_ms``); no_slower_than_measured marks
    fabrics whose projection is bounded above by the measured step; interference (with its 95 %
    interval, the ops it rests on and whether it is the case's own or pooled) how much slower the
    case's compute ran beside communication (``Interference``); host_factor the factor
    on the traced host (``calibrate``) and host_factor_source what set it ("timed steps", or
    "forward passes" or "training thread" where the step is mostly communication: ``calibrated``);
    own_miss_pct the model's miss of the case's own traced steps, each step's replay on its own path
    against its span, the median over the steps (``Fit.miss``, in %). A refused case has its reason
    in ``refused``, NaN projections and no_slower_than_measured NA (a nullable boolean column)."""
    rows = []
    for m in models:
        floor_ms = m.critical_path_ms()
        for name, fab in fabrics.items():
            ms = m.step_ms(fab)
            lo, hi = m.step_interval_ms(fab)
            rows.append(
                {
                    "case_id": m.case_id,
                    "fabric": name,
                    "measured_ms": m.measured_ms,
                    "compute_ms": floor_ms,
                    "projected_ms": ms,
                    "predicted_lo_ms": lo,
                    "predicted_hi_ms": hi,
                    "speedup": m.measured_ms / ms,
                    "comm_share": (ms - floor_ms) / ms if ms > 0 else float("nan"),
                    # A refused case has no projection to bound: NA, not a bound of nothing.
                    "no_slower_than_measured": None if m.refused is not None else m.no_slower_than_measured(fab),
                    "interference": m.interference.factor,
                    "interference_lo": m.interference.lo,
                    "interference_hi": m.interference.hi,
                    "interference_ops": m.interference.ops,
                    "interference_source": m.interference.source,
                    "host_factor": m.compute_scale,
                    "host_factor_source": m.fit.factor_source,
                    "own_miss_pct": 100 * m.fit.miss,
                    "refused": m.refused,
                }
            )
    table = pd.DataFrame(rows, columns=list(PROJECTION_COLUMNS))
    return table.astype({"no_slower_than_measured": "boolean"})


RANKING_COLUMNS = ("fabric", "first", "decided", "tied_with", "projected_ms", "predicted_lo_ms", "predicted_hi_ms")


def ranking(projections: pd.DataFrame) -> pd.DataFrame:
    """Per fabric, the case the projections rank first, and whether their intervals decide it.

    ``first`` is the case with the lowest projection; ``tied_with`` the cases whose interval
    reaches below the top of the first's (either could be fastest there), or where either has no
    interval (a case timed once); ``decided`` when there
    are none and another case was projected there: a lone projection beats nothing (the others
    refused, or the run finished one case), and JSON read "decided": true as a win over them.
    Refused cases take no part. Columns ``RANKING_COLUMNS``; the numbers are the first's."""
    rows = []
    made = projections[projections["refused"].isna() & projections["projected_ms"].notna()]
    for fabric, g in made.groupby("fabric", sort=False):
        best = g.loc[g["projected_ms"].idxmin()]
        # Not above the first's top, or either without an interval (one timed repeat): undecided.
        tied = g[(g["case_id"] != best["case_id"]) & ~(g["predicted_lo_ms"] >= best["predicted_hi_ms"])]
        rows.append(
            {
                "fabric": fabric,
                "first": best["case_id"],
                "decided": tied.empty and len(g) > 1,
                "tied_with": list(tied.sort_values("projected_ms")["case_id"]),
                "projected_ms": best["projected_ms"],
                "predicted_lo_ms": best["predicted_lo_ms"],
                "predicted_hi_ms": best["predicted_hi_ms"],
            }
        )
    return pd.DataFrame(rows, columns=list(RANKING_COLUMNS))


def cannot_win(projections: pd.DataFrame) -> list[str]:
    """The cases no projected fabric could rank first: on every fabric, the bottom of their
    interval is above the top of the first case's. Refused cases are not named (nothing is known)."""
    made = projections[projections["refused"].isna() & projections["projected_ms"].notna()]
    if made.empty:
        return []
    top_of_first = made.loc[made.groupby("fabric")["projected_ms"].idxmin()].set_index("fabric")["predicted_hi_ms"]
    out = made["predicted_lo_ms"] > made["fabric"].map(top_of_first)
    beaten = out.groupby(made["case_id"], sort=False).all()
    return [c for c, b in beaten.items() if b]
