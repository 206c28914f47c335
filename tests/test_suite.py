"""Suite validation and expansion: every bad input is refused before anything runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tpbench.suite import MAX_CASES, Machine, SuiteError, expand, load, parse, select, varying_keys, with_overrides

CPU = Machine(gpus=0)
REPO = Path(__file__).resolve().parent.parent

BASE = """
[suite]
name = "t"
[defaults]
world_size = 2
steps = 3
[sweep]
algorithm = ["ddp", "zero_no_overlap"]
bucket_cap_mb = [1, 4]
"""


def test_grid_expansion_and_stable_ids():
    cases = expand(parse(BASE, "t.toml"), CPU)
    assert len(cases) == 4
    again = expand(parse(BASE, "t.toml"), CPU)
    assert [c.case_id for c in cases] == [c.case_id for c in again]
    assert len({c.case_id for c in cases}) == 4
    assert varying_keys(cases) == ["algorithm", "bucket_cap_mb"]


def test_irrelevant_dimension_is_collapsed():
    # shard_buckets means nothing to ddp or zero_no_overlap: it must not double their cases.
    suite = parse(BASE + "shard_buckets = [false, true]\n", "t.toml")
    cases = expand(suite, CPU)
    assert len(cases) == 4
    assert all(c.shard_buckets is None for c in cases)


def test_auto_resolves_to_two_gloo_ranks_on_cpu_and_gpus_with_nccl():
    cpu = expand(parse('[sweep]\nalgorithm = ["ddp"]\n'), CPU)[0]
    assert (cpu.world_size, cpu.backend, cpu.device) == (2, "gloo", "cpu")
    gpu = expand(parse('[defaults]\ninterconnect = "nccl-default"\n'), Machine(gpus=4))[0]
    assert (gpu.world_size, gpu.backend, gpu.device) == (4, "nccl", "cuda")


def test_ids_ignore_budget_keys_but_not_measured_parameters():
    a = expand(parse("[defaults]\ntimeout_s = 10\nrepeats = 2\n"), CPU)[0]
    b = expand(
        parse("[defaults]\ntimeout_s = 20\nrepeats = 5\nsteps = 7\nslowdown_pct = 10\n[capture]\nprofiler_steps = 0\n"),
        CPU,
    )[0]
    c = expand(parse("[defaults]\nbucket_cap_mb = 4\n"), CPU)[0]
    assert a.case_id == b.case_id != c.case_id
    # A budget key the suite sweeps keeps its cases apart within the run.
    swept = expand(parse("[sweep]\nsteps = [4, 8]\n"), CPU)
    assert len({c.case_id for c in swept}) == 2


def test_overrides_replace_sweeps_and_defaults_and_reach_tables():
    suite = with_overrides(
        parse(BASE, "t.toml"), ["bucket_cap_mb=25", "steps=9", "workloads.mlp.width=32", "capture.profiler_steps=0"]
    )
    cases = expand(suite, CPU)
    assert {c.bucket_cap_mb for c in cases} == {25}
    assert all(c.steps == 9 and dict(c.workload_params)["width"] == 32 and c.profiler_steps == 0 for c in cases)
    assert len(cases) == 2


def test_filters():
    cases = expand(parse(BASE, "t.toml"), CPU)
    assert {c.algorithm for c in select(cases, ["algorithm=ddp"])} == {"ddp"}
    assert len(select(cases, ["bucket_cap_mb=1|4", "algorithm!=ddp"])) == 2
    assert select(cases, [f"id={cases[0].case_id[:6]}"]) == [cases[0]]
    with pytest.raises(SuiteError, match="unknown key 'nope'"):
        select(cases, ["nope=1"])


def test_every_bad_input_of_the_catalogue_is_refused_by_the_library():
    """The same catalogue the CLI is tested with (tests/data/bad_suites), at the library level."""
    for path in sorted((REPO / "tests" / "data" / "bad_suites").glob("*.toml")):
        expected = path.read_text().splitlines()[0].removeprefix("# expect: ")
        with pytest.raises(SuiteError) as e:
            expand(load(path), Machine(gpus=0, max_ranks=8, max_cases=MAX_CASES, capacity="2 cores, 4 GiB"))
        assert str(e.value).startswith(f"{path}: ") and expected in str(e.value), path


def test_missing_file():
    with pytest.raises(SuiteError, match="no such suite file"):
        load("/nonexistent/suite.toml")


@pytest.mark.ranks
def test_cli_unknown_key_exits_2_names_key_and_writes_nothing(tmp_path):
    suite = tmp_path / "bad.toml"
    suite.write_text("[defaults]\nstepz = 3\n")
    out = tmp_path / "results"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpbench",
            "sweep",
            str(suite),
            "--out",
            str(out),
            "--reports-dir",
            str(tmp_path / "reports"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "bad.toml" in proc.stderr and "stepz" in proc.stderr and "expected one of" in proc.stderr
    assert not out.exists() and not (tmp_path / "reports").exists()


def test_shipped_suites_validate():
    for path in sorted((REPO / "suites").glob("*.toml")):
        assert expand(load(path), CPU), path
