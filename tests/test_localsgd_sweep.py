"""Post-local SGD through the harness: real 4-rank sweeps (2 emulated nodes x 2 ranks), both
implementations, checked for what model averaging must do to the parameters and the traces.

The hook-level tests (``test_localsgd.py``, ``test_averaging.py``) check the hooks and averagers
against PyTorch's; these check that the harness calls them so that averaging really happens.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path

import pandas as pd
import pytest
from conftest import localsgd_suite, sweep_in_process

from tpbench import store
from tpbench.report import build_report
from tpbench.workloads.markov import TinyTransformer

pytestmark = pytest.mark.ranks  # starts rank processes: not in `make test-fast`

STEPS = 19  # timed steps 0..18; the profiler's warm-up is step 19, traced steps are 20 and 21
MARKOV = {"vocab": 32, "seq_len": 8, "d_model": 16, "n_layers": 1, "n_heads": 2}
MARKOV_TOML = "\n".join(f"{k} = {v}" for k, v in MARKOV.items())
SUITE = localsgd_suite(
    'impl = ["tpbench", "torch"]\naveraging_period = [4, 16]',
    name="lsgd-harness",
    batch_size=8,
    steps=STEPS,
    repeats=1,
    start_localSGD_iter=0,
    eval_every=10,  # a held-out loss every 10 steps: what a tune reads of each setting
    timeout_s=120,
    tables="[capture]\nprofiler_steps = 2\ntrace_windows = 1\n"
    + '[workloads.markov]\nnon_iid = "node"\nheldout_sequences = 16\n'
    + MARKOV_TOML
    + "\n",
)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> store.Loaded:
    return sweep_in_process(tmp_path_factory.mktemp("lsgd"), SUITE)


@pytest.fixture(scope="module")
def averaging_steps(run) -> pd.DataFrame:
    """One row per (case, rank, averaging step): what was measured just before and just after."""
    steps = run.steps.merge(run.cases[["case_id", "impl", "averaging_period"]], on="case_id")
    return steps[steps.param_norm_l2.notna()]


def test_every_case_averages_on_its_schedule(run, averaging_steps):
    assert set(run.cases.status) == {"done"}
    by_period = averaging_steps.groupby("averaging_period").step.unique()
    assert sorted(by_period[4]) == [0, 4, 8, 12, 16]
    assert sorted(by_period[16]) == [0, 16]


def test_parameters_are_equal_across_the_group_right_after_averaging(averaging_steps):
    """Before averaging the two nodes hold different parameters (node-local gradients); right
    after it every rank holds the same ones (the float64 norm of the flat parameters is equal)."""
    for (impl, period), steps in averaging_steps.groupby(["impl", "averaging_period"]):
        before = steps.pivot_table(index="step", columns="rank", values="param_norm_l2")
        after = steps.pivot_table(index="step", columns="rank", values="param_norm_averaged_l2")
        assert (before[0] != before[2]).all(), (impl, period)
        assert after.nunique(axis=1).eq(1).all(), f"{impl}, period {period}: ranks differ after averaging\n{after}"


def test_drift_before_averaging_stays_bounded_and_depends_on_the_period(averaging_steps):
    drift = averaging_steps.groupby(["impl", "averaging_period", "step"]).drift_max_l2.first()
    for impl in ("tpbench", "torch"):
        every4 = drift[impl, 4]
        # Each averaging resets the drift: it does not accumulate over periods.
        assert (every4.loc[8:] <= 1.2 * every4[4]).all(), every4
        # 16 local steps drift further apart than 4.
        assert drift[impl, 16][16] > 2 * every4[16]
    # The harness drives PyTorch's implementation and tpbench's identically.
    assert drift["tpbench"].equals(drift["torch"])


def _collectives_in_averaging(path: Path) -> dict[int, list[tuple[str, str, int]]]:
    """Per traced step (1, 2, ...): the collectives (any thread) that ran inside that step's
    ``tpbench.averaging`` range, as (name, dtype, elements)."""
    with gzip.open(path, "rt") as f:
        spans = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]

    def ranges(name: str) -> list[tuple[float, float]]:
        return sorted((e["ts"], e["ts"] + e["dur"]) for e in spans if e["name"] == name)

    steps = sorted((e["ts"], int(e["name"].split("#")[1])) for e in spans if e["name"].startswith("ProfilerStep#"))
    out: dict[int, list[tuple[str, str, int]]] = {n: [] for _, n in steps}
    for start, end in ranges("tpbench.averaging"):
        step = max(n for ts, n in steps if ts <= start)
        for e in spans:
            if e["name"].startswith("gloo:") and start <= e["ts"] <= end:
                dims = e["args"]["Input Dims"][0]
                out[step].append((e["name"], e["args"]["Input type"][0], math.prod(dims)))
    return out


def test_averaging_traffic_appears_in_the_traces_of_averaging_steps(run):
    """Traced steps 20 and 21 (the suite traces one window: one traced again goes on training):
    with period 4 step 20 averages (one allreduce of every parameter, in float32, inside the
    averaging range) and step 21 does not; with period 16 neither does."""
    n_params = sum(p.numel() for p in TinyTransformer(**MARKOV).parameters())
    for case in run.cases.to_dict("records"):
        for path in store.traces(run.run_dir, case["case_id"]):
            seen = _collectives_in_averaging(path)
            if case["averaging_period"] == 4:
                assert seen == {1: [("gloo:all_reduce", "float", n_params)], 2: []}, (case["case_id"], path.name)
            else:
                assert seen == {1: [], 2: []}, (case["case_id"], path.name)


def test_traced_steps_leave_out_the_drift_measurement_as_the_timed_ones_do(run):
    """The timed steps leave the drift measurement's time out (``untimed_ms``); the traced steps ran
    it, so with period 4 a float64 all-reduce of every parameter (46 ms of a 56 ms mean traced step
    on 4 ranks over 2 cores) counted as the case's exposed communication and its bytes per step.
    Traced steps measure no drift: every traced collective is a float32 all-reduce of the parameters."""
    for case in run.cases.to_dict("records"):
        collectives = store.read_case_table(run.run_dir, case["case_id"], "collectives")
        n_params = sum(p.numel() for p in TinyTransformer(**MARKOV).parameters())
        assert set(collectives["bytes"]) == {4 * n_params}, case["case_id"]


def test_every_traced_collectives_bytes_are_known(run):
    """The drift measurement at an averaging step gathered each rank's distance with an all_gather,
    whose list input Gloo's trace records without a size: the case's bytes per step came out
    unknown (and the what-if said the traces lacked record_shapes). Every collective is sized now."""
    summary = run.summary.set_index("case_id")
    for cid in run.cases["case_id"]:
        collectives = store.read_case_table(run.run_dir, cid, "collectives")
        assert collectives["bytes"].notna().all(), cid
        assert summary.loc[cid, "comm_bytes_per_step"] > 0, cid


# The harness as it was before averaging was fixed: gradients cleared right after the optimizer
# step, so the averager saw none. Installed in the rank processes only, through PYTHONPATH.
OLD_ORDER = """
import dataclasses
from tpbench import training

