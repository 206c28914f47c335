"""``tpbench compare RUN_DIR``: the cases of one run judged pair by pair (``compare.within_run``).

Synthetic runs (``synthetic_runs.make_run``) carry known answers; one real sweep of 2 Gloo ranks
checks the command end to end.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli, tiny_suite
from synthetic_runs import make_run

from tpbench import compare, render, store, sweep

# Per-round drift shared by every case of a world: paired comparisons cancel it, unpaired ones cannot.
DRIFT = [10.0, 13.0, 9.0, 15.0, 10.5, 12.0]


def scaled(f: float) -> list[float]:
    return [m * f for m in DRIFT]


def by_selector(w: compare.WithinRun) -> dict[str, list[compare.CasePair]]:
    out: dict[str, list[compare.CasePair]] = {}
    for p in w.pairs:
        out.setdefault(p.selector, []).append(p)
    return out


@pytest.fixture(scope="module")
def zero_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three ZeRO algorithms x shard_buckets x two world sizes: sharding costs 20%, the overlap
    hooks save 10% against zero_no_overlap, and 3 ranks cost the same as 2 but in other rounds."""

    def factor(case) -> float:
        f = 1.2 if case.shard_buckets else 1.0
        return f * (1.0 if case.algorithm == "zero_no_overlap" else 0.9) * (1.0 if case.world_size == 2 else 1.001)

    return make_run(
        tmp_path_factory.mktemp("within"),
        {"zero_no_overlap": DRIFT, "hook_with_zero_step": DRIFT, "hook_with_zero_step_interleaved": DRIFT},
        sweep={"shard_buckets": "[false, true]", "world_size": "[2, 3]"},
        factor=factor,
    )


def test_pairs_orientation_pairing_and_moot_keys(zero_run: Path) -> None:
    w = compare.within_run(zero_run)
    pairs = by_selector(w)
    # Each overlap hook against zero_no_overlap, whose shard_buckets is moot (None): both the
    # sharded and the unsharded hook case match it, as in the report.
    assert set(pairs) == {
        "algorithm=hook_with_zero_step..hook_with_zero_step_interleaved",
        "algorithm=zero_no_overlap..hook_with_zero_step",
        "algorithm=zero_no_overlap..hook_with_zero_step_interleaved",
        "shard_buckets=false..true",
        "world_size=2..3",
    }
    moot = pairs["algorithm=zero_no_overlap..hook_with_zero_step"]
    assert sorted(p.context["shard_buckets"] for p in moot) == [False, False, True, True]
    assert len({p.baseline_case for p in moot}) == 2  # one zero_no_overlap case per world size
    for p in pairs["algorithm=zero_no_overlap..hook_with_zero_step"]:
        expected = 0.9 * (1.2 if p.context["shard_buckets"] else 1.0)
        assert p.method == "paired" and p.result.pairs == len(DRIFT)
        assert p.result.ratio == pytest.approx(expected, rel=0.02)
    # Same world: the drift cancels round by round; across worlds it cannot (Welch over repeats).
    for p in pairs["shard_buckets=false..true"]:
        assert p.method == "paired" and p.result.verdict == compare.REGRESSION and p.result.half_width < 0.02
    for p in pairs["world_size=2..3"]:
        assert p.method == "unpaired" and p.result.pairs == 0
        assert p.result.verdict == compare.INCONCLUSIVE and p.result.half_width > 0.1
    for p in pairs["algorithm=hook_with_zero_step..hook_with_zero_step_interleaved"]:
        assert p.result.verdict == compare.PASS
    assert w.verdict == compare.REGRESSION and w.exit_code == 1
    assert w.keys == ["algorithm", "world_size", "shard_buckets"]


