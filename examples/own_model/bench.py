"""Bring your own model: a tpbench workload in one factory (docs/models.md, "Benchmark your own model").

    tpbench sweep examples/own_model/suite.toml      # run from the repository root

tpbench calls ``build(ctx, **params)`` on every rank for every repeat; ``params`` come from the
suite's ``[workloads."examples.own_model.bench:build"]`` table, defaulting to the defaults here.
Labels come from a fixed random linear "teacher", so the loss falls as the model learns.
"""

import torch
from torch import nn

from tpbench.workloads import Bench, WorkloadContext, batch_seed


def build(ctx: WorkloadContext, width: int = 256, depth: int = 3, features: int = 32, classes: int = 10) -> Bench:
    torch.manual_seed(ctx.seed)  # the same model on every rank
    layers = [nn.Linear(features, width), nn.GELU()] + [
        m for _ in range(depth - 1) for m in (nn.Linear(width, width), nn.GELU())
    ]
    model = nn.Sequential(*layers, nn.Linear(width, classes)).to(ctx.device)
    teacher = torch.randn(features, classes, generator=torch.Generator().manual_seed(1234))

    def train_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(batch_seed(ctx.seed, ctx.rank, step))  # different per rank and step
        x = torch.randn(ctx.batch_size, features, generator=g)
        return x.to(ctx.device), (x @ teacher).argmax(dim=1).to(ctx.device)

    return Bench(model=model, train_batch=train_batch, loss=nn.functional.cross_entropy)
