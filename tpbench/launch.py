"""Starting worlds of rank processes on this machine, and supervising them.

Cases that share a world (same world size, backend, device, interconnect) run in one set of
processes: the launcher writes them a plan, starts ``world_size`` workers once, and follows their
progress on a pipe per rank. Repeats are interleaved across the cases of a world (A1 B1 C1 A2 …)
so a drifting machine does not favour one case.

When a case crashes a rank or hangs past its ``timeout_s``, the launcher kills the whole world
(every rank runs in its own session and dies with the launcher via PDEATHSIG, so nothing is
orphaned), marks that case failed with its cause, and starts a fresh world for what is left. Every
repeat already finished is on disk, so nothing else is lost.

Under torchrun (``Torchrun``) a world is one torchrun job instead: one agent per node, started by
an optional prefix such as ``srun``, with ``--max-restarts 0``. Its ranks inherit no pipe, so each
appends its events to a file on the run directory's shared filesystem and the same ``Supervisor``
follows those files: progress, time-outs, failure attribution and the fresh world for the rest
work alike for both launchers.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import math
import os
import random
import re
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

from tpbench import store
from tpbench.capture import transport
from tpbench.interconnect import Interconnect, WorldNetwork, resolve, world_network
from tpbench.plan import Plan
from tpbench.suite import Case

# A world that has not rendezvoused by then is not going to.
STARTUP_TIMEOUT_S = 180.0
# After the first sign of failure, how long to wait for the other ranks' error reports.
DRAIN_S = 1.0

Listener = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class LaunchGroup:
    """Cases that run in the same world of processes."""

    key: tuple[int, str, str, str]
    cases: list[Case]

    @property
    def world_size(self) -> int:
        return self.key[0]


def group_cases(cases: Iterable[Case]) -> list[LaunchGroup]:
    groups: dict[tuple, list[Case]] = {}
    for c in cases:
        groups.setdefault(c.launch_key, []).append(c)
    return [LaunchGroup(k, v) for k, v in groups.items()]


def interleave(
    cases: list[Case], done: set[tuple[str, int]] = frozenset(), through_pass: int | None = None
) -> list[tuple[str, int]]:
    """The (case_id, repeat) items of a world, round by round, skipping those already done.

    Round ``r`` holds repeat ``r`` of every case (comparisons pair cases by repeat index), in an
    order shuffled per round (``round_order``), so that no case always runs first after the
    barrier, or always follows the same neighbour: position within a round cancels over rounds.
    ``through_pass``: only the rounds of the passes up to it (``rounds_through``).
    """

    def limit(c: Case) -> int:
        return c.repeats if through_pass is None else rounds_through(c, through_pass)

    rounds = max((limit(c) for c in cases), default=0)
    return [
        (c.case_id, r)
        for r in range(rounds)
        for c in round_order([c for c in cases if r < limit(c)], r)
        if (c.case_id, r) not in done
    ]


def rounds_through(case: Case, pass_number: int) -> int:
    """How many of a case's rounds its first ``pass_number`` passes (from 1) run: its repeats
    shared out as evenly as whole rounds allow, the last pass ending with the last round (the
    traced one)."""
    return case.repeats if pass_number >= case.passes else math.ceil(case.repeats * pass_number / case.passes)


def round_order(cases: list[Case], round_index: int) -> list[Case]:
    """``cases`` shuffled for round ``round_index``, seeded by the cases' ``seed`` values and the
    round: the same suite gets the same schedule in every run, on every side of a gate, and on a
    resume (done items are skipped from the same order, never reshuffled)."""
    seeds = sorted({c.seed for c in cases})
    order = list(cases)
    random.Random(f"tpbench-round:{seeds}:{round_index}").shuffle(order)
    return order


@dataclass
class WorldOutcome:
    completed: set[tuple[str, int]] = field(default_factory=set)
    failed_case: str | None = None
    cause: str | None = None
    detail: str | None = None
    stopped: bool = False  # a lockstep gate told the world to end its plan early
    died_tracing: bool = False  # a rank was killed by a signal while the failed case was being traced


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


def _start_rank(cores: tuple[int, ...] | None) -> None:
    """In a rank's child process before exec: die with the launcher, run on its own cores."""
    _die_with_parent()
    if cores:
        os.sched_setaffinity(0, cores)


