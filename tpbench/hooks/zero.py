"""ZeRO's optimizer step overlapped with DDP's backward pass, on NCCL and on Gloo.

``hook_with_zero_step`` and ``hook_with_zero_step_interleaved`` wrap any DDP communication hook
(``allreduce_hook``, the fp16/bf16 compression hooks, a user's own) so that a
``ZeroRedundancyOptimizer`` built with ``overlap_with_ddp=True`` steps its shard of the parameters
during backward and broadcasts the result, instead of in a separate ``zero.step()`` afterwards.
While DDP settles its buckets (two iterations, three with ``static_graph``) the hooks only record
the bucketing and parameters are not updated, as PyTorch documents.

Why PyTorch's versions hang on Gloo
-----------------------------------
Gloo pairs the collectives of a process group across ranks by the order in which each rank
*issues* them: every call takes the group's next sequence number as its tag. PyTorch's interleaved
hook issues each bucket's parameter broadcasts from ``fut.then(zero_step)``, a callback on the
bucket's all-reduce future. A Gloo future completes on one of the group's worker threads, and a
callback runs on whichever thread completes the future, or at once on the calling thread if it is
already complete when ``then`` is attached. Which of the two happens is a race, decided differently
on every rank, while the autograd thread keeps issuing the next buckets' all-reduces. Observed on
2 ranks (bypassing the Gloo check): rank 0 ran bucket 0's broadcast on a Gloo worker thread and
its next one for bucket 2, rank 1 ran buckets 0 and 1 on its main thread. Rank 0's broadcast then
shares a tag with a different collective on rank 1, both wait for bytes that never come, and
backward never returns. The last callback also blocks a Gloo worker thread in
``wait_for_broadcasts`` on work that needs those same workers to run. PyTorch's sequential hook
survives on Gloo only because it does all its issuing and waiting from the autograd thread in the
final bucket's hook. On NCCL the interleaved hook works because NCCL marks a future complete as
soon as the kernel is enqueued, so every callback runs inline, in issue order.

The design here
---------------
1. Every collective is issued, and every wait happens, on the thread that calls the hook (the
   autograd thread), never in a future callback. The order of collectives is a function of the
   bucket index sequence alone, which DDP makes the same on every rank (buckets reduce in index
   order once rebuilt), so the order is the same everywhere. A rank only ever waits for a
   collective that every rank issues before its own next wait, and Gloo's workers run queued work
   without help from the issuing thread, so every wait ends: no deadlock is possible.
2. Where futures complete at enqueue (NCCL on CUDA) waiting is a stream dependency, not a CPU
   block: the interleaved hook steps bucket ``k`` in bucket ``k``'s own hook, so its optimizer
   kernels follow that bucket's all-reduce on the stream and its broadcast follows them, the
   asynchronous behaviour that makes the overlap pay. Where futures complete on worker threads
   (Gloo, also with CUDA tensors) the same wait would block backward, so the interleaved hook
   steps bucket ``k - 1`` in bucket ``k``'s hook: bucket ``k``'s gradients are computed and
   reduced while ``k - 1`` is stepped. The choice depends on backend and device only, hence is the
   same on all ranks. The sequential hook steps every bucket, in index order, in the last
   bucket's hook.
3. The reduced gradients are read from the hook's future value (what DDP itself copies into
   ``.grad``), not from the bucket buffer, so hooks that return a new tensor work too.
4. The parameter partition is chosen here: whole buckets round-robin (as PyTorch does) or, with
   ``shard_buckets``, each bucket cut into at most ``world_size`` contiguous, near-equal runs
   handed to the least-loaded ranks. PyTorch's own ``shard_buckets`` heuristic can produce more
   runs than ranks and fail with "All indices are disallowed"; this one cannot.

The one condition left to the wrapped hook: on Gloo its own future callbacks must not issue
collectives (PyTorch's allreduce and fp16/bf16 hooks only compute in theirs), or it reintroduces
the race above by itself.

Each bucket's local step and broadcast appear in ``torch.profiler`` traces as
``tpbench.zero.step[bucket=K]`` and ``tpbench.zero.broadcast[bucket=K]`` (the broadcast range covers
issuing the bucket's broadcasts; the transfer itself shows as ``gloo:broadcast`` or an NCCL
kernel). The ranges are created only while a profiler records.

All use of PyTorch's private state lives in :mod:`tpbench.hooks._torch_private`.
"""

