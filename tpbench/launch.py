"""Starting worlds of rank processes on this machine, and supervising them.

Cases that share a world (same world size, backend, device, interconnect) run in one set of
processes: the launcher writes them a plan, starts ``world_size`` workers once, and follows their
progress on a pipe per rank. Repeats are interleaved across the cases of a world (A1 B1 C1 A2 …)
so a drifting machine does not favour one case.

When a case crashes a rank or hangs past its ``timeout_s``, the launcher kills the whole world
(every rank runs in its own session and dies with the launcher via PDEATHSIG, so nothing is
orphaned), marks that case failed with its cause, and starts a fresh world for what is left. Every
repeat already finished is on disk, so nothing else is lost.

Under torchrun (``worlds.Torchrun``) a world is one torchrun job instead: one agent per node,
started by an optional prefix such as ``srun``, with ``--max-restarts 0``. Its ranks inherit no
pipe, so each appends its events to a file on the run directory's shared filesystem and the same
``Supervisor`` follows those files: progress, time-outs, failure attribution and the fresh world
for the rest work alike for both launchers. The worlds themselves, and how their processes are
started and ended, are in ``tpbench.worlds``; this module decides what runs in them and follows it.
"""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from tpbench import store
from tpbench.capture import transport
from tpbench.interconnect import Interconnect, resolve, world_network
from tpbench.plan import Plan
from tpbench.record import WorldRecord
from tpbench.suite import Case
from tpbench.user_code import user_frame
from tpbench.worlds import (
    DRAIN_S,
    Ended,
    EventFiles,
    RankLayout,
    Torchrun,
    TorchrunWorld,
    World,
    WorldProcesses,
    exit_cause,
    rank_layout,
    tail,
    torchrun_env,
    torchrun_layout,
)

Listener = Callable[[str, dict[str, Any]], None]


def exception_line(tb: str) -> str:
    """The first line of a formatted traceback's (last) exception: its type and what it says first.

    A traceback's last line is the end of a multi-line message (DDP's unused-parameter error ends
    "... as part of this error"), which names neither the exception nor its cause. The exception
    starts at the first unindented line after the last frame (frames and their source lines are
    indented); in a text without frames, its first unindented line.
    """
    lines = tb.strip().splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith("  File ")]
    after = lines[frames[-1] + 1 :] if frames else lines
    return next((line for line in after if line and not line[0].isspace()), "an error")


# DDP's error for a model with parameters no step uses; its advice names DDP's argument, which a
# suite sets by its own key.
_UNUSED_PARAMETERS = "find_unused_parameters=True"


def suite_hint(tb: str) -> str:
    """What the suite can set against a rank's error, where the error's advice is a DDP argument the
    suite has a key for (else ""): DDP's message tells how to construct DDP, which a suite's user
    does not do."""
    if _UNUSED_PARAMETERS in tb:
        return (
            "; the model has parameters that no step uses: set find_unused_parameters = true in the suite "
            "(with the ZeRO hooks, static_graph = true, if the same parameters go unused in every step)"
        )
    return ""


