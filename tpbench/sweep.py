"""A sweep from end to end: suite → cases → worlds → store → summary (→ report, by the caller).

``run`` is the library function behind ``tpbench sweep`` (a new sweep, a resumed one, an adaptive
one, or worlds printed for torchrun); the CLI only parses arguments and shows progress through the
``Progress`` it passes. Nothing here prints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping

import pandas as pd

from tpbench import compare, record, store
from tpbench.algorithms import world_group_size
from tpbench.analysis import bandwidth, convergence, overlap, timeline
from tpbench.analysis.memory import per_case
from tpbench.analysis.stats import CONFIDENCE, slowest_rank, spent_confidence, summarize
from tpbench.analysis.trace_events import TraceUnreadable
from tpbench.environment import fingerprint
from tpbench.interconnect import (
    Interconnect,
    InterconnectUnavailable,
    check_available,
    reap_stale_namespaces,
    resolve,
)
from tpbench.launch import (
    Listener,
    PrintedWorld,
    check_endpoint,
    check_printed,
    group_cases,
    ingest_printed,
    print_group,
    printed_world_started,
    run_group,
    take_over_printed,
)
from tpbench.suite import (
    Case,
    Machine,
    Suite,
    expand_noting_unused,
    load,
    refuse_repeated_sets,
    select,
    unused_workload_tables,
    with_overrides,
)
from tpbench.worlds import Torchrun


@dataclass(frozen=True)
class Prepared:
    """A suite's cases, and the ``--set`` and ``--filter`` that made them (run.json keeps them);
    ``unused_workloads``: the ``[workloads.NAME]`` tables no case of the suite runs (before
    ``--filter``, which may leave out a workload on purpose), for validate and dry runs to warn of;
    ``unused_defaults``: the ``[defaults]`` keys no case uses, with why (``expand_noting_unused``)."""

    suite: Suite
    cases: list[Case]
    overrides: tuple[str, ...] = ()
    filters: tuple[str, ...] = ()
    unused_workloads: tuple[str, ...] = ()
    unused_defaults: tuple[str, ...] = ()


def prepare(
    suite_path: str | Path,
    overrides: Iterable[str] = (),
    filters: Iterable[str] = (),
    launcher: Torchrun | None = None,
    allow_large: bool = False,
) -> Prepared:
    """Load, override, validate and expand a suite; raises ``SuiteError`` before anything runs.

    Under torchrun "auto" sizes resolve against the torchrun layout (``--nnodes`` x
    ``--nproc-per-node``), and cases that cannot have that layout are refused. Worlds and sweeps
    far beyond this machine are refused unless ``allow_large``.
    """
    overrides, filters = tuple(overrides), tuple(filters)
    refuse_repeated_sets(overrides)
    suite = with_overrides(load(suite_path), overrides)
    machine = Machine.detect(limited=not allow_large)
    if launcher is not None:
        # Its layout is the user's explicit choice, on machines this one cannot see.
        machine = dataclasses.replace(
            machine, nnodes=launcher.nnodes, nproc_per_node=launcher.nproc_per_node, max_ranks=None
        )
    # A value --set gave that only the expansion refuses (an unknown algorithm, interconnect or
    # workload) is said "with --set", as the keys validated before it are: the file holds no such value.
    said = dataclasses.replace(suite, path=f"{suite.path} (with --set)") if overrides else suite
    expanded, unused = expand_noting_unused(said, machine)
    cases = select(expanded, filters, where=str(suite.path))
    return Prepared(suite, cases, overrides, filters, tuple(unused_workload_tables(suite, expanded)), tuple(unused))


# What a case writes, for the free-space check. Measured on the shipped suites: the largest case
# directory of `make sweep` (suites/zero.toml, gpt mini, 3 traced steps x 2 ranks) held 0.94 MB,
# about 156 KiB per traced step and rank with its derived tables, and a step row takes about 200
# bytes; rounded up, since bigger models trace more kernels. Once a case of the run has finished,
# its size replaces the estimate where it is larger.
TRACE_BYTES_PER_RANK_STEP = 256 * 1024
STEP_ROW_BYTES = 256
CASE_BASE_BYTES = 64 * 1024


def case_estimate(case: Case) -> int:
    """Bytes one case will write: its traces, its step rows and a little for the rest."""
    rows = case.repeats * (case.warmup_steps + case.steps) * STEP_ROW_BYTES
    return CASE_BASE_BYTES + case.world_size * (case.profiler_steps * TRACE_BYTES_PER_RANK_STEP + rows)


def check_space(root: Path, cases: list[Case], largest_done: int = 0) -> None:
    """Refuse to run ``cases`` when ``root``'s filesystem cannot hold them (see ``case_estimate``;
    ``largest_done``: the largest case directory this run has written, a better estimate)."""
    need = sum(max(case_estimate(c), largest_done) for c in cases)
    why = f"{len(cases)} case(s): traced steps x ranks x {TRACE_BYTES_PER_RANK_STEP // 1024} KiB, step rows"
    if largest_done:
        why += f", or the largest finished case ({largest_done / 2**20:.1f} MiB)"
    store.check_space(root, need, why)


def _largest_done(run: store.Run) -> int:
    return max((store.case_bytes(run.dir, cid) for cid, st in run.case_status().items() if st == store.DONE), default=0)


def launchable(prepared: Prepared, launcher: Torchrun | None) -> list[Interconnect]:
    """The cases' interconnects, in the order of their first cases, or ``InterconnectUnavailable``
    for one ``launcher`` or this machine cannot give: an emulated link lives in a network namespace
    of one machine, which torchrun worlds (the real network between their nodes) do not use, and
    which needs root, iproute2 and tbf (``check_available``). The error names the suite file and,
    for a profile of the suite's own, its ``rate`` key. Dry runs and ``validate`` check it too, so
    that they do not list cases the run would refuse."""
    suite = prepared.suite
    ics = [resolve(key[3], suite.interconnects) for key in dict.fromkeys(c.launch_key for c in prepared.cases)]
    for ic in ics:
        if launcher is not None and ic.shaped:
            raise InterconnectUnavailable(
                f"interconnect {ic.name!r} emulates a link in a network namespace of one machine; torchrun worlds "
                "use the real network between their nodes: run it with the local launcher"
            )
        try:
            check_available(ic)
        except InterconnectUnavailable as e:
            key = f"interconnects.{ic.name}.rate: " if ic.name in suite.interconnects else ""
            raise InterconnectUnavailable(f"{suite.path}: {key}{e}") from None
    return ics


def start(prepared: Prepared, out_root: Path, launcher: Torchrun | None = None, print_only: bool = False) -> store.Run:
    """Create the run directory (checked writable) with every case pending, and the launcher
    recorded so that ``--resume`` starts worlds the same way. A rendezvous port of this machine that
    another program holds is refused first (``check_endpoint``), not with the run made and at once
    interrupted, no case finished; but for ``print_only``, whose worlds the user starts later,
    when what holds the port may have let it go (their resume checks it then)."""
    launchable(prepared, launcher)
    if not print_only:
        check_endpoint(None, launcher)
    store.check_writable(out_root)
    check_space(out_root, prepared.cases)
    s = prepared.suite
    return store.Run.create(
        out_root,
        s.name,
        s.path,
        s.text,
        [c.params() for c in prepared.cases],
        fingerprint(),
        launcher_entry(launcher),
        prepared.overrides,
        prepared.filters,
    )


def launcher_entry(launcher: Torchrun | None) -> dict[str, Any]:
    """A launcher as run.json keeps it (``launcher_of`` reads it back)."""
    return {"name": "torchrun", **asdict(launcher)} if launcher else {"name": "local"}


def launcher_of(run: record.RunRecord) -> Torchrun | None:
    """The launcher a run (its record) was started with (None: local)."""
    launcher = run.launcher
    if launcher.name == "local":
        return None
    spec = dict(launcher.options)
    return Torchrun(**{**spec, "agent_prefix": tuple(spec.get("agent_prefix", ()))})


def resumed_with(run: store.Run, launcher: Torchrun | None | Literal["recorded"]) -> Torchrun | None:
    """The launcher a resume starts ``run``'s worlds with (``RECORDED``: the run's own), recorded as
    the run's where it differs (a new allocation's ``--rdzv-endpoint`` or ``--agent-prefix``): the
    interrupt's line of a run across nodes says a bare ``--resume`` goes on "in the same
    allocation", and it reused the first allocation's rendezvous, gone by then, its worlds waiting
    out their start-up."""
    if launcher == RECORDED:
        return launcher_of(run.record)
    if launcher != launcher_of(run.record):
        run.set_launcher(launcher_entry(launcher))
    return launcher


def print_worlds(run: store.Run, cases: list[Case], launcher: Torchrun) -> list[PrintedWorld]:
    """Plans and torchrun commands for the user to start (``--print``), one world per group of
    cases, to run one after another; ``reopen`` (``--resume``) later records what they did."""
    user_ics = run.record.suite_table("interconnects")
    printed = [print_group(run, group, user_ics, launcher) for group in group_cases(cases)]
    run.set_status(record.PRINTED)
    return [p for p in printed if p is not None]


def missing(run: store.Run) -> list[Case]:
    """The cases of a run that are not done (what ``--resume`` would run), read without changing it."""
    return [c.case for c in run.record.cases.values() if c.status != store.DONE]


def check_links(run: store.Run) -> None:
    """``InterconnectUnavailable`` for an emulated link that the missing cases of ``run`` need and
    this machine cannot make (no root, no ``tc``, no tbf): checked by ``reopen`` (a sweep's or a
    tune's resume) and a resume's dry run before anything runs or changes, as a new sweep checks
    its links before it starts (``start``)."""
    profiles = run.record.suite_table("interconnects")
    for name in dict.fromkeys(c.interconnect for c in missing(run)):
        check_available(resolve(name, profiles))


def repeats_left(run: store.Run, cases: list[Case]) -> dict[str, int]:
    """How many of each case's repeats ``--resume`` would run: a failed case starts clean, a pending
    one keeps its finished repeats, but for those whose part is unreadable (run again)."""
    status = run.case_status()
    kept = {
        c.case_id: 0
        if status[c.case_id] == store.FAILED
        else len(store.finished_repeats(run.dir, c.case_id)) - len(store.unreadable_parts(run.dir, c.case_id))
        for c in cases
    }
    return {c.case_id: c.repeats - kept[c.case_id] for c in cases}


def check_resumable(run: store.Run) -> None:
    """What a resume refuses before anything runs or changes, and so its dry run too (which would
    otherwise list the run's cases and exit 0 where the resume exits 2 or 3): a done case's steps
    lost or unreadable, a printed world's events file damaged, an emulated link this machine cannot
    make (``check_links``)."""
    store.load(run.dir, summary=False)
    check_printed(run)
    check_links(run)


def reopen(run_dir: Path) -> tuple[store.Run, list[Case]]:
    """A run to resume, owned by this process from now on, and the cases it still needs: failed
    ones start clean, pending ones keep their finished repeats. ``RunBusy`` when another process
    owns it (a sweep still running, a second resume).

    Worlds printed for the user to start (``--print``) are read back first, from their events
    files, so what they finished counts as done; those never started are taken over (their printed
    commands then run nothing: ``launch.take_over_printed``). A run with nothing left to run keeps
    its status.
    """
    run = store.Run.open(run_dir, own=True)
    check_resumable(run)
    cases = {cid: c.case for cid, c in run.record.cases.items()}
    ingest_printed(run, cases, run.record.suite_table("interconnects"), lambda kind, ev: None)
    todo = missing(run)
    if todo:
        check_space(run.dir, todo, _largest_done(run))
    for case in todo:
        run.reset_case(case.case_id)
        store.set_aside_unreadable(run.dir, case.case_id)
    take_over_printed(run)
    if todo:
        run.hold_reserve()
        run.set_status(store.RUNNING, resumed=time.time())
    return run, todo


def execute(
    run: store.Run,
    cases: list[Case],
    listener: Listener,
    launcher: Torchrun | None = None,
    lockstep: str | None = None,
    steps_interleaved: bool = False,
    in_passes: bool = False,
) -> None:
    """Run the cases' worlds one after another (``launcher``: None, rank processes started here;
    else torchrun jobs). On Ctrl-C the run is marked interrupted and the case in flight goes back
    to pending (its finished repeats stay), so ``--resume`` picks it up. The run stays
    ``running`` until ``finalize`` has written its summary. ``lockstep``: the socket of the
    ``tpbench gate`` (or tune) that paces every item; once it says stop, no further world starts.
    ``steps_interleaved``: each round's items run together (``launch.run_group``).

    ``in_passes``: the worlds take turns, each running a share of its rounds per pass
    (``Case.passes``, ``launch.rounds_through``), so that whatever the machine does over the
    minutes of a sweep falls on every world alike, rather than on whichever ran then. Cases that
    run in different worlds are compared unpaired; the what-if predicts one world's cases from
    another's. Each pass starts every world afresh (a few seconds each); a case that failed in one
    pass runs in none after it (``launch.run_group``)."""
    reap_stale_namespaces()
    user_ics = run.record.suite_table("interconnects")
    charged = time.monotonic()

    def charge() -> None:
        """The seconds since the last charge into the run's ``wall_s``: after every repeat, not only
        at the end, so that a sweep killed outright (SIGKILL) has its time counted when resumed
        (else the timed steps outran the wall time, and an adaptive budget was overspent)."""
        nonlocal charged
        now = time.monotonic()
        run.add_wall_time(now - charged)
        charged = now

    def listen(kind: str, ev: dict[str, Any]) -> None:
        if kind == "repeat_end":
            charge()
        listener(kind, ev)

    try:
        if cases:  # no world to start (a resume that only writes the summary): no port to take
            check_endpoint(run, launcher)
        groups = group_cases(cases)
        passes = max((c.passes for c in cases), default=1) if in_passes else 1
        turns = [(p if passes > 1 else None, g) for p in range(1, passes + 1) for g in groups]
        for i, (through, group) in enumerate(turns):
            if i:  # the first world's space was checked before the run began (start, reopen)
                ahead = {c.case_id: c for _, g in turns[i:] for c in g.cases}
                check_space(run.dir, list(ahead.values()), _largest_done(run))
            if run_group(run, group, user_ics, listen, launcher, lockstep, steps_interleaved, through):
                break
    except KeyboardInterrupt:
        _mark_interrupted(run)
        raise
    except (OSError, store.StoreError):
        # A disk that filled up: the run stops like an interrupted one, so that it does not read as
        # still running and ``--resume`` (with space again) runs what is missing. Writing that needs
        # a little space too; if even that fails, the run stays as it was and resumes all the same.
        with contextlib.suppress(OSError, store.StoreError):
            _mark_interrupted(run)
        raise
    finally:
        with contextlib.suppress(OSError, store.StoreError):
            charge()


def _mark_interrupted(run: store.Run) -> None:
    """The case in flight back to pending (its finished repeats stay), the run interrupted, and its
    reserved space (``store.RESERVE_FILE``) given back: it is held while the run is swept, and an
    interrupted run left as it is kept it for good (``--resume`` sets it aside again)."""
    for cid, status in run.case_status().items():
        if status == store.RUNNING:
            run.set_case(cid, store.PENDING)
    run.set_status(record.INTERRUPTED, interrupted=time.time())
    run.release_reserve()


def analyze_traces(run_dir: Path, cases: pd.DataFrame, params: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """Parse each finished case's traces once: store its intervals, per-step overlap and
    collectives as derived tables, and return per-case overlap figures for the summary.

    Times are per profiled step: the median over (rank, step) of compute, communication,
    overlap, exposed communication and idle time; ``overlap_pct`` is the mean over ranks of each
    rank's figure over Holistic Trace Analysis' window (``overlap.hta_overlap_pct``: every profiled
    step but the last, as a ratio of sums). Bytes per step: ``bandwidth.bytes_per_step``. ``params``:
    each case's settings, which give its collectives' group size where its traces do not
    (``algorithms.world_group_size``).
    """
    rows = []
    for cid in cases.loc[cases["status"] == store.DONE, "case_id"]:
        paths = store.traces(run_dir, cid)
        if not paths:
            continue
        try:
            tl = timeline.read_traces(paths)
        except TraceUnreadable as e:
            raise store.StoreError(
                f"case {cid}: {e}; move its trace folder ({store.trace_dir(run_dir, cid)}) aside and "
                f"`tpbench sweep --resume {run_dir}` finishes the run without that case's trace tables"
            ) from e
        per_step = overlap.step_overlap(tl.intervals, tl.steps)
        store.write_case_table(run_dir, cid, "intervals", tl.intervals)
        store.write_case_table(run_dir, cid, "overlap", per_step)
        collectives = bandwidth.collective_bandwidth(tl.intervals, world_group_size(params.get(cid, {})))
        store.write_case_table(run_dir, cid, "collectives", collectives)
        store.write_case_table(run_dir, cid, "marks", tl.marks)
        if per_step.empty:
            continue
        row = {
            "case_id": cid,
            "overlap_pct": float(overlap.hta_overlap_pct(per_step).mean()),
            **bandwidth.bytes_per_step(collectives, sorted(per_step["step"].unique().tolist())),
        }
        for col in ("compute_ns", "comm_ns", "overlap_ns", "exposed_comm_ns", "idle_ns", "optimizer_ns"):
            row[col.replace("_ns", "_ms")] = float(per_step[col].median()) / 1e6
        rows.append(row)
    return pd.DataFrame(rows)


def _memory_summary(loaded: store.Loaded) -> pd.DataFrame:
    """Per case, from the exact per-rank accounting: the fullest rank's optimizer state, plain DDP's,
    the share saved, the step-work imbalance (max / mean) and, for ZeRO hooks, the bucket count."""
    memory, partition = store.read_case_tables(loaded, "memory"), store.read_case_tables(loaded, "partition")
    if memory.empty:
        return pd.DataFrame()
    df = per_case(memory.assign(run_id=""), partition.assign(run_id="") if len(partition) else partition)
    return df[["case_id", "state_max_bytes", "ddp_state_bytes", "state_saved_pct", "imbalance", "buckets"]].rename(
        columns={
            "state_max_bytes": "opt_state_max_bytes",
            "ddp_state_bytes": "opt_state_ddp_bytes",
            "state_saved_pct": "opt_state_saved_pct",
            "imbalance": "step_imbalance",
            "buckets": "zero_buckets",
        }
    )


def _ddp_bucket_summary(loaded: store.Loaded) -> pd.DataFrame:
    """Per case, the gradient buckets DDP really built (table ``ddp_buckets``): their count
    (``ddp_buckets``), each one's bytes in reduction order (``ddp_bucket_bytes``) and the first's
    (``ddp_first_bucket_bytes``, the bucket that waits for the last gradients of backward)."""
    buckets = store.read_case_tables(loaded, "ddp_buckets")
    if buckets.empty:
        return pd.DataFrame()
    rows = [
        {
            "case_id": cid,
            "ddp_buckets": len(grp),
            "ddp_bucket_bytes": [int(b) for b in grp["bytes"]],
            "ddp_first_bucket_bytes": int(grp["bytes"].iloc[0]),
        }
        for cid, grp in buckets.sort_values("bucket").groupby("case_id", sort=False)
    ]
    return pd.DataFrame(rows)


def finalize(run: store.Run) -> store.Loaded:
    """Write summary.parquet and the run's efficiency figures, then mark the run complete (so a
    run is ``complete`` only with its summary); returns the loaded run. Interrupted, the run is
    marked ``interrupted`` and ``--resume`` finishes the analysis; so is one whose analysis could
    not write a file (a full disk, a path too long), as ``execute`` marks a failed write."""
    try:
        return _finalize(run)
    except (KeyboardInterrupt, OSError, store.StoreError):
        with contextlib.suppress(OSError, store.StoreError):  # writing that may fail too: then it stays
            _mark_interrupted(run)
        raise


def _finalize(run: store.Run) -> store.Loaded:
    loaded = store.load(run.dir, summary=False)  # written afresh below, even over a broken one
    summary = summarize(loaded.steps, loaded.cases)
    for extra in (
        convergence.summarize(loaded.steps),
        analyze_traces(run.dir, loaded.cases, {cid: c.params for cid, c in loaded.record.cases.items()}),
        _memory_summary(loaded),
        _ddp_bucket_summary(loaded),
    ):
        if len(extra):
            summary = summary.merge(extra, on="case_id", how="left")
    store.write_summary(run.dir, summary)
    timed_s = float(slowest_rank(loaded.steps)["step_ms"].sum() / 1e3) if not loaded.steps.empty else 0.0
    rec = run.record
    # A printed world's ranks were started by hand (or, taken over by a resume, never): not ours.
    own = [w for w in rec.worlds if not w.printed]
    by_hand = sum(w.world_size for w in rec.worlds if w.printed and printed_world_started(run, w.world))
    efficiency = record.Efficiency(
        wall_s=rec.wall_s,
        timed_s=timed_s,
        timed_share=timed_s / rec.wall_s if rec.wall_s and not by_hand else None,
        worlds_started=len(own),
        processes_started=sum(w.world_size for w in own),
        processes_by_hand=by_hand,
    )
    failed = [cid for cid, status in run.case_status().items() if status == store.FAILED]
    status = record.COMPLETE if not failed else record.COMPLETE_WITH_FAILURES
    run.set_status(status, efficiency=asdict(efficiency))
    run.release_reserve()
    return store.load(run.dir)


# ---------------------------------------------------------------- adaptive sweeps

# A batch adds at least this many rounds: one more round barely moves a t interval.
MIN_ROUNDS = 2
# The most batches an adaptive run adds. Each batch at most doubles the rounds, so six allow 64
# times the planned ones; the bound is what lets the rule peek after each batch and stay valid:
# its intervals spend their confidence over MAX_BATCHES + 1 looks (``stats.sequential_ratio``).
MAX_BATCHES = 6
ADAPTING, TARGET_MET, BUDGET_SPENT, LOOKS_SPENT = "running", "met", "budget", "looks"
# Ended with no comparison to narrow: every pair had a failed case (a sweep of none is refused before
# it runs, ``refuse_nothing_to_compare``), which is not a target met.
NO_COMPARISON = "none"


@dataclass(frozen=True)
class Batch:
    """Rounds an adaptive sweep adds: the cases (with their raised ``repeats``) and what for."""

    number: int
    cases: list[Case]
    added: dict[str, int]  # case_id → repeats this batch adds
    comparisons: list[tuple[str, float | None]]  # (label, half-width) still above the target


def refuse_nothing_to_compare(cases: list[Case]) -> None:
    """``SweepError`` for an adaptive sweep of cases no two of which differ in one swept key (one
    case, or a filter's pick): it adds rounds to comparisons, and with none it ended at once as
    "target met; 0 of 0 comparison(s) resolve", the target never measured against anything."""
    if not compare.any_comparable(cases):
        n = len(cases)
        which = "one case makes" if n == 1 else f"{n} cases, no two one swept key apart, make"
        raise SweepError(
            f"--target-ci: the sweep's {which} no comparison for adaptive rounds to narrow (they narrow those "
            "`tpbench compare RUN_DIR` makes, pair by pair); sweep a key over two or more values, or drop --target-ci"
        )


def start_adaptive(run: store.Run, target: float, budget_s: float) -> None:
    """Make a run adaptive: after its planned repeats, ``next_batch`` adds rounds until every
    within-run comparison (``compare.within_run``) resolves ±``target`` or the run has spent
    ``budget_s`` seconds running worlds (``wall_s``, the planned repeats included)."""
    run.set_adaptive(
        {
            "target_ci": target,
            "budget_s": budget_s,
            "state": ADAPTING,
            "planned_repeats": {cid: c.params["repeats"] for cid, c in run.record.cases.items()},
            "batches": [],
        }
    )


def reopen_adaptive(run: store.Run) -> None:
    """Open an ended adaptive loop again for a resume that runs cases again (a failed one): the
    loop ended without that case's comparisons, which then get their rounds. Its batches and budget
    stay as they were: ``next_batch`` goes on from them, and ends again with the half-widths after."""
    adaptive = run.record.adaptive
    if adaptive is None or adaptive.state == ADAPTING:
        return
    ended = ("wall_s", "half_widths_after", "rounds_added")
    run.set_adaptive({k: v for k, v in adaptive.to_json().items() if k not in ended} | {"state": ADAPTING})


def batches_left(run: store.Run, todo: list[Case]) -> int | None:
    """The most adaptive batches a resume of ``run`` may still run after ``todo`` (its missing
    cases): None where it runs none (a planned run, or an ended loop with nothing to run again;
    ``reopen_adaptive`` opens one only for cases run again). A dry run says so, for a run cut off
    between batches has no case to resume and yet its resume goes on adding rounds."""
    adaptive = run.record.adaptive
    if adaptive is None or (adaptive.state != ADAPTING and not todo):
        return None
    return max(MAX_BATCHES - len(adaptive.batches), 0)


def pending_batch(run: store.Run, todo: list[Case]) -> Batch | None:
    """The adaptive batch a resume finishes, as ``next_batch`` planned it (from its record in
    run.json): the last one, where the loop is running and any of ``todo`` (the missing cases) is
    one of its cases; None otherwise. The resume names it, as the batch line did before the cut,
    so that its rounds do not run under no batch."""
    adaptive = run.record.adaptive
    if adaptive is None or adaptive.state != ADAPTING or not adaptive.batches:
        return None
    last = adaptive.batches[-1]
    if not any(c.case_id in last["repeats"] for c in todo):
        return None
    return Batch(
        len(adaptive.batches),
        [run.record.cases[cid].case for cid in last["repeats"]],
        {cid: new - old for cid, (old, new) in last["repeats"].items()},
        [(c["pair"], c["half_width"]) for c in last["comparisons"]],
    )


def _half_widths(pairs: list[compare.CasePair]) -> list[dict[str, Any]]:
    return [{"pair": p.result.label, "half_width": p.result.half_width, "method": p.method} for p in pairs]


def _costs(loaded: store.Loaded, wall_s: float) -> tuple[float, float]:
    """Seconds per world start and per repeat, from the run so far: a repeat's steps as its ranks
    timed them (``elapsed_s``: warm-up and timed steps), the rest of ``wall_s`` (starting ranks,
    building models, tracing) spread over the worlds started."""
    repeats = (
        loaded.steps.groupby(["case_id", "repeat"])["elapsed_s"].max()
        if "elapsed_s" in loaded.steps
        else pd.Series(dtype=float)
    )
    worlds = max(len(loaded.record.worlds), 1)
    if repeats.empty:
        return 0.0, wall_s / worlds
    return max(wall_s - float(repeats.sum()), 0.0) / worlds, float(repeats.mean())


def _sequential_pairs(loaded: store.Loaded) -> list[compare.CasePair]:
    """The run's within-run comparisons with the intervals the adaptive rule decides by: at the
    confidence spent over every look it may take (the planned repeats, then each batch) and every
    comparison (``stats.spent_confidence``), so that peeking after each batch raises no false
    "resolved"."""
    n = len(compare.within_run(loaded).pairs)
    return compare.within_run(loaded, confidence=spent_confidence(CONFIDENCE, MAX_BATCHES + 1, n)).pairs


def _ended(pairs: list[compare.CasePair], wide: list[compare.CasePair], cap: int) -> str:
    """Why the loop ends: no comparison at all, the target met, the budget spent, or the looks."""
    if not pairs:
        return NO_COMPARISON
    if not wide:
        return TARGET_MET
    return BUDGET_SPENT if cap < MIN_ROUNDS else LOOKS_SPENT


def next_batch(run: store.Run) -> Batch | None:
    """The next batch of an adaptive run, its cases already extended (``store.Run.extend_case``)
    and it recorded in run.json; None once every comparison resolves the target, the budget
    cannot pay for ``MIN_ROUNDS`` more rounds, or ``MAX_BATCHES`` have run (the record says which,
    with the half-widths). Half-widths are the sequential rule's (``_sequential_pairs``).

    Rounds per comparison: ``_Growth``. Time per repeat is estimated from the run so far
    (``_costs``); the budget is checked before each batch, so a run ends past it by as much as its
    last batch's estimate was short."""
    adaptive = run.record.adaptive
    if adaptive is None or adaptive.state != ADAPTING:
        return None
    rec = adaptive.to_json()
    target, budget = float(rec["target_ci"]), float(rec["budget_s"])
    loaded = store.load(run.dir)
    pairs = _sequential_pairs(loaded)
    rec.setdefault("half_widths_before", _half_widths(pairs))
    wide = [p for p in pairs if p.result.half_width is None or p.result.half_width > target]
    cases = {cid: c.case for cid, c in run.record.cases.items()}
    spent = float(run.record.wall_s or 0.0)
    growth = _Growth.of(wide, cases, target, *_costs(loaded, spent))
    cap = growth.affordable_cap(budget - spent)
    if not wide or cap < MIN_ROUNDS or len(rec["batches"]) >= MAX_BATCHES:
        added = {c: cases[c].repeats - n for c, n in rec["planned_repeats"].items() if c in cases}
        rec |= {
            "state": _ended(pairs, wide, cap),
            "wall_s": spent,
            "half_widths_after": _half_widths(pairs),
            "rounds_added": {c: n for c, n in added.items() if n > 0},
        }
        run.set_adaptive(rec)
        return None
    new = growth.plan(cap)
    batch = Batch(
        len(rec["batches"]) + 1,
        [dataclasses.replace(cases[c], repeats=n) for c, n in new.items()],
        {c: n - cases[c].repeats for c, n in new.items()},
        [(p.result.label, p.result.half_width) for p in wide],
    )
    rec["batches"].append(
        {
            "started_wall_s": spent,
            "comparisons": _half_widths(wide),
            "repeats": {c: [cases[c].repeats, n] for c, n in new.items()},
        }
    )
    run.set_adaptive(rec)
    for c, n in new.items():
        run.extend_case(c, n)
    return batch


@dataclass(frozen=True)
class _Growth:
    """The rounds an adaptive batch would add, per world, and what they cost.

    A comparison of n rounds with half-width hw needs about n·(hw/target)² rounds (the t
    interval narrows as 1/√n); no interval yet: n more. The cases of each world involved are
    raised to one common count, so that their new repeats run round by round in one world start
    and pair with each other. Unpaired comparisons (cases of different worlds) are extended too:
    more repeats narrow Welch's interval as well, only more slowly."""

    cases: dict[str, Case]
    need: dict[tuple, int]  # world → the rounds its widest comparison asks for
    involved: dict[tuple, set[str]]  # world → the case ids of its comparisons
    start_s: float  # seconds per world start
    repeat_s: float  # seconds per repeat

    @classmethod
    def of(
        cls, wide: list[compare.CasePair], cases: dict[str, Case], target: float, start_s: float, repeat_s: float
    ) -> _Growth:
        need: dict[tuple, int] = {}
        involved: dict[tuple, set[str]] = {}
        for p in wide:
            n = p.result.pairs or min(p.result.baseline_repeats, p.result.candidate_repeats)
            hw = p.result.half_width
            rounds = math.ceil(n * (hw / target) ** 2) - n if hw else n
            # At most doubling what there is: a half-width from few rounds is itself a rough estimate.
            rounds = max(MIN_ROUNDS, min(rounds, n))
            for cid in (p.baseline_case, p.candidate_case):
                world = cases[cid].launch_key
                need[world] = max(need.get(world, 0), rounds)
                involved.setdefault(world, set()).add(cid)
        return cls(cases, need, involved, start_s, repeat_s)

    def plan(self, cap: int) -> dict[str, int]:
        """case_id → its new repeats, each world's rounds capped at ``cap``."""
        out = {}
        for world, cids in self.involved.items():
            top = max(self.cases[c].repeats for c in cids) + min(self.need[world], cap)
            out |= {c: top for c in cids}
        return out

    def cost(self, plan: dict[str, int]) -> float:
        return (
            len(self.involved) * self.start_s + sum(n - self.cases[c].repeats for c, n in plan.items()) * self.repeat_s
        )

    def affordable_cap(self, left_s: float) -> int:
        """The most rounds ``left_s`` seconds pay for (cost grows with the cap): a binary search,
        since a target far below the noise asks for millions. Below ``MIN_ROUNDS``: none."""
        lo, hi = MIN_ROUNDS - 1, max(self.need.values(), default=0)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.cost(self.plan(mid)) <= left_s else (lo, mid - 1)
        return lo


# ---------------------------------------------------------------- the whole sweep


class SweepError(ValueError):
    """Options a sweep cannot honour together (``--print`` with the local launcher, a suite whose
    filters keep no case): exit 2, before anything runs."""


@dataclass(frozen=True)
class Phase:
    """A stretch of worlds ``run`` starts: the planned (or, resumed, the missing) cases, then each
    adaptive batch."""

    run: store.Run
    cases: list[Case]
    items: dict[str, int]  # case_id → its (case, repeat) items still to run
    batch: Batch | None = None  # the adaptive batch (one a resume finishes too); None for the planned repeats


# Given each phase before its worlds start, the listener of its launcher events as a context (the
# CLI's progress display stays open while the phase runs).
Progress = Callable[[Phase], contextlib.AbstractContextManager[Listener]]


def _no_progress(phase: Phase) -> contextlib.AbstractContextManager[Listener]:
    return contextlib.nullcontext(lambda kind, data: None)


# ``run(resume=..., launcher=RECORDED)``: start worlds as the run was started (its recorded launcher).
RECORDED = "recorded"


@dataclass(frozen=True)
class Outcome:
    """What ``run`` did: the run (owned by this process), the cases it ran, and the finished run."""

    run: store.Run
    cases: list[Case]
    loaded: store.Loaded | None = None  # None: nothing was left to resume, or the worlds were printed
    nothing_left: bool = False  # resumed a run whose cases were all done and summarized: nothing ran
    printed: list[PrintedWorld] = field(default_factory=list)  # ``print_only``: the worlds to start
    launcher: Torchrun | None = None  # the launcher the cases were (or are to be) started with
    wall_s: float = 0.0  # seconds from the first world to the summary

    @property
    def failed(self) -> list[str]:
        """The run's failed cases (exit 1 on the command line)."""
        return [cid for cid, s in self.run.case_status().items() if s == store.FAILED]


def run(
    suite: str | Path | Prepared | None = None,
    *,
    overrides: Iterable[str] = (),
    filters: Iterable[str] = (),
    out: Path = Path("results"),
    launcher: Torchrun | None | Literal["recorded"] = None,
    resume: Path | None = None,
    target_ci: float | None = None,
    budget_s: float | None = None,
    lockstep: str | None = None,
    print_only: bool = False,
    allow_large: bool = False,
    progress: Progress = _no_progress,
) -> Outcome:
    """A sweep end to end: a new run of ``suite`` (a path, or already ``prepare``d) under ``out``, or
    the missing cases of ``resume``; then, with ``target_ci`` and ``budget_s``, the adaptive
    batches (``next_batch``); then ``finalize``. ``print_only``: the torchrun worlds are planned and
    returned (``Outcome.printed``) for the user to start, not run. ``launcher``: None runs ranks
    here; ``RECORDED`` (with ``resume``) starts them as the run was started, and another kind than
    the run's is refused (``refuse_another_launcher``). ``progress`` is told of
    each phase before its worlds start. Ctrl-C leaves the run interrupted and resumable."""
    pending = None
    if resume is not None:
        the_run, cases, launcher = _resume(resume, launcher, print_only)
        if not cases and _summarized(the_run):
            return Outcome(the_run, [], nothing_left=True)
        pending = pending_batch(the_run, cases)
        if cases:
            reopen_adaptive(the_run)
    else:
        launcher = None if launcher == RECORDED else launcher
        prepared = suite if isinstance(suite, Prepared) else prepare(suite, overrides, filters, launcher, allow_large)
        if not prepared.cases:
            raise SweepError(f"{prepared.suite.path}: no case matches the filters")
        if print_only and launcher is None:
            raise SweepError("--print: only with --launcher torchrun")
        if target_ci is not None:
            refuse_nothing_to_compare(prepared.cases)
        the_run, cases = start(prepared, Path(out), launcher, print_only), prepared.cases
        if target_ci is not None and budget_s is not None:
            start_adaptive(the_run, target_ci, budget_s)
    if print_only:
        return Outcome(the_run, cases, printed=print_worlds(the_run, cases, launcher), launcher=launcher)
    left = {c.case_id: c.repeats - len(store.finished_repeats(the_run.dir, c.case_id)) for c in cases}
    t0 = time.monotonic()
    with progress(Phase(the_run, cases, left, pending)) as listener:
        execute(the_run, cases, listener, launcher, lockstep, in_passes=lockstep is None)
    while (batch := next_batch(the_run)) is not None:
        with progress(Phase(the_run, batch.cases, batch.added, batch)) as listener:
            execute(the_run, batch.cases, listener, launcher)
    loaded = finalize(the_run)
    return Outcome(the_run, cases, loaded, wall_s=time.monotonic() - t0, launcher=launcher)


def _resume(
    run_dir: Path, launcher: Torchrun | None | Literal["recorded"], print_only: bool
) -> tuple[store.Run, list[Case], Torchrun | None]:
    """A run reopened to resume (``reopen``), its missing cases and the launcher to start them with."""
    refuse_a_tune(run_dir)
    refuse_another_launcher(run_dir, launcher)
    the_run, cases = reopen(run_dir)
    launcher = resumed_with(the_run, launcher)
    if print_only and launcher is None:
        raise SweepError(f"--print: {the_run.dir} runs with the local launcher; add --launcher torchrun")
    return the_run, cases, launcher


def refuse_another_launcher(run_dir: Path, launcher: Torchrun | None | Literal["recorded"]) -> None:
    """A resumed run starts its worlds the way its finished cases' worlds started: the local
    launcher's pinned ranks on this machine, or torchrun's agents on the recorded nodes. Another
    launcher would measure its missing cases apart from the finished ones, which the run would then
    compare as if alike, and leave run.json naming the launcher it did not use. ``RECORDED`` is the
    run's own, never another."""
    if launcher == RECORDED:
        return
    recorded = store.read_record(run_dir).launcher.name
    given = "local" if launcher is None else "torchrun"
    if given != recorded:
        raise SweepError(
            f"--launcher {given} with --resume: {run_dir} was started with the {recorded} launcher, and a resumed "
            "run starts its worlds as its finished cases ran (drop --launcher, or start a new run)"
        )


def refuse_a_tune(run_dir: Path) -> None:
    """A tune's run is resumed by ``tpbench tune --resume``: resumed as a sweep, it would run every
    arm to its last repeat, the eliminated ones too, and leave tune.json behind it, stale."""
    if (Path(run_dir) / store.TUNE_FILE).exists():
        raise store.StoreError(f"{run_dir}: a tune (it has {store.TUNE_FILE}); resume it with tpbench tune --resume")


def _summarized(run: store.Run) -> bool:
    """Complete with its summary written and readable: a resume of it has nothing to do. A summary
    that is missing or unreadable (cut short, overwritten) is written again from the steps."""
    if not run.record.finished:
        return False
    try:
        return not store.read_summary(run.dir, run.record).empty
    except store.StoreError:
        return False
