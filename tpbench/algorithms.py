"""The registry of sweepable algorithms: name → how to wrap a model for one case.

An algorithm turns a freshly built model into a ``Training``: the DDP module to call, what to do
after backward (optimizer step, model averaging). The worker drives every algorithm with the same
loop, so step times are comparable across them.

Each ``Algorithm`` also declares which algorithm-specific suite keys it uses (``uses``); the suite
collapses the others so that, say, ``shard_buckets`` never doubles the ``ddp`` cases.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import record_function

from tpbench import comm_hooks

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
    # Extra per-step columns (e.g. parameter drift before averaging), read after the step's timer
    # stops. The reserved key ``untimed_ms`` is time spent measuring inside the step, which the
    # worker subtracts from the step time.
    metrics: Callable[[], dict[str, float]] | None = None
    # The optimizer the case steps (a ZeroRedundancyOptimizer for ZeRO cases): its state and
    # partition are what tpbench.accounting counts.
    optimizer: torch.optim.Optimizer | None = None


@dataclass(frozen=True)
class BuildContext:
    """Everything an algorithm needs to wrap one model for one case on one rank."""

    case: Case
    device: torch.device
    rank: int = 0
    world_size: int = 1
    process_group: dist.ProcessGroup | None = None
    # The ranks of each real node (machine, or torchrun agent); None: all ranks on one node.
    nodes: tuple[tuple[int, ...], ...] | None = None


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
    # Keys that stop mattering for some values of others (returns the keys to collapse).
    moot: Callable[[dict], frozenset[str]] = lambda params: frozenset()
    # Whether the case registers a hook of the algorithm's own that takes no inner hook: then only
    # compression composes with it (see tpbench.comm_hooks), not a comm_hook of the user's.
    own_hook: Callable[[Case], bool] = lambda case: False
    # Whether the comm_hook is wrapped (the ZeRO hooks) rather than registered on DDP itself.
    wraps_comm_hook: bool = False

    def check(self, case: Case) -> str | None:
        """Why ``case`` cannot run with this algorithm, or None. Messages name the key and the rule."""
        if case.warmup_steps < self.min_warmup_steps:
            return f"warmup_steps: {self.name} needs at least {self.min_warmup_steps} (got {case.warmup_steps})"
        if case.impl == "torch" and case.backend not in self.torch_impl_backends:
            where = ", ".join(sorted(self.torch_impl_backends)) or "no backend"
            return f"impl: PyTorch's own {self.name} runs on {where}, not on {case.backend}"
        if case.shard_buckets and case.world_size < 2:
            return "shard_buckets: sharding buckets needs world_size >= 2"
        if self.own_hook(case) and comm_hooks.is_import_path(case.comm_hook):
            return (f"comm_hook: {self.name} registers its own hook, which takes no inner hook, so a hook of your own "
                    f"cannot be composed with it; expected \"allreduce\", \"fp16_compress\" or \"bf16_compress\" "
                    f"(PyTorch's compression wrappers around it), got {case.comm_hook!r}")
        return comm_hooks.check(case, wrapped=self.wraps_comm_hook)


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


def _ddp_with_comm_hook(model: torch.nn.Module, ctx: BuildContext) -> DDP:
    """DDP with the case's ``comm_hook`` registered directly (``ddp``, ``zero_no_overlap``)."""
    ddp = _ddp(model, ctx)
    comm_hooks.register(ddp, ctx.case, ctx.process_group)
    return ddp


def build_ddp(model: torch.nn.Module, ctx: BuildContext) -> Training:
    ddp = _ddp_with_comm_hook(model, ctx)
    optimizer = make_optimizer(ctx.case, ddp.parameters())
    return Training(ddp, _step_and_zero(optimizer), optimizer=optimizer)


def _zero(ddp: DDP, ctx: BuildContext, overlap_with_ddp: bool) -> ZeroRedundancyOptimizer:
    return ZeroRedundancyOptimizer(
        ddp.parameters(),
        optimizer_class=OPTIMIZERS[ctx.case.optimizer](),
        process_group=ctx.process_group,
        overlap_with_ddp=overlap_with_ddp,
        lr=ctx.case.lr,
    )


def build_zero_no_overlap(model: torch.nn.Module, ctx: BuildContext) -> Training:
    ddp = _ddp_with_comm_hook(model, ctx)
    zero = _zero(ddp, ctx, overlap_with_ddp=False)
    return Training(ddp, _step_and_zero(zero), optimizer=zero)


