"""The ``tpbench`` command line: every command's options, and the types that check their values."""

from __future__ import annotations

import argparse
import difflib
import os
import shlex
from pathlib import Path
from typing import Callable, NoReturn

import tpbench
from tpbench.cli.common import EXIT_USAGE, console, fraction, usage
from tpbench.cli.show import cmd_env, cmd_export, cmd_list, cmd_report, cmd_validate, cmd_whatif
from tpbench.cli.sweep import cmd_sweep
from tpbench.cli.tune import cmd_tune
from tpbench.cli.verdicts import cmd_compare, cmd_explain, cmd_gate

# Bounds of the adaptive options: a target below 0.1% asks for more rounds than any budget holds
# (and 1e-200 overflows the batch size); one above 10000% asks nothing of any interval; a budget beyond a
# week is a typo.
MIN_TARGET_CI, MAX_TARGET_CI = 0.001, 100.0
MAX_BUDGET_S = 7 * 24 * 3600.0


class _Parser(argparse.ArgumentParser):
    """argparse, an option's value that its type or its choices refuse said as every other bad option
    is: one line naming the option, the value and what was expected ("tpbench gate: error: --seed -5:
    expected an integer >= 0"), exit 2, as the checks made after parsing (``racing.Options.check``,
    ``compare.parse_threshold``, ``usage``) say theirs, so one command's errors look alike (argparse
    would print its usage block above "argument --budget-s: -1: ..."). Each type's message starts with
    the text it refuses; argparse's other errors (a missing value, an unknown option) keep its usage block."""

    def _get_value(self, action: argparse.Action, arg_string: str) -> object:
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError as e:
            usage(f"{_flag(action)} {e.message}", self.prog.removeprefix("tpbench "))

    def _check_value(self, action: argparse.Action, value) -> None:
        if isinstance(action, argparse._SubParsersAction) and value not in action.choices:
            _unknown_command(value, list(action.choices))
        if action.option_strings and action.choices is not None and value not in action.choices:
            usage(
                f"{_flag(action)} {value}: expected one of {', '.join(map(str, action.choices))}",
                self.prog.removeprefix("tpbench "),
            )
        super()._check_value(action, value)


def _unknown_command(value: str, commands: list[str]) -> NoReturn:
    """A command ``tpbench`` does not have, said in one line with the closest one it has (``rport``:
    report), so that the reader need not spot the typo in argparse's list of every command
    ("argument command: invalid choice: 'rport' (choose from ...)" under the usage block)."""
    close = difflib.get_close_matches(value, commands, n=1)
    guess = f"; did you mean {close[0]}?" if close else ""
    console.print(
        f"tpbench: error: {value}: no such command{guess} (the commands: {', '.join(commands)}; "
        "tpbench --help says what each does)",
        soft_wrap=True,
        markup=False,
    )
    raise SystemExit(EXIT_USAGE)


def _flag(action: argparse.Action) -> str:
    """An option as its errors name it: its long form (``--output`` for ``-o``, ``--epsilon`` for the
    ``--eps`` argparse lets a prefix stand for); a positional argument as its usage line names it
    (``RUN_DIR``, ``SUITE``)."""
    if not action.option_strings:
        return str(action.metavar or action.dest.upper())
    return max(action.option_strings, key=len)


def _given(what: str) -> Callable[[str], str]:
    """The type of a path argument or option kept as text: an empty one refused naming it
    (``Path("")`` is ``.``: taken as a path, ``validate ''`` would call the current directory not a
    regular file and ``report ''`` would look for a run there, neither naming what was typed)."""

    def parse(text: str) -> str:
        if not text:
            raise argparse.ArgumentTypeError(f"'': an empty path; expected {what}")
        return text

    return parse


def _path(what: str) -> Callable[[str], Path]:
    """The type of a path argument or option: ``_given``'s check, then the ``Path``."""
    check = _given(what)
    return lambda text: Path(check(text))


def _file(what: str) -> Callable[[str], Path]:
    """The type of an output file option: ``_path``'s check, and a folder refused as it is typed: a
    usage error naming the option (exit 2), not a failed write (exit 3, as if the disk were at fault).
    A name that ends in a separator (``-o out/``) names a folder too, made or not: ``Path`` drops the
    separator, so it would be written as a file called ``out``."""
    check = _path(what)

    def parse(text: str) -> Path:
        path = check(text)
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text}: is a folder; expected {what}")
        if text.endswith(("/", os.sep)):
            raise argparse.ArgumentTypeError(f"{text}: names a folder (it ends in '/'); expected {what}")
        return path

    return parse


