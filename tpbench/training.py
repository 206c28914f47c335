"""How each algorithm of ``tpbench.algorithms`` wraps a model for one case: the torch side.

An algorithm turns a freshly built model into a ``Training``: the DDP module to call, what to do
after backward (optimizer step, model averaging). The worker drives every algorithm with the same
loop, so step times are comparable across them. Only the worker imports this module; everything
that validates, reports or compares reads the torch-free declarations in ``tpbench.algorithms``.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from tpbench import comm_hooks
from tpbench.comm_hooks import ALLREDUCE
from tpbench.hooks import _torch_private as private
from tpbench.suite import DDP_DEFAULT

if TYPE_CHECKING:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from tpbench.suite import Case

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
    # stops. The reserved keys ``untimed_ms`` and ``untimed_cpu_ms`` are the wall and CPU time
    # spent measuring inside the step, which the worker subtracts from the step's times.
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


def build(model: torch.nn.Module, ctx: BuildContext) -> Training:
    """``model`` wrapped by the case's algorithm."""
    return BUILDERS[ctx.case.algorithm](model, ctx)


def make_optimizer(case: Case, params) -> torch.optim.Optimizer:
    return OPTIMIZERS[case.optimizer]()(params, lr=case.lr)


def hook_state(case: Case, process_group: dist.ProcessGroup | None) -> Any:
    """The state DDP passes to the hook: the user's factory's, else the process group."""
    if case.comm_hook_state is None:
        return process_group
    return comm_hooks.load(case.comm_hook_state, 1)(process_group)


def comm_hook(case: Case) -> Callable[..., Any]:
    """The case's hook as a function, ``allreduce_hook`` for ``"allreduce"`` (what the ZeRO hooks wrap)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    builtin = {
        ALLREDUCE: default_hooks.allreduce_hook,
        "fp16_compress": default_hooks.fp16_compress_hook,
        "bf16_compress": default_hooks.bf16_compress_hook,
    }
    if case.comm_hook in builtin:
        return builtin[case.comm_hook]
    return _returns_future(case.comm_hook, comm_hooks.load(case.comm_hook, 2))


def _returns_future(path: str, hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook`` (the user's), failing its case by name when it returns anything but a Future, or a
    Future whose value is not one tensor of the bucket's size.

    PyTorch's reducer takes a hook's return value on trust: ``None`` crashes the rank with SIGSEGV,
    and a value of the wrong size fails deep inside DDP ("setStorage: ... out of bounds") or the
    ZeRO hooks' slicing, or, where it is a view of the bucket, passes unnoticed; none of which
    names the hook. The type check costs one Python call per bucket. The value is known only once
    the collective completes, so it is checked in a callback chained to the future, in the first
    backward pass only (until the last bucket): that pass is a warm-up step (a hook of one's own
    needs ``warmup_steps`` >= 1), so the timed steps' futures stay as the hook made them.
    ``functools.wraps`` keeps the hook's name and signature, which DDP inspects when it registers it.
    """
    first_pass = True

    @functools.wraps(hook)
    def checked(state: Any, bucket: dist.GradBucket) -> Any:
        nonlocal first_pass
        fut = hook(state, bucket)
        if not private.is_future(fut):
            raise TypeError(
                f"comm_hook {path}: returned {type(fut).__name__}, expected a torch.futures.Future "
                "whose value is the bucket's reduced tensor"
            )
        if not first_pass:
            return fut
        first_pass = not bucket.is_last()
        return fut.then(functools.partial(_bucket_sized, path, bucket.index(), bucket.buffer().numel()))

    return checked


def _bucket_sized(path: str, index: int, numel: int, fut: torch.futures.Future) -> Any:
    """``fut``'s value, when it is what DDP's docs ask of a hook: "a single tensor that has the same
    shape with the tensors inside grad bucket". A one-tensor list, as a collective's future holds, is
    not: DDP's reducer fails on it ("Unable to cast [tensor(...)] to Tensor"), naming no hook."""
    value = fut.value()
    if isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], torch.Tensor):
        raise ValueError(
            f"comm_hook {path}: its future's value for bucket {index} is a {type(value).__name__} of one tensor, "
            "expected the tensor itself: a collective's future holds a list, so chain "
            ".then(lambda fut: fut.value()[0]) as PyTorch's allreduce_hook does"
        )
    if isinstance(value, torch.Tensor) and value.numel() == numel:
        return value
    got = f"a tensor of {value.numel()} elements" if isinstance(value, torch.Tensor) else type(value).__name__
    raise ValueError(
        f"comm_hook {path}: its future's value for bucket {index} is {got}, expected one tensor of the "
        f"bucket's {numel} elements (the reduced bucket.buffer())"
    )


