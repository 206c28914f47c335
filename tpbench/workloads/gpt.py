"""A decoder-only transformer in the shape of GPT-2, on a Markov chain with a known optimal loss.

What decides DDP's buckets and ZeRO's partition is the parameter structure: a large token
embedding that is also the output layer (tied, as in GPT-2), a small position embedding, and per
block two layer norms, the attention's qkv and output projections and a 4x MLP. ``preset = "gpt2"``
is GPT-2 small (124 M parameters); ``tiny`` trains in seconds on 2 CPU cores.

The task is the Markov idea of :mod:`tpbench.workloads.markov` scaled to a GPT vocabulary. A
dense transition matrix over 50257 tokens would not fit in memory, so the chain is a mixture of
``fanout`` random permutations with weights ``w``: from token ``i`` the next is ``perm_k(i)``
with probability ``w_k``. Such a matrix is doubly stochastic, so the uniform distribution is
stationary; held-out sequences start uniform, every position is then uniform, and the best
achievable expected loss is exactly the mean over tokens of each row's entropy (``H(w)`` when a
row's successors are distinct; coinciding successors are merged). Sequences are sampled with
:func:`tpbench.workloads.markov.sample_chain`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from tpbench.workload_params import GPT_PRESETS, GPTParams
from tpbench.workloads.base import Workload, batch_seed
from tpbench.workloads.markov import TinyTransformer, sample_chain


def permutation_chain(
    states: int, fanout: int, concentration: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``(successors, probs, entropy_rate)`` of a mixture of ``fanout`` random permutations.

    The weights are one Dirichlet(``concentration``) draw shared by all rows (which keeps the
    matrix doubly stochastic). The entropy rate is exact: per row, probabilities of coinciding
    successors are summed before taking the entropy, then rows are averaged (uniform stationary).
    """
    rng = np.random.default_rng(seed)
    weights = rng.dirichlet(np.full(fanout, concentration))
    successors = np.stack([rng.permutation(states) for _ in range(fanout)], axis=1)
    probs = np.broadcast_to(weights, (states, fanout)).copy()
    keys = np.arange(states)[:, None] * states + successors
    unique, inverse = np.unique(keys.ravel(), return_inverse=True)
    merged = np.bincount(inverse, weights=probs.ravel(), minlength=len(unique))
    merged = merged[merged > 0]
    entropy = float(-(merged * np.log(merged)).sum() / states)
    return torch.from_numpy(successors), torch.from_numpy(probs), entropy


def _gpt2_init(module: nn.Module) -> None:
    """GPT-2's initialisation: N(0, 0.02) weights, zero biases. PyTorch's default N(0, 1) token
    embedding, tied as the output layer, would start with logits of standard deviation ~sqrt(n_embd)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


class GPT(Workload):
    """GPT-2-shaped decoder (pre-norm blocks, tied output layer) on a permutation-mixture chain."""

    name = GPTParams.workload
    Params = GPTParams
    presets = GPT_PRESETS

    def __init__(self, params: GPTParams, ctx) -> None:
        super().__init__(params, ctx)
        p = params
        self.successors, self.probs, self._optimal_loss = permutation_chain(
            p.vocab_size, p.fanout, p.concentration, p.chain_seed
        )
        self.uniform = torch.full((p.vocab_size,), 1.0 / p.vocab_size, dtype=torch.float64)

    def build_model(self) -> nn.Module:
        p = self.params
        torch.manual_seed(self.ctx.seed)
        model = TinyTransformer(p.vocab_size, p.block_size, p.n_embd, p.n_layer, p.n_head, tied=True)
        model.apply(_gpt2_init)
        return model.to(self.ctx.device)

    def _sequences(self, count: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        seq = sample_chain(self.successors, self.probs, self.uniform, count, self.params.block_size + 1, g)
        return seq[:, :-1].to(self.ctx.device), seq[:, 1:].to(self.ctx.device)

    def train_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(batch_seed(self.ctx.seed, self.ctx.rank, step))
        return self._sequences(self.ctx.batch_size, g)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.flatten(0, 1), targets.flatten())

    def heldout_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Sequences fixed by ``chain_seed`` alone (rank -1: a seed no training batch uses)."""
        g = torch.Generator().manual_seed(batch_seed(self.params.chain_seed, rank=-1, step=0))
        x, y = self._sequences(self.params.heldout_sequences, g)
        return list(zip(x.split(self.ctx.batch_size), y.split(self.ctx.batch_size)))

    @property
    def optimal_loss(self) -> float:
        """The chain's entropy rate (nats per token)."""
        return self._optimal_loss
