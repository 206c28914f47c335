"""An embedding-heavy model, as in recommendation: a large embedding table plus a small MLP.

Nearly all parameters, and so nearly all gradient bytes, are in one tensor (the table): one DDP
bucket holds it whatever the bucket size, and without ``shard_buckets`` one ZeRO rank steps
almost the whole model. Gradients are dense (DDP and ZeRO do not take sparse ones).

A sample is ``bag_size`` item ids (Zipf-like popularity, as real id streams have); its label is
1 when the mean of a fixed hidden score of its items is positive, so the task is learnable.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from tpbench.workload_params import EMBEDDING_PRESETS, EmbeddingParams
from tpbench.workloads.base import Workload, batch_seed


class EmbeddingMLP(nn.Module):
    """Mean of a bag's embeddings through a 2-layer MLP: one logit per bag."""

    def __init__(self, rows: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.table = nn.EmbeddingBag(rows, dim, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.table(ids)).squeeze(1)


class Embedding(Workload):
    """Large embedding table + small MLP, binary labels from a hidden per-item score."""

    name = EmbeddingParams.workload
    Params = EmbeddingParams
    presets = EMBEDDING_PRESETS

    def __init__(self, params: EmbeddingParams, ctx) -> None:
        super().__init__(params, ctx)
        g = torch.Generator().manual_seed(batch_seed(0, rank=-2, step=0))
        self.item_score = torch.randn(params.rows, generator=g)
        # Zipf-like popularity: item k drawn with weight 1/(k+1), via inverse CDF on its cumulative sum.
        self.popularity_cdf = torch.cumsum(1.0 / torch.arange(1, params.rows + 1, dtype=torch.float64), 0)
        self.popularity_cdf /= self.popularity_cdf[-1].clone()

    def build_model(self) -> nn.Module:
        p = self.params
        torch.manual_seed(self.ctx.seed)
        return EmbeddingMLP(p.rows, p.dim, p.hidden).to(self.ctx.device)

    def _samples(self, count: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.params
        u = torch.rand(count, p.bag_size, generator=g, dtype=torch.float64)
        ids = torch.searchsorted(self.popularity_cdf, u).clamp_(max=p.rows - 1)
        y = (self.item_score[ids].mean(dim=1) > 0).float()
        return ids.to(self.ctx.device), y.to(self.ctx.device)

    def train_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._samples(
            self.ctx.batch_size, torch.Generator().manual_seed(batch_seed(self.ctx.seed, self.ctx.rank, step))
        )

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(output, targets)

    def heldout_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        x, y = self._samples(self.params.heldout_samples, torch.Generator().manual_seed(batch_seed(0, rank=-1, step=0)))
        return list(zip(x.split(self.ctx.batch_size), y.split(self.ctx.batch_size)))
