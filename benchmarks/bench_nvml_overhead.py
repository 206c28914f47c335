"""How much the NVML sampler slows the timed steps: the same case with and without it, in one run.

Runs the worker's own repeat loop (``CaseRunner.run_repeat``: build, warm-up, timed steps) in a
1-rank Gloo world inside this process, alternating rounds with the sampler off and on (ABBA, so
a drifting machine favours neither), and reports the median over rounds of the paired ratio
(round r's median timed step with the sampler / without it; target <= 1.02). Pairing within a
round is what keeps a shared, drifting machine's noise out of the ratio.

On a machine with an NVIDIA GPU the case runs on CUDA against the real NVML. Without one the
sampler can only be measured against a simulated NVML whose four calls per sample each sleep
``--sim-query-ms / 4`` with the GIL released, as ctypes calls do: that measures the sampler's
Python-side cost, not the driver's. The output says which one ran.

Usage: python -m benchmarks.bench_nvml_overhead [--rounds 8] [--steps 30] [--interval-ms 50]
       [--sim-query-ms 2] [--threads N] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pynvml
import torch
import torch.distributed as dist

from benchmarks.provenance import provenance
from tpbench.capture import nvml
from tpbench.suite import Machine, expand, parse
from tpbench.worker import CaseRunner, Events, Rank

SUITE = """
[defaults]
world_size = 1
backend = "gloo"
device = "{device}"
workload = "mlp"
batch_size = {batch}
warmup_steps = 5
steps = {steps}
repeats = 1
[capture]
profiler_steps = 0
nvml_interval_ms = {interval}
[workloads.mlp]
width = {width}
depth = {depth}
"""


class SimulatedNvml:
    """Stands in for pynvml on machines without a GPU: constant answers, a configurable cost."""

    NVMLError = pynvml.NVMLError

    def __init__(self, query_ms: float) -> None:
        self.call_s = query_ms / 4 / 1e3

    def _cost(self) -> None:
        time.sleep(self.call_s)  # releases the GIL, like a ctypes call into the driver

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetIndex(self, handle):
        return handle

    def nvmlDeviceGetName(self, handle):
        return "simulated GPU"

    def nvmlDeviceGetNvLinkState(self, handle, link):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetUtilizationRates(self, handle):
        self._cost()
        return SimpleNamespace(gpu=0, memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle):
        self._cost()
        return SimpleNamespace(used=0)

    def nvmlDeviceGetClockInfo(self, handle, kind):
        self._cost()
        return 0

    def nvmlDeviceGetFieldValues(self, handle, fields):
        self._cost()
        ok = SimpleNamespace(
            nvmlReturn=pynvml.NVML_SUCCESS,
            valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
            value=SimpleNamespace(ullVal=0),
        )
        return [ok for _ in fields]


@dataclass(frozen=True)
class Overhead:
    nvml: str  # "real" or "simulated"
    device: str
    interval_ms: int
    rounds: int
    steps: int
    off_ms: list[float]  # median timed step per round, sampler off
    on_ms: list[float]
    samples_per_round: float
    sampler_cpu_pct: float  # the sampler thread's CPU time / its lifetime, beside a repeat
    median_off_ms: float
    median_on_ms: float
    ratio: float  # median over rounds of on_ms[r] / off_ms[r]
    ratio_min: float
    ratio_max: float


def measure(
    rounds: int = 8,
    steps: int = 30,
    interval_ms: int = 50,
    sim_query_ms: float = 2.0,
    width: int = 512,
    depth: int = 4,
    batch: int = 32,
) -> Overhead:
    """Alternate rounds with the sampler off and on; needs no process group of its own."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    (case,) = expand(
        parse(
            SUITE.format(device=device.type, batch=batch, steps=steps, interval=interval_ms, width=width, depth=depth)
        ),
        Machine(gpus=torch.cuda.device_count()),
    )
    gpu = nvml.open_gpu(device) if cuda else nvml.open_device(SimulatedNvml(sim_query_ms))
    if isinstance(gpu, nvml.Unavailable):
        raise SystemExit(f"bench_nvml_overhead: {gpu.reason}")
    with tempfile.TemporaryDirectory(prefix="tpbench-nvml-bench-") as tmp:
        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        runner = CaseRunner(Rank(0, 1, 0, 1), device, Path(tmp), Events(None), dist.new_group(backend="gloo"))
        off: list[float] = []
        on: list[float] = []
        for r in range(rounds):
            for sampled in (False, True) if r % 2 == 0 else (True, False):
                runner.gpu = gpu if sampled else nvml.Unavailable("sampler off for the comparison")
                rows = runner.run_repeat(case, r, profile_after=False)
                median = float(rows[rows.phase == "timed"].step_ms.median())
                (on if sampled else off).append(median)
        # The sampler's own CPU share, beside one more repeat: a cost figure free of timing noise.
        runner.gpu = nvml.Unavailable("sampler run by the benchmark itself")
        sampler = nvml.Sampler(gpu, interval_ms).start()
        runner.run_repeat(case, rounds, profile_after=False)
        sampler.stop()
        cpu_pct = 100 * sampler.cpu_ns / sampler.wall_ns
        parts = sorted((Path(tmp) / "cases" / case.case_id / "nvml-parts").glob("*.parquet"))
        samples = [len(pd.read_parquet(p)) for p in parts]
        dist.destroy_process_group()
    paired = [a / b for a, b in zip(on, off)]
    return Overhead(
        "real" if cuda else "simulated",
        str(device),
        interval_ms,
        rounds,
        steps,
        off,
        on,
        statistics.mean(samples) if samples else 0.0,
        cpu_pct,
        statistics.median(off),
        statistics.median(on),
        statistics.median(paired),
        min(paired),
        max(paired),
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--interval-ms", type=int, default=50)
    ap.add_argument("--sim-query-ms", type=float, default=2.0, help="simulated NVML cost per sample (no GPU only)")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--json", type=Path, help="also write the result here")
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    for name in ("rounds", "steps"):  # 0 was a traceback after the run
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)}: expected at least 1")
    print(provenance("benchmarks.bench_nvml_overhead", argv), flush=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = measure(args.rounds, args.steps, args.interval_ms, args.sim_query_ms, args.width, args.depth, args.batch)
    print(
        f"NVML: {result.nvml} ({result.device}), sampling every {result.interval_ms} ms, "
        f"{result.samples_per_round:.0f} samples per round; the sampler thread used "
        f"{result.sampler_cpu_pct:.2f}% of one core"
    )
    print(
        f"median timed step: off {result.median_off_ms:.3f} ms, on {result.median_on_ms:.3f} ms "
        f"over {result.rounds} rounds × {result.steps} steps"
    )
    print(
        f"ratio on/off (median of per-round ratios): {result.ratio:.4f} "
        f"[min {result.ratio_min:.3f}, max {result.ratio_max:.3f}] (target <= 1.02)"
    )
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=1))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
