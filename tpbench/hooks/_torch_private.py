"""The one place where tpbench touches PyTorch's private internals.

Overlapping ZeRO with DDP cannot be written against public API alone: PyTorch's
``ZeroRedundancyOptimizer`` defers building its local optimizer until it is told how DDP bucketed
the gradients, and that hand-over happens through private state (``_overlap_info``, the
bucket-assignment cache, ``_partition_parameters``, ``_build_ddp_param_buckets``,
``_init_local_optimizer``, ``_local_step``). Knowing when DDP's buckets are final needs
``DistributedDataParallel._has_rebuilt_buckets``, skipping profiler ranges cheaply needs
``torch.autograd._profiler_enabled``, and checking that a user's hook returned a future needs
``torch._C.Future``.

Everything of that kind lives here, behind a small interface of plain values, so that a torch
upgrade touches one file. The interface is checked against the installed torch version: a
release outside :data:`SUPPORTED_TORCH` fails with an error that names it instead of failing
somewhere deep inside a backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.parallel import DistributedDataParallel

if TYPE_CHECKING:  # over a second to import; a rank of a DDP case never needs it
    from torch.distributed.optim import ZeroRedundancyOptimizer

SUPPORTED_TORCH: tuple[tuple[int, int], tuple[int, int]] = ((2, 4), (2, 15))
"""Inclusive lower and exclusive upper (major, minor) bound of torch releases this file was read against."""

_ZERO_PRIVATE_ATTRS = (
    "_overlap_with_ddp",
    "_clear_cache",
    "_partition_parameters",
    "_build_ddp_param_buckets",
    "_init_local_optimizer",
    "_local_step",
    "_bucket_assignments_per_rank_cache",
)


def _torch_minor(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def require_supported_torch(version: str | None = None) -> None:
    """Raise ``RuntimeError`` naming the installed torch when it is outside :data:`SUPPORTED_TORCH`."""
    version = version or torch.__version__
    low, high = SUPPORTED_TORCH
    if not low <= _torch_minor(version) < high:
        raise RuntimeError(
            f"tpbench's ZeRO hooks rely on private PyTorch internals checked for torch "
            f">={low[0]}.{low[1]},<{high[0]}.{high[1]}; the installed torch is {version}. "
            "Update tpbench/hooks/_torch_private.py for this release."
        )


def _require(missing: list[str], owner: str) -> None:
    if missing:
        raise RuntimeError(
            f"{owner} in torch {torch.__version__} lacks {missing}; "
            "tpbench/hooks/_torch_private.py needs updating for this release."
        )


@dataclass(frozen=True)
class _ZeroTypes:
    status: Any
    """``_OverlapStatus``: the enum ZeRO's overlap state machine is in."""
    assignment: Any
    """``_DDPBucketAssignment``: one rank's run of one bucket, as ZeRO records it."""


def _zero_private_types() -> _ZeroTypes:
    """ZeRO's private classes, imported late so that importing tpbench.hooks never fails on them."""
    try:
        from torch.distributed.optim.zero_redundancy_optimizer import _DDPBucketAssignment, _OverlapStatus
    except ImportError as e:
        raise RuntimeError(
            f"torch {torch.__version__}: {e}; tpbench/hooks/_torch_private.py needs updating for this release."
        ) from e
    return _ZeroTypes(status=_OverlapStatus, assignment=_DDPBucketAssignment)


def require_ddp_internals(ddp: DistributedDataParallel) -> None:
    """Fail at hook construction, not mid-backward, if DDP's private state has moved."""
    _require([] if hasattr(ddp, "_has_rebuilt_buckets") else ["_has_rebuilt_buckets"], "DistributedDataParallel")


def profiler_enabled() -> bool:
    """Whether a profiler is recording on this thread (a C++ flag read: costs well under a microsecond)."""
    return torch.autograd._profiler_enabled()


def is_future(value: Any) -> bool:
    """Whether a communication hook returned a future DDP can wait on. A collective's
    ``get_future()`` and ``then()`` return the private base class ``torch._C.Future``, of which the
    public ``torch.futures.Future`` is a subclass, so only the base class admits both."""
    return isinstance(value, torch._C.Future)


