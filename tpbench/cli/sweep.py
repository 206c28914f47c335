"""``tpbench sweep``: its options' checks, its progress on the terminal and its summary."""

from __future__ import annotations

import argparse
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from rich.markup import escape
from rich.progress import BarColumn, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from tpbench.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    FoldedProgress,
    RunElapsedColumn,
    cases_table,
    console,
    fitted,
    given_flags,
    interrupted,
    label_column,
    link_text,
    nodes_of,
    out,
    plain_progress,
    redraws,
    resumable,
    resumed_launcher,
    showing,
    stop_signals_interrupt,
    torchrun_launcher,
    usage,
    warn_unused,
)
from tpbench.pace import PlainPace

if TYPE_CHECKING:
    from tpbench.sweep import Outcome


class SweepProgress:
    """Renders launcher events: repeats run of those planned, the current case, cases settled, ETA.

    ``items``: each case's items still to run; the cases' other repeats are on disk (a resume, an
    adaptive batch), counted as run from the start, and ``earlier_s`` is the run's time before
    (``RunElapsedColumn``), so that a resumed run's line does not read as a run begun afresh. The
    ETA stays this session's pace over the repeats left. A case that fails runs none after, so its rest
    leaves the bar's total (the ETA counts only what will run) and is said as dropped beside the
    count of the planned ones: a sweep whose every case failed reads "0/4 repeats, 4 dropped", not
    "0/0". Cases run interleaved, so the line names the case of the repeat in flight and counts the
    cases settled apart, rather than numbering the case by how many ended before it.

    Away from a terminal (``redraws``) the line is disabled and plain lines are said instead
    (``plain_progress``): each world's start and end, each trace window taken again and each
    failure, and between them a finished repeat only when ``PlainPace`` says one is due (``clock``
    is its clock); a case's last repeat on the line of its end, which follows it, so that the count
    of cases done is the case's own. Every line is said whole (``soft_wrap``): a log's console is
    80 columns wide, and rich wrapped a failure's cause there into pieces a grep finds one of.
    """

    def __init__(
        self,
        cases: list,
        items: dict[str, int],
        clock: Callable[[], float] = time.monotonic,
        earlier_s: float = 0.0,
        nnodes: int = 1,
    ) -> None:
        from tpbench.suite import labels

        self.nnodes = nnodes  # the nodes each world spans, said as the dry run says them (``link_text``)
        self.left = dict(items)
        self.labels = labels([cases])[0]
        self.repeats = {c.case_id: c.repeats for c in cases}
        self.trace_windows = {c.case_id: c.trace_windows for c in cases}
        self.passes = max((c.passes for c in cases), default=1)
        self.progress = FoldedProgress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[tally]}"),
            RunElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            below=("current",),
            console=console,
            transient=False,
            disable=not redraws(console),
            get_time=clock,
        )
        self.planned = self.total = sum(items.values())
        self.run = 0
        self.before = sum(self.repeats.values()) - self.planned  # on disk already
        self.task = self.progress.add_task(
            "repeats",
            total=self.before + self.total,
            completed=self.before,
            current="starting worlds…",
            tally=self._tally(),
            earlier_s=earlier_s,
        )
        self.done_cases = 0
        self.failed_cases = 0
        self.total_cases = len(cases)
        self.pace = PlainPace(self.planned, clock)
        self.world, self.world_left = "", 0

    def _tally(self) -> str:
        """Repeats run of those planned, and those a failed case will not run."""
        dropped = self.planned - self.total
        return f"{self.before + self.run}/{self.before + self.planned}" + (f", {dropped} dropped" if dropped else "")

    def _cases(self) -> str:
        """The cases settled: "cases 1/3 done, 1 failed"."""
        failed = f", {self.failed_cases} failed" if self.failed_cases else ""
        return f"cases {self.done_cases}/{self.total_cases} done{failed}"

    def __call__(self, event: str, data: dict[str, Any]) -> None:
        if event == "world_start":
            turn = f"pass {data['sweep_pass']}/{self.passes}: " if "sweep_pass" in data else ""
            link = link_text(data["backend"], data["interconnect"], self.nnodes)
            self.world = f"{turn}world of {data['world_size']} ranks on {link}"
            self.world_left = data["items"]
            ranks = f"{turn}starting {data['world_size']} ranks on {link}…"
            self.progress.update(self.task, current=ranks)
            self._say(ranks)
        elif event == "world_done":
            self._say(f"repeats {self._tally()}: {self.world} finished; {self._cases()}")
        elif event == "repeat_start":
            label = self.labels.get(data["case"], data["case"])
            self.progress.update(
                self.task,
                current=f"{escape(label)} (repeat {data['repeat'] + 1}/{self.repeats.get(data['case'], '?')}); "
                f"{self._cases()}",
            )
        elif event == "repeat_end":
            if data["case"] in self.left:
                self.left[data["case"]] -= 1
            self.run += 1
            self.world_left -= 1
            self.progress.update(self.task, advance=1, tally=self._tally())
            if data["repeat"] + 1 < self.repeats.get(data["case"], 0):  # the last one: said as its case ends
                self._routine(data["case"], data["repeat"])
        elif event == "case_end":
            self.done_cases += 1
            self.progress.update(self.task, current=self._cases())
            self._routine(data["case"], self.repeats.get(data["case"], 1) - 1)
        elif event == "world_retry":
            self.progress.console.print(
                Text.assemble(("world failed: ", "yellow"), f"{data['cause']}; trying a fresh one"), soft_wrap=True
            )
        elif event == "trace_retry":
            label = self.labels.get(data["case"], data["case"])
            self.progress.console.print(
                Text.assemble(
                    ("trace failed: ", "yellow"), f"{label}: {data['cause']}; its last repeat again in a fresh world"
                ),
                soft_wrap=True,
            )
        elif event == "trace_retake":
            label = self.labels.get(data["case"], data["case"])
            # "of at most": the windows traced stop at the first fast enough, and the kept line counts those traced.
            most = self.trace_windows.get(data["case"], "?")
            again = f"{label}: tracing again, window {data['window']} of at most {most}"
            self.progress.update(self.task, current=escape(again))
            self._say(again)
        elif event == "capture":
            self._trace_kept(data)
        elif event == "case_failed":
            self._case_failed(data)

    def _trace_kept(self, data: dict[str, Any]) -> None:
        """Once per case traced again, which window was kept and how fast it ran (``capture.kept_text``),
        from the trace entry its run.json records: a line per retake said that a window was traced
        again, twice for a case traced three times, and never whether the one kept was usable."""
        from tpbench.capture import kept_text
        from tpbench.record import TraceWindow

        said = kept_text(TraceWindow.from_json(data["trace"])) if data.get("trace") else None
        if said:
            label = self.labels.get(data["case"], data["case"])
            self.progress.console.print(Text.assemble(("trace of ", "yellow"), f"{label}: {said}"), soft_wrap=True)

    def _repeat_done(self, case: str, repeat: int) -> str:
        """ "repeats 3/4: ddp repeat 2/2 done; cases 1/2 done"."""
        label, of = self.labels.get(case, case), self.repeats.get(case, "?")
        return f"repeats {self._tally()}: {label} repeat {repeat + 1}/{of} done; {self._cases()}"

    def _routine(self, case: str, repeat: int) -> None:
        """A finished repeat's plain line, when the log's pace has one due; not the world's last,
        which the line of the world's end, next, says with the same counts."""
        if self.world_left > 0 and self.pace.due(self.run):
            self._say(self._repeat_done(case, repeat))

    def _say(self, said: str) -> None:
        """``said`` as a plain line where the progress line is disabled (not on a terminal)."""
        if self.progress.disable:
            plain_progress(self.progress.tasks[0], said, eta=True)
            self.pace.said(self.run)

    def _case_failed(self, data: dict[str, Any]) -> None:
        self.failed_cases += 1
        self.total -= max(0, self.left.pop(data["case"], 0))
        label = self.labels.get(data["case"], data["case"])
        self.progress.update(
            self.task,
            total=self.before + self.total,
            tally=self._tally(),
            current=f"{escape(label)} failed; {self._cases()}",
        )
        failed = Text.assemble(("case failed: ", "red"), f"{label}: {data['cause']}")
        self.progress.console.print(failed, soft_wrap=True)


