"""The record of a run: run.json and summary.parquet carry a schema version; a version this
tpbench does not know is refused naming the file and the version; today's layout without one
(runs written before the version existed) still loads, every sub-record at its defaults; the
typed record is the only way into a loaded run."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import run_cli
from synthetic_runs import make_run

from tpbench import environment, store
from tpbench.record import (
    ADDED_KEYS,
    COMPLETE,
    COMPLETE_WITH_FAILURES,
    FINISHED,
    RUN_STATES,
    SCHEMA_VERSION,
    Capture,
    Case,
    Efficiency,
    LauncherRecord,
    RunRecord,
    Telemetry,
    WorldRecord,
)


@pytest.fixture
def run(tmp_path: Path) -> Path:
    path = make_run(tmp_path / "results", {"ddp": [10.0, 10.2, 9.9]})
    store.write_summary(path, pd.DataFrame({"case_id": list(store.load(path).record.cases), "median_ms": [10.0]}))
    return path


def export(run: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tpbench", "export", str(run), "--format", "custom-smaller-is-better"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_run_json_and_summary_carry_the_schema_version(run: Path) -> None:
    assert json.loads((run / "run.json").read_text())["schema_version"] == SCHEMA_VERSION == 1
    assert pq.read_schema(run / "summary.parquet").metadata[store.SUMMARY_VERSION_KEY] == b"1"
    loaded = store.load(run)
    assert loaded.record.schema_version == SCHEMA_VERSION
    (case,) = loaded.record.cases.values()
    assert case.status == "done" and case.params["algorithm"] == "ddp"
    with pytest.raises(TypeError):
        case.params["algorithm"] = "zero_no_overlap"  # the record is read-only


def test_the_commit_is_tpbench_s_only_where_its_checkout_tracks_it(tmp_path: Path, monkeypatch) -> None:
    """Installed (not editable) into a venv inside a user's own repository, tpbench's folder sits in
    that repository untracked, and the fingerprint recorded the user's commit as tpbench's. A real
    git repository here; ``tpbench.__file__`` is pointed at a copy of the package's first file, as
    an install places it. Tracked, the commit is recorded; untracked, none, as outside a repo."""
    import tpbench

    def git(*args: str) -> str:
        cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path), *args]
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "own.py").write_text("x = 1\n")
    git("add", "own.py")
    git("commit", "-qm", "the user's own")
    installed = tmp_path / "venv" / "lib" / "site-packages" / "tpbench" / "__init__.py"
    installed.parent.mkdir(parents=True)
    installed.write_text(Path(tpbench.__file__).read_text())
    monkeypatch.setattr(tpbench, "__file__", str(installed))
    assert environment.fingerprint()["git"] == {"commit": None, "dirty": None}
    git("add", "-f", str(installed))
    git("commit", "-qm", "tpbench tracked")
    assert environment.fingerprint()["git"] == {"commit": git("rev-parse", "HEAD"), "dirty": False}


def test_tpbench_version_names_the_version_every_run_records(capsys) -> None:
    assert run_cli(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"tpbench {environment.fingerprint()['tpbench']}"


@pytest.mark.parametrize("version", [2, 99, "1", None, -1])
def test_an_unknown_run_json_version_is_refused_naming_the_file_and_version(run: Path, version) -> None:
    """A higher integer is a newer tpbench's; "1", null or -1 was said to be one too ("upgrade
    tpbench"), though no tpbench writes them: a damaged record. The versions read are said in words:
    "(0, 1)" named a version 0 that no file says (it stands for a run without a version)."""
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(meta | {"schema_version": version}))
    p = export(run)
    assert p.returncode == 3
    (line,) = p.stderr.strip().splitlines()
    said = (
        "is not one this tpbench reads (1, or none); a newer tpbench"
        if isinstance(version, int) and version > 0
        else "is not a version (expected the integer 1, or no schema_version at all): a damaged record"
    )
    assert str(run / "run.json") in line and f"schema_version {version!r}" in line and said in line


def test_an_unknown_summary_version_is_refused_naming_the_file(run: Path) -> None:
    table = pq.read_table(run / "summary.parquet")
    pq.write_table(
        table.replace_schema_metadata(table.schema.metadata | {store.SUMMARY_VERSION_KEY: b"7"}),
        run / "summary.parquet",
    )
    p = export(run)
    assert p.returncode == 3
    (line,) = p.stderr.strip().splitlines()
    assert (
        str(run / "summary.parquet") in line and "schema_version 7 is not one this tpbench reads (1, or none)" in line
    )


def test_a_run_without_a_version_loads_as_today_s_layout(run: Path) -> None:
    meta = json.loads((run / "run.json").read_text())
    del meta["schema_version"]
    (run / "run.json").write_text(json.dumps(meta))
    pd.read_parquet(run / "summary.parquet").to_parquet(run / "summary.parquet", index=False)  # no version either
    assert store.load(run).record.schema_version == SCHEMA_VERSION  # migrated on reading
    assert export(run).returncode == 0
    # A resume's first write records the version it migrated to.
    owned = store.Run.open(run, own=True)
    owned.set_status("complete")
    assert json.loads((run / "run.json").read_text())["schema_version"] == SCHEMA_VERSION


def _old_run_json() -> dict:
    """A run.json as an early tpbench wrote it: no version, a case without the keys added since,
    no capture, a world with only its name and key, no launcher, efficiency or adaptive record."""
    case = tiny_case()
    params = {k: v for k, v in case.params().items() if k not in ADDED_KEYS}
    return {
        "run_id": "20240101T000000Z-abcdef",
        "suite": {"name": "old", "text": "[suite]\nname = 'old'\n"},
        "environment": {"torch": "2.0"},
        "cases": {case.case_id: {"params": params, "status": "done"}},
        "worlds": [{"world": "w0", "key": [2, "gloo", "cpu", "loopback"]}],
    }


def tiny_case() -> Case:
    from tpbench.suite import expand, parse

    # trace_windows at 1: the one added key whose default is not its old behaviour (one trace window).
    text = "[suite]\nname = 'old'\n[defaults]\nworld_size = 2\nbackend = 'gloo'\ndevice = 'cpu'\n"
    (case,) = expand(parse(text + "[capture]\ntrace_windows = 1\n"))
    return case


def test_an_old_run_json_reads_with_every_sub_record_at_its_defaults() -> None:
    record = RunRecord.from_json(_old_run_json())
    assert record.schema_version == SCHEMA_VERSION
    (case,) = record.cases.values()
    assert isinstance(case.case, Case) and case.case == tiny_case()  # the added keys at their old behaviour
    assert case.capture == Capture() and case.capture.nvml is None and case.repeats_run is None
    (world,) = record.worlds
    assert world == WorldRecord("w0", (2, "gloo", "cpu", "loopback")) and world.world_size == 2
    assert world.printed is False and world.schedule == () and world.nodes == ()
    assert record.launcher == LauncherRecord("local") and record.efficiency is None and record.adaptive is None
    assert record.planned_params(case.case_id)["repeats"] == case.params["repeats"]


def test_sub_records_are_typed_and_written_back_as_run_json_holds_them() -> None:
    meta = _old_run_json()
    (entry,) = meta["cases"].values()
    entry |= {"nvml": {"available": False, "reason": "CPU"}, "observed_transport": {"interfaces": ["lo"]}}
    adaptive = {"target_ci": 0.05, "budget_s": 60.0, "state": "running", "planned_repeats": {"x": 3}, "batches": []}
    meta |= {
        "adaptive": adaptive,
        "efficiency": {"wall_s": 2.0, "timed_s": 1.0},
        "launcher": {"name": "torchrun", "nnodes": 2},
    }
    record = RunRecord.from_json(meta)
    (case,) = record.cases.values()
    assert case.capture.nvml == Telemetry(available=False, reason="CPU")
    assert case.capture.observed_transport.interfaces == ("lo",)
    assert record.adaptive.target_ci == 0.05 and record.adaptive.half_widths_after is None
    assert record.adaptive.to_json() == adaptive  # what the adaptive loop writes back is what it read
    assert record.efficiency == Efficiency(wall_s=2.0, timed_s=1.0)
    assert record.launcher.name == "torchrun" and record.launcher.options == {"nnodes": 2}
    with pytest.raises(TypeError):
        record.adaptive.planned_repeats["x"] = 4  # read-only, as the rest of the record


def test_run_states_are_named_once() -> None:
    assert RUN_STATES == ("running", "interrupted", "printed", "complete", "complete_with_failures")
    assert FINISHED == (COMPLETE, COMPLETE_WITH_FAILURES)


REPO = Path(__file__).resolve().parent.parent
# Where run.json's raw dict may be read: the store (its only writer) and the record (its typed form).
RAW_READERS = {REPO / "tpbench" / "store.py", REPO / "tpbench" / "record.py", Path(__file__).resolve()}


def test_a_loaded_run_is_read_through_its_record_only() -> None:
    """``Loaded`` carries no raw run.json, and nothing outside the store and the record reaches
    into one (``loaded.meta[...]``, ``run.meta.get(...)``): a run.json key is spelled in record.py."""
    assert "meta" not in {f.name for f in dataclasses.fields(store.Loaded)}
    assert not hasattr(store.Loaded, "meta")
    raw = re.compile(r"\.meta\b")
    found = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for folder in ("tpbench", "tests", "benchmarks", "examples", "gpu")
        for path in sorted((REPO / folder).rglob("*.py"))
        if path not in RAW_READERS
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if raw.search(line)
    ]
    assert found == []


def test_the_fingerprint_reads_torchs_build_without_importing_torch():
    """A sweep command's fingerprint is the one torch itself gives, and, on a CPU build, costs no
    import of torch (seconds per command): compared in a fresh interpreter, before and after."""
    import subprocess
    import sys

    code = (
        "import json, sys; from tpbench.environment import fingerprint; a = fingerprint(); "
        "imported = 'torch' in sys.modules; import torch; b = fingerprint(); "
        "print(json.dumps([a == b, imported, torch.version.cuda is None]))"
    )
    same, imported, cpu_build = json.loads(subprocess.check_output([sys.executable, "-c", code], text=True))
    assert same
    assert imported is not cpu_build  # imported only where the build may have a GPU to ask about


def test_the_tables_step_time_columns_are_there_before_the_summary_is(tmp_path: Path) -> None:
    """A script's ``load(run).table["median_ms"]`` reads an interrupted run (no summary.parquet yet)
    and one whose cases all failed (a summary without numbers) as no numbers, not a KeyError."""
    no_summary = make_run(tmp_path / "a", {"ddp": [10.0, 10.2]})
    all_failed = make_run(tmp_path / "b", {"ddp": [10.0]}, failed=["ddp"])
    store.write_summary(all_failed, pd.DataFrame({"case_id": list(store.load(all_failed).record.cases)}))
    for path in (no_summary, all_failed):
        table = store.load(path).table
        assert set(store.STEP_TIME_COLUMNS) <= set(table.columns)
        assert table["median_ms"].isna().all() and table["repeat_medians_ms"].isna().all()


def test_the_steps_of_a_run_with_no_finished_case_have_the_steps_columns(tmp_path: Path) -> None:
    """``load(run).steps`` of a run whose cases all failed (or that was stopped before one finished) was a
    frame without columns: ``stats.repeat_values(run.steps)`` raised ``KeyError: 'phase'``, and
    ``run.steps.groupby("case_id")`` ``KeyError: 'case_id'``. It has no rows and every steps column."""
    from tpbench.analysis import stats

    steps = store.load(make_run(tmp_path, {"ddp": [10.0]}, failed=["ddp"])).steps
    assert steps.empty and set(store.STEPS_COLUMNS) | {"case_id"} <= set(steps.columns)
    assert stats.repeat_values(steps).empty and steps.groupby("case_id").size().empty


def test_a_summary_whose_step_times_are_text_is_refused_naming_the_column(run: Path) -> None:
    """``Loaded.table`` promises its step-time columns as numbers: a summary.parquet holding text there
    (written by hand, or by another tool) loaded as it was, and ``tpbench report`` then died in its
    verdicts with a TypeError while compare and export, which read the steps, went on."""
    path = run / "summary.parquet"
    cases = list(store.load(run).record.cases)
    pd.DataFrame({"case_id": cases, "median_ms": ["10.0"]}).to_parquet(path, index=False)
    with pytest.raises(store.StoreError) as e:
        store.load(run)
    assert str(e.value).startswith(f"{path}: column 'median_ms' holds ") and "expected numbers (ms)" in str(e.value)
    pd.DataFrame({"case_id": cases, "median_ms": [None]}, dtype=object).to_parquet(path, index=False)
    assert store.load(run).table["median_ms"].isna().all()  # a case without numbers is not a wrong type


@pytest.mark.parametrize("table", ["summary.parquet", "steps.parquet"])
def test_a_folder_in_a_tables_place_is_refused_naming_it(run: Path, table: str) -> None:
    """pandas reads a folder as a parquet dataset: a folder named summary.parquet escaped as a bare
    OSError naming no file ("error: : Cannot open for reading"), one named steps.parquet read as a
    table without its columns. Both are refused as what they are."""
    path = run / table if table == "summary.parquet" else next(run.glob(f"cases/*/{table}"))
    path.unlink()
    path.mkdir()
    with pytest.raises(store.StoreError) as e:
        store.load(run)
    assert str(e.value) == f"{path}: a directory, expected a parquet file"


def test_a_path_that_is_not_a_run_says_where_the_run_is(tmp_path: Path) -> None:
    """A run's own run.json, a suite's folder and the results root given where a run directory is
    asked for: "run.json: no such run directory" and "not a tpbench run (or its sweep never started)"
    left the user guessing the level; the error names the run folder, or the newest run below."""
    runs = [make_run(tmp_path / "results", {"ddp": [10.0]}) for _ in range(2)]
    newer = max(runs, key=lambda p: p.name)  # run ids sort by time (two made in one second, by suffix)
    expected = {
        newer / "run.json": f"the run is its folder, {newer}",
        newer.parent: f"{newer.parent / 'run.json'}: missing; {newer.parent} is not a tpbench run but holds 2 runs "
        f"(the latest: {newer}): give a run's own folder",
        tmp_path / "results": f"but holds 2 runs (the latest: {newer})",
        tmp_path: "is not a tpbench run (or its sweep never started)",
    }
    for path, said in expected.items():
        with pytest.raises(store.StoreError, match=re.escape(said)):
            store.load(path)


def test_a_gate_folder_given_as_a_run_names_its_two_runs(tmp_path: Path) -> None:
    """A gate's --out (results/gate in the CI example) given to export, report or compare: its runs
    are two levels down, baseline/<suite>/<id> and candidate/<suite>/<id>; "is not a tpbench run (or
    its sweep never started)" read as if the gate had run nothing."""
    gate = tmp_path / "gate"
    sides = [make_run(gate / side, {"ddp": [10.0, 10.1, 9.9]}) for side in ("baseline", "candidate")]
    (gate / "gate.json").write_text("{}")
    with pytest.raises(store.StoreError) as e:
        store.load(gate)
    assert str(e.value) == (
        f"{gate / 'run.json'}: missing; {gate} is not a tpbench run but a gate's folder, whose runs are "
        f"{sides[0]} and {sides[1]}: give one of those"
    )


def test_measuring_md_lists_every_summary_column_a_run_writes() -> None:
    """docs/measuring.md's table of summary.parquet's columns, against a real finished run's summary
    (a GPU run, so its memory peaks are there too): each column written is documented, each one
    documented is written. A script reading ``load(run).table`` had only "medians, spreads, CIs"."""
    from tpbench.suite import CAPTURE_KEYS, CASE_KEYS

    root = Path(__file__).resolve().parent
    text = (root.parent / "docs" / "measuring.md").read_text(encoding="utf-8")
    table = text.split("summary.parquet's columns", 1)[1].split("\n\n", 2)[1]
    documented = {name for row in table.splitlines()[2:] for name in re.findall(r"`([\w.]+)`", row.split("|")[1])}
    summary = pd.read_parquet(root / "fixtures" / "runs" / "h200_gloo2_capture" / "summary.parquet")
    cases = set(CASE_KEYS) | set(CAPTURE_KEYS) | {"case_id", "label", "status", "error", "detail"}
    written = {c for c in summary.columns if c not in cases and not c.startswith("workload.")}
    assert documented == written
