"""``tpbench explain``: the parts of a step-time change, on hand-built intervals (exact sums, what
waiting is) and through real sweeps with planted causes (a CPU burn on every rank → compute, the
same burn on one rank → straggler wait on the others, an emulated 1 Gbit/s link → exposed
communication, smaller buckets → exposed communication spread over the buckets). The sweeps are
2-rank Gloo worlds of the issue's smoke size (mlp 512×8, but a deep, narrow mlp for the buckets),
traced; each planted cause is several times the machine's step-to-step noise, and every real test checks
that the parts add up to the change the *timed* steps measured within 20 %, which the traced
steps only do if they ran as the timed ones did."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import REPO, run_cli, sweep_in_process, tiny_suite, tpbench
from test_interconnect import needs_netns

from tpbench import compare, explain, store
from tpbench.analysis import explain as parts
from tpbench.analysis.trace_events import BURN_RANGE
from tpbench.report.build import build_report

MLP = {"width": 512, "depth": 8}
SMOKE = {"batch_size": 32, "warmup_steps": 2, "steps": 5, "repeats": 3, "slowdown_kind": '"cpu"'}
BURNT = SMOKE | {"batch_size": 128}  # the ``burnt`` run's, and what a run matching its cases takes


def _iv(rank: int, lane: str, start: int, end: int, collective: str | None = None) -> dict:
    return {
        "rank": rank,
        "step": 0,
        "lane": lane,
        "start_ns": start,
        "end_ns": end,
        "collective": collective,
        "process_group": "0",
    }


def _steps(*spans: tuple[int, int, int]) -> pd.DataFrame:
    return pd.DataFrame([{"rank": r, "step": 0, "start_ns": s, "end_ns": e} for r, s, e in spans])


def test_a_rank_that_waits_for_a_late_peer_shows_straggler_wait_and_parts_sum_to_the_span() -> None:
    """Rank 1 computes 60 ns longer; rank 0 enters the allreduce 60 ns early and waits. Every ns of
    each span lands in exactly one part; the wait is rank 0's duration beyond rank 1's."""
    iv = pd.DataFrame(
        [
            _iv(0, "compute", 0, 40),
            _iv(0, "comm", 40, 120, "allreduce"),  # 60 waiting + 20 transfer
            _iv(0, "optimizer", 120, 140),
            _iv(0, "compute", 120, 135),
            _iv(1, "compute", 0, 100),
            _iv(1, "comm", 100, 120, "allreduce"),
            _iv(1, "optimizer", 120, 140),
            _iv(1, "compute", 120, 135),
        ]
    )
    per_rank = parts.rank_step_parts(iv, _steps((0, 0, 150), (1, 0, 150))).set_index("rank")
    assert per_rank.loc[0, ["compute", "optimizer", "straggler_wait", "exposed_comm", "idle"]].tolist() == [
        40,
        15,
        60,
        20,
        15,
    ]
    assert per_rank.loc[1, ["compute", "optimizer", "straggler_wait", "exposed_comm", "idle"]].tolist() == [
        100,
        15,
        0,
        20,
        15,
    ]
    assert (per_rank[list(parts.PARTS)].sum(axis=1) == per_rank["span_ns"]).all()
    step = parts.step_parts(per_rank.reset_index()).iloc[0]
    # The least-loaded rank's compute; rank 1's extra 60 joins rank 0's 60 of waiting (means: 30 + 30).
    assert (step["compute"], step["straggler_wait"], step["step_ns"]) == (40, 60, 150)
    assert step[list(parts.PARTS)].sum() == step["step_ns"]


def test_the_change_is_split_exactly_with_an_interval_per_part() -> None:
    rng = np.random.default_rng(0)
    base = pd.DataFrame({p: rng.uniform(1e6, 2e6, 8) for p in parts.PARTS})
    cand = base.sample(frac=1, random_state=1).reset_index(drop=True) + [3e6, 0, 0, 0, 0]
    base["step_ns"], cand["step_ns"] = base[list(parts.PARTS)].sum(axis=1), cand[list(parts.PARTS)].sum(axis=1)
    e = parts.explain(base, cand)
    assert e.top.name == "compute" and abs(e.residual_ms) < 1e-9
    assert e.top.lo < e.top.delta_ms < e.top.hi and e.top.lo > 2.0
    assert "mostly compute" in parts.sentence(e)


def test_a_traced_change_off_the_timed_one_is_said() -> None:
    base = pd.DataFrame({p: [1e6, 1.2e6, 0.9e6] for p in parts.PARTS})
    cand = base + [10e6, 0, 0, 0, 0]
    base["step_ns"], cand["step_ns"] = base[list(parts.PARTS)].sum(axis=1), cand[list(parts.PARTS)].sum(axis=1)
    e = parts.explain(base, cand)  # +10 ms traced

    def said(timed: float) -> str:
        return explain.CaseExplanation("c", "label", "b", "c", e, timed, e).unlike_timed

    assert said(11.0) == "" and said(8.5) == ""
    assert said(14.0).startswith("the traced change is 71% of the timed one") and said(float("nan")) == ""
    # Against a timed change near zero a ratio reads 1000s of per cent: the two changes say it instead.
    assert said(0.004).startswith("the traced change is off the timed one (+10.00 vs +0.00 ms)")


def test_a_change_its_interval_cannot_resolve_gets_no_share_and_mostly_means_more_than_half() -> None:
    """A change of about zero whose parts moved apart (compute one way, straggler wait the other) used
    to read "-0.00 ms per step faster …, mostly straggler wait: -4.42 ms (114883% of the change)"."""
    rng = np.random.default_rng(3)
    base = pd.DataFrame({p: rng.uniform(1e6, 2e6, 6) for p in parts.PARTS})
    cand = base.copy()
    cand["compute"] += 4e6
    cand["straggler_wait"] -= 4e6
    base["step_ns"], cand["step_ns"] = base[list(parts.PARTS)].sum(axis=1), cand[list(parts.PARTS)].sum(axis=1)
    e = parts.explain(base, cand)
    said = parts.sentence(e)
    assert e.lo < 0 < e.hi and "no change resolved" in said and "% of the change" not in said
    moved = ("the part that moved most: compute, +4.00 ms", "the part that moved most: straggler wait, -4.00 ms")
    assert "slower" not in said and "faster" not in said and any(m in said for m in moved)
    # Resolved, but the top part less than half the change: "most of all", not "mostly".
    cand = base[list(parts.PARTS)] + [3e6, 2e6, 2e6, 0, 0]
    cand["step_ns"] = cand[list(parts.PARTS)].sum(axis=1)
    e = parts.explain(base, cand)
    assert 0 < e.lo and "most of all compute: +3.00 ms (43% of the change" in parts.sentence(e)


def test_a_resolved_change_whose_largest_part_is_not_resolved_gets_no_mostly():
    """The step's change resolved (timed over many steps) but its largest part's interval, over a few
    traced steps, held zero: "mostly exposed comm: +4.67 ms (323% of the change, 95% CI -58.02 to
    +67.37)" claimed a cause the traced steps could not tell from noise. It now says no part's change is
    resolved and names the part that moved most with its interval."""
    base = pd.DataFrame({p: [1.5e6, 1.51e6, 1.49e6, 1.5e6] for p in parts.PARTS})
    cand = base.copy()
    cand["exposed_comm"] += [30e6, -25e6, 28e6, -14e6]  # +4.75 ms on average, unresolved
    cand["idle"] += [1e6, -0.8e6, 0.9e6, -0.5e6]  # +0.15 ms, unresolved
    base["step_ns"] = base[list(parts.PARTS)].sum(axis=1)
    cand["step_ns"] = base["step_ns"] + [1e6, 1.01e6, 0.99e6, 1e6]  # the step: +1 ms, resolved
    e = parts.explain(base, cand)
    said = parts.sentence(e)
    assert 0 < e.lo and e.top.lo < 0 < e.top.hi, (e, said)
    assert "slower (95% CI" in said and "no part's change is resolved over the traced steps" in said, said
    assert "mostly" not in said and "most of all" not in said and "% of the change" not in said, said


def test_an_unresolved_largest_part_beside_a_resolved_one_names_the_resolved_one():
    """A real pair (hook_with_zero_step_interleaved shard_buckets=False, two 3-repeat runs of zero.toml's
    1 MB cases) read "+8.42 ms per step slower (95% CI +5.98 to +19.15); no part's change is resolved over
    the traced steps: the part that moved most, straggler wait, +3.26 ms (95% CI -9.10 to +15.62)" above a
    table whose compute row was +1.88 [+0.89, +2.88]: resolved. The sentence keeps its largest part
    unclaimed and names the largest part that was resolved, with its interval."""
    base = pd.DataFrame({p: [1.5e6, 1.51e6, 1.49e6, 1.5e6] for p in parts.PARTS})
    cand = base.copy()
    cand["exposed_comm"] += [30e6, -25e6, 28e6, -14e6]  # +4.75 ms on average, unresolved
    cand["compute"] += 1e6  # +1 ms on every step: resolved
    base["step_ns"] = base[list(parts.PARTS)].sum(axis=1)
    cand["step_ns"] = base["step_ns"] + [1e6, 1.01e6, 0.99e6, 1e6]  # the step: +1 ms, resolved
    e = parts.explain(base, cand)
    said = parts.sentence(e)
    compute = next(c for c in e.components if c.name == "compute")
    assert 0 < compute.lo and e.top.name == "exposed_comm" and e.top.lo < 0 < e.top.hi, (e, said)
    assert "no part's change is resolved" not in said, said
    assert "the part that moved most, exposed comm, +4.75 ms (95% CI" in said, said
    assert "is not resolved over the traced steps; of the parts resolved, compute moved most: +1.00 ms" in said, said
    assert "mostly" not in said and "% of the change" not in said, said


# ---------------------------------------------------------------- real sweeps, planted causes


@pytest.fixture(scope="module")
def burnt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run, its cases interleaved round by round: no burn, and 150 % more CPU per step on every
    rank or on rank 1 only (``slowdown_ranks``). 150 %, not the issue's 40 %: on the shared 2-core
    machine a window of traced steps drifts from its case's timed steps by 10 ms and more, and the
    planted cause must stand out of the traced composition. Batches of 128, not 32: the burn is a
    share of the step's CPU time, which the batch scales and the optimizer step does not; at 32 a
    traced window's optimizer phase running 12 ms long once outweighed a burn of about 25 ms (the slow
    traced windows of docs/explain.md, whose memory-bound optimizer ops run several times slower), at
    128 the burn is about 45 ms."""
    root = tmp_path_factory.mktemp("explain")
    sweep = 'slowdown_pct = [0, 150]\nslowdown_ranks = ["all", [1]]'
    return sweep_in_process(root, tiny_suite(sweep, name="burn", profiler_steps=6, mlp=MLP, **BURNT)).run_dir


