"""The report without a browser: verdict words and intervals, sections present only with their
data, escaping of user text, several runs in one report through the CLI.

Verdict tests build runs in memory from the suite's real expansion (real case ids and collapsed
keys) with chosen per-repeat medians, so the right sentence is known. Section tests use run
directories written through the store by ``benchmarks/synth_run.py``. The browser checks are in
``test_report_browser.py``.
"""

from __future__ import annotations

import base64
import dataclasses
import itertools
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import localsgd_suite, run_cli
from synthetic_runs import make_run

from benchmarks import budget_resolution, synth_run
from tpbench import store
from tpbench.analysis import stats
from tpbench.racing import Options
from tpbench.record import RunRecord
from tpbench.report import build_report, performance, verdicts
from tpbench.report import data as report_data
from tpbench.report.timelines import traced_vs_timed
from tpbench.suite import Machine, expand, parse
from tpbench.sweep import finalize
from tpbench.tune_record import TuneRecord

ZERO_SUITE = """\
[suite]
name = "zero-test"
[defaults]
world_size = 2
backend = "gloo"
device = "cpu"
warmup_steps = 3
[sweep]
algorithm = ["zero_no_overlap", "hook_with_zero_step", "hook_with_zero_step_interleaved"]
bucket_cap_mb = [1, 4]
shard_buckets = [false, true]
interconnect = ["loopback", "tcp-1gbit"]
"""


def in_memory_run(
    suite_text: str,
    medians: dict[str, list[float]] | callable,
    run_id: str = "20260101T000000Z-aaaaaa",
    environment: dict | None = None,
) -> store.Loaded:
    """A finished run held in memory: real cases, per-repeat medians from ``medians(case params)``."""
    cases = expand(parse(suite_text, "test.toml"), Machine(gpus=0))
    meta = {
        "run_id": run_id,
        "suite": {"name": "zero-test", "text": suite_text},
        "status": "complete",
        "environment": environment or dict(synth_run.ENVIRONMENT),
        "cases": {c.case_id: {"params": c.params(), "status": "done"} for c in cases},
    }
    rows = []
    for c in cases:
        reps = np.asarray(medians(c.params()), dtype=float)
        rows.append(
            {
                "case_id": c.case_id,
                "median_ms": float(np.median(reps)),
                "ci_lo_ms": float(reps.min()),
                "ci_hi_ms": float(reps.max()),
                "repeat_medians_ms": reps.tolist(),
            }
        )
    record = RunRecord.from_json(meta)
    return store.Loaded(Path("/nonexistent"), record, store.cases_table(record), pd.DataFrame(), pd.DataFrame(rows))


def zero_medians(p: dict) -> list[float]:
    """Interleaved 20% faster than sequential on loopback, 25% slower on tcp-1gbit, give or take 1%
    per round; sequential and no-overlap the same within noise everywhere."""
    base = [100.0, 101.0, 99.0]
    if p["algorithm"] == "hook_with_zero_step_interleaved":
        factor = 0.8 if p["interconnect"] == "loopback" else 1.25
        return [v * factor * wobble for v, wobble in zip(base, (1.01, 0.99, 1.0))]
    if p["algorithm"] == "zero_no_overlap":
        return [100.5, 97.0, 102.0]
    return base


def test_the_report_reads_a_tunes_tune_json_once(tmp_path, monkeypatch):
    """The Recommendation read each run's tune.json, and the Verdicts read it again to leave a
    tune's settings to it: parsed and checked twice per report. ``Loaded.tune`` reads it once."""
    loaded = dataclasses.replace(in_memory_run(ZERO_SUITE, zero_medians), run_dir=tmp_path)
    store.write_tune(tmp_path, TuneRecord(Options(), 1.0, {}, []))
    reads = []
    read = store.read_tune
    monkeypatch.setattr(store, "read_tune", lambda run_dir: reads.append(run_dir) or read(run_dir))
    page = build_report([loaded])
    assert "Interrupted race: no recommendation" in page and "this tune raced: compared in its Recommendation" in page
    assert reads == [tmp_path]


def test_interleaved_vs_sequential_in_words_with_intervals():
    data = report_data.load([in_memory_run(ZERO_SUITE, zero_medians)])
    comps = verdicts.compare(data, verdicts.ZERO_KINDS[0])
    # 2 bucket sizes x 2 shard_buckets x 2 interconnects, each pair agreeing on all of them.
    assert len(comps) == 8
    for c in comps:
        assert (
            c.candidate["algorithm"] == "hook_with_zero_step_interleaved"
            and c.baseline["algorithm"] == "hook_with_zero_step"
        )
        assert all(c.candidate[k] == c.baseline[k] for k in ("bucket_cap_mb", "shard_buckets", "interconnect"))
    loop = next(
        c for c in comps if c.context == {"bucket_cap_mb": 4, "shard_buckets": False, "interconnect": "loopback"}
    )
    assert loop.verdict == "faster"
    # Paired by round (the two hooks share a world): t over 3 per-round ratios.
    assert loop.est.method == "paired" and loop.est.n == 3
    assert loop.lo < loop.ratio < loop.hi < 1 and loop.ratio == pytest.approx(0.8, rel=1e-3)
    assert verdicts.sentence(loop, list(loop.context)) == (
        "interleaved vs sequential at 4 MB buckets on loopback, shard_buckets=False, step time: "
        "faster: -20.0% [-22.0%, -18.0%], beyond the ±5% threshold (this run resolves ±2.5%)."
    )
    lines = verdicts.group_sentences(comps)
    assert (
        "interleaved vs sequential on loopback, shard_buckets=False, step time, at 1, 4 MB buckets: faster, beyond "
        "the ±5% threshold (most: -20.0% [-22.0%, -18.0%] at 1 MB; this run resolves ±2.5% or better at each)."
    ) in lines
    assert any(
        line.startswith(
            "interleaved vs sequential on tcp-1gbit, shard_buckets=True, step time, at 1, 4 MB buckets: slower, "
            "beyond the ±5% threshold (most: +25.0%"
        )
        for line in lines
    )


def test_collapsed_parameters_share_one_baseline_and_noise_is_not_called():
    data = report_data.load([in_memory_run(ZERO_SUITE, zero_medians)])
    comps = verdicts.compare(data, verdicts.ZERO_KINDS[1])  # sequential / zero_no_overlap
    assert len(comps) == 8
    # shard_buckets does not apply to zero_no_overlap: sharded and unsharded hooks meet the same case.
    by_base = {}
    for c in comps:
        by_base.setdefault(c.baseline["case_id"], set()).add(c.candidate["shard_buckets"])
    assert set(map(frozenset, by_base.values())) == {frozenset({False, True})}
    assert "shard_buckets" not in comps[0].context
    assert {c.verdict for c in comps} == {"no difference shown"}
    lines = verdicts.group_sentences(comps)
    # One line per interconnect and sharding: the two hook variants are judged apart, never folded together.
    assert len(lines) == 4 and all("at 1, 4 MB buckets: no difference shown, could only resolve ±" in x for x in lines)
    assert (
        "sequential (shard_buckets=True) vs zero_no_overlap (per-parameter broadcasts) on loopback, step time, at 1, "
        "4 MB buckets: no difference shown, could only resolve ±9.3% (most: +0.2% [-8.3%, +9.5%] at 1 MB; this run "
        "resolves ±9.3% or better at each)." in lines
    )


def test_a_speedup_cell_is_coloured_only_where_its_interval_excludes_1():
    """A ratio of 0.75 [0.23, 2.45] drawn blue reads as a win the run did not show: such a cell is
    white (the neutral 1), its text still giving the ratio and interval."""
    data = report_data.load([in_memory_run(ZERO_SUITE, zero_medians)])
    seen = set()
    for kind in verdicts.ZERO_KINDS[:2]:  # interleaved/sequential: all shown; sequential/no overlap: none
        comps = verdicts.compare(data, kind)
        heat = performance._heatmap(data, kind.key, comps).data[0]
        z, text = np.asarray(heat.z, dtype=float), np.asarray(heat.text)
        assert len(comps) == z.size
        for shade, said in zip(z.flat, text.flat):  # "0.80<br>[0.78, 0.82]<br>±2.5%"
            ratio, lo, hi = map(float, re.match(r"([\d.]+)<br>\[([\d.]+), ([\d.]+)\]", said).groups())
            held = lo <= 1 <= hi
            seen.add(held)
            assert shade == (0.0 if held else pytest.approx(math.log2(ratio), abs=0.01)), (said, shade)
    assert seen == {True, False}


def test_speedup_colours_are_a_log_scale_that_never_reaches_a_ratio_of_0():
    """The heatmaps coloured the ratio on a linear scale 1 ± its largest distance from 1: a hook 3
    times as slow stretched the colour bar to a ratio of -1 (its ticks read 0 and -1, ratios no step
    time has), and a hook twice as fast was coloured half as deep as one twice as slow. Coloured by
    log2(ratio) now: the bar is symmetric in the ratio's log and every tick a positive ratio."""

    def medians(p: dict) -> list[float]:
        """Interleaved 3 times sequential's step time at 1 MB buckets, half of it at 4 MB."""
        factor = (3.0 if p["bucket_cap_mb"] == 1 else 0.5) if p["algorithm"] == "hook_with_zero_step_interleaved" else 1
        return [100.0 * factor, 101.0 * factor, 99.0 * factor]

    data = report_data.load([in_memory_run(ZERO_SUITE, medians)])
    heat = performance._heatmap(data, verdicts.ZERO_KINDS[0].key, verdicts.compare(data, verdicts.ZERO_KINDS[0]))
    heat = heat.data[0]
    assert heat.zmin == -heat.zmax  # was 1 - 2, 1 + 2: a bar from a ratio of -1 to 3
    ratios = [float(t) for t in heat.colorbar.ticktext]
    assert min(ratios) > 0 and max(ratios) == pytest.approx(3.0, rel=0.02)
    z = np.asarray(heat.z, dtype=float)
    # Twice as fast is -1, as deep a blue as twice as slow would be red; 3 times as slow is log2 3.
    assert z.min() == pytest.approx(-1.0, abs=0.01) and z.max() == pytest.approx(math.log2(3), abs=0.01)


def test_a_speedup_colour_bar_of_no_coloured_cell_labels_each_tick_apart():
    """With every cell white (no interval excludes 1) the bar spans ±5 %, whose ticks at two figures
    read "1.1, 1, 1, 0.98, 0.95": two labels the same, one 1.05 said as 1.1."""

    def medians(p: dict) -> list[float]:
        return [100.0, 130.0, 80.0] if p["algorithm"] == "hook_with_zero_step_interleaved" else [100.0, 101.0, 99.0]

    data = report_data.load([in_memory_run(ZERO_SUITE, medians)])
    heat = performance._heatmap(data, verdicts.ZERO_KINDS[0].key, verdicts.compare(data, verdicts.ZERO_KINDS[0]))
    labels = list(heat.data[0].colorbar.ticktext)
    assert labels == ["0.952", "0.976", "1", "1.02", "1.05"], labels


def test_a_speedup_heatmap_of_one_bucket_size_labels_its_column_with_that_size():
    """With one bucket size in the run (``--filter bucket_cap_mb=1``) the comparisons' context drops
    the key (it does not vary), and the heatmaps' only column read "all" though every case ran at 1 MB."""
    suite = ZERO_SUITE.replace("bucket_cap_mb = [1, 4]", "bucket_cap_mb = [1]")
    data = report_data.load([in_memory_run(suite, zero_medians)])
    comps = verdicts.compare(data, verdicts.ZERO_KINDS[0])
    assert comps and all("bucket_cap_mb" not in c.context for c in comps)
    heat = performance._heatmap(data, verdicts.ZERO_KINDS[0].key, comps).data[0]
    assert list(heat.x) == ["1 MB"], heat.x


# ZERO_SUITE with both zero_no_overlap baselines (per-parameter and packed broadcasts), on one link.
PACKED_SUITE = ZERO_SUITE.replace("shard_buckets = [false, true]", "parameters_as_bucket_view = [false, true]").replace(
    'interconnect = ["loopback", "tcp-1gbit"]', ""
)


def packed_medians(hook_ms):
    """Repeat medians for PACKED_SUITE: unpacked zero_no_overlap 100 ms, packed 50, a hook ``hook_ms(params)``."""

    def medians(p: dict) -> list[float]:
        wobble = (1.0, 1.01, 0.99)
        if p["algorithm"] == "zero_no_overlap":
            return [(50.0 if p["parameters_as_bucket_view"] else 100.0) * w for w in wobble]
        return [hook_ms(p) * w for w in wobble]

    return medians


def test_hooks_advantage_splits_into_packing_and_overlap():
    """With both zero_no_overlap baselines, each hook is judged against the unpacked one (named so),
    and that ratio X splits into packing Y (packed / unpacked) times overlap Z (hook / packed)."""
    suite = PACKED_SUITE
    medians = packed_medians(lambda p: 40.0)  # both hooks: 0.4 of unpacked, 0.8 of packed
    data = report_data.load([in_memory_run(suite, medians)])
    kinds = {k.key: k for k in verdicts.ZERO_KINDS}
    comparisons = {key: verdicts.compare(data, k) for key, k in kinds.items()}
    against_unpacked = comparisons[verdicts.ZERO_KINDS[1].key]
    assert len(against_unpacked) == 2 and {c.baseline["parameters_as_bucket_view"] for c in against_unpacked} == {False}
    assert all(c.ratio == pytest.approx(0.4) for c in against_unpacked)
    said = verdicts.group_sentences(against_unpacked)[0]
    assert "vs zero_no_overlap (per-parameter broadcasts), step time, at" in said
    attrs = verdicts.attributions(comparisons)
    assert len(attrs) == 4  # two hooks x two bucket sizes
    (line,) = verdicts.attribution_lines(attrs)
    assert line.startswith(
        "Of the ZeRO hooks' 0.40× step time against zero_no_overlap (per-parameter broadcasts), 0.50× comes from "
        "packing the broadcasts (zero_no_overlap with parameters_as_bucket_view = true) and 0.80× from the hooks "
        "themselves (each hook against zero_no_overlap (packed broadcasts): the step overlapped with backward"
    ), line
    assert line.endswith(
        "the hook itself is faster in 4 of the 4 settings (the table below, each with its interval)."
    ), line
    table = verdicts.attribution_table(attrs)
    assert list(table["setting"]) == ["at 1 MB buckets", "at 4 MB buckets"] * 2
    assert list(table["from packing"]) == ["0.50× [0.50, 0.50]"] * 4
    assert list(table["from the hook itself"]) == ["0.80× [0.80, 0.80]"] * 4
    assert set(table["the hook itself"]) == {"faster, beyond the ±5% threshold"}
    # At one bucket size every setting is blank, and the table has no column for it.
    one = report_data.load([in_memory_run(suite.replace("bucket_cap_mb = [1, 4]", "bucket_cap_mb = [1]"), medians)])
    table = verdicts.attribution_table(verdicts.attributions({k.key: verdicts.compare(one, k) for k in kinds.values()}))
    assert len(table) == 2 and "setting" not in table and "hook" in table
    # A run without the packed baseline has nothing to split.
    plain = report_data.load([in_memory_run(suite.replace("parameters_as_bucket_view = [false, true]", ""), medians)])
    assert verdicts.attributions({k.key: verdicts.compare(plain, k) for k in verdicts.ZERO_KINDS}) == []


