"""Reference implementations of PyTorch's documented DDP communication hooks.

This package imports nothing else of tpbench: copy ``from tpbench.hooks import ...`` into any
training script.
"""

from typing import Any

from tpbench.hooks.averaging import (
    HierarchicalModelAverager,
    ParameterDrift,
    PeriodicModelAverager,
    average_parameters,
    average_parameters_or_parameter_groups,
    get_params_to_average,
    parameter_drift,
)
from tpbench.hooks.localsgd import (
    PostLocalSGDState,
    intra_node_subgroup,
    post_localSGD_hook,
    resolve_ranks_per_node,
)

__all__ = [
    "HierarchicalModelAverager",
    "ParameterDrift",
    "PeriodicModelAverager",
    "PostLocalSGDState",
    "average_parameters",
    "average_parameters_or_parameter_groups",
    "get_params_to_average",
    "hook_with_zero_step",
    "hook_with_zero_step_interleaved",
    "intra_node_subgroup",
    "parameter_drift",
    "post_localSGD_hook",
    "resolve_ranks_per_node",
]


def __getattr__(name: str) -> Any:
    """The ZeRO hooks, imported on first use: their module imports ``torch.distributed.optim`` (over a
    second) for the real ``ZeroRedundancyOptimizer`` annotation, which a rank of a case without ZeRO,
    or a script using only post-local SGD, should not pay for."""
    if name in ("hook_with_zero_step", "hook_with_zero_step_interleaved"):
        from tpbench.hooks import zero

        return getattr(zero, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
