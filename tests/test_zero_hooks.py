"""tpbench's ZeRO overlap hooks in real Gloo worlds of 2 and 3 ranks.

The oracle is PyTorch's own (``test_ddp_zero_overlap``): once the vacuous warm-up iterations are
over, a model trained through the hook equals DDP + the same optimizer stepped locally, with the
reference warmed through the same DDP bucket rebuild. Every rank function here is module-level
so that ``run_world`` can spawn it; many cases share one world because starting one costs
seconds of CPU.
"""

import copy
import itertools
from typing import Any, NamedTuple

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
    allreduce_hook,
    bf16_compress_hook,
    fp16_compress_hook,
)
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from world import run_world

from tpbench.hooks import hook_with_zero_step, hook_with_zero_step_interleaved
from tpbench.hooks import zero as zero_module
from tpbench.hooks._torch_private import ddp_buckets, require_supported_torch
from tpbench.hooks.zero import plan_shards

pytestmark = pytest.mark.ranks  # starts rank processes: not in `make test-fast`

SMALL_BUCKETS_MB = 0.004  # ~1000 floats: several buckets, some with several parameters
ONE_BUCKET_MB = 25.0
# A cap per bucket (DDP's bucket_cap_mb_list, torch >= 2.13), the last for the rest: on _model() it
# builds 3 buckets where the single 0.004 MB cap builds 2 (the gradient bytes in ready order are
# 32 + 1024 | 128 + 4096 | 128 + 2048), so a list that DDP did not get shows in the buckets.
CAP_LIST_MB = (0.001, 0.004)
CAP_LIST_BUCKET_BYTES = [1056, 4224, 2176]
STEPS = 4


class Case(NamedTuple):
    interleaved: bool
    shard_buckets: bool
    gradient_as_bucket_view: bool
    static_graph: bool
    hook: str = "allreduce"
    bucket_cap_mb: float | None = SMALL_BUCKETS_MB
    """None: DDP's own bucketing (nothing passed: 25 MB buckets, the first 1 MB), as bucket_cap_mb = "default"."""
    stream_ordered: bool = False
    """Take the NCCL path (step each bucket in its own hook) on Gloo, where it is slower but valid."""
    bucket_cap_mb_list: tuple[float, ...] | None = None

    @property
    def bucketing(self) -> dict[str, Any]:
        """DDP's bucket arguments, as tpbench's training passes them for the case's suite keys."""
        if self.bucket_cap_mb_list is not None:
            return {"bucket_cap_mb_list": list(self.bucket_cap_mb_list)}
        return {} if self.bucket_cap_mb is None else {"bucket_cap_mb": self.bucket_cap_mb}

    @property
    def id(self) -> str:
        kind = "interleaved" if self.interleaved else "sequential"
        return (
            f"{kind}-shard{int(self.shard_buckets)}-gabv{int(self.gradient_as_bucket_view)}"
            f"-static{int(self.static_graph)}-{self.hook}-cap{self._caps}"
            + ("-stream_ordered" if self.stream_ordered else "")
        )

    @property
    def _caps(self) -> str:
        if self.bucket_cap_mb_list is not None:
            return "list" + "-".join(f"{c:g}" for c in self.bucket_cap_mb_list)
        return "default" if self.bucket_cap_mb is None else f"{self.bucket_cap_mb:g}"


GRID = [Case(*flags) for flags in itertools.product([False, True], repeat=4)]
EXTRA = [
    # One bucket holding the whole model: PyTorch's shard_buckets heuristic fails on 2 ranks here.
    Case(False, True, False, False, bucket_cap_mb=ONE_BUCKET_MB),
    Case(True, True, False, False, bucket_cap_mb=ONE_BUCKET_MB),
    # Each hook wrapping each compression, sharded or not, on both Gloo paths.
    *(
        Case(interleaved, shard, False, False, hook=hook)
        for hook in ("fp16", "bf16")
        for interleaved in (False, True)
        for shard in (False, True)
    ),
    Case(True, True, True, False, hook="fp16"),
    Case(True, False, False, True, hook="bf16", stream_ordered=True),
    Case(True, False, False, False, stream_ordered=True),
    Case(True, True, True, True, stream_ordered=True),
    # DDP's own bucketing and a cap per bucket, for each hook, sharded or not, static graph too.
    *(
        Case(interleaved, shard, False, static, bucket_cap_mb=None)
        for interleaved in (False, True)
        for shard, static in ((False, False), (True, True))
    ),
    *(
        Case(interleaved, shard, gabv, static, bucket_cap_mb_list=CAP_LIST_MB)
        for interleaved in (False, True)
        for shard, gabv, static in ((False, False, False), (True, False, False), (True, True, True))
    ),
]
CASES = GRID + EXTRA
HOOKS = {"allreduce": allreduce_hook, "fp16": fp16_compress_hook, "bf16": bf16_compress_hook}


