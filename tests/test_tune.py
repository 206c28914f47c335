"""``tpbench tune``: the race on synthetic values (deterministic, no worlds), its options, and real
planted tunes on 2 Gloo ranks (a 40 % slower arm, a budget that runs out, a SIGKILL and a resume)."""

from __future__ import annotations

import dataclasses
import html
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from conftest import REPO, localsgd_suite, only_run, run_cli, tiny_suite

from tpbench import launch, store, sweep, tune, tune_answer, tune_trace, verdict
from tpbench.analysis.stats import slowest_rank
from tpbench.racing import ALL_TIED, BUDGET, MAX_ROUNDS, MIN_ROUNDS, ONE_LEFT, Options, Race, supported_epsilon
from tpbench.record import LauncherRecord, SuiteSource
from tpbench.report import recommendation
from tpbench.report.html import Page
from tpbench.suite import expand, labels, parse, select
from tpbench.tune_record import TuneArm, TuneResult, TuneRound


def synthetic(factors: dict[str, float], rounds: int, noise: float = 0.01, seed: int = 0) -> dict:
    """Arm → round → value: a common per-round machine state (what pairing cancels) times the
    arm's factor times its own small noise."""
    rng = np.random.default_rng(seed)
    common = rng.lognormal(0, 0.2, rounds)  # the machine: 20 % swings between rounds
    return {a: {r: 10 * f * common[r] * rng.lognormal(0, noise) for r in range(rounds)} for a, f in factors.items()}


def stored(tmp_path, suite) -> SimpleNamespace:
    """What ``tune._result`` reads of a run that synthetic races did not store: its directory and
    the suite it was started from. Its results root (``tmp_path``'s grandparent) is not the default
    ``results``: the commands a tune names give it (``--out``)."""
    source = SuiteSource("s", str(suite), "")
    return SimpleNamespace(dir=tmp_path, record=SimpleNamespace(suite=source, launcher=LauncherRecord()))


def tuned_run(run_dir: Path) -> SimpleNamespace:
    """What the report's Recommendation reads of a run (``store.Loaded``): its directory, its id and
    its tune.json, read as ``Loaded.tune`` reads it."""
    return SimpleNamespace(run_dir=run_dir, record=SimpleNamespace(run_id="r"), tune=store.read_tune(run_dir))


def write_tune_json(run_dir: Path, doc: dict) -> None:
    """``doc`` as the run's tune.json, versioned as the store versions it: a record no tune would write."""
    (run_dir / store.TUNE_FILE).write_text(json.dumps({"schema_version": store.SCHEMA_VERSION, **doc}))


# The summary of a run whose workload evaluates no held-out loss (the mlp): no arm has one.
NO_EVAL = pd.DataFrame(columns=["case_id"])
# An arm of the answer without a ratio to the recommended one, nor an elimination.
NO_RATIO = {"ratio": None, "lo": None, "hi": None, "eliminated_at": None}


def _racing_arms(*ids: str) -> list[TuneArm]:
    """Arms of 3 rounds named by ``ids``, the first recommended: for the time-to-target note's tests."""
    return [
        TuneArm(
            case_id=cid,
            label=cid,
            params={},
            status=tune_answer.RECOMMENDED if cid == ids[0] else "racing",
            rounds=3,
            **NO_RATIO,
        )
        for cid in ids
    ]


def run_race(race: Race, values: dict, stop_after: int | None = None) -> Race:
    """Feed the race round by round, as the conductor does, skipping eliminated and retired arms;
    ``stop_after`` rounds at most, as a tune interrupted then left it."""
    for r in range(stop_after or race.max_rounds):
        for a in list(race.live):
            race.record(a, r, values[a][r])
        while race.round_complete():
            race.close_round()
        if race.ended:
            break
    return race


def test_race_eliminates_a_clearly_slower_arm_at_the_first_look_and_names_the_best():
    values = synthetic({"best": 1.0, "slow": 1.4, "slower": 2.0}, 30)
    race = run_race(Race(list(values), 30, Options(min_rounds=5), comparisons=2), values)
    assert race.ended == ONE_LEFT and race.live == ["best"]
    assert race.eliminated == {"slow": 5, "slower": 5}  # no look before min_rounds, decided at the first
    assert [e["round"] for e in race.history] == [1, 2, 3, 4, 5]


def test_seven_planted_arms_pool_their_variance_so_the_slow_ones_go_at_the_first_look():
    """The planted suite's shape (0–40 % slower arms, 2 % noise per round): with the variance pooled
    over the live arms, every arm 10 % or more slower is out at the first look, and the race ends
    tied on the best arm long before its 30 rounds, at a fraction of the grid's cost (each arm's
    rounds are those it really ran: a retired arm's stop with it)."""
    factors = {f"s{p}": 1 + p / 100 for p in (0, 3, 6, 10, 15, 25, 40)}
    values = synthetic(factors, 30, noise=0.02)
    race = run_race(Race(list(values), 30, Options(epsilon=0.02), comparisons=6), values)
    assert race.ended == ALL_TIED and race.leader() == "s0" and race.rounds < 15
    assert all(race.eliminated[f"s{p}"] == MIN_ROUNDS for p in (10, 15, 25, 40)), race.eliminated
    rounds = {a: len(race.values[a]) for a in factors}
    cost = sum(rounds[a] * f for a, f in factors.items()) / (30 * sum(factors.values()))
    assert cost < 0.25, (cost, rounds)


def test_race_ties_arms_within_epsilon_and_keeps_unresolved_ones_to_the_last_round():
    tied = run_race(Race(["a", "b"], 40, Options(epsilon=0.05), comparisons=1), synthetic({"a": 1.0, "b": 1.005}, 40))
    assert tied.ended == ALL_TIED and len(tied.live) == 1 and {*tied.live, *tied.retired} == {"a", "b"}
    # 1.5 % apart with 1 % noise per round and a 0.5 % margin: neither tied nor separable in 12 rounds.
    close = run_race(
        Race(["a", "b"], 12, Options(epsilon=0.005), comparisons=1),
        synthetic({"a": 1.0, "b": 1.015}, 12, noise=0.02),
    )
    assert close.ended == MAX_ROUNDS and close.rounds == 12 and len(close.live) == 2
    assert close.rounds_to_decide() is not None


def test_an_arm_that_cannot_be_epsilon_faster_retires_and_runs_no_more_rounds():
    """Three arms, 2 % noise, a 2 % margin: the 4 % slower arm can no longer be 2 % faster than the
    leader long before the identical twin of the best is tied, so it is retired (tied: it runs no
    more rounds and costs nothing more) while the two others race on; the race ends tied when the
    leader alone is left running (by then the retired arm may have been shown slower, on its own
    rounds judged by the variance of all of them: eliminated)."""
    values = synthetic({"a": 1.0, "b": 1.0, "c": 1.04}, 60, noise=0.02, seed=1)
    race = run_race(Race(list(values), 60, Options(epsilon=0.02), comparisons=2), values)
    assert race.ended == ALL_TIED and len(race.live) == 1
    assert any("c" in e["retired"] for e in race.history) and len(race.values["c"]) < race.rounds / 2
    assert {*race.retired, *race.eliminated} == {"a", "b", "c"} - set(race.live)
    entry = next(e for e in race.history if "c" in e["retired"])
    assert 1 / 1.02 <= entry["intervals"]["c"][1] <= 1  # retired, not eliminated: not shown slower


def test_a_retired_arm_comes_back_when_a_new_leader_is_not_safe_from_it():
    """y leads x and z over the first three rounds; z (3 % behind y) is retired, x (2 % behind) may
    still be more than 2 % faster and races on. Then x turns 10 % faster and takes the lead. Over
    the rounds z ran, x was slower than y, so z may be more than 2 % faster than the new leader:
    the retirement is undone, z runs again from the next round (its rounds have a gap where it
    sat out) and is raced against x until the evidence decides it. A retirement against a leader
    that later changed would otherwise stack one epsilon on another."""
    base = {"y": 1.00, "x": 1.02, "z": 1.03}
    residual = {"y": [0.008, -0.008, 0.0], "x": [-0.008, 0.008, 0.0], "z": [0.0, 0.0, 0.0]}
    race = Race(["y", "x", "z"], 12, Options(epsilon=0.02, min_rounds=2), comparisons=2)
    for r in range(12):
        for a in list(race.live):
            f = 0.90 if a == "x" and r >= 3 else base[a]
            race.record(a, r, 10 * f * np.exp(residual[a][r] if r < 3 else 0.0))
        while race.round_complete():
            race.close_round()
        if race.ended:
            break
    by_round = {e["round"]: e for e in race.history}
    assert by_round[3]["retired"] == ["z"] and by_round[3]["leader"] == "y"
    assert by_round[4]["leader"] == "x" and by_round[4]["back"] == ["z"]
    assert 3 not in race.values["z"] and 4 in race.values["z"]  # sat out round 3, ran again from 4
    assert race.ended == ALL_TIED and race.live == ["x"] and "z" in race.retired
    assert race.interval("x", "z").lo >= 1 / 1.02  # safe from the leader the race ended with


def test_every_retired_arm_is_safe_from_the_leader_the_race_ends_with():
    """100 seeded races of five arms 0–5 % apart, 3 % noise, a 1 % margin: leaders change while arms
    sit retired, and some retirements are undone. Whenever a race ends tied, every retired arm's
    interval against the final leader, over the rounds it ran, still shows that it cannot be more
    than epsilon faster: the claim is about the leader the race ends with, not one it had."""
    factors = {"a": 1.0, "b": 1.01, "c": 1.02, "d": 1.03, "e": 1.05}
    comebacks = tied = 0
    for seed in range(100):
        values = synthetic(factors, 60, noise=0.03, seed=seed)
        race = run_race(Race(list(values), 60, Options(epsilon=0.01), comparisons=4), values)
        comebacks += sum(len(e["back"]) for e in race.history)
        if race.ended == ALL_TIED:
            tied += 1
            (leader,) = race.live
            assert all(race.interval(leader, a).lo >= 1 / 1.01 for a in race.retired), seed
    assert comebacks > 0 and tied > 20  # the case this test is about did happen


def test_a_far_slower_arm_retired_early_is_still_eliminated_not_called_tied():
    """Seven arms as a loaded machine measured the planted suite (the 40 % arm about 1.35, 6 % noise
    per round): at the first look the intervals are at their widest, and the slowest arm's low end
    is often just under 1, so it is retired. Its rounds are fixed from then on, but the variance they
    are judged by is pooled over every value the race gathers, and its interval narrows until it is
    shown slower: over 40 seeded races it is eliminated every time, after fewer rounds than the
    leader ran."""
    factors = dict(zip("abcdefg", (1.0, 1.055, 1.07, 1.095, 1.18, 1.21, 1.345)))
    late = 0
    for seed in range(40):
        values = synthetic(factors, 120, noise=0.06, seed=seed)
        race = run_race(Race(list(values), 120, Options(epsilon=0.02), comparisons=6), values)
        assert "g" in race.eliminated and len(race.values["g"]) < race.rounds, (seed, race.retired)
        if len(race.values["g"]) < race.eliminated["g"]:  # retired first, then shown slower
            late += 1
            assert race.retired_then_out["g"] == len(race.values["g"]) and "g" not in race.retired
    assert late > 0  # the case this test is about did happen


def test_the_tie_is_one_sided_the_claim_needs_no_arm_that_may_be_more_than_epsilon_faster():
    """1.5 % apart with 1 % noise and a 2 % margin: the race ends tied as soon as the slower arm
    cannot be more than 2 % faster than the leader, although its interval still reaches past +2 %
    (a two-sided tie would race on; the claim "within 2 % of the best" does not need it)."""
    values = synthetic({"a": 1.0, "b": 1.015}, 40)
    race = run_race(Race(["a", "b"], 40, Options(epsilon=0.02), comparisons=1), values)
    assert race.ended == ALL_TIED and race.leader() == "a"
    _, lo, hi = race.history[-1]["intervals"]["b"]
    assert lo >= 1 / 1.02 and hi > 1.02


def test_a_tie_is_never_claimed_for_a_leader_more_than_epsilon_slower_than_the_best():
    """200 seeded races of arms 0, 3 and 5 % apart, 3 % noise per round, a 2 % margin: a claim
    (tied or one left) whose leader is not the true best would be false; at 95 % confidence at most
    1 in 20 may be, and the union bound makes it far rarer."""
    false = 0
    for seed in range(200):
        values = synthetic({"a": 1.0, "b": 1.03, "c": 1.05}, 40, noise=0.03, seed=seed)
        race = run_race(Race(list(values), 40, Options(epsilon=0.02), comparisons=2), values)
        false += race.ended in (ALL_TIED, ONE_LEFT) and race.leader() != "a"
    assert false <= 2


def close_pair(tmp_path) -> tuple:
    """A suite of two arms 1.5 % apart, its cases, and 12 rounds of their values at 2 % noise: with a
    0.5 % margin, a race that ends unresolved."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 1.5]", repeats=12))
    cases = tune.prepare(suite).cases
    return suite, cases, synthetic({c.case_id: 1 + c.slowdown_pct / 100 for c in cases}, 12, noise=0.02)


def test_an_unresolved_tune_says_the_margin_its_rounds_do_show(tmp_path):
    """1.5 % apart, 2 % noise, a 0.5 % margin and 12 rounds: unresolved, and the claim says what the
    rounds did resolve, the leader at most 1 / lo − 1 slower than the arm left beside it."""
    suite, cases, values = close_pair(tmp_path)
    options = Options(epsilon=0.005)
    race = run_race(Race(list(values), 12, options, comparisons=1), values)
    result = tune_answer.result(stored(tmp_path, suite), cases, [race], options, 0.0, NO_EVAL)
    assert result.state == "unresolved"
    (other,) = [a for a in result.arms if a.status == "unresolved"]
    assert result.supported_epsilon == pytest.approx(1 / other.lo - 1) and result.supported_epsilon > 0.005
    assert f"the rounds run show it within {result.supported_epsilon:.1%} of the best" in result.claim
    assert result.to_json()["supported_epsilon"] == result.supported_epsilon


def test_an_unresolved_tune_says_what_to_run_to_decide_it(tmp_path, capsys):
    """Out of rounds: the same suite again with the rounds the estimate says would decide it, and
    this tune's own options; out of budget: a budget scaled to those rounds, and the repeats it had
    where they suffice. Printed under the table, in the report, in JSON as ``next_step``."""
    from tpbench.cli import tune as cli

    suite, cases, values = close_pair(tmp_path)
    options = Options(epsilon=0.005)
    race = run_race(Race(list(values), 12, options, comparisons=1), values)
    result = tune_answer.result(stored(tmp_path, suite), cases, [race], options, 30.0, NO_EVAL)
    rounds = 12 + result.rounds_to_decide
    # The estimate is for a race given that many rounds, its confidence spent over more looks (each
    # interval wider: more rounds), and settled: a race that long needs no more.
    assert race.rounds_to_decide(1000) > race.rounds_to_decide() and 12 + race.rounds_to_decide(rounds) <= rounds
    # --out: the tune's own results root; pasted without it, the race went to ./results.
    said_next = f"tpbench tune {suite} --out {tmp_path.parent.parent} --set repeats={rounds} --epsilon 0.5%"
    assert result.rounds_to_decide > 0 and result.next_step == said_next
    assert result.to_json()["next_step"] == result.next_step
    assert result.decide_wall_s is None  # values made up here, no step timed: no estimate of how long
    cli.print_tune(result, "text")
    assert f"race again from the start for about {rounds} rounds" in capsys.readouterr().out.replace("\n", " ")
    cli.print_tune(result, "md")  # a paragraph of its own, not run on from the cost line's
    md = capsys.readouterr().out
    assert f"wall 30 s\n\nTo decide it, race again from the start for about {rounds} rounds" in md
    store.write_tune(tmp_path, dataclasses.replace(tune._record(options, [race], 30.0), result=result))
    page = Page("tune")
    recommendation.section(page, [tuned_run(tmp_path)])
    html = page.render()
    assert f"race again from the start for about {rounds} rounds" in html and result.next_step in html

    budget = Options(epsilon=0.005, budget_s=30.0)
    race = _ended_by_budget(values, budget)
    result = tune_answer.result(stored(tmp_path, suite), cases, [race], budget, 30.0, NO_EVAL)
    rounds = 6 + result.rounds_to_decide
    assert rounds <= 200 and f"--set repeats=200 --epsilon 0.5% --budget-s {math.ceil(30.0 * rounds / 6)}" in (
        result.next_step
    )


def _ended_by_budget(values, options: Options) -> Race:
    """A race of the suite's 200 rounds that the budget ended after 6."""
    race = Race(list(values), 200, options, comparisons=1)
    for r in range(6):
        for a in race.live:
            race.record(a, r, values[a][r])
        race.close_round()
    race.end(BUDGET)
    return race


