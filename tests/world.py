"""Run a function in a real multi-rank Gloo world for a test.

Each rank is a spawned process with its own ``torch.distributed`` default group, rendezvous
through a FileStore (no port to race for). A rank's return value comes back through a pickle
file rather than a queue so that a rank may ``os._exit`` straight after (``destroy_process_group``
can hang on Gloo once subgroups exist). A world that does not finish within ``timeout_s`` is
killed and the test fails with a ``TimeoutError`` instead of blocking CI.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable


def _rank_main(fn: Callable[..., Any], rank: int, world_size: int, store: str, out: str, args: tuple) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
        result: tuple[str, Any] = ("ok", fn(rank, world_size, *args))
    except BaseException:  # the traceback travels back to the test
        result = ("error", traceback.format_exc())
    Path(out).write_bytes(pickle.dumps(result))
    os._exit(0)


def run_world(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 120.0) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` Gloo ranks; return the per-rank results.

    ``fn`` must be importable by name (a module-level function of a test module).
    """
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="tpbench-world-") as tmp:
        store = os.path.join(tmp, "store")
        outs = [os.path.join(tmp, f"rank{r}.pkl") for r in range(world_size)]
        procs = [
            ctx.Process(target=_rank_main, args=(fn, r, world_size, store, outs[r], args), daemon=True)
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        if hung:
            raise TimeoutError(f"ranks {hung} of a {world_size}-rank world did not finish within {timeout_s:.0f}s")
        results = []
        for r, path in enumerate(outs):
            if not os.path.exists(path):
                raise RuntimeError(f"rank {r} died without a result (exit code {procs[r].exitcode})")
            status, value = pickle.loads(Path(path).read_bytes())
            if status != "ok":
                raise RuntimeError(f"rank {r} raised:\n{value}")
            results.append(value)
        return results
