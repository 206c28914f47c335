"""Measure ``tpbench gate`` on your own runners before trusting it in CI.

Two numbers matter: how often identical code is called a regression (A/A false alarms), and how
often a real slowdown of a given size is caught (detection). This runs real gates of the checkout
it is in (the gate, both sides and the judging, its root a source tree first on the path, whatever
tpbench the interpreter has installed), the candidate slowed by ``slowdown_pct`` with ``slowdown_kind = "cpu"``
(each step burns that share of its CPU time more: an exact slowdown of the work, on top of the
machine's real noise), and judges every gate on each metric asked for: the runs of one gate
hold both wall and CPU time per step, so one gate answers for both.

``--competitor N`` keeps N CPU-bound busy loops running for the whole measurement: the "loaded"
condition, reproducibly. The machine's load average before and after each gate is recorded
beside its verdicts.

Usage::

    python examples/ci/gate_accuracy.py --out DIR [--suite suites/gate.toml] [--gates 20]
        [--slowdown 0 --slowdown 10] [--metric step_ms --metric cpu_ms] [--competitor 1]
        [--threshold 5%] [--table] [-- GATE_ARGS...]

Everything after ``--`` goes to ``tpbench gate`` (e.g. ``--repeats 40``; lockstep gates only, the
default: ``--mode rounds`` is refused). Results: one folder per
gate under DIR, ``DIR/gates.jsonl`` (one line per gate and metric, with its interval; per case, named,
where ``--suite`` has several) and a Markdown table on stdout (a row per case there; with ``--target-ci``
among GATE_ARGS, a second table of the gates' own answers: different,
same or unknown, from the sequential interval each stopped on); ``--table --threshold 2%`` prints the
table of what DIR holds judged at another threshold. A gate that refuses its input (exit 2: a
mistyped GATE_ARG) stops the script with the gate's error; one that ends without a verdict (exit 3:
a side failed) has its error shown and is tallied "no runs".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# The checkout this script is in: what its gates measure. Given as both sides it is a source tree,
# run with its root first on PYTHONPATH; this interpreter as a side ran the tpbench installed in its
# environment (the gate drops PYTHONPATH entries that hold tpbench from a python side), so a checkout
# run with PYTHONPATH beside a venv installed from another tree measured that other tree. The script
# judges with the same checkout: its root goes first on the import path before tpbench is imported.
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tpbench import compare, gate_record, store  # noqa: E402 (after ROOT is first on the path)
from tpbench.cli.common import EXIT_USAGE  # noqa: E402

# The shipped gate suite: one compute-bound DDP case of about 15 ms per step on 2 CPU ranks.
SUITE = ROOT / "suites" / "gate.toml"


def _busy_loops(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _runs(gate_dir: Path, side: str) -> list[Path]:
    """The side's runs in one gate's folder; none where the gate failed before the side wrote any."""
    folder = gate_dir / side
    return sorted(store.iter_runs(folder)) if folder.is_dir() else []


def gate_process(suite: Path, out: Path, slowdown: float, gate_args: list[str]) -> tuple[list[str], dict[str, str]]:
    """One gate's command and environment: the checkout's (``ROOT``) gate, its sides that checkout."""
    cmd = [sys.executable, "-m", "tpbench", "gate", str(suite), "--baseline", str(ROOT)]
    cmd += ["--candidate", str(ROOT), "--out", str(out), "--format", "json", *gate_args]
    if slowdown:
        cmd += ["--candidate-set", f"slowdown_pct={slowdown:g}", "--candidate-set", "slowdown_kind=cpu"]
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return cmd, os.environ | {"PYTHONPATH": path}


def run_gate(suite: Path, out: Path, slowdown: float, gate_args: list[str]) -> dict:
    """One real gate; its wall time, exit code and the machine's load around it."""
    cmd, env = gate_process(suite, out, slowdown, gate_args)
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    if proc.returncode == EXIT_USAGE:
        # Input the gate refuses (a mistyped GATE_ARG, a suite it rejects) is refused in every gate:
        # stop at the first with the gate's own words, not tally a campaign of gates that never ran.
        print(proc.stderr, end="", file=sys.stderr)
        print(f"gate_accuracy: the gate refused its input (exit {EXIT_USAGE}); nothing measured", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    if proc.returncode not in (0, 1, 4):  # a gate that could not judge: say why, and go on to the next
        print(proc.stderr, end="", file=sys.stderr)
    facts = {
        "wall_s": time.monotonic() - t0,
        "exit_code": proc.returncode,
        "load1_before": load_before,
        "load1_after": os.getloadavg()[0],
    }
    record = gate_record.read(out) if (out / gate_record.GATE_FILE).is_file() else None
    if record is not None and record.answer is not None:  # --target-ci: the gate's own, from its sequential interval
        facts |= {"answer": record.answer, "stopped": record.stopped, "target_ci": record.target_ci}
    return facts


def judge(out: Path, metric: str, threshold: float) -> list[dict]:
    """The gate's runs judged on ``metric`` as ``tpbench gate`` judges them (paired by repeat): a row
    per case, each naming its case (``case``) where the suite has more than one."""
    b, c = _runs(out, "baseline"), _runs(out, "candidate")
    if len(b) != 1 or len(c) != 1:
        return [{"verdict": "no runs", "ratio": None, "half_width": None, "pairs": 0}]
    cases = compare.compare_runs(b, c, metric=metric, threshold=threshold, pairing="repeats").cases
    rows = []
    for case in cases:
        row = {"case": case.label} if len(cases) > 1 else {}
        row |= {"verdict": case.verdict, "ratio": case.ratio, "ci_lo": case.ci_lo, "ci_hi": case.ci_hi}
        rows.append(row | {"half_width": case.half_width, "pairs": case.pairs})
    return rows


def table(rows: list[dict], threshold: float) -> str:
    """Tallies per condition, slowdown and metric; verdicts judged again at ``threshold`` from each
    gate's interval, so one set of gates can be scored at several thresholds."""
    rows = [r | {"verdict": _verdict(r, threshold)} for r in rows]
    lines = [
        f"threshold ±{threshold:.0%}",
        "",
        "| competitors | slowdown | metric | gates | regression | inconclusive | pass | improvement "
        "| median ratio | median half-width | median wall s | load1 range |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for (comp, slow, metric, case), g in _grouped(rows, "competitors", "slowdown_pct", "metric", "case"):
        n = {v: f"{sum(r['verdict'] == v for r in g)}/{len(g)}" for v in compare.VERDICTS}
        metric += f" ({case})" if case else ""  # a suite of several cases: a row per case
        lines.append(
            f"| {comp} | +{slow:g}% | {metric} | {len(g)} | {n['regression']} | {n['inconclusive']} | {n['pass']} "
            f"| {n['improvement']} | {_median(g, 'ratio'):.3f} | ±{_median(g, 'half_width'):.1%} "
            f"| {_median(g, 'wall_s'):.0f} | {_load_range(g)} |"
        )
    return "\n".join(lines) + "\n"


def answers_table(rows: list[dict]) -> str:
    """Gates with ``--target-ci``: their own answers (different / same / unknown, decided by the
    sequential interval they stopped on), and the pairs and wall time they took."""
    # One answer a gate (and metric), however many case rows it has.
    rows = list({(r["gate"], r["metric"]): r for r in rows if "answer" in r}.values())
    if not rows:
        return ""
    lines = [
        "",
        "| competitors | slowdown | metric | target | gates | different | same | unknown | median pairs "
        "| median wall s | load1 range |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for (comp, slow, metric, target), g in _grouped(rows, "competitors", "slowdown_pct", "metric", "target_ci"):
        n = {a: f"{sum(r['answer'] == a for r in g)}/{len(g)}" for a in ("different", "same", "unknown")}
        lines.append(
            f"| {comp} | +{slow:g}% | {metric} | ±{target:.0%} | {len(g)} | {n['different']} | {n['same']} "
            f"| {n['unknown']} | {_median(g, 'pairs'):.0f} | {_median(g, 'wall_s'):.0f} | {_load_range(g)} |"
        )
    return "\n".join(lines) + "\n"


def _grouped(rows: list[dict], *keys: str) -> list[tuple[tuple, list[dict]]]:
    """The rows grouped by the values of ``keys``, in sorted order of those values."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k, "") if k == "case" else r[k] for k in keys), []).append(r)
    return sorted(groups.items())


def _median(g: list[dict], key: str) -> float:
    """The upper median of ``key`` over the rows that have it (NaN when none do)."""
    vals = sorted(r[key] for r in g if r[key] is not None)
    return vals[len(vals) // 2] if vals else float("nan")


def _load_range(g: list[dict]) -> str:
    loads = [x for r in g for x in (r["load1_before"], r["load1_after"])]
    return f"{min(loads):.1f}–{max(loads):.1f}"


def _verdict(row: dict, threshold: float) -> str:
    """The gate's verdict at ``threshold``: judged again from its interval where it has one. A gate
    of fewer than ``compare.MIN_REPEATS`` pairs keeps its verdict (inconclusive: too few to judge),
    as every comparison of tpbench does; judged by its interval's ends alone, 2 pairs were tallied a
    regression or a pass at the very threshold the gate had called them inconclusive."""
    judged = (compare.PASS, compare.REGRESSION, compare.IMPROVEMENT, compare.INCONCLUSIVE)
    if row.get("ci_lo") is None or row["verdict"] not in judged or row["pairs"] < compare.MIN_REPEATS:
        return row["verdict"]
    return compare.judge(row["ci_lo"], row["ci_hi"], threshold)


def _mode(gate_args: list[str]) -> str | None:
    """The ``--mode`` among the gate's arguments, as ``--mode X`` or ``--mode=X``; None without."""
    for i, arg in enumerate(gate_args):
        if arg == "--mode" and i + 1 < len(gate_args):
            return gate_args[i + 1]
        if arg.startswith("--mode="):
            return arg.split("=", 1)[1]
    return None


def main() -> None:
    argv = sys.argv[1:]
    gate_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--suite", type=Path, default=SUITE, help="the suite gated (default: suites/gate.toml)")
    ap.add_argument("--gates", type=int, default=20, help="gates per slowdown (default 20)")
    ap.add_argument("--slowdown", type=float, action="append", help="percent; repeatable (default: 0 and 10)")
    ap.add_argument("--metric", action="append", help="step_ms and/or cpu_ms (default: both)")
    ap.add_argument("--competitor", type=int, default=0, help="busy loops running throughout (default 0)")
    ap.add_argument("--threshold", default="5%")
    ap.add_argument("--table", action="store_true", help="only print the table of what DIR already holds")
    args = ap.parse_args(argv)
    # Judged here by pairing one run per side repeat by repeat, a rounds gate (a run per side and
    # round) would be tallied "no runs", gate after gate, without a word of why.
    if (mode := _mode(gate_args)) not in (None, "lockstep"):
        ap.error(f"-- --mode {mode}: this script measures lockstep gates (one run per side, paired by repeat)")
    threshold = compare.parse_threshold(args.threshold)
    log = args.out / "gates.jsonl"
    if args.table and not log.is_file():  # a FileNotFoundError traceback for gates.jsonl before
        ap.error(f"--out {args.out}: no gates.jsonl there to print; run gates into it first")
    if not args.table:
        args.out.mkdir(parents=True, exist_ok=True)
        suite = args.suite.absolute()
        busy = _busy_loops(args.competitor)
        try:
            for i in range(args.gates):
                # Slowdowns alternate gate by gate, so a machine that changes affects them alike.
                for slowdown in args.slowdown or [0.0, 10.0]:
                    out = args.out / f"c{args.competitor}-s{slowdown:g}-{i:03d}"
                    facts = run_gate(suite, out, slowdown, gate_args)
                    for metric in args.metric or ["step_ms", "cpu_ms"]:
                        for judged in judge(out, metric, threshold):
                            row = {"gate": out.name, "competitors": args.competitor, "slowdown_pct": slowdown}
                            row |= {"metric": metric, **facts, **judged}
                            with open(log, "a") as f:
                                f.write(json.dumps(row) + "\n")
                            print(json.dumps(row), file=sys.stderr, flush=True)
        finally:
            for p in busy:
                p.kill()
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    sys.stdout.write(table(rows, threshold) + answers_table(rows))


if __name__ == "__main__":
    main()
