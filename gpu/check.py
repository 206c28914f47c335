"""Run every part of the GPU check in its own process and time limit; write one JSON summary.

Started by ``gpu/gpu_check.sh`` (which installs the carried wheels first). The parts, in order:

- ``preflight``: versions (Python, torch, CUDA, NCCL, driver, GPU), where each needed package was
  imported from; without CUDA the check stops here (exit 2) unless ``--rehearse``;
- ``zero_hooks``: ``gpu/zero_hooks.py``, parity and step-time ratios of the ZeRO hooks;
- ``capture``: ``gpu/capture.py``, two capture sweeps (NCCL ×1, Gloo ×2 sharing the GPU) and
  their checks (kernels, memcpys, NVML rate, transport);
- ``analysis``: ``gpu/analysis.py``, tpbench's own analysis of the traces and NCCL logs the
  capture sweeps produced, with the key figures;
- ``whatif``: ``gpu/whatif.py``, ``tpbench whatif`` on those runs: a GPU run refused with its
  reason, and each case's interference factor (how communication slows GPU compute);
- ``report``: ``tpbench report`` on those runs (needs plotly);
- ``overhead``: ``benchmarks/bench_nvml_overhead.py``, the NVML sampler's cost on the timed steps;
- ``comm_hooks``: ``gpu/comm_hooks.py``, fp16 and bf16 compression registered on DDP and wrapped
  by the ZeRO hooks (NCCL ×1), and on 2 Gloo ranks with post-local SGD, bytes halved;
- ``tune``: ``gpu/tune.py``, ``tpbench tune`` on a planted NCCL race (known answer) and on the
  ZeRO hooks over 2 Gloo ranks sharing the GPU, with the report's Recommendation;
- ``models``: ``gpu/models.py``, GPT-2 small under every ZeRO variant (exact memory accounting
  against the allocator) and post-local SGD, ResNet and embedding models on 2 Gloo ranks.

A part that fails or runs out of time costs only itself: the parts after it still run, each
within what is left of ``--budget-s``. ``gpu_check.json`` is rewritten after every part, so an
outer timeout still leaves the finished parts' results; ``artifacts.tar.gz`` (traces, NCCL logs,
stored tables, the report; at most 15 MiB) is written last.

Usage: python -m gpu.check --out DIR --work DIR [--budget-s 420] [--rehearse] [--parts a,b]
       python -m gpu.check --preflight --json FILE [--rehearse]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import platform
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

PACKAGES = ("torch", "numpy", "pandas", "pyarrow", "orjson", "plotly", "narwhals", "pynvml", "rich", "psutil")
DISTRIBUTIONS = {"pynvml": "nvidia-ml-py"}  # where the import name is not the distribution's
MIN_PART_S = 15
ARTIFACTS_MAX_BYTES = 15 * 2**20


@dataclass(frozen=True)
class Part:
    name: str
    argv: list[str]
    max_s: int
    needs: tuple[str, ...] = ()  # parts whose success this one depends on


@dataclass
class Outcome:
    status: str  # ok | failed | timeout | skipped
    seconds: float = 0.0
    exit: int | None = None
    reason: str = ""
    result: Any = None
    log: str | None = None


@dataclass
class Check:
    rehearsal: bool
    started: str
    budget_s: int
    parts: dict[str, Outcome] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(o.status == "ok" for o in self.parts.values())


# ---------------------------------------------------------------------------------------------
# preflight (runs in its own process)


def _distribution_version(module: str) -> str:
    try:
        return importlib.metadata.version(DISTRIBUTIONS.get(module, module))
    except importlib.metadata.PackageNotFoundError:
        return "?"


def preflight(rehearse: bool) -> tuple[dict[str, Any], int]:
    """What this machine has, and whether the GPU check can run on it."""
    info: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform(), "packages": {}}
    for name in PACKAGES:
        try:
            mod = importlib.import_module(name)
            info["packages"][name] = {
                "version": getattr(mod, "__version__", None) or _distribution_version(name),
                "from": str(Path(mod.__file__).parent),
            }
        except Exception as e:  # every missing package is reported, not just the first
            info["packages"][name] = {"error": f"{type(e).__name__}: {e}"}
    try:
        import tpbench.analysis.timeline  # the analysis needs orjson
        import tpbench.sweep

        info["tpbench"] = str(Path(tpbench.__file__).parent)
    except Exception as e:
        info["tpbench_error"] = f"{type(e).__name__}: {e}"
    if "error" in info["packages"]["torch"]:
        return info | {"error": "torch cannot be imported: " + info["packages"]["torch"]["error"]}, 2
    import torch

    info["cuda_available"] = torch.cuda.is_available()
    info["torch_cuda"] = torch.version.cuda
    if info["cuda_available"]:
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        try:
            smi = subprocess.run(
                [
                    "nvidia-smi",
                    "--query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm",
                    "--format=csv,noheader",
                ],
                capture_output=True,
                text=True,
                timeout=20,
            )
            info["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            info["nvidia_smi"] = f"not run: {e}"
    elif not rehearse:
        return info | {
            "error": f"no CUDA device is visible to torch {torch.__version__} (torch.version.cuda="
            f"{torch.version.cuda}): run the GPU check on a machine with an NVIDIA GPU"
        }, 2
    if "tpbench_error" in info:
        return info | {"error": "tpbench cannot be imported: " + info["tpbench_error"]}, 1
    return info, 0


# ---------------------------------------------------------------------------------------------
# orchestration


def run_part(part: Part, timeout_s: float, log: Path, out_json: Path) -> Outcome:
    """Run one part in its own session (so a timeout kills its rank processes too)."""
    t0 = time.monotonic()
    with log.open("w") as f:
        proc = subprocess.Popen(part.argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
            status = "ok" if code == 0 else "failed"
            reason = "" if code == 0 else f"exit {code}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
            status, reason = "timeout", f"killed after {timeout_s:.0f} s"
    result = None
    if out_json.exists():
        try:
            result = json.loads(out_json.read_text())
        except ValueError as e:
            reason += f"; unreadable result {out_json.name}: {e}"
    return Outcome(status, round(time.monotonic() - t0, 1), code, reason.strip("; "), result, log.name)


def _runs_of(check: Check) -> list[str]:
    capture = check.parts.get("capture")
    runs = (capture.result or {}).get("runs", {}) if capture else {}
    return [r["run_dir"] for r in runs.values() if isinstance(r, dict) and r.get("run_dir")]


def parts(args: argparse.Namespace, check: Check) -> list[Part]:
    py, rehearse = sys.executable, ["--rehearse"] if args.rehearse else []
    work = args.work

    def js(name: str) -> str:
        return str(work / f"{name}.json")

    return [
        Part("zero_hooks", [py, "-m", "gpu.zero_hooks", "--json", js("zero_hooks"), *rehearse], 110),
        Part(
            "capture",
            [py, "-m", "gpu.capture", "--root", str(work / "capture"), "--json", js("capture"), *rehearse],
            130,
        ),
        Part("analysis", [py, "-m", "gpu.analysis", "--json", js("analysis")], 60, needs=("capture",)),
        Part("whatif", [py, "-m", "gpu.whatif", "--json", js("whatif")], 45, needs=("capture",)),
        Part("report", [py, "-m", "tpbench", "report", "-o", str(work / "report.html")], 45, needs=("capture",)),
        Part(
            "overhead",
            [
                py,
                "-m",
                "benchmarks.bench_nvml_overhead",
                "--json",
                js("overhead"),
                *(["--rounds", "2", "--steps", "4", "--width", "64"] if args.rehearse else ["--rounds", "6"]),
            ],
            45,
        ),
        Part(
            "comm_hooks",
            [py, "-m", "gpu.comm_hooks", "--root", str(work / "comm_hooks"), "--json", js("comm_hooks"), *rehearse],
            90,
        ),
        Part("tune", [py, "-m", "gpu.tune", "--root", str(work / "tune"), "--json", js("tune"), *rehearse], 150),
        Part(
            "models", [py, "-m", "gpu.models", "--root", str(work / "models"), "--json", js("models"), *rehearse], 150
        ),
    ]


def _tally(out: dict[str, Any], part: str, result: dict[str, Any]) -> None:
    """A part's checks as ``PART.checks_passed`` ("31/32") and ``PART.failed_checks`` (their names)."""
    checks = result.get("checks", [])
    out[f"{part}.checks_passed"] = f"{sum(x['ok'] for x in checks)}/{len(checks)}"
    out[f"{part}.failed_checks"] = [x["check"] for x in checks if not x["ok"]]


