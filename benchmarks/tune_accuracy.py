"""Measure ``tpbench tune`` on planted suites: is its claim honest, and what does it cost?

A planted suite's arms are one compute-bound case slowed by known amounts (``slowdown_pct`` with
``slowdown_kind = "cpu"``: each step burns that share of its CPU time more), so the true best arm
is the one with the smallest slowdown. Each tune is judged on:

- right: the recommended arm is the true best, or planted within epsilon of it;
- claim false: the tune claimed a recommendation ("the best", or "within epsilon") and the
  recommended arm is planted more than epsilon slower than the best (an unresolved tune claims
  neither and is counted apart);
- margin false: an unresolved tune's margin shown (``supported_epsilon``, "the rounds run show it
  within X % of the best") is false, the recommended arm planted more than X % slower than the best;
- cost: ``timed_s`` against ``grid_timed_s`` (every arm for the recommended arm's rounds), and
  the wall time; whether the slowest arm went out with fewer rounds than the recommended one;
- the issue's check: right (or the runner-up recommended with the best tied), the slowest arm out
  earlier, and a cost share at most 0.5, together.

Beside each tune, in the same conditions, the naive pick DeepSpeed's autotuner makes: one fixed
short sweep of every arm (as many rounds as the tune's timed seconds pay for, spread evenly), then
the argmin of the arms' medians; it is wrong when that arm is planted more than epsilon slower.

``--competitor N`` keeps N CPU-bound busy loops running throughout (the loaded condition); the
load average before and after each tune is recorded. ``--no-naive`` runs the tunes alone (about
half the time: the naive sweep costs the tune's timed seconds again); its rows have no naive pick.

Usage::

    python benchmarks/tune_accuracy.py --out DIR [--suite suites/tune-planted.toml] [--tunes 20]
        [--competitor 1] [--no-naive] [--table] [-- TUNE_ARGS...]

Everything after ``--`` goes to ``tpbench tune`` (e.g. ``--epsilon 2% --budget-s 420``).
Results: ``DIR/tunes.jsonl`` (one line per tune) and a Markdown table on stdout. Run again with the
same ``DIR`` to add tunes: the log is appended to and the new tunes are numbered after the old.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tpbench import store

SUITE = Path(__file__).resolve().parents[1] / "suites" / "tune-planted.toml"


def _busy_loops(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _planted(params: dict) -> float:
    return float(params.get("slowdown_pct", 0.0))


def run_tune(suite: Path, out: Path, tune_args: list[str]) -> dict:
    """One real tune: its JSON result, exit code, wall time and the machine's load around it."""
    cmd = [sys.executable, "-m", "tpbench", "tune", str(suite), "--out", str(out), "--format", "json", *tune_args]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    load_before, t0 = os.getloadavg()[0], time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if proc.returncode not in (0, 4):
        raise SystemExit(f"`{' '.join(cmd)}` exited with {proc.returncode}")
    return {
        "result": json.loads(proc.stdout),
        "exit_code": proc.returncode,
        "wall_s": time.monotonic() - t0,
        "load1_before": load_before,
        "load1_after": os.getloadavg()[0],
    }


def naive_pick(suite: Path, out: Path, rounds: int) -> dict:
    """DeepSpeed's autotuner's pick: one short sweep of every arm, then the lowest median."""
    cmd = [sys.executable, "-m", "tpbench", "sweep", str(suite), "--out", str(out), "--no-report"]
    cmd += ["--set", f"repeats={rounds}", "--set", "capture.profiler_steps=0"]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    t0 = time.monotonic()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.monotonic() - t0
    table = store.load(next(iter(store.iter_runs(out)))).table
    best = table.loc[table["median_ms"].idxmin()]
    return {"naive_slowdown_pct": float(best["slowdown_pct"]), "naive_rounds": rounds, "naive_wall_s": wall}


def judge(facts: dict) -> dict:
    """The tune's and the naive pick's correctness against the planted truth."""
    res = facts["result"]
    eps_pct = 100 * res["epsilon"]
    best = min(_planted(a["params"]) for a in res["arms"])
    rec = _planted(res["recommended"]["params"]) if res["recommended"] else math.inf
    slowest = max(res["arms"], key=lambda a: _planted(a["params"]))
    planted = sorted({_planted(a["params"]) for a in res["arms"]})
    best_status = next(a["status"] for a in res["arms"] if _planted(a["params"]) == best)
    rec_rounds = next((a["rounds"] for a in res["arms"] if a["status"] == "recommended"), 0)
    right = rec == best or rec - best <= eps_pct
    claimed = res["state"] in ("recommended", "tied")
    shown = res.get("supported_epsilon")
    return {
        "state": res["state"],
        "epsilon": res["epsilon"],
        "recommended_slowdown_pct": rec,
        "right": right,
        "claim_false": claimed and not right,
        "margin_false": not claimed and shown is not None and rec - best > 100 * shown,
        "timed_s": res["timed_s"],
        "grid_timed_s": res["grid_timed_s"],
        "cost_share": res["timed_s"] / res["grid_timed_s"] if res["grid_timed_s"] else None,
        "slowest_out_earlier": slowest["status"] == "eliminated" and slowest["rounds"] < rec_rounds,
        # The check also accepts the runner-up recommended with the best tied beside it.
        "runner_up_best_tied": len(planted) > 1 and rec == planted[1] and best_status == "tied",
        "naive_wrong": None if facts["naive_slowdown_pct"] is None else facts["naive_slowdown_pct"] - best > eps_pct,
    }


