"""A world of rank processes: started here, one process per rank (``World``), or as a torchrun job
(``TorchrunWorld``), and what the launcher's ``Supervisor`` reads of either (``WorldProcesses``).

A local world pins each rank to cores of its own (``rank_layout``), and every rank dies with the
launcher (PDEATHSIG), so nothing is orphaned. Its ranks report on a pipe each; a torchrun job's,
which inherit no pipe, append to files on the run directory's shared filesystem (``EventFiles``),
and its agent's report says which rank failed and how (``torchrun_failures``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import json
import math
import os
import re
import selectors
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Protocol

from tpbench import store
from tpbench.capture import transport
from tpbench.interconnect import Interconnect, WorldNetwork
from tpbench.plan import STACKS_SIGNAL, Plan

# A world that has not rendezvoused by then is not going to.
STARTUP_TIMEOUT_S = 180.0
# The port torchrun's c10d rendezvous takes when ``--rdzv-endpoint`` names none.
C10D_DEFAULT_PORT = 29400
# How long a torchrun world's agents may take to meet (``--rdzv-timeout``; torchrun's own default
# join_timeout), and then how long its ranks may take to start (import torch, maybe from a network
# filesystem, and form their process group) before the world counts as not started.
RDZV_TIMEOUT_S = 600.0
RANKS_START_S = 60.0
# After the first sign of failure, how long to wait for the other ranks' error reports.
DRAIN_S = 1.0
# A rank asked for its stacks (``World.stacks``) writes them from a signal handler at once; a rank
# that has not within this long is not going to.
STACKS_S = 2.0
# The lines of a rank's stacks kept for run.json: its innermost frames come first.
STACK_LINES = 100


@dataclass(frozen=True)
class Ended:
    """How a world's processes ended: cleanly, or not, with the cause the launcher saw."""

    ok: bool
    cause: str = ""


class WorldProcesses(Protocol):
    """What the ``Supervisor`` needs of a world, whoever started its ranks."""

    world_size: int
    drain_s: float  # after a failure, how long the world may take to go quiet
    startup_s: float  # how long until rank 0 must have reported ``world_ready``

    def read_events(self, timeout: float) -> list[dict[str, Any]]: ...
    def quiet(self) -> bool: ...
    def ended(self) -> Ended | None: ...
    def killed_ranks(self) -> list[tuple[int, int]]: ...
    def log_tails(self) -> list[tuple[str, str]]: ...
    def stacks(self) -> list[tuple[str, str]]: ...
    def kill(self) -> None: ...


def _die_with_parent(sig: int = signal.SIGKILL) -> None:
    """In the child before exec: get ``sig`` if the launcher dies, so no rank is ever orphaned."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG


# What every rank does about garbage collection (``worker.CaseRunner.run_repeat``), as run.json says it.
GC_POLICY = "collected before, disabled during timed steps"


@dataclass(frozen=True)
class RankLayout:
    """Where the ranks of a local world run: each rank's own block of cores (``cores[r]``; None:
    not pinned, and ``why``) and the intra-op threads every rank uses (``threads``)."""

    cores: tuple[tuple[int, ...], ...] | None
    threads: int
    why: str = ""

    def record(self) -> dict[str, Any]:
        """The world's ``noise_controls`` in run.json."""
        pinning = {str(r): list(c) for r, c in enumerate(self.cores)} if self.cores else f"off: {self.why}"
        return {"gc": GC_POLICY, "pinning": pinning, "threads_per_rank": self.threads}