def _tail(path: Path, lines: int = 15) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    return ""


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
                    preexec_fn=functools.partial(_start_rank, layout.cores[r] if layout.cores else None),
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
                return Ended(False, _exit_cause(r, code))
        return Ended(True) if all(p.poll() == 0 for p in self.procs) else None

    def killed_ranks(self) -> list[tuple[int, int]]:
        """(rank, negative exit code) of the ranks a signal killed: root causes over their peers' errors."""
        return [(r, p.returncode) for r, p in enumerate(self.procs) if p.poll() is not None and p.returncode < 0]

    def log_tails(self) -> list[tuple[str, str]]:
        return [(f"rank {r} log", _tail(log)) for r, log in enumerate(self.logs)]

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

    ``--max-restarts 0``, always: torchrun's own restart would rerun the whole plan, the failing
    case included, and fail the same way; tpbench instead fails that case with its cause and
    starts a fresh torchrun job for the rest.
    """

    nnodes: int = 1
    nproc_per_node: int | None = None
    rdzv_endpoint: str | None = None
    agent_prefix: tuple[str, ...] = ()

    def problem(self) -> str | None:
        """Why this configuration cannot start a world, or None."""
        if self.nnodes < 1 or (self.nproc_per_node is not None and self.nproc_per_node < 1):
            return "--nnodes and --nproc-per-node must be >= 1"
        if self.nnodes > 1 and not self.rdzv_endpoint:
            return (
                f"--nnodes {self.nnodes} needs --rdzv-endpoint HOST:PORT "
                "(a port on the first node that every node can reach)"
            )
        return None

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
            "--max-restarts",
            "0",
            "-m",
            "tpbench.worker",
            str(plan_path),
        ]


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


class EventFiles:
    """Follows the events files the ranks of a torchrun world append to (``rank<r>.jsonl``).

    Files are reopened on every read: on NFS, opening a file is what makes a client revalidate
    its cache and see other hosts' appends.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.offsets: dict[Path, int] = {}
        self.partial: dict[Path, bytes] = {}

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
            events += [json.loads(line) for line in lines if line.strip()]
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
    # Every node must start an agent, rendezvous, and import torch (maybe from a network filesystem).
    startup_s = 600.0
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
        return Ended(False, _exit_cause(*failures[0]) if failures else f"torchrun exited with code {code}")

    def killed_ranks(self) -> list[tuple[int, int]]:
        return [(r, c) for r, c in self._failures() if c < 0 and c != -signal.SIGTERM]

    def log_tails(self) -> list[tuple[str, str]]:
        return [(f"rank {r} log", _tail(log)) for r, log in enumerate(self.rank_logs)] + [
            ("torchrun", _tail(self.agent_log, 40))
        ]

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


def _exit_cause(rank: int, code: int) -> str:
    if code < 0:
        return f"rank {rank} was killed by {signal.Signals(-code).name}"
    return f"rank {rank} exited with code {code}"


@dataclass
class InFlight:
    """What a world is running: one repeat, or a round's with their steps interleaved, allowed
    the sum of their cases' ``timeout_s`` (each arm's repeat is in the round's time)."""

    items: list[tuple[str, int]]
    t0: float  # the launcher's monotonic clock when it began
    limit_s: float

    def what(self) -> str:
        if len(self.items) == 1:
            return f"repeat {self.items[0][1]}"
        return f"round {self.items[0][1]} ({len(self.items)} cases stepped in turn)"


