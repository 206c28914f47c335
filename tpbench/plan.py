"""What one world of rank processes runs, as the launcher writes it and the worker reads it.

Its own module so that the launcher (and everything that imports it, ``tpbench validate``
included) need not import the worker, which imports torch.
"""

from __future__ import annotations

import dataclasses
import json
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpbench import store

# The signal on which a rank writes its Python stacks to its log (the worker registers it with
# ``faulthandler``): the launcher sends it to the ranks of a world whose repeat timed out
# (``worlds.World.stacks``), so that the failed case says where each rank was.
STACKS_SIGNAL = signal.SIGUSR1


@dataclass(frozen=True)
class Plan:
    """What one world runs: its cases and the (case_id, repeat) items in order."""

    run_dir: str
    world: str
    cases: list[dict[str, Any]]
    schedule: list[tuple[str, int]]
    # A FileStore path for local worlds (works across network namespaces); None → env:// (torchrun).
    rendezvous_file: str | None = None
    # Set for worlds started by torchrun: its ranks inherit no pipe from tpbench, so each appends
    # its events to ``<events_dir>/rank<r>.jsonl`` on the run directory's shared filesystem.
    events_dir: str | None = None
    # Set by ``tpbench sweep --lockstep SOCKET`` (``tpbench gate``): rank 0 asks the gate on this Unix
    # socket before each item and stops when told (``tpbench.lockstep``).
    lockstep: str | None = None
    # Set by ``tpbench tune``: each round's items (consecutive items of one repeat index) run
    # together, every arm built and their steps taken in turn (``worker.CaseRunner.run_round``).
    steps_interleaved: bool = False

    def save(self, path: Path) -> None:
        store.atomic_write_bytes(path, json.dumps(dataclasses.asdict(self), indent=1).encode())

    @classmethod
    def read(cls, path: Path) -> Plan:
        d = json.loads(Path(path).read_text())
        d["schedule"] = [tuple(x) for x in d["schedule"]]
        return cls(**d)
