"""The user's own code under hostile and careless use (docs/reliability.md, "user code"): workload
factories and communication hooks that sleep, exit, fork, change torch's process-wide state or
train into NaN. Each is reported as that factory's or case's failure, with the cause; nothing is
left behind and no other case is affected.

The factories are in tests/data/bad_user_models/user_models.py. Worlds are real 2-rank Gloo sweeps,
started through the real command (``tpbench``): the factories change the state of the process that
validates them, which must not be pytest's.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from conftest import REPO, only_run, run_cli, tiny_suite, tpbench, tpbench_at_once

from tpbench import store, user_code

BAD = REPO / "tests" / "data" / "bad_user_models"


@pytest.fixture
def in_bad(monkeypatch):
    monkeypatch.chdir(BAD)  # factories are imported from where tpbench runs, as the ranks import them
    monkeypatch.syspath_prepend(str(BAD))


def _suite(tmp_path: Path, sweep: str, **defaults: object) -> Path:
    path = tmp_path / "suite.toml"
    path.write_text(tiny_suite(sweep, **defaults))
    return path


def _sweep(tmp_path: Path, suite: Path) -> tuple[int, str, store.Loaded]:
    proc = tpbench("sweep", suite, "--out", tmp_path / "results", "--no-report", cwd=BAD)
    return proc.returncode, proc.stdout + proc.stderr, store.load(only_run(tmp_path / "results"))


def _errors(run: store.Loaded) -> dict[str, str]:
    """Each case's workload (and hook, where it is not the default) → its error ('' when done)."""
    out = {}
    for row in run.cases.itertuples():
        name = row.workload if row.comm_hook == "allreduce" else f"{row.workload}+{row.comm_hook}"
        out[name] = run.record.cases[row.case_id].error or ""
    return out


# --- time limits on user code outside a world -------------------------------------------------------