def ddp_has_rebuilt_buckets(ddp: DistributedDataParallel) -> bool:
    """Whether DDP has rebuilt its buckets, i.e. its bucketing is final for the rest of training."""
    return bool(ddp._has_rebuilt_buckets)


@dataclass(frozen=True)
class DdpBucket:
    """One gradient bucket DDP really built, in the order it reduces them (bucket 0 first)."""

    bytes: int
    params: int | None
    """How many parameters it holds (None where DDP's logging data does not say)."""


def ddp_buckets(ddp: DistributedDataParallel) -> list[DdpBucket] | None:
    """The buckets DDP reduces with, from its reducer's logging data (``_get_ddp_logging_data``):
    the rebuilt ones once DDP has rebuilt its buckets (after the first iteration, in the order the
    gradients became ready), else those it started with. Exact for every algorithm, since every
    one of them runs DDP's reducer. None on a torch outside :data:`SUPPORTED_TORCH` or whose
    logging data lacks the sizes: the figures are a record, not a reason to fail a case."""
    try:
        require_supported_torch()
    except RuntimeError:
        return None
    data = ddp._get_ddp_logging_data()
    rebuilt = bool(data.get("has_rebuilt_buckets")) and data.get("rebuilt_bucket_sizes")
    sizes = data.get("rebuilt_bucket_sizes") if rebuilt else data.get("bucket_sizes")
    if not isinstance(sizes, str) or not sizes.strip():
        return None
    indices = data.get("rebuilt_per_bucket_param_indices", "") if rebuilt else ""
    counts: list[int | None] = [len(b.split()) for b in indices.split(",")] if indices else []
    byte_sizes = [int(b) for b in sizes.split(",")]
    if len(counts) != len(byte_sizes):
        counts = [None] * len(byte_sizes)
    return [DdpBucket(b, n) for b, n in zip(byte_sizes, counts)]


@dataclass(frozen=True)
class Shard:
    """A contiguous run of one DDP bucket's parameters that one rank steps and then broadcasts."""

    bucket: int
    """DDP bucket index (the order DDP reduces buckets in)."""
    rank: int
    """Rank within ZeRO's process group that owns these parameters."""
    start: int
    """Index of the first parameter in the bucket's parameter list."""
    stop: int
    """One past the last parameter's index."""


@dataclass(frozen=True)
class InstalledShard:
    """A :class:`Shard` after ZeRO has taken it over."""

    shard: Shard
    flat: torch.Tensor
    """The contiguous tensor the shard's parameters now live in: the broadcast buffer."""
    local_offset: int | None
    """Index of the shard's first parameter in this rank's local optimizer, ``None`` if another rank owns it."""


