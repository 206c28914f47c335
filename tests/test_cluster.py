"""tpbench under torchrun, with one machine standing in for a cluster.

The integration tests start two torchrun agents per world ("nodes", through ``fake_srun.py``, which
plays ``srun --kill-on-bad-exit=1``) meeting at a c10d rendezvous on 127.0.0.1, exactly as
``--agent-prefix 'srun ...'`` does on Slurm. They check that a sweep runs the same cases as the local
launcher, that post-local SGD's node subgroups are the two agents' ranks, that every node is
recorded, and that a rank killed (or hung) on the second node fails only its case.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, only_run, run_cli, tiny_suite, worker_processes
from synthetic_runs import make_run
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from tpbench import cli, store, sweep
from tpbench.cli.common import torchrun_launcher
from tpbench.interconnect import InterconnectUnavailable
from tpbench.suite import Machine, SuiteError, expand, parse
from tpbench.training import node_subgroups
from tpbench.worlds import EventFiles, Torchrun, torchrun_failures

FAKE_SRUN = f"{shlex.quote(sys.executable)} {shlex.quote(str(REPO / 'tests' / 'fake_srun.py'))} 2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(nproc_per_node: int) -> list[str]:
    """``tpbench sweep`` arguments for worlds of two torchrun agents on this machine."""
    return [
        "--launcher",
        "torchrun",
        "--nnodes",
        "2",
        "--nproc-per-node",
        str(nproc_per_node),
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        "--agent-prefix",
        FAKE_SRUN,
    ]


# --- layout rules, commands and reports (no processes) ------------------------------------------

LOCALSGD = '[defaults]\nalgorithm = "post_localSGD_hook"\nstart_localSGD_iter = 2\nbackend = "gloo"\ndevice = "cpu"\n'


def test_auto_sizes_follow_the_torchrun_layout():
    machine = Machine(gpus=0, nnodes=2, nproc_per_node=2)
    (case,) = expand(parse(LOCALSGD), machine)
    assert (case.world_size, case.ranks_per_node) == (4, 2)
    # Smaller emulated nodes inside each real one are allowed.
    (case,) = expand(parse(LOCALSGD + "ranks_per_node = 1\n"), machine)
    assert case.ranks_per_node == 1
    # Without --nproc-per-node the suite's size is split over the nodes.
    (case,) = expand(parse(LOCALSGD + "world_size = 6\n"), Machine(gpus=0, nnodes=2))
    assert (case.world_size, case.ranks_per_node) == (6, 3)


@pytest.mark.parametrize(
    "extra, machine, message",
    [
        (
            "world_size = 2\n",
            Machine(0, 2, 2),
            'world_size: expected "auto" or 4 (--nnodes 2 x --nproc-per-node 2) under torchrun, got 2',
        ),
        ("world_size = 3\n", Machine(0, 2), "world_size: expected a multiple of --nnodes 2 under torchrun, got 3"),
        (
            "ranks_per_node = 4\n",
            Machine(0, 2, 2),
            'ranks_per_node: expected "auto" or a divisor of the 2 ranks per node under torchrun',
        ),
    ],
)
def test_layouts_torchrun_cannot_give_are_refused(extra, machine, message):
    with pytest.raises(SuiteError) as e:
        expand(parse(LOCALSGD + extra, "s.toml"), machine)
    assert message in str(e.value)


def test_node_subgroups_never_span_machines():
    assert node_subgroups(((0, 1), (2, 3)), 2) == [[0, 1], [2, 3]]
    assert node_subgroups(((0, 1), (2, 3)), 1) == [[0], [1], [2], [3]]
    assert node_subgroups(((0, 1, 2, 3),), 2) == [[0, 1], [2, 3]]  # the local launcher's emulated nodes
    with pytest.raises(ValueError, match="different machines"):
        node_subgroups(((0, 1), (2, 3)), 4)


def test_torchrun_commands():
    plan = Path("/shared/run/plans/w0.json")
    single = Torchrun().command(plan, 2, "id")
    assert "--standalone" in single and single[-3:] == ["-m", "tpbench.worker", str(plan)]
    assert single[single.index("--nproc-per-node") + 1] == "2"
    assert single[single.index("--max-restarts") + 1] == "0"
    multi = Torchrun(nnodes=2, rdzv_endpoint="node1:29500", agent_prefix=("srun", "--ntasks-per-node=1")).command(
        plan, 8, "run-w3"
    )
    assert multi[:2] == ["srun", "--ntasks-per-node=1"]
    for flag, value in [
        ("--nnodes", "2"),
        ("--nproc-per-node", "4"),
        ("--rdzv-backend", "c10d"),
        ("--rdzv-endpoint", "node1:29500"),
        ("--rdzv-id", "run-w3"),
        ("--rdzv-conf", "join_timeout=600"),  # torchrun's default, said: tpbench's start-up limit follows it
    ]:
        assert multi[multi.index(flag) + 1] == value
    assert "needs --rdzv-endpoint" in Torchrun(nnodes=2).problem()
    for endpoint in ("node1", "node1:29500", "10.0.0.1:1", "[::1]:29500", "[fe80::1]"):
        assert Torchrun(nnodes=2, rdzv_endpoint=endpoint).problem() is None, endpoint


def test_failure_reports_blame_the_killed_rank_over_the_ones_torchrun_stopped():
    """Reports in torchrun's own format: the second agent saw rank 3 killed and stopped rank 2
    itself (SIGTERM); the first saw rank 0 exit after a connection error."""

    def report(failures: dict[int, tuple[int, int]]) -> str:
        return ChildFailedError(
            "tpbench.worker",
            {r: ProcessFailure(local, 1000 + r, code, "<N/A>") for r, (local, code) in failures.items()},
        ).format_msg()

    text = (
        report({0: (0, 1)}) + "\n" + "\n".join("1: " + line for line in report({2: (0, -15), 3: (1, -9)}).splitlines())
    )
    assert torchrun_failures(text) == [(3, -9), (0, 1), (2, -15)]


def test_event_files_are_followed_line_by_line(tmp_path):
    events = EventFiles(tmp_path)
    assert events.read() == []
    (tmp_path / "rank1.jsonl").write_text('{"event": "error", "rank": 1, "error": "boom"}\n{"event": "x"')
    assert events.read() == [{"event": "error", "rank": 1, "error": "boom"}]
    with open(tmp_path / "rank1.jsonl", "a") as f:
        f.write(', "rank": 1}\n')
    (tmp_path / "rank0.jsonl").write_text('{"event": "world_ready", "world": "w0", "nodes": []}\n')
    assert events.read() == [{"event": "world_ready", "world": "w0", "nodes": []}, {"event": "x", "rank": 1}]
    assert events.read() == []


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "line 2: not JSON (Expecting property name"),
        ("[1, 2]", "line 2: [1, 2] is not an event; expected one JSON object per line"),
        (
            '{"event": "repeat_end", "t": 1.0, "case": "c", "repeat": "zero"}',
            """line 2: a 'repeat_end' event whose 'repeat' is "zero", expected int""",
        ),
        (
            '{"event": "round_start", "t": 1.0, "items": [["c"]]}',
            "line 2: a 'round_start' event whose items are not [case, repeat] pairs",
        ),
    ],
    ids=["not-json", "a-list", "repeat-as-text", "round-items"],
)
def test_a_damaged_events_file_stops_the_resume_naming_its_line_and_leaves_the_run(tmp_path, capsys, line, message):
    """A printed world's events file, read back by `--resume`, with a line that is not an event of
    the shape the ranks write: `--resume` crashed with a traceback (JSONDecodeError, TypeError,
    ValueError: list.remove) and left the case `running`; now exit 3 naming the file and line, and
    run.json as it was."""
    suite = tmp_path / "tiny.toml"
    suite.write_text(tiny_suite('algorithm = ["ddp"]', world_size='"auto"'))
    args = ["sweep", str(suite), "--launcher", "torchrun", "--nproc-per-node", "2", "--print", "--out", str(tmp_path)]
    assert run_cli(args) == 0
    run_dir = only_run(tmp_path)
    events = run_dir / "events" / "w0"
    events.mkdir(parents=True)
    ready = {"event": "world_ready", "t": 1.0, "world": "w0", "nodes": []}
    (events / "rank0.jsonl").write_text(json.dumps(ready) + "\n" + line + "\n")
    before = (run_dir / "run.json").read_bytes()
    capsys.readouterr()
    # Its dry run refuses it the same way (it listed the case and exited 0), changing nothing either.
    for dry in (["--dry-run"], ["--no-report"]):
        assert run_cli(["sweep", "--resume", str(run_dir), *dry]) == 3
        err = " ".join(capsys.readouterr().err.split())
        assert f"{events / 'rank0.jsonl'}: {message}" in err and "Traceback" not in err, err
        assert (run_dir / "run.json").read_bytes() == before


@pytest.mark.ranks
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--nnodes", "2"], "--nnodes: only with --launcher torchrun"),
        (["--launcher", "torchrun", "--nnodes", "2"], "--nnodes 2 needs --rdzv-endpoint"),
        (["--launcher", "torchrun", "--nnodes", "2", "--rdzv-endpoint", "h:1"], "give --agent-prefix"),
        # torchrun refused these in every world, a traceback in each case's detail and every case failed:
        (["--launcher", "torchrun", "--rdzv-endpoint", "h:99999"], "h:99999: expected a port number up to 65535"),
        (["--launcher", "torchrun", "--rdzv-endpoint", "h:abc"], "h:abc: expected a port number up to 65535"),
        (["--launcher", "torchrun", "--rdzv-endpoint", ":29500"], ":29500: expected HOST:PORT"),
        # Each agent listened on a port of its own and the world waited out its 10 minutes of start-up.
        (["--launcher", "torchrun", "--nnodes", "2", "--rdzv-endpoint", "h:0"], "h:0: port 0 picks a free port"),
    ],
)
def test_torchrun_usage_errors(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        cli.main(["sweep", str(REPO / "suites" / "smoke.toml"), "--out", str(tmp_path), *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before a run directory exists


@pytest.mark.parametrize(
    "started, argv, message",
    [
        (None, ["--launcher", "torchrun"], "was started with the local launcher"),
        (Torchrun(), ["--launcher", "local"], "was started with the torchrun launcher"),
        (Torchrun(), ["--launcher", "torchrun", "--nproc-per-node", "2"], "ran with no --nproc-per-node"),
    ],
)
def test_a_resume_refuses_another_launcher_than_the_runs_own(started, argv, message, capsys, tmp_path):
    """A resume given another launcher ran its missing cases with it while run.json kept naming the
    run's own (a local run's missing cases under torchrun): refused, dry run included, and by the
    library too, before the run is touched."""
    prepared = sweep.prepare(REPO / "suites" / "smoke.toml", launcher=started)
    run = sweep.start(prepared, tmp_path, started)
    run.lock.release()
    before = (run.dir / "run.json").read_text()
    for dry in (["--dry-run"], ["--no-report"]):
        with pytest.raises(SystemExit) as e:
            cli.main(["sweep", "--resume", str(run.dir), *argv, *dry])
        assert e.value.code == 2
        assert message in " ".join(capsys.readouterr().err.split())
    other = None if started else Torchrun()
    with pytest.raises(sweep.SweepError, match="a resumed run starts its worlds as its finished cases ran"):
        sweep.run(resume=run.dir, launcher=other)
    assert (run.dir / "run.json").read_text() == before


def test_a_resume_in_a_new_allocation_is_what_a_bare_resume_there_reuses(tmp_path):
    """Resumed in a new allocation (its own ``--rdzv-endpoint`` and ``--agent-prefix``) and then
    interrupted, a run says a bare ``--resume`` goes on "in the same allocation"; that resume
    started its worlds at the first allocation's rendezvous, gone by then, and each world waited out
    its start-up. The new allocation's settings are now the run's. With ``--print``, so that no
    rank starts: its commands are what the worlds would run."""
    first = Torchrun(nnodes=2, nproc_per_node=1, rdzv_endpoint="old-node:29500", agent_prefix=("srun", "-N2"))
    prepared = sweep.prepare(REPO / "suites" / "smoke.toml", ["world_size=auto"], launcher=first)
    sweep.start(prepared, tmp_path, first).lock.release()
    (run_dir,) = store.iter_runs(tmp_path)
    second = dataclasses.replace(first, rdzv_endpoint="new-node:29600", agent_prefix=("srun", "-N2", "-w", "n[3-4]"))
    sweep.run(resume=run_dir, launcher=second, print_only=True).run.lock.release()
    assert sweep.launcher_of(store.read_record(run_dir)) == second
    again = sweep.run(resume=run_dir, launcher=sweep.RECORDED, print_only=True)
    again.run.lock.release()
    (world,) = again.printed
    assert world.command[world.command.index("--rdzv-endpoint") + 1] == "new-node:29600"
    assert world.command[:4] == ["srun", "-N2", "-w", "n[3-4]"]


@pytest.mark.ranks
def test_emulated_links_need_the_local_launcher(tmp_path):
    launcher = Torchrun()
    prepared = sweep.prepare(REPO / "suites" / "smoke.toml", ["interconnect=tcp-1gbit"], launcher=launcher)
    with pytest.raises(InterconnectUnavailable, match="local launcher"):
        sweep.start(prepared, tmp_path, launcher)


def test_a_dry_run_refuses_what_the_run_would_and_names_the_first_cases_link(capsys):
    """A dry run listed the 24 cases the run then refused, and the refusal named whichever shaped
    link a set's order gave first."""
    args = ["sweep", str(REPO / "suites" / "crossover.toml"), "--launcher", "torchrun", "--dry-run"]
    for cmd in (args, ["tune", *args[1:]]):
        assert run_cli(cmd) == 2
        assert "interconnect 'tcp-2.5gbit' emulates a link" in capsys.readouterr().err


