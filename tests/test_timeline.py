"""Trace parsing: lanes, steps and collective metadata on hand-built traces with known answers,
robustness of the streaming reader to layout and chunking, and a real Gloo trace."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from tpbench.analysis import timeline, trace_events
from tpbench.analysis.overlap import step_overlap
from tpbench.analysis.timeline import INTERVAL_COLUMNS, LANES, read_trace, read_traces

TRACES = Path(__file__).parent / "fixtures" / "traces"
FIXTURE = TRACES / "gloo2"


def op(name: str, tid: int, ts: float, dur: float, cat: str = "cpu_op", **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur, "args": dict(args)}


def write(path: Path, events: list[dict], meta: dict | None = None, layout: str = "kineto") -> Path:
    """Write a Chrome trace the way torch.profiler does (``kineto``), on one line, or with json's indent."""
    doc = {"schemaVersion": 1, **(meta or {}), "traceEvents": events, "traceName": str(path)}
    if layout == "kineto":
        body = ",\n".join("  " + json.dumps(e) for e in events)
        head = json.dumps({k: v for k, v in doc.items() if k not in ("traceEvents", "traceName")})[:-1]
        text = f'{head},\n  "traceEvents": [\n{body}\n  ],"traceName": "{path}" }}'
    elif layout == "one-line":
        text = json.dumps(doc)
    else:
        text = json.dumps(doc, indent=2)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt") as f:
        f.write(text)
    return path


DIST = {
    "distributedInfo": {
        "backend": "gloo",
        "rank": 3,
        "world_size": 2,
        "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]}],
    }
}