def test_the_rounds_to_race_again_agree_with_the_repeats_the_command_gives(tmp_path, capsys):
    """A budget that ended the race after 6 of the suite's 200 rounds: the advice said "race again for
    about 20 rounds" beside a command of ``--set repeats=200`` (the suite's own, kept). Now the
    sentence says the command keeps this tune's 200 as the most, in the terminal, Markdown and report
    (not "the suite's": a tune's repeats may be its own ``--set repeats``, not the suite file's); a
    tune out of rounds, whose command gives just the rounds it names, says nothing more."""
    from tpbench.cli import tune as cli

    suite, cases, values = close_pair(tmp_path)
    budget = Options(epsilon=0.005, budget_s=30.0)
    race = _ended_by_budget(values, budget)
    result = tune_answer.result(stored(tmp_path, suite), cases, [race], budget, 30.0, NO_EVAL)
    rounds = 6 + result.rounds_to_decide
    assert rounds < 200 and "--set repeats=200 " in result.next_step and result.to_json()["next_repeats"] == 200
    said = f"race again from the start for about {rounds} rounds (the command keeps this tune's 200 as the most; "
    said += "under the same"
    cli.print_tune(result, "text")
    assert said in capsys.readouterr().out.replace("\n", " ")
    cli.print_tune(result, "md")
    assert said in capsys.readouterr().out
    store.write_tune(tmp_path, dataclasses.replace(tune._record(budget, [race], 30.0), result=result))
    page = Page("tune")
    recommendation.section(page, [tuned_run(tmp_path)])
    assert said in html.unescape(page.render())
    assert verdict.decide_words(20, 45.0, 200) == (
        "To decide it, race again from the start for about 20 rounds (the command keeps this tune's 200 as the most; "
        "20 take at most about 45 s here at this tune's pace; under the same launcher): "
    )
    assert verdict.decide_words(240, 45.0, 240) == verdict.decide_words(240, 45.0)


def test_an_unresolved_claim_says_the_open_arms_may_be_faster_one_sided(tmp_path):
    """The arms left open said "1 still within reach of it at 95% confidence and ±0.5%", a two-sided
    reading, where an arm stays open only while it may be more than epsilon faster (the tie is
    one-sided: one that may only be slower does not threaten the claim)."""
    suite, cases, values = close_pair(tmp_path)
    options = Options(epsilon=0.005)
    race = run_race(Race(list(values), 12, options, comparisons=1), values)
    result = tune_answer.result(stored(tmp_path, suite), cases, [race], options, 30.0, NO_EVAL)
    (other,) = [a for a in result.arms if a.status == "unresolved"]
    assert other.lo < 1 / 1.005  # what keeps it open: it may be more than 0.5% faster
    assert "unresolved (all 12 rounds run): 1 may still be over 0.5% faster at 95% confidence, " in result.claim
    assert "±" not in result.claim


def test_the_text_answer_keeps_its_cost_on_stdout(tmp_path, capsys):
    """``tpbench tune ... > answer.txt`` lost the cost line ("wall N s; timed steps ..."), printed on
    stderr with the run directory, while Markdown and JSON keep it in the answer. Now the claim,
    the table and the cost are on stdout, and only where the run lies goes to stderr."""
    from tpbench.cli import tune as cli

    suite, cases, values = close_pair(tmp_path)
    options = Options(epsilon=0.005)
    race = run_race(Race(list(values), 12, options, comparisons=1), values)
    result = tune_answer.result(stored(tmp_path, suite), cases, [race], options, 30.0, NO_EVAL)
    cli.print_tune(result, "text")
    said = capsys.readouterr()
    assert result.claim in said.out and "wall 30 s" in said.out and "wall" not in said.err
    assert said.err == f"Run directory: {result.run_dir}\n"
    # Markdown and JSON end stderr with the tune's run directory too: after --trace, the last one said
    # was the trace sweep's, and a script taking the last "Run directory:" line got the wrong run.
    for fmt in ("md", "json"):
        cli.print_tune(result, fmt)
        said = capsys.readouterr()
        assert said.err == f"Run directory: {result.run_dir}\n" and "Run directory" not in said.out
        if fmt == "json":
            assert json.loads(said.out)["claim"] == result.claim


def test_a_cpu_ms_tune_says_its_ratios_are_cpu_time_in_text_and_markdown(tmp_path, capsys):
    """``--metric cpu_ms``: the claim, the table's headings and the cost line read exactly as a step_ms
    tune's, so a reader of the text or Markdown took the ratios for wall time (only the JSON and the
    report named the metric). Now the ratio column and the cost line say what was raced."""
    from tpbench.cli import tune as cli

    suite, cases, values = close_pair(tmp_path)
    said = {}
    for metric in ("step_ms", "cpu_ms"):
        options = Options(epsilon=0.005, metric=metric)
        race = run_race(Race(list(values), 12, options, comparisons=1), values)
        result = tune_answer.result(stored(tmp_path, suite), cases, [race], options, 30.0, NO_EVAL)
        cli.print_tune(result, "md")
        said[metric] = capsys.readouterr().out
        cli.print_tune(result, "text")
        said[metric, "text"] = capsys.readouterr().out.replace("\n", " ")
    assert "| vs recommended (CPU time per step) |" in said["cpu_ms"]
    assert "\nwall 30 s; the ratios are of CPU time per step (--metric cpu_ms)\n" in said["cpu_ms"]
    assert "wall 30 s; the ratios are of CPU time per step (--metric cpu_ms)" in said["cpu_ms", "text"]
    assert "| vs recommended |" in said["step_ms"] and "CPU" not in said["step_ms"] + said["step_ms", "text"]


def test_a_budget_spent_before_the_first_look_says_nothing_was_judged(tmp_path, capsys):
    """``--budget-s 1`` on the smoke suite: its first round outlasts the budget and the race ends
    after it, before ``--min-rounds``. The claim said "1 may still be over 2% faster at 95% confidence"
    and nothing more, as if a look had found it so; no interval, no estimate. It named no command
    either, where every other unresolved tune does: now the suite's rounds with the time they take
    at this tune's pace (14 s a round here: 12 rounds, 168 s)."""
    from tpbench.cli import tune as cli

    suite, cases, values = close_pair(tmp_path)
    budget = Options(budget_s=1.0)
    said = {}
    for rounds in (1, 3):
        race = Race(list(values), 12, budget, comparisons=1)
        for r in range(rounds):
            for a in race.live:
                race.record(a, r, values[a][r])
            race.close_round()
        race.end(BUDGET)
        said[rounds] = tune_answer.result(stored(tmp_path, suite), cases, [race], budget, 14.0, NO_EVAL)
    assert said[1].claim.endswith(
        "; nothing was judged: the budget ran out after 1 round, before the 3 the race judges from (--min-rounds)"
    )
    assert "nothing was judged" not in said[3].claim  # judged at round 3: its intervals say the rest
    early = said[1]
    said_next = f"tpbench tune {suite} --out {tmp_path.parent.parent} --set repeats=12 --budget-s 168"
    assert early.rounds_to_decide is None and early.next_step == said_next
    cli.print_tune(early, "text")
    assert f"To judge it, race again with the time its rounds take (under the same launcher): {early.next_step}" in (
        capsys.readouterr().out.replace("\n", "")
    )


def test_a_tiny_margin_at_ten_nines_says_what_would_decide_it_in_the_words_it_was_asked(tmp_path):
    """``--epsilon 0.01% --confidence 0.9999999999`` (how docs/tune-runs.md runs every arm for fixed
    rounds): the race ends unresolved, and the rounds that would decide it run to millions, where a
    confidence spent over that many looks rounds to exactly 1.0 and had no normal quantile (the tune
    failed with a traceback after its last round). The command it names repeats the options as
    given ("100%" would be refused), and the wait reads in days."""
    suite, cases, values = close_pair(tmp_path)
    options = Options(epsilon=0.0001, confidence=0.9999999999)
    race = run_race(Race(list(values), 12, options, comparisons=1), values)
    assert race.rounds_to_decide(10**9) > race.rounds_to_decide() > 1000
    result = tune_answer.result(stored(tmp_path, suite), cases, [race], options, 30.0, NO_EVAL)
    assert result.state == "unresolved"
    assert result.next_step.endswith("--epsilon 0.01% --confidence 99.99999999%")
    # A real 2-arm tune at these options, after 4 rounds: "[-100.0%, +3.66e+56%]", not 57 digits.
    assert verdict.signed_pct(3.66e54) == "+3.66e+56%" and verdict.signed_pct(1.09) == "+9.0%"
    assert [verdict.duration(s) for s in (45, 600, 7200, 12855 * 60)] == ["45 s", "10 min", "2 h", "9 days"]


def test_only_the_commands_that_read_tune_json_refuse_a_damaged_one(tmp_path, capsys):
    """``whatif`` of a tune's untraced run read tune.json only to word its "no case was traced" error,
    and so exited on the damaged file instead. As ``compare`` and ``export`` (which never read it),
    it now does its own job; the report, whose Recommendation is tune.json's, refuses it naming it."""
    from synthetic_runs import make_run

    run_dir = make_run(tmp_path / "r", {"ddp": [10.0, 11.0], "zero_no_overlap": [12.0, 12.5]})
    sweep.finalize(store.Run.open(run_dir))  # its summary, as a tune leaves it
    (run_dir / store.TUNE_FILE).write_text("{not json")
    assert run_cli(["whatif", str(run_dir)]) == 3
    err = capsys.readouterr().err
    assert "no case was traced (a tune traces nothing)" in err and store.TUNE_FILE not in err, err
    assert run_cli(["compare", str(run_dir)]) in (0, 1, 4)
    assert run_cli(["export", "--format", "pytest-benchmark", str(run_dir)]) == 0
    assert store.TUNE_FILE not in capsys.readouterr().err
    assert run_cli(["report", str(run_dir), "-o", str(tmp_path / "report.html")]) == 3
    assert f"{run_dir / store.TUNE_FILE}: unreadable" in capsys.readouterr().err


def test_the_tune_record_reads_back_equal_to_what_was_written(tmp_path):
    """tune.json is one typed record (``TuneRecord``) from the race to its readers: written, read back
    equal field for field, the answer in it ``Result.to_json``'s object (``--format json``'s)."""
    suite, cases, values = close_pair(tmp_path)
    options = Options(epsilon=0.005, budget_s=60.0)
    race = run_race(Race(list(values), 12, options, comparisons=1), values)
    result = tune_answer.result(stored(tmp_path, suite), cases, [race], options, 30.0, NO_EVAL)
    where = {"run_dir": "elsewhere", "arms": [], "sentence": None}
    record = dataclasses.replace(tune._record(options, [race], 30.0), result=dataclasses.replace(result, where=where))
    store.write_tune(tmp_path, record)
    assert store.read_tune(tmp_path) == record and record.result.to_json() == result.to_json() | {"where": where}
    interrupted = tune._record(options, [race], 12.5)  # no answer yet: no "result" key
    store.write_tune(tmp_path, interrupted)
    assert store.read_tune(tmp_path) == interrupted and not tune.had_ended(interrupted)
    assert "result" not in json.loads((tmp_path / store.TUNE_FILE).read_text())


def test_a_tune_json_written_before_the_record_reads_and_writes_back_the_same(tmp_path):
    """A real tune's tune.json (two worlds, unresolved: tests/fixtures/tunes), written before
    ``TuneRecord`` existed, still reads, and written back from the record is the same file, byte for
    byte: the record writes tune.json's keys as they were, in their order."""
    fixture = REPO / "tests" / "fixtures" / "tunes" / "two_worlds_unresolved.json"
    (tmp_path / store.TUNE_FILE).write_bytes(fixture.read_bytes())
    saved = store.read_tune(tmp_path)
    assert saved.options == Options() and set(saved.worlds) == {"0", "1"} and len(saved.history) == 8
    assert saved.result.state == "unresolved" and len(saved.result.worlds) == 2 and saved.result.where is None
    assert {a.status for a in saved.result.arms} <= {"unresolved", "tied", "eliminated", "recommended"}
    store.write_tune(tmp_path, saved)
    assert (tmp_path / store.TUNE_FILE).read_bytes() == fixture.read_bytes()
    page = Page("tune")
    recommendation.section(page, [tuned_run(tmp_path)])
    assert html.escape(saved.result.claim) in page.render()
    # Damaged, it is refused naming the file and the key; of another version, naming the version.
    doc = json.loads(fixture.read_text())
    doc["history"][3]["intervals"] = {"x": [1.0, "low", 2.0]}
    write_tune_json(tmp_path, {k: v for k, v in doc.items() if k != "schema_version"})
    with pytest.raises(store.StoreError, match=r"tune\.json: 'history'\[3\] 'intervals' 'x' = \[1\.0, 'low', 2\.0\]"):
        store.read_tune(tmp_path)
    (tmp_path / store.TUNE_FILE).write_text(json.dumps(doc | {"schema_version": 2}))
    with pytest.raises(store.StoreError, match=r"tune\.json: expected a tune record of schema_version 1"):
        store.read_tune(tmp_path)


def test_a_tune_json_of_the_wrong_shape_is_refused_naming_the_file(tmp_path, capsys):
    """Valid JSON of the wrong shape gave tracebacks (exit 1) in ``tune --resume`` and the report;
    now exit 3 naming tune.json, as for run.json. An interrupted tune's report says how to resume it."""
    from synthetic_runs import make_run

    suite, cases, values = close_pair(tmp_path)
    options = Options(epsilon=0.005)
    race = run_race(Race(list(values), 12, options, comparisons=1), values)
    result = tune_answer.result(stored(tmp_path, suite), cases, [race], options, 30.0, NO_EVAL)
    good = dataclasses.replace(tune._record(options, [race], 30.0), result=result).to_json()
    run_dir = make_run(tmp_path / "r", {"ddp": [10.0, 11.0]})
    sweep.finalize(store.Run.open(run_dir))  # its summary, as a tune leaves it
    for broken in (
        {"options": 5},
        {"options": {"epsilon": 0.02, "patience": 3}},
        {"options": {"epsilon": "two"}},
        {"worlds": []},
        {"history": {}},
        {"wall_s": "long"},
        {"result": {"claim": 5, "arms": "zz"}},
        {"result": good["result"] | {"arms": [{"case_id": "x"}]}},
        {"result": good["result"] | {"recommended": {"case_id": "x", "label": "x", "params": {}}}},  # no such arm
    ):
        write_tune_json(run_dir, good | broken)
        for cmd in (["tune", "--resume"], ["report"]):
            assert run_cli([*cmd, str(run_dir)]) == 3, broken
            assert f"{run_dir / store.TUNE_FILE}: " in capsys.readouterr().err
    write_tune_json(run_dir, good | {"result": None})  # interrupted: its rounds so far, no answer
    assert run_cli(["report", str(run_dir), "-o", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    page = " ".join(html.unescape(page).split())
    assert "Interrupted race: no recommendation. This tune stopped after round 12 (interrupted, or still" in page
    assert f"Resume it with tpbench tune --resume {run_dir}." in page


def test_the_commands_a_tune_names_make_the_settings_it_raced(tmp_path):
    """A tune started with ``--set`` and ``--filter`` named a next race without them (it raced all
    seven arms of a suite filtered to two) and a trace sweep without its ``--set`` (other case ids:
    no case matched). run.json keeps both; ``repeats`` is each command's own."""
    suite, cases, values = close_pair(tmp_path)
    options = Options(epsilon=0.005)
    race = run_race(Race(list(values), 12, options, comparisons=1), values)
    source = SuiteSource("s", str(suite), "", None, ("batch_size=256", "repeats=12"), ("slowdown_pct=0|1",))
    record = SimpleNamespace(suite=source, launcher=LauncherRecord())
    run = SimpleNamespace(dir=Path("results/s/run"), record=record)  # the default root
    result = tune_answer.result(run, cases, [race], options, 30.0, NO_EVAL)
    rounds = 12 + result.rounds_to_decide
    assert shlex.split(result.next_step) == [
        *("tpbench", "tune", str(suite), "--set", "batch_size=256", "--filter", "slowdown_pct=0|1"),
        *("--set", f"repeats={rounds}", "--epsilon", "0.5%"),
    ]
    assert shlex.split(result.trace_step)[:6] == ["tpbench", "sweep", str(suite), "--set", "batch_size=256", "--filter"]
    # Under a results root of its own (--out), each command names it, so that a pasted one writes beside it.
    run.dir = tmp_path / "my results" / "s" / "run"
    result = tune_answer.result(run, cases, [race], options, 30.0, NO_EVAL)
    for command in (result.next_step, result.trace_step):
        assert shlex.split(command)[5:7] == ["--out", str(tmp_path / "my results")], command


def test_the_commands_a_torchrun_tune_names_run_under_its_launcher(tmp_path):
    """After ``tune --launcher torchrun``, both commands said "(under the same launcher)" but gave no
    launcher option: pasted, they ran locally, and a suite sized "auto" made other worlds, so the
    trace sweep's ``--filter id=...`` matched no case. Each now carries the tune's torchrun options,
    and the trace sweep's selects the two arms that were raced."""
    from tpbench.cli import build_parser
    from tpbench.cli.common import torchrun_launcher
    from tpbench.worlds import Torchrun

    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 1.5]", repeats=12, world_size='"auto"'))
    launcher = Torchrun(nnodes=2, nproc_per_node=2, rdzv_endpoint="node1:29500", agent_prefix=("srun", "-N2"))
    cases = tune.prepare(suite, launcher=launcher).cases
    assert {c.world_size for c in cases} == {4}
    values = synthetic({c.case_id: 1 + c.slowdown_pct / 100 for c in cases}, 12, noise=0.02)
    options = Options(epsilon=0.005)
    race = run_race(Race(list(values), 12, options, comparisons=1), values)
    ran = LauncherRecord.from_json({"name": "torchrun", **asdict(launcher)})  # as run.json keeps it
    record = SimpleNamespace(suite=SuiteSource("s", str(suite), ""), launcher=ran)
    run = SimpleNamespace(dir=tmp_path / "r" / "s" / "run", record=record)
    result = tune_answer.result(run, cases, [race], options, 30.0, NO_EVAL)
    assert result.state == "unresolved"
    for command in (result.next_step, result.trace_step):
        args = build_parser().parse_args(shlex.split(command)[1:])
        assert torchrun_launcher(args) == launcher, command
    args = build_parser().parse_args(shlex.split(result.trace_step)[1:])
    traced = sweep.prepare(args.suite, args.set, args.filter, launcher=torchrun_launcher(args)).cases
    assert {c.case_id for c in traced} == {c.case_id for c in cases}


def test_the_trace_sweep_a_tune_names_traces_both_settings_once(tmp_path):
    """The suite traces nothing (``capture.profiler_steps = 0``, as tune-planted's) and races many
    rounds: the sweep the tune named ran the suite's budget, every repeat again and no trace. It now
    runs ``--trace``'s: the two settings, one repeat each, whole averaging windows traced in one window.
    The tune's own ``--set capture.profiler_steps=0`` is left out of it, not set twice (refused)."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 1.5, 30]", repeats=12, steps=6))
    own = ("batch_size=16", "repeats=12", "capture.profiler_steps=0")
    cases = tune.prepare(suite, own).cases
    values = synthetic({c.case_id: 1 + c.slowdown_pct / 100 for c in cases}, 12, noise=0.02)
    options = Options(epsilon=0.005)
    race = run_race(Race(list(values), 12, options, comparisons=2), values)
    source = SuiteSource("s", str(suite), "", None, own)
    run = SimpleNamespace(dir=tmp_path, record=SimpleNamespace(suite=source, launcher=LauncherRecord()))
    result = tune_answer.result(run, cases, [race], options, 30.0, NO_EVAL)
    cmd = shlex.split(result.trace_step)
    assert cmd[:3] == ["tpbench", "sweep", str(suite)]
    sets = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]
    filters = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--filter"]
    traced = sweep.prepare(suite, sets, filters).cases
    assert {c.case_id for c in traced} == {a.case_id for a in tune_answer.traced_arms(result.arms)}
    assert [(c.repeats, c.profiler_steps, c.trace_windows) for c in traced] == [(1, tune_answer.TRACE_STEPS, 1)] * 2
    # Post-local SGD's windows of 4 and 16 steps: 16 holds whole windows of both; 3 and 4, 12.
    assert [tune_answer.trace_steps(w) for w in ([1], [4, 16], [3, 4], [8])] == [5, 16, 12, 8]


def test_a_run_keeps_the_set_and_filter_it_was_started_with(tmp_path):
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 10, 20]", repeats=4))
    prepared = tune.prepare(suite, ["batch_size=32"], ["slowdown_pct=0|10"])
    assert (prepared.overrides, prepared.filters) == (("batch_size=32",), ("slowdown_pct=0|10",))
    run = sweep.start(prepared, tmp_path / "r")
    assert store.read_run_json(run.dir)["suite"] | {"text": ""} == {
        **{"name": "s", "path": str(suite), "text": ""},
        **{"set": ["batch_size=32"], "filter": ["slowdown_pct=0|10"]},
    }
    assert (run.record.suite.overrides, run.record.suite.filters) == (("batch_size=32",), ("slowdown_pct=0|10",))


def test_an_arm_out_against_the_recommended_one_may_hold_1_in_the_table_once_later_rounds_are_noisier(tmp_path):
    """docs/tune.md, "The rule": the table's interval of an eliminated arm against the recommended one
    is judged by the variance pooled over every round the race ran, so it may hold 1 even where the
    leader that eliminated it is the arm recommended in the end, over the same rounds (a planted
    60 % arm: +64.4 % [+2.3 %, +164.0 %] at its elimination, [−2.2 %, +176.3 %] in the table). The
    docs said this happened only under another leader or over fewer rounds."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 1, 40]", repeats=12))
    a, c, b = (x.case_id for x in sorted(tune.prepare(suite).cases, key=lambda x: x.slowdown_pct))
    rng = np.random.default_rng(2)
    values: dict[str, dict[int, float]] = {a: {}, b: {}, c: {}}
    for r in range(12):  # three quiet rounds, then a noisy machine
        noise = 0.04 if r < 3 else 0.4
        for arm, base in ((a, 10.0), (c, 10.0), (b, 14.0)):
            values[arm][r] = base * rng.lognormal(0, noise)
    race = run_race(Race([a, c, b], 12, Options(), comparisons=2), values)
    result = tune_answer.result(stored(tmp_path, suite), tune.prepare(suite).cases, [race], Options(), 0.0, NO_EVAL)
    out = next(x for x in result.arms if x.case_id == b)
    assert result.recommended.case_id == a and out.eliminated_at == 3 and out.rounds == 3
    assert out.eliminated_vs["leader"] == a and out.eliminated_vs["lo"] > 1
    assert out.ratio == pytest.approx(out.eliminated_vs["ratio"]) and out.lo < 1 < out.hi


