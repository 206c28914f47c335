"""The lockstep gate end to end: real sweeps of both sides on 2-rank Gloo worlds, paced by the gate.

Its protocol (one world per side for the whole gate, items strictly alternating in a seeded order
that gate.json records), A/A not called a regression, an early stop that leaves honest runs, and
sides that fail: clear errors, never a hang. The slowdown it must catch is in test_gate.py.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import sys
from pathlib import Path

import pytest
from conftest import REPO, tiny_suite, worker_processes
from conftest import tpbench as run_tpbench

from tpbench import compare, report, store
from tpbench import gate as gate_module

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


@pytest.mark.slow  # two full gates (25-35 s): over CI's budget
def test_lockstep_alternates_items_of_worlds_started_once_stops_early_and_aa_is_not_a_regression(
    tmp_path: Path,
) -> None:
    """Two cases, 30 repeats planned, a target any 10 pairs meet. Each side's sweep starts one
    world; every round runs one item of each side, in the order gate.json records (drawn from the
    seed), and by the worlds' own clocks no item of one side overlaps an item of the other. After
    10 pairs per case the gate answers stop: each world ends its plan cleanly and each case is done
    with ``repeats_run`` 10 of the 30 planned, runs that compare and report read. The same code on
    both sides (a source tree and a venv) is not called a regression."""
    text = tiny_suite('algorithm = ["ddp", "zero_no_overlap"]')
    flags = ("--repeats", "30", "--target-ci", "1000%", "--seed", "7", "--threshold", "10%", "--format", "json")
    p, out = gate(tmp_path, text, *flags)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["pairing"] == "repeats"
    assert {c["verdict"] for c in doc["cases"]} <= {"pass", "inconclusive"}, doc
    assert [c["pairs"] for c in doc["cases"]] == [10, 10], doc

    record = json.loads((out / "gate.json").read_text())
    assert record["mode"] == "lockstep" and record["seed"] == 7
    assert record["stopped"] == "every case decided"  # by the sequential rule, ±1000 %
    # The answer line says the answer, the rule and the target once ("… target ±1000.0%; every case
    # decided (same, sequential rule, target ±1000.0%))" said them twice).
    answer = "Gate answer: same (each case's pairs by the sequential rule, target ±1000.0%; every case decided)"
    assert answer in p.stderr, p.stderr
    assert record["answer"] == "same" and set(record["answers"].values()) == {"same"}
    assert (doc["answer"], doc["answers"], doc["target_ci"]) == ("same", record["answers"], 10.0)  # --format json
    rounds = record["rounds"]
    assert len(rounds) == 20  # 2 cases x 10 repeats, one item per side each round
    rng = random.Random(7)
    for r in rounds:
        assert r["order"] == rng.sample(["baseline", "candidate"], 2)
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

    runs = [Path(record["sides"][s]["run"]) for s in ("baseline", "candidate")]
    for run in runs:
        meta = store.read_run_json(run)
        assert len(meta["worlds"]) == 1 and meta["status"] == "complete"
        for entry in meta["cases"].values():
            assert (entry["status"], entry["repeats_run"], entry["params"]["repeats"]) == ("done", 10, 30)
        assert sorted(store.load(run).steps["repeat"].unique()) == list(range(10))
    assert all(c.candidate_repeats == 10 for c in compare.compare_runs(runs[:1], runs[1:]).cases)
    assert report.write_report(runs, tmp_path / "r.html").stat().st_size > 0


@pytest.mark.slow
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


def test_an_item_the_budget_ends_during_is_kept_in_gate_json_as_on_its_sides_disk(tmp_path: Path) -> None:
    """The budget spent while an item ran: the gate waits for its world to end anyway, so the item
    finishes, is on its side's disk and is one of the pairs judged, but gate.json left it out and the
    stop line counted "45 rounds and 1 item of round 46" of a gate whose 46th round had run whole.
    Items of a second or more (a sleep of 10 warm-up steps a step) make the budget end during one,
    not in the moments between; gate.json's finished items of each side are now its run's repeats."""
    text = tiny_suite('algorithm = ["ddp"]', steps=6, slowdown_pct=1000, batch_size=64)
    p, out = gate(tmp_path, text, "--repeats", "100", "--budget-s", "12", "--format", "json")
    assert p.returncode in (0, 1), p.stderr
    record = json.loads((out / "gate.json").read_text())
    assert record["stopped"].startswith("budget of 12 s spent"), record["stopped"]
    if "'s item" in record["stopped"]:  # the item it waited for, named as such (not "item 40ff2cc6b19e 45")
        assert re.search(r"waiting for \w+'s item \(case [0-9a-f]{12}, repeat \d+\) to end$", record["stopped"])
    rounds = record["rounds"]
    for side in ("baseline", "candidate"):
        kept = sorted((i["case"], i["repeat"]) for r in rounds for i in r["items"] if i["side"] == side and i["done"])
        steps = store.load(record["sides"][side]["run"]).steps
        assert kept == sorted(set(zip(steps["case_id"], steps["repeat"].astype(int)))), (side, kept)
    whole = [r for r in rounds if not r.get("partial")]
    assert all(len(r["items"]) == 2 for r in whole) and all(len(r["items"]) == 1 for r in rounds if r not in whole)
    said = f"stopping after {len(whole)} round{'' if len(whole) == 1 else 's'}"
    assert said + (":" if len(whole) == len(rounds) else " and 1 item") in p.stderr, p.stderr


def test_a_suite_the_sides_refuse_is_bad_input(tmp_path: Path) -> None:
    """A suite key neither side knows: the sides' sweeps exit 2 naming the file and key, and so
    does the gate (exit 2, bad input), not 3 as for a side that broke."""
    p, _ = gate(tmp_path, tiny_suite('algorithm = ["ddp"]', bogus=1), "--repeats", "3")
    assert p.returncode == 2, p.stderr
    assert "gate.toml: [defaults] bogus: unknown key" in p.stderr


@pytest.mark.slow  # a lockstep and a rounds gate, stopped early (14 s): over CI's budget
def test_a_misspelt_metric_ends_the_gate_after_one_item_or_one_sweep(tmp_path: Path) -> None:
    """``--metric stepms``: in lockstep the first item's world says which columns it recorded
    instead of a value, and the gate exits 2 naming them, its sides stopped after that one item
    (of 30 planned); in rounds, the first sweep's run is checked before the others are swept.
    Both used to run the whole gate before the comparison refused the metric."""
    p, out = gate(tmp_path, tiny_suite('algorithm = ["ddp"]'), "--repeats", "30", "--metric", "stepms")
    assert p.returncode == 2, p.stderr
    assert "--metric stepms: not recorded by the" in p.stderr and "cpu_ms, " in p.stderr and "step_ms" in p.stderr
    assert len(list(out.glob("*/*/*/cases/*/parts/r*.parquet"))) == 1  # the one repeat run, kept for --resume
    rounds = tmp_path / "rounds"
    p = run_tpbench(
        "gate",
        tmp_path / "gate.toml",
        "--baseline",
        REPO,
        "--candidate",
        sys.prefix,
        "--out",
        rounds,
        "--mode",
        "rounds",
        "--rounds",
        "2",
        "--metric",
        "stepms",
    )
    assert p.returncode == 2 and "--metric stepms: not recorded in" in p.stderr, p.stderr
    assert [d.name for d in rounds.iterdir() if d.is_dir()] == ["baseline"]


def test_a_side_too_old_for_lockstep_is_named_with_the_way_out(tmp_path: Path) -> None:
    """A source tree whose `tpbench sweep` rejects --lockstep (this tree with that option removed):
    exit 2, as for any option a side's sweep refuses, naming the side, its log, and --mode rounds;
    the other side's sweep is stopped."""
    old = tmp_path / "old"
    shutil.copytree(REPO / "tpbench", old / "tpbench", ignore=shutil.ignore_patterns("__pycache__"))
    (old / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    cli = old / "tpbench" / "cli" / "options.py"
    lines = cli.read_text().splitlines(keepends=True)
    cli.write_text("".join(ln for ln in lines if '"--lockstep"' not in ln))
    p, out = gate(tmp_path, tiny_suite('algorithm = ["ddp"]'), "--repeats", "3", baseline=old)
    assert p.returncode == 2
    assert "baseline" in p.stderr and "--mode rounds" in p.stderr and str(out / "baseline.log") in p.stderr


def test_a_silent_side_stops_the_gate_after_the_stall_limit(tmp_path: Path) -> None:
    """A candidate whose command never starts a world nor exits (`sh -c "sleep 60"` as its
    tpbench): after ``stall_s`` of silence the gate raises a SideError naming it and its log, and
    both sides' processes are gone."""
    suite = tmp_path / "gate.toml"
    suite.write_text(tiny_suite('algorithm = ["ddp"]'))
    out = tmp_path / "gate"
    baseline = gate_module.resolve_side("baseline", str(REPO), out / "baseline")
    silent = gate_module.resolve_side("candidate", 'sh -c "sleep 60"', out / "candidate")
    with pytest.raises(gate_module.SideError, match=r"candidate \(sh -c .*said nothing for 3 s") as e:
        gate_module.run_lockstep(suite, baseline, silent, out, gate_module.Lockstep(repeats=2, stall_s=3))
    assert str(out / "candidate.log") in str(e.value)
    assert not worker_processes(out / "baseline")
