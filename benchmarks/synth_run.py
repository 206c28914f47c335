"""A realistic run directory made without running anything, for the report's benchmark and tests.

A ZeRO sweep of every algorithm over bucket sizes, ``shard_buckets`` and interconnects is what a
real GPU node produces and what a 2-core machine cannot run in seconds. This writes one through
the store's own writers, with the suite's own expansion (so case ids, collapsed keys and labels
are the real ones): steps.parquet per case from a simple cost model with per-repeat and per-step
noise, the trace-derived tables (intervals built per traced step, then overlap and collectives
computed from them by ``tpbench.analysis``), NVML samples in the capture module's columns, a failed
case, and summary.parquet via ``sweep.finalize``.

``make_localsgd_run`` writes a post-local SGD sweep with held-out losses, the known optimum and
parameter drift, for the convergence sections.

Usage: python -m benchmarks.synth_run OUT_ROOT [--buckets 1 2 4 8 16 25] [--repeats 3] [--localsgd]
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from tpbench import record, store, sweep
from tpbench.analysis.bandwidth import collective_bandwidth
from tpbench.analysis.overlap import step_overlap
from tpbench.analysis.timeline import INTERVAL_COLUMNS
from tpbench.capture.nvml import COLUMNS as NVML_COLUMNS
from tpbench.suite import Case, Machine, expand, parse

ENVIRONMENT: dict[str, Any] = {
    "tpbench": "0.1.0",
    "git": {"commit": "0123456789abcdef0123", "dirty": False},
    "torch": "2.13.0",
    "cuda": "12.8",
    "nccl": "2.27.3",
    "gpu_count": 8,
    "gpu_model": "Synthetic GPU",
    "gpu_driver": "570.00",
    "cpu_model": "Synthetic CPU",
    "cpu_count": 64,
    "hostname": "synthetic",
    "python": "3.11.7",
    "platform": "Linux",
}

SUITE = """\
[suite]
name = "{name}"
description = "Synthetic ZeRO sweep written by benchmarks/synth_run.py (no rank ran)"
[defaults]
world_size = {world_size}
backend = "gloo"
device = "cpu"
warmup_steps = 3
steps = {steps}
repeats = {repeats}
[sweep]
algorithm = ["ddp", "zero_no_overlap", "hook_with_zero_step", "hook_with_zero_step_interleaved"]
bucket_cap_mb = {buckets}
shard_buckets = [false, true]
interconnect = {interconnects}
[capture]
profiler_steps = {traced}
"""

MODEL_MB = 100.0  # gradient bytes of the synthetic model
GBPS = {"loopback": 5.0, "tcp-10gbit": 1.25, "tcp-1gbit": 0.125}  # GB/s per interconnect


@dataclass(frozen=True)
class Cost:
    """A step's parts in ms: compute, communication, optimizer, and how much comm compute hides."""

    compute: float
    comm: float
    optimizer: float
    hidden: float

    @property
    def step(self) -> float:
        return self.compute + self.comm * (1 - self.hidden) + self.optimizer


def cost(case: Case) -> Cost:
    """Bigger buckets hide less (fewer, later collectives) but pay less per-collective latency;
    ZeRO shards the optimizer; the hooks hide its step under backward, interleaved more so
    except on slow links where its extra broadcasts queue behind the allreduces."""
    comm = MODEL_MB / 1e3 / GBPS.get(case.interconnect, 1.0) * 1e3 * 2 * (case.world_size - 1) / case.world_size
    buckets = max(1, math.ceil(MODEL_MB / case.bucket_cap_mb))
    comm += 0.08 * buckets
    hidden = min(0.85, 0.35 + 0.5 * (1 - 1 / buckets))
    optimizer = 12.0
    if case.algorithm != "ddp":
        optimizer /= case.world_size
        comm *= 1.5  # the parameters' broadcast after the sharded step
    if case.algorithm == "hook_with_zero_step":
        optimizer *= 0.5
    if case.algorithm == "hook_with_zero_step_interleaved":
        optimizer *= 0.25
        hidden = min(0.95, hidden + (0.1 if GBPS.get(case.interconnect, 1.0) >= 1 else -0.15))
    if case.shard_buckets:
        optimizer *= 0.9
    return Cost(compute=30.0, comm=comm, optimizer=optimizer, hidden=hidden)


