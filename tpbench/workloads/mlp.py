"""A plain MLP on synthetic classification data: the default throughput workload."""

from __future__ import annotations

import torch
from torch import nn

from tpbench.workload_params import MLPParams
from tpbench.workloads.base import Workload, batch_seed


class MLP(Workload):
    """``depth`` Linear+ReLU layers of ``width`` features, then a classifier head.

    Labels are random, so the loss says nothing about learning; this workload exists to
    produce gradients of a chosen size and compute of a chosen cost.
    """

    name = MLPParams.workload
    Params = MLPParams

    def build_model(self) -> nn.Module:
        p: MLPParams = self.params
        torch.manual_seed(self.ctx.seed)
        layers: list[nn.Module] = []
        for _ in range(p.depth):
            layers += [nn.Linear(p.width, p.width), nn.ReLU()]
        layers.append(nn.Linear(p.width, p.classes))
        return nn.Sequential(*layers).to(self.ctx.device)

    def train_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        p: MLPParams = self.params
        g = torch.Generator().manual_seed(batch_seed(self.ctx.seed, self.ctx.rank, step))
        x = torch.randn(self.ctx.batch_size, p.width, generator=g)
        y = torch.randint(0, p.classes, (self.ctx.batch_size,), generator=g)
        return x.to(self.ctx.device), y.to(self.ctx.device)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output, targets)
