"""Capture end to end on CPU: a real 2-rank Gloo sweep with profiling, and per-case memory peaks.

What a GPU adds (CUDA kernels and memcpys in the traces, NVML samples) is checked by
``gpu/capture.py`` on a GPU machine; here NVML must be reported unavailable, quietly.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.distributed as dist
from conftest import sweep_in_process, tiny_suite
from world import run_world

from tpbench import capture, store, whatif_run
from tpbench.analysis import whatif
from tpbench.capture import NVML_FILE, nvml
from tpbench.suite import expand, parse
from tpbench.worker import CaseRunner, Events, Rank

pytestmark = pytest.mark.ranks  # starts rank processes: not in `make test-fast`


@pytest.fixture(scope="module")
def run(traced_tiny_run) -> store.Loaded:
    """Two traced cases, 2 ranks, 2 repeats (conftest's, test_report_browser.py's too)."""
    return traced_tiny_run


def _trace(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def test_one_parseable_trace_per_rank_with_phases_collectives_and_distributed_info(run):
    assert set(run.cases["status"]) == {"done"}
    for case in run.cases.to_dict("records"):
        files = store.traces(run.run_dir, case["case_id"])
        # HTA reads a folder with one file per rank and takes the rank from distributedInfo.
        # and nothing else in the folder (no leftover temporary export).
        assert sorted(p.name for p in files[0].parent.iterdir()) == ["rank0.json.gz", "rank1.json.gz"]
        assert files == sorted(files[0].parent.iterdir())
        for rank, path in enumerate(files):
            trace = _trace(path)
            info = trace["distributedInfo"]
            assert (info["rank"], info["world_size"], info["backend"]) == (rank, 2, "gloo")
            spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
            steps = [e for e in spans if e["name"].startswith("ProfilerStep#")]
            assert len(steps) == case["profiler_steps"]
            train_tid = steps[0]["tid"]
            names = {e["name"] for e in spans if e["tid"] == train_tid}
            assert {"tpbench.forward", "tpbench.backward", "tpbench.optimizer"} <= names
            gloo = {e["name"] for e in spans if e["name"].startswith("gloo:")}
            assert "gloo:all_reduce" in gloo
            if case["algorithm"] == "zero_no_overlap":
                assert "gloo:broadcast" in gloo  # ZeRO hands each rank's updated shard to the others


def test_each_timed_forward_pass_is_timed_and_each_traced_one_is_a_mark(run):
    """What the what-if's host factor and its validation's host rest on (``whatif.forward_times``):
    every timed and warm-up step's forward pass, a part of the step, and one ``forward`` mark per
    traced step and rank."""
    steps = run.steps
    assert (steps["forward_ms"] > 0).all() and (steps["forward_ms"] < steps["step_ms"]).all()
    for case in run.cases.to_dict("records"):
        marks = store.read_case_table(run.run_dir, case["case_id"], "marks")
        forward = marks[marks["kind"] == "forward"]
        assert forward.groupby("rank").size().tolist() == [case["profiler_steps"]] * 2
        assert (forward["end_ns"] > forward["start_ns"]).all()
        timed, traced = whatif.forward_times(steps[steps["case_id"] == case["case_id"]], marks)
        assert timed > 0 and traced > 0


def test_a_trace_window_the_host_ran_slow_in_is_traced_again(tmp_path):
    """A window whose forward passes ran at under ``capture.SPEED_FLOOR`` of their timed speed is
    traced again and the best window kept (``CaseRunner._profile``). The fault
    ``slow-trace:1`` has rank 1 sleep in its first window's forward passes (below a third of their
    timed speed): both ranks must trace again, the record says so, and the kept trace, alone in its
    folder, is not the slowed one."""
    suite = tiny_suite('fault = ["slow-trace:1"]', profiler_steps=2, trace_windows=3)
    loaded = sweep_in_process(tmp_path, suite)
    ((cid, case),) = loaded.record.cases.items()
    assert case.status == "done"
    window = case.capture.trace
    assert window.windows >= 2 and len(window.forward_speed) == len(window.step_speed) == window.windows
    # The training thread's CPU time, timed over traced, per window: the tracer adds work, the
    # forward passes' sleep does not (a sleep is no CPU time).
    assert len(window.thread_speed) == window.windows and all(0 < x < 2 for x in window.thread_speed)
    assert window.thread_speed[0] > window.forward_speed[0]
    assert window.forward_speed[0] < 1 / 3 and window.kept > 0
    kept = capture.window_score(
        *(x[window.kept] for x in (window.forward_speed, window.step_speed, window.thread_speed))
    )
    assert kept >= 1 or window.windows == 3
    traces = store.trace_dir(loaded.run_dir, cid)
    assert sorted(p.name for p in traces.iterdir()) == ["rank0.json.gz", "rank1.json.gz"]
    marks = store.read_case_table(loaded.run_dir, cid, "marks")
    forward = marks[marks["kind"] == "forward"]
    assert forward.groupby("rank").size().tolist() == [2, 2]  # the kept window's steps only
    timed, traced = whatif.forward_times(loaded.steps, marks)
    assert timed / traced > window.forward_speed[0]
    # The what-if reads the kept window's thread speed (it words a refusal: ``whatif.Fit``).
    done = loaded.cases[loaded.cases["status"] == store.DONE]
    model = whatif_run.case_models(loaded, done, whatif_run.link_wires(loaded, done))
    assert model(done.iloc[0].to_dict()).fit.thread_speed == window.thread_speed[window.kept]


def test_a_window_whose_thread_ran_slow_behind_long_waits_is_traced_again(tmp_path):
    """A step that is mostly waiting (here a planted sleep ten times its compute, as on a slow shaped
    link) hides a window's slow compute: its forward passes and its step keep near their timed speed.
    The training thread's CPU time shows it. ``busy-trace:1`` has rank 1 burn five times its timed CPU
    time (and 5 ms) after each step of the first window: that window is traced again, and another kept.
    Five, not two: after the steps' long sleeps a traced thread can run at a quarter of its timed speed
    in every window (the slow traced windows of docs/explain.md; a fresh clone's CI run traced 0.27, 0.21
    and 0.25), and a planted window only a third as fast was then no worse than the others, and kept."""
    suite = tiny_suite(
        'fault = ["busy-trace:1"]',
        profiler_steps=2,
        trace_windows=3,
        slowdown_pct=1000,
        slowdown_kind='"sleep"',
        mlp={"width": 256, "depth": 2},
    )
    loaded = sweep_in_process(tmp_path, suite)
    ((_, case),) = loaded.record.cases.items()
    window = case.capture.trace
    assert case.status == "done" and window.windows >= 2 and window.kept > 0
    assert window.thread_speed[0] < 1 / 3  # the burn: at least twice the thread's own CPU time
    assert window.thread_speed[window.kept] > window.thread_speed[0]


def test_a_window_is_traced_again_while_below_a_floor_at_most_three_times_and_the_best_kept():
    floor = capture.SPEED_FLOOR
    # The what-if's bound on a traced host, kept apart so that rank processes need not import the what-if.
    assert floor == whatif.COMPUTE_FACTOR[0]
    assert capture.window_score(floor, 1.0, 0.9) == 1 and capture.window_score(0.9, floor / 2, 0.9) == 0.5
    # The thread's CPU time alone: a step mostly waiting on a slow link whose compute ran at a third of its speed.
    assert capture.window_score(1.0, 0.95, floor / 2) == 0.5
    assert capture.retrace([0.5], 3) and capture.retrace([1.2, 0.99], 3)
    assert not capture.retrace([1.0], 3) and not capture.retrace([0.3, 0.3, 0.3], 3) and not capture.retrace([0.5], 1)
    assert all(
        math.isnan(capture.window_score(*s)) for s in [(math.nan, 0.2, 0.2), (0.2, math.nan, 0.2), (1, 1, math.nan)]
    )
    assert not capture.retrace([math.nan], 3)  # not measured (GPU ranks): never traced again
    assert capture.kept_window([0.3, 0.8, 0.5]) == 1 and capture.kept_window([math.nan]) == 0
    assert math.isnan(capture.speed(math.nan, 2.0)) and capture.speed(1.0, 2.0) == 0.5


def test_clock_sync_maps_the_sampler_clock_onto_each_trace(run):
    for cid, case in run.record.cases.items():
        for rank, path in enumerate(store.traces(run.run_dir, cid)):
            sync = case.capture.clock_sync[str(rank)]
            trace = _trace(path)
            assert sync["trace_base_ns"] == trace["baseTimeNanoseconds"]
            probes = [e["ts"] for e in trace["traceEvents"] if e.get("name") == nvml.CLOCK_PROBE]
            # The tightest probe was chosen; its exported ts is where the offset puts its sampler time.
            assert min(abs(ts - (sync["probe_ns"] / 1e3 + sync["offset_us"])) for ts in probes) < 0.01
            assert sync["uncertainty_us"] < 1000


def test_gloo_transport_is_observed_and_matches_loopback(run):
    for case in run.record.cases.values():
        seen = case.capture.observed_transport
        assert seen.asked == "loopback" and seen.backend == "gloo"
        assert seen.interfaces == ("lo",) and seen.mismatch is False
        for rank in ("0", "1"):
            assert seen.ranks[rank]["local_addresses"] == ["127.0.0.1"]
            assert seen.ranks[rank]["connections"] >= 1


def test_nvml_is_recorded_unavailable_on_cpu(run):
    for cid, case in run.record.cases.items():
        assert case.capture.nvml.available is False
        assert "CPU" in case.capture.nvml.reason
        assert not (store.case_dir(run.run_dir, cid) / NVML_FILE).exists()


def test_peak_rss_is_recorded_per_rank_and_repeat(run):
    peaks = run.steps.groupby(["case_id", "repeat", "rank"])["peak_rss_mb"].agg(["nunique", "first"])
    assert len(peaks) == 2 * 2 * 2
    assert (peaks["nunique"] == 1).all()
    assert all(100 < p < 10_000 and math.isfinite(p) for p in peaks["first"])


MEMORY_SUITE = """
[defaults]
world_size = 2
backend = "gloo"
device = "cpu"
batch_size = 8
warmup_steps = 1
steps = 2
repeats = 1
[capture]
profiler_steps = 0
[workloads.mlp]
width = 32
depth = 1
"""


def _peaks_in_one_world(rank: int, world_size: int, run_dir: str, big, small) -> list[dict[str, float]]:
    ctrl = dist.new_group(backend="gloo")
    runner = CaseRunner(
        Rank(rank, world_size, rank, world_size), torch.device("cpu"), Path(run_dir), Events(None), ctrl
    )
    peaks = []
    for case in (big, small, big, small):
        rows = runner.run_repeat(case, 0, profile_after=False)
        if rows is not None:
            peaks.append(rows.groupby("rank")["peak_rss_mb"].first().to_dict())
    return peaks


def test_peak_rss_is_reset_between_cases_in_one_process(one_world):
    """The same rank processes run a ~200 MB case, then a tiny one: the tiny one's peak must not
    inherit the big one's (VmHWM is reset through /proc/self/clear_refs before every repeat)."""
    peaks = one_world["peaks"]
    big1, small1, big2, small2 = peaks
    for rank in (0, 1):
        assert big1[rank] - small1[rank] > 100, peaks
        assert big2[rank] - small2[rank] > 100, peaks
        assert big2[rank] - big1[rank] < 50, peaks  # the same case peaks the same each time