def check_held(row: dict) -> bool:
    """The issue's check of one tune: the true best recommended (or one planted within epsilon of
    it, or the runner-up with the best tied), the slowest arm out with fewer rounds than the
    recommended one, and ``timed_s`` at most half of ``grid_timed_s`` (epsilon and the confidence
    are in every tune's JSON). An unresolved tune recommends nothing (exit 4): its best guess,
    right or not, does not hold the check."""
    share = row["cost_share"]
    named = row["state"] != "unresolved" and (row["right"] or row.get("runner_up_best_tied", False))
    return bool(named and row["slowest_out_earlier"] and share is not None and share <= 0.5)


def table(rows: list[dict]) -> str:
    head = (
        "| competitors | tunes | right (best or within ε) | claim false | unresolved | margin false "
        "| timed / grid (median) | slowest out earlier | check held | tune wall s (median) | naive pick wrong "
        "| load1 (median) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    groups: dict[int, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["competitors"], []).append(r)
    lines = []
    for comp, g in sorted(groups.items()):
        n = len(g)
        shares = [r["cost_share"] for r in g if r["cost_share"] is not None]
        lines.append(
            f"| {comp} | {n} | {sum(r['right'] for r in g)}/{n} | {sum(r['claim_false'] for r in g)}/{n} "
            f"| {sum(r['state'] == 'unresolved' for r in g)}/{n} | {sum(r.get('margin_false', False) for r in g)}/{n} "
            f"| {statistics.median(shares):.2f} "
            f"| {sum(r['slowest_out_earlier'] for r in g)}/{n} | {sum(map(check_held, g))}/{n} "
            f"| {statistics.median(r['wall_s'] for r in g):.0f} "
            f"| {_count([r['naive_wrong'] for r in g if r['naive_wrong'] is not None])} "
            f"| {statistics.median(r['load1_before'] for r in g):.2f} |"
        )
    return head + "\n".join(lines) + "\n"


def _count(flags: list[bool]) -> str:
    return f"{sum(flags)}/{len(flags)}" if flags else "–"


def main() -> None:
    argv = sys.argv[1:]
    tune_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--suite", type=Path, default=SUITE, help="a planted suite (default: suites/tune-planted.toml)")
    ap.add_argument("--tunes", type=int, default=20, help="tunes to run (default 20)")
    ap.add_argument("--competitor", type=int, default=0, help="busy loops running throughout (default 0)")
    ap.add_argument("--no-naive", action="store_true", help="run no naive sweep beside each tune")
    ap.add_argument("--table", action="store_true", help="only print the table of what DIR already holds")
    args = ap.parse_args(argv)
    log = args.out / "tunes.jsonl"
    # Checked here, in argparse's one line and exit 2: both used to end in a FileNotFoundError
    # traceback for tunes.jsonl, since no tune had run to write it.
    if args.tunes < 1 and not args.table:
        ap.error(f"--tunes {args.tunes}: expected at least 1 (--table prints what --out already holds)")
    if args.competitor < 0:
        ap.error(f"--competitor {args.competitor}: expected 0 or more busy loops")
    if args.table and not log.is_file():
        ap.error(f"--out {args.out}: no tunes.jsonl there to print; run tunes into it first")
    if not args.table:
        args.out.mkdir(parents=True, exist_ok=True)
        suite = args.suite.absolute()
        done = len(log.read_text().splitlines()) if log.exists() else 0
        busy = _busy_loops(args.competitor)
        try:
            for i in range(done, done + args.tunes):
                name = f"c{args.competitor}-{i:03d}"
                facts = run_tune(suite, args.out / name / "tune", tune_args)
                res = facts["result"]
                # The naive sweep gets the tune's timed seconds, spread evenly over every arm.
                rec_rounds = next((a["rounds"] for a in res["arms"] if a["status"] == "recommended"), 1)
                per_round = res["grid_timed_s"] / max(1, rec_rounds)
                rounds = max(1, int(res["timed_s"] / per_round)) if per_round else 1
                if args.no_naive:
                    facts |= {"naive_slowdown_pct": None, "naive_rounds": 0, "naive_wall_s": None}
                else:
                    facts |= naive_pick(suite, args.out / name / "naive", rounds)
                row = {"tune": name, "competitors": args.competitor, "wall_s": facts["wall_s"]}
                row |= {k: facts[k] for k in ("exit_code", "load1_before", "load1_after", "naive_wall_s")}
                row |= {"naive_slowdown_pct": facts["naive_slowdown_pct"], "naive_rounds": facts["naive_rounds"]}
                row |= judge(facts)
                with open(log, "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(json.dumps(row), file=sys.stderr, flush=True)
        finally:
            for p in busy:
                p.kill()
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    print(f"machine: {os.cpu_count()} CPUs; load average now {os.getloadavg()[0]:.2f}")
    sys.stdout.write(table(rows))


if __name__ == "__main__":
    main()