def _fastest(loaded) -> list[str]:
    """The report's first verdict, per setting of more than one case: the fastest case by the
    statistic its comparisons use (the geometric mean of per-repeat values; the table above sorts by
    the median) and whether it is clearly ahead of the runner-up, so that the terminal and the report
    name the same case. Where the run knows a target loss, then the report's soonest-to-target lines:
    settings that train differently (post-local SGD's) are not ranked by their step, and the fastest
    alone would recommend one that reaches the target later. Last, where repeats ran on a busy machine,
    how many (the report's Machine load, which the verdicts above do not weigh)."""
    from tpbench.report import data as report_data
    from tpbench.report import telemetry, verdicts

    data = report_data.load([loaded])
    busy = telemetry.busy_line(data)
    return verdicts.fastest_lines(data, alone=False) + verdicts.soonest_lines(data) + ([busy] if busy else [])


def _few_repeats(table) -> str:
    """``verdict.few_repeats_note`` of the table's cases, after the caption's own words."""
    from tpbench import verdict

    note = verdict.few_repeats_note(verdict.repeat_counts(table))
    return f". {note}" if note else ""


def _summary_table(loaded) -> Table:
    """The sweep's table of step times. Its caption is left-justified: wrapped to the table's width
    and centred, as rich does by default, its lines began at odd indents (most visibly in a file).
    The interval column is headed "95% CI" only where every row's interval is one: a range of 2 to 5
    repeats holds the median with less confidence (the caption's note), and is headed "interval"."""
    few = _few_repeats(loaded.table)
    t = Table(
        title=escape(f"{loaded.record.suite.name} · run {loaded.record.run_id}"),
        caption=f"ms/step: the median of the repeats' values, with {'an interval' if few else 'the 95% CI'} of that "
        "median (—: one repeat, no interval); steps p10–p90: the spread of single timed steps" + few,
        caption_justify="left",
    )
    label_column(t, "case")
    for col, just in [
        ("status", "left"),
        ("ms/step", "right"),
        ("interval" if few else "95% CI", "right"),
        ("steps p10–p90", "right"),
        ("samples/s", "right"),
    ]:
        t.add_column(col, justify=just)
    for row in loaded.table.sort_values("median_ms", na_position="last").to_dict("records"):
        if row.get("median_ms") == row.get("median_ms") and row.get("median_ms") is not None:
            t.add_row(
                escape(row["label"]),
                row["status"],
                f"{row['median_ms']:.2f}",
                f"[{row['ci_lo_ms']:.2f}, {row['ci_hi_ms']:.2f}]" if row["ci_lo_ms"] == row["ci_lo_ms"] else "—",
                f"{row['p10_ms']:.2f}–{row['p90_ms']:.2f}",
                f"{row['samples_per_s']:.0f}",
            )
        else:
            t.add_row(escape(row["label"]), f"[red]{row['status']}[/]", "", "", "", "")
    return t


