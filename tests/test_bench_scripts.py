"""The scripts in benchmarks/ as a user runs them: ``--help`` helps, a bad argument is refused in one
line with exit 2 before anything is measured. Each runs in this process as ``__main__`` (runpy), so
these take no ranks and no measurement; the figures they print are checked where the docs use them."""

from __future__ import annotations

import os
import runpy
import shutil
import sys

import pytest
import torch.multiprocessing
from conftest import REPO


def _run_script(name: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    """Run ``benchmarks/NAME.py ARGV`` as ``python benchmarks/NAME.py`` does; its exit code.

    Starting ranks fails the test: a script that measures where it should refuse would otherwise
    run for minutes."""

    def no_ranks(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"benchmarks/{name}.py {argv} started ranks")

    monkeypatch.setattr(torch.multiprocessing, "spawn", no_ranks)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *argv])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(REPO / "benchmarks" / f"{name}.py"), run_name="__main__")
    return exc.value.code or 0


@pytest.mark.parametrize("name", ["round_noise", "wake_cost"])
def test_help_prints_usage_and_measures_nothing(name, monkeypatch, capsys):
    """round_noise.py and wake_cost.py read sys.argv by hand: ``round_noise.py --help`` ran the
    40-round measurement, ``wake_cost.py --help`` ended in a ValueError traceback."""
    assert _run_script(name, ["--help"], monkeypatch) == 0
    assert capsys.readouterr().out.startswith(f"usage: {name}.py")


@pytest.mark.parametrize(
    ("name", "argv", "message"),
    [
        ("round_noise", ["abc"], "argument ROUNDS: invalid int value: 'abc'"),
        ("round_noise", ["1"], "ROUNDS 1: expected at least 2"),
        ("round_noise", ["--competiter"], "unrecognized arguments: --competiter"),
        ("wake_cost", ["0"], "BLOCKS 0: expected at least 1"),
        ("race_cost", ["--races", "0"], "--races 0: expected at least 1"),
        ("race_cost", ["--ratios", "1,x"], "--ratios 1,x: expected numbers separated by commas"),
        ("race_cost", ["--epsilon", "2"], "--epsilon 2 (200%): expected a margin above 0 and below 1"),
        ("bench_zero_hooks", ["--steps", "0"], "--steps 0: expected at least 1"),
        ("bench_zero_hooks", ["--world-size", "0"], "--world-size 0: expected at least 1"),
        ("bench_nvml_overhead", ["--rounds", "0"], "--rounds 0: expected at least 1"),
        ("bench_report", ["--rounds", "0"], "--rounds 0: expected at least 1"),
    ],
)
def test_a_bad_argument_is_refused_in_one_line(name, argv, message, monkeypatch, capsys):
    """A misspelt option was ignored (the measurement ran without it) and a count out of range ended
    in a traceback, often after the whole measurement; each is now argparse's one line and exit 2."""
    assert _run_script(name, argv, monkeypatch) == 2
    assert f"{name}.py: error: {message}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "argv", "message"),
    [
        ("own_miss", ["NOWHERE"], "NOWHERE: no such run directory"),
        ("twin_factor", ["NOWHERE"], "NOWHERE: no such run directory"),
        ("budget_resolution", ["NOWHERE"], "NOWHERE: no such run directory"),
        ("budget_resolution", ["--suite", "suites/smoke.toml", "--shape", "3x"], "--shape '3x': expected"),
        ("budget_resolution", ["--suite", "suites/smoke.toml", "--shape", "3x1+1", "--rounds", "0"], "--rounds 0"),
    ],
)
def test_the_run_readers_refuse_what_is_not_a_run_in_one_line(name, argv, message, tmp_path, monkeypatch, capsys):
    """A RUN_DIR that is not a run was a StoreError traceback (exit 1); budget_resolution's bad
    --shape exited 1 and its --rounds 0 printed nothing and exited 0, as if it had found nothing."""
    argv = [a.replace("NOWHERE", str(tmp_path / "nowhere")) for a in argv]
    assert _run_script(name, argv, monkeypatch) == 2
    err = capsys.readouterr().err
    assert f"{name}.py: error: {message.replace('NOWHERE', str(tmp_path / 'nowhere'))}" in err, err


