"""``tpbench tune``: the race on the terminal as it goes, and its answer as text, Markdown or JSON."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

from rich.markup import escape
from rich.progress import TextColumn
from rich.table import Table
from rich.text import Text

from tpbench.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNRESOLVED,
    FoldedProgress,
    RunElapsedColumn,
    console,
    fitted,
    fraction,
    given_flags,
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
    world_text,
)
from tpbench.cli.sweep import SweepDisplay
from tpbench.pace import PlainPace


class TuneProgress:
    """The race as it goes: the round, the settings left and the current leader, the item running.
    Away from a terminal (``redraws``) the line is disabled and plain lines are said instead
    (``plain_progress``): the start, each world's start, each round that eliminated, retired or
    brought back an arm, the round a race ended (its arms decided, its rounds or the budget spent),
    and the other judged rounds when ``PlainPace`` says one is due (``clock`` is its clock; the work
    is the rounds of every world's race): a line per round made a 300-round tune's log 300 lines,
    most of them the same leader again. ``earlier_s``: the tune's time before this session
    (tune.json's ``wall_s``, which its budget counts), where the elapsed time goes on from."""

    def __init__(
        self, cases: list, clock: Callable[[], float] = time.monotonic, earlier_s: float = 0.0, nnodes: int = 1
    ) -> None:
        from tpbench.suite import labels

        self.nnodes = nnodes  # the nodes each world spans, said as the dry run says them (``link_text``)
        self.labels = labels([cases])[0]
        self.total = len(cases)
        worlds = {c.launch_key for c in cases}
        self.judged = 0
        self.pace = PlainPace(len(worlds) * max((c.repeats for c in cases), default=1), clock)
        self.progress = FoldedProgress(
            TextColumn("[bold]tune"),
            RunElapsedColumn(),
            below=("race", "current"),
            console=console,
            transient=False,
            disable=not redraws(console),
            get_time=clock,
        )
        self.task = self.progress.add_task(
            "tune", total=None, race=f"{self.total} settings", current="starting…", earlier_s=earlier_s
        )
        self._say(f"{self.total} settings, starting…")

    def __call__(self, event: str, data: dict[str, Any]) -> None:
        """Launcher events (the item running)."""
        if event == "world_start":
            link = link_text(data["backend"], data["interconnect"], self.nnodes)
            starting = f"starting {data['world_size']} ranks on {link}…"
            self.progress.update(self.task, current=starting)
            self._say(starting)
        elif event == "repeat_start":
            label = self.labels.get(data["case"], data["case"])
            self.progress.update(self.task, current=f"round {data['repeat'] + 1}: {escape(label)}")
        elif event == "round_start":
            n = len(data["items"])
            self.progress.update(self.task, current=f"round {data['items'][0][1] + 1}: {n} settings stepped in turn")
        elif event == "case_failed":
            label = self.labels.get(data["case"], data["case"])
            failed = Text.assemble(("setting failed: ", "red"), f"{label}: {data['cause']}")
            self.progress.console.print(failed, soft_wrap=True)  # whole: a log's console is 80 columns

    def round(self, race, entry: dict[str, Any]) -> None:
        """A judged round (on the tune's conductor thread)."""
        leader = self.labels.get(entry["leader"], entry["leader"])
        gone = "".join(
            f"; {verb} {self.labels.get(a, a)}"
            for verb, key in (("eliminated", "eliminated"), ("retired", "retired"), ("back", "back"))
            for a in entry[key]
        )
        # Those still racing, and apart from them the retired (a tie keeps them: "tied with 2"), the
        # eliminated and the failed, so that the counts add up to the settings: "1 of 7 left" beside
        # "tied with 2" read as a contradiction.
        out = "".join(
            f", {len(held)} {what}"
            for what, held in (("retired", race.retired), ("eliminated", race.eliminated), ("failed", race.failed))
            if held
        )
        said = f"round {entry['round']}/{race.max_rounds}: {len(entry['live'])} of {len(race.arms)} still racing{out}, "
        said += f"leader {leader}{gone}"
        self.progress.update(self.task, race=escape(said))
        self.judged += 1
        if gone or entry["ended"] or self.pace.due(self.judged):
            self._say(said)

    def _say(self, said: str) -> None:
        """``said`` as a plain line, "tune round 4/30: …", where the progress line is disabled."""
        if self.progress.disable:
            plain_progress(self.progress.tasks[0], f"tune {said}")
            self.pace.said(self.judged)


def cmd_tune(args: argparse.Namespace) -> int:
    with stop_signals_interrupt():
        return _tune(args)


def _tune(args: argparse.Namespace) -> int:
    from tpbench import racing, sweep, tune, tune_answer

    launcher = torchrun_launcher(args)
    if args.resume:
        if args.dry_run:  # ignored, the resume raced every round left while the user asked for a plan
            usage(
                "--dry-run with --resume: a resumed tune has no dry run (tpbench report RUN_DIR shows the race so "
                "far; tpbench tune --resume RUN_DIR goes on with it)",
                "tune",
            )
        given = given_flags(
            {
                "--set": args.set,
                "--filter": args.filter,
                "--out": args.out,
                "--epsilon": args.epsilon,
                "--confidence": args.confidence,
                "--budget-s": args.budget_s,
                "--metric": args.metric,
                "--min-rounds": args.min_rounds,
            }
        )
        if given or args.suite:
            usage(
                f"{', '.join(given or [args.suite])} with --resume: a resumed tune races its own settings with its "
                "own options (tune.json)",
                "tune",
            )
        suite, options, launcher = None, racing.Options(), resumed_launcher(args, launcher, "tune")
    else:
        # --epsilon and --confidence as typed ("-5%"), for the check to echo; their fractions to race.
        typed = {k: v for k, v in (("epsilon", args.epsilon), ("confidence", args.confidence)) if v is not None}
        given = {k: v for k, v in (("metric", args.metric), ("min_rounds", args.min_rounds)) if v is not None}
        given |= {k: fraction(v) for k, v in typed.items()}
        options = racing.Options(budget_s=args.budget_s, **given)
        options.check(typed)
        suite = tune.prepare(args.suite, args.set, args.filter, launcher, args.allow_large, options.min_rounds)
        warn_unused(suite)  # before a race as before a dry run: the race's output scrolls it away
        if args.dry_run:
            sweep.launchable(suite, launcher)
            print_dry_run(suite, args.format, nodes_of(launcher))
            return EXIT_OK
    display = _TuneDisplay()
    try:
        result = tune.run(
            suite,
            options,
            out=args.out or Path("results"),
            launcher=launcher,
            resume=args.resume,
            progress=display,
        )
    except KeyboardInterrupt as e:
        return resumable(e, display.run, "tune", display.run and interrupted_keeps(display.run.dir))
    if args.trace:
        result = _trace_tune(result, launcher)
    print_tune(result, args.format)
    return {tune_answer.UNRESOLVED: EXIT_UNRESOLVED, tune_answer.FAILED: EXIT_FAILED}.get(result.state, EXIT_OK)


def interrupted_keeps(run_dir: Path) -> str:
    """What an interrupted tune keeps, by its tune.json: the race so far once a round was judged.
    Before one (the worlds starting, or the first round running) there is no race to keep, and "the
    race so far is kept" promised a resume rounds it would not find."""
    from tpbench import store

    saved = store.read_tune(run_dir)
    if saved is not None and saved.history:
        return "The race so far is kept."
    return (
        "No round was judged yet (the worlds were starting or running the first round): the run keeps the tune's "
        "settings and options, and a resume starts its race."
    )


def print_dry_run(prepared, fmt: str, nnodes: int = 1) -> None:
    """``tune --dry-run``: the settings a tune would race, their worlds across ``nnodes`` machines
    (``world_text``), in ``--format`` as its answer would be, so a script that reads the JSON answer
    can read the plan too."""
    from tpbench.suite import labels

    cases, rounds = prepared.cases, prepared.cases[0].repeats
    title = f"{prepared.suite.name}: {len(cases)} settings to race, at most {rounds} rounds (dry run)"
    names = labels([cases])[0]
    worlds = [world_text(c, nnodes) for c in cases]
    # Not sweep's "repeats × steps": a setting runs at most `rounds` (the title), fewer once decided.
    head = ("case_id", "setting", "world", "steps per round (warm-up + timed)")
    rows = [(c.case_id, names[c.case_id], w, f"{c.warmup_steps} + {c.steps}") for c, w in zip(cases, worlds)]
    if fmt == "text":
        t = Table(title=escape(title))
        t.add_column(head[0])
        label_column(t, head[1])
        for col in head[2:]:
            t.add_column(col)
        for r in rows:
            t.add_row(*map(escape, r))
        out.print(fitted(t, out))
        return
    if fmt == "json":
        settings = [
            {"case_id": c.case_id, "label": names[c.case_id], "params": c.params(), "world": w}
            for c, w in zip(cases, worlds)
        ]
        plan = {"suite": prepared.suite.name, "dry_run": True, "max_rounds": rounds, "settings": settings}
        sys.stdout.write(json.dumps(plan, indent=2, allow_nan=False) + "\n")
        return
    lines = [f"**{title}**", "", *_md_table(head, rows)]
    sys.stdout.write("\n".join(lines) + "\n")


def _trace_tune(result, launcher):
    """``tune --trace``: the trace sweep after the race (``tune_trace``), its progress on stderr. A
    trace that fails leaves the tune's answer as it is, and says why; Ctrl-C stops the trace only."""
    from tpbench import tune_trace

    console.print("Tracing the recommended setting and its closest rival:", markup=False, soft_wrap=True)
    try:
        return tune_trace.trace(result, launcher, SweepDisplay())
    except (tune_trace.TraceError, KeyboardInterrupt) as e:
        why = "interrupted" if isinstance(e, KeyboardInterrupt) else str(e)
        console.print(f"[yellow]No trace ({escape(why)}); the tune's answer stands.[/]", soft_wrap=True)
        return result


class _TuneDisplay:
    """The tune's ``Progress``: the run directory, then the race as it goes (``TuneProgress``)."""

    def __init__(self) -> None:
        self.run = None

    def __call__(self, run):
        from tpbench import store, sweep, tune
        from tpbench.suite import Case

        self.run = run
        console.print(f"Run directory: {run.dir}", markup=False, soft_wrap=True)
        saved = store.read_tune(run.dir)
        if tune.had_ended(saved):  # a resume of it races nothing: no race starting
            console.print("This tune had ended: nothing more to race; its answer again.", markup=False)
            return contextlib.nullcontext(tune.Watch())
        cases = [Case.from_params(c.params) for c in run.record.cases.values()]
        nnodes = nodes_of(sweep.launcher_of(run.record))
        listener = TuneProgress(cases, earlier_s=saved.wall_s if saved else 0.0, nnodes=nnodes)
        return showing(listener.progress, tune.Watch(listener, listener.round))


def decided(arm, epsilon: float) -> str:
    """When the race stopped running an arm: eliminated (clearly slower) or retired (tied: it could no
    longer be ``epsilon`` faster than the leader), or both: retired, then shown slower from the rounds it
    had run (its rounds then end before the round it went). An elimination says the interval that
    decided it, against that round's leader: the table's interval against the recommended arm may
    hold 1 (another leader then, fewer rounds, or a variance pooled over later, noisier rounds too), and
    without it the elimination would look unfounded.
    A tied arm says why it is tied: beside its ratio (a retired arm may be well behind, +16 % on
    suites/zero.toml), "tied" alone reads as "as fast"."""
    from tpbench import tune_answer, verdict

    said = []
    if arm.retired_at is not None:
        why = ""
        if arm.status == tune_answer.TIED:
            why = f": it could no longer be {verdict.percent(epsilon)} faster than the leader"
        said.append(f"retired after round {arm.retired_at}{verdict.sat_out(arm.sat_out)}{why}")
    elif arm.sat_out:
        said.append(verdict.brought_back(arm.sat_out))
    why = verdict.what_eliminated(arm.status, arm.eliminated_vs)
    if arm.eliminated_at is not None:
        said.append(f"eliminated after round {arm.eliminated_at}" + (f" ({why})" if why else ""))
    elif why:
        said.append(f"eliminated by {why}")
    return ", ".join(said)


# Before a tune's trace_step: a tune traces nothing, and this sweep traces what it recommends.
TRACE_SAYS = (
    "Where the time goes (a tune traces nothing; with --trace it does so after the race): this sweep traces the "
    "recommended setting and its closest rival, if any (under the same launcher): "
)


def _text_table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> Table:
    """Rows of plain text (escaped: a label may hold brackets) under ``head``, the first a setting's
    label (``label_column``), fitted to the terminal."""
    t = Table()
    label_column(t, head[0])
    for col in head[1:]:
        t.add_column(col)
    for r in rows:
        t.add_row(*map(escape, r))
    return fitted(t, out)


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


def raced_on(metric: str) -> str:
    """After the cost line, whose timed steps are wall time whatever was raced: what the ratios are,
    where the race was not on wall time per step (``verdict.ratio_heading``)."""
    from tpbench import verdict

    return "" if metric == "step_ms" else f"; the ratios are of {verdict.METRIC_WORDS[metric]} (--metric {metric})"


def print_tune(result, fmt: str) -> None:
    """The tune's answer on stdout in ``fmt``, then where its run lies on stderr, in every format: after
    ``--trace`` the last "Run directory:" said was the trace sweep's, and in Markdown and JSON nothing
    said the tune's again, so a script taking the last such line got the trace's run."""
    _print_answer(result, fmt)
    console.print(f"Run directory: {result.run_dir}", markup=False, soft_wrap=True)


def _print_answer(result, fmt: str) -> None:
    from tpbench import verdict

    if fmt == "json":
        sys.stdout.write(json.dumps(result.to_json(), indent=2, allow_nan=False) + "\n")
        return
    line = verdict.tie_line(result.epsilon)  # a tied arm's low end reads as clear of the margin, as it is
    rows = [
        (
            a.label,
            a.status,
            str(a.rounds),
            "—" if a.ratio is None else verdict.signed_pct(a.ratio, line),
            "—" if a.lo is None else f"[{verdict.signed_pct(a.lo, line)}, {verdict.signed_pct(a.hi, line)}]",
            decided(a, result.epsilon),
        )
        for a in result.arms
    ]
    spent = verdict.interval_heading(result.confidence, bool(result.worlds))
    head = ("setting", "status", "rounds", verdict.ratio_heading(result.metric), spent, "decided")
    if any(a.heldout_loss is not None for a in result.arms):  # a workload that evaluates: how far each trained
        head += ("held-out loss",)
        rows = [(*r, "—" if a.heldout_loss is None else f"{a.heldout_loss:.3f}") for r, a in zip(rows, result.arms)]
    if any(a.time_to_target_s is not None for a in result.arms):  # the time the training note ranks them by
        head += (verdict.TO_TARGET,)
        rows = [(*r, verdict.to_target(a.time_to_target_s)) for r, a in zip(rows, result.arms)]
    cost = (
        f"wall {result.wall_s:.0f} s; timed steps {result.timed_s:.1f} s, "
        f"{result.timed_s / result.grid_timed_s:.0%} of the {result.grid_timed_s:.1f} s the whole grid would have timed"
        if result.grid_timed_s
        else f"wall {result.wall_s:.0f} s"
    ) + raced_on(result.metric)
    then = ""  # unresolved: what would likely decide it (docs/tune.md, "Outputs")
    if result.next_step:
        more = result.rounds_to_decide  # None: nothing judged, no estimate (verdict.decide_words)
        rounds = more and result.recommended.rounds + more
        then = verdict.decide_words(rounds, result.decide_wall_s, result.next_repeats)
    if fmt == "md":
        lines = [f"**{result.claim}**", *(["", result.training_note] if result.training_note else [])]
        lines += ["", verdict.WORLDS_SAY, *(f"- {w}" for w in result.worlds)] if result.worlds else []
        lines += ["", *_md_table(head, rows)]
        # Its own paragraph: on the line under the cost, Markdown ran the two together into one.
        lines += ["", cost, *(["", f"{then}`{result.next_step}`"] if result.next_step else [])]
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
    # On stdout, as in Markdown and JSON: what the tune cost is part of its answer (`> answer.txt` keeps it);
    # where its run lies goes to stderr (``print_tune``), as every command's run directory does.
    out.print(cost, markup=False, soft_wrap=True)
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
