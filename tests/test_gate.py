"""The gate: verdicts on data with known answers, exit codes through the real command, the
several-baselines and paired-rounds methods, broken inputs, and a real slowdown caught end to end by
the lockstep gate on a busy machine (the lockstep protocol itself: test_lockstep.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import astuple, replace
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from conftest import REPO, run_cli, tiny_suite, tpbench_at_once
from conftest import tpbench as run_tpbench
from synthetic_runs import ENVIRONMENT, make_run

from tpbench import compare, gate, gate_record, render, store, user_code, verdict
from tpbench.analysis.stats import Ratio, hierarchical_ratio_ci, paired_ratio, unpaired_ratio


def tpbench(*args: str | Path) -> subprocess.CompletedProcess:
    """The real command; stderr with its line wrapping undone, so messages can be matched."""
    p = run_tpbench(*args, timeout=900)
    p.stderr = " ".join(p.stderr.split())
    return p


def noisy(median: float, n: int, spread: float, seed: int) -> list[float]:
    return list(median * (1 + spread * np.random.default_rng(seed).uniform(-1, 1, n)))


# ---------------------------------------------------------------- verdict logic


@pytest.mark.parametrize(
    ("lo", "hi", "verdict"),
    [
        (1.06, 1.20, "regression"),
        (0.80, 0.94, "improvement"),
        (0.97, 1.03, "pass"),
        (0.95, 1.05, "pass"),  # the tolerance band is closed
        (1.02, 1.08, "inconclusive"),  # might be a regression beyond 5%, might not
        (0.70, 1.40, "inconclusive"),  # far too wide to say anything
        (0.93, 0.99, "inconclusive"),  # might be an improvement beyond 5%, might not
    ],
)
def test_judge(lo: float, hi: float, verdict: str) -> None:
    assert compare.judge(lo, hi, 0.05) == verdict


@pytest.mark.parametrize(("text", "value"), [("5%", 0.05), ("0.05", 0.05), ("12.5%", 0.125), ("0", 0.0)])
def test_parse_threshold(text: str, value: float) -> None:
    assert compare.parse_threshold(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["five", "150%", "-1%", "1"])
def test_parse_threshold_rejects(text: str) -> None:
    with pytest.raises(compare.GateError, match="--threshold"):
        compare.parse_threshold(text)


def test_a_bare_threshold_of_1_or_more_says_it_reads_as_a_fraction() -> None:
    """``--threshold 5`` (meant as 5 %) said only "expected a value in [0%, 100%)": the 500 % it reads as was unsaid."""
    with pytest.raises(compare.GateError) as e:
        compare.parse_threshold("5")
    assert str(e.value) == (
        "--threshold 5 (a bare number is a fraction: 500%): expected a value in [0%, 100%), like 5% or 0.05"
    )
    with pytest.raises(compare.GateError, match=r"^--threshold 150%: expected a value in \[0%, 100%\), like 5%"):
        compare.parse_threshold("150%")


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "NaN%", "infinity%"])
def test_a_threshold_that_is_no_finite_number_is_refused_as_such(text: str) -> None:
    """``--threshold nan`` said "(a bare number is a fraction: nan%): expected a value in [0%, 100%)", as if
    NaN were a number out of range, and the hint was for a 5 meant as 5 %."""
    with pytest.raises(compare.GateError) as e:
        compare.parse_threshold(text)
    assert (
        str(e.value)
        == f"--threshold {text}: not a finite number; expected a percentage like 5% or a fraction like 0.05"
    )
    assert run_cli(["compare", str(REPO / "tests/data/whatif_links_run"), "--threshold", text]) == 2


def test_ratio_ci_known_answers() -> None:
    base = [np.array(noisy(10, 8, 0.02, 1))]
    # 30% slower, tight: the whole interval sits near 1.3.
    r, lo, hi, *_ = astuple(hierarchical_ratio_ci(base, [np.array(noisy(13, 8, 0.02, 2))]))
    assert r == pytest.approx(1.3, rel=0.03) and 1.25 < lo < 1.3 < hi < 1.35
    # Identical distributions: the interval covers 1 and is narrow.
    r, lo, hi, *_ = astuple(hierarchical_ratio_ci(base, [np.array(noisy(10, 8, 0.02, 3))]))
    assert lo < 1 < hi and hi - lo < 0.05


def test_between_run_spread_widens_the_interval() -> None:
    """Runs that disagree with each other must widen the interval, even when each run is tight."""
    tight = [np.array(noisy(10, 6, 0.01, s)) for s in range(3)]
    spread = [np.array(noisy(m, 6, 0.01, s)) for s, m in enumerate((9, 10, 11.5))]
    cand = [np.array(noisy(10.5, 6, 0.01, 9))]
    t, s = hierarchical_ratio_ci(tight, cand), hierarchical_ratio_ci(spread, cand)
    assert s.half_width > 3 * t.half_width


def test_paired_rounds_cancel_shared_drift() -> None:
    """Each round's machine state hits both sides; pairing cancels it, so a real 20% slowdown shows
    where pooling the rounds' repeats sees only noise."""
    drift = [1.0, 1.5, 0.8, 1.3]
    base = [np.array(noisy(10 * d, 5, 0.01, i)) for i, d in enumerate(drift)]
    cand = [np.array(noisy(12 * d, 5, 0.01, 10 + i)) for i, d in enumerate(drift)]
    u = hierarchical_ratio_ci(base, cand)
    p = paired_ratio(medians(base), medians(cand))
    assert compare.judge(u.lo, u.hi, 0.05) == "inconclusive"
    assert compare.judge(p.lo, p.hi, 0.05) == "regression" and p.ratio == pytest.approx(1.2, rel=0.02) and p.lo > 1.15


def medians(runs: list[np.ndarray]) -> dict[int, float]:
    return {i: float(np.median(r)) for i, r in enumerate(runs)}


@pytest.mark.parametrize(("n", "q"), [(2, 12.706), (3, 4.303), (5, 2.776), (10, 2.262)])
def test_paired_interval_uses_t_quantiles(n: int, q: float) -> None:
    """Log ratios alternating ±0.1 around log 1.1: the half-width in log space is t(n-1) · sd / sqrt(n)."""
    d = np.log(1.1) + 0.1 * np.array([(-1) ** i for i in range(n)])
    r = paired_ratio({i: 1.0 for i in range(n)}, {i: float(np.exp(v)) for i, v in enumerate(d)})
    half = q * np.std(d, ddof=1) / np.sqrt(n)
    assert r.method == "paired" and r.n == n
    assert np.log(r.hi) - np.log(r.ratio) == pytest.approx(half, rel=1e-3)
    assert r.half_width == pytest.approx(np.exp(half) - 1, rel=1e-3)


def test_paired_ratio_uses_common_rounds_only_and_single_has_no_interval() -> None:
    r = paired_ratio({0: 10.0, 1: 10.0, 5: 10.0}, {0: 11.0, 1: 11.0, 7: 50.0})
    assert r.n == 2 and r.ratio == pytest.approx(1.1)
    one = paired_ratio({0: 10.0}, {0: 12.0})
    assert one.method == "single" and not one.has_interval and np.isnan(one.half_width)


def test_unpaired_ratio_is_welch_on_logs() -> None:
    rng = np.random.default_rng(3)
    b, c = 10 * np.exp(rng.normal(0, 0.05, 12)), 11 * np.exp(rng.normal(0, 0.02, 6))
    r = unpaired_ratio(b, c)
    assert r.method == "unpaired" and r.lo < r.ratio < r.hi
    assert r.ratio == pytest.approx(np.exp(np.log(c).mean() - np.log(b).mean()))
    # scipy's own Welch test on the logs gives the same interval.
    ci = scipy.stats.ttest_ind(np.log(c), np.log(b), equal_var=False).confidence_interval(0.95)
    assert isinstance(r, Ratio) and (r.lo, r.hi) == pytest.approx((np.exp(ci.low), np.exp(ci.high)))


def test_paired_gate_false_alarms_and_power_in_simulation() -> None:
    """Rounds with ±30% shared drift, 3% unshared drift and 3% repeat noise, 5 rounds of 5 repeats:
    identical code is almost never a regression (≤1%), and a 15% slowdown is caught ≥80% of the time."""
    rng = np.random.default_rng(0)

    def verdict(effect: float) -> str:
        shared = rng.normal(0, 0.3, 5)

        def side(m: float) -> list[np.ndarray]:
            return [np.exp(np.log(m) + u + rng.normal(0, 0.03) + rng.normal(0, 0.03, 5)) for u in shared]

        r = paired_ratio(medians(side(10)), medians(side(10 * effect)))
        return compare.judge(r.lo, r.hi, 0.05)

    same = [verdict(1.0) for _ in range(400)]
    slower = [verdict(1.15) for _ in range(200)]
    assert same.count("regression") <= 4 and same.count("improvement") <= 4
    assert slower.count("regression") >= 160


# ---------------------------------------------------------------- comparing stored runs


def test_compare_verdicts_on_synthetic_runs(tmp_path: Path) -> None:
    base = make_run(tmp_path / "b", {"ddp": noisy(10, 6, 0.02, 1), "zero_no_overlap": noisy(20, 6, 0.02, 2)})
    cand = make_run(tmp_path / "c", {"ddp": noisy(13, 6, 0.02, 3), "zero_no_overlap": noisy(15, 6, 0.02, 4)}, seed=1)
    c = compare.compare_runs([base], [cand])
    verdicts = {r.label: r for r in c.cases}
    assert verdicts["ddp"].verdict == "regression" and verdicts["ddp"].ratio == pytest.approx(1.3, rel=0.05)
    assert verdicts["zero_no_overlap"].verdict == "improvement"
    assert c.verdict == "regression" and c.exit_code == 1

    same = make_run(tmp_path / "s", {"ddp": noisy(10, 6, 0.02, 5), "zero_no_overlap": noisy(20, 6, 0.02, 6)}, seed=2)
    c = compare.compare_runs([base], [same])
    assert {r.verdict for r in c.cases} == {"pass"} and c.exit_code == 0