def test_an_unresolved_tune_says_about_how_long_its_next_race_would_take(capsys):
    """The arms still in reach (and the recommended one) for the rounds the next race is given, each
    decided arm for the rounds it ran here, at each one's seconds per round, scaled by this tune's
    wall time over its timed steps; in the terminal and the report alike."""

    def arm(cid: str, status: str, rounds: int) -> TuneArm:
        return TuneArm(case_id=cid, label=cid, params={}, status=status, rounds=rounds, **NO_RATIO)

    arms = [arm("best", "recommended", 12), arm("close", "unresolved", 12), arm("slow", "eliminated", 3)]
    seconds = {"best": pd.Series([0.2] * 12), "close": pd.Series([0.3] * 12), "slow": pd.Series([1.0] * 3)}
    timed = 12 * 0.2 + 12 * 0.3 + 3 * 1.0
    wall = tune_answer._decide_wall_s(arms, seconds, 100, wall_s=2 * timed, timed_s=timed)
    assert wall == pytest.approx(2 * (100 * 0.2 + 100 * 0.3 + 3 * 1.0))  # 106 s
    assert tune_answer._decide_wall_s(arms, {}, 100, 0.0, 0.0) is None  # nothing timed: no estimate
    said = verdict.decide_words(112, wall)
    assert said.startswith("To decide it, race again from the start for about 112 rounds (at most about 2 min here")
    assert "(at most about 45 s here" in verdict.decide_words(112, 45.0)
    assert verdict.decide_words(112, None) == (
        "To decide it, race again from the start for about 112 rounds (under the same launcher): "
    )


def test_the_claim_states_the_margin_and_confidence_as_given(tmp_path):
    """Never rounded: a margin of 2.5 % read "within 2%" (a claim the race did not make), and a
    confidence of 0.9999999999 "100%"."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 0.5, 3, 30]", repeats=60))
    cases = tune.prepare(suite).cases
    values = synthetic({c.case_id: 1 + c.slowdown_pct / 100 for c in cases}, 60, noise=0.02, seed=2)
    options = Options(epsilon=0.025, confidence=0.975)
    race = run_race(Race(list(values), 60, options, comparisons=3), values)
    assert race.ended == ALL_TIED
    claim = tune_answer.result(stored(tmp_path, suite), cases, [race], options, 0.0, NO_EVAL).claim
    assert "within 2.5% of the best of 4 settings, 97.5% confidence;" in claim
    assert verdict.percent(0.9999999999) == "99.99999999%" and verdict.percent(0.02) == "2%"


def test_a_retired_arm_brought_back_says_the_rounds_it_sat_out(tmp_path):
    """An arm retired, then brought back, ran fewer rounds than the round it stopped after (the
    front door's tune of 2026-12-05: "retired after round 42" beside 18 rounds; one still racing at
    the end with 5 rounds of 12 and nothing said). ``Arm.sat_out`` counts the rounds it sat out, and
    the terminal and the report say it, for an arm retired again and for one still racing at the
    end. The race is the one above whose leader changes (z retired after round 3, back after 4)."""
    from tpbench.cli import tune as cli

    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 2, 3]", repeats=12))
    cases = tune.prepare(suite).cases
    y, x, z = (c.case_id for c in cases)
    residual = {y: [0.008, -0.008, 0.0], x: [-0.008, 0.008, 0.0], z: [0.0, 0.0, 0.0]}

    def race_to(last_round: int) -> Race:
        race = Race([y, x, z], 12, Options(epsilon=0.02, min_rounds=2), comparisons=2)
        for r in range(last_round):
            for a in list(race.live):
                f = 0.90 if a == x and r >= 3 else 1 + next(c for c in cases if c.case_id == a).slowdown_pct / 100
                race.record(a, r, 10 * f * np.exp(residual[a][r] if r < 3 else 0.0))
            while race.round_complete():
                race.close_round()
            if race.ended:
                break
        race.end(BUDGET)
        return race

    def arm_z(race: Race) -> TuneArm:
        result = tune_answer.result(stored(tmp_path, suite), cases, [race], Options(epsilon=0.02), 1.0, NO_EVAL)
        return next(a for a in result.arms if a.case_id == z)

    # Still racing when the budget ends after round 5: it ran rounds 1-3 and 5, and sat out 4.
    racing_z = arm_z(race_to(5))
    assert (racing_z.status, racing_z.rounds, racing_z.retired_at, racing_z.sat_out) == ("unresolved", 4, None, 1)
    assert dataclasses.asdict(racing_z)["sat_out"] == 1  # as the answer's JSON writes an arm
    assert cli.decided(racing_z, 0.02) == "retired, then brought back: it sat out 1 round"
    # Retired again after round 7, having run 6 of those 7 rounds.
    tied_z = arm_z(race_to(12))
    assert (tied_z.status, tied_z.rounds, tied_z.retired_at, tied_z.sat_out) == ("tied", 6, 7, 1)
    assert cli.decided(tied_z, 0.02) == (
        "retired after round 7 (it sat out 1 of them: retired, then brought back): "
        "it could no longer be 2% faster than the leader"
    )
    race = race_to(12)
    doc = tune_answer.result(stored(tmp_path, suite), cases, [race], Options(epsilon=0.02), 1.0, NO_EVAL).to_json()
    # One that ran every round it raced says nothing of it.
    assert [a["sat_out"] for a in doc["arms"]] == [0, 0, 1]
    doc["arms"][0] |= {"status": "unresolved", "rounds": 5, "retired_at": None, "sat_out": 7}
    store.write_tune(
        tmp_path,
        dataclasses.replace(tune._record(Options(epsilon=0.02), [race], 1.0), result=TuneResult.from_json(doc)),
    )
    page = Page("tune")
    recommendation.section(page, [tuned_run(tmp_path)])
    html = page.render()
    assert "<td>7 (it sat out 1 of them: retired, then brought back)</td>" in html
    assert "<td>retired, then brought back: it sat out 7 rounds</td>" in html


def test_a_tied_result_names_its_retired_arms_and_when_they_stopped(tmp_path, capsys):
    """A race that ends with arms retired: each is tied in the result (JSON ``retired_at``, the text
    table's "retired after round N"), ran only its own rounds, and is counted in the claim's tie."""
    from tpbench.cli import tune as cli

    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 0.5, 3, 30]", repeats=60))
    cases = tune.prepare(suite).cases
    factors = {c.case_id: 1 + c.slowdown_pct / 100 for c in cases}
    values = synthetic(factors, 60, noise=0.02, seed=2)
    race = run_race(Race(list(values), 60, Options(epsilon=0.02), comparisons=3), values)
    assert race.ended == ALL_TIED and race.retired
    result = tune_answer.result(stored(tmp_path, suite), cases, [race], Options(epsilon=0.02), 0.0, NO_EVAL)
    arms = {a.case_id: a for a in result.arms}
    written = {a["case_id"]: a for a in result.to_json()["arms"]}
    for a, at in race.retired.items():
        assert arms[a].status == "tied" and arms[a].retired_at == at and written[a]["retired_at"] == at
        assert arms[a].rounds == len(race.values[a]) <= race.rounds
    # The retirement that left the leader alone came in the last round: that arm ran every round and
    # still has its retired_at, the round its tie was decided (docs/tune.md had it null).
    (last,) = [a for a, at in race.retired.items() if at == race.rounds]
    assert arms[last].rounds == race.rounds and written[last]["retired_at"] == race.rounds
    assert f"tied with {len(race.retired)}," in result.claim
    cli.print_tune(result, "text")
    out = capsys.readouterr().out
    assert all(f"retired after round {at}" in out for at in race.retired.values())
    # Tied says why: "tied" beside a ratio well above 1 would read as "as fast".
    for a, at in race.retired.items():
        assert (
            cli.decided(arms[a], 0.02) == f"retired after round {at}: it could no longer be 2% faster than the leader"
        )
    # An eliminated arm says what eliminated it: its interval, above 1, against that round's leader.
    (slow,) = [a for a in result.arms if a.status == "eliminated"]
    assert slow.eliminated_vs["lo"] > 1 and slow.eliminated_vs["leader"] in race.arms
    said = f"eliminated after round {slow.eliminated_at} ({slow.eliminated_vs['ratio'] - 1:+.1%} ["
    assert said in out.replace("\n", " ") or said in " ".join(out.split())
    # Where the time goes: the sweep it names traces the recommended arm and the tied arm nearest it.
    rival = min((a for a in result.arms if a.status == "tied"), key=lambda a: a.ratio)
    cmd = shlex.split(result.trace_step)
    assert cmd[:5] == ["tpbench", "sweep", str(suite), "--out", str(tmp_path.parent.parent)] and cmd[5] == "--filter"
    assert {c.case_id for c in select(cases, [cmd[6]])} == {result.recommended.case_id, rival.case_id}
    assert result.trace_step in " ".join(out.split()) and result.to_json()["trace_step"] == result.trace_step


def write_heldout_steps(run_dir: Path, reach_at: dict[str, int], step_ms: dict[str, float], rounds: int = 5) -> None:
    """Each arm's stored steps as a post-local SGD run writes them, real parquet files: 40 steps a
    round, a held-out loss every 10, the target (1.05, the optimum 1.0) first reached after
    ``reach_at[arm]`` steps (never where that is beyond 40), each step ``step_ms[arm]`` ms with
    1 % of noise per round."""
    rng = np.random.default_rng(5)
    for arm, at in reach_at.items():
        rows = [
            {
                "repeat": r,
                "rank": 0,
                "step": s,
                "phase": "timed",
                "step_ms": step_ms[arm] * noise,
                "loss": 1.5,
                "heldout_loss": np.nan if (s + 1) % 10 else (1.02 if s + 1 >= at else 1.3),
                "optimal_loss": 1.0,
            }
            for r in range(rounds)
            for noise in [rng.lognormal(0, 0.01)]
            for s in range(40)
        ]
        d = store.case_dir(run_dir, arm)
        d.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_parquet(d / store.STEPS_FILE)


def test_a_recommendation_that_trains_worse_says_so_with_each_loss_and_time_to_target(tmp_path, capsys):
    """Settings that do not train alike (post-local SGD, a compressing hook): the race compares step
    times, so the recommended setting's faster steps may have bought a worse model. Its held-out
    loss ending more than 0.005 nats above the lowest is said beside the claim (text, JSON, the
    report), with the setting that reaches the target loss soonest and how sure that is: its ratio
    against the recommended one and the next soonest, each with its interval, paired by round over
    the stored steps; a table column gives every arm's loss. Losses that end level (DDP and ZeRO
    compute the same update) say nothing."""
    from tpbench.cli import tune as cli

    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 0.5, 3, 30]", repeats=60))
    cases = tune.prepare(suite).cases
    values = synthetic({c.case_id: 1 + c.slowdown_pct / 100 for c in cases}, 60, noise=0.02, seed=2)
    race = run_race(Race(list(values), 60, Options(epsilon=0.02), comparisons=3), values)
    best = race.leader()
    other = next(c.case_id for c in cases if c.case_id != best and c.slowdown_pct == 30)
    # The recommended arm reaches the target after 30 steps of 100 ms (3 s), the other after 20 (2 s);
    # the last two never do.
    rest = [c.case_id for c in cases if c.case_id not in (best, other)]
    write_heldout_steps(tmp_path, {best: 30, other: 20, **dict.fromkeys(rest, 99)}, dict.fromkeys(values, 100.0))

    def summary(best_loss: float, target: float | None = 1.6) -> pd.DataFrame:
        rows = [
            {
                "case_id": c.case_id,
                "final_heldout_loss": best_loss if c.case_id == best else 1.580 if c.case_id == other else 1.590,
                "target_loss": target,
                "steps_to_target": 30.0 if c.case_id == best else 20.0 if c.case_id == other else np.nan,
                "time_to_target_s": 3.0 if c.case_id == best else 2.0 if c.case_id == other else np.nan,
            }
            for c in cases
        ]
        return pd.DataFrame(rows)

    result = tune_answer.result(stored(tmp_path, suite), cases, [race], Options(epsilon=0.02), 0.0, summary(1.600))
    low = next(a for a in result.arms if a.case_id == other)
    note = result.training_note
    assert note.startswith("The settings do not train alike: the recommended one's held-out loss ends at 1.600")
    assert f"0.020 nats above the lowest ({low.label}, 1.580)" in note
    assert "Time to the target loss (training seconds, medians over rounds; intervals at 98.33333333% each, " in note
    assert f"so that the soonest against all 3 others holds at 95%): {low.label} reaches it soonest (2 s of " in note
    assert (
        "training); against the recommended one (2.99 s): faster: -33." in note and "beyond the ±5% threshold" in note
    )
    assert "next soonest" not in note  # no other arm reaches it in every round
    assert "compared step_ms alone" in note
    js = result.to_json()
    assert js["training_note"] == note and {a["case_id"]: a["heldout_loss"] for a in js["arms"]}[other] == 1.58
    assert {a["case_id"]: a["time_to_target_s"] for a in js["arms"]}[best] == 3.0
    assert all(a["time_to_target_s"] is None for a in js["arms"] if a["case_id"] not in (best, other))
    cli.print_tune(result, "text")
    out = " ".join(capsys.readouterr().out.split())
    assert " ".join(note.split()) in out and "held-out loss" in out and "1.580" in out
    # The table gives every arm's time to the target, "—" where a round never reached it: the note,
    # which ranks them by it, names only the soonest and the recommended one.
    cli.print_tune(result, "md")
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    head = [c.strip() for c in table[0].strip("|").split("|")]
    assert head[-2:] == ["held-out loss", "to target s (median)"]
    to_target = {row.split(" | ")[0].strip("| "): row.rstrip(" |").rsplit(" | ", 1)[1] for row in table[1:]}
    assert to_target[low.label] == "2" and to_target[result.recommended.label] == "3"
    assert sorted(to_target.values()) == ["2", "3", "—", "—"]
    store.write_tune(
        tmp_path, dataclasses.replace(tune._record(Options(epsilon=0.02), [race], 0.0), result=TuneResult.from_json(js))
    )
    page = Page("t")
    recommendation.section(page, [tuned_run(tmp_path)])
    shown = page.render()
    assert html.escape(note) in shown and "held-out loss" in shown
    # The report's table gives each arm's time to the target as the terminal's does: the note ranks by it.
    assert "<th>to target s (median)</th>" in shown and "<td>2</td>" in shown and "<td>—</td>" in shown
    # No workload evaluation: nothing to say.
    assert tune_answer.result(stored(tmp_path, suite), cases, [race], Options(), 0.0, NO_EVAL).training_note is None
    # No target known: the losses alone.
    untargeted = tune_answer.result(
        stored(tmp_path, suite), cases, [race], Options(epsilon=0.02), 0.0, summary(1.6, None)
    )
    assert "target" not in untargeted.training_note and "1.580" in untargeted.training_note
    # Just beyond the level band, the gap is not rounded onto it ("0.005 nats above" read as level).
    near = tune_answer.result(stored(tmp_path, suite), cases, [race], Options(epsilon=0.02), 0.0, summary(1.5855))
    assert f"0.0055 nats above the lowest ({low.label}, 1.580)" in near.training_note


def test_settings_that_end_level_but_reach_the_target_apart_name_the_soonest_with_its_interval(tmp_path):
    """Post-local SGD settings often end level (within 0.005 nats) yet reach the target loss after
    different numbers of steps: the race ranked time per step, which does not rank time to the
    target. The note used to appear only for a worse final loss, so such a tune said nothing of
    which setting reaches the target soonest; now it names it, against the recommended one and the
    next soonest, each with its interval, and says how sure (the confidence over the comparisons).
    Settings that reach the target at the same step (DDP and ZeRO) still get no note."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 20, 40]", repeats=20))
    cases = sorted(tune.prepare(suite).cases, key=lambda c: c.slowdown_pct)
    ids = [c.case_id for c in cases]
    values = synthetic({c.case_id: 1 + c.slowdown_pct / 100 for c in cases}, 20, seed=4)
    race = run_race(Race(ids, 20, Options(), comparisons=2), values)
    assert race.leader() == ids[0]
    # The fastest steps (100 ms) need 40 steps; the 20 % slower ones 20 (2.4 s), the slowest 30 (4.2 s).
    write_heldout_steps(tmp_path, dict(zip(ids, (40, 20, 30))), dict(zip(ids, (100.0, 120.0, 140.0))))
    summary = pd.DataFrame(
        {
            "case_id": ids,
            "final_heldout_loss": [1.02, 1.021, 1.019],
            "target_loss": 1.05,
            "steps_to_target": [40, 20, 30],
        }
    )
    result = tune_answer.result(stored(tmp_path, suite), cases, [race], Options(), 0.0, summary)
    rec, soon, slow = (next(a for a in result.arms if a.case_id == i) for i in ids)
    note = result.training_note
    every = f"after different numbers of steps, the held-out loss evaluated every {cases[0].eval_every} steps)"
    assert note.startswith(f"The settings do not train alike (they reach the target loss {every}"), note
    assert (
        f"{soon.label} reaches it soonest (2.4 s of training); against the recommended one (3.99 s): faster: -" in note
    )
    assert f"against the next soonest, {slow.label} (4.21 s): faster: -4" in note
    assert "intervals at 97.5% each, so that the soonest against all 2 others holds at 95%" in note
    # Reaching the target at the same step: the step time already ranks the time to it.
    together = summary.assign(steps_to_target=30)
    assert tune_answer.result(stored(tmp_path, suite), cases, [race], Options(), 0.0, together).training_note is None


