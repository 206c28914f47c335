"""``tpbench tune`` on a real NVIDIA GPU: a planted race whose answer is known, and a real one.

Two tunes through the CLI, as a user runs them (``python -m tpbench tune SUITE --format json``; the
second with ``--trace``, where the time goes):

- ``planted``: one launch-bound DDP case on NCCL ×1, four arms slowed by 0, 3, 10 and 40 % of the
  warm-up's step time (``slowdown_kind = "sleep"``: a host-side wait inside the timed step, which
  the CUDA events see on a step too small to hide it behind queued kernels). The true ranking is
  known, so the checks are the issue's: the 0 % arm is recommended (or the 3 % arm, with the 0 %
  arm tied), the 40 % arm is eliminated in fewer rounds than the recommended one ran (or at the
  race's first look), epsilon and confidence are stated, and the tune timed no more than the grid
  would have;
- ``zero``: DDP and both ZeRO hooks on 2 Gloo ranks sharing the GPU (communication staged through
  the host), under a time budget: whatever it decides, the result must be well formed (every arm's
  ratio inside its interval, one recommended arm) and ``tpbench report`` must open with the
  Recommendation; ``--trace`` must split the traced settings' steps on the GPU ranks into parts
  that add up to them.

Each tune's realised ratios are figures: on a GPU a planted wait is measured through CUDA events,
so the realised slowdown is the check's finding, not its input.

Usage: python -m gpu.tune --root DIR [--json FILE] [--rehearse]
(``--rehearse``: the same tunes on CPU ranks, to test the script; its figures are not GPU figures.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from gpu.analysis import Checks
from tpbench.racing import MIN_ROUNDS

PLANTED = """
[suite]
name = "gpu-tune-planted"
[defaults]
world_size = 1
backend = "{backend}"
device = "{device}"
interconnect = "{interconnect}"
algorithm = "ddp"
workload = "mlp"
batch_size = 64
warmup_steps = 5
steps = 20
repeats = 30
timeout_s = 300
slowdown_kind = "sleep"
[sweep]
slowdown_pct = [0, 3, 10, 40]
[capture]
profiler_steps = 0
[workloads.mlp]
width = 512
depth = 4
"""

ZERO = """
[suite]
name = "gpu-tune-zero"
[defaults]
world_size = 2
backend = "gloo"
device = "{device}"
interconnect = "loopback"
workload = "mlp"
batch_size = 64
warmup_steps = 3
steps = 10
repeats = 20
timeout_s = 300
[sweep]
algorithm = ["ddp", "hook_with_zero_step", "hook_with_zero_step_interleaved"]
[capture]
profiler_steps = 0
[workloads.mlp]
width = {width}
depth = 4
"""

BUDGET_S = {"planted": 60, "zero": 60}


def tune(root: Path, name: str, text: str, budget_s: int, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run ``tpbench tune`` on suite ``text`` (written as ``root/NAME.toml``) with ``extra`` options:
    its JSON result, exit code and wall time."""
    suite = root / f"{name}.toml"
    suite.write_text(text)
    cmd = [sys.executable, "-m", "tpbench", "tune", str(suite), "--out", str(root / "results")]
    cmd += ["--epsilon", "2%", "--budget-s", str(budget_s), "--format", "json", *extra]
    print("+", " ".join(cmd), flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    print(proc.stderr[-3000:], flush=True)
    try:
        result = json.loads(proc.stdout)
    except ValueError:
        result = {"unparsed_stdout": proc.stdout[-2000:]}
    return {"exit_code": proc.returncode, "wall_s": round(time.monotonic() - t0, 1), "result": result}


def _arms(result: dict[str, Any], key: str) -> dict[Any, dict[str, Any]]:
    return {a["params"].get(key): a for a in result.get("arms", [])}


def _figures(tuned: dict[str, Any], key: str, name: Callable[[Any], str] = str) -> dict[str, Any]:
    """A tune's figures: its claim, exit code, wall time, cost share, and each arm (by its ``key``
    value, shown by ``name``) with its status, rounds and ratio interval."""
    r = tuned["result"]
    timed, grid = r.get("timed_s") or 0, r.get("grid_timed_s") or 0
    return {
        "claim": r.get("claim"),
        "exit_code": tuned["exit_code"],
        "wall_s": tuned["wall_s"],
        "cost_share": round(timed / grid, 3) if grid else None,
        "arms": {
            name(v): {k: a.get(k) for k in ("status", "rounds", "ratio", "lo", "hi")} for v, a in _arms(r, key).items()
        },
    }


def check_common(c: Checks, label: str, tuned: dict[str, Any]) -> None:
    """What every tune's JSON must say, whatever it decided."""
    r = tuned["result"]
    c.check(f"{label}: exit 0 or 4 (recommended or unresolved)", tuned["exit_code"] in (0, 4), str(tuned["exit_code"]))
    c.check(f"{label}: epsilon and confidence stated", r.get("epsilon") == 0.02 and r.get("confidence") == 0.95)
    c.check(f"{label}: a claim", bool(r.get("claim")), str(r.get("claim")))
    arms = r.get("arms", [])
    bad = [a["case_id"] for a in arms if a.get("ratio") is not None and not a["lo"] <= a["ratio"] <= a["hi"]]
    c.check(f"{label}: every ratio inside its interval", bool(arms) and not bad, ", ".join(bad))
    rec = [a for a in arms if a.get("status") == "recommended"]
    c.check(f"{label}: one recommended arm", len(rec) == 1, json.dumps([a["params"] for a in rec]))
    timed, grid = r.get("timed_s"), r.get("grid_timed_s")
    c.check(
        f"{label}: timed_s and grid_timed_s",
        isinstance(timed, (int, float)) and isinstance(grid, (int, float)) and timed > 0,
        f"{timed} of {grid}",
    )


def check_planted(c: Checks, tuned: dict[str, Any], root: Path) -> dict[str, Any]:
    r = tuned["result"]
    arms = _arms(r, "slowdown_pct")
    best, slow = arms.get(0, {}), arms.get(40, {})
    near = arms.get(3, {})
    c.check(
        "planted: the 0 % arm recommended, or the 3 % arm with it tied",
        best.get("status") == "recommended" or (near.get("status") == "recommended" and best.get("status") == "tied"),
        f"0 %: {best.get('status')}, 3 %: {near.get('status')}",
    )
    best = best if best.get("status") == "recommended" else near
    # Fewer rounds than the recommended arm, unless the race ended at its first look (the minimum
    # rounds), where every arm has run as many: a quiet GPU may separate every arm at once.
    first_look = best.get("rounds") == MIN_ROUNDS
    c.check(
        "planted: the 40 % arm eliminated, in fewer rounds unless at the first look",
        slow.get("status") == "eliminated" and (slow.get("rounds", 0) < best.get("rounds", 0) or first_look),
        f"{slow.get('status')} after {slow.get('rounds')} rounds; recommended ran {best.get('rounds')}",
    )
    timed, grid = r.get("timed_s") or 0, r.get("grid_timed_s") or 0
    c.check("planted: timed no more than the grid", 0 < timed <= grid, f"{timed:.2f} of {grid:.2f} s")
    return _figures(tuned, "slowdown_pct", lambda pct: f"{pct:g} %")


def check_zero(c: Checks, tuned: dict[str, Any], root: Path) -> dict[str, Any]:
    r = tuned["result"]
    run_dir = r.get("run_dir")
    html = root / "tune-report.html"
    if c.check("zero: the tune's run directory", bool(run_dir) and Path(run_dir).is_dir(), str(run_dir)):
        c.check("zero: tune.json written", (Path(run_dir) / "tune.json").is_file())
        proc = subprocess.run(
            [sys.executable, "-m", "tpbench", "report", run_dir, "-o", str(html)], capture_output=True, text=True
        )
        page = html.read_text() if html.exists() else ""
        c.check(
            "zero: the report opens with the Recommendation",
            proc.returncode == 0 and 'id="recommendation"' in page,
            proc.stderr[-300:],
        )
        c.check("zero: the report says where the time goes (--trace)", 'id="where-time-goes"' in page)
    where = r.get("where") or {}
    arms = where.get("arms", [])
    c.check("zero: --trace traced the recommended setting", bool(arms) and arms[0]["role"] == "recommended")
    off = [a["label"] for a in arms if abs(sum(a["parts_ms"].values()) - a["step_ms"]) > 1e-6 * a["step_ms"]]
    c.check("zero: each traced setting's parts add up to its step", bool(arms) and not off, ", ".join(off))
    c.check("zero: traced compute on the GPU ranks", all(a["parts_ms"]["compute"] > 0 for a in arms))
    traced = {a["label"]: {"step_ms": a["step_ms"], **a["parts_ms"]} for a in arms}
    return _figures(tuned, "algorithm") | {"run_dir": run_dir, "where": traced, "where_said": where.get("sentence")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, required=True, help="where the suites and run directories go")
    ap.add_argument("--json", type=Path, help="write the checks and figures here")
    ap.add_argument("--rehearse", action="store_true", help="CPU ranks (tests the script, measures no GPU)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() and not args.rehearse:
        print("gpu_tune: no CUDA device is visible; run it on an NVIDIA GPU machine", file=sys.stderr)
        return 2
    args.root.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.rehearse else "cuda"
    planted = PLANTED.format(
        backend="gloo" if args.rehearse else "nccl",
        interconnect="loopback" if args.rehearse else "nccl-default",
        device=device,
    )
    zero = ZERO.format(device=device, width=128 if args.rehearse else 2048)
    c, result = Checks(), {"rehearsal": args.rehearse, "torch": torch.__version__}
    runs = (("planted", planted, check_planted, ()), ("zero", zero, check_zero, ("--trace",)))
    for name, text, check, extra in runs:
        try:
            tuned = tune(args.root, f"gpu-tune-{name}", text, BUDGET_S[name], extra)
            check_common(c, name, tuned)
            result[name] = check(c, tuned, args.root)
        except Exception as e:  # the other tune still runs; the error is a failed check
            c.check(f"{name}: tune and checks ran", False, f"{type(e).__name__}: {e}")
        c.save(result, args.json)
    return c.exit_code()


if __name__ == "__main__":
    sys.exit(main())
