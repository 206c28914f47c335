"""What every ``tpbench`` command shares: the two consoles (results on stdout, progress and errors
on stderr), the exit codes, usage errors, stop signals handled as Ctrl-C, and the launcher options.

Exit codes: 0 success, 1 a case failed (sweep) or a regression (compare, gate), 2 usage error or
bad suite, 3 missing/broken results or incomparable runs, 4 inconclusive (with
--fail-on-inconclusive) or a tune unresolved, 130 interrupted (128 + the signal's number for a stop signal).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shlex
import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, NoReturn

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, Task, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Column, Table
from rich.text import Text

if TYPE_CHECKING:
    from tpbench.record import RunRecord

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_RESULTS, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
# `tpbench tune` ended without a decision (the budget or the rounds ran out): 4, as an inconclusive
# comparison is.
EXIT_UNRESOLVED = 4

# No emoji codes: rich would read ":fire:" in a path or a suite's name as one, and print a run
# directory, and the --resume line naming it, as a path that does not exist ("🔥/smoke/...").
console = Console(stderr=True, highlight=False, emoji=False)
out = Console(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 160)


def given_flags(options: dict[str, Any]) -> list[str]:
    """The flags among ``options`` (flag → its parsed value) that the command line set: those whose
    value is not what they default to when absent, None or (``--set``, ``--filter``) an empty list."""
    return [flag for flag, value in options.items() if value is not None and value != []]


def fraction(text: str, example: float = 0.02) -> float:
    """``2%`` or ``0.02`` → 0.02: a percentage, or a bare number read as a fraction (the range is each
    option's own check: ``options._target_ci``, ``racing.Options.check``). Text that is neither is
    refused with ``example`` written both ways: a value the option itself would take, so that
    ``--confidence abc`` is not told "like 2%", which its range then refuses."""
    raw = text.strip()
    try:
        return float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text}: expected a percentage like {example * 100:g}% or a fraction like {example:g}"
        ) from None


def torchrun_launcher(args: argparse.Namespace):
    """The torchrun launcher the arguments ask for (None: local); a usage error as ``SystemExit``,
    said by the command that was run (``tpbench tune`` takes these options too)."""
    from tpbench.worlds import RDZV_TIMEOUT_S, Torchrun

    given = given_flags(
        {
            "--nnodes": args.nnodes,
            "--nproc-per-node": args.nproc_per_node,
            "--rdzv-endpoint": args.rdzv_endpoint,
            "--agent-prefix": args.agent_prefix,
            "--rdzv-timeout": args.rdzv_timeout,
        }
    )
    if args.launcher != "torchrun":
        # On --resume, --print alone reuses the run's own torchrun settings.
        if given or (args.print_only and not args.resume):
            usage(f"{', '.join(given or ['--print'])}: only with --launcher torchrun", args.command)
        return None
    launcher = Torchrun(
        nnodes=1 if args.nnodes is None else args.nnodes,
        nproc_per_node=args.nproc_per_node,
        rdzv_endpoint=args.rdzv_endpoint,
        agent_prefix=tuple(shlex.split(args.agent_prefix or "")),
        rdzv_timeout_s=args.rdzv_timeout or RDZV_TIMEOUT_S,
    )
    if launcher.problem():
        usage(launcher.problem(), args.command)
    if launcher.nnodes > 1 and not launcher.agent_prefix and not args.print_only:
        usage(
            f"--nnodes {launcher.nnodes} starts agents on {launcher.nnodes} machines: give --agent-prefix "
            "(e.g. 'srun --ntasks-per-node=1 --kill-on-bad-exit=1') to start them from here, "
            "or --print to start them yourself",
            args.command,
        )
    return launcher


def resumed_launcher(args: argparse.Namespace, launcher, command: str = "sweep"):
    """The launcher a resume starts its worlds with: the run's own (``sweep.RECORDED``) unless
    ``--launcher`` is given, which must name the same kind (``sweep.refuse_another_launcher``). A
    torchrun run keeps its recorded nodes and ranks per node (others would place the missing cases'
    ranks apart from the finished ones'); ``--rdzv-endpoint`` and ``--agent-prefix`` may change, as
    a new allocation's nodes need, and ``--rdzv-timeout``. ``tpbench sweep`` and ``tpbench tune`` resume alike."""
    from tpbench import store, sweep

    if not args.launcher:
        return sweep.RECORDED
    try:
        sweep.refuse_another_launcher(args.resume, launcher)
    except sweep.SweepError as e:
        usage(str(e), command)
    if launcher is None:
        return None
    run_record = store.read_record(args.resume)
    recorded = sweep.launcher_of(run_record)
    for flag, given, ran in (
        ("--nnodes", args.nnodes, recorded.nnodes),
        ("--nproc-per-node", args.nproc_per_node, recorded.nproc_per_node),
    ):
        if given is not None and given != ran:
            usage(_another_shape(run_record, args.resume, flag, given, ran), command)
    merged = dataclasses.replace(
        recorded,
        rdzv_endpoint=args.rdzv_endpoint or recorded.rdzv_endpoint,
        agent_prefix=launcher.agent_prefix if args.agent_prefix is not None else recorded.agent_prefix,
        rdzv_timeout_s=args.rdzv_timeout or recorded.rdzv_timeout_s,
    )
    if merged.problem():
        usage(merged.problem(), command)
    return merged


# Set by examples/slurm/sweep.sbatch: its --nnodes and --nproc-per-node are the job's allocation,
# not flags the user typed, so a refusal of them asks for another allocation instead.
SBATCH_ENV = "TPBENCH_SBATCH"


def _another_shape(run_record: RunRecord, run_dir: Path, flag: str, given: int, ran: int | None) -> str:
    """Why a resume's ``flag`` (``--nnodes``, ``--nproc-per-node``) other than the run's is refused,
    and what to do: on the command line, drop it; through sweep.sbatch (``SBATCH_ENV``), which
    passes the allocation's nodes and ranks per node, there is nothing to drop: the job to submit is
    one of the run's shape (``_sbatch_resume``), or, for a run the script cannot resume, a resume
    from the allocation outside it."""
    had = f"{flag} {ran}" if ran is not None else f"no {flag} (the world size over --nnodes)"
    said = f"{run_dir}'s worlds ran with {had}, and a resumed run places its ranks as its finished cases' were"
    if not os.environ.get(SBATCH_ENV):
        return f"{flag} {given} with --resume: {said} (drop it, or start a new run)"
    what = "nodes" if flag == "--nnodes" else "ranks per node"
    job = f"sweep.sbatch --resume: this job gives {given} {what} ({flag} {given}), where {said}"
    if sbatch := _sbatch_resume(run_record, run_dir):
        return f"{job}: submit it in an allocation of the run's shape, {sbatch}"
    return (
        f"{job}; the script always passes --nproc-per-node, which this run refuses: resume it from an allocation "
        f"of {run_record.launcher.options.get('nnodes', 1)} nodes "
        f"with tpbench sweep --resume {run_dir} --launcher torchrun --rdzv-endpoint HOST:PORT --agent-prefix CMD"
    )


def usage(message: str, command: str = "sweep") -> NoReturn:
    console.print(f"tpbench {command}: error: {message}", soft_wrap=True, markup=False)
    raise SystemExit(EXIT_USAGE)


def warn_unused(prepared) -> None:
    """Warn, on stderr, of each ``[workloads.NAME]`` table no case runs (``sweep.Prepared``'s
    ``unused_workloads``): its parameters change nothing, which a user who forgot or misspelt
    ``workload`` would otherwise learn only from the results; and of each ``[defaults]`` key no case
    uses (``unused_defaults``), which the collapse of keys that do not apply leaves unsaid."""
    runs = ", ".join(sorted({c.workload for c in prepared.cases}))
    for table in prepared.unused_workloads:
        console.print(
            f"warning: {prepared.suite.path}: {table}: no case runs this workload (the cases run {runs}); "
            "set `workload` to it where it is meant, or remove the table",
            markup=False,
            soft_wrap=True,
        )
    for note in prepared.unused_defaults:
        console.print(f"warning: {prepared.suite.path}: {note}", markup=False, soft_wrap=True)


# The widest a label column is kept for its longest word; a longer word folds onto the next line.
MAX_LABEL_WORD = 40
# Narrower than this a fixed label column reads as letters; rich then shares the width out itself.
MIN_LABEL_WIDTH = 16


def label_column(table: Table, header: str) -> None:
    """Add a column of case labels that hides no word of them: folded where rich would cut a word
    short ("hook_with_zero_s…" for both ZeRO hooks) when a table of many columns meets a narrow
    terminal; ``fitted`` widens it to its longest word where the terminal has room."""
    table.add_column(header, overflow="fold")


def fitted(table: Table, console: Console) -> Table:
    """``table`` with each label column (``label_column``) as wide as its longest label where the
    other columns leave room at their natural width, else at least as wide as its longest word, as
    far as ``console`` leaves room beside the other columns' longest words. The width is fixed, so
    that rich narrows the other columns to fit rather than the labels (its widest, which it
    narrows first). Where the console leaves less than ``MIN_LABEL_WIDTH``, rich shares the width
    out itself (the labels folded)."""

    def texts(column: Column) -> list[str]:
        return [c.plain if isinstance(c, Text) else str(c) for c in (column.header, *column.cells)]

    def longest(column: Column, words: bool) -> int:
        return max((len(piece) for text in texts(column) for piece in (text.split() if words else [text])), default=0)

    labels = [c for c in table.columns if c.overflow == "fold"]
    others = [c for c in table.columns if c not in labels]
    share = max(1, len(labels))
    room = (console.width - sum(longest(c, True) + 3 for c in others) - 1) // share - 3  # padding and rules
    spare = (console.width - sum(longest(c, False) + 3 for c in others) - 1) // share - 3
    for column in labels:
        word, whole = min(longest(column, True), MAX_LABEL_WORD, room), longest(column, False)
        column.width = min(max(spare, word), whole) if room >= MIN_LABEL_WIDTH else None
    return table


def world_text(case, nnodes: int = 1) -> str:
    """A case's world as the case tables say it: "2×gloo/cpu loopback", or across nodes
    "2×gloo/cpu network across 2 nodes" (``link_text``)."""
    return f"{case.world_size}×{case.backend}/{case.device} {link_text(case.backend, case.interconnect, nnodes)}"


def link_text(backend: str, interconnect: str, nnodes: int = 1) -> str:
    """What a world's ranks talk over: its interconnect, "loopback". Across ``nnodes`` > 1
    (torchrun's ``--nnodes``) it says so, and Gloo's ``loopback``, which is not pinned to ``lo`` there
    (``worlds.torchrun_env``), as the nodes' network: "network across 2 nodes". The dry run's world
    column and a sweep's or tune's progress say it alike."""
    if nnodes == 1:
        return interconnect
    link = "network" if backend == "gloo" and interconnect == "loopback" else interconnect
    return f"{link} across {nnodes} nodes"


def nodes_of(launcher) -> int:
    """The machines each world spans under ``launcher`` (None: the local launcher's one)."""
    return launcher.nnodes if launcher is not None else 1


def cases_table(title: str, cases: list, left: dict[str, int] | None = None, nnodes: int = 1) -> Table:
    """The cases a command would run, their worlds across ``nnodes`` machines (``world_text``);
    ``left``: each case's repeats still to run (a resume), shown as "2 of 3" before the steps."""
    from tpbench.suite import labels

    names = labels([cases])[0]
    t = Table(title=escape(title))
    t.add_column("case_id")
    label_column(t, "case")
    t.add_column("world")
    t.add_column("repeats × steps" if left is None else "repeats left of all × steps")
    for c in cases:
        repeats = f"{c.repeats}" if left is None else f"{left[c.case_id]} of {c.repeats}"
        t.add_row(
            c.case_id,
            escape(names[c.case_id]),
            escape(world_text(c, nnodes)),
            f"{repeats}×{c.steps}",
        )
    return t


# Signals a sweep handles as Ctrl-C: SIGTERM is what schedulers and CI send to stop a job, SIGHUP
# what a closed terminal or dropped ssh session sends.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """A stop signal, handled as Ctrl-C is; the exit code is 128 + its number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _terminate(signum: int, frame: object) -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # a second one must not cut the clean-up short
    raise Terminated(signum)


def interrupted(e: KeyboardInterrupt) -> tuple[str, int]:
    """What to say and the exit code, for Ctrl-C or a stop signal."""
    if isinstance(e, Terminated):
        return f"Terminated ({signal.Signals(e.signum).name}).", 128 + e.signum
    return "Interrupted.", EXIT_INTERRUPTED


def resumable(e: KeyboardInterrupt, run, command: str, kept: str) -> int:
    """Ctrl-C or a stop signal once the run exists: what is kept and how to resume it; the exit
    code. Before (no ``run``), the interrupt goes on to ``main``: there is nothing to resume."""
    if run is None:
        raise e
    said, code = interrupted(e)
    console.print(
        Text.assemble(
            "\n",
            (said, "yellow"),
            f" {kept} Resume with:\n  ",
            shlex.join(["tpbench", command, "--resume", str(run.dir)]),
            _resumed_elsewhere(run, command),
        ),
        soft_wrap=True,
    )
    return code


def _resumed_elsewhere(run, command: str) -> str:
    """For a torchrun run, what a resume elsewhere adds, in the words of where the run was: on one
    machine (one agent, no ``--agent-prefix``) there was no allocation, and Slurm's words there
    read as if the run needed one; across nodes, a new allocation's rendezvous and agents."""
    if run.record.launcher.name != "torchrun":
        return ""
    options = run.record.launcher.options
    if options.get("nnodes", 1) == 1 and not options.get("agent_prefix"):
        return _one_machine(options.get("rdzv_endpoint"))
    return _new_allocation(run, command)


def _one_machine(endpoint: str | None) -> str:
    """A one-machine run's resume: a bare one meets at the recorded endpoint again, which another
    program may hold by then (the resume then stops, naming it); ``--standalone`` (no endpoint)
    takes a free port wherever it is resumed, so nothing is to add."""
    if not endpoint:
        return ""
    return (
        f"\n(its worlds meet at {endpoint} again; for another port or machine, add --launcher torchrun "
        "--rdzv-endpoint HOST:PORT)"
    )


def _new_allocation(run, command: str) -> str:
    """For a run across nodes, what a resume from another allocation adds: a bare resume reuses the
    rendezvous endpoint and agent prefix that run.json records, which an ended job no longer holds."""
    slurm = f", or on Slurm: {sbatch}" if command == "sweep" and (sbatch := _sbatch_resume(run.record, run.dir)) else ""
    return (
        "\n(in the same allocation; from a new one, add --launcher torchrun --rdzv-endpoint HOST:PORT "
        f"--agent-prefix CMD for its rendezvous and agents{slurm})"
    )


def _sbatch_resume(run_record: RunRecord, run_dir: Path) -> str:
    """examples/slurm/sweep.sbatch's resume of the run in an allocation of the run's shape, or "" where
    the script cannot resume it. The script passes the allocation's nodes and a rank per GPU (else
    NPROC_PER_NODE), and a resume refuses any other than the run's: the bare command got the script's
    2 nodes of 8 GPUs. A run with no recorded ranks per node (torchrun --standalone) refuses the
    script's --nproc-per-node whatever it is."""
    options = run_record.launcher.options
    per_node = options.get("nproc_per_node")
    if per_node is None:
        return ""
    nodes = options.get("nnodes", 1)
    script = shlex.join(["examples/slurm/sweep.sbatch", "--resume", str(run_dir)])
    if run_record.environment.get("gpu_count"):
        return f"sbatch --nodes={nodes} --gpus-per-node={per_node} {script}"
    return f"NPROC_PER_NODE={per_node} sbatch --nodes={nodes} {script}"


@contextlib.contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """While a sweep runs, stop signals raise ``Terminated``; the previous handlers come back after."""
    previous = {sig: signal.signal(sig, _terminate) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def redraws(console: Console) -> bool:
    """Whether ``console`` redraws a progress line in place, as rich's ``Live`` decides it: a terminal,
    not a dumb one. Elsewhere (a file or a pipe: CI, nohup, Slurm) rich draws the line once, as it
    stops, cut to the width, so a log polled during an hour's sweep showed nothing of it; there the
    commands disable the line and say their progress in plain lines (``plain_progress``), paced by
    ``pace.PlainPace``."""
    return console.is_terminal and not console.is_dumb_terminal


class FoldedProgress(Progress):
    """A progress line of short columns (the bar, counts and times, which rich need never cut) with
    the task's long fields (``below``: the setting running, the race's leader) on lines of their own
    under it, folded at the terminal's edge. On one line an 80-column terminal showed "re…
    hook_with_zero_step bucket_cap_mb=0.5 shard_buckets=True (repeat 5/12); ca…": the bar, the
    count and the times gone, and the label cut."""

    def __init__(self, *columns: Any, below: tuple[str, ...], **kwargs: Any) -> None:
        super().__init__(*columns, **kwargs)
        self.below = below

    def get_renderables(self) -> Iterator[Any]:
        yield self.make_tasks_table(self.tasks)
        for task in self.tasks:
            for name in self.below:
                if text := task.fields.get(name):
                    yield Text.from_markup(f"  {text}", overflow="fold")


class RunElapsedColumn(TimeElapsedColumn):
    """The run's time elapsed: the task's own and its ``earlier_s`` field, the time the run's
    earlier sessions recorded (run.json's or tune.json's ``wall_s``). A resumed run's line started
    at 0:00:00, as if nothing had run, while a tune's budget counts that earlier time too. The ETA
    is rich's, from the task's own advances alone: this session's pace over the work left."""

    def render(self, task: Task) -> Text:
        earlier = task.fields.get("earlier_s", 0.0)
        if not earlier:
            return super().render(task)
        elapsed = (task.finished_time if task.finished else task.elapsed) or 0.0
        return Text(str(timedelta(seconds=int(elapsed + earlier))), style="progress.elapsed")


def plain_progress(task: Task, said: str, eta: bool = False) -> None:
    """One line of progress, uncut, with the time elapsed (and, with ``eta``, left once rich can
    estimate it) as the line on a terminal shows them, rendered by the same rich columns."""
    times = f"{RunElapsedColumn().render(task).plain} elapsed"
    if eta and task.time_remaining is not None:
        times += f", ETA {TimeRemainingColumn().render(task).plain}"
    console.print(f"{said} ({times})", markup=False, soft_wrap=True, highlight=False)


@contextlib.contextmanager
def showing(progress: Progress, watcher: Any) -> Iterator[Any]:
    """``watcher`` while ``progress`` is on the terminal."""
    with progress:
        yield watcher


def error(e: Exception, command: str) -> None:
    """``e`` on one line named by its command, "tpbench gate: error: ...", as ``usage`` and argparse
    say theirs: a bare "error: ..." in a CI log did not say which step failed. User text (file
    names, keys like "[defaults] steps") must not be read as rich markup."""
    console.print(Text.assemble(f"tpbench {command}: ", ("error: ", "red"), str(e)), soft_wrap=True)
