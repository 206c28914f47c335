"""The lockstep gate end to end: real sweeps of both sides on 2-rank Gloo worlds, paced by the gate.

Its protocol (one world per side for the whole gate, items strictly alternating in a seeded order
that gate.json records), A/A not called a regression, an early stop that leaves honest runs, and
sides that fail: clear errors, never a hang. The slowdown it must catch is in test_gate.py.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path

import pytest
from conftest import REPO, tiny_suite
from conftest import tpbench as run_tpbench

from tpbench import store

pytestmark = pytest.mark.ranks


def tpbench(*args: str | Path):
    p = run_tpbench(*args, timeout=600)
    p.stderr = " ".join(p.stderr.split())
    return p


def gate(tmp_path: Path, suite_text: str, *flags: str | Path, baseline: str | Path = REPO, candidate=sys.prefix):
    suite = tmp_path / "gate.toml"
    suite.write_text(suite_text)
    out = tmp_path / "gate"
    p = tpbench("gate", suite, "--baseline", baseline, "--candidate", candidate, "--out", out, *flags)
    return p, out


def test_lockstep_alternates_items_of_worlds_started_once_and_aa_is_not_a_regression(tmp_path: Path) -> None:
    """Two cases, 6 repeats: each side's sweep starts one world; every round runs one item of each
    side, in the order gate.json records (drawn from the seed), and by the worlds' own clocks no
    item of one side overlaps an item of the other. The same code on both sides (a source tree
    and a venv) is not called a regression."""
    text = tiny_suite('algorithm = ["ddp", "zero_no_overlap"]', warmup_steps=3, steps=6, batch_size=32)
    p, out = gate(tmp_path, text, "--repeats", "6", "--seed", "7", "--threshold", "10%", "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["pairing"] == "repeats"
    assert {c["verdict"] for c in doc["cases"]} <= {"pass", "inconclusive"}, doc
    assert all(c["pairs"] == 6 for c in doc["cases"]), doc

    record = json.loads((out / "gate.json").read_text())
    assert record["mode"] == "lockstep" and record["seed"] == 7 and record["stopped"] == "the plans ended"
    rounds = record["rounds"]
    assert len(rounds) == 12  # 2 cases x 6 repeats, one item per side each round
    rng = random.Random(7)
    for r in rounds:
        assert r["order"] == [s for s in rng.sample(["baseline", "candidate"], 2)]
        assert [i["side"] for i in r["items"]] == r["order"]
        (a, b) = r["items"]
        assert (a["case"], a["repeat"]) == (b["case"], b["repeat"])  # item i of one side is item i of the other
    assert {tuple(r["order"]) for r in rounds} == {("baseline", "candidate"), ("candidate", "baseline")}

    items = sorted((i for r in rounds for i in r["items"]), key=lambda i: i["began"])
    assert all(i["done"] for i in items)
    for prev, nxt in zip(items, items[1:]):
        assert prev["ended"] <= nxt["began"], (prev, nxt)  # never both at once
    for i in items:
        assert i["start"] <= i["began"] <= i["ended"] <= i["end"]  # inside the gate's go … done

    for side in ("baseline", "candidate"):
        meta = store.read_run_json(Path(record["sides"][side]["run"]))
        assert len(meta["worlds"]) == 1 and meta["status"] == "complete"
        assert {c["status"] for c in meta["cases"].values()} == {"done"}


def test_target_ci_stops_after_the_fewest_pairs_and_leaves_honest_runs(tmp_path: Path) -> None:
    """With a target any 10 pairs meet, the gate answers stop after 10 rounds: each side's world
    ends its plan cleanly, the case is done with ``repeats_run`` 10 of the 30 planned, and
    `tpbench compare` and `tpbench report` read the runs."""
    text = tiny_suite('algorithm = ["ddp"]', warmup_steps=3, steps=6, batch_size=32)
    p, out = gate(tmp_path, text, "--repeats", "30", "--target-ci", "99%", "--format", "json")
    assert p.returncode == 0, p.stderr
    record = json.loads((out / "gate.json").read_text())
    assert len(record["rounds"]) == 10 and record["stopped"].startswith("every case resolved to ±99.0%")
    (case,) = json.loads(p.stdout)["cases"]
    assert case["pairs"] == 10
    runs = [Path(record["sides"][s]["run"]) for s in ("baseline", "candidate")]
    for run in runs:
        meta = store.read_run_json(run)
        (entry,) = meta["cases"].values()
        assert (entry["status"], entry["repeats_run"], entry["params"]["repeats"]) == ("done", 10, 30)
        assert meta["status"] == "complete" and len(meta["worlds"]) == 1
        assert sorted(store.load(run).steps["repeat"].unique()) == list(range(10))
    compared = tpbench("compare", *runs, "--format", "json")
    assert compared.returncode == 0 and json.loads(compared.stdout)["cases"][0]["candidate_repeats"] == 10
    report = tpbench("report", runs[1], "-o", tmp_path / "r.html")
    assert report.returncode == 0 and (tmp_path / "r.html").stat().st_size > 0, report.stderr


def test_a_side_whose_worlds_die_is_reported_without_a_hang(tmp_path: Path) -> None:
    """The candidate's world is killed in its first item of each case (fault crash:1): the gate sees
    its connection end, the candidate's sweep fails that case and starts a fresh world, which
    connects and asks again; the baseline runs its items meanwhile, never two at once, and the
    verdict names both cases as missing (exit 3). gate.json records the candidate's items as not done."""
    text = tiny_suite('algorithm = ["ddp", "zero_no_overlap"]', warmup_steps=3, steps=6, batch_size=32)
    p, out = gate(tmp_path, text, "--repeats", "3", "--candidate-set", "fault=crash:1", "--format", "json")
    assert p.returncode == 3, p.stderr
    cases = json.loads(p.stdout)["cases"]
    assert [c["verdict"] for c in cases] == ["missing", "missing"] and all("failed" in c["reason"] for c in cases)
    record = json.loads((out / "gate.json").read_text())
    items = [i for r in record["rounds"] for i in r["items"]]
    assert sorted((i["case"], i["repeat"], i["done"]) for i in items if i["side"] == "candidate") == sorted(
        (c["case_id"], 0, False) for c in cases
    )
    assert sum(i["side"] == "baseline" and i["done"] for i in items) == 6
    meta = store.read_run_json(Path(record["sides"]["candidate"]["run"]))
    assert len(meta["worlds"]) == 2 and {c["status"] for c in meta["cases"].values()} == {"failed"}


def test_a_side_too_old_for_lockstep_is_named_with_the_way_out(tmp_path: Path) -> None:
    """A source tree whose `tpbench sweep` rejects --lockstep (this tree with that option removed):
    exit 3 naming the side, its log, and --mode rounds; the other side's sweep is stopped."""
    old = tmp_path / "old"
    shutil.copytree(REPO / "tpbench", old / "tpbench", ignore=shutil.ignore_patterns("__pycache__"))
    (old / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    cli = old / "tpbench" / "cli.py"
    lines = cli.read_text().splitlines(keepends=True)
    cli.write_text("".join(ln for ln in lines if '"--lockstep"' not in ln))
    p, out = gate(tmp_path, tiny_suite('algorithm = ["ddp"]'), "--repeats", "3", baseline=old)
    assert p.returncode == 3
    assert "baseline" in p.stderr and "--mode rounds" in p.stderr and str(out / "baseline.log") in p.stderr