def _zero_hook_builder(interleaved: bool) -> Callable[[torch.nn.Module, BuildContext], Training]:
    def build(model: torch.nn.Module, ctx: BuildContext) -> Training:
        """DDP + ``ZeroRedundancyOptimizer(overlap_with_ddp=True)`` stepped inside the comm hook.

        The step happens during backward, so after backward only the gradients are cleared. The
        wrapped hook is the case's ``comm_hook``; ``impl = "torch"`` wraps it with PyTorch's own
        implementation.
        """
        if ctx.case.impl == "torch":
            from torch.distributed.algorithms.ddp_comm_hooks import ddp_zero_hook as impl
        else:
            from tpbench import hooks as impl
        wrap = impl.hook_with_zero_step_interleaved if interleaved else impl.hook_with_zero_step
        ddp = _ddp(model, ctx)
        zero = _zero(ddp, ctx, overlap_with_ddp=True)
        hook = wrap(comm_hooks.hook(ctx.case), ddp, zero, shard_buckets=bool(ctx.case.shard_buckets))
        ddp.register_comm_hook(comm_hooks.state(ctx.case, ctx.process_group), hook)
        return Training(ddp, lambda: zero.zero_grad(set_to_none=True), optimizer=zero)

    return build


def node_subgroups(nodes: tuple[tuple[int, ...], ...], ranks_per_node: int) -> list[list[int]]:
    """The rank lists of post-local SGD's intra-node subgroups: each real node split into
    consecutive runs of ``ranks_per_node`` ranks.

    ``ranks_per_node`` equal to the real node size gives the real nodes; a divisor of it emulates
    smaller nodes inside each machine (one machine's ranks as 2 nodes x 2 ranks). A subgroup never
    spans machines: a size that does not divide every node's is refused, since "intra-node"
    traffic between hosts would measure something else.
    """
    sizes = sorted({len(n) for n in nodes})
    if any(len(n) % ranks_per_node for n in nodes):
        raise ValueError(
            f"ranks_per_node = {ranks_per_node} would put ranks of different machines in one node subgroup: "
            f"this world's nodes have {'/'.join(map(str, sizes))} ranks each; use \"auto\" (the real nodes) or a divisor"
        )
    return [list(n[i:i + ranks_per_node]) for n in nodes for i in range(0, len(n), ranks_per_node)]


_SUBGROUPS: dict[int, dist.ProcessGroup] = {}


def _intra_node_subgroup(ctx: BuildContext, ranks_per_node: int) -> dist.ProcessGroup:
    """This rank's node subgroup, one per world and size: cases and repeats rebuild models, not groups.

    A collective over the default group (every rank creates every subgroup), so it is created on
    the same case by all ranks.
    """
    if ranks_per_node not in _SUBGROUPS:
        nodes = ctx.nodes or (tuple(range(ctx.world_size)),)
        _SUBGROUPS[ranks_per_node], _ = dist.new_subgroups_by_enumeration(node_subgroups(nodes, ranks_per_node))
    return _SUBGROUPS[ranks_per_node]


class AveragingSkipped(RuntimeError):
    """A model averaging step at which the averager would average nothing: training would silently
    run as local SGD without averaging, so the case fails instead."""


def _param_norm(params) -> float:
    """L2 norm of this rank's flat parameters, in float64: a training diagnostic that is also
    bit-identical exactly on the ranks whose parameters agree (who shares gradients shows in it)."""
    return float(torch.linalg.vector_norm(torch.cat([p.detach().reshape(-1).to(torch.float64) for p in params])))


