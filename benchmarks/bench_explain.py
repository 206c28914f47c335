"""Peak memory and time of ``tpbench explain`` on big traces: two cases of two ~240 MB rank traces each.

``tpbench explain`` reads the derived tables a sweep wrote (``intervals.parquet``, ``marks.parquet``)
and never the traces; the sweep wrote those tables by streaming the traces (``timeline.read_traces``).
This script records a real 2-rank Gloo DDP trace of a deep MLP with ``benchmarks/make_trace.py`` (the
same job as ``bench_analysis``), then measures, each in a fresh process (peak RSS as ``VmHWM``, so it
includes the interpreter and libraries):

- ``trace``: what the sweep does for each of the two cases, then the explanation: ``read_traces`` of
  the case's folder, ``rank_step_parts`` + ``step_parts``, the timeline dropped, and ``explain`` of
  the two cases' steps;
- ``tables``: what ``tpbench explain`` does: both cases' ``intervals``/``marks`` parquet read back,
  their parts, and ``explain``.

The two cases are the same traces (the candidate a copy of the baseline): what is measured is how
much memory the data takes, not what it says.

Usage: python -m benchmarks.bench_explain [--workdir DIR] [--steps 30] [--depth 256] [--reuse]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.bench_analysis import _peak_rss_kb, uncompressed_size
from benchmarks.provenance import provenance


def _steps_of(marks):  # marks → the steps table explain reads (as tpbench.explain.traced_steps)
    return marks[marks["kind"] == "step"].rename(columns={"index": "step"})[["rank", "step", "start_ns", "end_ns"]]


def measure(how: str, workdir: str) -> dict[str, float]:
    import pandas as pd

    from tpbench.analysis import explain
    from tpbench.analysis.timeline import read_traces

    t0 = time.perf_counter()
    sides = []
    for case in ("base", "cand"):
        folder = Path(workdir) / case
        if how == "trace":
            tl = read_traces(folder)
            intervals, steps = tl.intervals, _steps_of(tl.marks)
            del tl
        else:
            intervals = pd.read_parquet(folder / "intervals.parquet")
            steps = _steps_of(pd.read_parquet(folder / "marks.parquet"))
        sides.append(explain.step_parts(explain.rank_step_parts(intervals, steps)))
        rows = len(intervals)
        del intervals
    e = explain.explain(*sides)
    return {
        "seconds": time.perf_counter() - t0,
        "peak_mb": _peak_rss_kb() / 1024,
        "intervals_per_case": rows,
        "steps": e.base_steps,
        "residual_ms": e.residual_ms,
    }


def _fresh(how: str, workdir: Path) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, "-m", __spec__.name, "--measure", how, str(workdir)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{how} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def prepare(workdir: Path, steps: int, depth: int, width: int, reuse: bool) -> None:
    """The traces in ``workdir/base`` (recorded unless ``reuse``), their copy in ``workdir/cand``,
    and each case's derived tables beside its traces, as the sweep writes them."""
    from benchmarks.make_trace import TraceJob, make_traces
    from tpbench.analysis.timeline import read_traces

    base = workdir / "base"
    if not (reuse and (base / "rank1.json.gz").exists()):
        shutil.rmtree(workdir, ignore_errors=True)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        make_traces(TraceJob(str(base), steps=steps, width=width, depth=depth, batch_size=16, bucket_cap_mb=1.0))
    cand = workdir / "cand"
    cand.mkdir(exist_ok=True)
    for trace in base.glob("rank*.json.gz"):
        shutil.copyfile(trace, cand / trace.name)
    tl = read_traces(base)
    for folder in (base, cand):
        tl.intervals.to_parquet(folder / "intervals.parquet")
        tl.marks.to_parquet(folder / "marks.parquet")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/tpbench-bench-explain"))
    parser.add_argument("--steps", type=int, default=30, help="profiled steps")
    parser.add_argument("--depth", type=int, default=256, help="MLP layers (ops per step)")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--reuse", action="store_true", help="reuse the traces already in --workdir")
    parser.add_argument("--measure", nargs=2, metavar=("HOW", "DIR"), help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.measure:
        print(json.dumps(measure(*a.measure)))
        return
    print(provenance("benchmarks.bench_explain", sys.argv[1:]), flush=True)
    prepare(a.workdir, a.steps, a.depth, a.width, a.reuse)
    for trace in sorted((a.workdir / "base").glob("rank*.json.gz")):
        print(
            f"trace {trace.name}: {uncompressed_size(trace) / 1e6:.0f} MB JSON ({trace.stat().st_size / 1e6:.0f} MB gz)"
        )
    for how in ("trace", "tables"):
        r = _fresh(how, a.workdir)
        print(
            f"{how:6}: {r['seconds']:6.1f} s, peak {r['peak_mb']:5.0f} MB, {r['intervals_per_case']:.0f} intervals "
            f"and {r['steps']:.0f} steps per case, residual {r['residual_ms']:+.1e} ms"
        )


if __name__ == "__main__":
    main()
