"""The ``tpbench`` command as a whole: no command given, a command or an option mistyped.

Each case names the exit code and the line a user meets; none starts a rank process.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from conftest import run_cli

from tpbench.cli.options import build_parser

REPO = Path(__file__).resolve().parents[1]
DOCS = "\n".join(page.read_text() for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))])


def commands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = (a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def shown(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The arguments ``COMMAND --help`` shows (not ``-h`` itself, nor the hidden ones)."""
    return [a for a in parser._actions if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]


def test_no_command_lists_every_command_with_what_it_does(capsys):
    """``tpbench`` alone said "the following arguments are required: command" under a usage line of
    bare names: now the help, each command with its line, then the error (exit 2)."""
    assert run_cli([]) == 2
    err = capsys.readouterr().err
    assert "write the HTML report of one run" in err and "race a suite's swept settings" in err
    assert err.rstrip().endswith("tpbench: error: give a command; tpbench COMMAND --help lists its options")


@pytest.mark.parametrize(
    ("typed", "said"),
    [
        ("rport", "tpbench: error: rport: no such command; did you mean report? (the commands: sweep, tune,"),
        ("comapre", "tpbench: error: comapre: no such command; did you mean compare? (the commands:"),
        ("frobnicate", "tpbench: error: frobnicate: no such command (the commands: sweep, tune, report,"),
    ],
)
def test_a_mistyped_command_names_the_closest_one(capsys, typed, said):
    """``tpbench rport RUN`` said "argument command: invalid choice: 'rport' (choose from ...)" under
    the usage block: the reader had to spot the typo in a list of eleven."""
    assert run_cli([typed, "results/smoke/RUN"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith(said) and "invalid choice" not in err and "usage:" not in err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["compare", "A", "B", "--formt", "json"], "unrecognized arguments: --formt json; did you mean --format?"),
        (["compare", "A", "B", "--treshold=2%"], "unrecognized arguments: --treshold=2%; did you mean --threshold?"),
        (
            ["sweep", "S", "--dryrun", "--no-reprot"],
            "unrecognized arguments: --dryrun --no-reprot; did you mean --dry-run, --no-report?",
        ),
        (["sweep", "S", "--report-dir", "r"], "unrecognized arguments: --report-dir r; did you mean --report?"),
        (["sweep", "S", "--frobnicate"], "tpbench sweep: error: unrecognized arguments: --frobnicate"),
    ],
)
def test_a_mistyped_option_names_the_closest_one_the_command_has(capsys, args, said):
    """``sweep S --dryrun`` said "unrecognized arguments: --dryrun" alone; the reader looked for the
    spelling in the usage block. The hidden ``--reports-dir`` (the tests') is never offered."""
    assert run_cli(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.endswith(said)


@pytest.mark.parametrize(
    ("option", "said"),
    [
        ("--confidence", "--confidence abc: expected a percentage like 95% or a fraction like 0.95"),
        ("--epsilon", "--epsilon abc: expected a percentage like 2% or a fraction like 0.02"),
    ],
)
def test_a_fraction_that_is_no_number_is_told_a_value_its_option_takes(capsys, option, said):
    """``tune --confidence abc`` was told "like 2% or ... 0.02", which the confidence's own range
    (above 0.5) then refuses: each option's example is now a value it takes."""
    assert run_cli(["tune", "S", option, "abc"]) == 2
    assert capsys.readouterr().err.strip() == f"tpbench tune: error: {said}"


@pytest.mark.parametrize("command", sorted(commands()))
def test_every_value_in_help_is_named_as_the_docs_name_it(command):
    """``--min-rounds MIN_ROUNDS``, ``--out OUT``, ``--threshold THRESHOLD`` and a lower-case ``[suite]``
    were argparse's names for what the docs call N, DIR, PCT and SUITE: each value is named, or its
    choices listed, so that one spelling means one thing across the commands."""
    for action in shown(commands()[command]):
        if action.nargs != 0:
            assert action.metavar or action.choices, f"{command} {action.option_strings or action.dest}"
            assert action.metavar != action.dest.upper() or not action.option_strings


@pytest.mark.parametrize("command", sorted(commands()))
def test_every_option_in_help_is_documented_and_every_documented_option_exists(command):
    """Each option a command's help shows is named somewhere in README.md or docs/, and each option
    the docs give a command on one line (``tpbench tune ... --epsilon 2%``) is one it has."""
    parser = commands()[command]
    for action in shown(parser):
        named = [o for o in action.option_strings if re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", DOCS)]
        assert named or not action.option_strings, f"tpbench {command} {action.option_strings}: not in the docs"
    for line in re.findall(rf"tpbench {command} ([^`\n]*)", DOCS):
        for option in re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", line):
            assert option in parser._option_string_actions, f"the docs give tpbench {command} {option}: {line}"


def test_gate_help_names_every_form_a_side_takes():
    """``tpbench gate --help`` gave four forms of ``--baseline``; the fifth, a folder of your own code (a
    checkout of a project whose suite names its own workload or hook), which CI gates a project's code
    with (docs/gates.md), was left out, as if such a folder were refused."""
    said = " ".join(commands()["gate"]._option_string_actions["--baseline"].help.split())
    for form in ("python executable", "venv", "tpbench source tree", "folder of your own code", "command prefix"):
        assert form in said, f"--baseline's help does not name {form}: {said}"
