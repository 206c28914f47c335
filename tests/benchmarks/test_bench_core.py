"""tpbench's own speed: suite expansion, summary statistics, gate verdicts, trace analysis.

These guard the parts of tpbench that grow with the size of a sweep rather than with the
hardware: a 2000-case grid must expand in well under a second, a long sweep's steps must
summarise in seconds, a gate must judge a case in milliseconds, and trace analysis must keep up
with traces of hundreds of MB. ``make test`` runs each body once (``--benchmark-disable``) so
they also stay correct; ``make bench`` times them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tpbench.analysis.stats import hierarchical_ratio_ci, summarize
from tpbench.suite import Machine, expand, parse

FIXTURE_TRACES = Path(__file__).resolve().parent.parent / "fixtures" / "traces" / "gloo2"

LARGE_SUITE = """\
[suite]
name = "large"
[defaults]
world_size = 2
backend = "gloo"
device = "cpu"
[sweep]
algorithm = ["ddp", "zero_no_overlap", "hook_with_zero_step", "hook_with_zero_step_interleaved", "post_localSGD_hook"]
bucket_cap_mb = [1, 2, 4, 8, 16, 25, 50, 100]
shard_buckets = [false, true]
seed = [0, 1, 2, 3, 4]
lr = [0.001, 0.01, 0.1]
start_localSGD_iter = [0, 10, 20]
"""


def test_expand_large_suite(benchmark) -> None:
    suite = parse(LARGE_SUITE, "large.toml")
    machine = Machine(gpus=0)
    cases = benchmark(expand, suite, machine)
    # Irrelevant dimensions collapse: shard_buckets only for the ZeRO hooks, start_localSGD_iter
    # only for post-local SGD; every remaining case is distinct.
    assert len({c.case_id for c in cases}) == len(cases)
    assert 1000 < len(cases) < 5 * 8 * 2 * 5 * 3 * 3
    benchmark.extra_info["cases"] = len(cases)


def _steps_frame(cases: int, repeats: int, ranks: int, steps: int, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    idx = pd.MultiIndex.from_product(
        [range(cases), range(repeats), range(ranks), range(steps)], names=["case", "repeat", "rank", "step"]
    ).to_frame(index=False)
    idx["case_id"] = "c" + idx.pop("case").astype(str)
    idx["phase"] = np.where(idx["step"] < 3, "warmup", "timed")
    idx["step_ms"] = rng.lognormal(np.log(10), 0.1, len(idx))
    idx["peak_rss_mb"] = 500.0
    case_table = pd.DataFrame(
        {"case_id": [f"c{i}" for i in range(cases)], "status": "done", "batch_size": 32, "world_size": ranks}
    )
    return idx, case_table


@pytest.mark.ranks
def test_summarize_long_sweep(benchmark) -> None:
    """100 cases × 10 repeats × 2 ranks × 40 steps: 80k rows, a long sweep's worth."""
    steps, cases = _steps_frame(100, 10, 2, 40)
    summary = benchmark(summarize, steps, cases)
    assert len(summary) == 100 and summary["median_ms"].between(8, 12).all()
    benchmark.extra_info["rows"] = len(steps)


def test_gate_verdict_per_case(benchmark) -> None:
    """One case's interval against 5 stored baselines of 10 repeats: the two-stage bootstrap,
    4000 draws, is the costly path of ``tpbench compare`` (a gate's paired t interval is not)."""
    rng = np.random.default_rng(0)
    base = [rng.lognormal(np.log(10), 0.05, 10) for _ in range(5)]
    cand = [rng.lognormal(np.log(11), 0.05, 10)]
    r = benchmark(hierarchical_ratio_ci, base, cand)
    assert r.lo < r.ratio < r.hi and r.ratio > 1.05


@pytest.mark.skipif(not FIXTURE_TRACES.is_dir(), reason="no trace fixture in tests/fixtures/traces/gloo2")
def test_trace_analysis_throughput(benchmark) -> None:
    """Parse a real 2-rank Gloo trace, per-step overlap and per-collective bandwidth."""
    timeline = pytest.importorskip("tpbench.analysis.timeline", reason="trace analysis not present")
    from tpbench.analysis.bandwidth import collective_bandwidth
    from tpbench.analysis.overlap import step_overlap

    def analyse() -> tuple[int, int]:
        tl = timeline.read_traces(FIXTURE_TRACES)
        per_step = step_overlap(tl.intervals, tl.steps)
        bw = collective_bandwidth(tl.intervals)
        return len(tl.intervals), len(per_step) + len(bw)

    intervals, rows = benchmark(analyse)
    assert intervals > 0 and rows > 0
    benchmark.extra_info["intervals"] = intervals
    benchmark.extra_info["trace_bytes"] = sum(p.stat().st_size for p in FIXTURE_TRACES.glob("*.json.gz"))
