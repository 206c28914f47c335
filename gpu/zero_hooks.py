"""Check tpbench's ZeRO overlap hooks on an NVIDIA GPU and time them against PyTorch's.

    python -m gpu.zero_hooks [--json FILE] [--rehearse]

Two worlds, each started once:

1. NCCL, world size 1 on ``cuda:0``: parity of both hooks (with and without ``shard_buckets``)
   with DDP + a local AdamW, then the step-time ratio tpbench / PyTorch for both hooks (PyTorch
   accepts NCCL, so no bypass is involved).
2. Gloo, 2 ranks sharing ``cuda:0`` (two NCCL ranks cannot share one GPU): parity of both hooks,
   the path where PyTorch's interleaved hook hangs, and the sequential ratio with PyTorch's Gloo
   check bypassed.

Gloo moves every bucket through host memory, so its world times fewer rounds. ``--rehearse``
runs both worlds on CPU with Gloo and a small model, to test this script without a GPU; its
figures are not GPU measurements.

Exit status: 0 when every parity check passes, 1 when one fails, 2 without CUDA.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from benchmarks.bench_zero_hooks import (
    Config,
    batches,
    bench_rank,
    build_model,
    device_for,
    launch,
    overlapped,
    summarize,
)

PARITY_STEPS = 4
PARITY_TOLERANCE = 1e-5
TIMING = dict(width=2048, depth=8, batch_size=64, bucket_cap_mb=25.0, warmup=5, steps=5)
"""The timed model and schedule: ~34M parameters, a handful of 25 MB buckets."""
REHEARSAL = dict(width=256, depth=4, batch_size=16, bucket_cap_mb=0.25, warmup=3, steps=2, rounds=3)


def parity(rank: int, cfg: Config, interleaved: bool, shard_buckets: bool) -> dict[str, Any]:
    """The hook's model against DDP + local AdamW, on the same batches, after the vacuous warm-up."""
    device = device_for(rank, cfg)
    cfg = replace(cfg, width=512, depth=4, batch_size=32, bucket_cap_mb=1.0, shard_buckets=shard_buckets)
    model = build_model(cfg, device)
    ddp, zero = overlapped("tpbench", interleaved, model, cfg, device)
    device_ids = [device.index] if device.type == "cuda" else None
    ref = DDP(copy.deepcopy(model), device_ids=device_ids, bucket_cap_mb=cfg.bucket_cap_mb)
    ref_optim = torch.optim.AdamW(ref.parameters(), lr=1e-3, foreach=False)  # the functional AdamW's loop
    warmup = 2
    data = batches(rank, cfg, device, warmup + PARITY_STEPS)
    loss = torch.nn.functional.cross_entropy

    initial = [p.detach().clone() for p in ddp.parameters()]
    for x, y in data[:warmup]:
        loss(ddp(x), y).backward()
        loss(ref(x), y).backward()
    drift = max((a - b).abs().max().item() for a, b in zip(initial, ddp.parameters()))
    ref_optim.zero_grad()
    diffs = []
    for x, y in data[warmup:]:
        zero.zero_grad()
        loss(ddp(x), y).backward()
        ref_optim.zero_grad()
        loss(ref(x), y).backward()
        ref_optim.step()
        diffs.append(max((a - b).abs().max().item() for a, b in zip(ddp.parameters(), ref.parameters())))
    return {
        "hook": "interleaved" if interleaved else "sequential",
        "shard_buckets": shard_buckets,
        "warmup_drift": drift,
        "max_param_diff": max(diffs),
        "ok": drift == 0.0 and max(diffs) <= PARITY_TOLERANCE,
    }


def _timed_hooks(cfg: Config) -> tuple[str, ...]:
    return ("sequential", "interleaved") if cfg.backend == "nccl" else ("sequential",)


def gpu_rank(rank: int, cfg: Config) -> dict[str, Any]:
    """Parity checks on a small model, then ``cfg``'s timed comparison for each hook PyTorch can run."""
    checks = [parity(rank, cfg, i, s) for i in (False, True) for s in (False, True)]
    timings = {hook: bench_rank(rank, replace(cfg, hook=hook)) for hook in _timed_hooks(cfg)}
    return {"parity": checks, "timings": timings}


def run(cfg: Config) -> dict[str, Any]:
    """One world for ``cfg``: parity and timings, summarised."""
    result = launch(gpu_rank, cfg)[0]
    timings = {hook: summarize(replace(cfg, hook=hook), r) for hook, r in result["timings"].items()}
    return {"parity": result["parity"], "timings": timings}


def worlds(rehearse: bool) -> dict[str, Config]:
    if rehearse:
        return {
            "gloo_1rank_cpu": Config(backend="gloo", device="cpu", world_size=1, **REHEARSAL),
            "gloo_2ranks_cpu": Config(backend="gloo", device="cpu", world_size=2, **REHEARSAL),
        }
    return {
        "nccl_1rank": Config(backend="nccl", device="cuda", world_size=1, rounds=40, **TIMING),
        "gloo_2ranks_one_gpu": Config(backend="gloo", device="cuda", world_size=2, rounds=12, **TIMING),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--rehearse", action="store_true", help="both worlds on CPU (tests the script, measures no GPU)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() and not args.rehearse:
        print(
            f"gpu_zero_hooks: needs an NVIDIA GPU with CUDA; torch {torch.__version__} sees none "
            f"(torch.version.cuda={torch.version.cuda}). Nothing was run.",
            file=sys.stderr,
        )
        return 2
    results: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "rehearsal": args.rehearse,
    }
    ok = True
    for name, cfg in worlds(args.rehearse).items():
        t0 = time.monotonic()
        try:
            results[name] = run(cfg)
        except Exception as e:  # the other world still runs; the error is reported
            results[name] = {"error": f"{type(e).__name__}: {e}"}
            ok = False
            print(f"== {name}: FAILED\n{e}", flush=True)
            continue
        finally:
            results[name]["seconds"] = round(time.monotonic() - t0, 1)
            if args.json:
                args.json.write_text(json.dumps(results, indent=1))
        print(f"== {name}")
        for check in results[name]["parity"]:
            ok &= check["ok"]
            print(
                f"  parity {check['hook']:11s} shard_buckets={check['shard_buckets']!s:5s} "
                f"warm-up drift {check['warmup_drift']:.3g}, max |param - reference| {check['max_param_diff']:.3g}: "
                f"{'ok' if check['ok'] else 'FAIL'}"
            )
        for hook, s in results[name]["timings"].items():
            wall = s["wall"]
            ms = wall["median_step_ms"]
            bypass = " (PyTorch's Gloo check bypassed)" if s["torch_gloo_check_bypassed"] else ""
            print(
                f"  {hook:11s} step tpbench {ms['tpbench']:.2f} ms, torch {ms['torch']:.2f} ms, "
                f"ratio {wall['ratio_median']:.3f} (95% CI {wall['ratio_ci95'][0]:.3f} .. {wall['ratio_ci95'][1]:.3f})"
                f"{bypass}",
                flush=True,
            )
    if args.json:
        print(f"results written to {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
