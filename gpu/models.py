"""Realistic models and post-local SGD on a real NVIDIA GPU, through the library (as ``tpbench sweep``).

Two small sweeps:

- NCCL, world size 1: GPT-2 small (124M parameters, ``preset = "gpt2"``, 256-token sequences)
  under ``ddp``, ``zero_no_overlap`` and both ZeRO hooks. Checks: every case done, finite losses,
  the exact per-rank accounting (parameters, gradients, AdamW state = two fp32 tensors per
  parameter plus a step counter each) against the parameter count, and the caching allocator's
  peak at least that large (the counted bytes are a lower bound of what the GPU held).
- Gloo, 2 ranks sharing the GPU (CUDA tensors), 2 emulated nodes of 1 rank: ``post_localSGD_hook``
  switching at step 0 with averaging every 4 steps on ``markov``, plus ``resnet`` and ``embedding``
  at their small presets under ``ddp``. Checks: averaging happened on schedule and left both ranks
  with equal parameters (``param_norm_averaged_l2`` equal across ranks at every averaging step).

Prints one line per check; ``--json`` writes checks and figures. ``--rehearse`` runs the same on
CPU with the smallest sizes (tests the script, measures nothing about GPUs). Exit 0 when every
check passes, 1 when one fails, 2 without CUDA.

Usage: python -m gpu.models [--root DIR] [--json FILE] [--rehearse]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from gpu.analysis import Checks
from gpu.capture import run_sweeps

GPT_SUITE = """
[suite]
name = "gpu-models-gpt"
[defaults]
world_size = 1
backend = "{backend}"
interconnect = "{interconnect}"
device = "{device}"
workload = "gpt"
batch_size = {batch}
warmup_steps = 5
steps = {steps}
repeats = 2
timeout_s = 300
[sweep]
algorithm = ["ddp", "zero_no_overlap", "hook_with_zero_step", "hook_with_zero_step_interleaved"]
[capture]
profiler_steps = 1
[workloads.gpt]
preset = "{preset}"
block_size = {block}
"""

MIXED_SUITE = """
[suite]
name = "gpu-models-mixed"
[defaults]
world_size = 2
backend = "gloo"
device = "{device}"
ranks_per_node = 1
warmup_steps = 3
steps = 20
repeats = 1
batch_size = 8
timeout_s = 300
[sweep]
workload = ["markov", "resnet", "embedding"]
algorithm = ["ddp", "post_localSGD_hook"]
start_localSGD_iter = [0]
averaging_period = [4]
[capture]
profiler_steps = 4
[workloads.resnet]
preset = "{preset}"
[workloads.embedding]
preset = "{preset}"
"""


def check_gpt(c: Checks, run_dir: Path) -> dict[str, Any]:
    from tpbench import store

    loaded = store.load(run_dir)
    out: dict[str, Any] = {}
    for cid, entry in loaded.record.cases.items():
        algo = entry.params["algorithm"]
        if not c.check(f"gpt {algo}: case done", entry.status == store.DONE, entry.error or ""):
            continue
        steps = loaded.steps[loaded.steps["case_id"] == cid]
        timed = steps[steps["phase"] == "timed"]
        c.check(
            f"gpt {algo}: finite losses",
            bool(timed["loss"].map(math.isfinite).all()),
            f"last {float(timed['loss'].iloc[-1]):.3f}",
        )
        mem_path = store.case_dir(run_dir, cid) / "memory.parquet"
        fig: dict[str, Any] = {
            "median_step_ms": float(timed.groupby("step")["step_ms"].max().median()),
            "loss_last": float(timed["loss"].iloc[-1]),
        }
        if c.check(f"gpt {algo}: memory table written", mem_path.exists()):
            import pandas as pd

            mem = pd.read_parquet(mem_path).iloc[0]
            n = int(mem["param_bytes"]) // 4
            state, counted = (
                int(mem["optimizer_state_bytes"]),
                int(mem["param_bytes"] + mem["grad_bytes"] + mem["optimizer_state_bytes"]),
            )
            # AdamW: exp_avg + exp_avg_sq in fp32 per element, plus one step counter per parameter tensor.
            c.check(
                f"gpt {algo}: AdamW state = 2 x 4 bytes per element + step counters",
                8 * n <= state <= 8 * n + 8 * 1000,
                f"{state} bytes for {n} elements",
            )
            peak = float(steps["peak_allocated_mb"].max()) * 2**20 if "peak_allocated_mb" in steps else float("nan")
            c.check(
                f"gpt {algo}: allocator peak >= counted bytes",
                peak >= counted,
                f"peak {peak / 2**30:.2f} GiB, counted {counted / 2**30:.2f} GiB",
            )
            fig |= {"params": n, "optimizer_state_bytes": state, "counted_bytes": counted, "peak_allocated_bytes": peak}
        out[algo] = fig
    return out


def check_mixed(c: Checks, run_dir: Path) -> dict[str, Any]:
    from tpbench import store

    loaded = store.load(run_dir)
    out: dict[str, Any] = {}
    for cid, entry in loaded.record.cases.items():
        p = entry.params
        label = f"{p['workload']} {p['algorithm']}"
        if not c.check(f"{label}: case done", entry.status == store.DONE, entry.error or ""):
            continue
        steps = loaded.steps[(loaded.steps["case_id"] == cid) & (loaded.steps["phase"] == "timed")]
        fig: dict[str, Any] = {"median_step_ms": float(steps.groupby("step")["step_ms"].max().median())}
        if p["algorithm"] == "post_localSGD_hook" and "param_norm_averaged_l2" in steps:
            avg = steps.dropna(subset=["param_norm_averaged_l2"])
            per_step = avg.groupby(["repeat", "step"])["param_norm_averaged_l2"].agg(["min", "max", "size"])
            equal = bool(((per_step["max"] - per_step["min"]) <= 1e-6 * per_step["max"].abs()).all())
            c.check(f"{label}: averaging every 4 steps", len(per_step) >= 20 // 4, f"{len(per_step)} averaging steps")
            c.check(
                f"{label}: ranks equal after averaging",
                equal and bool((per_step["size"] == 2).all()),
                f"max spread {float((per_step['max'] - per_step['min']).max()):.3g}",
            )
            fig["averaging_steps"] = len(per_step)
            fig["drift_before_averaging"] = (
                steps.dropna(subset=["drift_max_l2"]).groupby("step")["drift_max_l2"].max().round(4).tolist()
            )
        out[label] = fig
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--root", type=Path, help="where the suites and run directories go (default: a new temporary folder)"
    )
    ap.add_argument("--json", type=Path, help="write the checks and figures here")
    ap.add_argument("--rehearse", action="store_true", help="CPU, smallest sizes (tests the script, measures no GPU)")
    args = ap.parse_args(argv)
    result: dict[str, Any] = {"torch": torch.__version__, "rehearsal": args.rehearse, "runs": {}}
    if not torch.cuda.is_available() and not args.rehearse:
        msg = (
            "gpu_models: no CUDA device is visible (torch.cuda.is_available() is False); "
            "run it on an NVIDIA GPU machine"
        )
        print(msg, file=sys.stderr)
        if args.json:
            args.json.write_text(json.dumps(result | {"error": msg}, indent=1))
        return 2
    root = args.root or Path(tempfile.mkdtemp(prefix="tpbench-gpu-models-"))
    root.mkdir(parents=True, exist_ok=True)
    if args.rehearse:
        gpu = dict(backend="gloo", interconnect="loopback", device="cpu", batch=2, steps=4, preset="tiny", block=32)
    else:
        gpu = dict(
            backend="nccl", interconnect="nccl-default", device="cuda", batch=8, steps=20, preset="gpt2", block=256
        )
    sweeps = (
        ("gpt", GPT_SUITE.format(**gpu), check_gpt),
        (
            "mixed",
            MIXED_SUITE.format(device="cpu" if args.rehearse else "cuda", preset="tiny" if args.rehearse else "small"),
            check_mixed,
        ),
    )
    return run_sweeps(root, sweeps, result, args.json)


if __name__ == "__main__":
    sys.exit(main())