def make_run(
    root: Path,
    *,
    name: str = "synthetic-zero",
    buckets: tuple[float, ...] = (1, 2, 4, 8, 16, 25),
    interconnects: tuple[str, ...] = ("loopback", "tcp-10gbit", "tcp-1gbit"),
    world_size: int = 2,
    repeats: int = 3,
    steps: int = 20,
    traced: int = 2,
    seed: int = 0,
    model: Callable[[Case], Cost] = cost,
    failed: int = 1,
    nvml: bool = True,
) -> Path:
    """Write the run under ``root`` and return its directory."""
    text = SUITE.format(
        name=name,
        world_size=world_size,
        steps=steps,
        repeats=repeats,
        traced=traced,
        buckets=list(buckets),
        interconnects=list(interconnects).__repr__().replace("'", '"'),
    )
    suite = parse(text, f"{name}.toml")
    cases = expand(suite, Machine(gpus=0))
    run = store.Run.create(root, suite.name, suite.path, text, [c.params() for c in cases], dict(ENVIRONMENT))
    rng = np.random.default_rng(seed)
    for i, case in enumerate(cases):
        if i >= len(cases) - failed:
            run.set_case(
                case.case_id,
                store.FAILED,
                error=f"rank 1 was killed by SIGKILL (synthetic failure of case {i})",
                detail="--- rank 1 log (last lines) ---\nRuntimeError: synthetic",
                failed_at=time.time(),
            )
            continue
        c = model(case)
        _write_steps(run.dir, case, c, rng)
        if traced:
            intervals, spans = _intervals(case, c, traced)
            store.write_case_table(run.dir, case.case_id, "intervals", intervals)
            store.write_case_table(run.dir, case.case_id, "overlap", step_overlap(intervals, spans))
            store.write_case_table(run.dir, case.case_id, "collectives", collective_bandwidth(intervals))
        if nvml:
            store.write_case_table(run.dir, case.case_id, "nvml", _nvml(case, c, rng))
        run.set_case(case.case_id, store.DONE)
    run.add_wall_time(float(sum(model(c).step for c in cases) * (steps + 3) * repeats / 1e3 * 1.3))
    run.set_status(record.COMPLETE_WITH_FAILURES if failed else record.COMPLETE)
    sweep.finalize(run)
    return run.dir


def _write_steps(run_dir: Path, case: Case, c: Cost, rng: np.random.Generator) -> None:
    n = case.warmup_steps + case.steps
    for repeat in range(case.repeats):
        drift = rng.lognormal(0, 0.03)
        rows = []
        for rank in range(case.world_size):
            ms = c.step * drift * rng.lognormal(0, 0.05, n) * (1 - 0.02 * rank)
            ms[: case.warmup_steps] *= 1.8
            rows.append(
                pd.DataFrame(
                    {
                        "repeat": repeat,
                        "rank": rank,
                        "step": np.arange(n),
                        "phase": ["warmup" if s < case.warmup_steps else "timed" for s in range(n)],
                        "step_ms": ms,
                        "loss": 2.3 * np.exp(-np.arange(n) / 40) + 0.1,
                        "elapsed_s": np.cumsum(ms) / 1e3,
                        "peak_rss_mb": 900 + 40 * rank + 0.5 * case.bucket_cap_mb,
                        "peak_allocated_mb": 2000 + (800 if case.algorithm == "ddp" else 800 / case.world_size),
                        "peak_reserved_mb": 2600 + 4 * case.bucket_cap_mb,
                    }
                )
            )
        store.write_repeat(run_dir, case.case_id, repeat, pd.concat(rows, ignore_index=True))
    store.finish_case(run_dir, case.case_id, case.repeats)