class Supervisor:
    """Follows one world's events until it finishes, fails or hangs."""

    def __init__(
        self,
        world: WorldProcesses,
        cases: dict[str, Case],
        run: store.Run,
        listener: Listener,
        interconnect: Interconnect | None = None,
    ) -> None:
        self.world = world
        self.interconnect = interconnect  # what the world asked for, to judge the observed transport
        self.cases = cases
        self.run = run
        self.listener = listener
        self.outcome = WorldOutcome()
        self.current: InFlight | None = None
        self.errors: list[dict[str, Any]] = []
        self.ready = False
        self.finished = False
        self.overran: str | None = None  # why the repeat in flight failed although it ended
        self.started_t = 0.0  # rank 0's clock at the start of the repeat in flight
        self.tracing: str | None = None  # the case whose trace some rank has started, until its repeat ends

    def _pump(self, timeout: float) -> None:
        for ev in self.world.read_events(timeout):
            self._handle(ev)

    def _handle(self, ev: dict[str, Any]) -> None:
        kind = ev["event"]
        if self.overran:
            return  # the world is about to be killed; nothing after the overrun counts
        if kind == "world_ready":
            self.ready = True
            self.run.world_nodes(ev["world"], ev["nodes"])
        elif kind in ("repeat_start", "round_start"):
            items = [(ev["case"], ev["repeat"])] if kind == "repeat_start" else [tuple(i) for i in ev["items"]]
            self.current = InFlight(items, time.monotonic(), sum(self.cases[cid].timeout_s for cid, _ in items))
            self.started_t = ev["t"]
            for cid, _ in items:
                self.run.set_case(cid, store.RUNNING)
        elif kind == "repeat_end":
            # Timed on rank 0's clock, so a repeat that ended past its limit fails as timed out even
            # when its end reached us before the launcher's own check did.
            took, limit = ev["t"] - self.started_t, self.current.limit_s
            if took > limit:
                self.overran = f"timed out after {limit:g} s in {self.current.what()} (it took {took:.1f} s)"
                return
            self.outcome.completed.add((ev["case"], ev["repeat"]))
            self.tracing = None
            self.current.items.remove((ev["case"], ev["repeat"]))
            if not self.current.items:
                self.current = None
        elif kind == "case_end":
            case = self.cases[ev["case"]]
            # A tune's arm brought back after sitting rounds out ends on the last round with fewer
            # repeats than planned, their numbers with a gap: the race ends it with the repeats it
            # ran (``tune._cut``). In a sweep a missing repeat is pending, and a later world runs it.
            if len(store.finished_repeats(self.run.dir, case.case_id)) == case.repeats:
                self.run.case_done(case.case_id, case.repeats)
        elif kind == "trace_start":
            self.tracing = ev["case"]
        elif kind == "capture":
            self._record_capture(ev)
        elif kind == "error":
            self.errors.append(ev)
        elif kind == "stopped":
            self.outcome.stopped = True
        elif kind == "world_done":
            self.finished = True
        self.listener(kind, ev)

    def _record_capture(self, ev: dict[str, Any]) -> None:
        """A case's telemetry summary, clock offsets, trace windows and observed transport (judged
        against the asked profile) into its run.json entry."""
        cid = ev["case"]
        info: dict[str, Any] = {"nvml": ev["nvml"], "clock_sync": ev["clock_sync"], "trace": ev.get("trace")}
        if self.interconnect is not None:
            seen = ev["transport"]
            info["observed_transport"] = transport.summarize(
                self.interconnect, transport.from_dicts(seen["backend"], seen["ranks"])
            )
        self.run.case_captured(cid, info)

    def _fail(self, cause: str, hung: bool = False) -> WorldOutcome:
        """Decide what went wrong, then kill the world.

        A rank killed by a signal is the root cause even when its peers reported errors first:
        their errors ("connection reset by peer") are the consequence. Otherwise the first
        reported Python error wins, then the given cause (a non-zero exit, a hang). A failing
        world gets ``drain_s`` to go quiet (torchrun reports its failed ranks as it exits); a
        hung one will not, so it gets only ``DRAIN_S`` for late error reports.
        """
        deadline = time.monotonic() + (DRAIN_S if hung else self.world.drain_s)
        while time.monotonic() < deadline and not self.world.quiet():
            self._pump(0.05)
        self._pump(0)
        killed = self.world.killed_ranks()
        self.outcome.failed_case = self.current.items[0][0] if self.current and len(self.current.items) == 1 else None
        if killed:
            self.outcome.cause = _exit_cause(*killed[0])
            if self.tracing is not None:
                self.outcome.failed_case, self.outcome.died_tracing = self.tracing, True
        elif self.errors:
            first = self.errors[0]
            tb = first["error"].strip().splitlines()
            self.outcome.failed_case = first.get("case") or self.outcome.failed_case
            self.outcome.cause = f"rank {first['rank']} raised {tb[-1] if tb else 'an error'}"
        else:
            self.outcome.cause = cause
        reports = [f"--- rank {e['rank']} error ---\n{e['error']}" for e in self.errors]
        tails = [f"--- {name} (last lines) ---\n{text}" for name, text in self.world.log_tails()]
        self.outcome.detail = "\n".join(reports + tails)
        self.world.kill()
        return self.outcome

    def supervise(self) -> WorldOutcome:
        started = time.monotonic()
        while True:
            self._pump(0.2)
            if self.overran:
                return self._fail(self.overran, hung=True)  # the world is still running: do not wait for it
            if self.errors:
                return self._fail("error")
            ended = self.world.ended()
            if ended is not None and not ended.ok:
                return self._fail(ended.cause)
            if ended is not None:
                self._pump(0)
                if self.finished:
                    self.world.kill()
                    return self.outcome
                return self._fail("the world exited before finishing its plan")
            now = time.monotonic()
            if not self.ready and now - started > self.world.startup_s:
                return self._fail(
                    f"the world did not start within {self.world.startup_s:.0f} s (rendezvous)", hung=True
                )
            if self.current and now - self.current.t0 > self.current.limit_s:
                limit = self.current.limit_s
                return self._fail(f"timed out after {limit:g} s in {self.current.what()} (a rank hung)", hung=True)


