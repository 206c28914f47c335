"""The commands that read what is there: a run (``report``, ``export``, ``whatif``), a suite
(``validate``), this machine (``env``) and what tpbench offers (``list``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tpbench.cli.common import (
    EXIT_OK,
    EXIT_RESULTS,
    console,
    error,
    fitted,
    label_column,
    out,
    usage,
    warn_unused,
)


def cmd_report(args: argparse.Namespace) -> int:
    from tpbench import report, store

    # Each later run is compared with the first: the same run twice would say nothing.
    resolved = [Path(run).resolve() for run in args.runs]
    twice = [run for i, run in enumerate(args.runs) if resolved[i] in resolved[:i]]
    if twice:
        usage(f"{twice[0]}: given twice; a report of several runs compares each with the first", "report")
    _refuse_copies(args.runs, [store.read_record(Path(run)).run_id for run in args.runs])
    out_path = args.output or report.default_report_path(args.runs)
    path = report.write_report(args.runs, out_path, args.metric)
    console.print(f"Report: {path}", markup=False, soft_wrap=True)
    return EXIT_OK


def _refuse_copies(runs: list[str], run_ids: list[str]) -> None:
    """Exit 2 where a run is a copy of an earlier one (another folder, the same run id): the report
    keys runs by their id, so the two would share one tag ("B · … against B · …") and one set of
    cases, and every ratio between them would be exactly 1."""
    for i, rid in enumerate(run_ids):
        if rid in run_ids[:i]:
            first = runs[run_ids.index(rid)]
            usage(
                f"{runs[i]}: the same run as {first} (run id {rid}, a copy); a report of several runs "
                "compares each with the first",
                "report",
            )


def cmd_validate(args: argparse.Namespace) -> int:
    from tpbench import store, sweep
    from tpbench.interconnect import InterconnectUnavailable

    prepared = sweep.prepare(args.suite, args.set, args.filter, allow_large=args.allow_large)
    cases = prepared.cases
    size = store.size_words(sum(map(sweep.case_estimate, cases)))
    about = f"{sum(c.repeats for c in cases)} repeats; about {size} of results"
    n = len(cases)
    out.print(f"{args.suite}: ok, {n} case{'' if n == 1 else 's'} ({about})", markup=False, soft_wrap=True)
    warn_unused(prepared)
    # A suite can be valid and still need what this machine lacks (root, `tc` for an emulated link):
    # said as a warning, since the suite is right and another machine may run it.
    try:
        sweep.launchable(prepared, None)
    except InterconnectUnavailable as e:
        console.print(f"warning: {e} (`tpbench sweep` would refuse it here, exit 2)", markup=False, soft_wrap=True)
    # A suite can be valid and still not fit where its results go by default (``steps = 1e9``): the
    # sweep's own check, said here as a warning rather than only when `sweep` refuses it (exit 3).
    results = Path("results").absolute()
    try:
        sweep.check_space(next(p for p in (results, *results.parents) if p.exists()), cases)
    except store.StoreError as e:
        console.print(
            f"warning: {e} (`tpbench sweep` would refuse these cases there, exit 3)", markup=False, soft_wrap=True
        )
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

    if args.suites is not None and not Path(args.suites).is_dir():  # asked for, and not there
        # A suite file given for the folder is there: "no such folder" would send its reader looking for it.
        what = "not a folder" if Path(args.suites).exists() else "no such folder"
        usage(f"--suites {args.suites}: {what}; expected a folder of suite TOML files", "list")
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
    suites_dir = Path(args.suites or "suites")
    files = sorted(suites_dir.glob("*.toml")) if suites_dir.is_dir() else []
    if files:
        s = Table(title=escape(f"suites in {suites_dir}"))
        s.add_column("file")
        s.add_column("description")
        for p in files:
            s.add_row(escape(p.name), escape(_suite_description(p)))
        out.print(s)
    elif args.suites is not None:  # asked for: an empty table would not say why
        out.print(f"No suite in {suites_dir} (no *.toml file).", markup=False, soft_wrap=True)
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


def cmd_export(args: argparse.Namespace) -> int:
    from tpbench import export as exports

    export = exports.export_run(args.run, args.format, args.metric, metric_name="--metric")
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


def cmd_whatif(args: argparse.Namespace) -> int:
    from tpbench import whatif_run
    from tpbench.analysis.whatif_validation import UnknownReference

    try:
        fabrics = whatif_run.load_fabrics(args.fabrics)
    except ValueError as e:
        usage(str(e), "whatif")
    unknown = [f for f in args.fabric if f not in fabrics]
    if unknown:
        usage(
            f"--fabric {', '.join(unknown)}: unknown fabric{'s' if len(unknown) > 1 else ''}; expected one of "
            f"{', '.join(fabrics)} (--fabrics FILE adds others)",
            "whatif",
        )
    try:
        written = whatif_run.write(args.run, {k: fabrics[k] for k in (args.fabric or fabrics)}, args.reference)
    except UnknownReference as e:
        usage(str(e), "whatif")
    except ValueError as e:
        error(e, "whatif")
        return EXIT_RESULTS
    for line in whatif_run.replaced_fabrics(fabrics):  # on stderr: stdout is the format's own
        console.print(line, markup=False, soft_wrap=True)
    # Every case refused: the tables and the reasons are written, but a script must not read "projected".
    code = EXIT_RESULTS if written.result.projections["refused"].notna().all() else EXIT_OK
    if args.format == "json":
        sys.stdout.write(json.dumps(written.to_json(), indent=2, allow_nan=False) + "\n")
        if written.unwritten:  # the JSON names no table, so only their loss is said
            _say_tables(written)
        return code
    if args.format == "md":
        sys.stdout.write(written.to_markdown())
    else:
        _print_whatif_text(written)
    _say_tables(written)
    if code != EXIT_OK:
        console.print("[yellow]Nothing projected: every case was refused (the reasons above).[/]")
    return code


def _say_tables(written) -> None:
    """Where the what-if's tables were written, or why they were not (a run on a read-only disk):
    the projections printed are complete either way, so the command still answers."""
    if written.unwritten:
        console.print(
            Text.assemble(("tables not written: ", "yellow"), f"{written.unwritten}; the projections are complete"),
            soft_wrap=True,
        )
    else:
        console.print(f"tables: {written.projections_path}, {written.validation_path}", markup=False, soft_wrap=True)


def _print_whatif_text(written) -> None:
    """``tpbench whatif``'s text: the validation (where the run has emulated links), the projections,
    the refusals (on stderr) and the ranking per fabric."""
    from tpbench import whatif_run

    if len(written.result.validation):
        _print_whatif_validation(written)
    t = Table(title=whatif_run.PROJECTIONS_TITLE)
    case, *numbers = written.projection_head()
    label_column(t, case)
    for col in numbers:
        t.add_column(col, justify="right")
    for row in written.projection_rows():
        t.add_row(*row)
    out.print(fitted(t, out))
    # Each note whole (soft_wrap): away from a terminal rich wrapped a refusal at 80 columns and a
    # ranking at 160, and a grep of a log for a case found the first piece of its sentence.
    for line in written.refused_models():
        console.print(Text.assemble(("(*) refused ", "yellow"), line), soft_wrap=True)
    for line in written.ranking_lines():
        out.print(f"projection: {line}", markup=False, soft_wrap=True)


def _print_whatif_validation(written) -> None:
    """The what-if's validation: each emulated link predicted from its twins, what was refused, the errors."""
    from tpbench import whatif_run

    t = Table(title=whatif_run.VALIDATION_TITLE)
    direction, case, *rest = whatif_run.VALIDATION_HEAD
    t.add_column(direction)
    label_column(t, case)
    for i, col in enumerate(rest):
        t.add_column(col, justify="right" if i >= 2 else "left")  # from, link; then the numbers
    for row in written.validation_rows():
        t.add_row(*row)
    out.print(fitted(t, out))
    for line in written.refused_references():
        console.print(Text.assemble(("refused ", "yellow"), line), soft_wrap=True)
    for e in written.result.errors().to_dict("records"):
        out.print(whatif_run.error_line(e), markup=False, soft_wrap=True)
