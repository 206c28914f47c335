"""tpbench's own analysis of the traces and NCCL logs a GPU capture sweep produced, as figures.

    python -m gpu.analysis --runs RUN_DIR [RUN_DIR ...] [--json FILE]

For every finished case of each run: the traces are parsed again with ``timeline.read_traces``
(timed), and the figures the sweep stored are read back: intervals per rank and lane (count,
total time, the most frequent names: which CUDA kernels landed in which lane), per-rank overlap
over the profiled steps, the summary's overlap figures, and per-collective bandwidth (label,
bytes, group size, busbw). Every ``logs/nccl-*.log`` is parsed with ``transport.parse_nccl_log``
and set beside the ``observed_transport`` the sweep recorded. A few checks say whether the
analysis found what a GPU trace must contain (steps on every rank, kernels in the compute lane,
collectives labelled, memcpys where Gloo stages CUDA tensors through the host).

Exit 0 when every check passes, 1 when one fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from tpbench import store
from tpbench.analysis import overlap, timeline, trace_events
from tpbench.capture import transport
from tpbench.record import CaseRecord

TOP_NAMES = 4


def lanes(intervals: pd.DataFrame) -> dict[str, Any]:
    """Per lane: intervals, total ms, GPU (stream) and CPU (thread) intervals, most frequent names."""
    out: dict[str, Any] = {}
    for lane, g in intervals.groupby("lane", observed=True):
        names = g["name"].astype(str).value_counts().head(TOP_NAMES)
        out[str(lane)] = {
            "intervals": len(g),
            "per_rank": {int(r): int(n) for r, n in g["rank"].value_counts().sort_index().items()},
            "total_ms": round(float((g["end_ns"] - g["start_ns"]).sum()) / 1e6, 3),
            "streams_or_threads": int(g["stream_or_thread"].nunique()),
            "on_gpu_streams": int(g["stream_or_thread"].astype(str).str.startswith("stream").sum()),
            "top_names": {str(k)[:100]: int(v) for k, v in names.items()},
        }
    return out


def collectives(table: pd.DataFrame | None) -> dict[str, Any]:
    """Per collective label: instances, bytes, group sizes, median algbw/busbw."""
    if table is None or table.empty:
        return {}
    out = {}
    for label, g in table.groupby("collective"):
        out[str(label)] = {
            "instances": len(g),
            "bytes_median": None if g["bytes"].isna().all() else int(g["bytes"].median()),
            "group_sizes": sorted(int(x) for x in g["group_size"].unique()),
            "ranks_seen": sorted(int(x) for x in g["ranks"].unique()),
            "time_us_median": round(float(g["time_ns"].median()) / 1e3, 2),
            "algbw_gbps_median": None if g["algbw_gbps"].isna().all() else round(float(g["algbw_gbps"].median()), 3),
            "busbw_gbps_median": None if g["busbw_gbps"].isna().all() else round(float(g["busbw_gbps"].median()), 3),
        }
    return out


def fast_path(paths: list[Path]) -> dict[str, Any]:
    """Whether the regex fast path read every piece of these traces, and read them exactly as
    plain JSON decoding does (the parser's claim, so far checked on CPU-made traces only)."""
    accumulator = trace_events.TraceEvents
    real = accumulator._take_fast
    used: list[bool] = []
    try:
        accumulator._take_fast = lambda self, piece: used.append(real(self, piece)) or used[-1]
        fast = timeline.read_traces(paths)
        accumulator._take_fast = lambda self, piece: False
        slow = timeline.read_traces(paths)
    finally:
        accumulator._take_fast = real
    same = fast.intervals.equals(slow.intervals) and fast.steps.equals(slow.steps) and fast.marks.equals(slow.marks)
    return {"pieces": len(used), "pieces_on_fast_path": sum(used), "same_as_json_decoding": same}


def nccl_logs(run_dir: Path) -> dict[str, Any]:
    out = {}
    for log in sorted((run_dir / "logs").glob("nccl-*.log")):
        parsed = transport.parse_nccl_log(log.read_text(errors="replace"), rank=-1, log=log.name)
        out[log.name] = {k: v for k, v in parsed.__dict__.items() if k not in ("rank", "log")} | {
            "bytes": log.stat().st_size
        }
    return out


class Checks:
    """Named pass/fail checks, printed as they are made (this script's and ``gpu/capture.py``'s)."""

    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.results.append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"{'PASS' if ok else 'FAIL'}  {name}{': ' + detail if detail else ''}", flush=True)
        return ok

    @property
    def passed(self) -> bool:
        return all(r["ok"] for r in self.results)

    def save(self, result: dict[str, Any], path: Path | None) -> None:
        """``result`` with the checks so far, written to ``path`` after each piece of work: a part
        killed at its time limit keeps what it finished."""
        result |= {"checks": self.results, "passed": self.passed}
        if path:
            path.write_text(json.dumps(result, indent=1, default=str))

    def exit_code(self) -> int:
        """0 when every check passed, else 1; said on the last line."""
        print("ALL PASSED" if self.passed else "SOME CHECKS FAILED")
        return 0 if self.passed else 1