def _closing_line(outcome: Outcome, resumed: bool) -> str:
    """Wall time, timed steps and processes started, on stdout with the table and the fastest line it
    closes (``> results.txt`` kept the table without what it cost; tune's cost line is on stdout too).
    The last two are the whole run's (its record's efficiency), so a resume says its own wall time
    apart from the run's: "Wall 0.2 s; timed steps 4.0 s" on a resume that only wrote the summary read
    as more time timed than spent."""
    from tpbench.record import Efficiency

    eff = outcome.loaded.record.efficiency or Efficiency()
    started = eff.started_text()
    if not resumed:  # the worlds' time apart: the report gives that one, without the analysis after them
        worlds = f" ({eff.worlds_text()})" if eff.wall_s else ""
        return f"Wall {outcome.wall_s:.1f} s{worlds}; timed steps {eff.timed_s:.1f} s; {started}."
    run = ", ".join(t for t in (eff.worlds_text(), f"{eff.timed_s:.1f} s in timed steps", started) if t)
    return f"Wall {outcome.wall_s:.1f} s this resume; the whole run: {run}."


def _failures_line(run_dir: Path, failed: int, report: Path | None) -> str:
    """Where a failed case's whole cause (a raising rank's traceback, a hung world's stacks) and its
    ranks' last log lines are, and how to run it again: the line printed as it failed gives only the
    cause's first line ("rank 1 raised RuntimeError: ..."), and the rest, which the report shows, is
    otherwise found only by reading run.json."""
    cases, them = ("1 case", "it") if failed == 1 else (f"{failed} cases", "them")
    shown = f"under 'Failed cases' in {report} and " if report else ""
    again = shlex.join(["tpbench", "sweep", "--resume", str(run_dir)])
    return (
        f"{cases} failed: the cause in full (a raising rank's traceback, or each rank's stacks when a repeat timed "
        f"out) and the ranks' last log lines are {shown}"
        f"in {run_dir / 'run.json'} (each case's detail); after a fix, {again} runs {them} again."
    )


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


