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

import pytest

from tpbench import store

from test_reliability import run_cli, tiny_suite

SWEEP = [sys.executable, "-m", "tpbench", "sweep"]


def sweep(*args: str, cwd: Path, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*SWEEP, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, **kw)


def tree(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*")}


# --- 1. rendezvous does not depend on the characters of a path ---------------------------------


@pytest.mark.parametrize("out_name,suite_name", [("res#ults?x=1", "plain"), ("plain", "su#ite?a=b")])
def test_url_characters_in_paths_rendezvous_inside_the_run_and_leave_nothing_behind(tmp_path, out_name, suite_name):
    """'#' and '?' in --out or in the suite name: two sweeps into the same root both finish (exit 0),
    and nothing is left outside the run directories (no stray rendezvous file)."""
    suite = tiny_suite(tmp_path, 'algorithm = ["ddp"]', name=suite_name)
    out = tmp_path / out_name
    before = tree(tmp_path)
    for _ in range(2):
        proc = sweep(str(suite), "--out", str(out), "--no-report", cwd=tmp_path, timeout=200)
        assert proc.returncode == 0, proc.stderr
    runs = list(store.iter_runs(out))
    assert len(runs) == 2
    assert {store.load(r).meta["status"] for r in runs} == {"complete"}
    outside = {p for p in tree(tmp_path) - before if not any((tmp_path / p).is_relative_to(r) for r in runs)}
    assert outside == {Path(out_name), Path(out_name) / suite_name}, outside
    assert not [p for r in runs for p in r.rglob("*.rdzv")]
