"""Parse + analysis time and peak memory of tpbench against Holistic Trace Analysis, on one big trace.

Real traces reach hundreds of MB, so the analysis has to be fast and lean enough to run on every
case of a sweep. This script records a real 2-rank Gloo DDP trace of a deep MLP (many ops per
step, many steps) with ``benchmarks/make_trace.py``, rewrites rank 0's trace as a GPU trace with the
same timing (HTA only analyses GPU kernels; see ``make_trace.gpu_style``) and then, each tool in a
fresh process of its own, parses that one file and computes communication/computation overlap:

- tpbench: ``read_traces`` + ``step_overlap`` + ``overlap_totals`` + ``collective_bandwidth``
- HTA 0.5.0: ``TraceAnalysis(trace_dir=...)`` + ``get_comm_comp_overlap`` (its defaults)

Wall time is measured around those calls inside the process (imports excluded); peak memory is the
process's maximum resident set size (``VmHWM``), so it includes the interpreter and libraries.
The two overlap % columns are over the same window (all steps but the last, as HTA counts) and
differ by about a point only because HTA, by default, rounds every event inwards to whole
microseconds, which shaves the many µs-long ops of this trace; with ``HTA_DISABLE_NS_ROUNDING=1``
it prints tpbench's number.

Usage: python -m benchmarks.bench_analysis [--workdir DIR] [--steps 30] [--depth 256] [--reuse]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.provenance import provenance

TARGET_BYTES = 200 * 10**6


def measure(tool: str, folder: str) -> dict[str, float]:
    """Run one tool on ``folder`` in this process; return its wall and CPU time, peak RSS and overlap %.

    CPU time is reported beside wall time because it barely moves when other work shares the
    machine; a single-rank trace keeps HTA in one process, so both are comparable.
    """
    if tool == "tpbench":
        from tpbench.analysis.bandwidth import collective_bandwidth
        from tpbench.analysis.overlap import overlap_totals, step_overlap
        from tpbench.analysis.timeline import read_traces

        t0, c0 = time.perf_counter(), time.process_time()
        tl = read_traces(folder)
        step_overlap(tl.intervals, tl.steps)
        collective_bandwidth(tl.intervals)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        last = tl.steps.groupby("rank")["step"].transform("max")  # HTA's window, for the comparison
        pct = overlap_totals(step_overlap(tl.intervals, tl.steps[tl.steps["step"] < last]))["overlap_pct"].iloc[0]
        rows = len(tl.intervals)
    else:
        from hta.trace_analysis import TraceAnalysis

        t0, c0 = time.perf_counter(), time.process_time()
        result = TraceAnalysis(trace_dir=folder).get_comm_comp_overlap(visualize=False)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        pct, rows = result["comp_comm_overlap_pctg"].iloc[0], -1
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "peak_mb": _peak_rss_kb() / 1024,
        "overlap_pct": float(pct),
        "intervals": rows,
    }


def _peak_rss_kb() -> int:
    """This process's peak RSS, and its children's (HTA parses several ranks in a pool).

    ``VmHWM`` rather than ``ru_maxrss`` for the process itself: Linux keeps ``ru_maxrss`` across
    ``exec``, so a child would inherit the high-water mark of the parent it was forked from.
    """
    status = Path("/proc/self/status").read_text()
    hwm = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))
    return max(hwm, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)


def run_measurement(tool: str, folder: Path) -> dict[str, float]:
    """``measure`` in a fresh interpreter, so neither tool's memory or caches affect the other."""
    proc = subprocess.run(
        [sys.executable, "-m", __spec__.name, "--measure", tool, str(folder)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{tool} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def uncompressed_size(path: Path) -> int:
    size = 0
    with gzip.open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            size += len(chunk)
    return size


def generate(workdir: Path, steps: int, depth: int, width: int) -> Path:
    """Record the Gloo traces and rewrite rank 0's as a GPU trace in ``workdir/bench``."""
    from benchmarks.make_trace import TraceJob, gpu_style, make_traces

    cpu = workdir / "cpu"
    make_traces(TraceJob(str(cpu), steps=steps, width=width, depth=depth, batch_size=16, bucket_cap_mb=1.0))
    bench = workdir / "bench"
    gpu_style(cpu / "rank0.json.gz", bench / "rank0.json.gz")
    shutil.rmtree(cpu)
    return bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/tpbench-bench-analysis"))
    parser.add_argument("--steps", type=int, default=30, help="profiled steps")
    parser.add_argument("--depth", type=int, default=256, help="MLP layers (ops per step)")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--reuse", action="store_true", help="reuse the trace already in --workdir")
    parser.add_argument("--measure", nargs=2, metavar=("TOOL", "DIR"), help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.measure:
        print(json.dumps(measure(*a.measure)))
        return
    print(provenance("benchmarks.bench_analysis", sys.argv[1:]), flush=True)

    bench = a.workdir / "bench"
    if not (a.reuse and (bench / "rank0.json.gz").exists()):
        shutil.rmtree(a.workdir, ignore_errors=True)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        t0 = time.perf_counter()
        generate(a.workdir, a.steps, a.depth, a.width)
        print(f"generated in {time.perf_counter() - t0:.0f} s")
    trace = bench / "rank0.json.gz"
    size = uncompressed_size(trace)
    print(f"trace: {trace}  {size / 1e6:.0f} MB JSON ({trace.stat().st_size / 1e6:.0f} MB gzipped)")
    if size < TARGET_BYTES:
        print(f"warning: below the {TARGET_BYTES / 1e6:.0f} MB target; raise --steps or --depth")

    ours, hta = run_measurement("tpbench", bench), run_measurement("hta", bench)
    print(f"{'':10} {'wall s':>8} {'CPU s':>8} {'peak MB':>9} {'overlap %':>10}")
    for name, r in (("tpbench", ours), ("HTA 0.5.0", hta)):
        print(f"{name:10} {r['seconds']:8.2f} {r['cpu_seconds']:8.2f} {r['peak_mb']:9.0f} {r['overlap_pct']:10.2f}")
    print(
        f"speed-up {hta['seconds'] / ours['seconds']:.1f}x wall, {hta['cpu_seconds'] / ours['cpu_seconds']:.1f}x CPU "
        f"(target >= 5x); peak memory {ours['peak_mb'] / hta['peak_mb']:.2f} of HTA's (target <= 0.33); "
        f"{ours['intervals']:.0f} intervals"
    )


if __name__ == "__main__":
    main()