def rank_layout(available: Iterable[int], world_size: int) -> RankLayout:
    """Pin each rank to a disjoint block of equal size of the ``available`` cores, leaving one core
    spare (for the launcher, the gate, the OS) where there are more cores than ranks: two ranks
    sharing a core, or a rank moved between cores mid-step, is noise the machine did not need to
    add. As many cores as ranks: one core each. Measured on a 2-core VM with 2 ranks (a 15 ms
    step, 6 repeats of 20 steps; idle): pinned, repeats scattered by 4.1 % in step time and 1.8 %
    in CPU time, unpinned by 7.2 % and 3.2 %; beside a busy loop the pinned steps were 13 % faster.
    Fewer cores than ranks: nothing is pinned. Each rank gets one intra-op thread per core of its
    block (unpinned: its share of the cores), fixed for the whole world."""
    cores = sorted(available)
    if len(cores) < world_size:
        why = f"{len(cores)} cores for {world_size} ranks (fewer cores than ranks)"
        return RankLayout(None, 1, why)
    per = max(1, (len(cores) - 1) // world_size)
    return RankLayout(tuple(tuple(cores[r * per : (r + 1) * per]) for r in range(world_size)), per)


def start_rank(cores: tuple[int, ...] | None) -> None:
    """In a rank's child process before exec: die with the launcher, run on its own cores."""
    _die_with_parent()
    if cores:
        os.sched_setaffinity(0, cores)


def tail(path: Path, lines: int = 15, end: int | None = None) -> str:
    """The last ``lines`` lines of a log, of its first ``end`` bytes when given."""
    with contextlib.suppress(OSError):
        with open(path, "rb") as f:
            text = f.read(end if end is not None else -1).decode(errors="replace")
        return "\n".join(text.strip().splitlines()[-lines:])
    return ""


def _size(path: Path) -> int:
    with contextlib.suppress(OSError):
        return path.stat().st_size
    return 0


class World:
    """The rank processes of one attempt at a plan, started here, each reporting on a pipe."""

    # After the first sign of failure, how long to wait for the other ranks' error reports.
    drain_s = DRAIN_S
    # A world that has not rendezvoused by then is not going to.
    startup_s = STARTUP_TIMEOUT_S

    def __init__(
        self, plan: Plan, plan_path: Path, world_size: int, net: WorldNetwork, log_dir: Path, layout: RankLayout
    ) -> None:
        self.plan = plan
        self.world_size = world_size
        self.procs: list[subprocess.Popen] = []
        self.groups_killed = False
        self.logs: list[Path] = []
        self.dumped_at: dict[int, int] = {}  # rank → its log's size when it was asked for its stacks
        self.readers: dict[int, int] = {}  # read fd → rank
        self.buffers: dict[int, bytes] = {}
        self.sel = selectors.DefaultSelector()
        log_dir.mkdir(parents=True, exist_ok=True)
        for r in range(world_size):
            read_fd, write_fd = os.pipe()
            # NCCL ranks log their transport choices for capture; a profile's env may still override.
            nccl = (
                transport.nccl_debug_env(log_dir / f"nccl-{plan.world}-rank{r}.log")
                if plan.cases[0]["backend"] == "nccl"
                else {}
            )
            env = (
                os.environ
                | nccl
                | dict(net.env)
                | {
                    "RANK": str(r),
                    "WORLD_SIZE": str(world_size),
                    "LOCAL_RANK": str(r),
                    "LOCAL_WORLD_SIZE": str(world_size),
                    "OMP_NUM_THREADS": str(layout.threads),
                    "PYTHONUNBUFFERED": "1",
                }
            )
            log = log_dir / f"{plan.world}-rank{r}.log"
            argv = net.wrap([sys.executable, "-m", "tpbench.worker", str(plan_path), "--event-fd", str(write_fd)])
            with open(log, "wb") as out:
                p = subprocess.Popen(
                    argv,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    pass_fds=(write_fd,),
                    start_new_session=True,
                    preexec_fn=functools.partial(start_rank, layout.cores[r] if layout.cores else None),
                )
            os.close(write_fd)
            self.procs.append(p)
            self.logs.append(log)
            self.readers[read_fd] = r
            self.buffers[read_fd] = b""
            self.sel.register(read_fd, selectors.EVENT_READ)

    def read_events(self, timeout: float) -> list[dict[str, Any]]:
        """Events that arrived on the ranks' pipes, waiting up to ``timeout`` for the first."""
        events = []
        for key, _ in self.sel.select(timeout):
            fd = key.fd
            chunk = os.read(fd, 65536)
            if not chunk:
                self.sel.unregister(fd)
                continue
            self.buffers[fd] += chunk
            *lines, self.buffers[fd] = self.buffers[fd].split(b"\n")
            events += [json.loads(line) for line in lines if line.strip()]
        return events

    def quiet(self) -> bool:
        """No more events can come: every rank has closed its pipe."""
        return not self.sel.get_map()

    def ended(self) -> Ended | None:
        """None while ranks run; a failure as soon as one rank fails; success once all exit 0."""
        for r, p in enumerate(self.procs):
            code = p.poll()
            if code not in (None, 0):
                return Ended(False, exit_cause(r, code))
        return Ended(True) if all(p.poll() == 0 for p in self.procs) else None

    def killed_ranks(self) -> list[tuple[int, int]]:
        """(rank, negative exit code) of the ranks a signal killed: root causes over their peers' errors."""
        return [(r, p.returncode) for r, p in enumerate(self.procs) if p.poll() is not None and p.returncode < 0]

    def log_tails(self) -> list[tuple[str, str]]:
        """Each rank's last log lines, written before any stacks it was asked for (``stacks``)."""
        return [(f"rank {r} log", tail(log, end=self.dumped_at.get(r))) for r, log in enumerate(self.logs)]

    def stacks(self) -> list[tuple[str, str]]:
        """Where each live rank is, for a world that hung: its Python stacks, every thread's, which
        it writes to its log on ``STACKS_SIGNAL`` (``faulthandler``, from a signal handler, so also
        while it is blocked in a collective). A time-out's cause alone ("timed out after 60 s") says
        neither which rank stopped nor where; these say both: the rank stuck in the user's code or a
        peer that never came, and its peers waiting in the collective."""
        for r, p in enumerate(self.procs):
            if p.poll() is None:
                self.dumped_at[r] = _size(self.logs[r])
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, STACKS_SIGNAL)
        deadline = time.monotonic() + STACKS_S
        while time.monotonic() < deadline and any(_size(self.logs[r]) == n for r, n in self.dumped_at.items()):
            time.sleep(0.05)
        time.sleep(0.1)  # the last frames of a dump that has begun
        found = []
        for r, n in self.dumped_at.items():
            with open(self.logs[r], "rb") as f:
                f.seek(n)
                text = f.read().decode(errors="replace").strip()
            if text:
                found.append((f"rank {r} stacks when it timed out", "\n".join(text.splitlines()[:STACK_LINES])))
        return found

    def kill(self) -> None:
        """Kill each rank's process group (its session), also where the rank itself has exited: what
        the user's code started in a rank (a forked worker, a server) dies with the world. Once only,
        right as the world ends: a group keeps its id reserved while any member lives, so no other
        process can be hit. (Code that calls setsid() itself leaves the group and is not reached.)"""
        if not self.groups_killed:
            self.groups_killed = True
            for p in self.procs:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        for fd in list(self.readers):
            if fd in self.sel.get_map():
                self.sel.unregister(fd)
            os.close(fd)
        self.readers.clear()