def _integer(minimum: int, maximum: int | None = None, why: str = "") -> Callable[[str], int]:
    """The type of an integer option from ``minimum`` (to ``maximum``): a negative ``--seed``, ``--repeats 0``
    or ``--nnodes 0`` refused naming the value and the range (``why``: what the bound is for)."""
    expected = f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"{text}: expected {expected}{why}")
        return value

    return parse


def _command_line(text: str) -> str:
    """``--agent-prefix``: a command line, as typed, once ``shlex`` can split it: an unclosed quote is
    refused here as a bad option, not met later as a ``ValueError`` when the launcher is built."""
    try:
        shlex.split(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text}: expected a command line ({e})") from None
    return text


def _gate_repeats(text: str) -> int:
    """``gate --repeats``: 1 to ``gate.MAX_REPEATS``, read where it is given (the gate's module is
    not imported for every command's parser)."""
    from tpbench.gate import MAX_REPEATS

    return _integer(1, MAX_REPEATS)(text)


def _target_ci(text: str) -> float:
    """``--target-ci 5%`` or ``0.05``: the half-width every within-run comparison (a sweep's) or
    every case's interval (a gate's) should reach."""
    try:
        value = fraction(text)
    except argparse.ArgumentTypeError:
        value = 0.0  # out of range below: one message for text and numbers alike
    if 1 <= value <= MAX_TARGET_CI and not text.strip().endswith("%"):
        # A bare 5 is a fraction, ±500 %, met at once with no round added; 5% is what is meant. Only
        # within the bounds: "inf" (or 200) is no fraction anyone could mean, "or inf% if you mean it".
        raise argparse.ArgumentTypeError(
            f"{text}: a bare number is a fraction ({value:.0%}); write {text.strip()}% for that percentage, "
            f"or {value:.0%} if you mean it"
        )
    if not MIN_TARGET_CI <= value <= MAX_TARGET_CI:
        raise argparse.ArgumentTypeError(
            f"{text}: expected a percentage like 5% or a fraction like 0.05, "
            f"from {MIN_TARGET_CI:.1%} to {MAX_TARGET_CI:.0%}"
        )
    return value


def _out_dir(text: str) -> Path:
    """A results folder: its path must be UTF-8, since torch's file store (the ranks' rendezvous)
    and its profiler (the traces) take only such paths; refused here rather than by every rank."""
    _path("a results folder")(text)
    try:
        os.fsencode(text).decode("utf-8")
    except UnicodeDecodeError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: not a UTF-8 path; torch's file store and profiler cannot write under it"
        ) from None
    return Path(text)


def _results_root(text: str) -> Path:
    """The type of ``sweep --out`` and ``tune --out``: a results folder (``_out_dir``) that is not a
    run's directory nor inside one. Each run goes in ``OUT/<suite>/<run_id>``: given a run's own
    folder (as if ``--out`` named where to put this run, or added to that one), the new run would be
    made inside the old one's, the two tangled in one folder without a word."""
    from tpbench.store import RUN_FILE, TUNE_FILE

    def holds_a_run(folder: Path) -> bool:
        try:
            return (folder / RUN_FILE).is_file()
        except OSError:  # a folder this user may not search: it holds no run of theirs
            return False

    out = _out_dir(text).resolve()
    run = next((p for p in (out, *out.parents) if holds_a_run(p)), None)
    if run is None:
        return Path(text)
    where = "is" if run == out else f"is inside {run},"
    command = "tune" if (run / TUNE_FILE).is_file() else "sweep"
    raise argparse.ArgumentTypeError(
        f"{text}: {where} a run's directory (it holds {RUN_FILE}); --out is the results root, each run going in "
        f"OUT/<suite>/<run_id>: give the folder the runs are kept in, or run that run's missing cases with "
        f"tpbench {command} --resume {shlex.quote(str(run))}"
    )


def _seconds(text: str) -> float:
    """A time budget: finite, above 0 and at most ``MAX_BUDGET_S`` (NaN, inf and 1e308 would never end)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= MAX_BUDGET_S:
        raise argparse.ArgumentTypeError(f"{text}: expected a number of seconds > 0 and <= {MAX_BUDGET_S:g} (7 days)")
    return value


def _time_metric(p: argparse.ArgumentParser, what: str) -> None:
    """``--metric step_ms|cpu_ms`` of the commands that read a run's times (report, export)."""
    p.add_argument(
        "--metric",
        choices=("step_ms", "cpu_ms"),
        default="step_ms",
        help=f"{what}: wall time per step (default) or the ranks' CPU time per step",
    )


def _verdict_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metric",
        default="step_ms",
        metavar="COLUMN",
        help="per-step column to compare, lower is better (default: step_ms)",
    )
    p.add_argument("--threshold", default="5%", metavar="PCT", help="changes within ±THRESHOLD pass (default: 5%%)")
    p.add_argument("--format", choices=("text", "md", "json"), default="text", help="output on stdout (default: text)")
    p.add_argument(
        "--fail-on-inconclusive", action="store_true", help="exit 4 when a case is inconclusive (default: exit 0)"
    )
    _ignore_env_arg(p, "compare")


