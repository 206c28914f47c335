"""The DDP buckets every case really built, and zero_no_overlap's packed baseline, in a real sweep:
2 Gloo ranks of gpt mini, at 1 MB buckets and at DDP's own default (no ``bucket_cap_mb`` passed)."""

from __future__ import annotations

import html
import re

import pytest
from conftest import sweep_in_process, tiny_suite

from tpbench import compare, store
from tpbench.report import write_report

pytestmark = pytest.mark.ranks  # starts rank processes: not in `make test-fast`

MB = 2**20


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    text = tiny_suite(
        'algorithm = ["ddp", "zero_no_overlap", "hook_with_zero_step"]\n'
        'bucket_cap_mb = [1, "default"]\n'
        "parameters_as_bucket_view = [false, true]\n",
        name="buckets",
        workload='"gpt"',
        batch_size=2,
        warmup_steps=3,
        steps=2,
        repeats=2,
    )
    text += '[workloads.gpt]\npreset = "mini"\nblock_size = 32\n'
    folder = tmp_path_factory.mktemp("buckets")
    return sweep_in_process(folder, text)


def test_packed_baseline_runs_only_for_zero_no_overlap(run):
    cases = run.cases
    assert set(cases["status"]) == {"done"}
    packed = cases.groupby("algorithm")["parameters_as_bucket_view"].agg(lambda s: sorted(map(str, s)))
    assert packed["zero_no_overlap"] == ["False", "False", "True", "True"]
    assert packed["hook_with_zero_step"] == packed["ddp"] == ["None", "None"]


def test_summary_holds_the_buckets_every_case_built(run):
    summary = run.summary.set_index("case_id")
    memory = store.read_case_tables(run, "memory").groupby("case_id")["grad_bytes"].first()
    for case in run.cases.to_dict("records"):
        row = summary.loc[case["case_id"]]
        sizes = list(row["ddp_bucket_bytes"])
        assert row["ddp_buckets"] == len(sizes) and row["ddp_first_bucket_bytes"] == sizes[0], case["label"]
        # Every gradient byte is in exactly one bucket: the sizes are DDP's, not an estimate.
        assert sum(sizes) == memory[case["case_id"]], case["label"]
        if case["bucket_cap_mb"] == 1:
            # 3.7 MB of gradients at 1 MB caps (a bucket closes once it reaches its cap).
            assert len(sizes) == 4 and all(s < 1.1 * MB for s in sizes), (case["label"], sizes)
        else:
            # Nothing passed: DDP's 1 MB first bucket, then up to 25 MB (one cap for all would give one bucket).
            assert len(sizes) == 2 and sizes[0] < 1.1 * MB < sizes[1], (case["label"], sizes)
        if case["algorithm"] == "hook_with_zero_step":
            assert row["zero_buckets"] == len(sizes)


def test_report_says_the_buckets_and_splits_the_hooks_advantage(run, tmp_path):
    page = html.unescape(write_report([run.run_dir], tmp_path / "report.html").read_text())
    # bucket_cap_mb counts MiB (2**20 bytes), and so do the sizes beside it (the MB/step columns are 1e6).
    assert re.search(r"bucket_cap_mb = 1 → 4 buckets of 0\.\d\d–1\.\d\d MiB \(first ", page)
    assert 'bucket_cap_mb = "default" → 2 buckets of' in page
    assert "comes from packing the broadcasts (zero_no_overlap with parameters_as_bucket_view = true)" in page
    # Each setting's split is a row of the table under the sentence.
    assert 'id="attribution"' in page
    assert "<td>at 1 MB buckets</td>" in page and "<td>at DDP's default buckets</td>" in page


def test_a_cap_per_bucket_reaches_ddp(tmp_path):
    """bucket_cap_mb_list in a sweep: [1] holds the tiny mlp in one bucket, a small first cap splits it."""
    text = tiny_suite('bucket_cap_mb_list = [[0.002, 1], [1]]\nalgorithm = ["ddp", "zero_no_overlap"]\n', name="caps")
    run = sweep_in_process(tmp_path, text)
    built = {
        (row["algorithm"], tuple(row["bucket_cap_mb_list"])): row["ddp_buckets"]
        for row in run.summary.to_dict("records")
    }
    assert built == {
        ("ddp", (0.002, 1)): 2,
        ("ddp", (1,)): 1,
        ("zero_no_overlap", (0.002, 1)): 2,
        ("zero_no_overlap", (1,)): 1,
    }
    page = html.unescape(write_report([run.run_dir], tmp_path / "report.html").read_text())
    assert "bucket_cap_mb_list = [0.002, 1] → 2 buckets of" in page
    # `tpbench compare RUN_DIR` pairs cases by a list-valued key too.
    keys = [p.key for p in compare.within_run(run).pairs]
    assert keys.count("bucket_cap_mb_list") == 2 and keys.count("algorithm") == 2
