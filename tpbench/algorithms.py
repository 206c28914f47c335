"""The registry of sweepable algorithms: name → how to wrap a model for one case.

An algorithm turns a freshly built model into a ``Training``: the DDP module to call, what to do
after backward (optimizer step, model averaging). The worker drives every algorithm with the same
loop, so step times are comparable across them.

Each ``Algorithm`` also declares which algorithm-specific suite keys it uses (``uses``); the suite
collapses the others so that, say, ``shard_buckets`` never doubles the ``ddp`` cases.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

if TYPE_CHECKING:
    from tpbench.suite import Case

# Keys that only some algorithms use; every other case key applies to all of them.
ALGORITHM_SPECIFIC_KEYS = frozenset(
    {"impl", "shard_buckets", "start_localSGD_iter", "post_local_gradient_allreduce", "averaging_period", "ranks_per_node"}
)

OPTIMIZERS: dict[str, Callable[..., type[torch.optim.Optimizer]]] = {
    "adamw": lambda: torch.optim.AdamW,
    "adam": lambda: torch.optim.Adam,
    "sgd": lambda: torch.optim.SGD,
}


@dataclass
class Training:
    """What the worker drives each step: ``model(x)``, backward, then ``after_backward()``."""

    model: torch.nn.Module
    after_backward: Callable[[], None]
    # Model averaging or anything else that runs after the optimizer step; its own phase in traces.
    after_step: Callable[[], None] | None = None
    # Extra per-step columns (e.g. parameter drift before averaging), read after the step's timer stops.
    metrics: Callable[[], dict[str, float]] | None = None


@dataclass(frozen=True)
class BuildContext:
    """Everything an algorithm needs to wrap one model for one case on one rank."""

    case: Case
    device: torch.device
    rank: int = 0
    world_size: int = 1
    process_group: dist.ProcessGroup | None = None


@dataclass(frozen=True)
class Algorithm:
    name: str
    description: str
    build: Callable[[torch.nn.Module, BuildContext], Training]
    uses: frozenset[str] = field(default_factory=frozenset)
    # ZeRO's overlap hooks spend their first iterations collecting buckets; fewer warm-up steps
    # would time vacuous iterations.
    min_warmup_steps: int = 0
    # Backends on which PyTorch's own implementation runs (impl = "torch"); empty: no torch impl.
    torch_impl_backends: frozenset[str] = frozenset()

    def check(self, case: Case) -> str | None:
        """Why ``case`` cannot run with this algorithm, or None. Messages name the key and the rule."""
        if case.warmup_steps < self.min_warmup_steps:
            return f"warmup_steps: {self.name} needs at least {self.min_warmup_steps} (got {case.warmup_steps})"
        if case.impl == "torch" and case.backend not in self.torch_impl_backends:
            where = ", ".join(sorted(self.torch_impl_backends)) or "no backend"
            return f"impl: PyTorch's own {self.name} runs on {where}, not on {case.backend}"
        if case.shard_buckets and case.world_size < 2:
            return "shard_buckets: sharding buckets needs world_size >= 2"
        return None


def make_optimizer(case: Case, params) -> torch.optim.Optimizer:
    return OPTIMIZERS[case.optimizer]()(params, lr=case.lr)


def _ddp(model: torch.nn.Module, ctx: BuildContext) -> DDP:
    case = ctx.case
    return DDP(
        model,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        process_group=ctx.process_group,
        bucket_cap_mb=case.bucket_cap_mb,
        gradient_as_bucket_view=case.gradient_as_bucket_view,
        static_graph=case.static_graph,
    )


def _step_and_zero(optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    def after_backward() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return after_backward


def build_ddp(model: torch.nn.Module, ctx: BuildContext) -> Training:
    ddp = _ddp(model, ctx)
    return Training(ddp, _step_and_zero(make_optimizer(ctx.case, ddp.parameters())))


def build_zero_no_overlap(model: torch.nn.Module, ctx: BuildContext) -> Training:
    ddp = _ddp(model, ctx)
    zero = ZeroRedundancyOptimizer(
        ddp.parameters(),
        optimizer_class=OPTIMIZERS[ctx.case.optimizer](),
        process_group=ctx.process_group,
        overlap_with_ddp=False,
        lr=ctx.case.lr,
    )
    return Training(ddp, _step_and_zero(zero))


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in [
        Algorithm("ddp", "DDP all-reduce, full optimizer on every rank", build_ddp),
        Algorithm(
            "zero_no_overlap",
            "DDP + ZeroRedundancyOptimizer stepped after backward (no overlap)",
            build_zero_no_overlap,
        ),
    ]
}
