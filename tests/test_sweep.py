"""End-to-end sweeps with real 2-rank Gloo worlds, through the ``tpbench`` command."""

from __future__ import annotations

import contextlib
import json
import math
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
from conftest import REPO, only_run, run_cli, tiny_suite, tpbench, worker_processes

from tpbench import store

pytestmark = pytest.mark.ranks  # starts rank processes: not in `make test-fast`


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("smoke")
    # Relative --out, as `make sweep` uses: rank processes must still find the run's files.
    proc = tpbench(
        "sweep", str(REPO / "suites" / "smoke.toml"), "--out", "results", "--reports-dir", "reports", cwd=tmp
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp, only_run(tmp / "results"), proc


def test_smoke_sweep_writes_every_rank_step_and_repeat(smoke):
    tmp, run_dir, proc = smoke
    loaded = store.load(run_dir)
    assert loaded.record.status == "complete"
    assert set(loaded.cases["status"]) == {"done"}
    for case in loaded.cases.to_dict("records"):
        steps = loaded.steps[loaded.steps.case_id == case["case_id"]]
        expected = {
            (rep, rank, step)
            for rep in range(case["repeats"])
            for rank in range(case["world_size"])
            for step in range(case["warmup_steps"] + case["steps"])
        }
        assert set(zip(steps.repeat, steps["rank"], steps.step)) == expected
        assert len(steps) == len(expected)
        assert (steps.step_ms > 0).all() and steps.step_ms.map(math.isfinite).all()
        assert (steps.phase == "timed").sum() == case["repeats"] * case["world_size"] * case["steps"]
        assert len(store.traces(run_dir, case["case_id"])) == case["world_size"]


def test_smoke_summary_report_and_efficiency(smoke):
    tmp, run_dir, proc = smoke
    summary = pd.read_parquet(run_dir / "summary.parquet")
    assert len(summary) == 2
    assert (summary.median_ms > 0).all()
    assert (summary.ci_lo_ms <= summary.median_ms).all() and (summary.median_ms <= summary.ci_hi_ms * 1.0000001).all()
    assert summary.repeat_medians_ms.map(len).eq(2).all()
    eff = json.loads((run_dir / "run.json").read_text())["efficiency"]
    # Both cases share one world: two rank processes for the whole sweep.
    assert eff["worlds_started"] == 1 and eff["processes_started"] == 2
    reports = list((tmp / "reports").glob("smoke-*.html"))
    assert len(reports) == 1
    html = reports[0].read_text()
    assert "zero_no_overlap" in html and html.count("<script") >= 2 and "<script src=" not in html
    assert "smoke" in proc.stdout and "ms/step" in proc.stdout
    # Under the table, the report's first verdict: the terminal and the report name the same fastest case.
    (fastest,) = [line for line in proc.stdout.splitlines() if line.startswith("Fastest: ")]
    assert fastest.split(" at ")[0] in html and "against the runner-up" in fastest, fastest


def test_crash_and_hang_fail_only_their_case_and_leave_no_process(tmp_path):
    suite = tmp_path / "faults.toml"
    suite.write_text(tiny_suite('fault = ["none", "crash:1", "hang:1"]', timeout_s=6))
    proc = tpbench("sweep", str(suite), "--out", str(tmp_path / "results"), "--no-report", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run_dir = only_run(tmp_path / "results")
    meta = json.loads((run_dir / "run.json").read_text())
    by_fault = {c["params"]["fault"]: c for c in meta["cases"].values()}
    assert by_fault["none"]["status"] == "done"
    assert by_fault["crash:1"]["status"] == "failed"
    assert by_fault["crash:1"]["error"] == "rank 1 was killed by SIGKILL"
    assert by_fault["hang:1"]["status"] == "failed"
    assert by_fault["hang:1"]["error"].startswith("timed out after 6 s")
    # ... naming the cure for a case that is only slow here, beside the hang it may be
    assert "(a rank hung; or it runs slower than that here: raise the suite's timeout_s)" in by_fault["hang:1"]["error"]
    # The sweep went on in a fresh world after each failure.
    assert len(meta["worlds"]) >= 2
    assert worker_processes(run_dir) == []
    assert store.load(run_dir).steps.case_id.nunique() == 1


def test_a_rank_that_dies_as_its_trace_starts_gets_a_fresh_world_and_its_case_finishes(tmp_path):
    """torch.profiler's native side can abort a rank as a trace starts, rarely and not on demand
    (seen here: "malloc(): unsorted double linked list corrupted" in Kineto's start). The fault
    ``abort-trace:1`` has rank 1 abort there, in the case's first world only: a real SIGABRT of a
    real rank. The traced repeat runs again in a fresh world; nothing is lost or run twice."""
    suite = tmp_path / "abort.toml"
    suite.write_text(tiny_suite('fault = ["abort-trace:1"]', repeats=2, profiler_steps=2))
    proc = tpbench("sweep", str(suite), "--out", str(tmp_path / "results"), "--no-report", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = only_run(tmp_path / "results")
    assert "trace failed:" in proc.stderr and "SIGABRT" in proc.stderr, proc.stderr
    meta = json.loads((run_dir / "run.json").read_text())
    ((cid, case),) = meta["cases"].items()
    assert case["status"] == "done" and len(meta["worlds"]) == 2
    # The second world ran only the traced repeat: the first had written repeat 0.
    assert [w["schedule"] for w in meta["worlds"]] == [
        [[cid, 0], [cid, 1]],
        [[cid, 1]],
    ]
    steps = store.load(run_dir).steps
    assert sorted(steps.groupby(["repeat", "rank"]).size().unique()) == [2 + 4]  # warm-up and timed steps, once
    assert sorted(steps.groupby("repeat")["rank"].nunique().items()) == [(0, 2), (1, 2)]
    traces = store.trace_dir(run_dir, cid)
    assert sorted(p.name for p in traces.iterdir()) == ["rank0.json.gz", "rank1.json.gz"]
    assert worker_processes(run_dir) == []


def test_interrupt_then_resume_runs_only_what_is_missing(tmp_path):
    suite = tmp_path / "long.toml"
    defaults = tiny_suite('steps = [4, 250]\nalgorithm = ["ddp", "zero_no_overlap"]').replace("steps = 4\n", "")
    suite.write_text(defaults)
    out = tmp_path / "results"
    # A job started in the background by a shell (as CI may run us) inherits SIGINT ignored;
    # give the sweep the disposition an interactive user's Ctrl-C would meet.
    p = subprocess.Popen(
        [sys.executable, "-m", "tpbench", "sweep", str(suite), "--out", str(out), "--no-report"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    run_dir = None
    while time.monotonic() < deadline:
        runs = list(store.iter_runs(out)) if out.exists() else []
        if runs:
            run_dir = runs[0]
            meta = json.loads((run_dir / "run.json").read_text())
            status = {(c["params"]["algorithm"], c["params"]["steps"]): c["status"] for c in meta["cases"].values()}
            # Whatever order the round runs its cases in: both short ones done, a long one running.
            short = [v for (_, steps), v in status.items() if steps == 4]
            if short == ["done", "done"] and "running" in status.values():
                break
        time.sleep(0.05)
    else:
        p.kill()
        pytest.fail("the sweep never reached its long case")
    # At once: its 250 steps take about 0.3 s on a quiet machine (a 0.5 s wait here let it finish and
    # the interrupt land on the other long case, which left three cases done).
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "--resume" in err and "the finished repeats of the cases in flight, are kept" in err, err
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "interrupted"
    statuses = sorted(c["status"] for c in meta["cases"].values())
    assert statuses == ["done", "done", "pending", "pending"]
    assert worker_processes(run_dir) == []
    assert not list((run_dir / "plans").glob("*.rdzv"))  # the world's FileStore file, removed on Ctrl-C too
    done_files = {
        cid: (run_dir / "cases" / cid / "steps.parquet").stat().st_mtime_ns
        for cid, c in meta["cases"].items()
        if c["status"] == "done"
    }

    proc = tpbench("sweep", "--resume", str(run_dir), "--no-report", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "complete"
    assert {c["status"] for c in meta["cases"].values()} == {"done"}
    for cid, mtime in done_files.items():
        assert (run_dir / "cases" / cid / "steps.parquet").stat().st_mtime_ns == mtime
    last_plan = json.loads((run_dir / "plans" / f"{meta['worlds'][-1]['world']}.json").read_text())
    assert sorted(c["steps"] for c in last_plan["cases"]) == [250, 250]
    assert len(store.load(run_dir).steps) > 0


def test_unwritable_results_root_fails_before_running(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = tpbench(
        "sweep", str(REPO / "suites" / "smoke.toml"), "--out", str(blocker / "results"), "--no-report", cwd=tmp_path
    )
    assert proc.returncode == 3
    assert f"{blocker} is a file, not a directory" in " ".join(proc.stderr.split())


def test_a_world_that_cannot_start_is_retried_once_then_fails_its_cases_with_the_cause(tmp_path):
    # A profile pointing Gloo at an interface that does not exist: every world dies starting up.
    suite = tmp_path / "broken.toml"
    suite.write_text(
        tiny_suite('algorithm = ["ddp", "zero_no_overlap"]', interconnect='"broken"')
        + '[interconnects.broken]\nbackend = "gloo"\nenv = { GLOO_SOCKET_IFNAME = "nonexistent0" }\n'
    )
    proc = tpbench("sweep", str(suite), "--out", str(tmp_path / "results"), "--no-report", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run_dir = only_run(tmp_path / "results")
    meta = json.loads((run_dir / "run.json").read_text())
    assert len(meta["worlds"]) == 2
    assert {c["status"] for c in meta["cases"].values()} == {"failed"}
    assert all(c["error"].startswith("rank") for c in meta["cases"].values()), meta["cases"]
    assert any("nonexistent0" in (c.get("detail") or "") for c in meta["cases"].values())
    assert worker_processes(run_dir) == []


def _progress_of(tmp_path, suite_text: str):
    """Sweep ``suite_text`` with the command's progress (``SweepProgress``) listening: its one task."""
    from tpbench import sweep
    from tpbench.cli.sweep import SweepProgress

    suite = tmp_path / "fail.toml"
    suite.write_text(suite_text)
    shown = []

    @contextlib.contextmanager
    def progress(phase: sweep.Phase):
        listener = SweepProgress(phase.cases, phase.items)
        shown.append(listener)
        yield listener

    outcome = sweep.run(suite, out=tmp_path / "results", progress=progress)
    assert len(outcome.failed) == 1
    (listener,) = shown
    (task,) = listener.progress.tasks
    return task


def test_the_progress_bar_ends_full_when_a_case_fails(tmp_path):
    """The command's progress over a real sweep whose second case's rank is killed in its first
    repeat: that case runs nothing after, so its unrun repeats leave the total and the bar ends at
    its total, not short of it with an ETA that never comes."""
    task = _progress_of(tmp_path, tiny_suite('fault = ["none", "crash:1"]', repeats=3, warmup_steps=3))
    assert (task.completed, task.total) == (3, 3)


def test_the_progress_of_a_sweep_whose_every_case_fails_counts_the_planned_repeats_and_names_the_failure(
    tmp_path,
):
    """Its only case's rank is killed in its first repeat: the bar's total drops to what will run
    (nothing), while the count keeps the planned repeats and says they were dropped ("0/0" said
    nothing), and the line names the case as failed rather than as if its repeat still ran."""
    task = _progress_of(tmp_path, tiny_suite('algorithm = ["ddp"]', fault='"crash:1"', repeats=2, warmup_steps=3))
    assert (task.completed, task.total) == (0, 0)
    assert task.fields["tally"] == "0/2, 2 dropped"
    assert task.fields["current"] == "ddp failed; cases 0/1 done, 1 failed"


def test_a_sweep_whose_stderr_is_no_terminal_says_its_progress_on_plain_lines(tmp_path, capsys):
    """Away from a terminal (stderr a file or a pipe, as in CI, under nohup or Slurm; capsys's is
    one) rich draws its progress line once, as it stops, cut to the width: a log polled while the
    sweep ran held only the run directory. Each world's start and end is now a line of its own,
    uncut, the time beside it, and no bar is drawn (the finished repeats between, paced, are
    tests/test_progress.py's)."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite('algorithm = ["ddp", "zero_no_overlap"]', repeats=2))
    assert run_cli(["sweep", str(suite), "--out", str(tmp_path / "r"), "--no-report"]) == 0
    said = capsys.readouterr().err.splitlines()
    assert said[1].startswith("starting 2 ranks on loopback… (0:00:0"), said
    end = said[-1]
    assert end.split(" (")[0] == "repeats 4/4: world of 2 ranks on loopback finished; cases 2/2 done", said
    assert " elapsed" in end and not any("━" in line for line in said)


def test_a_sweep_with_a_failed_case_says_where_its_traceback_is_and_how_to_run_it_again(tmp_path, capsys, monkeypatch):
    """A case whose ranks raise in its hook: the line printed as it failed holds the cause's first
    line only; the sweep's end names where the whole cause and the ranks' logs are (without a
    report, run.json alone) and the resume that runs the case again, and that detail is there."""
    monkeypatch.chdir(tmp_path)  # the hook is imported from where tpbench runs, as the ranks import it
    (tmp_path / "raising_hook_of_test_sweep.py").write_text(
        "def hook(state, bucket):\n    raise RuntimeError('boom in the hook')\n"
    )
    suite = tmp_path / "raise.toml"
    suite.write_text(tiny_suite('algorithm = ["ddp"]', comm_hook='"raising_hook_of_test_sweep:hook"', repeats=1))
    assert run_cli(["sweep", str(suite), "--out", str(tmp_path / "results"), "--no-report"]) == 1
    run_dir = only_run(tmp_path / "results")
    said = " ".join(capsys.readouterr().err.split())
    assert "raised RuntimeError: boom in the hook" in said
    assert (
        "1 case failed: the cause in full (a raising rank's traceback, or each rank's stacks when a repeat timed out) "
        "and the ranks' last log lines are in "
        f"{run_dir / 'run.json'} (each case's detail); after a fix, tpbench sweep --resume {run_dir} runs it again"
    ) in said
    (entry,) = json.loads((run_dir / "run.json").read_text())["cases"].values()
    assert "Traceback" in entry["detail"] and "boom in the hook" in entry["detail"]


def test_the_library_sweep_tells_its_progress_each_phase_and_returns_the_finished_run(tmp_path):
    """``sweep.run``, as the command calls it: the progress it is given sees the phase (its cases and
    items) before any world starts and gets the launcher's events; the outcome holds the finished
    run, summarized and complete, owned by this process."""
    import contextlib

    from tpbench import sweep

    suite = tmp_path / "lib.toml"
    suite.write_text(tiny_suite('algorithm = ["ddp", "zero_no_overlap"]', repeats=2))
    phases, events = [], []

    def progress(phase: sweep.Phase):
        phases.append((len(phase.cases), sum(phase.items.values()), phase.batch, phase.run.record.status))
        return contextlib.nullcontext(lambda kind, data: events.append(kind))

    outcome = sweep.run(suite, out=tmp_path / "results", progress=progress)
    assert phases == [(2, 4, None, "running")]
    assert events.count("repeat_end") == 4 and events.count("case_end") == 2
    assert outcome.loaded is not None and outcome.loaded.record.status == "complete"
    assert set(outcome.loaded.table["status"]) == {"done"} and outcome.failed == []
    assert (outcome.run.dir / store.SUMMARY_FILE).exists() and outcome.run.lock is not None
    # Resumed with nothing left, it says so and runs nothing.
    outcome.run.lock.release()
    again = sweep.run(resume=outcome.run.dir, launcher=sweep.RECORDED, progress=progress)
    assert again.nothing_left and again.loaded is None and len(phases) == 1
