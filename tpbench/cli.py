"""The ``tpbench`` command: argument parsing and terminal output only; the work is in the library.

Exit codes: 0 success, 1 a case failed (sweep) or a regression (compare, gate), 2 usage error or
bad suite, 3 missing/broken results or incomparable runs, 4 inconclusive (with
--fail-on-inconclusive) or a tune unresolved, 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import sys
from pathlib import Path
from typing import Any, Iterator

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_RESULTS, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
# `tpbench tune` ended without a decision (the budget or the rounds ran out): 4, as an inconclusive
# comparison is.
EXIT_UNRESOLVED = 4

console = Console(stderr=True, highlight=False)
out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)


class SweepProgress:
    """Renders launcher events: case i/N, the current case, ETA."""

    def __init__(self, cases: list, total_items: int) -> None:
        from tpbench.suite import labels

        self.labels = labels([cases])[0]
        self.repeats = {c.case_id: c.repeats for c in cases}
        self.passes = max((c.passes for c in cases), default=1)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[current]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task("repeats", total=total_items, current="starting worlds…")
        self.done_cases = 0
        self.total_cases = len(cases)

    def __call__(self, event: str, data: dict[str, Any]) -> None:
        if event == "world_start":
            turn = f"pass {data['sweep_pass']}/{self.passes}: " if "sweep_pass" in data else ""
            ranks = f"{turn}starting {data['world_size']} ranks on {data['interconnect']}…"
            self.progress.update(self.task, current=ranks)
        elif event == "repeat_start":
            label = self.labels.get(data["case"], data["case"])
            self.progress.update(
                self.task,
                current=f"case {self.done_cases + 1}/{self.total_cases}: {escape(label)} "
                f"(repeat {data['repeat'] + 1}/{self.repeats.get(data['case'], '?')})",
            )
        elif event == "repeat_end":
            self.progress.advance(self.task)
        elif event == "case_end":
            self.done_cases += 1
        elif event == "world_retry":
            self.progress.console.print(
                Text.assemble(("world failed: ", "yellow"), f"{data['cause']}; trying a fresh one")
            )
        elif event == "trace_retry":
            label = self.labels.get(data["case"], data["case"])
            self.progress.console.print(
                Text.assemble(
                    ("trace failed: ", "yellow"), f"{label}: {data['cause']}; its last repeat again in a fresh world"
                )
            )
        elif event == "trace_retake":
            label = self.labels.get(data["case"], data["case"])
            self.progress.console.print(
                Text.assemble(
                    ("trace retaken: ", "yellow"),
                    f"{label}: the host ran its traced forward passes at ×{data['forward_speed']:.2f} of their "
                    f"timed speed, its steps at ×{data['step_speed']:.2f}, its training thread's CPU time at "
                    f"×{data['thread_speed']:.2f}",
                )
            )
        elif event == "case_failed":
            self.done_cases += 1
            label = self.labels.get(data["case"], data["case"])
            self.progress.console.print(Text.assemble(("case failed: ", "red"), f"{label}: {data['cause']}"))


def _fastest(loaded) -> list[str]:
    """The report's first verdict, per setting of more than one case: the fastest case by the
    statistic its comparisons use (the geometric mean of per-repeat values; the table above sorts by
    the median) and whether it is clearly ahead of the runner-up, so that the terminal and the report
    name the same case."""
    from tpbench.report import data as report_data
    from tpbench.report import verdicts

    return verdicts.fastest_lines(report_data.load([loaded]), alone=False)


def _summary_table(loaded) -> Table:
    t = Table(
        title=escape(f"{loaded.record.suite.name} · run {loaded.record.run_id}"),
        caption="ms/step: the median of the repeats' values, with the 95% CI of that median; "
        "steps p10–p90: the spread of single timed steps",
    )
    for col, just in [
        ("case", "left"),
        ("status", "left"),
        ("ms/step", "right"),
        ("95% CI", "right"),
        ("steps p10–p90", "right"),
        ("samples/s", "right"),
    ]:
        t.add_column(col, justify=just)
    s = loaded.table
    for row in (
        s.sort_values("median_ms", na_position="last").to_dict("records") if "median_ms" in s else s.to_dict("records")
    ):
        if row.get("median_ms") == row.get("median_ms") and row.get("median_ms") is not None:
            t.add_row(
                escape(row["label"]),
                row["status"],
                f"{row['median_ms']:.2f}",
                f"[{row['ci_lo_ms']:.2f}, {row['ci_hi_ms']:.2f}]",
                f"{row['p10_ms']:.2f}–{row['p90_ms']:.2f}",
                f"{row['samples_per_s']:.0f}",
            )
        else:
            t.add_row(escape(row["label"]), f"[red]{row['status']}[/]", "", "", "", "")
    return t


def _torchrun(args: argparse.Namespace):
    """The torchrun launcher the arguments ask for (None: local); a usage error as ``SystemExit``."""
    from tpbench.launch import Torchrun

    given = [
        f
        for f, v in (
            ("--nnodes", args.nnodes),
            ("--nproc-per-node", args.nproc_per_node),
            ("--rdzv-endpoint", args.rdzv_endpoint),
            ("--agent-prefix", args.agent_prefix),
        )
        if v is not None
    ]
    if args.launcher != "torchrun":
        # On --resume, --print alone reuses the run's own torchrun settings.
        if given or (args.print_only and not args.resume):
            _usage(f"{', '.join(given or ['--print'])}: only with --launcher torchrun")
        return None
    launcher = Torchrun(
        nnodes=1 if args.nnodes is None else args.nnodes,
        nproc_per_node=args.nproc_per_node,
        rdzv_endpoint=args.rdzv_endpoint,
        agent_prefix=tuple(shlex.split(args.agent_prefix or "")),
    )
    if launcher.problem():
        _usage(launcher.problem())
    if launcher.nnodes > 1 and not launcher.agent_prefix and not args.print_only:
        _usage(
            f"--nnodes {launcher.nnodes} starts agents on {launcher.nnodes} machines: give --agent-prefix "
            "(e.g. 'srun --ntasks-per-node=1 --kill-on-bad-exit=1') to start them from here, "
            "or --print to start them yourself"
        )
    return launcher


def _usage(message: str, command: str = "sweep") -> None:
    console.print(f"tpbench {command}: error: {message}", soft_wrap=True, markup=False)
    raise SystemExit(EXIT_USAGE)


def _print_worlds(run, worlds: list, launcher) -> int:
    """``--print``: the command(s) to start on every node, then how to record what they did."""
    where = "on this machine" if launcher.nnodes == 1 else f"on each of the {launcher.nnodes} nodes, at the same time"
    if launcher.agent_prefix:
        where = "once (the prefix starts one agent per node)"
    for w in worlds:
        env = [f"{k}={v}" for k, v in sorted(w.env.items())]
        out.print(f"# world {w.world} ({w.plan}): run {where}", soft_wrap=True, markup=False)
        out.print(shlex.join(["env", *env, *w.command]), soft_wrap=True, highlight=False, markup=False)
    if len(worlds) > 1:
        out.print("# run the worlds one after another", soft_wrap=True)
    out.print(
        f"# when every torchrun has exited, record the results (and run what is missing):\n"
        f"tpbench sweep --resume {shlex.quote(str(run.dir))}",
        soft_wrap=True,
        markup=False,
    )
    return EXIT_OK


def _cases_table(title: str, cases: list) -> Table:
    from tpbench.suite import labels

    names = labels([cases])[0]
    t = Table(title=escape(title))
    for col in ("case_id", "case", "world", "repeats × steps"):
        t.add_column(col)
    for c in cases:
        t.add_row(
            c.case_id,
            escape(names[c.case_id]),
            f"{c.world_size}×{c.backend}/{c.device} {escape(c.interconnect)}",
            f"{c.repeats}×{c.steps}",
        )
    return t


def _check_resume_args(args: argparse.Namespace) -> None:
    """``--resume`` runs the run's own suite: what would change its cases is refused, so that the
    missing cases measure what the finished ones did."""
    from tpbench import store, user_files

    changed = [
        f
        for f, v in (
            ("--set", args.set),
            ("--filter", args.filter),
            ("--out", args.out),
            ("--target-ci", args.target_ci),
            ("--budget-s", args.budget_s),
        )
        if v
    ]
    if changed:
        _usage(
            f"{', '.join(changed)} with --resume: a resumed run runs its own suite's missing cases unchanged, "
            "in its own directory (start a new sweep to change them)"
        )
    if args.suite:
        recorded = store.read_record(args.resume).suite.text
        try:
            same = user_files.read_text(args.suite, "suite file") == recorded
        except ValueError:
            same = False
        if not same:
            _usage(
                f"{args.suite} with --resume: not the suite {args.resume} was started from "
                "(a resumed run runs its own suite, kept in its run.json; drop SUITE)"
            )


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


def _interrupted(e: KeyboardInterrupt) -> tuple[str, int]:
    """What to say and the exit code, for Ctrl-C or a stop signal."""
    if isinstance(e, Terminated):
        return f"Terminated ({signal.Signals(e.signum).name}).", 128 + e.signum
    return "Interrupted.", EXIT_INTERRUPTED


def _resumable(e: KeyboardInterrupt, run, command: str, kept: str) -> int:
    """Ctrl-C or a stop signal once the run exists: what is kept and how to resume it; the exit
    code. Before (no ``run``), the interrupt goes on to ``main``: there is nothing to resume."""
    if run is None:
        raise e
    said, code = _interrupted(e)
    console.print(
        Text.assemble(
            "\n",
            (said, "yellow"),
            f" {kept} Resume with:\n  ",
            shlex.join(["tpbench", command, "--resume", str(run.dir)]),
        ),
        soft_wrap=True,
    )
    return code


@contextlib.contextmanager
def _stop_signals_interrupt() -> Iterator[None]:
    """While a sweep runs, stop signals raise ``Terminated``; the previous handlers come back after."""
    previous = {sig: signal.signal(sig, _terminate) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def cmd_sweep(args: argparse.Namespace) -> int:
    with _stop_signals_interrupt():
        return _sweep(args)


def _sweep(args: argparse.Namespace) -> int:
    from tpbench import report, store, sweep
    from tpbench.record import Efficiency

    launcher = _check_sweep_args(args)
    if args.resume:
        _check_resume_args(args)
        if args.dry_run:
            run = store.Run.open(args.resume)
            todo = sweep.missing(run)
            out.print(_cases_table(f"{run.dir}: {len(todo)} cases to resume (dry run)", todo))
            return EXIT_OK
        suite, launcher = None, launcher if args.launcher else sweep.RECORDED
    else:
        suite = sweep.prepare(args.suite, args.set, args.filter, launcher, allow_large=args.allow_large)
        if not suite.cases:
            console.print("[yellow]No case matches the filters.[/]")
            return EXIT_USAGE
        if args.dry_run:
            out.print(_cases_table(f"{suite.suite.name}: {len(suite.cases)} cases (dry run)", suite.cases))
            return EXIT_OK
        if not args.no_report:  # before hours of sweeping, not after
            if args.report and args.report.is_dir():
                raise store.StoreError(f"{args.report}: is a folder; --report takes the report's file name")
            store.check_writable(args.report.parent if args.report else args.reports_dir, "report directory")
    display = _SweepDisplay()
    try:
        outcome = sweep.run(
            suite,
            out=args.out or Path("results"),
            launcher=launcher,
            resume=args.resume,
            target_ci=args.target_ci,
            budget_s=args.budget_s,
            lockstep=args.lockstep,
            print_only=args.print_only,
            progress=display,
        )
    except sweep.SweepError as e:
        _usage(str(e))
    except KeyboardInterrupt as e:
        return _resumable(e, display.run, "sweep", "Finished cases are kept.")
    if outcome.nothing_left:
        console.print(f"Nothing to resume: every case of {outcome.run.dir} is done.", markup=False, soft_wrap=True)
        return EXIT_OK
    if args.print_only:
        console.print(f"Run directory: {outcome.run.dir}", markup=False, soft_wrap=True)
        return _print_worlds(outcome.run, outcome.printed, outcome.launcher)
    _print_adaptive(outcome.loaded.record.adaptive)
    out.print(_summary_table(outcome.loaded))
    for line in _fastest(outcome.loaded):
        out.print(line, markup=False, soft_wrap=True)
    eff = outcome.loaded.record.efficiency or Efficiency()
    console.print(
        f"Wall {outcome.wall_s:.1f} s; timed steps {eff.timed_s:.1f} s; {eff.processes_started} rank processes started."
    )
    if not args.no_report:
        run_dir = outcome.run.dir
        path = report.write_report([run_dir], args.report or report.default_report_path(run_dir, args.reports_dir))
        console.print(f"Report: {path}", markup=False, soft_wrap=True)
    return EXIT_FAILED if outcome.failed else EXIT_OK


def _check_sweep_args(args: argparse.Namespace):
    """The options' combinations a sweep refuses (a usage error as ``SystemExit``); the torchrun
    launcher they ask for (None: local)."""
    launcher = _torchrun(args)
    if args.lockstep and not Path(args.lockstep).is_socket():
        _usage(f"--lockstep {args.lockstep}: no gate listens there (a Unix socket of `tpbench gate`)")
    if (args.target_ci is None) != (args.budget_s is None) and not args.resume:
        _usage("--target-ci and --budget-s go together: the rounds an adaptive sweep adds need a limit")
    if args.target_ci is not None and args.print_only:
        _usage("--target-ci with --print: an adaptive sweep decides its rounds as it runs; run it here")
    if args.target_ci is not None and args.lockstep:
        _usage("--target-ci with --lockstep: the gate decides when its sides stop")
    if args.print_only and args.lockstep:
        _usage("--print: a lockstep gate paces worlds this command starts itself; drop --lockstep")
    return launcher


class _SweepDisplay:
    """The sweep's ``Progress``: the run directory once it exists, a line per adaptive batch, and
    each phase's progress bar (``SweepProgress``)."""

    def __init__(self) -> None:
        self.run = None

    def __call__(self, phase):
        if self.run is None:
            self.run = phase.run
            console.print(f"Run directory: {phase.run.dir}", markup=False, soft_wrap=True)
        if phase.batch is not None:
            _print_batch(phase.run.record, phase.batch)
        listener = SweepProgress(phase.cases, phase.items)
        return _showing(listener.progress, listener)