def _ignore_env_arg(p: argparse.ArgumentParser, verb: str) -> None:
    """``--ignore-env KEY``: compare's and explain's one rule for runs whose fingerprints differ."""
    from tpbench.environment import COMPARABLE_KEYS

    p.add_argument(
        "--ignore-env",
        action="append",
        default=[],
        choices=COMPARABLE_KEYS,
        metavar="KEY",
        help=f"{verb} even though this fingerprint key differs ({', '.join(COMPARABLE_KEYS)})",
    )


def _fraction_text(example: float) -> Callable[[str], str]:
    """The type of ``--epsilon`` and ``--confidence``: their text as typed, once it reads as a
    fraction (``fraction``, its refusal giving ``example``, a value of that option), so that the range
    check (``racing.Options.check``) can echo what was typed."""

    def parse(text: str) -> str:
        fraction(text, example)
        return text

    return parse


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="tpbench", description="Profile and benchmark PyTorch DDP communication hooks.")
    ap.add_argument("--version", action="version", version=f"tpbench {tpbench.__version__}")
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

    def run_args(p: argparse.ArgumentParser, suite_help: str, resume_help: str) -> None:
        """What ``sweep`` and ``tune`` share: a suite (or ``--resume`` of a run), its ``--set``/``--filter``,
        ``--allow-large`` and the results root."""
        p.add_argument("suite", nargs="?", type=_given("a suite file"), metavar="SUITE", help=suite_help)
        suite_args(p)
        allow_large_arg(p)
        p.add_argument("--out", type=_results_root, metavar="DIR", help="results root (default: results)")
        p.add_argument("--resume", type=_path("a run directory"), metavar="RUN_DIR", help=resume_help)

    def torchrun_args(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
        t = p.add_argument_group("torchrun (multi-node; the results root must be on a filesystem every node sees)")
        t.add_argument(
            "--launcher",
            choices=("local", "torchrun"),
            help="start the ranks here (local, the default) or each world as a torchrun job; --resume reuses the run's "
            "(another is refused)",
        )
        t.add_argument("--nnodes", type=_integer(1), metavar="N", help="nodes per world (default: 1)")
        t.add_argument(
            "--nproc-per-node",
            type=_integer(1),
            metavar="N",
            help="ranks per node (default: the world size / --nnodes)",
        )
        t.add_argument(
            "--rdzv-endpoint",
            metavar="HOST:PORT",
            help="c10d rendezvous on the first node (needed with --nnodes > 1; default: torchrun --standalone)",
        )
        t.add_argument(
            "--agent-prefix",
            type=_command_line,
            metavar="CMD",
            help="command that starts one torchrun agent per node, "
            "e.g. 'srun --ntasks-per-node=1 --kill-on-bad-exit=1'",
        )
        t.add_argument(
            "--rdzv-timeout",
            type=_seconds,
            metavar="SECONDS",
            help="how long each world's agents may take to meet before the sweep stops (default: 600); "
            "its ranks then get 60 s more to start",
        )
        return t

    p = sub.add_parser("sweep", help="run a suite")
    run_args(p, "suite TOML file (not needed with --resume)", "run only the missing or failed cases of RUN_DIR")
    p.add_argument("--dry-run", action="store_true", help="list the cases and exit")
    p.add_argument("--no-report", action="store_true", help="do not write the HTML report")
    p.add_argument(
        "--report",
        type=_file("the report's file name"),
        metavar="FILE",
        help="report path (default: reports/<suite>-<run_id>.html)",
    )
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
    run_args(
        p,
        "suite TOML file: its swept grid is the settings raced (not with --resume)",
        "go on with an interrupted tune of RUN_DIR",
    )
    p.add_argument("--dry-run", action="store_true", help="list the settings and exit")
    p.add_argument(
        "--epsilon",
        type=_fraction_text(0.02),
        metavar="PCT",
        help="the claim: the setting named is within PCT of the best, 2%% or 0.02 (default: 2%%)",
    )
    p.add_argument(
        "--confidence",
        type=_fraction_text(0.95),
        metavar="C",
        help="of the whole claim, above 0.5, below 1: 0.95 or 95%% (default: 0.95)",
    )
    p.add_argument(
        "--budget-s", type=_seconds, metavar="SECONDS", help="stop after this long, resolved or not (default: no limit)"
    )
    p.add_argument("--metric", choices=("step_ms", "cpu_ms"), help="what is raced (default: wall time per step)")
    p.add_argument(
        "--min-rounds",
        type=_integer(2, why=" (an interval needs two rounds)"),
        metavar="N",
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
    p.add_argument(
        "runs",
        nargs="+",
        type=_path("a run directory"),
        metavar="RUN_DIR",
        help="one run, or several: each compared with the first",
    )
    p.add_argument(
        "-o",
        "--output",
        type=_file("the report's file name"),
        metavar="FILE",
        help="default: reports/<suite>-<run_id>.html; several runs: reports/<suite>-<run_id>-vs-<run_id>.html",
    )
    _time_metric(p, "what the verdicts compare")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("validate", help="check a suite without running it")
    p.add_argument("suite", type=_given("a suite file"), metavar="SUITE", help="suite TOML file")
    suite_args(p)
    allow_large_arg(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("env", help="print this machine's environment fingerprint")
    p.set_defaults(func=cmd_env)

    p = sub.add_parser("list", help="list algorithms, workloads and suites")
    p.add_argument(
        "--suites",
        type=_given("a folder"),
        metavar="DIR",
        help="folder of suites (default: suites, where there is one)",
    )
    p.set_defaults(func=cmd_list)

    p = sub.add_parser(
        "compare",
        help="judge a candidate run against baseline run(s), or the cases of one run pair by pair: "
        "pass/regression/improvement/…",
    )
    p.add_argument(
        "runs",
        nargs="+",
        type=_path("a run directory"),
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
        type=_path("a run directory"),
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
    _ignore_env_arg(p, "explain")
    p.add_argument("--format", choices=("text", "md", "json"), default="text", help="output on stdout (default: text)")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("gate", help="run a suite for baseline and candidate in this job, in lockstep, and judge")
    p.add_argument("suite", type=_given("a suite file"), metavar="SUITE", help="suite TOML file")
    p.add_argument(
        "--baseline",
        required=True,
        metavar="PATH_OR_CMD",
        help="python executable, venv directory, tpbench source tree (pyproject.toml), folder of your own code "
        "(its MODULE:NAME workloads and hooks, run by this tpbench) or tpbench command prefix",
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
        type=_gate_repeats,
        metavar="N",
        help="lockstep: the most repeats per case (default: 30; 500 with --target-ci)",
    )
    p.add_argument(
        "--target-ci",
        type=_target_ci,
        metavar="PCT",
        help="lockstep: pair until every case is decided (from 10 pairs a case): different when its interval "
        "excludes 1, same when it lies within ±PCT; then answer same / different / unknown",
    )
    p.add_argument(
        "--budget-s",
        type=_seconds,
        metavar="SECONDS",
        help="lockstep: stop after this long, whatever is left (default: 480)",
    )
    p.add_argument(
        "--seed", type=_integer(0), metavar="N", help="lockstep: seed of each round's side order (default: 0)"
    )
    p.add_argument(
        "--rounds", type=_integer(1), metavar="N", help="rounds mode: sweeps per side, alternating (default: 5)"
    )
    suite_args(p)
    p.add_argument(
        "--candidate-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override for the candidate only (e.g. slowdown_pct=10 to check the gate itself)",
    )
    p.add_argument(
        "--out",
        type=_out_dir,
        metavar="DIR",
        help="where the gate's runs, logs and gate.json go (default: results/gate/<id>)",
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
    p.add_argument("run", type=_path("a run directory"), metavar="RUN_DIR")
    p.add_argument(
        "--format",
        required=True,
        choices=("pytest-benchmark", "custom-smaller-is-better"),
        help="a saved run that pytest-benchmark compare reads, or github-action-benchmark's customSmallerIsBetter",
    )
    _time_metric(p, "what each case's numbers are")
    p.add_argument(
        "-o", "--output", type=_file("the export's file name"), metavar="FILE", help="write here instead of stdout"
    )
    p.set_defaults(func=cmd_export)

    p = sub.add_parser(
        "whatif", help="project a run's step times onto other fabrics (α–β model), validated on its emulated links"
    )
    p.add_argument("run", type=_path("a run directory"), metavar="RUN_DIR")
    p.add_argument(
        "--fabric", action="append", default=[], metavar="NAME", help="project onto these fabrics only (default: all)"
    )
    p.add_argument(
        "--fabrics",
        action="append",
        default=[],
        type=_path("a fabrics file"),
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
        choices=("text", "json", "md"),
        default="text",
        help="text: the tables and the answer; json: projections, intervals, refusals, validation and ranking; "
        "md: the text's tables, refusals and answer as Markdown",
    )
    p.set_defaults(func=cmd_whatif)
    for command in sub.choices.values():  # what ``cli.main`` says an argument too many with
        command.set_defaults(command_parser=command)
    return ap
