"""The suite key comm_hook: what is refused and why, a user's hook through a real sweep, and the
bytes each hook puts on the wire, counted from real traces.

Bad hook inputs that refuse the same way on every machine are in tests/data/bad_suites; here are
those that depend on the torch build (bf16) or on a file written for the test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from conftest import tiny_suite, tpbench
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from world import run_world

from tpbench import store
from tpbench.analysis.stats import Ratio
from tpbench.comm_hooks import Bf16Support
from tpbench.hooks import hook_with_zero_step
from tpbench.report.build import build_report
from tpbench.report.comm_hooks import _figure, winner_lines
from tpbench.report.verdicts import ZERO_KINDS, Comparison
from tpbench.suite import Case, Machine, SuiteError, case_id, expand, parse

CPU = Machine(gpus=0)
EXAMPLE_HOOK = "examples.comm_hooks.scaled_fp16:scaled_fp16_hook"


def _bf16_on_this_torch(rank: int, world_size: int) -> dict[str, Any]:
    """What PyTorch itself does with bf16 compression here: DDP registering the hook directly, a
    ZeRO hook wrapping it, and Gloo all-reducing bfloat16."""
    out: dict[str, Any] = {}
    try:
        DDP(torch.nn.Linear(4, 4)).register_comm_hook(None, bf16_compress_hook)
        out["direct"] = None
    except TypeError as e:
        out["direct"] = str(e)
    ddp = DDP(torch.nn.Linear(4, 4))
    zero = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD, overlap_with_ddp=True, lr=0.1)
    ddp.register_comm_hook(None, hook_with_zero_step(bf16_compress_hook, ddp, zero))
    t = torch.full((3,), 1.5, dtype=torch.bfloat16)
    dist.all_reduce(t)
    out["gloo_sum"] = t.float().tolist()
    return out


@pytest.mark.ranks
def test_bf16_refused_exactly_where_pytorch_refuses_it(what_ddp_does: dict[str, Any]) -> None:
    found = what_ddp_does["bf16"]
    support = Bf16Support.detect()
    assert (found["direct"] is None) == (support.refusal("gloo", wrapped=False) is None), found
    assert support.refusal("gloo", wrapped=True) is None  # the wrapped hook registered above
    assert found["gloo_sum"] == [3.0, 3.0, 3.0]
    suite = parse(
        '[defaults]\nworld_size = 2\ncomm_hook = "bf16_compress"\n[sweep]\n'
        'algorithm = ["hook_with_zero_step", "hook_with_zero_step_interleaved"]\n',
        "bf16.toml",
    )
    assert len(expand(suite, CPU)) == 2
    direct = parse(
        '[defaults]\nworld_size = 2\ncomm_hook = "bf16_compress"\nalgorithm = "zero_no_overlap"\n', "bf16.toml"
    )
    if found["direct"] is None:
        assert len(expand(direct, CPU)) == 1
    else:
        with pytest.raises(
            SuiteError, match=r"bf16\.toml: \[defaults\] comm_hook: bf16_compress: PyTorch's DDP registers"
        ):
            expand(direct, CPU)


def test_bf16_rules() -> None:
    cpu_build = Bf16Support(gpu_build=False, nccl=None, xccl=False, torch_version="2.13.0+cpu")
    assert "this torch (2.13.0+cpu) is not" in cpu_build.refusal("gloo", wrapped=False)
    assert cpu_build.refusal("gloo", wrapped=True) is None
    old_nccl = Bf16Support(gpu_build=True, nccl=(2, 9, 6), xccl=False)
    assert "NCCL 2.9.6" in old_nccl.refusal("nccl", wrapped=True)
    assert "CUDA 11+ and NCCL 2.10+" in old_nccl.refusal("gloo", wrapped=False)
    assert Bf16Support(gpu_build=True, nccl=(2, 10, 3), xccl=False).refusal("nccl", wrapped=False) is None


def test_module_that_fails_on_import_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_hooks.py").write_text("raise ZeroDivisionError('half-written module')\n")
    monkeypatch.chdir(tmp_path)  # hooks are imported from where tpbench runs, as the ranks import them
    with pytest.raises(SuiteError, match=r"comm_hook: .*cannot import 'broken_hooks'.*ZeroDivisionError: half-written"):
        expand(parse('[defaults]\nworld_size = 2\ncomm_hook = "broken_hooks:hook"\n', "t.toml"), CPU)


_IMPORTS = "import torch\nimport torch.distributed as dist\n\n"
_TYPED = "def typed(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:\n    ...\n"
_DDP_RULE_HOOKS = {
    "ddp_rule_hooks": _IMPORTS
    + "def plain(state, bucket):\n    ...\n"
    + "def other_name(state, grad_bucket):\n    ...\n"
    + "def wrong_return(state, bucket) -> torch.Tensor:\n    ...\n"
    + _TYPED,
    "ddp_rule_lazy_hooks": "from __future__ import annotations\n" + _IMPORTS + _TYPED,
}
_DDP_RULE_PATHS = [
    "ddp_rule_hooks:plain",
    "ddp_rule_hooks:other_name",
    "ddp_rule_hooks:typed",
    "ddp_rule_hooks:wrong_return",
    "ddp_rule_lazy_hooks:typed",
]


def _ddp_registers(rank: int, world_size: int, where: str) -> dict[str, bool]:
    """Which of the hooks DDP's register_comm_hook accepts."""
    import importlib
    import sys

    sys.path.insert(0, where)
    out = {}
    for path in _DDP_RULE_PATHS:
        module, _, name = path.partition(":")
        try:
            DDP(torch.nn.Linear(4, 4)).register_comm_hook(None, getattr(importlib.import_module(module), name))
            out[path] = True
        except (KeyError, ValueError):
            out[path] = False
    return out


