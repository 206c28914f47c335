"""Measure a tpbench gate on your own runners before trusting it in CI.

Two numbers matter: how often identical code is called a regression (false positives, A/A), and
how often a real slowdown of a given size is caught (detection). Both are measured for the two
ways of gating:

- ``compare``: a stored baseline run against a later candidate run (separate sweeps, as when the
  baseline comes from another job); also with the three previous runs pooled as baselines;
- ``gate``: ``tpbench gate --mode rounds`` (both sides in the same job, rounds interleaved and paired).

Only identical-code runs are collected. Detection is measured on the same runs with every step
time of the candidate side multiplied by (1 + slowdown): an exact slowdown on top of the
machine's real noise. A wall-clock delay injected into the steps (``slowdown_pct``) does not give
an exact slowdown on a loaded machine, where the scheduler amplifies it: ``--knob`` also runs
real ``slowdown_pct`` gates and reports what they realized.

Usage::

    python examples/ci/gate_accuracy.py collect --out DIR [--pairs 20] [--rounds 3] [--knob N]
    python examples/ci/gate_accuracy.py score DIR [--threshold 5%] [--slowdown 10%] [--regroup 5]

``collect`` runs the real commands with this interpreter's tpbench and keeps every run (A/A
compare sweeps and A/A gates alternate, so a machine that gets busier affects both alike);
``score`` judges the stored runs with the current method and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tpbench import compare, store
from tpbench.analysis.stats import repeat_values

SUITE = """\
[suite]
name = "gate-accuracy"
description = "One DDP case of a few ms per step, for measuring gates"

[defaults]
world_size = 2
backend = "gloo"
device = "cpu"
algorithm = "ddp"
workload = "mlp"
batch_size = 64
warmup_steps = 10
steps = 20
repeats = 5
timeout_s = 300

[capture]
profiler_steps = 0

[workloads.mlp]
width = 256
depth = 4
"""


def _tpbench(*args: str) -> int:
    cmd = [sys.executable, "-m", "tpbench", *args]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, stdout=sys.stderr.fileno()).returncode


def _gate(suite: Path, out: Path, rounds: int, *extra: str) -> None:
    py = sys.executable
    _tpbench(
        "gate",
        str(suite),
        "--baseline",
        py,
        "--candidate",
        py,
        "--mode",
        "rounds",
        "--rounds",
        str(rounds),
        "--out",
        str(out),
        "--format",
        "json",
        *extra,
    )


def collect(out: Path, pairs: int, rounds: int, knob: list[float]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    suite = out / "suite.toml"
    suite.write_text(SUITE)
    (out / "settings.json").write_text(json.dumps({"pairs": pairs, "rounds": rounds}))
    for i in range(pairs + 1):
        _tpbench("sweep", str(suite), "--no-report", "--out", str(out / "compare" / f"{i:03d}"))
        if i < pairs:
            _gate(suite, out / "gate" / f"{i:03d}", rounds)
    for pct in knob:
        _gate(suite, out / "knob" / f"{pct:g}", rounds, "--candidate-set", f"slowdown_pct={pct}")


def _run(folder: Path) -> Path | None:
    runs = [r for r in store.iter_runs(folder) if (r / store.SUMMARY_FILE).exists()]
    return runs[0] if len(runs) == 1 else None


def _gate_sides(folder: Path) -> tuple[list[Path], list[Path]] | None:
    """A finished gate's rounds, per side; None while it is incomplete."""
    b = [_run(r) for r in sorted((folder / "baseline").glob("round*"))]
    c = [_run(r) for r in sorted((folder / "candidate").glob("round*"))]
    if not b or len(b) != len(c) or None in b + c:
        return None
    return b, c


def _slowed(run: Path, factor: float, scratch: Path) -> Path:
    """A copy of ``run`` whose every step took ``factor`` times as long."""
    copy = scratch / f"{run.parent.parent.parent.name}-{run.name}-x{factor:g}"
    if not copy.exists():
        shutil.copytree(run, copy)
        for steps in copy.glob("cases/*/steps.parquet"):
            df = pd.read_parquet(steps)
            df["step_ms"] *= factor
            store.atomic_write_parquet(steps, df)
    return copy


@dataclass
class Tally:
    verdicts: list[str]
    ratios: list[float]

    def rate(self, *verdicts: str) -> str:
        k = sum(v in verdicts for v in self.verdicts)
        return f"{k}/{len(self.verdicts)}"

    def spread(self) -> str:
        r = np.array(self.ratios)
        return f"{np.median(r):.3f} [{np.quantile(r, 0.1):.3f}–{np.quantile(r, 0.9):.3f}]" if r.size else "–"