import bisect
import contextlib
import itertools
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

from tpbench.hooks import _torch_private as private
from tpbench.hooks._torch_private import Shard

__all__ = ["hook_with_zero_step", "hook_with_zero_step_interleaved"]

CommHook = Callable[[Any, dist.GradBucket], torch.futures.Future]
"""A hook to wrap, annotated as PyTorch's ``hook`` parameter is."""
ZeroHook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]
"""A wrapped hook, annotated as PyTorch's functions' return is (``typing.get_type_hints`` compares equal)."""

_NO_RANGE = contextlib.nullcontext()


def _split_contiguous(numels: list[int], parts: int) -> list[tuple[int, int]]:
    """Cut a run of parameter sizes into at most ``parts`` contiguous, non-empty, near-equal runs.

    Cuts fall on the parameter boundary nearest to each ``j / parts`` of the total, so no run
    exceeds its share by more than one parameter.
    """
    prefix = list(itertools.accumulate(numels, initial=0))
    total = prefix[-1]
    cuts = [0]
    for j in range(1, parts):
        target = total * j / parts
        i = bisect.bisect_left(prefix, target, lo=cuts[-1])
        if i > cuts[-1] and (i == len(prefix) or target - prefix[i - 1] <= prefix[i] - target):
            i -= 1
        cuts.append(min(i, len(numels)))
    cuts.append(len(numels))
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if a < b]


def plan_shards(bucket_numels: list[list[int]], world_size: int, shard_buckets: bool) -> list[Shard]:
    """Decide which rank steps which parameters of each DDP bucket.

    Without ``shard_buckets`` bucket ``k`` goes wholly to rank ``k % world_size``, as in PyTorch, so
    the two implementations partition alike and compare like for like. With it, each bucket is
    cut by :func:`_split_contiguous` and its runs go, largest first, to the ranks with the least
    work so far (distinct ranks within a bucket, ties to the lower rank): every rank helps with
    most buckets, so the per-bucket step shrinks with the world size. Deterministic, hence equal
    on all ranks. Returned sorted by (bucket, rank): the broadcast order.
    """
    shards: list[Shard] = []
    load = [0] * world_size
    for b, numels in enumerate(bucket_numels):
        if not shard_buckets:
            shards.append(Shard(b, b % world_size, 0, len(numels)))
            continue
        runs = sorted(_split_contiguous(numels, world_size), key=lambda r: -sum(numels[r[0] : r[1]]))
        ranks = sorted(range(world_size), key=lambda r: (load[r], r))
        for (start, stop), rank in zip(runs, ranks):
            load[rank] += sum(numels[start:stop])
            shards.append(Shard(b, rank, start, stop))
    return sorted(shards, key=lambda s: (s.bucket, s.rank))


def _completes_at_enqueue(group: Any, device: torch.device) -> bool:
    """Whether collectives on ``device`` complete their futures when enqueued (NCCL on CUDA).

    ``dist.get_backend`` answers ``"nccl"`` or, for a group with one backend per device type,
    e.g. ``"cpu:gloo,cuda:nccl"``.
    """
    backend = str(dist.get_backend(group))
    if ":" in backend:
        per_device = dict(item.split(":", 1) for item in backend.split(","))
        backend = per_device.get(device.type, "")
    return device.type == "cuda" and backend == "nccl"


@dataclass(frozen=True)
class _BucketPlan:
    """What one rank does for one DDP bucket once ZeRO is installed."""

    index: int
    numel: int
    dtype: torch.dtype
    """The bucket's size and dtype, which its hook's reduced tensor must have."""
    broadcasts: tuple[tuple[torch.Tensor, int], ...]
    """(flat shard tensor, global source rank) per owning rank, in rank order."""
    local_offset: int | None
    """Where this rank's run of the bucket starts in its local optimizer; ``None`` if it owns none."""
    grad_slices: tuple[tuple[int, int, torch.Size], ...]
    """(element offset, numel, shape) in the reduced flat bucket of each parameter this rank steps."""
    step_range: str
    broadcast_range: str


