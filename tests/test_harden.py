"""Careless and hostile input files and outputs (docs/reliability.md, "Files" and "what-if's
inputs"): special files, oversized files, wrong types and non-finite numbers are refused in one
line naming the file and key (exit 2), outputs never replace a device node, budgets are finite.

No rank process starts here: runs come from ``synthetic_runs.make_run``.
"""

from __future__ import annotations

import os
import signal
import stat
import tempfile
import threading
from pathlib import Path

import pytest
from conftest import run_cli, tiny_suite
from synthetic_runs import make_run

from tpbench import store, sweep, user_files, whatif_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("harden"), {"ddp": [10.0, 10.1, 9.9], "zero_no_overlap": [12, 12.2, 12.1]})
    sweep.finalize(store.Run.open(run))  # its summary, as a sweep leaves it
    return run


# --- files: only regular files are read, with a size cap -----------------------------------------


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/urandom"])
def test_a_device_as_a_suite_or_fabrics_file_is_refused_not_read(special, tmp_path, capsys):
    link = tmp_path / "suite.toml"
    link.symlink_to(special)
    assert run_cli(["validate", str(link)]) == 2
    assert f"{link}: the suite file is not a regular file (a character device)" in capsys.readouterr().err
    with pytest.raises(ValueError, match="fabrics file is not a regular file"):
        whatif_run.load_fabrics([special])


def test_a_fifo_as_a_suite_is_refused_without_blocking(tmp_path, capsys):
    fifo = tmp_path / "suite.toml"
    os.mkfifo(fifo)
    assert run_cli(["validate", str(fifo)]) == 2
    assert "not a regular file (a FIFO)" in capsys.readouterr().err


def test_a_directory_as_a_suite_or_fabrics_file_is_refused_naming_it(tmp_path, capsys):
    """It used to read "error: 3: Is a directory" (the file descriptor's number) and exit 3."""
    assert run_cli(["validate", str(tmp_path)]) == 2
    assert f"{tmp_path}: the suite file is not a regular file (a directory)" in capsys.readouterr().err
    with pytest.raises(ValueError, match=f"{tmp_path}: the fabrics file is not a regular file"):
        whatif_run.load_fabrics([tmp_path])


