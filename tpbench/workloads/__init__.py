"""Workloads: small, self-contained models with generated data (never downloaded).

Register a workload by adding its class to ``WORKLOADS``; the suite validates
``[workloads.NAME]`` tables against the class's ``Params`` dataclass.
"""

from tpbench.workloads.base import Workload, WorkloadContext
from tpbench.workloads.markov import MarkovChainLM
from tpbench.workloads.mlp import MLP

WORKLOADS: dict[str, type[Workload]] = {
    MLP.name: MLP,
    MarkovChainLM.name: MarkovChainLM,
}

__all__ = ["WORKLOADS", "Workload", "WorkloadContext"]
