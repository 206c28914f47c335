"""Overlap arithmetic on hand-built intervals with known answers, and against brute force."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tpbench.analysis.overlap import (
    STEP_OVERLAP_COLUMNS,
    hta_overlap_pct,
    overlap_totals,
    step_overlap,
    union,
)
from tpbench.analysis.timeline import read_traces

FIXTURE = Path(__file__).parent / "fixtures" / "traces" / "gloo2"


def frame(*rows: tuple[str, int, int], rank: int = 0) -> pd.DataFrame:
    """Intervals as (lane, start, end) on one rank."""
    return pd.DataFrame(
        {
            "rank": [rank] * len(rows),
            "lane": [r[0] for r in rows],
            "start_ns": [r[1] for r in rows],
            "end_ns": [r[2] for r in rows],
        }
    )


def steps(*spans: tuple[int, int], rank: int = 0) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "rank": rank,
            "step": range(1, len(spans) + 1),
            "start_ns": [s for s, _ in spans],
            "end_ns": [e for _, e in spans],
        }
    )


def metrics(iv: pd.DataFrame, st: pd.DataFrame) -> list[dict]:
    cols = ["compute_ns", "comm_ns", "overlap_ns", "exposed_comm_ns", "idle_ns", "overlap_pct"]
    return step_overlap(iv, st)[cols].to_dict("records")


def test_union_merges_nested_touching_and_duplicate_intervals() -> None:
    s, e = union(np.array([10, 0, 5, 30, 30, 40]), np.array([20, 10, 8, 35, 35, 40]))
    assert s.tolist() == [0, 30, 40] and e.tolist() == [20, 35, 40]
    s, e = union(np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    assert s.tolist() == [] and e.tolist() == []


def test_nested_intervals_count_once() -> None:
    iv = frame(("compute", 0, 100), ("compute", 10, 20), ("compute", 30, 90), ("comm", 50, 150))
    assert metrics(iv, steps((0, 200))) == [
        {"compute_ns": 100, "comm_ns": 100, "overlap_ns": 50, "exposed_comm_ns": 50, "idle_ns": 50, "overlap_pct": 50.0}
    ]


def test_several_streams_and_threads() -> None:
    iv = frame(("compute", 0, 40), ("compute", 30, 70), ("comm", 60, 100), ("comm", 90, 120))
    assert metrics(iv, steps((0, 150))) == [
        {
            "compute_ns": 70,
            "comm_ns": 60,
            "overlap_ns": 10,
            "exposed_comm_ns": 50,
            "idle_ns": 30,
            "overlap_pct": pytest.approx(100 / 6),
        }
    ]


def test_gaps_in_compute_under_one_collective() -> None:
    iv = frame(("compute", 0, 10), ("compute", 20, 30), ("comm", 5, 25))
    assert metrics(iv, steps((0, 40))) == [
        {"compute_ns": 20, "comm_ns": 20, "overlap_ns": 10, "exposed_comm_ns": 10, "idle_ns": 10, "overlap_pct": 50.0}
    ]


def test_intervals_cut_at_step_boundaries() -> None:
    """A step's numbers see only the part of an interval inside its span; a gap between steps
    and time outside every step count nowhere."""
    iv = frame(("compute", 50, 150), ("comm", 90, 130), ("comm", 95, 96), ("compute", 300, 400), ("comm", -50, -10))
    st = steps((0, 100), (120, 200))
    assert metrics(iv, st) == [
        {"compute_ns": 50, "comm_ns": 10, "overlap_ns": 10, "exposed_comm_ns": 0, "idle_ns": 50, "overlap_pct": 100.0},
        {"compute_ns": 30, "comm_ns": 10, "overlap_ns": 10, "exposed_comm_ns": 0, "idle_ns": 50, "overlap_pct": 100.0},
    ]


def test_memcpy_and_other_are_busy_optimizer_ranges_are_not() -> None:
    iv = frame(("memcpy", 0, 10), ("other", 20, 30), ("optimizer", 0, 100), ("compute", 40, 60))
    out = step_overlap(iv, steps((0, 100))).iloc[0]
    assert (out["compute_ns"], out["comm_ns"], out["idle_ns"], out["optimizer_ns"]) == (20, 0, 60, 100)
    assert np.isnan(out["overlap_pct"])


def test_ranks_are_separate_and_a_rank_without_intervals_still_has_rows() -> None:
    iv = pd.concat([frame(("comm", 0, 10), rank=0), frame(("compute", 0, 10), rank=1)])
    st = pd.concat([steps((0, 10), rank=0), steps((0, 10), rank=1), steps((0, 10), rank=2)])
    out = step_overlap(iv, st)
    assert list(out.columns) == list(STEP_OVERLAP_COLUMNS)
    assert out[["rank", "comm_ns", "compute_ns", "overlap_ns", "idle_ns"]].values.tolist() == [
        [0, 10, 0, 0, 0],
        [1, 0, 10, 0, 0],
        [2, 0, 0, 0, 10],
    ]


def test_totals_are_ratios_of_sums() -> None:
    iv = frame(("comm", 0, 10), ("compute", 0, 10), ("comm", 100, 190), ("compute", 100, 110))
    per_step = step_overlap(iv, steps((0, 50), (100, 200)))
    assert per_step["overlap_pct"].tolist() == [100.0, pytest.approx(100 / 9)]
    total = overlap_totals(per_step).iloc[0]
    assert (total["comm_ns"], total["overlap_ns"], total["overlap_pct"]) == (100, 20, 20.0)
    assert overlap_totals(per_step, by=()).iloc[0]["overlap_pct"] == 20.0


def test_hta_window_drops_each_ranks_last_step_unless_it_is_the_only_one() -> None:
    """Rank 0: steps 50 % and 10 % overlapped, then a last step (100 %) HTA leaves out → 30 %;
    rank 1 has one step only, which HTA keeps."""
    iv = pd.concat(
        [
            frame(
                ("comm", 0, 10),
                ("compute", 0, 5),
                ("comm", 100, 110),
                ("compute", 100, 101),
                ("comm", 200, 210),
                ("compute", 200, 210),
                rank=0,
            ),
            frame(("comm", 0, 10), ("compute", 0, 2), rank=1),
        ]
    )
    per_step = step_overlap(iv, pd.concat([steps((0, 50), (100, 150), (200, 250), rank=0), steps((0, 50), rank=1)]))
    assert overlap_totals(per_step).set_index("rank")["overlap_pct"].round(3).tolist() == [53.333, 20.0]
    assert hta_overlap_pct(per_step).to_dict() == {0: pytest.approx(30.0), 1: pytest.approx(20.0)}


def test_summary_overlap_is_the_mean_of_the_ranks_over_htas_window(tmp_path: Path) -> None:
    """What ``tpbench sweep`` stores in summary.parquet, on the real 2-rank Gloo trace."""
    from tpbench import sweep

    shutil.copytree(FIXTURE, tmp_path / "cases" / "c1" / "trace")
    row = sweep.analyze_traces(tmp_path, pd.DataFrame({"case_id": ["c1"], "status": ["done"]}), {}).iloc[0]
    t = read_traces(FIXTURE)
    per_rank = hta_overlap_pct(step_overlap(t.intervals, t.steps))
    assert len(per_rank) == 2 and t.steps.groupby("rank").size().tolist() == [4, 4]
    assert row["overlap_pct"] == pytest.approx(per_rank.mean())


def test_matches_brute_force_on_random_intervals() -> None:
    """Against counting covered ticks one by one, for many random layouts."""
    rng = np.random.default_rng(0)
    lanes = np.array(["compute", "comm", "memcpy", "optimizer", "other"])
    for _ in range(200):
        n = int(rng.integers(0, 40))
        start = rng.integers(-20, 300, n)
        end = start + rng.integers(0, 60, n)
        lane = lanes[rng.integers(0, len(lanes), n)]
        cuts = np.sort(rng.choice(np.arange(0, 300), size=6, replace=False))
        spans = [(int(cuts[i]), int(cuts[i + 1])) for i in range(0, 6, 2)]
        iv = pd.DataFrame({"rank": 0, "lane": lane, "start_ns": start, "end_ns": end})
        got = step_overlap(iv, steps(*spans))
        for (lo, hi), row in zip(spans, got.itertuples()):
            ticks = np.arange(lo, hi)[:, None]
            # Each lane's covered ticks: a tick is covered when some interval of the lane holds it.
            covered = {n: ((ticks >= start[lane == n]) & (ticks < end[lane == n])).any(axis=1) for n in lanes}
            comp, comm = covered["compute"], covered["comm"]
            assert row.compute_ns == comp.sum() and row.comm_ns == comm.sum()
            assert row.overlap_ns == (comp & comm).sum()
            assert row.idle_ns == (~(comp | comm | covered["memcpy"] | covered["other"])).sum()
            assert row.optimizer_ns == covered["optimizer"].sum()


def test_overlapping_steps_are_refused() -> None:
    with pytest.raises(ValueError, match="overlap in time"):
        step_overlap(frame(("compute", 0, 10)), steps((0, 100), (50, 150)))