class _Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def emit(self, event: str, **data) -> None:
        self.events.append((event, data))


def _sampled_case(rank: int, world_size: int, run_dir: str, case) -> list[tuple[str, dict]]:
    from test_nvml import FakeNvml

    ctrl = dist.new_group(backend="gloo")
    events = _Recorder()
    runner = CaseRunner(Rank(rank, world_size, rank, world_size), torch.device("cpu"), Path(run_dir), events, ctrl)
    runner.gpu = nvml.open_device(FakeNvml())  # only because no GPU exists here
    for repeat in range(case.repeats):
        runner.run_repeat(case, repeat, profile_after=repeat == case.repeats - 1)
    return events.events


SAMPLED_SUITE = (
    MEMORY_SUITE.replace("steps = 2\nrepeats = 1", "steps = 6\nrepeats = 2")
    .replace("profiler_steps = 0", "profiler_steps = 3\nnvml_interval_ms = 2")
    .replace("width = 32", "width = 384")
)


FAULTS = {"one-window": "", "traced-again": 'fault = "slow-trace:1"'}


def _one_world(rank: int, world_size: int, dirs: dict[str, str], big, small, cases: dict) -> dict:
    """The peaks first, in rank processes that have run nothing else, as in a world of their own."""
    peaks = _peaks_in_one_world(rank, world_size, dirs["peaks"], big, small)
    return {"peaks": peaks, "events": {k: _sampled_case(rank, world_size, dirs[k], c) for k, c in cases.items()}}


