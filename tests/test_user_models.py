"""Your own model by import path: the worked example swept end to end, the bad-input catalogue
(tests/data/bad_user_models), and a model too big for memory failing only its case."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO, tpbench

from tpbench import store
from tpbench.suite import Machine, SuiteError, expand, load

pytestmark = pytest.mark.ranks  # starts rank processes: not in `make test-fast`

BAD = REPO / "tests" / "data" / "bad_user_models"
CPU = Machine(gpus=0)


@pytest.mark.parametrize("path", sorted(BAD.glob("*.toml")), ids=lambda p: p.stem)
def test_bad_user_model_refused_before_anything_runs(path: Path, monkeypatch) -> None:
    monkeypatch.chdir(BAD)  # factories are imported from where tpbench runs, as the ranks import them
    monkeypatch.syspath_prepend(str(BAD))
    expected = path.read_text().splitlines()[0].removeprefix("# expect: ")
    with pytest.raises(SuiteError) as e:
        expand(load(path), CPU)
    assert str(e.value).startswith(f"{path}: ") and expected in str(e.value)


def test_cli_refuses_a_raising_factory_with_exit_2_and_one_line(tmp_path: Path) -> None:
    suite = BAD / "05-factory-raises.toml"
    proc = tpbench("sweep", str(suite), "--out", str(tmp_path / "results"), "--no-report", cwd=BAD)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(suite) in lines[0] and "workload" in lines[0] and "RuntimeError" in lines[0]
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_worked_example_sweeps_end_to_end(tmp_path: Path) -> None:
    """examples/own_model through a real 2-rank sweep, from the repository root as docs/models.md says."""
    proc = tpbench(
        "sweep",
        "examples/own_model/suite.toml",
        "--set",
        "steps=2",
        "--set",
        "repeats=1",
        "--set",
        "capture.profiler_steps=0",
        "--out",
        str(tmp_path / "results"),
        "--report",
        str(tmp_path / "report.html"),
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = store.load(next(store.iter_runs(tmp_path / "results")))
    assert set(run.cases["status"]) == {"done"} and len(run.cases) == 8
    assert run.steps["loss"].notna().all()
    memory = store.read_case_tables(run, "memory")
    assert len(memory) == 2 * len(run.cases)
    assert "What ZeRO saves" in (tmp_path / "report.html").read_text()


@pytest.mark.slow
def test_model_too_big_for_memory_fails_its_case_not_the_sweep(tmp_path: Path) -> None:
    suite = tmp_path / "huge.toml"
    suite.write_text(
        '[defaults]\nworld_size = 2\nbackend = "gloo"\ndevice = "cpu"\nbatch_size = 4\nwarmup_steps = 1\n'
        'steps = 2\nrepeats = 1\ntimeout_s = 60\n[sweep]\nworkload = ["user_models:huge", "user_models:good"]\n'
        "[capture]\nprofiler_steps = 0\n"
    )
    proc = tpbench("sweep", str(suite), "--out", str(tmp_path / "results"), "--no-report", cwd=BAD)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run = store.load(next(store.iter_runs(tmp_path / "results")))
    status = dict(zip(run.cases["workload"], run.cases["status"]))
    assert status == {"user_models:huge": "failed", "user_models:good": "done"}
    error = run.record.cases[run.cases.set_index("workload").loc["user_models:huge", "case_id"]].error
    assert "alloc" in error.lower(), error
