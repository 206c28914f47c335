"""The lockstep protocol between a conductor (``tpbench gate``, ``tpbench tune``) and the rank 0 of a world.

A lockstep gate keeps one world per side alive and lets exactly one of them run one (case,
repeat) item at a time. Before each item of its plan, rank 0 of a world sends ``ready`` and waits
for the gate's answer: ``go`` (run it; the answer names the metric the gate judges), ``skip``
(run nothing for this item and go on with the plan: ``tpbench tune`` answers it for an arm it has
eliminated) or ``stop`` (run nothing more: the world ends its plan). A world that skipped any item
ends as one that was stopped, so the cases it cut short are done with the repeats they ran. After
a ``go`` it sends ``done`` with the repeat's value of that metric, computed as ``tpbench compare``
computes it, and when the item began and ended by its own clock (where the repeat recorded no such
column, ``recorded`` lists those it did).

Messages are JSON lines over a Unix socket at a path the gate chose. A path-based socket reaches
the gate from inside the network namespace of an emulated link, where TCP to the gate's localhost
would not; it lives in a directory only its owner can enter, which is the authentication. A gate
that goes away closes the socket: the waiting rank 0 sees the end of the stream and fails.
"""

from __future__ import annotations

import json
import socket
from typing import Any

GO, SKIP, STOP, READY, DONE = "go", "skip", "stop", "ready", "done"


def send(sock: socket.socket, msg: str, **data: Any) -> None:
    sock.sendall((json.dumps({"msg": msg, **data}) + "\n").encode())


def split_lines(buffer: bytes) -> tuple[list[dict[str, Any]], bytes]:
    """The whole messages in ``buffer`` and what is left of it (a message still arriving)."""
    *lines, rest = buffer.split(b"\n")
    return [json.loads(line) for line in lines if line.strip()], rest


class GateClient:
    """Rank 0's end: asks before each item, reports each item done."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buffer = b""

    def ask(self, case_id: str, repeat: int) -> dict[str, Any]:
        """Wait for the gate's answer to running this item (``msg`` is GO, SKIP or STOP)."""
        send(self.sock, READY, case=case_id, repeat=repeat)
        while True:
            found, self.buffer = split_lines(self.buffer)
            if found:
                return found[0]
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("the lockstep gate closed its socket (the gate ended or failed)")
            self.buffer += chunk

    def done(
        self,
        case_id: str,
        repeat: int,
        value: float | None,
        began: float,
        ended: float,
        recorded: list[str] | None = None,
    ) -> None:
        """The item is over: its value, and when it began and ended on rank 0's wall clock;
        ``recorded``: the per-step columns it has, where the metric asked for is not one of them."""
        extra = {} if recorded is None else {"recorded": recorded}
        send(self.sock, DONE, case=case_id, repeat=repeat, value=value, began=began, ended=ended, **extra)
