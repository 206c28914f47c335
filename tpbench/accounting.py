"""Exact memory and work per rank, counted from the tensors: what ZeRO shards and how evenly.

Process RSS says little on CPU (the runtime dominates it, about the same for every case), and
the CUDA allocator's peak mixes activations in. What ZeRO changes is the optimizer state each
rank holds and the share of the step each rank does; both are read here from the optimizer a
case really built, once per case after its timed steps (never inside one).

Per rank: bytes of parameters, of gradients (one tensor of each parameter's shape and dtype:
every DDP rank holds full gradients, and ZeRO stage 1 does not shard them; DDP's communication
buckets hold another copy unless ``gradient_as_bucket_view``), of optimizer state (every tensor
in the optimizer's state: AdamW's ``exp_avg``, ``exp_avg_sq`` and ``step``), and the parameters
this rank's optimizer steps. For ZeRO cases also the partition: which rank steps which run of
which DDP bucket (hooks) or which parameters (``zero_no_overlap``). For every case the gradient
buckets DDP really built (table ``ddp_buckets``): what ``bucket_cap_mb`` asked for is a cap, and
the buckets DDP fills up to it (and past it by up to one tensor) are what the step communicates.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch.nn.parallel import DistributedDataParallel

from tpbench import store
from tpbench.hooks import _torch_private as private


@dataclass(frozen=True)
class RankAccount:
    """One rank's exact figures for one case."""

    rank: int
    param_bytes: int
    grad_bytes: int
    optimizer_state_bytes: int
    stepped_params: int
    """Elements of the parameters this rank's optimizer steps."""
    stepped_tensors: int


@dataclass(frozen=True)
class PartitionRun:
    """A run of parameters one rank steps: part of a DDP bucket (hooks) or, with ``bucket`` None,
    the rank's whole share (``zero_no_overlap``)."""

    rank: int
    bucket: int | None
    first: int
    """Index of the run's first parameter in the bucket (0 for a whole share)."""
    tensors: int
    params: int


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _is_zero(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` is a ``ZeroRedundancyOptimizer``, without importing it (over a second
    of every rank's start): where its module was never imported, nothing can be one."""
    module = sys.modules.get("torch.distributed.optim.zero_redundancy_optimizer")
    return module is not None and isinstance(optimizer, module.ZeroRedundancyOptimizer)


def _local_optimizer(optimizer: torch.optim.Optimizer) -> Any:
    return private.zero_local_optimizer(optimizer) if _is_zero(optimizer) else optimizer


def measure(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int
) -> tuple[RankAccount, list[PartitionRun]]:
    """This rank's figures, and (for ZeRO, the same on every rank) the partition."""
    params = [p for p in model.parameters()]
    local = _local_optimizer(optimizer)
    stepped = [p for group in local.param_groups for p in group["params"]]
    state = sum(_bytes(v) for s in local.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    account = RankAccount(
        rank=rank,
        param_bytes=sum(_bytes(p) for p in params),
        grad_bytes=sum(_bytes(p) for p in params if p.requires_grad),
        optimizer_state_bytes=state,
        stepped_params=sum(p.numel() for p in stepped),
        stepped_tensors=len(stepped),
    )
    runs: list[PartitionRun] = []
    if _is_zero(optimizer):
        runs = [
            PartitionRun(r, bucket, first, len(ps), sum(p.numel() for p in ps))
            for r, bucket, first, ps in private.zero_partition(optimizer)
        ]
    return account, runs


def write_ddp_buckets(run_dir: Path, case_id: str, model: torch.nn.Module) -> None:
    """Store the buckets ``model`` (a DDP module, after its buckets were rebuilt) reduces with:
    table ``ddp_buckets``, one row per bucket (bucket, bytes, params). The same on every rank."""
    buckets = private.ddp_buckets(model) if isinstance(model, DistributedDataParallel) else None
    if buckets:
        df = pd.DataFrame([{"bucket": i, **asdict(b)} for i, b in enumerate(buckets)]).astype({"params": "Int64"})
        store.write_case_table(run_dir, case_id, "ddp_buckets", df)


def write(run_dir: Path, case_id: str, measured: list[tuple[RankAccount, list[PartitionRun]]]) -> None:
    """Store every rank's figures (table ``memory``) and the partition (table ``partition``, ZeRO only)."""
    store.write_case_table(run_dir, case_id, "memory", pd.DataFrame([asdict(a) for a, _ in measured]))
    runs = measured[0][1]
    if runs:
        df = pd.DataFrame([asdict(r) for r in runs]).astype({"bucket": "Int64"})
        store.write_case_table(run_dir, case_id, "partition", df)
