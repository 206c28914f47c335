"""Capture on a real NVIDIA GPU: traces with CUDA activity, NVML at the configured rate, overhead.

Runs two small capture sweeps through the library (the same path as ``tpbench sweep``):

- NCCL, world size 1 on GPU 0 (a lone NCCL rank connects to nobody, so no NCCL kernels and no
  transport to judge; its NCCL_DEBUG log must still be written and parsed);
- Gloo, 2 ranks sharing GPU 0 with CUDA tensors (Gloo stages through host memory: the traces
  show host↔device memcpys around ``gloo:*`` ranges).

Then checks, per case and rank: the trace holds CUDA kernels, memcpys, the phase ranges and
``distributedInfo``; ``nvml.parquet`` holds samples at the configured interval whose trace-clock
timestamps fall inside the traced window; run.json has the observed transport and clock offsets.
(The sampler's overhead is ``benchmarks/bench_nvml_overhead.py``'s job.)

Prints one line per check; ``--json`` writes the checks and each run directory's path (the run
directories go under ``--root``, for ``gpu/analysis.py`` and ``tpbench report``). ``--rehearse``
runs the same sweeps on CPU (Gloo ×1 and ×2) to test the script without a GPU: the GPU checks then
fail, as they should. Exit 0 when every check passes, 1 when one fails, 2 without CUDA.

Usage: python -m gpu.capture [--root DIR] [--json FILE] [--interval-ms 50] [--rehearse]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from gpu.analysis import Checks

SUITE = """
[suite]
name = "gpu-capture-{backend}{world_size}"
[defaults]
world_size = {world_size}
backend = "{backend}"
device = "{device}"
interconnect = "{interconnect}"
workload = "mlp"
batch_size = {batch}
warmup_steps = 5
steps = {steps}
repeats = {repeats}
timeout_s = 300
[sweep]
algorithm = ["ddp", "zero_no_overlap", "hook_with_zero_step_interleaved"]
[capture]
profiler_steps = 3
nvml_interval_ms = {interval}
[workloads.mlp]
width = {width}
depth = 4
"""

WORLDS = (("nccl", 1, "nccl-default"), ("gloo", 2, "loopback"))
REHEARSAL_WORLDS = (("gloo", 1, "loopback"), ("gloo", 2, "loopback"))
SIZES = dict(width=2048, batch=64, steps=30, repeats=2)
REHEARSAL_SIZES = dict(width=128, batch=8, steps=4, repeats=1)


def run_suite(root: Path, name: str, text: str) -> Path:
    """Write suite ``text`` as ``root/NAME.toml`` and sweep it through the library, as ``tpbench
    sweep`` does (run directories under ``root/results``); the run directory."""
    from tpbench import sweep

    suite = root / f"{name}.toml"
    suite.write_text(text)
    prepared = sweep.prepare(suite)
    run = sweep.start(prepared, root / "results")
    sweep.execute(run, prepared.cases, lambda kind, data: None)
    sweep.finalize(run)
    return run.dir


def run_sweeps(
    root: Path,
    sweeps: Iterable[tuple[str, str, Callable[[Checks, Path], Any]]],
    result: dict[str, Any],
    out: Path | None,
) -> int:
    """Sweep each (name, suite text, check) in turn (``run_suite``) and check its run directory:
    ``result["runs"][name]`` gets the run directory and the check's figures, saved to ``out`` after
    each; a sweep that fails is a failed check and the next still runs. The exit code."""
    c = Checks()
    result["runs"] = {}
    for name, text, check in sweeps:
        try:
            run_dir = run_suite(root, name, text)
            result["runs"][name] = {"run_dir": str(run_dir)}  # kept should its check fail: later parts read it
            result["runs"][name]["figures"] = check(c, run_dir)
        except Exception as e:  # the other sweep still runs; the error is a failed check
            c.check(f"{name}: sweep and checks ran", False, f"{type(e).__name__}: {e}")
        c.save(result, out)
    return c.exit_code()


def _suite(backend: str, world_size: int, interconnect: str, interval_ms: int, rehearse: bool) -> str:
    return SUITE.format(
        backend=backend,
        world_size=world_size,
        interconnect=interconnect,
        interval=interval_ms,
        device="cpu" if rehearse else "cuda",
        **(REHEARSAL_SIZES if rehearse else SIZES),
    )


def _check_trace(c: Checks, label: str, path: Path, rank: int) -> tuple[float, float]:
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    cats: dict[str, int] = {}
    for e in events:
        cats[e.get("cat", "")] = cats.get(e.get("cat", ""), 0) + 1
    names = {e["name"] for e in events}
    c.check(
        f"{label} rank {rank}: distributedInfo",
        trace.get("distributedInfo", {}).get("rank") == rank,
        json.dumps(trace.get("distributedInfo", {}))[:120],
    )
    c.check(f"{label} rank {rank}: CUDA kernels", cats.get("kernel", 0) > 0, f"{cats.get('kernel', 0)} kernels")
    c.check(f"{label} rank {rank}: memcpys", cats.get("gpu_memcpy", 0) > 0, f"{cats.get('gpu_memcpy', 0)} memcpys")
    phases = {"tpbench.forward", "tpbench.backward", "tpbench.optimizer"}
    c.check(f"{label} rank {rank}: phase ranges", phases <= names, ", ".join(sorted(phases - names)) or "all")
    steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
    return min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)


def check_run(c: Checks, run_dir: Path, interval_ms: int) -> dict[str, Any]:
    from tpbench import store
    from tpbench.capture import NVML_FILE

    loaded = store.load(run_dir)
    summary: dict[str, Any] = {"run_dir": str(run_dir), "cases": {}}
    for cid, entry in loaded.record.cases.items():
        p = entry.params
        label = f"{p['backend']}×{p['world_size']} {p['algorithm']}"
        if not c.check(f"{label}: case done", entry.status == store.DONE, entry.error or ""):
            continue
        windows = {r: _check_trace(c, label, path, r) for r, path in enumerate(store.traces(run_dir, cid))}
        c.check(f"{label}: one trace per rank", len(windows) == p["world_size"], f"{len(windows)} traces")
        capture = entry.capture
        nv = capture.nvml.to_json() if capture.nvml else {}
        c.check(f"{label}: NVML available", nv.get("available") is True, nv.get("reason") or "")
        seen = capture.observed_transport.to_json() if capture.observed_transport else {}
        case_summary: dict[str, Any] = {
            "nvml": nv,
            "observed_transport": seen or None,
            "clock_sync": dict(capture.clock_sync) or None,
        }
        path = store.case_dir(run_dir, cid) / NVML_FILE
        if c.check(f"{label}: nvml.parquet written", path.exists()):
            df = pd.read_parquet(path)
            gaps = df.sort_values("t_ns").groupby(["rank", "repeat"])["t_ns"].diff().dropna() / 1e6
            median_gap = float(gaps.median())
            c.check(
                f"{label}: samples at the configured rate",
                0.9 * interval_ms <= median_gap <= 1.25 * interval_ms,
                f"median interval {median_gap:.1f} ms for {interval_ms} ms, {len(df)} samples, "
                f"median query {df['query_ms'].median():.2f} ms",
            )
            for col in ("gpu_util_pct", "mem_used_mb", "power_w", "sm_clock_mhz", "pcie_tx_mb_s", "pcie_rx_mb_s"):
                c.check(f"{label}: {col} sampled", df[col].notna().any(), f"median {df[col].median():.1f}")
            c.check(
                f"{label}: timed-step samples",
                (df["phase"] == "timed").any(),
                str(df["phase"].value_counts().to_dict()),
            )
            for r, (lo, hi) in windows.items():
                prof = df[(df["rank"] == r) & (df["phase"] == "profile")]
                inside = (
                    prof["ts_us"].between(lo - interval_ms * 1e3, hi + interval_ms * 1e3).all() if len(prof) else None
                )
                c.check(
                    f"{label} rank {r}: profile samples inside the trace window",
                    inside is not False,
                    f"{len(prof)} samples in the profiled steps"
                    + ("" if len(prof) else " (window shorter than the interval)"),
                )
            case_summary["samples"] = len(df)
            case_summary["median_interval_ms"] = median_gap
            case_summary["median_query_ms"] = float(df["query_ms"].median())
        if p["backend"] == "gloo":
            c.check(
                f"{label}: Gloo observed on lo",
                seen.get("interfaces") == ["lo"] and seen.get("mismatch") is False,
                json.dumps({k: seen.get(k) for k in ("interfaces", "mismatch", "reason")}),
            )
        else:
            logs = sorted((run_dir / "logs").glob("nccl-*.log"))
            c.check(
                f"{label}: NCCL debug log written",
                any("NCCL" in log.read_text(errors="replace") for log in logs),
                ", ".join(log.name for log in logs) or "no logs/nccl-*.log",
            )
            c.check(
                f"{label}: NCCL transport observed",
                seen.get("backend") == "nccl",
                json.dumps({k: seen.get(k) for k in ("transports", "mismatch", "reason")}),
            )
        summary["cases"][label] = case_summary
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--interval-ms", type=int, default=50)
    ap.add_argument(
        "--root", type=Path, help="where the suites and run directories go (default: a new temporary folder)"
    )
    ap.add_argument("--json", type=Path, help="write the checks and run directories here")
    ap.add_argument("--rehearse", action="store_true", help="Gloo ×1 and ×2 on CPU (tests the script, measures no GPU)")
    args = ap.parse_args(argv)
    result: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "rehearsal": args.rehearse}
    if not torch.cuda.is_available() and not args.rehearse:
        msg = (
            "gpu_capture: no CUDA device is visible (torch.cuda.is_available() is False); "
            "run it on an NVIDIA GPU machine"
        )
        print(msg, file=sys.stderr)
        if args.json:
            args.json.write_text(json.dumps(result | {"error": msg}, indent=1))
        return 2
    result["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    root = args.root or Path(tempfile.mkdtemp(prefix="tpbench-gpu-capture-"))
    root.mkdir(parents=True, exist_ok=True)
    sweeps = [
        (
            f"gpu-capture-{backend}{world_size}",
            _suite(backend, world_size, interconnect, args.interval_ms, args.rehearse),
            lambda c, run_dir: check_run(c, run_dir, args.interval_ms),
        )
        for backend, world_size, interconnect in (REHEARSAL_WORLDS if args.rehearse else WORLDS)
    ]
    return run_sweeps(root, sweeps, result, args.json)


if __name__ == "__main__":
    sys.exit(main())