def _loop_left(run, todo: list) -> str:
    """What a resume's adaptive loop does after the missing cases (nothing for a planned run): a run
    cut off between batches has 0 cases to resume and still more batches to run."""
    from tpbench import sweep

    batches = sweep.batches_left(run, todo)
    if batches is None:
        return ""
    adaptive, spent = run.record.adaptive, run.record.wall_s or 0.0
    budget = f"{spent:.0f} of {adaptive.budget_s:g} s spent"
    if batches == 0 or spent >= adaptive.budget_s:
        return f"; then the adaptive loop ends ({sweep.MAX_BATCHES - batches} batch(es) run, {budget})"
    return f"; the adaptive loop goes on: up to {batches} more batch(es) within the budget left ({budget})"


def _loop_ahead(args: argparse.Namespace) -> str:
    """What a fresh adaptive sweep may run after its planned cases (nothing for a planned one): its
    dry run listed the planned repeats alone, the same with --target-ci as without."""
    from tpbench import sweep

    if args.target_ci is None:
        return ""
    return (
        f"; then up to {sweep.MAX_BATCHES} adaptive batch(es) of rounds until each comparison resolves "
        f"±{args.target_ci:.1%} or {args.budget_s:g} s of worlds are spent"
    )


def _check_resume_args(args: argparse.Namespace) -> None:
    """``--resume`` runs the run's own suite: what would change its cases is refused, so that the
    missing cases measure what the finished ones did."""
    from tpbench import store, suite, sweep, user_files

    sweep.refuse_a_tune(args.resume)
    changed = given_flags(
        {
            "--set": args.set,
            "--filter": args.filter,
            "--out": args.out,
            "--target-ci": args.target_ci,
            "--budget-s": args.budget_s,
        }
    )
    if changed:
        usage(
            f"{', '.join(changed)} with --resume: a resumed run runs its own suite's missing cases unchanged, "
            "in its own directory (start a new sweep to change them)"
        )
    if args.suite:
        source = store.read_record(args.resume).suite
        # A run started with --set recorded them after the file's text: the file itself is the same suite.
        recorded = suite.file_text(source.text, source.overrides)
        try:
            same = user_files.read_text(args.suite, "suite file") == recorded
        except ValueError:
            same = False
        if not same:
            usage(
                f"{args.suite} with --resume: not the suite {args.resume} was started from "
                "(a resumed run runs its own suite, kept in its run.json; drop SUITE)"
            )


def cmd_sweep(args: argparse.Namespace) -> int:
    with stop_signals_interrupt():
        return _sweep(args)