class ZeroInternals:
    """The private side of one ``ZeroRedundancyOptimizer`` built with ``overlap_with_ddp=True``."""

    def __init__(self, zero: ZeroRedundancyOptimizer) -> None:
        require_supported_torch()
        _require([name for name in _ZERO_PRIVATE_ATTRS if not hasattr(zero, name)], "ZeroRedundancyOptimizer")
        _require([] if hasattr(torch.autograd, "_profiler_enabled") else ["_profiler_enabled"], "torch.autograd")
        self._zero = zero
        self._types = _zero_private_types()

    @property
    def overlap_with_ddp(self) -> bool:
        return bool(self._zero._overlap_with_ddp)

    @property
    def initialized(self) -> bool:
        return self._zero._overlap_info.status == self._types.status.INITIALIZED

    def install(
        self, params_per_bucket: list[list[torch.Tensor]], shards: list[Shard], shard_buckets: bool
    ) -> list[InstalledShard]:
        """Hand ZeRO the final DDP bucketing and the parameter partition chosen by the caller.

        This does what ``ZeroRedundancyOptimizer._init_zero_for_overlap`` does, except that the
        partition is ``shards`` rather than ZeRO's own heuristic (which, with ``shard_buckets``,
        fails with "All indices are disallowed" when a bucket splits into more pieces than there
        are ranks). Afterwards ZeRO's own bookkeeping (partition, buckets, parameter groups) is
        that of a fully initialised optimizer, and each parameter's data lives in its shard's flat
        tensor so that one broadcast per shard syncs it. Its state-dict methods fail as they do under
        PyTorch's own hooks: the local optimizer is a functional one, which has no ``state_dict``.
        """
        zero = self._zero
        if self.initialized:
            raise RuntimeError("this ZeroRedundancyOptimizer is already overlapped with a DDP model")
        info = zero._overlap_info
        zero._clear_cache()
        assignments: list[dict[int, Any]] = [{} for _ in range(zero.world_size)]
        params_per_rank: list[list[torch.Tensor]] = [[] for _ in range(zero.world_size)]
        assigned_ranks: list[set[int]] = [set() for _ in params_per_bucket]
        offsets: dict[int, int] = {}
        for s in shards:
            params = params_per_bucket[s.bucket][s.start : s.stop]
            assignments[s.rank][s.bucket] = self._types.assignment(s.bucket, params, s.start)
            if s.rank == zero.rank:
                offsets[s.bucket] = len(params_per_rank[s.rank])
            params_per_rank[s.rank].extend(params)
            assigned_ranks[s.bucket].add(s.rank)
        info.status = self._types.status.INITIALIZED
        info.shard_buckets = shard_buckets
        info.params_per_bucket = [list(ps) for ps in params_per_bucket]
        info.total_size = sum(p.numel() for ps in params_per_bucket for p in ps) if shard_buckets else None
        info.params_per_rank = params_per_rank
        info.assigned_ranks_per_bucket = assigned_ranks
        info.offsets = offsets
        info.num_bucket_assignments = len(shards)
        zero._bucket_assignments_per_rank_cache = assignments
        zero._partition_parameters(params_per_rank)
        zero._build_ddp_param_buckets()
        zero._init_local_optimizer()

        local_index = {id(p): i for i, p in enumerate(zero.optim.param_groups[0]["params"])}
        installed = []
        for s in shards:
            assignment = assignments[s.rank][s.bucket]
            local_offset = None
            if s.rank == zero.rank:
                local_offset = local_index[id(assignment.parameters[0])]
                run = zero.optim.param_groups[0]["params"][local_offset : local_offset + s.stop - s.start]
                if [id(p) for p in run] != [id(p) for p in assignment.parameters]:
                    raise RuntimeError("ZeRO's local optimizer does not hold a shard's parameters contiguously")
            installed.append(InstalledShard(s, assignment.tensor, local_offset))
        return installed

    @property
    def num_local_params(self) -> int:
        """Length of the gradient list :meth:`local_step` expects."""
        return len(self._zero.optim.param_groups[0]["params"])

    def local_step(self, gradients: list[torch.Tensor | None]) -> None:
        """Step this rank's local (functional) optimizer; ``None`` entries are left untouched.

        Goes through ZeRO's own ``_local_step``, as PyTorch's hooks do, so the two step alike. That
        includes what they do not do: the functional optimizers read their hyperparameters from
        their construction arguments, so a learning-rate scheduler on ``zero.param_groups`` changes
        ``zero.optim.param_groups`` but not the step.
        """
        self._zero._local_step(gradients)


def zero_local_optimizer(zero: ZeroRedundancyOptimizer) -> Any:
    """The optimizer that steps this rank's shard (a functional one with ``overlap_with_ddp``):
    its ``param_groups`` are the parameters this rank steps, its ``state`` the state it holds."""
    return zero.optim


def zero_partition(zero: ZeroRedundancyOptimizer) -> list[tuple[int, int | None, int, list[torch.Tensor]]]:
    """Which rank steps which parameters: ``(rank, bucket, first index in the bucket, parameters)``.

    With ``overlap_with_ddp`` one entry per (rank, DDP bucket) that rank steps part of, read from
    ZeRO's bucket-assignment cache (filled when the hooks install their partition); without it
    one entry per rank with ``bucket`` None, from ZeRO's own greedy partition of the parameters.
    """
    if zero._overlap_with_ddp:
        return [
            (rank, bucket, a.offset, list(a.parameters))
            for rank, per_bucket in enumerate(zero._bucket_assignments_per_rank_cache)
            for bucket, a in sorted(per_bucket.items())
        ]
    return [
        (rank, None, 0, [p for group in groups for p in group["params"]])
        for rank, groups in enumerate(zero._partition_parameters())
    ]