def figures(check: Check) -> dict[str, Any]:
    """The key numbers of every part, side by side (the parts' full results stay under ``parts``)."""
    out: dict[str, Any] = {}
    p = check.parts
    if (z := p.get("zero_hooks")) and z.result:
        for world, r in z.result.items():
            if not isinstance(r, dict) or "parity" not in r:
                continue
            out[f"zero_hooks.{world}.parity_ok"] = all(c["ok"] for c in r["parity"])
            out[f"zero_hooks.{world}.max_param_diff"] = max(c["max_param_diff"] for c in r["parity"])
            for hook, t in r.get("timings", {}).items():
                out[f"zero_hooks.{world}.{hook}.ratio_median"] = t["wall"]["ratio_median"]
                out[f"zero_hooks.{world}.{hook}.ratio_ci95"] = t["wall"]["ratio_ci95"]
                out[f"zero_hooks.{world}.{hook}.step_ms"] = t["wall"]["median_step_ms"]
    if (c := p.get("capture")) and c.result:
        _tally(out, "capture", c.result)
    if (a := p.get("analysis")) and a.result:
        out["analysis"] = a.result.get("figures", {})
    if (w := p.get("whatif")) and w.result:
        _tally(out, "whatif", w.result)
        runs = w.result.get("runs", {})
        out["whatif"] = {
            run: r.get("cases") or {k: r.get(k) for k in ("refused", "interference")} for run, r in runs.items()
        }
    if (h := p.get("comm_hooks")) and h.result:
        _tally(out, "comm_hooks", h.result)
        out["comm_hooks"] = {name: r.get("figures") for name, r in h.result.get("runs", {}).items()}
    if (t := p.get("tune")) and t.result:
        _tally(out, "tune", t.result)
        out["tune"] = {k: t.result[k] for k in ("planted", "zero") if k in t.result}
    if (r := p.get("report")) and r.status == "ok":
        html = check.artifacts.get("report_path")
        out["report.seconds"] = r.seconds
        out["report.bytes"] = Path(html).stat().st_size if html and Path(html).exists() else None
    if (m := p.get("models")) and m.result:
        _tally(out, "models", m.result)
        out["models"] = {name: r.get("figures") for name, r in m.result.get("runs", {}).items()}
    if (o := p.get("overhead")) and o.result:
        out["overhead"] = {
            k: o.result[k]
            for k in (
                "nvml",
                "device",
                "interval_ms",
                "ratio",
                "ratio_min",
                "ratio_max",
                "median_off_ms",
                "median_on_ms",
                "sampler_cpu_pct",
            )
        }
    return out