# Beside a timeout's cause: a healthy case on a busy or slow machine times out the same way as a hung
# one, and the cure for it is a larger timeout.
SLOWER = "; or it runs slower than that here: raise the suite's timeout_s"


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
    traced one), which no earlier pass runs, though passes outnumber rounds (some passes then run
    none of the case's rounds)."""
    if pass_number >= case.passes:
        return case.repeats
    return min(math.ceil(case.repeats * pass_number / case.passes), case.repeats - 1)


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
        self.stacks: list[tuple[str, str]] = []  # where each rank was when its repeat timed out
        # The machines the world spans (its ``world_ready``'s host names), by which Gloo's transport is judged:
        # ``lo`` on one, the network across several. Host names, not torchrun's node groups: agents
        # standing in for nodes on one machine (tests/test_cluster.py) leave Gloo on the host name's address.
        self.nnodes = 1

    def _pump(self, timeout: float) -> None:
        for ev in self.world.read_events(timeout):
            self._handle(ev)

    def _handle(self, ev: dict[str, Any]) -> None:
        kind = ev["event"]
        if self.overran:
            return  # the world is about to be killed; nothing after the overrun counts
        if kind == "world_ready":
            self.ready = True
            self.nnodes = max(1, len({n["hostname"] for n in ev["nodes"]}))
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
                self.overran = f"timed out after {limit:g} s in {self.current.what()} (it took {took:.1f} s{SLOWER})"
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
                self.interconnect, transport.from_dicts(seen["backend"], seen["ranks"]), self.nnodes
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
            self.outcome.cause = exit_cause(*killed[0])
            if self.tracing is not None:
                self.outcome.failed_case, self.outcome.died_tracing = self.tracing, True
        elif self.errors:
            first = self.errors[0]
            self.outcome.failed_case = first.get("case") or self.outcome.failed_case
            self.outcome.cause = (
                f"rank {first['rank']} raised {exception_line(first['error']).rstrip()}{user_frame(first['error'])}"
                f"{suite_hint(first['error'])}"
            )
        else:
            self.outcome.cause = cause
        reports = [f"--- rank {e['rank']} error ---\n{e['error']}" for e in self.errors]
        stacks = [f"--- {name} ---\n{text}" for name, text in self.stacks]
        tails = [f"--- {name} (last lines) ---\n{text}" for name, text in self.world.log_tails()]
        self.outcome.detail = "\n".join(reports + stacks + tails)
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
                self.stacks = self.world.stacks()
                return self._fail(
                    f"timed out after {limit:g} s in {self.current.what()} (a rank hung{SLOWER})", hung=True
                )


class RendezvousFailed(store.StoreError):
    """A torchrun world's agents cannot meet: the sweep stops (exit 3), its run interrupted with
    its finished cases kept, rather than each further world waiting out its start-up to fail its
    cases."""


def rendezvous_failed(run: store.Run, launcher: Torchrun, why: str, cure: str, slow: bool = False) -> RendezvousFailed:
    """The error naming the endpoint (or torchrun's ``--standalone``), what went wrong, what to do,
    and the resume that runs the rest: with another port of the same host when an endpoint was
    given, and (``slow``: a start that may only have been slow) a longer ``--rdzv-timeout``, which
    a resume may change (``cli.common.resumed_launcher``)."""
    resume = store.resume_command(run.dir)
    options = []
    if launcher.rendezvous_address():
        options.append(_another_port(launcher))
    if slow:
        options.append("--rdzv-timeout SECONDS")
    if options:
        resume += f" --launcher torchrun {' and/or '.join(options)}"
    where = f"--rdzv-endpoint {launcher.rdzv_endpoint}" if launcher.rdzv_endpoint else "torchrun --standalone"
    return RendezvousFailed(
        f"{where}: {why}; {cure}. The run's finished cases are kept; then run the rest with: {resume}"
    )


def check_endpoint(run: store.Run | None, launcher: Torchrun | None) -> None:
    """``RendezvousFailed`` when the rendezvous endpoint is on this machine and another program holds
    its port (``Torchrun.endpoint_held``). ``run`` None: a new run, checked before its directory is
    made (``sweep.start``), so that a refused sweep leaves no interrupted run without a finished case
    behind; the error then says to run the command again with another port. Else before the run's
    worlds start (a resume, each adaptive batch), naming the resume that runs its missing cases; a
    resume with no case to run starts no world and is not checked (``sweep.execute``)."""
    held = None if launcher is None else launcher.endpoint_held()
    if not held:
        return
    port = launcher.rendezvous_address()[1]
    cure = f"give another port, or stop what holds this one (ss -ltnp 'sport = :{port}' names it)"
    why = f"{held}, so torchrun's agents would never meet"
    if run is None:
        raise RendezvousFailed(
            f"--rdzv-endpoint {launcher.rdzv_endpoint}: {why}; {cure}. No run was started: run the same command "
            f"with {_another_port(launcher)}"
        )
    raise rendezvous_failed(run, launcher, why, cure)


def _another_port(launcher: Torchrun) -> str:
    """``--rdzv-endpoint HOST:OTHER_PORT`` for a launcher with a valid endpoint: its host (IPv6 in
    brackets), the port to be chosen."""
    host = launcher.rendezvous_address()[0]
    return f"--rdzv-endpoint {f'[{host}]' if ':' in host else host}:OTHER_PORT"


def never_met(run: store.Run, launcher: Torchrun, name: str, cause: str, world: TorchrunWorld) -> RendezvousFailed:
    """The error that stops a sweep whose torchrun world started no rank (``TorchrunWorld.never_met``).

    Rather than a fresh world, then its cases failed, and each further world waiting out the same
    rendezvous (twice, ``--rdzv-timeout`` each) to fail its cases too: nothing of it ran, so no case is to
    blame, and the next world would meet at the same endpoint."""
    said = world.agent_error()
    why = f"world {name}'s torchrun agents never met, and started no rank ({cause}{f': {said}' if said else ''})"
    checks = f"that the agents start (their output: {world.agent_log})"
    if address := launcher.rendezvous_address():
        checks = (
            f"that every node reaches {address[0]} on port {address[1]}, no other program holds it there, and {checks}"
        )
    cure = f"check {checks}; a start that is only slow needs a --rdzv-timeout above {launcher.rdzv_timeout_s:g} s"
    return rendezvous_failed(run, launcher, why, cure, slow=True)


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


def _record_whole(run: store.Run, cases: Iterable[Case], settled: set[str], done: set[tuple[str, int]]) -> set[str]:
    """Record done the cases not yet done whose every repeat is on disk, and return their ids. A sweep
    killed outright (SIGKILL, the OOM killer) after rank 0 wrote a case's last repeat, before the
    launcher recorded the case, leaves it so: no world has anything of it to run, and it stayed
    pending in a run then marked complete (the dry run's "only to record" was never done)."""
    whole = [c for c in cases if c.case_id not in settled and all((c.case_id, r) in done for r in range(c.repeats))]
    for case in whole:
        run.case_done(case.case_id, case.repeats)
    return {c.case_id for c in whole}


def _torchrun_world(
    run: store.Run, plan: Plan, plan_path: Path, launcher: Torchrun, world_size: int, ic: Interconnect
) -> TorchrunWorld:
    """A plan's world started as a torchrun job, its rendezvous named after the run and world."""
    env = torchrun_env(ic, launcher, plan, run.dir / "logs")
    rdzv_id = f"tpbench-{run.run_id}-{plan.world}"
    return TorchrunWorld(plan, plan_path, launcher, world_size, env, run.dir / "logs", rdzv_id=rdzv_id)


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
    status = run.case_status()
    # A case done in an earlier pass is merged: its parts are gone, and ``done`` would not know it.
    failed, finished = ({cid for cid in cases if status[cid] == s} for s in (store.FAILED, store.DONE))
    finished |= _record_whole(run, group.cases, failed | finished, done)
    retried, retraced = False, set[str]()  # a fresh world once for the machine; a trace's retry once per case
    size = group.world_size
    layout = rank_layout(os.sched_getaffinity(0), size) if launcher is None else torchrun_layout(launcher, size)
    while True:
        live = [c for c in group.cases if c.case_id not in failed | finished]
        schedule = interleave(live, done, through_pass)
        if not schedule:
            return False
        passed = {} if through_pass is None else {"sweep_pass": through_pass}
        plan, plan_path = _write_plan(run, group, schedule, launcher, layout, lockstep, steps_interleaved, **passed)
        started = {
            "world": plan.world,
            "world_size": group.world_size,
            "backend": ic.backend,
            "interconnect": ic.name,
            "items": len(schedule),
        }
        listener("world_start", started | passed)
        if launcher is None:
            try:
                with world_network(ic) as net:
                    world = World(plan, plan_path, group.world_size, net, run.dir / "logs", layout)
                    outcome = _supervise(world, cases, run, listener, ic)
            finally:  # Ctrl-C included: its ranks exit without closing the FileStore, which would remove it
                Path(plan.rendezvous_file).unlink(missing_ok=True)
        else:
            world = _torchrun_world(run, plan, plan_path, launcher, group.world_size, ic)
            outcome = _supervise(world, cases, run, listener, ic)
            if outcome.cause is not None and world.never_met():
                raise never_met(run, launcher, plan.world, outcome.cause, world)
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


def take_over_printed(run: store.Run) -> None:
    """Record as spent the printed worlds that never started (no events), whose pending cases the
    resume that calls this runs (or prints again) itself: their printed commands, started after
    all, then run nothing (``worker._spent``) rather than measure those cases a second time and
    write over their traces and tables."""
    for entry in _printed_not_recorded(run):
        if not printed_world_started(run, entry.world):
            run.world_ingested(entry.world)


def _printed_not_recorded(run: store.Run) -> list[WorldRecord]:
    """The run's worlds printed for the user to start (``--print``) that no resume has recorded yet."""
    return [entry for entry in run.record.worlds if entry.printed and not entry.ingested]


def printed_world_started(run: store.Run, world: str) -> bool:
    """Whether a printed world was started (by hand): its ranks write events files as they start."""
    return any((run.dir / "events" / world).glob("rank*.jsonl"))


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
        return [(f"rank {r} log", tail(log)) for r, log in enumerate(self.rank_logs)]

    def stacks(self) -> list[tuple[str, str]]:
        return []  # no process to ask

    def kill(self) -> None:
        pass


def check_printed(run: store.Run) -> None:
    """Read, recording nothing, the events files ``ingest_printed`` would read: a whole line that is
    not an event is refused as it is there (``event_line``: ``store.StoreError`` naming the file and
    line), so that ``sweep --resume --dry-run`` refuses what ``--resume`` refuses instead of listing
    the run's cases and exiting 0."""
    for entry in _printed_not_recorded(run):
        EventFiles(run.dir / "events" / entry.world).read()


def ingest_printed(
    run: store.Run, cases: dict[str, Case], user_interconnects: dict[str, Any], listener: Listener
) -> None:
    """Record what the printed worlds of a run did, from their events files, as if supervised:
    finished cases become done, a case that raised or was cut short becomes failed. A printed
    world with no events yet has not been started; it is left alone (its cases stay pending)."""
    for entry in _printed_not_recorded(run):
        if not printed_world_started(run, entry.world):
            continue
        world = PrintedWorldRecord(run.dir, entry.world, entry.world_size)
        plan = Plan.read(run.dir / "plans" / f"{entry.world}.json")
        planned = [cases[c["case_id"]] for c in plan.cases if c["case_id"] in cases]
        ic = resolve(entry.key[3], user_interconnects)
        outcome = Supervisor(world, {c.case_id: c for c in planned}, run, listener, interconnect=ic).supervise()
        if outcome.cause is not None:
            _record_failure(run, outcome, planned, listener)
        run.world_ingested(entry.world)
