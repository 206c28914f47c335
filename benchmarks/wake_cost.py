"""How much slower does compute run right after the thread has slept? (docs/interconnects.md)

On a shaped link a rank's thread sleeps through long waits for the wire, on loopback it barely
waits, so compute that follows a wait may run at another speed on each link, which the what-if
(it carries a twin's traced compute to another link) cannot see. This probe builds the first case
of suites/whatif.toml (its workload, batch and optimizer, as a sweep builds them, in one process
with one thread) and times it right after sleeping 0, 5, 20, 50 and 150 ms: its optimizer step,
and its forward and backward. The sleeps take turns within each block so that the machine's drift
falls on all alike.

Usage: ``python benchmarks/wake_cost.py [BLOCKS]`` (default 6 blocks of 10 samples per sleep).
Prints the command and the machine's load, then each sleep's median, 10th and 90th percentile in ms.
Measure on an otherwise idle machine.
"""

import argparse
import os
import shlex
import statistics
import sys
import time

import torch

from tpbench import suite as suite_mod
from tpbench import workloads
from tpbench.training import make_optimizer
from tpbench.workloads.base import WorkloadContext

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "suites", "whatif.toml")
SLEEPS_MS = (0, 5, 20, 50, 150)
SAMPLES = 10


def main(blocks: int) -> None:
    torch.set_num_threads(1)
    case = suite_mod.expand(suite_mod.load(SUITE))[0]  # every case of the suite has the same model
    wl_cls = workloads.resolve(case.workload)
    ctx = WorkloadContext(rank=0, world_size=1, batch_size=case.batch_size, seed=case.seed, device=torch.device("cpu"))
    workload = wl_cls(wl_cls.Params(**dict(case.workload_params)), ctx)
    model = workload.build_model()
    opt = make_optimizer(case, model.parameters())
    x, y = workload.train_batch(0)

    def forward_backward() -> None:
        opt.zero_grad()
        workload.loss(model(x), y).backward()

    for _ in range(20):  # warm-up: allocations, AdamW's state
        forward_backward()
        opt.step()
    parts = {"optimizer step": opt.step, "forward and backward": forward_backward}
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(blocks):
        for name, work in parts.items():
            for sleep_ms in SLEEPS_MS:
                for _ in range(SAMPLES):
                    time.sleep(sleep_ms / 1e3)
                    t0 = time.perf_counter()
                    work()
                    times.setdefault((name, sleep_ms), []).append((time.perf_counter() - t0) * 1e3)
    for (name, sleep_ms), ts in times.items():
        q = statistics.quantiles(ts, n=10)
        median = statistics.median(ts)
        print(f"{name:21s} after {sleep_ms:3d} ms asleep: median {median:.2f} ms (p10 {q[0]:.2f}, p90 {q[-1]:.2f})")


def parse_blocks(argv: list[str]) -> int:
    """BLOCKS, checked: read by hand it made ``--help`` a traceback and ``0`` one after the warm-up."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("blocks", nargs="?", type=int, default=6, metavar="BLOCKS", help="default 6")
    blocks = parser.parse_args(argv).blocks
    if blocks < 1:
        parser.error(f"BLOCKS {blocks}: expected at least 1")
    return blocks


if __name__ == "__main__":
    blocks = parse_blocks(sys.argv[1:])
    load = os.getloadavg()
    print("command:", shlex.join(["python", "benchmarks/wake_cost.py", *sys.argv[1:]]))
    print(f"load average (1, 5 min) at the start: {load[0]:.2f} {load[1]:.2f}; {os.cpu_count()} CPUs", flush=True)
    main(blocks)