def write_summary(out: Path, check: Check) -> None:
    check.figures = {}
    try:
        check.figures = figures(check)
    except Exception as e:  # a malformed part result must not lose the summary
        check.figures = {"error": f"{type(e).__name__}: {e}"}
    doc = {"passed": check.passed, **asdict(check)}
    tmp = out / "gpu_check.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(out / "gpu_check.json")


def pack(out: Path, work: Path, runs: list[str]) -> dict[str, Any]:
    """The run artifacts worth a look elsewhere, most useful first, up to ARTIFACTS_MAX_BYTES."""
    wanted: list[Path] = [work / "report.html", work / "tune" / "tune-report.html"]
    for run in map(Path, runs):
        wanted += [run / "run.json", run / "summary.parquet", *sorted((run / "logs").glob("*.log"))]
        for case in sorted((run / "cases").glob("*")):
            wanted += sorted(case.glob("trace/*.json.gz")) + sorted(case.glob("*.parquet"))
    kept, left, size = [], [], 0
    with tarfile.open(out / "artifacts.tar.gz", "w:gz") as tar:
        for path in wanted:
            if not path.is_file():
                continue
            n = path.stat().st_size
            if size + n > ARTIFACTS_MAX_BYTES:
                left.append(str(path.relative_to(work)))
                continue
            tar.add(path, arcname=str(path.relative_to(work)))
            kept.append(str(path.relative_to(work)))
            size += n
    return {"files": len(kept), "bytes_before_compression": size, "left_out": left}


