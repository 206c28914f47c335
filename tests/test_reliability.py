"""Faults, bad input and nothing lost: real processes, real signals, real files.

Complements ``test_sweep.py`` (crash/hang knobs, SIGINT + resume, unwritable root).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import only_run, run_cli, tiny_suite, worker_processes

from tpbench import store

HERE = Path(__file__).resolve().parent
CATALOGUE = sorted((HERE / "data" / "bad_suites").glob("*.toml"))


def expected_message(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), path
    return first[len("# expect: ") :]


def test_catalogue_is_large_enough():
    assert len(CATALOGUE) >= 25


@pytest.mark.parametrize("suite", CATALOGUE, ids=[p.stem for p in CATALOGUE])
def test_bad_suite_exits_2_with_one_line_naming_file_and_key_and_writes_nothing(suite, tmp_path, capsys):
    out, reports = tmp_path / "results", tmp_path / "reports"
    code = run_cli(["sweep", str(suite), "--out", str(out), "--reports-dir", str(reports)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"tpbench sweep: error: {suite}: "), err  # said by the command, as a bad option is
    assert expected_message(suite) in err
    assert not out.exists() and not reports.exists()


def tiny_suite_file(tmp_path: Path, sweep: str, name: str = "tiny", **defaults: object) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(tiny_suite(sweep, name=name, **{"warmup_steps": 3} | defaults))
    return path


def rank_pids(run_dir: Path) -> dict[int, int]:
    """Rank → pid of the worker processes of a run (read from their environment)."""
    pids = {}
    for line in subprocess.run(
        ["pgrep", "-f", f"tpbench.worker {run_dir}"], capture_output=True, text=True
    ).stdout.split():
        try:
            env = Path(f"/proc/{line}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ranks = [int(e.split(b"=", 1)[1]) for e in env if e.startswith(b"RANK=")]
        if ranks:
            pids[ranks[0]] = int(line)
    return pids


@pytest.mark.ranks
def test_kill_9_of_a_rank_mid_case_fails_that_case_only(tmp_path):
    # The second case runs long enough to be killed from outside while it is in flight.
    suite = tiny_suite_file(tmp_path, "steps = [4, 4000, 5]")
    out = tmp_path / "results"
    p = subprocess.Popen(
        [sys.executable, "-m", "tpbench", "sweep", str(suite), "--out", str(out), "--no-report"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    killed = None
    while time.monotonic() < deadline and killed is None:
        for run_dir in store.iter_runs(out) if out.exists() else []:
            meta = json.loads((run_dir / "run.json").read_text())
            running = [c for c in meta["cases"].values() if c["status"] == "running" and c["params"]["steps"] == 4000]
            pids = rank_pids(run_dir)
            if running and 1 in pids:
                time.sleep(0.5)
                os.kill(pids[1], signal.SIGKILL)
                killed = run_dir
        time.sleep(0.05)
    assert killed, "never saw the long case running"
    _, err = p.communicate(timeout=180)
    assert p.returncode == 1, err
    meta = json.loads((killed / "run.json").read_text())
    status = {c["params"]["steps"]: (c["status"], c.get("error")) for c in meta["cases"].values()}
    assert status[4000] == ("failed", "rank 1 was killed by SIGKILL")
    assert status[4][0] == "done" and status[5][0] == "done"
    assert rank_pids(killed) == {}
    assert store.load(killed).steps.case_id.nunique() == 2


@pytest.mark.ranks
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="needs root to mount a tiny tmpfs")
def test_full_results_directory_fails_before_any_case(tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(full)], check=True)
    try:
        with pytest.raises(OSError), open(full / "filler", "wb") as f:
            while True:  # fill it up
                f.write(b"\0" * 4096)
                f.flush()
        suite = tiny_suite_file(tmp_path, 'algorithm = ["ddp"]')
        proc = subprocess.run(
            [sys.executable, "-m", "tpbench", "sweep", str(suite), "--out", str(full / "results"), "--no-report"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 3, proc.stderr
        assert "not writable" in proc.stderr and "No space left on device" in proc.stderr
        assert not list((full / "results").rglob("run.json"))
    finally:
        subprocess.run(["umount", str(full)], check=False)


@pytest.fixture(scope="module")
def finished_run(finished_tiny_run) -> Path:
    """tiny_suite_file's two cases, ddp and zero_no_overlap, swept (conftest's, test_hostile.py's too)."""
    return finished_tiny_run