def test_a_dry_run_across_nodes_says_gloo_runs_over_their_network_not_loopback(tmp_path, capsys):
    """``--nnodes 2`` listed zero.toml's worlds as "2×gloo/cpu loopback", Gloo over 127.0.0.1, which
    ranks on two machines cannot use: across nodes their Gloo is not pinned to ``lo``
    (``worlds.torchrun_env``) and runs over the nodes' network, which the world column now says, as
    the tune's dry run does. One node's torchrun world is still loopback."""
    nodes = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", "node0:29500", "--agent-prefix", "srun"]
    args = [str(REPO / "suites" / "zero.toml"), "--launcher", "torchrun", "--dry-run"]
    assert run_cli(["sweep", *args, *nodes]) == 0
    shown = capsys.readouterr().out
    assert shown.count("2×gloo/cpu network across 2 nodes") == 18 and "loopback" not in shown, shown
    assert run_cli(["tune", *args, *nodes, "--format", "json"]) == 0
    worlds = {s["world"] for s in json.loads(capsys.readouterr().out)["settings"]}
    assert worlds == {"2×gloo/cpu network across 2 nodes"}
    assert run_cli(["sweep", *args, "--nproc-per-node", "2"]) == 0
    assert capsys.readouterr().out.count("2×gloo/cpu loopback") == 18
    smoke = [str(REPO / "suites" / "smoke.toml"), "--launcher", "torchrun", *nodes[:-2], "--print"]
    assert run_cli(["sweep", *smoke, "--out", str(tmp_path)]) == 0
    assert run_cli(["sweep", "--resume", str(only_run(tmp_path)), "--dry-run"]) == 0  # the run's own launcher
    assert capsys.readouterr().out.count("2×gloo/cpu network across 2 nodes") == 2


