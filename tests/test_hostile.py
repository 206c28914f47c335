"""Hostile and careless use: odd paths, concurrent use, signals, wrong-shaped result files.

Each scenario names the exit code and the message a user meets (the suites that must be refused
outright are in ``tests/data/bad_suites/``). Sweeps are real 2-rank Gloo worlds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import run_cli
from test_reliability import tiny_suite_file as tiny_suite

from tpbench import store

pytestmark = pytest.mark.ranks  # starts rank processes: not in `make test-fast`

SWEEP = [sys.executable, "-m", "tpbench", "sweep"]


def sweep(*args: str, cwd: Path, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*SWEEP, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, **kw)


def tree(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*")}


# --- 1. rendezvous does not depend on the characters of a path ---------------------------------


@pytest.mark.parametrize(
    "out_name,suite_name",
    [
        ("res#ults?x=1", "plain"),
        pytest.param("plain", "su#ite?a=b", marks=pytest.mark.slow),
        pytest.param("new\nline %20 ü", "plain", marks=pytest.mark.slow),
    ],
)
def test_url_characters_in_paths_rendezvous_inside_the_run_and_leave_nothing_behind(tmp_path, out_name, suite_name):
    """'#', '?', a newline, '%20' in --out or in the suite name: two sweeps into the same root both
    finish (exit 0), and nothing is left outside the run directories (no stray rendezvous file)."""
    suite = tiny_suite(tmp_path, 'algorithm = ["ddp"]', name=suite_name)
    out = tmp_path / out_name
    before = tree(tmp_path)
    for _ in range(2):
        proc = sweep(str(suite), "--out", str(out), "--no-report", cwd=tmp_path, timeout=200)
        assert proc.returncode == 0, proc.stderr
    runs = list(store.iter_runs(out))
    assert len(runs) == 2
    assert {store.load(r).record.status for r in runs} == {"complete"}
    outside = {p for p in tree(tmp_path) - before if not any((tmp_path / p).is_relative_to(r) for r in runs)}
    assert outside == {Path(out_name), Path(out_name) / suite_name}, outside
    assert not [p for r in runs for p in r.rglob("*.rdzv")]


# --- 3. --resume: its own suite, nothing run by a dry run, one owner at a time -------------------


@pytest.fixture(scope="module")
def done_run(finished_tiny_run) -> Path:
    """tiny_suite's two cases, ddp and zero_no_overlap, swept (conftest's, test_reliability.py's too)."""
    return finished_tiny_run


def copy_run(run_dir: Path, tmp_path: Path, missing: int = 0) -> Path:
    """A copy of a finished run; ``missing``: that many cases put back to pending, as an
    interrupted sweep leaves them (their steps gone, no summary)."""
    import shutil

    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy)
    if missing:
        meta = json.loads((copy / "run.json").read_text())
        for cid in list(meta["cases"])[:missing]:
            meta["cases"][cid]["status"] = "pending"
            shutil.rmtree(copy / "cases" / cid)
        meta["status"] = "interrupted"
        (copy / "summary.parquet").unlink()
        (copy / "run.json").write_text(json.dumps(meta))
    return copy


def test_resume_of_a_complete_run_leaves_it_complete_and_untouched(done_run, tmp_path, capsys):
    run = copy_run(done_run, tmp_path)
    before = (run / "run.json").read_bytes()
    assert run_cli(["sweep", "--resume", str(run), "--no-report"]) == 0
    assert "Nothing to resume" in capsys.readouterr().err
    assert (run / "run.json").read_bytes() == before