def corrupt_copy(run_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy)
    return copy


@pytest.mark.ranks
def test_report_on_truncated_parquet_names_the_file(finished_run, tmp_path, capsys):
    run = corrupt_copy(finished_run, tmp_path)
    victim = next(run.glob("cases/*/steps.parquet"))
    victim.write_bytes(victim.read_bytes()[:100])
    assert run_cli(["report", str(run), "-o", str(tmp_path / "r.html")]) == 3
    err = capsys.readouterr().err
    assert str(victim) in err and "unreadable parquet" in err
    assert not (tmp_path / "r.html").exists()


@pytest.mark.ranks
def test_resume_writes_a_cut_short_summary_again(finished_run, tmp_path, capsys):
    """A summary.parquet cut short was left as it was ("Nothing to resume", exit 0) while `report`
    refused it; a missing one was written again. Both are now written again from the steps."""
    run = corrupt_copy(finished_run, tmp_path)
    summary = run / "summary.parquet"
    summary.write_bytes(summary.read_bytes()[:100])
    assert run_cli(["sweep", "--resume", str(run), "--no-report"]) == 0
    assert "Nothing to resume" not in capsys.readouterr().out
    assert len(store.load(run).summary) == 2
    assert run_cli(["report", str(run), "-o", str(tmp_path / "r.html")]) == 0


@pytest.mark.ranks
def test_a_resume_says_its_own_wall_time_apart_from_the_runs(finished_run, tmp_path, capsys):
    """The closing line's timed steps and processes are the whole run's: on a resume that only wrote
    the summary it read "Wall 0.2 s; timed steps 4.0 s", more time timed than spent."""
    run = corrupt_copy(finished_run, tmp_path)
    (run / "summary.parquet").unlink()
    assert run_cli(["sweep", "--resume", str(run), "--no-report"]) == 0
    line = " ".join(capsys.readouterr().out.split())
    wall_s = json.loads((run / "run.json").read_text())["efficiency"]["wall_s"]
    assert " s this resume; the whole run: " in line and f"{wall_s:.1f} s running worlds" in line