# The stand-in for tpbench in the Slurm script's tests: it writes its arguments to ``args``.
TPBENCH_ARGS = 'printf "%s\\n" "$@" > "$SLURM_SUBMIT_DIR/args"'


def _slurm_job(
    tmp_path: Path,
    argv: tuple[str, ...] = ("suites/zero.toml", "--set", "steps=50"),
    tpbench: str = TPBENCH_ARGS,
    **env: str,
) -> subprocess.CompletedProcess:
    """examples/slurm/sweep.sbatch ``argv`` run as Slurm would on the first node of a 2-node job, with
    stand-ins for scontrol, tpbench (``tpbench``: its body; by default it writes its arguments to
    ``args``) and nvidia-smi (a node without a GPU driver: it fails, printing nothing), and ``env``
    added to the job's environment."""
    shims = tmp_path / "bin"
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "activate").write_text(f'PATH="{shims}:$PATH"\n')
    shims.mkdir()
    for name, body in [
        ("scontrol", 'printf "gpu-a\\ngpu-b\\n"'),
        ("tpbench", tpbench),
        ("nvidia-smi", "exit 9"),
    ]:
        (shims / name).write_text(f"#!/bin/sh\n{body}\n")
        (shims / name).chmod(0o755)
    job = {k: v for k, v in os.environ.items() if k not in ("SLURM_GPUS_ON_NODE", "NPROC_PER_NODE")}
    job |= {
        "SLURM_SUBMIT_DIR": str(tmp_path),
        "SLURM_JOB_NODELIST": "gpu-[a-b]",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_ID": "1234",
    } | env
    return subprocess.run(
        ["bash", str(REPO / "examples" / "slurm" / "sweep.sbatch"), *argv],
        env=job,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )


def test_slurm_script_hands_the_allocation_to_torchrun(tmp_path):
    """examples/slurm/sweep.sbatch with stand-ins for scontrol and tpbench: the allocation becomes
    the torchrun settings tpbench accepts (rendezvous on the first node, a port per job)."""
    proc = _slurm_job(tmp_path, SLURM_GPUS_ON_NODE="4")
    assert proc.returncode == 0, proc.stderr
    args = cli.build_parser().parse_args((tmp_path / "args").read_text().splitlines())
    assert torchrun_launcher(args) == Torchrun(
        nnodes=2,
        nproc_per_node=4,
        rdzv_endpoint="gpu-a:29734",
        agent_prefix=("srun", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"),
    )
    assert (args.suite, args.set, args.out) == ("suites/zero.toml", ["steps=50"], tmp_path / "results")


def test_slurm_script_resumes_a_run_in_a_new_allocation(tmp_path):
    """A job stopped by its time limit leaves its run interrupted; `sbatch sweep.sbatch --resume
    RUN_DIR` made `tpbench sweep --resume --launcher ... --out ... RUN_DIR`, which argparse refuses
    (--resume took no value) and --out with --resume too: the script could not resume a run. It now
    gives the resume the new allocation's rendezvous and agents, and neither a suite nor --out."""
    proc = _slurm_job(tmp_path, ("--resume", "results/zero/r1"), SLURM_GPUS_ON_NODE="4")
    assert proc.returncode == 0, proc.stderr
    args = cli.build_parser().parse_args((tmp_path / "args").read_text().splitlines())
    assert (args.resume, args.suite, args.out) == (Path("results/zero/r1"), None, None)
    launcher = torchrun_launcher(args)
    assert (launcher.nnodes, launcher.nproc_per_node, launcher.rdzv_endpoint) == (2, 4, "gpu-a:29734")
    assert launcher.agent_prefix[0] == "srun"
    refused = _slurm_job(tmp_path / "no-run", ("--resume",), SLURM_GPUS_ON_NODE="4")
    assert refused.returncode != 0 and "usage: sbatch examples/slurm/sweep.sbatch" in refused.stderr
    assert not (tmp_path / "no-run" / "args").exists()


def test_slurm_script_on_cpu_nodes_asks_for_the_ranks_per_node_and_takes_them(tmp_path):
    """On a node with no GPU the script ended at once with nvidia-smi's exit status and no word of
    why (set -e, pipefail); it now says what to set, and with NPROC_PER_NODE set it runs."""
    refused = _slurm_job(tmp_path / "refused")
    assert refused.returncode == 2, refused.stderr
    assert "ranks per node: expected a count >= 1, got '0'" in refused.stderr
    assert "on CPU-only nodes set it: NPROC_PER_NODE=4 sbatch" in refused.stderr
    assert not (tmp_path / "refused" / "args").exists()
    ran = _slurm_job(tmp_path / "ran", NPROC_PER_NODE="3")
    assert ran.returncode == 0, ran.stderr
    args = cli.build_parser().parse_args((tmp_path / "ran" / "args").read_text().splitlines())
    assert torchrun_launcher(args).nproc_per_node == 3


def test_slurm_script_resume_of_another_shape_asks_for_the_run_s_allocation(tmp_path):
    """Through sweep.sbatch, a resume in a job of other nodes or ranks per node than the run's was
    refused "(drop it, or start a new run)": the script passes --nnodes and --nproc-per-node
    itself, so there was nothing the user could drop. The refusal now names the allocation to ask
    for, the run's 2 nodes of 1 rank here, as the interrupt's sbatch line does."""
    run_dir = make_run(tmp_path / "results", {"ddp": [10.0, 10.1, 9.9]})
    run = store.Run.open(run_dir, own=True)
    launcher = Torchrun(nnodes=2, nproc_per_node=1, rdzv_endpoint="old-node:29500", agent_prefix=("srun", "-N2"))
    run.set_launcher(sweep.launcher_entry(launcher))
    run.set_status("interrupted")
    run.lock.release()
    real = f'PYTHONPATH={shlex.quote(str(REPO))} exec {shlex.quote(sys.executable)} -m tpbench "$@"'
    wanted = f"NPROC_PER_NODE=1 sbatch --nodes=2 examples/slurm/sweep.sbatch --resume {run_dir}"
    for nodes, per_node in (("4", "2"), ("4", "1"), ("2", "2")):
        env = {"SLURM_JOB_NUM_NODES": nodes, "NPROC_PER_NODE": per_node}
        job = _slurm_job(tmp_path / f"{nodes}x{per_node}", ("--resume", str(run_dir)), real, **env)
        err = " ".join(job.stderr.split())
        assert job.returncode == 2 and wanted in err and "drop it" not in err, err
    assert store.read_record(run_dir).status == "interrupted"


# --- two agents x 2 ranks: smoke cases and post-local SGD over the two "nodes" ------------------


@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("cluster")
    code = run_cli(
        [
            "sweep",
            str(REPO / "suites" / "smoke.toml"),
            *two_nodes(2),
            "--out",
            str(tmp / "results"),
            "--no-report",
            "--set",
            "world_size=auto",
            "--set",
            'algorithm=["ddp", "zero_no_overlap", "post_localSGD_hook"]',
            "--set",
            "start_localSGD_iter=2",
            "--set",
            "averaging_period=2",
        ]
    )
    assert code == 0
    return only_run(tmp / "results")


@pytest.mark.ranks
@pytest.mark.slow
def test_smoke_cases_run_on_both_nodes_in_one_world(two_node_run):
    loaded = store.load(two_node_run)
    assert set(loaded.cases.status) == {"done"} and loaded.record.status == "complete"
    assert loaded.record.launcher.name == "torchrun"
    assert len(loaded.record.worlds) == 1
    for case in loaded.cases.to_dict("records"):
        steps = loaded.steps[loaded.steps.case_id == case["case_id"]]
        assert case["world_size"] == 4
        assert set(steps["rank"]) == {0, 1, 2, 3}
        assert len(steps) == case["repeats"] * 4 * (case["warmup_steps"] + case["steps"])
        # Every node's ranks wrote their own traces.
        assert [p.name for p in store.traces(two_node_run, case["case_id"])] == [f"rank{r}.json.gz" for r in range(4)]
    assert sorted(p.name for p in (two_node_run / "events" / "w0").iterdir()) == [f"rank{r}.jsonl" for r in range(4)]


@pytest.mark.ranks
def test_every_node_is_recorded(two_node_run):
    meta = json.loads((two_node_run / "run.json").read_text())
    assert [(n["node"], n["ranks"]) for n in meta["worlds"][0]["nodes"]] == [(0, [0, 1]), (1, [2, 3])]
    nodes = meta["environment"]["nodes"]
    assert [n["ranks"] for n in nodes] == [[0, 1], [2, 3]]
    for n in nodes:
        assert n["hostname"] == socket.gethostname()
        assert n["fingerprint"]["cpu_count"] and n["fingerprint"]["torch"]


@pytest.mark.ranks
def test_post_local_sgd_shares_gradients_within_each_node_only(two_node_run):
    """After the switch each node all-reduces its own gradients: just before each averaging,
    ranks of one node hold identical parameters (bit-identical norms) and the nodes differ."""
    loaded = store.load(two_node_run)
    cid = loaded.cases.loc[loaded.cases.algorithm == "post_localSGD_hook", "case_id"].item()
    steps = loaded.steps[(loaded.steps.case_id == cid) & loaded.steps.param_norm_l2.notna()]
    assert steps.step.nunique() >= 3
    norms = steps.pivot_table(index=["repeat", "step"], columns="rank", values="param_norm_l2")
    assert (norms[0] == norms[1]).all() and (norms[2] == norms[3]).all()
    assert (norms[0] != norms[2]).all()
    assert (steps.drift_max_l2 > 0).all()


@pytest.mark.ranks
def test_a_tune_races_under_torchrun_with_each_world_on_two_nodes(tmp_path, capsys):
    """The race needs every item of a world's rounds answered by the tune (rank 0 asks it over a
    Unix socket): under two torchrun agents it runs its rounds and writes an ordinary tune run; with
    ``--trace`` the sweep after the race runs under the same launcher."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("slowdown_pct = [0, 40]", slowdown_kind='"cpu"', repeats=3, world_size='"auto"'))
    out = tmp_path / "r"
    args = ["tune", str(suite), "--out", str(out), "--min-rounds", "2", "--format", "json", "--trace", *two_nodes(1)]
    code = run_cli(args)
    doc = json.loads(capsys.readouterr().out)
    assert code in (0, 4) and {a["rounds"] for a in doc["arms"]} <= {2, 3}, doc
    run_dir = Path(doc["run_dir"])
    traced = Path(doc["where"]["run_dir"])
    assert set(store.iter_runs(out)) == {run_dir, traced}
    for d in (run_dir, traced):
        meta = json.loads((d / "run.json").read_text())
        assert [w["launcher"] for w in meta["worlds"]] == ["torchrun"]
        assert [(n["node"], n["ranks"]) for n in meta["worlds"][0]["nodes"]] == [(0, [0]), (1, [1])]
    assert json.loads((run_dir / "run.json").read_text())["worlds"][0]["steps_interleaved"]
    saved = store.read_tune(run_dir)
    assert saved.history[-1].round == max(a["rounds"] for a in doc["arms"])


# --- failures under torchrun ----------------------------------------------------------------------


@pytest.mark.ranks
@pytest.mark.slow
def test_crash_and_hang_on_the_second_node_fail_only_their_cases(tmp_path):
    suite = tmp_path / "faults.toml"
    suite.write_text(tiny_suite('fault = ["none", "crash:1", "hang:1"]', world_size='"auto"', timeout_s=8))
    assert run_cli(["sweep", str(suite), *two_nodes(1), "--out", str(tmp_path / "results"), "--no-report"]) == 1
    run_dir = only_run(tmp_path / "results")
    meta = json.loads((run_dir / "run.json").read_text())
    by_fault = {c["params"]["fault"]: c for c in meta["cases"].values()}
    assert by_fault["none"]["status"] == "done"
    assert by_fault["crash:1"]["status"] == "failed"
    assert by_fault["crash:1"]["error"] == "rank 1 was killed by SIGKILL"
    assert "--- torchrun (last lines) ---" in by_fault["crash:1"]["detail"]
    assert by_fault["hang:1"]["status"] == "failed"
    assert by_fault["hang:1"]["error"].startswith("timed out after 8 s")
    # The hang ran in a fresh torchrun job after the crash, and nothing is left running.
    assert [w["launcher"] for w in meta["worlds"]] == ["torchrun", "torchrun"]
    assert worker_processes(run_dir) == []


def test_a_rendezvous_port_another_program_holds_is_refused_before_the_run_or_its_worlds(tmp_path, capsys):
    """A plain TCP listener on the endpoint's port: torchrun's agents connected to it as to their
    store and waited; each world waited out its 10 minutes of start-up, was retried, failed its
    cases, and the next world did the same. The port is probed first instead (exit 3, naming the
    endpoint and what to do). A new sweep or tune is refused before its run directory is made: it
    left an interrupted run with no finished case, and an error saying its finished cases were kept.
    A ``--print`` run's resume (a bare one reuses the recorded endpoint) stops before its first
    world, naming the resume with another port, the run interrupted and its cases pending."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("lr = [0.01, 0.02]"))
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
        torchrun = ["--launcher", "torchrun", "--rdzv-endpoint", endpoint, "--out", str(tmp_path / "r")]
        for command in ("sweep", "tune"):
            extra = ["--no-report"] if command == "sweep" else ["--set", "repeats=3"]
            assert run_cli([command, str(suite), *torchrun, *extra]) == 3
            err = " ".join(capsys.readouterr().err.split())
            assert f"--rdzv-endpoint {endpoint}: another program holds port {endpoint.split(':')[1]}" in err, err
            assert "No run was started: run the same command with --rdzv-endpoint 127.0.0.1:OTHER_PORT" in err
            assert not list(tmp_path.rglob("run.json"))
        assert run_cli(["sweep", str(suite), *torchrun, "--print"]) == 0
        capsys.readouterr()
        run_dir = only_run(tmp_path / "r")
        assert run_cli(["sweep", "--resume", str(run_dir), "--no-report"]) == 3
        assert Torchrun(rdzv_endpoint=endpoint).endpoint_held() is not None
    err = " ".join(capsys.readouterr().err.split())
    assert f"--rdzv-endpoint {endpoint}: another program holds port {endpoint.split(':')[1]}" in err
    assert f"tpbench sweep --resume {run_dir} --launcher torchrun --rdzv-endpoint 127.0.0.1:OTHER_PORT" in err
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "interrupted" and [w["world"] for w in meta["worlds"]] == ["w0"]  # the printed one
    assert {c["status"] for c in meta["cases"].values()} == {"pending"}
    # Free again, or on another machine (the store is hosted there): nothing to say.
    assert Torchrun(rdzv_endpoint=endpoint).endpoint_held() is None
    assert Torchrun(nnodes=2, rdzv_endpoint="192.0.2.1:29500").endpoint_held() is None


def test_a_resume_that_starts_no_world_does_not_check_the_rendezvous_port(tmp_path, capsys):
    """A torchrun run interrupted after its last case, while its summary was written: a bare resume
    while another program held the recorded port was refused (exit 3, "run the rest with ...
    OTHER_PORT"), though it only had the summary to write and no world to start. The port is checked
    only where a world will start."""
    run_dir = make_run(tmp_path, {"ddp": [10.0, 10.1, 9.9], "zero_no_overlap": [12.0, 12.2, 12.1]})
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
        run = store.Run.open(run_dir, own=True)
        run.set_launcher(sweep.launcher_entry(Torchrun(rdzv_endpoint=endpoint)))
        run.set_status("interrupted")
        run.lock.release()
        assert run_cli(["sweep", "--resume", str(run_dir), "--no-report"]) == 0, capsys.readouterr().err
    loaded = store.load(run_dir)
    assert loaded.record.status == "complete" and len(loaded.summary) == 2


@pytest.mark.ranks
def test_a_world_whose_agents_never_meet_stops_the_sweep(tmp_path, capsys):
    """Two nodes asked for, one agent started: the rendezvous never forms. Each world waited out
    its 10-minute start-up, was retried, failed its cases, and the next world did the same. With
    ``--rdzv-timeout`` (here 3 s) the agents give up, and the first world that started no rank stops
    the sweep (exit 3) naming the endpoint, what to check and the resume; nothing is failed, nothing
    is left running."""
    suite = tmp_path / "s.toml"
    suite.write_text(tiny_suite("lr = [0.01, 0.02]", world_size='"auto"'))
    argv = [*two_nodes(1), "--rdzv-timeout", "3", "--out", str(tmp_path / "r")]
    argv[argv.index("--agent-prefix") + 1] = FAKE_SRUN.removesuffix(" 2") + " 1"  # one agent of the two
    assert run_cli(["sweep", str(suite), *argv, "--no-report"]) == 3
    err = " ".join(capsys.readouterr().err.split())
    run_dir = only_run(tmp_path / "r")
    endpoint = argv[argv.index("--rdzv-endpoint") + 1]
    assert f"--rdzv-endpoint {endpoint}: world w0's torchrun agents never met, and started no rank" in err
    assert "RendezvousTimeoutError" in err and "a --rdzv-timeout above 3 s" in err
    assert f"--resume {run_dir} --launcher torchrun --rdzv-endpoint 127.0.0.1:OTHER_PORT and/or --rdzv-timeout" in err
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "interrupted" and [w["world"] for w in meta["worlds"]] == ["w0"]
    assert {c["status"] for c in meta["cases"].values()} == {"pending"}
    assert meta["launcher"]["rdzv_timeout_s"] == 3
    assert worker_processes(run_dir) == []


# --- --print: the user starts torchrun, --resume records what it did -----------------------------


@pytest.fixture(scope="module")
def printed_run(tmp_path_factory) -> dict:
    """``--print`` of one 2-rank case, the printed torchrun command run as a user runs it, then a
    dry run of the resume and the resume itself (with a report): what each said, for the tests below."""
    import contextlib
    import io

    tmp = tmp_path_factory.mktemp("printed")
    out = tmp / "results"
    suite = tmp / "tiny.toml"
    suite.write_text(tiny_suite('algorithm = ["ddp"]', world_size='"auto"'))
    said: dict = {}

    def cli_said(key: str, args: list[str]) -> int:
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = run_cli(args)
        said[key] = stdout.getvalue()
        return code

    printed = ["sweep", str(suite), "--launcher", "torchrun", "--nproc-per-node", "2", "--print", "--out", str(out)]
    assert cli_said("print", printed) == 0
    run_dir = only_run(out)
    said["status_after_print"] = json.loads((run_dir / "run.json").read_text())["status"]
    commands = [line for line in said["print"].splitlines() if not line.startswith("#")]
    started = subprocess.run(shlex.split(commands[0]), capture_output=True, text=True, cwd=tmp, timeout=300)
    assert started.returncode == 0, started.stdout + started.stderr
    # A dry run says that the world ran: its case is left to record, with no repeat to run.
    said["dry_run_code"] = cli_said("dry_run", ["sweep", "--resume", str(run_dir), "--dry-run"])
    report = tmp / "r.html"
    said["resume_code"] = cli_said("resume", ["sweep", "--resume", str(run_dir), "--report", str(report)])
    return {"run_dir": run_dir, "commands": commands, "said": said, "report": report}


@pytest.mark.ranks
def test_printed_command_runs_and_resume_records_it(printed_run):
    run_dir, commands, said = printed_run["run_dir"], printed_run["commands"], printed_run["said"]
    assert len(commands) == 2 and commands[1] == f"tpbench sweep --resume {run_dir}"
    assert "--max-restarts 0" in commands[0] and "--standalone" in commands[0]
    assert said["status_after_print"] == "printed"
    assert said["dry_run_code"] == 0
    shown = " ".join(said["dry_run"].split())
    assert "1 case to resume, 1 of them with every repeat on disk, only to record" in shown and "0 of 1" in shown
    assert said["resume_code"] == 0
    loaded = store.load(run_dir)
    assert loaded.record.status == "complete" and set(loaded.cases.status) == {"done"}
    assert loaded.record.worlds[0].ingested
    assert isinstance(loaded.summary, pd.DataFrame) and len(loaded.summary) == 1


@pytest.mark.ranks
def test_a_resume_of_printed_worlds_says_who_started_their_ranks(printed_run):
    """After ``--print``, the user's torchrun and ``--resume``, the closing line said "0.0 s running
    worlds, ... 2 rank processes started", and the report 230770 % of that time in timed steps:
    tpbench had started and clocked none of them. Both now say the ranks were started by hand,
    give no seconds of worlds tpbench did not run, and the record keeps those ranks apart from
    tpbench's own (no share of a time not clocked)."""
    run_dir, said, report = printed_run["run_dir"], printed_run["said"], printed_run["report"]
    assert said["resume_code"] == 0
    line = " ".join(said["resume"].split())
    by_hand = "2 rank processes started by hand from the printed commands, none by tpbench."
    whole_run = line.rpartition("the whole run: ")[2]
    assert whole_run.endswith(f"s in timed steps, {by_hand}") and "running" not in whole_run, line
    efficiency = store.load(run_dir).record.efficiency
    assert efficiency.processes_started == 0 and efficiency.processes_by_hand == 2
    assert efficiency.timed_share is None
    assert by_hand in " ".join(report.read_text().split())


@pytest.mark.ranks
def test_a_printed_command_whose_world_a_resume_took_over_runs_nothing(tmp_path, capsys):
    """--print, then --resume before the printed command ran: the resume runs the case itself. The
    printed command, started after all, must not measure the finished case again (it wrote its
    repeats and traces over the run's): it exits naming the resume, and the run is unchanged."""
    out = tmp_path / "results"
    suite = ["sweep", str(REPO / "suites" / "smoke.toml"), "--set", "world_size=auto", "--set", "repeats=1"]
    printed = [*suite, "--filter", "algorithm=ddp", "--launcher", "torchrun", "--nproc-per-node", "1", "--print"]
    assert run_cli([*printed, "--out", str(out)]) == 0
    run_dir = only_run(out)
    command = next(line for line in capsys.readouterr().out.splitlines() if not line.startswith("#"))
    assert run_cli(["sweep", "--resume", str(run_dir), "--no-report"]) == 0
    files = {p: p.read_bytes() for p in (run_dir / "cases").rglob("*") if p.is_file()}

    started = subprocess.run(shlex.split(command), capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert started.returncode != 0
    assert f"`tpbench sweep --resume {run_dir}`" in started.stderr and "nothing to run" in started.stderr
    assert {p: p.read_bytes() for p in (run_dir / "cases").rglob("*") if p.is_file()} == files
    assert not (run_dir / "events" / "w0").exists()


def test_an_interrupted_torchrun_run_says_how_to_resume_it_from_a_new_allocation(capsys):
    """The interrupt's resume line was the bare ``tpbench sweep --resume RUN``, which reuses the
    rendezvous endpoint and agents run.json records: from a login node, or a new Slurm job, that
    rendezvous is gone. A torchrun run's line says what a new allocation adds; a local run's does not."""
    from types import SimpleNamespace

    from tpbench.cli.common import resumable
    from tpbench.record import LauncherRecord

    def said(launcher: str, command: str, gpus: int = 8, **options) -> str:
        record = SimpleNamespace(launcher=LauncherRecord(launcher, options), environment={"gpu_count": gpus})
        run = SimpleNamespace(dir=Path("results/zero/R"), record=record)
        assert resumable(KeyboardInterrupt(), run, command, "Kept.") == 130
        return capsys.readouterr().err

    torchrun = said("torchrun", "sweep", nnodes=4, nproc_per_node=8)
    assert "tpbench sweep --resume results/zero/R" in torchrun
    assert "--rdzv-endpoint HOST:PORT --agent-prefix CMD" in torchrun
    assert "sbatch --nodes=4 --gpus-per-node=8 examples/slurm/sweep.sbatch --resume results/zero/R" in torchrun
    assert "sbatch" not in said("torchrun", "tune", nnodes=4, nproc_per_node=8)
    assert "--rdzv-endpoint" not in said("local", "sweep")


def test_the_slurm_resume_line_asks_for_the_run_s_nodes_and_ranks_per_node(capsys):
    """An interrupted torchrun sweep printed ``sbatch examples/slurm/sweep.sbatch --resume RUN``: the
    script's own ``--nodes=2`` and a rank per GPU, which a resume refuses (exit 2) for any run of
    another shape, a 4-node run or CPU nodes' ranks (2 agents of 1 rank each here). The line now asks
    for the run's nodes and ranks per node, and a run with no recorded ranks per node (one torchrun
    --standalone node), which the script's --nproc-per-node would be refused for, gets no line."""
    from types import SimpleNamespace

    from tpbench.cli.common import resumable
    from tpbench.record import LauncherRecord

    def said(gpus: int, **options) -> str:
        record = SimpleNamespace(launcher=LauncherRecord("torchrun", options), environment={"gpu_count": gpus})
        resumable(KeyboardInterrupt(), SimpleNamespace(dir=Path("results/own-model/R"), record=record), "sweep", "")
        return " ".join(capsys.readouterr().err.split())

    cpu = said(0, nnodes=2, nproc_per_node=1)
    assert "NPROC_PER_NODE=1 sbatch --nodes=2 examples/slurm/sweep.sbatch --resume results/own-model/R" in cpu
    assert "sbatch" not in said(0, nnodes=1, nproc_per_node=None)


def test_a_one_machine_torchrun_run_s_resume_line_speaks_of_no_allocation(capsys):
    """A torchrun run on one machine (one agent started here, no --agent-prefix) said to resume "in the
    same allocation; from a new one, add ... --agent-prefix CMD", Slurm's words where no Slurm was
    involved, and offered an sbatch line where it had --nproc-per-node. Its line now says where its
    worlds meet again and how to give another endpoint; one on --standalone, which takes a free port
    wherever it is resumed, adds nothing. A run whose agents a prefix started keeps the allocation's words."""
    from types import SimpleNamespace

    from tpbench.cli.common import resumable
    from tpbench.record import LauncherRecord

    def said(**options) -> str:
        record = SimpleNamespace(launcher=LauncherRecord("torchrun", options), environment={"gpu_count": 0})
        resumable(KeyboardInterrupt(), SimpleNamespace(dir=Path("results/own-model/R"), record=record), "sweep", "")
        return " ".join(capsys.readouterr().err.split())

    endpoint = said(nnodes=1, nproc_per_node=2, rdzv_endpoint="127.0.0.1:29613", agent_prefix=[])
    assert "allocation" not in endpoint and "sbatch" not in endpoint and "--agent-prefix" not in endpoint, endpoint
    assert "its worlds meet at 127.0.0.1:29613 again" in endpoint
    assert "add --launcher torchrun --rdzv-endpoint HOST:PORT" in endpoint
    standalone = said(nnodes=1, nproc_per_node=None, rdzv_endpoint=None, agent_prefix=[])
    assert standalone.endswith("tpbench sweep --resume results/own-model/R"), standalone
    prefixed = said(nnodes=1, nproc_per_node=1, rdzv_endpoint="n1:29500", agent_prefix=["srun", "-N1"])
    assert "in the same allocation" in prefixed and "NPROC_PER_NODE=1 sbatch --nodes=1" in prefixed