@contextlib.contextmanager
def _showing(progress: Progress, watcher: Any) -> Iterator[Any]:
    """``watcher`` while ``progress`` is on the terminal."""
    with progress:
        yield watcher


def _print_batch(record, batch) -> None:
    """The line an adaptive batch starts with: what is still too wide, and the rounds it adds."""
    widest = max((hw for _, hw in batch.comparisons if hw is not None), default=None)
    console.print(
        f"adaptive batch {batch.number}: {len(batch.comparisons)} comparison(s) above ±"
        f"{record.adaptive.target_ci:.1%}"
        + (f" (widest ±{widest:.1%})" if widest is not None else "")
        + f"; +{max(batch.added.values())} round(s) for {len(batch.cases)} case(s), "
        f"{record.wall_s or 0:.0f} of {record.adaptive.budget_s:g} s spent",
        markup=False,
        soft_wrap=True,
    )


def _print_adaptive(adaptive) -> None:
    """How an adaptive sweep ended (nothing for a planned one)."""
    from tpbench import sweep

    if not adaptive:
        return
    after = [c["half_width"] for c in adaptive.half_widths_after or ()]
    within = sum(hw is not None and hw <= adaptive.target_ci for hw in after)
    said = {
        sweep.TARGET_MET: "target met",
        sweep.BUDGET_SPENT: "budget spent",
        sweep.LOOKS_SPENT: f"the most batches ({sweep.MAX_BATCHES}) added",
    }.get(adaptive.state, "")
    console.print(
        f"adaptive: {said}; {within} of {len(after)} comparison(s) resolve ±{adaptive.target_ci:.1%}, "
        f"{sum((adaptive.rounds_added or {}).values())} repeat(s) added over {len(adaptive.batches)} "
        "batch(es)",
        markup=False,
        soft_wrap=True,
    )