def test_resume_dry_run_lists_the_missing_cases_and_runs_nothing(done_run, tmp_path, capsys):
    run = copy_run(done_run, tmp_path, missing=1)
    before = tree(run), (run / "run.json").read_bytes()
    pending = [cid for cid, c in json.loads(before[1])["cases"].items() if c["status"] == "pending"]
    assert run_cli(["sweep", "--resume", str(run), "--dry-run"]) == 0
    assert pending[0] in capsys.readouterr().out
    assert (tree(run), (run / "run.json").read_bytes()) == before
    # A repeat already on disk is not run again, and the table says how many are left (it showed the whole plan).
    parts = run / "cases" / pending[0] / "parts"
    parts.mkdir(parents=True)
    pd.DataFrame({"repeat": [0]}).to_parquet(parts / "r0000.parquet")  # readable: an empty file reruns
    repeats = json.loads(before[1])["cases"][pending[0]]["params"]["repeats"]
    assert run_cli(["sweep", "--resume", str(run), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "repeats left of all × steps" in printed and f"{repeats - 1} of {repeats}×" in printed


def test_resume_dry_run_refuses_a_run_whose_done_case_lost_its_steps(done_run, tmp_path, capsys):
    """`--resume` refuses a run whose done case's steps.parquet is gone (exit 3 naming it); its dry
    run listed "0 cases to resume" and exited 0, telling the user the run was whole."""
    run = copy_run(done_run, tmp_path)
    steps = next((run / "cases").glob("*/steps.parquet"))
    steps.unlink()
    before = tree(run), (run / "run.json").read_bytes()
    assert run_cli(["sweep", "--resume", str(run), "--dry-run"]) == 3
    assert f"{steps}: missing, but run.json says case" in capsys.readouterr().err
    assert (tree(run), (run / "run.json").read_bytes()) == before


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--set", "steps=9"], "--set with --resume: a resumed run runs its own suite"),
        (["--filter", "algorithm=ddp"], "--filter with --resume"),
        (
            ["--out", "elsewhere"],
            "--out with --resume: a resumed run runs its own suite's missing cases unchanged, in its own",
        ),
        (["OTHER"], "with --resume: not the suite"),
    ],
)
def test_resume_refuses_what_would_change_its_cases(done_run, tmp_path, capsys, extra, message):
    """Exit 2, one line, and the run is not touched."""
    run = copy_run(done_run, tmp_path, missing=1)
    other = tiny_suite(tmp_path, 'algorithm = ["ddp"]', name="other")
    before = (run / "run.json").read_bytes()
    args = [str(other) if a == "OTHER" else a for a in extra]
    assert run_cli(["sweep", *args, "--resume", str(run), "--no-report"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert (run / "run.json").read_bytes() == before


def test_resume_accepts_the_suite_the_run_was_started_from(done_run, tmp_path, capsys):
    run = copy_run(done_run, tmp_path, missing=1)
    same = tmp_path / "same.toml"
    same.write_text(json.loads((run / "run.json").read_text())["suite"]["text"])
    assert run_cli(["sweep", str(same), "--resume", str(run), "--dry-run"]) == 0


def test_resume_accepts_the_suite_file_of_a_run_started_with_set(done_run, tmp_path, capsys):
    """A run started with ``--set`` records the file's text and a note per assignment; given that
    file again with ``--resume`` (the first command, its ``--set`` dropped as the resume asks) it was
    refused as "not the suite the run was started from"."""
    from tpbench import suite

    run = copy_run(done_run, tmp_path, missing=1)
    meta = json.loads((run / "run.json").read_text())
    same = tmp_path / "same.toml"
    same.write_text(meta["suite"]["text"])
    assignments = ["timeout_s=60"]  # the suite's own value: the cases stay the run's
    meta["suite"]["text"] = suite.with_overrides(suite.load(same), assignments).text
    meta["suite"]["set"] = assignments
    (run / "run.json").write_text(json.dumps(meta))
    assert run_cli(["sweep", str(same), "--resume", str(run), "--dry-run"]) == 0, capsys.readouterr().err
    same.write_text(meta["suite"]["text"].replace("timeout_s = 60", "timeout_s = 61", 1))
    assert run_cli(["sweep", str(same), "--resume", str(run), "--dry-run"]) == 2
    assert "not the suite" in capsys.readouterr().err


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_run_being_swept_belongs_to_its_sweep_and_a_stop_signal_interrupts_it_like_ctrl_c(tmp_path, capsys, stop):
    """While a sweep runs, ``--resume`` of its run is refused naming the owner (exit 3, nothing
    touched); SIGTERM (or SIGHUP) then ends the sweep as Ctrl-C does (exit 128 + signal, run
    interrupted, the case in flight back to pending, no rank left), and the run can be owned again."""
    from test_sweep import worker_processes

    suite = tiny_suite(tmp_path, "steps = [4, 4000]")
    out = tmp_path / "results"
    p = subprocess.Popen(
        [*SWEEP, str(suite), "--out", str(out), "--no-report"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline, run_dir = time.monotonic() + 120, None
    while time.monotonic() < deadline and run_dir is None:
        for r in store.iter_runs(out) if out.exists() else []:
            meta = json.loads((r / "run.json").read_text())
            if any(c["status"] == "running" and c["params"]["steps"] == 4000 for c in meta["cases"].values()):
                run_dir = r
        time.sleep(0.05)
    assert run_dir is not None, "never saw the long case running"
    try:
        assert run_cli(["sweep", "--resume", str(run_dir), "--no-report"]) == 3
        err = capsys.readouterr().err
        assert f"in use by pid {p.pid} on host" in err and str(run_dir) in err, err
        assert json.loads((run_dir / "run.json").read_text())["status"] == "running"
    finally:
        p.send_signal(stop)
        _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + stop, err
    assert f"Terminated ({stop.name})" in err and "--resume" in err
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "interrupted"
    assert sorted(c["status"] for c in meta["cases"].values()) == ["done", "pending"]
    assert worker_processes(run_dir) == []
    # The space a run holds back while it is swept is given back: it stayed in every interrupted run.
    assert not (run_dir / store.RESERVE_FILE).exists()
    store.RunLock(run_dir)  # free again


def test_ctrl_c_during_the_end_of_sweep_analysis_leaves_a_run_resume_completes(done_run, tmp_path, monkeypatch, capsys):
    """A run is ``complete`` only with its summary: interrupted while analysing, it is marked
    interrupted, and ``--resume`` (nothing left to run) writes the summary and completes it.
    The interrupt is a real SIGINT, sent when the trace analysis starts."""
    from tpbench import sweep as sweep_mod

    run = copy_run(done_run, tmp_path)
    (run / "summary.parquet").unlink()
    analyse = sweep_mod.analyze_traces

    def interrupted(*a):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the signal arrives before this ends
        return analyse(*a)

    monkeypatch.setattr(sweep_mod, "analyze_traces", interrupted)
    # A test run started in the background by a shell without job control inherits SIGINT ignored;
    # give this process the handler an interactive Ctrl-C would meet.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            sweep_mod.finalize(store.Run.open(run))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert json.loads((run / "run.json").read_text())["status"] == "interrupted"
    assert not (run / "summary.parquet").exists()
    monkeypatch.undo()
    assert run_cli(["sweep", "--resume", str(run), "--no-report"]) == 0
    assert json.loads((run / "run.json").read_text())["status"] == "complete"
    assert (run / "summary.parquet").exists()


def test_ctrl_c_after_the_run_completed_exits_with_the_runs_code_and_says_it_is_saved(tmp_path, monkeypatch, capsys):
    """Ctrl-C after the closing line, while the report is written, exited 130 saying "Interrupted."
    of a run complete and saved, with nothing to resume. Now the run's own exit code, and a line
    that says the run is complete and how to write the report that was not (a stop signal, a
    ``KeyboardInterrupt`` too, is handled alike). The signal is real, sent from inside the report's
    writing, so it lands there every time."""
    from tpbench import report

    suite = tiny_suite(tmp_path, 'algorithm = ["ddp"]')

    def stopped(*a, **k):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the signal arrives before this ends
        raise AssertionError("the signal did not arrive")

    monkeypatch.setattr(report, "write_report", stopped)
    # As in the test above: a test run in the background may inherit SIGINT ignored.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code = run_cli(["sweep", str(suite), "--out", str(tmp_path / "results")])
    finally:
        signal.signal(signal.SIGINT, previous)
    captured = capsys.readouterr()
    (run,) = store.iter_runs(tmp_path / "results")
    assert code == 0, captured.err
    err = " ".join(captured.err.split())
    assert "Wall " in captured.out and "Report:" not in err
    assert f"Interrupted. The run had finished: {run} is complete and saved; its report was not written: " in err
    assert f"tpbench report {run}" in err and "--resume" not in err
    assert json.loads((run / "run.json").read_text())["status"] == "complete"


def test_a_write_that_fails_in_the_end_of_sweep_analysis_leaves_the_run_interrupted(done_run, tmp_path, monkeypatch):
    """A derived table that cannot be written (a full disk, a path too long: a reviewer's 4,000-character
    results path) used to leave run.json "running" after exit 3; it is marked interrupted, as a failed
    write during the worlds is, and ``--resume`` finishes the analysis."""
    from tpbench import sweep as sweep_mod

    run = copy_run(done_run, tmp_path)
    (run / "summary.parquet").unlink()

    def unwritable(path, *a, **k):
        raise store.StoreError(f"{path}: cannot write: File name too long")

    monkeypatch.setattr(store, "write_summary", unwritable)
    with pytest.raises(store.StoreError, match="File name too long"):
        sweep_mod.finalize(store.Run.open(run))
    assert json.loads((run / "run.json").read_text())["status"] == "interrupted"
    monkeypatch.undo()
    assert run_cli(["sweep", "--resume", str(run), "--no-report"]) == 0
    assert json.loads((run / "run.json").read_text())["status"] == "complete"


# --- 2. result files of the wrong shape: exit 3 naming the file ---------------------------------


def _run_json(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _each_case(m: dict, change) -> str:
    """run.json text with ``change(entry)`` as every case's entry."""
    return json.dumps(m | {"cases": {k: change(v) for k, v in m["cases"].items()}})


# Each damage rewrites run.json (a dict → JSON text) or a case's steps.parquet (a DataFrame).
RUN_JSON_DAMAGE = {
    "null": lambda m: "null",
    "a-list": lambda m: "[1, 2]",
    "empty-object": lambda m: "{}",
    "empty-file": lambda m: "",
    "deeply-nested": lambda m: json.dumps(m | {"environment": "X"}).replace('"X"', _nested(100_000)),
    "cases-null": lambda m: json.dumps(m | {"cases": None}),
    "cases-empty": lambda m: json.dumps(m | {"cases": {}}),
    "cases-a-list": lambda m: json.dumps(m | {"cases": list(m["cases"].values())}),
    "case-entry-a-string": lambda m: _each_case(m, lambda v: "done"),
    "case-without-params": lambda m: _each_case(m, lambda v: {"status": "done"}),
    "case-without-status": lambda m: _each_case(m, lambda v: {"params": v["params"]}),
    "case-unknown-status": lambda m: _each_case(m, lambda v: v | {"status": "great"}),
    "params-a-list": lambda m: _each_case(m, lambda v: v | {"params": [1]}),
    "params-missing-keys": lambda m: _each_case(m, lambda v: v | {"params": {"algorithm": "ddp"}}),
    "params-wrong-type": lambda m: _each_case(m, lambda v: v | {"params": v["params"] | {"steps": "many"}}),
    "params-null-algorithm": lambda m: _each_case(m, lambda v: v | {"params": v["params"] | {"algorithm": None}}),
    "run-id-a-number": lambda m: json.dumps(m | {"run_id": 7}),
    "suite-a-string": lambda m: json.dumps(m | {"suite": "zero"}),
    "suite-text-null": lambda m: json.dumps(m | {"suite": m["suite"] | {"text": None}}),
    "environment-a-list": lambda m: json.dumps(m | {"environment": [1]}),
    "worlds-a-string": lambda m: json.dumps(m | {"worlds": "w0"}),
}
STEPS_DAMAGE = {
    "no-step-ms": lambda df: df.drop(columns=["step_ms"]),
    "step-ms-text": lambda df: df.assign(step_ms="fast"),
    "no-rows": lambda df: df.iloc[:0],
    "foreign-table": lambda df: df[["loss"]].rename(columns={"loss": "x"}),
    "no-phase": lambda df: df.drop(columns=["phase"]),
}


def _commands(run: Path, tmp_path: Path) -> dict[str, list[str]]:
    return {
        "report": ["report", str(run), "-o", str(tmp_path / "r.html")],
        "compare": ["compare", str(run), str(run)],
        "export": ["export", str(run), "--format", "pytest-benchmark", "-o", str(tmp_path / "b.json")],
    }


@pytest.mark.parametrize("command", ["report", "compare", "export"])
@pytest.mark.parametrize("damage", list(RUN_JSON_DAMAGE), ids=list(RUN_JSON_DAMAGE))
def test_wrong_shaped_run_json_exits_3_naming_the_file(done_run, tmp_path, capsys, damage, command):
    run = copy_run(done_run, tmp_path)
    (run / "run.json").write_text(RUN_JSON_DAMAGE[damage](_run_json(run)))
    assert run_cli(_commands(run, tmp_path)[command]) == 3
    err = capsys.readouterr().err
    assert str(run / "run.json") in err and "Traceback" not in err, err
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("command", ["report", "compare", "export"])
@pytest.mark.parametrize("damage", list(STEPS_DAMAGE), ids=list(STEPS_DAMAGE))
def test_wrong_shaped_steps_parquet_exits_3_naming_the_file(done_run, tmp_path, capsys, damage, command):
    import pandas as pd

    run = copy_run(done_run, tmp_path)
    victim = next(run.glob("cases/*/steps.parquet"))
    STEPS_DAMAGE[damage](pd.read_parquet(victim)).to_parquet(victim)
    assert run_cli(_commands(run, tmp_path)[command]) == 3
    err = capsys.readouterr().err
    assert str(victim) in err and "Traceback" not in err, err


def test_a_complete_run_without_its_summary_is_refused_by_report_until_resumed(done_run, tmp_path, capsys):
    """A complete run's summary.parquet gone: the report used to drop its verdicts and step times
    without a word; it exits 3 naming the file, as for a done case's missing steps.parquet, and
    ``--resume`` writes the summary again."""
    run = copy_run(done_run, tmp_path)
    (run / "summary.parquet").unlink()
    assert run_cli(_commands(run, tmp_path)["report"]) == 3
    err = " ".join(capsys.readouterr().err.split())
    assert f"{run / 'summary.parquet'}: missing, but run.json says the run is complete" in err, err
    assert "Traceback" not in err and not (tmp_path / "r.html").exists()
    assert run_cli(["sweep", "--resume", str(run), "--no-report"]) == 0
    assert run_cli(_commands(run, tmp_path)["report"]) == 0


@pytest.mark.parametrize("foreign", ["table", "run"])
def test_a_summary_parquet_that_is_not_a_summary_is_refused_naming_it_until_resumed(
    done_run, tmp_path, capsys, foreign
):
    """A foreign table in summary.parquet's place (no ``case_id``), or another run's summary (its
    case ids not this run's): the report dropped its verdicts without a word and
    ``tpbench.load(run).table`` had no numbers; report, compare and export exit 3 naming the file,
    and ``--resume`` writes the summary again."""
    run = copy_run(done_run, tmp_path)
    if foreign == "table":
        pd.read_parquet(next(run.glob("cases/*/memory.parquet"))).to_parquet(run / "summary.parquet")
        said = "not a tpbench summary table (no 'case_id' column)"
    else:
        other = pd.read_parquet(run / "summary.parquet")
        other.assign(case_id=[f"0000000000{i:02d}" for i in range(len(other))]).to_parquet(run / "summary.parquet")
        said = f"{len(other)} of its cases are not this run's (e.g. 000000000000); another run's summary?"
    for command in _commands(run, tmp_path).values():
        assert run_cli(command) == 3
        err = " ".join(capsys.readouterr().err.split())
        assert f"{run / 'summary.parquet'}: {said}" in err, err
        assert "Traceback" not in err and not (tmp_path / "r.html").exists()
    assert run_cli(["sweep", "--resume", str(run), "--no-report"]) == 0
    assert store.load(run).table["median_ms"].notna().all()


# --- 6. a repeat longer than timeout_s fails as timed out ---------------------------------------


def test_a_repeat_that_ends_after_its_timeout_fails_as_timed_out(tmp_path):
    """The world's own report (events as a torchrun world writes them, read back as ``--resume``
    reads a printed world's): the repeat ended 0.5 s past ``timeout_s``, so the case fails as timed
    out instead of passing because its end arrived before the launcher's check."""
    from tpbench.launch import SLOWER, PrintedWorldRecord, Supervisor
    from tpbench.suite import Machine, expand, load

    case = expand(load(tiny_suite(tmp_path, 'algorithm = ["ddp"]', timeout_s=2)), Machine(gpus=0))[0]
    run = store.Run.create(tmp_path / "results", "tiny", "tiny.toml", "", [case.params()], {})
    events = run.dir / "events" / "w0"
    events.mkdir(parents=True)
    t = 1_000.0
    lines = [
        {"event": "world_ready", "t": t, "world": "w0", "nodes": []},
        {"event": "repeat_start", "t": t, "case": case.case_id, "repeat": 0},
        {"event": "repeat_end", "t": t + 2.5, "case": case.case_id, "repeat": 0, "median_ms": 1.0},
        {"event": "case_end", "t": t + 2.5, "case": case.case_id},
        {"event": "world_done", "t": t + 2.6, "world": "w0"},
    ]
    (events / "rank0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    outcome = Supervisor(PrintedWorldRecord(run.dir, "w0", 2), {case.case_id: case}, run, lambda k, e: None).supervise()
    assert outcome.failed_case == case.case_id
    assert outcome.cause == f"timed out after 2 s in repeat 0 (it took 2.5 s{SLOWER})"
    assert outcome.completed == set()
    assert run.record.cases[case.case_id].status == "running"  # not done; the launcher marks it failed


def test_a_round_stepped_in_turn_has_its_arms_timeouts_together(tmp_path):
    """A tune's round runs two arms' steps in turn: it may take both arms' ``timeout_s`` (2 + 2 s),
    so 3.5 s passes, and 4.5 s fails as timed out in that round, blamed on no single arm."""
    from tpbench.launch import SLOWER, PrintedWorldRecord, Supervisor
    from tpbench.suite import Machine, expand, load

    cases = expand(load(tiny_suite(tmp_path, 'algorithm = ["ddp", "zero_no_overlap"]', timeout_s=2)), Machine(0))
    a, b = (c.case_id for c in cases)
    outcomes = []
    for took in (3.5, 4.5):
        run = store.Run.create(tmp_path / f"r{took}", "tiny", "tiny.toml", "", [c.params() for c in cases], {})
        events = run.dir / "events" / "w0"
        events.mkdir(parents=True)
        t = 1_000.0
        lines = [
            {"event": "world_ready", "t": t, "world": "w0", "nodes": []},
            {"event": "round_start", "t": t, "items": [[a, 0], [b, 0]]},
            {"event": "repeat_end", "t": t + took, "case": a, "repeat": 0, "median_ms": 1.0},
            {"event": "repeat_end", "t": t + took, "case": b, "repeat": 0, "median_ms": 1.0},
            {"event": "world_done", "t": t + took, "world": "w0"},
        ]
        (events / "rank0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
        world = PrintedWorldRecord(run.dir, "w0", 2)
        outcomes.append(Supervisor(world, {c.case_id: c for c in cases}, run, lambda k, e: None).supervise())
    assert outcomes[0].cause is None and outcomes[0].completed == {(a, 0), (b, 0)}
    assert outcomes[1].cause == f"timed out after 4 s in round 0 (2 cases stepped in turn) (it took 4.5 s{SLOWER})"
    assert outcomes[1].failed_case is None and outcomes[1].completed == set()


# --- 5. equal values make one case --------------------------------------------------------------


def test_equal_numbers_make_one_case_with_the_id_existing_results_have():
    from tpbench.suite import Machine, expand, parse, select, with_overrides

    def ids(text: str, *sets: str) -> list[str]:
        return [c.case_id for c in expand(with_overrides(parse("[suite]\n" + text, "x.toml"), sets), Machine(gpus=0))]

    default = ids("")
    # The id of the default case since budget keys left the identity (stored runs keep their ids:
    # runs are matched by identity, see test_gate's repeats test).
    assert default == ["ea105e14acf2"]
    assert ids("", "bucket_cap_mb=25.0") == ids("[defaults]\nbucket_cap_mb = 25.0") == default
    assert ids("", "timeout_s=300.0") == default
    assert ids("[defaults]\nlr = 1") == ids("[defaults]\nlr = 1.0")
    assert ids("[defaults]\nworkload = 'markov'\n[workloads.markov]\nleak = 1") == ids(
        "[defaults]\nworkload = 'markov'\n[workloads.markov]\nleak = 1.0"
    )
    assert ids("[sweep]\nbucket_cap_mb = [25.0, 4]")[0] == default[0]
    cases = expand(parse("[sweep]\nbucket_cap_mb = [25, 4]", "x.toml"), Machine(gpus=0))
    assert [c.bucket_cap_mb for c in select(cases, ["bucket_cap_mb=25.0"])] == [25]


# --- 4. limits sized from the machine, with an explicit override --------------------------------


def test_machine_limits_follow_cores_and_memory_and_allow_large_lifts_them(capsys):
    from tpbench.suite import MAX_CASES, Machine

    machine = Machine.detect()
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    assert machine.max_ranks == max(2, min(4 * os.cpu_count(), memory_mb // 512))
    assert machine.max_cases == MAX_CASES
    huge = Path(__file__).parent / "data" / "bad_suites" / "54-world-beyond-the-machine.toml"
    assert run_cli(["validate", str(huge)]) == 2
    assert f"expected at most {machine.max_ranks} ranks on this machine" in capsys.readouterr().err
    assert run_cli(["validate", str(huge), "--allow-large"]) == 0
    assert "ok, 1 case (" in capsys.readouterr().out


# --- 9, 10. the terminal prints paths as they are; files respect the umask ----------------------


def test_markup_in_names_and_paths_is_printed_verbatim_and_files_follow_the_umask(tmp_path):
    """A suite named ``zero [v2]`` swept into ``b[/x]`` (rich markup if read as such): exit 0, the
    run directory and the report printed as they are; under umask 002 every result and report
    file is 0664, as a plain ``open`` would make it, so a team can share the results."""
    suite = tiny_suite(tmp_path, 'algorithm = ["ddp"]', name="zero [v2]")
    out, reports = tmp_path / "b[/x]", tmp_path / "reports [red]"
    proc = sweep(
        str(suite), "--out", str(out), "--reports-dir", str(reports), cwd=tmp_path, preexec_fn=lambda: os.umask(0o002)
    )
    assert proc.returncode == 0, proc.stderr
    run_dir = next(store.iter_runs(out))
    assert run_dir.parent.name == "zero [v2]"
    report = reports / f"zero [v2]-{run_dir.name}.html"
    assert f"Run directory: {run_dir}\n" in proc.stderr and f"Report: {report}\n" in proc.stderr, proc.stderr
    assert "zero [v2]" in proc.stdout  # the summary table's title
    # The closing line's wall time includes the analysis after the worlds; the report gives the
    # worlds' own, and both name it alike (the report once called it "wall", 46.4 s against 50.8).
    worlds_s = json.loads((run_dir / "run.json").read_text())["efficiency"]["wall_s"]
    said = f"{worlds_s:.1f} s running worlds"
    assert f"({said}); timed steps " in " ".join((proc.stdout + proc.stderr).split()), proc.stdout + proc.stderr
    assert f"{said}, " in report.read_text() and " s wall, " not in report.read_text()
    written = [
        run_dir / "run.json",
        run_dir / "summary.parquet",
        report,
        *run_dir.glob("cases/*/*.parquet"),
        *run_dir.glob("plans/*.json"),
    ]
    assert {oct(p.stat().st_mode & 0o777) for p in written} == {"0o664"}, {
        str(p): oct(p.stat().st_mode) for p in written
    }
    assert not list(tmp_path.rglob("*.tmp"))


def test_emoji_codes_in_paths_and_names_are_printed_verbatim(tmp_path, capsys):
    """The terminal read ``:fire:`` in a path as an emoji code: a sweep into ``--out ':fire:'``
    printed its run directory, and its ``--resume`` line, as ``🔥/smoke/…``, a path that does not
    exist; a suite file's name and its description, likewise."""
    folder = tmp_path / ":fire:"
    folder.mkdir()
    suite = tiny_suite(folder, 'algorithm = ["ddp"]', name="s:smile:", description=":+1: by design")
    assert run_cli(["validate", str(suite)]) == 0
    assert f"{suite}: ok" in capsys.readouterr().out
    assert run_cli(["list", "--suites", str(folder)]) == 0
    listed = capsys.readouterr().out
    assert "s:smile:.toml" in listed and ":+1: by design" in listed, listed
    # --print makes the run directory and names it, and the resume that records it, running no rank.
    assert run_cli(["sweep", str(suite), "--out", str(folder), "--launcher", "torchrun", "--print"]) == 0
    (run_dir,) = store.iter_runs(folder)
    said = capsys.readouterr()
    assert f"Run directory: {run_dir}\n" in said.err and f"tpbench sweep --resume {run_dir}\n" in said.out, said


def test_list_tolerates_a_suites_folder_of_broken_files(tmp_path, capsys):
    """Exit 0, every file listed, each broken one with its problem in one line; descriptions are
    printed as written (no markup)."""
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "a-good.toml").write_text('[suite]\ndescription = "uses [red]no markup[/red]"\n')
    (suites / "b-syntax.toml").write_text("[suite\n")
    (suites / "c-binary.toml").write_bytes(b"\xff\xfe\x00garbage")
    (suites / "d-suite-not-a-table.toml").write_text("suite = 3\n")
    (suites / "e-description-a-number.toml").write_text("[suite]\ndescription = 5\n")
    (suites / "f-nested.toml").write_text("x = " + "[" * 50_000 + "]" * 50_000 + "\n")
    (suites / "g-a-folder.toml").mkdir()
    (suites / "h-[bold]name.toml").write_text("")
    assert run_cli(["list", "--suites", str(suites)]) == 0
    text = capsys.readouterr().out
    assert "uses [red]no markup[/red]" in text.replace("\n", "")
    for name in (
        "b-syntax",
        "c-binary",
        "d-suite-not-a-table",
        "e-description-a-number",
        "f-nested",
        "g-a-folder",
        "h-[bold]name",
    ):
        assert name in text, name
    assert text.count("(unreadable:") == 4, text  # syntax, binary, nested, folder


# --- 8. disk: the report's folder is checked before the sweep; errors name the user's file ------


@pytest.mark.parametrize(
    "where,message",
    [
        ("{tmp}/a-file/r.html", "{tmp}/a-file: the folder of --report {tmp}/a-file/r.html is a file, not a directory"),
        # /proc takes no new files, and the OS says "No such file or directory" of a folder that is there.
        ("/proc/r.html", "/proc: the folder of --report /proc/r.html takes no new files (a virtual filesystem"),
    ],
)
def test_an_unusable_report_path_is_refused_before_the_sweep(tmp_path, capsys, where, message):
    suite = tiny_suite(tmp_path, 'algorithm = ["ddp"]')
    (tmp_path / "a-file").write_text("")
    (tmp_path / "a-folder").mkdir()
    out = tmp_path / "results"
    assert run_cli(["sweep", str(suite), "--out", str(out), "--report", where.format(tmp=tmp_path)]) == 3
    err = " ".join(capsys.readouterr().err.split())
    assert message.format(tmp=tmp_path) in err, err
    assert not out.exists()


@pytest.mark.parametrize("out", ["a-file", "a-file/results"])
def test_a_file_in_place_of_the_results_directory_is_named(tmp_path, capsys, out):
    """``--out`` naming a file, or a path under one: said so, where the OS says only "File exists"."""
    suite = tiny_suite(tmp_path, 'algorithm = ["ddp"]')
    (tmp_path / "a-file").write_text("")
    assert run_cli(["sweep", str(suite), "--out", str(tmp_path / out), "--no-report"]) == 3
    err = " ".join(capsys.readouterr().err.split())
    said = "is a file" if out == "a-file" else f"cannot be made: {tmp_path / 'a-file'} is a file"
    assert f"{tmp_path / out}: the results directory {said}, not a directory" in err, err


@pytest.mark.parametrize("command", [["report"], ["export", "--format", "custom-smaller-is-better"]])
@pytest.mark.parametrize(
    "where,message",
    [
        ("{tmp}/new/deeper/out", None),  # made, as sweep --report and --out make theirs
        ("{tmp}/a-file/out", "{tmp}/a-file: the folder of {tmp}/a-file/out is a file, not a directory"),
        ("{tmp}/a-file/sub/out", "{tmp}/a-file/sub: the folder of {tmp}/a-file/sub/out cannot be made: {tmp}/a-file"),
        ("/proc/out", "/proc: the folder of /proc/out takes no new files (a virtual filesystem"),
    ],
)
def test_an_output_files_missing_folders_are_made_or_refused_as_the_sweeps_report(
    done_run, tmp_path, capsys, command, where, message
):
    """``report -o`` and ``export -o`` made the folders above their file, as ``sweep --report`` does,
    but one that could not be made was said as the OS says it ("{tmp}/a-file: File exists", "Not a
    directory", "No such file or directory" of /proc): now as ``sweep --report`` says it (exit 3)."""
    (tmp_path / "a-file").write_text("")
    target = where.format(tmp=tmp_path)
    code = run_cli([command[0], str(done_run), *command[1:], "-o", target])
    err = " ".join(capsys.readouterr().err.split())
    if message is None:
        assert code == 0 and Path(target).is_file(), err
    else:
        assert code == 3 and message.format(tmp=tmp_path) in err, err


# The three commands that take an output file name: the sweep's report, report and export.
OUTPUT_FILE_COMMANDS = pytest.mark.parametrize(
    "command",
    [
        ["sweep", "{suite}", "--report"],
        ["report", "{run}", "-o"],
        ["export", "{run}", "--format", "pytest-benchmark", "-o"],
    ],
)


@OUTPUT_FILE_COMMANDS
def test_a_folder_given_as_an_output_file_is_refused_as_typed(done_run, tmp_path, capsys, command):
    """A folder for ``--report`` or ``-o``: one line naming the option (exit 2), before anything runs.
    It was taken, then failed on writing (exit 3, "error: DIR: cannot write: Is a directory", no option
    named), or for the sweep was refused as a disk fault (exit 3)."""
    folder = tmp_path / "a-folder"
    folder.mkdir()
    suite = tiny_suite(tmp_path, 'algorithm = ["ddp"]')
    args = [a.format(suite=suite, run=done_run) for a in command]
    assert run_cli([*args, str(folder)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    option = "--report" if command[0] == "sweep" else "--output"
    assert f"tpbench {command[0]}: error: {option} {folder}: is a folder; expected the" in err, err
    assert list(folder.iterdir()) == []


@OUTPUT_FILE_COMMANDS
def test_an_output_file_that_ends_in_a_slash_is_refused_as_a_folder(done_run, tmp_path, capsys, command):
    """``-o out/`` for a folder not made yet: the report was written as a file called ``out`` (exit 0).
    Now one line naming the option and the name typed (exit 2), and nothing is written."""
    suite = tiny_suite(tmp_path, 'algorithm = ["ddp"]')
    args = [a.format(suite=suite, run=done_run) for a in command]
    target = f"{tmp_path}/out/"
    assert run_cli([*args, target]) == 2
    err = " ".join(capsys.readouterr().err.split())
    option = "--report" if command[0] == "sweep" else "--output"
    assert f"tpbench {command[0]}: error: {option} {target}: names a folder (it ends in '/')" in err, err
    assert not (tmp_path / "out").exists()


def test_a_failed_write_names_the_users_file_and_leaves_no_temporary(tmp_path):
    """A folder in the file's place when it is written (the CLI refuses one as typed, but one can
    appear meanwhile): the rename of the finished temporary file fails, the error names the user's
    path, and the temporary file is gone."""
    target = tmp_path / "bench.json"
    target.mkdir()
    with pytest.raises(store.StoreError, match=f"{target}: cannot write: Is a directory"):
        store.write_output(target, b"{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json"]


# --- 13. smaller --------------------------------------------------------------------------------


@pytest.mark.parametrize(("flag", "value"), [("--nnodes", "0"), ("--nproc-per-node", "-3")])
def test_torchrun_with_zero_nodes_is_refused(tmp_path, capsys, flag, value):
    """The option and its value named: "--nnodes and --nproc-per-node must be >= 1" said neither."""
    suite = tiny_suite(tmp_path, 'algorithm = ["ddp"]')
    assert run_cli(["sweep", str(suite), "--launcher", "torchrun", flag, value, "--out", str(tmp_path / "r")]) == 2
    assert f"tpbench sweep: error: {flag} {value}: expected an integer >= 1" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


# --- 11. a profile's env may change what runs only when it says so -----------------------------


def test_allow_env_lets_a_profile_set_a_variable_that_changes_what_runs():
    from tpbench.interconnect import resolve

    profiles = {
        "traced": {
            "backend": "gloo",
            "env": {"LD_PRELOAD": "/opt/libtrace.so", "GLOO_SOCKET_IFNAME": "lo"},
            "allow_env": ["LD_PRELOAD"],
        }
    }
    assert dict(resolve("traced", profiles).env) == {"LD_PRELOAD": "/opt/libtrace.so", "GLOO_SOCKET_IFNAME": "lo"}
    profiles["traced"]["allow_env"] = []
    with pytest.raises(ValueError, match="env.LD_PRELOAD changes what every rank runs"):
        resolve("traced", profiles)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a small tmpfs")
@pytest.mark.slow
def test_a_disk_that_fills_up_mid_sweep_names_the_file_leaves_no_temporary_and_loses_nothing(tmp_path):
    """The results filesystem fills up as soon as the run exists: exit 3 naming a file of the run,
    no temporary file anywhere, run.json still readable; with space again, --resume completes it."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], check=True)
    try:
        suite = tiny_suite(tmp_path, "steps = [20, 21]")
        p = subprocess.Popen(
            [*SWEEP, str(suite), "--out", str(disk / "results"), "--no-report"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while not list(disk.glob("results/tiny/*/run.json")) and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(OSError), open(disk / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        _, err = p.communicate(timeout=180)
        assert p.returncode == 3, err
        run_dir = next(store.iter_runs(disk / "results"))
        assert f"{run_dir}/" in err and "No space left on device" in err, err
        assert not [q for q in disk.rglob("*") if ".tmp" in q.name]
        (disk / "filler").unlink()
        # The space the run held back let run.json say the sweep stopped: not "running".
        assert store.read_run_json(run_dir)["status"] == "interrupted"
        proc = sweep("--resume", str(run_dir), "--no-report", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert set(store.load(run_dir).cases.status) == {"done"}
        assert not (run_dir / store.RESERVE_FILE).exists()  # given back once the run is complete
    finally:
        subprocess.run(["umount", str(disk)], check=False)


@pytest.fixture(scope="module")
def traced_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("traced")
    suite = tiny_suite(tmp, 'algorithm = ["ddp", "zero_no_overlap"]')
    suite.write_text(suite.read_text().replace("profiler_steps = 0", "profiler_steps = 2"))
    proc = sweep(str(suite), "--out", str(tmp / "results"), "--no-report", cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    return next(store.iter_runs(tmp / "results"))


@pytest.mark.parametrize(
    "table", ["intervals", "overlap", "collectives", "marks", "memory", "partition", "ddp_buckets"]
)
def test_a_foreign_derived_table_exits_3_naming_the_file(traced_run, tmp_path, capsys, table):
    """The accounting's tables too: a foreign ``memory`` or ``partition`` table raised a ValueError or
    KeyError out of the report's ZeRO section, and a foreign ``ddp_buckets`` table was counted as
    buckets by ``explain``."""
    import pandas as pd

    run = copy_run(traced_run, tmp_path)
    victim = next(run.glob(f"cases/*/{table}.parquet"))
    pd.DataFrame({"x": [1.0]}).to_parquet(victim)
    if table == "ddp_buckets":  # read by explain (the bucket count) and the summary, not by the report
        assert run_cli(["explain", str(run), "--pair", "algorithm=ddp..zero_no_overlap"]) == 3
    else:
        assert run_cli(["report", str(run), "-o", str(tmp_path / "r.html")]) == 3
    err = capsys.readouterr().err
    assert f"{victim}: not a tpbench {table} table" in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("table", "column"),
    [
        ("intervals", "start_ns"),
        ("overlap", "exposed_comm_ns"),
        ("collectives", "busbw_gbps"),
        ("marks", "start_ns"),
        ("memory", "optimizer_state_bytes"),
        ("partition", "params"),
        ("ddp_buckets", "bytes"),
    ],
)
def test_a_derived_table_holding_text_for_numbers_exits_3_naming_the_column(
    traced_run, tmp_path, capsys, table, column
):
    """A derived table whose number column holds text (edited by hand, written by another tool) is
    refused as steps.parquet's is, naming the file and the column; each was a TypeError or ValueError
    traceback (exit 1) out of the report's or explain's arithmetic."""
    import pandas as pd

    run = copy_run(traced_run, tmp_path)
    victim = next(run.glob(f"cases/*/{table}.parquet"))
    df = pd.read_parquet(victim)
    df[column] = df[column].astype(str) + "x"
    df.to_parquet(victim)
    if table == "ddp_buckets":
        assert run_cli(["explain", str(run), "--pair", "algorithm=ddp..zero_no_overlap"]) == 3
    else:
        assert run_cli(["report", str(run), "-o", str(tmp_path / "r.html")]) == 3
    err = capsys.readouterr().err
    assert f"{victim}: column {column!r} holds" in err and "expected numbers" in err, err
    assert "Traceback" not in err, err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a small tmpfs")
def test_a_sweep_that_would_not_fit_on_the_disk_is_refused_before_it_runs(tmp_path):
    """2 MiB free; the suite's cases trace 3 steps on 2 ranks each (about 1.6 MiB a case by the
    estimate the shipped suites were measured for): refused up front, exit 3 naming the root, the
    free space and the need, and nothing written."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], check=True)
    try:
        suite = tiny_suite(tmp_path, 'algorithm = ["ddp", "zero_no_overlap"]')
        suite.write_text(suite.read_text().replace("profiler_steps = 0", "profiler_steps = 3"))
        p = subprocess.run(
            [*SWEEP, str(suite), "--out", str(disk / "results"), "--no-report"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
        )
        assert p.returncode == 3, p.stderr
        assert f"{disk / 'results'}: " in p.stderr and "MiB free, the cases to run need about" in p.stderr, p.stderr
        assert "2 case(s)" in p.stderr, p.stderr
        assert not list(disk.rglob("run.json"))
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_space_check_uses_the_largest_finished_case_when_it_is_larger(tmp_path):
    """Between worlds the estimate grows to the largest case this run has written (here an
    impossible 1 PiB), so a run whose cases turned out bigger than estimated stops before a world
    that cannot fit, rather than inside it."""
    from tpbench import sweep

    [case] = sweep.prepare(tiny_suite(tmp_path, 'algorithm = ["ddp"]')).cases
    sweep.check_space(tmp_path, [case])  # a few KiB: fits
    with pytest.raises(store.StoreError, match=r"largest finished case \(1073741824\.0 MiB\)"):
        sweep.check_space(tmp_path, [case], largest_done=2**50)
