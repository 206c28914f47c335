"""Bandwidth per collective: nccl-tests' formulas on hand-computed cases, instance matching."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tpbench.analysis.bandwidth import COLLECTIVE_BANDWIDTH_COLUMNS, busbw_factor, collective_bandwidth
from tpbench.analysis.timeline import read_traces

MS = 1_000_000


def comm(
    rank: int,
    collective: str,
    start_ms: float,
    dur_ms: float,
    nbytes: int | None,
    group: str | None = "0",
    size: int | None = 2,
    step: int = 1,
) -> dict:
    return {
        "rank": rank,
        "step": step,
        "lane": "comm",
        "start_ns": int(start_ms * MS),
        "end_ns": int((start_ms + dur_ms) * MS),
        "bytes": nbytes,
        "collective": collective,
        "process_group": group,
        "group_size": size,
        "group_size_unknown": False,
    }


def frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    df["bytes"] = df["bytes"].astype("Int64")
    df["group_size"] = df["group_size"].astype("Int64")
    return df


@pytest.mark.parametrize(
    ("collective", "n", "factor"),
    [
        ("allreduce", 2, 1.0),
        ("allreduce", 8, 1.75),
        ("broadcast", 8, 1.0),
        ("allgather", 4, 0.75),
        ("reduce_scatter", 4, 0.75),
        ("alltoall", 2, 0.5),
        ("reduce", 4, 1.0),
        ("sendrecv", 4, 1.0),
    ],
)
def test_busbw_factors_are_nccl_tests(collective: str, n: int, factor: float) -> None:
    assert busbw_factor(collective, n) == factor


def test_unknown_collective_has_no_factor() -> None:
    assert np.isnan(busbw_factor("barrier", 4))


def test_time_is_the_fastest_rank_and_bandwidth_uses_gb_of_1e9() -> None:
    """100 MB allreduce: rank 0 waited 30 ms for rank 1, which took 20 ms → 5 GB/s algbw;
    with 4 ranks the bus carries 2·3/4 of that per rank-link → 7.5 GB/s."""
    rows = [comm(0, "allreduce", 0, 50, 100_000_000, size=4), comm(1, "allreduce", 30, 20, 100_000_000, size=4)]
    out = collective_bandwidth(frame(rows))
    assert list(out.columns) == list(COLLECTIVE_BANDWIDTH_COLUMNS)
    row = out.iloc[0]
    assert (row["time_ns"], row["slowest_ns"], row["ranks"], row["group_size"]) == (20 * MS, 50 * MS, 2, 4)
    assert row["algbw_gbps"] == pytest.approx(5.0)
    assert row["busbw_gbps"] == pytest.approx(7.5)


def test_a_broadcast_is_timed_on_its_slowest_rank_never_faster_than_its_link() -> None:
    """On Gloo a broadcast's root returns once its bytes are in the socket's buffer: crossover.toml's
    589 KB broadcasts on a 1 Gbit/s (0.125 GB/s) link read 2.41 GB/s of busbw, timed on the root. A
    rooted collective is timed on the receiver, which ends only once the bytes have crossed."""
    nbytes = 589_824
    rows = [comm(0, "broadcast", 0, 0.245, nbytes, size=2), comm(1, "broadcast", 0, 4.9, nbytes, size=2)]
    row = collective_bandwidth(frame(rows)).iloc[0]
    assert row["time_ns"] == row["slowest_ns"] == 4.9 * MS
    assert row["busbw_gbps"] == pytest.approx(nbytes / 4.9e-3 / 1e9) and row["busbw_gbps"] < 0.125


def test_instances_match_by_order_within_group_and_collective() -> None:
    """Ranks interleave two groups differently in time; each group's own order still pairs them."""
    rows = [
        comm(0, "allreduce", 0, 10, 8_000_000, group="a"),
        comm(0, "broadcast", 5, 4, 1_000_000, group="b"),
        comm(0, "allreduce", 20, 10, 4_000_000, group="a"),
        comm(1, "broadcast", 0, 2, 1_000_000, group="b"),
        comm(1, "allreduce", 3, 8, 8_000_000, group="a"),
        comm(1, "allreduce", 21, 4, 4_000_000, group="a"),
    ]
    out = collective_bandwidth(frame(rows)).set_index(["process_group", "collective", "instance"])
    assert out.loc[("a", "allreduce", 0), "time_ns"] == 8 * MS
    assert out.loc[("a", "allreduce", 1), "time_ns"] == 4 * MS
    assert out.loc[("b", "broadcast", 0), "time_ns"] == 4 * MS  # rooted: its slowest rank
    assert out.loc[("a", "allreduce", 0), "algbw_gbps"] == pytest.approx(1.0)  # 8 MB / 8 ms
    assert out.loc[("b", "broadcast", 0), "busbw_gbps"] == pytest.approx(0.25)  # 1 MB / 4 ms, factor 1


