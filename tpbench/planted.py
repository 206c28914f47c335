"""What a suite plants in a rank so that the answer is known: slowdowns, and the tests' faults.

``slowdown_pct`` with ``slowdown_kind`` "cpu" burns CPU time on the training thread (the planted
suites of ``tpbench tune`` and the gates' accuracy benchmarks: a slowdown proportional to the work);
"sleep" delays each timed step by a share of the warm-up's step time. The ``fault`` key (test-only)
kills or hangs a rank, or aborts it as torch.profiler's native side rarely does; a traced window
can be slowed to look disturbed. ``tpbench.worker`` calls these where a step or a trace runs.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from pathlib import Path
from typing import Any, Callable

from tpbench.suite import Case


def slowed(case: Case, rank: int) -> bool:
    """Whether ``slowdown_pct`` slows this rank (``slowdown_ranks``: "all" or a list of ranks)."""
    return case.slowdown_ranks == "all" or rank in case.slowdown_ranks


def slowdown_s(case: Case, step_ms: list[float]) -> float:
    """``slowdown_kind = "sleep"``: the delay per timed step, in seconds, that share of the
    warm-up's median step time.

    A fixed delay from the warm-up: proportional to each step's own wall time, the ranks' delays
    would feed each other through the next collective and compound. The first warm-up step
    carries one-off costs (allocation, bucket rebuild): it is left out.
    """
    if not case.slowdown_pct or case.slowdown_kind != "sleep":
        return 0.0
    return statistics.median(step_ms[1:] or step_ms) * case.slowdown_pct / 100 / 1e3


def burn(seconds: float) -> None:
    """``slowdown_kind = "cpu"``: burn this much CPU time on the training thread. The amount is
    ``slowdown_pct`` of the step's own CPU time so far (every thread's): a slowdown proportional
    to the work, whatever the machine does to it (the rest of the step's CPU time moves beside it:
    10 % realised 8.7-11.2 % on the 2-core VM, docs/gates.md). A rank's CPU time does not include
    waiting for its peers, so the burns do not compound through the collectives as wall-time
    delays would."""
    deadline = time.thread_time() + seconds
    while time.thread_time() < deadline:
        pass


def delay(seconds: float) -> None:
    """``slowdown_pct``'s delay (test-only, for gates): sleep most of it, then spin to the
    deadline, since a sleep alone wakes late on a busy machine."""
    deadline = time.perf_counter() + seconds
    if seconds > 2e-3:
        time.sleep(seconds - 1e-3)
    while time.perf_counter() < deadline:
        pass


def slow_forward(timed_forward_ms: float) -> Callable[..., None]:
    """A forward pre-hook that sleeps twice the timed forward pass and 5 ms more: the traced
    forward passes run at under a third of their timed speed, as in a window the machine disturbed."""
    pause_s = (2 * timed_forward_ms + 5) / 1e3

    def slow(*_: Any) -> None:
        time.sleep(pause_s)

    return slow


def inject(kind: str) -> None:
    """Test-only faults (suite key ``fault``): die like an OOM kill, or block like a lost peer."""
    if kind == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:
        time.sleep(3600)


def abort_once(run_dir: Path, case_id: str, rank: int) -> None:
    """Test-only fault ``abort-trace:RANK``: abort as torch.profiler's native side rarely does
    when a trace starts, in the run's first world to trace the case only (a marker file says it
    happened), so that the launcher's retry of the trace can be seen to succeed."""
    marker = run_dir / "logs" / f"abort-trace.{case_id}.rank{rank}"
    if not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        os.abort()
