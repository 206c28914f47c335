"""Stands in for ``srun --ntasks=N --kill-on-bad-exit=1`` on one machine: runs a command N times
at once (one torchrun agent per "node"), forwards SIGTERM to every task, stops the others when
one fails, and exits with the first failure's code.

Usage: ``python tests/fake_srun.py N COMMAND...`` (the ``--agent-prefix`` of the cluster tests).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time


def main() -> int:
    n, argv = int(sys.argv[1]), sys.argv[2:]
    tasks = [subprocess.Popen(argv) for _ in range(n)]

    def forward(signum: int, frame: object) -> None:
        for t in tasks:
            if t.poll() is None:
                t.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while any(t.poll() is None for t in tasks):
        if any(t.poll() not in (None, 0) for t in tasks):
            forward(signal.SIGTERM, None)
        time.sleep(0.1)
    codes = [t.returncode for t in tasks]
    return next((c for c in codes if c != 0), 0) & 0xFF


if __name__ == "__main__":
    sys.exit(main())