def _sweep(args: argparse.Namespace) -> int:
    from tpbench import store, sweep

    launcher = _check_sweep_args(args)
    if args.resume:
        _check_resume_args(args)
        launcher = resumed_launcher(args, launcher)
        if args.dry_run:
            run = store.Run.open(args.resume)
            sweep.check_resumable(run)  # what --resume refuses before it changes anything, refused here too
            todo = sweep.missing(run)
            left = sweep.repeats_left(run, todo)
            # A case with every repeat on disk (a printed world that ran) is only recorded.
            on_disk = sum(left[c.case_id] == 0 for c in todo)
            recorded = f", {on_disk} of them with every repeat on disk, only to record" if on_disk else ""
            n = len(todo)
            loop = _loop_left(run, todo)
            title = f"{run.dir}: {n} case{'' if n == 1 else 's'} to resume{recorded}{loop} (dry run)"
            table = cases_table(title, todo, left, nodes_of(sweep.launcher_of(run.record)))
            out.print(fitted(table, out))
            return EXIT_OK
        suite = None
    else:
        suite = sweep.prepare(args.suite, args.set, args.filter, launcher, allow_large=args.allow_large)
        warn_unused(suite)  # before a run as before a dry run: the run's output scrolls it away
        if args.dry_run:
            sweep.launchable(suite, launcher)
            if args.target_ci is not None:
                try:
                    sweep.refuse_nothing_to_compare(suite.cases)
                except sweep.SweepError as e:
                    usage(str(e))
            n = len(suite.cases)
            title = f"{suite.suite.name}: {n} case{'' if n == 1 else 's'}{_loop_ahead(args)} (dry run)"
            out.print(fitted(cases_table(title, suite.cases, nnodes=nodes_of(launcher)), out))
            return EXIT_OK
        if not args.no_report:  # before hours of sweeping, not after
            where = f"folder of --report {args.report}" if args.report else "report directory"
            store.check_writable(args.report.parent if args.report else args.reports_dir, where)
    display = SweepDisplay()
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
        usage(str(e))
    except KeyboardInterrupt as e:
        return resumable(
            e, display.run, "sweep", "Finished cases, and the finished repeats of the cases in flight, are kept."
        )
    if outcome.nothing_left:
        console.print(f"Nothing to resume: every case of {outcome.run.dir} is done.", markup=False, soft_wrap=True)
        return EXIT_OK
    if args.print_only:
        console.print(f"Run directory: {outcome.run.dir}", markup=False, soft_wrap=True)
        return _print_worlds(outcome.run, outcome.printed, outcome.launcher)
    return _conclude(args, outcome)


def _conclude(args: argparse.Namespace, outcome: Outcome) -> int:
    """A finished run's summary, closing line and report; the exit code. The run is complete and
    saved before any of it: Ctrl-C or a stop signal here cuts the printing or the report short, not
    the run, so the exit code is still the run's (not 130, which would say there is something to
    resume) and the line says what is kept and how to write the report that was not."""
    from tpbench import report

    run_dir, path = outcome.run.dir, None
    try:
        _print_adaptive(outcome.loaded.record.adaptive)
        out.print(fitted(_summary_table(outcome.loaded), out))
        for line in _fastest(outcome.loaded):
            out.print(line, markup=False, soft_wrap=True)
        out.print(_closing_line(outcome, resumed=args.resume is not None), markup=False, soft_wrap=True)
        if not args.no_report:
            path = report.write_report(
                [run_dir], args.report or report.default_report_path([run_dir], args.reports_dir)
            )
            console.print(f"Report: {path}", markup=False, soft_wrap=True)
        if outcome.failed:
            console.print(_failures_line(run_dir, len(outcome.failed), path), markup=False, soft_wrap=True)
    except KeyboardInterrupt as e:
        said, _ = interrupted(e)
        again = shlex.join(["tpbench", "report", str(run_dir), *(["-o", str(args.report)] if args.report else [])])
        missing = "" if args.no_report or path else f"; its report was not written: {again}"
        console.print(
            Text.assemble("\n", (said, "yellow"), f" The run had finished: {run_dir} is complete and saved{missing}."),
            soft_wrap=True,
        )
    return EXIT_FAILED if outcome.failed else EXIT_OK