def test_orientation_rules() -> None:
    a, b = {"algorithm": "ddp"}, {"algorithm": "post_localSGD_hook", "start_localSGD_iter": 10}
    assert compare.orient("algorithm", b, a, ["post_localSGD_hook", "ddp"]) == (a, b)
    never = {"algorithm": "post_localSGD_hook", "start_localSGD_iter": "never"}
    assert compare.orient("start_localSGD_iter", b, never, [10, "never"]) == (never, b)
    x, y = {"algorithm": "ddp", "static_graph": True}, {"algorithm": "ddp", "static_graph": False}
    assert compare.orient("static_graph", x, y, [True, False]) == (y, x)
    x, y = {"algorithm": "ddp", "bucket_cap_mb": 25}, {"algorithm": "ddp", "bucket_cap_mb": 1.5}
    assert compare.orient("bucket_cap_mb", x, y, [25, 1.5]) == (y, x)
    x, y = {"algorithm": "ddp", "interconnect": "tcp"}, {"algorithm": "ddp", "interconnect": "loopback"}
    assert compare.orient("interconnect", x, y, ["loopback", "tcp"]) == (y, x)
    s = {"algorithm": "hook_with_zero_step"}
    i = {"algorithm": "hook_with_zero_step_interleaved"}
    assert compare.orient("algorithm", i, s, ["hook_with_zero_step_interleaved", "hook_with_zero_step"]) == (s, i)