def _intervals(case: Case, c: Cost, traced: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per rank and traced step: forward and backward ops on the training thread, one allreduce per
    bucket launched as its gradients are ready, the optimizer (after backward, or per bucket in the hooks)."""
    rows, spans = [], []
    buckets = max(1, math.ceil(MODEL_MB / case.bucket_cap_mb))
    bucket_bytes = int(MODEL_MB * 1e6 / buckets)
    ops = 60
    for rank in range(case.world_size):
        t = 1_000_000_000 + rank * 20_000
        for step in range(case.warmup_steps + case.steps, case.warmup_steps + case.steps + traced):
            start = t
            op_ns = int(c.compute * 1e6 / ops)
            for k in range(ops):
                rows.append(
                    (
                        rank,
                        step,
                        "compute",
                        "thread 1",
                        "aten::addmm" if k % 3 else "aten::relu",
                        t,
                        t + op_ns,
                        None,
                        None,
                        None,
                        None,
                        False,
                    )
                )
                t += op_ns
            backward_start = start + ops // 3 * op_ns
            comm_ns = int(c.comm * 1e6 / buckets)
            free = backward_start
            for b in range(buckets):
                ready = backward_start + int((b + 1) / buckets * (t - backward_start))
                s = max(ready, free)
                rows.append(
                    (
                        rank,
                        step,
                        "comm",
                        "gloo thread",
                        "gloo:all_reduce",
                        s,
                        s + comm_ns,
                        bucket_bytes,
                        "allreduce",
                        "0",
                        case.world_size,
                        False,
                    )
                )
                free = s + comm_ns
            exposed = max(t, start + int((c.compute + c.comm * (1 - c.hidden)) * 1e6))
            opt_ns = int(c.optimizer * 1e6)
            rows.append(
                (
                    rank,
                    step,
                    "optimizer",
                    "thread 1",
                    "tpbench.optimizer",
                    exposed,
                    exposed + opt_ns,
                    None,
                    None,
                    None,
                    None,
                    False,
                )
            )
            rows.append(
                (
                    rank,
                    step,
                    "compute",
                    "thread 1",
                    "aten::_fused_adamw_",
                    exposed,
                    exposed + opt_ns,
                    None,
                    None,
                    None,
                    None,
                    False,
                )
            )
            t = max(free, exposed + opt_ns)
            spans.append((rank, step, start, t))
            t += 50_000
    df = pd.DataFrame(rows, columns=list(INTERVAL_COLUMNS))
    df = df.astype(
        {
            "rank": "int32",
            "step": "int64",
            "start_ns": "int64",
            "end_ns": "int64",
            "bytes": "Int64",
            "group_size": "Int64",
        }
    )
    for col in ("lane", "stream_or_thread", "name", "collective", "process_group"):
        df[col] = df[col].astype("category")
    return df, pd.DataFrame(spans, columns=["rank", "step", "start_ns", "end_ns"])


def _nvml(case: Case, c: Cost, rng: np.random.Generator, interval_ms: float = 50.0) -> pd.DataFrame:
    """Samples every ``interval_ms`` over each repeat: idle set-up, warm-up, timed steps, idle gather."""
    frames = []
    n = case.warmup_steps + case.steps
    for repeat in range(case.repeats):
        ends = np.cumsum(np.full(n, c.step)) + 200.0  # ms since the sampler started; 200 ms of set-up
        total = ends[-1] + 150.0
        t = np.arange(0.0, total, interval_ms)
        step = np.searchsorted(ends, t)
        inside = (t >= 200.0) & (step < n)
        phase = np.where(~inside, "idle", np.where(step < case.warmup_steps, "warmup", "timed"))
        for rank in range(case.world_size):
            busy = inside * (70 + 25 * c.compute / c.step)
            frames.append(
                pd.DataFrame(
                    {
                        "rank": rank,
                        "repeat": repeat,
                        "step": np.where(inside, step, -1),
                        "phase": phase,
                        "t_ns": (t * 1e6).astype("int64") + repeat * 10**10,
                        "ts_us": t * 1e3,
                        "query_ms": 1.2,
                        "gpu_util_pct": np.clip(busy + rng.normal(0, 3, len(t)), 0, 100),
                        "mem_util_pct": busy * 0.4,
                        "mem_used_mb": 2600 + 4 * case.bucket_cap_mb + rank * 10.0,
                        "power_w": 90 + 4 * busy,
                        "sm_clock_mhz": np.where(inside, 1980.0, 345.0),
                        "pcie_tx_mb_s": inside * (MODEL_MB / c.step * 1e3 * 0.1),
                        "pcie_rx_mb_s": inside * (MODEL_MB / c.step * 1e3 * 0.1),
                        "nvlink_tx_mb_s": np.nan,
                        "nvlink_rx_mb_s": np.nan,
                    }
                )
            )
    return pd.concat(frames, ignore_index=True)[list(NVML_COLUMNS)]


LOCALSGD_SUITE = """\
[suite]
name = "{name}"
description = "Synthetic post-local SGD sweep written by benchmarks/synth_run.py (no rank ran)"
[defaults]
algorithm = "post_localSGD_hook"
world_size = 4
ranks_per_node = 2
backend = "gloo"
device = "cpu"
workload = "markov"
warmup_steps = 0
steps = {steps}
repeats = {repeats}
eval_every = {eval_every}
[sweep]
start_localSGD_iter = ["never", 0, {late}]
averaging_period = [4, 16]
[capture]
profiler_steps = 0
"""


def make_localsgd_run(
    root: Path,
    *,
    name: str = "synthetic-localsgd",
    steps: int = 120,
    repeats: int = 2,
    eval_every: int = 10,
    optimum: float = 1.5,
    seed: int = 0,
) -> Path:
    """A post-local SGD run: local steps are cheaper (no global allreduce) but converge to a
    held-out loss above DDP's, more so the longer the averaging period; parameters drift
    between averagings. Steps carry held-out loss every ``eval_every`` steps, drift before each
    averaging and the workload's optimum, as the worker writes them."""
    text = LOCALSGD_SUITE.format(name=name, steps=steps, repeats=repeats, eval_every=eval_every, late=steps // 4)
    suite = parse(text, f"{name}.toml")
    cases = expand(suite, Machine(gpus=0))
    run = store.Run.create(root, suite.name, suite.path, text, [c.params() for c in cases], dict(ENVIRONMENT))
    rng = np.random.default_rng(seed)
    for case in cases:
        start = None if case.start_localSGD_iter == "never" else int(case.start_localSGD_iter)
        step = np.arange(steps)
        local = np.zeros(steps, bool) if start is None else step >= start
        gap = 0.0 if start is None else 0.004 * case.averaging_period
        for repeat in range(case.repeats):
            rows = []
            for rank in range(case.world_size):
                ms = np.where(local, 40.0, 60.0) * rng.lognormal(0, 0.04, steps)
                held = optimum + gap * local + 1.2 * np.exp(-step / 18) + rng.normal(0, 0.003, steps)
                avg = local & ((step - (start or 0) + 1) % (case.averaging_period or 1) == 0)
                drift = np.where(avg, 0.05 * (case.averaging_period or 1) * (1 + 0.1 * rank), np.nan)
                rows.append(
                    pd.DataFrame(
                        {
                            "repeat": repeat,
                            "rank": rank,
                            "step": step,
                            "phase": "timed",
                            "step_ms": ms,
                            "loss": held + rng.normal(0, 0.05, steps),
                            "elapsed_s": np.cumsum(ms) / 1e3,
                            "peak_rss_mb": 540.0 + rank,
                            "heldout_loss": np.where((step + 1) % eval_every == 0, held, np.nan),
                            "drift_max_l2": drift,
                            "drift_mean_l2": drift * 0.7,
                            "optimal_loss": optimum,
                        }
                    )
                )
            store.write_repeat(run.dir, case.case_id, repeat, pd.concat(rows, ignore_index=True))
        run.case_done(case.case_id, case.repeats)
    run.add_wall_time(float(steps * repeats * len(cases) * 0.07))
    run.set_status(record.COMPLETE)
    sweep.finalize(run)
    return run.dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="results root; the run goes to OUT/<name>/<run_id>")
    ap.add_argument("--buckets", type=float, nargs="+", default=[1, 2, 4, 8, 16, 25])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--localsgd", action="store_true", help="write a post-local SGD run instead")
    args = ap.parse_args()
    # Checked here, in argparse's one line and exit 2: either ended in a SuiteError traceback
    # naming the script's own synthetic suite, not the option given.
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: expected at least 1")
    if not all(b > 0 for b in args.buckets):
        ap.error(f"--buckets {' '.join(map(str, args.buckets))}: expected sizes in MB above 0")
    if args.localsgd:
        print(make_localsgd_run(args.out, repeats=args.repeats))
    else:
        print(make_run(args.out, buckets=tuple(args.buckets), repeats=args.repeats))


if __name__ == "__main__":
    main()
