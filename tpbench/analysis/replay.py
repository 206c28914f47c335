"""Fabrics, and the replay of a step on one: what each collective costs on a fabric, and how a
traced step's skeleton (``skeletons``) runs with those costs.

A skeleton holds, per rank, the training thread's work between communication events (``Work``),
the points where it issues a collective (``Issue``) and the points where the hook's dependency
structure makes it wait for one (``Wait``). ``simulate`` replays it with collective durations from
an α–β model of a fabric, so the measured compute timeline stays and only the communication changes.

Collectives run one at a time, in issue order, on one channel (as NCCL's stream does; Gloo may run
two at once, which on a bandwidth-bound link finishes no sooner). A collective starts when every
rank has issued it and the channel is free.

Interference (κ, measured by ``interference.interference``): work runs 1/κ as fast while the channel is
busy, after each work's traced stretch beside communication is taken out.

Cost per collective (ring algorithms, sizes as nccl-tests counts them)::

    t = hops · α + wire_bytes / β
    hops = 2(n−1) for allreduce, n−1 otherwise
    wire_bytes = bytes · busbw_factor(collective, n)         (point-to-point links, per rank)
    wire_bytes = n · bytes · busbw_factor   [(n−1)·bytes for broadcast/reduce]   (shared medium)

``β`` is then exactly the bus bandwidth nccl-tests reports, so a measured busbw can be put in the
fabric table as is. A shared medium is one link all ranks' traffic crosses: the emulated
``tcp-<rate>`` links, where one tbf-shaped ``lo`` carries both directions of every rank (a 2-rank
all-reduce of B bytes moves 2B through it). A fabric may have a ``floor``: a second path every
transfer also crosses, pipelined with the first, so the slower of the two sets the time (an
emulated link behind this host's own TCP stack).

Every time in ``simulate`` is a sum or a maximum of work and collective costs, or the time a work
takes at rate 1 or 1/κ across the channel's busy spans, so the replay is non-decreasing in the
compute factor and in every collective's cost: the bounds ``whatif`` puts on a projection rest on that.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from tpbench.analysis.bandwidth import busbw_factor

# --------------------------------------------------------------------------- fabrics


@dataclass(frozen=True)
class Fabric:
    """An α–β description of a link. ``beta_Bps`` is per rank and direction (nccl-tests' busbw)
    for point-to-point fabrics, or of the whole medium when ``shared``."""

    name: str
    alpha_s: float
    beta_Bps: float
    shared: bool = False
    description: str = ""
    floor: Fabric | None = None
    # A fitted path's bandwidth per collective kind (``fit_host_path``): on Gloo a broadcast is a
    # plain send while an all-reduce also sums on the CPU, several times slower per byte.
    by_collective: tuple[tuple[str, float], ...] = ()
    # A shaped link's token bucket (tbf's burst): after the link has idled long enough to refill
    # it, this many bytes cross without waiting for the rate (at the floor's speed). ``simulate``
    # keeps the bucket's level from one collective to the next.
    burst_bytes: float = 0.0
    # Where the fabric was defined (``parse_fabrics``' source: a fabrics file's path), so that a file's
    # fabric that replaced a built-in one of the same name can be said (``whatif_run.replaced_fabrics``).
    source: str = ""

    def beta_for(self, collective: str) -> float:
        return dict(self.by_collective).get(collective, self.beta_Bps)


# Nominal per-direction line rates; achievable busbw is typically 70-90% of them, so projections
# are optimistic by that much. α is a per-hop latency of the order NCCL's own tuning model uses.
# Put your own nccl-tests busbw here (or in a --fabrics file) for a sharper projection.
FABRICS_TOML = """
[fabrics.nvlink4]
description = "NVLink 4 (H100 SXM): 18 links x 25 GB/s per direction"
latency_us = 3.0
bandwidth_GBps = 450.0

[fabrics.pcie5-x16]
description = "PCIe 5.0 x16 peer to peer: 32 GT/s x 16 lanes, 128b/130b"
latency_us = 5.0
bandwidth_GBps = 63.0

[fabrics.ib-ndr]
description = "InfiniBand NDR, one 400 Gb/s port per GPU"
latency_us = 5.0
bandwidth_GBps = 50.0

[fabrics.100gbe]
description = "100 Gigabit Ethernet (RoCE), one port per node"
latency_us = 10.0
bandwidth_GBps = 12.5
"""


# Bounds a fabrics file's numbers must lie within: past them a value is a typo, not a link.
MAX_FABRICS = 64
MAX_LATENCY_US = 1e6  # one second per hop
MAX_BANDWIDTH_GBPS = 1e6  # a petabyte per second
_FABRIC_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
# What a fabrics file holds, said by the errors of a file that holds no fabric (not TOML, or empty).
_EXPECTED_FILE = "expected [fabrics.NAME] tables, each with latency_us and bandwidth_GBps"


def parse_fabrics(text: str, source: str = "<fabrics>") -> dict[str, Fabric]:
    """Fabrics from TOML: ``[fabrics.NAME]`` with ``latency_us``, ``bandwidth_GBps`` (1e9 bytes/s)
    and optional ``shared`` (a boolean) and ``description`` (a string). Every error is a
    ``ValueError`` naming the source, fabric and key and what was expected: a name of letters,
    digits and ``_.+-`` (it is printed in tables and the report), finite numbers within
    ``MAX_LATENCY_US`` / ``MAX_BANDWIDTH_GBPS``, at least one fabric and at most ``MAX_FABRICS``."""
    try:
        doc = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as e:
        raise ValueError(f"{source}: not valid TOML: {str(e) or 'nested too deeply'}; {_EXPECTED_FILE}") from None
    unknown_top = set(doc) - {"fabrics"}
    if unknown_top:
        raise ValueError(f"{source}: unknown table(s) {sorted(unknown_top)}; expected [fabrics.NAME]")
    tables = doc.get("fabrics", {})
    if not isinstance(tables, dict):
        raise ValueError(f"{source}: fabrics must be tables [fabrics.NAME], got {type(tables).__name__}")
    if not tables:
        # An empty file (truncated, or the wrong one given) added nothing and said nothing: the
        # projections then ran on the built-in fabrics alone, the user's own missing from them.
        raise ValueError(f"{source}: no fabrics; {_EXPECTED_FILE}")
    if len(tables) > MAX_FABRICS:
        raise ValueError(f"{source}: {len(tables)} fabrics; at most {MAX_FABRICS} per file")
    out: dict[str, Fabric] = {}
    for name, t in tables.items():
        where = f"{source}: [fabrics.{name}]"
        if not _FABRIC_NAME.fullmatch(name):
            raise ValueError(f"{where}: expected a name of letters, digits and _.+- (at most 64 characters)")
        if not isinstance(t, dict):
            raise ValueError(f"{where}: expected a table")
        extra = set(t) - {"latency_us", "bandwidth_GBps", "shared", "description"}
        if extra:
            raise ValueError(
                f"{where}: unknown key(s) {sorted(extra)}; expected latency_us, bandwidth_GBps, shared, description"
            )
        lat = _bounded_number(t, "latency_us", where, 0.0, MAX_LATENCY_US, low_open=False)
        bw = _bounded_number(t, "bandwidth_GBps", where, 0.0, MAX_BANDWIDTH_GBPS, low_open=True)
        shared, description = t.get("shared", False), t.get("description", "")
        if not isinstance(shared, bool):
            raise ValueError(f"{where}: shared must be true or false, got {shared!r}")
        if not isinstance(description, str):
            raise ValueError(f"{where}: description must be a string, got {description!r}")
        out[name] = Fabric(name, lat * 1e-6, bw * 1e9, shared, description, source=source)
    return out


def _bounded_number(t: dict, key: str, where: str, low: float, high: float, *, low_open: bool) -> float:
    """``t[key]``, a finite number within its bounds; a key left out is named with what it takes,
    as one out of bounds is, so that the user can write it without opening the docs."""
    expected = f"a finite number {'>' if low_open else '>='} {low:g} and <= {high:g}"
    if key not in t:
        raise ValueError(f"{where}: missing {key}; expected {expected}")
    v = t[key]
    low_ok = (v > low if low_open else v >= low) if isinstance(v, (int, float)) else False
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not low_ok or v > high:
        raise ValueError(f"{where}: {key} must be {expected}, got {v!r}")
    return float(v)


def emulated_link(
    rate_bits_per_s: float, host: Fabric | None, name: str | None = None, burst_bytes: float = 0.0
) -> Fabric:
    """A ``tcp-<rate>`` link: a shared medium at the tbf rate with its bucket of ``burst_bytes``,
    behind this host's own path."""
    return Fabric(
        name or f"tcp-{rate_bits_per_s:g}bit",
        0.0,
        rate_bits_per_s / 8,
        shared=True,
        description="tbf-shaped loopback (one medium for all ranks)",
        floor=host,
        burst_bytes=burst_bytes,
    )


def wire_bytes(collective: str, nbytes: float, n: int, fabric: Fabric) -> float:
    """The bytes one collective puts on ``fabric``'s medium (busbw convention; on a shared medium
    every rank's share crosses it)."""
    factor = busbw_factor(collective, n)
    if math.isnan(factor):
        raise ValueError(f"no cost model for collective {collective!r}")
    if fabric.shared:
        return (n - 1) * nbytes if collective in ("broadcast", "reduce") else n * factor * nbytes
    return factor * nbytes


def collective_time(collective: str, nbytes: float, n: int, fabric: Fabric, head_start_bytes: float = 0.0) -> float:
    """Seconds for one collective of ``nbytes`` (nccl-tests' count) among ``n`` ranks on ``fabric``.
    Its first ``head_start_bytes`` on the wire (a shaped link's bucket) do not wait for the rate:
    they cross at the floor's speed (the host's own path), the rest at the rate."""
    if n < 2:
        return 0.0
    hops = 2 * (n - 1) if collective == "allreduce" else n - 1
    wire = wire_bytes(collective, nbytes, n, fabric)
    head = min(head_start_bytes, wire)
    t = hops * fabric.alpha_s + (wire - head) / fabric.beta_for(collective)
    if fabric.floor is not None:
        below = collective_time(collective, nbytes, n, fabric.floor)
        t = max(t + below * head / wire, below) if wire else below
    return t


# --------------------------------------------------------------------------- the replay

Key = tuple[str, int]  # (collective, instance within the step)


@dataclass(frozen=True)
class Work:
    """Thread time between events; ``beside``: how much of it ran while this rank's communication
    was in flight in the trace (already stretched by interference there)."""

    seconds: float
    beside: float = 0.0


@dataclass(frozen=True)
class Issue:
    key: Key


@dataclass(frozen=True)
class Wait:
    keys: tuple[Key, ...]


Op = Work | Issue | Wait


@dataclass(frozen=True)
class CollectiveSpec:
    key: Key
    nbytes: float
    group_size: int


@dataclass(frozen=True)
class StepSkeleton:
    """One profiled step: each rank's thread as ops, the collectives in channel (issue) order,
    and the step's measured span (slowest rank)."""

    step: int
    ranks: tuple[tuple[Op, ...], ...]
    collectives: tuple[CollectiveSpec, ...]
    measured_s: float

    @cached_property
    def last_waited(self) -> dict[Wait, int]:
        """Per wait, the channel position of the last collective it waits for: the channel runs
        collectives one at a time in this order, so that one finishes last."""
        at = {c.key: i for i, c in enumerate(self.collectives)}
        return {
            op: max((at.get(k, len(at)) for k in op.keys), default=-1)
            for ops in self.ranks
            for op in ops
            if type(op) is Wait
        }


@dataclass(frozen=True)
class Schedule:
    step_s: float
    thread_end_s: tuple[float, ...]
    start_s: dict[Key, float]
    finish_s: dict[Key, float]


def simulate(
    sk: StepSkeleton,
    cost: Callable[[CollectiveSpec], float],
    compute_scale: float = 1.0,
    interference: float = 1.0,
) -> Schedule:
    """Replay a skeleton (``_replay``). On a fabric with a bucket (``Price`` of a shaped link) the
    bucket refills at the link's rate while the channel is idle, and a collective's first bytes,
    up to its level, cross at the floor's speed (``collective_time``). The step is replayed in the
    steady state of its bucket: the level it starts with is what the same step leaves plus what
    the link's idle time after its last collective refills, the step before taken to be like this
    one (a full bucket first, then once more from that level)."""
    burst = cost.fabric.burst_bytes if isinstance(cost, Price) else 0.0
    if not burst:
        return _replay(sk, cost, compute_scale, interference)[0]
    schedule, left = _replay(sk, cost, compute_scale, interference, burst, burst)
    last = max(schedule.finish_s.values(), default=0.0)
    level = min(burst, left + (schedule.step_s - last) * cost.fabric.beta_Bps)
    return schedule if level >= burst else _replay(sk, cost, compute_scale, interference, burst, level)[0]


def _replay(
    sk: StepSkeleton,
    cost: Callable[..., float],
    compute_scale: float,
    interference: float,
    burst: float = 0.0,
    level: float = 0.0,
) -> tuple[Schedule, float]:
    """Replay a skeleton: threads advance through their ops, collectives run one at a time in
    channel order once every rank has issued them. Raises ``ValueError`` on a skeleton that
    cannot finish (a wait for a collective some rank never issues).

    ``interference`` (κ ≥ 1): thread work runs κ times slower while a collective is in flight
    (Gloo's threads take the cores compute needs). A work's traced length already holds the
    stretch of the time it spent beside communication in the trace (``Work.beside``): that part is
    shrunk by κ to the work itself, which the replay stretches again wherever its own collectives
    run. So the replay is an event simulation in time order: a rank's work left shrinks at rate 1,
    or 1/κ while the channel is busy, and the next event is the earliest of a work's end, a
    collective's end and a collective's start. With κ = 1 it is the plain max-plus replay.
    ``burst``, ``level``: a shaped link's bucket and its level at the start (``simulate``); returns
    the schedule and the level left."""
    n = len(sk.ranks)
    pos = [0] * n
    left: list[float | None] = [None] * n  # work left in the current Work op (None: not started)
    done_at = [0.0] * n
    issued = dict.fromkeys((c.key for c in sk.collectives), 0)  # ranks that have issued each
    start: dict[Key, float] = {}
    finish: dict[Key, float] = {}
    now, free, nxt = 0.0, 0.0, 0
    ended = sum(not ops for ops in sk.ranks)  # ranks through all their ops
    sizes = [len(ops) for ops in sk.ranks]
    while True:
        moved = False
        for r, ops in enumerate(sk.ranks):  # everything each rank can do at `now` without time passing
            while pos[r] < sizes[r]:
                op = ops[pos[r]]
                if type(op) is Work:
                    if left[r] is None:
                        left[r] = (op.seconds - op.beside + op.beside / interference) * compute_scale
                    if left[r] > 0:
                        break
                    left[r] = None
                elif type(op) is Issue:
                    issued[op.key] += 1
                else:
                    last = sk.last_waited[op]
                    if last >= nxt or (last >= 0 and finish[sk.collectives[last].key] > now):
                        break
                pos[r] += 1
                done_at[r] = now
                ended += pos[r] == sizes[r]
        while nxt < len(sk.collectives) and free <= now and issued[sk.collectives[nxt].key] == n:
            spec = sk.collectives[nxt]
            if burst:
                level = min(burst, level + (now - free) * cost.fabric.beta_Bps)
                used = min(level, cost.wire_bytes(spec))
                start[spec.key], finish[spec.key] = now, now + cost(spec, used)
                level -= used
            else:
                start[spec.key], finish[spec.key] = now, now + cost(spec)
            free = finish[spec.key]
            nxt += 1
            moved = True
        if moved and free <= now:  # a collective that cost nothing may have released a wait
            continue
        if nxt == len(sk.collectives) and ended == n:
            return Schedule(max([free, *done_at]), tuple(done_at), start, finish), level
        rate = 1 / interference if free > now else 1.0
        later = free if free > now else math.inf
        for r in range(n):
            if left[r]:
                later = min(later, now + left[r] / rate)
        if later == math.inf:
            stuck = {r: sk.ranks[r][pos[r]] for r in range(n) if pos[r] < len(sk.ranks[r])}
            raise ValueError(f"skeleton cannot finish: ranks blocked at {stuck}")
        for r in range(n):
            if left[r]:
                # The rank whose work sets the next event finishes it exactly (no rounding left over).
                left[r] = 0.0 if now + left[r] / rate <= later else left[r] - (later - now) * rate
        now = later


@dataclass(frozen=True)
class Price:
    """Each collective's seconds on ``fabric`` (``collective_time``): the cost ``simulate`` takes,
    carrying its fabric so that the replay can keep a shaped link's bucket."""

    fabric: Fabric

    def __call__(self, c: CollectiveSpec, head_start_bytes: float = 0.0) -> float:
        return collective_time(c.key[0], c.nbytes, c.group_size, self.fabric, head_start_bytes)

    def wire_bytes(self, c: CollectiveSpec) -> float:
        return wire_bytes(c.key[0], c.nbytes, c.group_size, self.fabric) if c.group_size > 1 else 0.0


def fabric_cost(fabric: Fabric) -> Price:
    return Price(fabric)


FREE = Fabric("free", 0.0, float("inf"), description="communication costs nothing")


def step_replays_s(
    skels: Sequence[StepSkeleton], fabric: Fabric, compute_scale: float = 1.0, interference: float = 1.0
) -> np.ndarray:
    """Each traced step's replay on ``fabric`` (s), in the skeletons' order."""
    cost = fabric_cost(fabric)
    return np.array([simulate(sk, cost, compute_scale, interference).step_s for sk in skels])


def median_step_s(
    skels: Sequence[StepSkeleton], fabric: Fabric, compute_scale: float = 1.0, interference: float = 1.0
) -> float:
    return float(np.median(step_replays_s(skels, fabric, compute_scale, interference)))
