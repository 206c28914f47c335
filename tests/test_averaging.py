"""Model averagers and parameter drift in a real 4-rank Gloo world.

Each rank gives its parameter a value that says which rank and step it came from, so what an
averaging call did (nothing, a pair mean, the global mean) can be read off the result.
"""

from __future__ import annotations

import inspect
import typing

import pytest
import torch
import torch.distributed as dist
from world import run_world

from tpbench.hooks import (
    HierarchicalModelAverager,
    PeriodicModelAverager,
    average_parameters,
    average_parameters_or_parameter_groups,
    parameter_drift,
)

pytestmark = pytest.mark.ranks  # starts rank processes: not in `make test-fast`

WORLD = 4
STEPS = 10


def _param(value: float) -> torch.nn.Parameter:
    p = torch.nn.Parameter(torch.tensor([value, -value]))
    p.grad = torch.zeros_like(p)
    return p


def _run_schedule(averager: object) -> list[float]:
    """After each call, the first entry of a parameter that was set to ``rank + 10 * step`` before it."""
    rank = dist.get_rank()
    p = _param(0.0)
    seen = []
    for step in range(STEPS):
        with torch.no_grad():
            p.fill_(rank + 10.0 * step)
        averager.average_parameters([p])
        seen.append(p[0].item())
    return seen


def _scenarios(rank: int, world_size: int) -> dict:
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager as TorchPeriodic
    from torch.distributed.algorithms.model_averaging.hierarchical_model_averager import (
        HierarchicalModelAverager as TorchHierarchical,
    )

    out: dict = {}
    periodic = PeriodicModelAverager(period=3, warmup_steps=2)
    out["due"] = []
    for _ in range(STEPS):
        out["due"].append(periodic.next_averaging_group() is not None)
        periodic.average_parameters([_param(0.0)])
    out["periodic"] = _run_schedule(PeriodicModelAverager(period=3, warmup_steps=2))
    out["periodic_torch"] = _run_schedule(TorchPeriodic(period=3, warmup_steps=2))
    levels = {2: 2, 4: 4}
    out["hierarchical"] = _run_schedule(HierarchicalModelAverager(levels, warmup_steps=1))
    out["hierarchical_torch"] = _run_schedule(TorchHierarchical(levels, warmup_steps=1))

    # Optimizer param groups are accepted; parameters without a gradient are left alone.
    trained, frozen = _param(float(rank)), torch.nn.Parameter(torch.tensor([float(rank)]))
    average_parameters_or_parameter_groups([{"params": [trained, frozen]}])
    out["groups"] = (trained[0].item(), frozen.item())

    # average_parameters has PyTorch's contract: every given parameter, gradient or not, from an iterator.
    from torch.distributed.algorithms.model_averaging import utils as torch_utils

    def given() -> list[torch.nn.Parameter]:
        return [_param(float(rank)), torch.nn.Parameter(torch.tensor([3.0 * rank, 0.25]))]

    ours, theirs = given(), given()
    average_parameters(iter(ours))
    torch_utils.average_parameters(iter(theirs), None)
    out["all_given"] = ([p.tolist() for p in ours], [p.tolist() for p in theirs])

    # A rank outside the group keeps its values.
    pair = dist.new_group([0, 1])
    outsider = _param(float(rank))
    average_parameters([outsider], pair)
    out["outsider"] = outsider[0].item()

    out["drift"] = parameter_drift([torch.tensor([float(rank), 0.0]), torch.tensor([[0.5]])])
    out["no_drift"] = parameter_drift([torch.full((3,), 0.1)])
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_world(_scenarios, WORLD, timeout_s=120)


def _global_mean(step: int) -> float:
    return sum(range(WORLD)) / WORLD + 10.0 * step


def test_periodic_schedule(ranks: list[dict]) -> None:
    averaged = [2, 5, 8]  # step >= warmup_steps and (step - warmup_steps) % period == 0
    for rank, r in enumerate(ranks):
        assert r["due"] == [s in averaged for s in range(STEPS)]
        expected = [_global_mean(s) if s in averaged else rank + 10.0 * s for s in range(STEPS)]
        assert r["periodic"] == pytest.approx(expected)