def test_the_time_to_target_note_gives_medians_and_says_where_it_ranks_by_the_geometric_mean():
    """The note gave geometric means ("reaches it soonest (2.15 s)") beside the table's "to target s
    (median)" column and the report's soonest-to-target line, which give medians. Its times are now
    medians; it still ranks by the geometric mean, which its ratios compare, and says so where a
    setting it is set against has the lower median (here the recommended one: 1, 1, 10 s)."""
    arms = _racing_arms("a", "b", "c")
    reach = {"a": {0: 1.0, 1: 1.0, 2: 10.0}, "b": {0: 2.0, 1: 2.0, 2: 2.0}, "c": {0: 3.0, 1: 3.0, 2: 30.0}}
    note = tune_answer._to_target(arms[0], arms, reach, 0.95, dict.fromkeys(reach, 0))
    assert note.startswith("Time to the target loss (training seconds, medians over rounds; intervals at 97.5% each")
    assert (
        "b reaches it soonest (2 s of training; first by the geometric mean over rounds, which the ratios compare); "
        "against the recommended one (1 s): "
    ) in note
    assert "against the next soonest, c (3 s): " in note
    # Where the medians agree with the rank, nothing more is said.
    later = reach | {"a": {0: 5.0, 1: 5.0, 2: 5.0}}
    plain = tune_answer._to_target(arms[0], arms, later, 0.95, dict.fromkeys(reach, 0))
    assert "b reaches it soonest (2 s of training); against the recommended one (5 s)" in plain


def test_the_time_to_target_note_names_a_lower_median_of_a_setting_it_does_not_set_against():
    """The note said "first by the geometric mean" only where the recommended one or the next soonest had the
    lower median: a third setting with a lower median (here d: 1, 1.5, 30 s) stood in the table's "to target s
    (median)" column at 1.5 s beside the soonest's 2 s, unexplained, as the report's soonest line had it of
    suites/localsgd.toml. The note now says so of any setting, and names it where it is not set against."""
    arms = _racing_arms("a", "b", "c", "d")
    reach = {
        "a": {0: 5.0, 1: 5.0, 2: 5.0},
        "b": {0: 2.0, 1: 2.0, 2: 2.0},
        "c": {0: 2.1, 1: 2.1, 2: 2.1},
        "d": {0: 1.0, 1: 1.5, 2: 30.0},
    }
    note = tune_answer._to_target(arms[0], arms, reach, 0.95, dict.fromkeys(reach, 0))
    assert (
        "b reaches it soonest (2 s of training; first by the geometric mean over rounds, which the ratios compare; "
        "the lowest median is d's, 1.5 s); against the recommended one (5 s): "
    ) in note
    assert "against the next soonest, c (2.1 s): " in note


def test_worlds_of_one_arm_run_their_rounds_and_the_note_compares_per_sample(tmp_path):
    """Arms in different worlds (world_size = [1, 2]), one arm a world. Such a world used to end at
    its first round, and its one value was set against the other world's one value as though they
    made an interval: "the best of 2 settings, 95% confidence; 1 eliminated" on a value a side. Each
    world now runs its rounds (its one arm is its winner, and runs on for the comparison across
    worlds), and the world winners are compared on their intervals; with one round the most
    (``repeats = 1``) nothing is decided. batch_size is per rank, so the 2-rank
    world takes twice the samples a step: the note gives the per-sample ratio beside the claim."""
    from tpbench.cli import tune as cli

    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("world_size = [1, 2]", repeats=60))
    cases = sorted(tune.prepare(suite).cases, key=lambda c: c.world_size)
    values = synthetic({cases[0].case_id: 1.0, cases[1].case_id: 3.0}, 60, seed=3)

    def races(max_rounds: int) -> list[Race]:
        return [
            run_race(
                Race([c.case_id], max_rounds, Options(), comparisons=1, world=w, runs_on=True),
                {c.case_id: values[c.case_id]},
            )
            for w, c in enumerate(cases)
        ]

    raced = races(60)
    assert [r.rounds for r in raced] == [60, 60] and {(r.decided, r.ended) for r in raced} == {(ONE_LEFT, MAX_ROUNDS)}
    result = tune_answer.result(stored(tmp_path, suite), cases, raced, Options(), 0.0, NO_EVAL)
    rec, other = (next(a for a in result.arms if a.case_id == c.case_id) for c in cases)
    assert (
        rec.status == tune_answer.RECOMMENDED and other.status == tune_answer.ELIMINATED and 1 < other.lo < other.ratio
    )
    assert result.claim.startswith(f"{rec.label}: the best of 2 settings")
    note = result.training_note
    assert "do not take the same samples a step" in note and "8 for the recommended one, 16 for others" in note
    half = 0.5  # the recommended arm's 8 samples a step over the other's 16
    assert f"{other.label} ×{other.ratio * half:.2f} [{other.lo * half:.2f}, {other.hi * half:.2f}]" in note
    # The report: no round held two settings, so no race chart (it used to fail on the empty history).
    store.write_tune(tmp_path, dataclasses.replace(tune._record(Options(), raced, 0.0), result=result))
    page = Page("t")
    recommendation.section(page, [tuned_run(tmp_path)])
    shown = page.render()
    assert html.escape(note) in shown and "No race chart: no world held two of these settings" in shown
    assert "<td>None</td>" not in shown and "the recommended setting's world, at the end, unpaired" in shown
    assert (
        cli.decided(other, 0.02)
        == "eliminated by the recommended setting's world, at the end, unpaired (the interval beside it)"
    )
    assert result.worlds == [f"{a.label}: the only setting in its world" for a in (rec, other)]
    # One round a world: a value a side, no interval, no decision.
    single = tune_answer.result(stored(tmp_path, suite), cases, races(1), Options(), 0.0, NO_EVAL)
    assert single.state == tune_answer.UNRESOLVED
    assert [a.status for a in single.arms if a.status != tune_answer.RECOMMENDED] == [tune_answer.UNRESOLVED]


