"""post_localSGD_hook and PostLocalSGDState in a real 4-rank Gloo world (2 emulated nodes x 2 ranks).

One world runs every scenario (a world start costs seconds of CPU); the tests then check what
each rank reported.
"""

# No ``from __future__ import annotations``: DDP rejects a hook whose annotations are strings.
import logging

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from world import run_world

from tpbench.hooks import (
    PeriodicModelAverager,
    PostLocalSGDState,
    post_localSGD_hook,
    resolve_ranks_per_node,
)

pytestmark = pytest.mark.ranks  # starts rank processes: not in `make test-fast`

WORLD = 4
RANKS_PER_NODE = 2
START = 2
STEPS = 5

_bucket_calls: list[int] = []


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)


def _counting_hook(state: PostLocalSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    _bucket_calls.append(bucket.index())
    return post_localSGD_hook(state, bucket)


def _grads_per_step(post_local_gradient_allreduce: bool) -> dict:
    """Gradients after each backward, ``state.iter`` after each step, and bucket calls per step."""
    rank = dist.get_rank()
    # A tiny bucket cap gives several buckets, so counting "once per iteration" is really tested.
    model = DDP(_model(), bucket_cap_mb=1e-4)
    state = PostLocalSGDState(None, None, START, post_local_gradient_allreduce, ranks_per_node=RANKS_PER_NODE)
    model.register_comm_hook(state, _counting_hook)
    grads, iters, calls = [], [], []
    for step in range(STEPS):
        _bucket_calls.clear()
        model.zero_grad()
        x, y = _batch(rank, step)
        nn.functional.mse_loss(model(x), y).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
        iters.append(state.iter)
        calls.append(len(_bucket_calls))
    return {"grads": grads, "iter": iters, "calls": calls, "subgroup_size": dist.get_world_size(state.subgroup)}


def _train(impl: str, post_local_gradient_allreduce: bool, period: int) -> list[torch.Tensor]:
    """Flat parameters after every step of post-local SGD with ``impl``'s hook and averager."""
    from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as torch_localsgd
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager as TorchAverager

    rank = dist.get_rank()
    model = DDP(_model(), bucket_cap_mb=1e-4)
    if impl == "torch":
        # PyTorch cannot infer nodes on CPU, so it gets the same subgroup explicitly.
        subgroup, _ = dist.new_subgroups(group_size=RANKS_PER_NODE)
        state = torch_localsgd.PostLocalSGDState(None, subgroup, START, post_local_gradient_allreduce)
        model.register_comm_hook(state, torch_localsgd.post_localSGD_hook)
        averager = TorchAverager(period=period, warmup_steps=START)
    else:
        state = PostLocalSGDState(None, None, START, post_local_gradient_allreduce, ranks_per_node=RANKS_PER_NODE)
        model.register_comm_hook(state, post_localSGD_hook)
        averager = PeriodicModelAverager(period=period, warmup_steps=START)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    history = []
    for step in range(8):
        opt.zero_grad()
        x, y = _batch(rank, step)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        averager.average_parameters(model.parameters())
        history.append(torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()]))
    return history


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _scenarios(rank: int, world_size: int) -> dict:
    records = _Records()
    logging.getLogger("tpbench.hooks.localsgd").addHandler(records)
    logging.getLogger("tpbench.hooks.localsgd").setLevel(logging.INFO)
    out = {"local": _grads_per_step(True), "none": _grads_per_step(False), "log": list(records.messages)}
    for allreduce in (True, False):
        for impl in ("torch", "tpbench"):
            out[(impl, allreduce)] = _train(impl, allreduce, period=3)
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_world(_scenarios, WORLD, timeout_s=180)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a, b)


def test_gradients_are_global_before_the_switch(ranks: list[dict]) -> None:
    for kind in ("local", "none"):
        for step in range(START):
            g0 = ranks[0][kind]["grads"][step]
            assert all(_same(r[kind]["grads"][step], g0) for r in ranks), (kind, step)