def _write_plan(
    run: store.Run,
    group: LaunchGroup,
    schedule: list[tuple[str, int]],
    launcher: Torchrun | None,
    layout: RankLayout,
    lockstep: str | None = None,
    steps_interleaved: bool = False,
    **entry: Any,
) -> tuple[Plan, Path]:
    """The next world's plan, saved under ``plans/``, and its entry in run.json: the schedule in
    the order it runs, and what was done against noise (``RankLayout.record``)."""
    world_name = run.next_world()
    scheduled = {cid for cid, _ in schedule}
    plan = Plan(
        run_dir=str(run.dir),
        world=world_name,
        cases=[c.params() for c in group.cases if c.case_id in scheduled],
        schedule=schedule,
        rendezvous_file=None if launcher else str(run.dir / "plans" / f"{world_name}.rdzv"),
        events_dir=str(run.dir / "events" / world_name) if launcher else None,
        lockstep=lockstep,
        steps_interleaved=steps_interleaved,
    )
    plan_path = run.dir / "plans" / f"{world_name}.json"
    plan.save(plan_path)
    run.world_started(
        {
            "world": world_name,
            "key": list(group.key),
            "items": len(schedule),
            "schedule": [list(item) for item in schedule],
            "started": time.time(),
            "launcher": "torchrun" if launcher else "local",
            "noise_controls": layout.record(),
            "steps_interleaved": steps_interleaved,
            **entry,
        }
    )
    return plan, plan_path


def _supervise(
    world: WorldProcesses, cases: dict[str, Case], run: store.Run, listener: Listener, ic: Interconnect
) -> WorldOutcome:
    try:
        return Supervisor(world, cases, run, listener, interconnect=ic).supervise()
    finally:
        world.kill()


