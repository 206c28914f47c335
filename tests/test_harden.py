"""Careless and hostile input files and outputs (docs/reliability.md, "Files" and "what-if's
inputs"): special files, oversized files, wrong types and non-finite numbers are refused in one
line naming the file and key (exit 2), outputs never replace a device node, budgets are finite.

No rank process starts here: runs come from ``synthetic_runs.make_run``.
"""

from __future__ import annotations

import os
import stat
import threading

import pytest
from conftest import run_cli
from synthetic_runs import make_run

from tpbench import user_files, whatif_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("harden"), {"ddp": [10.0, 10.1, 9.9], "zero_no_overlap": [12, 12.2, 12.1]})


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
        ("".join(f"[fabrics.f{i}]\nlatency_us = 1\nbandwidth_GBps = 3\n" for i in range(65)), "at most 64 per file"),
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


@pytest.mark.parametrize("value", ["nan", "inf", "1e308", "-5", "0"])
def test_budget_seconds_must_be_finite_and_bounded(tmp_path, capsys, value):
    assert (
        run_cli(["sweep", "suites/smoke.toml", "--target-ci", "5%", "--budget-s", value, "--out", str(tmp_path)]) == 2
    )
    assert "expected a number of seconds > 0 and <= 604800" in capsys.readouterr().err
    assert run_cli(["gate", "suites/gate.toml", "--baseline", ".", "--candidate", ".", "--budget-s", value]) == 2
    assert "expected a number of seconds > 0 and <= 604800" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["1e-200", "0%", "80%", "nan"])
def test_adaptive_target_must_lie_within_its_bounds(tmp_path, capsys, value):
    assert (
        run_cli(["sweep", "suites/smoke.toml", "--target-ci", value, "--budget-s", "60", "--out", str(tmp_path)]) == 2
    )
    assert "from 0.1% to 50%" in capsys.readouterr().err


# --- compare: nothing to compare is not a pass; metrics are recorded columns ---------------------


def test_compare_of_a_filter_matching_nothing_or_of_no_pair_exits_2(run_dir, tmp_path, capsys):
    assert run_cli(["compare", str(run_dir), "--filter", "algorithm=ddp", "--fail-on-inconclusive"]) == 2
    assert "nothing to compare" in capsys.readouterr().err
    assert run_cli(["compare", str(run_dir), "--filter", "bucket_cap_mb=999"]) == 2
    assert "--filter bucket_cap_mb=999: matches no finished case" in capsys.readouterr().err


@pytest.mark.parametrize("metric", ["repeat", "rank", "nonesuch"])
def test_compare_metric_that_is_not_a_recorded_measurement_exits_2(run_dir, capsys, metric):
    assert run_cli(["compare", str(run_dir), "--metric", metric]) == 2
    err = capsys.readouterr().err
    assert f"--metric {metric}: not recorded" in err and "step_ms" in err and "Traceback" not in err
