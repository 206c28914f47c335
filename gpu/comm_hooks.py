"""DDP communication hooks on a real NVIDIA GPU: compression registered on DDP and wrapped by the ZeRO hooks.

Two small sweeps through the library (as ``tpbench sweep``):

- NCCL, world size 1 on GPU 0: ``zero_no_overlap`` (the hook registered on DDP itself) and both
  ZeRO hooks (wrapping it), each with ``allreduce``, ``fp16_compress`` and ``bf16_compress``. On a
  torch built for CUDA with NCCL >= 2.10 bf16 compression is accepted (a CPU build refuses it on
  DDP itself). Checks: every case done, finite losses, and the compressed cases' last loss within
  2 % of their ``allreduce`` twin's (one rank: the hook rounds the gradient and nothing else);
- Gloo, 2 ranks sharing the GPU (CUDA tensors staged through the host), traced: ``zero_no_overlap``
  and ``post_localSGD_hook`` (switching at step 0, averaging every 2; compression wraps it) with
  each hook. Checks: every case done, finite losses, and ``zero_no_overlap``'s all-reduced bytes
  per step under fp16 and bf16 half the ``allreduce`` case's, as the traces count them.

Prints one line per check; ``--json`` writes checks and figures. ``--rehearse`` runs the same on
CPU ranks without bf16 (a CPU build refuses it registered on DDP; tests the script). Exit 0
when every check passes, 1 when one fails, 2 without CUDA.

Usage: python -m gpu.comm_hooks [--root DIR] [--json FILE] [--rehearse]
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

HOOKS = ("allreduce", "fp16_compress", "bf16_compress")

NCCL_SUITE = """
[suite]
name = "gpu-comm-hooks-{backend}1"
[defaults]
world_size = 1
backend = "{backend}"
interconnect = "{interconnect}"
device = "{device}"
workload = "mlp"
batch_size = 64
warmup_steps = 3
steps = 10
repeats = 1
timeout_s = 300
[sweep]
algorithm = ["zero_no_overlap", "hook_with_zero_step", "hook_with_zero_step_interleaved"]
comm_hook = {hooks}
[capture]
profiler_steps = 0
[workloads.mlp]
width = {width}
depth = 4
"""

GLOO_SUITE = """
[suite]
name = "gpu-comm-hooks-gloo2"
[defaults]
world_size = 2
backend = "gloo"
interconnect = "loopback"
device = "{device}"
workload = "mlp"
batch_size = 64
warmup_steps = 3
steps = 6
repeats = 1
timeout_s = 300
start_localSGD_iter = 0
averaging_period = 2
[sweep]
algorithm = ["zero_no_overlap", "post_localSGD_hook"]
comm_hook = {hooks}
[capture]
profiler_steps = 2
[workloads.mlp]
width = {width}
depth = 4
"""


def _cases(c: Checks, loaded: Any, world: str) -> dict[str, tuple[dict[str, Any], Any]]:
    """Each case of the run that is done, with its timed steps, checked for finite losses:
    label → (params, timed steps)."""
    from tpbench import store

    out = {}
    for cid, entry in loaded.record.cases.items():
        p = entry.params
        label = f"{world} {p['algorithm']} {p['comm_hook']}"
        if not c.check(f"{label}: case done", entry.status == store.DONE, entry.error or ""):
            continue
        timed = loaded.steps[(loaded.steps["case_id"] == cid) & (loaded.steps["phase"] == "timed")]
        c.check(f"{label}: finite losses", bool(timed["loss"].map(math.isfinite).all()))
        out[label] = (p | {"case_id": cid}, timed)
    return out


def check_nccl(c: Checks, run_dir: Path) -> dict[str, Any]:
    from tpbench import store

    loaded = store.load(run_dir)
    last = {
        (p["algorithm"], p["comm_hook"]): float(timed["loss"].iloc[-1])
        for p, timed in _cases(c, loaded, f"{loaded.cases['backend'].iloc[0]}×1").values()
    }
    for (algo, hook), loss in sorted(last.items()):
        base = last.get((algo, "allreduce"))
        if hook != "allreduce" and base is not None:
            c.check(
                f"{algo} {hook}: last loss within 2 % of allreduce's",
                abs(loss - base) <= 0.02 * abs(base),
                f"{loss:.5f} vs {base:.5f}",
            )
    return {f"{a} {h}": round(v, 5) for (a, h), v in sorted(last.items())}


def check_gloo(c: Checks, run_dir: Path) -> dict[str, Any]:
    from tpbench import store

    loaded = store.load(run_dir)
    summary = loaded.summary.set_index("case_id")
    keys = ("allreduce_bytes_per_step", "comm_bytes_per_step", "median_ms")
    out = {
        label: {k: float(summary.loc[p["case_id"], k]) for k in keys}
        for label, (p, _) in _cases(c, loaded, "gloo×2").items()
    }
    base = out.get("gloo×2 zero_no_overlap allreduce", {}).get("allreduce_bytes_per_step")
    for hook in HOOKS[1:]:
        got = out.get(f"gloo×2 zero_no_overlap {hook}", {}).get("allreduce_bytes_per_step")
        if base and got is not None:
            c.check(
                f"gloo×2 {hook}: half the all-reduced bytes", abs(got / base - 0.5) < 0.01, f"{got:.0f} of {base:.0f}"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, help="where the suites and run directories go (default: a new folder)")
    ap.add_argument("--json", type=Path, help="write the checks and figures here")
    ap.add_argument("--rehearse", action="store_true", help="CPU ranks (tests the script, measures no GPU)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() and not args.rehearse:
        print("gpu_comm_hooks: no CUDA device is visible; run it on an NVIDIA GPU machine", file=sys.stderr)
        return 2
    root = args.root or Path(tempfile.mkdtemp(prefix="tpbench-gpu-comm-hooks-"))
    root.mkdir(parents=True, exist_ok=True)
    # A CPU build of torch refuses bf16 compression registered on DDP itself: the rehearsal leaves it out.
    hooks = json.dumps(list(HOOKS[:2] if args.rehearse else HOOKS))
    if args.rehearse:
        world = dict(backend="gloo", interconnect="loopback", device="cpu", width=64, hooks=hooks)
    else:
        world = dict(backend="nccl", interconnect="nccl-default", device="cuda", width=1024, hooks=hooks)
    sweeps = (
        ("gpu-comm-hooks-nccl", NCCL_SUITE.format(**world), check_nccl),
        (
            "gpu-comm-hooks-gloo",
            GLOO_SUITE.format(device=world["device"], width=world["width"], hooks=hooks),
            check_gloo,
        ),
    )
    return run_sweeps(root, sweeps, {"torch": torch.__version__, "rehearsal": args.rehearse}, args.json)


if __name__ == "__main__":
    sys.exit(main())
