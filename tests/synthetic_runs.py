"""Run directories written through the store from synthetic step times.

The gate's and the exports' tests need runs whose right answer is known (a 30% regression, pure
noise, a different torch) and take milliseconds to make, not sweeps. The layout is the real one:
``store.Run.create`` with cases from the real suite expansion, repeats persisted and merged the
way the worker and the launcher do it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from tpbench import store
from tpbench.suite import Case, Machine, expand, parse, select, with_overrides

ENVIRONMENT: dict[str, Any] = {
    "tpbench": "0.1.0",
    "git": {"commit": "0123456789abcdef", "dirty": False},
    "torch": "2.13.0+cpu",
    "cuda": None,
    "nccl": None,
    "gpu_count": 0,
    "gpu_model": None,
    "gpu_driver": None,
    "cpu_model": "Synthetic CPU",
    "cpu_count": 2,
    "hostname": "test",
    "python": "3.11.7",
    "platform": "Linux",
}

SUITE = """\
[suite]
name = "synthetic"
[defaults]
world_size = {world_size}
backend = "gloo"
device = "cpu"
warmup_steps = 3
steps = {steps}
repeats = {repeats}
[sweep]
algorithm = {algorithms}
[capture]
profiler_steps = 0
"""


def make_run(
    root: Path,
    medians: Mapping[str, Sequence[float]],
    *,
    world_size: int = 2,
    steps: int = 8,
    jitter: float = 0.01,
    seed: int = 0,
    environment: Mapping[str, Any] | None = None,
    failed: Sequence[str] = (),
    defaults: Mapping[str, Any] | None = None,
    sweep: Mapping[str, Any] | None = None,
    factor: Callable[[Case], float] | None = None,
    cpu_ms: Callable[[Case], float] | None = None,
    workloads: Mapping[str, Mapping[str, Any]] | None = None,
    overrides: Sequence[str] = (),
    filters: Sequence[str] = (),
    suite_name: str = "synthetic",
) -> Path:
    """A finished run with one case per algorithm; ``medians[algorithm]`` are its per-repeat medians (ms).

    Steps scatter ±``jitter`` around their repeat's median; rank 1 is a little faster so the
    slowest-rank rule is exercised. Algorithms in ``failed`` are recorded as failed, without steps.
    ``defaults`` adds suite defaults, ``sweep`` more swept keys (values in TOML syntax); then
    ``medians`` are per algorithm and ``factor(case)`` scales them per case (cases of one world
    share each repeat's round, as a sweep's do). ``cpu_ms(case)``: each step's CPU time (with the
    same jitter); without it the steps record none, as runs from before it was recorded.
    ``workloads``: ``[workloads.NAME]`` tables, their values in TOML syntax. ``overrides``: ``--set``
    assignments, applied and recorded as a sweep's; ``filters``: ``--filter`` expressions, the same.
    ``suite_name``: the suite's name, as run.json records it.
    """
    algorithms = sorted(medians)
    repeats = max(len(v) for v in medians.values())
    text = (
        SUITE.replace('"synthetic"', f'"{suite_name}"')
        .format(world_size=world_size, steps=steps, repeats=repeats, algorithms=list(algorithms))
        .replace("'", '"')
    )
    text = text.replace("[sweep]", "".join(f"{k} = {v}\n" for k, v in (defaults or {}).items()) + "[sweep]")
    text = "".join(line for line in text.splitlines(True) if line.split(" = ")[0] not in (sweep or {}))
    text = text.replace("[capture]", "".join(f"{k} = {v}\n" for k, v in (sweep or {}).items()) + "[capture]")
    for name, keys in (workloads or {}).items():
        text += f"[workloads.{name}]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items())
    suite = with_overrides(parse(text, "synthetic.toml"), overrides)
    cases = select(expand(suite, Machine(gpus=0)), filters)
    run = store.Run.create(
        root,
        suite_name,
        "synthetic.toml",
        suite.text,
        [c.params() for c in cases],
        dict(environment or ENVIRONMENT),
        overrides=overrides,
        filters=filters,
    )
    rng = np.random.default_rng(seed)
    for case in cases:
        if case.algorithm in failed:
            run.set_case(case.case_id, store.FAILED, error="synthetic failure")
            continue
        values = [m * (factor(case) if factor else 1.0) for m in medians[case.algorithm]]
        for r, m in enumerate(values):
            rows = []
            for rank in range(case.world_size):
                noise = 1 + jitter * rng.uniform(-1, 1, case.warmup_steps + steps)
                ms = m * noise * (1 if rank == 0 else 0.97)
                rows.append(
                    pd.DataFrame(
                        {
                            "repeat": r,
                            "rank": rank,
                            "step": range(len(ms)),
                            "phase": ["warmup" if i < case.warmup_steps else "timed" for i in range(len(ms))],
                            "step_ms": ms,
                            "loss": 1.0,
                            "elapsed_s": np.cumsum(ms) / 1e3,
                            "peak_rss_mb": 100.0 + r,
                        }
                        | ({"cpu_ms": cpu_ms(case) * noise} if cpu_ms else {})
                    )
                )
            store.write_repeat(run.dir, case.case_id, r, pd.concat(rows, ignore_index=True))
        run.case_done(case.case_id, len(values))
    run.set_status("complete")
    return run.dir