def test_a_factory_that_sleeps_is_stopped_by_the_time_limit_naming_it(in_bad, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(user_code, "LIMIT_S", 1.0)
    suite = _suite(tmp_path, 'workload = ["user_models:sleeps"]')
    assert run_cli(["validate", str(suite)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err]
    assert (
        f"{suite}: [sweep] workload[0]: user_models:sleeps: did not return within 1 s (called with ctx.device = meta)"
        in err
    )


def test_a_hook_module_that_never_finishes_importing_is_stopped_naming_it(in_bad, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(user_code, "LIMIT_S", 1.0)
    suite = _suite(tmp_path, 'algorithm = ["ddp"]', comm_hook='"sleepy_import:hook"')
    assert run_cli(["validate", str(suite)]) == 2
    assert "sleepy_import:hook (importing sleepy_import): did not return within 1 s" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("factory", "said"),
    [("exits", "called sys.exit(0) instead of returning"), ("interrupts", "raised KeyboardInterrupt instead of")],
)
def test_a_factory_that_exits_or_raises_keyboardinterrupt_fails_as_that_factory(factory, said, tmp_path):
    suite = _suite(tmp_path, f'workload = ["user_models:{factory}"]')
    validate, sweep = ["validate", suite], ["sweep", suite, "--out", tmp_path / "results", "--no-report"]
    for proc in tpbench_at_once(validate, sweep, cwd=BAD):  # neither starts a world
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"user_models:{factory}: {said}" in proc.stderr and "Interrupted" not in proc.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.ranks
@pytest.mark.slow
def test_a_factory_that_exits_on_the_ranks_fails_its_case_naming_systemexit(tmp_path):
    code, out, run = _sweep(tmp_path, _suite(tmp_path, 'workload = ["user_models:exits_on_ranks", "user_models:good"]'))
    assert code == 1, out
    errors = _errors(run)
    assert "raised SystemExit: 0" in errors["user_models:exits_on_ranks"] and errors["user_models:good"] == ""


# --- process hygiene ----------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.ranks
def test_a_factory_that_forks_leaves_no_process_behind_when_its_world_ends(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    suite = _suite(tmp_path, 'workload = ["user_models:forks"]')
    suite.write_text(suite.read_text() + f'[workloads."user_models:forks"]\npid_dir = "{pids}"\n')
    code, out, run = _sweep(tmp_path, suite)
    assert code == 0, out
    forked = [int(p.name) for p in pids.iterdir()]
    assert len(forked) == 2  # one per rank, each meant to sleep for 10 minutes
    deadline = time.monotonic() + 30  # the kill is immediate; reaping by init may lag on a loaded machine
    while any(map(_alive, forked)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(map(_alive, forked)), forked


@pytest.mark.slow  # several worlds, one per failed case (25-40 s): over CI's budget
@pytest.mark.ranks
def test_a_factory_that_changes_torch_state_fails_its_case_and_the_next_starts_clean(tmp_path):
    suite = _suite(tmp_path, 'workload = ["user_models:doubles", "user_models:threads", "user_models:good"]')
    code, out, run = _sweep(tmp_path, suite)
    assert code == 1, out
    errors = _errors(run)
    assert "changed torch's default dtype from float32 to float64" in errors["user_models:doubles"]
    assert re.search(r"changed torch's intra-op thread count from \d+ to 7", errors["user_models:threads"])
    assert errors["user_models:good"] == ""
    # The good case ran clean: the same losses, bit for bit, as in a sweep of it alone.
    alone = tmp_path / "alone"
    alone.mkdir()
    code, out, reference = _sweep(alone, _suite(alone, 'workload = ["user_models:good"]'))
    assert code == 0, out
    good = run.cases.set_index("workload").loc["user_models:good", "case_id"]
    losses = run.steps[run.steps.case_id == good].sort_values(["rank", "step"])["loss"].tolist()
    assert losses == reference.steps.sort_values(["rank", "step"])["loss"].tolist()


def test_every_change_to_torch_state_is_named_between_items(monkeypatch):
    """The flags the world tests do not flip, mocked here: flipping them for real would change the
    state of this test process."""
    import torch

    from tpbench import guards

    before = guards.torch_state()
    monkeypatch.setattr(torch, "is_grad_enabled", lambda: False)
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "medium")
    with pytest.raises(RuntimeError) as e:
        guards.check_torch_state(before)
    assert str(e.value) == (
        "the case (its workload factory or hook) changed torch's grad mode from True to False; "
        "deterministic algorithms flag from False to True; float32 matmul precision from highest to medium"
    )


# --- non-finite training ------------------------------------------------------------------------------


@pytest.mark.slow  # several worlds, one per failed case (25-40 s): over CI's budget
@pytest.mark.ranks
def test_non_finite_training_fails_its_case_with_the_cause_and_is_never_ranked(tmp_path, capsys):
    suite = _suite(
        tmp_path,
        'workload = ["user_models:nan_params", "user_models:good"]\ncomm_hook = ["allreduce", "user_models:nan_grads"]',
        algorithm='"ddp"',
    )
    code, out, run = _sweep(tmp_path, suite)
    assert code == 1, out
    errors = _errors(run)
    assert errors.pop("user_models:good") == ""
    assert len(errors) == 3
    for name, error in errors.items():
        assert "FloatingPointError: non-finite training: " in error, (name, error)
    assert "the loss was nan at step" in errors["user_models:nan_params"]
    # Within the run there is then nothing to rank: the one finished case has no pair.
    assert run_cli(["compare", str(run.run_dir)]) == 2
    assert "nothing to compare" in capsys.readouterr().err


@pytest.mark.ranks
@pytest.mark.slow
def test_compare_never_ranks_a_case_whose_training_became_non_finite(tmp_path, monkeypatch):
    """The same case finite in the baseline and NaN in the candidate: the candidate failed, so the
    comparison is "missing" (exit 3), never a pass or an improvement. The gate judges its sides
    with the same engine (``compare.compare_runs``)."""
    suite = _suite(tmp_path, 'workload = ["user_models:nan_when_asked"]', repeats=2)
    base = tpbench("sweep", suite, "--out", tmp_path / "base", "--no-report", cwd=BAD)
    assert base.returncode == 0, base.stdout + base.stderr
    monkeypatch.setenv("TPBENCH_TEST_NAN", "1")
    cand = tpbench("sweep", suite, "--out", tmp_path / "cand", "--no-report", cwd=BAD)
    assert cand.returncode == 1, cand.stdout + cand.stderr
    runs = [only_run(tmp_path / "base"), only_run(tmp_path / "cand")]
    proc = tpbench("compare", *runs, "--format", "json", cwd=BAD)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    (case,) = json.loads(proc.stdout)["cases"]
    assert case["verdict"] == "missing" and "failed" in case["reason"], case


@pytest.mark.ranks
def test_a_multi_line_error_is_reported_by_its_type_and_first_line_and_the_suite_key_that_mends_it(tmp_path):
    """DDP's unused-parameter error runs over several lines: the case's error names it by its first
    (its last line, "... as part of this error", says neither what nor why), and the suite key that
    mends it, DDP's advice being an argument the suite's user never passes; with the key the same
    model runs."""
    sweep = 'workload = ["user_models:unused_parameter"]\nfind_unused_parameters = [false, true]'
    code, out, run = _sweep(tmp_path, _suite(tmp_path, sweep))
    assert code == 1, out
    by_key = {row.find_unused_parameters: row for row in run.cases.itertuples()}
    error = run.record.cases[by_key[False].case_id].error
    assert "raised RuntimeError: Expected to have finished reduction in the prior iteration" in error, error
    assert "set find_unused_parameters = true in the suite" in error, error
    said = " ".join(out.split())  # rich wraps lines
    assert "raised RuntimeError: Expected to have finished reduction" in said
    assert "set find_unused_parameters = true in the suite" in said
    assert by_key[True].status == "done", run.record.cases[by_key[True].case_id].error


HOOKS = ("hook_raises", "returns_none", "short_result", "not_decompressed")


@pytest.fixture(scope="module")
def broken_hooks(tmp_path_factory) -> tuple[int, str, store.Loaded]:
    """One sweep of each broken hook of user_models.py under DDP and a ZeRO hook: the tests below
    each read their own cases of it."""
    tmp = tmp_path_factory.mktemp("hooks")
    hooks = ", ".join(f'"user_models:{h}"' for h in HOOKS)
    sweep = f'algorithm = ["ddp", "hook_with_zero_step"]\ncomm_hook = [{hooks}]'
    return _sweep(tmp, _suite(tmp, sweep, warmup_steps=3))


def _hook_errors(run: store.Loaded) -> dict[tuple[str, str], str]:
    """(algorithm, comm_hook) → that case's error ('' when done)."""
    return {(r.algorithm, r.comm_hook): run.record.cases[r.case_id].error or "" for r in run.cases.itertuples()}


@pytest.mark.ranks
def test_a_rank_error_raised_in_the_users_code_names_where(broken_hooks):
    """A hook that raised failed its case with "rank 0 raised ValueError: my hook is broken", its own
    words, naming neither the hook nor its file: the case's error now ends with the innermost frame
    of the user's code (tpbench's, torch's and Python's frames skipped), relative to where tpbench
    runs; an error of tpbench's own (a hook returning None) gets no such suffix."""
    code, out, run = broken_hooks
    assert code == 1, out
    errors = {hook: error for (algorithm, hook), error in _hook_errors(run).items() if algorithm == "ddp"}
    source = (BAD / "user_models.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, start=1) if "my hook is broken" in text)
    assert errors["user_models:hook_raises"].endswith(
        f"raised ValueError: my hook is broken (at user_models.py:{line}, in hook_raises)"
    ), errors
    assert errors["user_models:returns_none"].endswith("whose value is the bucket's reduced tensor"), errors


@pytest.mark.ranks
def test_a_hook_whose_result_is_not_the_buckets_size_or_dtype_fails_its_cases_naming_the_hook(broken_hooks):
    """A result one element short ran "done" under DDP (a view of the bucket) and failed the ZeRO
    hooks with "start (…) + length (…) exceeds dimension size (…)"; an undecompressed fp16 result
    failed them with "expected dtype float … but got dtype c10::Half": neither named the hook. DDP
    casts an fp16 result into the gradients, so there that hook still runs."""
    code, out, run = broken_hooks
    assert code == 1, out
    found = _hook_errors(run)
    for algorithm in ("ddp", "hook_with_zero_step"):
        error = found[(algorithm, "user_models:short_result")]
        assert "comm_hook user_models:short_result: its future's value for bucket 0 is a tensor of" in error, error
        assert "expected one tensor of the bucket's" in error, error
    assert found[("ddp", "user_models:not_decompressed")] == ""
    error = found[("hook_with_zero_step", "user_models:not_decompressed")]
    assert "inner hook user_models:not_decompressed returned torch.float16 ×" in error, error
    assert "the optimizer steps on the bucket's reduced gradients, torch.float32 ×" in error, error


@pytest.mark.ranks
def test_a_hook_that_returns_no_future_fails_its_cases_naming_the_hook(broken_hooks):
    """Registered on DDP or wrapped by a ZeRO hook, a hook returning None crashed the rank (SIGSEGV)."""
    code, out, run = broken_hooks
    assert code == 1, out
    errors = [e for (_, hook), e in _hook_errors(run).items() if hook == "user_models:returns_none"]
    assert len(errors) == 2, errors
    for error in errors:
        assert (
            "TypeError: comm_hook user_models:returns_none: returned NoneType, expected a torch.futures.Future" in error
        )