_post_local = training.BUILDERS["post_localSGD_hook"]


def _old_order(model, ctx):
    built = _post_local(model, ctx)
    step = built.after_backward

    def step_and_zero():
        step()
        built.model.zero_grad(set_to_none=True)

    return dataclasses.replace(built, after_backward=step_and_zero)


training.BUILDERS["post_localSGD_hook"] = _old_order
"""


def test_an_averaging_step_that_would_average_nothing_fails_the_case(tmp_path, monkeypatch):
    patch = tmp_path / "patch"
    patch.mkdir()
    (patch / "sitecustomize.py").write_text(OLD_ORDER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in [str(patch), os.environ.get("PYTHONPATH")] if p))
    text = SUITE.replace("world_size = 4", "world_size = 2").replace("ranks_per_node = 2", "ranks_per_node = 1")
    text = text.replace(f"steps = {STEPS}", "steps = 2").replace("averaging_period = [4, 16]", "averaging_period = [4]")
    text = text.replace("eval_every = 10", "eval_every = 2")  # within its 2 steps
    run = sweep_in_process(tmp_path, text.replace("profiler_steps = 2", "profiler_steps = 0"))
    for case in run.record.cases.values():
        assert case.status == "failed", case
        assert "AveragingSkipped: post_localSGD_hook: model averaging is due at step 0" in case.error
        assert "averager would average none of the" in case.error


def test_a_tune_reads_the_held_out_loss_each_setting_ends_at(run):
    """``tpbench tune`` races step times, which say nothing of how far post-local SGD's steps take
    the model: it reads, from the finalized run's summary as this sweep's, the held-out loss each
    setting ends at and its time to the target (``tune_answer._converged``), for the note it gives when the
    recommended setting ends worse (tests/test_tune.py)."""
    from tpbench import tune_answer

    by_case = run.summary.set_index("case_id")
    for case_id in run.cases["case_id"]:
        loss = tune_answer._converged(by_case, case_id)["heldout_loss"]
        assert loss is not None and loss == pytest.approx(float(by_case.loc[case_id, "final_heldout_loss"]))
        assert math.isfinite(loss) and 0 < loss < math.log(MARKOV["vocab"]) + 1


def test_a_report_without_zero_cases_has_no_what_zero_saves_section(run):
    """Its DDP and post-local SGD cases hold the whole optimizer state each: the section was headed
    "What ZeRO saves" over no ZeRO, and the memory chart pointed to it."""
    assert len(store.read_case_tables(run, "memory"))  # what the section was drawn from
    html = build_report([run])
    assert 'id="zero-saves"' not in html and "What ZeRO saves" not in html