def test_pair_selection_flips_sides_and_gates_the_exit_code(zero_run: Path, capsys) -> None:
    sel = "algorithm=hook_with_zero_step_interleaved..hook_with_zero_step"
    w = compare.within_run(zero_run, pairs=[sel])
    assert len(w.pairs) == 4 and {p.selector for p in w.pairs} == {sel}
    assert all(p.result.verdict == compare.PASS for p in w.pairs)
    # One command gates CI on one internal comparison: sharding must not be slower (it is).
    assert run_cli(["compare", str(zero_run), "--pair", "shard_buckets=false..true", "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "regression" and len(doc["pairs"]) == 4
    assert all(p["result"]["half_width"] > 0 and p["method"] == "paired" for p in doc["pairs"])
    assert run_cli(["compare", str(zero_run), "--pair", "shard_buckets=true..false"]) == 0
    assert "improvement: faster, beyond the ±5% threshold" in capsys.readouterr().out
    assert len(compare.within_run(zero_run, pairs=["world_size=2.0..3"]).pairs) == 5
    assert run_cli(["compare", str(zero_run), "--pair", sel, "--filter", "world_size=3", "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("### tpbench compare (within one run): ✅ pass")
    assert md.count("✅ pass: ") == 2 and md.count("within the ±5% threshold") == 2


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("algorithm=ddp", "expected KEY=BASELINE..CANDIDATE"),
        ("bucket_cap_mb=1..4", "'bucket_cap_mb' is not swept in this run; swept: algorithm, world_size, shard_buckets"),
        (
            "algorithm=ddp..zero_no_overlap",
            "algorithm has no value 'ddp' in this run; it has hook_with_zero_step, hook_with_zero_step_interleaved,",
        ),
        ("world_size=2..2", "no two done cases differ only in world_size with these values; comparisons of "),
    ],
)
def test_pair_errors_name_what_exists(zero_run: Path, selector: str, message: str, capsys) -> None:
    assert run_cli(["compare", str(zero_run), "--pair", selector]) == 2
    assert message in " ".join(capsys.readouterr().err.split())


def test_too_few_rounds_are_inconclusive_and_verdicts_state_the_half_width(tmp_path: Path) -> None:
    run = make_run(tmp_path, {"ddp": [10, 11], "zero_no_overlap": [12, 13]})
    (p,) = compare.within_run(run).pairs
    assert p.result.verdict == compare.INCONCLUSIVE and "too few to judge (2 pairs; need 3)" in p.result.reason
    assert render.verdict_text(p.result) == "inconclusive: slower, too few to judge (2 pairs; need 3)"
    text = render.render_text(compare.within_run(run))
    assert "resolves" in text.splitlines()[3] and "the widest interval resolves ±" in text
    assert text.count("too few to judge") == 1  # said once: in the verdict, not again as a note


def test_huge_half_widths_read_in_three_figures_wherever_they_are_said(tmp_path: Path, capsys) -> None:
    """Two rounds far apart give a t interval on one degree of freedom quintillions of per cent wide:
    every output states a half-width through ``verdict.half_width_pct`` ("±8.42e+14%"), as
    ``signed_pct`` states a change, where each had a fixed format ("±842056629980018.5%")."""
    from types import SimpleNamespace

    from tpbench import verdict
    from tpbench.analysis.stats import Ratio
    from tpbench.cli.sweep import _print_batch
    from tpbench.record import Adaptive
    from tpbench.report import verdicts

    assert [verdict.half_width_pct(hw) for hw in (0.054, 0.52, 16539.12)] == ["±5.4%", "±52.0%", "±1.65e+06%"]
    run = make_run(tmp_path, {"ddp": [10, 10], "zero_no_overlap": [1, 1000]}, jitter=0.0)
    (p,) = compare.within_run(run).pairs
    said = verdict.half_width_pct(p.result.half_width)
    assert p.result.half_width > 1e3 and said.startswith("±") and "e+" in said
    assert f"the widest interval resolves {said}" in render.render_text(compare.within_run(run))
    assert verdicts.resolution([Ratio(1.0, 1 / 16540.12, 16540.12, 2, "paired")]) == "this run resolves ±1.65e+06%"
    record = SimpleNamespace(adaptive=Adaptive(target_ci=0.05, budget_s=60.0), wall_s=12.0)
    _print_batch(record, sweep.Batch(1, [], {"x": 2}, [("ddp", 8420566299800.185)]))
    assert "(widest ±8.42e+14%)" in capsys.readouterr().err


def test_the_sides_shown_are_the_values_whose_ratio_is_the_change(tmp_path: Path) -> None:
    """A side with two slow repeats in six: its median (10) is below the other's (12) while its
    geometric mean (14.4) is above it. The change is the ratio of geometric means, so the columns
    beside it (``compare``'s and the report's table of comparisons) show those, never two medians
    that move the other way from it."""
    import re

    from tpbench.report import build_report

    values = {"zero_no_overlap": [10, 10, 10, 10, 30, 30], "hook_with_zero_step": [12] * 6}
    run = make_run(tmp_path, values, jitter=0.0)
    (p,) = compare.within_run(run).pairs
    r = p.result
    assert (r.baseline_median, r.candidate_median) == (10, 12) and r.ratio < 1
    assert r.baseline_compared == pytest.approx(10 * 3 ** (1 / 3)) and r.candidate_compared == pytest.approx(12)
    assert r.candidate_compared / r.baseline_compared == pytest.approx(r.ratio)
    row = next(line for line in render.render_text(compare.within_run(run)).splitlines() if line.startswith("algo"))
    assert row.split()[4:7] == ["14.4", "12.0", "-16.8%"]  # 12 / 14.42
    doc = json.loads(render.render_json(compare.within_run(run)))
    assert doc["pairs"][0]["result"]["baseline_compared"] == pytest.approx(r.baseline_compared)
    html = build_report([sweep.finalize(store.Run.open(run))])
    table = re.sub(r"(<[^>]+>\s*)+", "|", html[html.index('id="comparisons"') :])
    assert "|hook_with_zero_step|zero_no_overlap|12|14.4|0.83|" in table  # candidate ms, baseline ms, ratio


def test_a_metric_at_zero_is_inconclusive_not_a_crash(tmp_path: Path, capsys) -> None:
    """A per-step column that counts nothing in a repeat (gc_collections, steal_pct: 0) has no log
    ratio: the pair is inconclusive with the reason, in every format, where ``compare RUN --metric``
    stopped with a ZeroDivisionError traceback."""
    run = make_run(
        tmp_path,
        {"ddp": [10, 11, 12], "zero_no_overlap": [12, 13, 14]},
        cpu_ms=lambda case: 0.0 if case.algorithm == "ddp" else 2.0,
    )
    (p,) = compare.within_run(run, metric="cpu_ms").pairs
    assert p.result.verdict == compare.INCONCLUSIVE and p.result.ratio is None
    assert p.result.reason == "a repeat's cpu_ms is 0: no ratio"
    for fmt in ("text", "md", "json"):
        assert run_cli(["compare", str(run), "--metric", "cpu_ms", "--format", fmt]) == 0
        assert "a repeat's cpu_ms is 0: no ratio" in capsys.readouterr().out
    assert run_cli(["compare", str(run), "--metric", "cpu_ms", "--fail-on-inconclusive"]) == 4


def test_runs_whose_candidate_counts_nothing_are_inconclusive(tmp_path: Path, capsys) -> None:
    """Runs compared by a metric the candidate recorded as 0 (steal_pct on an idle host): no ratio, as
    for a baseline at 0. It read "improvement: faster: -100.0% [-100.0%, -100.0%]", and the NaN
    half-width stopped ``--format json`` with a ValueError; paired by repeat it divided by zero."""
    base = make_run(tmp_path / "a", {"ddp": [10, 11, 12]}, cpu_ms=lambda case: 2.0)
    cand = make_run(tmp_path / "b", {"ddp": [10, 11, 12]}, cpu_ms=lambda case: 0.0, seed=1)
    (r,) = compare.compare_runs([base], [cand], metric="cpu_ms").cases
    assert (r.verdict, r.reason, r.ratio) == (compare.INCONCLUSIVE, "candidate median is 0: no ratio", None)
    assert run_cli(["compare", str(base), str(cand), "--metric", "cpu_ms", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["cases"][0]["reason"] == "candidate median is 0: no ratio"
    (r,) = compare.compare_runs([base], [cand], metric="cpu_ms", pairing="repeats").cases
    assert r.reason == "a candidate repeat's value is 0: no ratio"


def test_runs_compare_states_half_widths_too(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    base = make_run(tmp_path / "a", {"ddp": list(10 * (1 + 0.01 * rng.uniform(-1, 1, 6)))})
    cand = make_run(tmp_path / "b", {"ddp": list(10 * (1 + 0.01 * rng.uniform(-1, 1, 6)))}, seed=1)
    text = render.render_text(compare.compare_runs([base], [cand]))
    assert "pass: no difference shown, within the ±5% threshold" in text and "| resolves |" not in text
    assert "resolves" in text.splitlines()[4]


@pytest.mark.ranks
def test_real_sweep_compared_within(tmp_path: Path, capsys) -> None:
    suite = tmp_path / "suite.toml"
    suite.write_text(tiny_suite('algorithm = ["ddp", "zero_no_overlap"]', warmup_steps=3, repeats=3))
    assert run_cli(["sweep", str(suite), "--out", str(tmp_path / "results"), "--no-report"]) == 0
    capsys.readouterr()
    (run,) = (tmp_path / "results").glob("*/*")
    code = run_cli(["compare", str(run), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    (p,) = doc["pairs"]
    assert p["key"] == "algorithm" and (p["baseline_value"], p["candidate_value"]) == ("ddp", "zero_no_overlap")
    assert p["method"] == "paired" and p["result"]["pairs"] == 3 and p["result"]["half_width"] > 0
    assert code == compare.exit_code_of(doc["verdict"], False) and doc["verdict"] == p["result"]["verdict"]


# ---------------------------------------------------------------- adaptive sweeps (--target-ci)


def _adaptive_suite(tmp_path: Path) -> Path:
    suite = tmp_path / "suite.toml"
    suite.write_text(tiny_suite('algorithm = ["ddp", "zero_no_overlap"]', warmup_steps=3, repeats=3))
    return suite


def _record(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def _planned(tmp_path: Path, target: float) -> store.Run:
    """An adaptive run whose planned repeats have run (its budget still open), released by this process."""
    prepared = sweep.prepare(_adaptive_suite(tmp_path))
    run = sweep.start(prepared, tmp_path / "r")
    sweep.start_adaptive(run, target, 1e6)
    sweep.execute(run, prepared.cases, lambda kind, data: None)
    return run


@pytest.mark.slow  # rounds until a budget is spent (20-33 s): over CI's budget
@pytest.mark.ranks
def test_adaptive_sweep_adds_rounds_until_the_budget_is_spent(tmp_path: Path, capsys) -> None:
    """A target no run on this machine reaches: batches of rounds (each at most doubling the
    rounds there are) until the budget cannot pay for a world start and two more rounds, all
    recorded in run.json. The budget is set from the planned part's own time (2.5 times it: one
    more world start fits, a second after it does not), so the test does not depend on the
    machine's speed; --resume continues the adaptive loop where the run left it."""
    run = _planned(tmp_path, 0.001)
    run.set_adaptive(run.record.adaptive.to_json() | {"budget_s": 2.5 * run.record.wall_s})
    run.set_status("interrupted")
    run.lock.release()
    assert run_cli(["sweep", "--resume", str(run.dir), "--no-report"]) == 0
    assert "adaptive batch 1: 1 comparison(s) above ±0.1%" in capsys.readouterr().err
    meta = _record(run.dir)
    adaptive = meta["adaptive"]
    assert meta["status"] == "complete" and adaptive["state"] == "budget" and adaptive["target_ci"] == 0.001
    assert adaptive["batches"] and adaptive["wall_s"] == meta["wall_s"]
    first = adaptive["batches"][0]
    assert all(old == 3 and 3 + 2 <= new <= 6 for old, new in first["repeats"].values())
    repeats = {cid: c["params"]["repeats"] for cid, c in meta["cases"].items()}
    assert adaptive["rounds_added"] == {cid: n - 3 for cid, n in repeats.items()}
    assert len(set(repeats.values())) == 1  # one world: the cases keep running round by round
    before, after = adaptive["half_widths_before"][0], adaptive["half_widths_after"][0]
    assert before["pair"] == after["pair"] == "algorithm: ddp → zero_no_overlap" and before["method"] == "paired"
    # The summary and compare just see cases with more repeats.
    loaded = store.load(run.dir)
    assert [len(r) for r in loaded.summary["repeat_ids"]] == list(repeats.values())
    assert run_cli(["compare", str(run.dir), "--format", "json"]) in (0, 1)
    (p,) = json.loads(capsys.readouterr().out)["pairs"]
    assert p["result"]["pairs"] == max(repeats.values())


@pytest.mark.ranks
def test_adaptive_sweep_with_a_target_met_adds_nothing(tmp_path: Path, capsys) -> None:
    # 5 planned rounds, not 3: at 2 degrees of freedom the sequential rule's t quantile (about 12) lets
    # one noisy tiny round widen the interval past even ±10000 %; at 4 (about 5) it cannot.
    suite = tmp_path / "suite.toml"
    suite.write_text(tiny_suite('algorithm = ["ddp", "zero_no_overlap"]', warmup_steps=3, repeats=5))
    args = ["sweep", str(suite), "--out", str(tmp_path / "r"), "--no-report"]
    assert run_cli([*args, "--target-ci", "10000%", "--budget-s", "600"]) == 0
    said = capsys.readouterr().err
    assert "adaptive: target met; 1 of 1 comparison(s) resolve ±10000.0% (widest ±" in said
    assert "by the sequential rule, wider than a 95% interval), 0 repeat(s) added over 0 batch(es)" in said
    (run,) = (tmp_path / "r").glob("*/*")
    adaptive = _record(run)["adaptive"]
    assert adaptive["state"] == "met" and adaptive["batches"] == [] and adaptive["rounds_added"] == {}


def test_dry_run_of_an_adaptive_sweep_says_the_rounds_it_may_add(tmp_path: Path, capsys) -> None:
    """``sweep --target-ci 5% --budget-s 60 --dry-run`` listed the planned cases alone, the same as
    without the flags, though the sweep may then run many times their repeats; its resume's dry
    run says what the loop has left, and so does a fresh one now."""
    adaptive = ["--target-ci", "5%", "--budget-s", "60", "--dry-run"]
    assert run_cli(["sweep", str(_adaptive_suite(tmp_path)), *adaptive]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert (
        "2 cases; then up to 6 adaptive batch(es) of rounds until each comparison resolves ±5.0% or 60 s of "
        "worlds are spent (dry run)"
    ) in said, said


@pytest.mark.ranks
def test_dry_run_of_an_adaptive_run_cut_off_between_batches_says_the_loop_goes_on(tmp_path: Path, capsys) -> None:
    """Planned repeats done, the loop still running: no case is missing, yet --resume runs more
    batches. The dry run read "0 cases to resume" and nothing more, as if the run were whole."""
    run = _planned(tmp_path, 0.001)
    run.set_status("interrupted")
    run.lock.release()
    assert run_cli(["sweep", "--resume", str(run.dir), "--dry-run"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "0 cases to resume; the adaptive loop goes on: up to 6 more batch(es) within the budget left (" in said
    assert _record(run.dir)["adaptive"]["batches"] == []  # a dry run: nothing planned, nothing run


@pytest.mark.ranks
@pytest.mark.slow
def test_interrupted_adaptive_batch_resumes(tmp_path: Path, capsys) -> None:
    """A batch recorded and its cases extended, its world never run (what Ctrl-C right after
    ``next_batch`` leaves): --resume runs the pending repeats and closes the adaptive loop."""
    run = _planned(tmp_path, 0.001)
    batch = sweep.next_batch(run)
    assert batch is not None and sum(batch.added.values()) == 6 and all(c.repeats == 6 for c in batch.cases)
    run.set_status("interrupted")
    run.lock.release()
    meta = _record(run.dir)
    assert {c["status"] for c in meta["cases"].values()} == {"pending"}
    for cid in meta["cases"]:  # the planned repeats went back to parts, kept
        assert store.finished_repeats(run.dir, cid) == {0, 1, 2}
    # Budget: pay for this batch, not for another.
    meta["adaptive"]["budget_s"] = meta["wall_s"] + 1e-3
    (run.dir / "run.json").write_text(json.dumps(meta))
    assert run_cli(["sweep", "--resume", str(run.dir), "--no-report"]) == 0
    # The batch it finishes is named, as before the cut: its rounds ran under no batch line.
    said = " ".join(capsys.readouterr().err.split())
    assert "adaptive batch 1: 1 comparison(s) above ±0.1%" in said and "+3 round(s) for 2 case(s)" in said, said
    assert said.count("adaptive batch") == 1  # the budget pays for no batch after it
    meta = _record(run.dir)
    assert meta["status"] == "complete" and meta["adaptive"]["state"] == "budget"
    assert meta["adaptive"]["rounds_added"] == {cid: 3 for cid in meta["cases"]}
    steps = store.load(run.dir).steps
    assert sorted(steps["repeat"].unique()) == list(range(6))
    assert run_cli(["sweep", "--resume", str(run.dir), "--target-ci", "5%"]) == 2


@pytest.mark.ranks
def test_resuming_a_failed_case_of_an_adaptive_run_reopens_its_loop(tmp_path: Path, capsys) -> None:
    """The loop ended while a case had failed: no comparison (it said "target met; 0 of 0"). --resume ran the
    case again and kept that ending, its comparison never judged, run.json's half-widths after
    empty. Now the loop goes on from its record and ends again, here on its budget, with the
    comparison's half-width after."""
    suite = tmp_path / "suite.toml"
    suite.write_text(tiny_suite('algorithm = ["ddp", "zero_no_overlap"]', repeats=2))
    prepared = sweep.prepare(suite)
    run = sweep.start(prepared, tmp_path / "r")
    sweep.start_adaptive(run, 0.05, 1e6)
    done, failed = prepared.cases
    sweep.execute(run, [done], lambda kind, data: None)
    run.set_case(failed.case_id, store.FAILED, error="planted")
    # Ended with no comparison: said so, where it read "target met; 0 of 0 comparison(s)".
    assert sweep.next_batch(run) is None and run.record.adaptive.state == sweep.NO_COMPARISON
    from tpbench.cli.sweep import _print_adaptive

    _print_adaptive(run.record.adaptive)
    said = " ".join(capsys.readouterr().err.split())
    assert said.startswith("adaptive: no comparison among the finished cases") and "target met" not in said, said
    run.set_status("interrupted")
    run.lock.release()
    meta = _record(run.dir)
    meta["adaptive"]["budget_s"] = meta["wall_s"]  # spent: the loop ends at its first look after the resume
    (run.dir / "run.json").write_text(json.dumps(meta))
    assert run_cli(["sweep", "--resume", str(run.dir), "--no-report"]) == 0
    said = capsys.readouterr().err
    assert "adaptive: budget spent (" in said and "; 0 of 1 comparison(s) resolve ±5.0%" in said
    adaptive = _record(run.dir)["adaptive"]
    assert adaptive["state"] == "budget" and adaptive["half_widths_before"] == []
    (after,) = adaptive["half_widths_after"]
    assert after["pair"] == "algorithm: ddp → zero_no_overlap" and after["half_width"] > 0.05


def test_adaptive_ending_says_the_widest_half_width_by_its_rule(capsys) -> None:
    """The loop stops by the sequential rule's half-widths, wider than the 95 % interval a verdict
    gives: "0 of 1 comparison(s) resolve ±20.0%" stood above "this run resolves ±19.6%" with
    nothing to tell why. The line says the widest half-width it judged by, and by which rule."""
    from tpbench.cli.sweep import _print_adaptive
    from tpbench.record import Adaptive

    after = ({"pair": "algorithm: ddp → zero_no_overlap", "half_width": 0.303, "method": "paired"},)
    ended = {"target_ci": 0.2, "state": "budget", "half_widths_after": after, "rounds_added": {"a": 11}}
    _print_adaptive(Adaptive(**ended, budget_s=60, wall_s=61.2))
    assert (
        capsys.readouterr().err.split()
        == (
            "adaptive: budget spent (61 of 60 s); 0 of 1 comparison(s) resolve ±20.0% (widest ±30.3% by the "
            "sequential rule, wider than a 95% interval), 11 repeat(s) added over 0 batch(es)"
        ).split()
    )


def test_adaptive_ending_on_a_budget_left_too_small_says_how_much_was_left(capsys) -> None:
    """``--budget-s 60`` ended at 55 s, the 5 s left too few for two more rounds and the world start they need, and
    the line said "budget spent", which the 55 s in the closing line below it then contradicted."""
    from tpbench.cli.sweep import _print_adaptive
    from tpbench.record import Adaptive

    after = ({"pair": "algorithm: ddp → zero_no_overlap", "half_width": 0.34, "method": "paired"},)
    _print_adaptive(Adaptive(target_ci=0.05, budget_s=60, wall_s=55.3, state="budget", half_widths_after=after))
    said = " ".join(capsys.readouterr().err.split())
    assert said.startswith(
        "adaptive: budget spent (55 of 60 s; the 5 s left pay for fewer than 2 more rounds at this run's pace); 0 of 1"
    ), said


def test_adaptive_flags_are_checked(tmp_path: Path, capsys) -> None:
    suite = _adaptive_suite(tmp_path)
    assert run_cli(["sweep", str(suite), "--target-ci", "5%"]) == 2
    assert "--target-ci and --budget-s go together" in capsys.readouterr().err
    assert run_cli(["sweep", str(suite), "--target-ci", "0%", "--budget-s", "10"]) == 2
    assert "expected a percentage like 5%" in capsys.readouterr().err


def test_adaptive_sweep_without_a_comparison_is_refused(tmp_path: Path, capsys) -> None:
    """One case, or two that differ in two keys, make no comparison for rounds to narrow: it ran the
    planned repeats and said "target met; 0 of 0 comparison(s) resolve ±5.0%". Refused before
    anything runs (exit 2), its dry run too; two cases one key apart are not."""
    suite = tmp_path / "suite.toml"
    suite.write_text(tiny_suite('algorithm = ["ddp", "zero_no_overlap"]\nbatch_size = [8, 16]'))
    adaptive = ["--target-ci", "5%", "--budget-s", "60", "--out", str(tmp_path / "r"), "--no-report"]
    assert run_cli(["sweep", str(suite), "--set", 'algorithm=["ddp"]', "--set", "batch_size=8", *adaptive]) == 2
    assert "the sweep's one case makes no comparison for adaptive rounds to narrow" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    diagonal = [str(suite), "--filter", "id=" + "|".join(_diagonal_ids(suite)), *adaptive]
    assert run_cli(["sweep", *diagonal, "--dry-run"]) == 2
    assert "2 cases, no two one swept key apart, make no comparison" in capsys.readouterr().err
    assert run_cli(["sweep", str(suite), "--filter", "batch_size=8", *adaptive, "--dry-run"]) == 0


def _diagonal_ids(suite: Path) -> list[str]:
    """The ids of (ddp, batch 8) and (zero_no_overlap, batch 16): two cases two keys apart."""
    cases = sweep.prepare(suite).cases
    return [c.case_id for c in cases if (c.algorithm, c.batch_size) in {("ddp", 8), ("zero_no_overlap", 16)}]


def test_report_and_compare_match_the_same_cases(zero_run: Path, tmp_path: Path) -> None:
    """The report's algorithm comparisons (``verdicts.compare``) are pairs ``compare RUN_DIR`` lists
    too, moot keys and post-local SGD against plain DDP included."""
    from tpbench.algorithms import is_plain_ddp
    from tpbench.report import data as report_data
    from tpbench.report import verdicts

    def report_pairs(loaded: store.Loaded, kinds) -> set[tuple[str, str]]:
        rd = report_data.load([loaded])
        return {(c.baseline["case_id"], c.candidate["case_id"]) for k in kinds for c in verdicts.compare(rd, k)}

    loaded = sweep.finalize(store.Run.open(zero_run))
    mine = {(p.baseline_case, p.candidate_case) for p in compare.within_run(loaded).pairs if p.key == "algorithm"}
    assert report_pairs(loaded, verdicts.ZERO_KINDS) == mine and len(mine) == 12
    # And they say the same of each: one interval, one verdict, in the same words.
    words = {(p.baseline_case, p.candidate_case): p.result.words for p in compare.within_run(loaded).pairs}
    rd = report_data.load([loaded])
    said = {
        (c.baseline["case_id"], c.candidate["case_id"]): c.said.words
        for k in verdicts.ZERO_KINDS
        for c in verdicts.compare(rd, k)
    }
    assert said == {pair: words[pair] for pair in said}

    localsgd = sweep.finalize(
        store.Run.open(
            make_run(
                tmp_path,
                {"ddp": DRIFT, "post_localSGD_hook": scaled(0.9)},
                sweep={"start_localSGD_iter": '["never", 2]', "averaging_period": "[2, 4]"},
            )
        )
    )
    w = compare.within_run(localsgd)
    plain = {cid for cid, c in localsgd.record.cases.items() if is_plain_ddp(c.params)}
    mine = {(p.baseline_case, p.candidate_case) for p in w.pairs if p.baseline_case in plain}
    mine = {(b, c) for b, c in mine if c not in plain}
    assert report_pairs(localsgd, [verdicts.LOCALSGD_KIND]) == mine and len(mine) == 4
    assert {p.selector for p in w.pairs} == {
        "algorithm=ddp..post_localSGD_hook",
        "start_localSGD_iter=never..2",
        "averaging_period=2..4",
    }


def test_repeats_raised_by_an_adaptive_sweep_do_not_part_cases(tmp_path: Path) -> None:
    run = make_run(tmp_path, {"ddp": DRIFT, "zero_no_overlap": scaled(1.1)})
    meta = _record(run)
    cid = next(iter(meta["cases"]))
    meta["cases"][cid]["params"]["repeats"] = 9  # as if extended; its extra repeats never ran
    (run / "run.json").write_text(json.dumps(meta))
    assert compare.within_run(run).pairs == []  # repeats 6 vs 9 would be a second swept key
    meta["adaptive"] = {"planned_repeats": {c: 6 for c in meta["cases"]}}
    (run / "run.json").write_text(json.dumps(meta))
    (p,) = compare.within_run(run).pairs
    assert p.selector == "algorithm=ddp..zero_no_overlap" and p.result.ratio == pytest.approx(1.1, rel=0.02)


def test_report_and_compare_say_the_same_of_a_difference_not_shown_beyond_the_threshold(tmp_path: Path) -> None:
    """Interleaved 1–15% slower than sequential round by round: the interval excludes no change but
    reaches past the ±5% threshold. The report and ``compare RUN_DIR`` give it the same words, and
    neither says "could only resolve" of an interval that resolved a difference."""
    from tpbench.report import build_report, verdicts
    from tpbench.report import data as report_data

    slower = [1.02, 1.15, 1.05, 1.12, 1.01, 1.10]
    run = sweep.finalize(
        store.Run.open(
            make_run(
                tmp_path,
                {
                    "hook_with_zero_step": DRIFT,
                    "hook_with_zero_step_interleaved": [m * f for m, f in zip(DRIFT, slower)],
                },
                jitter=0.0,
            )
        )
    )
    (pair,) = compare.within_run(run).pairs
    (c,) = verdicts.compare(report_data.load([run]), verdicts.ZERO_KINDS[0])
    assert (pair.baseline_case, pair.candidate_case) == (c.baseline["case_id"], c.candidate["case_id"])
    assert 1 < c.lo < 1.05 < c.hi and (pair.result.ci_lo, pair.result.ci_hi) == (c.lo, c.hi)
    assert pair.result.words == c.said.words == "slower, not shown beyond the ±5% threshold"
    assert pair.result.verdict == compare.INCONCLUSIVE
    text = render.render_text(compare.within_run(run))
    assert "inconclusive: slower, not shown beyond the ±5% threshold" in text and "could only resolve" not in text
    html = build_report([run])
    assert f"{c.said.text} (this run resolves ±" in html and "could only resolve" not in html


def test_two_workloads_sharing_a_parameter_key_are_compared_on_workload(tmp_path: Path) -> None:
    """``workload = ["mlp", "resnet"]``: their parameter tables share keys of other values
    (``classes``, ``width``), which vary among the cases beside ``workload``. Counted as keys of
    their own, the two cases differed in three and ``compare RUN`` found nothing to compare; a
    workload's parameters vary only with it, so the pair differs in ``workload`` alone."""
    run = make_run(
        tmp_path,
        {"ddp": [10.0, 10.2, 9.9]},
        sweep={"workload": '["mlp", "resnet"]'},
        workloads={"mlp": {"width": 32, "depth": 2}, "resnet": {"preset": '"tiny"'}},
    )
    assert [p.key for p in compare.within_run(run).pairs] == ["workload"]
