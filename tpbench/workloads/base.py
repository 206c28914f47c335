"""The contract every workload keeps, so the worker can run any of them the same way."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch


@dataclass(frozen=True)
class WorkloadContext:
    """Where a workload instance lives: which rank of which world, and its seeds."""

    rank: int
    world_size: int
    batch_size: int
    seed: int
    device: torch.device
    # Ranks that form one (real or emulated) node; workloads with a non-IID option use it.
    ranks_per_node: int = 1


def batch_seed(seed: int, rank: int, step: int) -> int:
    """A generator seed that differs per (seed, rank, step) and is the same on every run."""
    return (seed * 1_000_003 + rank * 10_007 + step) % (2**63 - 1)


class Workload(ABC):
    """A model and its data.

    ``Params`` is a frozen dataclass whose fields are the keys accepted under ``[workloads.NAME]``
    in a suite; its defaults are the workload's defaults. The model must come out identical on
    every rank (seeded by ``ctx.seed`` only) while training batches differ per rank (seeded by
    seed, rank and step), so data parallelism has something to average. Batches are produced
    before a step's timer starts, so generating them never counts as step time.
    """

    name: ClassVar[str]
    Params: ClassVar[type]
    # Named sizes for ``preset`` (see ``apply_preset``); empty for workloads without presets.
    presets: ClassVar[dict[str, dict[str, int]]] = {}

    def __init__(self, params: object, ctx: WorkloadContext) -> None:
        self.params = params
        self.ctx = ctx

    @abstractmethod
    def build_model(self) -> torch.nn.Module:
        """A fresh model on ``ctx.device``, identical on all ranks."""

    @abstractmethod
    def train_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of training step ``step`` for this rank, on ``ctx.device``."""

    @abstractmethod
    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Scalar training loss."""

    def heldout_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Fixed held-out batches (the same on every rank); empty when the workload has none."""
        return []

    @property
    def optimal_loss(self) -> float | None:
        """The best achievable expected loss, when the task makes it known exactly."""
        return None
