"""The ``tpbench`` command: argument parsing and terminal output only; the work is in the library.

One module per command or family of commands (``sweep``, ``tune``, ``verdicts``: compare, gate and
explain; ``show``: report, export, whatif, validate, env, list), their options in ``options``,
and what they share (consoles, exit codes, stop signals) in ``common``, whose docstring lists the
exit codes.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys

from tpbench.cli.common import EXIT_RESULTS, EXIT_USAGE, console, error, interrupted, usage
from tpbench.cli.options import build_parser

# A value that starts like a negative number ("-1%", "-1e-3", "-inf") but that argparse does not
# take for one (it takes only "-5" and "-0.5"): argparse reads it as an unknown option and says
# "expected one argument", never reaching the check that names the option and what it expects.
_NEGATIVE = re.compile(r"-(\d|\.\d|inf|nan)", re.IGNORECASE)
_ARGPARSE_NEGATIVE = re.compile(r"-\d+|-\d*\.\d+")


def _negative_values_kept(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``--epsilon -1%`` as ``--epsilon=-1%``: the value reaches the option's own check, which
    refuses it naming the option and the values expected (exit 2). Only where argparse would have
    refused the pair anyway, so that nothing it accepts reads otherwise, and only after an option of
    the command that takes one value: joined to a flag (``--dry-run -1%``) argparse would say "ignored
    explicit argument", and to an option the command lacks, "unrecognized arguments: --eps=-1%",
    which the user never typed; left apart, it names the stray value itself."""
    command = _command_parser(parser, argv)
    out: list[str] = []
    for token in argv:
        prev = out[-1] if out else ""
        joinable = command is not None and _takes_one_value(command, prev)
        if joinable and _NEGATIVE.match(token) and not _ARGPARSE_NEGATIVE.fullmatch(token):
            out[-1] = f"{prev}={token}"
        else:
            out.append(token)
    return out


def _command_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser | None:
    """The parser of the command ``argv`` starts with (None: none, which argparse then refuses)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and argv:
            return action.choices.get(argv[0])
    return None


def _takes_one_value(parser: argparse.ArgumentParser, flag: str) -> bool:
    """Whether ``flag`` is a long option of ``parser`` that takes one value, given whole or, as
    argparse allows, by a prefix of one option alone (``--eps`` for ``--epsilon``)."""
    if not flag.startswith("--") or "=" in flag or flag == "--":
        return False
    options = parser._option_string_actions
    matches = [options[flag]] if flag in options else [a for s, a in options.items() if s.startswith(flag)]
    return len(matches) == 1 and matches[0].nargs is None


# Commands that take one run or suite: what they do with it, and what a reader who gave more likely meant.
_COMPARE = "to compare runs: tpbench compare BASELINE CANDIDATE"
_ONE = {
    "whatif": (
        "RUN_DIR",
        "it projects one run's traced steps onto other fabrics",
        f"{_COMPARE}; where their time went: tpbench explain BASELINE CANDIDATE",
    ),
    "export": ("RUN_DIR", "it writes one run for a CI dashboard", _COMPARE),
    "sweep": ("SUITE", "it runs one suite", ""),
    "tune": ("SUITE", "it races one suite's settings", ""),
    "validate": ("SUITE", "it checks one suite", ""),
}


def _refuse_extra(args: argparse.Namespace, extra: list[str]) -> None:
    """Arguments the command did not take, refused with the command's own usage (argparse's root
    parser would show the list of commands and "unrecognized arguments" without naming the command),
    and, for a command that takes one run or suite given more, what it takes: exit 2."""
    parser: argparse.ArgumentParser = args.command_parser
    if args.command in _ONE and not any(a.startswith("-") for a in extra):
        what, does, meant = _ONE[args.command]
        said = f"takes one {what} ({does}), got {len(extra) + 1}: {' '.join(extra)} besides"
        parser.error(f"{said}; {meant}" if meant else said)
    parser.error(f"unrecognized arguments: {' '.join(extra)}{_closest_options(parser, extra)}")


def _closest_options(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """For each mistyped long option among ``extra`` (``--dryrun``, ``--formt=json``), the command's
    closest one, "; did you mean --dry-run?" (empty: none is close), so that the reader need not find
    the spelling in the usage block. Hidden options are never offered."""
    known = [
        flag
        for flag, action in parser._option_string_actions.items()
        if flag.startswith("--") and flag != "--help" and action.help != argparse.SUPPRESS
    ]
    guesses: list[str] = []
    for token in extra:
        flag = token.split("=", 1)[0]
        if flag.startswith("--") and flag not in known:
            guesses += [g for g in difflib.get_close_matches(flag, known, n=1, cutoff=0.8) if g not in guesses]
    return f"; did you mean {', '.join(guesses)}?" if guesses else ""


def main(argv: list[str] | None = None) -> None:
    from tpbench.compare import GateError
    from tpbench.explain import ExplainError, Unanswerable
    from tpbench.gate import SideError
    from tpbench.interconnect import InterconnectUnavailable
    from tpbench.racing import TuneError
    from tpbench.store import StoreError
    from tpbench.suite import SuiteError

    parser = build_parser()
    given = sys.argv[1:] if argv is None else argv
    if not given:
        # What there is to run, each command with its line, rather than argparse's "the following
        # arguments are required: command" under a usage line that lists the names alone.
        parser.print_help(sys.stderr)
        console.print("\ntpbench: error: give a command; tpbench COMMAND --help lists its options", markup=False)
        sys.exit(EXIT_USAGE)
    args, extra = parser.parse_known_args(_negative_values_kept(given, parser))
    if extra:
        _refuse_extra(args, extra)
    if args.command in ("sweep", "tune") and not args.suite and not args.resume:
        console.print(f"tpbench {args.command}: error: give a SUITE file, or --resume RUN_DIR", markup=False)
        sys.exit(EXIT_USAGE)
    try:
        code = args.func(args)
    except SuiteError as e:
        # A suite file's mistake, or a --set or --filter one: bad input, said as a bad option is.
        usage(str(e), args.command)
    except InterconnectUnavailable as e:
        error(e, args.command)
        code = EXIT_USAGE
    except (StoreError, Unanswerable) as e:
        error(e, args.command)
        code = EXIT_RESULTS
    except OSError as e:
        # A disk that fills up or a folder that disappears mid-sweep: what finished is on disk.
        error(RuntimeError(f"{e.filename or ''}: {e.strerror or e}"), args.command)
        code = EXIT_RESULTS
    except KeyboardInterrupt as e:
        # Before a run directory exists (or outside a sweep): nothing to resume, nothing to say but that.
        said, code = interrupted(e)
        console.print(said, markup=False)
    except (GateError, TuneError, ExplainError) as e:
        # Bad options or arguments, said as argparse and the options' own types say them (exit 2).
        usage(str(e), args.command)
    except SideError as e:
        error(e, args.command)
        code = EXIT_USAGE if e.usage else EXIT_RESULTS
    sys.exit(code)