def _tally(jobs: list[tuple[list[Path], list[Path], bool]], threshold: float) -> Tally:
    verdicts, ratios = [], []
    for b, c, paired in jobs:
        (case,) = compare.compare_runs(b, c, threshold=threshold, pairing="rounds" if paired else "none").cases
        verdicts.append(case.verdict)
        ratios.append(case.ratio if case.ratio is not None else float("nan"))
    return Tally(verdicts, ratios)


def score(out: Path, threshold: float, slowdown: float, regroup: list[int]) -> str:
    settings = json.loads((out / "settings.json").read_text())
    scratch = out / "scaled"
    scratch.mkdir(exist_ok=True)
    factor = 1 + slowdown
    runs = [r for r in (_run(p) for p in sorted((out / "compare").iterdir())) if r is not None]
    gates = [g for g in (_gate_sides(p) for p in sorted((out / "gate").iterdir())) if g is not None]
    slow = [_slowed(r, factor, scratch) for r in runs]
    jobs = {
        "compare, 1 stored baseline": (
            [([runs[i]], [runs[i + 1]], False) for i in range(len(runs) - 1)],
            [([runs[i]], [slow[i + 1]], False) for i in range(len(runs) - 1)],
        ),
        "compare, 3 stored baselines pooled": (
            [(runs[i - 3 : i], [runs[i]], False) for i in range(3, len(runs))],
            [(runs[i - 3 : i], [slow[i]], False) for i in range(3, len(runs))],
        ),
        f"gate, {settings['rounds']} paired rounds a side": (
            [(b, c, True) for b, c in gates],
            [(b, [_slowed(r, factor, scratch) for r in c], True) for b, c in gates],
        ),
    }
    # Longer gates from the same rounds: consecutive gates' rounds regrouped, without overlap.
    pairs = [(b, c) for bs, cs in gates for b, c in zip(bs, cs)]
    for n in regroup:
        chunks = [pairs[i : i + n] for i in range(0, len(pairs) - n + 1, n)]
        jobs[f"gate, {n} paired rounds a side (regrouped)"] = (
            [([b for b, _ in ch], [c for _, c in ch], True) for ch in chunks],
            [([b for b, _ in ch], [_slowed(c, factor, scratch) for _, c in ch], True) for ch in chunks],
        )
    lines = [
        f"threshold ±{threshold:.0%}; "
        f"detection of an exact {slowdown:.0%} slowdown (candidate step times × {factor:g})",
        "",
        "| method | pairs | A/A: regression | A/A: improvement | A/A: inconclusive | A/A ratio, median [p10–p90] "
        f"| +{slowdown:.0%}: regression | +{slowdown:.0%}: inconclusive |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, (aa_jobs, slow_jobs) in jobs.items():
        aa, sl = _tally(aa_jobs, threshold), _tally(slow_jobs, threshold)
        lines.append(
            f"| {name} | {len(aa.verdicts)} "
            f"| {aa.rate('regression')} | {aa.rate('improvement')} | {aa.rate('inconclusive')} "
            f"| {aa.spread()} "
            f"| {sl.rate('regression')} | {sl.rate('inconclusive')} |"
        )
    knob_dir = out / "knob"
    if knob_dir.is_dir():
        lines += ["", "| `--candidate-set slowdown_pct=N` gate | realized ratio [CI] | verdict |", "|---|---:|---|"]
        for g in sorted(knob_dir.iterdir(), key=lambda p: float(p.name)):
            sides = _gate_sides(g)
            if sides:
                (case,) = compare.compare_runs(*sides, threshold=threshold, pairing="rounds").cases
                lines.append(f"| {g.name} | {case.ratio:.3f} [{case.ci_lo:.3f}, {case.ci_hi:.3f}] | {case.verdict} |")
    spread = [float(np.median(repeat_values(store.load(r).steps)["step_ms"])) for r in runs]
    lines += [
        "",
        f"run medians over the A/A compare sweeps: {min(spread):.1f}–{max(spread):.1f} ms "
        f"(median {np.median(spread):.1f} ms, {len(spread)} runs)",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("collect")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--pairs", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--knob",
        type=float,
        action="append",
        default=[],
        metavar="PCT",
        help="also run a gate with --candidate-set slowdown_pct=PCT (repeatable)",
    )
    p = sub.add_parser("score")
    p.add_argument("out", type=Path)
    p.add_argument("--threshold", default="5%")
    p.add_argument("--slowdown", default="10%")
    p.add_argument(
        "--regroup",
        type=int,
        action="append",
        default=[],
        metavar="N",
        help="also score gates of N rounds made of the collected gates' rounds, regrouped",
    )
    args = ap.parse_args()
    if args.command == "collect":
        collect(args.out, args.pairs, args.rounds, args.knob)
    else:
        sys.stdout.write(
            score(
                args.out, compare.parse_threshold(args.threshold), compare.parse_threshold(args.slowdown), args.regroup
            )
        )


if __name__ == "__main__":
    main()
