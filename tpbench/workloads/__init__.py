"""Workloads: small, self-contained models with generated data (never downloaded).

Register a workload by adding its class to ``WORKLOADS``; the suite validates
``[workloads.NAME]`` tables against the class's ``Params`` dataclass.
"""

import torch

from tpbench.workloads.base import Workload, WorkloadContext
from tpbench.workloads.embedding import Embedding
from tpbench.workloads.gpt import GPT
from tpbench.workloads.markov import MarkovChainLM
from tpbench.workloads.mlp import MLP
from tpbench.workloads.resnet import ResNet

WORKLOADS: dict[str, type[Workload]] = {w.name: w for w in (MLP, MarkovChainLM, GPT, ResNet, Embedding)}



def parameter_count(cls: type[Workload], params: object) -> int:
    """How many parameters ``cls`` builds with ``params``, counted on the meta device (no memory
    allocated, so a 124 M-parameter preset is counted in milliseconds). Tied tensors count once."""
    ctx = WorkloadContext(rank=0, world_size=1, batch_size=1, seed=0, device=torch.device("meta"))
    with torch.device("meta"):
        model = cls(params, ctx).build_model()
    return sum(p.numel() for p in model.parameters())


def preset_sizes(cls: type[Workload]) -> dict[str, int]:
    """Parameters of each named preset ("default" for a workload without presets)."""
    if not cls.presets:
        return {"default": parameter_count(cls, cls.Params())}
    return {name: parameter_count(cls, cls.Params(preset=name)) for name in cls.presets}


__all__ = ["WORKLOADS", "Workload", "WorkloadContext", "parameter_count", "preset_sizes"]
