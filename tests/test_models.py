"""The built-in models (gpt, resnet, embedding beside mlp and markov) and the exact memory and work
accounting: every model at its smallest size trains under every algorithm on 2 real Gloo ranks,
and the bytes each rank holds match hand-computed figures."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import sweep_in_process, tiny_suite

from tpbench import algorithms, store
from tpbench.analysis.memory import per_case
from tpbench.report.build import build_report
from tpbench.workloads import WORKLOADS, parameter_count
from tpbench.workloads.gpt import GPT, GPTParams, permutation_chain
from tpbench.workloads.markov import entropy_rate

pytestmark = pytest.mark.ranks  # starts rank processes: not in `make test-fast`

REPO = Path(__file__).resolve().parent.parent
ALGORITHMS = list(algorithms.ALGORITHMS)

SUITE = tiny_suite(
    f"workload = {sorted(WORKLOADS)!r}\nalgorithm = {ALGORITHMS!r}\nshard_buckets = [false, true]".replace("'", '"'),
    batch_size=4,
    warmup_steps=3,
    steps=2,
    timeout_s=120,
    start_localSGD_iter=2,  # post-local SGD goes local within the run
)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> store.Loaded:
    """One sweep: every built-in workload at its smallest size x every algorithm (both shard_buckets)."""
    # In this process: a fresh interpreter would spend seconds importing torch.
    loaded = sweep_in_process(tmp_path_factory.mktemp("models"), SUITE)
    assert loaded.record.status == "complete" and set(loaded.cases["status"]) == {"done"}, loaded.record.cases
    return loaded


def test_every_model_trains_under_every_algorithm(run: store.Loaded) -> None:
    cases = run.cases
    assert set(cases["status"]) == {"done"}
    # 5 workloads x (ddp, zero_no_overlap, post-local SGD + 2 hooks x 2 shard_buckets)
    assert len(cases) == len(WORKLOADS) * 7
    assert set(zip(cases["workload"], cases["algorithm"])) == {(w, a) for w in WORKLOADS for a in ALGORITHMS}
    assert run.steps["loss"].map(math.isfinite).all()


def _accounts(run: store.Loaded, workload: str) -> dict[tuple[str, object], list[dict]]:
    memory = store.read_case_tables(run, "memory").merge(run.cases, on="case_id")
    memory = memory[memory["workload"] == workload].sort_values("rank")
    return {
        (a, s): g.to_dict("records") for (a, s), g in memory.groupby(["algorithm", memory["shard_buckets"].map(str)])
    }


def test_memory_accounting_matches_hand_computed_bytes(run: store.Loaded) -> None:
    """mlp 32 x 2 with 16 classes: W0 32x32 + b0 32, W1 32x32 + b1 32, W2 16x32 + b2 16 = 2640 float32
    parameters (10560 bytes). AdamW holds two float32 tensors per parameter element plus one
    float32 step per tensor: 2640 * 8 + 6 * 4 = 21144 bytes for the whole model."""
    acc = _accounts(run, "mlp")
    full = 2640 * 8 + 6 * 4
    for rows in acc.values():
        assert [r["param_bytes"] for r in rows] == [10560, 10560]
        assert [r["grad_bytes"] for r in rows] == [10560, 10560]
    # Plain DDP (and post-local SGD): every rank holds and steps everything.
    for algo in ("ddp", "post_localSGD_hook"):
        assert [(r["optimizer_state_bytes"], r["stepped_params"]) for r in acc[(algo, "None")]] == [(full, 2640)] * 2
    # zero_no_overlap: ZeRO's greedy partition, largest tensor first to the least-loaded rank:
    # W0, W1 (1024 each) to ranks 0 and 1, W2 (512) to rank 0, the three biases to rank 1.
    assert [
        (r["optimizer_state_bytes"], r["stepped_params"], r["stepped_tensors"])
        for r in acc[("zero_no_overlap", "None")]
    ] == [(1536 * 8 + 2 * 4, 1536, 2), (1104 * 8 + 4 * 4, 1104, 4)]
    for hook in ("hook_with_zero_step", "hook_with_zero_step_interleaved"):
        # One 25 MB bucket: without shard_buckets it goes wholly to rank 0.
        assert [(r["optimizer_state_bytes"], r["stepped_params"]) for r in acc[(hook, "False")]] == [
            (full, 2640),
            (0, 0),
        ]
        # With shard_buckets the bucket (reverse layer order: b2 W2 b1 W1 | b0 W0) is cut at the
        # tensor boundary nearest half its 2640 elements: 1584 (4 tensors) and 1056 (2 tensors).
        assert [
            (r["optimizer_state_bytes"], r["stepped_params"], r["stepped_tensors"]) for r in acc[(hook, "True")]
        ] == [(1584 * 8 + 4 * 4, 1584, 4), (1056 * 8 + 2 * 4, 1056, 2)]


def test_partition_and_what_zero_saves(run: store.Loaded) -> None:
    partition = store.read_case_tables(run, "partition").merge(run.cases, on="case_id")
    mlp = partition[partition["workload"] == "mlp"]
    sharded = mlp[(mlp["algorithm"] == "hook_with_zero_step") & (mlp["shard_buckets"] == True)]  # noqa: E712 - element-wise
    assert sharded[["rank", "bucket", "first", "tensors", "params"]].values.tolist() == [
        [0, 0, 0, 4, 1584],
        [1, 0, 4, 2, 1056],
    ]
    assert set(partition["algorithm"]) == {"zero_no_overlap", "hook_with_zero_step", "hook_with_zero_step_interleaved"}
    memory = store.read_case_tables(run, "memory").assign(run_id="r")
    summary = per_case(memory, partition.assign(run_id="r")[["run_id", "case_id", "rank", "bucket"]]).merge(
        run.cases, on="case_id"
    )
    ddp = summary[summary["algorithm"] == "ddp"].set_index("workload")["ddp_state_bytes"]
    for row in summary[summary["sharded"]].to_dict("records"):
        # Sharded state sums to exactly plain DDP's full state, for every model.
        assert row["ddp_state_bytes"] == ddp[row["workload"]]
    # The summary carries the per-case figures: one bucket without shard_buckets is all the step on one rank.
    mlp_hooks = run.summary[(run.summary["workload"] == "mlp") & (run.summary["algorithm"] == "hook_with_zero_step")]
    assert sorted(mlp_hooks["step_imbalance"]) == [pytest.approx(2 * 1584 / 2640), 2.0]
    assert (mlp_hooks["opt_state_ddp_bytes"] == 2640 * 8 + 6 * 4).all()
    html = build_report([run])
    assert "What ZeRO saves" in html and "one rank steps everything and the others nothing" in html
    assert "rank 0: bucket 0 [0:4] 1,584; rank 1: bucket 0 [4:6] 1,056" in html  # the partition, in words


def test_gpt2_preset_is_gpt2_small() -> None:
    assert parameter_count(GPT, GPTParams(preset="gpt2")) == 124_439_808
    assert GPTParams(preset="gpt2", n_layer=2).n_layer == 2
    with pytest.raises(ValueError, match="preset must be one of"):
        GPTParams(preset="gpt5")
    model = GPT(GPTParams(), _ctx()).build_model()
    assert model.head.weight is model.tokens.weight, "the output layer is tied to the token embedding"


def _ctx():
    from tpbench.workloads import WorkloadContext

    return WorkloadContext(rank=0, world_size=1, batch_size=4, seed=0, device=torch.device("cpu"))


def test_permutation_chain_optimum_is_exact_with_coinciding_successors() -> None:
    """A small vocabulary makes successors coincide; the entropy rate must still be exact: the dense
    matrix is doubly stochastic (uniform is stationary) and markov.entropy_rate agrees."""
    successors, probs, entropy = permutation_chain(states=6, fanout=4, concentration=1.0, seed=3)
    dense = np.zeros((6, 6))
    np.add.at(dense, (np.repeat(np.arange(6), 4), successors.numpy().ravel()), probs.numpy().ravel())
    assert (np.bincount(successors.numpy().ravel(), minlength=6) > 0).all()
    assert dense.sum(axis=0) == pytest.approx(np.ones(6)) and dense.sum(axis=1) == pytest.approx(np.ones(6))
    assert (np.count_nonzero(dense, axis=1) < 4).any(), "the test needs a row with coinciding successors"
    assert entropy == pytest.approx(entropy_rate(dense), abs=1e-12)


def test_list_shows_each_model_presets_and_parameter_counts() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tpbench", "list"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, "COLUMNS": "250"},
    )
    assert proc.returncode == 0, proc.stderr
    for text in ("gpt2: 124.44 M", "resnet18: 11.17 M", "large: 256.02 M", "n_layer=(preset)"):
        assert text in proc.stdout, text