@pytest.mark.parametrize(
    ("hook_ms", "says"),
    [
        (lambda p: 50.0, "the hook itself is not shown to differ in 4 of the 4 settings ("),
        (
            lambda p: 40.0 if p["bucket_cap_mb"] == 1 else 50.0,
            "the hook itself is faster in 2 and not shown to differ in 2 of the 4 settings (",
        ),
    ],
)
def test_the_hooks_own_share_reads_as_a_sentence(hook_ms, says):
    """The verdict's count of what the hook itself does was the verdict words spliced after "is":
    "the hook itself is no difference shown in 4 of the 4 settings"."""
    data = report_data.load([in_memory_run(PACKED_SUITE, packed_medians(hook_ms))])
    (line,) = verdicts.attribution_lines(
        verdicts.attributions({k.key: verdicts.compare(data, k) for k in verdicts.ZERO_KINDS})
    )
    assert says in line, line


def test_a_single_repeat_is_never_called():
    suite = ZERO_SUITE.replace('interconnect = ["loopback", "tcp-1gbit"]', 'interconnect = ["loopback"]')
    data = report_data.load([in_memory_run(suite, lambda p: zero_medians(p)[:1])])
    comps = verdicts.compare(data, verdicts.ZERO_KINDS[0])
    assert comps and {c.verdict for c in comps} == {"no interval"}
    assert verdicts.sentence(comps[0], list(comps[0].context)).endswith(
        "step time: no interval: -19.2%, not judged (one repeat: no interval)."
    )


def test_fastest_line_names_the_setting_and_the_evidence_against_the_runner_up():
    data = report_data.load([in_memory_run(ZERO_SUITE, zero_medians)])
    lines = verdicts.fastest_lines(data)
    assert len(lines) == 2  # one per interconnect: the setting, not a tuning knob
    loop = next(line for line in lines if "on loopback" in line)
    assert loop.startswith("Fastest on loopback: hook_with_zero_step_interleaved")
    # Against its twin configuration, the same step time:
    assert (
        "; against the runner-up hook_with_zero_step_interleaved" in loop and "step time: no difference shown" in loop
    )
    assert loop.count("resolve") == 1 and "(this run resolves ±" in loop
    # Bucket sizes of 0.5 and 4 MB make a float column; the line writes the sizes as the labels do.
    halves = report_data.load([in_memory_run(ZERO_SUITE.replace("[1, 4]", "[0.5, 4]"), zero_medians)])
    text = " ".join(verdicts.fastest_lines(halves))
    assert re.search(r"bucket_cap_mb=4(?![.\d])", text) and "bucket_cap_mb=4.0" not in text


def test_fastest_lines_follow_the_suites_order_of_its_settings():
    """The sweep's closing lines came in the report table's order, the values sorted: a suite that
    lists its slowest link first, or ``batch_size = [16, 4, 8]``, read its lines in another order."""
    suite = ZERO_SUITE.replace('["loopback", "tcp-1gbit"]', '["tcp-1gbit", "loopback"]')
    lines = verdicts.fastest_lines(report_data.load([in_memory_run(suite, zero_medians)]), alone=False)
    assert [line.split(":")[0] for line in lines] == ["Fastest on tcp-1gbit", "Fastest on loopback"]
    suite = ZERO_SUITE.replace("[sweep]\n", "[sweep]\nbatch_size = [16, 4, 8]\n")
    lines = verdicts.fastest_lines(report_data.load([in_memory_run(suite, zero_medians)]), alone=False)
    assert [re.search(r"batch_size=\d+", line).group() for line in lines] == [
        f"batch_size={b}" for b in (16, 16, 4, 4, 8, 8)
    ]


def test_a_fastest_case_that_is_not_the_lowest_median_says_which_is():
    """The fastest is ranked by the geometric mean over repeats, the sweep's table by the median:
    where they name different cases, the line says which case has the lowest median and why it
    names another."""

    def medians(p: dict) -> list[float]:
        if p["algorithm"] == "zero_no_overlap":  # the lowest median, one slow round: a higher geometric mean
            return [90.0, 91.0, 130.0]
        return [100.0, 101.0, 99.0] if p["algorithm"] == "hook_with_zero_step" else [110.0, 111.0, 109.0]

    suite = ZERO_SUITE.replace('interconnect = ["loopback", "tcp-1gbit"]', 'interconnect = ["loopback"]')
    (line,) = verdicts.fastest_lines(report_data.load([in_memory_run(suite, medians)]))
    assert line.startswith("Fastest: hook_with_zero_step ")
    assert re.search(r"the lowest median is zero_no_overlap bucket_cap_mb=\d's, 91.0 ms/step\); against", line)
    # The runner-up's, it is named once.
    suite_one = suite.replace("bucket_cap_mb = [1, 4]", "bucket_cap_mb = [4]").replace("[false, true]", "[false]")
    (line,) = verdicts.fastest_lines(report_data.load([in_memory_run(suite_one, medians)]))
    assert "the lowest median is the runner-up's, 91.0 ms/step); against the runner-up zero_no_overlap" in line
    # Where the fastest is also the lowest median, nothing is added.
    (plain,) = verdicts.fastest_lines(report_data.load([in_memory_run(suite, zero_medians)]))
    assert "lowest median" not in plain


def test_a_runner_up_that_is_not_the_next_lowest_median_says_which_is():
    """The front door named the runner-up hook_with_zero_step_interleaved shard_buckets=True (second by
    the geometric mean) under a table whose second row, by median, was shard_buckets=False: the line
    says which case has the next lowest median, as it does for the fastest."""

    def medians(p: dict) -> list[float]:
        if p["algorithm"] == "zero_no_overlap":  # the next lowest median, one slow round: a higher geometric mean
            return [90.0, 91.0, 130.0]
        return [80.0, 81.0, 79.0] if p["algorithm"] == "hook_with_zero_step" else [95.0, 96.0, 94.0]

    suite = ZERO_SUITE.replace('interconnect = ["loopback", "tcp-1gbit"]', 'interconnect = ["loopback"]')
    suite = suite.replace("bucket_cap_mb = [1, 4]", "bucket_cap_mb = [4]").replace("[false, true]", "[false]")
    (line,) = verdicts.fastest_lines(report_data.load([in_memory_run(suite, medians)]))
    assert line.startswith("Fastest: hook_with_zero_step ") and "lowest median is" not in line.split(";")[0]
    assert (
        "against the runner-up hook_with_zero_step_interleaved (second by the geometric mean over repeats, which "
        "the ratio compares; the next lowest median is zero_no_overlap's, 91.0 ms/step), step time: "
    ) in line
    # Where the runner-up is also the next lowest median, nothing is added.
    steady = {"zero_no_overlap": [90.0, 91.0, 92.0]}
    (plain,) = verdicts.fastest_lines(
        report_data.load([in_memory_run(suite, lambda p: steady.get(p["algorithm"]) or medians(p))])
    )
    assert "next lowest median" not in plain and "against the runner-up zero_no_overlap, step time" in plain


def test_a_verdict_that_says_what_the_run_resolves_is_not_followed_by_it_again():
    """A "no difference shown" verdict's clause names its resolution ("could only resolve ±x%"); the
    report's sentences add "(this run resolves ±x%)" to every other verdict, once."""
    reps = {"repeat_medians_ms": [1.0] * 6}  # the rounds the ratio rests on (their values are not read)
    sides = ({"algorithm": "a", **reps}, {"algorithm": "b", **reps}, {}, {})
    wide = verdicts.Comparison(verdicts.ZERO_KINDS[0], "run", *sides, stats.Ratio(1.01, 0.93, 1.09, 6, "paired"))
    narrow = dataclasses.replace(wide, est=stats.Ratio(1.08, 1.06, 1.10, 6, "paired"))
    assert wide.said.says_resolution and not narrow.said.says_resolution
    one, other = verdicts.sentence(wide, []), verdicts.sentence(narrow, [])
    assert one.count("resolve") == 1 and re.search(r", could only resolve ±8\.\d%\.$", one)
    assert other.count("resolve") == 1 and re.search(r"threshold \(this run resolves ±1\.\d%\)\.$", other)


def test_a_setting_of_one_case_is_not_called_the_fastest():
    """A swept key outside the tuning knobs (here the interconnect, with one algorithm) makes each
    case a setting of its own: the report gives its time and says it is alone, never "Fastest"."""
    suite = ZERO_SUITE.replace(
        'algorithm = ["zero_no_overlap", "hook_with_zero_step", "hook_with_zero_step_interleaved"]\n'
        "bucket_cap_mb = [1, 4]\nshard_buckets = [false, true]\n",
        'algorithm = ["hook_with_zero_step"]\n',
    )
    data = report_data.load([in_memory_run(suite, zero_medians)])
    lines = verdicts.fastest_lines(data)
    assert len(lines) == 2 and not any("Fastest" in line for line in lines)
    loop = next(line for line in lines if "loopback" in line)
    assert loop.startswith("On loopback: hook_with_zero_step at 100 ms/step [99, 101]")
    assert loop.endswith(", the only case there.")
    assert verdicts.fastest_lines(data, alone=False) == []


def test_a_step_time_and_its_interval_read_alike():
    """Three significant figures of the median, its trailing zeros kept and its interval's ends given
    the same decimals (the front door's line read "17 ms/step [15.8, 18.6]"), and more decimals where
    an end would print as the median it differs from (a loaded run's read "178 [178, 179]")."""
    from tpbench import verdict

    assert verdict.ms_interval(17.0, 15.8, 18.6) == ("17.0", "15.8", "18.6")
    assert verdict.ms_interval(100.0, 99.0, 101.0) == ("100", "99", "101")
    assert [verdict.ms(0.5), verdict.ms(1234.5)] == ["0.500", "1234"]
    assert verdict.ms_interval(178.2, 177.9, 179.1) == ("178.2", "177.9", "179.1")
    assert verdict.ms_interval(178.2, 178.16, 178.5) == ("178.20", "178.16", "178.50")
    # An end that equals the median (every repeat alike) keeps the plain decimals.
    assert verdict.ms_interval(178.0, 178.0, 178.0) == ("178", "178", "178")
    suite = ZERO_SUITE.replace('interconnect = ["loopback", "tcp-1gbit"]', 'interconnect = ["loopback"]')
    data = report_data.load(
        [in_memory_run(suite, lambda p: [17.0, 17.0, 17.0] if p["bucket_cap_mb"] == 4 else [30.0] * 3)]
    )
    (line,) = verdicts.fastest_lines(data)
    assert re.search(r" at 17\.0 ms/step \[\d+\.\d, \d+\.\d\]", line), line


def test_a_line_opened_by_a_key_keeps_the_key_as_the_suite_spells_it():
    """A sentence may open with a setting: a phrase is capitalised, a key is a name to type."""
    assert report_data.sentence_start("on loopback, shard_buckets=True") == "On loopback, shard_buckets=True"
    assert report_data.sentence_start("slowdown_pct=0.0") == "slowdown_pct=0.0"
    assert report_data.sentence_start("") == ""


def drifting_medians(p: dict) -> list[float]:
    """Rounds that drift by ±30% together (a busy machine), interleaved 4% faster than sequential
    within each round, give or take 0.5%."""
    drift = [100.0, 135.0, 80.0, 120.0, 90.0, 140.0]
    if p["algorithm"] == "hook_with_zero_step_interleaved":
        return [v * 0.96 * w for v, w in zip(drift, (1.005, 0.995, 1.0, 1.004, 0.996, 1.0))]
    return drift


def test_cases_of_one_world_are_paired_by_round_so_shared_drift_cancels():
    """Cases of one world ran round by round: the round's drift cancels in each round's ratio and a
    4% difference is called, resolved to better than ±1%. Compared unpaired, the same values
    could not tell it: the drift is ten times the effect."""
    suite = ZERO_SUITE.replace('interconnect = ["loopback", "tcp-1gbit"]', 'interconnect = ["loopback"]')
    data = report_data.load([in_memory_run(suite, drifting_medians)])
    comps = verdicts.compare(data, verdicts.ZERO_KINDS[0])
    assert comps and all(c.est.method == "paired" and c.est.n == 6 for c in comps)
    assert {c.verdict for c in comps} == {"faster"} and all(c.est.half_width < 0.01 for c in comps)
    c = comps[0]
    unpaired = stats.case_ratio(verdicts.repeat_values(c.baseline), verdicts.repeat_values(c.candidate), paired=False)
    assert unpaired.lo < 1 < unpaired.hi and unpaired.half_width > 0.15
    assert "step time: faster: -4.0% [" in verdicts.sentence(c, list(c.context))
    assert "(this run resolves ±0." in verdicts.sentence(c, list(c.context))


def test_metric_cpu_ms_compares_cpu_time_and_says_so(tmp_path):
    """Sequential's steps take 20% longer on the wall clock but the same CPU time (it waits, say):
    by step time it is slower, by CPU time no different, and the sentences name what they compare."""
    medians = {"zero_no_overlap": [10, 10.2, 9.9, 10.1], "hook_with_zero_step": [12, 12.2, 11.9, 12.1]}
    run = make_run(tmp_path / "run", medians, cpu_ms=lambda case: 5.0, jitter=0.002)
    finalize(store.Run.open(run))
    kind = verdicts.ZERO_KINDS[1]  # sequential / zero_no_overlap
    wall = verdicts.compare(report_data.load([store.load(run)]), kind)
    cpu_data = report_data.load([store.load(run)], metric="cpu_ms")
    cpu = verdicts.compare(cpu_data, kind)
    assert [c.verdict for c in wall] == ["slower"] and [c.verdict for c in cpu] == ["no difference shown"]
    assert "CPU time per step" in verdicts.sentence(cpu[0], list(cpu[0].context))
    assert "Verdicts compare CPU time per step (cpu_ms)" in build_report([store.load(run)], tmp_path, "cpu_ms")


def test_all_cases_table_says_its_memory_columns_are_mib(tmp_path):
    """The All cases table's ``max_peak_rss_mb`` holds MiB (2^20 bytes, as the Memory chart's axis
    says), and its header alone read as megabytes, 5 % apart."""
    run = make_run(tmp_path / "run", {"ddp": [10, 10.1, 9.9]})
    finalize(store.Run.open(run))
    html = build_report([store.load(run)], tmp_path)
    assert "max_peak_rss_mb" in html and "The *_mb columns are in MiB (2^20 bytes)" in html