def two_world_races(tmp_path, repeats: int):
    """A suite of two worlds (world_size 1 and 2), two settings in each (0 and 40 % slower), and each
    world's race run on synthetic rounds: the 2-rank world twice as slow as the 1-rank one."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("world_size = [1, 2]\nslowdown_pct = [0, 40]", repeats=repeats))
    cases = tune.prepare(suite).cases
    scale = {c.case_id: c.world_size * (1 + c.slowdown_pct / 100) for c in cases}
    values = synthetic(scale, repeats, noise=0.02, seed=4)
    races = []
    for w, size in enumerate((1, 2)):
        arms = [c.case_id for c in cases if c.world_size == size]
        races.append(run_race(Race(arms, repeats, Options(), comparisons=3, world=w), values))
    return suite, cases, races


def test_arms_across_worlds_get_each_worlds_own_answer(tmp_path, capsys):
    """Two links, two settings on each (what a suite sweeping interconnect races): the claim across
    worlds names the faster link's best setting, which says mostly that the link is faster; each
    world's own race says which setting to use on that link, and the tune says so per world (text,
    JSON, the report)."""
    from tpbench.cli import tune as cli

    suite, cases, races = two_world_races(tmp_path, 30)
    result = tune_answer.result(stored(tmp_path, suite), cases, races, Options(), 0.0, NO_EVAL)
    label = {a.case_id: a.label for a in result.arms}
    best = {c.world_size: label[c.case_id] for c in cases if c.slowdown_pct == 0}
    assert result.worlds == [
        f"{best[1]}: the best of 2 in its world; 1 eliminated",
        f"{best[2]}: the best of 2 in its world; 1 eliminated",
    ]
    assert result.to_json()["worlds"] == result.worlds
    cli.print_tune(result, "text")
    out = capsys.readouterr().out
    assert "Within each world (its own race, on the same intervals):" in out and best[2] in out
    cli.print_tune(result, "md")  # the other world's arm holds its winner's unpaired interval: the column says so
    assert "| interval (95% jointly; other worlds unpaired) |" in capsys.readouterr().out
    store.write_tune(tmp_path, dataclasses.replace(tune._record(Options(), races, 0.0), result=result))
    page = Page("t")
    recommendation.section(page, [tuned_run(tmp_path)])
    assert html.escape(result.worlds[1]) in page.render() and "other worlds unpaired" in page.render()
    # One world: the claim is the world's answer, nothing more to say.
    alone = [c for c in cases if c.world_size == 1]
    assert tune_answer.result(stored(tmp_path, suite), alone, races[:1], Options(), 0.0, NO_EVAL).worlds == []


def test_across_worlds_the_winners_run_on_and_an_open_comparison_says_what_would_decide_it(tmp_path):
    """Each world's race decided at its first look (its 40 % arm out), but its winner keeps running
    the world's rounds: the winners are compared unpaired, and that comparison needs their rounds. It
    used to stop the winners at round 3, call the unresolved tune "(most rounds run)" with 27 rounds
    left, and give no estimate nor next step (the estimate read only the worlds' own races)."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("world_size = [1, 2]\nslowdown_pct = [0, 40]", repeats=30))
    cases = tune.prepare(suite).cases
    races = []
    for w, size in enumerate((1, 2)):
        world = {
            c.case_id: (1.02 if size == 2 else 1.0) * (1 + c.slowdown_pct / 100) for c in cases if c.world_size == size
        }
        race = Race(list(world), 30, Options(), comparisons=3, world=w, runs_on=True)
        races.append(run_race(race, synthetic(world, 30, noise=0.02, seed=w)))
    for race in races:
        assert race.decided == ONE_LEFT and race.ended == MAX_ROUNDS and race.rounds == 30
        assert len(race.eliminated) == 1 and len(race.judged(race.leader())) == 30
    result = tune_answer.result(stored(tmp_path, suite), cases, races, Options(), 60.0, NO_EVAL)
    # Not "(most rounds run)", which read as "most of the rounds".
    assert result.state == tune_answer.UNRESOLVED and "unresolved (all 30 rounds run)" in result.claim
    assert result.rounds_to_decide and f"about {result.rounds_to_decide} more rounds would decide it" in result.claim
    assert f"--set repeats={30 + result.rounds_to_decide}" in result.next_step
    label = {a.case_id: a.label for a in result.arms}
    assert [w.split(": ")[1] for w in result.worlds] == ["the best of 2 in its world; 1 eliminated"] * 2
    assert all(label[r.leader()] in " ".join(result.worlds) for r in races)
    # A race of one world still ends with its last arm.
    alone = run_race(Race(list(world), 30, Options(), comparisons=1), synthetic(world, 30, noise=0.02, seed=1))
    assert alone.ended == alone.decided == ONE_LEFT and alone.rounds < 30


def test_a_decided_tune_has_no_rounds_to_decide_though_another_worlds_own_race_is_open(tmp_path):
    """The faster world's race names its best; the other world's two settings (alike, 4× slower) are
    too noisy to tell apart in their own race, yet both are clearly slower than the best, unpaired: the tune is decided
    ("the best of 4 settings", exit 0). Its JSON said "rounds_to_decide": 505 all the same."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("world_size = [1, 2]\nslowdown_pct = [0, 40]", repeats=10))
    cases = tune.prepare(suite).cases
    races = []
    for w, size in enumerate((1, 2)):
        world = {c.case_id: 1 + c.slowdown_pct / 100 if size == 1 else 4.0 for c in cases if c.world_size == size}
        values = synthetic(world, 10, noise=0.02 if size == 1 else 0.3, seed=w)
        races.append(run_race(Race(list(world), 10, Options(), comparisons=3, world=w, runs_on=True), values))
    assert races[0].decided == ONE_LEFT and races[1].decided is None  # the slower world's own race is open
    result = tune_answer.result(stored(tmp_path, suite), cases, races, Options(), 10.0, NO_EVAL)
    assert result.state == tune_answer.RECOMMENDED and "the best of 4 settings" in result.claim
    assert result.rounds_to_decide is None and result.to_json()["rounds_to_decide"] is None
    assert result.next_step is None and result.decide_wall_s is None


def test_an_arm_of_another_world_clearly_slower_than_the_best_is_eliminated_whatever_its_winner(tmp_path):
    """Another world's arms share its winner's outcome against the best arm (tied or undecided),
    unless an arm's own interval against the best lies above 1: it used to be listed "unresolved",
    counted as "still within reach", beside an interval that showed it slower."""
    rng = np.random.default_rng(5)
    best = Race(["a"], 30, Options(), comparisons=2, world=0)
    other = Race(["b", "slow"], 30, Options(), comparisons=2, world=1)
    for r in range(30):
        best.record("a", r, 10 * rng.lognormal(0, 0.01))
        other.record("b", r, 10 * rng.lognormal(0, 0.3))  # too noisy to tell from the best unpaired
        other.record("slow", r, 15 * rng.lognormal(0, 0.01))
    best.rounds = other.rounds = 30
    other.end(MAX_ROUNDS)  # its race undecided: neither arm went, neither retired
    status = tune_answer._statuses([best, other], best, "a", 0.02, 0.99)
    assert other.leader() == "b" and status == {"b": tune_answer.UNRESOLVED, "slow": tune_answer.ELIMINATED}


def test_a_world_the_budget_ended_before_its_first_round_leaves_its_arms_unresolved(tmp_path):
    """The first world spent the whole budget: the second started none of its rounds. Its arms have
    no value, so no leader and nothing to compare (the tune used to raise ValueError comparing an
    empty side unpaired, exit 1, and so did --resume)."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("world_size = [1, 2]\nslowdown_pct = [0, 40]", repeats=10))
    cases = tune.prepare(suite).cases
    ran = {c.case_id: 1 + c.slowdown_pct / 100 for c in cases if c.world_size == 1}
    first = run_race(Race(list(ran), 10, Options(), comparisons=3, runs_on=True), synthetic(ran, 10, seed=2))
    second = Race([c.case_id for c in cases if c.world_size == 2], 10, Options(), comparisons=3, world=1, runs_on=True)
    second.end(BUDGET)
    assert second.leader() is None
    result = tune_answer.result(stored(tmp_path, suite), cases, [first, second], Options(budget_s=5), 5.0, NO_EVAL)
    statuses = {a.case_id: a.status for a in result.arms}
    assert [statuses[a] for a in second.arms] == [tune_answer.UNRESOLVED] * 2
    assert result.state == tune_answer.UNRESOLVED and "(budget spent)" in result.claim
    label = {a.case_id: a.label for a in result.arms}
    assert result.worlds == [
        f"{result.recommended.label}: the best of 2 in its world; 1 eliminated",
        f"{', '.join(label[a] for a in second.arms)}: not raced: the budget was spent before their world started",
    ]


def test_the_grid_a_tune_costs_against_counts_each_worlds_own_rounds(tmp_path):
    """The budget cut the recommended arm's world after 3 rounds, and the other world ran 6: the
    grid counted every arm for the recommended arm's 3 rounds alone, so a tune across worlds
    printed "timed steps 1.8 s, 162% of the 1.1 s the whole grid would have timed". Each arm now
    counts for its own world's rounds: the tune never times more than the grid."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("world_size = [1, 2]\nslowdown_pct = [0, 40]", repeats=10))
    cases = tune.prepare(suite).cases
    values = synthetic({c.case_id: c.world_size * (1 + c.slowdown_pct / 100) for c in cases}, 10, seed=3)
    races = []
    for w, (size, rounds) in enumerate(((1, 3), (2, 6))):
        race = Race([c.case_id for c in cases if c.world_size == size], 10, Options(), 3, world=w, runs_on=True)
        for r in range(rounds):
            for a in list(race.live):
                race.record(a, r, values[a][r])
            race.close_round()
        race.end(BUDGET)
        races.append(race)
    for race in races:  # each arm's timed steps, as a world stores them: 0.1 s a step, 4 steps a round
        for a in race.arms:
            rows = [(a, r, "timed", s, 0, 100.0) for r in race.judged(a) for s in range(4)]
            steps = pd.DataFrame(rows, columns=["case_id", "repeat", "phase", "step", "rank", "step_ms"])
            store.case_dir(tmp_path, a).mkdir(parents=True)
            steps.to_parquet(store.case_dir(tmp_path, a) / store.STEPS_FILE)
    result = tune_answer.result(stored(tmp_path, suite), cases, races, Options(budget_s=9), 9.0, NO_EVAL)
    assert result.recommended.case_id in races[0].arms and result.recommended.rounds == 3
    ran = sum(len(race.judged(a)) for race in races for a in race.arms)
    assert result.timed_s == pytest.approx(0.4 * ran)
    assert result.grid_timed_s == pytest.approx(0.4 * (2 * 3 + 2 * 6))
    assert result.timed_s <= result.grid_timed_s


def test_every_arm_failed_recommends_nothing_and_exits_1(tmp_path, capsys):
    """Both arms' worlds crash: no recommendation, state "failed" and exit 1, as a failed sweep
    (it used to read "recommended" with no recommended arm, and exit 0); the report says why it has
    no race chart. A ``[defaults]`` key no case uses is warned of once before the race, as a sweep
    and a dry run warn of it (the tune prepared its suite inside and said nothing)."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite('fault = ["crash:1", "crash:0"]', repeats=4, timeout_s=30, shard_buckets="true"))
    code = run_cli(["tune", str(suite), "--out", str(tmp_path / "r"), "--format", "json"])
    out, err = capsys.readouterr()
    unused = f"warning: {suite}: [defaults] shard_buckets = true: no case uses it (ddp does not use it)\n"
    assert err.count(unused) == 1 and err.startswith(unused), err
    printed = json.loads(out)
    assert code == 1 and printed["state"] == tune_answer.FAILED and printed["recommended"] is None
    assert printed["claim"] == "no recommendation: every one of the 2 settings failed"
    assert {a["status"] for a in printed["arms"]} == {tune_answer.FAILED}
    (run_dir,) = store.iter_runs(tmp_path / "r")
    page = Page("t")
    recommendation.section(page, [tuned_run(run_dir)])
    assert "No race chart: every setting failed (the table), so no round was judged." in page.render()


def test_the_margin_an_unresolved_race_shows_holds_at_its_confidence():
    """200 seeded races of arms 0, 3 and 5 % apart, 5 % noise, cut at 8 rounds (a 0.5 % margin, so
    they end unresolved): the leader is more than the supported margin slower than the true best in
    at most 1 in 20 (the union bound makes it far rarer). Read off the ratios instead of their low
    ends, it would be wrong whenever noise put b or c ahead."""
    wrong = 0
    factors = {"a": 1.0, "b": 1.03, "c": 1.05}
    for seed in range(200):
        values = synthetic(factors, 8, noise=0.05, seed=seed)
        race = run_race(Race(list(values), 8, Options(epsilon=0.005), comparisons=2), values)
        leader = race.leader()
        shown = supported_epsilon(r for a, r in race.intervals(leader).items() if a != leader)
        wrong += shown is None or factors[leader] > 1 + shown
    assert wrong <= 10


def test_the_race_cost_benchmark_runs_the_tunes_race_and_prices_each_arm_by_its_rounds(capsys):
    """benchmarks/race_cost.py on arms 0, 2 and 50 % apart: the 50 % arm goes after a few rounds
    while the 2 % arm, within epsilon, races on until it retires, so the share lies between the
    two arms that run every round (2.02 / 3.52 of the grid, by time) and the whole grid; the best
    is always recommended, and the same seed gives the same races."""
    from benchmarks import race_cost

    ratios, options = (1.0, 1.02, 1.5), Options(epsilon=0.02)
    outcomes = [race_cost.race_once(ratios, 0.05, np.random.default_rng(s), options, 60) for s in range(5)]
    for o in outcomes:
        assert not o.wrong and o.rounds > options.min_rounds
        assert (1 + 1.02) / sum(ratios) < o.share < 1
    assert race_cost.race_once(ratios, 0.05, np.random.default_rng(3), options, 60) == outcomes[3]
    race_cost.main(["--ratios", "1,1.02,1.5", "--sd", "0.05", "--races", "3", "--repeats", "60"])
    out = capsys.readouterr().out
    assert "share median" in out and "wrong 0/3" in out and "out of rounds 0/3" in out
    # Four rounds of 20 % noise decide nothing between arms 1 % apart: out of rounds, unresolved,
    # which the loaded check counts as missed however low its share.
    stuck = race_cost.race_once((1.0, 1.01), 0.2, np.random.default_rng(0), options, 4)
    assert not stuck.resolved and all(o.resolved for o in outcomes)


def test_the_accuracy_benchmark_judges_each_tune_against_the_planted_truth_and_counts_the_issues_check():
    """benchmarks/tune_accuracy.py on made-up tune results (no tune runs): a claim for the 3 % or
    the 6 % arm is false against a 2 % margin, yet the issue's check accepts the 3 % arm with the
    0 % one tied beside it; the check also needs the 40 % arm out with fewer rounds than the
    recommended one, and a cost share of at most 0.5."""
    from benchmarks import tune_accuracy

    def facts(rec: float, state: str, timed: float, slow_rounds: int) -> dict:
        arms = [
            {"params": {"slowdown_pct": p}, "status": "recommended" if p == rec else s, "rounds": r}
            for p, s, r in ((0.0, "tied", 20), (3.0, "tied", 20), (6.0, "tied", 20), (40.0, "eliminated", slow_rounds))
        ]
        result = {"state": state, "epsilon": 0.02, "confidence": 0.95, "recommended": {"params": {"slowdown_pct": rec}}}
        result |= {"arms": arms, "timed_s": timed, "grid_timed_s": 100.0, "supported_epsilon": None}
        return {"result": result, "naive_slowdown_pct": None}

    rows = [
        tune_accuracy.judge(facts(3.0, "tied", 45.0, 3)),  # the runner-up, the best tied; cheap: held
        tune_accuracy.judge(facts(0.0, "tied", 55.0, 3)),  # right, but over half the grid
        tune_accuracy.judge(facts(0.0, "tied", 40.0, 20)),  # the 40 % arm ran as long as the best
        tune_accuracy.judge(facts(6.0, "tied", 30.0, 3)),  # 6 % slower than the best: a false claim
        tune_accuracy.judge(facts(0.0, "unresolved", 30.0, 3)),  # the right best guess, but no recommendation
    ]
    assert [r["right"] for r in rows] == [False, True, True, False, True]
    assert [r["claim_false"] for r in rows] == [True, False, False, True, False]  # unresolved claims nothing
    assert [tune_accuracy.check_held(r) for r in rows] == [True, False, False, False, False]
    for r in rows:
        r |= {"competitors": 1, "wall_s": 60.0, "load1_before": 1.0}
    line = tune_accuracy.table(rows).splitlines()[-1]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:5] == ["1", "5", "3/5", "2/5", "1/5"] and cells[8] == "1/5"  # the check held in 1 of 5


def rounds_of(history: list[dict]) -> list[TuneRound]:
    """A race chart's rounds as tune.json holds them (``TuneRound``), from their keys that matter."""
    return [TuneRound.from_json(e, f"'history'[{i}] ") for i, e in enumerate(history)]


def test_the_race_chart_zooms_on_the_ratios_near_1_on_a_log_axis():
    """A 2.3× setting must not squash the tie zone and the settings racing for it into the chart's
    bottom: the axis is logarithmic, holds the band and every ratio up to RACE_TOP, and says that
    slower settings run off its top."""
    history = [
        {
            "round": r,
            "eliminated": ["far"] if r == 3 else [],
            "retired": ["near"] if r == 5 else [],
            "intervals": {"far": [2.3, 1.9, 2.8], "near": [1.05, 0.97, 1.13]}
            if r <= 3
            else {"near": [1.04, 0.99, 1.1]},
        }
        for r in range(2, 6)
    ]
    fig = recommendation._race_figure(rounds_of(history), {"far": "far", "near": "near"}, 0.02, min_rounds=2)
    axis = fig.layout.yaxis
    low, high = (10**v for v in axis.range)
    assert axis.type == "log" and low <= 1 / 1.02**2 and 1.13 < high <= recommendation.RACE_TOP
    assert fig.layout.xaxis.dtick == 1  # whole rounds: no tick at 2.5
    assert "run off the top" in fig.layout.title.text
    # Each setting its own colour, set here (plotly's own would give the cross and ring traces slots
    # too, and two settings one colour), in the table's order.
    lines = [t for t in fig.data if t.mode == "lines+markers"]
    assert [t.name for t in lines] == ["far", "near"] and len({t.line.color for t in lines} - {None}) == 2
    calm = recommendation._race_figure(
        rounds_of(history[2:]), {"near": "near"}, 0.02, min_rounds=2
    )  # nothing beyond: no note
    assert "run off" not in calm.layout.title.text and 10 ** calm.layout.yaxis.range[1] >= 1.04


def test_the_race_charts_title_and_key_fit_above_the_plot():
    """The title and its two lines of key sat in a 70 px top margin: plotly puts the title's first
    baseline at the margin's middle, so the key's last line ran into the plot's top edge, and a cross
    kept on that edge (an elimination beyond the axis) covered its words. The margin now grows with
    the title's lines, as much per line as the two-line charts (70 px) give theirs, less a little
    for the key's smaller type."""
    history = [
        {"round": r, "eliminated": ["far"] if r == 3 else [], "retired": [], "intervals": {"far": [3.2, 2.6, 4.0]}}
        for r in range(2, 4)
    ]
    fig = recommendation._race_figure(rounds_of(history), {"far": "far"}, 0.02, min_rounds=2)
    lines = fig.layout.title.text.count("<br>") + 1
    assert lines == 3 and fig.layout.margin.t >= 33 * lines


def test_the_race_chart_keeps_an_elimination_beyond_its_top_on_the_top_edge():
    """A setting eliminated at 1.62× the leader (suites/whatif.toml's zero_no_overlap on loopback)
    ran off the chart's top with its cross: the table said "eliminated after round 5" and the chart
    showed nothing happen. The cross now sits on the top edge, drawn whole, its hover the ratio."""
    history = [
        {
            "round": r,
            "eliminated": ["far"] if r == 5 else [],
            "retired": [],
            "intervals": {"far": [1.62, 0.8 if r < 5 else 1.16, 2.26], "near": [1.05, 0.97, 1.13]},
        }
        for r in range(2, 6)
    ]
    fig = recommendation._race_figure(rounds_of(history), {"far": "far", "near": "near"}, 0.02, min_rounds=2)
    high = 10 ** fig.layout.yaxis.range[1]
    (cross,) = [t for t in fig.data if t.mode == "markers" and t.marker.symbol == "x"]
    assert list(cross.customdata) == [5] and cross.y[0] == pytest.approx(high) and cross.cliponaxis is False
    assert cross.text[0] == "eliminated at 1.62× the leader"
    (line,) = [t for t in fig.data if t.name == "far" and t.mode == "lines+markers"]
    assert line.y[-1] == 1.62  # the line itself still runs off the top, as the title says


def test_the_race_chart_says_what_retired_means_without_calling_a_slower_setting_tied():
    """A setting retired at 1.30× the leader was keyed "○: retired, tied": read as "as fast". Retired
    says only that it can no longer be more than ε faster than the leader, which the key and the
    ring's hover now say in the table's words, beside the ratio."""
    history = [
        {
            "round": r,
            "eliminated": [],
            "retired": ["slow"] if r == 3 else [],
            "intervals": {"slow": [1.3, 1.01, 1.67]},
        }
        for r in range(2, 4)
    ]
    fig = recommendation._race_figure(rounds_of(history), {"slow": "slow"}, 0.02, min_rounds=2)
    title = fig.layout.title.text
    assert "tied" not in title and "○: retired (it could no longer be 2% faster than the leader)" in title
    assert "shaded: 1 / 1.02 to 1" in title
    (ring,) = [t for t in fig.data if t.mode == "markers" and t.marker.symbol == "circle-open"]
    assert ring.text[0] == "retired at 1.3× the leader: it could no longer be 2% faster than the leader"


def test_the_race_chart_draws_the_rounds_leader_at_1():
    """The leader has no interval against itself: left out, the line of a setting that led rounds 3
    and 4 ran straight from its ratio at round 2 to round 5's, as if it had trailed in between."""
    led = {2: "b", 3: "a", 4: "a", 5: "b"}
    history = [
        {
            "round": r,
            "leader": led[r],
            "eliminated": [],
            "retired": [],
            "intervals": {k: [1.04, 0.95, 1.14] for k in ("a", "b", "c") if k != led[r]},
        }
        for r in range(2, 6)
    ]
    fig = recommendation._race_figure(rounds_of(history), {"a": "a", "b": "b", "c": "c"}, 0.02, min_rounds=2)
    lines = {t.name: t for t in fig.data if t.mode == "lines+markers"}
    assert list(lines["a"].customdata) == [2, 3, 4, 5] and list(lines["a"].y) == [1.04, 1, 1, 1.04]
    assert [round(v, 6) for v in lines["a"].error_y.array] == [0.1, 0, 0, 0.1]  # no bar where it led
    assert list(lines["b"].y) == [1, 1.04, 1.04, 1] and list(lines["c"].y) == [1.04] * 4
    assert "at 1 without a bar: the round's leader" in fig.layout.title.text


def test_the_race_chart_draws_the_settings_at_one_round_side_by_side_and_hovers_the_round():
    """Each setting was drawn at the round itself: at one round their bars lay on one another, and in
    a short race, where they are widest, each hid the others' (tune-planted.toml's 7 settings over 12
    rounds). Each setting now sits a little aside, the group within half a round; the hover, and the
    cross and ring, keep the round itself."""
    history = [
        {
            "round": r,
            "leader": "a",
            "eliminated": ["c"] if r == 4 else [],
            "retired": [],
            "intervals": {"b": [1.04, 0.95, 1.14], "c": [1.3, 1.1, 1.5]},
        }
        for r in range(2, 5)
    ]
    fig = recommendation._race_figure(rounds_of(history), {"a": "a", "b": "b", "c": "c"}, 0.02, min_rounds=2)
    lines = [t for t in fig.data if t.mode == "lines+markers"]
    assert [list(t.customdata) for t in lines] == [[2, 3, 4]] * 3
    for k in range(3):
        xs = sorted(t.x[k] for t in lines)
        assert len(set(xs)) == 3 and xs[-1] - xs[0] <= 0.5 and xs[0] < 2 + k < xs[-1]
    assert all("round %{customdata}" in t.hovertemplate for t in fig.data)
    (cross,) = [t for t in fig.data if t.mode == "markers"]
    assert list(cross.customdata) == [4] and cross.x[0] == lines[2].x[-1]  # on its setting's point
    assert "side by side" in fig.layout.xaxis.title.text