# Bounds of the adaptive options: a target below 0.1% asks for more rounds than any budget holds
# (and 1e-200 overflows the batch size); one above 10000% asks nothing of any interval; a budget beyond a
# week is a typo.
MIN_TARGET_CI, MAX_TARGET_CI = 0.001, 100.0
MAX_BUDGET_S = 7 * 24 * 3600.0


def _target_ci(text: str) -> float:
    """``--target-ci 5%`` or ``0.05``: the half-width every within-run comparison (a sweep's) or
    every case's interval (a gate's) should reach."""
    try:
        value = _fraction(text)
    except argparse.ArgumentTypeError:
        value = 0.0  # out of range below: one message for text and numbers alike
    if not MIN_TARGET_CI <= value <= MAX_TARGET_CI:
        raise argparse.ArgumentTypeError(
            f"{text}: expected a percentage like 5% or a fraction like 0.05, "
            f"from {MIN_TARGET_CI:.1%} to {MAX_TARGET_CI:.0%}"
        )
    return value


def _out_dir(text: str) -> Path:
    """A results folder: its path must be UTF-8, since torch's file store (the ranks' rendezvous)
    and its profiler (the traces) take only such paths; refused here rather than by every rank."""
    try:
        os.fsencode(text).decode("utf-8")
    except UnicodeDecodeError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: not a UTF-8 path; torch's file store and profiler cannot write under it"
        ) from None
    return Path(text)


