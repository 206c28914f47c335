"""Report generation time and file size for a run of a hundred cases and more.

The run is synthetic (``benchmarks/synth_run.py``): a ZeRO sweep of 4 algorithms over bucket sizes,
``shard_buckets`` and 3 interconnects, with every table a real sweep leaves in the store (steps,
summary, intervals, overlap, collectives, NVML samples) and a failed case. Each round times
``write_report`` end to end in a fresh process (imports excluded): loading through the store,
building every section, writing the file. Both wall and CPU time are printed, since a shared
machine's wall time includes waiting for other people's work.

Usage: python -m benchmarks.bench_report [--workdir DIR] [--reuse] [--rounds 3] [--buckets 1 2 4 8 16 25]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.provenance import provenance

TARGET_S = 10.0

_ROUND = """
import json, sys, time
from pathlib import Path
from tpbench import report
run, out = Path(sys.argv[1]), Path(sys.argv[2])
w, c = time.perf_counter(), time.process_time()
report.write_report([run], out)
print(json.dumps({"wall_s": time.perf_counter() - w, "cpu_s": time.process_time() - c}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--workdir", type=Path, help="where the synthetic run and the report go (default: a temporary folder)"
    )
    ap.add_argument("--reuse", action="store_true", help="reuse a synthetic run already in --workdir")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--buckets", type=float, nargs="+", default=[1, 2, 4, 8, 16, 25])
    args = ap.parse_args()
    if args.rounds < 1:  # 0 timed nothing and ended in a FileNotFoundError for the report it never wrote
        ap.error(f"--rounds {args.rounds}: expected at least 1")
    print(provenance("benchmarks.bench_report", sys.argv[1:]), flush=True)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="tpbench-bench-report-"))
    runs = sorted((work / "results").glob("*/*/run.json")) if args.reuse else []
    if runs:
        run_dir = runs[-1].parent
    else:
        from benchmarks.synth_run import make_run

        run_dir = make_run(work / "results", buckets=tuple(args.buckets))
    cases = len(json.loads((run_dir / "run.json").read_text())["cases"])
    out = work / "report.html"
    rounds = []
    for _ in range(args.rounds):
        proc = subprocess.run(
            [sys.executable, "-c", _ROUND, str(run_dir), str(out)], capture_output=True, text=True, check=True
        )
        rounds.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    html = out.read_text()
    wall = statistics.median(r["wall_s"] for r in rounds)
    cpu = statistics.median(r["cpu_s"] for r in rounds)
    print(f"run: {run_dir} ({cases} cases)")
    print(f"report: {out}")
    walls = ", ".join(f"{r['wall_s']:.2f}" for r in rounds)
    figures = html.count('tpbPlot("fig')
    print(
        f"generation time, median of {args.rounds}: {wall:.2f} s wall, {cpu:.2f} s CPU "
        f"(target <= {TARGET_S:.0f} s; rounds: {walls} s wall)"
    )
    print(
        f"file size: {out.stat().st_size / 1e6:.2f} MB, "
        f"of which plotly.js {_plotly_js_bytes() / 1e6:.2f} MB; {figures} figures"
    )


def _plotly_js_bytes() -> int:
    import plotly.offline

    return len(plotly.offline.get_plotlyjs().encode())


if __name__ == "__main__":
    main()