def race_charts(tmp_path, suite, cases, races, options: Options = Options()) -> list:
    """The race charts the report's Recommendation draws for ``races`` (synthetic, stored as a tune
    stores them): the figures the page was handed, in order."""
    result = tune_answer.result(stored(tmp_path, suite), cases, races, options, 0.0, NO_EVAL)
    store.write_tune(tmp_path, dataclasses.replace(tune._record(options, races, 0.0), result=result))
    page, figures = Page("t"), []
    page.figure = figures.append
    recommendation.section(page, [tuned_run(tmp_path)])
    return figures


def test_the_race_chart_starts_at_the_first_round_the_rule_may_decide(tmp_path):
    """The race computes intervals from round 2, but before --min-rounds (3) it decides nothing, and
    there the intervals span the chart: drawn, round 2 read as a race under way. The chart starts at
    --min-rounds and its title says why the rounds before it are not drawn."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 5, 40]", repeats=12))
    cases = tune.prepare(suite).cases
    values = synthetic({c.case_id: 1 + c.slowdown_pct / 100 for c in cases}, 12, noise=0.03, seed=2)
    race = run_race(Race([c.case_id for c in cases], 12, Options(), comparisons=2), values)
    assert race.history[0]["round"] == 1 and race.history[1]["intervals"]  # the race has round 2's intervals
    (fig,) = race_charts(tmp_path, suite, cases, [race])
    assert min(x for t in fig.data for x in t.customdata) == MIN_ROUNDS == 3
    assert "before round 3, too few rounds to decide (--min-rounds 3)" in fig.layout.title.text


def test_an_interrupted_tunes_report_shows_the_race_so_far_and_claims_nothing(tmp_path):
    """Interrupted, a tune says "The race so far is kept" and points at the report, yet the report's
    Recommendation said only "No recommendation yet: this tune stopped after 6 rounds": no table, no
    chart. It now shows tune.json's race as of its last judged round, labelled as interrupted: each
    setting's standing and ratio to that round's leader, and the race chart, with no claim."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 1, 40]", repeats=12))
    cases = tune.prepare(suite).cases
    values = synthetic({c.case_id: 1 + c.slowdown_pct / 100 for c in cases}, 12, noise=0.03, seed=2)
    race = run_race(Race([c.case_id for c in cases], 12, Options(), comparisons=2), values, stop_after=6)
    assert not race.ended and race.eliminated  # the 40 % arm went; the race was cut short after round 6
    store.write_tune(tmp_path, tune._record(Options(), [race], 0.0))  # no result: interrupted
    page, figures, tables = Page("t"), [], []
    page.figure, page.table = figures.append, tables.append
    names = labels([cases])[0]
    run = tuned_run(tmp_path)
    run.cases = pd.DataFrame({"case_id": list(names), "label": list(names.values())})
    run.record.cases = {c.case_id: SimpleNamespace(params=c.params()) for c in cases}
    recommendation.section(page, [run])
    said = " ".join(html.unescape(" ".join(page.parts)).split())
    assert "Interrupted race: no recommendation." in said and "after round 6" in said
    assert f"tpbench tune --resume {tmp_path}" in said and "within 2%" not in said
    (table,) = tables
    by = table.set_index("setting")
    slow = next(c for c in cases if c.slowdown_pct == 40)
    assert by.loc[names[slow.case_id], "status"] == "eliminated"
    assert by.loc[names[slow.case_id], "eliminated after round"] == race.eliminated[slow.case_id]
    assert "vs that round's leader" in by.loc[names[slow.case_id], "what eliminated it"]
    leader = race.history[-1]["leader"]
    assert by.loc[names[leader], "status"] == "leader" and (by["rounds"] == 6).sum() >= 2
    other = next(a for a in race.live if a != leader)
    ratio, lo, hi = race.history[-1]["intervals"][other]
    line = verdict.tie_line(Options().epsilon)
    row = by.loc[names[other]]
    assert row["as of round"] == 6 and row["vs that round's leader"] == verdict.change(ratio, line=line)
    assert row["interval (95% jointly)"] == f"[{verdict.change(lo, line=line)}, {verdict.change(hi, line=line)}]"
    (fig,) = figures
    assert fig.layout.title.text.startswith("The race so far (interrupted after round 6): ")
    assert max(x for t in fig.data for x in t.customdata) == 6
    # Stopped before --min-rounds: nothing was decided, so no table or chart, and it says why.
    early = run_race(Race([c.case_id for c in cases], 12, Options(), comparisons=2), values, stop_after=2)
    store.write_tune(tmp_path, tune._record(Options(), [early], 0.0))
    page, run.tune = Page("t"), store.read_tune(tmp_path)
    page.figure, page.table = figures.append, tables.append
    recommendation.section(page, [run])
    said = " ".join(html.unescape(" ".join(page.parts)).split())
    assert "stopped after 2 rounds" in said and "before any round the race could decide (round 3" in said
    assert len(figures) == len(tables) == 1


def test_a_tune_across_worlds_draws_one_race_chart_per_world_named_by_its_world(tmp_path):
    """Each world races on its own rounds against its own leader. Drawn in one chart, the two
    worlds' lines ran side by side, both leaders at 1, and nothing said which world a line was in."""
    suite, cases, races = two_world_races(tmp_path, 12)
    charts = race_charts(tmp_path, suite, cases, races)
    assert len(charts) == 2
    for fig, size in zip(charts, (1, 2)):
        assert fig.layout.title.text.startswith(f"The race in the world of world_size={size}: ")
        arms = {c.label(["world_size", "slowdown_pct"]) for c in cases if c.world_size == size}
        assert {t.name for t in fig.data if t.mode == "lines+markers"} == arms
    # One world: one chart, its title naming no world.
    (alone,) = race_charts(tmp_path, suite, [c for c in cases if c.world_size == 1], races[:1])
    assert alone.layout.title.text.startswith("The race: ")


def test_a_tied_arms_low_end_on_the_margin_does_not_read_as_the_margin(tmp_path, capsys):
    """A tied arm's low end is at or above 1 / (1 + ε), a change of -1.96 % at ε = 2 %. One decimal
    wrote it "-2.0%", beside "it could no longer be 2% faster than the leader" (text, md, report):
    the number read as the margin the words said it was clear of. It reads "-1.96%"; an arm just
    below the line (not tied) keeps its one decimal, "-2.0%"."""
    from tpbench.cli import tune as cli

    assert verdict.signed_pct(1 / 1.02, verdict.tie_line(0.02)) == "-1.96%"
    assert verdict.signed_pct(1 / 1.02 - 1e-4, verdict.tie_line(0.02)) == "-2.0%"
    assert verdict.signed_pct(0.97, verdict.tie_line(0.02)) == "-3.0%"  # far from it: as before
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 0.5]", repeats=40))
    cases = tune.prepare(suite).cases
    values = synthetic({c.case_id: 1 + c.slowdown_pct / 100 for c in cases}, 40, seed=1)
    race = run_race(Race([c.case_id for c in cases], 40, Options(), comparisons=1), values)
    result = tune_answer.result(stored(tmp_path, suite), cases, [race], Options(), 0.0, NO_EVAL)
    assert result.state == tune_answer.TIED
    # The tied arm's low end on the line: retired, as racing.within_epsilon says.
    arms = [dataclasses.replace(a, lo=1 / 1.02) if a.status == tune_answer.TIED else a for a in result.arms]
    result = dataclasses.replace(result, arms=arms)
    for fmt in ("text", "md"):
        cli.print_tune(result, fmt)
        out = capsys.readouterr().out
        assert "could no longer be 2% faster" in out and "[-1.96%, " in out and "-2.0%" not in out
    store.write_tune(tmp_path, dataclasses.replace(tune._record(Options(), [race], 0.0), result=result))
    page = Page("t")
    recommendation.section(page, [tuned_run(tmp_path)])
    assert "[-1.96%, " in page.render() and "-2.0%" not in page.render()


def test_the_interval_spends_confidence_over_looks_and_comparisons():
    """The race's interval is sequential_ratio at its looks and comparisons: wider than a plain
    95 % paired interval, by the union bound."""
    from tpbench.analysis.stats import paired_ratio

    values = synthetic({"a": 1.0, "b": 1.1}, 8, noise=0.05)
    race = Race(["a", "b", "c"], 30, Options(min_rounds=5), comparisons=6)
    race.values, race.rounds = {"a": values["a"], "b": values["b"], "c": {}}, 8
    assert race.looks == 26
    spent, plain = race.interval("a", "b"), paired_ratio(values["a"], values["b"])
    assert spent.ratio == pytest.approx(plain.ratio)
    assert spent.lo < plain.lo and spent.hi > plain.hi


def test_replaying_stored_values_rebuilds_the_same_race():
    values = synthetic({"a": 1.0, "b": 1.03, "c": 1.3, "d": 1.6}, 20, noise=0.02, seed=3)
    live = run_race(Race(list(values), 20, Options(), comparisons=3), values)
    stored = {a: dict(live.values[a]) for a in values}  # what each arm ran: its repeats on disk
    again = Race(list(values), 20, Options(), comparisons=3)
    again.replay(stored)
    assert again.history == live.history and again.eliminated == live.eliminated and again.ended == live.ended
    assert again.retired == live.retired


@pytest.mark.parametrize(
    "bad",
    [
        ["--epsilon", "0"],
        ["--epsilon", "-2%"],
        ["--epsilon", "nan"],
        ["--epsilon", "two"],
        ["--epsilon", "2"],  # a bare number is a fraction: 200 %
        ["--confidence", "95"],
        ["--confidence", "0.5"],
        ["--confidence", "1"],
        ["--confidence", "inf"],
        ["--budget-s", "0"],
        ["--budget-s", "nan"],
        ["--budget-s", "inf"],
        ["--budget-s", "1e308"],
        ["--min-rounds", "1"],
        ["--out", "results\udcff"],
    ],
)
def test_bad_options_exit_2_before_anything_runs(tmp_path, capsys, bad):
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 10]"))
    assert run_cli(["tune", str(suite), "--out", str(tmp_path / "r"), *bad]) == 2
    assert bad[0] in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_resuming_a_tune_that_had_ended_says_so_and_shows_no_race_starting(tmp_path, capsys):
    """``tune --resume RUN`` of a tune that had ended races nothing, yet its progress line said
    "tune 2 settings starting…" on stderr. Now it says the tune had ended and shows its answer again."""
    from tpbench.cli import tune as cli

    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 40]", repeats=3))
    run, _ = tune.start(suite, Options(), out_root=tmp_path / "results")
    capsys.readouterr()
    for ended in (False, True):
        saved = store.read_tune(run.dir)
        answer = {"run_dir": str(run.dir), "claim": "x", "metric": "step_ms", "state": "tied", "arms": []}
        answer |= {"recommended": None, "rounds_to_decide": None}
        answer |= dict.fromkeys(("epsilon", "confidence", "wall_s", "timed_s", "grid_timed_s"), 0.5)
        store.write_tune(run.dir, dataclasses.replace(saved, result=TuneResult.from_json(answer)) if ended else saved)
        with cli._TuneDisplay()(run):
            pass
        said = capsys.readouterr().err
        assert said.startswith(f"Run directory: {run.dir}\n")
        assert ("starting…" in said) is not ended
        assert ("This tune had ended: nothing more to race; its answer again." in said) is ended


