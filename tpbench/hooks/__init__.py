"""Reference implementations of PyTorch's documented DDP communication hooks.

This package imports nothing else of tpbench: copy ``from tpbench.hooks import ...`` into any
training script.
"""

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
    "intra_node_subgroup",
    "parameter_drift",
    "post_localSGD_hook",
    "resolve_ranks_per_node",
]

from tpbench.hooks.zero import hook_with_zero_step, hook_with_zero_step_interleaved

__all__ += ["hook_with_zero_step", "hook_with_zero_step_interleaved"]