def register_comm_hook(ddp: DDP, case: Case, process_group: dist.ProcessGroup | None) -> None:
    """Register the case's hook on DDP directly; ``"allreduce"`` keeps DDP's built-in all-reduce."""
    if case.comm_hook != ALLREDUCE:
        ddp.register_comm_hook(hook_state(case, process_group), comm_hook(case))


def compress(case: Case, inner: Callable[..., Any]) -> Callable[..., Any]:
    """``inner`` (a hook that takes no inner hook, like post_localSGD_hook) with the case's
    compression around it, through PyTorch's fp16/bf16 wrappers; ``"allreduce"``: ``inner`` itself.
    A hook of one's own does not compose (refused at validation by the algorithm)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    wrappers = {
        "fp16_compress": default_hooks.fp16_compress_wrapper,
        "bf16_compress": default_hooks.bf16_compress_wrapper,
    }
    if case.comm_hook == ALLREDUCE:
        return inner
    if case.comm_hook not in wrappers:
        raise ValueError(f"comm_hook {case.comm_hook!r} cannot be composed with {getattr(inner, '__name__', inner)}")
    return wrappers[case.comm_hook](inner)


def bucketing(case: Case) -> dict[str, Any]:
    """DDP's bucket arguments for a case: ``bucket_cap_mb = "default"`` passes none (DDP's own 25 MB
    buckets and 1 MB first bucket), ``bucket_cap_mb_list`` only where set, so a torch without that
    argument still runs every other case."""
    if case.bucket_cap_mb_list is not None:
        return {"bucket_cap_mb_list": list(case.bucket_cap_mb_list)}
    if case.bucket_cap_mb == DDP_DEFAULT:
        return {}
    return {"bucket_cap_mb": case.bucket_cap_mb}


def _ddp(model: torch.nn.Module, ctx: BuildContext) -> DDP:
    case = ctx.case
    return DDP(
        model,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        process_group=ctx.process_group,
        gradient_as_bucket_view=case.gradient_as_bucket_view,
        static_graph=case.static_graph,
        find_unused_parameters=case.find_unused_parameters,
        **bucketing(case),
    )


def _step_and_zero(optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    def after_backward() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return after_backward


def _ddp_with_comm_hook(model: torch.nn.Module, ctx: BuildContext) -> DDP:
    """DDP with the case's ``comm_hook`` registered directly (``ddp``, ``zero_no_overlap``)."""
    ddp = _ddp(model, ctx)
    register_comm_hook(ddp, ctx.case, ctx.process_group)
    return ddp


def build_ddp(model: torch.nn.Module, ctx: BuildContext) -> Training:
    ddp = _ddp_with_comm_hook(model, ctx)
    optimizer = make_optimizer(ctx.case, ddp.parameters())
    return Training(ddp, _step_and_zero(optimizer), optimizer=optimizer)