@pytest.mark.ranks
@pytest.mark.parametrize("cut", ["gzip", "json"])
def test_a_trace_cut_short_is_named_and_the_run_finishes_without_it(finished_run, tmp_path, capsys, cut):
    """A case's trace cut short (a copy interrupted, a damaged disk) ended the analysis of a sweep or
    resume in a traceback from the JSON or gzip decoder, naming no file. It exits 3 naming the file
    and what to do; done so, the resume finishes the run."""
    run = corrupt_copy(finished_run, tmp_path)
    (run / "summary.parquet").unlink()  # so that the resume analyses the run again
    cid = next(iter(store.load(run, summary=False).record.cases))
    store.trace_dir(run, cid).mkdir()
    whole = gzip.decompress((Path(__file__).parent / "fixtures" / "traces" / "gloo2" / "rank0.json.gz").read_bytes())
    victim = store.trace_dir(run, cid) / "rank0.json.gz"
    cut_short = gzip.compress(whole)[:-100] if cut == "gzip" else gzip.compress(whole[: len(whole) // 2])
    victim.write_bytes(cut_short)
    assert run_cli(["sweep", "--resume", str(run), "--no-report"]) == 3
    err = " ".join(capsys.readouterr().err.split())
    assert f"case {cid}: {victim}: not a whole Chrome trace" in err and "Traceback" not in err, err
    assert f"move its trace folder ({store.trace_dir(run, cid)}) aside" in err, err
    shutil.move(store.trace_dir(run, cid), tmp_path / "aside")
    assert run_cli(["sweep", "--resume", str(run), "--no-report"]) == 0
    assert len(store.load(run).summary) == 2


@pytest.mark.ranks
@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_resume_refuses_a_done_case_whose_steps_are_lost(finished_run, tmp_path, capsys, damage):
    """A done case's steps.parquet missing or cut short: `--resume` said "Nothing to resume: every
    case is done" and exited 0 (or, with the summary gone too, marked the complete run interrupted);
    it exits 3 naming the file, and changes nothing."""
    run = corrupt_copy(finished_run, tmp_path)
    victim = next(run.glob("cases/*/steps.parquet"))
    if damage == "missing":
        victim.unlink()
    else:
        victim.write_bytes(victim.read_bytes()[:100])
    before = (run / "run.json").read_text()
    assert run_cli(["sweep", "--resume", str(run), "--no-report"]) == 3
    captured = capsys.readouterr()
    assert str(victim) in captured.err and "Nothing to resume" not in captured.out
    assert (run / "run.json").read_text() == before


@pytest.mark.ranks
def test_resume_records_a_pending_case_whose_every_repeat_is_on_disk(finished_run, tmp_path):
    """A sweep killed outright after rank 0 wrote a case's last repeat, before the launcher recorded
    the case: the dry run said "only to record", but `--resume` ran no world for it, left it pending
    and marked the run complete (exit 0). It is recorded done, its steps those the ranks wrote."""
    run = corrupt_copy(finished_run, tmp_path)
    case_id = next(run.glob("cases/*/steps.parquet")).parent.name
    steps = (run / "cases" / case_id / "steps.parquet").read_bytes()
    store.unmerge_case(run, case_id)
    meta = json.loads((run / "run.json").read_text())
    meta["status"], meta["cases"][case_id]["status"] = "running", "running"
    (run / "run.json").write_text(json.dumps(meta))
    assert run_cli(["sweep", "--resume", str(run), "--no-report"]) == 0
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "complete" and meta["cases"][case_id]["status"] == "done"
    assert (run / "cases" / case_id / "steps.parquet").read_bytes() == steps
    assert len(meta["worlds"]) == len(json.loads((finished_run / "run.json").read_text())["worlds"])


@pytest.mark.ranks
def test_resume_runs_again_a_repeat_whose_part_is_cut_short(finished_run, tmp_path, capsys):
    """A pending case's repeat part cut short (a disk error, a hand's `head -c`): `--resume` ran the
    rest, then died merging the parts with a bare pyarrow traceback, every time. The part is set
    aside (kept, as unreadable-rNNNN.parquet) and its repeat runs again."""
    run = corrupt_copy(finished_run, tmp_path)
    case_id = next(run.glob("cases/*/steps.parquet")).parent.name
    store.unmerge_case(run, case_id)
    part = run / "cases" / case_id / "parts" / "r0000.parquet"
    part.write_bytes(part.read_bytes()[:100])
    meta = json.loads((run / "run.json").read_text())
    meta["status"], meta["cases"][case_id]["status"] = "interrupted", "pending"
    (run / "run.json").write_text(json.dumps(meta))
    assert run_cli(["sweep", "--resume", str(run), "--dry-run"]) == 0
    assert "1 of 1×" in capsys.readouterr().out  # the repeat runs again: not "0 of 1×", only to record
    assert run_cli(["sweep", "--resume", str(run), "--no-report"]) == 0
    assert json.loads((run / "run.json").read_text())["cases"][case_id]["status"] == "done"
    steps = pd.read_parquet(run / "cases" / case_id / "steps.parquet")
    assert sorted(steps["repeat"].unique()) == [0] and not steps.duplicated(["repeat", "rank", "step"]).any()
    assert (run / "cases" / case_id / "unreadable-r0000.parquet").exists()


@pytest.mark.ranks
@pytest.mark.parametrize("damage,message", [("missing", "run.json: missing"), ("garbage", "run.json: corrupted")])
def test_report_on_broken_run_json_says_what_is_broken(finished_run, tmp_path, capsys, damage, message):
    run = corrupt_copy(finished_run, tmp_path)
    if damage == "missing":
        (run / "run.json").unlink()
    else:
        (run / "run.json").write_text('{"run_id": ')
    assert run_cli(["report", str(run), "-o", str(tmp_path / "r.html")]) == 3
    assert message in capsys.readouterr().err


@pytest.mark.ranks
@pytest.mark.slow
def test_two_concurrent_sweeps_into_one_root_are_both_intact_and_bitwise_reproducible(tmp_path):
    """Same suite, same seed, at the same time into the same results root: distinct runs, both
    complete, and identical losses to the last bit (CPU/Gloo is deterministic for a fixed thread
    count; on GPU, cuBLAS/NCCL reduction order can differ, see docs/reliability.md)."""
    suite = tiny_suite_file(
        tmp_path,
        'algorithm = ["ddp", "zero_no_overlap", "hook_with_zero_step", "hook_with_zero_step_interleaved", '
        '"post_localSGD_hook"]',
        start_localSGD_iter=3,
        averaging_period=2,
        bucket_cap_mb=0.01,
    )
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "tpbench", "sweep", str(suite), "--out", str(out), "--no-report"]
    procs = [
        subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    runs = list(store.iter_runs(out))
    assert len(runs) == 2 and runs[0].name != runs[1].name
    a, b = (store.load(r) for r in runs)
    assert set(a.cases.status) == set(b.cases.status) == {"done"}
    assert a.steps.case_id.nunique() == 5
    cols = ["case_id", "repeat", "rank", "step"]
    la = a.steps.sort_values(cols)[cols + ["loss"]].reset_index(drop=True)
    lb = b.steps.sort_values(cols)[cols + ["loss"]].reset_index(drop=True)
    pd.testing.assert_frame_equal(la, lb, check_exact=True)


def test_a_run_whose_process_is_gone_reads_as_interrupted_not_running(tmp_path, capsys):
    """A sweep killed outright (SIGKILL, the OOM killer) leaves run.json saying "running": its report
    said "2 running" for ever. Read while no process holds its lock, it is what Ctrl-C would have left
    (interrupted, the cases in flight pending); while one does, it is running. run.json is not changed."""
    from synthetic_runs import make_run

    run_dir = make_run(tmp_path / "r", {"ddp": [10.0, 11.0], "zero_no_overlap": [9.0, 9.5]})
    meta = json.loads((run_dir / "run.json").read_text())
    first = sorted(meta["cases"])[0]
    meta["status"], meta["cases"][first]["status"] = "running", "running"
    (run_dir / "run.json").write_text(json.dumps(meta))
    loaded = store.load(run_dir)
    assert loaded.record.status == "interrupted" and loaded.record.cases[first].status == "pending"
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"
    lock = store.RunLock(run_dir)  # as the sweep running it holds it
    try:
        loaded = store.load(run_dir)
        assert loaded.record.status == "running" and loaded.record.cases[first].status == "running"
    finally:
        lock.release()
    assert run_cli(["report", str(run_dir), "-o", str(tmp_path / "r.html")]) == 0
    assert "running" not in capsys.readouterr().out + (tmp_path / "r.html").read_text().split("<body")[1]


@pytest.mark.ranks
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="needs root to mount a tmpfs read-only")
def test_a_run_on_a_read_only_disk_says_to_resume_a_copy(finished_run, tmp_path, capsys):
    """``--resume`` of a run on a read-only filesystem said only "RUN/.lock: Read-only file system"
    (exit 3); it now says what to do (copy it and resume the copy), and what works where it is."""
    disk = tmp_path / "ro"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)], check=True)
    try:
        run = corrupt_copy(finished_run, disk)
        meta = json.loads((run / "run.json").read_text())
        (run / "run.json").write_text(json.dumps(meta | {"status": "interrupted"}))
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        assert run_cli(["sweep", "--resume", str(run), "--no-report"]) == 3
        err = " ".join(capsys.readouterr().err.split())
        assert f"{run}: cannot be written here (Read-only file system); a resume writes into the run: copy it" in err
        assert run_cli(["report", str(run), "-o", str(tmp_path / "r.html")]) == 0  # read where it is
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_a_repeat_that_times_out_records_where_each_rank_was(tmp_path, capsys):
    """A rank hanging in the case's code (``fault = "hang:1"``) failed its case with "timed out after
    N s" and a detail of empty log tails: nothing said which rank stopped, nor where. At the
    time-out each rank is asked for its Python stacks, which the case's detail now holds: rank 1
    in the planted hang, rank 0 in the step it waits in; and the world still leaves no process.
    The limit leaves the warm-up and the collection before the timed steps time on a loaded machine:
    at 5 s, with the load average at 6-9 on 2 cores, both ranks were still collecting when it ran out."""
    suite = tiny_suite_file(tmp_path, 'fault = ["hang:1"]', timeout_s=15)
    assert run_cli(["sweep", str(suite), "--out", str(tmp_path / "results"), "--no-report"]) == 1
    run_dir = only_run(tmp_path / "results")
    (entry,) = json.loads((run_dir / "run.json").read_text())["cases"].values()
    assert entry["error"].startswith("timed out after 15 s in repeat 0"), entry["error"]
    stacks = {part.split(" ---\n")[0]: part for part in entry["detail"].split("--- rank ")[1:]}
    assert "in inject" in stacks["1 stacks when it timed out"], entry["detail"]
    assert "in step" in stacks["0 stacks when it timed out"], entry["detail"]
    assert "each rank's stacks when a repeat timed out" in " ".join(capsys.readouterr().err.split())
    assert worker_processes(run_dir) == []