def test_report_metric_not_recorded_is_an_error_naming_the_run(tmp_path):
    run = make_run(tmp_path / "old", {"ddp": [10, 10.1, 9.9]})  # no cpu_ms, like runs made before it was recorded
    finalize(store.Run.open(run))
    proc = subprocess.run(
        [sys.executable, "-m", "tpbench", "report", str(run), "--metric", "cpu_ms", "-o", str(tmp_path / "r.html")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 3 and "--metric cpu_ms was not recorded" in " ".join(proc.stderr.split())
    assert str(run) in proc.stderr.replace("\n", "")


def test_cases_of_different_worlds_are_compared_unpaired():
    """The hooks on loopback and on tcp-1gbit ran in different worlds: a comparison across worlds
    must not pair repeats that did not run together."""
    data = report_data.load([in_memory_run(ZERO_SUITE, zero_medians)])
    rows = data.done.to_dict("records")
    loop = next(r for r in rows if r["algorithm"] == "hook_with_zero_step" and r["interconnect"] == "loopback")
    tcp = next(r for r in rows if r["algorithm"] == "hook_with_zero_step" and r["interconnect"] == "tcp-1gbit")
    twin = next(
        r
        for r in rows
        if r["algorithm"] == "hook_with_zero_step_interleaved"
        and all(r[k] == loop[k] for k in ("interconnect", "bucket_cap_mb", "shard_buckets"))
    )
    assert verdicts.case_estimate(loop, tcp).method == "unpaired"
    assert verdicts.case_estimate(loop, twin).method == "paired"


LOCALSGD_SUITE = localsgd_suite(
    'start_localSGD_iter = ["never", 10]\naveraging_period = [4]',
    name="lsgd-test",
    steps=40,
    repeats=3,
    eval_every=10,
)


def localsgd_data(
    reached: dict[str, tuple[bool, ...]] | None = None,
    *,
    heldout: bool = True,
    optimum: float | None = 1.0,
    drift: bool = False,
    evals_to: int = 40,
) -> report_data.ReportData:
    """Plain DDP (100 ms steps, final held-out loss 1.02) and post-local SGD (60 ms, 1.04) over 3
    repeats, the target 1.05; ``reached`` names, per side ("never", "local"), the repeats whose
    held-out loss reaches it (at step 29; the others stay at 1.3): all of them by default. Without
    ``heldout`` the run stores no held-out loss (eval_every = 0); ``optimum`` None: none known. With
    ``drift`` post-local SGD records its parameter drift before each averaging (every 4th step). No
    evaluation after ``evals_to`` steps trained (40: the last is at the end of training)."""
    reached = {"never": (True,) * 3, "local": (True,) * 3, **(reached or {})}
    cases = expand(parse(LOCALSGD_SUITE, "lsgd.toml"), Machine(gpus=0))
    never = next(c for c in cases if c.start_localSGD_iter == "never")
    local = next(c for c in cases if c.start_localSGD_iter == 10)
    target = np.nan if optimum is None else optimum * 1.05
    rows = []
    for side, case, step_ms, final in (("never", never, 100.0, 1.02), ("local", local, 60.0, 1.04)):
        for repeat in range(3):
            end = final if reached[side][repeat] else 1.3
            for rank in range(4):
                for step in range(40):
                    # Held-out loss evaluated every 10 steps; a reaching repeat gets there at step 29.
                    held = np.nan if (step + 1) % 10 or step >= evals_to else (1.3 if step < 29 else end)
                    rows.append(
                        {
                            "case_id": case.case_id,
                            "repeat": repeat,
                            "rank": rank,
                            "step": step,
                            "phase": "timed",
                            "step_ms": step_ms * (1 + 0.01 * repeat),
                            "loss": 1.5,
                            **({"heldout_loss": held} if heldout else {}),
                            "optimal_loss": np.nan if optimum is None else optimum,
                            **({"drift_max_l2": 0.5 if side == "local" and step % 4 == 3 else np.nan} if drift else {}),
                        }
                    )
    steps = pd.DataFrame(rows)
    summary = pd.DataFrame(
        [
            {
                "case_id": c.case_id,
                "median_ms": ms,
                "ci_lo_ms": ms,
                "ci_hi_ms": ms * 1.02,
                "repeat_medians_ms": [ms, ms * 1.01, ms * 1.02],
                **(
                    {"final_heldout_loss": final, "optimal_loss": np.nan if optimum is None else optimum}
                    | {"target_loss": target}
                    if heldout
                    else {}
                ),
            }
            for c, ms, final in ((never, 100.0, 1.02), (local, 60.0, 1.04))
        ]
    )
    return report_data.load([finished_in_memory("lsgd-test", LOCALSGD_SUITE, cases, steps, summary)])


def finished_in_memory(name: str, text: str, cases: list, steps: pd.DataFrame, summary: pd.DataFrame) -> store.Loaded:
    """A finished run ``r1`` of suite ``name`` (``text``) held in memory: every case done, these tables."""
    meta = {
        "run_id": "r1",
        "suite": {"name": name, "text": text},
        "status": "complete",
        "environment": dict(synth_run.ENVIRONMENT),
        "cases": {c.case_id: {"params": c.params(), "status": "done"} for c in cases},
    }
    record = RunRecord.from_json(meta)
    return store.Loaded(Path("/nonexistent"), record, store.cases_table(record), steps, summary)


def test_local_sgd_verdict_time_to_target_and_final_gap():
    data = localsgd_data()
    [v] = verdicts.convergence_verdicts(data)
    assert v.cand_reached == v.base_reached == 3
    assert v.reach_ratio.ratio == pytest.approx(0.6) and v.reach_ratio.method == "paired"
    assert v.final_delta == pytest.approx(0.02)
    text = verdicts.convergence_sentence(v, [])
    assert text.startswith("post-local SGD (start_localSGD_iter=10 averaging_period=4) reaches the target in ")
    assert ", time to the target: faster: -40.0% [" in text and "but ends 0.020 nats above DDP's held-out loss" in text
    assert "its step time against DDP's, faster: -40.0% [" in text and "(this run resolves ±" in text


@pytest.mark.parametrize(
    ("delta", "says"),
    [
        (0.005493, "ends 0.0055 nats above DDP's held-out loss"),
        (-0.0061, "ends 0.006 nats below DDP's held-out loss"),
        (0.005, "ends level with DDP (held-out loss within 0.005 nats)"),  # on the band: level, as in the tune's note
    ],
)
def test_a_final_loss_just_beyond_the_level_band_is_not_rounded_onto_it(delta, says):
    """suites/localsgd.toml's post-local SGD averaging every 16 steps ended 0.005493 nats above DDP: the
    line said "ends 0.005 nats above DDP's held-out loss" beside the others' "ends level with DDP (held-out
    loss within 0.005 nats)", a gap that read as inside the band it was said to be beyond."""
    [v] = verdicts.convergence_verdicts(localsgd_data())
    assert says in verdicts.convergence_sentence(dataclasses.replace(v, final_delta=delta), [])


def test_final_held_out_loss_says_its_step_where_the_last_evaluation_is_not_the_end_of_training():
    """With eval_every not dividing the steps trained (here 30 of 40 evaluated), the "final" held-out loss
    the report compares is the last evaluation's, not the trained model's: the verdicts and the Time to
    target table now say at which step it was evaluated (and say nothing where it is the end)."""
    short = localsgd_data(evals_to=30)
    [v] = verdicts.convergence_verdicts(short)
    assert "ends 0.020 nats above DDP's held-out loss (last evaluated at step 30 of the 40 trained);" in (
        verdicts.convergence_sentence(v, [])
    )
    [line] = verdicts.step_time_only_sentences(localsgd_data(optimum=None, evals_to=30), [], [])
    assert "(no target: the workload knows no optimal loss; last evaluated at step 30 of the 40 trained)" in line
    table = build_report(short.runs).split("Time to target", 1)[1]
    assert "last held-out evaluation" in table and "<td>30 of 40</td>" in table
    [v] = verdicts.convergence_verdicts(localsgd_data())
    assert "last evaluated" not in verdicts.convergence_sentence(v, [])
    assert "last held-out evaluation" not in build_report(localsgd_data().runs)


@pytest.mark.parametrize(
    "reached, says, never_says",
    [
        # Every repeat of the candidate reached the target, two of DDP's: not "only 3 of its repeats".
        (
            {"never": (True, True, False)},
            "reaches the target in 1.82 s of training (DDP in only 2 of its 3 repeats)",
            "only 3",
        ),
        # Two of the candidate's three: the table beside it leaves the cell blank, so the sentence gives no time.
        (
            {"never": (False,) * 3, "local": (True, True, False)},
            "reaches the target in only 2 of its 3 repeats, which DDP never does",
            "s of training",
        ),
        (
            {"never": (True, False, True), "local": (False,) * 3},
            "never reaches the target (DDP in only 2 of its 3 repeats)",
            "DDP does, in",
        ),
    ],
)
def test_local_sgd_verdict_when_some_repeats_miss_the_target(reached, says, never_says):
    """A case "reaches the target" only if every repeat does (the Time to target table's rule): the
    sentence says how many repeats did where not all, on either side, and never a time the table
    beside it leaves blank."""
    [v] = verdicts.convergence_verdicts(localsgd_data(reached))
    assert v.reach_ratio is None
    text = verdicts.convergence_sentence(v, [])
    assert says in text and never_says not in text, text


TWO_DDP_SUITE = localsgd_suite(
    'algorithm = ["ddp", "post_localSGD_hook"]\nstart_localSGD_iter = ["never", 10]\naveraging_period = [4]',
    name="lsgd-two-ddp",
    steps=40,
    repeats=3,
    eval_every=10,
).replace('algorithm = "post_localSGD_hook"\n', "", 1)


def two_ddp_data() -> report_data.ReportData:
    """Post-local SGD (60 ms steps, final held-out loss 1.04) beside both forms of plain DDP: the ``ddp``
    algorithm (100 ms, 1.02) and post-local SGD that never switches (90 ms, 1.03); 3 repeats of 40 steps,
    a held-out loss every 10, each reaching the target (1.05) at step 29."""
    cases = expand(parse(TWO_DDP_SUITE, "lsgd.toml"), Machine(gpus=0))
    shape = {("ddp", None): (100.0, 1.02), ("post_localSGD_hook", "never"): (90.0, 1.03)}
    shape[("post_localSGD_hook", 10)] = (60.0, 1.04)
    rows, summary = [], []
    for c in cases:
        step_ms, final = shape[c.algorithm, c.start_localSGD_iter]
        for repeat, step in itertools.product(range(3), range(40)):
            held = np.nan if (step + 1) % 10 else (1.3 if step < 29 else final)
            rows.append(
                {
                    **{"case_id": c.case_id, "repeat": repeat, "rank": 0, "step": step, "phase": "timed"},
                    **{"step_ms": step_ms * (1 + 0.01 * repeat), "loss": 1.5, "heldout_loss": held},
                    "optimal_loss": 1.0,
                }
            )
        summary.append(
            {
                **{"case_id": c.case_id, "median_ms": step_ms, "ci_lo_ms": step_ms, "ci_hi_ms": step_ms * 1.02},
                "repeat_medians_ms": [step_ms, step_ms * 1.01, step_ms * 1.02],
                **{"final_heldout_loss": final, "optimal_loss": 1.0, "target_loss": 1.05},
            }
        )
    loaded = finished_in_memory("lsgd-two-ddp", TWO_DDP_SUITE, cases, pd.DataFrame(rows), pd.DataFrame(summary))
    return report_data.load([loaded])


def test_post_local_sgd_against_two_ddp_baselines_names_each():
    """A run with both the ``ddp`` algorithm and post-local SGD that never switches has two plain-DDP
    baselines, both "DDP": each post-local SGD case got two verdict lines that began alike and never
    said which DDP each was set against. Each now names its baseline by what tells the two apart."""
    data = two_ddp_data()
    conv = verdicts.convergence_verdicts(data)
    lines = [verdicts.convergence_sentence(v, data.context_keys) for v in conv]
    plain = verdicts.step_time_only_sentences(data, [], data.context_keys)  # as though none were judged
    for said in (lines, plain):
        assert len(said) == 2
        ddp, never = sorted(said, key=lambda line: "against DDP run as algorithm=ddp" not in line)
        assert "against DDP run as algorithm=ddp)" in ddp, ddp
        assert "against DDP run as algorithm=post_localSGD_hook start_localSGD_iter=never)" in never, never
    # A run with one DDP names none: "DDP" says it.
    [v] = verdicts.convergence_verdicts(localsgd_data())
    assert "against DDP run as" not in verdicts.convergence_sentence(v, [])


def _time_to_target_table(data) -> str:
    """The convergence section's Time to target table of ``data``, as HTML."""
    from tpbench.report import convergence
    from tpbench.report.html import Page

    page = Page(title="t")
    convergence.section(page, data, verdicts.convergence_verdicts(data))
    html = page.render()
    table = html[html.index("Time to target") :]
    return table[table.index("<table") : table.index("</table>")]


def test_the_time_to_target_caption_says_it_is_only_as_fine_as_eval_every():
    """suites/localsgd.toml evaluates its held-out loss every 20 steps: its Time to target table gave
    40 against 60 steps to the target, a gap of one evaluation that may be a step, and nothing said so."""
    from tpbench.report import convergence
    from tpbench.report.html import Page

    data = localsgd_settings_data()
    page = Page(title="t")
    convergence.section(page, data, verdicts.convergence_verdicts(data))
    said = " ".join(re.sub(r"<[^>]+>", " ", page.render()).split())
    assert "Steps and time to target are only as fine as eval_every (every 10 steps): they are the first " in said
    assert "and the case got there within the eval_every steps before it." in said


def test_the_time_to_target_table_sets_post_local_sgd_against_each_ddp():
    """With both forms of plain DDP the table's one "time to target vs DDP" column kept whichever
    verdict came last: a ratio against one DDP under a heading that could mean either. Each DDP now
    has its columns, named as the verdict lines name it."""
    table = _time_to_target_table(two_ddp_data())
    head = re.findall(r"<th>(.*?)</th>", table)
    for named in ("algorithm=ddp", "algorithm=post_localSGD_hook start_localSGD_iter=never"):
        assert f"time to target vs DDP ({named})" in head and f"final loss − DDP ({named}) (nats)" in head, head
    rows = [re.findall(r"<td>(.*?)</td>", r, re.S) for r in re.findall(r"<tr>(.*?)</tr>", table, re.S)]
    [local] = [r for r in rows if r and "start_localSGD_iter=10" in r[0]]
    ratios = [
        re.sub(r"<[^>]+>", "", local[head.index(f"time to target vs DDP ({n})")])  # the interval's nowrap span
        for n in ("algorithm=ddp", "algorithm=post_localSGD_hook start_localSGD_iter=never")
    ]
    assert ratios[0].startswith("0.6") and ratios[1].startswith("0.67"), ratios


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two small synthetic runs written through the store: one with every derived table, one bare."""
    root = tmp_path_factory.mktemp("runs")
    small = dict(buckets=(1, 4), interconnects=("loopback", "tcp-1gbit"), repeats=2, steps=6)
    full = synth_run.make_run(root / "full", name="full", **small)
    bare = synth_run.make_run(root / "bare", name="bare", traced=0, nvml=False, failed=0, **small)
    return full, bare


def headings(html: str) -> set[str]:
    return set(re.findall(r'<h2 id="([^"]+)"', html))


def figures(html: str) -> list[dict]:
    """Every figure of a page as the JSON its ``tpbPlot`` call draws (``<`` is escaped inside it)."""
    return [json.loads(f) for f in re.findall(r'tpbPlot\("fig\d+", (.*?)\);</script>', html)]


def figure_after(html: str, anchor: str) -> dict:
    """The first figure after the heading with id ``anchor``."""
    return figures(html[html.index(f'id="{anchor}"') :])[0]


def test_sections_appear_only_with_their_data(runs):
    full, bare = runs
    with_all = headings(build_report([store.load(full)]))
    assert {
        "verdicts",
        "environment",
        "step-time",
        "speedups",
        "overlap",
        "timeline",
        "collectives",
        "telemetry",
        "memory",
        "comparisons",
        "failed",
        "cases",
    } <= with_all
    without = headings(build_report([store.load(bare)]))
    assert {"verdicts", "step-time", "speedups", "memory", "cases"} <= without
    assert not {"overlap", "timeline", "collectives", "telemetry", "failed", "convergence", "traces"} & without


def hostile_copy(run_dir: Path, dest: Path) -> Path:
    """A copy of a run whose every piece of user text is markup."""
    shutil.copytree(run_dir, dest)
    meta = json.loads((dest / "run.json").read_text())
    meta["suite"]["name"] = "<script>alert(1)</script>"
    meta["suite"]["text"] = meta["suite"]["text"].replace("Synthetic", "<script>alert('toml')</script>")
    meta["suite"]["description"] = "<img src=x onerror=alert(2)> & friends"
    first, second = list(meta["cases"])[:2]
    meta["cases"][first]["params"]["interconnect"] = "<b>lo</b><script>alert(3)</script>"
    meta["cases"][second].update(
        status="failed", error="<img src=y onerror=alert(4)>", detail="</pre><script>alert(5)</script>"
    )
    (dest / "run.json").write_text(json.dumps(meta))
    return dest


def test_user_text_is_escaped_everywhere(runs, tmp_path):
    html = build_report([store.load(hostile_copy(runs[0], tmp_path / "hostile"))])
    body = html.split("</head>", 1)[1]
    for raw in ("<script>alert(", "<img src=", "<b>lo</b>"):
        assert raw not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "&lt;img src=y onerror=alert(4)&gt;" in body
    # In figures: JSON with "<" as \u003c, and plotly's own markup escaped as entities.
    assert "\\u003cb\\u003elo" not in body and "&lt;b&gt;lo&lt;\\u002fb&gt;" in body


def test_report_command_compares_several_runs(runs, tmp_path):
    full, _ = runs
    other = tmp_path / "other"
    shutil.copytree(full, other)
    meta = json.loads((other / "run.json").read_text())
    meta["run_id"] = meta["run_id"][:-1] + "z"
    meta["environment"]["torch"] = "2.14.0"
    (other / "run.json").write_text(json.dumps(meta))
    out = tmp_path / "cmp.html"
    # The CLI in this process: a fresh interpreter would spend seconds importing torch.
    assert run_cli(["report", str(full), str(other), "-o", str(out)]) == 0
    html = out.read_text()
    assert "across-runs" in headings(html)
    assert "A · torch 2.13.0" in html and "B · torch 2.14.0" in html
    # Identical data, judged by the engine of `tpbench compare`: no change is called (these runs
    # have too few repeats for a verdict, as `tpbench compare` says of them too).
    (line,) = re.findall(r"Run B · torch 2.14.0 against run A · torch 2.13.0, over \d+ common case\(s\): [^<]*", html)
    assert (
        "regression" not in line
        and "improvement" not in line
        and "median step-time ratio 1.00 (range 1.00–1.00)" in line
    )


def test_the_line_over_several_runs_prints_its_ratios_with_the_same_decimals(tmp_path):
    """A later run 14 % and 20 % slower case by case: three significant figures wrote "range
    1.14–1.2", the trailing zero of one end dropped; both ends now carry two decimals."""
    base = make_run(
        tmp_path / "base", {"zero_no_overlap": [100.0] * 4, "hook_with_zero_step": [100.0] * 4}, jitter=0.001
    )
    cand = make_run(
        tmp_path / "cand", {"zero_no_overlap": [114.0] * 4, "hook_with_zero_step": [120.0] * 4}, jitter=0.001
    )
    for run in (base, cand):
        finalize(store.Run.open(run))  # the summary, as a sweep leaves it
    html = build_report([store.load(base), store.load(cand)])
    (line,) = re.findall(r"median step-time ratio [^;<]*", html)
    assert line == "median step-time ratio 1.17 (range 1.14–1.20)", line


def test_budget_resolution_counts_what_the_reports_comparisons_resolve(tmp_path):
    """benchmarks/budget_resolution reads a run as its report does: the one comparison of these
    two cases of one world is paired, and its half-width is the report's."""
    drift = [100.0, 130.0, 85.0, 115.0, 95.0]
    run = make_run(tmp_path, {"zero_no_overlap": drift, "hook_with_zero_step": [v * 0.9 for v in drift]}, jitter=0.002)
    finalize(store.Run.open(run))  # the summary, as a sweep leaves it
    res = budget_resolution.resolution(run)
    [c] = verdicts.compare(report_data.load([store.load(run)]), verdicts.ZERO_KINDS[1])
    assert (res.comparisons, res.paired, res.within_target) == (1, 1, 1)
    assert res.median_half_width == res.max_half_width == pytest.approx(c.est.half_width) and c.est.half_width < 0.05
    assert res.shape == "5x3+8"
    assert "half-width <= 5%: 1/1 (100%)" in budget_resolution.line(res)


def test_budget_resolution_says_when_a_run_states_no_comparison(tmp_path):
    """A run whose report compares nothing (one DDP case, as suites/smoke.toml's ddp against
    zero_no_overlap is not a comparison the report states) printed "0/0 (nan%) median ±nan%"."""
    run = make_run(tmp_path, {"ddp": [100.0, 101.0, 99.0]}, jitter=0.002)
    finalize(store.Run.open(run))
    text = budget_resolution.line(budget_resolution.resolution(run))
    assert "nan" not in text and "no comparison" in text


def test_an_adaptive_sweeps_raised_repeats_do_not_split_its_cases(tmp_path):
    """An adaptive sweep raised one case's repeats: the report still pairs it with the others (its
    repeats as planned, from run.json's ``adaptive`` record), instead of treating 9 and 6 repeats
    as two settings with nothing to compare."""
    run = make_run(tmp_path / "run", {"zero_no_overlap": [10.0] * 6, "hook_with_zero_step": [9.0] * 6}, jitter=0.002)
    meta = json.loads((run / "run.json").read_text())
    seq = next(cid for cid, c in meta["cases"].items() if c["params"]["algorithm"] == "hook_with_zero_step")
    meta["adaptive"] = {"planned_repeats": {cid: 6 for cid in meta["cases"]}}
    meta["cases"][seq]["params"]["repeats"] = 9
    (run / "run.json").write_text(json.dumps(meta))
    finalize(store.Run.open(run))
    data = report_data.load([store.load(run)])
    assert "repeats" not in data.context_keys
    (comparison,) = verdicts.compare(data, verdicts.ZERO_KINDS[1])
    assert comparison.verdict == "faster"


def test_the_collectives_table_shows_one_instance_at_the_median_not_a_median_per_column():
    """Six broadcasts of one size: a median per column set the middle two times' mean beside the
    middle two busbw's mean (1.72 GB/s beside 1,857,024 B in 1.97 ms, where that instance's own is
    0.94); the table now shows the lower-median instance whole."""
    from types import SimpleNamespace

    from tpbench.report.html import Page
    from tpbench.report.timelines import _collectives_table

    times = [1.0, 1.5, 1.8, 2.2, 4.0, 6.0]
    df = pd.DataFrame(
        {
            "run": "r",
            "label": "zero_no_overlap",
            "collective": "broadcast",
            "time_ms": times,
            "bytes": [1_857_024] * 3 + [512] + [1_857_024] * 2,
            "busbw_gbps": [1_857_024 / (t * 1e6) for t in times[:3]]
            + [512 / 2.2e6]
            + [1_857_024 / (t * 1e6) for t in times[4:]],
        }
    )
    page = Page("t")
    _collectives_table(page, SimpleNamespace(multi=False), df)
    body = page.render()
    row = re.search(r"<td>6</td>\s*<td>([^<]+)</td>\s*<td>([^<]+)</td>\s*<td>([^<]+)</td>", body)
    assert row, body
    assert float(row[1]) == 1.8 and row[2] == "1857024"
    assert float(row[3]) == pytest.approx(1_857_024 / 1.8e6, abs=0.005)  # shown to 3 figures


def test_the_crossover_table_names_every_key_that_tells_its_points_apart():
    """The front door's points differ by shard_buckets too: two "loopback | 4" rows read alike."""
    from tpbench.report.interconnect import _other_keys

    points = pd.DataFrame(
        {
            "interconnect": ["loopback"] * 2,
            "bucket_cap_mb": [4, 4],
            "shard_buckets": [False, True],
            "seed": [0, 0],
            "sequential_case": ["a", "b"],
            "ratio": [0.9, 1.1],
        }
    )
    assert _other_keys(points) == ["shard_buckets"]


def test_the_crossover_legend_spells_a_setting_as_the_case_labels_and_tables_do():
    """The legend and hover said shard_buckets=false (the command line's spelling) where the table under
    the chart, the verdicts and every case label say shard_buckets=False."""
    from tpbench.report.interconnect import _crossover_figure

    points = pd.DataFrame(
        {
            "interconnect": ["loopback"] * 2,
            "bucket_cap_mb": [4.0, 4.0],
            "shard_buckets": [False, True],
            "comm_hook": ["allreduce"] * 2,
            "allreduce_bytes_per_step": [3.71e6] * 2,
            "comm_compute": [3.0, 4.5],
            "ratio": [1.15, 1.03],
            "ratio_lo": [0.87, 0.45],
            "ratio_hi": [1.52, 2.37],
        }
    )
    fig = _crossover_figure(points, None, ["shard_buckets"])
    names = [t.name for t in fig.data]
    assert names == ["bucket_cap_mb=4 shard_buckets=False", "bucket_cap_mb=4 shard_buckets=True"]
    assert fig.data[0].text[0] == "loopback, allreduce, shard_buckets=False, all-reduce 3.71 MB/step"


def test_the_crossover_hover_gives_its_ratio_two_decimals_as_the_page_does():
    """The hover said "interleaved/sequential 1.150" under a table (and intervals) of two decimals, 1.15."""
    from tpbench.report.interconnect import _crossover_figure

    points = pd.DataFrame(
        {
            "interconnect": ["loopback"],
            "bucket_cap_mb": [4.0],
            "allreduce_bytes_per_step": [3.71e6],
            "comm_compute": [3.0],
            "ratio": [1.15],
            "ratio_lo": [0.87],
            "ratio_hi": [1.52],
        }
    )
    (hover,) = {t.hovertemplate for t in _crossover_figure(points, None, []).data if t.hovertemplate}
    assert "interleaved/sequential %{y:.2f}" in hover, hover


def test_the_crossover_plots_its_ratios_on_a_log_axis():
    """interleaved / sequential is a ratio and the crossover's line a fit of its log: on a linear axis
    one point's interval up to 36.6 (suites/zero.toml, 3 repeats) pressed the other points, their
    intervals and the line into the bottom 5 % of the chart, unreadable."""
    from tpbench.report.interconnect import _crossover_figure

    points = pd.DataFrame(
        {
            "interconnect": ["loopback"] * 3,
            "bucket_cap_mb": [0.5, 1, 4],
            "allreduce_bytes_per_step": [3.71e6] * 3,
            "comm_compute": [3.0, 4.5, 3.3],
            "ratio": [1.15, 1.03, 1.49],
            "ratio_lo": [0.87, 0.45, 0.06],
            "ratio_hi": [1.52, 2.37, 36.6],
        }
    )
    fig = _crossover_figure(points, None, [])
    assert fig.layout.yaxis.type == "log" and "log scale" in fig.layout.yaxis.title.text
    # Over three decades every tick says its ratio: plotly's own labels between decades are bare digits
    # ("5, 2, 1, 5, 2, 0.1"), the "5" under 1 meaning 0.5.
    ticks = dict(zip(fig.layout.yaxis.tickvals, fig.layout.yaxis.ticktext))
    assert {0.1: "0.1", 0.5: "0.5", 1.0: "1", 2.0: "2", 10.0: "10"}.items() <= ticks.items(), ticks
    assert ticks[0.05] == "0.05" and max(ticks) < 100, ticks


def test_a_ratio_axis_close_to_one_is_labelled_in_even_steps():
    """The front door's crossover chart (ratios 0.88-1.19) had one labelled tick, "1": the 1-2-5 steps of
    a decade put nothing else near its points, so no ratio could be read off the axis."""
    from tpbench.report.figures import log_ratio_ticks

    ticks = log_ratio_ticks([0.876, 1.19, 0.944, 1.13])
    assert ticks["ticktext"] == ["0.85", "0.9", "0.95", "1", "1.05", "1.1", "1.15", "1.2"], ticks
    assert log_ratio_ticks([1.0, 2.7])["ticktext"] == ["1", "1.5", "2", "2.5", "3"]
    assert log_ratio_ticks([0.06, 36.6])["ticktext"][:3] == ["0.05", "0.1", "0.2"]  # decades as before


def test_a_ratio_axis_labels_ticks_within_its_points_not_beyond_them():
    """The front door's crossover chart (points and intervals 0.72-1.36) still had one labelled tick,
    "1": 0.5 and 2 counted as near its points, but plotly's axis, which spans the points, shows neither."""
    from tpbench.report.figures import log_ratio_ticks

    values = [0.844, 1.33, 0.814, 1.35, 0.963, 1.36, 0.81, 1.1, 0.864, 1.2, 0.719, 1.11]
    shown = [t for t in log_ratio_ticks(values)["tickvals"] if min(values) <= t <= max(values)]
    assert len(shown) >= 3 and 1 in shown, shown


def test_a_table_column_with_no_value_shows_empty_cells_not_none():
    """pandas' formatters skip a column holding only None, which printed "None" (the Across runs
    table's ratio when no case had a counterpart); every cell is the page's own, blank when missing."""
    from tpbench.report.html import Page

    page = Page("t")
    page.table(pd.DataFrame([{"case": "ddp", "ratio": None, "verdict": "missing"}]))
    assert "<td>None</td>" not in page.parts[-1] and "<td></td>" in page.parts[-1]


def test_several_runs_show_parameters_as_the_suite_spells_them(tmp_path):
    """A run of another workload lacks mlp's keys: concatenated, its NaN turned the other runs'
    integers into floats ("workload.width=64.0" in every sentence); they read as the suite wrote
    them. No case has a counterpart in the first run, so the Across runs table has no ratio."""
    two = {"ddp": [10.0, 10.2, 9.9], "zero_no_overlap": [12.0, 12.1, 11.9]}
    mlp = {"workload": '"mlp"'}
    runs = [
        make_run(tmp_path / "wide", two, defaults=mlp, workloads={"mlp": {"width": 64}}),
        make_run(tmp_path / "narrow", two, defaults=mlp, workloads={"mlp": {"width": 32}}, seed=1),
        make_run(tmp_path / "markov", two, defaults={"workload": '"markov"'}, seed=2),
    ]
    loaded = [finalize(store.Run.open(run)) for run in runs]
    data = report_data.load(loaded)
    said = {report_data.context_text(row, data.context_keys) for row in data.cases.to_dict("records")}
    assert said == {"workload=mlp, workload.width=64", "workload=mlp, workload.width=32", "workload=markov"}
    html = build_report(loaded, tmp_path)
    assert "workload.width=64.0" not in html and "Fastest workload=mlp, workload.width=64:" in html
    assert 'id="across-runs"' in html and "<td>None</td>" not in html


def test_the_folded_comparisons_name_packed_broadcasts_only_where_the_run_has_them(tmp_path):
    """A run without parameters_as_bucket_view = true (crossover.toml, compression.toml) was told its
    ZeRO hooks were compared against zero_no_overlap "unpacked and packed"."""
    zero = {"zero_no_overlap": [20, 21, 20.5], "hook_with_zero_step": [15, 15.5, 15.2]}
    zero["hook_with_zero_step_interleaved"] = [14, 14.5, 14.2]
    unpacked = make_run(tmp_path / "unpacked", zero)
    finalize(store.Run.open(unpacked))
    unpacked = build_report([store.load(unpacked)], tmp_path)
    assert "more: each ZeRO hook against zero_no_overlap (per-parameter broadcasts)" in unpacked
    assert "unpacked and packed" not in unpacked
    both = make_run(tmp_path / "both", zero, sweep={"parameters_as_bucket_view": "[false, true]"})
    finalize(store.Run.open(both))
    assert "more: each ZeRO hook against zero_no_overlap (unpacked and packed)" in build_report(
        [store.load(both)], tmp_path
    )


def test_traced_against_timed_gives_the_range_over_cases(runs):
    """The Overlap section's one figure for how long traced steps took against timed ones: a median
    over cases alone read "0.99×" where one case's traced steps took 1.59× (localsgd, 5 cases)."""
    said = traced_vs_timed(np.array([1.155, 0.994, 0.80, 0.82, 1.59]))
    assert said.startswith(
        "Traced steps took 0.99× as long as their case's timed median (the median over 5 cases; 0.80× to 1.59×): "
    )
    assert traced_vs_timed(np.array([1.2])).startswith("Traced steps took 1.20× as long as the timed steps' median: ")
    # Two decimals whatever the leading digit: two significant figures wrote a median of 1.036 "1×"
    # beside "0.99×", no overhead where the traced steps took 3.6 % longer.
    said = traced_vs_timed(np.array([1.036, 0.994, 1.061, 1.036]))
    assert said.startswith(
        "Traced steps took 1.04× as long as their case's timed median (the median over 4 cases; 0.99× to 1.06×)"
    )
    assert "timed median (the median over " in build_report([store.load(runs[0])])


def test_step_time_caption_says_what_a_post_local_sgd_point_is():
    """Its points are the median over averaging periods of each period's mean step, not the median
    of its steps that the caption said (which drops most averaging steps)."""
    data = localsgd_data()
    assert "Post-local SGD after its switch: per repeat, the median over whole averaging periods" in (
        performance.step_time_caption(data.done)
    )
    plain = data.done[data.done["start_localSGD_iter"] == "never"]
    assert "Post-local SGD" not in performance.step_time_caption(plain)


@pytest.mark.parametrize("without", ["heldout", "optimum"])
def test_local_sgd_against_ddp_is_stated_without_a_target_loss(without):
    """Post-local SGD against DDP in step time is one of the report's stated comparisons, but it was
    said only inside the convergence verdict: a run without a held-out loss (eval_every = 0, the
    default) or whose workload knows no optimum (embedding, most models of one's own) got none."""
    data = localsgd_data(heldout=False) if without == "heldout" else localsgd_data(optimum=None)
    assert verdicts.convergence_verdicts(data) == []
    [line] = verdicts.step_time_only_sentences(data, [], [])
    assert line.startswith(
        "post-local SGD (start_localSGD_iter=10 averaging_period=4): its step time against DDP's, faster: -40.0% ["
    )
    if without == "heldout":
        assert line.endswith(
            "; no held-out loss was evaluated (eval_every), so how far its steps take the model is not measured."
        )
    else:
        assert line.endswith(
            "; it ends 0.020 nats above DDP's held-out loss (no target: the workload knows no optimal loss)."
        )


def test_all_comparisons_table_lists_post_local_sgd_against_ddp():
    """The table has the figures of every pair the verdicts state; post-local SGD against DDP's were
    left out, and a post-local SGD run had no such table at all."""
    html = build_report(localsgd_data().runs)
    assert 'id="comparisons"' in html and "post-local SGD / DDP" in html


def test_all_comparisons_table_says_each_figure_once_with_two_decimals():
    """The verdict column repeated the change and interval the ratio and 95% CI columns show ("faster:
    -20.0% [-22.0%, -18.0%], beyond ..."), in a column too narrow for them, and the CI's three
    significant figures wrote 1.20 as "1.2" beside the heatmaps' "[0.86, 1.20]" for the same pair."""
    data = report_data.load([in_memory_run(ZERO_SUITE, zero_medians)])
    comps = verdicts.compare(data, verdicts.ZERO_KINDS[0])
    rows = performance.comparison_rows(data, comps)
    loop = next(i for i, c in enumerate(comps) if c.context.get("interconnect") == "loopback")
    row = rows.iloc[loop]
    c = comps[loop]
    assert row["verdict"] == "faster, beyond the ±5% threshold"
    assert row["ratio"] == f"{c.ratio:.2f}" and row["95% CI"] == f"[{c.lo:.2f}, {c.hi:.2f}]"


def localsgd_settings_data(
    slow_last: float = 1.02,
    reach_s: dict[tuple, tuple[float, float, float]] | None = None,
    finals: dict[tuple, float] | None = None,
) -> report_data.ReportData:
    """Plain DDP and post-local SGD averaging every 4 and every 16 steps, 3 repeats of 40 steps, a
    held-out loss every 10 (the target 1.05): DDP 100 ms a step reaching it after 20 steps (2 s),
    every 4 steps 60 ms after 30 (1.8 s), every 16 steps 55 ms after 40 (2.2 s), the second repeat
    1 % slower and the last ``slow_last`` times as slow. All end level. ``reach_s``: per setting
    (start_localSGD_iter, averaging_period), each repeat's seconds of training to the target instead;
    ``finals``: per setting, its final held-out loss (median over repeats) instead of 1.02."""
    text = localsgd_suite(
        'start_localSGD_iter = ["never", 10]\naveraging_period = [4, 16]',
        name="lsgd-settings",
        steps=40,
        repeats=3,
        eval_every=10,
    )
    cases = expand(parse(text, "lsgd.toml"), Machine(gpus=0))
    shape = {("never", None): (100.0, 20), (10, 4): (60.0, 30), (10, 16): (55.0, 40)}
    rows, summary = [], []
    for c in cases:
        step_ms, at = shape[c.start_localSGD_iter, c.averaging_period]
        for repeat in range(3):
            for step in range(40):
                held = np.nan if (step + 1) % 10 else (1.3 if step + 1 < at else 1.02)
                ms = step_ms * (1, 1.01, slow_last)[repeat]
                if reach_s and (c.start_localSGD_iter, c.averaging_period) in reach_s:
                    ms = reach_s[c.start_localSGD_iter, c.averaging_period][repeat] * 1e3 / at
                rows.append(
                    {
                        **{"case_id": c.case_id, "repeat": repeat, "rank": 0, "step": step, "phase": "timed"},
                        **{"step_ms": ms, "loss": 1.5, "heldout_loss": held},
                        "optimal_loss": 1.0,
                    }
                )
        summary.append(
            {
                **{"case_id": c.case_id, "median_ms": step_ms, "ci_lo_ms": step_ms, "ci_hi_ms": step_ms * 1.02},
                "repeat_medians_ms": [step_ms, step_ms * 1.01, step_ms * 1.02],
                **{"optimal_loss": 1.0, "target_loss": 1.05},
                "final_heldout_loss": (finals or {}).get((c.start_localSGD_iter, c.averaging_period), 1.02),
            }
        )
    return report_data.load(
        [finished_in_memory("lsgd-settings", text, cases, pd.DataFrame(rows), pd.DataFrame(summary))]
    )


def test_the_verdicts_say_which_post_local_sgd_setting_reaches_the_target_soonest():
    """Post-local SGD's settings train differently: each was set against DDP alone, so a report of
    several settings never said which reaches the target loss soonest (here averaging every 4 steps,
    neither the fastest step nor the fewest steps). The Verdicts now name it against its runner-up,
    with the interval of their ratio in compare's words. Its times are medians over repeats, as the
    post-local SGD lines beside it give them (it gave geometric means, 2.06 s where they said 1.82 s
    of a last repeat half as slow again), and plain DDP is "DDP" there, not a hook that never runs."""
    html = build_report(localsgd_settings_data(slow_last=1.5).runs)
    said = " ".join(re.sub(r"<[^>]+>", " ", html).split()).replace("&#x27;", "'")
    assert (
        "post-local SGD (start_localSGD_iter=10 averaging_period=4) reaches the target in 1.82 s of training vs "
        "DDP's 2.02 s" in said
    )
    assert (
        "Soonest to the target loss: post_localSGD_hook start_localSGD_iter=10 averaging_period=4 in 1.82 s of "
        "training (median over repeats); against the runner-up DDP (2.02 s), time to the target: faster: -10.0% ["
        in said
    )


def test_the_soonest_line_says_which_case_has_the_next_lowest_median_where_the_runner_up_has_not():
    """suites/localsgd.toml, 3 repeats: the soonest line named DDP (1.88 s) against the runner-up
    "start_localSGD_iter=60 averaging_period=4 (2.27 s)", second by the geometric mean (2.24 against 2.26 s), while
    the Time to target table beside it gave averaging every 16 steps 2.12 s, a lower median, unexplained. As the
    Fastest line does for step times, the soonest line says which case has the next lowest median where the
    runner-up has not (and the lowest where a third case has it)."""
    reach = {("never", None): (1.885, 1.529, 1.92), (10, 4): (2.506, 2.271, 1.978), (10, 16): (2.899, 2.118, 1.874)}
    said = " ".join(verdicts.soonest_lines(localsgd_settings_data(reach_s=reach)))
    assert (
        "against the runner-up post_localSGD_hook start_localSGD_iter=10 averaging_period=4 (2.27 s; second by the "
        "geometric mean over repeats, which the ratio compares; the next lowest median is post_localSGD_hook "
        "start_localSGD_iter=10 averaging_period=16's, 2.12 s), time to the target: " in said
    )
    # The soonest by the geometric mean without the lowest median, which a third case has.
    reach = {("never", None): (1.3, 1.3, 1.3), (10, 4): (1.25, 1.25, 1.5), (10, 16): (1.0, 1.2, 3.0)}
    said = " ".join(verdicts.soonest_lines(localsgd_settings_data(reach_s=reach)))
    assert (
        "Soonest to the target loss: DDP in 1.3 s of training (median over repeats); first by the geometric mean over "
        "repeats, which the ratio compares; the lowest median is post_localSGD_hook start_localSGD_iter=10 "
        "averaging_period=16's, 1.2 s; against the runner-up post_localSGD_hook start_localSGD_iter=10 "
        "averaging_period=4 (1.25 s), time to the target: " in said
    )


def test_the_fastest_line_says_where_the_fastest_setting_ends_with_a_worse_held_out_loss():
    """suites/localsgd.toml, 3 repeats: "Fastest: post_localSGD_hook start_localSGD_iter=0 averaging_period=16 at
    42.5 ms/step [34.7, 47.0]; against the runner-up DDP, step time: faster: -20.7%", the line the sweep prints
    under its table, said nothing of its held-out loss, which ended 0.0055 nats above DDP's (the lowest was
    1.584 nats): a faster step read as the better setting. Where the fastest ends more than the level band
    above the lowest of its setting, the line now says so, as the tune's note does of its recommended one."""
    finals = {("never", None): 1.02, (10, 4): 1.021, (10, 16): 1.03}
    said = verdicts.fastest_lines(localsgd_settings_data(finals=finals))
    assert said[0].startswith("Fastest: post_localSGD_hook start_localSGD_iter=10 averaging_period=16 ")
    assert said[0].endswith(
        "; its held-out loss ends at 1.030, 0.010 nats above the lowest (DDP, 1.020): its faster step does not "
        "train as far."
    ), said[0]
    assert not verdicts.fastest_lines(localsgd_settings_data())[0].endswith("train as far.")


def test_the_sweeps_terminal_says_which_setting_reaches_the_target_soonest_under_the_fastest():
    """Under its table the sweep printed the report's Fastest line alone: of suites/localsgd.toml it named
    post-local SGD from step 0 averaging every 4 steps, whose time to the target was +66% [+13%, +144%]
    DDP's, and said nothing of the loss. Where the settings train differently the fastest step is not the
    soonest to the target (here averaging every 16 steps against every 4): the terminal gives the
    report's soonest-to-target line under the Fastest one, as the Verdicts do."""
    from tpbench.cli.sweep import _fastest

    lines = _fastest(localsgd_settings_data().runs[0])
    assert lines[0].startswith("Fastest: post_localSGD_hook start_localSGD_iter=10 averaging_period=16 ")
    assert lines[1].startswith(
        "Soonest to the target loss: post_localSGD_hook start_localSGD_iter=10 averaging_period=4 in 1.82 s of training"
    )


def test_a_tunes_report_says_its_intervals_are_not_the_notes_and_leaves_the_soonest_to_it(tmp_path):
    """A tune of suites/localsgd.toml (4 rounds of 120 steps): its note gave DDP against the recommended
    setting's time to the target 'no difference shown: -26.0% [-53.1%, +16.5%]' at 98.75% each, and the
    report's line for the same pair 'slower: +35.2% [+3.4%, +76.8%]' at 95%, with a Soonest line that gave
    the note's DDP against the next soonest -7.4% [-21.1%, +8.5%] beside its [-29.3%, +21.2%], none saying why
    they differ. The Soonest line leaves a tune's arms to its note, as the Fastest does, and the Verdicts and
    the Time to target table say theirs are 95% each, the note's at the confidence the race spent."""
    loaded = dataclasses.replace(localsgd_settings_data().runs[0], run_dir=tmp_path)
    store.write_tune(tmp_path, TuneRecord(Options(), 1.0, {}, []))
    said = " ".join(re.sub(r"<[^>]+>", " ", build_report([loaded])).split()).replace("&#x27;", "'")
    assert "Soonest to the target loss" not in said
    assert (
        "The 3 settings this tune raced: compared in its Recommendation above, at the confidence its race spent, "
        "which its intervals state; each interval here is 95% on its own" in said
    )
    assert "The tune's note in the Recommendation gives times to the target at the confidence its race spent" in said
    assert "Soonest to the target loss" in build_report(localsgd_settings_data().runs)


def test_compare_within_a_run_says_a_compressing_hook_may_train_apart_where_no_loss_was_measured(tmp_path):
    """`tpbench compare RUN_DIR` of suites/compression.toml called comm_hook allreduce → fp16_compress an
    "improvement: faster, beyond the ±5% threshold" (-31.2% a step on tcp-1gbit) and said nothing of training:
    fp16 compression rounds every gradient, and the run evaluated no held-out loss (eval_every = 0), so whether
    its faster step trains as far is not measured. The report says so of post-local SGD without a held-out loss;
    compare now says it of every pair whose one key changes the update (a communication hook, post-local SGD's
    settings) where no held-out loss was evaluated, and nothing of pairs that compute the same update."""
    from tpbench import compare

    run = make_run(
        tmp_path,
        {"ddp": [50.0, 51.0, 52.0], "zero_no_overlap": [60.0, 61.0, 62.0]},
        sweep={"comm_hook": '["allreduce", "fp16_compress"]'},
        factor=lambda c: 0.7 if c.comm_hook == "fp16_compress" else 1.0,
    )
    said = {p.result.label: p.result.training for p in compare.within_run(run).pairs}
    assert said["comm_hook: allreduce → fp16_compress (algorithm=ddp)"] == (
        "may not train alike: comm_hook changes the update, and no held-out loss was evaluated (eval_every = 0), "
        "so how far a step takes the model is not measured; the step time compared does not count it"
    )
    assert said["algorithm: ddp → zero_no_overlap (comm_hook=fp16_compress)"] == ""
    # ddp → post_localSGD_hook, the algorithm itself the key, is said so too (it was left out).
    lsgd = make_run(
        tmp_path / "lsgd",
        {"ddp": [50.0, 51.0, 52.0], "post_localSGD_hook": [40.0, 41.0, 42.0]},
        defaults={"start_localSGD_iter": 2, "averaging_period": 4},
    )
    (pair,) = compare.within_run(lsgd).pairs
    assert pair.result.training.startswith(
        "may not train alike: algorithm (post-local SGD's averaging) changes the update, and no held-out loss"
    ), pair.result.training


def test_the_fastest_line_says_a_hook_that_changes_the_update_may_not_train_alike_where_no_loss_was_measured(
    tmp_path,
):
    """suites/compression.toml's report named an fp16-compressing hook fastest with nothing said of training,
    where compare now says it may not train alike (no held-out loss evaluated): the Fastest line says it too,
    and nothing where the fastest and its runner-up compute the same update."""
    run = make_run(
        tmp_path,
        {"ddp": [50.0, 51.0, 52.0]},
        sweep={"comm_hook": '["allreduce", "fp16_compress"]'},
        factor=lambda c: 0.7 if c.comm_hook == "fp16_compress" else 1.0,
    )
    from tpbench import sweep

    (line,) = verdicts.fastest_lines(report_data.load([sweep.finalize(store.Run.open(run))]))
    assert line.startswith("Fastest: ddp comm_hook=fp16_compress at "), line
    assert line.endswith(
        "; it may not train alike: comm_hook changes the update, and no held-out loss was evaluated "
        "(eval_every = 0), so how far a step takes the model is not measured."
    ), line
    same = make_run(tmp_path / "same", {"ddp": [50.0, 51.0, 52.0], "zero_no_overlap": [60.0, 61.0, 62.0]})
    loaded = sweep.finalize(store.Run.open(same))
    assert "may not train alike" not in verdicts.fastest_lines(report_data.load([loaded]))[0]


def test_compare_within_a_run_says_which_pairs_do_not_train_alike():
    """`tpbench compare RUN_DIR` of suites/localsgd.toml called start_localSGD_iter 0 → 60 (every 4 steps) a
    regression, +17% a step (exit 1), and said nothing of the loss: the report of that run had the same
    setting reaching the target loss in 2.23 s against 3.10 s, after 40 steps against 60. A pair whose
    cases reach the target after different numbers of steps now says so, with each side's steps and
    training seconds to it; a pair that reaches it together says nothing."""
    from tpbench import compare, render
    from tpbench.analysis import convergence

    loaded = localsgd_settings_data().runs[0]
    reach = convergence.summarize(loaded.steps)[["case_id", "steps_to_target", "time_to_target_s"]]
    loaded = dataclasses.replace(loaded, summary=loaded.summary.merge(reach, on="case_id"))
    within = compare.within_run(loaded)
    said = {p.result.label: p.result.training for p in within.pairs}
    assert said["averaging_period: 4 → 16 (start_localSGD_iter=10)"] == (
        "does not train alike (medians over repeats): to the target loss after 30 → 40 steps, 1.82 → 2.22 s of "
        "training (held-out loss evaluated every 10 steps); the candidate ends level with the baseline (held-out "
        "loss within 0.005 nats); the step time compared does not count how far a step takes the model (the report's "
        "Convergence section has the curves)"
    )
    text = render.render_text(within)
    assert "averaging_period: 4 → 16 (start_localSGD_iter=10): does not train alike (medians over repeats)" in text
    assert json.loads(render.render_json(within))["pairs"][0]["result"]["training"].startswith("does not train")
    twins = dataclasses.replace(loaded, summary=loaded.summary.assign(steps_to_target=20.0))
    assert all(not p.result.training for p in compare.within_run(twins).pairs)
    # A side that never reached the target is said apart: "after 30 → never steps" read as a count.
    summary = loaded.summary.copy()
    summary.loc[summary["case_id"] == within.pairs[0].candidate_case, ["steps_to_target", "time_to_target_s"]] = (
        math.nan
    )
    [first, *_] = compare.within_run(dataclasses.replace(loaded, summary=summary)).pairs
    assert "to the target loss after 20 steps (2.02 s of training) for the baseline, never for the candidate (" in (
        first.result.training
    )


def test_compare_within_a_run_judges_the_held_out_loss_gap_as_the_report_does():
    """`tpbench compare RUN_DIR` of suites/localsgd.toml (2 repeats of 120 steps) said nothing of
    start_localSGD_iter never → 60 averaging every 16 steps: both reached the target after 40 steps, but
    its held-out loss ended 0.010 nats above DDP's, which the report's line for the same pair says ("ends
    0.010 nats above DDP's held-out loss"). A pair whose final held-out losses end beyond the level band
    now says so in the report's words, though it reaches the target at the same step; on the band is level."""
    from tpbench import compare
    from tpbench.analysis import convergence

    loaded = localsgd_settings_data().runs[0]
    worse = loaded.cases.loc[loaded.cases["averaging_period"] == 16, "case_id"].tolist()
    summary = loaded.summary.assign(steps_to_target=20.0, time_to_target_s=2.0)
    apart = summary.assign(final_heldout_loss=np.where(summary["case_id"].isin(worse), 1.0304, 1.02))
    within = compare.within_run(dataclasses.replace(loaded, summary=apart))
    said = {p.result.label: p.result.training for p in within.pairs}
    line = said["averaging_period: 4 → 16 (start_localSGD_iter=10)"]
    assert "the candidate ends 0.010 nats above the baseline's held-out loss;" in line
    assert convergence.ends_against(0.0104, "DDP") == "ends 0.010 nats above DDP's held-out loss"
    level = summary.assign(final_heldout_loss=np.where(summary["case_id"].isin(worse), 1.025, 1.02))
    assert all(not p.result.training for p in compare.within_run(dataclasses.replace(loaded, summary=level)).pairs)


def test_the_time_to_target_tables_losses_say_their_unit_and_a_difference_its_sign():
    """The Time to target table gave its losses without a unit (the charts above say nats) and each
    case's final loss − DDP in four significant figures, 0.0004154 and -0.0009063 in one column of
    suites/localsgd.toml's report: a precision the 0.005-nat level band makes meaningless, unaligned."""
    table = _time_to_target_table(localsgd_data())
    head = re.findall(r"<th>(.*?)</th>", table)
    for h in ("final held-out loss (nats)", "optimum (nats)", "gap to optimum (nats)", "final loss − DDP (nats)"):
        assert h in head, head
    rows = [re.findall(r"<td>(.*?)</td>", r, re.S) for r in re.findall(r"<tr>(.*?)</tr>", table, re.S)]
    [local] = [r for r in rows if r and "start_localSGD_iter=10" in r[0]]
    assert local[head.index("final loss − DDP (nats)")] == "+0.0200"


def test_plain_ddp_is_named_ddp_in_every_legend_and_table_of_the_report():
    """Post-local SGD that never switches is plain DDP: the Verdicts called it "DDP", while the
    convergence legend, the Time to target table and the step-time chart called it
    "post_localSGD_hook start_localSGD_iter=never" (11 times in this report), one more setting."""
    html = build_report(localsgd_settings_data().runs)
    assert "start_localSGD_iter=never" not in html
    assert re.search(r'"mode":"lines\+markers","name":"DDP"', html)  # the convergence legend
    assert "<td>DDP</td>" in html  # the Time to target table's first column
    assert "<td>post_localSGD_hook start_localSGD_iter=10 averaging_period=4</td>" in html


def test_report_of_several_runs_leaves_the_first_runs_own_report(tmp_path, monkeypatch):
    """`tpbench report A B` without -o wrote to A's own report path (reports/<suite>-<A>.html, where
    A's sweep had written A's report) and replaced it with the comparison."""
    a = make_run(tmp_path / "a", {"ddp": [10.0, 10.2, 9.9]})
    b = make_run(tmp_path / "b", {"ddp": [10.1, 10.0, 10.3]})
    c = make_run(tmp_path / "c", {"ddp": [10.0, 10.1, 10.2]})
    for run in (a, b, c):
        finalize(store.Run.open(run))
    monkeypatch.chdir(tmp_path)
    ids = [store.read_record(run).run_id for run in (a, b, c)]
    assert run_cli(["report", str(a)]) == 0
    own = tmp_path / "reports" / f"synthetic-{ids[0]}.html"
    before = own.read_bytes()
    assert "across-runs" not in headings(before.decode())

    assert run_cli(["report", str(a), str(b)]) == 0
    assert run_cli(["report", str(a), str(b), str(c)]) == 0
    assert own.read_bytes() == before
    pair = tmp_path / "reports" / f"synthetic-{ids[0]}-vs-{ids[1]}.html"
    assert "across-runs" in headings(pair.read_text())
    (three,) = (tmp_path / "reports").glob(f"synthetic-{ids[0]}-vs-2-runs-*.html")
    assert "across-runs" in headings(three.read_text())


def test_the_drift_chart_counts_steps_trained_as_the_loss_chart_beside_it_does():
    """A drift stored at step s is measured after that step's optimizer step, s + 1 steps in; the chart
    drew it at s on a "step" axis beside the loss chart's "steps trained", so averaging every 4 steps
    from the start read as drift at 0, 4, 8 (none trained at 0) against losses at 20, 40. And its
    legend, at the shared height below the plot, covered that axis's title."""
    from tpbench.report.convergence import _drift_figure
    from tpbench.report.figures import LEGEND_BELOW

    curves = pd.DataFrame(
        {"case": ["a"] * 3 + ["b"] * 2, "order": [0] * 3 + [1] * 2, "step": [0, 4, 8, 60, 76], "drift_max_l2": 0.5}
    )
    fig = _drift_figure(curves, {"a": "#000001", "b": "#000002"})
    assert [list(t.x) for t in fig.data] == [[1, 5, 9], [61, 77]]
    assert fig.layout.xaxis.title.text == "steps trained"
    assert fig.layout.legend.y < LEGEND_BELOW["y"]


def test_local_sgd_verdicts_name_every_setting_the_run_varies(tmp_path):
    """Post-local SGD's lines against DDP named only start_localSGD_iter and averaging_period: a run
    sweeping post_local_gradient_allreduce got two lines "post-local SGD (start_localSGD_iter=2
    averaging_period=4): ..." with different numbers, and no way to tell which case each was."""
    run = make_run(
        tmp_path,
        {"post_localSGD_hook": [20.0, 20.5]},
        world_size=4,
        defaults={"ranks_per_node": 2},
        sweep={"start_localSGD_iter": '["never", 2]', "post_local_gradient_allreduce": "[true, false]"},
        factor=lambda c: 1.0 if c.start_localSGD_iter == "never" else (0.6 if c.post_local_gradient_allreduce else 0.5),
    )
    finalize(store.Run.open(run))
    html = build_report([store.load(run)])
    for flag in ("True", "False"):
        said = f"post-local SGD (start_localSGD_iter=2 averaging_period=4 post_local_gradient_allreduce={flag}): "
        assert html.count(said) == 1, flag


def test_a_case_has_one_colour_in_the_loss_and_the_drift_charts():
    """Each convergence chart numbered its own series' colours: DDP, which never averages, has no
    drift, so every drift line took the colour of the case before it in the loss chart beside it
    (post-local SGD was red against the loss and DDP's blue against the drift)."""
    from tpbench.report import convergence
    from tpbench.report.html import Page

    data = localsgd_data(drift=True)
    page = Page(title="t")
    convergence.section(page, data, verdicts.convergence_verdicts(data))
    loss, drift = figures(page.render())
    loss_colors = {t["name"]: t["line"]["color"] for t in loss["data"] if t.get("showlegend", True)}
    assert len(set(loss_colors.values())) == 2
    [local] = drift["data"]
    assert local["line"]["color"] == loss_colors[local["name"]]


def test_the_loss_chart_marks_where_post_local_sgd_switches_in_its_own_colour():
    """The loss-per-step chart drew post-local SGD's curve with nothing at start_localSGD_iter, so a
    bend there read as noise or a learning-rate effect. A dash-dot line now marks the switch (10
    steps trained here), on the step chart only, in the case's colour; DDP gets none."""
    from tpbench.report import convergence
    from tpbench.report.html import Page

    data = localsgd_data()
    page = Page(title="t")
    convergence.section(page, data, verdicts.convergence_verdicts(data))
    html = page.render()
    assert "dash-dot: where post-local SGD switches" in html
    loss = figures(html)[0]
    [line] = [s for s in loss["layout"]["shapes"] if s["line"].get("dash") == "dashdot"]
    assert line["x0"] == line["x1"] == 10 and line["xref"] == "x"
    colors = {t["name"]: t["line"]["color"] for t in loss["data"] if t.get("showlegend", True)}
    assert line["line"]["color"] == next(c for name, c in colors.items() if "start_localSGD_iter=10" in name)


def test_express_and_plain_figures_draw_ranks_in_the_page_templates_colours(runs):
    """Figures built with plotly express took D3's palette (the report builds them without a
    template), ``go`` traces the page template's in the browser: rank 0 was blue in "Memory per rank"
    and violet in "What ZeRO saves" beside it."""
    import plotly.io as pio

    from tpbench.report.html import PAGE_TEMPLATE

    full, _ = runs
    memory = figure_after(build_report([store.load(full)]), "memory")
    colorway = [c.lower() for c in pio.templates[PAGE_TEMPLATE].layout.colorway]
    drawn = {t["name"]: t["marker"]["color"].lower() for t in memory["data"]}
    assert drawn["rank 0"] == colorway[0] and drawn["rank 1"] == colorway[1], drawn
    # ... in MiB, as "What ZeRO saves" says its bytes: the axis read "MB" of VmHWM's KiB / 1024.
    assert memory["layout"]["xaxis"]["title"]["text"] == "MiB"


def test_machine_load_lists_the_repeats_furthest_from_their_median_first_either_way(monkeypatch):
    """The noisy repeats were sorted by their signed change: one 30 % below its case's median came
    last, after those at "+0%" (and past the table's rows it was the one left out), and a change of
    -0.05 % read "-0%" beside "+0%"."""
    from tpbench.report import telemetry
    from tpbench.report.html import Page

    text = '[suite]\nname = "load"\n[defaults]\nworld_size = 2\nbackend = "gloo"\ndevice = "cpu"\nrepeats = 4\n'
    cases = expand(parse(text, "load.toml"), Machine(gpus=0))
    busy = {"load1": 3.0, "steal_pct": 0.0, "runnable": 4, "busy_cores": 64.0, "other_cores": 63.0}
    repeat_ms = [100.0, 99.9, 70.0, 105.0]  # against their median 99.95: +0.05 %, -0.05 %, -30 %, +5 %
    steps = pd.DataFrame(
        [
            {"case_id": cases[0].case_id, "repeat": r, "rank": rank, "step": s, "phase": "timed", "step_ms": ms, **busy}
            for r, ms in enumerate(repeat_ms)
            for rank in range(2)
            for s in range(3)
        ]
    )
    summary = pd.DataFrame([{"case_id": cases[0].case_id, "median_ms": 99.95, "repeat_medians_ms": repeat_ms}])
    page = Page(title="t")
    telemetry.machine_load(page, report_data.load([finished_in_memory("load", text, cases, steps, summary)]))
    rows = [re.findall(r"<td>(.*?)</td>", tr) for tr in re.findall(r"<tr>(.*?)</tr>", page.render(), re.S)]
    assert [(r[1], r[2]) for r in rows if r] == [("2", "-30%"), ("3", "+5%"), ("0", "+0%"), ("1", "+0%")]
    # Past the table's rows, one repeat left out is one repeat: it read "1 more noisy repeats not listed."
    monkeypatch.setattr(telemetry, "MAX_NOISY_ROWS", 3)
    page = Page(title="t")
    telemetry.machine_load(page, report_data.load([finished_in_memory("load", text, cases, steps, summary)]))
    assert "1 more noisy repeat not listed." in page.render()


def test_a_waterfall_leaves_room_above_its_highest_bar_for_that_bars_label():
    """Plotly's value axis ended at the highest level the bars reach, so a part's label drawn above a
    bar there was cut in half ("+2.84" over a run of increases ending at 110 ms), and a long case's
    one-line title ran under the chart's tool buttons."""
    from tpbench.analysis.explain import Component, Explanation
    from tpbench.explain import CaseExplanation
    from tpbench.report import waterfall

    parts = [("compute", 12.0), ("exposed_comm", 5.6), ("optimizer", -0.9), ("idle", 4.6), ("straggler_wait", 2.8)]
    explanation = Explanation(
        base_ms=86.6,
        cand_ms=110.7,
        delta_ms=24.1,
        lo=-29.7,
        hi=53.9,
        base_steps=6,
        cand_steps=6,
        components=[Component(name, d, d - 10, d + 10) for name, d in parts],
    )
    case = CaseExplanation("c1", "hook_with_zero_step shard_buckets=False", "c1", "c1", explanation, 24.1, explanation)
    fig = waterfall._waterfall("B", case)
    low, high = fig.layout.yaxis.range
    assert low == 0 and high >= 1.1 * 110.7  # the running sum's highest level is the candidate's 110.7 ms
    assert fig.layout.yaxis.title.text == "ms per step"
    assert fig.layout.title.text.split("<br>") == [
        f"B, {case.label}",
        "step time (ms), baseline → candidate",
    ]


def test_the_collectives_chart_colours_each_algorithm_as_the_step_time_chart_does(runs):
    """Plotly colours a series in the order it first appears: the collectives, grouped by case id (a
    hash), put zero_no_overlap first, so it took the colour plain DDP has in the step-time chart."""
    full, _ = runs
    html = build_report([store.load(full)])
    step_time = {t["name"]: t["line"]["color"] for t in figure_after(html, "step-time")["data"]}
    collectives = {t["name"].split(" ")[0]: t["marker"]["color"] for t in figure_after(html, "collectives")["data"]}
    assert len(collectives) > 1 and all(step_time[algo] == color for algo, color in collectives.items()), (
        step_time,
        collectives,
    )


def test_the_overlap_legend_lists_the_parts_in_the_order_the_bars_stack_them(runs):
    """Plotly lists a stacked bar chart's legend in reverse ("traceorder" defaults to "reversed"
    under barmode "stack"), right for a vertical stack, but these bars stack left to right under a
    horizontal legend that then read "idle, exposed comm, overlapped, compute only"."""
    full, _ = runs
    fig = figure_after(build_report([store.load(full)]), "overlap")
    assert fig["layout"]["barmode"] == "stack"
    stacked = [t["name"] for t in fig["data"] if t["type"] == "bar"]
    assert stacked == ["compute only", "overlapped", "exposed comm", "idle"]
    assert fig["layout"]["legend"].get("traceorder") == "normal", fig["layout"]["legend"]


def test_the_collectives_chart_tells_the_settings_of_one_algorithm_apart(runs):
    """Coloured by algorithm with a symbol per collective, every case of one algorithm (post-local
    SGD's periods, packed and unpacked zero_no_overlap) drew the same marker: one trace per
    algorithm and collective, told apart only by hovering. Now each case and collective has its own
    legend entry, named by the case's label, and a symbol no other of its algorithm's has."""
    full, _ = runs
    traces = figure_after(build_report([store.load(full)]), "collectives")["data"]
    by_color: dict[str, list[tuple[str, str]]] = {}
    for t in traces:
        by_color.setdefault(t["marker"]["color"], []).append((t["name"], t["marker"]["symbol"]))
    hooks = [entries for entries in by_color.values() if entries[0][0].startswith("hook_with_zero_step ")]
    assert len(hooks) == 1 and len(hooks[0]) > 1, by_color  # its four cases, each its own entry
    for entries in by_color.values():
        names, symbols = zip(*entries)
        assert len(set(names)) == len(names) and len(set(symbols)) == len(symbols), entries
        assert all(name.endswith(", allreduce") for name in names), names


def test_the_collectives_chart_labels_its_byte_axis_as_sizes(runs):
    """Plotly labelled a log axis of bytes "5, 1000, 2, 5, 10k": the "5" before "1000" meant 500 bytes.
    One tick a decade, each a size ("100 B", "1 kB", "10 MB")."""
    from tpbench.report.figures import log_byte_ticks

    assert log_byte_ticks([500, 4000, 2.5e7]) == {
        "tickvals": [1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8],
        "ticktext": ["100 B", "1 kB", "10 kB", "100 kB", "1 MB", "10 MB", "100 MB"],
    }
    assert log_byte_ticks([]) == {}
    full, _ = runs
    axis = figure_after(build_report([store.load(full)]), "collectives")["layout"]["xaxis"]
    assert axis["type"] == "log" and axis["ticktext"] and all(t.endswith("B") for t in axis["ticktext"]), axis


@pytest.mark.parametrize("sizes", [[16640, 20800], [20800], [5100, 9900], [7, 7.5]])
def test_a_byte_axis_within_one_decade_still_shows_two_labelled_ticks(sizes):
    """A 2-rank MLP's DDP buckets of 16.6 and 20.8 kB drew the collectives chart with no label on its
    x axis: its ticks were 10 kB and 100 kB, both outside plotly's range. The axis now sets its range
    around the sizes and ticks inside it."""
    from tpbench.report.figures import log_byte_ticks

    axis = log_byte_ticks(sizes)
    lo, hi = axis["range"]
    assert lo < math.log10(min(sizes)) and math.log10(max(sizes)) < hi, axis
    inside = [t for t in axis["tickvals"] if lo <= math.log10(t) <= hi]
    assert len(inside) >= 2 and len(axis["ticktext"]) == len(axis["tickvals"]), axis


def test_the_timeline_draws_a_step_as_the_overlap_figures_count_it():
    """A Gloo collective's range often ends after its step has (its end is recorded once the worker
    thread runs again): the timeline drew it whole, past the step's end, and left it out of the next
    step, which the overlap figures count it in. Each rank's bars are now its intervals cut to its span
    of the step, and their union per lane is what ``overlap.step_overlap`` counts."""
    from tpbench.analysis.overlap import step_overlap, union
    from tpbench.report.timelines import _gantt_figure, _step_pieces

    ms = 1_000_000
    spans = [
        (rank, step, 20 * step * ms + rank * ms, 20 * (step + 1) * ms + rank * ms) for rank in (0, 1) for step in (0, 1)
    ]
    steps = pd.DataFrame(spans, columns=["rank", "step", "start_ns", "end_ns"])
    rows = []
    for rank, step, lo, hi in spans:
        rows += [
            (rank, step, "compute", "aten::mm", lo, lo + 8 * ms),
            (rank, step, "optimizer", "tpbench.optimizer", hi - 3 * ms, hi - ms),
        ]
        rows.append((rank, step, "comm", "gloo:all_reduce", lo + 6 * ms, hi + 5 * ms))  # into the next step
    iv = pd.DataFrame(rows, columns=["rank", "step", "lane", "name", "start_ns", "end_ns"])
    marks = steps.rename(columns={"step": "index"}).assign(kind="step")
    counted = step_overlap(iv, steps).set_index(["rank", "step"])
    fig = _gantt_figure(_step_pieces(iv, marks, 1))
    origin = steps.loc[steps["step"] == 1, "start_ns"].min()
    for rank, _, lo, hi in (s for s in spans if s[1] == 1):
        bars = [
            (origin + b * ms, origin + (b + w) * ms)
            for t in fig.data
            if t.name == "comm"
            for y, b, w in zip(t.y, t.base, t.x)
            if y == f"rank {rank} · comm"
        ]
        assert all(lo - 1 <= s and e <= hi + 1 for s, e in bars), (rank, bars, lo, hi)
        us, ue = union(np.array([round(s) for s, _ in bars]), np.array([round(e) for _, e in bars]))
        assert abs(int((ue - us).sum()) - counted.loc[(rank, 1), "comm_ns"]) <= 2, (rank, bars)


def test_the_overlap_bars_add_up_to_the_traced_step(tmp_path):
    """On a real H200 capture (GPU memcpy kernels beside compute and NCCL-less Gloo comm) the stacked
    bars, compute only + overlapped + exposed + idle, fell short of the traced step by the copies,
    up to 2 ms of a 57 ms step, with nothing to say what was missing. The stack now has "other work",
    and sums to the table's step ms (traced)."""
    run = shutil.copytree(Path(__file__).parent / "fixtures" / "runs" / "h200_gloo2_capture", tmp_path / "run")
    html = build_report([store.load(run)])
    fig = figure_after(html, "overlap")
    bars = [t for t in fig["data"] if t["type"] == "bar"]
    assert "other work" in [t["name"] for t in bars]
    stacked = np.sum([_plotted(t["x"]) for t in bars], axis=0)
    per_step = store.read_case_tables(store.load(run), "overlap")
    spans = per_step.groupby("case_id")["span_ns"].mean() / 1e6
    assert sorted(np.round(stacked, 6)) == sorted(np.round(spans.to_numpy(), 6)), (stacked, spans)


def _plotted(values: list | dict) -> np.ndarray:
    """A figure's array as plotly's JSON holds it: a list, or base64 bytes with their dtype."""
    if isinstance(values, dict):
        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"])
    return np.asarray(values, dtype=float)


def test_the_overlap_table_says_its_compute_and_comm_include_the_overlapped_part(runs):
    """The paragraph above spoke of "compute that ran alone" while the table's "compute ms" held all of
    it, overlapped part included (compute ms ≥ overlapped ms in every row); and the table's overlap %
    (every traced step) differed from summary.parquet's overlap_pct (HTA's window) unexplained."""
    full, _ = runs
    html = build_report([store.load(full)])
    section = html[html.index('id="overlap"') :]
    section = section[: section.index("<h2", 10)]
    assert "<th>compute ms (with overlapped)</th>" in section and "<th>comm ms (with overlapped)</th>" in section
    assert "overlap_pct, as Holistic Trace Analysis counts it, leaves out the last" in section
    body = section[section.index("<table") : section.index("</table>")]
    head = re.findall(r"<th>(.*?)</th>", body)
    rows = [re.findall(r"<td>(.*?)</td>", r, re.S) for r in re.findall(r"<tr>(.*?)</tr>", body, re.S)]
    table = pd.DataFrame([r for r in rows if r], columns=head)
    for col in ("compute ms (with overlapped)", "comm ms (with overlapped)"):
        ms = {c: table[c].str.replace(",", "").astype(float) for c in (col, "overlapped ms")}
        assert (ms[col] >= ms["overlapped ms"]).all(), table


def test_the_overlap_table_says_its_optimizer_column_is_the_optimizers_ranges_whatever_ran_there(runs):
    """ "optimizer ms" is the time inside the optimizer's ranges, communication there included: zero.toml's
    zero_no_overlap at 0.5 MB read 41.4 ms of it beside 16.3 ms of compute in a 71.2 ms step whose stack
    (compute, exposed comm, idle) it is no part of, and tpbench explain's optimizer part, the compute
    there alone, read a few ms for the same steps. Nothing said so."""
    from html import unescape

    full, _ = runs
    html = build_report([store.load(full)])
    section = html[html.index('id="overlap"') :]
    section = unescape(" ".join(section[: section.index("<h2", 10)].split()))
    assert "<th>optimizer ms</th>" in section
    assert "optimizer ms is the time inside the optimizer's ranges" in section
    assert "no part of the stack" in section and "explain's optimizer part" in section


def test_report_refuses_a_copy_of_a_run_it_was_given(runs, tmp_path, capsys):
    """A copy of a run (another folder, the same run id) is the same run given twice: the report
    tagged both "B" and compared the run with itself, every ratio exactly 1."""
    full, _ = runs
    copy = shutil.copytree(full, tmp_path / "copy")
    out = tmp_path / "cmp.html"
    assert run_cli(["report", str(full), str(copy), "-o", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{copy}: the same run as {full}" in err and "a copy" in err and not out.exists()


def test_across_runs_names_the_first_runs_cases_a_later_run_lacks(tmp_path):
    """A later run made with another --filter lacks some of the first run's cases: the Across runs
    section names them, where its table, a row per case of the later run, left them out."""
    base = make_run(tmp_path / "b", {"ddp": [10.0, 10.2, 9.9], "zero_no_overlap": [12.0, 12.1, 11.9]})
    cand = make_run(tmp_path / "c", {"ddp": [10.1, 10.0, 9.8]}, seed=1)
    html = build_report([finalize(store.Run.open(run)) for run in (base, cand)], tmp_path)
    said = re.search(r"Not in run B [^(]*\(cases of run A [^)]* it did not run, not judged\): ([^<]*)</p>", html)
    assert said is not None and said.group(1) == "zero_no_overlap."


def test_a_single_runs_step_time_bars_sit_on_their_own_labels(tmp_path):
    """One run, no bucket-size axis: a bar per case, coloured by algorithm. Grouped, each label kept a
    slot for every algorithm's trace and its one bar sat beside the label, a third of a row off with
    three algorithms; overlaid, each bar is centred on its case."""
    medians = {"ddp": [10.0, 10.2], "zero_no_overlap": [12.0, 12.1], "hook_with_zero_step": [11.0, 11.1]}
    run = finalize(store.Run.open(make_run(tmp_path / "r", medians)))
    fig = figure_after(build_report([run], tmp_path), "step-time")
    assert len(fig["data"]) == 3 and all(len(trace["y"]) == 1 for trace in fig["data"])
    assert fig["layout"]["barmode"] != "group"


def test_the_crossover_table_gives_ratios_and_intervals_two_decimals_as_the_page_does():
    """Its ratio columns were plain floats at the page's three significant figures, "0.81", "1.1" and
    "1.2" in one row where every other table and the heatmaps write "[0.86, 1.20]"; its interval now
    sits in one "95% CI" column as in the All comparisons table."""
    from tpbench.report.interconnect import _crossover_table

    points = pd.DataFrame(
        {
            "interconnect": ["loopback", "tcp-1gbit"],
            "bucket_cap_mb": [4.0, 4.0],
            "allreduce_bytes_per_step": [3.71e6] * 2,
            "comm_compute": [3.0, 4.5],
            "sequential_ms": [40.0, 80.0],
            "interleaved_ms": [40.4, 90.0],
            "ratio": [1.0, 1.1234],
            "ratio_lo": [0.81, np.nan],
            "ratio_hi": [1.2, np.nan],
            "half_width": [0.19, np.nan],
        }
    )
    table = _crossover_table(points, [])
    assert list(table.columns[-3:]) == ["ratio", "95% CI", "resolves"]
    assert table[["ratio", "95% CI", "resolves"]].values.tolist() == [
        ["1.00", "[0.81, 1.20]", "±19.0%"],
        ["1.12", "", "one repeat"],
    ]
    # Points of one comm:compute in the order of their other keys: zero.toml's 4 MB rows read True, False.
    tied = points.assign(comm_compute=3.0, shard_buckets=[True, False])
    assert _crossover_table(tied, ["shard_buckets"])["shard_buckets"].tolist() == [False, True]


def test_a_ratio_and_its_interval_stay_together_in_a_table_cell():
    """The attribution table's "from packing" cell broke between "0.30×" and "[0.23, 0.40]" in a narrow
    column, the interval alone on the next line as if a cell of its own; the figure and its interval
    are one unbreakable run (``html.Page.table``), a word before an interval is left to wrap."""
    from tpbench.report.html import Page

    page = Page(title="t")
    cells = ["0.30× [0.23, 0.40]", "32.3 [20.4, 127.5]", "+3.1% [+1.0%, +5.2%]", "faster [0.86, 0.97]"]
    page.table(pd.DataFrame({"c": cells}))
    spans = re.findall(r'<span class="interval">(.*?)</span>', page.render())
    assert spans == ["0.30× [0.23, 0.40]", "32.3 [20.4, 127.5]", "+3.1% [+1.0%, +5.2%]", "[0.86, 0.97]"]


def test_what_zero_saves_of_one_zero_case_gives_its_figures_once():
    """smoke.toml has one ZeRO case, and "What ZeRO saves" said "0.0391 MiB (45 % saved) at best
    (zero_no_overlap) and 0.0391 MiB (45 % saved) at worst (zero_no_overlap)"; two cases keep both."""
    from tpbench.report import zero_memory

    row = {"run_id": "r", "run": "A", "algorithm": "zero_no_overlap", "sharded": True, "ranks": 2, "bucket_cap_mb": 1.0}
    one = pd.DataFrame([row | {"label": "zero_no_overlap", "state_max_bytes": 41_000.0, "state_saved_pct": 45.0}])
    one["ddp_state_bytes"] = 74_000.0
    [said] = zero_memory._sentences(one, [])
    assert "ZeRO holds 0.0391 MiB (45 % saved) (zero_no_overlap); an even split over 2 ranks would save 50 %." in said
    two = pd.concat([one, one.assign(label="hook_with_zero_step", state_max_bytes=52_000.0, state_saved_pct=30.0)])
    [said] = zero_memory._sentences(two.reset_index(drop=True), [])
    assert "(45 % saved) at best (zero_no_overlap) and 0.0496 MiB (30 % saved) at worst (hook_with_zero_step)" in said
    # Its opening words start a sentence: "on loopback: Plain DDP holds …" read as a fragment.
    [said] = zero_memory._sentences(one.assign(interconnect="loopback"), ["interconnect"])
    assert said.startswith("On loopback: Plain DDP holds 0.0706 MiB"), said


FOUR_LINKS = '["loopback", "tcp-2.5gbit", "tcp-1gbit", "tcp-500mbit"]'


def _links_shown(page: str, pattern: str) -> list[str]:
    return list(dict.fromkeys(re.findall(pattern, page)))


@pytest.mark.parametrize(
    "links", [FOUR_LINKS, '["tcp-500mbit", "tcp-1gbit", "loopback"]'], ids=["fastest-first", "slowest-first"]
)
def test_a_runs_links_are_listed_in_its_suites_order(links):
    """Sorted by name, crossover.toml's links read loopback, tcp-1gbit, tcp-2.5gbit, tcp-500mbit in the
    step-time chart, the tables and the Verdicts: 2.5 Gbit/s between 1 Gbit/s and 500 Mbit/s. They are
    listed as the suite lists them, slowest first where it does."""
    suite = ZERO_SUITE.replace('["loopback", "tcp-1gbit"]', links)
    loaded = in_memory_run(suite, zero_medians)
    data = report_data.load([loaded])
    want = json.loads(links)
    for _, grp in data.cases.groupby("algo", sort=False):
        assert list(dict.fromkeys(grp["interconnect"])) == want
    page = build_report([loaded])
    assert _links_shown(page, r"interleaved vs sequential on ([\w.-]+)") == want


def _links_run(links: str, run_id: str) -> store.Loaded:
    return in_memory_run(ZERO_SUITE.replace('["loopback", "tcp-1gbit"]', links), zero_medians, run_id=run_id)


def _links_per_run(runs: list[store.Loaded]) -> list[list[str]]:
    cases = report_data.load(runs).cases
    return [list(g["interconnect"].drop_duplicates()) for _, g in cases.groupby("run_id", sort=False)]


def test_links_of_runs_whose_suites_list_them_apart_are_listed_by_rate():
    """Runs of suites that list their links in orders that do not agree are listed by rate, fastest
    first, loopback (no tbf rate) before every emulated link; runs of one suite keep its order, and
    so do runs of suites that list a part of another's links in its order."""
    a = _links_run('["tcp-1gbit", "loopback"]', "20260101T000000Z-aaaaaa")
    b = _links_run('["tcp-500mbit", "tcp-2.5gbit"]', "20260102T000000Z-bbbbbb")
    assert _links_per_run([a, b]) == [["loopback", "tcp-1gbit"], ["tcp-2.5gbit", "tcp-500mbit"]]
    four = _links_run(FOUR_LINKS, "20260103T000000Z-cccccc")
    assert _links_per_run([a, four])[1] == ["loopback", "tcp-2.5gbit", "tcp-1gbit", "tcp-500mbit"]
    c = _links_run('["tcp-500mbit", "loopback"]', "20260104T000000Z-dddddd")
    d = _links_run('["tcp-500mbit", "tcp-1gbit", "loopback"]', "20260105T000000Z-eeeeee")
    assert _links_per_run([c, d]) == [["tcp-500mbit", "loopback"], ["tcp-500mbit", "tcp-1gbit", "loopback"]]


def test_what_zero_saves_says_its_links_in_the_reports_order():
    """ "What ZeRO saves" grouped its sentences sorted by run id and value: on loopback, on tcp-1gbit,
    on tcp-2.5gbit, on tcp-500mbit, where every other section lists crossover.toml's links as the
    suite does; its sentences follow the cases' order (``ReportData.cases``), runs as given."""
    from tpbench.report import zero_memory

    links = json.loads(FOUR_LINKS)
    row = {"algorithm": "hook_with_zero_step", "sharded": True, "ranks": 2, "bucket_cap_mb": 2.0, "buckets": 2}
    row |= {"state_max_bytes": 41_000.0, "state_saved_pct": 45.0, "ddp_state_bytes": 74_000.0, "shard_buckets": False}
    row |= {"stepped_min": 1, "busiest_share_pct": 67.0, "imbalance": 1.34, "label": "hook_with_zero_step"}
    cases = pd.DataFrame([row | {"run_id": run, "run": run, "interconnect": link} for run in "BA" for link in links])
    said = zero_memory._sentences(cases, ["interconnect"])
    found = [re.match(r"(\w): (?:ZeRO hooks at 2 MB buckets )?[Oo]n ([\w.-]+)", s).groups() for s in said]
    assert found == [(run, link) for run in "BA" for link in links] * 2


def test_the_collectives_chart_draws_each_emulated_links_rate_as_its_ceiling(tmp_path):
    """No busbw measured on a tbf-shaped link can lie above its rate, yet nothing on the chart said where
    that was: broadcasts timed on their root read 2.41 GB/s on a 0.125 GB/s link and looked like any other
    point. A dotted line marks each emulated link's rate; loopback, unshaped, has none."""
    import plotly.graph_objects as go

    from tpbench.report import timelines

    run = make_run(tmp_path / "links", {"ddp": [10.0, 10.1]}, sweep={"interconnect": '["loopback", "tcp-1gbit"]'})
    data = report_data.load([finalize(store.Run.open(run))])
    fig = go.Figure()
    timelines._link_ceilings(fig, data, pd.DataFrame({"case_id": data.done["case_id"]}))
    [line] = fig.layout.shapes
    assert line.y0 == line.y1 == 0.125 and line.line.dash == "dot"
    assert [a.text for a in fig.layout.annotations] == ["tcp-1gbit: 0.125 GB/s"]


def test_a_step_time_points_hover_says_the_confidence_its_interval_holds():
    """The step-time chart's hover headed every interval "95% CI (ms)"; with 2 to 5 repeats it is their range,
    which holds the median with less confidence (75 % with 3), as the caption above it says."""
    from tpbench import verdict
    from tpbench.report import performance

    assert performance._interval_hover(9.8, 10.4, 3) == "[9.8, 10.4] (the range of 3 repeats: 75%)"
    assert performance._interval_hover(9.8, 10.4, 12) == "[9.8, 10.4] (95%)"
    assert performance._interval_hover(9.8, 10.4, None) == "[9.8, 10.4] (95%)"  # an older run: no repeat values
    assert performance._interval_hover(math.nan, math.nan, 1) == "none (one repeat)"
    frame = pd.DataFrame({"repeat_medians_ms": [[1.0, 2.0, 3.0], None, np.array([1.0] * 6)]})
    assert verdict.repeat_counts(frame) == [3, None, 6]


def test_gpu_telemetrys_absence_says_for_how_many_cases():
    """zero.toml's 18 CPU cases read "No NVML samples in this report: the case runs on CPU: no GPU to
    sample.", as if of one case; the reason now says how many cases it holds for."""
    from types import SimpleNamespace as NS

    from tpbench.report import telemetry
    from tpbench.report.html import Page

    def case(reason):
        return NS(capture=NS(nvml=NS(available=False, reason=reason)))

    cpu = "the case runs on CPU: no GPU to sample"
    runs = [NS(record=NS(cases={str(i): case(cpu) for i in range(18)}))]
    data = NS(runs=runs, representative=lambda table: [])
    page = Page(title="t")
    telemetry.nvml(page, data)
    assert f"No NVML samples in this report: {cpu} (all 18 cases)." in page.render()
    runs[0].record.cases["0"] = case("no NVML driver")
    page = Page(title="t")
    telemetry.nvml(page, data)
    assert f"no NVML driver (1 case of 18); {cpu} (17 cases of 18)." in page.render()


def test_a_waterfalls_line_says_where_its_traced_change_is_off_the_timed_one():
    """`tpbench explain A B` warned that a case's traced change was off its timed one ("+0.87 vs -21.41 ms: the
    traced steps did not run as the timed ones"), so its parts are a weak guide to the change; the report of
    the same two runs gave the same case's line and waterfall without the warning. The line now carries it."""
    from tpbench.analysis.explain import Component, Explanation
    from tpbench.explain import CaseExplanation
    from tpbench.report import waterfall

    def explanation(base: float, cand: float) -> Explanation:
        d = cand - base
        return Explanation(base, cand, d, d - 5, d + 5, 3, 3, [Component("compute", d, d - 5, d + 5)])

    timed, traced = explanation(99.49, 78.08), explanation(113.36, 114.23)
    off = CaseExplanation("c1", "zero_no_overlap", "c1", "c1", timed, timed.delta_ms, traced)
    line = waterfall.case_line("B", off)
    assert off.unlike_timed and line == f"B, zero_no_overlap: {off.top} Warning: {off.unlike_timed}."
    assert "+0.87 vs -21.41 ms" in line
    alike = CaseExplanation("c1", "zero_no_overlap", "c1", "c1", timed, timed.delta_ms, timed)
    assert waterfall.case_line("B", alike) == f"B, zero_no_overlap: {alike.top}"


def _collectives_of_unknown_group_size(tmp_path: Path, broadcast: bool) -> report_data.ReportData:
    """A run whose traced all-reduces have bytes and times but no group size (post-local SGD after its
    switch, on Gloo): their busbw is NaN, as ``collective_bandwidth`` leaves it; with ``broadcast`` also a
    broadcast, whose busbw needs no group size."""
    from tpbench.analysis.bandwidth import COLLECTIVE_BANDWIDTH_COLUMNS

    run = make_run(tmp_path / "run", {"post_localSGD_hook": [10.0, 10.1]})
    rows = [
        (None, "allreduce", 0, 1, 4_000_000, None, 4, 4_000_000, 4_100_000, 1.0, np.nan),
        (None, "allreduce", 1, 1, 4_000_000, None, 4, 5_000_000, 5_100_000, 0.8, np.nan),
    ]
    if broadcast:
        rows.append((None, "broadcast", 0, 1, 4_000_000, None, 4, 4_000_000, 4_000_000, 1.0, 1.0))
    table = pd.DataFrame(rows, columns=list(COLLECTIVE_BANDWIDTH_COLUMNS)).astype(
        {"bytes": "Int64", "group_size": "Int64"}
    )
    opened = store.Run.open(run)
    for cid in opened.record.cases:
        store.write_case_table(run, cid, "collectives", table)
    return report_data.load([finalize(opened)])


@pytest.mark.parametrize("broadcast", [False, True])
def test_collectives_of_unknown_group_size_say_so(tmp_path, broadcast):
    """The all-reduces' busbw was NaN for want of a group size: the chart fell back to transfer times
    saying the traces record no message sizes (they do), or, beside a broadcast's busbw, left them out
    unsaid; the table's busbw cell was blank beside known bytes. The reason is the group size, and the
    cell says unknown."""
    from tpbench.report import timelines
    from tpbench.report.html import Page

    page = Page("t")
    timelines.bandwidth(page, _collectives_of_unknown_group_size(tmp_path, broadcast))
    body = page.render()
    assert "record no input shapes" not in body and "do not record message sizes" not in body
    assert "several sizes" in body
    assert ("Left out of the chart: 2 instances" in body) == broadcast
    row = re.search(r"<td>allreduce</td>\s*<td>2</td>\s*<td>([^<]+)</td>\s*<td>([^<]+)</td>\s*<td>([^<]+)</td>", body)
    assert row, body
    assert row[2] == "4000000" and row[3] == "unknown: group size"
    assert not re.search(r">\s*nan\s*<", body, re.IGNORECASE)


def test_the_busbw_axis_starts_at_zero(tmp_path):
    """Around a single point (a DDP case's one all-reduce size) plotly centred the axis on it, and the
    chart's busbw axis ran down to -0.75 GB/s: a bandwidth is never negative."""
    from tpbench.report import timelines
    from tpbench.report.html import Page

    data = _collectives_of_unknown_group_size(tmp_path, broadcast=True)
    df = data.with_cases(data.table("collectives"))
    fig = timelines._busbw(Page("t"), data, df.assign(time_ms=df["time_ns"] / 1e6))
    assert fig.layout.yaxis.rangemode == "tozero"