@pytest.mark.parametrize(
    ("name", "argv", "message"),
    [
        ("tune_accuracy", ["--out", "OUT", "--tunes", "0"], "--tunes 0: expected at least 1"),
        ("tune_accuracy", ["--out", "OUT", "--table"], "--out OUT: no tunes.jsonl there to print"),
        ("tune_accuracy", ["--out", "OUT", "--competitor", "-1"], "--competitor -1: expected 0 or more busy loops"),
        ("make_trace", ["OUT", "--steps", "0"], "--steps 0: expected at least 1"),
        ("make_trace", ["OUT", "--world-size", "0"], "--world-size 0: expected at least 1"),
        ("synth_run", ["OUT", "--repeats", "0"], "--repeats 0: expected at least 1"),
        ("synth_run", ["OUT", "--buckets", "1", "0"], "--buckets 1.0 0.0: expected sizes in MB above 0"),
    ],
)
def test_the_writers_refuse_a_count_out_of_range_in_one_line(name, argv, message, tmp_path, monkeypatch, capsys):
    """tune_accuracy's --tunes 0, or --table on a folder without results, ended in a FileNotFoundError
    traceback for tunes.jsonl; make_trace's --steps 0 in torch.profiler's "Invalid profiler schedule";
    synth_run's --repeats 0 in a SuiteError naming its own synthetic suite. Nothing is written."""
    out = tmp_path / "out"
    argv = [a.replace("OUT", str(out)) for a in argv]
    assert _run_script(name, argv, monkeypatch) == 2
    err = capsys.readouterr().err
    assert f"{name}.py: error: {message.replace('OUT', str(out))}" in err, err
    assert not out.exists()


def test_own_miss_counts_a_case_the_whatif_cannot_model_as_refused(tmp_path, monkeypatch, capsys):
    """own_miss.py ended in a NotModelled traceback at the first case the what-if refuses without a
    model (traces gone here; a GPU, one-rank or switched post-local SGD case alike), so it could not
    read a run that held one; that case now counts among the refused and the others are replayed."""
    run = tmp_path / "run"
    shutil.copytree(REPO / "tests/data/whatif_links_run", run)
    gone = sorted((run / "cases").iterdir())[0]
    (gone / "intervals.parquet").unlink()
    monkeypatch.setattr(sys, "argv", ["own_miss.py", str(run)])
    runpy.run_path(str(REPO / "benchmarks" / "own_miss.py"), run_name="__main__")
    line = capsys.readouterr().out.splitlines()[-1].split(" | ")
    assert line[1:3] == ["5", "1"], line


def test_a_benchmark_states_its_command_and_the_load_before_its_figures(monkeypatch, capsys):
    """budget_resolution's half-widths (and bench_zero_hooks', bench_analysis', bench_explain's,
    bench_report's and bench_nvml_overhead's timings) depend on the machine's noise; they printed
    neither the command nor the load, so a pasted figure could be neither judged nor rerun."""
    run = str(REPO / "tests/data/whatif_links_run")
    monkeypatch.setattr(sys, "argv", ["budget_resolution.py", run, "--target", "0.1"])
    runpy.run_module("benchmarks.budget_resolution", run_name="__main__")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"command: python -m benchmarks.budget_resolution {run} --target 0.1"
    assert out[1].startswith("load average (1, 5 min) at the start: ") and out[1].endswith(f"; {os.cpu_count()} CPUs")
    assert "half-width <= 10%" in out[2]


def test_the_ratio_coverage_benchmark_reproduces_the_figures_compare_states():
    """``verdict.BOOTSTRAP_RATIO_HELD`` is what benchmarks/ratio_coverage.py measured; its own draws
    (seeded, so the same on any machine) land near them, and 6 repeats a side near the label."""
    from benchmarks import ratio_coverage
    from tpbench import verdict

    for n, held in verdict.BOOTSTRAP_RATIO_HELD.items():
        assert abs(ratio_coverage.coverage(n, 400, 0.1, 3) - held) < 0.04, n
    assert ratio_coverage.coverage(6, 400, 0.1, 3) >= 0.93