def _adds_up(case: dict) -> None:
    """The parts sum to the change the timed steps measured (each side's traced composition scaled
    to its timed step); the traced steps' own parts sum to their own change, unscaled; and where
    that is more than 20 % off the timed change the output says so (``unlike_timed``).

    How close the traced change comes is not asserted: on the 2-core VM a traced window now and
    then runs 1.5–3× its timed steps (the profiler's ``record_shapes``, docs/explain.md), and the
    scaled parts still name the planted cause. That the traced steps carried the cause is checked
    on the trace itself (``_burns``)."""
    total, timed = sum(c["delta_ms"] for c in case["components"]), case["timed_delta_ms"]
    assert total == pytest.approx(case["delta_ms"], abs=1e-6) and total == pytest.approx(timed, rel=1e-9)
    traced = sum(c["delta_ms"] for c in case["traced_components"])
    assert traced == pytest.approx(case["traced_delta_ms"], abs=1e-6)
    assert bool(case["unlike_timed"]) == (abs(traced - timed) > 0.2 * abs(timed)), case


def _burns(run: Path, case_id: str) -> dict[int, tuple[int, float]]:
    """Per rank: how many ``tpbench.burn`` ranges the case's traced steps hold, and their mean ms."""
    iv = store.read_case_table(run, case_id, "intervals")
    burns = iv[iv["name"] == BURN_RANGE].assign(ms=lambda b: (b["end_ns"] - b["start_ns"]) / 1e6)
    return {int(r): (len(b), float(b["ms"].mean())) for r, b in burns.groupby("rank")}