@dataclass(frozen=True)
class Torchrun:
    """How worlds start under torchrun.

    Each world is one torchrun job: ``nnodes`` agents of ``nproc_per_node`` ranks (None: the
    world's size divided by ``nnodes``) meeting at a c10d rendezvous on ``rdzv_endpoint`` (None,
    for one node only: torchrun's ``--standalone``, a free port on this machine).
    ``agent_prefix`` is the command that starts one agent on every node, e.g. ``srun
    --ntasks-per-node=1 --kill-on-bad-exit=1``; without one a single agent starts here.
    ``rdzv_timeout_s``: how long the agents may take to meet (torchrun's ``join_timeout``); a
    world whose agents never met stops the sweep (``launch.run_group``).

    ``--max-restarts 0``, always: torchrun's own restart would rerun the whole plan, the failing
    case included, and fail the same way; tpbench instead fails that case with its cause and
    starts a fresh torchrun job for the rest.
    """

    nnodes: int = 1
    nproc_per_node: int | None = None
    rdzv_endpoint: str | None = None
    agent_prefix: tuple[str, ...] = ()
    rdzv_timeout_s: float = RDZV_TIMEOUT_S

    def problem(self) -> str | None:
        """Why this configuration cannot start a world, or None."""
        # The option given and its value: "--nnodes and --nproc-per-node must be >= 1" named neither.
        for flag, value in (("--nnodes", self.nnodes), ("--nproc-per-node", self.nproc_per_node)):
            if value is not None and value < 1:
                return f"{flag} {value}: expected an integer >= 1"
        if self.nnodes > 1 and not self.rdzv_endpoint:
            return (
                f"--nnodes {self.nnodes} needs --rdzv-endpoint HOST:PORT "
                "(a port on the first node that every node can reach)"
            )
        return self._endpoint_problem()

    def _endpoint_problem(self) -> str | None:
        """Why ``rdzv_endpoint`` is no ``HOST[:PORT]`` torchrun can meet at, or None. Checked here,
        before a run exists: torchrun itself refuses ``HOST:99999`` with a traceback in every world,
        each of its cases marked failed ("torchrun exited with code 1"), and with port 0 each node's
        agent listens on a port of its own, so the nodes never meet and the first world waits out
        its start-up time (``TorchrunWorld.startup_s``: ``--rdzv-timeout`` and a minute)."""
        if not self.rdzv_endpoint:
            return None
        endpoint = self.rdzv_endpoint
        host, port = _host_and_port(endpoint)
        if not re.fullmatch(r"[\w.:-]+", host):
            return f"--rdzv-endpoint {endpoint}: expected HOST:PORT, the first node's name or address and a port"
        if port is not None and not (port.isascii() and port.isdigit() and int(port) <= 65535):
            return f"--rdzv-endpoint {endpoint}: expected a port number up to 65535 after the colon"
        if port is not None and int(port) == 0 and self.nnodes > 1:
            return (
                f"--rdzv-endpoint {endpoint}: port 0 picks a free port on each node, where the nodes cannot "
                "meet: give a port on the first node that every node can reach"
            )
        return None

    def rendezvous_address(self) -> tuple[str, int] | None:
        """The host (IPv6 brackets off) and port of a valid ``rdzv_endpoint``, torchrun's default
        port where it names none; None without one."""
        if not self.rdzv_endpoint or self._endpoint_problem():
            return None
        host, port = _host_and_port(self.rdzv_endpoint)
        return host, C10D_DEFAULT_PORT if port is None else int(port)

    def endpoint_held(self) -> str | None:
        """Why the c10d store cannot listen at ``rdzv_endpoint`` on this machine, or None: the
        endpoint is not this machine's (another node hosts the store), or its port is free.

        torchrun's agent on the endpoint's machine hosts the store; when another program holds the
        port, the agent falls back to connecting to that program as a client, which never answers,
        and every agent waits (a plain TCP listener keeps them waiting past 5 minutes), a world's
        whole start-up limit, and then the next world's.
        Checked before a new run is made (but for ``--print``, whose worlds start later) and before
        each run's worlds start: what holds a port may change between ``--print`` and its resume, and
        a bare ``--resume`` reuses a recorded endpoint."""
        address = self.rendezvous_address()
        if address is None or address[1] == 0 or not _is_this_machine(address[0]):
            return None
        host, port = address
        for family, wildcard in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
            try:
                with socket.socket(family, socket.SOCK_STREAM) as s:
                    # As torch's store does: a finished world's connections (TIME_WAIT) do not block it.
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind((wildcard, port))
                    s.listen()
            except OSError as e:
                if e.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                    continue  # no IPv6 on this machine
                if e.errno == errno.EADDRINUSE:
                    return f"another program holds port {port} on this machine ({host})"
                return f"port {port} on this machine ({host}) cannot be listened on: {e.strerror or e}"
        return None

    def options(self) -> list[str]:
        """The ``tpbench sweep`` / ``tpbench tune`` options that start worlds this way, for a command
        tpbench suggests: pasted without them, it ran locally, and a suite sized ``"auto"`` made
        other worlds (other case ids, so its ``--filter id=...`` matched no case)."""
        flags = ["--launcher", "torchrun"]
        if self.nnodes != 1:
            flags += ["--nnodes", str(self.nnodes)]
        if self.nproc_per_node is not None:
            flags += ["--nproc-per-node", str(self.nproc_per_node)]
        if self.rdzv_endpoint:
            flags += ["--rdzv-endpoint", self.rdzv_endpoint]
        if self.agent_prefix:
            flags += ["--agent-prefix", shlex.join(self.agent_prefix)]
        if self.rdzv_timeout_s != RDZV_TIMEOUT_S:
            flags += ["--rdzv-timeout", f"{self.rdzv_timeout_s:g}"]
        return flags

    def command(self, plan_path: Path, world_size: int, rdzv_id: str) -> list[str]:
        """The command line that starts one world (every node's agent, when there is a prefix)."""
        per_node = self.nproc_per_node or world_size // self.nnodes
        if self.rdzv_endpoint:
            rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", self.rdzv_endpoint, "--rdzv-id", rdzv_id]
        else:
            rdzv = ["--standalone"]
        return [
            *self.agent_prefix,
            *torchrun_executable(),
            "--nnodes",
            str(self.nnodes),
            "--nproc-per-node",
            str(per_node),
            *rdzv,
            "--rdzv-conf",
            f"join_timeout={math.ceil(self.rdzv_timeout_s)}",
            "--max-restarts",
            "0",
            "-m",
            "tpbench.worker",
            str(plan_path),
        ]