def _seconds(text: str) -> float:
    """A time budget: finite, above 0 and at most ``MAX_BUDGET_S`` (NaN, inf and 1e308 would never end)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= MAX_BUDGET_S:
        raise argparse.ArgumentTypeError(f"{text}: expected a number of seconds > 0 and <= {MAX_BUDGET_S:g} (7 days)")
    return value


class TuneProgress:
    """The race as it goes: the round, the settings left and the current leader, the item running."""

    def __init__(self, cases: list) -> None:
        from tpbench.suite import labels

        self.labels = labels([cases])[0]
        self.total = len(cases)
        self.progress = Progress(
            TextColumn("[bold]tune"),
            TextColumn("{task.fields[race]}"),
            TextColumn("{task.fields[current]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task("tune", total=None, race=f"{self.total} settings", current="starting…")

    def __call__(self, event: str, data: dict[str, Any]) -> None:
        """Launcher events (the item running)."""
        if event == "world_start":
            self.progress.update(self.task, current=f"starting {data['world_size']} ranks on {data['interconnect']}…")
        elif event == "repeat_start":
            label = self.labels.get(data["case"], data["case"])
            self.progress.update(self.task, current=f"round {data['repeat'] + 1}: {escape(label)}")
        elif event == "round_start":
            n = len(data["items"])
            self.progress.update(self.task, current=f"round {data['items'][0][1] + 1}: {n} settings stepped in turn")
        elif event == "case_failed":
            label = self.labels.get(data["case"], data["case"])
            self.progress.console.print(Text.assemble(("setting failed: ", "red"), f"{label}: {data['cause']}"))

    def round(self, race, entry: dict[str, Any]) -> None:
        """A judged round (on the tune's conductor thread)."""
        leader = self.labels.get(entry["leader"], entry["leader"])
        gone = "".join(
            f"; {verb} {escape(self.labels.get(a, a))}"
            for verb, key in (("eliminated", "eliminated"), ("retired, tied", "retired"), ("back", "back"))
            for a in entry[key]
        )
        self.progress.update(
            self.task,
            race=f"round {entry['round']}/{race.max_rounds}: {len(entry['live'])} of {len(race.arms)} left, "
            f"leader {escape(leader)}{gone}",
        )


def cmd_tune(args: argparse.Namespace) -> int:
    with _stop_signals_interrupt():
        return _tune(args)


def _tune(args: argparse.Namespace) -> int:
    from tpbench import sweep, tune

    launcher = _torchrun(args)
    if args.resume:
        given = [
            f
            for f, v in (
                ("--set", args.set),
                ("--filter", args.filter),
                ("--out", args.out),
                ("--epsilon", args.epsilon),
                ("--confidence", args.confidence),
                ("--budget-s", args.budget_s),
                ("--metric", args.metric),
                ("--min-rounds", args.min_rounds),
            )
            if v is not None and v != []
        ]
        if given or args.suite:
            _usage(
                f"{', '.join(given or [args.suite])} with --resume: a resumed tune races its own settings with its "
                "own options (tune.json)",
                "tune",
            )
        suite, options, launcher = None, tune.Options(), launcher if args.launcher else sweep.RECORDED
    else:
        given = {
            k: v
            for k, v in (("confidence", args.confidence), ("metric", args.metric), ("min_rounds", args.min_rounds))
            if v is not None
        }
        epsilon = args.epsilon if args.epsilon is not None else tune.Options.epsilon
        suite, options = args.suite, tune.Options(epsilon=epsilon, budget_s=args.budget_s, **given)
        options.check()
        if args.dry_run:
            prepared = tune.prepare(args.suite, args.set, args.filter, launcher, args.allow_large)
            title = (
                f"{prepared.suite.name}: {len(prepared.cases)} settings to race, "
                f"at most {prepared.cases[0].repeats} rounds (dry run)"
            )
            out.print(_cases_table(title, prepared.cases))
            return EXIT_OK
    display = _TuneDisplay()
    try:
        result = tune.run(
            suite,
            options,
            overrides=args.set,
            filters=args.filter,
            out=args.out or Path("results"),
            launcher=launcher,
            resume=args.resume,
            allow_large=args.allow_large,
            progress=display,
        )
    except KeyboardInterrupt as e:
        return _resumable(e, display.run, "tune", "The race so far is kept.")
    if args.trace:
        result = _trace_tune(result, launcher)
    _print_tune(result, args.format)
    return EXIT_UNRESOLVED if result.state == tune.UNRESOLVED else EXIT_OK


def _trace_tune(result, launcher):
    """``tune --trace``: the trace sweep after the race (``tune_trace``), its progress on stderr. A
    trace that fails leaves the tune's answer as it is, and says why; Ctrl-C stops the trace only."""
    from tpbench import tune_trace

    console.print("Tracing the recommended setting and its closest rival:", markup=False, soft_wrap=True)
    try:
        return tune_trace.trace(result, launcher, _SweepDisplay())
    except (tune_trace.TraceError, KeyboardInterrupt) as e:
        why = "interrupted" if isinstance(e, KeyboardInterrupt) else str(e)
        console.print(f"[yellow]No trace ({escape(why)}); the tune's answer stands.[/]", soft_wrap=True)
        return result


class _TuneDisplay:
    """The tune's ``Progress``: the run directory, then the race as it goes (``TuneProgress``)."""

    def __init__(self) -> None:
        self.run = None

    def __call__(self, run):
        from tpbench import tune

        self.run = run
        console.print(f"Run directory: {run.dir}", markup=False, soft_wrap=True)
        listener = TuneProgress([tune.Case.from_params(c.params) for c in run.record.cases.values()])
        return _showing(listener.progress, tune.Watch(listener, listener.round))


def _decided(arm) -> str:
    """When the race stopped running an arm: eliminated (clearly slower) or retired (tied: it could no
    longer be epsilon faster than the leader), or both: retired, then shown slower from the rounds it
    had run (its rounds then end before the round it went). An elimination says the interval that
    decided it, against that round's leader: the table's interval against the recommended arm may
    hold 1 (another leader then, or fewer rounds), and without it the elimination would look unfounded."""
    from tpbench import verdict

    said = [] if arm.retired_at is None else [f"retired after round {arm.retired_at}"]
    why = verdict.what_eliminated(arm.status, arm.eliminated_vs)
    if arm.eliminated_at is not None:
        said.append(f"eliminated after round {arm.eliminated_at}" + (f" ({why})" if why else ""))
    elif why:
        said.append(f"eliminated by {why}")
    return ", ".join(said)


# Before a tune's trace_step: a tune traces nothing, and this sweep traces what it recommends.
TRACE_SAYS = (
    "Where the time goes (a tune traces nothing; with --trace it does so after the race): this sweep traces the "
    "recommended setting and its closest rival, if any (with this tune's own --set and launcher options): "
)


def _text_table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> Table:
    """Rows of plain text (escaped: a label may hold brackets) under ``head``."""
    t = Table()
    for col in head:
        t.add_column(col)
    for r in rows:
        t.add_row(*map(escape, r))
    return t


def _md_table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """``_text_table``'s rows as Markdown lines."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]


def _where_table(where: dict) -> tuple[str, tuple[str, ...], list[tuple[str, ...]], str | None]:
    """``tune --trace``'s figures: a title, a table of each traced setting's parts per step, and the
    rival against the recommended setting part by part (None without a rival)."""
    from tpbench import verdict
    from tpbench.analysis.explain import PARTS

    arms = where["arms"]
    steps = verdict.traced_steps_words([a["traced_steps"] for a in arms])
    title = (
        f"Where the time goes (traced after the race, {steps}, scaled to the race's step times; {where['run_dir']}):"
    )
    head = ("setting", "role", "step ms", *(p.replace("_", " ") + " ms" for p in PARTS))
    rows = [(a["label"], a["role"], f"{a['step_ms']:.2f}", *(f"{a['parts_ms'][p]:.2f}" for p in PARTS)) for a in arms]
    return title, head, rows, verdict.rival_line(where)


def _print_tune(result, fmt: str) -> None:
    from tpbench import verdict

    if fmt == "json":
        sys.stdout.write(json.dumps(result.to_json(), indent=2, allow_nan=False) + "\n")
        return
    rows = [
        (
            a.label,
            a.status,
            str(a.rounds),
            "—" if a.ratio is None else f"{a.ratio - 1:+.1%}",
            "—" if a.lo is None else f"[{a.lo - 1:+.1%}, {a.hi - 1:+.1%}]",
            _decided(a),
        )
        for a in result.arms
    ]
    head = ("setting", "status", "rounds", "vs recommended", f"{result.confidence:.0%} interval (spent)", "decided")
    if any(a.heldout_loss is not None for a in result.arms):  # a workload that evaluates: how far each trained
        head += ("held-out loss",)
        rows = [(*r, "—" if a.heldout_loss is None else f"{a.heldout_loss:.3f}") for r, a in zip(rows, result.arms)]
    cost = (
        f"wall {result.wall_s:.0f} s; timed steps {result.timed_s:.1f} s, "
        f"{result.timed_s / result.grid_timed_s:.0%} of the {result.grid_timed_s:.1f} s the whole grid would have timed"
        if result.grid_timed_s
        else f"wall {result.wall_s:.0f} s"
    )
    then = ""  # unresolved: what would likely decide it (docs/tune.md, "Outputs")
    if result.next_step:
        rounds = result.recommended.rounds + result.rounds_to_decide
        then = (
            f"To decide it, race again for about {rounds} rounds "
            "(with this tune's own --set, --filter and launcher options): "
        )
    if fmt == "md":
        lines = [f"**{result.claim}**", *(["", result.training_note] if result.training_note else [])]
        lines += ["", verdict.WORLDS_SAY, *(f"- {w}" for w in result.worlds)] if result.worlds else []
        lines += ["", *_md_table(head, rows)]
        lines += ["", cost, *([f"{then}`{result.next_step}`"] if result.next_step else [])]
        if result.where:
            title, whead, wrows, said = _where_table(result.where)
            lines += ["", title, "", *_md_table(whead, wrows), *(["", said] if said else [])]
        elif result.trace_step:
            lines += ["", f"{TRACE_SAYS}`{result.trace_step}`"]
        sys.stdout.write("\n".join([*lines, ""]) + "\n")
        return
    out.print(result.claim, markup=False, soft_wrap=True)
    if result.training_note:
        out.print(result.training_note, markup=False, soft_wrap=True)
    if result.worlds:
        out.print("\n".join([verdict.WORLDS_SAY, *(f"  {w}" for w in result.worlds)]), markup=False, soft_wrap=True)
    out.print(_text_table(head, rows))
    if result.next_step:
        out.print(then + result.next_step, markup=False, soft_wrap=True)
    if result.where:
        title, whead, wrows, said = _where_table(result.where)
        out.print(title, markup=False, soft_wrap=True)
        out.print(_text_table(whead, wrows))
        if said:
            out.print(said, markup=False, soft_wrap=True)
    elif result.trace_step:
        out.print(TRACE_SAYS + result.trace_step, markup=False, soft_wrap=True)
    console.print(f"{cost}. Run directory: {result.run_dir}", markup=False, soft_wrap=True)


def cmd_report(args: argparse.Namespace) -> int:
    from tpbench import report

    out_path = args.output or report.default_report_path(args.runs[0])
    path = report.write_report(args.runs, out_path, args.metric)
    console.print(f"Report: {path}", markup=False, soft_wrap=True)
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    from tpbench import sweep

    prepared = sweep.prepare(args.suite, args.set, args.filter, allow_large=args.allow_large)
    out.print(f"{args.suite}: ok, {len(prepared.cases)} cases", markup=False, soft_wrap=True)
    return EXIT_OK


def cmd_env(args: argparse.Namespace) -> int:
    from tpbench.environment import fingerprint

    out.print_json(json.dumps(fingerprint(), default=str))
    return EXIT_OK


def _count(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n >= 1e5 else f"{n / 1e3:.1f} k"


def cmd_list(args: argparse.Namespace) -> int:
    from tpbench.algorithms import ALGORITHMS
    from tpbench.workloads import WORKLOADS, preset_sizes

    t = Table(title="algorithms")
    t.add_column("name")
    t.add_column("description")
    t.add_column("uses")
    for a in ALGORITHMS.values():
        t.add_row(a.name, a.description, ", ".join(sorted(a.uses)))
    out.print(t)
    w = Table(title="workloads")
    w.add_column("name")
    w.add_column("[workloads.NAME] keys")
    w.add_column("parameters (preset: count)")
    import dataclasses

    for name, cls in WORKLOADS.items():
        sizes = ", ".join(f"{k}: {_count(v)}" for k, v in preset_sizes(cls).items())
        from_preset = set(next(iter(cls.presets.values()), {}))
        keys = (
            f"{f.name}={'(preset)' if f.name in from_preset else repr(f.default)}"
            for f in dataclasses.fields(cls.Params)
        )
        w.add_row(name, ", ".join(keys), sizes)
    out.print(w)
    suites_dir = Path(args.suites)
    if suites_dir.is_dir():
        s = Table(title=escape(f"suites in {suites_dir}"))
        s.add_column("file")
        s.add_column("description")
        for p in sorted(suites_dir.glob("*.toml")):
            s.add_row(escape(p.name), escape(_suite_description(p)))
        out.print(s)
    return EXIT_OK


def _suite_description(path: Path) -> str:
    """A suite file's description for ``tpbench list``; a broken file is listed as such (its
    problem in one line), never the end of the listing."""
    import tomllib

    try:
        doc = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError, RecursionError) as e:
        return f"(unreadable: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'nested too deeply'})"
    meta = doc.get("suite")
    desc = meta.get("description") if isinstance(meta, dict) else None
    return desc if isinstance(desc, str) else ""


def _verdict_args(p: argparse.ArgumentParser) -> None:
    from tpbench.environment import COMPARABLE_KEYS

    p.add_argument("--metric", default="step_ms", help="per-step column to compare, lower is better (default: step_ms)")
    p.add_argument("--threshold", default="5%", help="changes within ±THRESHOLD pass (default: 5%%)")
    p.add_argument("--format", choices=("text", "md", "json"), default="text", help="output on stdout (default: text)")
    p.add_argument(
        "--fail-on-inconclusive", action="store_true", help="exit 4 when a case is inconclusive (default: exit 0)"
    )
    p.add_argument(
        "--ignore-env",
        action="append",
        default=[],
        choices=COMPARABLE_KEYS,
        metavar="KEY",
        help=f"compare even though this fingerprint key differs ({', '.join(COMPARABLE_KEYS)})",
    )


def _print_verdict(comparison, fmt: str) -> int:
    from tpbench import explain, render

    comparison = explain.annotate(comparison)  # a regression names its top contributor where traced
    sys.stdout.write(render.RENDERERS[fmt](comparison))
    sys.stdout.flush()
    return comparison.exit_code


def cmd_compare(args: argparse.Namespace) -> int:
    from tpbench import compare

    threshold = compare.parse_threshold(args.threshold)
    if len(args.runs) == 1:
        within = compare.within_run(
            args.runs[0],
            metric=args.metric,
            threshold=threshold,
            fail_on_inconclusive=args.fail_on_inconclusive,
            pairs=args.pair,
            filters=args.filter,
        )
        if not within.pairs:
            # "pass" over no comparison would let a CI job pass on a typo or a one-case run.
            console.print(
                f"tpbench compare: error: {args.runs[0]}: nothing to compare: no two finished cases"
                + (" that --filter/--pair keep" if args.filter or args.pair else "")
                + " differ in exactly one swept key",
                soft_wrap=True,
                markup=False,
            )
            return EXIT_USAGE
        return _print_verdict(within, args.format)
    if args.pair or args.filter:
        flags = ", ".join(f for f, v in (("--pair", args.pair), ("--filter", args.filter)) if v)
        console.print(
            f"tpbench compare: error: {flags}: only with a single RUN_DIR (pairs of cases within one run)",
            soft_wrap=True,
            markup=False,
        )
        return EXIT_USAGE
    comparison = compare.compare_runs(
        args.runs[:-1],
        args.runs[-1:],
        metric=args.metric,
        threshold=threshold,
        fail_on_inconclusive=args.fail_on_inconclusive,
        ignore_env=args.ignore_env,
    )
    return _print_verdict(comparison, args.format)


def cmd_explain(args: argparse.Namespace) -> int:
    from tpbench import explain, render

    report = explain.run(args.runs, pairs=args.pair)
    sys.stdout.write(render.EXPLAIN_RENDERERS[args.format](report))
    sys.stdout.flush()
    return EXIT_OK


def cmd_gate(args: argparse.Namespace) -> int:
    with _stop_signals_interrupt():  # SIGTERM/SIGHUP: the sides stopped, their sockets removed, said so
        return _gate(args)


def _gate(args: argparse.Namespace) -> int:
    from tpbench import compare, gate, store

    threshold = compare.parse_threshold(args.threshold)  # before minutes of sweeps, not after
    lockstep_only = {
        "--repeats": args.repeats,
        "--target-ci": args.target_ci,
        "--seed": args.seed,
        "--budget-s": args.budget_s,
    }
    misplaced = [f for f, v in lockstep_only.items() if v is not None] if args.mode == "rounds" else []
    if args.mode == "lockstep" and args.rounds is not None:
        misplaced = ["--rounds"]
    if misplaced:
        raise compare.GateError(f"{', '.join(misplaced)}: not an option of --mode {args.mode}")
    given = {
        k: v for k, v in (("repeats", args.repeats), ("budget_s", args.budget_s), ("seed", args.seed)) if v is not None
    }
    if args.target_ci is not None:
        given = {"repeats": gate.ADAPTIVE_REPEATS} | given | {"target_ci": args.target_ci}
    cfg = gate.Lockstep(metric=args.metric, **given)
    judged = gate.run(
        args.suite,
        args.baseline,
        args.candidate,
        (args.out or Path("results") / "gate" / store.new_run_id()).absolute(),
        mode=args.mode,
        rounds=args.rounds or 5,
        cfg=cfg,
        overrides=args.set,
        filters=args.filter,
        candidate_overrides=args.candidate_set,
        announce=lambda line: console.print(line, soft_wrap=True, markup=False),
        threshold=threshold,
        fail_on_inconclusive=args.fail_on_inconclusive,
        ignore_env=args.ignore_env,
        explain_steps=gate.EXPLAIN_STEPS if args.explain else 0,
    )
    if judged.record is not None and "answer" in judged.record:
        console.print(
            f"Gate answer: {judged.record['answer']} (each case's pairs by the sequential rule, target "
            f"±{cfg.target_ci:.1%}; {judged.record['stopped']})",
            soft_wrap=True,
            markup=False,
        )
    console.print(f"Gate runs: {judged.out}", soft_wrap=True, markup=False)
    return _print_verdict(judged.comparison, args.format)


def _fraction(text: str) -> float:
    """``2%`` or ``0.02`` → 0.02: a percentage, or a bare number read as a fraction (the range is each
    option's own check: ``_target_ci``, ``tune.Options.check``)."""
    raw = text.strip()
    try:
        return float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text}: expected a percentage like 2% or a fraction like 0.02") from None


