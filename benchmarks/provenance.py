"""What a benchmark prints before figures that depend on the machine's noise: the command that gives
them again and the load the machine was under when it started. A figure without them cannot be
judged or reproduced, and the docs state every figure with both."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence


def provenance(module: str, argv: Sequence[str]) -> str:
    """Two lines: ``command: python -m MODULE ARGV`` and the 1- and 5-minute load averages with the
    CPU count. Call it before the work starts, so that the load is the machine's, not the benchmark's."""
    load = os.getloadavg()
    return (
        f"command: {shlex.join(['python', '-m', module, *argv])}\n"
        f"load average (1, 5 min) at the start: {load[0]:.2f} {load[1]:.2f}; {os.cpu_count()} CPUs"
    )
