"""Does ``tpbench explain`` name the planted cause? (docs/explain.md, "Two checks, measured")

Two planted changes on the smoke size (2 Gloo ranks, mlp 512×8, batch 32, 2 warm-up + 8 timed
steps, 3 repeats, 8 traced steps), each swept for real and explained through the CLI:

- ``40 % more CPU``: a run with ``slowdown_kind = "cpu"``, then the same suite with
  ``--set slowdown_pct=40`` as a second run; ``explain BASE CAND`` should name ``compute``;
- ``1 Gbit/s link``: ``interconnect = ["loopback", "tcp-1gbit"]`` in one run; ``explain RUN --pair
  interconnect=loopback..tcp-1gbit`` should name ``exposed_comm`` (the emulated link needs root for
  its network namespace; without it the row says why).

Prints one Markdown row per check (the top part, the step time's change with compare's interval,
the top part's share, the traced change and its share of the timed one) and the load average
before and after. Run it with nothing else heavy running: the figures are step times.

Usage: ``python benchmarks/explain_checks.py --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

SUITE = """\
[suite]
name = "{name}"

[defaults]
world_size = 2
backend = "gloo"
device = "cpu"
workload = "mlp"
batch_size = 32
warmup_steps = 2
steps = 8
repeats = 3
slowdown_kind = "cpu"
timeout_s = 300

[sweep]
seed = [0]
{sweep}

[capture]
profiler_steps = 8

[workloads.mlp]
width = 512
depth = 8
"""


def tpbench(*args: str) -> subprocess.CompletedProcess:
    """One CLI call of the checkout this script sits in, its output kept."""
    root = Path(__file__).resolve().parents[1]
    env = os.environ | {"PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-m", "tpbench", *args], capture_output=True, text=True, env=env)


def sweep(suite: Path, out: Path, *extra: str) -> Path:
    proc = tpbench("sweep", str(suite), "--out", str(out), "--no-report", *extra)
    if proc.returncode != 0:
        raise SystemExit(f"sweep {suite} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    (run,) = [p for p in out.glob("*/*") if (p / "run.json").exists()]
    return run


def row(check: str, args: list[str]) -> str:
    proc = tpbench("explain", *args, "--format", "json")
    if proc.returncode != 0:
        return f"| {check} | explain exited {proc.returncode}: {proc.stderr.strip()[-300:]} |"
    (case,) = json.loads(proc.stdout)["cases"]
    top = next(c for c in case["components"] if c["name"] == case["top"])
    timed, traced = case["timed_delta_ms"], case["traced_delta_ms"]
    detail = [d for d in case["exposed_comm_detail"] if d["name"].startswith("bucket ")]
    where = f"`{case['top']}`" + (f", {detail[0]['name']}" if case["top"] == "exposed_comm" and detail else "")
    return (
        f"| {check} | {where} | {case['delta_ms']:+.1f} ms ({case['lo']:+.1f} to {case['hi']:+.1f}) | "
        f"{top['delta_ms']:+.1f} ms ({top['delta_ms'] / case['delta_ms']:.0%}) | {traced:+.1f} ms | "
        f"{traced / timed:.0%} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="a new directory for the runs")
    args = parser.parse_args()
    if args.out.exists():  # each sweep's run is found by globbing its folder, which must hold only that run
        parser.error(f"--out {args.out} already exists; give a new directory")
    args.out.mkdir(parents=True)
    load_before = os.getloadavg()
    base_toml, link_toml = args.out / "base.toml", args.out / "link.toml"
    base_toml.write_text(SUITE.format(name="check", sweep=""))
    link_toml.write_text(SUITE.format(name="link", sweep='interconnect = ["loopback", "tcp-1gbit"]'))
    base = sweep(base_toml, args.out / "base")
    cand = sweep(base_toml, args.out / "cand", "--set", "slowdown_pct=40")
    rows = [row("40 % more CPU", [str(base), str(cand)])]
    try:
        link = sweep(link_toml, args.out / "link")
        rows.append(row("1 Gbit/s link", [str(link), "--pair", "interconnect=loopback..tcp-1gbit"]))
    except SystemExit as e:
        rows.append(f"| 1 Gbit/s link | not run: {str(e).splitlines()[0]} |")
    print("| check | top | change (95 % CI) = the timed change | top part | traced change | traced / timed |")
    print("| --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    after = os.getloadavg()
    print(
        f"load average (1, 5 min): before {load_before[0]:.2f} {load_before[1]:.2f}, after {after[0]:.2f} "
        f"{after[1]:.2f}; {os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