def bf16_compress(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """``bf16_compress_hook`` under another name: DDP refuses to register that name on a torch
    built without CUDA and NCCL (the ZeRO hooks' wrapper is accepted), though Gloo all-reduces
    bfloat16; the reference registers the very same function this way."""
    return bf16_compress_hook(state, bucket)


REFERENCE_HOOKS = HOOKS | {"bf16": bf16_compress}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)
    )


def _optimizer_kwargs() -> dict[str, float]:
    return {"lr": 0.01, "momentum": 0.9, "weight_decay": 0.001}


def _params(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def _overlapped(case: Case, model: torch.nn.Module) -> tuple[DDP, ZeroRedundancyOptimizer]:
    ddp = DDP(
        copy.deepcopy(model),
        gradient_as_bucket_view=case.gradient_as_bucket_view,
        static_graph=case.static_graph,
        **case.bucketing,
    )
    zero = ZeroRedundancyOptimizer(
        ddp.parameters(), optimizer_class=torch.optim.SGD, overlap_with_ddp=True, **_optimizer_kwargs()
    )
    wrap = hook_with_zero_step_interleaved if case.interleaved else hook_with_zero_step
    ddp.register_comm_hook(None, wrap(HOOKS[case.hook], ddp, zero, shard_buckets=case.shard_buckets))
    return ddp, zero


def _check_case(rank: int, case: Case) -> dict[str, Any]:
    """Train the hooked model and the reference side by side; report what the test asserts on."""
    model = _model()
    ddp, zero = _overlapped(case, model)
    ref = DDP(
        copy.deepcopy(model),
        gradient_as_bucket_view=case.gradient_as_bucket_view,
        static_graph=case.static_graph,
        **case.bucketing,
    )
    if case.hook != "allreduce":
        ref.register_comm_hook(None, REFERENCE_HOOKS[case.hook])
    ref_optim = torch.optim.SGD(ref.parameters(), **_optimizer_kwargs())
    # The same training without compression: the hooked model must be nearer the compressed reference.
    plain = DDP(copy.deepcopy(model), **case.bucketing)
    plain_optim = torch.optim.SGD(plain.parameters(), **_optimizer_kwargs())
    warmup = 3 if case.static_graph else 2
    torch.manual_seed(100 + rank)  # each rank its own data, so the reduction matters
    inputs = [torch.randn(4, 16) for _ in range(warmup + STEPS)]

    initial = _params(ddp)
    vacuous_drift = []
    for x in inputs[:warmup]:
        ddp(x).sum().backward()
        vacuous_drift.append(_max_diff(initial, _params(ddp)))
        ref(x).sum().backward()  # same bucket rebuild as the hooked model, no step
        plain(x).sum().backward()
    ref_optim.zero_grad()
    plain_optim.zero_grad()
    step_diffs, plain_diffs = [], []
    for x in inputs[warmup:]:
        zero.zero_grad()
        ddp(x).sum().backward()
        ref_optim.zero_grad()
        ref(x).sum().backward()
        ref_optim.step()
        step_diffs.append(_max_diff(_params(ddp), _params(ref)))
        plain_optim.zero_grad()
        plain(x).sum().backward()
        plain_optim.step()
        plain_diffs.append(_max_diff(_params(ddp), _params(plain)))
    return {
        "vacuous_drift": vacuous_drift,
        "moved": _max_diff(initial, _params(ddp)),
        "step_diffs": step_diffs,
        "plain_diffs": plain_diffs,
        "params": _params(ddp),
        "bucket_bytes": [b.bytes for b in ddp_buckets(ddp) or []],
        "ref_bucket_bytes": [b.bytes for b in ddp_buckets(ref) or []],
    }


def _profiled_ranges(rank: int) -> dict[str, Any]:
    """Which named ranges one profiled step records, and how many are opened with no profiler."""
    case = Case(True, True, False, False)
    ddp, _ = _overlapped(case, _model())
    opened = []
    real_record_function = zero_module.record_function

    def counting(name: str) -> Any:
        opened.append(name)
        return real_record_function(name)

    zero_module.record_function = counting
    try:
        for _ in range(4):
            ddp(torch.randn(4, 16)).sum().backward()
        unprofiled = len(opened)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            ddp(torch.randn(4, 16)).sum().backward()
    finally:
        zero_module.record_function = real_record_function
    names = sorted({e.name for e in prof.events() if e.name.startswith("tpbench.zero.")})
    return {"unprofiled": unprofiled, "names": names}


def _value_errors(rank: int) -> dict[str, str]:
    """The message each invalid construction raises, by case."""
    found = {}
    ddp = DDP(_model())
    plain_zero = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD, lr=0.01)
    for wrap in (hook_with_zero_step, hook_with_zero_step_interleaved):
        try:
            wrap(allreduce_hook, ddp, plain_zero)
        except ValueError as e:
            found[f"{wrap.__name__}-no-overlap"] = str(e)
    unused = DDP(_model(), find_unused_parameters=True)
    zero = ZeroRedundancyOptimizer(unused.parameters(), optimizer_class=torch.optim.SGD, overlap_with_ddp=True, lr=0.01)
    try:
        hook_with_zero_step(allreduce_hook, unused, zero)
    except ValueError as e:
        found["find-unused"] = str(e)
    return found