@pytest.fixture(scope="module")
def one_world(tmp_path_factory) -> dict:
    """One 2-rank world runs the peak-RSS cases, then each FAULTS case against the fake NVML, each
    into a folder of its own: the two tests below read it."""
    (small,) = expand(parse(MEMORY_SUITE))
    # 3000 × 3000 float32 = 36 MB per tensor: above glibc's mmap threshold, so freeing returns it to the OS.
    big = dataclasses.replace(small, workload_params=(("classes", 16), ("depth", 1), ("width", 3000)), case_id="big")
    cases = {k: expand(parse(SAMPLED_SUITE.replace("[capture]", f"{f}\n[capture]")))[0] for k, f in FAULTS.items()}
    dirs = {k: str(tmp_path_factory.mktemp(k)) for k in ("peaks", *FAULTS)}
    found = run_world(_one_world, 2, dirs, big, small, cases, timeout_s=480)[0]
    return found | {"cases": cases, "dirs": {k: Path(d) for k, d in dirs.items()}}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_worker_writes_nvml_samples_on_the_trace_clock_against_a_fake_nvml(one_world, fault):
    """The worker's whole NVML path in a real 2-rank world, with FakeNvml standing in for the
    driver only because no GPU exists here: parts per repeat, merged nvml.parquet (by the store, as
    the launcher's recorder does when the case ends), samples tagged with step and phase, and
    profiled-step samples inside the rank's traced steps, also where the first window was slowed
    and a later one kept (``slow-trace:1``; a busy machine does the same at random)."""
    case, events, tmp_path = one_world["cases"][fault], one_world["events"][fault], one_world["dirs"][fault]
    (info,) = [data for kind, data in events if kind == "capture"]
    if FAULTS[fault]:
        assert info["trace"]["kept"] > 0  # the first window's forward passes were slowed: not kept
    assert info["nvml"]["available"] is True and info["nvml"]["file"] == NVML_FILE
    for rank in ("0", "1"):
        r = info["nvml"]["ranks"][rank]
        assert r["gpu"] == "Fake GPU" and r["samples"] > 10 and r["error"] is None
        assert 1.5 <= r["median_interval_ms"] <= 4
    assert info["transport"]["backend"] == "gloo" and len(info["transport"]["ranks"]) == 2
    case_dir = store.case_dir(tmp_path, case.case_id)
    assert (case_dir / "nvml-parts").exists() and not (case_dir / NVML_FILE).exists()  # the recorder merges them
    store.finish_telemetry(tmp_path, case.case_id, info["clock_sync"])
    assert not (case_dir / "nvml-parts").exists()
    df = pd.read_parquet(case_dir / NVML_FILE)
    assert list(df.columns) == list(nvml.COLUMNS)
    assert set(df["repeat"]) == {0, 1} and set(df["rank"]) == {0, 1}
    assert {"warmup", "timed", "profile", "idle"} <= set(df["phase"])
    assert df.loc[df["phase"] == "timed", "step"].between(case.warmup_steps, case.warmup_steps + case.steps - 1).all()
    assert df["ts_us"].notna().all()
    # A window the machine slowed is traced again (capture.trace_windows): the kept one's steps are
    # numbered after the windows before it, the first of them the profiler's warm-up, untraced.
    warmup_step = case.warmup_steps + case.steps + info["trace"]["kept"] * (case.profiler_steps + 1)
    for rank, path in enumerate(store.traces(tmp_path, case.case_id)):
        steps = [e for e in _trace(path)["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
        lo, hi = min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)
        traced = df[(df["rank"] == rank) & (df["phase"] == "profile") & (df["step"] > warmup_step)]
        assert len(traced) > 0
        # Samples of the traced steps (not the profiler's warm-up step) lie within them on the trace's clock.
        assert traced["ts_us"].between(lo - 1e3, hi + 1e3).all(), (lo, hi, traced["ts_us"].tolist())


# Adam on a 512-wide MLP (the ops of docs/whatif-runs.md's slow windows) traced for 30 steps in a
# fresh process (glibc's heap as a rank's, untouched by this one's tests); prints how far the main
# arena grew from the first traced step to the last, in MiB (``mallinfo2``).
_HEAP_SCRIPT = """
import contextlib, ctypes, sys, tempfile, pathlib, torch
from tpbench.capture import profiler
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks")]
mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2
if sys.argv[1] == "without":
    profiler.heap_apart_from_tracer = lambda device: contextlib.nullcontext()
torch.manual_seed(0)
model = torch.nn.Sequential(*[m for _ in range(8) for m in (torch.nn.Linear(512, 512), torch.nn.ReLU())])
optimizer = torch.optim.Adam(model.parameters(), foreach=False)
x, arena = torch.randn(128, 512), []
def step(_):
    optimizer.zero_grad()
    model(x).square().mean().backward()
    optimizer.step()
    arena.append(mallinfo2().arena)
for i in range(30):
    step(i)
profiler.trace_steps(step, 30, 30, torch.device("cpu"), pathlib.Path(tempfile.mkdtemp()) / "rank0.json.gz")
print((arena[-1] - arena[31]) >> 20)
"""


@pytest.mark.skipif(not hasattr(__import__("ctypes").CDLL(None), "mallinfo2"), reason="glibc's mallinfo2 only")
def test_traced_steps_do_not_grow_the_heap():
    """The tracer's shapes must not make each step's tensors extend the heap onto fresh pages
    (``profiler.heap_apart_from_tracer``). Without the guard, the same steps (run here too, so that
    the test cannot pass for want of a workload that grows the heap) grew it by 275-683 MiB on the
    2-core machine, with it by 0."""
    import subprocess
    import sys

    grown = {
        how: int(
            subprocess.run([sys.executable, "-c", _HEAP_SCRIPT, how], capture_output=True, text=True, check=True).stdout
        )
        for how in ("with", "without")
    }
    assert grown["with"] < 20 and grown["without"] > 100, grown


# After a trace, a tensor larger than any the heap had adapted to (16 MiB, after 256 KiB ones and
# what importing torch frees) is allocated and freed again and again; prints the page faults of the
# last ten allocations.
_AFTER_SCRIPT = """
import resource, torch
from tpbench.capture import profiler
for _ in range(5):
    torch.ones(64, 1024)  # 256 KiB, freed at once: glibc's thresholds adapt to it
with profiler.heap_apart_from_tracer(torch.device("cpu")):
    for _ in range(5):
        torch.ones(256, 1024)  # traced steps' 1 MiB tensors, mapped
faults = []
for _ in range(20):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(4096, 1024)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sum(faults[10:]))
"""


@pytest.mark.skipif(not hasattr(__import__("ctypes").CDLL(None), "mallopt"), reason="glibc's mallopt only")
def test_after_a_trace_the_heap_keeps_what_it_frees(tmp_path):
    """The thresholds the guard leaves are those glibc's adaptation ends at: a 16 MiB tensor freed and
    allocated again is served from the heap without a fault. With the mmap threshold alone raised
    and the trim threshold left where it stood, each allocation faulted 4,064 pages back in, in 16
    of 18 runs from a temporary folder on the 2-core machine (in the others the tensor did not
    border the heap's top, which the layout of its allocations decides)."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _AFTER_SCRIPT], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert int(p.stdout) < 100


def test_a_case_traced_again_says_once_which_window_it_kept_and_how_fast(tmp_path, capsys):
    """The sweep printed "trace retaken: …" for each window traced again, twice for a case traced three
    times, and never whether the window kept was usable. It now says once per case, from the trace
    entry run.json records, which window it kept and at what speeds (``capture.kept_text``)."""
    from conftest import only_run, run_cli

    suite = tmp_path / "slow.toml"
    suite.write_text(tiny_suite('fault = ["slow-trace:1"]', profiler_steps=2, trace_windows=3))
    assert run_cli(["sweep", str(suite), "--out", str(tmp_path / "results"), "--no-report"]) == 0
    said = " ".join(capsys.readouterr().err.split())  # the terminal's wrapping undone
    (entry,) = json.loads((only_run(tmp_path / "results") / "run.json").read_text())["cases"].values()
    window = capture.TraceWindow.from_json(entry["trace"])
    assert window.windows >= 2 and "trace retaken" not in said
    assert said.count("trace of ") == 1 and f"trace of ddp: {capture.kept_text(window)}" in said, said
    # Away from a terminal each retake is a line of its own, counted against the most the case may trace.
    assert "ddp: tracing again, window 2 of at most 3 (" in said, said


def test_what_a_case_traced_again_kept_is_said_in_words():
    """A window kept above the floor says so; one kept below it, where every window ran below half
    speed, says the what-if may refuse the case; one window traced says nothing."""
    assert capture.kept_text(capture.TraceWindow(1, 0, (0.3,), (0.3,), (0.3,))) is None
    kept = capture.TraceWindow(2, 1, (0.3, 0.91), (0.8, 0.85), (0.7, 0.62))
    assert capture.kept_text(kept) == (
        "window 2 of 2 kept: its forward passes at ×0.91 of their timed speed, its steps at ×0.85, its training "
        "thread's CPU time at ×0.62 (1 window before it ran below half speed)"
    )
    slow = capture.TraceWindow(3, 1, (0.9, 0.9, 0.9), (0.8, 0.8, 0.8), (0.3, 0.45, 0.4))
    assert capture.kept_text(slow) == (
        "all 3 windows below half speed; the fastest kept, window 2: its forward passes at ×0.90 of their timed "
        "speed, its steps at ×0.80, its training thread's CPU time at ×0.45 (the what-if may refuse the case)"
    )