def test_compare_and_export_of_an_interrupted_tune_say_how_to_finish_it(tmp_path, capsys):
    """An interrupted tune's arms are pending: ``compare RUN`` said only "nothing to compare: no two
    finished cases differ in exactly one swept key" and ``export`` "no case has timed steps (2
    pending)", neither naming the resume that finishes them, nor the report that shows the race so far."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 40]", repeats=3))
    run, _ = tune.start(suite, Options(), out_root=tmp_path / "results")
    capsys.readouterr()
    for cmd in (["compare"], ["export", "--format", "pytest-benchmark"]):
        assert run_cli([*cmd, str(run.dir)]) == 2
        said = " ".join(capsys.readouterr().err.split())
        assert (
            f"(2 pending: an unfinished run; tpbench tune --resume {run.dir} finishes it, "
            f"tpbench report {run.dir} shows how far it got)"
        ) in said, said


def test_a_resumed_tune_s_elapsed_time_goes_on_from_the_time_tune_json_records(tmp_path, capsys):
    """A resumed tune's progress said "0:00:00 elapsed" though its budget counts its earlier
    sessions' time too (tune.json's ``wall_s``): its display now starts from that time."""
    from tpbench.cli import tune as cli

    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 40]", repeats=3))
    run, _ = tune.start(suite, Options(), out_root=tmp_path / "results")
    store.write_tune(run.dir, dataclasses.replace(store.read_tune(run.dir), wall_s=90.0))
    capsys.readouterr()
    with cli._TuneDisplay()(run):
        pass
    assert "tune 2 settings, starting… (0:01:30 elapsed)" in capsys.readouterr().err


@pytest.mark.ranks
def test_a_tune_whose_stderr_is_no_terminal_says_its_judged_rounds_on_plain_lines(tmp_path, capsys):
    """Away from a terminal (a file or a pipe; capsys's is one) rich drew the race's progress line
    once, at the end, cut to the width ("… round 30: 2 sett…"): a log polled during the tune held
    only the run directory. A judged round that decided an arm, and the one the race ended with, is
    now a line of its own, uncut, as it is judged (the others, paced, are tests/test_progress.py's)."""
    suite = planted(tmp_path, "[0, 40]", repeats=4)
    run_cli(["tune", str(suite), "--out", str(tmp_path / "r"), "--min-rounds", "2", "--format", "json"])
    rounds = store.read_tune(only_run(tmp_path / "r")).history
    said = capsys.readouterr().err.splitlines()
    judged = [line for line in said if line.startswith("tune round ")]
    decided = {f"tune round {e.round}/4" for e in rounds if e.eliminated or e.retired or e.back or e.ended}
    heads = {line.split(":")[0] for line in judged}
    assert decided and decided <= heads <= {f"tune round {e.round}/4" for e in rounds}, said
    assert all(", leader ddp slowdown_pct=" in line and line.endswith(" elapsed)") for line in judged), judged
    assert said[1].startswith("tune 2 settings, starting… (") and not any("━" in line for line in said)


def test_resuming_a_directory_that_is_not_there_says_so(tmp_path, capsys):
    """As ``sweep --resume`` does (it used to say "no tune.json; not a tune")."""
    assert run_cli(["tune", "--resume", str(tmp_path / "none")]) == 3
    assert f"{tmp_path / 'none'}: no such run directory" in capsys.readouterr().err


def test_resuming_a_folder_that_holds_no_run_says_so_not_that_it_is_a_sweep(tmp_path, capsys):
    """An empty folder, or a results root given for its run, was told "no tune.json; not a tune
    (resume a sweep with tpbench sweep)", though it held no sweep either: now as ``sweep --resume``
    says it, naming the runs a root holds."""
    empty, root = tmp_path / "empty", tmp_path / "results"
    empty.mkdir()
    (root / "zero" / "20260101T000000Z-abcdef").mkdir(parents=True)
    (root / "zero" / "20260101T000000Z-abcdef" / "run.json").write_text("{}")
    assert run_cli(["tune", "--resume", str(empty)]) == 3
    err = " ".join(capsys.readouterr().err.split())
    assert f"{empty} is not a tpbench run (or its sweep never started)" in err and "not a tune" not in err
    assert run_cli(["tune", "--resume", str(root)]) == 3
    err = " ".join(capsys.readouterr().err.split())
    assert f"{root} is not a tpbench run but holds 1 run (the latest: {root}/zero/20260101T000000Z-abcdef)" in err


def test_a_resume_with_dry_run_is_refused_and_races_nothing(tmp_path, capsys):
    """``tune --resume RUN_DIR --dry-run`` of a tune stopped before its first round: the dry run was
    ignored and the resume raced every round left (24 s, exit 4). Now refused (exit 2) with what to
    run instead, and the run is as it was: no world started, no round in tune.json."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 10]", repeats=4))
    run, _ = tune.start(suite, Options(), out_root=tmp_path / "r")
    assert run_cli(["tune", "--resume", str(run.dir), "--dry-run"]) == 2
    assert "--dry-run with --resume: a resumed tune has no dry run" in capsys.readouterr().err
    assert store.read_tune(run.dir).history == []
    assert set(run.case_status().values()) == {store.PENDING}


def test_epsilon_and_confidence_take_a_percentage_or_a_fraction(tmp_path, capsys):
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 10]", repeats=4))
    for eps, conf in (("3%", "90%"), ("0.03", "0.9")):
        assert run_cli(["tune", str(suite), "--epsilon", eps, "--confidence", conf, "--dry-run"]) == 0
    capsys.readouterr()
    assert run_cli(["tune", str(suite), "--epsilon", "2", "--dry-run"]) == 2
    assert "--epsilon 2 (200%): expected a margin above 0 and below 1, like 0.02 (or 2%)" in capsys.readouterr().err
    assert run_cli(["tune", str(suite), "--epsilon", "100%", "--dry-run"]) == 2
    assert "--epsilon 100%: expected" in capsys.readouterr().err  # as typed, not the 1 it reads as
    assert run_cli(["tune", str(suite), "--confidence", "95", "--dry-run"]) == 2
    assert "--confidence 95 (9500%): expected a number above 0.5 and below 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["tune", "SUITE", "--dry-run", "--epsilon", "-1%"],
            "--epsilon -1%: expected a margin above 0 and below 1",
        ),
        (
            ["tune", "SUITE", "--dry-run", "--confidence", "-5%"],
            "--confidence -5%: expected a number above 0.5 and below 1",
        ),
        (["tune", "SUITE", "--dry-run", "--budget-s", "-1e3"], "--budget-s -1e3: expected a number of seconds > 0"),
        (["sweep", "SUITE", "--dry-run", "--target-ci", "-5%"], "--target-ci -5%: expected a percentage like 5%"),
        (["compare", "A", "B", "--threshold", "-5%"], "--threshold -5%: expected a value in [0%, 100%)"),
        (["gate", "SUITE", "--baseline", ".", "--candidate", ".", "--threshold", "-5%"], "--threshold -5%: expected"),
    ],
)
def test_a_negative_value_is_refused_by_its_option_check(tmp_path, capsys, args, said):
    """A negative value argparse does not take for a number ("-1%") reached no check: argparse said
    "argument --epsilon: expected one argument", as if none was given. Now the option's own message."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 10]", repeats=4))
    assert run_cli([str(suite) if a == "SUITE" else a for a in args]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert said in err and "expected one argument" not in err
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["sweep", "SUITE", "--dry-run", "-5%"], "tpbench sweep: error: unrecognized arguments: -5%"),
        (["compare", "A", "B", "--fail-on-inconclusive", "-1%"], "tpbench compare: error: unrecognized arguments: -1%"),
        (["sweep", "SUITE", "--dry-run", "--epsilon", "-5%"], "unrecognized arguments: --epsilon -5%"),
        (["sweep", "SUITE", "--dry-run", "--eps", "-5%"], "unrecognized arguments: --eps -5%"),
        (["tune", "SUITE", "--dry-run", "--eps", "-5%"], "--epsilon -5%: expected a margin above 0 and below 1"),
    ],
)
def test_a_negative_value_after_a_flag_or_another_commands_option_is_named_as_typed(tmp_path, capsys, args, said):
    """A negative value was joined to whatever option came before it: after a flag argparse said
    "argument --dry-run: ignored explicit argument '-5%'", and after an option the command lacks,
    "unrecognized arguments: --epsilon=-5%", a form nobody typed. Only an option of the command that
    takes one value (or its abbreviation, as argparse allows) takes it now."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 10]", repeats=4))
    assert run_cli([str(suite) if a == "SUITE" else a for a in args]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert said in err and "ignored explicit argument" not in err and "=-" not in err


@pytest.mark.parametrize(
    "args",
    [["--nnodes", "2"], ["--launcher", "torchrun", "--nnodes", "0"], ["--launcher", "torchrun", "--nnodes", "2"]],
)
def test_a_launcher_option_refused_is_said_by_tune(tmp_path, capsys, args):
    """The torchrun options' errors, shared with sweep, said "tpbench sweep: error: ..." to a tune."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 10]", repeats=4))
    assert run_cli(["tune", str(suite), "--dry-run", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tpbench tune: error: --nnodes") and "tpbench sweep" not in err


def test_a_dry_run_prints_its_plan_in_the_format_asked(tmp_path, capsys):
    """``--format json`` printed the text table, which a script reading the answer cannot parse."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 10]", repeats=4))
    assert run_cli(["tune", str(suite), "--dry-run", "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["dry_run"] is True and plan["max_rounds"] == 4
    assert [a["params"]["slowdown_pct"] for a in plan["settings"]] == [0, 10]
    assert plan["settings"][0]["world"] == "2×gloo/cpu loopback"
    assert run_cli(["tune", str(suite), "--dry-run", "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert "2 settings to race, at most 4 rounds (dry run)" in md
    assert "| case_id | setting | world | steps per round (warm-up + timed) |" in md
    assert "| 2 + 4 |" in md  # tiny_suite's warm-up and timed steps, run every round an arm races
    # The text table said "repeats × steps", 4×8: as if every arm ran every round; both now say the same.
    assert run_cli(["tune", str(suite), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "steps per round (warm-up + timed)" in text and "2 + 4" in text and "repeats" not in text


@pytest.mark.parametrize(
    "args, said",
    [
        # A swept repeats: the race stopped at the fewest while the other arms ran rounds nobody
        # judged, and the tune claimed it cost 152 % of the grid.
        (["--set", "repeats=[4, 6]"], "repeats = [4, 6]: expected one value for every arm"),
        # Fewer rounds than --min-rounds: nothing is ever judged, the tune could only end unresolved
        # ("within 92846.8% of the best" on the smoke suite's 2 repeats).
        (["--set", "repeats=2"], "repeats = 2: expected at least --min-rounds 3"),
        (["--min-rounds", "5"], "repeats = 4: expected at least --min-rounds 5"),
        (["--set", "slowdown_pct=0"], "1 case; a tune races two or more settings"),
        (["--filter", "slowdown_pct=0"], "1 case after --filter; a tune races two or more settings"),
        # It was overridden without a word.
        (["--set", "capture.profiler_steps=3"], "--set capture.profiler_steps=3: a tune traces nothing"),
    ],
)
def test_a_grid_the_race_cannot_judge_is_refused_with_exit_2(tmp_path, capsys, args, said):
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 10]", repeats=4))
    for dry in (["--dry-run"], ["--out", str(tmp_path / "r")]):
        assert run_cli(["tune", str(suite), *args, *dry]) == 2
        assert said in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def planted(tmp_path, slowdowns: str = "[0, 5, 40]", repeats: int = 14):
    """Arms of one compute-bound case, slower by planted CPU work: suites/gate.toml's (about 15 ms a
    step on 2 ranks). Smaller steps are mostly Gloo's latency, whose jitter on a contended 2-core
    machine (one rank now and then at half speed) hides even a 40 % slowdown."""
    suite = tmp_path / "planted.toml"
    text = tiny_suite(
        f"slowdown_pct = {slowdowns}",
        slowdown_kind='"cpu"',
        repeats=repeats,
        batch_size=512,
        steps=6,
        mlp={"width": 256, "depth": 4},
    )
    suite.write_text(text)
    return suite


@pytest.mark.ranks
def test_a_planted_tune_eliminates_the_slow_arm_early_and_prints_its_json(tmp_path, capsys):
    """Two arms 0.2 % apart with a 0.2 % margin are not decided in 14 rounds (a tie needs the
    runner-up's interval within about ±0.4 %, far below a 2-core machine's scatter), so the race runs
    on after the 40 % arm is out, however quiet the machine. Closer margins did not hold: 5 % apart
    with a 5 % margin, a quiet machine once tied them at the third round, and 1 % apart with a 1 %
    margin at the fourth (a fresh clone's CI), each the round that eliminated the slow arm: the
    runner-up's interval, a few times its standard error wide, then had only to lie a standard
    error or so above its gap."""
    suite = planted(tmp_path, "[0, 0.2, 40]")
    args = ["tune", str(suite), "--out", str(tmp_path / "r"), "--min-rounds", "3", "--epsilon", "0.2%"]
    code = run_cli([*args, "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == (4 if doc["state"] == "unresolved" else 0)
    assert set(doc) >= {"recommended", "epsilon", "confidence", "metric", "claim", "arms"}
    assert set(doc) >= {"wall_s", "timed_s", "grid_timed_s"}
    assert doc["epsilon"] == 0.002 and doc["confidence"] == 0.95 and doc["metric"] == "step_ms"
    arms = {a["params"]["slowdown_pct"]: a for a in doc["arms"]}
    assert set(arms) == {0, 0.2, 40}
    for a in doc["arms"]:
        assert set(a) >= {"case_id", "params", "status", "rounds", "ratio", "lo", "hi"}
        assert a["status"] in ("recommended", "tied", "eliminated", "unresolved")
    slow = arms[40]
    assert slow["status"] == "eliminated"
    # Nothing more once out (retired first, it may be eliminated a few rounds after its last).
    assert slow["rounds"] <= slow["eliminated_at"] and slow["rounds"] < max(a["rounds"] for a in doc["arms"])
    # It went by its interval against that round's leader (clearly above 1); the table's interval
    # is against the arm recommended at the end, over the rounds it ran.
    went = store.read_tune(only_run(tmp_path / "r")).history[slow["eliminated_at"] - 1]
    assert slow["case_id"] in went.eliminated and went.intervals[slow["case_id"]][1] > 1, went
    # ... and the arm says so itself: the leader then, and the interval that lay above 1.
    vs = slow["eliminated_vs"]
    assert vs["leader"] == went.leader and (vs["ratio"], vs["lo"], vs["hi"]) == went.intervals[slow["case_id"]]
    assert all(a["eliminated_vs"] is None for a in doc["arms"] if a["status"] != "eliminated")
    # The mlp evaluates no held-out loss: no arm has one, and there is nothing to say of training.
    assert doc["training_note"] is None and all(a["heldout_loss"] is None for a in doc["arms"])
    assert doc["recommended"]["params"]["slowdown_pct"] in (0, 0.2)
    assert doc["claim"].startswith(next(a["label"] for a in doc["arms"] if a["status"] == "recommended"))
    assert 0 < doc["timed_s"] < doc["grid_timed_s"]
    # An ordinary run: tune.json versioned, every arm done with the rounds it ran, readable by all.
    run_dir = only_run(tmp_path / "r")
    saved = store.read_tune(run_dir)
    assert saved.result.claim == doc["claim"] and saved.history[-1].round == max(a["rounds"] for a in doc["arms"])
    loaded = store.load(run_dir)
    assert loaded.record.status == "complete"
    ran = loaded.steps.groupby("case_id")["repeat"].nunique().to_dict()
    assert ran == {a["case_id"]: a["rounds"] for a in doc["arms"]}
    # Every arm's memory and DDP buckets are counted, the 40 % arm's too, though it stopped before its
    # last round: counted on the last alone, the report's memory sections left out every arm the race
    # stopped, and said nothing of them.
    for a in doc["arms"]:
        for table in ("memory", "ddp_buckets"):
            counted = store.read_case_table(run_dir, a["case_id"], table)
            assert counted is not None and len(counted), (a["label"], a["status"], table)
    # Each round's arms stepped in turn, the order reversed every step: read off rank 0's step ends
    # (seconds since the round began), which one repeat after another would not order so.
    world = store.read_run_json(run_dir)["worlds"][0]
    assert world["steps_interleaved"]
    first = [cid for cid, r in world["schedule"] if r == 0]
    steps = loaded.steps[(loaded.steps["repeat"] == 0) & (loaded.steps["rank"] == 0)]
    warmup, timed = (
        steps[steps["phase"] == p].sort_values("elapsed_s")["case_id"].tolist() for p in ("warmup", "timed")
    )
    per_arm = [len(warmup) // len(first), len(timed) // len(first)]  # warm-up, then timed: each from turn 0
    turns = [first if i % 2 == 0 else first[::-1] for n in per_arm for i in range(n)]
    assert warmup + timed == [c for turn in turns for c in turn]
    assert run_cli(["compare", str(run_dir)]) in (0, 1, 4)
    capsys.readouterr()
    assert run_cli(["export", "--format", "pytest-benchmark", str(run_dir)]) == 0
    capsys.readouterr()
    assert run_cli(["whatif", str(run_dir)]) == 3  # nothing to replay: it says why, and what would give it
    assert "no case was traced (a tune traces nothing)" in capsys.readouterr().err
    assert run_cli(["report", str(run_dir), "-o", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text()
    assert page.index(">Recommendation<") < page.index(">Environment<")  # the report opens with it
    # Arms told apart by a planted slowdown, a key of the setting and not a tuning knob: each read as
    # "the only case there" in the Verdicts. They are the race's, compared in its Recommendation.
    assert "the only case there" not in page and "settings this tune raced: compared in its Recommendation" in page
    assert doc["claim"].split(":")[0] in page
    assert "intervals at 95% confidence spent" in page and "{result[" not in page  # its method, filled in
    assert verdict.eliminated_vs_text(vs) in html.unescape(re.sub(r"</?span[^>]*>", "", page))  # interval spans off
    assert doc["recommended"]["case_id"] in doc["trace_step"] and doc["trace_step"] in html.unescape(page)
    # Resumed once it has ended, it races nothing more and says the same, its wall time its own.
    assert run_cli(["tune", "--resume", str(run_dir), "--format", "json"]) == code
    again = json.loads(capsys.readouterr().out)
    assert again["wall_s"] == doc["wall_s"] and again["claim"] == doc["claim"] and again["arms"] == doc["arms"]
    # Resumed as a sweep it would run the eliminated arms to their last repeat and leave tune.json
    # stale: refused, with the command that resumes it.
    for dry in ([], ["--dry-run"]):
        assert run_cli(["sweep", "--resume", str(run_dir), *dry]) == 3
        assert "a tune (it has tune.json); resume it with tpbench tune --resume" in capsys.readouterr().err


@pytest.mark.ranks
def test_a_spent_budget_ends_unresolved_with_its_own_exit_code(tmp_path, capsys):
    suite = planted(tmp_path, "[0, 3]")
    assert run_cli(["tune", str(suite), "--out", str(tmp_path / "r"), "--budget-s", "1", "--format", "json"]) == 4
    doc = json.loads(capsys.readouterr().out)
    assert doc["state"] == "unresolved" and "budget spent" in doc["claim"]
    assert {a["rounds"] for a in doc["arms"]} == {1}  # the budget is checked after each round
    assert store.read_tune(only_run(tmp_path / "r")).worlds["0"].ended == BUDGET


@pytest.mark.ranks
def test_resume_after_sigkill_runs_no_round_twice_and_loses_none(tmp_path, capsys):
    # Nothing is judged before the sixth round and the tune is killed after its fourth: however
    # quiet the machine, it is still running then, and what the killed session left (at most a
    # fifth round timed and not judged) cannot end it on replay, so the resumed tune races on. (With
    # --min-rounds 3 a quiet machine could decide arms 1 % apart inside the 2 % margin from rounds
    # the killed session had timed, and the resume launched nothing.)
    suite = planted(tmp_path, "[0, 1, 40]", repeats=10)
    out = tmp_path / "r"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpbench", "tune", str(suite), "--out", str(out), "--min-rounds", "6"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            runs = list(store.iter_runs(out)) if out.is_dir() else []
            saved = store.read_tune(runs[0]) if runs and (runs[0] / store.TUNE_FILE).exists() else None
            if saved and len(saved.history) >= 4:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the tune ended before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)  # the tune and its ranks: nothing can clean up
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    run_dir = only_run(out)
    before = {c: store.finished_repeats(run_dir, c) for c in store.read_run_json(run_dir)["cases"]}
    worlds_before = len(store.read_run_json(run_dir)["worlds"])
    # The killed session's time is counted (it was only added as a session ended: the timed steps
    # then outran the run's wall time).
    timed = sum(slowest_rank(store.case_steps(run_dir, c).assign(case_id=c))["step_ms"].sum() / 1e3 for c in before)
    wall_before = store.read_run_json(run_dir).get("wall_s", 0.0)
    assert wall_before >= timed > 0
    code = run_cli(["tune", "--resume", str(run_dir), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code in (0, 4)
    meta = store.read_run_json(run_dir)
    assert meta["wall_s"] > wall_before and meta["efficiency"]["timed_share"] <= 1
    rerun = {tuple(item) for w in meta["worlds"][worlds_before:] for item in w["schedule"]}
    assert not any((c, r) in rerun for c, rs in before.items() for r in rs), "a finished round ran again"
    steps = store.load(run_dir).steps
    history = store.read_tune(run_dir).history
    for case_id, arm in steps.groupby("case_id"):
        # None lost: each arm ran every round it was live for (the first, then each after a round
        # left it running), and none other: a retired arm brought back sits out the rounds between.
        live = {0} | {e.round for e in history[:-1] if case_id in e.live}
        assert set(arm["repeat"].unique()) == live, case_id
        assert not arm.duplicated(["repeat", "rank", "step", "phase"]).any()
    rounds = [e.round for e in history]
    assert rounds == list(range(1, len(rounds) + 1))  # every round judged once, in order
    assert rounds[-1] == max(a["rounds"] for a in doc["arms"])
    if doc["next_step"]:  # unresolved: about how long the race it names would take, from the steps timed here
        assert doc["decide_wall_s"] > 0


def test_arms_of_two_worlds_are_raced_apart_and_their_winners_compared_unpaired(tmp_path):
    """World size 1 and 2 cannot share rounds: each world's race, then the winners unpaired. The
    2-rank world's winner is 30 % slower than the 1-rank one's: the whole world goes."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("world_size = [1, 2]\nslowdown_pct = [0, 40]", repeats=20))
    cases = tune.prepare(suite).cases
    groups = launch.group_cases(cases)
    assert len(groups) == 2
    races = []
    for i, g in enumerate(groups):
        world = {c.case_id: (1.3 if c.world_size == 2 else 1.0) * (1.4 if c.slowdown_pct else 1.0) for c in g.cases}
        values = synthetic(world, 20, seed=i)
        races.append(run_race(Race(list(world), 20, Options(), comparisons=len(cases) - 1, world=i), values))
    result = tune_answer.result(stored(tmp_path, suite), cases, races, Options(), 0.0, NO_EVAL)
    by = {(a.params["world_size"], a.params["slowdown_pct"]): a for a in result.arms}
    assert by[(1, 0)].status == "recommended" and result.state == "recommended"
    assert by[(1, 40)].status == by[(2, 40)].status == "eliminated" and by[(1, 40)].eliminated_at == MIN_ROUNDS
    assert by[(2, 0)].status == "eliminated" and by[(2, 0)].eliminated_at is None  # across worlds
    assert by[(2, 0)].lo > 1 and result.claim.startswith(by[(1, 0)].label + ": the best of 4 settings")


def test_the_help_states_the_default_min_rounds():
    from tpbench.cli import build_parser

    tune_parser = build_parser()._subparsers._group_actions[0].choices["tune"]
    (action,) = [a for a in tune_parser._actions if "--min-rounds" in a.option_strings]
    assert f"(default: {MIN_ROUNDS})" in action.help


def test_an_arm_brought_back_for_the_last_round_is_ended_with_the_repeats_it_ran(tmp_path):
    """A retired arm brought back in time for the last round (``repeats``) ends that round with
    fewer repeats than planned, their numbers with a gap (0, 1 and 3 of 4, say). Its world's
    ``case_end`` must not finish it as if all 4 were there (that raised "expected 4 repeats, found 3"
    and failed the whole tune with exit 3, seen on the front door); the race's end cuts it with the
    3 it ran. The world's events are read back as ``--resume`` reads a printed world's."""
    from synthetic_runs import make_run

    from tpbench.launch import PrintedWorldRecord, Supervisor
    from tpbench.suite import Case

    src = store.load(make_run(tmp_path / "src", {"ddp": [10.0, 11.0, 10.5, 10.2]}))
    (params,) = [dict(c.params) for c in src.record.cases.values()]
    run = store.Run.create(tmp_path / "results", "t", "t.toml", "", [params], {})
    case = Case.from_params(params)
    for r in (0, 1, 3):
        store.write_repeat(run.dir, case.case_id, r, src.steps[src.steps["repeat"] == r])
    events = run.dir / "events" / "w0"
    events.mkdir(parents=True)
    lines = [
        {"event": "world_ready", "t": 1.0, "world": "w0", "nodes": []},
        {"event": "round_start", "t": 1.0, "items": [[case.case_id, 3]]},
        {"event": "repeat_end", "t": 1.5, "case": case.case_id, "repeat": 3, "median_ms": 10.2},
        {"event": "case_end", "t": 1.5, "case": case.case_id},
        {"event": "world_done", "t": 1.6, "world": "w0"},
    ]
    (events / "rank0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    outcome = Supervisor(PrintedWorldRecord(run.dir, "w0", 2), {case.case_id: case}, run, lambda k, e: None).supervise()
    assert outcome.cause is None and outcome.completed == {(case.case_id, 3)}
    assert run.case_status()[case.case_id] == store.RUNNING
    tune._cut(run, [case])
    assert run.record.cases[case.case_id].status == store.DONE
    assert sorted(store.load(run.dir).steps["repeat"].unique()) == [0, 1, 3]


@pytest.mark.ranks
def test_trace_says_where_the_recommended_settings_time_goes_beside_its_closest_rival(tmp_path, capsys):
    """``--trace``: after the race, a sweep traces the recommended arm and its closest rival, as the
    tune ran them, beside the tune's run; each one's parts (explain's) add up to the step time the
    tune measured for it, and the terminal, tune.json and the report's Recommendation carry them.
    Two arms 1 % apart in 2 rounds, one look: an interval over 2 rounds (1 degree of freedom) all but
    never decides, and the other arm is the closest rival either way (eliminated, it is the runner-up)."""
    suite = planted(tmp_path, "[0, 1]", repeats=2)
    args = ["tune", str(suite), "--out", str(tmp_path / "r"), "--min-rounds", "2", "--trace", "--format", "md"]
    code = run_cli(args)
    printed = capsys.readouterr().out
    assert code in (0, 4), printed
    runs = list(store.iter_runs(tmp_path / "r"))
    (tuned,) = [r for r in runs if store.read_tune(r) is not None]
    result = store.read_tune(tuned).result
    where = result.where
    traced = Path(where["run_dir"])
    assert set(runs) == {tuned, traced} and traced.parent == tuned.parent
    arms = where["arms"]
    assert [a["role"] for a in arms] == ["recommended", "closest rival"]
    assert arms[0]["case_id"] == result.recommended.case_id
    # The race's time, the trace's composition: the recommended arm's geometric mean over its rounds,
    # the rival's that times its ratio in the tune's table (paired over the rounds both ran).
    steps = store.load(tuned).steps
    own = (
        steps[steps["case_id"] == arms[0]["case_id"]]
        .groupby("repeat")
        .apply(lambda r: r[r["phase"] == "timed"].groupby("step")["step_ms"].max().median())
    )
    assert arms[0]["step_ms"] == pytest.approx(float(np.exp(np.log(own).mean())))
    rival = next(a for a in result.arms if a.case_id == arms[1]["case_id"])
    assert arms[1]["step_ms"] == pytest.approx(arms[0]["step_ms"] * rival.ratio)
    for a in arms:
        assert a["traced_steps"] == tune_answer.TRACE_STEPS
        assert sum(a["parts_ms"].values()) == pytest.approx(a["step_ms"])
        assert a["parts_ms"]["compute"] > 0
    # The trace run: the same two cases, one repeat each, traced; the race's run untouched by it.
    loaded = store.load(traced)
    assert set(loaded.cases["case_id"]) == {a["case_id"] for a in arms}
    assert set(loaded.cases["repeats"]) == {1} and set(loaded.cases["profiler_steps"]) == {tune_answer.TRACE_STEPS}
    assert all(store.read_case_table(traced, a["case_id"], "intervals") is not None for a in arms)
    assert store.load(tuned).steps.groupby("case_id")["repeat"].nunique().max() == 2
    assert where["sentence"].startswith(f"{arms[1]['step_ms'] - arms[0]['step_ms']:+.2f} ms a step")
    text = " ".join(printed.split())
    assert "Where the time goes (traced after the race, 5 steps each" in text and where["sentence"] in text
    assert "| setting | role | step ms | compute ms |" in text and "tpbench sweep" not in text
    page = Page("t")
    recommendation.section(page, [tuned_run(tuned)])
    body = html.unescape(page.render())
    assert 'id="where-time-goes"' in body and where["sentence"] in body
    # Resumed after it ended, the tune shows its answer again, where the time goes included (the
    # result rebuilt from the race used to drop it, and the report with it).
    assert run_cli(["tune", "--resume", str(tuned), "--format", "json"]) == code
    assert json.loads(capsys.readouterr().out)["where"] == where == store.read_tune(tuned).result.where


def _tune_in_its_session(args: list[str], stdout: int) -> subprocess.Popen:
    """``tpbench ARGS`` in a process group of its own, stderr piped, for a test to SIGINT as a terminal
    does. A test run started in the background by a shell without job control inherits SIGINT ignored
    (its tune then ran to the end); the child gets the disposition a terminal's user meets."""
    return subprocess.Popen(
        [sys.executable, "-m", "tpbench", *args],
        cwd=REPO,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


@pytest.mark.ranks
def test_ctrl_c_during_the_trace_stops_the_trace_only_and_the_tunes_answer_stands(tmp_path):
    """Ctrl-C (SIGINT to the tune's process group, as a terminal sends it; the ranks run in sessions
    of their own) once the race has ended and the trace sweep has started: the trace stops, its ranks
    with it, and the tune still prints its answer and exits as the race ended (0 or 4), tune.json
    keeping the race without a ``where``."""
    suite = planted(tmp_path, "[0, 1]", repeats=2)
    out = tmp_path / "r"
    args = ["tune", str(suite), "--out", str(out), "--min-rounds", "2", "--trace", "--format", "json"]
    proc = _tune_in_its_session(args, stdout=subprocess.PIPE)
    try:
        said = []
        for line in proc.stderr:
            said.append(line)
            if "Run directory:" in line and any("Tracing the recommended setting" in s for s in said):
                time.sleep(0.5)  # the trace sweep has its run and is starting its world
                os.killpg(proc.pid, signal.SIGINT)
                break
        stdout, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    said = "".join(said) + rest
    assert "Tracing the recommended setting" in said, said
    assert proc.returncode in (0, 4), said
    assert "No trace (interrupted); the tune's answer stands." in " ".join(said.split())
    doc = json.loads(stdout)
    assert doc["claim"] and doc.get("where") is None
    runs = list(store.iter_runs(out))
    (tuned,) = [r for r in runs if store.read_tune(r) is not None]
    assert store.read_tune(tuned).result.where is None
    assert len(runs) == 2  # the trace run started beside the tune's, and was stopped
    with pytest.raises(ProcessLookupError):  # nothing of the tune's process group is left running
        os.killpg(proc.pid, 0)


@pytest.mark.ranks
def test_ctrl_c_before_any_round_was_judged_says_so_not_that_the_race_so_far_is_kept(tmp_path):
    """Ctrl-C as the tune's world starts (SIGINT to its process group once the run directory is
    said, long before the ranks' first round ends): nothing was judged, and "The race so far is
    kept" promised a race that tune.json does not hold. The line says no round was judged and how
    to resume, and the run is resumable."""
    suite = planted(tmp_path, "[0, 40]", repeats=4)
    proc = _tune_in_its_session(["tune", str(suite), "--out", str(tmp_path / "r")], stdout=subprocess.DEVNULL)
    try:
        first = proc.stderr.readline()
        os.killpg(proc.pid, signal.SIGINT)
        said = " ".join((first + proc.communicate(timeout=120)[1]).split())
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    run_dir = only_run(tmp_path / "r")
    assert first.startswith("Run directory:") and proc.returncode == 130, said
    assert store.read_tune(run_dir).history == [] and "race so far" not in said
    assert (
        "Interrupted. No round was judged yet (the worlds were starting or running the first round): the run keeps "
        f"the tune's settings and options, and a resume starts its race. Resume with: tpbench tune --resume {run_dir}"
    ) in said


def test_an_interval_that_eliminated_an_arm_never_reads_as_holding_no_change():
    """An elimination rests on an interval lying above 1; a low end of 1.0004 printed at one decimal
    read "[+0.0%, …]" in the table (seen on a real tune). It keeps as many decimals as its sign needs."""
    said = verdict.eliminated_vs_text({"leader": "a", "ratio": 1.164, "lo": 1.0004, "hi": 1.354})
    assert said == "+16.4% [+0.04%, +35.4%] vs that round's leader"
    assert [verdict.signed_pct(r) for r in (1.0, 0.99996, 1.00001, 1.0000001, 1.085)] == [
        "+0.0%",
        "-0.004%",
        "+0.001%",
        "+0.0%",
        "+8.5%",
    ]


def test_the_closest_rival_traced_is_the_nearest_tied_or_unresolved_arm_else_the_nearest_eliminated():
    def arm(cid: str, status: str, ratio: float | None) -> TuneArm:
        return TuneArm(case_id=cid, label=cid, params={}, status=status, rounds=3, **NO_RATIO | {"ratio": ratio})

    rec = arm("a", tune_answer.RECOMMENDED, None)
    tied, near, far = (
        arm("t", tune_answer.TIED, 1.04),
        arm("e1", tune_answer.ELIMINATED, 1.02),
        arm("e2", tune_answer.ELIMINATED, 1.5),
    )
    assert tune_answer.traced_arms([far, near, tied, rec]) == [
        rec,
        tied,
    ]  # a tie first, though an eliminated arm is nearer
    assert tune_answer.traced_arms([far, near, rec]) == [rec, near]  # else the runner-up: why it is slower
    assert tune_answer.traced_arms([rec, arm("f", tune_answer.FAILED, None)]) == [rec]
    assert (
        tune_answer.traced_arms([arm("u", tune_answer.UNRESOLVED, 1.0), far]) == []
    )  # nothing recommended, nothing traced


def test_the_trace_sweep_traces_whole_averaging_windows_and_the_cases_as_the_tune_ran_them():
    """Post-local SGD averages every ``averaging_period``-th step: the trace of a setting holds whole
    windows (5 steps would hold no averaging of a period of 16), one repeat, one trace window."""
    text = localsgd_suite("averaging_period = [4, 16]", name="ls", start_localSGD_iter=0, steps=32, repeats=9)
    cases = expand(parse(text))
    record = SimpleNamespace(
        suite=SimpleNamespace(text=text, path=None, name="ls"),
        cases={c.case_id: SimpleNamespace(params=c.params()) for c in cases},
    )
    prepared = tune_trace.prepared(SimpleNamespace(record=record), [c.case_id for c in cases])
    assert {c.averaging_period: c.profiler_steps for c in prepared.cases} == {4: 8, 16: 16}
    assert all(c.repeats == 1 and c.trace_windows == 1 and c.steps == 32 for c in prepared.cases)
    assert [c.case_id for c in prepared.cases] == [c.case_id for c in cases]  # the same settings, by id


def test_the_reports_race_table_names_a_cpu_ms_races_ratios() -> None:
    """The report's table headed its ratios "vs recommended" whatever was raced; the terminal says
    "vs recommended (CPU time per step)" of a cpu_ms tune, and so does the report now."""
    from tpbench.report.recommendation import _table

    arm = TuneArm(
        case_id="a",
        label="a",
        params={},
        status="recommended",
        rounds=3,
        ratio=1.0,
        lo=None,
        hi=None,
        eliminated_at=None,
    )
    result = {"run_dir": "r", "state": "recommended", "recommended": None, "claim": "x", "arms": []}
    result |= {"epsilon": 0.02, "confidence": 0.95, "rounds_to_decide": None}
    result |= dict.fromkeys(("wall_s", "timed_s", "grid_timed_s"), 1.0)
    for metric, heading in (("cpu_ms", "vs recommended (CPU time per step)"), ("step_ms", "vs recommended")):
        table = _table(dataclasses.replace(TuneResult.from_json(result | {"metric": metric}), arms=[arm]))
        assert heading in table.columns, list(table.columns)


def test_the_terminal_and_the_report_write_an_arms_time_to_target_with_one_function(capsys) -> None:
    """The report's Recommendation table and the terminal's each formatted an arm's time to the target
    themselves (``_to_target`` in one, inline in the other): one change to either would set the two
    tables apart. Both now head and write the cell with ``verdict.TO_TARGET`` and ``verdict.to_target``."""
    from tpbench import verdict
    from tpbench.cli import tune as cli
    from tpbench.report.recommendation import _table

    def arm(name: str, seconds: float | None) -> TuneArm:
        fields = {"case_id": name, "label": name, "params": {}, "status": "unresolved", "rounds": 3, "ratio": 1.0}
        return TuneArm(**fields, lo=None, hi=None, eliminated_at=None, time_to_target_s=seconds)

    arms = [arm("a", 2.2049), arm("b", None), arm("c", 12.345)]
    result = {"run_dir": "r", "state": "unresolved", "recommended": None, "claim": "x", "arms": []}
    result |= {"epsilon": 0.02, "confidence": 0.95, "rounds_to_decide": None, "metric": "step_ms"}
    result |= dict.fromkeys(("wall_s", "timed_s", "grid_timed_s"), 1.0)
    answer = dataclasses.replace(TuneResult.from_json(result), arms=arms)
    written = [verdict.to_target(a.time_to_target_s) for a in arms]
    assert written == ["2.2", "—", "12.3"]
    assert _table(answer)[verdict.TO_TARGET].tolist() == written
    cli.print_tune(answer, "md")
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert table[0].rstrip(" |").endswith(verdict.TO_TARGET)
    assert [row.rstrip(" |").rsplit(" | ", 1)[1] for row in table[1:]] == written


def test_the_trace_sentence_keeps_each_interval_end_on_its_side_of_no_change() -> None:
    """A part named as excluding no change read "optimizer +0.04 ms [+0.00, +0.07]" (its low end
    +0.004 ms, rounded to two decimals): the sentence said it excluded no change beside an interval
    that showed it. Each end now keeps its side of zero, with up to four decimals."""
    from tpbench.analysis.explain import Component, Explanation

    components = [
        Component("compute", 0.21, 0.13, 0.30),
        Component("optimizer", 0.04, 0.004, 0.07),
        Component("idle", -0.0032, -0.0061, -0.0004),
    ]
    e = Explanation(3.23, 3.48, 0.25, 0.1, 0.4, 5, 5, components)
    said = tune_trace._by_part(e)
    assert "optimizer +0.04 ms [+0.004, +0.07]" in said, said
    assert "idle -0.003 ms [-0.01, -0.0004]" in said, said
    assert "compute +0.21 ms [+0.13, +0.30]" in said, said
    assert said.endswith("excluding no change: compute, optimizer, idle)."), said
    assert verdict.signed_ms(0.0) == "+0.00" and verdict.signed_ms(0.88) == "+0.88"


def test_the_docs_opening_claim_names_the_setting_as_the_tune_labels_it() -> None:
    """docs/tune.md opened with "ddp slowdown_pct=0.0: within 2% of the best of 7 settings …", where a
    tune of suites/tune-planted.toml names that setting "ddp slowdown_pct=0": the example a reader
    compares the terminal with must read as the terminal does."""
    from tpbench.suite import labels

    cases = tune.prepare(REPO / "suites" / "tune-planted.toml").cases
    names = labels([cases])[0]
    (best,) = [names[c.case_id] for c in cases if c.slowdown_pct == 0]
    opening = (REPO / "docs" / "tune.md").read_text().split("```")[1]
    assert f"\n{best}: within 2% of the best of {len(cases)} settings, 95% confidence;" in opening, (best, opening)
