"""Next-token prediction on sequences of a random Markov chain: a convergence task with a known optimum.

Post-local SGD trades communication for convergence, so measuring it needs a task where "how far
from the best possible loss" is a number, not a guess. For a Markov chain the best predictor of
the next token given all previous ones is the transition row of the current token, so the lowest
achievable expected cross-entropy per predicted token is the chain's entropy rate

    H = -sum_i pi_i sum_j P_ij log P_ij        (nats, pi the stationary distribution),

provided sequences start in the stationary distribution (then every position is distributed as
pi). The held-out set is drawn that way, so ``optimal_loss`` is exact for the held-out loss.

The states form ``clusters`` blocks: each transition row puts ``1 - leak`` of its mass on its own
block and ``leak`` on all states. That makes the non-IID option meaningful: with
``non_iid = "node"`` (or ``"rank"``) each node (rank) starts its sequences in its own blocks and
mostly stays there, so it sees mostly its own part of the transition table, as with data sharded
by source. The optimal predictor is the same for every shard (only which states are visited
differs), so the held-out optimum is unchanged and the gap measures what local steps cost.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from tpbench.workload_params import MarkovParams
from tpbench.workloads.base import Workload, WorkloadContext, batch_seed


def stationary_distribution(transition: np.ndarray) -> np.ndarray:
    """The distribution ``pi`` with ``pi @ P = pi``, for an irreducible chain.

    Solves ``(P^T - I) pi = 0`` with one equation replaced by ``sum(pi) = 1`` (the system has rank
    n - 1), which is exact to rounding, unlike power iteration on a slowly mixing chain.
    """
    n = transition.shape[0]
    system = transition.T - np.eye(n)
    system[-1, :] = 1.0
    rhs = np.zeros(n)
    rhs[-1] = 1.0
    return np.linalg.solve(system, rhs)


def entropy_rate(transition: np.ndarray) -> float:
    """Entropy rate in nats of the stationary chain with this transition matrix."""
    pi = stationary_distribution(transition)
    logs = np.log(transition, out=np.zeros_like(transition), where=transition > 0)
    return float(-(pi[:, None] * transition * logs).sum())


def clustered_chain(states: int, clusters: int, leak: float, concentration: float, seed: int) -> np.ndarray:
    """A random transition matrix whose rows keep ``1 - leak`` of their mass inside the row's block.

    Rows are Dirichlet(``concentration``) draws; the all-states part is strictly positive, so the
    chain is irreducible and aperiodic and its stationary distribution is unique.
    """
    rng = np.random.default_rng(seed)
    size = states // clusters
    transition = leak * rng.dirichlet(np.full(states, concentration), size=states)
    for i in range(states):
        block = (i // size) * size
        transition[i, block : block + size] += (1 - leak) * rng.dirichlet(np.full(size, concentration))
    return transition / transition.sum(axis=1, keepdims=True)


def sample_sequences(
    transition: torch.Tensor, start: torch.Tensor, count: int, length: int, generator: torch.Generator
) -> torch.Tensor:
    """``count`` sequences of ``length`` states: the first drawn from ``start``, then by ``transition``.

    A dense transition matrix is the sparse chain in which every state may follow every state.
    """
    n = transition.shape[0]
    return sample_chain(torch.arange(n).expand(n, n), transition, start, count, length, generator)


def sample_chain(
    successors: torch.Tensor,
    probs: torch.Tensor,
    start: torch.Tensor,
    count: int,
    length: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """Sequences of a chain given row-wise: from state ``i`` the next is ``successors[i, j]`` with
    probability ``probs[i, j]`` (float64). A chain over a GPT-sized vocabulary fits in memory only
    this way (a dense 50257 x 50257 matrix is 20 GB).

    Inverse-CDF sampling on float64 cumulative rows, one uniform per token, so a sequence depends
    only on the generator's state (the same on every machine).
    """
    row_cdf = probs.cumsum(dim=1)
    last = probs.shape[1] - 1
    uniforms = torch.rand(length, count, generator=generator, dtype=torch.float64)
    seq = torch.empty(length, count, dtype=torch.long)
    seq[0] = torch.searchsorted(start.cumsum(0), uniforms[0]).clamp_(max=start.shape[0] - 1)
    for t in range(1, length):
        prev = seq[t - 1]
        pick = torch.searchsorted(row_cdf[prev], uniforms[t].unsqueeze(1)).squeeze(1).clamp_(max=last)
        seq[t] = successors[prev, pick]
    return seq.T.contiguous()


class _Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    """A GPT-style decoder: token and position embeddings, ``n_layers`` blocks, a linear head
    (with ``tied``, GPT-2's output layer that shares the token embedding's weight).

    Input ``(batch, time)`` token ids, output ``(batch, time, vocab)`` next-token logits.
    """

    def __init__(self, vocab: int, seq_len: int, d_model: int, n_layers: int, n_heads: int, tied: bool = False) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(seq_len, d_model)
        self.blocks = nn.Sequential(*(_Block(d_model, n_heads) for _ in range(n_layers)))
        self.norm = nn.LayerNorm(d_model)
        # Tied (GPT-2): the output layer is the token embedding, one tensor for both.
        self.head = nn.Linear(d_model, vocab, bias=not tied)
        if tied:
            self.head.weight = self.tokens.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        where = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tokens(tokens) + self.positions(where)
        return self.head(self.norm(self.blocks(x)))


class MarkovChainLM(Workload):
    """Next-token prediction on a random clustered Markov chain, with a tiny transformer.

    Converges to within a few hundredths of a nat of the optimum in a few hundred steps on CPU
    with the defaults.
    """

    name = MarkovParams.workload
    Params = MarkovParams

    def __init__(self, params: MarkovParams, ctx: WorkloadContext) -> None:
        super().__init__(params, ctx)
        p = params
        matrix = clustered_chain(p.vocab, p.clusters, p.leak, p.concentration, p.chain_seed)
        self.transition = torch.from_numpy(matrix)
        self.stationary = torch.from_numpy(stationary_distribution(matrix)).clamp_(min=0)
        self._optimal_loss = entropy_rate(matrix)
        self.train_start = self._start_distribution()

    def _start_distribution(self) -> torch.Tensor:
        """Where this rank's training sequences start: anywhere (IID), or in its own blocks."""
        p, ctx = self.params, self.ctx
        if p.non_iid == "none":
            return self.stationary
        if p.non_iid == "node":
            unit, units = ctx.rank // ctx.ranks_per_node, max(1, ctx.world_size // ctx.ranks_per_node)
        else:
            unit, units = ctx.rank, ctx.world_size
        owned = [c for c in range(p.clusters) if c % units == unit % units] or [unit % p.clusters]
        size = p.vocab // p.clusters
        mask = torch.zeros(p.vocab, dtype=torch.bool)
        for c in owned:
            mask[c * size : (c + 1) * size] = True
        start = torch.where(mask, self.stationary, torch.zeros_like(self.stationary))
        return start / start.sum()

    def build_model(self) -> nn.Module:
        p = self.params
        torch.manual_seed(self.ctx.seed)
        return TinyTransformer(p.vocab, p.seq_len, p.d_model, p.n_layers, p.n_heads).to(self.ctx.device)

    def _split(self, seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return seq[:, :-1].to(self.ctx.device), seq[:, 1:].to(self.ctx.device)

    def train_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(batch_seed(self.ctx.seed, self.ctx.rank, step))
        seq = sample_sequences(self.transition, self.train_start, self.ctx.batch_size, self.params.seq_len + 1, g)
        return self._split(seq)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.flatten(0, 1), targets.flatten())

    def heldout_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Sequences from the stationary start, fixed by ``chain_seed`` alone: identical on all ranks and runs."""
        p = self.params
        # Rank -1: a seed no training batch uses.
        g = torch.Generator().manual_seed(batch_seed(p.chain_seed, rank=-1, step=0))
        seq = sample_sequences(self.transition, self.stationary, p.heldout_sequences, p.seq_len + 1, g)
        return [self._split(chunk) for chunk in seq.split(self.ctx.batch_size)]

    @property
    def optimal_loss(self) -> float:
        """The chain's entropy rate (nats per token): the expected held-out loss of the true predictor."""
        return self._optimal_loss
