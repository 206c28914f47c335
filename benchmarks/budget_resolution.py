"""What a suite's budget buys: per run, its wall time and how finely its report's comparisons resolve.

A suite spends its time as repeats × (warm-up + timed steps). Comparisons of cases of one world are
paired by round, so each extra round is one more paired ratio: more, shorter repeats can tighten
the intervals in the same wall time, or not, where the warm-up and the per-repeat set-up (model
build, DDP construction) eat the saving. This measures it. For each run: its wall time
(``run.json`` efficiency), the report's within-run comparisons (``report.verdicts.compare`` for
every kind the report states: the ZeRO hooks, torch against tpbench, post-local SGD against DDP),
the share whose 95 % interval half-width is at most ``--target`` (5 %) and the median and largest
half-width.

Two ways to use it:

    # runs already made
    python -m benchmarks.budget_resolution RUN_DIR [RUN_DIR ...]
    # make them: each SHAPE is REPEATSxWARMUP+STEPS; shapes alternate round by round (ABAB...), so a
    # change in the machine's load falls on both alike
    python -m benchmarks.budget_resolution --suite suites/zero.toml --shape 5x5+30 --shape 12x3+12 --rounds 2

Step times are noise-dependent: run it on an otherwise idle machine, and again under the load the
figure is meant for.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.provenance import provenance

TARGET = 0.05


@dataclass(frozen=True)
class Resolution:
    run_dir: Path
    shape: str  # repeats x (warm-up + timed steps), from the run's cases
    wall_s: float | None
    comparisons: int
    paired: int
    within_target: int  # comparisons whose half-width is at most the target
    median_half_width: float
    max_half_width: float


def resolution(run_dir: Path, target: float = TARGET) -> Resolution:
    """The half-widths of every within-run comparison the run's report states."""
    from tpbench import store
    from tpbench.report import data as report_data
    from tpbench.report import verdicts

    loaded = store.load(run_dir)
    data = report_data.load([loaded])
    kinds = [*verdicts.ZERO_KINDS, *verdicts.impl_kinds(data), verdicts.LOCALSGD_KIND]
    ests = [c.est for k in kinds for c in verdicts.compare(data, k)]
    widths = [e.half_width for e in ests if e.has_interval]
    shapes = sorted(
        {f"{e.params['repeats']}x{e.params['warmup_steps']}+{e.params['steps']}" for e in loaded.record.cases.values()}
    )
    return Resolution(
        Path(run_dir),
        ", ".join(shapes),
        loaded.record.efficiency.wall_s if loaded.record.efficiency else None,
        len(ests),
        sum(e.method == "paired" for e in ests),
        sum(w <= target for w in widths),
        statistics.median(widths) if widths else float("nan"),
        max(widths) if widths else float("nan"),
    )


def line(r: Resolution, target: float = TARGET) -> str:
    wall = f"{r.wall_s:7.1f} s" if r.wall_s is not None else "      ? s"
    if not r.comparisons:  # nothing to resolve: say so rather than print shares and widths of nan
        return f"{r.shape:>10}  {wall}  no comparison in its report  {r.run_dir}"
    return (
        f"{r.shape:>10}  {wall}  {r.comparisons:3d} comparisons ({r.paired} paired)  "
        f"half-width <= {target:.0%}: {r.within_target}/{r.comparisons} ({r.within_target / r.comparisons:.0%})  "
        f"median ±{r.median_half_width:.1%}  largest ±{r.max_half_width:.1%}  {r.run_dir}"
    )


def parse_shape(text: str) -> tuple[int, int, int]:
    """REPEATSxWARMUP+STEPS as three integers; ValueError naming the text."""
    m = re.fullmatch(r"(\d+)x(\d+)\+(\d+)", text)
    if not m:
        raise ValueError(f"--shape {text!r}: expected REPEATSxWARMUP+STEPS, e.g. 12x3+12")
    return int(m[1]), int(m[2]), int(m[3])


def sweep(suite: str, shape: str, out: Path) -> Path:
    """One run of ``suite`` with its budget set to ``shape``; returns the run directory."""
    repeats, warmup, steps = parse_shape(shape)
    cmd = [sys.executable, "-m", "tpbench", "sweep", suite, "--out", str(out), "--no-report"]
    cmd += ["--set", f"repeats={repeats}", "--set", f"warmup_steps={warmup}", "--set", f"steps={steps}"]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    (run_json,) = out.glob("*/*/run.json")
    return run_json.parent


def main() -> None:
    from tpbench import store

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path, metavar="RUN_DIR")
    ap.add_argument("--suite", help="sweep this suite once per --shape and round")
    ap.add_argument("--shape", action="append", default=[], help="REPEATSxWARMUP+STEPS (with --suite)")
    ap.add_argument("--rounds", type=int, default=1, help="sweeps per shape, alternated (default: 1)")
    ap.add_argument("--out", type=Path, help="results root for --suite (default: a temporary folder)")
    ap.add_argument("--target", type=float, default=TARGET, help="half-width counted as resolved (default: 0.05)")
    args = ap.parse_args()
    if bool(args.suite) == bool(args.runs) or (args.suite and not args.shape):
        ap.error("give RUN_DIRs, or --suite with at least one --shape")
    # Each refused in argparse's one line and exit 2: a bad --shape exited 1, --rounds 0 printed nothing
    # and exited 0, a RUN_DIR that is not a run was a StoreError traceback.
    try:
        for shape in args.shape:
            parse_shape(shape)
    except ValueError as e:
        ap.error(str(e))
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: expected at least 1")
    print(provenance("benchmarks.budget_resolution", sys.argv[1:]), flush=True)
    runs = list(args.runs)
    if args.suite:
        root = args.out or Path(tempfile.mkdtemp(prefix="tpbench-budget-"))
        for k in range(args.rounds):
            for i, shape in enumerate(args.shape):
                runs.append(sweep(args.suite, shape, root / f"round{k}-shape{i}"))
    try:
        results = [resolution(r, args.target) for r in runs]
    except store.StoreError as e:
        ap.error(str(e))
    for r in results:
        print(line(r, args.target))
    by_shape: dict[str, list[Resolution]] = {}
    for r in results:
        by_shape.setdefault(r.shape, []).append(r)
    if len(by_shape) > 1 or any(len(v) > 1 for v in by_shape.values()):
        print("per shape, median over its runs:")
        for shape, rs in by_shape.items():
            walls = [r.wall_s for r in rs if r.wall_s is not None]
            wall = f"{statistics.median(walls):.1f} s" if walls else "?"
            compared = [r for r in rs if r.comparisons]
            if not compared:
                print(f"{shape:>10}  {wall} wall, no comparison in its reports ({len(rs)} runs)")
                continue
            share = statistics.median(r.within_target / r.comparisons for r in compared)
            median = statistics.median(r.median_half_width for r in compared)
            print(
                f"{shape:>10}  {wall} wall, {share:.0%} within ±{args.target:.0%}, "
                f"median ±{median:.1%} ({len(rs)} runs, {len(compared)} with comparisons)"
            )


if __name__ == "__main__":
    main()
