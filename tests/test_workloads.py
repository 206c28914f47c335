"""The workload contract for every registered workload, and the Markov task's known optimum."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from tpbench.workloads import WORKLOADS, WorkloadContext
from tpbench.workloads.markov import (
    MarkovChainLM,
    MarkovParams,
    entropy_rate,
    sample_sequences,
    stationary_distribution,
)

CPU = torch.device("cpu")
# Small parameters per workload, so building a model for several ranks stays quick.
SMALL = {"mlp": {"width": 32, "depth": 2}, "markov": {"heldout_sequences": 64}}


def _workload(name: str, rank: int = 0, world_size: int = 4, seed: int = 0, **params: object):
    cls = WORKLOADS[name]
    ctx = WorkloadContext(rank=rank, world_size=world_size, batch_size=8, seed=seed, device=CPU, ranks_per_node=2)
    return cls(cls.Params(**{**SMALL.get(name, {}), **params}), ctx)


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_contract(name: str) -> None:
    w0, w1 = _workload(name, rank=0), _workload(name, rank=1)
    assert torch.equal(_flat(w0.build_model()), _flat(w1.build_model())), "models must match on all ranks"
    x0, _ = w0.train_batch(3)
    x1, _ = w1.train_batch(3)
    assert not torch.equal(x0, x1), "ranks must train on different data"
    assert torch.equal(x0, w0.train_batch(3)[0]), "a batch must be reproducible"
    model = w0.build_model()
    x, y = w0.train_batch(0)
    assert w0.loss(model(x), y).dim() == 0
    for (a, b), (c, d) in zip(w0.heldout_batches(), w1.heldout_batches(), strict=True):
        assert torch.equal(a, c) and torch.equal(b, d), "held-out batches must match on all ranks"
    for f in dataclasses.fields(WORKLOADS[name].Params):
        assert f.default is not dataclasses.MISSING, f"{name}.{f.name} needs a default (it is a suite key)"


def test_entropy_rate_of_a_two_state_chain() -> None:
    a, b = 0.3, 0.1
    transition = np.array([[1 - a, a], [b, 1 - b]])
    pi = np.array([b, a]) / (a + b)

    def h(p: float) -> float:
        return -(p * math.log(p) + (1 - p) * math.log(1 - p))

    assert stationary_distribution(transition) == pytest.approx(pi, abs=1e-12)
    assert entropy_rate(transition) == pytest.approx(pi[0] * h(a) + pi[1] * h(b), abs=1e-12)


def test_optimal_loss_matches_sampled_chain() -> None:
    """The exact entropy rate agrees with two independent estimates from a long sample of the chain."""
    w = _workload("markov")
    pi = w.stationary.numpy()
    assert pi @ w.transition.numpy() == pytest.approx(pi, abs=1e-12)
    seq = sample_sequences(w.transition, w.stationary, 4096, 65, torch.Generator().manual_seed(1))
    # 1. Mean surprisal of the true predictor; sequences are independent, so their means give the error bar.
    surprisal = -torch.log(w.transition[seq[:, :-1], seq[:, 1:]]).mean(dim=1)
    stderr = surprisal.std().item() / math.sqrt(len(surprisal))
    assert abs(surprisal.mean().item() - w.optimal_loss) < 4 * stderr
    # 2. A count-based bigram model fitted to the sample (knows nothing of the true matrix).
    vocab = w.params.vocab
    counts = torch.zeros(vocab * vocab, dtype=torch.float64)
    counts.index_add_(
        0, (seq[:, :-1] * vocab + seq[:, 1:]).reshape(-1), torch.ones(seq[:, 1:].numel(), dtype=torch.float64)
    )
    counts = counts.view(vocab, vocab)
    fitted = counts / counts.sum(dim=1, keepdim=True)
    plug_in = -(counts * torch.log(fitted.clamp(min=1e-300))).sum().item() / counts.sum().item()
    assert plug_in == pytest.approx(w.optimal_loss, abs=0.01)


def _start_clusters(w: MarkovChainLM) -> set[int]:
    size = w.params.vocab // w.params.clusters
    return {int(t) // size for step in range(20) for t in w.train_batch(step)[0][:, 0]}


def test_non_iid_ranks_start_in_their_own_clusters() -> None:
    assert all(_start_clusters(_workload("markov", rank=r)) == {0, 1, 2, 3} for r in range(4))
    # 4 ranks, 2 per node: node 0 owns clusters 0 and 2, node 1 owns 1 and 3.
    nodes = [_start_clusters(_workload("markov", rank=r, non_iid="node")) for r in range(4)]
    assert nodes == [{0, 2}, {0, 2}, {1, 3}, {1, 3}]
    ranks = [_start_clusters(_workload("markov", rank=r, non_iid="rank")) for r in range(4)]
    assert ranks == [{0}, {1}, {2}, {3}]
    # The held-out set is the global distribution either way.
    skewed = _workload("markov", non_iid="node", seed=5).heldout_batches()
    for (a, _), (b, _) in zip(skewed, _workload("markov").heldout_batches(), strict=True):
        assert torch.equal(a, b)


def test_transformer_gets_close_to_the_optimum() -> None:
    w = _workload("markov", rank=0, world_size=1, heldout_sequences=256)
    torch.manual_seed(0)
    model = w.build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(200):
        x, y = w.train_batch(step)
        loss = w.loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        heldout = [w.loss(model(x), y).item() for x, y in w.heldout_batches()]
    start = math.log(w.params.vocab)
    gap = sum(heldout) / len(heldout) - w.optimal_loss
    assert -0.05 < gap < 0.15 * (start - w.optimal_loss)


@pytest.mark.parametrize(
    "bad",
    [{"vocab": 30}, {"leak": 0.0}, {"leak": 1.5}, {"d_model": 30}, {"non_iid": "yes"}],
)
def test_params_are_checked(bad: dict) -> None:
    with pytest.raises(ValueError):
        MarkovParams(**bad)
