"""Starting worlds of rank processes on this machine, and supervising them.

Cases that share a world (same world size, backend, device, interconnect) run in one set of
processes: the launcher writes them a plan, starts ``world_size`` workers once, and follows their
progress on a pipe per rank. Repeats are interleaved across the cases of a world (A1 B1 C1 A2 …)
so a drifting machine does not favour one case.

When a case crashes a rank or hangs past its ``timeout_s``, the launcher kills the whole world
(every rank runs in its own session and dies with the launcher via PDEATHSIG, so nothing is
orphaned), marks that case failed with its cause, and starts a fresh world for what is left. Every
repeat already finished is on disk, so nothing else is lost.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from tpbench import store
from tpbench.capture import transport
from tpbench.interconnect import Interconnect, WorldNetwork, resolve, world_network
from tpbench.suite import Case
from tpbench.worker import Plan

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


def interleave(cases: list[Case], done: set[tuple[str, int]] = frozenset()) -> list[tuple[str, int]]:
    """Round-robin schedule of (case_id, repeat) items, skipping those already done."""
    rounds = max((c.repeats for c in cases), default=0)
    return [
        (c.case_id, r)
        for r in range(rounds)
        for c in cases
        if r < c.repeats and (c.case_id, r) not in done
    ]


@dataclass
class WorldOutcome:
    completed: set[tuple[str, int]] = field(default_factory=set)
    failed_case: str | None = None
    cause: str | None = None
    detail: str | None = None


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL if the launcher dies, so no rank is ever orphaned."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class World:
    """The rank processes of one attempt at a plan."""

    def __init__(self, plan: Plan, plan_path: Path, world_size: int, net: WorldNetwork, log_dir: Path) -> None:
        self.plan = plan
        self.world_size = world_size
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        self.readers: dict[int, int] = {}  # read fd → rank
        log_dir.mkdir(parents=True, exist_ok=True)
        threads = max(1, (os.cpu_count() or 1) // world_size)
        for r in range(world_size):
            read_fd, write_fd = os.pipe()
            # NCCL ranks log their transport choices for capture; a profile's env may still override.
            nccl = transport.nccl_debug_env(log_dir / f"nccl-{plan.world}-rank{r}.log") if plan.cases[0]["backend"] == "nccl" else {}
            env = os.environ | nccl | dict(net.env) | {
                "RANK": str(r), "WORLD_SIZE": str(world_size),
                "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(world_size),
                "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1",
            }
            log = log_dir / f"{plan.world}-rank{r}.log"
            argv = net.wrap([sys.executable, "-m", "tpbench.worker", str(plan_path), "--event-fd", str(write_fd)])
            with open(log, "wb") as out:
                p = subprocess.Popen(
                    argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    pass_fds=(write_fd,), start_new_session=True, preexec_fn=_die_with_parent,
                )
            os.close(write_fd)
            self.procs.append(p)
            self.logs.append(log)
            self.readers[read_fd] = r

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        for fd in list(self.readers):
            os.close(fd)
        self.readers.clear()

    def log_tail(self, rank: int, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            text = self.logs[rank].read_text(errors="replace").strip().splitlines()
            return "\n".join(text[-lines:])
        return ""


def _exit_cause(rank: int, code: int) -> str:
    if code < 0:
        return f"rank {rank} was killed by {signal.Signals(-code).name}"
    return f"rank {rank} exited with code {code}"


class Supervisor:
    """Follows one world's events until it finishes, fails or hangs."""

    def __init__(self, world: World, cases: dict[str, Case], run: store.Run, listener: Listener,
                 interconnect: Interconnect | None = None) -> None:
        self.world = world
        self.interconnect = interconnect  # what the world asked for, to judge the observed transport
        self.cases = cases
        self.run = run
        self.listener = listener
        self.buffers: dict[int, bytes] = {fd: b"" for fd in world.readers}
        self.sel = selectors.DefaultSelector()
        for fd in world.readers:
            self.sel.register(fd, selectors.EVENT_READ)
        self.outcome = WorldOutcome()
        self.current: tuple[str, int, float] | None = None
        self.errors: list[dict[str, Any]] = []
        self.ready = False
        self.finished = False

    def _pump(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            fd = key.fd
            chunk = os.read(fd, 65536)
            if not chunk:
                self.sel.unregister(fd)
                continue
            self.buffers[fd] += chunk
            *lines, self.buffers[fd] = self.buffers[fd].split(b"\n")
            for line in lines:
                if line.strip():
                    self._handle(json.loads(line))

    def _handle(self, ev: dict[str, Any]) -> None:
        kind = ev["event"]
        if kind == "world_ready":
            self.ready = True
        elif kind == "repeat_start":
            self.current = (ev["case"], ev["repeat"], time.monotonic())
            self.run.set_case(ev["case"], store.RUNNING)
        elif kind == "repeat_end":
            self.outcome.completed.add((ev["case"], ev["repeat"]))
            self.current = None
        elif kind == "case_end":
            case = self.cases[ev["case"]]
            store.finish_case(self.run.dir, case.case_id, case.repeats)
            self.run.set_case(case.case_id, store.DONE)
        elif kind == "capture":
            self._record_capture(ev)
        elif kind == "error":
            self.errors.append(ev)
        elif kind == "world_done":
            self.finished = True
        self.listener(kind, ev)

    def _record_capture(self, ev: dict[str, Any]) -> None:
        """A case's telemetry summary, clock offsets and observed transport (judged against the
        asked profile) into its run.json entry."""
        cid = ev["case"]
        info: dict[str, Any] = {"nvml": ev["nvml"], "clock_sync": ev["clock_sync"]}
        if self.interconnect is not None:
            seen = ev["transport"]
            info["observed_transport"] = transport.summarize(self.interconnect, transport.from_dicts(seen["backend"], seen["ranks"]))
        self.run.set_case(cid, self.run.meta["cases"][cid]["status"], **info)

    def _fail(self, cause: str) -> WorldOutcome:
        """Decide what went wrong, then kill the world.

        A rank killed by a signal is the root cause even when its peers reported errors first:
        their errors ("connection reset by peer") are the consequence. Otherwise the first
        reported Python error wins, then the given cause (a non-zero exit, a hang).
        """
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline and self.sel.get_map():
            self._pump(0.05)
        killed = [(r, p.returncode) for r, p in enumerate(self.world.procs) if p.poll() is not None and p.returncode < 0]
        self.outcome.failed_case = self.current[0] if self.current else None
        if killed:
            self.outcome.cause = _exit_cause(*killed[0])
        elif self.errors:
            first = self.errors[0]
            tb = first["error"].strip().splitlines()
            self.outcome.failed_case = first.get("case") or self.outcome.failed_case
            self.outcome.cause = f"rank {first['rank']} raised {tb[-1] if tb else 'an error'}"
        else:
            self.outcome.cause = cause
        reports = [f"--- rank {e['rank']} error ---\n{e['error']}" for e in self.errors]
        tails = [f"--- rank {r} log (last lines) ---\n{self.world.log_tail(r)}" for r in range(self.world.world_size)]
        self.outcome.detail = "\n".join(reports + tails)
        self.world.kill()
        return self.outcome

    def supervise(self) -> WorldOutcome:
        started = time.monotonic()
        while True:
            self._pump(0.2)
            if self.errors:
                return self._fail("error")
            for r, p in enumerate(self.world.procs):
                code = p.poll()
                if code not in (None, 0):
                    return self._fail(_exit_cause(r, code))
            if all(p.poll() == 0 for p in self.world.procs):
                self._pump(0)
                if self.finished:
                    self.world.kill()
                    return self.outcome
                return self._fail("the world exited before finishing its plan")
            now = time.monotonic()
            if not self.ready and now - started > STARTUP_TIMEOUT_S:
                return self._fail(f"the world did not start within {STARTUP_TIMEOUT_S:.0f} s (rendezvous)")
            if self.current:
                cid, repeat, t0 = self.current
                limit = self.cases[cid].timeout_s
                if now - t0 > limit:
                    return self._fail(f"timed out after {limit:g} s in repeat {repeat} (a rank hung)")


def run_group(run: store.Run, group: LaunchGroup, user_interconnects: dict[str, Any], listener: Listener) -> None:
    """Run every pending repeat of a group's cases, restarting the world after each failure."""
    ic: Interconnect = resolve(group.key[3], user_interconnects)
    cases = {c.case_id: c for c in group.cases}
    done: set[tuple[str, int]] = set()
    for c in group.cases:
        done |= {(c.case_id, r) for r in store.finished_repeats(run.dir, c.case_id)}
    failed: set[str] = set()
    attempt = 0
    while True:
        live = [c for c in group.cases if c.case_id not in failed]
        schedule = interleave(live, done)
        if not schedule:
            return
        world_name = f"w{len(run.meta.setdefault('worlds', []))}"
        plan = Plan(
            run_dir=str(run.dir), world=world_name,
            cases=[c.params() for c in live if any(cid == c.case_id for cid, _ in schedule)],
            schedule=schedule, rendezvous_file=str(run.dir / "plans" / f"{world_name}.rdzv"),
        )
        plan_path = run.dir / "plans" / f"{world_name}.json"
        plan.save(plan_path)
        run.meta["worlds"].append({"world": world_name, "key": list(group.key), "items": len(schedule), "started": time.time()})
        run.save()
        listener("world_start", {"world": world_name, "world_size": group.world_size, "interconnect": ic.name, "items": len(schedule)})
        with world_network(ic) as net:
            world = World(plan, plan_path, group.world_size, net, run.dir / "logs")
            try:
                outcome = Supervisor(world, cases, run, listener, interconnect=ic).supervise()
            finally:
                world.kill()
        done |= outcome.completed
        attempt += 1
        if outcome.cause is None:
            continue
        targets = [outcome.failed_case] if outcome.failed_case else [c.case_id for c in live]
        for cid in targets:
            failed.add(cid)
            run.set_case(cid, store.FAILED, error=outcome.cause, detail=outcome.detail, failed_at=time.time())
            listener("case_failed", {"case": cid, "cause": outcome.cause})