def test_runs_of_two_suites_say_so_above_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A smoke run against a gate run: every case read "missing: no baseline data for this case" and
    nothing said why. The suites' names (run.json's) now say it once above the table, and whether any
    case is in both; runs of one suite, however else they differ, get no such line."""
    smoke = make_run(tmp_path / "s", {"ddp": noisy(10, 3, 0.02, 1)}, suite_name="smoke")
    gated = make_run(tmp_path / "g", {"ddp": noisy(10, 3, 0.02, 2)}, suite_name="gate", defaults={"batch_size": 512})
    assert run_cli(["compare", str(smoke), str(gated)]) == 3
    out = capsys.readouterr().out
    said = "the baseline ran suite smoke, the candidate suite gate: no case is in both"
    assert out.count(said) == 1 and out.index(said) < out.index("no baseline data for this case"), out
    assert said in json.loads(render.render_json(compare.compare_runs([smoke], [gated])))["suites_differ"]
    renamed = make_run(tmp_path / "r", {"ddp": noisy(10, 3, 0.02, 3)}, suite_name="smoke-renamed", seed=1)
    c = compare.compare_runs([smoke], [renamed])
    assert c.suites_differ == "the baseline ran suite smoke, the candidate suite smoke-renamed", c.suites_differ
    other = make_run(tmp_path / "o", {"ddp": noisy(10, 3, 0.02, 4)}, suite_name="smoke", defaults={"batch_size": 512})
    assert compare.compare_runs([smoke], [other]).suites_differ == ""


def test_noise_is_never_a_regression(tmp_path: Path) -> None:
    """Pure noise (±15% per repeat, the same distribution on both sides) over 30 seeds: pass or
    inconclusive, never regression or improvement."""
    verdicts = []
    for seed in range(30):
        b = make_run(tmp_path / f"b{seed}", {"ddp": noisy(10, 5, 0.15, 100 + seed)}, seed=seed)
        c = make_run(tmp_path / f"c{seed}", {"ddp": noisy(10, 5, 0.15, 200 + seed)}, seed=seed)
        verdicts.append(compare.compare_runs([b], [c]).cases[0].verdict)
    assert set(verdicts) <= {"pass", "inconclusive"}, verdicts


def test_too_few_repeats_is_inconclusive(tmp_path: Path) -> None:
    b = make_run(tmp_path / "b", {"ddp": [10, 10.1]})
    c = make_run(tmp_path / "c", {"ddp": [20, 20.1]})
    (case,) = compare.compare_runs([b], [c]).cases
    assert case.verdict == "inconclusive" and "too few to judge (2 baseline, 2 candidate repeats" in case.reason


def test_a_lockstep_gate_stopped_before_two_pairs_is_not_judged_unpaired(tmp_path: Path) -> None:
    """A lockstep gate whose budget ran out with fewer than 2 pairs fell back to the unpaired bootstrap
    (an interval from the baseline's 3 repeats against the candidate's 1) under the heading "t interval
    ... over repeats paired in lockstep". Now the pairs are all it judges, and it says how few there were."""
    b = make_run(tmp_path / "b", {"ddp": [10, 10.4, 9.6]})
    c = make_run(tmp_path / "c", {"ddp": [20]})
    comparison = compare.compare_runs([b], [c], pairing="repeats")
    (case,) = comparison.cases
    assert case.verdict == "inconclusive" and case.pairs == 1 and case.half_width is None
    assert case.ci_lo == case.ci_hi == case.ratio == pytest.approx(2.0, rel=0.02)
    assert case.reason == "1 pair (the one repeat both sides ran): a paired interval needs 2", case.reason
    assert "paired in lockstep" in render.render_text(comparison)
    # Repeats that no pair shares: nothing to pair, said so, rather than an unpaired interval.
    apart = compare.RunData.of(c)
    apart = replace(apart, dir=tmp_path / "apart", values={k: {7: v[0]} for k, v in apart.values.items()})
    (case,) = compare.compare_runs([b], [apart], pairing="repeats").cases
    assert case.verdict == "missing" and case.reason == "no repeat ran on both sides", case.reason


def test_a_rounds_gate_of_one_round_is_not_judged_unpaired(tmp_path: Path) -> None:
    """``gate --mode rounds --rounds 1`` judged its one pair of runs by the unpaired bootstrap over their
    repeats, and called a regression under the heading "t interval of the ratio over paired rounds"."""
    b = make_run(tmp_path / "b", {"ddp": noisy(10, 6, 0.02, 1)})
    c = make_run(tmp_path / "c", {"ddp": noisy(13, 6, 0.02, 2)}, seed=1)
    (case,) = compare.compare_runs([b], [c], pairing="rounds").cases
    assert case.verdict == "inconclusive" and case.pairs == 1 and case.half_width is None, case
    assert case.reason == "1 pair (the one round both sides ran): a paired interval needs 2", case.reason


def test_several_baselines_judge_against_their_spread(tmp_path: Path) -> None:
    """A candidate 12% above one baseline is a regression against that one alone; against three
    baselines that themselves scatter ±10% it is within their spread: inconclusive. A 40% slowdown
    stands out of the same spread."""
    medians = (9.5, 10.0, 11.0)
    bases = [make_run(tmp_path / f"b{i}", {"ddp": noisy(m, 6, 0.02, i)}, seed=i) for i, m in enumerate(medians)]
    cand = make_run(tmp_path / "c", {"ddp": noisy(10.6, 6, 0.02, 7)}, seed=7)
    assert compare.compare_runs(bases[:1], [cand]).cases[0].verdict == "regression"
    pooled = compare.compare_runs(bases, [cand])
    (case,) = pooled.cases
    assert case.verdict == "inconclusive" and case.baseline_runs == 3 and case.baseline_repeats == 18
    slow = make_run(tmp_path / "slow", {"ddp": noisy(14, 6, 0.02, 8)}, seed=8)
    assert compare.compare_runs(bases, [slow]).cases[0].verdict == "regression"


def test_incomparable_environment_and_world(tmp_path: Path) -> None:
    base = make_run(tmp_path / "b", {"ddp": noisy(10, 5, 0.02, 1)})
    other_torch = make_run(tmp_path / "t", {"ddp": noisy(13, 5, 0.02, 2)}, environment=ENVIRONMENT | {"torch": "2.4.0"})
    c = compare.compare_runs([base], [other_torch])
    assert c.verdict == "incomparable" and c.exit_code == 3
    assert any("torch: 2.13.0+cpu vs 2.4.0" in d for d in c.environment_differences)
    assert compare.compare_runs([base], [other_torch], ignore_env=["torch"]).verdict == "regression"

    four_ranks = make_run(tmp_path / "w", {"ddp": noisy(10, 5, 0.02, 3)}, world_size=4)
    (case,) = compare.compare_runs([base], [four_ranks]).cases
    assert case.verdict == "incomparable" and "world_size 2 vs 4" in case.reason


def test_runs_on_other_gpu_counts_are_incomparable_and_runs_without_one_still_compare(tmp_path: Path) -> None:
    """Ranks of a CUDA case share a GPU when the node has fewer than the world's ranks, so the same
    case on one GPU and on two of one model measured other things, and compare judged them. A run
    whose fingerprint does not record a GPU count is still judged against one that does."""
    one, two = (ENVIRONMENT | {"gpu_model": "NVIDIA H200", "gpu_count": n} for n in (1, 2))
    base = make_run(tmp_path / "b", {"ddp": noisy(10, 5, 0.02, 1)}, environment=one)
    other = make_run(tmp_path / "c", {"ddp": noisy(10, 5, 0.02, 2)}, environment=two)
    c = compare.compare_runs([base], [other])
    assert c.verdict == "incomparable" and c.exit_code == 3
    assert c.environment_differences == [f"{Path(base).name} vs {Path(other).name}: gpu_count: 1 vs 2"]
    assert compare.compare_runs([base], [other], ignore_env=["gpu_count"]).verdict == "pass"
    unrecorded = {k: v for k, v in one.items() if k != "gpu_count"}
    older = make_run(tmp_path / "o", {"ddp": noisy(10, 5, 0.02, 3)}, environment=unrecorded)
    assert compare.compare_runs([older], [other]).verdict == "pass"


def test_an_ignored_environment_difference_is_still_said(tmp_path: Path) -> None:
    """``--ignore-env torch`` judged the runs, and every output then read as if both ran one torch:
    a CI summary gave a verdict across torch versions without naming them."""
    base = make_run(tmp_path / "b", {"ddp": noisy(10, 5, 0.02, 1)})
    other = make_run(tmp_path / "t", {"ddp": noisy(10, 5, 0.02, 2)}, environment=ENVIRONMENT | {"torch": "2.4.0"})
    diff = f"{Path(base).name} vs {Path(other).name}: torch: 2.13.0+cpu vs 2.4.0"
    said = f"environment differs, ignored (--ignore-env): {diff}"
    c = compare.compare_runs([base], [other], ignore_env=["torch"])
    assert c.environment_differences == [] and c.exit_code != 3
    assert c.ignored_environment_differences == [diff]
    assert said in render.render_text(c) and f"- {said}" in render.render_markdown(c)
    assert json.loads(render.render_json(c))["ignored_environment_differences"] == c.ignored_environment_differences
    assert compare.compare_runs([base], [other]).ignored_environment_differences == []


def test_two_runs_of_few_repeats_say_their_interval_holds_less_than_95(tmp_path: Path) -> None:
    """The README tour compares two sweeps of 3 repeats under "95% bootstrap CI", an interval that held
    the ratio 90 % of the time (benchmarks/ratio_coverage.py): the text and Markdown now say so; from 5
    repeats a side, as from lockstep pairs, nothing is added."""
    few = [make_run(tmp_path / side, {"ddp": noisy(10, 3, 0.02, seed)}) for side, seed in (("b", 1), ("c", 2))]
    c = compare.compare_runs(few[:1], few[1:])
    said = (
        "With fewer than 5 repeats a side the bootstrap interval of two runs holds the ratio with less confidence "
        "than 95% (3 repeats: about 90%, simulated for log-normal repeats)."
    )
    assert said in render.render_text(c) and f"- {said}" in render.render_markdown(c)
    enough = [make_run(tmp_path / side, {"ddp": noisy(10, 5, 0.02, seed)}) for side, seed in (("B", 1), ("C", 2))]
    assert "With fewer than" not in render.render_text(compare.compare_runs(enough[:1], enough[1:]))
    assert verdict.few_repeats_ratio_note([2, 4, 6]) == (
        "With fewer than 5 repeats a side the bootstrap interval of two runs holds the ratio with less confidence "
        "than 95% (2 repeats: about 69%; 4 repeats: about 93%, simulated for log-normal repeats)."
    )


def test_missing_cases(tmp_path: Path) -> None:
    base = make_run(tmp_path / "b", {"ddp": noisy(10, 5, 0.02, 1)})
    cand = make_run(tmp_path / "c", {"ddp": noisy(10, 5, 0.02, 2), "zero_no_overlap": noisy(10, 5, 0.02, 3)})
    c = compare.compare_runs([base], [cand])
    by = {r.label: r.verdict for r in c.cases}
    assert by == {"ddp": "pass", "zero_no_overlap": "missing"} and c.exit_code == 3
    crashed = make_run(tmp_path / "f", {"ddp": noisy(10, 5, 0.02, 4)}, failed=["ddp"])
    (case,) = compare.compare_runs([base], [crashed]).cases
    assert case.verdict == "missing" and "failed" in case.reason