def _check_sweep_args(args: argparse.Namespace):
    """The options' combinations a sweep refuses (a usage error as ``SystemExit``); the torchrun
    launcher they ask for (None: local)."""
    launcher = torchrun_launcher(args)
    if args.lockstep and not Path(args.lockstep).is_socket():
        usage(f"--lockstep {args.lockstep}: no gate listens there (a Unix socket of `tpbench gate`)")
    if (args.target_ci is None) != (args.budget_s is None) and not args.resume:
        usage("--target-ci and --budget-s go together: the rounds an adaptive sweep adds need a limit")
    if args.target_ci is not None and args.print_only:
        usage("--target-ci with --print: an adaptive sweep decides its rounds as it runs; run it here")
    if args.target_ci is not None and args.lockstep:
        usage("--target-ci with --lockstep: the gate decides when its sides stop")
    if args.print_only and args.lockstep:
        usage("--print: a lockstep gate paces worlds this command starts itself; drop --lockstep")
    if args.no_report and args.report:
        usage(f"--report {args.report} with --no-report: the one names the report's file, the other writes none")
    return launcher


class SweepDisplay:
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
        from tpbench import sweep

        record = phase.run.record
        nnodes = nodes_of(sweep.launcher_of(record))
        listener = SweepProgress(phase.cases, phase.items, earlier_s=record.wall_s or 0.0, nnodes=nnodes)
        return showing(listener.progress, listener)


def _print_batch(record, batch) -> None:
    """The line an adaptive batch starts with: what is still too wide, and the rounds it adds."""
    from tpbench import verdict

    widest = max((hw for _, hw in batch.comparisons if hw is not None), default=None)
    console.print(
        f"adaptive batch {batch.number}: {len(batch.comparisons)} comparison(s) above ±"
        f"{record.adaptive.target_ci:.1%}"
        + (f" (widest {verdict.half_width_pct(widest)})" if widest is not None else "")
        + f"; +{max(batch.added.values())} round(s) for {len(batch.cases)} case(s), "
        f"{record.wall_s or 0:.0f} of {record.adaptive.budget_s:g} s spent",
        markup=False,
        soft_wrap=True,
    )


def _budget_left(adaptive) -> str:
    """ "55 of 60 s; the 5 s left pay for fewer than 2 more rounds at this run's pace": the loop also
    ends with budget left that cannot pay for a batch's rounds and world starts (``sweep.next_batch``),
    which "budget spent" alone denied beside the closing line's wall time."""
    from tpbench import sweep

    spent, budget = adaptive.wall_s or 0.0, adaptive.budget_s or 0.0
    left = budget - spent
    if left < 0.5:
        return f"{spent:.0f} of {budget:g} s"
    few = f"fewer than {sweep.MIN_ROUNDS} more rounds at this run's pace"
    return f"{spent:.0f} of {budget:g} s; the {left:.0f} s left pay for {few}"


def _print_adaptive(adaptive) -> None:
    """How an adaptive sweep ended (nothing for a planned one), with the widest half-width after by
    the rule it stopped by: the sequential one, at the confidence spent over the loop's looks, wider
    than the 95 % interval that the verdicts under it and ``compare`` give of the same comparison, so
    that the two figures of one comparison are told apart."""
    from tpbench import sweep, verdict

    if not adaptive:
        return
    after = [c["half_width"] for c in adaptive.half_widths_after or ()]
    within = sum(hw is not None and hw <= adaptive.target_ci for hw in after)
    widest = max((hw for hw in after if hw is not None), default=None)
    by_rule = (
        f" (widest {verdict.half_width_pct(widest)} by the sequential rule, wider than a 95% interval)"
        if widest is not None
        else ""
    )
    said = {
        sweep.TARGET_MET: "target met",
        sweep.BUDGET_SPENT: f"budget spent ({_budget_left(adaptive)})",
        sweep.LOOKS_SPENT: f"the most batches ({sweep.MAX_BATCHES}) added",
        sweep.NO_COMPARISON: "no comparison among the finished cases (a failed case's comparisons are left out; "
        "--resume runs it again, and the rounds go on)",
    }.get(adaptive.state, "")
    console.print(
        f"adaptive: {said}; {within} of {len(after)} comparison(s) resolve ±{adaptive.target_ci:.1%}{by_rule}, "
        f"{sum((adaptive.rounds_added or {}).values())} repeat(s) added over {len(adaptive.batches)} "
        "batch(es)",
        markup=False,
        soft_wrap=True,
    )