def test_unknown_bytes_and_group_size() -> None:
    """Without a payload there is no bandwidth; without a group size the ranks seen stand in."""
    rows = [
        comm(0, "allgather", 0, 10, None, group=None, size=None),
        comm(1, "allgather", 0, 10, None, group=None, size=None),
        comm(0, "reduce_scatter", 20, 10, 30_000_000, group=None, size=None),
        comm(1, "reduce_scatter", 20, 10, 30_000_000, group=None, size=None),
    ]
    out = collective_bandwidth(frame(rows))
    assert np.isnan(out.iloc[0]["algbw_gbps"]) and pd.isna(out.iloc[0]["bytes"])
    assert out.iloc[1]["group_size"] == 2
    assert out.iloc[1]["busbw_gbps"] == pytest.approx(3.0 * 0.5)
    assert out["process_group"].isna().all()


def test_no_collectives_gives_an_empty_frame() -> None:
    df = frame([comm(0, "allreduce", 0, 1, 1)]).assign(lane="compute", collective=None)
    out = collective_bandwidth(df)
    assert out.empty and list(out.columns) == list(COLLECTIVE_BANDWIDTH_COLUMNS)


@pytest.mark.parametrize("folder", ["gloo2", "h200_gloo2_zero_interleaved"])  # CPU, and CUDA tensors on an H200
def test_real_gloo_trace_pairs_every_collective_across_both_ranks(folder: str) -> None:
    iv = read_traces(Path(__file__).parent / "fixtures" / "traces" / folder).intervals
    out = collective_bandwidth(iv)
    per_rank = iv[iv["lane"] == "comm"].groupby("rank").size()
    assert per_rank.nunique() == 1 and len(out) == per_rank.iloc[0]
    assert (out["ranks"] == 2).all() and (out["time_ns"] <= out["slowest_ns"]).all()
    assert (out["algbw_gbps"] > 0).all()
    allreduce = out[out["collective"] == "allreduce"]
    assert np.allclose(allreduce["busbw_gbps"], allreduce["algbw_gbps"])  # 2(n−1)/n = 1 for n = 2


def test_one_rank_of_an_older_torch_job_keeps_allreduce_and_sendrecv_apart_at_the_job_size() -> None:
    """The single trace of rank 2 of 4 (torch 1.13: no collective metadata): instances pair by kernel
    label, and the group size is the job's (distributedInfo.world_size), not the one rank seen."""
    iv = read_traces(Path(__file__).parent / "fixtures" / "traces" / "old_torch").intervals
    out = collective_bandwidth(iv)
    assert out[["collective", "instance", "group_size", "ranks"]].values.tolist() == [
        ["allreduce", 0, 4, 1],
        ["sendrecv", 0, 4, 1],
        ["allreduce", 1, 4, 1],
        ["sendrecv", 1, 4, 1],
    ]
    assert out["time_ns"].tolist() == [400_000, 150_000] * 2