def _what_ddp_does(rank: int, world_size: int, where: str) -> dict[str, Any]:
    return {"bf16": _bf16_on_this_torch(rank, world_size), "registers": _ddp_registers(rank, world_size, where)}


@pytest.fixture(scope="module")
def what_ddp_does(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One 2-rank Gloo world asks PyTorch both questions above: bf16 compression, and which of
    ``_DDP_RULE_HOOKS`` (written to ``where``) DDP registers."""
    where = tmp_path_factory.mktemp("ddp_rule_hooks")
    for module, text in _DDP_RULE_HOOKS.items():
        (where / f"{module}.py").write_text(text)
    return run_world(_what_ddp_does, 2, str(where), timeout_s=60)[0] | {"where": where}


@pytest.mark.ranks
def test_hooks_ddp_would_refuse_are_refused_at_validation_where_ddp_registers_them(
    what_ddp_does: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """DDP looks the bucket up by the name ``bucket`` and compares annotations with real types: a hook
    it refuses failed every case on every rank with a bare ``KeyError: 'bucket'``. Refused up front
    exactly where DDP registers it (``ddp``); the ZeRO hooks, which call it themselves, take it."""
    # hooks are imported from where tpbench runs, as the ranks import them
    monkeypatch.chdir(what_ddp_does["where"])
    registers = what_ddp_does["registers"]
    assert registers == {p: p in ("ddp_rule_hooks:plain", "ddp_rule_hooks:typed") for p in _DDP_RULE_PATHS}
    for path, ok in registers.items():
        direct = parse(f'[defaults]\nworld_size = 2\ncomm_hook = "{path}"\n', "t.toml")
        wrapped = parse(
            f'[defaults]\nworld_size = 2\ncomm_hook = "{path}"\nalgorithm = "hook_with_zero_step"\n', "t.toml"
        )
        assert len(expand(wrapped, CPU)) == 1
        if ok:
            assert len(expand(direct, CPU)) == 1
        else:
            with pytest.raises(SuiteError, match=rf"t\.toml: \[defaults\] comm_hook: .*'{path}' .*DDP requires"):
                expand(direct, CPU)


def test_state_collapses_for_builtin_hooks_and_old_ids_stay() -> None:
    suite = parse(
        f'[defaults]\nworld_size = 2\ncomm_hook_state = "examples.comm_hooks.scaled_fp16:make_state"\n'
        f'[sweep]\ncomm_hook = ["allreduce", "fp16_compress", "{EXAMPLE_HOOK}"]\n'
        'algorithm = ["ddp", "post_localSGD_hook"]\n',
        "t.toml",
    )
    cases = expand(suite, CPU)
    assert len(cases) == 6  # post-local SGD at "never" is plain DDP, with any hook of one's own
    assert {c.comm_hook: c.comm_hook_state for c in cases} == {
        "allreduce": None,
        "fp16_compress": None,
        EXAMPLE_HOOK: "examples.comm_hooks.scaled_fp16:make_state",
    }
    # A case recorded before comm_hook existed reads back with the same id as the all-reduce case.
    plain = next(c for c in cases if c.comm_hook == "allreduce" and c.algorithm == "ddp")
    old = {k: v for k, v in plain.params().items() if k not in ("comm_hook", "comm_hook_state")}
    assert case_id(Case.from_params(old)) == plain.case_id
    assert len({c.case_id for c in cases}) == 6


def _sweep(tmp_path: Path, *args: str) -> store.Loaded:
    proc = tpbench("sweep", *args, "--out", tmp_path / "results", "--no-report")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return store.load(next(store.iter_runs(tmp_path / "results")))


def _bytes(run: store.Loaded) -> dict[tuple[str, str], tuple[float, float]]:
    table = run.cases[["case_id", "algorithm", "comm_hook"]].merge(
        run.summary[["case_id", "allreduce_bytes_per_step", "comm_bytes_per_step"]], on="case_id"
    )
    return {
        (r["algorithm"], r["comm_hook"]): (r["allreduce_bytes_per_step"], r["comm_bytes_per_step"])
        for r in table.to_dict("records")
    }


def _gradient_bytes(width: int, depth: int, classes: int) -> int:
    return 4 * (depth * (width * width + width) + width * classes + classes)


@pytest.mark.ranks
@pytest.mark.slow
def test_example_hook_runs_through_a_real_sweep_at_half_the_bytes(tmp_path: Path) -> None:
    """examples/comm_hooks from the repository root, as docs/hooks.md says: registered by ddp and
    wrapped by both ZeRO hooks, next to DDP's all-reduce and PyTorch's fp16 compression."""
    run = _sweep(
        tmp_path,
        "examples/comm_hooks/suite.toml",
        "--set",
        "steps=2",
        "--set",
        "repeats=1",
        "--set",
        "capture.profiler_steps=2",
    )
    assert set(run.cases["status"]) == {"done"} and len(run.cases) == 9
    assert run.steps["loss"].notna().all()
    fp32 = _gradient_bytes(width=256, depth=3, classes=16)
    found = _bytes(run)
    for algorithm in ("ddp", "hook_with_zero_step", "hook_with_zero_step_interleaved"):
        broadcasts = fp32 if algorithm != "ddp" else 0  # ZeRO sends each updated parameter once, in fp32
        assert found[(algorithm, "allreduce")] == (fp32, fp32 + broadcasts)
        for hook in ("fp16_compress", EXAMPLE_HOOK):
            assert found[(algorithm, hook)] == (fp32 / 2, fp32 / 2 + broadcasts), (algorithm, hook)
    html = build_report([run])
    assert "Communication hook: bytes on the wire and which ZeRO hook wins" in html
    assert f"with {EXAMPLE_HOOK}, undecided (one repeat)" in html  # a single repeat calls nothing


@pytest.mark.ranks
@pytest.mark.slow
def test_compression_composes_with_post_local_sgd_and_bf16_with_zero_hooks(tmp_path: Path) -> None:
    suite = tmp_path / "compose.toml"
    suite.write_text(
        tiny_suite(
            'algorithm = ["post_localSGD_hook", "hook_with_zero_step_interleaved"]\n'
            'comm_hook = ["allreduce", "fp16_compress"]',
            warmup_steps=3,
            steps=2,
            timeout_s=300,  # the default
            start_localSGD_iter=0,
            averaging_period=1000,
            profiler_steps=2,
        )
    )
    run = _sweep(tmp_path, str(suite))
    found = _bytes(run)
    fp32 = _gradient_bytes(width=32, depth=2, classes=16)
    # Averaging every 1000 steps: the traced steps carry only the gradients, post-local SGD's or ZeRO's.
    assert found[("post_localSGD_hook", "allreduce")] == (fp32, fp32)
    assert found[("post_localSGD_hook", "fp16_compress")] == (fp32 / 2, fp32 / 2)
    assert found[("hook_with_zero_step_interleaved", "fp16_compress")] == (fp32 / 2, fp32 / 2 + fp32)
    bf16 = _sweep(
        tmp_path / "bf16",
        str(suite),
        "--set",
        'algorithm=["hook_with_zero_step_interleaved"]',
        "--set",
        'comm_hook=["bf16_compress"]',
    )
    assert _bytes(bf16)[("hook_with_zero_step_interleaved", "bf16_compress")] == (fp32 / 2, fp32 / 2 + fp32)


def _pair(hook: str, bucket: float, ratio: float, lo: float, hi: float) -> Comparison:
    kind = ZERO_KINDS[0]  # interleaved / sequential
    context = {"bucket_cap_mb": bucket, "comm_hook": hook}
    reps = {"repeat_medians_ms": [1.0] * 5}  # the 5 rounds the ratio rests on (their values are not read)
    return Comparison(
        kind,
        "run",
        {"algorithm": "hook_with_zero_step_interleaved", **context, **reps},
        {"algorithm": "hook_with_zero_step", **context, **reps},
        context,
        {},
        Ratio(ratio, lo, hi, 5, "paired"),
    )


def test_report_says_per_bucket_size_whether_compression_changes_the_winner() -> None:
    lines = winner_lines(
        [
            _pair("allreduce", 2, 0.90, 0.85, 0.95),
            _pair("fp16_compress", 2, 1.10, 1.05, 1.15),
            _pair("allreduce", 8, 0.90, 0.85, 0.95),
            _pair("fp16_compress", 8, 0.92, 0.88, 0.97),
            _pair("allreduce", 32, 1.10, 1.05, 1.15),
            _pair("fp16_compress", 32, 1.01, 0.97, 1.05),
            _pair("fp16_compress", 64, 1.10, 1.05, 1.15),  # no all-reduce twin: nothing to compare with
        ]
    )
    assert len(lines) == 3
    two, eight, big = lines
    assert two.startswith(
        "At 2 MB buckets: with allreduce, interleaved wins (interleaved/sequential 0.90 [0.85, 0.95]: faster, "
        "not shown beyond the ±5% threshold; this run resolves ±5.7%)"
    )
    assert two.endswith("Compression changes the answer: interleaved with allreduce, sequential with fp16_compress.")
    assert eight.endswith("Compression does not change the answer (interleaved).")
    assert big.endswith(
        "Compression changes the answer: sequential with allreduce, no clear winner with fp16_compress."
    )


def test_report_does_not_say_compression_keeps_or_changes_an_answer_the_run_did_not_decide() -> None:
    """An interval that holds no change but reaches beyond the threshold (2 MB: ±48%; at 8 MB the
    all-reduce hook's) could hide either winner: "Compression does not change the answer (no clear
    winner)" and "changes the answer: interleaved with allreduce, no clear winner with fp16_compress"
    both read as findings where the run found nothing. A tie within the threshold is an answer."""
    lines = winner_lines(
        [
            _pair("allreduce", 2, 1.03, 0.85, 1.25),
            _pair("fp16_compress", 2, 0.83, 0.40, 1.70),
            _pair("allreduce", 4, 0.90, 0.85, 0.95),
            _pair("fp16_compress", 4, 0.83, 0.40, 1.70),
            _pair("allreduce", 8, 1.03, 0.85, 1.25),
            _pair("fp16_compress", 8, 0.90, 0.85, 0.95),
            _pair("allreduce", 16, 1.01, 0.97, 1.04),
            _pair("fp16_compress", 16, 1.00, 0.98, 1.03),
        ]
    )
    two, four, eight, sixteen = lines
    for line in (two, four, eight):
        assert "Compression changes" not in line and "Compression does not change" not in line, line
    assert two.endswith("Whether compression changes the answer is not shown: undecided with allreduce, fp16_compress.")
    assert four.endswith("Whether compression changes the answer is not shown: undecided with fp16_compress.")
    assert eight.endswith("Whether compression changes the answer is not shown: undecided with allreduce.")
    assert sixteen.endswith("Compression does not change the answer (no clear winner).")


def test_the_wrapped_hooks_chart_plots_its_ratios_on_a_log_axis() -> None:
    """interleaved / sequential with its interval, as the crossover chart plots it (on a log axis since
    8a82424): on a linear one an interval such as [0.06, 36.6] pressed every other point flat, and twice as
    fast sat half as far from 1 as twice as slow."""
    fig = _figure([_pair("allreduce", 2, 0.90, 0.85, 0.95), _pair("fp16_compress", 2, 1.49, 0.06, 36.6)])
    assert fig.layout.yaxis.type == "log" and "(log scale)" in fig.layout.yaxis.title.text


_OWN_HOOKS = '''import torch
import torch.distributed as dist


def local_only(state, bucket):
    """Never communicates: every rank steps with its own gradients."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def averaged(state, bucket):
    tensor = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda f: f.value()[0])