def _zero(ddp: DDP, ctx: BuildContext, overlap_with_ddp: bool) -> ZeroRedundancyOptimizer:
    # Imported here: over a second of every rank's start, which only ZeRO cases need.
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(
        ddp.parameters(),
        optimizer_class=OPTIMIZERS[ctx.case.optimizer](),
        process_group=ctx.process_group,
        overlap_with_ddp=overlap_with_ddp,
        # Ignored (with a warning) by PyTorch under overlap_with_ddp: the suite collapses it there.
        parameters_as_bucket_view=bool(ctx.case.parameters_as_bucket_view),
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
        hook = wrap(comm_hook(ctx.case), ddp, zero, shard_buckets=bool(ctx.case.shard_buckets))
        ddp.register_comm_hook(hook_state(ctx.case, ctx.process_group), hook)
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
            f'this world\'s nodes have {"/".join(map(str, sizes))} ranks each; use "auto" (the real nodes) or a divisor'
        )
    return [list(n[i : i + ranks_per_node]) for n in nodes for i in range(0, len(n), ranks_per_node)]


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
    one's own is refused by ``tpbench.algorithms.Algorithm.check``). Node subgroups come from the
    world's real nodes (``ctx.nodes``), split further when ``ranks_per_node`` emulates smaller ones.

    The order is PyTorch's documented one: ``optimizer.step()``, then
    ``averager.average_parameters()``, and only then are the gradients cleared, because both
    implementations' averagers average only the parameters that have a gradient. At each
    averaging step the drift across ranks (and each rank's parameter norm) is measured just before
    averaging, and the parameter norm again just after it (equal on every rank of the averaging
    group when averaging worked); the time that takes is reported as ``untimed_ms`` (wall) and
    ``untimed_cpu_ms`` and left out of the step's times; traced steps do not measure it. An
    averaging step at which the averager would average no parameter fails the case
    (``AveragingSkipped``) instead of silently training without averaging.
    """
    case = ctx.case
    if case.start_localSGD_iter == "never":
        return build_ddp(model, ctx)
    from tpbench.hooks import PeriodicModelAverager

    state_cls, hook, averager_cls, chosen_by_averager = _post_localsgd_impl(case.impl)
    ddp = _ddp(model, ctx)
    subgroup = _intra_node_subgroup(ctx, case.ranks_per_node)
    state = state_cls(
        process_group=None,
        subgroup=subgroup,
        start_localSGD_iter=case.start_localSGD_iter,
        post_local_gradient_allreduce=case.post_local_gradient_allreduce,
    )
    ddp.register_comm_hook(state, compress(case, hook))
    optimizer = make_optimizer(case, ddp.parameters())
    averager = averager_cls(period=case.averaging_period, warmup_steps=case.start_localSGD_iter)
    # Same schedule as the averager, kept by us so both implementations are measured alike.
    schedule = PeriodicModelAverager(period=case.averaging_period, warmup_steps=case.start_localSGD_iter)
    measured: dict[str, float] = {}

    def before_averaging() -> None:
        measured.update(_before_averaging(list(ddp.parameters()), schedule.step, chosen_by_averager))

    def after_averaging() -> None:
        t0, cpu0 = time.perf_counter_ns(), time.process_time_ns()
        measured["param_norm_averaged_l2"] = _param_norm(ddp.parameters())
        measured["untimed_ms"] += (time.perf_counter_ns() - t0) / 1e6
        measured["untimed_cpu_ms"] += (time.process_time_ns() - cpu0) / 1e6

    def after_step() -> None:
        # Traced steps measure no drift: the timed steps leave its time out (``untimed_ms``), so a
        # trace holding its collectives would count them as the case's communication.
        measure = schedule.next_averaging_group() is not None and not private.profiler_enabled()
        if measure:
            before_averaging()
        schedule.step += 1
        averager.average_parameters(ddp.parameters())
        if measure:
            after_averaging()
        optimizer.zero_grad(set_to_none=True)

    def metrics() -> dict[str, float]:
        out = dict(measured)
        measured.clear()
        return out

    return Training(ddp, optimizer.step, after_step=after_step, metrics=metrics, optimizer=optimizer)


def _post_localsgd_impl(impl: str) -> tuple[Any, Callable, Any, Callable]:
    """Post-local SGD's state class, hook, averager class and the averager's choice of parameters:
    PyTorch's (``impl = "torch"``) or tpbench's reference ones."""
    if impl == "torch":
        from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as torch_hook
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager as TorchAverager
        from torch.distributed.algorithms.model_averaging.utils import get_params_to_average

        return torch_hook.PostLocalSGDState, torch_hook.post_localSGD_hook, TorchAverager, get_params_to_average
    from tpbench.hooks import PeriodicModelAverager, PostLocalSGDState, post_localSGD_hook
    from tpbench.hooks.averaging import get_params_to_average

    return PostLocalSGDState, post_localSGD_hook, PeriodicModelAverager, get_params_to_average


def _before_averaging(params: list[torch.nn.Parameter], step: int, chosen_by_averager: Callable) -> dict[str, float]:
    """Just before an averaging step: the drift across ranks and this rank's parameter norm, with the
    time measuring took (``untimed_ms``, ``untimed_cpu_ms``). ``AveragingSkipped`` when the
    averager would average no parameter (none has a gradient)."""
    from tpbench.hooks import parameter_drift

    t0, cpu0 = time.perf_counter_ns(), time.process_time_ns()
    if not chosen_by_averager(params):
        raise AveragingSkipped(
            f"post_localSGD_hook: model averaging is due at step {step} but the averager would average "
            f"none of the {len(params)} parameters "
            "(it averages only parameters with a gradient, and none has one): "
            "gradients must still be present when average_parameters runs"
        )
    drift = parameter_drift(params)
    return dict(
        drift_max_l2=drift.max_l2,
        drift_mean_l2=drift.mean_l2,
        param_norm_l2=_param_norm(params),
        untimed_ms=(time.perf_counter_ns() - t0) / 1e6,
        untimed_cpu_ms=(time.process_time_ns() - cpu0) / 1e6,
    )


# Each algorithm of ``tpbench.algorithms.ALGORITHMS`` by name (a test keeps the two tables alike).
BUILDERS: dict[str, Callable[[torch.nn.Module, BuildContext], Training]] = {
    "ddp": build_ddp,
    "zero_no_overlap": build_zero_no_overlap,
    "hook_with_zero_step": _zero_hook_builder(interleaved=False),
    "hook_with_zero_step_interleaved": _zero_hook_builder(interleaved=True),
    "post_localSGD_hook": build_post_localsgd,
}