def test_hierarchical_levels(ranks: list[dict]) -> None:
    # Step 0 is warm-up; every 4th step averages all ranks; other even steps average node pairs.
    for rank, r in enumerate(ranks):
        pair_mean = (rank // 2) * 2 + 0.5
        expected = []
        for s in range(STEPS):
            if s < 1 or s % 2:
                expected.append(rank + 10.0 * s)
            elif s % 4 == 0:
                expected.append(_global_mean(s))
            else:
                expected.append(pair_mean + 10.0 * s)
        assert r["hierarchical"] == pytest.approx(expected)


def test_same_results_as_pytorch(ranks: list[dict]) -> None:
    for r in ranks:
        assert r["periodic"] == r["periodic_torch"]
        assert r["hierarchical"] == r["hierarchical_torch"]


def test_param_groups_and_frozen_parameters(ranks: list[dict]) -> None:
    for rank, r in enumerate(ranks):
        assert r["groups"] == (pytest.approx(1.5), rank)


def test_average_parameters_averages_every_given_parameter_as_pytorch_does(ranks: list[dict]) -> None:
    for r in ranks:
        ours, theirs = r["all_given"]
        assert ours == theirs  # bitwise: same arithmetic
        assert ours[1] == [4.5, 0.25]  # the parameter without a gradient is averaged too


def test_rank_outside_the_group_is_untouched(ranks: list[dict]) -> None:
    assert [r["outsider"] for r in ranks] == [0.5, 0.5, 2.0, 3.0]


def test_parameter_drift(ranks: list[dict]) -> None:
    # Ranks at 0, 1, 2, 3 around a mean of 1.5: distances 1.5, 0.5, 0.5, 1.5.
    for r in ranks:
        assert r["drift"].max_l2 == pytest.approx(1.5)
        assert r["drift"].mean_l2 == pytest.approx(1.0)
        assert r["no_drift"].max_l2 == 0.0


def test_argument_checks() -> None:
    with pytest.raises(ValueError):
        PeriodicModelAverager(period=0)
    with pytest.raises(ValueError):
        PeriodicModelAverager(period=2, warmup_steps=-1)


def _pytorch_twins() -> list[tuple[object, object]]:
    """Each reference function or class of ``tpbench.hooks`` beside PyTorch's documented one."""
    from torch.distributed.algorithms.ddp_comm_hooks import ddp_zero_hook, post_localSGD_hook
    from torch.distributed.algorithms.model_averaging import averagers, hierarchical_model_averager, utils

    import tpbench.hooks as ours

    theirs = {
        "hook_with_zero_step": ddp_zero_hook,
        "hook_with_zero_step_interleaved": ddp_zero_hook,
        "post_localSGD_hook": post_localSGD_hook,
        "PostLocalSGDState": post_localSGD_hook,
        "PeriodicModelAverager": averagers,
        "HierarchicalModelAverager": hierarchical_model_averager,
        "average_parameters": utils,
        "average_parameters_or_parameter_groups": utils,
        "get_params_to_average": utils,
    }
    pairs: list[tuple[object, object]] = []
    for name, module in theirs.items():
        mine, twin = getattr(ours, name), getattr(module, name)
        pairs.append((mine, twin))
        if inspect.isclass(twin):
            pairs += [
                (getattr(mine, m), getattr(twin, m))
                for m in ("average_parameters", "maybe_increase_iter")
                if hasattr(twin, m)
            ]
    return pairs


def test_signatures_match_pytorchs() -> None:
    """docs/hooks.md promises PyTorch's signatures: the same parameters in the same order, of the
    same kinds, with PyTorch's defaults; tpbench may only add keyword-only parameters, or a default
    where PyTorch has none."""
    for mine, twin in _pytorch_twins():
        ours, theirs = inspect.signature(mine).parameters, inspect.signature(twin).parameters
        name = getattr(mine, "__qualname__", mine)
        assert list(ours)[: len(theirs)] == list(theirs), name
        for p in theirs.values():
            assert ours[p.name].kind == p.kind, (name, p.name)
            if p.default is not inspect.Parameter.empty:
                assert ours[p.name].default == p.default, (name, p.name)
        extra = list(ours)[len(theirs) :]
        assert all(ours[p].kind is inspect.Parameter.KEYWORD_ONLY for p in extra), (name, extra)


def test_zero_hooks_type_hints_are_pytorchs() -> None:
    """The documented signature annotates ``zero: ZeroRedundancyOptimizer`` and the returned hook as
    one giving a ``Future[Tensor]``. Ours named ZeRO by a string its module never imported, so
    ``typing.get_type_hints`` (what validating and documenting tools read) raised ``NameError``
    where PyTorch's resolves, and its returned hook was annotated a bare ``Future``."""
    from torch.distributed.algorithms.ddp_comm_hooks import ddp_zero_hook

    import tpbench.hooks as ours

    for name in ("hook_with_zero_step", "hook_with_zero_step_interleaved"):
        theirs = typing.get_type_hints(getattr(ddp_zero_hook, name))
        assert typing.get_type_hints(getattr(ours, name)) == theirs, name


def test_hierarchical_averager_without_periods_is_refused_as_pytorchs_is() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        HierarchicalModelAverager()


def test_params_to_average_refuse_what_pytorchs_refuses_with_its_error() -> None:
    """PyTorch's ``get_params_to_average`` raises ``NotImplementedError`` for an item that is neither a
    parameter nor a parameter group; ours raised ``TypeError``, which code catching PyTorch's missed."""
    from torch.distributed.algorithms.model_averaging import utils

    from tpbench.hooks import get_params_to_average

    for fn in (utils.get_params_to_average, get_params_to_average):
        with pytest.raises(NotImplementedError, match="is not supported"):
            fn([3])
