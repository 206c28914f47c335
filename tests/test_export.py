"""Exports round-trip through their consumers: ``pytest-benchmark compare`` reads ours like its own
saved runs, and the customSmallerIsBetter file has exactly the shape github-action-benchmark parses.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from synthetic_runs import make_run

from tpbench import export as exports

REPO = Path(__file__).resolve().parent.parent
PYTEST_BENCHMARK = shutil.which("pytest-benchmark", path=str(Path(sys.executable).parent))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    medians = {
        "ddp": [10.0, 10.4, 9.8, 10.1],
        "zero_no_overlap": [20.0, 21.0, 19.5, 20.2],
        "hook_with_zero_step": [15.0],
    }
    return make_run(tmp_path_factory.mktemp("export"), medians, failed=["hook_with_zero_step"])


def export(run: Path, fmt: str, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tpbench", "export", str(run), "--format", fmt, "-o", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def test_pytest_benchmark_document(run: Path) -> None:
    doc = exports.export_pytest_benchmark(run).document
    assert {"machine_info", "commit_info", "benchmarks", "datetime", "version"} <= doc.keys()
    assert doc["commit_info"]["id"] == "0123456789abcdef"
    by_name = {b["name"]: b for b in doc["benchmarks"]}
    assert set(by_name) == {"ddp", "zero_no_overlap"}  # the failed case has no numbers to export
    s = by_name["ddp"]["stats"]
    data = np.array(s["data"])
    assert s["rounds"] == data.size == 4 * 8  # timed steps, slowest rank, all repeats
    assert s["min"] == data.min() and s["max"] == data.max() and s["median"] == pytest.approx(np.median(data))
    assert s["q1"] <= s["median"] <= s["q3"] and s["iqr"] == pytest.approx(s["q3"] - s["q1"])
    assert s["ops"] == pytest.approx(1 / s["mean"]) and 0.009 < s["median"] < 0.011  # seconds, like pytest-benchmark
    assert by_name["ddp"]["extra_info"]["repeat_medians_ms"] == pytest.approx([10.0, 10.4, 9.8, 10.1], rel=0.02)


@pytest.mark.skipif(PYTEST_BENCHMARK is None, reason="pytest-benchmark's command is not installed")
def test_pytest_benchmark_compare_reads_the_export(run: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "0001_base.json", tmp_path / "0002_cand.json"
    p = export(run, "pytest-benchmark", a)
    assert p.returncode == 0, p.stderr
    shutil.copy(a, b)
    out = subprocess.run(
        [PYTEST_BENCHMARK, "compare", str(a), str(b), "--columns", "min,median,max,rounds", "--group-by", "name"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "Failed to load" not in out.stdout + out.stderr
    # Both benchmarks of both files are in the table, with their 32 rounds and milliseconds shown.
    for name in ("ddp", "zero_no_overlap"):
        rows = [ln for ln in out.stdout.splitlines() if ln.lstrip().startswith(name)]
        assert len(rows) == 2 and all(" 32" in r for r in rows), out.stdout
    assert "(time in ms)" in out.stdout


def test_custom_smaller_is_better(run: Path, tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    p = export(run, "custom-smaller-is-better", path)
    assert p.returncode == 0, p.stderr
    assert "hook_with_zero_step" in p.stderr and "not exported" in p.stderr
    # github-action-benchmark JSON.parse()s the file into BenchmarkResult[]: a list of
    # {name: string, value: number, unit: string, range?: string, extra?: string}; NaN is not JSON.
    entries = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert isinstance(entries, list) and len(entries) == 2
    for e in entries:
        assert set(e) <= {"name", "value", "unit", "range", "extra"}
        assert (
            isinstance(e["name"], str)
            and isinstance(e["unit"], str)
            and isinstance(e["range"], str)
            and isinstance(e["extra"], str)
        )
        assert isinstance(e["value"], (int, float)) and math.isfinite(e["value"])
    by = {e["name"]: e for e in entries}
    assert by["synthetic/ddp"]["unit"] == "ms" and by["synthetic/ddp"]["value"] == pytest.approx(10.05, rel=0.02)
    assert re.fullmatch(r"\[9\.\d+, 10\.\d+\]", by["synthetic/ddp"]["range"])  # the interval extra says
    assert "; tpbench 0.1.0; torch " in by["synthetic/ddp"]["extra"]  # the format has no version field of its own
    # Its 4 repeats' interval is their range, which holds the median with 87.5 % confidence: it said "95% CI".
    extra = by["synthetic/ddp"]["extra"]
    assert re.match(r"range \[9\.\d+, 10\.\d+\] ms \(holds the median with 87\.5% confidence\) over 4 ", extra), extra
    assert len({e["name"] for e in entries}) == len(entries)  # names are the series keys on the dashboard


def test_export_to_stdout_and_bad_format(run: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "tpbench", "export", str(run), "--format", "custom-smaller-is-better"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert p.returncode == 0 and json.loads(p.stdout)[0]["name"].startswith("synthetic/")
    p = subprocess.run(
        [sys.executable, "-m", "tpbench", "export", str(run), "--format", "csv"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert p.returncode == 2


@pytest.mark.parametrize("fmt", exports.EXPORT_FORMATS)
def test_a_run_without_a_finished_case_is_refused_not_exported_empty(tmp_path: Path, fmt: str, capsys) -> None:
    """A run killed before any repeat finished (here every case failed) used to export an empty
    document with exit 0, which a CI job would upload; refused with exit 2 naming the run, as
    ``compare`` refuses nothing to compare, and nothing written."""
    run = make_run(tmp_path / "run", {"ddp": [10.0], "zero_no_overlap": [12.0]}, failed=["ddp", "zero_no_overlap"])
    out = tmp_path / "bench.json"
    assert run_cli(["export", str(run), "--format", fmt, "-o", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{run}: nothing to export: no case has timed steps (2 failed)" in err, err
    assert not out.exists()


def test_pytest_benchmark_names_come_from_all_the_runs_cases(tmp_path: Path) -> None:
    """A case without data (a tune's world left "not raced", an interrupted sweep) used to drop
    the keys only it varied from every name (``ddp[slowdown_pct=0.0]`` for
    ``ddp[world_size=1-slowdown_pct=0.0]``): names follow all the run's cases, so a dashboard's
    series keeps its name whichever cases finished."""
    run = make_run(tmp_path / "run", {"ddp": [10.0, 10.2]}, sweep={"world_size": "[1, 2]"})
    names = {b["extra_info"]["case_id"]: b["name"] for b in exports.export_pytest_benchmark(run).document["benchmarks"]}
    meta = json.loads((run / "run.json").read_text())
    gone = next(cid for cid, c in meta["cases"].items() if c["params"]["world_size"] == 2)
    meta["cases"][gone]["status"] = "pending"  # as a run that never got to that world leaves it
    (run / "run.json").write_text(json.dumps(meta))
    shutil.rmtree(run / "cases" / gone)
    (left,) = exports.export_pytest_benchmark(run).document["benchmarks"]
    assert left["name"] == names[left["extra_info"]["case_id"]] == "ddp[world_size=1]"
    assert left["params"] == {"world_size": 1}


def test_the_range_is_the_interval_itself_not_a_half_width_around_the_median(tmp_path: Path) -> None:
    """A median's bootstrap interval is lopsided where the repeats are: the range was its half-width,
    "35.97 ± 11.97", read as [24.0, 47.9] beside the value while the interval was [16.64, 40.58].
    github-action-benchmark shows the range verbatim beside the value ("35.97 ms (RANGE)" in its
    chart's tooltip): it is the interval now, as ``extra`` says it."""
    from tpbench.analysis.stats import bootstrap_ci

    repeats = [16.0, 17.5, 30.0, 35.0, 36.0, 37.0, 40.0, 41.0]
    (entry,) = exports.export_custom_smaller_is_better(make_run(tmp_path, {"ddp": repeats}, jitter=0.0)).document
    lo, hi = bootstrap_ci(np.array(repeats))
    assert hi - entry["value"] < (entry["value"] - lo) / 2  # lopsided: a ± would misplace it
    assert entry["range"] == f"[{lo:.4g}, {hi:.4g}]"
    assert entry["extra"].startswith(f"95% CI [{lo:.4g}, {hi:.4g}] ms over 8 repeats")


def test_a_case_of_one_repeat_is_exported_without_a_range(tmp_path: Path) -> None:
    """One repeat has no interval: the optional range is left out, not given as "± 0"."""
    entries = exports.export_custom_smaller_is_better(make_run(tmp_path, {"ddp": [10.0]})).document
    (entry,) = entries
    assert "range" not in entry and entry["extra"].startswith("no CI (one repeat) over 1 repeats")
    assert entry["value"] == pytest.approx(10.0, rel=0.02)


def test_export_of_cpu_time_names_the_metric_and_exports_its_values(tmp_path: Path, capsys) -> None:
    """The CI example gates on cpu_ms while export wrote only wall time: the dashboard could not show
    the number the gate judged. ``--metric cpu_ms`` exports the ranks' CPU time per step, its series
    named apart (a chart must not join CPU time to wall time); a run without it is refused."""
    run = make_run(tmp_path / "cpu", {"ddp": [10.0, 10.2, 9.9]}, cpu_ms=lambda case: 4.0)
    [entry] = exports.export_run(run, "custom-smaller-is-better", "cpu_ms").document
    assert entry["name"].endswith("/ddp [cpu_ms]") and entry["value"] == pytest.approx(4.0, rel=0.05)
    [wall] = exports.export_run(run, "custom-smaller-is-better").document
    assert not wall["name"].endswith("]") and wall["value"] == pytest.approx(10.0, rel=0.05)
    doc = exports.export_run(run, "pytest-benchmark", "cpu_ms").document
    [bench] = doc["benchmarks"]
    assert bench["group"].endswith("(cpu_ms)") and bench["extra_info"]["metric"] == "cpu_ms"
    assert bench["stats"]["median"] == pytest.approx(0.004, rel=0.05)  # seconds, as pytest-benchmark writes
    without = make_run(tmp_path / "wall", {"ddp": [10.0, 10.2]})
    assert run_cli(["export", str(without), "--format", "pytest-benchmark", "--metric", "cpu_ms"]) == 2
    assert "--metric cpu_ms was not recorded in this run's steps" in capsys.readouterr().err
    with pytest.raises(exports.GateError) as e:
        exports.export_run(without, "pytest-benchmark", "cpu_ms")
    assert str(e.value) == f"{without}: metric cpu_ms was not recorded in this run's steps"


@pytest.mark.parametrize(
    ("fmt", "metric", "said"),
    [
        ("csv", "step_ms", "fmt 'csv': expected one of pytest-benchmark, custom-smaller-is-better"),
        ("pytest-benchmark", "wall", "metric 'wall': expected one of step_ms, cpu_ms"),
    ],
)
def test_the_python_api_s_errors_name_its_parameters_not_the_command_s_flags(run: Path, fmt, metric, said) -> None:
    """``export_run(run, "csv")`` said "--format csv: ...", a flag the caller of a function never
    typed; its parameters are named, as ``compare.compare``'s ``pairing`` is (the command line's
    choices refuse these values before the function is called, naming the flag)."""
    with pytest.raises(exports.GateError) as e:
        exports.export_run(run, fmt, metric)
    assert str(e.value) == said


def test_runs_of_one_suite_at_other_set_values_export_apart(tmp_path: Path) -> None:
    """Runs at ``--set bucket_cap_mb=4`` and ``=8`` exported the same names, so a dashboard merged their
    series. The names carry the run's --set of what a case measures, spelled alike however typed;
    a run without --set, a budget key (repeats), a key the case ignores (shard_buckets for DDP) or one
    the label already shows leaves a name as it was."""
    medians = {"ddp": [10.0, 10.2, 9.9], "hook_with_zero_step": [12.0, 12.1, 11.9]}

    def names(*sets: str) -> list[str]:
        run = make_run(tmp_path / str(len(list(tmp_path.iterdir()))), medians, overrides=sets)
        return [e["name"] for e in exports.export_custom_smaller_is_better(run).document]

    assert names() == names("repeats=3") == ["synthetic/ddp", "synthetic/hook_with_zero_step"]
    four = ["synthetic/ddp (--set bucket_cap_mb=4)", "synthetic/hook_with_zero_step (--set bucket_cap_mb=4)"]
    assert names("bucket_cap_mb=4") == names("bucket_cap_mb = 4.0", "repeats=3") == four
    assert names("shard_buckets=true", "bucket_cap_mb=8") == [
        "synthetic/ddp (--set bucket_cap_mb=8)",
        "synthetic/hook_with_zero_step (--set bucket_cap_mb=8, shard_buckets=true)",
    ]
    assert names("bucket_cap_mb=[4, 8]")[:2] == ["synthetic/ddp bucket_cap_mb=4", "synthetic/ddp bucket_cap_mb=8"]


def test_pytest_benchmark_names_of_runs_at_other_set_values_differ(tmp_path: Path) -> None:
    """Runs at ``--set bucket_cap_mb=4`` and ``=8`` saved benchmarks of the same names, so
    ``pytest-benchmark compare`` set one against the other as if one case. Names and ``params`` carry
    the run's --set of what a case measures, by custom-smaller-is-better's rule: a run without --set,
    a budget key or a key the case ignores (shard_buckets for DDP) leaves a name as it was."""
    medians = {"ddp": [10.0, 10.2, 9.9], "hook_with_zero_step": [12.0, 12.1, 11.9]}

    def benchmarks(*sets: str) -> list[tuple[str, object]]:
        run = make_run(tmp_path / str(len(list(tmp_path.iterdir()))), medians, overrides=sets)
        return [(b["name"], b["params"]) for b in exports.export_pytest_benchmark(run).document["benchmarks"]]

    assert benchmarks() == benchmarks("repeats=3") == [("ddp", None), ("hook_with_zero_step", None)]
    assert benchmarks("bucket_cap_mb = 4.0", "repeats=3") == [
        ("ddp[bucket_cap_mb=4]", {"bucket_cap_mb": "4"}),
        ("hook_with_zero_step[bucket_cap_mb=4]", {"bucket_cap_mb": "4"}),
    ]
    assert [name for name, _ in benchmarks("shard_buckets=true", "bucket_cap_mb=8")] == [
        "ddp[bucket_cap_mb=8]",
        "hook_with_zero_step[bucket_cap_mb=8-shard_buckets=true]",
    ]


def test_runs_of_one_suite_at_other_filters_export_apart_and_each_case_under_one_name(tmp_path: Path) -> None:
    """Names came from the keys that vary among the cases a --filter kept: runs at ``--filter
    bucket_cap_mb=1`` and ``=4`` both exported "synthetic/ddp", one dashboard series of two settings,
    and the 1 MB case had one name alone and another beside the 4 MB one. Names show the keys the
    suite sweeps, whatever the filter kept."""
    medians = {"ddp": [10.0, 10.2, 9.9], "hook_with_zero_step": [12.0, 12.1, 11.9]}
    sweep = {"bucket_cap_mb": "[1, 4]"}

    def names(*filters: str) -> list[str]:
        run = make_run(tmp_path / str(len(list(tmp_path.iterdir()))), medians, sweep=sweep, filters=filters)
        return [e["name"] for e in exports.export_custom_smaller_is_better(run).document]

    one, four = names("bucket_cap_mb=1", "algorithm=ddp"), names("bucket_cap_mb=4", "algorithm=ddp")
    assert one == ["synthetic/ddp bucket_cap_mb=1"] and four == ["synthetic/ddp bucket_cap_mb=4"]
    assert set(one + four) <= set(names())


def test_a_run_of_two_workloads_exports_in_each_format(tmp_path: Path) -> None:
    """``workload = ["mlp", "resnet"]``: their parameter tables share a key of other values
    (``classes``, ``width``), so ``workload.classes`` varied among the cases too, and the
    pytest-benchmark export stopped on it with a traceback (a Case has no attribute of that name).
    Workload parameters are set per workload, never swept: ``workload`` names the benchmark."""
    run = make_run(
        tmp_path,
        {"ddp": [10.0, 10.2]},
        sweep={"workload": '["mlp", "resnet"]'},
        workloads={"mlp": {"width": 32, "depth": 2}, "resnet": {"preset": '"tiny"'}},
    )
    benchmarks = exports.export_pytest_benchmark(run).document["benchmarks"]
    assert [(b["name"], b["params"]) for b in benchmarks] == [
        ("ddp[workload=mlp]", {"workload": "mlp"}),
        ("ddp[workload=resnet]", {"workload": "resnet"}),
    ]
    entries = exports.export_custom_smaller_is_better(run).document
    assert [e["name"] for e in entries] == ["synthetic/ddp workload=mlp", "synthetic/ddp workload=resnet"]


def test_pytest_benchmark_names_show_the_suites_swept_keys_whatever_the_filter_kept(tmp_path: Path) -> None:
    """pytest-benchmark names came from the keys that vary among the cases a --filter kept: runs at
    ``--filter bucket_cap_mb=1`` and ``=4`` both saved "ddp", so ``pytest-benchmark compare`` set one
    setting against the other. They show the keys the suite sweeps, as custom-smaller-is-better's do."""
    medians = {"ddp": [10.0, 10.2, 9.9], "hook_with_zero_step": [12.0, 12.1, 11.9]}
    sweep = {"bucket_cap_mb": "[1, 4]"}

    def names(*filters: str) -> list[str]:
        run = make_run(tmp_path / str(len(list(tmp_path.iterdir()))), medians, sweep=sweep, filters=filters)
        return [b["name"] for b in exports.export_pytest_benchmark(run).document["benchmarks"]]

    one, four = names("bucket_cap_mb=1", "algorithm=ddp"), names("bucket_cap_mb=4", "algorithm=ddp")
    assert one == ["ddp[bucket_cap_mb=1]"] and four == ["ddp[bucket_cap_mb=4]"]
    assert set(one + four) <= set(names())


def test_pytest_benchmark_names_leave_out_the_keys_a_case_does_not_take(tmp_path: Path) -> None:
    """A swept key that does not apply to a case (``shard_buckets`` of DDP) named it
    "ddp[shard_buckets=None]", with None in its params; custom-smaller-is-better's "ddp" and the
    case's label leave it out, and so does its name now."""
    run = make_run(
        tmp_path,
        {"ddp": [10.0, 10.1], "hook_with_zero_step": [12.0, 12.1]},
        sweep={"shard_buckets": "[true, false]"},
    )
    benchmarks = exports.export_pytest_benchmark(run).document["benchmarks"]
    assert [b["name"] for b in benchmarks] == [
        "ddp",
        "hook_with_zero_step[shard_buckets=True]",
        "hook_with_zero_step[shard_buckets=False]",
    ]
    assert [b["params"] for b in benchmarks] == [None, {"shard_buckets": True}, {"shard_buckets": False}]