def orchestrate(args: argparse.Namespace) -> int:
    start = time.monotonic()
    deadline = start + args.budget_s
    out, work = args.out, args.work
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    check = Check(args.rehearse, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), args.budget_s)
    pre = work / "preflight.json"
    outcome = run_part(
        Part(
            "preflight",
            [
                sys.executable,
                "-m",
                "gpu.check",
                "--preflight",
                "--json",
                str(pre),
                *(["--rehearse"] if args.rehearse else []),
            ],
            90,
        ),
        90,
        work / "preflight.log",
        pre,
    )
    outcome.log = (work / "preflight.log").read_text()[-4000:]
    check.parts["preflight"] = outcome
    write_summary(out, check)
    if outcome.status != "ok":
        error = (outcome.result or {}).get("error") or outcome.reason
        print(f"gpu_check: preflight failed: {error}\n{outcome.log}", file=sys.stderr)
        return 2 if outcome.exit == 2 else 1
    todo = [p for p in parts(args, check) if not args.parts or p.name in args.parts]
    for i, part in enumerate(todo):
        left = deadline - time.monotonic() - MIN_PART_S * (len(todo) - i - 1)
        missing = [n for n in part.needs if check.parts.get(n) is None or not _runs_of(check)]
        if missing:
            check.parts[part.name] = Outcome("skipped", reason=f"needs the run directories of {', '.join(missing)}")
        elif left < MIN_PART_S:
            check.parts[part.name] = Outcome("skipped", reason=f"time budget spent ({args.budget_s} s)")
        else:
            argv = part.argv + (
                ["--runs", *_runs_of(check)]
                if part.name in ("analysis", "whatif")
                else _runs_of(check)
                if part.name == "report"
                else []
            )
            timeout = min(part.max_s, left)
            print(f"gpu_check: {part.name} (limit {timeout:.0f} s) ...", flush=True)
            check.parts[part.name] = run_part(
                replace(part, argv=argv), timeout, out / f"{part.name}.log", work / f"{part.name}.json"
            )
            o = check.parts[part.name]
            print(f"gpu_check: {part.name}: {o.status} in {o.seconds} s {o.reason}", flush=True)
        if part.name == "report":
            check.artifacts["report_path"] = str(work / "report.html")
        write_summary(out, check)
    try:
        check.artifacts |= pack(out, work, _runs_of(check))
    except Exception as e:  # the summary matters more than the artifacts
        check.artifacts["error"] = f"{type(e).__name__}: {e}"
    check.artifacts["total_seconds"] = round(time.monotonic() - start, 1)
    write_summary(out, check)
    print(
        json.dumps(
            {"passed": check.passed, "parts": {k: v.status for k, v in check.parts.items()}, "figures": check.figures},
            indent=1,
            default=str,
        )
    )
    print(f"gpu_check: {'PASSED' if check.passed else 'FAILED'}; summary in {out / 'gpu_check.json'}")
    return 0 if check.passed else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="where gpu_check.json, the logs and artifacts.tar.gz go")
    ap.add_argument("--work", type=Path, help="scratch folder for run directories")
    ap.add_argument("--budget-s", type=int, default=420)
    ap.add_argument("--rehearse", action="store_true", help="run on CPU to test the check itself")
    ap.add_argument(
        "--parts",
        type=lambda s: [p for p in s.split(",") if p],
        default=[],
        help="comma-separated parts to run (default: all); e.g. models",
    )
    ap.add_argument("--preflight", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.preflight:
        info, code = preflight(args.rehearse)
        args.json.write_text(json.dumps(info, indent=1))
        print(json.dumps(info, indent=1))
        return code
    if not (args.out and args.work):
        ap.error("--out and --work are required")
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
