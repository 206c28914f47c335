"""One rank: run a plan of cases (all repeats, interleaved) inside one world of processes.

Started by ``tpbench.launch`` (one process per rank, ``python -m tpbench.worker PLAN``) or by
``torchrun -m tpbench.worker PLAN``; rank and world come from the usual environment variables.
A plan is a list of cases plus the schedule of (case, repeat) items to run in this world. The
process group is created once for the whole plan: starting processes and rendezvous is by far the
most expensive thing on a small machine.

For each item: build the workload's model, wrap it with the case's algorithm, run untimed warm-up
steps, meet the other ranks at a barrier, run the timed steps, then gather every rank's step
times on rank 0, which persists the repeat. After a case's last repeat, a few more steps run
under torch.profiler so tracing never perturbs a timed step. A plan with ``steps_interleaved``
(``tpbench tune``) runs each round's items together: every arm built, then their steps in turn
(``CaseRunner.run_round``).

Progress and errors go to the launcher as JSON lines on an inherited file descriptor
(``--event-fd``), or under torchrun, which passes nothing on, appended to a file per rank that the
plan names (``events_dir``, on the run directory's shared filesystem). A rank that fails reports
the traceback and exits at once: the other ranks are probably blocked in a collective by then,
and only the launcher can tear the world down.

Under a lockstep gate (``tpbench gate``; the plan's ``lockstep`` socket) rank 0 asks the gate
before each item and the world runs it, or ends its plan, as told (``Turns``).

Right after the rendezvous the ranks exchange where they run (``gather_nodes``): post-local SGD
takes its node subgroups from the real nodes, and the launcher records every node in run.json.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import datetime as _dt
import faulthandler
import gc
import json
import math
import os
import signal
import socket
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pandas as pd
import torch
import torch.distributed as dist
from torch.profiler import record_function

from tpbench import accounting, capture, guards, lockstep, planted, store, workloads
from tpbench.analysis.stats import metric_columns, repeat_values, windows_of
from tpbench.analysis.trace_events import BURN_RANGE, FORWARD_RANGE
from tpbench.capture import machine_load, nvml, profiler, transport
from tpbench.comm_hooks import is_import_path
from tpbench.environment import fingerprint
from tpbench.plan import STACKS_SIGNAL, Plan
from tpbench.suite import Case
from tpbench.training import BuildContext, Training, build
from tpbench.workloads import WorkloadContext


@dataclass(frozen=True)
class Rank:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    # The node (torchrun agent) this rank runs on: torchrun's GROUP_RANK; 0 for the local launcher.
    node: int = 0

    @classmethod
    def from_env(cls) -> Rank:
        ws = int(os.environ.get("WORLD_SIZE", "1"))
        return cls(
            rank=int(os.environ.get("RANK", "0")),
            world_size=ws,
            local_rank=int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))),
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", str(ws))),
            node=int(os.environ.get("GROUP_RANK", "0")),
        )


class Events:
    """JSON-lines progress messages to the launcher; silent when there is no launcher listening.

    The local launcher hands each rank a pipe (``fd``). Under torchrun there is no pipe to
    inherit, so each rank appends to a file of its own (``path``) that the launcher follows; a
    file per rank because appends from several hosts to one file are not atomic on NFS. Each
    event is fsynced: a shared filesystem shows other hosts only what has been synced.
    """

    def __init__(self, fd: int | None = None, path: Path | None = None) -> None:
        self._sync = path is not None
        if fd is not None:
            self._f = os.fdopen(fd, "w", buffering=1)
        elif path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(path, "a", buffering=1)  # lives as long as the process
        else:
            self._f = None

    def emit(self, event: str, **data: Any) -> None:
        if self._f is not None:
            self._f.write(json.dumps({"event": event, "t": time.time(), **data}) + "\n")
            if self._sync:
                self._f.flush()
                os.fsync(self._f.fileno())


class StepTimer:
    """Wall time of one step (CUDA events + synchronize on GPU, perf_counter_ns on CPU) and the
    process's CPU time over the same span: every thread's, the training thread's and the
    communication threads' (Gloo's, NCCL's proxy), which is what a busy runner steals from.

    On CPU ranks also the forward pass's wall time (``forward_done``): compute that issues none of
    its step's collectives, so it tells how fast this host ran the timed steps whatever the link
    (the what-if sets a host's speed untraced against traced by it, ``whatif.forward_times``), and
    the training thread's own CPU time (``thread_ms``): its work without its waits, which a trace
    window's steps compare against to tell how much work the tracer added. NaN on GPU ranks, where
    the host's clock would time kernel launches, not the kernels."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        self._cpu0 = time.process_time_ns()
        self._t_forward: int | None = None
        if self.cuda:
            self._start.record()
        else:
            self._thread0 = time.thread_time_ns()
            self._t0 = time.perf_counter_ns()

    def forward_done(self) -> None:
        if not self.cuda:
            self._t_forward = time.perf_counter_ns()

    def forward_ms(self) -> float:
        """The forward pass's wall ms since ``start`` (NaN on GPU ranks, or before ``forward_done``)."""
        return math.nan if self._t_forward is None else (self._t_forward - self._t0) / 1e6

    def thread_ms(self) -> float:
        """The training thread's CPU ms since ``start`` (NaN on GPU ranks)."""
        return math.nan if self.cuda else (time.thread_time_ns() - self._thread0) / 1e6

    def cpu_s(self) -> float:
        """The process's CPU time since ``start``, in seconds."""
        return (time.process_time_ns() - self._cpu0) / 1e9

    def stop_ms(self) -> tuple[float, float]:
        """(wall ms, CPU ms) since ``start``."""
        if self.cuda:
            self._end.record()
            self._end.synchronize()
            wall = self._start.elapsed_time(self._end)
        else:
            wall = (time.perf_counter_ns() - self._t0) / 1e6
        return wall, (time.process_time_ns() - self._cpu0) / 1e6


class GcCounter:
    """Counts the garbage collections that start (a ``gc.callbacks`` entry), to show that none ran
    inside a timed step."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.count += 1


def _phase(profiled: bool, name: str) -> contextlib.AbstractContextManager:
    # Timed steps carry no record_function at all: zero instrumentation cost where we measure.
    return record_function(name) if profiled else contextlib.nullcontext()


def train_step(
    training: Training,
    workload,
    x: torch.Tensor,
    y: torch.Tensor,
    profiled: bool = False,
    forward_done: Callable[[], None] | None = None,
    backward_done: Callable[[], None] | None = None,
) -> torch.Tensor:
    """forward + backward + what the algorithm does after backward: the unit a step time measures.
    ``forward_done`` is called as the forward pass ends (``StepTimer.forward_done``);
    ``backward_done`` as backward ends, while the gradients are the comm hook's results (the
    algorithm may drop them after)."""
    with _phase(profiled, FORWARD_RANGE):
        loss = workload.loss(training.model(x), y)
    if forward_done is not None:
        forward_done()
    with _phase(profiled, "tpbench.backward"):
        loss.backward()
    if backward_done is not None:
        backward_done()
    with _phase(profiled, "tpbench.optimizer"):
        training.after_backward()
    if training.after_step is not None:
        with _phase(profiled, "tpbench.averaging"):
            training.after_step()
    return loss.detach()


def _reset_peak_rss() -> None:
    # Writing 5 to clear_refs resets VmHWM, so each case gets its own peak (Linux only).
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _peak_rss_mb() -> float:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def build_case(
    case: Case, rank: int, world_size: int, device: torch.device, nodes: tuple[tuple[int, ...], ...] | None = None
) -> tuple[Any, Training]:
    """The case's workload and its model wrapped by the case's algorithm, on this rank: what each
    repeat starts from (``benchmarks/round_noise.py`` builds its arms the same way)."""
    wl_cls = workloads.resolve(case.workload)
    workload = wl_cls(
        wl_cls.Params(**dict(case.workload_params)),
        WorkloadContext(
            rank=rank,
            world_size=world_size,
            batch_size=case.batch_size,
            seed=case.seed,
            device=device,
            ranks_per_node=case.ranks_per_node or world_size,
        ),
    )
    training = build(workload.build_model(), BuildContext(case, device, rank=rank, world_size=world_size, nodes=nodes))
    return workload, training


class _Repeat:
    """One case's repeat in progress on this rank: its model, and its steps' measurements so far.

    A round whose steps are interleaved (``CaseRunner.run_round``) holds one per arm and steps
    them in turn; a plain item holds one. Everything a step needs of its case (the planted
    slowdown, the injected fault, held-out evaluation) lives here, so that stepping arms in turn
    measures each exactly as it would be measured alone.
    """

    def __init__(self, runner: CaseRunner, case: Case, repeat: int) -> None:
        self.case, self.repeat = case, repeat
        rank = runner.rank.rank
        self.sampler = nvml.start_sampler(runner.gpu, case.nvml_interval_ms)
        self.workload, self.training = build_case(case, rank, runner.rank.world_size, runner.device, runner.nodes)
        self.timer = StepTimer(runner.device)
        fault_kind, _, fault_rank = case.fault.partition(":")
        mine = case.fault != "none" and int(fault_rank) == rank
        self.fault = fault_kind if mine and repeat == 0 and fault_kind in ("crash", "hang") else None
        self.aborts_tracing = mine and fault_kind == "abort-trace"
        self.slows_tracing = mine and fault_kind == "slow-trace"
        self.busies_tracing = mine and fault_kind == "busy-trace"
        self.step_ms: list[float] = []
        self.cpu_ms: list[float] = []
        self.forward_ms: list[float] = []  # CPU ranks: the forward pass's wall ms (StepTimer)
        self.thread_ms: list[float] = []  # CPU ranks: the training thread's CPU ms (StepTimer)
        self.gc_runs: list[int] = []
        self.losses: list[torch.Tensor] = []
        self.starts: list[float] = []  # perf_counter seconds at each step's start and end
        self.ends: list[float] = []
        self.extra: list[dict[str, float]] = []
        self.heldout = self.workload.heldout_batches() if case.eval_every else []
        self.slowed = planted.slowed(case, rank)
        self.burn = case.slowdown_pct / 100 if case.slowdown_kind == "cpu" and self.slowed else 0.0
        self.burned: list[float] = []  # seconds of CPU burnt per timed step
        self.delay_s = 0.0
        # A hook of the user's own has its results compared across the ranks (``guards.check_reduced``)
        # in the first warm-up step: untimed, and left out of the slowdown's calibration.
        self.checks_hook = is_import_path(case.comm_hook) and case.warmup_steps > 0
        self.hook_grads: tuple[float, float] | None = None

    def _fingerprint(self) -> None:
        self.hook_grads = guards.grad_fingerprint(self.training.model)

    def step(self, collections: GcCounter) -> None:
        """The case's next step (warm-up or timed), measured."""
        i, case = len(self.step_ms), self.case
        if i == case.warmup_steps:
            self.delay_s = planted.slowdown_s(case, self.step_ms) if self.slowed else 0.0
        if self.fault and i == case.warmup_steps + 1:
            planted.inject(self.fault)
        x, y = self.workload.train_batch(i)
        before = collections.count
        self.starts.append(time.perf_counter())
        self.timer.start()
        probe = self._fingerprint if self.checks_hook and i == 0 else None
        self.losses.append(
            train_step(self.training, self.workload, x, y, forward_done=self.timer.forward_done, backward_done=probe)
        )
        if self.delay_s:
            planted.delay(self.delay_s)
        elif self.burn and i >= case.warmup_steps:
            self.burned.append(self.timer.cpu_s() * self.burn)
            planted.burn(self.burned[-1])
        ms, cpu = self.timer.stop_ms()
        self.ends.append(time.perf_counter())
        # Below this line nothing counts as step time.
        self.thread_ms.append(self.timer.thread_ms())
        self.gc_runs.append(collections.count - before)
        row = self.training.metrics() if self.training.metrics else {}
        self.step_ms.append(ms - row.pop("untimed_ms", 0.0))
        self.cpu_ms.append(cpu - row.pop("untimed_cpu_ms", 0.0))
        self.forward_ms.append(self.timer.forward_ms())
        if self.heldout and (i + 1) % case.eval_every == 0:
            row["heldout_loss"] = _evaluate(self.training.model, self.workload, self.heldout)
        self.extra.append(row)