def analyse_case(c: Checks, run_dir: Path, cid: str, entry: CaseRecord, summary: pd.DataFrame) -> dict[str, Any]:
    p = entry.params
    label = f"{p['backend']}x{p['world_size']} {p['algorithm']}"
    paths = store.traces(run_dir, cid)
    t0 = time.perf_counter()
    tl = timeline.read_traces(paths)
    parse_s = time.perf_counter() - t0
    iv = tl.intervals
    per_step = store.read_case_table(run_dir, cid, "overlap")
    if per_step is None or per_step.empty:
        per_step = overlap.step_overlap(iv, tl.steps)
    per_rank = overlap.overlap_totals(per_step, by=("rank",)) if not per_step.empty else pd.DataFrame()
    coll = store.read_case_table(run_dir, cid, "collectives")
    row = summary[summary["case_id"] == cid]
    keys = ("overlap_pct", "compute_ms", "comm_ms", "overlap_ms", "exposed_comm_ms", "idle_ms", "optimizer_ms")
    result: dict[str, Any] = {
        "label": label,
        "trace_bytes": sum(p.stat().st_size for p in paths),
        "parse_s": round(parse_s, 3),
        "steps_per_rank": {int(r): int(n) for r, n in tl.steps["rank"].value_counts().sort_index().items()},
        "lanes": lanes(iv),
        "overlap_per_rank": {
            int(r["rank"]): {k: round(float(r[k]), 3) for k in ("overlap_pct",) if k in r}
            for _, r in per_rank.iterrows()
        },
        "summary": {
            k: round(float(row[k].iloc[0]), 4) for k in keys if k in row and len(row) and pd.notna(row[k].iloc[0])
        },
        "collectives": collectives(coll),
        "observed_transport": t.to_json() if (t := entry.capture.observed_transport) else None,
        "fast_path": fast_path(paths),
    }
    ranks = p["world_size"]
    fp = result["fast_path"]
    c.check(
        f"{label}: fast path read every piece, as JSON decoding does",
        fp["pieces"] == fp["pieces_on_fast_path"] and fp["same_as_json_decoding"],
        json.dumps(fp),
    )
    c.check(
        f"{label}: steps on every rank", len(result["steps_per_rank"]) == ranks, json.dumps(result["steps_per_rank"])
    )
    compute = result["lanes"].get("compute", {})
    c.check(
        f"{label}: CUDA kernels in the compute lane",
        compute.get("on_gpu_streams", 0) > 0,
        ", ".join(list(compute.get("top_names", {}))[:2]),
    )
    c.check(
        f"{label}: overlap per rank", len(result["overlap_per_rank"]) == ranks, json.dumps(result["overlap_per_rank"])
    )
    labels = set(result["collectives"])
    if ranks > 1:  # a lone NCCL rank may launch no kernel at all for an in-place all-reduce
        c.check(
            f"{label}: collectives found and labelled",
            bool(labels) and not labels & {"none", "None", "unknown", ""},
            ", ".join(sorted(labels)),
        )
    if p["backend"] == "gloo":
        c.check(
            f"{label}: memcpys (Gloo stages CUDA tensors through the host)",
            result["lanes"].get("memcpy", {}).get("intervals", 0) > 0,
        )
    return result


def analyse_run(c: Checks, run_dir: Path) -> dict[str, Any]:
    loaded = store.load(run_dir)
    out: dict[str, Any] = {"run_dir": str(run_dir), "cases": {}, "nccl_logs": nccl_logs(run_dir)}
    for cid, entry in loaded.record.cases.items():
        if entry.status != store.DONE:
            continue
        try:
            case = analyse_case(c, run_dir, cid, entry, loaded.summary)
            out["cases"][case.pop("label")] = case
        except Exception as e:  # the other cases are still analysed
            c.check(f"{run_dir.name} {cid}: analysis ran", False, f"{type(e).__name__}: {e}")
    for name, log in out["nccl_logs"].items():
        c.check(
            f"{name}: NCCL version and network parsed",
            bool(log["version"]) and bool(log["network"]),
            f"NCCL {log['version']}, network {log['network']}, nnodes {log['nnodes']}, transports {log['transports']}",
        )
    return out


def headline(runs: dict[str, Any]) -> dict[str, Any]:
    """One line of figures per case, for the summary's top."""
    out = {}
    for run in runs.values():
        for label, case in run.get("cases", {}).items():
            out[label] = {
                "overlap_pct": case["summary"].get("overlap_pct"),
                "comm_ms": case["summary"].get("comm_ms"),
                "compute_ms": case["summary"].get("compute_ms"),
                "lanes": {k: v["intervals"] for k, v in case["lanes"].items()},
                "collectives": {
                    k: (v["instances"], v["bytes_median"], v["busbw_gbps_median"])
                    for k, v in case["collectives"].items()
                },
                "parse_s": case["parse_s"],
            }
        for name, log in run.get("nccl_logs", {}).items():
            out[name] = {k: log[k] for k in ("version", "network", "nnodes", "transports")}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, nargs="+", required=True)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    c = Checks()
    runs: dict[str, Any] = {}
    for run_dir in args.runs:
        try:
            runs[run_dir.name] = analyse_run(c, run_dir)
        except Exception as e:
            c.check(f"{run_dir}: analysis ran", False, f"{type(e).__name__}: {e}")
    c.save({"figures": headline(runs), "runs": runs}, args.json)
    return c.exit_code()


if __name__ == "__main__":
    sys.exit(main())
