"""Is a what-if host factor the tracer's cost, or the machine's speed while tracing? (docs/whatif-runs.md)

``tpbench whatif`` calibrates each case's compute to its timed steps: the factor is timed over
traced, and the traced steps run after the timed ones. This steps one case of suites/whatif.toml
on 2 Gloo ranks (pinned one core each, as tpbench pins them) in passes of three blocks of
``--steps`` steps: untraced, traced (torch.profiler as tpbench traces: CPU activity,
``record_shapes``, the same ranges), untraced again, in a seeded order per pass. Per pass it prints
the slowest rank's median step of each block and two ratios: untraced / traced, what calibration
would find were the model exact, and untraced / untraced, the same ratio with no tracer at all.
Where the two scatter alike, a factor says more about when the traced steps ran than about the
tracer. Last, rank 0 probes the tracer's cost per recorded op apart from any step: 2,000 small
ops (a 64-element add) untraced and traced in alternating blocks, five times.

Usage: ``python benchmarks/tracer_factor.py [PASSES] [--algorithm NAME] [--steps N]`` (default
10 passes of 8 steps, ``hook_with_zero_step_interleaved`` on loopback).
"""

import argparse
import os
import shlex
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile

from tpbench import suite as suite_mod
from tpbench.worker import build_case, train_step

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "suites", "whatif.toml")


def block(wl, tr, first: int, steps: int, traced: bool) -> list[float]:
    dist.barrier()
    out = []
    for i in range(first, first + steps):
        x, y = wl.train_batch(i)
        t0 = time.perf_counter()
        train_step(tr, wl, x, y, profiled=traced)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def op_cost_us(n: int = 2000) -> list[float]:
    """The tracer's cost per recorded op, in µs: a traced block of ``n`` adds against the mean of the
    untraced blocks either side of it, five times."""
    a, b = torch.randn(64), torch.randn(64)

    def per_op() -> float:
        t = time.perf_counter_ns()
        for _ in range(n):
            torch.add(a, b)
        return (time.perf_counter_ns() - t) / n / 1e3

    per_op()
    out = []
    for _ in range(5):
        before = per_op()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True):
            traced = per_op()
        out.append(traced - (before + per_op()) / 2)
    return out


def worker(rank: int, ws: int, args: argparse.Namespace) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29613")
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    torch.set_num_threads(1)
    os.sched_setaffinity(0, {rank % os.cpu_count()})
    case = next(
        c
        for c in suite_mod.expand(suite_mod.load(SUITE))
        if c.algorithm == args.algorithm and c.interconnect == "loopback"
    )
    wl, tr = build_case(case, rank, ws, torch.device("cpu"))
    step = case.warmup_steps
    block(wl, tr, 0, case.warmup_steps, False)
    rows = []
    for p in range(args.passes):
        order = ["untraced", "traced", "untraced again"]
        np.random.default_rng(p).shuffle(order)
        medians = {}
        for name in order:
            if name == "traced":
                with profile(activities=[ProfilerActivity.CPU], record_shapes=True):
                    t = block(wl, tr, step, args.steps, True)
            else:
                t = block(wl, tr, step, args.steps, False)
            step += args.steps
            got = [None] * ws
            dist.all_gather_object(got, t)
            medians[name] = float(np.median(np.max(got, axis=0)))
        rows.append(medians)
    if rank == 0:
        print(
            f"{case.algorithm} on loopback, {args.passes} passes of {args.steps} steps, load1 {os.getloadavg()[0]:.2f}"
        )
        for m in rows:
            print(
                f"untraced {m['untraced']:6.2f} ms  traced {m['traced']:6.2f}  again {m['untraced again']:6.2f}  "
                f"untraced/traced {m['untraced'] / m['traced']:.2f}  "
                f"untraced/untraced {m['untraced'] / m['untraced again']:.2f}"
            )
        for what, num, den in (
            ("untraced/traced", "untraced", "traced"),
            ("untraced/untraced", "untraced", "untraced again"),
        ):
            r = np.array([m[num] / m[den] for m in rows])
            sd = f"sd of log {np.log(r).std(ddof=1):.3f}" if len(r) > 1 else "no sd (one pass)"
            print(f"{what:18s} median {np.median(r):.2f}, {r.min():.2f}–{r.max():.2f}, {sd}")
        cost = op_cost_us()
        print(f"tracer cost per op: {', '.join(f'{c:.2f}' for c in cost)} µs (median {np.median(cost):.2f})")
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("passes", nargs="?", type=int, default=10)
    ap.add_argument("--algorithm", default="hook_with_zero_step_interleaved")
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    if args.passes < 1:
        ap.error(f"passes {args.passes}: expected at least 1")
    print("command:", shlex.join(["python", "benchmarks/tracer_factor.py", *sys.argv[1:]]), flush=True)
    mp.spawn(worker, args=(2, args), nprocs=2)