def test_baseline_cases_the_candidate_lacks_are_named_without_changing_the_verdict(tmp_path: Path) -> None:
    """A candidate run with another --filter lacks some of the baseline's cases: every output names
    them ("not in candidate: ..."), and the verdict and exit code stay those of the cases both have."""
    base = make_run(tmp_path / "b", {"ddp": noisy(10, 5, 0.02, 1), "zero_no_overlap": noisy(20, 5, 0.02, 2)})
    cand = make_run(tmp_path / "c", {"ddp": noisy(10, 5, 0.02, 3)}, seed=1)
    c = compare.compare_runs([base], [cand])
    assert [r.label for r in c.cases] == ["ddp"] and c.verdict == "pass" and c.exit_code == 0
    assert c.not_in_candidate == ["zero_no_overlap"]
    said = "not in candidate (baseline cases it did not run, not judged): zero_no_overlap"
    assert said in render.render_text(c) and f"- {said}" in render.render_markdown(c)
    assert json.loads(render.render_json(c))["not_in_candidate"] == ["zero_no_overlap"]
    assert compare.compare_runs([cand], [base]).not_in_candidate == []


def test_cases_of_runs_with_other_filters_are_labelled_by_the_keys_that_tell_them_apart(tmp_path: Path) -> None:
    """Each run labelled its cases by the keys that vary among its own: a candidate run at ``--filter
    bucket_cap_mb=1`` called its case "ddp", one of the baseline's two ddp cases, while the list of
    baseline cases it lacks said "ddp bucket_cap_mb=4". Both runs' cases are labelled as one."""
    sweep = {"bucket_cap_mb": "[1, 4]"}
    base = make_run(tmp_path / "b", {"ddp": noisy(10, 5, 0.02, 1)}, sweep=sweep)
    cand = make_run(tmp_path / "c", {"ddp": noisy(10, 5, 0.02, 2)}, sweep=sweep, filters=["bucket_cap_mb=1"], seed=1)
    c = compare.compare_runs([base], [cand])
    assert [r.label for r in c.cases] == ["ddp bucket_cap_mb=1"]
    assert c.not_in_candidate == ["ddp bucket_cap_mb=4"]
    assert "ddp bucket_cap_mb=1 " in render.render_text(c)


def test_an_added_key_off_its_old_behaviour_is_another_case(tmp_path: Path) -> None:
    """The identity leaves an added key (``ADDED_KEYS``) out at its old behaviour, so a packed
    ``zero_no_overlap`` (parameters_as_bucket_view = true) has the key and the unpacked one does
    not: matched on the keys both have, the packed case was judged against the unpacked one
    ("faster: -60%") and the baseline's packed case, which the candidate lacks, went unnamed."""
    sweep = {"parameters_as_bucket_view": "[false, true]"}

    def packed(case) -> float:
        return 0.4 if case.params()["parameters_as_bucket_view"] else 1.0

    both = make_run(tmp_path / "both", {"zero_no_overlap": noisy(100, 5, 0.02, 1)}, sweep=sweep, factor=packed)
    unpacked = make_run(tmp_path / "unpacked", {"zero_no_overlap": noisy(100, 5, 0.02, 2)}, seed=1)
    c = compare.compare_runs([both], [unpacked])
    assert c.not_in_candidate == ["zero_no_overlap parameters_as_bucket_view=True"]
    assert [r.verdict for r in c.cases] == ["pass"]
    only_packed = make_run(
        tmp_path / "packed", {"zero_no_overlap": noisy(40, 5, 0.02, 3)}, sweep={"parameters_as_bucket_view": "[true]"}
    )
    c = compare.compare_runs([unpacked], [only_packed])
    assert [r.verdict for r in c.cases] == ["missing"]
    assert c.not_in_candidate == ["zero_no_overlap parameters_as_bucket_view=False"]


def test_other_metric(tmp_path: Path) -> None:
    """Any per-step column compares the same way (lower is better): here peak memory, which is the
    same on both sides although the step times are not."""
    base = make_run(tmp_path / "b", {"ddp": noisy(10, 5, 0.02, 1)})
    cand = make_run(tmp_path / "c", {"ddp": noisy(20, 5, 0.02, 2)})
    (case,) = compare.compare_runs([base], [cand], metric="peak_rss_mb").cases
    assert case.verdict == "pass" and case.baseline_median == pytest.approx(102)


def test_slowdown_pct_does_not_orphan_cases(tmp_path: Path) -> None:
    """slowdown_pct is a test knob, not part of what the case is: runs with and without it compare,
    also against a run stored with an older id (matching goes by identity, not by stored id)."""
    base = make_run(tmp_path / "b", {"ddp": noisy(10, 5, 0.02, 1)})
    cand = make_run(tmp_path / "c", {"ddp": noisy(12.5, 5, 0.02, 2)}, defaults={"slowdown_pct": 25})
    assert {p.name for p in (base / "cases").iterdir()} == {p.name for p in (cand / "cases").iterdir()}
    (case,) = compare.compare_runs([base], [cand]).cases
    assert case.verdict == "regression"
    rename_case_ids(base, lambda cid: "old" + cid[3:])
    (case,) = compare.compare_runs([base], [cand]).cases
    assert case.verdict == "regression" and case.baseline_runs == 1


def test_runs_timing_other_steps_say_so_and_a_switch_timed_otherwise_is_incomparable(tmp_path: Path) -> None:
    """Runs made with other `steps` still match case by case, and compare and the report say the
    timed steps differ; post-local SGD switching within its timed steps times another mix of global
    and local steps under another `steps` (3 of 8 before the switch, 3 of 40): incomparable, exit 3."""
    from tpbench import store
    from tpbench.report.build import build_report
    from tpbench.sweep import finalize

    sweep = {"start_localSGD_iter": '["never", 6]'}
    base = make_run(tmp_path / "b", {"post_localSGD_hook": noisy(10, 5, 0.02, 1)}, sweep=sweep)
    cand = make_run(
        tmp_path / "c",
        {"post_localSGD_hook": noisy(10, 5, 0.02, 2)},
        sweep=sweep,
        steps=40,
        factor=lambda case: 1.0 if case.start_localSGD_iter == "never" else 1.5,  # more local steps timed
    )
    for run in (base, cand):
        finalize(store.Run.open(run))  # the summaries the report reads, as a sweep leaves them
    p = tpbench("compare", base, cand, "--format", "json")
    assert p.returncode == 3, p.stderr
    cases = {c["label"].split("=")[-1]: c for c in json.loads(p.stdout)["cases"]}  # "never" is labelled DDP
    assert cases["DDP"]["verdict"] == "pass" and cases["DDP"]["reason"] == "timed steps differ: steps 8 vs 40"
    assert cases["6"]["verdict"] == "incomparable" and cases["6"]["ratio"] is not None
    assert "after 3 of 8 timed steps in the baseline, 3 of 40 in the candidate" in cases["6"]["reason"]
    html = build_report([store.load(base), store.load(cand)])
    assert "3 of 40 in the candidate" in html  # the "Across runs" table's note
    # The line over the runs tallies it, but its ratio is of the case judged alone (one case: its own figures).
    ratio = re.search(r"1 incomparable, 1 pass \(threshold ±5%\); step-time ratio ([\d.]+); its interval", html)
    assert ratio and 0.95 < float(ratio[1]) < 1.05


def test_a_baseline_sweeping_a_budget_key_matches_the_case_timed_alike(tmp_path: Path) -> None:
    """A baseline that sweeps warmup_steps has two cases of one identity: the candidate's case is
    judged against the one that timed the same steps, not whichever comes first."""
    base = make_run(
        tmp_path / "b",
        {"ddp": noisy(10, 5, 0.02, 1)},
        sweep={"warmup_steps": "[1, 3]"},
        factor=lambda case: 2.0 if case.warmup_steps == 1 else 1.0,  # the first of the two, twice as slow
    )
    cand = make_run(tmp_path / "c", {"ddp": noisy(10, 5, 0.02, 2)})
    (case,) = compare.compare_runs([base], [cand]).cases
    assert case.verdict == "pass" and case.reason == ""