def _reduced_tensor(fut: torch.futures.Future) -> torch.Tensor:
    """The flat reduced bucket a comm hook's future holds (a tensor, or a one-tensor list)."""
    value = fut.value()
    return value[0] if isinstance(value, (list, tuple)) else value


def _check_reduced(flat: Any, hook: CommHook, plan: _BucketPlan) -> None:
    """``ValueError`` naming the inner hook when its reduced bucket is not the bucket's size and dtype
    (its gradients are sliced out of it and stepped): a hook that returns its compressed tensor
    without decompressing it, or a tensor of another size, would otherwise fail inside the optimizer
    step ("expected dtype float ... but got dtype c10::Half") or in a slice, naming neither the hook
    nor the bucket."""
    if not isinstance(flat, torch.Tensor) or flat.dtype != plan.dtype or flat.numel() != plan.numel:
        got = f"{flat.dtype} × {flat.numel()}" if isinstance(flat, torch.Tensor) else type(flat).__name__
        name = f"{getattr(hook, '__module__', '?')}:{getattr(hook, '__qualname__', hook)}"
        raise ValueError(
            f"the ZeRO hook's inner hook {name} returned {got} for bucket {plan.index}; the optimizer steps on the "
            f"bucket's reduced gradients, {plan.dtype} × {plan.numel} (a compressing hook decompresses in its "
            "future's callback, as fp16_compress_hook does)"
        )


