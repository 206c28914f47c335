"""A ResNet-style convolutional classifier on synthetic images, in plain torch.

Convolution weights are many small-to-medium tensors growing with depth, plus BatchNorm
parameters and buffers (which DDP broadcasts every forward): a parameter structure unlike a
transformer's. Each class is a fixed random image; a sample is its class's image plus Gaussian
noise, so the task is learnable and held-out accuracy means something, and nothing is downloaded.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from tpbench.workload_params import RESNET_PRESETS, ResNetParams
from tpbench.workloads.base import Workload, batch_seed


class _Basic(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with BatchNorm and a shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def resnet(width: int, stages: int, blocks_per_stage: int, classes: int) -> nn.Module:
    """Stem, ``stages`` stages of basic blocks (channels doubling, resolution halving after the
    first), global average pooling and a linear classifier. 4 stages of 2 blocks at width 64 is
    ResNet-18's body (11.2 M parameters with a 1000-class head; the stem here is a 3x3 conv)."""
    layers: list[nn.Module] = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
    cin = width
    for s in range(stages):
        cout = width * 2**s
        for b in range(blocks_per_stage):
            layers.append(_Basic(cin, cout, stride=2 if s > 0 and b == 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


class ResNet(Workload):
    """ResNet-style CNN on noisy copies of one random template image per class."""

    name = ResNetParams.workload
    Params = ResNetParams
    presets = RESNET_PRESETS

    def __init__(self, params: ResNetParams, ctx) -> None:
        super().__init__(params, ctx)
        g = torch.Generator().manual_seed(batch_seed(0, rank=-2, step=0))
        self.templates = torch.randn(params.classes, 3, params.image_size, params.image_size, generator=g)

    def build_model(self) -> nn.Module:
        p = self.params
        torch.manual_seed(self.ctx.seed)
        return resnet(p.width, p.stages, p.blocks_per_stage, p.classes).to(self.ctx.device)

    def _images(self, count: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, self.params.classes, (count,), generator=g)
        x = self.templates[y] + self.params.noise * torch.randn(self.templates[y].shape, generator=g)
        return x.to(self.ctx.device), y.to(self.ctx.device)

    def train_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._images(
            self.ctx.batch_size, torch.Generator().manual_seed(batch_seed(self.ctx.seed, self.ctx.rank, step))
        )

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, targets)

    def heldout_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        x, y = self._images(self.params.heldout_images, torch.Generator().manual_seed(batch_seed(0, rank=-1, step=0)))
        return list(zip(x.split(self.ctx.batch_size), y.split(self.ctx.batch_size)))