def test_filters_that_match_no_case_are_refused_naming_the_filter_and_the_values_there(tmp_path, capsys):
    """``validate`` said "ok, 0 cases" (exit 0) where ``sweep`` and ``tune`` refuse the same filter;
    all three now refuse it alike, naming the filter that left no case and the values the cases
    before it had, so that a misspelt value reads as such ("No case matches the filters." did not)."""
    suite = Path(__file__).parent.parent / "suites" / "smoke.toml"
    for command in ("validate", "sweep", "tune"):
        assert run_cli([command, str(suite), "--filter", "algorithm=nope"]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert "smoke.toml: --filter algorithm=nope: no case matches; the 2 case(s) have algorithm ddp | zero" in err
    assert run_cli(["validate", str(suite), "--filter", "algorithm=ddp", "--filter", "steps=999"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--filter steps=999: no case matches; the 1 case(s) the filters before it left have steps 8" in err


def test_a_workload_table_no_case_runs_is_warned_of(tmp_path, capsys):
    """``[workloads.markov]`` beside cases that all run mlp was accepted without a word: its parameters
    changed nothing, and a forgotten or misspelt ``workload`` went unseen until the results. validate
    and the dry runs now warn, naming the table; ``--set workload=markov`` uses it, and then nothing is said."""
    suite = tmp_path / "s.toml"
    suite.write_text(
        '[sweep]\nalgorithm = ["ddp", "zero_no_overlap"]\n[defaults]\nworkload = "mlp"\n'
        "[workloads.markov]\nvocab = 64\n"
    )
    warning = f"warning: {suite}: [workloads.markov]: no case runs this workload (the cases run mlp)"
    for command in (["validate"], ["sweep", "--dry-run"], ["tune", "--dry-run"]):
        assert run_cli([*command, str(suite)]) == 0
        assert warning in " ".join(capsys.readouterr().err.split()), command
    assert run_cli(["validate", str(suite), "--set", "workload=markov"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_default_that_no_case_uses_is_warned_of(tmp_path, capsys):
    """``bucket_cap_mb = 4`` beside ``bucket_cap_mb_list``, or ``shard_buckets = true`` for ddp, was
    collapsed without a word: the value changed nothing. validate and the dry runs warn, naming the
    file, the key and what wins; a key that some case uses (shard_buckets beside a ZeRO hook) is not
    warned of, and the cases are those the suite always gave."""
    suite = tmp_path / "c.toml"
    suite.write_text(
        '[suite]\nname = "b"\n[sweep]\nalgorithm = ["ddp", "zero_no_overlap"]\n'
        "[defaults]\nbucket_cap_mb = 4\nbucket_cap_mb_list = [1, 25]\nshard_buckets = true\n"
    )
    caps = f"warning: {suite}: [defaults] bucket_cap_mb = 4: no case uses it (bucket_cap_mb_list replaces it)"
    shard = f"warning: {suite}: [defaults] shard_buckets = true: no case uses it (ddp does not use it; "
    shard += "zero_no_overlap does not use it)"
    for command in (["validate"], ["sweep", "--dry-run"], ["tune", "--dry-run"]):
        assert run_cli([*command, str(suite)]) == 0
        err = " ".join(capsys.readouterr().err.split())
        assert caps in err and shard in err, command
    assert run_cli(["validate", str(suite), "--set", "algorithm=hook_with_zero_step"]) == 0
    assert "shard_buckets" not in capsys.readouterr().err
    assert run_cli(["validate", str(suite), "--set", "algorithm=['ddp', 'hook_with_zero_step']"]) == 0
    assert "shard_buckets" not in capsys.readouterr().err


def test_a_filter_value_that_no_case_has_is_refused_beside_values_that_match(capsys):
    """``--filter 'algorithm=ddp|zero_no_overlp'`` ran ddp alone (exit 0): the misspelt value kept no
    case, but the filter kept some, so nothing said so. Each value must now match a case (exit 2),
    for ``=`` and ``!=`` alike and for id prefixes; values that all match still select as before."""
    suite = Path(__file__).parent.parent / "suites" / "smoke.toml"
    for command in (["validate"], ["sweep", "--dry-run"]):
        assert run_cli([*command, str(suite), "--filter", "algorithm=ddp|zero_no_overlp"]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert (
            "smoke.toml: --filter algorithm=ddp|zero_no_overlp: no case has algorithm zero_no_overlp (each value "
            "must match a case); the 2 case(s) have algorithm ddp | zero_no_overlap"
        ) in err, err
    assert run_cli(["validate", str(suite), "--filter", "algorithm!=ddp|nope"]) == 2
    assert "no case has algorithm nope" in capsys.readouterr().err
    assert run_cli(["validate", str(suite), "--filter", "id=0|zz"]) == 2
    assert "no case has id zz" in capsys.readouterr().err
    assert run_cli(["validate", str(suite), "--filter", "algorithm=ddp|zero_no_overlap"]) == 0
    assert "ok, 2 cases" in capsys.readouterr().out


def test_a_filter_error_says_the_collapsed_value_apart_with_the_filter_that_keeps_it(capsys):
    """``shard_buckets`` does not apply to the zero suite's zero_no_overlap cases (collapsed to None):
    the error listed "None | false | true", a value no suite sets; it now names the filter that keeps
    those cases, and that filter keeps them."""
    zero = Path(__file__).parent.parent / "suites" / "zero.toml"
    assert run_cli(["validate", str(zero), "--filter", "shard_buckets=maybe"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "the 18 case(s) have shard_buckets false | true, or none where it does not apply (6, collapsed: " in err
    assert "--filter shard_buckets=None keeps them)" in err and "None |" not in err
    assert run_cli(["validate", str(zero), "--filter", "shard_buckets=None"]) == 0
    assert "ok, 6 cases" in " ".join(capsys.readouterr().out.split())
    smoke = Path(__file__).parent.parent / "suites" / "smoke.toml"
    assert run_cli(["validate", str(smoke), "--filter", "shard_buckets=true"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "shard_buckets does not apply to any of the 2 case(s) (collapsed: --filter shard_buckets=None" in err


def test_validate_says_how_much_a_suite_writes_and_warns_where_it_would_not_fit(tmp_path, capsys, monkeypatch):
    """``validate`` passed ``steps = 1e9`` as "ok" and the sweep then refused it for disk space
    (exit 3): it still passes (the suite is valid), with the estimate the sweep's check uses and a
    warning that a sweep into results/ would be refused."""
    suite = Path(__file__).parent.parent / "suites" / "smoke.toml"
    monkeypatch.chdir(tmp_path)
    assert run_cli(["validate", str(suite)]) == 0
    shown = capsys.readouterr()
    assert "smoke.toml: ok, 2 cases (" in shown.out and " MiB of results)" in shown.out and not shown.err
    assert run_cli(["validate", str(suite), "--set", "steps=1000000000"]) == 0
    shown = capsys.readouterr()
    assert " TiB of results)" in shown.out
    assert f"warning: {tmp_path}: " in shown.err and "would refuse these cases there, exit 3" in shown.err


def test_one_case_is_counted_as_one_case(tmp_path, capsys, monkeypatch):
    """A count that can be one says "case": validate, a dry run and the report said "ok, 1 cases",
    "1 cases (dry run)" and "1 cases: 1 done"."""
    suite = Path(__file__).parent.parent / "suites" / "smoke.toml"
    monkeypatch.chdir(tmp_path)
    assert run_cli(["validate", str(suite), "--filter", "algorithm=ddp"]) == 0
    assert "smoke.toml: ok, 1 case (" in capsys.readouterr().out
    assert run_cli(["sweep", str(suite), "--filter", "algorithm=ddp", "--dry-run"]) == 0
    assert "smoke: 1 case (dry run)" in capsys.readouterr().out
    run = make_run(tmp_path / "one", {"ddp": [10.0, 10.1, 9.9]})
    sweep.finalize(store.Run.open(run))
    assert run_cli(["report", str(run), "-o", str(tmp_path / "r.html")]) == 0
    assert "(complete; 1 case: 1 done)" in (tmp_path / "r.html").read_text()


@pytest.mark.ranks
def test_one_rank_process_is_one_process(tmp_path, capsys):
    """The sweep's last line said "1 rank processes started"."""
    suite = Path(__file__).parent.parent / "suites" / "smoke.toml"
    args = ["--filter", "algorithm=ddp", "--set", "world_size=1", "--set", "repeats=1", "--set", "steps=2"]
    assert run_cli(["sweep", str(suite), *args, "--no-report", "--out", str(tmp_path)]) == 0
    said = capsys.readouterr()
    assert "; 1 rank process started." in " ".join((said.out + said.err).split())


def test_list_names_a_suites_folder_that_is_not_there(tmp_path, capsys):
    """An explicit ``--suites`` that does not exist is an error; without it, a folder with no suites/
    lists the algorithms and workloads alone."""
    assert run_cli(["list", "--suites", str(tmp_path / "none")]) == 2
    assert f"--suites {tmp_path / 'none'}: no such folder" in capsys.readouterr().err
    # A suite file given for the folder is there, and said to be no folder.
    (tmp_path / "s.toml").write_text("[suite]\n")
    assert run_cli(["list", "--suites", str(tmp_path / "s.toml")]) == 2
    assert (
        f"--suites {tmp_path / 's.toml'}: not a folder; expected a folder of suite TOML files"
        in capsys.readouterr().err
    )
    # A folder with no suite in it: said so, where an empty "suites in" table said nothing of why.
    (tmp_path / "empty").mkdir()
    assert run_cli(["list", "--suites", str(tmp_path / "empty")]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert f"No suite in {tmp_path / 'empty'} (no *.toml file)." in said and "suites in" not in said


def test_export_leaves_out_steps_without_a_time(tmp_path, capsys):
    """A case whose steps hold no time (NaN) is not exported, with the reason, instead of a
    traceback (pytest-benchmark's statistics of nothing; JSON has no NaN)."""
    import math

    run = make_run(tmp_path, {"ddp": [math.nan] * 3, "zero_no_overlap": [12, 12.2, 12.1]})
    for fmt in ("pytest-benchmark", "custom-smaller-is-better"):
        assert run_cli(["export", str(run), "--format", fmt]) == 0
        printed = capsys.readouterr()
        assert "not exported: ddp" in printed.err and "zero_no_overlap" in printed.out


def test_an_oversized_or_binary_suite_is_refused_naming_it(tmp_path, capsys):
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * user_files.MAX_INPUT_BYTES)
    assert run_cli(["validate", str(big)]) == 2
    assert f"{big}: the suite file is larger than 1024 KiB" in capsys.readouterr().err
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe[suite]")
    assert run_cli(["validate", str(binary)]) == 2
    assert f"{binary}: the suite file is not UTF-8 text" in capsys.readouterr().err


# --- what-if's inputs: every value typed, finite and bounded --------------------------------------


@pytest.mark.parametrize(
    "body, message",
    [
        ("[fabrics.x]\nlatency_us = 1\nbandwidth_GBps = -3\n", "bandwidth_GBps must be a finite number > 0"),
        ("[fabrics.x]\nlatency_us = nan\nbandwidth_GBps = 3\n", "latency_us must be a finite number >= 0"),
        ("[fabrics.x]\nlatency_us = 1\nbandwidth_GBps = inf\n", "bandwidth_GBps must be a finite number"),
        ("[fabrics.x]\nlatency_us = 1\nbandwidth_GBps = 1e9\n", "and <= 1e+06, got 1000000000.0"),
        ('[fabrics.x]\nlatency_us = "1"\nbandwidth_GBps = 3\n', "latency_us must be a finite number"),
        ('[fabrics.x]\nlatency_us = 1\nbandwidth_GBps = 3\nshared = "false"\n', "shared must be true or false"),
        ("[fabrics.x]\nlatency_us = 1\nbandwidth_GBps = 3\ndescription = 5\n", "description must be a string"),
        ('[fabrics."[red]x[/red]"]\nlatency_us = 1\nbandwidth_GBps = 3\n', "expected a name of letters, digits"),
        ("fabrics = 5\n", "fabrics must be tables [fabrics.NAME], got int"),
        ("[fabrics.x\nlatency_us = 1\n", "not valid TOML"),
        # Named the position alone; the shape expected is said, as the other errors say theirs.
        ("x ][\n", "expected [fabrics.NAME] tables, each with latency_us and bandwidth_GBps"),
        # A key left out is named with what it takes, as a key out of bounds is.
        ("[fabrics.x]\nlatency_us = 1\n", "missing bandwidth_GBps; expected a finite number > 0 and <= 1e+06"),
        ("[fabrics.x]\nbandwidth_GBps = 3\n", "missing latency_us; expected a finite number >= 0 and <= 1e+06"),
        ("".join(f"[fabrics.f{i}]\nlatency_us = 1\nbandwidth_GBps = 3\n" for i in range(65)), "at most 64 per file"),
        # Accepted in silence (exit 0), nothing added: a file truncated, or the wrong one given.
        ("", "no fabrics; expected [fabrics.NAME] tables, each with latency_us and bandwidth_GBps"),
        ("# my fabrics\n[fabrics]\n", "no fabrics; expected [fabrics.NAME] tables"),
    ],
)
def test_whatif_fabrics_of_the_wrong_type_or_out_of_bounds_exit_2_naming_the_key(
    run_dir, tmp_path, capsys, body, message
):
    f = tmp_path / "fabrics.toml"
    f.write_text(body)
    assert run_cli(["whatif", str(run_dir), "--fabrics", str(f)]) == 2
    err = capsys.readouterr().err
    assert str(f) in err and message in err, err
    assert "Traceback" not in err


# --- outputs: through symlinks, in place into special files, never replacing a node --------------


def test_export_to_dev_null_writes_in_place_and_keeps_the_device(run_dir, capsys):
    before = os.stat("/dev/null")
    assert run_cli(["export", str(run_dir), "--format", "pytest-benchmark", "-o", "/dev/null"]) == 0
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino


def test_report_through_a_symlink_writes_its_target_and_keeps_the_link(run_dir, tmp_path, capsys):
    target = tmp_path / "real.html"
    target.write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to(target)
    assert run_cli(["report", str(run_dir), "-o", str(link)]) == 0
    assert link.is_symlink() and link.resolve() == target
    assert target.read_text().startswith("<!DOCTYPE html>")
    # The same run twice (here once through a trailing "."): refused, the page left as it was.
    assert run_cli(["report", str(run_dir), str(run_dir / "."), "-o", str(link)]) == 2
    assert "given twice" in capsys.readouterr().err and target.read_text().startswith("<!DOCTYPE html>")


def test_export_into_a_fifo_writes_to_its_reader(run_dir, tmp_path, capsys):
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    assert run_cli(["export", str(run_dir), "--format", "pytest-benchmark", "-o", str(fifo)]) == 0
    reader.join(timeout=30)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and got and got[0].startswith(b"{")


# --- budgets and targets: finite and within documented bounds ------------------------------------


_GATE = ["gate", "NONE", "--baseline", ".", "--candidate", "."]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["sweep", "SUITE", "--budget-s", "-1"], "tpbench sweep: error: --budget-s -1: expected a number of seconds"),
        (["sweep", "SUITE", "--target-ci", "0"], "tpbench sweep: error: --target-ci 0: expected a percentage"),
        (["sweep", "SUITE", "--launcher", "torchrun", "--nproc-per-node", "0"], "--nproc-per-node 0: expected an"),
        (["tune", "SUITE", "--epsilon", "200%"], "tpbench tune: error: --epsilon 200%: expected a margin"),
        (["tune", "SUITE", "--epsilon", "abc"], "tpbench tune: error: --epsilon abc: expected a percentage"),
        (["tune", "SUITE", "--min-rounds", "1"], "tpbench tune: error: --min-rounds 1: expected an integer >= 2"),
        (["tune", "SUITE", "--min-rounds", "x"], "tpbench tune: error: --min-rounds x: expected an integer >= 2"),
        (["tune", "SUITE", "--nnodes", "-1"], "tpbench tune: error: --nnodes -1: expected an integer >= 1"),
        (["compare", "A", "B", "--threshold", "150%"], "tpbench compare: error: --threshold 150%: expected"),
        (["compare", "A", "B", "--format", "xml"], "tpbench compare: error: --format xml: expected one of text, md"),
        ([*_GATE, "--seed", "-5"], "tpbench gate: error: --seed -5: expected an integer >= 0"),
        ([*_GATE, "--repeats", "0"], "tpbench gate: error: --repeats 0: expected an integer from 1 to 10000"),
        ([*_GATE, "--mode", "rounds", "--rounds", "0"], "tpbench gate: error: --rounds 0: expected an integer >= 1"),
        ([*_GATE, "--threshold", "x"], "tpbench gate: error: --threshold x: expected a percentage"),
        (["sweep", "SUITE", "--set", "=5"], "tpbench sweep: error: --set =5: expected KEY=VALUE"),
        (["validate", "SUITE", "--filter", "nokey=1"], "s.toml: --filter nokey=1: unknown key; expected one of id,"),
    ],
)
def test_an_option_value_refused_is_one_line_naming_command_option_and_value(tmp_path, capsys, args, said):
    """Option errors came in two looks within one command: argparse's usage block above "tpbench
    sweep: error: argument --budget-s: -1: ...", or one line "error: --epsilon 200%: ..."; and a
    negative ``--seed`` (which ``random.Random`` reads as the positive one) was taken; ``--set`` and
    ``--filter`` said "error: --set =5: ...". Now one line each, said by the command, exit 2, before
    anything runs."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 10]", repeats=4))
    given = [str(suite) if a == "SUITE" else str(tmp_path / "none.toml") if a == "NONE" else a for a in args]
    assert run_cli([*given, "--out", str(tmp_path / "out")] if args[0] not in ("compare", "validate") else given) == 2
    err = capsys.readouterr().err
    # The suite's file first where the error is the suite's (--filter's, as --set's unknown key).
    named = (f"tpbench {args[0]}: error: --", f"tpbench {args[0]}: error: {suite}: --")
    assert said in err and err.startswith(named) and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["sweep", "suites/smoke.toml", "--dry-run", "--launcher", "torchrun", "--agent-prefix", "srun 'x"],
            "tpbench sweep: error: --agent-prefix srun 'x: expected a command line (No closing quotation)",
        ),
        (
            ["gate", "suites/gate.toml", "--baseline", "'x", "--candidate", "."],
            "tpbench gate: error: --baseline 'x: expected a file, a directory or a command line (No closing quotation)",
        ),
    ],
)
def test_a_command_line_with_an_unclosed_quote_is_refused_naming_the_option(tmp_path, capsys, args, said):
    """shlex's "ValueError: No closing quotation" came out as a traceback, exit 1."""
    assert run_cli([*args, "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == said
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["nan", "inf", "1e308", "-5", "0"])
def test_budget_seconds_must_be_finite_and_bounded(tmp_path, capsys, value):
    assert (
        run_cli(["sweep", "suites/smoke.toml", "--target-ci", "5%", "--budget-s", value, "--out", str(tmp_path)]) == 2
    )
    assert "expected a number of seconds > 0 and <= 604800" in capsys.readouterr().err
    assert run_cli(["gate", "suites/gate.toml", "--baseline", ".", "--candidate", ".", "--budget-s", value]) == 2
    assert "expected a number of seconds > 0 and <= 604800" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["1e-200", "0%", "20000%", "nan", "inf", "200"])
def test_adaptive_target_must_lie_within_its_bounds(tmp_path, capsys, value):
    """A bare "inf" or "200" was told "write inf% for that percentage, or inf% if you mean it" (and
    "20000% if you mean it"), values the bounds refuse however written."""
    assert (
        run_cli(["sweep", "suites/smoke.toml", "--target-ci", value, "--budget-s", "60", "--out", str(tmp_path)]) == 2
    )
    err = capsys.readouterr().err
    assert "from 0.1% to 10000%" in err and "if you mean it" not in err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["validate", ""], "tpbench validate: error: SUITE '': an empty path; expected a suite file"),
        (["sweep", ""], "tpbench sweep: error: SUITE '': an empty path; expected a suite file"),
        (["tune", ""], "tpbench tune: error: SUITE '': an empty path; expected a suite file"),
        (["sweep", "--resume", ""], "tpbench sweep: error: --resume '': an empty path; expected a run directory"),
        (["sweep", "suites/smoke.toml", "--out", ""], "tpbench sweep: error: --out '': an empty path"),
        (["sweep", "suites/smoke.toml", "--report", ""], "tpbench sweep: error: --report '': an empty path"),
        (["report", ""], "tpbench report: error: RUN_DIR '': an empty path; expected a run directory"),
        (
            ["report", "RUN", "-o", ""],
            "tpbench report: error: --output '': an empty path; expected the report's file name",
        ),
        (["compare", "RUN", ""], "tpbench compare: error: RUN_DIR '': an empty path; expected a run directory"),
        (["explain", "", "RUN"], "tpbench explain: error: RUN_DIR '': an empty path; expected a run directory"),
        (["export", "", "--format", "pytest-benchmark"], "tpbench export: error: RUN_DIR '': an empty path"),
        (["export", "RUN", "--format", "pytest-benchmark", "-o", ""], "tpbench export: error: --output '': an empty"),
        (["whatif", ""], "tpbench whatif: error: RUN_DIR '': an empty path; expected a run directory"),
        (["whatif", "RUN", "--fabrics", ""], "tpbench whatif: error: --fabrics '': an empty path"),
        (["list", "--suites", ""], "tpbench list: error: --suites '': an empty path; expected a folder"),
    ],
)
def test_an_empty_path_is_refused_naming_the_argument(run_dir, capsys, args, said):
    """``Path("")`` is ``.``: ``validate ''`` said ".: the suite file is not a regular file (a
    directory)", ``report ''`` looked for a run in the current directory, ``sweep --out ''`` swept
    into it and ``list --suites ''`` listed the default folder. Each is refused, exit 2, naming it."""
    assert run_cli([str(run_dir) if a == "RUN" else a for a in args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(said) and err.count("\n") == 1, err


def test_a_report_file_with_no_report_is_refused(tmp_path, capsys):
    """Both were accepted, and no report written where --report said."""
    args = ["sweep", "suites/smoke.toml", "--no-report", "--report", str(tmp_path / "r.html"), "--dry-run"]
    assert run_cli(args) == 2
    assert "with --no-report: the one names the report's file, the other writes none" in capsys.readouterr().err


def test_a_bare_target_of_one_or_more_is_refused_as_the_fraction_it_reads_as(tmp_path, capsys):
    """``--target-ci 5`` read as ±500 %: met at once, the sweep added no round and said nothing."""
    for cmd in (["sweep", "suites/smoke.toml", "--budget-s", "60"], ["gate", "suites/gate.toml"]):
        assert run_cli([*cmd, "--target-ci", "5", "--dry-run" if cmd[0] == "sweep" else "--repeats", "1"]) == 2
        assert "5: a bare number is a fraction (500%); write 5% for that percentage, or 500%" in capsys.readouterr().err
    assert run_cli(["sweep", "suites/smoke.toml", "--target-ci", "0.05", "--budget-s", "60", "--dry-run"]) == 0


# --- compare: nothing to compare is not a pass; metrics are recorded columns ---------------------


def test_compare_of_a_filter_matching_nothing_or_of_no_pair_exits_2(run_dir, tmp_path, capsys):
    assert run_cli(["compare", str(run_dir), "--filter", "algorithm=ddp", "--fail-on-inconclusive"]) == 2
    assert "nothing to compare" in capsys.readouterr().err
    assert run_cli(["compare", str(run_dir), "--filter", "bucket_cap_mb=999"]) == 2
    assert f"{run_dir}: --filter bucket_cap_mb=999: no case matches" in capsys.readouterr().err


def test_compare_names_a_filter_value_that_no_finished_case_has(run_dir, capsys):
    """As sweep's --filter does: ``algorithm=ddp|zero_no_overlp`` compared ddp alone, the typo unseen."""
    assert run_cli(["compare", str(run_dir), "--filter", "algorithm=ddp|zero_no_overlp"]) == 2
    said = capsys.readouterr().err
    assert "no case has algorithm zero_no_overlp (each value must match a case)" in said, said


@pytest.mark.parametrize("metric", ["repeat", "rank", "nonesuch"])
def test_compare_metric_that_is_not_a_recorded_measurement_exits_2(run_dir, capsys, metric):
    assert run_cli(["compare", str(run_dir), "--metric", metric]) == 2
    err = capsys.readouterr().err
    assert f"--metric {metric}: not recorded" in err and "step_ms" in err and "Traceback" not in err


# --- the gate: its budget holds while it waits, one gate per folder, only its sides' worlds ------


@pytest.mark.ranks
def test_a_side_that_never_connects_stops_the_gate_when_the_budget_is_spent(tmp_path, monkeypatch):
    """The candidate's command never starts a world (`sleep`): the gate must not wait out its
    600 s stall limit but stop once its 3 s budget is spent, name the side, and leave no process."""
    from conftest import REPO, tiny_suite, worker_processes

    from tpbench import gate

    suite = tmp_path / "gate.toml"
    suite.write_text(tiny_suite('algorithm = ["ddp"]'))
    out = tmp_path / "gate"
    baseline = gate.resolve_side("baseline", str(REPO), out / "baseline")
    silent = gate.resolve_side("candidate", 'sh -c "sleep 300"', out / "candidate")
    cfg = gate.Lockstep(repeats=2, budget_s=3, finish_grace_s=5)
    sockets = tmp_path / "tmp"
    sockets.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(sockets))
    with pytest.raises(gate.SideError, match=r"candidate \(sh -c .*ran no item before the gate stopped \(budget of 3"):
        gate.run_lockstep(suite, baseline, silent, out, cfg)
    assert not worker_processes(out / "baseline")
    assert not list(sockets.iterdir())


def test_a_second_gate_into_the_same_folder_is_refused_naming_the_first(tmp_path, capsys):
    from tpbench import store

    out = tmp_path / "gate"
    out.mkdir()
    held = store.RunLock(out)  # what the first gate holds while it runs
    try:
        assert run_cli(["gate", "suites/gate.toml", "--baseline", ".", "--candidate", ".", "--out", str(out)]) == 3
    finally:
        held.release()
    assert f"{out}: in use by pid {os.getpid()}" in capsys.readouterr().err


def test_only_the_sides_own_processes_may_take_their_turns():
    """A third `sweep --lockstep` given a gate's socket is refused: the gate accepts a world only
    when the connecting process descends from that side's sweep (SO_PEERCRED + /proc)."""
    import socket
    import subprocess
    import sys

    from tpbench.gate import _descends_from, _peer_pid

    a, b = socket.socketpair(socket.AF_UNIX)
    assert _peer_pid(a) == os.getpid()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert _descends_from(child.pid, os.getpid())
        assert _descends_from(os.getpid(), os.getpid())
        assert not _descends_from(os.getpid(), child.pid)
    finally:
        child.kill()
        child.wait()


def test_a_tmpdir_too_long_for_a_socket_path_falls_back_to_tmp(tmp_path, monkeypatch):
    from tpbench import gate

    long = tmp_path / ("d" * 120)
    long.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    folder = gate._socket_folder()
    try:
        assert folder.parent == Path("/tmp") and len(os.fsencode(folder / "c")) <= 107
    finally:
        folder.rmdir()
    assert not list(long.iterdir())


def test_user_code_in_the_callers_folder_imports_from_a_gate_side(tmp_path, monkeypatch):
    """A gate's sides run in out/<side>; the caller's folder reaches them as TPBENCH_USER_PATH,
    appended after everything else so it never shadows the side's own tpbench."""
    import sys

    from tpbench import user_code

    (tmp_path / "mine_for_gate.py").write_text("VALUE = 42\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv(user_code.USER_PATH_ENV, str(tmp_path))
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert user_code.import_module("mine_for_gate").VALUE == 42
    assert sys.path[-1] == str(tmp_path)


@pytest.mark.ranks
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_to_the_gate_says_so_stops_the_sides_and_removes_its_sockets(tmp_path, stop):
    import subprocess
    import sys
    import time

    from conftest import REPO, tiny_suite, worker_processes

    suite = tmp_path / "gate.toml"
    suite.write_text(tiny_suite('algorithm = ["ddp"]', steps=200, repeats=5))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "gate"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpbench", "gate", str(suite), "--baseline", str(REPO), "--candidate", str(REPO)]
        + ["--out", str(out)],
        env=os.environ | {"TMPDIR": str(tmp)},
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 240
    while not worker_processes(out / "baseline") and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
    proc.send_signal(stop)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + stop, err
    assert f"Terminated ({signal.Signals(stop).name})." in err
    assert not list(tmp.glob("tpbg-*"))
    assert not worker_processes(out / "baseline") and not worker_processes(out / "candidate")


# --- a disk that fills while a trace is written leaves no temporary trace file ------------------


def test_a_disk_full_during_the_trace_export_leaves_no_temporary_trace_file(tmp_path):
    """A real tmpfs filled to its last few KiB: the traced steps' export fails with ENOSPC, and
    neither the exporter's files nor the gzip part stay behind."""
    import subprocess

    import torch

    from tpbench.capture.profiler import trace_steps

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], check=False).returncode:
        pytest.skip("needs root to mount a tmpfs")
    try:
        with pytest.raises(OSError), open(disk / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        (disk / "filler").write_bytes((disk / "filler").read_bytes()[: -16 * 1024])  # 16 KiB left
        model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
        x = torch.randn(4, 64)

        def step(_: int) -> None:
            model(x).sum().backward()

        with pytest.raises(OSError):
            trace_steps(step, 3, 0, torch.device("cpu"), disk / "trace" / "rank0.json.gz")
        assert [p.name for p in (disk / "trace").iterdir()] == []
    finally:
        # Lazily: torch's trace exporter keeps its failed file open until the process exits.
        subprocess.run(["umount", "--lazy", str(disk)], check=False)


def test_a_results_folder_whose_path_is_not_utf8_is_refused_before_anything_runs(tmp_path, capsys):
    """torch's FileStore and profiler take only UTF-8 paths: such an --out is refused in one line
    (exit 2) rather than failing every rank and leaving a run that reads as running."""
    out = os.fsdecode(os.fsencode(tmp_path) + b"/results\xff")
    assert run_cli(["sweep", "suites/smoke.toml", "--out", out]) == 2
    assert "not a UTF-8 path" in capsys.readouterr().err
    assert run_cli(["gate", "suites/gate.toml", "--baseline", ".", "--candidate", ".", "--out", out]) == 2
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["sweep", "tune"])
@pytest.mark.parametrize("below", ["", "cases"])
def test_a_results_folder_that_is_a_run_or_inside_one_is_refused_naming_the_resume(run_dir, command, below, capsys):
    """--out is the results root: given a run's own folder (or one inside it), the new run was made
    inside the old one's. Refused in one line (exit 2) naming the run and its resume; nothing written."""
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    assert run_cli([command, "suites/smoke.toml", "--out", str(run_dir / below), "--dry-run"]) == 2
    said = capsys.readouterr().err
    assert "a run's directory (it holds run.json)" in said
    assert f"tpbench sweep --resume {run_dir}" in said
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before


@pytest.mark.parametrize("command", [["report"], ["compare"], ["sweep", "--dry-run", "--resume"]])
def test_a_folder_of_runs_given_as_a_run_names_its_latest_run_and_a_file_says_it_is_one(tmp_path, command, capsys):
    """A results root or a suite's folder given where a run was expected: exit 3 naming the latest
    run it holds ("is not a tpbench run" alone left the reader to look two levels down); a file (a
    suite given to --resume, say) is said to be a file, not "no such run directory"."""
    run = make_run(tmp_path / "results", {"ddp": [10.0, 10.1, 9.9]})
    for folder in (run.parent, run.parent.parent):
        assert run_cli([*command, str(folder)]) == 3
        said = " ".join(capsys.readouterr().err.split())
        assert f"{folder} is not a tpbench run but holds 1 run (the latest: {run}): give a run's own folder" in said
    suite = tmp_path / "suite.toml"
    suite.write_text(tiny_suite('algorithm = ["ddp"]'))
    assert run_cli([*command, str(suite)]) == 3
    said = f"{suite}: not a directory; expected a run directory (results/<suite>/<run_id>)"
    assert said in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize(
    "command",
    [
        ["report"],
        ["export", "--format", "pytest-benchmark"],
        ["compare"],
        ["explain", "--pair", "algorithm=ddp..zero_no_overlap"],
        ["whatif"],
    ],
)
def test_a_run_directory_that_does_not_exist_exits_3_in_every_command_that_reads_runs(tmp_path, command, capsys):
    """A missing run directory is missing results, as the docs' exit codes say (3, naming it), in every command
    that reads a run: one of them exiting 2 (as a bad option) would make a CI step's code mean another thing."""
    missing = tmp_path / "results" / "zero" / "gone"
    assert run_cli([command[0], str(missing), *command[1:]]) == 3
    assert f"tpbench {command[0]}: error: {missing}: no such run directory" in " ".join(capsys.readouterr().err.split())
    if command[0] in ("report", "compare", "explain"):  # the second run missing, the first there
        run = make_run(tmp_path / "here", {"ddp": [10.0, 10.1, 9.9]})
        assert run_cli([command[0], str(run), str(missing)]) == 3
        assert f"{missing}: no such run directory" in " ".join(capsys.readouterr().err.split())


# --- run.json entries of the wrong type: exit 3 naming the file, never a traceback ---------------


@pytest.mark.parametrize(
    "entry",
    [
        {"adaptive": 5},
        {"adaptive": "yes"},
        {"adaptive": {"target_ci": "5%", "budget_s": 60, "state": "adapting"}},
        {"adaptive": {"target_ci": 0.05, "budget_s": 60, "state": "adapting", "planned_repeats": [3]}},
        {"adaptive": {"target_ci": 0.05, "budget_s": 60, "state": "adapting", "planned_repeats": {"x": "3"}}},
        {"adaptive": {"target_ci": 0.05, "budget_s": 60, "state": 5}},
        {"efficiency": [1]},
        {"launcher": "local"},
        {"status": 3},
        {"wall_s": "long"},
    ],
)
@pytest.mark.parametrize("command", ["report", "compare", "export"])
def test_run_json_entries_of_the_wrong_type_exit_3_naming_the_file(run_dir, tmp_path, capsys, entry, command):
    import json
    import shutil

    damaged = tmp_path / "run"
    shutil.copytree(run_dir, damaged)
    meta = json.loads((damaged / "run.json").read_text())
    (damaged / "run.json").write_text(json.dumps(meta | entry))
    args = {"report": ["-o", str(tmp_path / "r.html")], "export": ["--format", "pytest-benchmark"], "compare": []}
    assert run_cli([command, str(damaged), *args[command]]) == 3
    err = capsys.readouterr().err
    assert f"{damaged}/run.json: corrupted (" in err.replace("\n", "") and "Traceback" not in err


@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_a_run_json_that_is_not_a_regular_file_exits_3_without_reading_it(run_dir, tmp_path, capsys, special):
    import shutil

    damaged = tmp_path / "run"
    shutil.copytree(run_dir, damaged)
    (damaged / "run.json").unlink()
    if special == "fifo":
        os.mkfifo(damaged / "run.json")
    else:
        (damaged / "run.json").symlink_to(special)
    assert run_cli(["report", str(damaged), "-o", str(tmp_path / "r.html")]) == 3
    # Said as what it is: a FIFO or a device where run.json should be is no corrupted run.json.
    kind = "a FIFO" if special == "fifo" else "a character device"
    assert f"{damaged}/run.json: the run.json is not a regular file ({kind})" in capsys.readouterr().err


def test_a_run_json_too_large_is_not_called_a_toml_file(run_dir, tmp_path, capsys):
    """user_files' size limit said "expected a small TOML file" of a run.json too."""
    import shutil

    damaged = tmp_path / "run"
    shutil.copytree(run_dir, damaged)
    (damaged / "run.json").write_bytes(b" " * (store.MAX_RUN_JSON_BYTES + 1))
    assert run_cli(["report", str(damaged), "-o", str(tmp_path / "r.html")]) == 3
    err = " ".join(capsys.readouterr().err.split())
    assert f"{damaged}/run.json: corrupted (the run.json is larger than" in err and "TOML" not in err, err


@pytest.mark.parametrize("repeats", ["0", "100000"])
def test_gate_repeats_out_of_bounds_exit_2(tmp_path, capsys, repeats):
    out = tmp_path / "g"
    assert (
        run_cli(
            ["gate", "suites/gate.toml", "--baseline", ".", "--candidate", ".", "--repeats", repeats]
            + ["--out", str(out)]
        )
        == 2
    )
    assert f"--repeats {repeats}: expected an integer from 1 to 10000" in capsys.readouterr().err


@pytest.mark.parametrize("capture", [{"nvml": "none"}, {"observed_transport": [1]}, {"clock_sync": 5}])
def test_a_case_capture_entry_of_the_wrong_type_exits_3_naming_the_file(run_dir, tmp_path, capsys, capture):
    """What a case's capture recorded is read as typed sub-records (``record.Capture``): an entry
    that is no JSON object is refused when the run is read, not met deep inside the report."""
    import json
    import shutil

    damaged = tmp_path / "run"
    shutil.copytree(run_dir, damaged)
    meta = json.loads((damaged / "run.json").read_text())
    next(iter(meta["cases"].values())).update(capture)
    (damaged / "run.json").write_text(json.dumps(meta))
    assert run_cli(["report", str(damaged), "-o", str(tmp_path / "r.html")]) == 3
    err = capsys.readouterr().err
    assert f"{damaged}/run.json: corrupted (" in err.replace("\n", "") and "Traceback" not in err


@pytest.mark.parametrize("value", ["1e-200", "0%", "20000%", "nan"])
def test_the_gates_target_has_the_sweeps_bounds(capsys, value):
    args = ["gate", "suites/gate.toml", "--baseline", ".", "--candidate", ".", "--target-ci", value]
    assert run_cli(args) == 2
    assert "from 0.1% to 10000%" in capsys.readouterr().err