def _host_and_port(endpoint: str) -> tuple[str, str | None]:
    """``HOST[:PORT]`` split, IPv6 brackets taken off the host; no port: None (torchrun's default)."""
    host, colon, port = endpoint.rpartition(":")
    if not colon or endpoint.endswith("]"):  # "[::1]" is a host alone
        return endpoint[1:-1] if endpoint.startswith("[") and endpoint.endswith("]") else endpoint, None
    return (host[1:-1] if host.startswith("[") and host.endswith("]") else host), port


def _is_this_machine(host: str) -> bool:
    """Whether ``host`` names this machine: it resolves to an address a socket here can bind (an
    address of one of its interfaces, loopback included); a name that does not resolve is not."""
    try:
        addresses = {a[4][0] for a in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except (OSError, UnicodeError):
        return False
    for address in addresses:
        with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM) as s:
            with contextlib.suppress(OSError):
                s.bind((address, 0))
                return True
    return False


def torchrun_executable() -> list[str]:
    """The torchrun of this Python environment (every node must see the same one)."""
    script = Path(sys.executable).parent / "torchrun"
    return [str(script)] if script.exists() else [sys.executable, "-m", "torch.distributed.run"]


def torchrun_layout(launcher: Torchrun, world_size: int) -> RankLayout:
    """Torchrun's ranks are started by its agents, never pinned; each gets its share of the cores
    (of the launching machine: every node is assumed alike)."""
    per_node = launcher.nproc_per_node or world_size // launcher.nnodes
    return RankLayout(None, max(1, (os.cpu_count() or 1) // per_node), "torchrun starts the ranks")


def torchrun_env(ic: Interconnect, launcher: Torchrun, plan: Plan, log_dir: Path) -> dict[str, str]:
    """Environment a torchrun world's agents pass to their ranks.

    The profile's variables; on a single node also Gloo's loopback default (between nodes Gloo
    must use the real network). NCCL ranks log their transport choices as under the local
    launcher, but NCCL_DEBUG_FILE has no rank pattern: host name and pid keep the files apart
    (``transport.nccl_log_path`` expands them back).
    """
    # As the local launcher does (torchrun would otherwise set 1, with a warning); the worker sets
    # torch's intra-op threads to the same number.
    threads = torchrun_layout(launcher, plan.cases[0]["world_size"]).threads
    env = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads), **ic.env}
    if ic.backend == "gloo" and launcher.nnodes == 1:
        env = {"GLOO_SOCKET_IFNAME": "lo", **env}
    if plan.cases[0]["backend"] == "nccl":
        nccl = transport.nccl_debug_env(log_dir / f"nccl-{plan.world}.log")
        nccl["NCCL_DEBUG_FILE"] = str(log_dir / f"nccl-{plan.world}-%h-%p.log")
        env = nccl | env
    return env


