"""Write real per-rank torch.profiler traces of a small DDP run on Gloo, laid out like the store.

The analysis modules are tested against real traces, not only hand-built ones, and the speed
benchmark needs traces of hundreds of MB; both come from here. Each rank trains an MLP under DDP
with the same ``record_function`` phase names the worker uses (``tpbench.forward``, ``.backward``,
``.optimizer``), inside torch.profiler's own schedule so steps are ``ProfilerStep#N`` ranges.

With ``--bucket-ranges`` a comm hook steps each bucket's parameters in the allreduce future's
callback under ``tpbench.zero.step[bucket=K]`` and the training thread then broadcasts each bucket
under ``tpbench.zero.broadcast[bucket=K]``: the range names and thread placement of the ZeRO hooks,
without their sharding, so the optimizer lane and ``gloo:broadcast`` appear in the trace.

``--gpu-style DIR`` also writes each trace rewritten as a GPU trace with the same timing (see
``gpu_style``): Holistic Trace Analysis only analyses GPU kernels, so this is how its overlap
numbers are compared with tpbench's on a real trace, and how the speed benchmark gets a file both
tools can analyse.

Usage: python -m benchmarks.make_trace OUT_DIR [--steps 3] [--width 64] [--depth 2] [--bucket-ranges]
                                   [--gpu-style DIR]
writes OUT_DIR/rank0.json.gz, OUT_DIR/rank1.json.gz, ... (and DIR/rank<r>.json.gz)
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function, schedule


@dataclass(frozen=True)
class TraceJob:
    out_dir: str
    steps: int = 3
    width: int = 64
    depth: int = 2
    batch_size: int = 16
    bucket_cap_mb: float = 0.01
    bucket_ranges: bool = False
    world_size: int = 2


def _bucket_step_hook(lr: float):
    """Allreduce a bucket, then SGD-step its parameters in the future's callback, like
    ``hook_with_zero_step`` does, under the range name the ZeRO hooks emit."""

    # No annotations on the hook itself: DDP checks them at run time, and under
    # ``from __future__ import annotations`` they are strings it does not accept.
    def hook(state, bucket):  # type: ignore[no-untyped-def]
        index = bucket.index()

        def step(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            with record_function(f"tpbench.zero.step[bucket={index}]"), torch.no_grad():
                for p, g in zip(bucket.parameters(), bucket.gradients()):
                    p.add_(g, alpha=-lr)
            return fut.value()

        return allreduce_hook(state, bucket).then(step)

    return hook


def _rank_main(rank: int, job: TraceJob, store: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=job.world_size)
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(job.depth):
        layers += [nn.Linear(job.width, job.width), nn.ReLU()]
    model = DDP(nn.Sequential(*layers, nn.Linear(job.width, 8)), bucket_cap_mb=job.bucket_cap_mb)
    if job.bucket_ranges:
        model.register_comm_hook(None, _bucket_step_hook(lr=1e-3))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(job.batch_size, job.width, generator=g)
    y = torch.randint(0, 8, (job.batch_size,), generator=g)
    out = Path(job.out_dir) / f"rank{rank}.json.gz"

    def train_step() -> None:
        with record_function("tpbench.forward"):
            loss = nn.functional.cross_entropy(model(x), y)
        with record_function("tpbench.backward"):
            loss.backward()
        if job.bucket_ranges:
            params = [p for p in model.parameters()]
            for k, chunk in enumerate(params[i : i + 2] for i in range(0, len(params), 2)):
                with record_function(f"tpbench.zero.broadcast[bucket={k}]"):
                    for p in chunk:
                        dist.broadcast(p.data, src=k % job.world_size)
        else:
            with record_function("tpbench.optimizer"):
                optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    # Two untraced steps first: DDP rebuilds its buckets after the first iteration.
    for _ in range(2):
        train_step()
    dist.barrier()
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=1, active=job.steps, repeat=1),
        on_trace_ready=lambda prof: prof.export_chrome_trace(str(out)),
        record_shapes=True,
    ) as prof:
        for _ in range(1 + job.steps):
            train_step()
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


def make_traces(job: TraceJob) -> list[Path]:
    """Run a ``job.world_size``-rank Gloo world and return the trace paths, one per rank."""
    Path(job.out_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tpbench-trace-") as tmp:
        mp.spawn(_rank_main, args=(job, os.path.join(tmp, "store")), nprocs=job.world_size, join=True)
    return [Path(job.out_dir) / f"rank{r}.json.gz" for r in range(job.world_size)]


def gpu_style(src: Path, dst: Path) -> None:
    """Rewrite a CPU/Gloo trace as a GPU trace whose kernels replay its compute and communication.

    Each outermost ``aten::`` op of the training thread (the one with ``ProfilerStep#N``) becomes a
    compute kernel on stream 7 with the op's start and duration, launched (``cudaLaunchKernel``,
    same correlation id) from the op itself; each ``gloo:<op>`` range becomes an NCCL kernel with
    the same timing, one stream per Gloo thread, carrying the collective metadata torch.profiler
    attaches to NCCL kernels. The ``gloo:*`` ranges are removed; everything else is kept. So the
    GPU trace has exactly the CPU trace's compute and communication intervals, and any analysis of
    GPU kernels (HTA's) sees what tpbench sees in the CPU trace.
    """
    with gzip.open(src, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    train_tid = next(e["tid"] for e in events if e.get("name", "").startswith("ProfilerStep#"))
    pid = next(e["pid"] for e in events if e.get("tid") == train_tid)
    ops = sorted(
        (
            e
            for e in events
            if e.get("ph") == "X"
            and e.get("cat") == "cpu_op"
            and e["tid"] == train_tid
            and e["name"].startswith("aten::")
        ),
        key=lambda e: (e["ts"], -e["dur"]),
    )
    out = [e for e in events if not (e.get("cat") == "user_annotation" and e["name"].startswith("gloo:"))]
    gloo = sorted(
        (e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("gloo:")),
        key=lambda e: e["ts"],
    )
    streams = {tid: 20 + i for i, tid in enumerate(sorted({e["tid"] for e in gloo}))}
    corr, reach = 1, float("-inf")

    def launch(ts: float, name: str, dur: float, stream: int, args: dict) -> None:
        nonlocal corr
        out.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": pid,
                "tid": train_tid,
                "ts": ts,
                "dur": min(dur, 1.0),
                "args": {"correlation": corr},
            }
        )
        out.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": name,
                "pid": 0,
                "tid": stream,
                "ts": ts,
                "dur": dur,
                "args": {"device": 0, "stream": stream, "correlation": corr, **args},
            }
        )
        corr += 1

    for op in ops:
        if op["ts"] >= reach:
            launch(op["ts"], f"kernel<{op['name']}>", op["dur"], 7, {})
        reach = max(reach, op["ts"] + op["dur"])
    group = trace.get("distributedInfo", {}).get("pg_config", [{}])[0]
    for e in gloo:
        op = e["name"][len("gloo:") :]
        nelems = sum(math.prod(d) for d in e["args"].get("Input Dims", []) if isinstance(d, list))
        meta = {
            "Collective name": op,
            "In msg nelems": nelems,
            "Out msg nelems": nelems,
            "dtype": "Float",
            "Group size": group.get("pg_size"),
            "Process Group Name": group.get("pg_name"),
        }
        kernel = "ncclDevKernel_" + "".join(w.capitalize() for w in op.split("_")) + "_Sum_f32_RING_LL"
        launch(e["ts"], kernel, e["dur"], streams[e["tid"]], meta)
    trace["traceEvents"] = out
    write_trace(trace, dst)


def write_trace(trace: dict, path: Path) -> None:
    """Write a trace gzipped in torch.profiler's layout: each event opens a line indented by two spaces."""
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = "".join(f"{json.dumps(k)}: {json.dumps(v)}, " for k, v in trace.items() if k != "traceEvents")
    with gzip.open(path, "wt") as f:
        f.write("{" + meta + '"traceEvents": [\n')
        f.write(",\n".join("  " + json.dumps(e) for e in trace["traceEvents"]))
        f.write("\n]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--bucket-cap-mb", type=float, default=0.01)
    parser.add_argument("--bucket-ranges", action="store_true")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--gpu-style", metavar="DIR", help="also write GPU-style copies of the traces here")
    a = parser.parse_args()
    # Checked here, in argparse's one line and exit 2: --steps 0 started the ranks and ended in
    # torch.profiler's "Invalid profiler schedule" traceback, a zero size in one from torch.
    for name in ("steps", "width", "batch_size", "world_size"):
        if getattr(a, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(a, name)}: expected at least 1")
    job = TraceJob(a.out_dir, a.steps, a.width, a.depth, a.batch_size, a.bucket_cap_mb, a.bucket_ranges, a.world_size)
    for path in make_traces(job):
        print(f"{path}  {path.stat().st_size / 1e3:.1f} kB")
        if a.gpu_style:
            copy = Path(a.gpu_style) / path.name
            gpu_style(path, copy)
            print(f"{copy}  {copy.stat().st_size / 1e3:.1f} kB")


if __name__ == "__main__":
    main()