def test_gradients_are_per_node_after_the_switch(ranks: list[dict]) -> None:
    nodes = [[0, 1], [2, 3]]
    for step in range(START, STEPS):
        grads = [r["local"]["grads"][step] for r in ranks]
        for a, b in nodes:
            assert _same(grads[a], grads[b]), step
        assert not torch.allclose(grads[0], grads[2]), step
    assert all(r["local"]["subgroup_size"] == RANKS_PER_NODE for r in ranks)


def test_no_gradient_allreduce_after_the_switch(ranks: list[dict]) -> None:
    for step in range(START, STEPS):
        grads = [r["none"]["grads"][step] for r in ranks]
        for a in range(WORLD):
            for b in range(a + 1, WORLD):
                assert not torch.allclose(grads[a], grads[b]), (step, a, b)


def test_iter_counts_once_per_iteration_and_stops_at_the_switch(ranks: list[dict]) -> None:
    for r in ranks:
        # DDP's first iteration uses one large bucket; from the second on, the rebuilt small ones.
        assert min(r["local"]["calls"][1:]) > 1, "the test needs several buckets per iteration"
        assert r["local"]["iter"] == [1, 2, 2, 2, 2]
        assert r["none"]["iter"] == [1, 2, 2, 2, 2]


def test_logs_when_local_sgd_starts(ranks: list[dict]) -> None:
    started = [m for m in ranks[0]["log"] if m.startswith("Start to apply local SGD")]
    assert started == [f"Start to apply local SGD after {START} iterations."] * 2


@pytest.mark.parametrize("allreduce", [True, False])
def test_parity_with_pytorch(ranks: list[dict], allreduce: bool) -> None:
    for rank, r in enumerate(ranks):
        for step, (ours, theirs) in enumerate(zip(r[("tpbench", allreduce)], r[("torch", allreduce)])):
            assert _same(ours, theirs), (rank, step)
    # Averaging steps (2, 5) leave every rank with the same parameters; local steps do not.
    for step in (2, 5):
        assert all(_same(r[("tpbench", allreduce)][step], ranks[0][("tpbench", allreduce)][step]) for r in ranks)
    assert not torch.equal(ranks[0][("tpbench", allreduce)][3], ranks[2][("tpbench", allreduce)][3])


def _without_node_size(rank: int, world_size: int) -> dict:
    """PyTorch's way: ``PostLocalSGDState(subgroup=None)`` on CPU ranks with no LOCAL_WORLD_SIZE."""
    import os
    import warnings

    os.environ.pop("LOCAL_WORLD_SIZE", None)
    ddp = DDP(torch.nn.Linear(4, 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = PostLocalSGDState(None, None, start_localSGD_iter=2)
    ddp.register_comm_hook(state, post_localSGD_hook)
    x = torch.ones(2, 4)
    for _ in range(2):  # before the switch: global allreduce, no node size needed
        ddp(x).sum().backward()
    out = {"warned": [str(w.message) for w in caught], "trained": True}
    try:
        ddp(x).sum().backward()  # the switch builds the node subgroup
        out["switch"] = None
    except Exception as e:  # the error is what the test checks
        out["switch"] = str(e)
    return out


def test_a_state_without_node_size_builds_and_fails_only_at_the_switch() -> None:
    """Code that never switches must run as under PyTorch: a warning at construction, the error
    (what to pass) only when local SGD starts."""
    if torch.cuda.is_available():
        pytest.skip("with CUDA the node size is the device count, as in PyTorch")
    for r in run_world(_without_node_size, 2, timeout_s=120):
        assert len(r["warned"]) == 1 and "ranks_per_node" in r["warned"][0] and "iteration 2" in r["warned"][0]
        assert r["trained"]
        assert r["switch"] is not None and "cannot tell which ranks share a node" in r["switch"]


def test_ranks_per_node_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert resolve_ranks_per_node(2) == 2
    assert resolve_ranks_per_node() == 8
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="ranks_per_node"):
            resolve_ranks_per_node()
    with pytest.raises(ValueError):
        resolve_ranks_per_node(0)