def _post_local_sgd_trace(path: Path, rank: int) -> Path:
    """Rank ``rank`` of 4 after post-local SGD's switch, as Gloo records it: the world, a second group
    of 4 and this rank's node subgroup of 2 in ``pg_config``; each ``gloo:*`` range names no group.
    In step 1, a 4 MB gradient all-reduce (the subgroup's), the 4 MB averaging all-reduce (the
    world's) and a 4 MB broadcast, each 4 ms on every rank: algbw 1 GB/s."""
    node = [rank - rank % 2, rank - rank % 2 + 1]
    groups = [("0", 4, [0, 1, 2, 3]), ("1", 4, [0, 1, 2, 3]), (str(2 + rank // 2), 2, node)]
    args = {"Input Dims": [[1_000_000]], "Input type": ["float"]}

    def event(name: str, ts: float, dur: float, **a: object) -> dict:
        return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": a}

    doc = {
        "distributedInfo": {
            "backend": "gloo",
            "rank": rank,
            "world_size": 4,
            "pg_config": [{"pg_name": n, "pg_size": s, "ranks": r} for n, s, r in groups],
        },
        "traceEvents": [
            event("ProfilerStep#1", 0, 15000),
            {**event("aten::mm", 0, 5), "cat": "cpu_op"},
            event("gloo:all_reduce", 10, 4000, **args),
            event("gloo:all_reduce", 5000, 4000, **args),
            event("gloo:broadcast", 10000, 4000, **args),
        ],
    }
    path.write_text(json.dumps(doc))
    return path


def test_a_gloo_collective_in_a_trace_of_several_group_sizes_has_no_busbw(tmp_path: Path) -> None:
    """Post-local SGD after its switch on 4 ranks: Gloo's ranges name no group and the traces hold groups
    of 4 and of 2, so a range's group size is unknown. The ranks that ran an instance must not stand in:
    both node subgroups' all-reduces pair as one instance seen on 4 ranks, and 2(n−1)/n with n = 4 read
    1.5 GB/s where the subgroup's n = 2 gives 1. algbw stays; a broadcast's factor is 1 whatever n."""
    paths = [_post_local_sgd_trace(tmp_path / f"rank{r}.json", r) for r in range(4)]
    out = collective_bandwidth(read_traces(paths).intervals)
    assert out["collective"].tolist() == ["allreduce", "allreduce", "broadcast"]
    assert (out["ranks"] == 4).all() and out["group_size"].isna().all()
    assert np.allclose(out["algbw_gbps"], 1.0)
    assert out["busbw_gbps"].isna().tolist() == [True, True, False]
    assert out["busbw_gbps"].iloc[2] == pytest.approx(1.0)


def test_a_case_over_the_world_group_alone_takes_its_size_from_its_settings(tmp_path: Path) -> None:
    """A world's traces list every group made in it: a DDP case that ran beside post-local SGD's
    cases lists their node subgroups too, and its all-reduces, all over the world, read "unknown:
    group size". Its settings say it (``world_group_size``): the world's 4, so busbw = 1.5 × algbw;
    a post-local SGD case that switches, or a hook of one's own, stays unknown. ``sweep.analyze_traces``
    stores each case's table so."""
    from tpbench import store, sweep
    from tpbench.algorithms import world_group_size

    ddp = {"algorithm": "ddp", "world_size": 4, "comm_hook": "allreduce"}
    switched = {"algorithm": "post_localSGD_hook", "world_size": 4, "start_localSGD_iter": 0}
    assert world_group_size(ddp) == 4 and world_group_size({}) is None
    assert world_group_size(switched) is None and world_group_size(ddp | {"comm_hook": "mine:hook"}) is None
    for cid in ("ddp", "switched"):
        folder = store.trace_dir(tmp_path, cid)
        folder.mkdir(parents=True)
        for r in range(4):
            text = _post_local_sgd_trace(tmp_path / f"rank{r}.json", r).read_text()
            (folder / f"rank{r}.json.gz").write_bytes(gzip.compress(text.encode()))
    cases = pd.DataFrame({"case_id": ["ddp", "switched"], "status": ["done", "done"]})
    sweep.analyze_traces(tmp_path, cases, {"ddp": ddp, "switched": switched})
    mine = store.read_case_table(tmp_path, "ddp", "collectives")
    assert (mine["group_size"] == 4).all() and np.allclose(mine["busbw_gbps"], [1.5, 1.5, 1.0])
    theirs = store.read_case_table(tmp_path, "switched", "collectives")
    assert theirs["group_size"].isna().all() and theirs["busbw_gbps"].isna().tolist() == [True, True, False]
