"""Workloads: small, self-contained models with generated data (never downloaded).

Register a workload by adding its class to ``WORKLOADS`` and its ``Params`` dataclass to
``tpbench.workload_params`` (torch-free), against which the suite validates ``[workloads.NAME]``
tables. A user's model is named by
import path instead (``"mypkg.bench:build"``, see ``tpbench.workloads.imported``); ``resolve``
gives either kind.
"""

import torch

from tpbench.workload_params import UserWorkloadError, is_import_path, unknown
from tpbench.workloads.base import Workload, WorkloadContext, batch_seed
from tpbench.workloads.embedding import Embedding
from tpbench.workloads.gpt import GPT
from tpbench.workloads.imported import Bench, imported_workload
from tpbench.workloads.markov import MarkovChainLM
from tpbench.workloads.mlp import MLP
from tpbench.workloads.resnet import ResNet

WORKLOADS: dict[str, type[Workload]] = {w.name: w for w in (MLP, MarkovChainLM, GPT, ResNet, Embedding)}


_imported: dict[str, type[Workload]] = {}


def resolve(name: str) -> type[Workload]:
    """A built-in workload by name, or a user's factory by import path ``"MODULE:FACTORY"``
    (imported once per process). Raises ``UserWorkloadError`` (a ValueError) saying what was expected."""
    if name in WORKLOADS:
        return WORKLOADS[name]
    if not is_import_path(name):
        raise unknown(name)
    if name not in _imported:
        _imported[name] = imported_workload(name)
    return _imported[name]


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


__all__ = [
    "WORKLOADS",
    "Bench",
    "UserWorkloadError",
    "Workload",
    "WorkloadContext",
    "batch_seed",
    "parameter_count",
    "preset_sizes",
    "resolve",
]