def build_post_localsgd(model: torch.nn.Module, ctx: BuildContext) -> Training:
    """DDP with post-local SGD: global gradient averaging until ``start_localSGD_iter``, then
    node-local (or none), plus periodic model averaging after the optimizer step.

    ``start_localSGD_iter = "never"`` is plain DDP, the baseline every local-SGD case is judged
    against. ``comm_hook`` compression wraps ``post_localSGD_hook`` in PyTorch's
    ``fp16_compress_wrapper``/``bf16_compress_wrapper`` (the hook takes no inner hook, so a hook of
    one's own is refused by ``Algorithm.check``). Node subgroups come from the world's real nodes (``ctx.nodes``), split further when
    ``ranks_per_node`` emulates smaller ones.

    The order is PyTorch's documented one: ``optimizer.step()``, then
    ``averager.average_parameters()``, and only then are the gradients cleared, because both
    implementations' averagers average only the parameters that have a gradient. At each
    averaging step the drift across ranks (and each rank's parameter norm) is measured just before
    averaging, and the parameter norm again just after it (equal on every rank of the averaging
    group when averaging worked); the time that takes is reported as ``untimed_ms`` and left out
    of the step time. An averaging step at which the averager would average no parameter fails
    the case (``AveragingSkipped``) instead of silently training without averaging.
    """
    case = ctx.case
    if case.start_localSGD_iter == "never":
        return build_ddp(model, ctx)
    from tpbench.hooks import PeriodicModelAverager, parameter_drift

    if case.impl == "torch":
        from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as torch_hook
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager as TorchAverager
        from torch.distributed.algorithms.model_averaging.utils import get_params_to_average

        state_cls, hook, averager_cls = torch_hook.PostLocalSGDState, torch_hook.post_localSGD_hook, TorchAverager
        chosen_by_averager = get_params_to_average
    else:
        from tpbench.hooks import PostLocalSGDState, post_localSGD_hook
        from tpbench.hooks.averaging import get_params_to_average

        state_cls, hook, averager_cls = PostLocalSGDState, post_localSGD_hook, PeriodicModelAverager
        chosen_by_averager = get_params_to_average
    ddp = _ddp(model, ctx)
    subgroup = _intra_node_subgroup(ctx, case.ranks_per_node)
    state = state_cls(
        process_group=None, subgroup=subgroup, start_localSGD_iter=case.start_localSGD_iter,
        post_local_gradient_allreduce=case.post_local_gradient_allreduce,
    )
    ddp.register_comm_hook(state, comm_hooks.compress(case, hook))
    optimizer = make_optimizer(case, ddp.parameters())
    averager = averager_cls(period=case.averaging_period, warmup_steps=case.start_localSGD_iter)
    # Same schedule as the averager, kept by us so both implementations are measured alike.
    schedule = PeriodicModelAverager(period=case.averaging_period, warmup_steps=case.start_localSGD_iter)
    measured: dict[str, float] = {}

    def before_averaging() -> None:
        t0 = time.perf_counter_ns()
        params = list(ddp.parameters())
        if not chosen_by_averager(params):
            raise AveragingSkipped(
                f"post_localSGD_hook: model averaging is due at step {schedule.step} but the averager would average "
                f"none of the {len(params)} parameters (it averages only parameters with a gradient, and none has one): "
                "gradients must still be present when average_parameters runs"
            )
        with record_function("tpbench.drift"):  # its collectives, told apart from the averaging's in traces
            drift = parameter_drift(params)
        measured.update(drift_max_l2=drift.max_l2, drift_mean_l2=drift.mean_l2, param_norm_l2=_param_norm(params),
                        untimed_ms=(time.perf_counter_ns() - t0) / 1e6)

    def after_averaging() -> None:
        t0 = time.perf_counter_ns()
        measured["param_norm_averaged_l2"] = _param_norm(ddp.parameters())
        measured["untimed_ms"] += (time.perf_counter_ns() - t0) / 1e6

    def after_step() -> None:
        due = schedule.next_averaging_group() is not None
        if due:
            before_averaging()
        schedule.step += 1
        averager.average_parameters(ddp.parameters())
        if due:
            after_averaging()
        optimizer.zero_grad(set_to_none=True)

    def metrics() -> dict[str, float]:
        out = dict(measured)
        measured.clear()
        return out

    return Training(ddp, optimizer.step, after_step=after_step, metrics=metrics, optimizer=optimizer)


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in [
        Algorithm("ddp", "DDP all-reduce, full optimizer on every rank", build_ddp),
        Algorithm(
            "zero_no_overlap",
            "DDP + ZeroRedundancyOptimizer stepped after backward (no overlap)",
            build_zero_no_overlap,
        ),
        *(
            Algorithm(
                name,
                description,
                _zero_hook_builder(interleaved),
                uses=frozenset({"impl", "shard_buckets"}),
                # The first two iterations (three with static_graph) only collect buckets; we ask
                # for three always so that no timed step is a vacuous one.
                min_warmup_steps=3,
                # PyTorch's own ZeRO hooks refuse Gloo ("may meet hangs", pytorch#62300).
                torch_impl_backends=frozenset({"nccl"}),
                wraps_comm_hook=True,
            )
            for name, description, interleaved in [
                ("hook_with_zero_step", "ZeRO step overlapped with backward: all buckets stepped after the last one is reduced", False),
                ("hook_with_zero_step_interleaved", "ZeRO step overlapped with backward: each bucket stepped as soon as it is reduced", True),
            ]
        ),
        Algorithm(
            "post_localSGD_hook",
            "post-local SGD: global gradient averaging until start_localSGD_iter, then node-local, "
            "plus PeriodicModelAverager after the optimizer step",
            build_post_localsgd,
            uses=frozenset({"impl", "start_localSGD_iter", "post_local_gradient_allreduce", "averaging_period", "ranks_per_node"}),
            torch_impl_backends=frozenset({"gloo", "nccl"}),
            # "never" is plain DDP: nothing local-SGD-specific applies.
            moot=lambda p: frozenset({"impl", "post_local_gradient_allreduce", "averaging_period", "ranks_per_node"})
            if p["start_localSGD_iter"] == "never" else frozenset(),
            own_hook=lambda case: case.start_localSGD_iter != "never",
        ),
    ]
}