def test_runs_differing_only_in_repeats_match_case_by_case_in_compare_and_report(tmp_path: Path) -> None:
    """`tpbench compare` and `tpbench report` match cases by the same engine: runs that differ only
    in repeats share every case, even when the baseline's ids were stored by a tpbench that hashed
    repeats into them, and the report shows the verdicts `tpbench compare` gives."""
    from tpbench import store
    from tpbench.report import verdicts
    from tpbench.report.build import build_report
    from tpbench.report.data import load as report_data
    from tpbench.sweep import finalize

    base = make_run(tmp_path / "b", {"ddp": noisy(10, 3, 0.02, 1), "zero_no_overlap": noisy(20, 3, 0.02, 2)})
    cand = make_run(tmp_path / "c", {"ddp": noisy(13, 5, 0.02, 3), "zero_no_overlap": noisy(20, 5, 0.02, 4)})
    for run in (base, cand):
        finalize(store.Run.open(run))  # the summaries the report reads, as a sweep leaves them
    rename_case_ids(base, lambda cid: "rep3" + cid[4:])
    proc = subprocess.run(
        [sys.executable, "-m", "tpbench", "compare", str(base), str(cand), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr  # the ddp regression
    by_cli = [
        (c["case_id"], c["label"], c["verdict"], c["ratio"], c["ci_lo"], c["ci_hi"])
        for c in json.loads(proc.stdout)["cases"]
    ]
    assert sorted(v for _, _, v, *_ in by_cli) == ["pass", "regression"]

    data = report_data([store.load(base), store.load(cand)])
    (engine,) = verdicts.against_first_run(verdicts.run_data(data))
    assert [(c.case_id, c.label, c.verdict, c.ratio, c.ci_lo, c.ci_hi) for c in engine.cases] == by_cli
    # One label per case in both runs: the repeats they differ in are not part of it.
    assert sorted(data.cases["label"]) == ["ddp", "ddp", "zero_no_overlap", "zero_no_overlap"]
    html = build_report(data.runs)
    assert "over 2 common case(s): 1 regression, 1 pass" in html
    assert "<td>none</td>" in html and "<td>None</td>" not in html  # no CUDA here: said, not Python's None
    (line,) = verdicts.across_runs_lines(data, [engine])
    assert "; the intervals resolve ±" in line and re.search(
        r"\(regression: slower, beyond the ±5% threshold; resolves ±\d+(\.\d)?%\)\.$", line
    )


def test_across_runs_line_of_one_common_case_gives_its_ratio_not_a_range(tmp_path: Path) -> None:
    """A gate of suites/gate.toml compares one case: the report's line gives that case's ratio and
    what its interval resolves. It said "median step-time ratio 1.00 (range 1.00–1.00); the
    intervals resolve ±43.6% to ±43.6% (median ±43.6%)", a spread of one number read as a summary."""
    from tpbench.report import verdicts
    from tpbench.report.data import load as report_data
    from tpbench.sweep import finalize

    base = make_run(tmp_path / "b", {"ddp": noisy(10, 5, 0.02, 1)})
    cand = make_run(tmp_path / "c", {"ddp": noisy(10, 5, 0.02, 2)})
    for run in (base, cand):
        finalize(store.Run.open(run))
    data = report_data([store.load(base), store.load(cand)])
    (line,) = verdicts.across_runs_lines(data, verdicts.against_first_run(verdicts.run_data(data)))
    assert "range" not in line and "median" not in line and " to ±" not in line, line
    assert re.search(
        r"over 1 common case\(s\): 1 \w+ \(threshold ±5%\); step-time ratio \d\.\d\d; "
        r"its interval resolves ±\d+(\.\d)?%\.$",
        line,
    ), line


def rename_case_ids(run: Path, new: Callable[[str], str]) -> None:
    """Give a run's cases other ids, as an older tpbench that hashed more keys stored them."""
    meta = json.loads((run / "run.json").read_text())
    for cid in list(meta["cases"]):
        entry = meta["cases"].pop(cid)
        entry["params"]["case_id"] = new(cid)
        meta["cases"][new(cid)] = entry
        (run / "cases" / cid).rename(run / "cases" / new(cid))
    (run / "run.json").write_text(json.dumps(meta))
    summary = run / "summary.parquet"
    if summary.exists():
        pd.read_parquet(summary).assign(case_id=lambda df: df["case_id"].map(new)).to_parquet(summary)


# ---------------------------------------------------------------- the command: exit codes and formats


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    return {
        "base": make_run(root / "base", {"ddp": noisy(10, 6, 0.02, 1)}),
        "base2": make_run(root / "base2", {"ddp": noisy(10.1, 6, 0.02, 11)}, seed=11),
        "same": make_run(root / "same", {"ddp": noisy(10, 6, 0.02, 2)}, seed=2),
        "slow": make_run(root / "slow", {"ddp": noisy(13, 6, 0.02, 3)}, seed=3),
        "fast": make_run(root / "fast", {"ddp": noisy(7, 6, 0.02, 4)}, seed=4),
        "wide": make_run(root / "wide", {"ddp": noisy(10.5, 4, 0.4, 5)}, seed=5),
        "torch": make_run(root / "torch", {"ddp": noisy(10, 6, 0.02, 6)}, environment=ENVIRONMENT | {"torch": "2.4.0"}),
    }


@pytest.mark.parametrize(
    ("candidate", "flags", "code", "verdict"),
    [
        ("same", [], 0, "pass"),
        ("slow", [], 1, "regression"),
        ("fast", [], 0, "improvement"),
        ("wide", [], 0, "inconclusive"),
        ("wide", ["--fail-on-inconclusive"], 4, "inconclusive"),
        ("torch", [], 3, "incomparable"),
        ("slow", ["--threshold", "40%"], 0, "pass"),
    ],
)
def test_compare_exit_codes(runs: dict[str, Path], candidate: str, flags: list[str], code: int, verdict: str) -> None:
    p = tpbench("compare", runs["base"], runs[candidate], "--format", "json", *flags)
    assert p.returncode == code, p.stderr
    doc = json.loads(p.stdout)
    assert doc["verdict"] == verdict and doc["exit_code"] == code and doc["cases"][0]["label"] == "ddp"


def test_compare_text_and_markdown(runs: dict[str, Path]) -> None:
    p = tpbench("compare", runs["base"], runs["base2"], runs["slow"])
    assert p.returncode == 1
    assert "baseline: 2 run(s)" in p.stdout and "regression" in p.stdout and "+3" in p.stdout  # +3x.x%
    md = tpbench("compare", runs["base"], runs["slow"], "--format", "md").stdout
    lines = md.splitlines()
    assert lines[0].startswith("### tpbench compare:") and "regression" in lines[0]
    table = [ln for ln in lines if ln.startswith("|")]
    assert len(table) == 3 and table[1].startswith("|---") and table[2].startswith("| ddp |")
    assert all(ln.count("|") == table[0].count("|") for ln in table)


def test_a_markdown_verdict_is_headed_by_the_command_that_made_it(runs: dict[str, Path], capsys) -> None:
    """compare's Markdown was headed "tpbench gate" (one renderer for both): a CI summary then named a
    gate that never ran."""
    from tpbench.cli import verdicts

    comparison = compare.compare_runs([runs["base"]], [runs["slow"]])
    assert verdicts._print_verdict(comparison, "md", "gate") == 1
    assert capsys.readouterr().out.startswith("### tpbench gate: 🔴 **regression**")
    assert verdicts._print_verdict(comparison, "md") == 1
    assert capsys.readouterr().out.startswith("### tpbench compare: 🔴 **regression**")


def test_compare_usage_errors(runs: dict[str, Path], tmp_path: Path) -> None:
    base, slow = runs["base"], runs["slow"]
    done = tpbench_at_once(  # as tpbench() above, all at once
        ["compare", base],  # one run, one case: no pair within it to judge, no "pass"
        ["compare", base, slow, "--pair", "algorithm=ddp..zero_no_overlap"],
        ["compare", base, slow, "--threshold", "lots"],
        ["compare", base, slow, "--metric", "nope"],
        ["compare", base, slow, base / "."],  # the same run on both sides
        # One baseline given twice: pooled as two runs that agree exactly, it narrowed the interval.
        ["compare", base, base / ".", slow],
        timeout=900,
    )
    for p in done:
        p.stderr = " ".join(p.stderr.split())
    one, pair, threshold, metric, same, twice = done
    assert one.returncode == 2 and "nothing to compare" in one.stderr and "pass" not in one.stdout
    assert pair.returncode == 2 and "only with a single RUN_DIR" in pair.stderr
    assert threshold.returncode == 2 and "--threshold lots" in threshold.stderr
    assert metric.returncode == 2 and "--metric nope" in metric.stderr and "step_ms" in metric.stderr
    assert same.returncode == 2 and f"{base}: given as both baseline and candidate" in same.stderr
    assert twice.returncode == 2 and f"{base}: given twice" in twice.stderr and "regression" not in twice.stdout


def test_broken_runs_exit_3_naming_the_file(runs: dict[str, Path], tmp_path: Path) -> None:
    p = tpbench("compare", tmp_path / "nowhere", runs["slow"])
    assert p.returncode == 3 and "no such run directory" in p.stderr

    import shutil

    bad_json = tmp_path / "bad_json"
    shutil.copytree(runs["base"], bad_json)
    (bad_json / "run.json").write_text('{"run_id": "x", "cases": {')
    p = tpbench("compare", bad_json, runs["slow"])
    assert p.returncode == 3 and f"{bad_json / 'run.json'}: corrupted" in p.stderr

    bad_steps = tmp_path / "bad_steps"
    shutil.copytree(runs["base"], bad_steps)
    steps = next(bad_steps.glob("cases/*/steps.parquet"))
    steps.write_bytes(steps.read_bytes()[:100])
    p = tpbench("compare", runs["base"], bad_steps)
    assert p.returncode == 3 and f"{steps}: unreadable parquet" in p.stderr


@pytest.mark.ranks
def test_gate_rejects_sides_it_cannot_run(tmp_path: Path) -> None:
    suite = REPO / "suites" / "smoke.toml"
    p = tpbench("gate", suite, "--baseline", tmp_path / "no-such-venv", "--candidate", sys.executable)
    assert p.returncode == 2 and "no-such-venv" in p.stderr
    (tmp_path / "env" / "bin").mkdir(parents=True)  # a conda environment, say: not a folder of code
    (tmp_path / "env" / "bin" / "python").symlink_to(sys.executable)
    p = tpbench("gate", suite, "--baseline", tmp_path / "env", "--candidate", sys.executable)
    assert p.returncode == 2 and "a Python environment without pyvenv.cfg; give its bin/python" in p.stderr
    # --rounds 0 used to run the default 5 rounds (0 read as "not given").
    p = tpbench("gate", suite, "--baseline", REPO, "--candidate", sys.executable, "--mode", "rounds", "--rounds", "0")
    assert p.returncode == 2 and "--rounds 0: expected an integer >= 1" in p.stderr


@pytest.mark.parametrize("empty", ["--baseline", "--candidate"])
def test_an_empty_side_is_refused_naming_the_option(tmp_path: Path, capsys, empty: str) -> None:
    """``Path("")`` is the current directory: run from a checkout, ``--baseline ""`` was that source
    tree, and the gate measured it against the candidate without a word."""
    sides = {"--baseline": str(REPO), "--candidate": str(REPO)} | {empty: ""}
    args = ["gate", "suites/gate.toml", *[x for kv in sides.items() for x in kv], "--out", str(tmp_path / "out")]
    assert run_cli([*args, "--repeats", "1", "--budget-s", "5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tpbench gate: error: {empty} '': empty; expected a python executable"), err
    assert err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()
    with pytest.raises(gate.GateError, match=f"{empty} '': empty"):
        gate.resolve_side(empty.removeprefix("--"), "", tmp_path)


def test_a_failing_side_is_said_as_the_gate_says_its_errors(tmp_path: Path, capsys) -> None:
    """A side whose sweep fails stopped the gate with a bare "error: baseline (...): its sweep exited
    with 1 ...", where every other error of the command reads "tpbench gate: error: ..."."""
    side = "/bin/false tpbench"  # a command prefix whose "sweep" exits 1 at once, leaving no run
    args = ["gate", "suites/gate.toml", "--baseline", side, "--candidate", side, "--repeats", "2"]
    assert run_cli([*args, "--budget-s", "60", "--out", str(tmp_path / "out")]) == 3
    err = " ".join(capsys.readouterr().err.split())
    # The gate may see the sweep exit before or after it stops for it: "its sweep exited with 1 and left
    # no run" or "its sweep ran no item before the gate stopped (its sweep exited)", one line either way.
    said = f"tpbench gate: error: baseline ({side}): its sweep "
    assert said in err and " error:" not in err.replace(said, ""), err


def test_a_refused_gate_leaves_the_markdown_summary_its_reason(tmp_path: Path, capsys) -> None:
    """The CI example's --out, results/gate, reused (a self-hosted runner's workspace kept between
    jobs): the gate refuses it with exit 2, and its Markdown summary was left empty, the reason only in
    the job's log."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "gate.json").write_text("{}")
    args = ["gate", "suites/gate.toml", "--baseline", ".", "--candidate", ".", "--format", "md", "--out", str(out)]
    assert run_cli(args) == 2
    said = capsys.readouterr().out
    assert said.startswith("**tpbench gate: no verdict**: the gate refused its input.")
    assert "holds an earlier gate's runs; give a new folder" in said


def test_a_failing_side_leaves_the_markdown_summary_its_reason(tmp_path: Path, capsys) -> None:
    """The CI example tees ``--format md`` into the job's summary; a side that failed left it empty
    (exit 3, the reason only in the job's log). The Markdown now says there is no verdict and why."""
    side = "/bin/false tpbench"
    args = ["gate", "suites/gate.toml", "--baseline", side, "--candidate", side, "--repeats", "2", "--format", "md"]
    assert run_cli([*args, "--budget-s", "60", "--out", str(tmp_path / "out")]) == 3
    out = capsys.readouterr().out
    assert out.startswith("**tpbench gate: no verdict**: a side failed.") and f"baseline ({side}): its sweep " in out


@pytest.mark.parametrize(
    "flags, said",
    [
        (
            ["--target-ci", "5%", "--repeats", "5"],
            "--repeats 5 with --target-ci: the gate decides a case from 10 pairs",
        ),
        (["--set", "repeats=2"], "--set repeats=2: the gate sets repeats; use --repeats"),
        (["--candidate-set", "repeats=2"], "--candidate-set repeats=2: the gate sets repeats; use --repeats"),
        (["--set", "capture.profiler_steps=5"], "--set capture.profiler_steps=5: a gate never traces while it"),
    ],
)
def test_lockstep_options_it_would_not_honour_are_refused(tmp_path: Path, capsys, flags: list[str], said: str) -> None:
    """A --target-ci gate of fewer than 10 repeats could never decide a case: it ran to "unknown"
    without a word. ``--set repeats=2`` came after the gate's own ``repeats`` and won: each side ran 2
    repeats while gate.json said 4; ``--set capture.profiler_steps=5`` traced the measured steps."""
    args = ["gate", "suites/gate.toml", "--baseline", str(REPO), "--candidate", str(REPO), "--repeats", "4"]
    assert run_cli([*args, "--out", str(tmp_path / "out"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tpbench gate: error: {said}"), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fmt", ["json", "md"])
def test_the_gate_answer_is_in_json_and_markdown(tmp_path: Path, capsys, monkeypatch, fmt: str) -> None:
    """With --target-ci the gate's same / different / unknown answer was said only on stderr: a CI
    step reading ``--format json`` (or the Markdown job summary) could not see it. The sides'
    sweeps are stood in for by two finished runs (the lockstep protocol: test_lockstep.py)."""
    runs = {
        side: make_run(tmp_path / side, {"ddp": noisy(m, 12, 0.02, seed)}, seed=seed)
        for side, m, seed in (("baseline", 10, 1), ("candidate", 13, 2))
    }
    cid = next(iter(compare.RunData.of(runs["candidate"]).params))
    side = gate_record.GateSide("spec", "source", "run", "log", 0)
    record = gate_record.GateRecord(
        seed=0, metric="step_ms", repeats=30, target_ci=0.05, budget_s=480.0, stopped="every case decided",
        wall_s=1.0, sides={"baseline": side, "candidate": side}, rounds=[], answer="different",
        answers={cid: "different"},
    )  # fmt: skip

    def lockstep(suite, baseline, candidate, out, cfg, **_) -> gate.LockstepRun:
        assert cfg.target_ci == pytest.approx(0.05)
        return gate.LockstepRun(out, runs["baseline"], runs["candidate"], record)

    monkeypatch.setattr(gate, "run_lockstep", lockstep)
    args = ["gate", "suites/gate.toml", "--baseline", str(REPO), "--candidate", str(REPO), "--target-ci", "5%"]
    assert run_cli([*args, "--out", str(tmp_path / "out"), "--format", fmt]) == 1
    out, err = capsys.readouterr()
    said = "Gate answer: different (each case's pairs by the sequential rule, target ±5.0%; every case decided)"
    assert said in " ".join(err.split())
    if fmt == "json":
        doc = json.loads(out)
        assert (doc["answer"], doc["answers"], doc["target_ci"]) == ("different", {cid: "different"}, 0.05)
        assert doc["verdict"] == "regression"
    else:
        assert out.splitlines()[2] == f"- {said}", out
    # compare, and a gate without a target, have no answer to give: no key, no line.
    plain = compare.compare_runs([runs["baseline"]], [runs["candidate"]])
    assert "answer" not in json.loads(render.render_json(plain)) and "answer" not in render.render_markdown(plain)


def test_resolve_side_forms(tmp_path: Path) -> None:
    venv = Path(sys.prefix)
    s = gate.resolve_side("baseline", str(venv), tmp_path)
    assert (s.kind, s.cwd) == ("venv", tmp_path) and s.argv[1:] == ("-m", "tpbench")
    s = gate.resolve_side("baseline", sys.executable, tmp_path)
    assert s.kind == "python" and s.argv[0] == str(Path(sys.executable).absolute())
    s = gate.resolve_side("candidate", str(REPO), tmp_path)
    assert s.kind == "source" and s.env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO) and s.cwd == REPO
    s = gate.resolve_side("candidate", f"{sys.executable} -m tpbench", tmp_path)
    assert s.kind == "command" and s.argv == (sys.executable, "-m", "tpbench")


def test_a_venv_side_runs_its_own_tpbench_though_a_checkout_is_on_pythonpath(tmp_path: Path, monkeypatch) -> None:
    """Run from a clone with ``PYTHONPATH=clone``, a python or venv side used to import the clone's
    tpbench, not its own: the gate measured one version against itself. Entries holding a tpbench
    package are left out; the others (a workload's module) stay."""
    checkout, modules = tmp_path / "checkout", tmp_path / "modules"
    (checkout / "tpbench").mkdir(parents=True)
    (checkout / "tpbench" / "__init__.py").write_text("")
    modules.mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(checkout), str(modules)]))
    code = "import tpbench, sys; print(tpbench.__file__); print(sys.path)"

    def imports(side: gate.Side, env: dict[str, str]) -> tuple[str, str]:
        p = subprocess.run([side.argv[0], "-c", code], env=env, cwd=side.cwd, capture_output=True, text=True)
        found, path = p.stdout.splitlines()
        return found, path

    for spec in (sys.executable, sys.prefix):
        side = gate.resolve_side("candidate", spec, tmp_path)
        assert side.env["PYTHONPATH"] == str(modules)
        own, _ = imports(side, {k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        found, path = imports(side, os.environ | side.env)
        assert found == own and not found.startswith(str(checkout)) and str(modules) in path
    side = gate.resolve_side("candidate", str(REPO), tmp_path)
    assert side.env["PYTHONPATH"].split(os.pathsep) == [str(REPO.resolve()), str(modules)]


# ---------------------------------------------------------------- end to end: a real slowdown


GATE_SUITE = """\
[suite]
name = "gate-e2e"
[defaults]
world_size = 2
backend = "gloo"
device = "cpu"
algorithm = "ddp"
workload = "mlp"
batch_size = 64
warmup_steps = 4
steps = 10
repeats = 12
timeout_s = 120
[capture]
profiler_steps = 0
[workloads.mlp]
width = 256
depth = 4
"""


def same_code_gate(suite: Path, *flags: str | Path) -> subprocess.CompletedProcess:
    """`tpbench gate` of this tree as a source tree (baseline) against this venv (candidate)."""
    return tpbench("gate", suite, "--baseline", REPO, "--candidate", sys.prefix, *flags)


@pytest.mark.slow  # two sides beside a busy loop, 12 pairs (35-55 s): over CI's budget
@pytest.mark.ranks
def test_lockstep_gate_calls_a_30pct_slowdown_a_regression_beside_a_busy_process(tmp_path: Path) -> None:
    """A few-ms step, 12 pairs through the lockstep gate, with a CPU-bound process competing for
    the machine throughout: slowdown_pct=30 (burning CPU) on the candidate is a regression (exit 1). Not
    skippable: pairing each repeat with its neighbour in time is what makes a busy machine's noise
    cancel."""
    suite = tmp_path / "gate.toml"
    suite.write_text(GATE_SUITE)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        slow = same_code_gate(
            suite,
            "--repeats",
            "12",
            "--candidate-set",
            "slowdown_pct=30",
            "--candidate-set",
            "slowdown_kind=cpu",
            "--out",
            tmp_path / "slow",
            "--format",
            "json",
        )
    finally:
        busy.kill()
        busy.wait()
    doc = json.loads(slow.stdout)
    (case,) = doc["cases"]
    print(f"slowdown_pct=30: ratio {case['ratio']:.3f} [{case['ci_lo']:.3f}, {case['ci_hi']:.3f}] -> {case['verdict']}")
    assert doc["pairing"] == "repeats" and case["pairs"] == 12
    assert case["verdict"] == "regression" and slow.returncode == 1, slow.stdout + slow.stderr


@pytest.mark.ranks
@pytest.mark.slow
def test_rounds_mode_sweeps_whole_suites_alternately(tmp_path: Path) -> None:
    """--mode rounds (for a side too old for lockstep): one whole sweep per side and round, each
    round's two runs paired; lockstep's options are refused there."""
    suite = tmp_path / "gate.toml"
    suite.write_text(tiny_suite('algorithm = ["ddp"]', repeats=3))
    p = same_code_gate(suite, "--mode", "rounds", "--rounds", "2", "--out", tmp_path / "g", "--format", "json")
    assert p.returncode in (0, 1), p.stderr
    doc = json.loads(p.stdout)
    assert doc["pairing"] == "rounds" and doc["cases"][0]["baseline_runs"] == doc["cases"][0]["candidate_runs"] == 2
    assert sorted(d.name for d in (tmp_path / "g" / "candidate").iterdir()) == ["round01", "round02"]
    p = same_code_gate(suite, "--mode", "rounds", "--repeats", "9")
    assert p.returncode == 2 and "--repeats: not an option of --mode rounds" in p.stderr


@pytest.mark.ranks
def test_example_workflow_uses_real_flags() -> None:
    """examples/ci/perf-gate.yml must keep working as the command evolves: its gate invocation
    parses with the real argument parser."""
    import re
    import shlex

    from tpbench.cli import build_parser

    text = (REPO / "examples" / "ci" / "perf-gate.yml").read_text()
    env = dict(re.findall(r"^ {6}([A-Z_]+): \"?([^\"\n]+)\"?$", text, re.M)) | {"RUNNER_TEMP": "/tmp"}
    block = re.search(r"tpbench gate (.*?)\| tee", text, re.S).group(1).replace("\\\n", " ")
    argv = ["gate", *(re.sub(r"\$([A-Z_]+)", lambda m: env[m.group(1)], a) for a in shlex.split(block))]
    args = build_parser().parse_args(argv)
    assert args.func.__name__ == "cmd_gate" and args.format == "md" and args.mode == "lockstep" and args.repeats == 30
    assert (REPO / args.suite).is_file()


def _workflow_step(name: str) -> str:
    """The ``run`` script of examples/ci/perf-gate.yml's step ``name``, GitHub's expressions filled in."""
    import yaml

    doc = yaml.safe_load((REPO / "examples" / "ci" / "perf-gate.yml").read_text())
    (step,) = [s for s in doc["jobs"]["gate"]["steps"] if s.get("name") == name]
    assert step["shell"] == "bash"
    return step["run"].replace("${{ github.base_ref }}", "main")


def test_example_workflow_checks_out_the_baseline_again_in_a_reused_workspace(tmp_path: Path) -> None:
    """The workflow's baseline step, run by bash as GitHub runs it, twice in one clone with
    RUNNER_TEMP emptied between jobs, as on a self-hosted runner: the second job's ``git worktree
    add`` failed with "is a missing but already registered worktree", the job red before it measured."""
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "RUNNER_TEMP": str(tmp_path / "temp"),
    }
    clone = tmp_path / "clone"
    clone.mkdir()

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=clone, env=env, check=True, capture_output=True, text=True).stdout

    (clone / "code.py").write_text("base\n")
    git("init", "-q")
    git("add", "code.py")
    git("commit", "-qm", "base")
    base = git("rev-parse", "HEAD").strip()
    git("update-ref", "refs/remotes/origin/main", base)
    (clone / "code.py").write_text("candidate\n")
    git("commit", "-qam", "pull request")
    script = _workflow_step("Check out the merge base (baseline)")
    for job in range(2):
        (tmp_path / "temp").mkdir()  # each job's RUNNER_TEMP starts empty
        p = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=clone, env=env)
        assert p.returncode == 0, f"job {job + 1}: the baseline step failed"
        assert (tmp_path / "temp" / "baseline" / "code.py").read_text() == "base\n"
        shutil.rmtree(tmp_path / "temp")


GATE_ACCURACY = REPO / "examples" / "ci" / "gate_accuracy.py"


def test_gate_accuracy_stops_at_a_gate_that_refuses_its_input(tmp_path: Path) -> None:
    """examples/ci/gate_accuracy.py with a mistyped GATE_ARG: each gate exits 2 before any side
    starts, and the script crashed at the first with a traceback about the side's missing folder,
    the gate's own error unsaid. It stops there with that error, exit 2, having logged no gate."""
    argv = [sys.executable, GATE_ACCURACY, "--out", tmp_path, "--gates", "2", "--slowdown", "0", "--", "--repets", "5"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run(list(map(str, argv)), capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "unrecognized arguments: --repets 5; did you mean --repeats?" in p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "gates.jsonl").exists()


def test_gate_accuracy_refuses_rounds_gates_before_running_one(tmp_path: Path) -> None:
    """The script judges one run per side, paired by repeat: a ``--mode rounds`` gate writes a run
    per side and round, and each was tallied "no runs" after its minutes of sweeping."""
    argv = [sys.executable, GATE_ACCURACY, "--out", tmp_path, "--gates", "1", "--", "--mode", "rounds"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run(list(map(str, argv)), capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2 and "-- --mode rounds: this script measures lockstep gates" in p.stderr, p.stderr
    assert not (tmp_path / "gates.jsonl").exists() and not list(tmp_path.iterdir())


def test_gate_accuracy_table_of_a_folder_without_gates_is_refused_in_one_line(tmp_path: Path) -> None:
    """``--table --out DIR`` on a folder that holds no gates.jsonl ended in a FileNotFoundError traceback."""
    argv = [sys.executable, GATE_ACCURACY, "--out", tmp_path, "--table"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run(list(map(str, argv)), capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2 and f"--out {tmp_path}: no gates.jsonl there to print" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_gate_accuracy_judges_with_the_checkout_it_is_in(tmp_path: Path) -> None:
    """The gates measure the script's checkout, but its own imports (the judging: store, compare)
    took whatever tpbench the interpreter found first: run from one checkout with another tree's
    tpbench installed or on PYTHONPATH, the other tree judged this one's gates. A tpbench that fails
    on import stands first on PYTHONPATH here; the script still answers, from its own checkout."""
    other = tmp_path / "other" / "tpbench"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("raise ImportError('the other tree was imported')\n")
    argv = [sys.executable, GATE_ACCURACY, "--out", tmp_path, "--table"]
    env = {**os.environ, "PYTHONPATH": str(other.parent)}
    p = subprocess.run(list(map(str, argv)), capture_output=True, text=True, env=env, timeout=120)
    assert "the other tree was imported" not in p.stderr, p.stderr
    assert p.returncode == 2 and "no gates.jsonl there to print" in p.stderr, p.stderr


def test_gate_accuracy_measures_the_checkout_it_is_in(tmp_path: Path, monkeypatch) -> None:
    """Both sides were this interpreter (``sys.executable``), and the gate drops the PYTHONPATH
    entries that hold tpbench from a python side: run from a checkout with ``PYTHONPATH`` beside a
    venv whose tpbench is installed from another tree, every gate measured that other tree. Both
    sides are now the checkout the script is in, a source tree run with its root first on PYTHONPATH,
    and the gate itself runs from it too."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gate_accuracy", GATE_ACCURACY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # as the finding ran it: the checkout on PYTHONPATH
    cmd, env = module.gate_process(module.SUITE, tmp_path / "g", 10.0, [])
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)
    for name in ("baseline", "candidate"):
        side = gate.resolve_side(name, cmd[cmd.index(f"--{name}") + 1], tmp_path / name)
        assert side.kind == "source" and side.env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO), side


def test_gate_accuracy_judges_a_gate_that_left_no_runs(tmp_path: Path) -> None:
    """A gate that failed before its sides wrote a run (its folder empty or absent) is tallied as
    "no runs"; the script crashed there, ending a campaign of hours at that gate."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gate_accuracy", GATE_ACCURACY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.judge(tmp_path / "c0-s0-000", "cpu_ms", 0.05)[0]["verdict"] == "no runs"


def test_gate_accuracy_judges_each_case_of_a_suite_of_several(tmp_path: Path) -> None:
    """``--suite`` of your own with more than one case (examples/own_model's 8): the script ran a whole
    gate, then stopped with "ValueError: too many values to unpack (expected 1)". Each case is judged
    and tallied in a row of its own, named beside the metric."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gate_accuracy", GATE_ACCURACY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "c0-s0-000"
    medians = {"ddp": [10.0, 10.1, 9.9, 10.2], "zero_no_overlap": [12.0, 12.1, 11.9, 12.2]}
    make_run(out / "baseline", medians)
    make_run(out / "candidate", medians)
    rows = module.judge(out, "step_ms", 0.05)
    assert sorted(r["case"] for r in rows) == ["ddp", "zero_no_overlap"] and all(r["pairs"] == 4 for r in rows)
    facts = {"gate": out.name, "competitors": 0, "slowdown_pct": 0.0, "metric": "step_ms", "wall_s": 30.0}
    facts |= {"exit_code": 0, "load1_before": 1.0, "load1_after": 1.0}
    said = module.table([facts | r for r in rows], 0.05)
    assert "| 0 | +0% | step_ms (ddp) | 1 |" in said and "| 0 | +0% | step_ms (zero_no_overlap) | 1 |" in said
    (one,) = module.judge(tmp_path / "none", "step_ms", 0.05)
    assert one["verdict"] == "no runs" and "case" not in one


@pytest.mark.parametrize("mode", ["lockstep", "rounds"])
def test_a_file_in_place_of_the_gates_out_folder_is_named(tmp_path: Path, capsys, mode: str) -> None:
    """``--out`` naming a file (or a path under one): said as a sweep's ``--out`` is, before any side
    starts; the gate said only "tpbench gate: error: /tmp/x: File exists" (lockstep) or
    ".../x/baseline/round01: Not a directory" (rounds)."""
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "gate"
    args = ["gate", "suites/gate.toml", "--baseline", ".", "--candidate", ".", "--mode", mode, "--out", str(out)]
    assert run_cli([*args, *(["--rounds", "2"] if mode == "rounds" else ["--budget-s", "60"])]) == 3
    err = " ".join(capsys.readouterr().err.split())
    said = f"tpbench gate: error: {out}: the gate's --out folder cannot be made: {tmp_path / 'a-file'} is a file"
    assert said in err, err


def test_a_round_the_budget_cuts_short_keeps_its_finished_item(tmp_path: Path) -> None:
    """The budget spent while one side's item of a round had finished: the round was dropped from
    gate.json's rounds and the stop line said "stopping after 0 rounds", though the item had run and
    was on its side's disk. A stand-in conductor (the gate's own class, not torch's) finishes the
    first item of round 2 and then finds the budget spent."""
    from types import SimpleNamespace

    names = ("baseline", "candidate")
    sides = [SimpleNamespace(exited=False, side=SimpleNamespace(name=n), root=tmp_path / n) for n in names]
    done = iter([gate_record.GateItem("baseline", "c", 0, 0.0, 1.0, True)] * 3)

    class Conductor:
        def run_item(self, side, metric):
            try:
                return next(done)
            except StopIteration:
                raise gate.BudgetSpent("candidate's item c repeat 1") from None

    rounds: list = []
    cfg = gate.Lockstep(budget_s=1e12)  # never spent by the clock: the stand-in spends it
    stopped = gate._pace(Conductor(), sides, cfg, 0.0, rounds, lambda line: None)
    assert stopped.startswith("budget of 1e+12 s spent while waiting for candidate's item")
    assert [len(r.items) for r in rounds] == [2, 1] and rounds[1].partial and not rounds[0].partial
    assert "partial" in rounds[1].to_json() and "partial" not in rounds[0].to_json()
    assert gate._rounds_run(rounds) == "1 round and 1 item of round 2"
    assert gate._rounds_run(rounds[:1]) == "1 round"


class SteppedClock:
    """Seconds that pass only when the test says so (as tests/test_progress.py's)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def paced_rounds_lines(roots: list[Path], rounds: int, round_s: float) -> list[str]:
    """The rounds lines a lockstep gate of ``rounds`` rounds of ``round_s`` each says, its sides'
    runs under ``roots``. A stand-in conductor (the gate's own class, not torch's) runs each item at
    once and steps the clock; the sides' plans end after ``rounds`` rounds."""
    from types import SimpleNamespace

    clock = SteppedClock()
    sides = [
        SimpleNamespace(exited=False, side=SimpleNamespace(name=n), root=r)
        for n, r in zip(("baseline", "candidate"), roots)
    ]
    ran: list = []

    class Conductor:
        def run_item(self, side, metric):
            if len(ran) == 2 * rounds:
                for s in sides:
                    s.exited = True
                return None
            clock.t += round_s / 2
            ran.append(side)
            return gate_record.GateItem(side.side.name, "c", (len(ran) - 1) // 2, clock.t, clock.t, True)

    said: list[str] = []
    cfg = gate.Lockstep(budget_s=1e12)  # never spent: the stepped clock is not the gate's budget clock
    assert gate._pace(Conductor(), sides, cfg, 0.0, [], said.append, clock) is None
    return said


def test_the_gate_says_its_rounds_as_the_sweep_paces_its_lines(tmp_path: Path) -> None:
    """A line every 10 rounds whatever the time: a 500-repeat --target-ci gate (rounds of about 2 s)
    said one every 20 s, a 480 s budget two dozen of them, and one of rounds of 1 s every 10 s. The
    gate now paces them as the sweep and the tune do (``PlainPace``): once 30 s and a tenth of the
    rounds its sides' runs plan have passed, so 200 rounds of 2 s of a 500-round plan say 4 lines, not 20."""
    roots = []
    for name in ("baseline", "candidate"):
        make_run(tmp_path / name, {"ddp": [10.0] * 500})
        roots.append(tmp_path / name)
    said = paced_rounds_lines(roots, rounds=200, round_s=2.0)
    assert said == [f"tpbench gate: {n} rounds, {2 * n} s" for n in (50, 100, 150, 200)]


def test_the_gate_paces_its_rounds_by_time_alone_where_no_plan_is_read(tmp_path: Path) -> None:
    """Sides whose runs this tpbench cannot read (none yet, or another version's): a line every
    30 s, not every 10 rounds (of 1 s: 3 lines in 100 rounds, not 10)."""
    said = paced_rounds_lines([tmp_path / "b", tmp_path / "c"], rounds=100, round_s=1.0)
    assert said == [f"tpbench gate: {n} rounds, {n} s" for n in (30, 60, 90)]


def test_the_stop_line_names_the_item_it_waited_for_by_case_and_repeat() -> None:
    """The budget spent while an item ran: the stop line read "waiting for baseline's item 40ff2cc6b19e 45
    to end", an id and a number that could be a second id or a count. The item the gate waits for
    (``_Conductor.run_item``) is named with what each is (end to end: tests/test_lockstep.py)."""
    said = gate.item_words("baseline", "40ff2cc6b19e", 45)
    assert said == "baseline's item (case 40ff2cc6b19e, repeat 45)"


# gate.json as a lockstep gate wrote it before its record was typed (no schema_version): a finished
# item with the world's clock, one its world died in, a round the budget cut short, and the answer.
OLD_GATE_JSON = {
    "mode": "lockstep", "seed": 7, "metric": "step_ms", "repeats": 30, "target_ci": 0.05, "budget_s": 480.0,
    "stopped": "budget of 480 s spent while waiting for candidate's item c 1", "answer": "unknown",
    "answers": {"c": "unknown"}, "wall_s": 481.5,
    "sides": {
        "baseline": {"spec": "/base", "kind": "source", "run": "/g/baseline/r1", "log": "/g/baseline.log",
                     "exit_code": 0},
        "candidate": {"spec": "/venv", "kind": "venv", "run": "/g/candidate/r2", "log": "/g/candidate.log",
                      "exit_code": None},
    },
    "rounds": [
        {"round": 1, "order": ["candidate", "baseline"], "items": [
            {"side": "candidate", "case": "c", "repeat": 0, "start": 10.0, "end": 11.0, "done": False},
            {"side": "baseline", "case": "c", "repeat": 0, "start": 11.0, "end": 12.5, "done": True,
             "began": 11.1, "ended": 12.4},
        ]},
        {"round": 2, "order": ["baseline", "candidate"], "items": [
            {"side": "baseline", "case": "c", "repeat": 1, "start": 13.0, "end": 14.0, "done": True,
             "began": 13.1, "ended": 13.9},
        ], "partial": True},
    ],
}  # fmt: skip


def test_gate_json_loads_into_the_record_the_gate_writes_and_back(tmp_path: Path) -> None:
    """The gate judged from a dict it had built for gate.json, picking keys out of it, and nothing read
    gate.json back but as a dict. Now one typed record (``gate_record.GateRecord``) passes from the
    gate's rounds to its file to its answer: a file as earlier gates wrote it loads into it, writes
    back the same keys and values (with ``schema_version``), and reads back equal; a file of another
    version, or not a gate's, is refused naming it."""
    old = tmp_path / "old"
    old.mkdir()
    (old / "gate.json").write_text(json.dumps(OLD_GATE_JSON))
    record = gate_record.read(old)
    assert record.rounds[1].partial and record.rounds[0].items[0].began is None
    assert record.sides["candidate"] == gate_record.GateSide(
        "/venv", "venv", "/g/candidate/r2", "/g/candidate.log", None
    )
    assert record.gate_answer == compare.GateAnswer("unknown", {"c": "unknown"}, 0.05, OLD_GATE_JSON["stopped"])
    assert record.to_json() == {"schema_version": 1, **OLD_GATE_JSON}
    again = tmp_path / "again"
    again.mkdir()
    gate_record.write(again, record)
    assert gate_record.read(again) == record
    assert json.loads((again / "gate.json").read_text()) == {"schema_version": 1, **OLD_GATE_JSON}
    # Without --target-ci: no answer in the record, none in the file.
    plain = replace(record, answer=None, answers=None, target_ci=None)
    gate_record.write(again, plain)
    assert "answer" not in json.loads((again / "gate.json").read_text()) and gate_record.read(again) == plain
    assert plain.gate_answer is None
    for doc, said in (({**OLD_GATE_JSON, "schema_version": 2}, "schema_version 2"), ([], "expected a JSON object")):
        (again / "gate.json").write_text(json.dumps(doc))
        with pytest.raises(gate.GateError, match=f"gate.json: {said}"):
            gate_record.read(again)
    (again / "gate.json").write_text(json.dumps({k: v for k, v in OLD_GATE_JSON.items() if k != "rounds"}))
    with pytest.raises(gate.GateError, match="gate.json: not a gate record"):
        gate_record.read(again)


@pytest.mark.parametrize(("flags", "warned"), [(["--repeats", "2"], True), (["--repeats", "3"], False)])
def test_a_gate_too_short_to_fail_says_so_before_it_runs(tmp_path: Path, capsys, flags, warned) -> None:
    """``--repeats 2``: every case ends "too few to judge (2 pairs; need 3)", inconclusive, and the
    gate exits 0 whatever the candidate does; a CI job made quick that way never went red, unwarned."""
    side = "/bin/false tpbench"  # the sides fail at once: the warning comes before any sweep
    args = ["gate", "suites/gate.toml", "--baseline", side, "--candidate", side, *flags]
    assert run_cli([*args, "--budget-s", "60", "--out", str(tmp_path / "out")]) == 3
    err = " ".join(capsys.readouterr().err.split())
    said = "tpbench gate: warning: --repeats 2: a case is judged on at least 3 pairs; with 2 every case ends"
    assert (said in err) == warned and ("cannot fail" in err) == warned, err
    if warned:
        assert err.index(said) < err.index("tpbench gate: baseline:"), err


# ---------------------------------------------------------------- the user's own code


USER_MODEL = """\
import torch
from tpbench.workloads import Bench, WorkloadContext, batch_seed

print(f"mymodels imported from {__file__}", flush=True)  # in each rank's log: which copy ran
EXTRA_MATMULS = @EXTRA@


class Net(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, width), torch.nn.Linear(width, 4)
        self.w = torch.nn.Parameter(torch.eye(width))

    def forward(self, x):
        h = self.a(x)
        for _ in range(1 + EXTRA_MATMULS):
            h = h @ self.w
        return self.b(h)


def make(ctx: WorkloadContext, width: int = 128) -> Bench:
    torch.manual_seed(ctx.seed)
    model = Net(width).to(ctx.device)

    def train_batch(step: int):
        g = torch.Generator().manual_seed(batch_seed(ctx.seed, ctx.rank, step))
        x = torch.randn(ctx.batch_size, 32, generator=g)
        return x.to(ctx.device), x[:, :4].argmax(dim=1).to(ctx.device)

    return Bench(model=model, train_batch=train_batch, loss=torch.nn.functional.cross_entropy)
"""

USER_SUITE = """\
[suite]
name = "mine"
[defaults]
workload = "mymodels:make"
world_size = 2
backend = "gloo"
device = "cpu"
algorithm = "ddp"
batch_size = 64
warmup_steps = 1
steps = 4
repeats = 3
timeout_s = 60
"""


def user_project(folder: Path, extra_matmuls: int = 0) -> Path:
    """A user's project: ``mymodels.py`` (a model factory doing ``1 + extra_matmuls`` matmuls of
    its hidden layer a step, saying its file in each rank's log) and ``suite.toml`` naming it."""
    folder.mkdir(parents=True)
    (folder / "mymodels.py").write_text(USER_MODEL.replace("@EXTRA@", str(extra_matmuls)))
    (folder / "suite.toml").write_text(USER_SUITE)
    return folder


def imported_from(run: Path) -> set[str]:
    """The files ``mymodels`` was imported from, as the run's rank logs say them."""
    logs = "".join(p.read_text() for p in (run / "logs").glob("*-rank*.log"))
    return set(re.findall(r"mymodels imported from (\S+)", logs))


@pytest.mark.slow  # two rounds-mode sweeps of a user's own model (15 s): over CI's budget
@pytest.mark.ranks
def test_a_rounds_gate_imports_the_suites_own_code_from_the_callers_folder(tmp_path: Path, monkeypatch) -> None:
    """Only the lockstep gate handed its sides the caller's folder: in ``--mode rounds`` (and the
    sweeps of ``--explain``) a venv side's sweep, run in ``--out/<side>``, could not import the
    suite's ``workload = "mymodels:make"`` and the gate exited 2 ("cannot import 'mymodels'")."""
    mine = user_project(tmp_path / "mine")
    monkeypatch.chdir(mine)  # the caller's folder; the gate runs here, its sides' sweeps in fresh interpreters
    args = ["gate", "suite.toml", "--baseline", sys.prefix, "--candidate", sys.prefix, "--mode", "rounds"]
    assert run_cli([*args, "--rounds", "1", "--set", "repeats=1", "--out", str(tmp_path / "g")]) == 0
    for side in ("baseline", "candidate"):
        (run,) = store.iter_runs(tmp_path / "g" / side / "round01")
        assert imported_from(run) == {str(mine / "mymodels.py")}


def test_a_folder_of_ones_own_code_is_a_side_that_imports_from_it_alone(tmp_path: Path, monkeypatch) -> None:
    """A directory that is neither a venv nor holds a tpbench package is the user's own code, run by
    this tpbench: first on PYTHONPATH (with its src/), its working directory and its only user path, so
    the caller's folder (the candidate's checkout) cannot supply the baseline's modules."""
    base, cand = user_project(tmp_path / "base"), user_project(tmp_path / "cand")
    (base / "src").mkdir()
    (cand / "pyproject.toml").write_text("")  # with or without one
    monkeypatch.chdir(cand)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(tmp_path / "elsewhere")]))
    for folder, spec, first in ((base, "../base", [str(base), str(base / "src")]), (cand, ".", [str(cand)])):
        s = gate.resolve_side("baseline", spec, tmp_path / "out")
        assert (s.kind, s.cwd, s.argv) == ("project", folder, (sys.executable, "-m", "tpbench"))
        assert s.env[user_code.USER_PATH_ENV] == str(folder)
        path = s.env["PYTHONPATH"].split(os.pathsep)
        assert path[: len(first)] == first and path[-1] == str(tmp_path / "elsewhere")
        p = subprocess.run(
            [*s.argv[:1], "-c", "import mymodels, tpbench; print(mymodels.__file__); print(tpbench.__file__)"],
            env=os.environ | s.env,
            cwd=s.cwd,
            capture_output=True,
            text=True,
        )
        mine, tpb = p.stdout.splitlines()[-2:]
        assert mine == str(folder / "mymodels.py") and Path(tpb).resolve() == Path(gate.__file__).resolve().with_name(
            "__init__.py"
        )


@pytest.mark.ranks
def test_a_gate_of_two_checkouts_of_ones_own_code_measures_each_sides_own_model(tmp_path: Path) -> None:
    """Gating one's own model, run in the candidate's checkout: ``--baseline ../base --candidate .``.
    A folder without a tpbench package was refused ("a source tree without a tpbench package"), and
    a venv side imported the model from the caller's folder: both sides measured the candidate's."""
    base = user_project(tmp_path / "base")
    cand = user_project(tmp_path / "cand", extra_matmuls=2)  # 3x the hidden layer's compute
    (base / "pyproject.toml").write_text("")
    args = ["gate", "suite.toml", "--baseline", "../base", "--candidate", ".", "--repeats", "3"]
    p = run_tpbench(*args, "--out", tmp_path / "g", "--format", "json", cwd=cand)
    assert p.returncode in (0, 1), p.stderr
    assert "baseline ../base: a folder of your own code, run by this tpbench" in p.stderr
    sides = json.loads((tmp_path / "g" / "gate.json").read_text())["sides"]
    for name, folder in (("baseline", base), ("candidate", cand)):
        assert sides[name]["kind"] == "project"
        assert imported_from(Path(sides[name]["run"])) == {str(folder / "mymodels.py")}
    (case,) = json.loads(p.stdout)["cases"]
    assert case["pairs"] == 3


@pytest.mark.parametrize(
    ("suite_text", "overrides", "refused"),
    [
        (tiny_suite('algorithm = ["ddp"]'), [], True),  # built-in code only: a wrong folder gated tpbench alike
        (tiny_suite('algorithm = ["ddp"]'), ["workload=mymodels:make"], False),
        (tiny_suite('algorithm = ["ddp"]'), ["workload"], True),  # no value: an IndexError's traceback
        (tiny_suite('algorithm = ["ddp"]', workload='"mymodels:make"'), [], False),
        (tiny_suite('comm_hook = ["allreduce", "myhooks:h"]'), [], False),
    ],
)
def test_a_folder_of_ones_own_code_with_a_suite_that_names_none_is_refused(
    tmp_path: Path, suite_text: str, overrides: list[str], refused: bool
) -> None:
    """A folder that is neither a venv nor tpbench's is read as the user's code; with a suite that
    names no MODULE:NAME (``--baseline results``, a typo) both sides ran this tpbench on the same
    code, and the gate passed it against itself without a word. Refused before any sweep."""
    suite = tmp_path / "suite.toml"
    suite.write_text(suite_text)
    folder = tmp_path / "not-code"
    folder.mkdir()
    side = gate.resolve_side("baseline", str(folder), tmp_path / "out")
    assert side.kind == "project"
    if refused:
        with pytest.raises(gate.GateError, match=r"a folder of your own code, but .* names none \(no workload"):
            gate._refuse_a_project_without_code(side, suite, overrides)
    else:
        gate._refuse_a_project_without_code(side, suite, overrides)


def test_the_keys_the_gate_refuses_in_set_are_the_ones_it_sets() -> None:
    """``GATE_KEYS`` (refused in a user's --set) and ``Lockstep.overrides`` (set for both sides) name one list."""
    assert [o.split("=", 1)[0] for o in gate.Lockstep().overrides()] == list(gate.GATE_KEYS)


@pytest.mark.parametrize("mode", ["lockstep", "rounds"])
def test_a_missing_suite_file_is_the_gates_first_and_only_line_naming_it_as_typed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    """``tpbench gate nosuch.toml`` with folders of one's own code printed how it resolved each side
    (two lines) before the error, and the error named the absolute path where ``sweep`` names the
    path as typed; the error now comes first and alone, as ``sweep``'s does."""
    (tmp_path / "mine").mkdir()
    monkeypatch.chdir(tmp_path)
    assert run_cli(["gate", "nosuch.toml", "--baseline", "mine", "--candidate", "mine", "--mode", mode]) == 2
    assert capsys.readouterr().err.splitlines() == ["tpbench gate: error: nosuch.toml: no such suite file"]


def test_report_tallies_only_the_common_cases_and_names_a_run_with_none_in_common(tmp_path: Path) -> None:
    """The report's line per later run counts a case missing on one side apart from the common ones
    (it said "over 2 common case(s): 1 missing, 2 pass", three verdicts of two cases), and a run
    that shares no case with the first gets a line saying so instead of none."""
    from tpbench.report import verdicts
    from tpbench.report.data import load as report_data
    from tpbench.sweep import finalize

    two = {"ddp": noisy(10, 3, 0.01, 1), "zero_no_overlap": noisy(20, 3, 0.01, 2)}
    base = make_run(tmp_path / "a", two)
    more = make_run(tmp_path / "b", {**two, "hook_with_zero_step": noisy(15, 3, 0.01, 3)})
    other = make_run(tmp_path / "c", {"ddp": noisy(10, 3, 0.01, 4)}, defaults={"batch_size": 64})
    for run in (base, more, other):
        finalize(store.Run.open(run))
    data = report_data([store.load(base), store.load(more), store.load(other)])
    first, second = verdicts.across_runs_lines(data, verdicts.against_first_run(verdicts.run_data(data)))
    assert "over 2 common case(s): 2 pass (threshold ±5%)" in first
    assert first.endswith("; 1 case(s) missing on one side (the Across runs table says why).")
    none_in_common = r"Run C · \S+ against run A · \S+: no case has data in both runs; 1 case\(s\) missing on .*\."
    assert re.fullmatch(none_in_common, second)


def test_a_case_without_baseline_data_says_whether_the_baseline_failed_it_or_lacks_it(tmp_path: Path) -> None:
    """The baseline side names its case's status as the candidate side does ("no candidate data (case
    failed)"): "no baseline data for this case" read as if the baseline never had it, hiding a
    baseline to ``--resume``."""
    two = {"ddp": noisy(10, 3, 0.01, 1), "zero_no_overlap": noisy(20, 3, 0.01, 2)}
    base = make_run(tmp_path / "a", two, failed=["ddp"])
    cand = make_run(tmp_path / "b", {**two, "hook_with_zero_step": noisy(15, 3, 0.01, 3)})
    reasons = {c.label: (c.verdict, c.reason) for c in compare.compare_runs([base], [cand]).cases}
    assert reasons["ddp"] == ("missing", "no baseline data (case failed)")
    assert reasons["hook_with_zero_step"] == ("missing", "no baseline data for this case")
    assert reasons["zero_no_overlap"][0] == "pass"


def test_a_copy_of_a_pooled_run_is_refused_on_its_side_and_allowed_against_it(tmp_path: Path) -> None:
    """A copy of a baseline run (another folder, the same run id) pooled beside it counted the run's
    repeats twice ("baseline: 2 run(s)", repeats 6/3): refused, as the run given twice is. The run
    against its copy, an A/A check, is still judged."""
    import shutil

    base = make_run(tmp_path / "a", {"ddp": noisy(10, 3, 0.01, 1)})
    cand = make_run(tmp_path / "b", {"ddp": noisy(10, 3, 0.01, 2)})
    copy = shutil.copytree(base, tmp_path / "copy")
    with pytest.raises(compare.GateError, match=rf"^{copy}: the same run as {base} \(run id \S+, a copy\)"):
        compare.compare_runs([base, copy], [cand])
    (case,) = compare.compare_runs([base], [copy]).cases
    assert case.ratio == pytest.approx(1.0)


def test_gate_accuracy_keeps_a_gate_of_too_few_pairs_inconclusive(tmp_path: Path) -> None:
    """A gate of 2 pairs (``-- --repeats 2``, or a budget that ran out) is inconclusive, too few to
    judge, in its row of gates.jsonl; the table judged it again from its interval's ends alone and
    tallied it a regression at the same threshold. The row, as such a real gate wrote it, is kept
    inconclusive; one of enough pairs is still judged again at the table's threshold."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gate_accuracy", GATE_ACCURACY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    row = {"gate": "c0-s10-000", "competitors": 0, "slowdown_pct": 10.0, "metric": "cpu_ms", "wall_s": 41.6}
    row |= {"exit_code": 0, "load1_before": 9.5, "load1_after": 10.5, "verdict": "inconclusive", "ratio": 1.121}
    row |= {"ci_lo": 1.052, "ci_hi": 1.195, "half_width": 0.066, "pairs": 2}
    assert "| 0 | +10% | cpu_ms | 1 | 0/1 | 1/1 | 0/1 | 0/1 |" in module.table([row], 0.05)
    assert "| 0 | +10% | cpu_ms | 1 | 1/1 | 0/1 | 0/1 | 0/1 |" in module.table([row | {"pairs": 3}], 0.05)
