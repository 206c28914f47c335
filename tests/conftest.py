"""Helpers shared by the test modules, imported as ``from conftest import ...`` (pytest puts tests/
on the path, as it does for ``world.py`` and ``synthetic_runs.py``).

Tests that start rank processes (a sweep, or a world of ``world.py``) carry the ``ranks`` mark;
``make test-fast`` runs the others.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tpbench import cli, store, sweep

REPO = Path(__file__).resolve().parent.parent


def tpbench(*args: str | Path, cwd: Path = REPO, timeout: float = 300) -> subprocess.CompletedProcess:
    """The real command, ``python -m tpbench ARGS``, in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "tpbench", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


def tpbench_at_once(
    *commands: list[str | Path], cwd: Path = REPO, timeout: float = 300
) -> list[subprocess.CompletedProcess]:
    """Each of ``commands`` as ``tpbench(*command)``, all started at once (for commands that time
    nothing and touch no file another writes): their results in the order given."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tpbench", *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
        )
        for args in commands
    ]
    done = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def run_cli(args: list[str]) -> int:
    """``tpbench ARGS`` in this process, returning its exit code: a fresh interpreter would spend
    longer importing torch than the small worlds of these tests spend measuring."""
    with pytest.raises(SystemExit) as e:
        cli.main(args)
    return e.value.code


def sweep_in_process(folder: Path, text: str) -> store.Loaded:
    """Sweep the suite ``text`` (written to ``folder/suite.toml``) into ``folder/results``, finalized."""
    suite = folder / "suite.toml"
    suite.write_text(text)
    return sweep.run(suite, out=folder / "results").loaded


def only_run(root: Path) -> Path:
    runs = list(store.iter_runs(root))
    assert len(runs) == 1, runs
    return runs[0]


def worker_processes(run_dir: Path) -> list[str]:
    out = subprocess.run(["pgrep", "-af", f"tpbench.worker {run_dir}"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def tiny_suite(
    sweep: str,
    *,
    name: str | None = None,
    description: str | None = None,
    profiler_steps: int = 0,
    trace_windows: int = 1,
    mlp: dict[str, int] | None = None,
    **defaults: object,
) -> str:
    """A 2-rank Gloo suite of tiny mlp cases; ``sweep`` is the body of its [sweep] table, whose keys
    leave [defaults]. ``defaults`` (TOML values as text) replace or add to the [defaults] below;
    ``profiler_steps`` traced steps per case in at most ``trace_windows`` windows (one: a tiny model's
    steps trace at under half their timed speed, below the floor that has a window traced again,
    ``capture.SPEED_FLOOR``); ``mlp``: the [workloads.mlp] table (width 32, depth 2)."""
    base = {
        "world_size": 2,
        "backend": '"gloo"',
        "device": '"cpu"',
        "batch_size": 8,
        "warmup_steps": 2,
        "steps": 4,
        "repeats": 1,
        "timeout_s": 60,
    } | defaults
    swept = {line.split("=")[0].strip() for line in sweep.splitlines()}
    lines = "\n".join(f"{k} = {v}" for k, v in base.items() if k not in swept)
    head = f'[suite]\nname = "{name}"\n' if name else ""
    if description is not None:
        head += f'description = "{description}"\n'
    workload = "\n".join(f"{k} = {v}" for k, v in (mlp or {"width": 32, "depth": 2}).items())
    return (
        f"{head}[defaults]\n{lines}\n[sweep]\n{sweep}\n"
        f"[capture]\nprofiler_steps = {profiler_steps}\ntrace_windows = {trace_windows}\n[workloads.mlp]\n{workload}\n"
    )


def localsgd_suite(sweep: str, *, name: str, tables: str = "", **defaults: object) -> str:
    """Post-local SGD on 4 Gloo ranks in 2 emulated nodes, of the markov workload (whose drift and
    convergence these suites measure); ``sweep`` is the body of its [sweep] table, ``defaults``
    (TOML values as text) add to [defaults], ``tables`` (TOML) follows, e.g. [capture]."""
    base = {
        "algorithm": '"post_localSGD_hook"',
        "world_size": 4,
        "ranks_per_node": 2,
        "backend": '"gloo"',
        "device": '"cpu"',
        "workload": '"markov"',
        "warmup_steps": 0,
    } | defaults
    lines = "\n".join(f"{k} = {v}" for k, v in base.items())
    return f'[suite]\nname = "{name}"\n[defaults]\n{lines}\n[sweep]\n{sweep}\n{tables}'


@pytest.fixture(scope="session")
def finished_tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished real sweep of two tiny cases (ddp, zero_no_overlap; 2 Gloo ranks, 3 warm-up steps),
    shared by test_reliability.py and test_hostile.py: their tests read it, or change a copy."""
    tmp = tmp_path_factory.mktemp("done")
    suite = tmp / "tiny.toml"
    suite.write_text(tiny_suite('algorithm = ["ddp", "zero_no_overlap"]', name="tiny", warmup_steps=3))
    # The CLI in this process: a fresh interpreter would spend seconds importing torch.
    assert run_cli(["sweep", str(suite), "--out", str(tmp / "results"), "--no-report"]) == 0
    return only_run(tmp / "results")


@pytest.fixture(scope="session")
def traced_tiny_run(tmp_path_factory: pytest.TempPathFactory) -> store.Loaded:
    """A finished real sweep with traced steps: ddp and zero_no_overlap on 2 Gloo ranks, 2 repeats,
    2 traced steps each; shared by test_capture_sweep.py and test_report_browser.py, whose tests read
    it, or change a copy. Its description is for the browser test's page."""
    text = tiny_suite(
        'algorithm = ["ddp", "zero_no_overlap"]',
        name="report-smoke",
        description="Two tiny cases on 2 Gloo ranks, traced, for the browser test",
        workload='"mlp"',
        warmup_steps=3,
        steps=6,
        repeats=2,
        timeout_s=120,
        profiler_steps=2,
        mlp={"width": 64, "depth": 2},
    )
    # In this process: a fresh interpreter would spend seconds importing torch.
    return sweep_in_process(tmp_path_factory.mktemp("traced"), text)