def _record_failure(run: store.Run, outcome: WorldOutcome, live: list[Case], listener: Listener) -> list[str]:
    """Mark the case a failed world was running (all of them when unknown) failed; returns their ids."""
    targets = [outcome.failed_case] if outcome.failed_case else [c.case_id for c in live]
    for cid in targets:
        run.set_case(cid, store.FAILED, error=outcome.cause, detail=outcome.detail, failed_at=time.time())
        listener("case_failed", {"case": cid, "cause": outcome.cause})
    return targets


def _done_repeats(run: store.Run, cases: Iterable[Case]) -> set[tuple[str, int]]:
    return {(c.case_id, r) for c in cases for r in store.finished_repeats(run.dir, c.case_id)}


def run_group(
    run: store.Run,
    group: LaunchGroup,
    user_interconnects: dict[str, Any],
    listener: Listener,
    launcher: Torchrun | None = None,
    lockstep: str | None = None,
    steps_interleaved: bool = False,
    through_pass: int | None = None,
) -> bool:
    """Run every pending repeat of a group's cases, restarting the world after each failure.

    ``launcher`` None starts the ranks here (network namespace included, for emulated links);
    a ``Torchrun`` starts each world as a torchrun job. ``lockstep``: the socket of a lockstep
    gate the worlds ask before each item (``tpbench.lockstep``). Returns True when that gate
    stopped the world early: the cases it cut short are then done with the repeats they ran
    (``store.Run.case_cut``). ``steps_interleaved``: each round's items run together, their steps
    taken in turn (``Plan.steps_interleaved``; ``tpbench tune``). ``through_pass``: only the rounds
    of the sweep's passes up to it (``rounds_through``). A case failed earlier in the run stays so.
    """
    ic: Interconnect = resolve(group.key[3], user_interconnects)
    cases = {c.case_id: c for c in group.cases}
    done = _done_repeats(run, group.cases)
    failed = {cid for cid, status in run.case_status().items() if cid in cases and status == store.FAILED}
    retried = False
    retraced: set[str] = set()
    if launcher is None:
        layout = rank_layout(os.sched_getaffinity(0), group.world_size)
    else:
        layout = torchrun_layout(launcher, group.world_size)
    while True:
        live = [c for c in group.cases if c.case_id not in failed]
        schedule = interleave(live, done, through_pass)
        if not schedule:
            return False
        passed = {} if through_pass is None else {"sweep_pass": through_pass}
        plan, plan_path = _write_plan(run, group, schedule, launcher, layout, lockstep, steps_interleaved, **passed)
        started = {"world": plan.world, "world_size": group.world_size, "interconnect": ic.name, "items": len(schedule)}
        listener("world_start", started | passed)
        if launcher is None:
            with world_network(ic) as net:
                outcome = _supervise(
                    World(plan, plan_path, group.world_size, net, run.dir / "logs", layout), cases, run, listener, ic
                )
            # Its ranks exit without closing the FileStore, which would have removed the file.
            Path(plan.rendezvous_file).unlink(missing_ok=True)
        else:
            world = TorchrunWorld(
                plan,
                plan_path,
                launcher,
                group.world_size,
                torchrun_env(ic, launcher, plan, run.dir / "logs"),
                run.dir / "logs",
                rdzv_id=f"tpbench-{run.run_id}-{plan.world}",
            )
            outcome = _supervise(world, cases, run, listener, ic)
        done |= outcome.completed
        if outcome.stopped and outcome.cause is None:
            for case in live:
                ran = store.finished_repeats(run.dir, case.case_id)
                if ran and run.case_status()[case.case_id] != store.DONE:
                    run.case_cut(case.case_id, len(ran))
            return True
        if outcome.cause is None:
            continue
        if outcome.failed_case is None and not retried:
            # No case to blame (the world died starting up or between cases): that may be the
            # machine, not the cases, so try a fresh world once before failing them all.
            retried = True
            listener("world_retry", {"world": plan.world, "cause": outcome.cause})
            continue
        if outcome.died_tracing and outcome.failed_case not in retraced:
            # torch.profiler's native side can kill a rank outright as a trace starts (an abort in
            # Kineto's allocator, rare and not reproducible). The traced repeat is written only once
            # its trace is, so a fresh world runs that repeat again: once per case, then it fails.
            retraced.add(outcome.failed_case)
            listener("trace_retry", {"case": outcome.failed_case, "cause": outcome.cause})
            continue
        failed.update(_record_failure(run, outcome, live, listener))


