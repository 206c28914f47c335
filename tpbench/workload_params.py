"""The parameters of the built-in workloads: what ``[workloads.NAME]`` accepts, without torch.

The suite validates against these dataclasses (``tpbench validate`` imports no torch); the models
they configure live in ``tpbench.workloads``, which only the worker, ``tpbench list`` and the
tests import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar


class UserWorkloadError(ValueError):
    """The import path, the factory or what it returns breaks the protocol (the message says how)."""


def is_import_path(name: str) -> bool:
    return ":" in name


def apply_preset(params: object, presets: dict[str, dict[str, int]]) -> None:
    """Fill a frozen ``Params``'s size fields left at 0 ("the preset's") from ``params.preset``.

    Called from ``__post_init__``: the resolved sizes are what the case records, so a stored
    case says exactly what ran, and an explicit size overrides the preset's.
    """
    chosen = presets.get(params.preset)
    if chosen is None:
        raise ValueError(f"preset must be one of {', '.join(presets)}, got {params.preset!r}")
    for key, value in chosen.items():
        current = getattr(params, key)
        if current < 0:
            raise ValueError(f"{key} must be > 0 (or 0 for the preset's {value}), got {current}")
        if current == 0:
            object.__setattr__(params, key, value)


NON_IID_MODES = ("none", "node", "rank")


def check_chain_seed(chain_seed: int) -> None:
    """``chain_seed`` seeds numpy's generator, which refuses a negative seed: refused here, at
    validation, rather than failing every case on the ranks. The suite's range check cannot catch it,
    since the default, 0, allows any sign."""
    if chain_seed < 0:
        raise ValueError(f"chain_seed must be >= 0, got {chain_seed}")


def shards_by_node(workload: str, params: Mapping[str, Any]) -> bool:
    """Whether a workload's training data depends on ``ranks_per_node``: markov's ``non_iid = "node"``
    gives each node its own part of the chain. Then the key shapes every case's data, plain DDP's
    included, not only post-local SGD's subgroups, and a case must keep it to train on the same data."""
    return workload == MarkovParams.workload and params.get("non_iid") == "node"


@dataclass(frozen=True)
class MLPParams:
    workload: ClassVar[str] = "mlp"

    width: int = 1024
    depth: int = 8
    classes: int = 16


@dataclass(frozen=True)
class MarkovParams:
    """The chain (``vocab`` … ``chain_seed``), the model (``d_model`` … ``n_heads``) and the data split.

    ``chain_seed`` fixes the task, independently of the run's ``seed`` (model init and batches), so
    runs with different seeds are repeats of one task with one optimum.
    """

    workload: ClassVar[str] = "markov"

    vocab: int = 32
    clusters: int = 4
    leak: float = 0.02
    concentration: float = 0.5
    chain_seed: int = 0
    seq_len: int = 32
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    non_iid: str = "none"
    heldout_sequences: int = 512

    def __post_init__(self) -> None:
        check_chain_seed(self.chain_seed)
        if self.vocab % self.clusters:
            raise ValueError(f"vocab ({self.vocab}) must be divisible by clusters ({self.clusters})")
        if not 0 < self.leak <= 1:
            raise ValueError(f"leak must be in (0, 1] (0 would split the chain), got {self.leak}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.non_iid not in NON_IID_MODES:
            raise ValueError(f"non_iid must be one of {', '.join(NON_IID_MODES)}, got {self.non_iid!r}")


GPT_PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(n_layer=2, n_head=2, n_embd=64, vocab_size=64, block_size=32),
    "mini": dict(n_layer=4, n_head=4, n_embd=128, vocab_size=1024, block_size=64),
    "small": dict(n_layer=6, n_head=8, n_embd=256, vocab_size=8192, block_size=128),
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, block_size=1024),
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024, vocab_size=50257, block_size=1024),
}


@dataclass(frozen=True)
class GPTParams:
    """``preset`` picks the sizes; a size set here (non-zero) overrides the preset's.

    ``fanout``, ``concentration`` and ``chain_seed`` define the task (see the module docstring);
    ``chain_seed`` fixes it independently of the run's ``seed``.
    """

    workload: ClassVar[str] = "gpt"

    preset: str = "tiny"
    n_layer: int = 0
    n_head: int = 0
    n_embd: int = 0
    vocab_size: int = 0
    block_size: int = 0
    fanout: int = 4
    concentration: float = 1.0
    chain_seed: int = 0
    heldout_sequences: int = 64

    def __post_init__(self) -> None:
        apply_preset(self, GPT_PRESETS)
        check_chain_seed(self.chain_seed)
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.fanout > self.vocab_size:
            raise ValueError(f"fanout ({self.fanout}) must be at most vocab_size ({self.vocab_size})")


RESNET_PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(width=8, stages=2, blocks_per_stage=1, image_size=16),
    "small": dict(width=32, stages=3, blocks_per_stage=2, image_size=32),
    "resnet18": dict(width=64, stages=4, blocks_per_stage=2, image_size=224),
}


@dataclass(frozen=True)
class ResNetParams:
    """``preset`` picks the sizes; a size set here (non-zero) overrides the preset's."""

    workload: ClassVar[str] = "resnet"

    preset: str = "tiny"
    width: int = 0
    stages: int = 0
    blocks_per_stage: int = 0
    image_size: int = 0
    classes: int = 10
    noise: float = 1.0
    heldout_images: int = 256

    def __post_init__(self) -> None:
        apply_preset(self, RESNET_PRESETS)


EMBEDDING_PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(rows=4096, dim=16, hidden=32),
    "small": dict(rows=262144, dim=32, hidden=64),
    "large": dict(rows=4_000_000, dim=64, hidden=256),
}


@dataclass(frozen=True)
class EmbeddingParams:
    """``preset`` picks the sizes; a size set here (non-zero) overrides the preset's."""

    workload: ClassVar[str] = "embedding"

    preset: str = "tiny"
    rows: int = 0
    dim: int = 0
    hidden: int = 0
    bag_size: int = 8
    heldout_samples: int = 1024

    def __post_init__(self) -> None:
        apply_preset(self, EMBEDDING_PRESETS)


# Built-in workload name → its parameters.
PARAMS: dict[str, type] = {p.workload: p for p in (MLPParams, MarkovParams, GPTParams, ResNetParams, EmbeddingParams)}


def unknown(name: str) -> UserWorkloadError:
    """The error for a workload name that is neither built in nor an import path."""
    return UserWorkloadError(f"expected one of {', '.join(PARAMS)} or an import path MODULE:FACTORY, got {name!r}")
