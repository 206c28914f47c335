"""The record of a run: run.json and summary.parquet carry a schema version; a version this
tpbench does not know is refused naming the file and the version; today's layout without one
(runs written before the version existed) still loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from synthetic_runs import make_run

from tpbench import store
from tpbench.record import SCHEMA_VERSION


@pytest.fixture
def run(tmp_path: Path) -> Path:
    path = make_run(tmp_path / "results", {"ddp": [10.0, 10.2, 9.9]})
    store.write_summary(path, pd.DataFrame({"case_id": list(store.load(path).meta["cases"]), "median_ms": [10.0]}))
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


@pytest.mark.parametrize("version", [2, 99, "1", None])
def test_an_unknown_run_json_version_is_refused_naming_the_file_and_version(run: Path, version) -> None:
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(meta | {"schema_version": version}))
    p = export(run)
    assert p.returncode == 3
    (line,) = p.stderr.strip().splitlines()
    assert str(run / "run.json") in line and f"schema_version {version!r}" in line and "newer tpbench" in line


def test_an_unknown_summary_version_is_refused_naming_the_file(run: Path) -> None:
    table = pq.read_table(run / "summary.parquet")
    pq.write_table(
        table.replace_schema_metadata(table.schema.metadata | {store.SUMMARY_VERSION_KEY: b"7"}),
        run / "summary.parquet",
    )
    p = export(run)
    assert p.returncode == 3
    (line,) = p.stderr.strip().splitlines()
    assert str(run / "summary.parquet") in line and "schema_version 7" in line


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