'''


@pytest.mark.ranks
def test_a_hook_of_your_own_that_never_communicates_fails_its_case_with_the_reason(tmp_path: Path) -> None:
    """A hook returning each rank's own gradients ran "done" at a fraction of the all-reduce's step
    time, winning every comparison; its first warm-up step now shows the ranks' gradients apart,
    registered on DDP and wrapped by a ZeRO hook alike, while a hook that all-reduces stays done."""
    (tmp_path / "own_hooks.py").write_text(_OWN_HOOKS)
    suite = tmp_path / "own.toml"
    suite.write_text(
        tiny_suite(
            'algorithm = ["ddp", "hook_with_zero_step"]\ncomm_hook = ["own_hooks:local_only", "own_hooks:averaged"]',
            warmup_steps=3,
        )
    )
    proc = tpbench("sweep", suite, "--out", tmp_path / "results", "--no-report", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    cases = store.load(next(store.iter_runs(tmp_path / "results"))).record.cases.values()
    found = {(c.case.algorithm, c.case.comm_hook): (c.status, c.error or "") for c in cases}
    for algorithm in ("ddp", "hook_with_zero_step"):
        assert found[(algorithm, "own_hooks:averaged")] == ("done", "")
        status, error = found[(algorithm, "own_hooks:local_only")]
        assert status == "failed" and "comm_hook own_hooks:local_only did not reduce the gradients" in error


@pytest.mark.parametrize(("path", "said"), [("sys:maxsize", "is an int,"), ("math:pi", "is a float,")])
def test_a_hook_path_naming_no_function_says_what_it_names(path: str, said: str) -> None:
    """'sys:maxsize' read "is a int, not a function"."""
    from tpbench import comm_hooks

    with pytest.raises(comm_hooks.CommHookError, match=f"'{path}' {said} not a function"):
        comm_hooks.load(path, 2)


def test_a_hook_whose_future_holds_a_list_fails_naming_the_hook() -> None:
    """A hook returning a collective's own future (``dist.all_reduce(..., async_op=True).get_future()``,
    whose value is ``[tensor]``) was let through as "a one-tensor list counts as that tensor"; DDP's
    reducer then failed the case with "Unable to cast [tensor([...])] to Tensor", the hook unnamed, under
    ``ddp`` and ``hook_with_zero_step`` alike (torch 2.13, Gloo). It fails naming the hook and the fix."""
    from tpbench import training

    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result([torch.zeros(6)])
    with pytest.raises(ValueError) as e:
        training._bucket_sized("mymod:hook", 0, 6, fut)
    assert str(e.value) == (
        "comm_hook mymod:hook: its future's value for bucket 0 is a list of one tensor, expected the tensor "
        "itself: a collective's future holds a list, so chain .then(lambda fut: fut.value()[0]) as PyTorch's "
        "allreduce_hook does"
    )
    fut = torch.futures.Future()
    fut.set_result(torch.zeros(6))
    assert training._bucket_sized("mymod:hook", 0, 6, fut).numel() == 6