CPU_EVENTS = [
    {"ph": "M", "name": "thread_name", "pid": 100, "tid": 2, "args": {"name": "pt_gloo_runloop"}},
    op("ProfilerStep#5", 1, 1000, 100, cat="user_annotation"),
    op("ProfilerStep#6", 1, 1100, 100, cat="user_annotation"),
    op("aten::zeros", 1, 900, 10),  # before the first step
    op("aten::linear", 1, 1010, 30),
    op("aten::addmm", 1, 1015, 20),  # nested in aten::linear
    op("aten::relu", 1, 1040, 10),  # touches aten::linear: still its own op
    op("gloo:all_reduce", 2, 1030, 50, cat="user_annotation", **{"Input Dims": [[1000]], "Input type": ["float"]}),
    op("aten::copy_", 2, 1035, 5),  # part of the collective
    op("tpbench.zero.step[bucket=0]", 2, 1085, 10, cat="user_annotation"),
    op("aten::add_", 2, 1086, 8),  # optimizer work in a future's callback: compute
    op("aten::mul", 3, 1120, 10),  # neither training thread nor a range: other
    op("aten::mm", 1, 1195, 15),  # crosses the end of step 6
    op("c10d::allreduce_", 1, 1029, 1),  # not aten work
    {"ph": "s", "id": 1, "pid": 100, "tid": 1, "ts": 1010, "cat": "fwdbwd", "name": "fwdbwd"},
    {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": 1300},
]


def test_cpu_trace_lanes_steps_and_gloo_metadata(tmp_path: Path) -> None:
    t = read_trace(write(tmp_path / "t.json", CPU_EVENTS, DIST))
    iv = t.intervals
    assert tuple(iv.columns) == INTERVAL_COLUMNS
    assert list(iv["lane"].cat.categories) == list(LANES)
    got = [(r.name, r.lane, r.stream_or_thread, r.step, r.start_ns, r.end_ns) for r in iv.itertuples()]
    assert got == [
        ("aten::zeros", "compute", "thread 1", -1, 900_000, 910_000),
        ("aten::linear", "compute", "thread 1", 5, 1_010_000, 1_040_000),
        ("gloo:all_reduce", "comm", "thread 2", 5, 1_030_000, 1_080_000),
        ("aten::relu", "compute", "thread 1", 5, 1_040_000, 1_050_000),
        ("tpbench.zero.step[bucket=0]", "optimizer", "thread 2", 5, 1_085_000, 1_095_000),
        ("aten::add_", "compute", "thread 2", 5, 1_086_000, 1_094_000),
        ("aten::mul", "other", "thread 3", 6, 1_120_000, 1_130_000),
        ("aten::mm", "compute", "thread 1", 6, 1_195_000, 1_210_000),
    ]
    assert (iv["rank"] == 3).all()
    comm = iv[iv["lane"] == "comm"].iloc[0]
    assert (comm["bytes"], comm["collective"], comm["process_group"], comm["group_size"]) == (4000, "allreduce", "0", 2)
    assert iv.loc[iv["lane"] != "comm", "bytes"].isna().all()
    assert t.steps.to_dict("list") == {
        "rank": [3, 3],
        "step": [5, 6],
        "start_ns": [1_000_000, 1_100_000],
        "end_ns": [1_100_000, 1_200_000],
    }


GPU_EVENTS = [
    op("ProfilerStep#1", 1, 0, 1000, cat="user_annotation"),
    op("aten::mm", 1, 5, 10),  # CPU ops do not count once a trace has kernels
    op("gemm_kernel", 7, 10, 100, cat="kernel", stream=7, correlation=1),
    op(
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        20,
        50,
        200,
        cat="kernel",
        stream=20,
        correlation=2,
        **{
            "Collective name": "allreduce",
            "In msg nelems": 1024,
            "Out msg nelems": 1024,
            "dtype": "Float",
            "Group size": 4,
            "Process Group Name": "0",
        },
    ),
    # No metadata on the kernel: it comes from the record_param_comms op around its launch.
    op(
        "record_param_comms",
        1,
        285,
        10,
        **{
            "Collective name": "_allgather_base",
            "In msg nelems": 256,
            "Out msg nelems": 1024,
            "dtype": "BFloat16",
            "Group size": 4,
            "Process Group Name": "1",
        },
    ),
    op("cudaLaunchKernel", 1, 290, 2, cat="cuda_runtime", correlation=3),
    op("ncclDevKernel_AllGather_RING_LL(x)", 20, 300, 100, cat="kernel", stream=20, correlation=3),
    # Neither: only the kernel name says which collective; bytes unknown.
    op("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(x)", 21, 500, 50, cat="kernel", stream=21, correlation=4),
    op("Memcpy HtoD (Pageable -> Device)", 7, 600, 20, cat="gpu_memcpy", stream=7, correlation=5),
    op("tpbench.zero.step[bucket=1]", 7, 700, 80, cat="gpu_user_annotation", stream=7),
    op("tpbench.zero.step[bucket=1]", 1, 650, 5, cat="user_annotation"),  # CPU side of the same range
    op("gloo:broadcast", 9, 800, 100, cat="user_annotation", **{"Input Dims": [[8, 4]], "Input type": ["c10::Half"]}),
]


def test_gpu_trace_kernels_streams_and_nccl_metadata(tmp_path: Path) -> None:
    iv = read_trace(write(tmp_path / "rank0.json.gz", GPU_EVENTS)).intervals
    plain = iv.astype(object).where(iv.notna(), None)
    got = [
        (r.lane, r.stream_or_thread, r.start_ns, r.collective, r.process_group, r.bytes, r.group_size)
        for r in plain.itertuples()
    ]
    na = None
    assert got == [
        ("compute", "stream 7", 10_000, na, na, na, na),
        ("comm", "stream 20", 50_000, "allreduce", "0", 4096, 4),
        ("comm", "stream 20", 300_000, "allgather", "1", 2048, 4),
        ("comm", "stream 21", 500_000, "reduce_scatter", na, na, na),
        ("memcpy", "stream 7", 600_000, na, na, na, na),
        ("optimizer", "stream 7", 700_000, na, na, na, na),
        ("comm", "thread 9", 800_000, "broadcast", na, 64, na),
    ]
    assert (iv["rank"] == 0).all()  # from the file name: no distributedInfo


@pytest.mark.parametrize("layout", ["kineto", "one-line", "indent"])
def test_reader_is_independent_of_layout_and_chunking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    """Tiny chunks cut the array everywhere, also inside nested ``}, {`` of an event's args."""
    nested = op("aten::cat", 1, 1160, 5, **{"Input Dims": [[1], [2]], "Extra": [{"a": 1}, {"b": {"c": 2}}]})
    events = [*CPU_EVENTS, nested]
    reference = read_trace(write(tmp_path / "ref.json", events, DIST)).intervals
    path = write(tmp_path / f"{layout}.json.gz", events, DIST, layout=layout)
    for chunk in (1, 7, 64, 1 << 20):
        monkeypatch.setattr(trace_events, "_CHUNK_BYTES", chunk)
        pd.testing.assert_frame_equal(read_trace(path).intervals, reference)


def read_both_ways(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[timeline.Timeline, timeline.Timeline, list[bool]]:
    """Read ``path`` as is, then with the regex fast path disabled (JSON decoding only)."""
    real = trace_events.TraceEvents._take_fast
    used: list[bool] = []
    monkeypatch.setattr(
        trace_events.TraceEvents, "_take_fast", lambda self, piece: used.append(real(self, piece)) or used[-1]
    )
    fast = read_traces(path)
    monkeypatch.setattr(trace_events.TraceEvents, "_take_fast", lambda self, piece: False)
    return fast, read_traces(path), used


@pytest.mark.parametrize("folder", ["gloo2", "gloo2_gpu_style", "h200_gloo2_zero_interleaved"])
def test_fast_path_reads_real_traces_exactly_as_json_decoding(monkeypatch: pytest.MonkeyPatch, folder: str) -> None:
    fast, slow, used = read_both_ways(TRACES / folder, monkeypatch)
    assert used and all(used), "torch.profiler's layout should never need the slow path"
    pd.testing.assert_frame_equal(fast.intervals, slow.intervals)
    pd.testing.assert_frame_equal(fast.steps, slow.steps)
    pd.testing.assert_frame_equal(fast.marks, slow.marks)
    assert (fast.marks["kind"] == "issue").any() and (fast.marks["kind"] == "zero_step").any()


@pytest.mark.parametrize("events", [CPU_EVENTS, GPU_EVENTS], ids=["cpu", "gpu"])
def test_fast_path_matches_json_decoding_on_hand_built_traces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, events: list[dict]
) -> None:
    fast, slow, used = read_both_ways(write(tmp_path / "rank0.json", events, DIST), monkeypatch)
    assert all(used)
    pd.testing.assert_frame_equal(fast.intervals, slow.intervals)


def test_events_the_fast_path_cannot_account_for_send_the_piece_to_json_decoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event with its keys in another order is still read: the piece falls back, whole."""
    reordered = {
        "ph": "X",
        "name": "aten::sub",
        "cat": "cpu_op",
        "pid": 100,
        "tid": 1,
        "ts": 1150,
        "dur": 5,
        "args": {},
    }
    events = [*CPU_EVENTS[:5], reordered, *CPU_EVENTS[5:]]  # not last: the last event is always decoded as JSON
    fast, slow, used = read_both_ways(write(tmp_path / "rank0.json", events, DIST), monkeypatch)
    assert used == [False]
    assert "aten::sub" in set(fast.intervals["name"])
    pd.testing.assert_frame_equal(fast.intervals, slow.intervals)


def test_metadata_after_the_events_still_names_the_rank(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"traceEvents": CPU_EVENTS, **DIST}))
    assert set(read_trace(path).intervals["rank"]) == {3}


def test_real_gloo_trace(tmp_path: Path) -> None:
    """The fixture from ``benchmarks/make_trace.py``: every ``gloo:*`` range becomes a comm interval with
    its payload, steps come from ``ProfilerStep#N``, compute lives on the training thread."""
    t = read_traces(FIXTURE)
    iv, steps = t.intervals, t.steps
    assert sorted(iv["rank"].unique()) == [0, 1]
    assert steps.groupby("rank")["step"].apply(list).to_dict() == {0: [1, 2, 3, 4], 1: [1, 2, 3, 4]}
    for rank in (0, 1):
        with gzip.open(FIXTURE / f"rank{rank}.json.gz", "rt") as f:
            events = json.load(f)["traceEvents"]
        gloo = [e for e in events if e.get("name", "").startswith("gloo:")]
        mine = iv[(iv["rank"] == rank) & (iv["lane"] == "comm")]
        assert len(mine) == len(gloo) > 0
        assert (mine["end_ns"] - mine["start_ns"]).sum() == pytest.approx(
            sum(e["dur"] for e in gloo) * 1e3, abs=len(gloo)
        )
        train = next(e["tid"] for e in events if e.get("name", "").startswith("ProfilerStep#"))
        compute = iv[(iv["rank"] == rank) & (iv["lane"] == "compute")]
        assert set(compute["stream_or_thread"].astype(str)) == {f"thread {train}"}
    comm = iv[iv["lane"] == "comm"]
    assert set(comm["collective"]) == {"allreduce", "broadcast"}
    assert (comm["bytes"] > 0).all() and (comm["process_group"] == "0").all() and (comm["group_size"] == 2).all()
    assert iv.loc[iv["lane"] == "optimizer", "name"].str.startswith("tpbench.zero.").all()
    assert (iv["step"] >= 1).mean() > 0.95


# Traces in the shapes real GPU machines write that hand-built ones missed (tests/fixtures/traces/README.md).
OLD_TORCH = TRACES / "old_torch" / "worker2.1669144545.pt.trace.json"


def test_older_torch_without_collective_name_labels_kernels_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 1.13's ``record_param_comms`` carries no ``Collective name``: the kernel names say which
    collective ran; a ``SendRecv`` kernel is neither a send nor a recv; the single file of rank 2 of a
    4-rank job gets the job's size from ``distributedInfo.world_size``, not the one rank it holds."""
    fast, slow, used = read_both_ways(OLD_TORCH, monkeypatch)
    assert all(used), "the older Trace span field order must not send pieces to JSON decoding"
    pd.testing.assert_frame_equal(fast.intervals, slow.intervals)
    comm = fast.intervals[fast.intervals["lane"] == "comm"]
    assert comm["collective"].tolist() == ["allreduce", "sendrecv", "allreduce", "sendrecv"]
    assert (comm["group_size"] == 4).all() and comm["bytes"].isna().all() and comm["process_group"].isna().all()
    assert (fast.intervals["rank"] == 2).all()
    assert fast.steps["step"].tolist() == [7, 8]
    assert fast.intervals.loc[fast.intervals["lane"] == "compute", "name"].tolist() == ["volta_sgemm_128x64_nn"] * 2


def test_canonical_collective_keeps_sendrecv_apart() -> None:
    assert timeline.canonical_collective("SendRecv") == "sendrecv"
    assert timeline.canonical_collective("send") == "send" and timeline.canonical_collective("recv") == "recv"


def test_a_single_trace_without_a_rank_is_rank_0_with_a_warning(tmp_path: Path) -> None:
    """A ROCm trace of one process: no distributedInfo and no rank in the file name (HTA assumes rank 0)."""
    path = TRACES / "rocm_rankless" / "trace.json"
    with pytest.warns(UserWarning, match="no rank in distributedInfo or in the file name; taken as rank 0"):
        t = read_traces(path)
    assert (t.intervals["rank"] == 0).all() and t.steps["step"].tolist() == [1, 2, 3]
    assert t.intervals["lane"].value_counts()[["compute", "memcpy"]].tolist() == [3, 3]
    other = tmp_path / "trace2.json"
    other.write_bytes(path.read_bytes())
    with pytest.raises(ValueError, match="with several traces each must name its rank"):
        read_traces([path, other])


def test_a_trace_without_profiler_steps_is_one_step_with_a_warning() -> None:
    path = TRACES / "no_profiler_step" / "rank1.json"
    with pytest.warns(UserWarning, match="no ProfilerStep#N in the trace; the whole trace is analysed as one step"):
        t = read_traces(path)
    t0 = 9_000_000_000
    assert t.steps.to_dict("records") == [{"rank": 1, "step": 0, "start_ns": t0 + 30_000, "end_ns": t0 + 800_000}]
    assert (t.intervals["step"] == 0).all()
    per_step = step_overlap(t.intervals, t.steps)
    assert per_step[["comm_ns", "overlap_ns"]].iloc[0].tolist() == [500_000, 130_000]
    assert t.intervals.loc[t.intervals["lane"] == "comm", "collective"].tolist() == ["allreduce"]


def test_real_h200_trace_puts_cuda_work_gloo_ranges_and_zero_annotations_in_their_lanes() -> None:
    """Recorded by the GPU check (H200, torch 2.11, CUDA 13): 2 Gloo ranks sharing the GPU, tpbench's
    interleaved ZeRO hook. Kernels, memcpys and the hook's GPU annotations are on CUDA streams; Gloo,
    which stages CUDA tensors through the host, communicates on CPU threads."""
    t = read_traces(TRACES / "h200_gloo2_zero_interleaved")
    iv = t.intervals
    assert t.steps.groupby("rank")["step"].apply(list).to_dict() == {0: [1, 2, 3], 1: [1, 2, 3]}
    where = iv.groupby("lane", observed=True)["stream_or_thread"].agg(lambda s: {x.split()[0] for x in s}).to_dict()
    assert where == {"compute": {"stream"}, "comm": {"thread"}, "optimizer": {"stream"}, "memcpy": {"stream"}}
    assert iv.groupby(["rank", "lane"], observed=True).size().to_dict() == {
        (0, "compute"): 261,
        (0, "comm"): 12,
        (0, "optimizer"): 6,
        (0, "memcpy"): 99,
        (1, "compute"): 213,
        (1, "comm"): 12,
        (1, "optimizer"): 6,
        (1, "memcpy"): 99,
    }
    comm = iv[iv["lane"] == "comm"]
    assert set(comm["name"]) == {"gloo:all_reduce", "gloo:broadcast"} and (comm["group_size"] == 2).all()
    # Two buckets of the 16.8M-parameter MLP, float32: 8,425,488 and 8,392,704 elements.
    assert set(comm["bytes"]) == {33_701_952, 33_570_816}
    assert set(iv.loc[iv["lane"] == "optimizer", "name"].str.replace(r"\[bucket=\d\]", "", regex=True)) == {
        "tpbench.zero.step",
        "tpbench.zero.broadcast",
    }


def test_a_cpu_trace_without_aten_ops_reads_as_its_communication_alone(tmp_path: Path) -> None:
    """A trace whose CPU side holds no ``aten::`` op (a hand-made one, or a profiler told to record only
    user annotations) crashed the reader with an IndexError: the per-thread split of no ops still
    yielded one (empty) thread. Its communication is read, and no compute."""
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {}}
        for name, ts, dur in (("ProfilerStep#1", 0, 100), ("gloo:all_reduce", 10, 40))
    ]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": ev, "distributedInfo": {"rank": 0, "world_size": 2}}))
    tl = read_trace(path)
    assert tl.intervals["lane"].astype(str).tolist() == ["comm"] and len(tl.steps) == 1
