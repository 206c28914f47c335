"""How much of a round's noise does each way of running two arms cancel? (docs/tune.md)

Two arms of the same case (A/A, suites/tune-planted.toml's 0 % arm on 2 Gloo ranks, pinned one
core each as tpbench pins them): the per-round log ratio of their step-time medians (slowest
rank per step) should be 0, and its spread over rounds is the noise a race must beat. Four
designs, in a seeded order within each round so that they see the same machine:

- rebuild: per arm, build the model, 3 warm-up and 10 timed steps (what a sweep repeat does);
- reuse: the same with the models built once;
- interleave: both built once, warm-up then timed steps alternating A, B, A, B;
- inter-build: both built per round, then interleaved.

Usage: ``python benchmarks/round_noise.py [ROUNDS] [--competitor]`` (default 40 rounds; with
``--competitor`` a busy loop runs throughout). Prints the command and the machine's load, then each
design's spread and mean.
"""

import argparse
import os
import shlex
import subprocess
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tpbench import suite as suite_mod
from tpbench.worker import build_case, train_step

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "suites", "tune-planted.toml")
WARM, TIMED, GAP = 3, 10, 0.05


def make(case, rank, ws):
    return build_case(case, rank, ws, torch.device("cpu"))


def step(arm, i):
    wl, tr = arm
    x, y = wl.train_batch(i)
    t0 = time.perf_counter()
    train_step(tr, wl, x, y)
    return (time.perf_counter() - t0) * 1e3


def block(arm):
    dist.barrier()
    out = [step(arm, i) for i in range(WARM + TIMED)][WARM:]
    time.sleep(GAP)
    return out


def interleaved(a, b):
    dist.barrier()
    ta, tb = [], []
    for i in range(WARM + TIMED):
        x, y = step(a, i), step(b, i)
        if i >= WARM:
            ta.append(x)
            tb.append(y)
    time.sleep(GAP)
    return ta, tb


def worker(rank, ws, rounds):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29611")
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    torch.set_num_threads(1)
    os.sched_setaffinity(0, {rank % os.cpu_count()})  # as tpbench pins 2 ranks on 2 cores
    s = suite_mod.load(SUITE)
    case = suite_mod.expand(s)[0]
    a0, b0 = make(case, rank, ws), make(case, rank, ws)
    res = {d: [] for d in ("rebuild", "reuse", "interleave", "inter-build")}
    for r in range(rounds):
        order = list(res)
        np.random.default_rng(r).shuffle(order)
        for d in order:
            if d == "rebuild":
                ta = block(make(case, rank, ws))
                tb = block(make(case, rank, ws))
            elif d == "reuse":
                ta, tb = block(a0), block(b0)
            elif d == "interleave":
                ta, tb = interleaved(a0, b0)
            else:
                ta, tb = interleaved(make(case, rank, ws), make(case, rank, ws))
            got = [None] * ws
            dist.all_gather_object(got, (ta, tb))
            if rank == 0:
                sa = np.max([g[0] for g in got], axis=0)
                sb = np.max([g[1] for g in got], axis=0)
                res[d].append(np.log(np.median(sa) / np.median(sb)))
    if rank == 0:
        print(f"{rounds} rounds, load1 {os.getloadavg()[0]:.2f}")
        for d, v in res.items():
            v = np.array(v)
            print(f"{d:12s} sd of log ratio {v.std(ddof=1):.3f}  mean {v.mean():+.3f}")
    dist.destroy_process_group()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, checked before any rank starts: the script used to take any word that did not
    start with ``--`` as ROUNDS and ignore the rest, so ``--help`` or a misspelt ``--competitor``
    silently ran the whole measurement, and ``abc`` or ``1`` ended in a traceback."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "rounds", nargs="?", type=int, default=40, metavar="ROUNDS", help="A/A rounds per design (default 40)"
    )
    parser.add_argument("--competitor", action="store_true", help="run a busy loop throughout")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error(f"ROUNDS {args.rounds}: expected at least 2 (a spread needs two rounds)")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    load = os.getloadavg()
    print("command:", shlex.join(["python", "benchmarks/round_noise.py", *argv]), flush=True)
    print(f"load average (1, 5 min) at the start: {load[0]:.2f} {load[1]:.2f}; {os.cpu_count()} CPUs", flush=True)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.competitor else None
    try:
        mp.spawn(worker, args=(2, args.rounds), nprocs=2)
    finally:
        if busy:
            busy.kill()


if __name__ == "__main__":
    main()
