"""``tpbench whatif`` on the runs a GPU capture sweep produced: its answer on real GPU traces.

    python -m gpu.whatif --runs RUN_DIR [RUN_DIR ...] [--json FILE]

``python -m tpbench whatif RUN --format json`` runs on each run as a user runs it. The what-if replays CPU ranks (the
training thread's work between its collectives); on a GPU, compute is CUDA kernels queued ahead of the thread and
autograd's device thread issues the collectives, so a GPU run must be refused, with that reason, and nothing projected
(exit 3); each of its cases' interference factor is still measured on its tables (compute beside Gloo's collectives over
compute alone, as the what-if defines it). A CPU run (``--rehearse``) is checked for what must hold on any machine:
every projection refused with a reason or inside its own interval and no faster than its own compute, every interference
factor inside its interval.

Exit 0 when every check passes, 1 when one fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpu.analysis import Checks
from tpbench import store
from tpbench.analysis import interference

REFUSED = 3  # tpbench whatif's exit code for a run it cannot model
CASE_KEYS = (
    "measured_ms",
    "compute_ms",
    "interference",
    "interference_lo",
    "interference_hi",
    "interference_ops",
    "interference_source",
    "own_miss_pct",
    "refused",
)


def _rounded(x: Any) -> Any:
    return round(x, 4) if isinstance(x, float) else x


def _interference(run_dir: Path) -> dict[str, str]:
    """Each case's interference factor from its own traced ops (``interference.interference``), measured
    on the stored tables though nothing is projected: near 1 where compute runs on the GPU and Gloo
    communicates on CPU threads."""
    out = {}
    for cid, entry in store.load(run_dir).record.cases.items():
        intervals = store.read_case_table(run_dir, cid, "intervals")
        if intervals is not None:
            pairs = interference.interference_pairs(intervals)
            out[entry.params["algorithm"]] = interference.interference(pairs).describe()
    return out


def check_run(c: Checks, run_dir: Path) -> dict[str, Any]:
    name = run_dir.parent.name
    devices = sorted(set(store.load(run_dir).cases["device"]))
    proc = subprocess.run(
        [sys.executable, "-m", "tpbench", "whatif", str(run_dir), "--format", "json"], capture_output=True, text=True
    )
    if devices != ["cpu"]:
        c.check(
            f"{name}: a GPU run refused, with the reason",
            proc.returncode == REFUSED and "GPU runs are not projected" in proc.stderr,
            f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}",
        )
        return {
            "exit_code": proc.returncode,
            "devices": devices,
            "refused": proc.stderr.strip()[-600:],
            "interference": _interference(run_dir),
        }
    if not c.check(f"{name}: tpbench whatif ran", proc.returncode == 0, proc.stderr[-300:]):
        return {"exit_code": proc.returncode}
    answer = json.loads(proc.stdout)
    cases: dict[str, Any] = {}
    for p in answer["projections"]:
        case = cases.setdefault(p["label"], {k: _rounded(p[k]) for k in CASE_KEYS} | {"projected_ms": {}})
        if not p["refused"]:
            case["projected_ms"][p["fabric"]] = [
                _rounded(p[k]) for k in ("predicted_lo_ms", "projected_ms", "predicted_hi_ms")
            ]
    for label, case in cases.items():
        label = f"{name} {label}"
        if case["refused"]:
            c.check(f"{label}: the refusal names its reason", len(case["refused"]) > 10, case["refused"][:200])
        else:
            inside = all(lo <= mid <= hi for lo, mid, hi in case["projected_ms"].values())
            c.check(f"{label}: every projection inside its interval", inside, json.dumps(case["projected_ms"]))
            fastest = min(mid for _, mid, _ in case["projected_ms"].values())
            compute = case["compute_ms"]
            c.check(
                f"{label}: no projection faster than its compute",
                fastest >= compute * (1 - 1e-6),
                f"{fastest} vs {compute}",
            )
        kappa = (case["interference_lo"], case["interference"], case["interference_hi"])
        if None not in kappa:
            c.check(f"{label}: interference inside its interval", kappa[0] <= kappa[1] <= kappa[2], str(kappa))
    return {"exit_code": 0, "cases": cases, "answer": answer["answer"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, nargs="+", required=True)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    c, result = Checks(), {}
    for run_dir in args.runs:
        try:
            result[run_dir.parent.name] = check_run(c, run_dir)
        except Exception as e:  # the other runs are still checked; the error is a failed check
            c.check(f"{run_dir}: whatif checked", False, f"{type(e).__name__}: {e}")
    c.save({"runs": result}, args.json)
    return c.exit_code()


if __name__ == "__main__":
    sys.exit(main())
