"""Model averagers for post-local SGD, and a measure of how far ranks drift apart between them.

References for ``torch.distributed.algorithms.model_averaging``: ``PeriodicModelAverager`` and
``HierarchicalModelAverager``. Both count one ``step`` per ``average_parameters`` call (one per
training iteration) exactly as PyTorch does, and average with the same arithmetic (flatten,
divide by the group size, allreduce), so a run with PyTorch's averager and one with these give
identical parameters. Like PyTorch, the averagers leave out parameters without a gradient (they
were not trained, so averaging them is wasted traffic); ``average_parameters`` itself averages
every parameter it is given, as PyTorch's does.

Unlike PyTorch, averaged values are copied back into the existing parameter tensors instead of
re-pointing ``param.data`` at slices of one flat buffer; the numbers are the same, and parameters
keep their own storage (optimizers and DDP hold references to it).
"""

from __future__ import annotations

import logging
import warnings
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

ParamsOrGroups = Iterable[torch.nn.Parameter] | Iterable[dict]


def get_params_to_average(params: ParamsOrGroups) -> list[torch.Tensor]:
    """The parameters that have a gradient, from ``model.parameters()`` or ``optimizer.param_groups``;
    ``NotImplementedError`` for anything else, as PyTorch's."""
    chosen: list[torch.Tensor] = []
    for item in params:
        if isinstance(item, torch.Tensor):
            candidates: Iterable[torch.Tensor] = (item,)
        elif isinstance(item, dict):
            candidates = item["params"]
        else:
            # NotImplementedError, as PyTorch's raises: code written against it catches that.
            raise NotImplementedError(f"Parameter input of type {type(item)} is not supported")
        chosen.extend(p for p in candidates if p.grad is not None)
    return chosen


def _in_group(group: dist.ProcessGroup | None) -> bool:
    return dist.get_rank(group) >= 0


def average_parameters(params: Iterable[torch.Tensor], process_group: dist.ProcessGroup | None = None) -> None:
    """Replace every given parameter by its mean over ``process_group`` (``None``: global), as
    PyTorch's ``model_averaging.utils.average_parameters`` does, gradient or not (the averagers
    leave out parameters without one: ``average_parameters_or_parameter_groups``).

    All tensors travel in one flat buffer: one allreduce instead of one per parameter. A rank
    outside ``process_group`` returns without touching anything.
    """
    if not _in_group(process_group):
        return
    tensors = list(params)
    if any(not isinstance(t, torch.Tensor) for t in tensors):
        raise TypeError(
            "average_parameters takes tensors; for optimizer.param_groups use average_parameters_or_parameter_groups"
        )
    if not tensors:
        return
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    flat.div_(dist.get_world_size(process_group))
    if flat.device.type == "cuda":
        # The parameters were just written by the optimizer on the compute stream; the
        # communication stream must not read them before that finishes.
        torch.cuda.synchronize(flat.device)
    dist.all_reduce(flat, group=process_group)
    offset = 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def average_parameters_or_parameter_groups(
    params: ParamsOrGroups, process_group: dist.ProcessGroup | None = None
) -> None:
    """Average the parameters that have a gradient, from ``model.parameters()`` or
    ``optimizer.param_groups`` (PyTorch's function of the same name; what the averagers call)."""
    average_parameters(get_params_to_average(params), process_group)


@dataclass(frozen=True)
class ParameterDrift:
    """How far ranks' parameters are apart: L2 distance of each rank's flat parameters to the group mean."""

    max_l2: float
    mean_l2: float


def parameter_drift(params: Iterable[torch.Tensor], group: dist.ProcessGroup | None = None) -> ParameterDrift:
    """Spread of the parameters across the ranks of ``group`` (``None``: global); the same on every rank.

    A collective: every rank of ``group`` must call it. Call it just before averaging to see what
    local steps cost in agreement. Computed in float64 so that identical parameters give exactly
    zero drift (a float32 mean of equal values can round away from them). Costs one allreduce of
    the parameters (in float64) plus one of a float64 per rank: each rank's distance in its own
    slot, zeros elsewhere, so the sum is every distance exactly. (An all_gather of the scalars did
    the same, but Gloo's trace records a list input without its size, and the run's bytes per step
    came out unknown wherever a traced step held it.)
    """
    tensors = list(params)
    n = dist.get_world_size(group)
    flat = torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])
    mean = flat.clone()
    dist.all_reduce(mean, group=group)
    mean.div_(n)
    distances = torch.zeros(n, dtype=torch.float64)
    distances[dist.get_rank(group)] = torch.linalg.vector_norm(flat - mean)
    dist.all_reduce(distances, group=group)
    return ParameterDrift(max_l2=distances.max().item(), mean_l2=distances.mean().item())


def _warn_if_pointless(largest_period: int) -> None:
    if largest_period == 1:
        warnings.warn(
            "averaging parameters every step costs at least as much as DDP's gradient allreduce; use plain DDP instead",
            stacklevel=3,
        )


