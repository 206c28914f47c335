"""The ``tpbench`` command as a whole: no command given, a command or an option mistyped.

Each case names the exit code and the line a user meets; none starts a rank process.
"""

from __future__ import annotations

import pytest
from conftest import run_cli


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