@pytest.mark.ranks
def test_more_cpu_per_step_is_compute_and_one_slowed_rank_is_straggler_wait(burnt: Path, capsys) -> None:
    assert run_cli(["explain", str(burnt), "--pair", "slowdown_pct=0..150", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for case in doc["cases"]:
        assert [sorted(c) for c in case["components"]] == [["delta_ms", "hi", "lo", "name"]] * 5
        assert [c["name"] for c in case["components"]] == list(parts.PARTS)
        assert case["lo"] <= case["delta_ms"] <= case["hi"]
        _adds_up(case)
        # The traced steps burnt as the timed ones did, on the slowed ranks only: every traced step
        # one burn of about the planted change (each burning rank adds its burn to the step).
        slowed = [0, 1] if "=all" in case["label"] else [1]
        burns = _burns(burnt, case["cand_case"])
        assert sorted(burns) == slowed and not _burns(burnt, case["base_case"]), burns
        for count, ms in burns.values():
            assert count == 6 and case["timed_delta_ms"] / 2 <= ms <= 2 * case["timed_delta_ms"], burns
    tops = {c["label"]: c["top"] for c in doc["cases"]}
    assert tops == {
        "slowdown_pct: 0 → 150 (slowdown_ranks=all)": "compute",
        "slowdown_pct: 0 → 150 (slowdown_ranks=[1])": "straggler_wait",
    }, doc


@pytest.mark.ranks
def test_the_step_time_change_is_compares_figure_point_and_interval(burnt: Path, capsys) -> None:
    """The step-time line is what ``compare`` measured of the pair (its compared values, paired by
    round, and their ratio's interval in ms), not an unpaired interval over the few traced steps:
    explain must not call "faster" what compare calls no difference. The parts still add up to it."""
    assert run_cli(["compare", str(burnt), "--pair", "slowdown_pct=0..150", "--format", "json"]) in (0, 1)
    judged = {p["result"]["label"]: p["result"] for p in json.loads(capsys.readouterr().out)["pairs"]}
    assert run_cli(["explain", str(burnt), "--pair", "slowdown_pct=0..150", "--format", "json"]) == 0
    for case in json.loads(capsys.readouterr().out)["cases"]:
        r = judged[case["label"]]
        base = r["baseline_compared"]
        assert (case["base_ms"], case["cand_ms"]) == pytest.approx((base, r["candidate_compared"]), rel=1e-9)
        assert case["delta_ms"] == pytest.approx(base * (r["ratio"] - 1), rel=1e-9)
        assert (case["lo"], case["hi"]) == pytest.approx((base * (r["ci_lo"] - 1), base * (r["ci_hi"] - 1)), rel=1e-9)
        resolved = not r["ci_lo"] <= 1 <= r["ci_hi"]
        assert ("no change resolved" not in case["sentence"]) == resolved, (case["sentence"], r)
        _adds_up(case)


def test_a_change_without_an_interval_says_so() -> None:
    """Compare has no interval for one repeat a side: the sentence says so rather than "95% CI nan"."""
    base = pd.DataFrame({p: [1e6, 1.2e6, 0.9e6] for p in parts.PARTS})
    cand = base + [10e6, 0, 0, 0, 0]
    base["step_ns"], cand["step_ns"] = base[list(parts.PARTS)].sum(axis=1), cand[list(parts.PARTS)].sum(axis=1)
    e = dataclasses.replace(parts.explain(base, cand), lo=float("nan"), hi=float("nan"))
    said = parts.sentence(e)
    assert "slower (no interval: too few timed repeats), mostly compute" in said and "nan" not in said


def test_a_run_against_its_copy_says_no_change_resolved_with_its_interval() -> None:
    """A run explained against its exact copy: every part +0.00, the step time's interval compare's
    [-1.16, +2.34]. The sentence said "No change in the traced steps' time.", though its figure is the
    timed steps' and an interval that wide resolves nothing; it now words it as any unresolved change,
    and names no "part that moved most" where none moved. Without an interval it says that instead."""
    base = pd.DataFrame({p: [1e6, 1.2e6, 0.9e6] for p in parts.PARTS})
    base["step_ns"] = base[list(parts.PARTS)].sum(axis=1)
    e = dataclasses.replace(parts.explain(base, base.copy()), lo=-1.16, hi=2.34)
    said = parts.sentence(e)
    assert said == "+0.00 ms per step, no change resolved (95% CI -1.16 to +2.34); no part moved by 0.01 ms or more."
    e = dataclasses.replace(e, lo=float("nan"), hi=float("nan"))
    said = parts.sentence(e)
    assert said.startswith("+0.00 ms per step, no change resolved (no interval: too few timed repeats)"), said
    # A part that did move beside an unchanged step time is still named.
    cand = base[list(parts.PARTS)] + [1e6, -1e6, 0, 0, 0]
    cand["step_ns"] = cand[list(parts.PARTS)].sum(axis=1)
    said = parts.sentence(dataclasses.replace(parts.explain(base, cand), lo=-1.16, hi=2.34))
    assert "no change resolved (95% CI -1.16 to +2.34); the part that moved most: compute, +1.00 ms" in said, said


def test_an_unresolved_change_names_a_part_its_own_interval_resolves() -> None:
    """An unresolved change whose largest part swung (exposed communication, -2.0 ms, 95% CI -6 to +2)
    beside a steady part (compute, +1.9 ms, +1.2 to +2.6): the sentence named only the swing, so the
    one part the traced steps do show went unsaid. It is named now; and not twice where it is the top."""
    comps = [
        parts.Component("compute", 1.9, 1.2, 2.6),
        parts.Component("exposed_comm", -2.0, -6.0, 2.0),
        *(parts.Component(p, 0.0, -0.1, 0.1) for p in parts.PARTS[2:]),
    ]
    e = parts.Explanation(30.0, 29.9, -0.1, -4.0, 3.0, 5, 5, comps)
    said = parts.sentence(e)
    assert "the part that moved most: exposed comm, -2.00 ms (95% CI -6.00 to +2.00)" in said, said
    assert said.endswith("; of the parts resolved, compute moved most: +1.90 ms (95% CI +1.20 to +2.60)."), said
    steady = dataclasses.replace(e, components=[comps[0], parts.Component("exposed_comm", 0.5, -1.0, 2.0), *comps[2:]])
    said = parts.sentence(dataclasses.replace(steady, delta_ms=0.1))
    assert "the part that moved most: compute, +1.90 ms" in said and "of the parts resolved" not in said, said


def _line_kinds(text: str) -> list[tuple[int, str]]:
    """Each line's indent and first word, numbers as "#": what the page's example and the output share."""
    words = [(len(line) - len(line.lstrip()), (line.split() or [""])[0]) for line in text.splitlines()]
    return [(indent, "#" if word[:1] in "+-" and word[1:2].isdigit() else word) for indent, word in words]


def test_the_pages_example_output_has_the_outputs_lines() -> None:
    """docs/explain.md's example output, line by line, is what the text renderer writes: the runs'
    line, each case's label, sentence, table and note (the page once left out the first and last)."""
    from tpbench import render

    page = (REPO / "docs" / "explain.md").read_text(encoding="utf-8")
    example = page.split("```\n")[2]  # the first plain block, after the commands' ```sh block
    base = pd.DataFrame({p: [1e6, 1.2e6, 0.9e6] for p in parts.PARTS} | {f"{parts.DETAIL}bucket 0": [1e5] * 3})
    cand = base + [0, 5e5, 0, 0, 24e6, 5e5]
    for side in (base, cand):
        side["step_ns"] = side[list(parts.PARTS)].sum(axis=1)
    e = parts.explain(base, cand)
    case = explain.CaseExplanation("1601c6a93971", "slowdown_pct: 0 → 150", "b", "c", e, e.delta_ms, e, (1, 1))
    out = render.render_explain_text(explain.Report("results/zero/<RUN>", "results/zero/<RUN>", [case]))
    assert _line_kinds(example) == _line_kinds(out), out


@pytest.mark.ranks
def test_text_and_markdown_name_the_top_contributor_in_one_sentence(burnt: Path, capsys) -> None:
    assert run_cli(["explain", str(burnt), "--pair", "slowdown_pct=0..150"]) == 0
    out = capsys.readouterr().out
    # The step time's interval is compare's over 3 paired rounds, which a busy machine may leave
    # unresolved: then the sentence names the part that moved most, without a share.
    for part in ("compute", "straggler wait"):
        assert (
            "ms per step slower (95% CI " in out
            and f"mostly {part}" in out
            or ("no change resolved (95% CI" in out and f"the part that moved most: {part}" in out)
        ), out
    assert run_cli(["explain", str(burnt), "--pair", "slowdown_pct=0..150", "--format", "md"]) == 0
    assert "| part | change ms | 95% CI |" in capsys.readouterr().out


@pytest.mark.ranks
def test_compare_names_the_top_contributor_of_a_regression(burnt: Path, capsys) -> None:
    """Each regression names its top contributor (3 paired rounds may leave a case inconclusive,
    which names none)."""
    code = run_cli(["compare", str(burnt), "--pair", "slowdown_pct=0..150", "--format", "json"])
    cases = {p["result"]["label"]: p["result"] for p in json.loads(capsys.readouterr().out)["pairs"]}
    if code == 0 and all(c["verdict"] == "inconclusive" for c in cases.values()):
        pytest.skip(f"3 paired rounds decided neither pair on this machine: {[c['words'] for c in cases.values()]}")
    assert code == 1, cases
    expected = {
        "slowdown_pct: 0 → 150 (slowdown_ranks=all)": "mostly compute",
        "slowdown_pct: 0 → 150 (slowdown_ranks=[1])": "mostly straggler wait",
    }
    for label, c in cases.items():
        assert (expected[label] in c["top_contributor"]) == (c["verdict"] == "regression"), c
    assert run_cli(["compare", str(burnt), "--pair", "slowdown_pct=0..150"]) == 1
    out = capsys.readouterr().out
    said = "where the time went, over its traced steps (tpbench explain): +"
    assert any(f"{label}, {said}" in out for label, c in cases.items() if c["verdict"] == "regression")
    assert run_cli(["compare", str(burnt), "--pair", "slowdown_pct=0..150", "--format", "md"]) == 1
    out = capsys.readouterr().out
    assert any(f"\n- {label}, {said}" in out for label, c in cases.items() if c["verdict"] == "regression"), out
    # No regression, nothing to explain: a pair judged the other way round is an improvement.
    assert run_cli(["compare", str(burnt), "--pair", "slowdown_pct=150..0", "--format", "json"]) == 0
    assert {p["result"]["top_contributor"] for p in json.loads(capsys.readouterr().out)["pairs"]} == {""}


@pytest.mark.ranks
def test_compare_of_another_metric_names_the_contributor_with_the_step_times_figures(burnt: Path) -> None:
    """The parts split the step time: under ``compare RUN --metric cpu_ms`` a regression's sentence
    gives the step time's change (compare's step-time figures for the pair), where it scaled the
    parts to the CPU time's and read "+1.16 ms per step slower, mostly exposed comm" of a step that
    grew by 9.8 ms. The verdict is set to regression here: 3 paired rounds may leave it undecided."""
    selector = "slowdown_pct=0..150"
    by_cpu = compare.within_run(burnt, metric="cpu_ms", pairs=[selector])
    forced = [dataclasses.replace(p.result, verdict=compare.REGRESSION) for p in by_cpu.pairs]
    by_cpu = dataclasses.replace(
        by_cpu, pairs=[dataclasses.replace(p, result=r) for p, r in zip(by_cpu.pairs, forced, strict=True)]
    )
    steps = {p.candidate_case: explain.Measured.of(p.result) for p in compare.within_run(burnt, pairs=[selector]).pairs}
    for p in explain.annotate(by_cpu).pairs:
        cpu = explain.Measured.of(next(r for r in forced if r.case_id == p.candidate_case))
        assert p.result.top_contributor.startswith(f"{steps[p.candidate_case].delta_ms:+.2f} ms per step")
        assert not p.result.top_contributor.startswith(f"{cpu.delta_ms:+.2f} ms per step")


@pytest.mark.ranks
def test_compare_of_two_runs_by_another_metric_names_the_contributor_with_the_step_times_figures(
    burnt: Path, tmp_path: Path
) -> None:
    """Across runs too (``compare A B --metric cpu_ms``, ``gate --metric cpu_ms --explain``) the sentence
    gives the step time's change: it gave the CPU time's as "ms per step slower". The copy's steps
    took twice as long by the clock and no more CPU (a wait), so the two figures differ; the verdict is
    set to regression, the CPU times being equal."""
    other = shutil.copytree(burnt, tmp_path / "other")
    doc = json.loads((other / store.RUN_FILE).read_text())
    doc["run_id"] += "-copy"
    (other / store.RUN_FILE).write_text(json.dumps(doc))
    for table in other.glob("cases/*/steps.parquet"):
        steps = pd.read_parquet(table)
        steps.assign(step_ms=2 * steps["step_ms"]).to_parquet(table)
    by_cpu = compare.compare_runs([burnt], [other], metric="cpu_ms")
    by_cpu = dataclasses.replace(
        by_cpu, cases=[dataclasses.replace(r, verdict=compare.REGRESSION) for r in by_cpu.cases]
    )
    steps = {r.case_id: explain.Measured.of(r) for r in compare.compare_runs([burnt], [other]).cases}
    for r in explain.annotate(by_cpu).cases:
        assert steps[r.case_id].delta_ms > 1, steps
        assert r.top_contributor.startswith(f"{steps[r.case_id].delta_ms:+.2f} ms per step"), r.top_contributor


@pytest.mark.ranks
def test_two_runs_match_case_by_case(burnt: Path, tmp_path: Path, capsys) -> None:
    """BASE CAND matches by identity (``compare.counterpart``): a run against a copy of itself
    explains each case, with no change in any part."""
    copy = shutil.copytree(burnt, tmp_path / "copy")
    assert run_cli(["explain", str(burnt), str(copy), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["cases"]) == 4 and doc["environment_differences"] == []
    assert all(c["delta_ms"] == 0 and {p["delta_ms"] for p in c["components"]} == {0} for c in doc["cases"])


def test_a_run_given_twice_is_refused_as_compare_refuses_it(tmp_path: Path, capsys) -> None:
    """Every part of a run against itself is exactly 0: a typo, not an explanation (exit 2, compare's words)."""
    from synthetic_runs import make_run

    run = make_run(tmp_path, {"ddp": [10.0, 10.1, 9.9]})
    for same in (run, run / "."):
        assert run_cli(["explain", str(run), str(same)]) == 2
        assert f"{run}: given as both baseline and candidate" in capsys.readouterr().err
        assert run_cli(["compare", str(run), str(same)]) == 2
        assert f"{run}: given as both baseline and candidate" in capsys.readouterr().err


def test_runs_without_traces_exit_3_and_a_traced_case_without_its_tables_names_them(tmp_path: Path, capsys) -> None:
    """No traces is what the runs hold, not a bad argument: exit 3, as ``whatif`` on such a run. A
    case whose traces are there but whose analysed tables are gone is told which files, not to trace."""
    from synthetic_runs import make_run

    base, cand = (make_run(tmp_path / side, {"ddp": [10.0, 10.1, 9.9]}) for side in ("base", "cand"))
    assert run_cli(["explain", str(base), str(cand)]) == 3
    said = capsys.readouterr().err
    assert "no traced steps (baseline case" in said and "capture.profiler_steps >= 2" in said
    (cid,) = store.load(cand).record.cases
    for run in (base, cand):
        store.trace_dir(run, cid).mkdir()
        (store.trace_dir(run, cid) / "rank0.json.gz").write_bytes(b"")
    assert run_cli(["explain", str(base), str(cand)]) == 3
    said = capsys.readouterr().err
    for run in (base, cand):
        case = store.case_dir(run, cid)
        assert f"{case / 'intervals.parquet'}, {case / 'marks.parquet'}: missing, though the case was traced" in said
    assert "profiler_steps" not in said


@pytest.mark.ranks
def test_runs_of_other_environments_are_explained_as_incomparable(burnt: Path, tmp_path: Path, capsys) -> None:
    """compare's rule (``compare.runs_environment_differences``): another torch makes the runs
    incomparable, said above the parts and exit 3, unless --ignore-env torch, which still names the
    difference in every format, as compare does (it was left unsaid)."""
    other = shutil.copytree(burnt, tmp_path / "other")
    doc = json.loads((other / store.RUN_FILE).read_text())
    doc["environment"]["torch"] = "9.9.9"
    (other / store.RUN_FILE).write_text(json.dumps(doc))
    assert run_cli(["compare", str(burnt), str(other)]) == 3
    capsys.readouterr()
    assert run_cli(["explain", str(burnt), str(other)]) == 3
    out = capsys.readouterr().out
    assert "incomparable: the environments differ" in out and "environment differs: " in out
    assert f"torch: {store.load(burnt).environment['torch']} vs 9.9.9" in out
    assert run_cli(["explain", str(burnt), str(other), "--format", "json"]) == 3
    assert len(json.loads(capsys.readouterr().out)["environment_differences"]) == 1
    ignored = "environment differs, ignored (--ignore-env): "
    for fmt in ("text", "md"):
        assert run_cli(["explain", str(burnt), str(other), "--ignore-env", "torch", "--format", fmt]) == 0
        out = capsys.readouterr().out
        assert "incomparable" not in out and ignored in out and "vs 9.9.9" in out
    assert run_cli(["explain", str(burnt), str(other), "--ignore-env", "torch", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["environment_differences"] == [] and len(doc["ignored_environment_differences"]) == 1


@pytest.mark.ranks
def test_bad_arguments_say_what_to_give(burnt: Path, tmp_path: Path, capsys) -> None:
    from synthetic_runs import make_run

    # Two runs with no case in common: not a matter of traces (it used to say to trace more steps),
    # nor of the arguments (it exited 2): the runs cannot answer, exit 3 as compare's "missing".
    other = make_run(tmp_path, {"ddp": [10.0, 10.1, 9.9]})
    assert run_cli(["compare", str(burnt), str(other)]) == 3
    capsys.readouterr()
    assert run_cli(["explain", str(burnt), str(other)]) == 3
    said = capsys.readouterr().err
    assert f"no finished case of {other} has a finished counterpart in {burnt}" in said and "profiler" not in said
    assert run_cli(["explain", str(burnt), "--pair", "slowdown_pct=0..40"]) == 2
    assert "slowdown_pct has no value '40'" in capsys.readouterr().err
    assert run_cli(["explain", str(burnt), "--pair", "nokey=a..b"]) == 2
    assert "'nokey' is not swept" in capsys.readouterr().err
    assert run_cli(["explain", str(burnt)]) == 2
    assert f"{burnt}: one run given" in capsys.readouterr().err


@pytest.mark.ranks
def test_a_report_of_two_runs_judges_them_once_for_its_verdicts_and_waterfalls(
    burnt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tpbench report A B` ran compare's engine twice per later run, once for the across-runs
    verdicts and again for the waterfalls (each reading both runs from disk anew); it now judges
    them once and draws both from that, with the same waterfalls."""
    other = shutil.copytree(burnt, tmp_path / "other")
    doc = json.loads((other / store.RUN_FILE).read_text())
    doc["run_id"] += "-copy"
    (other / store.RUN_FILE).write_text(json.dumps(doc))
    calls = []
    judge = compare.compare_runs
    monkeypatch.setattr(compare, "compare_runs", lambda *a, **k: calls.append(a) or judge(*a, **k))
    page = build_report([store.load(burnt), store.load(other)])
    assert len(calls) == 1
    assert "Where the time went" in page and page.count('"type":"waterfall"') == 4
    assert "over 4 common case(s)" in page


@pytest.mark.slow
@pytest.mark.ranks
def test_a_run_without_traces_says_how_to_get_them(tmp_path: Path, capsys) -> None:
    untraced = sweep_in_process(tmp_path, tiny_suite("seed = [0]", name="plain", steps=1, warmup_steps=1)).run_dir
    copy = shutil.copytree(untraced, tmp_path / "copy")
    assert run_cli(["explain", str(untraced), str(copy)]) == 3
    said = capsys.readouterr().err
    assert "no traced steps (baseline case" in said and "capture.profiler_steps" in said


@pytest.mark.slow  # a second sweep (10-15 s on the shared 2-core machine): CI's budget has no room for it
@pytest.mark.ranks
def test_a_report_of_two_runs_shows_where_the_time_went(burnt: Path, tmp_path: Path, capsys) -> None:
    """A quick traced run without the slowdown keys matches each of the four cases (their common
    keys agree): the report of both has a waterfall per case, and explain agrees with it."""
    quick = BURNT | {"warmup_steps": 1, "steps": 1, "repeats": 1}
    first = sweep_in_process(tmp_path, tiny_suite("seed = [0]", name="burn", profiler_steps=3, mlp=MLP, **quick))
    page = build_report([first, store.load(burnt)])
    assert "Where the time went" in page and page.count('"type":"waterfall"') == 4
    assert run_cli(["explain", str(first.run_dir), str(burnt), "--format", "json"]) == 0
    for case in json.loads(capsys.readouterr().out)["cases"]:
        assert sum(c["delta_ms"] for c in case["components"]) == pytest.approx(case["delta_ms"], abs=1e-6)
        assert case["sentence"] in page
    assert "Where the time went" not in build_report([store.load(burnt)])


@pytest.mark.slow
@pytest.mark.ranks
def test_parts_add_up_to_the_timed_change_with_more_repeats_and_traced_steps(tmp_path: Path, capsys) -> None:
    # ``burnt``'s burn, 150 % at batches of 128: at 100 % and 32 a disturbance of fixed size (a slow
    # optimizer phase, a rank held up) once outweighed the all-ranks burn in a slow-test run.
    smoke = BURNT | {"repeats": 4, "steps": 10}
    sweep = 'slowdown_pct = [0, 150]\nslowdown_ranks = ["all", [1]]'
    run = sweep_in_process(tmp_path, tiny_suite(sweep, name="burn", profiler_steps=12, mlp=MLP, **smoke))
    assert run_cli(["explain", str(run.run_dir), "--pair", "slowdown_pct=0..150", "--format", "json"]) == 0
    cases = json.loads(capsys.readouterr().out)["cases"]
    assert [c["top"] for c in cases] == ["compute", "straggler_wait"]
    for case in cases:
        _adds_up(case)


@needs_netns
@pytest.mark.slow  # two worlds, one on an emulated link (13-31 s on the shared 2-core machine)
@pytest.mark.ranks
def test_a_slower_emulated_link_is_exposed_communication(tmp_path: Path, capsys) -> None:
    """``interconnect=loopback..tcp-1gbit`` within one run: two worlds, the same case (mlp 256×4: a
    1 MB bucket, which the emulated link turns from about 1 ms into about 16 ms of allreduce)."""
    link = 'interconnect = ["loopback", "tcp-1gbit"]'
    mlp = {"width": 256, "depth": 4}
    smoke = SMOKE | {"repeats": 2, "steps": 4}
    run = sweep_in_process(tmp_path, tiny_suite(link, name="link", profiler_steps=6, mlp=mlp, **smoke))
    assert run_cli(["explain", str(run.run_dir), "--pair", "interconnect=loopback..tcp-1gbit", "--format", "json"]) == 0
    (case,) = json.loads(capsys.readouterr().out)["cases"]
    assert case["top"] == "exposed_comm", case
    assert [d["name"] for d in case["exposed_comm_detail"]] == ["bucket 0"]  # one bucket under the 25 MB cap
    _adds_up(case)


@pytest.mark.ranks
def test_smaller_buckets_are_exposed_communication_shown_by_bucket(tmp_path: Path, capsys) -> None:
    """``bucket_cap_mb=25..0.01`` on a deep, narrow mlp (48 layers of 64 and a head: 98 parameters of
    16 KB or less): DDP builds one bucket for the whole model, then one per layer (the small head
    shares one), and each of the 48 allreduces pays Gloo's per-collective cost, several times the
    step's compute (about 20 → 110 ms per step on the shared 2-core machine). The exposed time is
    split over the candidate's buckets, which sum to it. Four repeats: the change is compare's, whose
    interval on two pairs (a t of 12.7) could hold no change even at 5× ("no change resolved", and no
    sentence about the buckets)."""
    mlp = {"width": 64, "depth": 48}
    smoke = SMOKE | {"repeats": 4, "steps": 4}
    suite = tiny_suite("bucket_cap_mb = [25, 0.01]", name="buckets", profiler_steps=4, mlp=mlp, **smoke)
    run = sweep_in_process(tmp_path, suite)
    assert run_cli(["explain", str(run.run_dir), "--pair", "bucket_cap_mb=25..0.01", "--format", "json"]) == 0
    (case,) = json.loads(capsys.readouterr().out)["cases"]
    assert case["top"] == "exposed_comm", case
    assert case["ddp_buckets"] == [1, 48]
    detail = case["exposed_comm_detail"]
    assert [d["name"] for d in detail] == [f"bucket {i}" for i in range(48)]  # in bucket order
    exposed = next(c for c in case["components"] if c["name"] == "exposed_comm")
    assert sum(d["delta_ms"] for d in detail) == pytest.approx(exposed["delta_ms"], rel=1e-9)
    assert "spread over 48 buckets" in case["sentence"]
    _adds_up(case)
    assert run_cli(["explain", str(run.run_dir), "--pair", "bucket_cap_mb=25..0.01"]) == 0
    out = capsys.readouterr().out
    assert "exposed_comm: 40 more buckets" in out and "DDP buckets 1 → 48" in out


@pytest.mark.parametrize(
    ("value", "said"),
    [("[2]", "expected ranks < world_size 2, got [2]"), ('"some"', 'expected "all" or a list of ranks')],
)
def test_slowdown_ranks_names_ranks_of_the_world(tmp_path: Path, value: str, said: str, capsys) -> None:
    (tmp_path / "s.toml").write_text(tiny_suite("seed = [0]", slowdown_pct=10, slowdown_ranks=value))
    assert run_cli(["validate", str(tmp_path / "s.toml")]) == 2
    assert "slowdown_ranks" in (err := capsys.readouterr().err) and said in err


@pytest.mark.slow  # two sides in lockstep, then a traced sweep of each (about 60 s on the shared machine)
@pytest.mark.ranks
def test_gate_explain_traces_each_side_after_the_verdict_and_names_the_cause(tmp_path: Path) -> None:
    suite = tmp_path / "gate.toml"
    suite.write_text(tiny_suite("seed = [0]", name="g", mlp=MLP, **SMOKE | {"steps": 4}))
    flags = ["--repeats", "6", "--candidate-set", "slowdown_pct=150", "--explain", "--format", "json"]
    done = tpbench("gate", suite, "--baseline", REPO, "--candidate", sys.prefix, "--out", tmp_path / "g", *flags)
    (case,) = json.loads(done.stdout)["cases"]
    assert done.returncode == 1 and case["verdict"] == "regression", done.stderr
    assert "mostly compute" in case["top_contributor"]
    # The gate's own runs traced nothing; the explanation came from the runs traced after it.
    for side in ("baseline", "candidate"):
        (measured,) = [p for p in store.iter_runs(tmp_path / "g" / side) if "explain" not in p.parts]
        assert not list(measured.glob("cases/*/trace/*.json.gz"))
        (traced,) = store.iter_runs(tmp_path / "g" / side / "explain")
        assert list(traced.glob("cases/*/trace/rank*.json.gz"))


def test_the_explain_checks_benchmark_refuses_an_existing_out_in_one_line(tmp_path, monkeypatch, capsys):
    """benchmarks/explain_checks.py wants a new --out: run twice with the same DIR it used to end in
    a FileExistsError traceback; it now says what to do, as argparse does, before sweeping anything."""
    from benchmarks import explain_checks

    monkeypatch.setattr(sys, "argv", ["explain_checks.py", "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as exc:
        explain_checks.main()
    assert exc.value.code == 2
    assert f"--out {tmp_path} already exists" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_ignore_env_with_one_run_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--ignore-env KEY`` given with one run was taken without a word: the cases of one run share its
    environment, so it ignored nothing. Refused (exit 2) as ``--pair`` with two runs is, before any run is read."""
    run = tmp_path / "run"
    shutil.copytree(REPO / "tests/data/whatif_links_run", run)
    pair = ["--pair", "interconnect=loopback..tcp-500mbit"]
    for command in (["compare", str(run)], ["explain", str(run), *pair]):
        assert run_cli([*command, "--ignore-env", "torch"]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"tpbench {command[0]}: error: --ignore-env: only when runs are compared" in err, err
    assert run_cli(["compare", str(run), *pair]) != 2  # the same without it: judged
    assert run_cli(["explain", str(run), *pair]) == 0


def test_a_broadcasts_transfer_is_not_straggler_wait() -> None:
    """A broadcast's root returns once its bytes are in Gloo's socket buffer: measured against the
    root's 1 ms, a receiver's 5 ms transfer counted 4 ms of waiting for a late peer, with every rank
    started together. A rooted collective is measured against the fastest of the other ranks: with
    one receiver nothing waited; with two, the one 4 ms slower than the other waited 4 ms."""
    from tpbench.analysis.explain import _waits

    two = pd.DataFrame([_iv(0, "comm", 0, 1_000_000, "broadcast"), _iv(1, "comm", 0, 5_000_000, "broadcast")])
    assert _waits(two).tolist() == [0, 0]
    three = pd.concat([two, pd.DataFrame([_iv(2, "comm", 0, 9_000_000, "broadcast")])], ignore_index=True)
    assert _waits(three).tolist() == [0, 0, 4_000_000]
    # An all-reduce is still measured against its shortest: the last to arrive.
    reduce = pd.DataFrame([_iv(0, "comm", 0, 80, "allreduce"), _iv(1, "comm", 60, 80, "allreduce")])
    assert _waits(reduce).tolist() == [60, 0]


def test_one_run_without_pair_names_the_run_and_what_to_give(tmp_path: Path, capsys) -> None:
    """``explain RUN`` alone: the message said "explain RUN_DIR needs --pair", naming no run, so a
    script that meant to pass two runs (the second one's variable empty) could not tell which it got."""
    from synthetic_runs import make_run

    run = make_run(tmp_path, {"ddp": [10.0, 10.1, 9.9]})
    assert run_cli(["explain", str(run)]) == 2
    said = capsys.readouterr().err
    assert f"{run}: one run given; expected two runs (BASE CAND) or one run with --pair" in said, said


def test_runs_of_two_suites_say_so_as_compare_does(tmp_path: Path, capsys) -> None:
    """Runs of two suites: compare says "the baseline ran suite a, the candidate suite b", explain
    said nothing of it, neither where the runs share no case (only "no finished case of … has a
    counterpart") nor above the parts of the cases they do share."""
    from synthetic_runs import make_run

    from tpbench import render

    base = make_run(tmp_path / "a", {"ddp": [10.0, 10.1, 9.9]}, suite_name="a")
    cand = make_run(tmp_path / "b", {"zero_no_overlap": [10.0, 10.1, 9.9]}, suite_name="b")
    assert run_cli(["explain", str(base), str(cand)]) == 3
    said = capsys.readouterr().err
    assert "the baseline ran suite a, the candidate suite b: no case is in both" in said, said
    shared = make_run(tmp_path / "c", {"ddp": [10.0, 10.1, 9.9]}, suite_name="c")
    assert explain._matched(base, shared)[3] == "the baseline ran suite a, the candidate suite c"
    e = parts.explain(*[pd.DataFrame({p: [1e6, 1.1e6] for p in parts.PARTS} | {"step_ns": [5e6, 5.5e6]})] * 2)
    case = explain.CaseExplanation("c1", "ddp", "c1", "c1", e, e.delta_ms, e, (1, 1))
    report = explain.Report(
        str(base), str(shared), [case], suites_differ="the baseline ran suite a, the candidate suite c"
    )
    for out in (render.render_explain_text(report), render.render_explain_markdown(report)):
        assert "the baseline ran suite a, the candidate suite c\n" in out, out
    assert json.loads(render.render_explain_json(report))["suites_differ"] == report.suites_differ


def test_a_candidate_case_without_a_counterpart_is_said_skipped_as_compare_says_it_missing(tmp_path: Path, capsys):
    """A candidate case with no counterpart in the baseline was left out of explain without a word
    (``skipped`` empty), while compare lists it as missing: it read as a case explain had covered."""
    from synthetic_runs import make_run

    base = make_run(tmp_path / "a", {"ddp": [10.0, 10.1, 9.9]})
    cand = make_run(tmp_path / "b", {"ddp": [10.0, 10.1, 9.9], "zero_no_overlap": [10.0, 10.1, 9.9]})
    unmatched = explain._matched(base, cand)[4]
    assert list(unmatched.values()) == ["missing: no baseline data for this case"], unmatched
    assert run_cli(["explain", str(base), str(cand)]) == 3  # the synthetic runs hold no traced steps
    said = capsys.readouterr().err
    assert f"{next(iter(unmatched))}: missing: no baseline data for this case" in said, said


def test_exposed_comm_all_in_one_bucket_is_named_without_its_figure_twice() -> None:
    """One bucket holding all the exposed communication (a slower link, DDP's one bucket): the sentence
    read "mostly exposed comm (mostly bucket 0, +109.30 ms): +109.30 ms", the same figure twice and a
    "mostly" for what is all of it. It names the bucket; a bucket that holds part of it keeps its figure."""
    base = pd.DataFrame({p: [1e6, 1.2e6, 0.9e6] for p in parts.PARTS} | {f"{parts.DETAIL}bucket 0": [1e6] * 3})
    cand = base + [0, 20e6, 0, 0, 0, 20e6]
    for side in (base, cand):
        side["step_ns"] = side[list(parts.PARTS)].sum(axis=1)
    said = parts.sentence(parts.explain(base, cand))
    assert "slower (95% CI +18.27 to +21.73), mostly exposed comm (bucket 0): +20.00 ms (100% of" in said, said
    cand[f"{parts.DETAIL}bucket 1"] = [5e6] * 3
    base[f"{parts.DETAIL}bucket 1"] = [0.0] * 3
    cand[f"{parts.DETAIL}bucket 0"] -= 5e6
    said = parts.sentence(parts.explain(base, cand))
    assert "mostly exposed comm (mostly bucket 0, +15.00 ms): +20.00 ms" in said, said
