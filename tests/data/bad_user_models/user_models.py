"""Factories for tests/test_user_models.py: one that keeps the protocol (``good``), one whose model
cannot fit in any machine's memory (``huge``), and one per way of breaking the protocol (used
by the NN-*.toml suites next to this file, each with its expected error on its first line).
tests/test_harden_user_code.py uses the hostile ones at the end: they sleep, fork, change torch's
process-wide state or train into NaN."""

import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

from tpbench.workloads import Bench, WorkloadContext, batch_seed


def good(ctx: WorkloadContext, width: int = 16) -> Bench:
    torch.manual_seed(ctx.seed)
    model = nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 4)).to(ctx.device)

    def train_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(batch_seed(ctx.seed, ctx.rank, step))
        x = torch.randn(ctx.batch_size, 8, generator=g)
        return x.to(ctx.device), torch.randint(0, 4, (ctx.batch_size,), generator=g).to(ctx.device)

    return Bench(model, train_batch, nn.functional.cross_entropy)


def huge(ctx: WorkloadContext, width: int = 1_000_000) -> Bench:
    """A 10^12-parameter layer: 4 TB of float32 (fine on the meta device, impossible on a rank)."""
    bench = good(ctx)
    bench.model = nn.Linear(width, width).to(ctx.device)
    return bench


def raises(ctx: WorkloadContext) -> Bench:
    raise RuntimeError("the dataset path is not configured")


def returns_model(ctx: WorkloadContext) -> nn.Module:
    return nn.Linear(2, 2)


def model_not_module(ctx: WorkloadContext) -> Bench:
    bench = good(ctx)
    bench.model = "a model"
    return bench


def loss_not_callable(ctx: WorkloadContext) -> Bench:
    bench = good(ctx)
    bench.loss = 0.0
    return bench


def batch_not_pair(ctx: WorkloadContext) -> Bench:
    bench = good(ctx)
    bench.train_batch = lambda step: torch.zeros(3)
    return bench


def batch_without_step(ctx: WorkloadContext) -> Bench:
    bench = good(ctx)
    bench.train_batch = lambda: (torch.zeros(2, 8), torch.zeros(2, dtype=torch.long))  # takes no step
    return bench


def no_default(ctx: WorkloadContext, width: int) -> Bench:
    return good(ctx, width)


def no_ctx() -> Bench:
    return good(None)


def params_without_ctx(width: int = 8) -> Bench:  # ctx forgotten: tpbench's ctx would land in width
    return good(None, width)


not_a_function = 3


def exits(ctx: WorkloadContext) -> Bench:
    sys.exit(0)


def interrupts(ctx: WorkloadContext) -> Bench:
    raise KeyboardInterrupt


def exits_on_ranks(ctx: WorkloadContext) -> Bench:
    """Passes the meta-device check, then calls ``sys.exit(0)`` on every rank."""
    if ctx.device.type != "meta":
        sys.exit(0)
    return good(ctx)


def sleeps(ctx: WorkloadContext) -> Bench:
    time.sleep(3600)
    return good(ctx)


def forks(ctx: WorkloadContext, pid_dir: str = "") -> Bench:
    """On the ranks (not on the meta device), leaves a child behind that would sleep for 10 minutes,
    its pid in a file under ``pid_dir``."""
    if ctx.device.type != "meta":
        child = os.fork()
        if child == 0:
            time.sleep(600)
            os._exit(0)
        (Path(pid_dir) / str(child)).touch()
    return good(ctx)


def doubles(ctx: WorkloadContext) -> Bench:
    torch.set_default_dtype(torch.float64)
    return good(ctx)


def threads(ctx: WorkloadContext) -> Bench:
    torch.set_num_threads(7)
    return good(ctx)


def nan_params(ctx: WorkloadContext) -> Bench:
    bench = good(ctx)
    with torch.no_grad():
        bench.model[0].weight[0, 0] = float("nan")
    return bench


def nan_when_asked(ctx: WorkloadContext) -> Bench:
    """``good``, with a NaN weight on the ranks where the environment sets ``TPBENCH_TEST_NAN``:
    one case identity, finite in one run and not in another."""
    bench = good(ctx)
    if os.environ.get("TPBENCH_TEST_NAN") and ctx.device.type != "meta":
        with torch.no_grad():
            bench.model[0].weight[0, 0] = float("nan")
    return bench


def nan_grads(state: object, bucket: torch.distributed.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A communication hook that writes NaN into every gradient."""
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(bucket.buffer().fill_(float("nan")))
    return fut


def unused_parameter(ctx: WorkloadContext) -> Bench:
    """``good``'s model beside a layer its forward never uses: DDP's second step raises its
    multi-line "Expected to have finished reduction" error."""
    bench = good(ctx)
    bench.model = _WithUnused(bench.model).to(ctx.device)
    return bench


class _WithUnused(nn.Module):
    def __init__(self, used: nn.Module) -> None:
        super().__init__()
        self.used, self.unused = used, nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def returns_none(state, bucket):  # unannotated: DDP refuses a "-> None" hook at validation
    """A communication hook that forgets its return: PyTorch's reducer would crash on it (SIGSEGV)."""
    bucket.buffer()


def hook_raises(state, bucket):
    """A communication hook that raises its own words, which say nothing of which hook it is."""
    raise ValueError("my hook is broken")


def short_result(state, bucket):
    """All-reduces, then returns the bucket's view one element short: DDP, taking its views of the
    result by offset, ran on without noticing; the ZeRO hooks failed slicing it."""
    tensor = bucket.buffer().div_(torch.distributed.get_world_size())
    return torch.distributed.all_reduce(tensor, async_op=True).get_future().then(lambda f: f.value()[0][:-1])


def not_decompressed(state, bucket):
    """fp16 compression that forgets to decompress: DDP casts the result into the fp32 gradients,
    the ZeRO hooks' optimizer step failed on the dtype ("expected dtype float ... got c10::Half")."""
    tensor = bucket.buffer().div(torch.distributed.get_world_size()).half()
    return torch.distributed.all_reduce(tensor, async_op=True).get_future().then(lambda f: f.value()[0])


def heldout_not_pairs(ctx: WorkloadContext) -> Bench:
    bench = good(ctx)
    bench.heldout_batches = lambda: 5
    return bench


def optimal_loss_nan(ctx: WorkloadContext) -> Bench:
    bench = good(ctx)
    bench.optimal_loss = float("nan")
    return bench


def dtype_default(ctx: WorkloadContext, dtype: torch.dtype = torch.float32) -> Bench:
    """A default no suite can give nor run.json record (it crashed the sweep writing the case)."""
    return good(ctx)
