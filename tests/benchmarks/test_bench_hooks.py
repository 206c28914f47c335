"""Hook dispatch overhead per bucket: what the ZeRO overlap hooks cost beyond the work itself.

A one-rank Gloo world in this process and a model of tiny layers with a tiny bucket cap: the
collectives and the arithmetic are nearly free, so a training step's time is dominated by
per-bucket bookkeeping (DDP's own, the hook's, the optimizer's). Each hook is timed at two bucket
counts; the slope between them is the cost of one more bucket, and comparing it with plain
``allreduce_hook`` + a ZeRO step after backward isolates what the overlap hooks add.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
hooks = pytest.importorskip("tpbench.hooks", reason="tpbench.hooks not importable yet")
if not hasattr(hooks, "hook_with_zero_step"):
    pytest.skip("tpbench.hooks.hook_with_zero_step not written yet", allow_module_level=True)

from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook  # noqa: E402
from torch.distributed.optim import ZeroRedundancyOptimizer  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

WIDTH = 16
BUCKET_CAP_MB = WIDTH * (WIDTH + 1) * 4 / 2**20  # one layer's weight and bias per bucket
WARMUP = 3  # the ZeRO hooks' first two iterations only record the buckets


@pytest.fixture(scope="module")
def world() -> Iterator[None]:
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    with tempfile.TemporaryDirectory() as d:  # the FileStore removes its file itself
        dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def _model(layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)))


def _step_fn(kind: str, layers: int) -> tuple[Callable[[], None], int]:
    """A warmed-up training step of ``kind`` and the number of DDP buckets it runs through."""
    ddp = DDP(_model(layers), bucket_cap_mb=BUCKET_CAP_MB)
    zero = ZeroRedundancyOptimizer(
        ddp.parameters(), optimizer_class=torch.optim.SGD, lr=0.01, overlap_with_ddp=kind != "allreduce_then_zero_step"
    )
    seen: set[int] = set()

    # No annotations: DDP rejects a hook whose bucket annotation is not the GradBucket class itself,
    # and under ``from __future__ import annotations`` it would be a string.
    def counted_allreduce(state, bucket):
        seen.add(bucket.index())
        return allreduce_hook(state, bucket)

    if kind == "allreduce_then_zero_step":
        ddp.register_comm_hook(None, counted_allreduce)
    else:
        ddp.register_comm_hook(None, getattr(hooks, kind)(counted_allreduce, ddp, zero))
    x = torch.randn(8, WIDTH)

    def step() -> None:
        zero.zero_grad()
        ddp(x).sum().backward()
        if kind == "allreduce_then_zero_step":
            zero.step()

    for _ in range(WARMUP):
        seen.clear()
        step()
    return step, len(seen)


@pytest.mark.parametrize("layers", [4, 32])
@pytest.mark.parametrize("kind", ["allreduce_then_zero_step", "hook_with_zero_step", "hook_with_zero_step_interleaved"])
def test_hook_step_per_bucket(benchmark, world: None, kind: str, layers: int) -> None:
    step, buckets = _step_fn(kind, layers)
    benchmark.group = f"zero hooks, 1 rank, {layers} layers"
    benchmark.extra_info["buckets"] = buckets
    benchmark(step)
    assert buckets >= layers // 2