class _ZeroOverlap:
    """Per (DDP model, ZeRO optimizer) state behind one wrapped hook; see the module docstring."""

    def __init__(
        self,
        hook: CommHook,
        ddp: DistributedDataParallel,
        zero: ZeroRedundancyOptimizer,
        internals: private.ZeroInternals,
        shard_buckets: bool,
        interleaved: bool,
    ) -> None:
        self._hook = hook
        self._ddp = weakref.ref(ddp)  # the hook lives inside DDP's reducer: a strong ref is a cycle
        self._zero = zero
        self._internals = internals
        self._shard_buckets = shard_buckets
        self._interleaved = interleaved
        self._collected: list[list[torch.Tensor]] = []
        self._plans: list[_BucketPlan] | None = None
        self._unchecked: set[int] = set()  # buckets whose reduced tensor ``_check_reduced`` has yet to see
        self._lag: int | None = None  # buckets between a reduce being issued and its step; None = at the end
        self._grads: list[torch.Tensor | None] = []
        self._reduced: deque[tuple[_BucketPlan, torch.futures.Future]] = deque()
        self._broadcasts: list[Any] = []
        self._next_bucket = 0

    def __call__(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future:
        fut = self._hook(state, bucket)
        if self._plans is None:
            self._collect(bucket)
        else:
            self._advance(bucket.index(), fut)
        return fut

    def _collect(self, bucket: dist.GradBucket) -> None:
        ddp = self._ddp()
        if ddp is None or not private.ddp_has_rebuilt_buckets(ddp):
            return
        params = bucket.parameters()
        if bucket.index() != len(self._collected):
            raise RuntimeError(f"DDP reduced bucket {bucket.index()} before bucket {len(self._collected)}")
        if sum(p.numel() for p in params) != bucket.buffer().numel():
            raise RuntimeError("DDP bucket is not its parameters laid out back to back; cannot slice gradients")
        self._collected.append(params)
        if bucket.is_last():
            self._install(bucket.buffer().device)

    def _install(self, device: torch.device) -> None:
        zero = self._zero
        numels = [[p.numel() for p in params] for params in self._collected]
        shards = plan_shards(numels, zero.world_size, self._shard_buckets)
        installed = self._internals.install(self._collected, shards, self._shard_buckets)
        plans = []
        for k, params in enumerate(self._collected):
            mine = [s for s in installed if s.shard.bucket == k]
            broadcasts = tuple((s.flat, dist.get_global_rank(zero.process_group, s.shard.rank)) for s in mine)
            if zero.world_size == 1:
                broadcasts = ()  # nothing to send; skip the no-op collectives
            local = next((s for s in mine if s.local_offset is not None), None)
            slices: tuple[tuple[int, int, torch.Size], ...] = ()
            if local is not None:
                offsets = list(itertools.accumulate(numels[k], initial=0))
                slices = tuple(
                    (offsets[i], numels[k][i], params[i].shape) for i in range(local.shard.start, local.shard.stop)
                )
            plans.append(
                _BucketPlan(
                    index=k,
                    numel=sum(numels[k]),
                    dtype=params[0].dtype,
                    broadcasts=broadcasts,
                    local_offset=None if local is None else local.local_offset,
                    grad_slices=slices,
                    step_range=f"tpbench.zero.step[bucket={k}]",
                    broadcast_range=f"tpbench.zero.broadcast[bucket={k}]",
                )
            )
        self._grads = [None] * self._internals.num_local_params
        if self._interleaved:
            self._lag = 0 if _completes_at_enqueue(zero.process_group, device) else 1
        self._collected = []
        self._plans = plans
        self._unchecked = {p.index for p in plans}

    def _advance(self, index: int, fut: torch.futures.Future) -> None:
        assert self._plans is not None
        if index != self._next_bucket:
            raise RuntimeError(
                f"DDP reduced bucket {index} where bucket {self._next_bucket} was expected; an earlier "
                "backward pass stopped part-way (its broadcasts may be unmatched across ranks)"
            )
        self._next_bucket = index + 1
        self._reduced.append((self._plans[index], fut))
        if index == len(self._plans) - 1:
            while self._reduced:
                self._step_and_broadcast(*self._reduced.popleft())
            self._wait_for_broadcasts()
        elif self._lag is not None:
            while self._reduced and self._reduced[0][0].index <= index - self._lag:
                self._step_and_broadcast(*self._reduced.popleft())

    def _step_and_broadcast(self, plan: _BucketPlan, fut: torch.futures.Future) -> None:
        if plan.local_offset is not None:
            fut.wait()  # NCCL: a stream dependency; Gloo: blocks until this bucket is reduced
            flat = _reduced_tensor(fut)
            if plan.index in self._unchecked:  # a bucket's first reduce, in warm-up: timed steps skip the check
                _check_reduced(flat, self._hook, plan)
                self._unchecked.discard(plan.index)
            grads = self._grads
            for i, (offset, numel, shape) in enumerate(plan.grad_slices, start=plan.local_offset):
                grads[i] = flat.narrow(0, offset, numel).view(shape)
            with record_function(plan.step_range) if private.profiler_enabled() else _NO_RANGE:
                self._internals.local_step(grads)
            for i in range(plan.local_offset, plan.local_offset + len(plan.grad_slices)):
                grads[i] = None
        if plan.broadcasts:
            group = self._zero.process_group
            with record_function(plan.broadcast_range) if private.profiler_enabled() else _NO_RANGE:
                for tensor, src in plan.broadcasts:
                    self._broadcasts.append(dist.broadcast(tensor, src=src, group=group, async_op=True))

    def _wait_for_broadcasts(self) -> None:
        """Parameters must be whole before the next forward; DDP calls no hook after the last bucket."""
        for work in self._broadcasts:
            work.wait()
        self._broadcasts.clear()
        self._next_bucket = 0


def _require_types(ddp: Any, zero: Any) -> None:
    """``TypeError`` naming the argument when ``ddp`` or ``zero`` is the wrong kind of object.

    Checked before the private-state checks, which would otherwise report a module passed for
    ``ddp`` or a plain optimizer passed for ``zero`` as private state missing from this torch
    release.
    """
    if not isinstance(ddp, DistributedDataParallel):
        raise TypeError(
            f"ddp must be a DistributedDataParallel (the model the hook is registered on), got {type(ddp).__name__}"
        )
    if not isinstance(zero, ZeroRedundancyOptimizer):
        raise TypeError(
            f"zero must be a ZeroRedundancyOptimizer built with overlap_with_ddp=True, got {type(zero).__name__}"
        )


def _wrap(
    hook: CommHook,
    ddp: DistributedDataParallel,
    zero: ZeroRedundancyOptimizer,
    shard_buckets: bool,
    interleaved: bool,
    name: str,
) -> ZeroHook:
    _require_types(ddp, zero)
    internals = private.ZeroInternals(zero)
    private.require_ddp_internals(ddp)
    if not internals.overlap_with_ddp:
        raise ValueError("ZeroRedundancyOptimizer must be constructed with `overlap_with_ddp=True` to use this hook")
    if ddp.find_unused_parameters and not ddp.static_graph:
        raise ValueError(
            "DDP with find_unused_parameters=True (and no static_graph) never rebuilds its buckets, "
            "so ZeRO would never be initialised and parameters would never update"
        )
    overlap = _ZeroOverlap(hook, ddp, zero, internals, shard_buckets, interleaved)

    def hook_with_zero(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        return overlap(state, bucket)

    hook_with_zero.__name__ = hook_with_zero.__qualname__ = name
    return hook_with_zero


def hook_with_zero_step(
    hook: CommHook,
    ddp: DistributedDataParallel,
    zero: ZeroRedundancyOptimizer,
    shard_buckets: bool = False,
) -> ZeroHook:
    """Modify ``hook`` to overlap ZeRO's optimizer step with DDP's backward pass.

    The optimizer computation follows the backward computation (it runs in the last bucket's
    hook, bucket by bucket), overlapping with outstanding backward communication and with the
    broadcasts of buckets already stepped. May be preferred over
    :func:`hook_with_zero_step_interleaved` when communication is slow relative to computation.

    Args:
        hook: the DDP communication hook to modify.
        ddp: the DDP instance the hook is registered on.
        zero: the ZeRO instance, built with ``overlap_with_ddp=True`` over ``ddp``'s parameters.
        shard_buckets: if True, each bucket's parameters are partitioned across possibly several
            ranks; if False, each bucket is assigned wholly to one rank.

    Returns:
        The modified hook, to pass to ``ddp.register_comm_hook``.

    Raises:
        ValueError: if ``zero`` was constructed with ``overlap_with_ddp=False``, or if ``ddp`` uses
            ``find_unused_parameters=True`` without ``static_graph`` (its buckets never settle).
        TypeError: if ``ddp`` is not a ``DistributedDataParallel`` or ``zero`` not a
            ``ZeroRedundancyOptimizer``.

    Warning:
        The first two training iterations (three with ``static_graph``) do not update parameters
        while DDP's bucketing information is being collected.
    """
    return _wrap(hook, ddp, zero, shard_buckets, interleaved=False, name="hook_with_zero_step")


def hook_with_zero_step_interleaved(
    hook: CommHook,
    ddp: DistributedDataParallel,
    zero: ZeroRedundancyOptimizer,
    shard_buckets: bool = False,
) -> ZeroHook:
    """Modify ``hook`` to overlap ZeRO's optimizer step with DDP's backward pass, bucket by bucket.

    Once a bucket's gradients are reduced, the optimizer computation for that bucket runs, so
    all-reduces and broadcasts interleave in the communication stream. Preferred over
    :func:`hook_with_zero_step` when communication is relatively fast. On NCCL a bucket is
    stepped in its own hook (stream-ordered, no CPU wait); on Gloo in the next bucket's hook, so
    that backward computation continues while a bucket is reduced.

    Args:
        hook: the DDP communication hook to modify.
        ddp: the DDP instance the hook is registered on.
        zero: the ZeRO instance, built with ``overlap_with_ddp=True`` over ``ddp``'s parameters.
        shard_buckets: if True, each bucket's parameters are partitioned across possibly several
            ranks; if False, each bucket is assigned wholly to one rank.

    Returns:
        The modified hook, to pass to ``ddp.register_comm_hook``.

    Raises:
        ValueError: if ``zero`` was constructed with ``overlap_with_ddp=False``, or if ``ddp`` uses
            ``find_unused_parameters=True`` without ``static_graph`` (its buckets never settle).
        TypeError: if ``ddp`` is not a ``DistributedDataParallel`` or ``zero`` not a
            ``ZeroRedundancyOptimizer``.

    Warning:
        The first two training iterations (three with ``static_graph``) do not update parameters
        while DDP's bucketing information is being collected.
    """
    return _wrap(hook, ddp, zero, shard_buckets, interleaved=True, name="hook_with_zero_step_interleaved")