def _check_case_on_path(rank: int, case: Case) -> dict[str, Any]:
    real = zero_module._completes_at_enqueue
    if case.stream_ordered:
        zero_module._completes_at_enqueue = lambda group, device: True
    try:
        return _check_case(rank, case)
    finally:
        zero_module._completes_at_enqueue = real


def _world_main(rank: int, world_size: int, cases: list[Case]) -> dict[str, Any]:
    return {
        "cases": {case: _check_case_on_path(rank, case) for case in cases},
        "ranges": _profiled_ranges(rank),
        "errors": _value_errors(rank),
    }


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"{n}ranks")
def world(request: pytest.FixtureRequest) -> dict[str, Any]:
    """One Gloo world per size runs every case; the tests below only read its results."""
    results = run_world(_world_main, request.param, CASES, timeout_s=150)
    return {"size": request.param, "ranks": results}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_parity_with_ddp_and_local_optimizer(world: dict[str, Any], case: Case) -> None:
    for rank, result in enumerate(world["ranks"]):
        r = result["cases"][case]
        assert r["vacuous_drift"] == [0.0] * len(r["vacuous_drift"]), f"rank {rank}: warm-up moved parameters"
        assert r["moved"] > 0.0, f"rank {rank}: parameters never updated"
        # Both sides reduce the same (compressed) gradients in the same order, so they agree as
        # closely with compression as without; compression itself moves the parameters far more
        # (measured: fp16 2e-5 to 6e-5, bf16 2e-4 to 7e-4), so a hook that skipped it would fail.
        assert max(r["step_diffs"]) <= 1e-6, f"rank {rank}: differs from DDP + local SGD: {r['step_diffs']}"
        if case.hook != "allreduce":
            assert max(r["plain_diffs"]) > 1e-5, f"rank {rank}: {case.hook} compression changed nothing"
    first = world["ranks"][0]["cases"][case]["params"]
    for rank, result in enumerate(world["ranks"][1:], start=1):
        assert _max_diff(first, result["cases"][case]["params"]) == 0.0, f"rank {rank} differs from rank 0"


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.bucket_cap_mb is None or c.bucket_cap_mb_list], ids=lambda c: c.id
)
def test_bucketings_reach_ddp(world: dict[str, Any], case: Case) -> None:
    """The parity above holds under the bucketing asked for, not under one DDP fell back to: a cap
    list builds its own buckets, DDP's default (1 MB first bucket) holds this small model in one;
    and the hooked model and its reference bucket alike."""
    for result in world["ranks"]:
        r = result["cases"][case]
        assert r["bucket_bytes"] == r["ref_bucket_bytes"]
        if case.bucket_cap_mb_list:
            assert r["bucket_bytes"] == CAP_LIST_BUCKET_BYTES
        else:
            assert len(r["bucket_bytes"]) == 1


def test_profiler_ranges_name_each_bucket(world: dict[str, Any]) -> None:
    for result in world["ranks"]:
        ranges = result["ranges"]
        assert ranges["unprofiled"] == 0, "record_function was entered without a profiler running"
        broadcasts = {n for n in ranges["names"] if ".broadcast[" in n}
        buckets = range(len(broadcasts))
        assert len(buckets) >= 2
        assert broadcasts == {f"tpbench.zero.broadcast[bucket={k}]" for k in buckets}
        steps = {n for n in ranges["names"] if ".step[" in n}
        assert steps and steps <= {f"tpbench.zero.step[bucket={k}]" for k in buckets}


def test_value_errors(world: dict[str, Any]) -> None:
    errors = world["ranks"][0]["errors"]
    assert "overlap_with_ddp=True" in errors["hook_with_zero_step-no-overlap"]
    assert "overlap_with_ddp=True" in errors["hook_with_zero_step_interleaved-no-overlap"]
    assert "find_unused_parameters" in errors["find-unused"]