class PeriodicModelAverager:
    """Averages parameters over ``process_group`` every ``period`` steps once ``warmup_steps`` have passed.

    Call ``average_parameters(model.parameters())`` after each ``optimizer.step()``: the call at
    step ``s`` (counted from 0) averages exactly when ``s >= warmup_steps`` and
    ``(s - warmup_steps) % period == 0``. With post-local SGD, ``warmup_steps`` should equal
    ``start_localSGD_iter``, so the first averaging happens on the first local step.
    """

    def __init__(self, period: int, warmup_steps: int = 0, process_group: dist.ProcessGroup | None = None) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if period < 1:
            raise ValueError(f"period must be >= 1, got {period}")
        _warn_if_pointless(period)
        self.period = period
        self.warmup_steps = warmup_steps
        # Resolved now (as PyTorch does) so that None can mean "no averaging due" below.
        self.process_group = process_group if process_group is not None else dist.group.WORLD
        self.step = 0

    def next_averaging_group(self) -> dist.ProcessGroup | None:
        """The group the next ``average_parameters`` call averages over, or ``None`` if it will not average.

        Lets a caller measure :func:`parameter_drift` over the right group just before averaging.
        """
        due = self.step >= self.warmup_steps and (self.step - self.warmup_steps) % self.period == 0
        return self.process_group if due else None

    def average_parameters(self, params: ParamsOrGroups) -> None:
        """Average ``params`` if this step is due, then advance ``step``."""
        group = self.next_averaging_group()
        if group is not None:
            average_parameters_or_parameter_groups(params, group)
        self.step += 1


def _consecutive_subgroup(group: dist.ProcessGroup, size: int) -> dist.ProcessGroup:
    """This rank's subgroup when ``group``'s ranks are cut into consecutive runs of ``size``.

    A collective over the default group. Built by enumeration rather than with
    ``new_subgroups(group=...)``, which older supported torch releases lack.
    """
    ranks = dist.get_process_group_ranks(group)
    if size < 1 or len(ranks) % size:
        raise ValueError(f"group size {size} does not divide the {len(ranks)} ranks of process_group")
    subgroup, _ = dist.new_subgroups_by_enumeration([ranks[i : i + size] for i in range(0, len(ranks), size)])
    return subgroup


class HierarchicalModelAverager:
    """Averages over groups of several sizes, each on its own period (hierarchical SGD).

    ``period_group_size_dict`` maps a period to a group size, smallest period first, e.g.
    ``{4: 8, 16: 16}``: groups of 8 consecutive ranks every 4 steps, all 16 ranks every 16 steps.
    The last size must be the size of ``process_group`` (the whole world when ``None``). At each
    step from ``warmup_steps`` on, only the largest period dividing ``step`` averages, since its
    group contains the smaller ones. As in PyTorch, periods count from step 0, not from
    ``warmup_steps``. Subgroups are created here, a collective over the default group.
    """

    def __init__(
        self,
        period_group_size_dict: Mapping[int, int] | None = None,
        warmup_steps: int = 0,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        # PyTorch's signature defaults it to None, refused here as there: no levels, nothing to average.
        if not period_group_size_dict:
            raise ValueError("period_group_size_dict must not be empty")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        periods = list(period_group_size_dict)
        if periods[0] < 1:
            raise ValueError(f"periods must be >= 1, got {periods[0]}")
        _warn_if_pointless(periods[-1])
        process_group = process_group if process_group is not None else dist.group.WORLD
        overall = dist.get_world_size(process_group)
        sizes = list(period_group_size_dict.values())
        if sizes[-1] != overall:
            raise ValueError(f"the last group size {sizes[-1]} must equal the size of process_group ({overall})")
        self.process_group = process_group
        self.warmup_steps = warmup_steps
        self.step = 0
        self.period_process_group_dict: OrderedDict[int, dist.ProcessGroup] = OrderedDict()
        for period, size in period_group_size_dict.items():
            logger.info(
                "groups of %s ranks average parameters every %s steps (unless a higher level does)", size, period
            )
            if size == overall:
                self.period_process_group_dict[period] = process_group
            else:
                self.period_process_group_dict[period] = _consecutive_subgroup(process_group, size)

    def next_averaging_group(self) -> dist.ProcessGroup | None:
        """The group the next ``average_parameters`` call averages over, or ``None`` if it will not average."""
        if self.step < self.warmup_steps:
            return None
        for period in reversed(self.period_process_group_dict):
            if self.step % period == 0:
                return self.period_process_group_dict[period]
        return None

    def average_parameters(self, params: ParamsOrGroups) -> None:
        """Average ``params`` over the group due at this step, if any, then advance ``step``."""
        group = self.next_averaging_group()
        if group is not None:
            average_parameters_or_parameter_groups(params, group)
        self.step += 1