# What the launcher's ``Supervisor`` reads of each kind of event, and its type. An events file is on
# disk (and, after ``--print``, read back by ``--resume``), so a line without them is damage (a
# disk's, an edit's): ``event_line`` says so naming the file and line, not a KeyError mid-resume.
_NUMBER = (int, float)
EVENT_FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "world_ready": {"world": str, "nodes": list},
    "repeat_start": {"t": _NUMBER, "case": str, "repeat": int},
    "round_start": {"t": _NUMBER, "items": list},
    "repeat_end": {"t": _NUMBER, "case": str, "repeat": int},
    "case_end": {"case": str},
    "trace_start": {"case": str},
    "capture": {"case": str},
    "error": {"rank": int, "error": str},
}


def event_line(line: bytes, where: str) -> dict[str, Any]:
    """One line of a rank's events file as an event, checked for what the supervisor reads of its
    kind (``EVENT_FIELDS``; a round's items as [case, repeat] pairs); ``store.StoreError`` naming
    ``where`` (file and line), the key and what was expected otherwise."""
    expected = 'expected one JSON object per line, as tpbench.worker writes them ({"event": NAME, ...})'
    try:
        ev = json.loads(line)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise store.StoreError(f"{where}: not JSON ({e}); {expected}") from None
    if not isinstance(ev, dict) or not isinstance(ev.get("event"), str):
        raise store.StoreError(f"{where}: {line[:80].decode(errors='replace')} is not an event; {expected}")
    for key, kind in EVENT_FIELDS.get(ev["event"], {}).items():
        value = ev.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise store.StoreError(
                f"{where}: a {ev['event']!r} event whose {key!r} is {json.dumps(value)}, expected {names}"
            )
    if ev["event"] == "round_start" and not all(
        isinstance(i, list) and len(i) == 2 and isinstance(i[0], str) and type(i[1]) is int for i in ev["items"]
    ):
        raise store.StoreError(f"{where}: a 'round_start' event whose items are not [case, repeat] pairs")
    return ev