def _soak(rank: int, world_size: int, iterations: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(6)])
    out = {}

    def counting_allreduce(seen: set[int], bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """DDP's all-reduce on the default group; the hook state ``seen`` collects the bucket indices."""
        seen.add(bucket.index())
        return allreduce_hook(None, bucket)

    for wrap in (hook_with_zero_step_interleaved, hook_with_zero_step):
        ddp = DDP(copy.deepcopy(model), bucket_cap_mb=1e-5)  # 10 bytes: one parameter per bucket
        zero = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, overlap_with_ddp=True)
        seen: set[int] = set()
        ddp.register_comm_hook(seen, wrap(counting_allreduce, ddp, zero, shard_buckets=True))
        torch.manual_seed(rank)
        for _ in range(iterations):
            zero.zero_grad()
            ddp(torch.randn(2, 16)).pow(2).mean().backward()
        out[wrap.__name__] = {"params": _params(ddp), "buckets": len(seen)}
    dist.barrier()
    return out


@pytest.mark.slow
def test_soak_tiny_buckets_three_ranks() -> None:
    """80 iterations of both hooks, one parameter per bucket, sharded: a hang fails via the timeout."""
    results = run_world(_soak, 3, 80, timeout_s=150)
    for name, first in results[0].items():
        assert first["buckets"] == 12
        for rank, result in enumerate(results[1:], start=1):
            assert _max_diff(first["params"], result[name]["params"]) == 0.0, f"{name}: rank {rank} differs"


def test_plan_shards_partitions_every_bucket() -> None:
    # The layout PyTorch's heuristic fails on (3 runs for 2 ranks): W, b, W, b, W, b, W, b in one bucket.
    buckets = [[4096, 64] * 4, [100], [7, 7, 7], [1] * 10]
    for world_size in (1, 2, 3, 5):
        shards = plan_shards(buckets, world_size, shard_buckets=True)
        for k, numels in enumerate(buckets):
            mine = sorted((s for s in shards if s.bucket == k), key=lambda s: s.start)
            assert [s.start for s in mine][0] == 0 and mine[-1].stop == len(numels)
            assert all(a.stop == b.start for a, b in zip(mine, mine[1:]))
            assert len({s.rank for s in mine}) == len(mine) <= world_size
        assert shards == sorted(shards, key=lambda s: (s.bucket, s.rank))
    two = plan_shards([[4096, 64] * 4], 2, shard_buckets=True)
    assert sorted((s.stop - s.start) for s in two) == [4, 4]
    whole = plan_shards(buckets, 3, shard_buckets=False)
    assert [(s.bucket, s.rank, s.start, s.stop) for s in whole] == [
        (k, k % 3, 0, len(n)) for k, n in enumerate(buckets)
    ]


def test_unsupported_torch_is_named() -> None:
    require_supported_torch(torch.__version__)
    with pytest.raises(RuntimeError, match=r"installed torch is 2\.99\.0"):
        require_supported_torch("2.99.0")
    with pytest.raises(RuntimeError, match=r"installed torch is 2\.3\.1\+cu121"):
        require_supported_torch("2.3.1+cu121")


def _wrong_objects(rank: int, world_size: int) -> dict[str, str]:
    """What each ZeRO hook raises when handed the wrong object for ``ddp`` or ``zero``."""
    model = _model()
    ddp = DDP(copy.deepcopy(model))
    zero = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD, overlap_with_ddp=True, lr=0.01)
    found = {}
    for name, args in {
        "module-as-ddp": (allreduce_hook, model, zero),
        "optimizer-as-zero": (allreduce_hook, ddp, torch.optim.SGD(ddp.parameters(), lr=0.01)),
    }.items():
        for wrap in (hook_with_zero_step, hook_with_zero_step_interleaved):
            try:
                wrap(*args)
                found[f"{wrap.__name__}-{name}"] = "accepted"
            except Exception as e:  # the type and message are what the test checks
                found[f"{wrap.__name__}-{name}"] = f"{type(e).__name__}: {e}"
    return found


def test_a_wrong_ddp_or_zero_is_named_not_blamed_on_torch() -> None:
    """A module passed for ``ddp`` or a plain optimizer for ``zero`` is a caller's mistake: it is
    named as such, not reported as private state missing from this torch release."""
    (found,) = run_world(_wrong_objects, 1, timeout_s=120)
    for wrap in ("hook_with_zero_step", "hook_with_zero_step_interleaved"):
        assert found[f"{wrap}-module-as-ddp"].startswith("TypeError: ddp must be a DistributedDataParallel")
        assert "got Sequential" in found[f"{wrap}-module-as-ddp"]
        assert found[f"{wrap}-optimizer-as-zero"].startswith("TypeError: zero must be a ZeroRedundancyOptimizer")
        assert "got SGD" in found[f"{wrap}-optimizer-as-zero"]