def cmd_export(args: argparse.Namespace) -> int:
    from tpbench import export as exports

    export = exports.export_run(args.run, args.format)
    for label in export.skipped:
        console.print(
            f"[yellow]not exported:[/] {escape(label)} (no timed steps: the case failed or never ran)", soft_wrap=True
        )
    if args.output:
        export.write(args.output)
        console.print(f"Wrote {args.output}", soft_wrap=True, markup=False)
    else:
        sys.stdout.write(export.text)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tpbench", description="Profile and benchmark PyTorch DDP communication hooks.")
    sub = ap.add_subparsers(dest="command", required=True)

    def suite_args(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a default or a swept key (capture.KEY, workloads.NAME.KEY reach those tables)",
        )
        p.add_argument(
            "--filter",
            action="append",
            default=[],
            metavar="KEY=V1|V2",
            help="keep only matching cases (KEY!=V excludes; id=PREFIX matches case ids)",
        )

    def allow_large_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--allow-large",
            action="store_true",
            help="run worlds and sweeps beyond this machine's limits (4 ranks per core, 512 MiB per rank; 10000 cases)",
        )

    def torchrun_args(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
        t = p.add_argument_group("torchrun (multi-node; the results root must be on a filesystem every node sees)")
        t.add_argument(
            "--launcher",
            choices=("local", "torchrun"),
            help="start the ranks here (local, the default) or each world as a torchrun job; --resume reuses the run's",
        )
        t.add_argument("--nnodes", type=int, help="nodes per world (default: 1)")
        t.add_argument("--nproc-per-node", type=int, help="ranks per node (default: the world size / --nnodes)")
        t.add_argument(
            "--rdzv-endpoint",
            metavar="HOST:PORT",
            help="c10d rendezvous on the first node (needed with --nnodes > 1; default: torchrun --standalone)",
        )
        t.add_argument(
            "--agent-prefix",
            metavar="CMD",
            help="command that starts one torchrun agent per node, "
            "e.g. 'srun --ntasks-per-node=1 --kill-on-bad-exit=1'",
        )
        return t

    p = sub.add_parser("sweep", help="run a suite")
    p.add_argument("suite", nargs="?", help="suite TOML file (not needed with --resume)")
    suite_args(p)
    allow_large_arg(p)
    p.add_argument("--out", type=_out_dir, help="results root (default: results)")
    p.add_argument("--resume", type=Path, metavar="RUN_DIR", help="run only the missing or failed cases of RUN_DIR")
    p.add_argument("--dry-run", action="store_true", help="list the cases and exit")
    p.add_argument("--no-report", action="store_true", help="do not write the HTML report")
    p.add_argument("--report", type=Path, metavar="FILE", help="report path (default: reports/<suite>-<run_id>.html)")
    p.add_argument("--reports-dir", type=Path, default=Path("reports"), help=argparse.SUPPRESS)
    # Set by `tpbench gate` (lockstep mode): the Unix socket its worlds ask before each item.
    p.add_argument("--lockstep", metavar="SOCKET", help=argparse.SUPPRESS)
    a = p.add_argument_group("adaptive budget (after the planned repeats, rounds for comparisons still too wide)")
    a.add_argument(
        "--target-ci",
        type=_target_ci,
        metavar="PCT",
        help="add rounds until every within-run comparison (`tpbench compare RUN_DIR`) resolves ±PCT, e.g. 5%%",
    )
    a.add_argument(
        "--budget-s",
        type=_seconds,
        metavar="SECONDS",
        help="with --target-ci: stop adding rounds once the run has spent this long running worlds, "
        "the planned repeats included",
    )
    t = torchrun_args(p)
    t.add_argument(
        "--print",
        dest="print_only",
        action="store_true",
        help="write the plans and print the torchrun command(s) to run on every node, then exit; "
        "`--resume RUN_DIR` afterwards records what they did",
    )
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser(
        "tune", help="race a suite's swept settings and name the best, with a margin and a confidence (docs/tune.md)"
    )
    p.add_argument("suite", nargs="?", help="suite TOML file: its swept grid is the settings raced (not with --resume)")
    suite_args(p)
    allow_large_arg(p)
    p.add_argument("--out", type=_out_dir, help="results root (default: results)")
    p.add_argument("--resume", type=Path, metavar="RUN_DIR", help="go on with an interrupted tune of RUN_DIR")
    p.add_argument("--dry-run", action="store_true", help="list the settings and exit")
    p.add_argument(
        "--epsilon",
        type=_fraction,
        metavar="PCT",
        help="the claim: the setting named is within PCT of the best, 2%% or 0.02 (default: 2%%)",
    )
    p.add_argument(
        "--confidence", type=_fraction, help="of the whole claim, above 0.5, below 1: 0.95 or 95%% (default: 0.95)"
    )
    p.add_argument(
        "--budget-s", type=_seconds, metavar="SECONDS", help="stop after this long, resolved or not (default: no limit)"
    )
    p.add_argument("--metric", choices=("step_ms", "cpu_ms"), help="what is raced (default: wall time per step)")
    p.add_argument(
        "--min-rounds",
        type=int,
        help="rounds every setting runs before the first elimination or retirement (default: 3); repeats is the most",
    )
    p.add_argument("--format", choices=("text", "md", "json"), default="text", help="how to print the result")
    p.add_argument(
        "--trace",
        action="store_true",
        help="after the race, trace the recommended setting and its closest rival and say where their time goes",
    )
    torchrun_args(p)
    p.set_defaults(func=cmd_tune, print_only=False)

    p = sub.add_parser("report", help="write the HTML report of one run, or compare several")
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    p.add_argument("-o", "--output", type=Path, metavar="FILE")
    p.add_argument(
        "--metric",
        choices=("step_ms", "cpu_ms"),
        default="step_ms",
        help="what the verdicts compare: wall time per step (default) or the ranks' CPU time per step",
    )
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("validate", help="check a suite without running it")
    p.add_argument("suite")
    suite_args(p)
    allow_large_arg(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("env", help="print this machine's environment fingerprint")
    p.set_defaults(func=cmd_env)

    p = sub.add_parser("list", help="list algorithms, workloads and suites")
    p.add_argument("--suites", default="suites", help="folder of suites (default: suites)")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser(
        "compare",
        help="judge a candidate run against baseline run(s), or the cases of one run pair by pair: "
        "pass/regression/improvement/…",
    )
    p.add_argument(
        "runs",
        nargs="+",
        type=Path,
        metavar="RUN_DIR",
        help="BASELINE_RUN... CANDIDATE_RUN (several baselines are pooled); one RUN_DIR: its cases that differ "
        "in one swept key, pair by pair",
    )
    _verdict_args(p)
    p.add_argument(
        "--pair",
        action="append",
        default=[],
        metavar="KEY=BASELINE..CANDIDATE",
        help="one run: judge only these comparisons (repeatable), e.g. "
        "algorithm=hook_with_zero_step..hook_with_zero_step_interleaved",
    )
    p.add_argument(
        "--filter",
        action="append",
        default=[],
        metavar="KEY=V1|V2",
        help="one run: compare only the cases that match (as for sweep; KEY!=V excludes)",
    )
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser(
        "explain",
        help="split a step-time change into compute, exposed communication, optimizer, idle and straggler wait",
    )
    p.add_argument(
        "runs",
        nargs="+",
        type=Path,
        metavar="RUN_DIR",
        help="BASE_RUN CAND_RUN (their cases matched as compare matches them), or one RUN_DIR with --pair",
    )
    p.add_argument(
        "--pair",
        action="append",
        default=[],
        metavar="KEY=BASELINE..CANDIDATE",
        help="one run: explain these comparisons of its cases (repeatable), e.g. interconnect=loopback..tcp-1gbit",
    )
    p.add_argument("--format", choices=("text", "md", "json"), default="text", help="output on stdout (default: text)")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("gate", help="run a suite for baseline and candidate in this job, in lockstep, and judge")
    p.add_argument("suite", help="suite TOML file")
    p.add_argument(
        "--baseline",
        required=True,
        metavar="PATH_OR_CMD",
        help="python executable, venv directory, source tree (pyproject.toml) or tpbench command prefix",
    )
    p.add_argument("--candidate", required=True, metavar="PATH_OR_CMD", help="same forms as --baseline")
    p.add_argument(
        "--mode",
        choices=("lockstep", "rounds"),
        default="lockstep",
        help="lockstep: one world per side, alternating repeat by repeat (default); rounds: whole sweeps "
        "alternating, for a side whose tpbench predates lockstep",
    )
    p.add_argument(
        "--repeats",
        type=int,
        help="lockstep: the most repeats per case (default: 30; 500 with --target-ci)",
    )
    p.add_argument(
        "--target-ci",
        type=_target_ci,
        metavar="PCT",
        help="lockstep: stop once every case's interval half-width is at most PCT (after 10 pairs per case)",
    )
    p.add_argument(
        "--budget-s",
        type=_seconds,
        metavar="SECONDS",
        help="lockstep: stop after this long, whatever is left (default: 480)",
    )
    p.add_argument("--seed", type=int, help="lockstep: seed of each round's side order (default: 0)")
    p.add_argument("--rounds", type=int, help="rounds mode: sweeps per side, alternating (default: 5)")
    suite_args(p)
    p.add_argument(
        "--candidate-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override for the candidate only (e.g. slowdown_pct=10 to check the gate itself)",
    )
    p.add_argument(
        "--out", type=_out_dir, help="where the gate's runs, logs and gate.json go (default: results/gate/<id>)"
    )
    _verdict_args(p)
    p.add_argument(
        "--explain",
        action="store_true",
        help="on a regression, trace a few steps of each side afterwards (the gate traces nothing while it "
        "measures) and name each regression's top contributor (compute, exposed_comm, ...; see tpbench explain)",
    )
    p.set_defaults(func=cmd_gate)

    p = sub.add_parser("export", help="write a run as pytest-benchmark or github-action-benchmark JSON")
    p.add_argument("run", type=Path, metavar="RUN_DIR")
    p.add_argument("--format", required=True, choices=("pytest-benchmark", "custom-smaller-is-better"))
    p.add_argument("-o", "--output", type=Path, metavar="FILE", help="write here instead of stdout")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser(
        "whatif", help="project a run's step times onto other fabrics (α–β model), validated on its emulated links"
    )
    p.add_argument("run", type=Path, metavar="RUN_DIR")
    p.add_argument(
        "--fabric", action="append", default=[], metavar="NAME", help="project onto these fabrics only (default: all)"
    )
    p.add_argument(
        "--fabrics",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="TOML with [fabrics.NAME] latency_us, bandwidth_GBps (adds to or overrides the built-in table)",
    )
    p.add_argument(
        "--reference",
        metavar="LINK",
        help="interconnect whose cases are modelled (default: loopback, else the run's first)",
    )
    p.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="text: the tables and the answer; json: projections, intervals, refusals, validation and ranking",
    )
    p.set_defaults(func=cmd_whatif)
    return ap


def cmd_whatif(args: argparse.Namespace) -> int:
    from tpbench import whatif_run

    try:
        fabrics = whatif_run.load_fabrics(args.fabrics)
    except ValueError as e:
        _error(e)
        return EXIT_USAGE
    unknown = [f for f in args.fabric if f not in fabrics]
    if unknown:
        console.print(
            f"tpbench whatif: error: unknown fabric(s) {', '.join(unknown)}; known: {', '.join(fabrics)}", markup=False
        )
        return EXIT_USAGE
    try:
        written = whatif_run.write(args.run, {k: fabrics[k] for k in (args.fabric or fabrics)}, args.reference)
    except ValueError as e:
        _error(e)
        return EXIT_RESULTS
    if args.format == "json":
        sys.stdout.write(json.dumps(written.to_json(), indent=2, allow_nan=False) + "\n")
        return EXIT_OK
    if len(written.result.validation):
        _print_whatif_validation(written)
    t = Table(
        title="PROJECTED step time (ms) [95% interval]: this machine's compute with each fabric's α–β communication"
    )
    t.add_column("case")
    t.add_column(f"measured ({written.result.reference})", justify="right")
    t.add_column("compute critical path", justify="right")
    t.add_column("compute beside comm", justify="right")
    for name in written.fabrics():
        t.add_column(name, justify="right")
    for row in written.projection_rows():
        t.add_row(*row)
    out.print(t)
    for line in written.refused_models():
        console.print(Text.assemble(("(*) refused ", "yellow"), line))
    for line in written.ranking_lines():
        out.print(f"projection: {line}", markup=False)
    console.print(f"tables: {written.projections_path}, {written.validation_path}", markup=False)
    return EXIT_OK


def _print_whatif_validation(written) -> None:
    """The what-if's validation: each emulated link predicted from its twins, what was refused, the errors."""
    from tpbench import whatif_run

    t = Table(title="validation: emulated links predicted from their twins on other links")
    numbers = ("measured ms [95% CI]", "predicted ms [95% interval]", "error", "target's host ×")
    for col in ("direction", "case", "from", "link", *numbers):
        t.add_column(col, justify="right" if col in numbers else "left")
    for row in written.validation_rows():
        t.add_row(*row)
    out.print(t)
    for line in written.refused_references():
        console.print(Text.assemble(("refused ", "yellow"), line))
    for e in written.result.errors().to_dict("records"):
        out.print(whatif_run.error_line(e), markup=False)


def _error(e: Exception) -> None:
    # User text (file names, keys like "[defaults] steps") must not be read as rich markup.
    console.print(Text.assemble(("error: ", "red"), str(e)), soft_wrap=True)


def main(argv: list[str] | None = None) -> None:
    from tpbench.compare import GateError
    from tpbench.explain import ExplainError
    from tpbench.gate import SideError
    from tpbench.interconnect import InterconnectUnavailable
    from tpbench.store import StoreError
    from tpbench.suite import SuiteError
    from tpbench.tune import TuneError

    args = build_parser().parse_args(argv)
    if args.command in ("sweep", "tune") and not args.suite and not args.resume:
        console.print(f"tpbench {args.command}: error: give a SUITE file, or --resume RUN_DIR", markup=False)
        sys.exit(EXIT_USAGE)
    try:
        code = args.func(args)
    except (SuiteError, InterconnectUnavailable) as e:
        _error(e)
        code = EXIT_USAGE
    except StoreError as e:
        _error(e)
        code = EXIT_RESULTS
    except OSError as e:
        # A disk that fills up or a folder that disappears mid-sweep: what finished is on disk.
        _error(RuntimeError(f"{e.filename or ''}: {e.strerror or e}"))
        code = EXIT_RESULTS
    except KeyboardInterrupt as e:
        # Before a run directory exists (or outside a sweep): nothing to resume, nothing to say but that.
        said, code = _interrupted(e)
        console.print(said, markup=False)
    except (GateError, TuneError, ExplainError) as e:
        _error(e)
        code = EXIT_USAGE
    except SideError as e:
        _error(e)
        code = EXIT_RESULTS
    sys.exit(code)