class EventFiles:
    """Follows the events files the ranks of a torchrun world append to (``rank<r>.jsonl``).

    Files are reopened on every read: on NFS, opening a file is what makes a client revalidate
    its cache and see other hosts' appends. A line is an event once its newline is there (a rank
    may be mid-write); a whole line that is not one is refused (``event_line``).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.offsets: dict[Path, int] = {}
        self.partial: dict[Path, bytes] = {}
        self.lines: dict[Path, int] = {}  # whole lines read so far, to name a damaged one

    def read(self) -> list[dict[str, Any]]:
        events = []
        for path in sorted(self.folder.glob("rank*.jsonl")):
            with open(path, "rb") as f:
                f.seek(self.offsets.get(path, 0))
                chunk = f.read()
            if not chunk:
                continue
            self.offsets[path] = self.offsets.get(path, 0) + len(chunk)
            *lines, self.partial[path] = (self.partial.get(path, b"") + chunk).split(b"\n")
            first = self.lines.get(path, 0) + 1
            self.lines[path] = first - 1 + len(lines)
            events += [event_line(line, f"{path}: line {n}") for n, line in enumerate(lines, first) if line.strip()]
        return events


# One entry of torchrun's failure report (ChildFailedError), once per failed rank and agent. Lines
# may carry a prefix (srun --label).
_FAILURE_RE = re.compile(r"rank\s*:\s*(?P<rank>\d+) \(local_rank: \d+\)\s*\n[^\n]*?exitcode\s*:\s*(?P<code>-?\d+)")


def torchrun_failures(report: str) -> list[tuple[int, int]]:
    """(rank, exit code) of every failed rank in torchrun's output, most telling first.

    torchrun lists the ranks it stopped itself (SIGTERM, sent to the survivors once it saw a
    failure) beside the one that failed. So: ranks killed by any other signal first (the crash),
    then ranks that exited with an error (often their peers' connection errors), then SIGTERM.
    """
    found = [(int(m["rank"]), int(m["code"])) for m in _FAILURE_RE.finditer(report)]
    return sorted(dict.fromkeys(found), key=lambda f: (f[1] == -signal.SIGTERM, f[1] > 0))


class TorchrunWorld:
    """One attempt at a plan as a torchrun job (``[prefix] torchrun ... -m tpbench.worker PLAN``),
    followed through its ranks' events files."""

    # torchrun needs a moment to notice a failed rank, stop the others and print its report.
    drain_s = 30.0
    # How long agents get to stop their ranks after SIGTERM before they are killed.
    stop_s = 15.0

    def __init__(
        self,
        plan: Plan,
        plan_path: Path,
        launcher: Torchrun,
        world_size: int,
        env: dict[str, str],
        log_dir: Path,
        rdzv_id: str,
    ) -> None:
        assert plan.events_dir is not None
        self.world_size = world_size
        # Every node must start an agent and rendezvous, then its ranks import torch and meet.
        self.startup_s = launcher.rdzv_timeout_s + RANKS_START_S
        self.events = EventFiles(Path(plan.events_dir))
        log_dir.mkdir(parents=True, exist_ok=True)
        self.rank_logs = [log_dir / f"{plan.world}-rank{r}.log" for r in range(world_size)]
        self.agent_log = log_dir / f"{plan.world}-agents.log"
        argv = launcher.command(plan_path, world_size, rdzv_id)
        with open(self.agent_log, "wb") as out:
            # SIGTERM, not SIGKILL, if the launcher dies: agents then stop their ranks (and srun its tasks).
            self.proc = subprocess.Popen(
                argv,
                env=os.environ | env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=functools.partial(_die_with_parent, signal.SIGTERM),
            )

    def read_events(self, timeout: float) -> list[dict[str, Any]]:
        events = self.events.read()
        if not events:
            time.sleep(timeout)
        return events

    def quiet(self) -> bool:
        """Every agent has exited (so no rank can write any more)."""
        return self.proc.poll() is not None

    def _failures(self) -> list[tuple[int, int]]:
        """Failed ranks from the agents' reports, which they print as they exit."""
        if self.proc.poll() is None:
            return []
        with contextlib.suppress(OSError):
            return torchrun_failures(self.agent_log.read_text(errors="replace"))
        return []

    def ended(self) -> Ended | None:
        code = self.proc.poll()
        if code is None:
            return None
        if code == 0:
            return Ended(True)
        failures = self._failures()
        return Ended(False, exit_cause(*failures[0]) if failures else f"torchrun exited with code {code}")

    def killed_ranks(self) -> list[tuple[int, int]]:
        return [(r, c) for r, c in self._failures() if c < 0 and c != -signal.SIGTERM]

    def never_met(self) -> bool:
        """No rank of this world ever started: its agents start ranks only once all of them have
        met, each rank's first act is to open its log, and the agents reported no failed rank. So
        the agents never met (an endpoint they cannot reach, or one another program holds, a node
        whose agent never came), or never started (an ``--agent-prefix`` that failed)."""
        return not any(log.exists() for log in self.rank_logs) and not self._failures()

    def agent_error(self) -> str:
        """The last exception the agents' output names (``RendezvousTimeoutError``, …), or ""."""
        found = re.findall(r"^\S*?(\w+(?:Error|Exception)\b.*)$", tail(self.agent_log, 40), re.MULTILINE)
        return found[-1].strip() if found else ""

    def log_tails(self) -> list[tuple[str, str]]:
        return [(f"rank {r} log", tail(log)) for r, log in enumerate(self.rank_logs)] + [
            ("torchrun", tail(self.agent_log, 40))
        ]

    def stacks(self) -> list[tuple[str, str]]:
        """None: the ranks run under torchrun's agents, on other nodes too, and a signal to an agent
        would stop it (``World.stacks`` asks a local world's ranks)."""
        return []

    def kill(self) -> None:
        """SIGTERM to the job's process group: agents stop their ranks, srun forwards it to every node."""
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=self.stop_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def exit_cause(rank: int, code: int) -> str:
    if code < 0:
        return f"rank {rank} was killed by {signal.Signals(-code).name}"
    return f"rank {rank} exited with code {code}"