@dataclass(frozen=True)
class PrintedWorld:
    """A world for the user to start: its plan and the torchrun command to run on every node."""

    world: str
    plan: Path
    env: dict[str, str]
    command: list[str]


def print_group(
    run: store.Run, group: LaunchGroup, user_interconnects: dict[str, Any], launcher: Torchrun
) -> PrintedWorld | None:
    """Write the plan of a group's pending repeats as a world the user starts (``--print``);
    ``ingest_printed`` reads back what it did. None when nothing is pending."""
    schedule = interleave(group.cases, _done_repeats(run, group.cases))
    if not schedule:
        return None
    ic = resolve(group.key[3], user_interconnects)
    plan, plan_path = _write_plan(
        run, group, schedule, launcher, torchrun_layout(launcher, group.world_size), printed=True
    )
    env = torchrun_env(ic, launcher, plan, run.dir / "logs")
    return PrintedWorld(
        plan.world, plan_path, env, launcher.command(plan_path, group.world_size, f"tpbench-{run.run_id}-{plan.world}")
    )


class PrintedWorldRecord:
    """A world the user ran from a printed command, as the ``Supervisor`` sees it afterwards:
    over, its events files complete, no process to watch or kill."""

    drain_s = 0.0
    startup_s = float("inf")

    def __init__(self, run_dir: Path, world: str, world_size: int) -> None:
        self.world_size = world_size
        self.events = EventFiles(run_dir / "events" / world)
        self.rank_logs = [run_dir / "logs" / f"{world}-rank{r}.log" for r in range(world_size)]

    def read_events(self, timeout: float) -> list[dict[str, Any]]:
        return self.events.read()

    def quiet(self) -> bool:
        return True

    def ended(self) -> Ended:
        return Ended(True)

    def killed_ranks(self) -> list[tuple[int, int]]:
        return []  # exit codes were seen by the user's torchrun, not by us

    def log_tails(self) -> list[tuple[str, str]]:
        return [(f"rank {r} log", _tail(log)) for r, log in enumerate(self.rank_logs)]

    def kill(self) -> None:
        pass


def ingest_printed(
    run: store.Run, cases: dict[str, Case], user_interconnects: dict[str, Any], listener: Listener
) -> None:
    """Record what the printed worlds of a run did, from their events files, as if supervised:
    finished cases become done, a case that raised or was cut short becomes failed. A printed
    world with no events yet has not been started; it is left alone (its cases stay pending)."""
    for entry in run.record.worlds:
        if not entry.printed or entry.ingested:
            continue
        if not any((run.dir / "events" / entry.world).glob("rank*.jsonl")):
            continue
        world = PrintedWorldRecord(run.dir, entry.world, entry.world_size)
        plan = Plan.read(run.dir / "plans" / f"{entry.world}.json")
        planned = [cases[c["case_id"]] for c in plan.cases if c["case_id"] in cases]
        ic = resolve(entry.key[3], user_interconnects)
        outcome = Supervisor(world, {c.case_id: c for c in planned}, run, listener, interconnect=ic).supervise()
        if outcome.cause is not None:
            _record_failure(run, outcome, planned, listener)
        run.world_ingested(entry.world)