def _turn(arms: list[_Repeat], step: int) -> list[_Repeat]:
    """The order the arms take step ``step`` in: reversed every other step, so that no arm always
    steps first (right after the previous arm, or the barrier) over a repeat."""
    return arms if step % 2 == 0 else arms[::-1]


class CaseRunner:
    """Runs repeats of cases on this rank, within an initialized process group."""

    def __init__(
        self,
        rank: Rank,
        device: torch.device,
        run_dir: Path,
        events: Events,
        ctrl: dist.ProcessGroup,
        nodes: tuple[tuple[int, ...], ...] | None = None,
        hosts: tuple[tuple[int, ...], ...] | None = None,
        counts_first: bool = False,
    ) -> None:
        self.rank = rank
        self.device = device
        self.run_dir = run_dir
        self.events = events
        self.ctrl = ctrl
        self.nodes = nodes  # the ranks of each real node (see gather_nodes); None: one node
        self.hosts = hosts or nodes  # the ranks of each machine (hostname): whose CPU is the world's there
        self.gpu = nvml.open_gpu(device)  # once per process: nvmlInit is not free
        self.current: str | None = None  # the case being built, stepped or finished (a failure's case)
        # Where a case may be stopped before its last repeat (a tune, a lockstep gate: ``Plan.lockstep``),
        # its memory and DDP buckets are counted after its first instead (``_counts``).
        self.counts_first = counts_first

    def run_repeat(self, case: Case, repeat: int, profile_after: bool) -> pd.DataFrame | None:
        """One repeat; returns all ranks' rows on rank 0 (None elsewhere)."""
        return self.run_round([(case, repeat, profile_after)])[0]

    def run_round(self, items: list[tuple[Case, int, bool]]) -> list[pd.DataFrame | None]:
        """Repeats of one or more cases, ``(case, repeat, profile_after)``, with their steps
        interleaved: every arm built, then warmed up and timed step by step in turn (``_turn``).
        A drift of the machine slower than a few steps then slows every arm alike, which pairing
        by round cancels; repeats run one after the other would each see their own stretch of it
        (docs/tune.md, "Steps interleaved"). Returns each item's rows, all ranks', on rank 0
        (None elsewhere), in the order of ``items``.

        With more than one arm the process's memory peaks are the round's, not a case's: they are
        recorded as missing."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        _reset_peak_rss()
        arms = []
        for case, repeat, _ in items:
            self.current = case.case_id
            arms.append(_Repeat(self, case, repeat))
        collections = GcCounter()
        gc_was_enabled = gc.isenabled()
        gc.callbacks.append(collections)
        dist.barrier(group=self.ctrl)
        t_start = time.perf_counter()
        try:
            for i in range(max(a.case.warmup_steps for a in arms)):
                self._step([a for a in _turn(arms, i) if i < a.case.warmup_steps], collections)
            # No collection inside a timed step: one now, none until the timed steps end.
            gc.collect()
            gc.disable()
            load_start, cpu_start = self._machine_snapshot()
            for i in range(max(a.case.steps for a in arms)):
                self._step([a for a in _turn(arms, i) if i < a.case.steps], collections)
            load_end, cpu_end = self._machine_snapshot()
        finally:
            gc.callbacks.remove(collections)
            if gc_was_enabled:
                gc.enable()
        # Peaks are read before the profiled steps: the profiler's own buffers are not the case's.
        memory = {"peak_rss_mb": _peak_rss_mb(), **self._gpu_memory()}
        if len(arms) > 1:
            memory = dict.fromkeys(memory, float("nan"))
        window = (load_start, load_end, cpu_end - cpu_start)
        out = []
        for arm, (_, _, profile_after) in zip(arms, items):
            self.current = arm.case.case_id
            out.append(self._finish(arm, t_start, profile_after, memory, window))
        return out

    def _step(self, arms: list[_Repeat], collections: GcCounter) -> None:
        for arm in arms:
            self.current = arm.case.case_id
            arm.step(collections)

    def _finish(
        self, arm: _Repeat, t_start: float, profile_after: bool, memory: dict[str, float], window: tuple
    ) -> pd.DataFrame | None:
        """An arm's repeat after its timed steps: checked, traced on its case's last repeat, and
        gathered on rank 0, which writes its capture and returns every rank's rows."""
        case, repeat, training, workload = arm.case, arm.repeat, arm.training, arm.workload
        guards.check_finite(repeat, self.rank.rank, arm.losses, training.model)  # after the peaks: it allocates
        # Exact bytes and step work, once per case, after the timed steps.
        counts = self._counts(repeat, profile_after)
        counted = accounting.measure(training.model, training.optimizer, self.rank.rank) if counts else None
        spans = nvml.step_spans(arm.starts, arm.ends, case.warmup_steps)
        clock, trace_window = None, None
        if profile_after and case.profiler_steps > 0:
            # The launcher retries a case once whose rank dies by a signal from here on (launch.run_group).
            self.events.emit("trace_start", case=case.case_id, rank=self.rank.rank)
            if arm.aborts_tracing:
                planted.abort_once(self.run_dir, case.case_id, self.rank.rank)
            burn_s = statistics.median(arm.burned) if arm.burned else 0.0
            clock, profile_spans, trace_window = self._profile(case, arm, burn_s)
            spans += profile_spans
        mine = {
            "step_ms": arm.step_ms,
            "cpu_ms": arm.cpu_ms,
            "forward_ms": arm.forward_ms,
            "gc_collections": arm.gc_runs,
            "loss": torch.stack(arm.losses).float().cpu().tolist(),
            "elapsed_s": [e - t_start for e in arm.ends],
            "extra": arm.extra,
            "load_window": window,
            **memory,
            "capture": self._capture(case, repeat, arm.sampler, spans, clock, last=profile_after, window=trace_window),
            "accounting": counted,
            "hook_grads": arm.hook_grads,
        }
        gathered: list[Any] | None = [None] * self.rank.world_size if self.rank.rank == 0 else None
        dist.gather_object(mine, gathered, dst=0, group=self.ctrl)
        if gathered is None:
            return None
        fingerprints = [m.pop("hook_grads") for m in gathered]
        if arm.checks_hook:
            guards.check_reduced(case.comm_hook, repeat, fingerprints)
        _machine_loads(gathered, self.hosts)
        captures = [m.pop("capture") for m in gathered]
        accounts = [m.pop("accounting") for m in gathered]
        capture.write_repeat(self.run_dir, case.case_id, repeat, captures)
        if profile_after:
            info = capture.case_info(self.run_dir, case.case_id, case.nvml_interval_ms, case.backend, captures)
            self.events.emit("capture", case=case.case_id, **info)
        if counts:
            accounting.write(self.run_dir, case.case_id, accounts)
            accounting.write_ddp_buckets(self.run_dir, case.case_id, training.model)
        rows = _rows(case, repeat, gathered)
        if workload.optimal_loss is not None:
            rows["optimal_loss"] = workload.optimal_loss
        return rows

    def _counts(self, repeat: int, last: bool) -> bool:
        """Whether this repeat counts its case's memory and DDP buckets: the last, or the first where
        the case may be stopped before its last (``counts_first``). Counted on the last alone, a tune's
        eliminated and retired arms had none: of zero.toml's 18 settings the report's What ZeRO saves
        showed the 5 that ran every round, its best and worst over those, and said nothing of the 13.
        The figures are the same after any repeat's timed steps: each repeat builds its model anew."""
        return repeat == 0 if self.counts_first else last

    def _machine_snapshot(self) -> tuple[machine_load.CpuSnapshot | None, float]:
        """/proc/stat read by each node's local rank 0 while every other rank of the world waits
        at a barrier (so that its runnable tasks are the machine's others; None on other ranks),
        and this rank's own CPU time, read by every rank as the barrier releases it. Ends with the
        ranks together, as a repeat's timed steps must start."""
        dist.barrier(group=self.ctrl)
        own = machine_load.own_cpu_s()
        snap = None
        if self.rank.local_rank == 0:
            time.sleep(machine_load.SETTLE_S)
            snap = machine_load.snapshot()
        dist.barrier(group=self.ctrl)
        return snap, own

    def _capture(
        self,
        case: Case,
        repeat: int,
        sampler: nvml.Sampler | None,
        spans: list[nvml.Span],
        clock: nvml.ClockSync | None,
        last: bool,
        window: capture.TraceWindow | None = None,
    ) -> capture.RankCapture:
        """This rank's telemetry for the repeat; on a case's last repeat also the transport it used
        and how its trace window went."""
        cap = capture.RankCapture(self.rank.rank, capture.nvml_status(self.gpu), clock=clock, trace=window)
        if sampler is not None:
            cap.samples = nvml.samples_frame(self.gpu, sampler.stop(), spans, self.rank.rank, repeat)
            cap.sampler_error = sampler.error
        if last:
            cap.transport = transport.observe(case.backend, self.rank.rank)
        return cap

    def _gpu_memory(self) -> dict[str, float]:
        if self.device.type != "cuda":
            return {}
        return {
            "peak_allocated_mb": torch.cuda.max_memory_allocated(self.device) / 2**20,
            "peak_reserved_mb": torch.cuda.max_memory_reserved(self.device) / 2**20,
        }

    def _profile(
        self, case: Case, arm: _Repeat, burn_s: float
    ) -> tuple[nvml.ClockSync | None, list[nvml.Span], capture.TraceWindow]:
        """``profiler_steps`` traced steps after the timed ones (see ``capture.profiler``), slowed
        as the timed steps were: the same delay, or the timed steps' median burn (``burn_s``; not
        a share of the traced step's CPU time, which the profiler inflates), in its own trace
        range. The traces must show what the timed steps measured, or ``tpbench explain`` could
        not say where a planted slowdown went.

        On CPU ranks a window in which the host ran much slower than in the timed steps is traced
        again (``capture.retrace``), and the best window kept: the what-if builds its model from
        these steps, and a window the machine disturbed (a neighbour, the hypervisor) would carry
        that disturbance into every projection. The forward pass (it issues no collective), the step
        and the training thread's CPU time (its work without its waits) tell; the ranks agree on the
        slowest rank's speeds, as every rank must trace the same steps and keep the same window."""
        training, workload = arm.training, arm.workload
        timed = slice(case.warmup_steps, None)
        # The forward pass's, the step's and the training thread's CPU ms: timed medians, traced per step.
        timed_ms = [statistics.median(x[timed]) for x in (arm.forward_ms, arm.step_ms, arm.thread_ms)]
        forward_s, step_s, thread_s = traced_s = ([], [], [])
        slowing, busy = arm.slows_tracing, arm.busies_tracing

        def run_step(step: int) -> None:
            x, y = workload.train_batch(step)
            c0, t0 = time.thread_time(), time.perf_counter()
            train_step(
                training, workload, x, y, profiled=True, forward_done=lambda: forward_s.append(time.perf_counter() - t0)
            )
            if busy:  # Test-only fault ``busy-trace:RANK``: five times the step's timed CPU time and 5 ms more.
                planted.burn((5 * timed_ms[2] + 5) / 1e3)
            if arm.delay_s:
                planted.delay(arm.delay_s)  # a wait: no range, so the trace shows it as what it is (idle)
            elif burn_s:
                with record_function(BURN_RANGE):  # CPU work of the training thread: compute
                    planted.burn(burn_s)
            step_s.append(time.perf_counter() - t0)
            thread_s.append(time.thread_time() - c0)

        out = store.trace_dir(self.run_dir, case.case_id) / f"rank{self.rank.rank}.json.gz"
        for stale in out.parent.glob(f"rank{self.rank.rank}.window*.json.gz"):  # a world killed while it traced
            stale.unlink()
        windows: list[tuple[nvml.ClockSync | None, list[nvml.Span], Path]] = []
        speeds, scores = [], []
        cpu = self.device.type == "cpu"  # GPU ranks time none of the three here
        while True:
            for x in traced_s:
                x.clear()
            # Test-only fault ``slow-trace:RANK``: this rank's forward passes slowed in the first window.
            hook = training.model.register_forward_pre_hook(planted.slow_forward(timed_ms[0])) if slowing else None
            path = out.with_name(f"rank{self.rank.rank}.window{len(windows)}.json.gz")
            # Each window goes on training (a warm-up step and the traced ones): its steps' batches and
            # NVML samples are numbered as the model took them, as an averaging period counts them.
            first = case.warmup_steps + case.steps + len(windows) * (case.profiler_steps + 1)
            clock, spans = profiler.trace_steps(run_step, case.profiler_steps, first, self.device, path)
            windows.append((clock, spans, path))
            if hook is not None:
                hook.remove()
                slowing = False
            busy = False
            # The first step is the profiler's warm-up, untraced.
            mine = [
                capture.speed(t, statistics.median(x[1:]) * 1e3) if cpu else math.nan
                for t, x in zip(timed_ms, traced_s)
            ]
            speeds.append(self._slowest(mine))
            scores.append(capture.window_score(*speeds[-1]))
            if not capture.retrace(scores, case.trace_windows):
                break
            if self.rank.rank == 0:  # the window about to be traced, from 1; the capture event says which was kept
                self.events.emit("trace_retake", case=case.case_id, window=len(windows) + 1)
        kept = capture.kept_window(scores)
        for k, (_, _, path) in enumerate(windows):
            if k == kept:
                os.replace(path, out)
            else:
                path.unlink()
        clock, spans, _ = windows[kept]
        forward, steps, threads = (_json_numbers(list(x)) for x in zip(*speeds))
        return clock, spans, capture.TraceWindow(len(windows), kept, forward, steps, threads)

    def _slowest(self, speeds: list[float]) -> list[float]:
        """Each of ``speeds``, the lowest over the world's ranks (every rank gets them; NaN where
        no rank measured it)."""
        t = torch.tensor([x if x == x else math.inf for x in speeds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.ctrl)
        return [x if x < math.inf else math.nan for x in t.tolist()]


def _json_numbers(values: list[float]) -> tuple[float | None, ...]:
    """NaN as None: run.json is strict JSON."""
    return tuple(x if x == x else None for x in values)


@torch.no_grad()
def _evaluate(model: torch.nn.Module, workload, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Mean held-out loss of this rank's replica (ranks may differ under local SGD)."""
    was_training = model.training
    model.eval()
    # The DDP wrapper would sync buffers / prepare a backward that never comes; use the module.
    module = getattr(model, "module", model)
    total = sum(float(workload.loss(module(x), y)) for x, y in batches)
    model.train(was_training)
    return total / len(batches)


def _machine_loads(gathered: list[dict[str, Any]], hosts: tuple[tuple[int, ...], ...] | None) -> None:
    """Turn each rank's ``load_window`` into its load columns (``machine_load.over_window``): on
    each machine the reader's snapshots less the CPU of the world's ranks on that machine only
    (``hosts``: ranks per hostname; None: all on one), NaN on the other ranks' rows."""
    windows = [m.pop("load_window") for m in gathered]
    for ranks in hosts or (tuple(range(len(gathered))),):
        world_cpu_s = sum(windows[r][2] for r in ranks)
        for r in ranks:
            gathered[r] |= machine_load.over_window(windows[r][0], windows[r][1], world_cpu_s)


def _rows(case: Case, repeat: int, gathered: list[dict[str, Any]]) -> pd.DataFrame:
    frames = []
    for r, m in enumerate(gathered):
        n = len(m["step_ms"])
        frame = {
            "repeat": repeat,
            "rank": r,
            "step": range(n),
            "phase": ["warmup" if i < case.warmup_steps else "timed" for i in range(n)],
            "step_ms": m["step_ms"],
            "loss": m["loss"],
            "elapsed_s": m["elapsed_s"],
        }
        extra = pd.DataFrame(m["extra"], index=range(n))
        frame |= {k: v for k, v in m.items() if k not in frame and k != "extra"}
        frames.append(pd.concat([pd.DataFrame(frame), extra], axis=1))
    return pd.concat(frames, ignore_index=True)


def _device(rank: Rank, case_device: str) -> torch.device:
    if case_device == "cuda":
        # Several Gloo ranks may share one GPU; NCCL ranks get one each (the suite checks that).
        index = rank.local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


@contextlib.contextmanager
def _world(plan: Plan, rank: Rank, backend: str, timeout_s: float) -> Iterator[dist.ProcessGroup]:
    timeout = _dt.timedelta(seconds=timeout_s)
    if plan.rendezvous_file:
        # A FileStore built from the path itself, never a file:// URL: a '#', '?' or newline in
        # the results path would be parsed as URL syntax and point the ranks at another file.
        rdzv = dist.FileStore(plan.rendezvous_file, rank.world_size)
        dist.init_process_group(backend, store=rdzv, rank=rank.rank, world_size=rank.world_size, timeout=timeout)
    else:
        dist.init_process_group(
            backend, init_method="env://", rank=rank.rank, world_size=rank.world_size, timeout=timeout
        )
    # Barriers and result gathering use a Gloo group of their own, so they never queue behind
    # (or show up among) the measured collectives.
    yield dist.new_group(backend="gloo")


@dataclass(frozen=True)
class Node:
    """One machine of a world (one torchrun agent), as its ranks reported it."""

    node: int
    hostname: str
    ranks: list[int]
    fingerprint: dict[str, Any]


def gather_nodes(rank: Rank, ctrl: dist.ProcessGroup) -> list[Node]:
    """The world's real layout, known to every rank: which ranks share each node, and each node's
    environment fingerprint (taken once per node, by its local rank 0).

    Post-local SGD builds its intra-node subgroups from it, and the launcher records it in
    run.json: under torchrun the sweeping process sees only its own machine. A collective over
    ``ctrl``.
    """
    mine = {
        "node": rank.node,
        "hostname": socket.gethostname(),
        "fingerprint": fingerprint() if rank.local_rank == 0 else None,
    }
    everyone: list[Any] = [None] * rank.world_size
    dist.all_gather_object(everyone, mine, group=ctrl)
    nodes: dict[int, Node] = {}
    for r, info in enumerate(everyone):
        node = nodes.setdefault(info["node"], Node(info["node"], info["hostname"], [], {}))
        node.ranks.append(r)
        node.fingerprint.update(info["fingerprint"] or {})
    return [nodes[k] for k in sorted(nodes)]


def _threads(rank: Rank) -> int:
    """Intra-op threads: the number the launcher chose for every rank of the world
    (``OMP_NUM_THREADS``: one per core of a pinned rank's block, else its share of the cores),
    else this rank's share of the cores it may run on."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    return max(1, len(os.sched_getaffinity(0)) // rank.local_world_size)


def _check_world(rank: Rank, case: Case) -> None:
    """A plan started with another layout than it was written for (a hand-typed torchrun
    command) fails before the rendezvous, saying what to start."""
    if case.world_size != rank.world_size:
        raise ValueError(
            f"this world has {rank.world_size} ranks but its plan's cases need {case.world_size}: "
            f"start torchrun with --nnodes x --nproc-per-node = {case.world_size}"
        )


class Turns:
    """This world's side of a lockstep gate (``tpbench.lockstep``); permits everything without one.

    Rank 0 asks the gate before each item and tells the other ranks the answer over the control
    group, so the whole world runs the item or the whole world ends its plan. The wait happens
    before ``repeat_start``: the launcher's per-repeat time-out does not run while the other side
    measures.
    """

    def __init__(self, plan: Plan, rank: Rank, ctrl: dist.ProcessGroup) -> None:
        self.ctrl = ctrl
        self.enabled = plan.lockstep is not None
        self.client = lockstep.GateClient(plan.lockstep) if self.enabled and rank.rank == 0 else None
        self.metric = "step_ms"
        # Told to skip an item or to stop: the world ends as a stopped one, its cases cut short.
        self.cut = False

    def answer(self, case_id: str, repeat: int) -> str:
        """GO, SKIP (this item only) or STOP (the rest of the plan), the same on every rank."""
        if not self.enabled:
            return lockstep.GO
        answer = [None]
        if self.client is not None:
            reply = self.client.ask(case_id, repeat)
            self.metric = reply.get("metric", self.metric)
            answer = [reply["msg"]]
        dist.broadcast_object_list(answer, src=0, group=self.ctrl)
        self.cut |= answer[0] != lockstep.GO
        return answer[0]

    def done(self, case: Case, repeat: int, rows: pd.DataFrame, began: float) -> None:
        """Tell the gate the item is over, with its value of the gate's metric and when it began
        (``began``) and ended on this clock; where the repeat recorded no such column, the columns
        it did record instead, so that a misspelt ``--metric`` ends the gate after one item."""
        if self.client is None:
            return
        if self.metric not in rows.columns:
            self.client.done(case.case_id, repeat, None, began, time.time(), recorded=metric_columns(rows))
            return
        values = repeat_values(
            rows.assign(case_id=case.case_id), self.metric, windows_of({case.case_id: case.params()})
        )
        value = float(values[self.metric].iloc[0]) if len(values) else None
        self.client.done(case.case_id, repeat, value, began, time.time())


def _batches(plan: Plan) -> list[list[tuple[str, int]]]:
    """The plan's items as the world runs them: one at a time, or, with ``steps_interleaved``,
    each round's (the consecutive items of one repeat index) together."""
    batches: list[list[tuple[str, int]]] = []
    for item in plan.schedule:
        if plan.steps_interleaved and batches and batches[-1][-1][1] == item[1]:
            batches[-1].append(item)
        else:
            batches.append([item])
    return batches


def _run_batch(
    runner: CaseRunner, plan: Plan, cases: dict[str, Case], items: list[tuple[str, int]], gate: Turns, events: Events
) -> None:
    """Run a batch of items (one, or a round's with their steps interleaved) and persist each on rank 0."""
    rank0 = runner.rank.rank == 0
    if rank0 and len(items) == 1:
        events.emit("repeat_start", case=items[0][0], repeat=items[0][1])
    elif rank0:
        events.emit("round_start", items=[list(item) for item in items])
    began = time.time()
    rows = runner.run_round([(cases[cid], r, r == cases[cid].repeats - 1) for cid, r in items])
    if not rank0:
        return
    for (case_id, repeat), found in zip(items, rows):
        case = cases[case_id]
        store.write_repeat(Path(plan.run_dir), case_id, repeat, found)
        value = repeat_values(found.assign(case_id=case_id), windows=windows_of({case_id: case.params()}))
        events.emit("repeat_end", case=case_id, repeat=repeat, median_ms=float(value["step_ms"].iloc[0]))
        if repeat == case.repeats - 1:
            events.emit("case_end", case=case_id)
        gate.done(case, repeat, found, began)


def run_plan(plan: Plan, events: Events) -> None:
    rank = Rank.from_env()
    cases = {c["case_id"]: Case.from_params(c) for c in plan.cases}
    first = next(iter(cases.values()))
    try:
        _check_world(rank, first)
    except ValueError:
        events.emit("error", case=None, repeat=None, rank=rank.rank, error=traceback.format_exc())
        os._exit(1)
    torch.set_num_threads(_threads(rank))
    device = _device(rank, first.device)
    # Longer than the launcher's per-case limit, so a hang is reported by the launcher as a hang of
    # that case rather than by Gloo as a receive timeout on whichever rank waited.
    timeout = 2 * max(c.timeout_s for c in cases.values()) + 60
    with _world(plan, rank, first.backend, timeout) as ctrl:
        nodes = gather_nodes(rank, ctrl)
        hosts = {n.hostname: () for n in nodes}
        for n in nodes:
            hosts[n.hostname] += tuple(n.ranks)
        runner = CaseRunner(
            rank,
            device,
            Path(plan.run_dir),
            events,
            ctrl,
            nodes=tuple(tuple(n.ranks) for n in nodes),
            hosts=tuple(hosts.values()),
            counts_first=plan.lockstep is not None,
        )
        if rank.rank == 0:
            events.emit("world_ready", world=plan.world, nodes=[dataclasses.asdict(n) for n in nodes])
        gate = Turns(plan, rank, ctrl)
        torch_state = guards.torch_state()
        for batch in _batches(plan):
            try:
                answers = [(item, gate.answer(*item)) for item in batch]
                go = [item for item, answer in answers if answer == lockstep.GO]
                if go:
                    _run_batch(runner, plan, cases, go, gate, events)
                    guards.check_torch_state(torch_state)
                if any(answer not in (lockstep.GO, lockstep.SKIP) for _, answer in answers):
                    break
            except BaseException:  # the user's code may raise SystemExit or KeyboardInterrupt: its case's failure
                case_id = runner.current or batch[0][0]
                repeat = dict(batch)[case_id]
                events.emit("error", case=case_id, repeat=repeat, rank=rank.rank, error=traceback.format_exc())
                os._exit(1)
        if gate.cut and rank.rank == 0:
            events.emit("stopped", world=plan.world)
        dist.barrier(group=ctrl)
        if rank.rank == 0:
            events.emit("world_done", world=plan.world)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m tpbench.worker", description="Run one rank of a tpbench plan.")
    ap.add_argument("plan", type=Path)
    ap.add_argument("--event-fd", type=int, default=None)
    args = ap.parse_args(argv)
    plan = Plan.read(args.plan)
    if plan.events_dir is not None and (spent := _spent(plan)):
        print(f"python -m tpbench.worker {args.plan}: {spent}", file=sys.stderr, flush=True)
        sys.exit(2)
    events = _torchrun_rank(plan) if plan.events_dir is not None else Events(args.event_fd)
    # Asked by the launcher when a repeat times out, a rank writes where it is to its log
    # (``worlds.World.stacks``), from a signal handler: a rank blocked in a collective too.
    faulthandler.register(STACKS_SIGNAL, all_threads=True)
    run_plan(plan, events)
    sys.stdout.flush()
    sys.stderr.flush()
    # destroy_process_group() can hang on Gloo once subgroups exist; everything is written by now.
    os._exit(0)


def _spent(plan: Plan) -> str | None:
    """Why a world printed by ``sweep --print`` must not run (None: it may). Once ``--resume`` has
    recorded such a world (its events read back, or its cases taken over because it had not
    started), its printed command is spent: started again, from a shell's history say, its ranks
    would measure finished cases a second time and write over their traces and tables."""
    try:
        worlds = store.read_record(Path(plan.run_dir)).worlds
    except store.StoreError:
        return None  # no readable run.json to tell: the plan runs as it always did
    entry = next((w for w in worlds if w.world == plan.world), None)
    if entry is None or not entry.printed or entry.ingested is None:
        return None
    when = _dt.datetime.fromtimestamp(entry.ingested).isoformat(timespec="seconds")
    return (
        f"world {plan.world} of {plan.run_dir} was recorded by `tpbench sweep --resume` at {when} (what this "
        "command ran read back, or its cases taken over to run there): nothing to run; what the run still misses, "
        f"`tpbench sweep --resume {plan.run_dir}` runs (add --print for new commands)"
    )


def _torchrun_rank(plan: Plan) -> Events:
    """Set up a rank that torchrun started: die with its agent (SIGKILL via PDEATHSIG, so that
    killing an agent never leaves a rank behind), write output where the local launcher's ranks
    write theirs, and report through this rank's events file."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    rank = int(os.environ["RANK"])
    log = Path(plan.run_dir) / "logs" / f"{plan.world}-rank{rank}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return Events(path=Path(plan.events_dir) / f"rank{rank}.jsonl")


if __name__ == "__main__":
    main()
