"""Interconnect profiles, and emulated links that really exist and really go away.

The namespace tests need root and iproute2 (CI runs as root, so they run there); they are
skipped with the reason otherwise. Every namespace test checks afterwards that no namespace of
this process or of its dead children is left on the machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_cli, tiny_suite

from tpbench import interconnect as icm
from tpbench import store, sweep
from tpbench.interconnect import Interconnect, InterconnectUnavailable, resolve, world_network

# ---------------------------------------------------------------------------------------------
# Profiles


@pytest.mark.parametrize(
    ("name", "backend", "env"),
    [
        ("nccl-default", "nccl", {}),
        ("nccl-p2p", "nccl", {"NCCL_P2P_DISABLE": "0", "NCCL_P2P_LEVEL": "SYS", "NCCL_SHM_DISABLE": "0"}),
        ("nccl-shm", "nccl", {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "0"}),
        (
            "nccl-socket",
            "nccl",
            {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NET": "Socket", "NCCL_IB_DISABLE": "1"},
        ),
        (
            "nccl-ib",
            "nccl",
            {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NET": "IB", "NCCL_IB_DISABLE": "0"},
        ),
        ("loopback", "gloo", {}),
    ],
)
def test_builtin_profiles(name: str, backend: str, env: dict[str, str]) -> None:
    ic = resolve(name)
    assert ic == Interconnect(name, backend, env, None)
    assert not ic.shaped


@pytest.mark.parametrize(
    ("name", "rate"),
    [("tcp-1gbit", 1e9), ("tcp-10gbit", 1e10), ("tcp-25gbit", 2.5e10), ("tcp-500mbit", 5e8), ("tcp-2.5gbit", 2.5e9)],
)
def test_emulated_link_rates(name: str, rate: float) -> None:
    ic = resolve(name)
    assert (ic.backend, dict(ic.env), ic.rate_bits_per_s) == ("gloo", {}, rate)


@pytest.mark.parametrize(
    "name", ["tcp-fast", "tcp-1Gbit", "tcp-1gbps", "tcp-1mbps", "tcp-0gbit", "tcp-500kbit", "tcp-", "tcp-1.gbit"]
)
def test_bad_rates_say_what_is_expected(name: str) -> None:
    with pytest.raises(ValueError, match=r"expected tcp-<rate> with a rate like '500mbit'"):
        resolve(name)


def test_unknown_name_lists_builtins_and_suite_profiles() -> None:
    expected = r"unknown interconnect 'nvlink'.*nccl-default.*tcp-<rate>.*defined in this suite: slow"
    with pytest.raises(ValueError, match=expected):
        resolve("nvlink", {"slow": {"backend": "gloo", "rate": "1mbit"}})


def test_profiles_are_hashable_for_grouping_worlds() -> None:
    assert len({resolve("nccl-shm"), resolve("nccl-shm"), resolve("tcp-1gbit")}) == 2


def test_user_profiles() -> None:
    profiles = {
        "wan": {"backend": "gloo", "rate": "2.5gbit", "env": {"GLOO_SOCKET_IFNAME": "lo"}},
        "nccl-tree": {"backend": "nccl", "env": {"NCCL_ALGO": "Tree"}},
        "gloo-plain": {"backend": "gloo"},
    }
    assert resolve("wan", profiles) == Interconnect("wan", "gloo", {"GLOO_SOCKET_IFNAME": "lo"}, 2.5e9)
    assert resolve("nccl-tree", profiles) == Interconnect("nccl-tree", "nccl", {"NCCL_ALGO": "Tree"}, None)
    assert resolve("gloo-plain", profiles) == Interconnect("gloo-plain", "gloo", {}, None)
    assert resolve("loopback", profiles).name == "loopback"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"backend": "gloo", "speed": "1gbit"}, r"unknown key\(s\) speed; expected backend, env, rate, allow_env$"),
        ({"rate": "1gbit"}, r"backend must be one of gloo, nccl, it has none$"),
        ({"backend": "mpi"}, r"backend must be one of gloo, nccl, got 'mpi'"),
        ({"backend": "nccl", "env": {"NCCL_DEBUG": 1}}, r"env.NCCL_DEBUG must be a string, got int"),
        ({"backend": "nccl", "env": {"1BAD": "x"}}, r"not a valid environment variable name"),
        ({"backend": "nccl", "env": ["NCCL_DEBUG=INFO"]}, r"env must be a table of strings"),
        ({"backend": "gloo", "rate": 1e9}, r"bad rate 1000000000.0: expected a rate like"),
        ({"backend": "gloo", "rate": "1 Gb/s"}, r"bad rate '1 Gb/s'"),
        ({"backend": "nccl", "rate": "1gbit"}, r"rate applies to backend 'gloo' only"),
        (
            {"backend": "gloo", "rate": "1gbit", "env": {"MASTER_ADDR": "10.0.0.1"}},
            r"env.MASTER_ADDR must be '127.0.0.1'",
        ),
        ("1gbit", r"expected a table with keys backend, env, rate, allow_env$"),
    ],
)
def test_bad_user_profiles(table: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve("mine", {"mine": table})


def test_user_profiles_may_not_shadow_builtins() -> None:
    for name in ("loopback", "nccl-ib", "tcp-3gbit"):
        with pytest.raises(ValueError, match=rf"{name!r} shadows a builtin"):
            resolve("loopback", {name: {"backend": "gloo"}})


def test_unshaped_networks_are_no_op_wrappers() -> None:
    with world_network(resolve("loopback")) as net:
        assert net.namespace is None
        assert net.wrap(["python", "-c", "pass"]) == ["python", "-c", "pass"]
        assert net.env == {"GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}
        assert net.master_addr == "127.0.0.1"
    with world_network(resolve("nccl-socket")) as net:
        assert net.env["NCCL_NET"] == "Socket" and "GLOO_SOCKET_IFNAME" not in net.env
    custom = resolve("eth", {"eth": {"backend": "gloo", "env": {"GLOO_SOCKET_IFNAME": "eth0", "MASTER_ADDR": "node0"}}})
    with world_network(custom) as net:
        assert (net.env["GLOO_SOCKET_IFNAME"], net.master_addr) == ("eth0", "node0")


def test_tbf_bucket_holds_gso_packets_and_scales_with_rate() -> None:
    burst, limit = icm.tbf_parameters(1e6)
    assert burst >= 4 * 65536 and limit >= 16 * 2**20
    burst, limit = icm.tbf_parameters(1e11)
    assert burst == pytest.approx(1e11 / 8 * 1e-3)  # 1 ms of traffic
    assert icm.tbf_parameters(1e13)[1] == 2**32 - 1  # tbf's limit is 32 bits


def test_missing_requirements_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "tc" else f"/usr/sbin/{tool}")
    icm.check_available(resolve("loopback"))  # needs nothing
    expected = r"'tcp-1gbit' emulates a link and needs: root .*; the `tc` command"
    with pytest.raises(InterconnectUnavailable, match=expected):
        icm.check_available(resolve("tcp-1gbit"))
    assert icm.reap_stale_namespaces() == []


def test_dry_runs_and_validate_name_a_link_this_machine_cannot_make(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked where PATH holds no `tc` (a real PATH, the check itself runs): a suite of emulated
    links, built in (tcp-1gbit) or its own (a rated profile), is refused by `sweep --dry-run` and
    `tune --dry-run` (exit 2), as the sweep would refuse it, naming the suite file, the key that
    asks for the link and what is missing; `validate` says the same as a warning (exit 0: the suite
    is right, this machine is not). A suite on loopback alone passes all three without a word."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if ip := shutil.which("ip"):
        (bin_dir / "ip").symlink_to(ip)
    monkeypatch.setenv("PATH", str(bin_dir))
    own = tmp_path / "own.toml"
    own.write_text(
        tiny_suite('interconnect = ["loopback", "wan"]', repeats=3)
        + '[interconnects.wan]\nbackend = "gloo"\nrate = "2gbit"\n'
    )
    builtin = tmp_path / "builtin.toml"
    builtin.write_text(tiny_suite('interconnect = ["loopback", "tcp-1gbit"]', repeats=3))
    flat = tmp_path / "flat.toml"
    flat.write_text(tiny_suite("bucket_cap_mb = [1, 2]", interconnect='"loopback"', repeats=3))
    missing = "emulates a link and needs: .*the `tc` command \\(install iproute2\\)"
    for suite, where in (
        (own, f"{own}: interconnects.wan.rate: interconnect 'wan' "),
        (builtin, f"{builtin}: interconnect 'tcp-1gbit' "),
    ):
        for command in (["sweep", "--dry-run"], ["tune", "--dry-run"]):
            assert run_cli([*command, str(suite)]) == 2
            assert re.search(re.escape(where) + missing, capsys.readouterr().err)
        assert run_cli(["validate", str(suite)]) == 0
        said = capsys.readouterr()
        assert ": ok, " in said.out and re.search("warning: " + re.escape(where) + missing, said.err)
    for command in (["sweep", "--dry-run"], ["tune", "--dry-run"], ["validate"]):
        assert run_cli([*command, str(flat)]) == 0
        said = capsys.readouterr()
        assert "`tc`" not in said.err and "warning" not in said.err


def test_resume_refuses_an_emulated_link_it_cannot_make_before_running_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run of loopback and tcp-1gbit cases, interrupted before any ran, resumed where `tc` is
    missing: refused (exit 2) naming what is missing, before anything runs or changes. It ran the
    loopback world first, then stopped at the emulated one, the run left reading as running."""
    suite = tmp_path / "suite.toml"
    suite.write_text(tiny_suite('interconnect = ["loopback", "tcp-1gbit"]'))
    monkeypatch.setattr(sweep, "check_available", lambda ic: None)  # made where `tc` is: no root needed here
    run = sweep.start(sweep.prepare(suite), tmp_path / "results")
    run.set_status(store.INTERRUPTED)
    run.lock.release()
    monkeypatch.undo()
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "tc" else f"/usr/sbin/{tool}")
    before = (run.dir / "run.json").read_text()
    for dry in (["--dry-run"], ["--no-report"]):
        assert run_cli(["sweep", "--resume", str(run.dir), *dry]) == 2
        assert "'tcp-1gbit' emulates a link and needs: " in capsys.readouterr().err
    assert (run.dir / "run.json").read_text() == before  # nothing ran: the loopback world neither
    assert store.read_record(run.dir).status == store.INTERRUPTED


def test_a_tune_resume_refuses_an_emulated_link_it_cannot_make_before_racing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As a sweep's resume: a tune of loopback and tcp-1gbit arms, interrupted before any round,
    resumed where `tc` is missing, is refused naming what is missing, its run unchanged."""
    from tpbench import racing, tune

    suite = tmp_path / "suite.toml"
    suite.write_text(tiny_suite('interconnect = ["loopback", "tcp-1gbit"]', repeats=3))
    monkeypatch.setattr(sweep, "check_available", lambda ic: None)  # made where `tc` is: no root needed here
    run, _ = tune.start(suite, racing.Options(), out_root=tmp_path / "results")
    run.set_status(store.INTERRUPTED)
    run.lock.release()
    monkeypatch.undo()
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "tc" else f"/usr/sbin/{tool}")
    before = (run.dir / "run.json").read_text()
    assert run_cli(["tune", "--resume", str(run.dir)]) == 2
    assert "'tcp-1gbit' emulates a link and needs: " in capsys.readouterr().err
    assert (run.dir / "run.json").read_text() == before


# ---------------------------------------------------------------------------------------------
# Namespaces (root + iproute2)

needs_netns = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
    reason="network namespace tests need root and iproute2 (`ip`, `tc`)",
)


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split(" ", 1)[0] for line in out.splitlines() if line}


def _qdisc(namespace: str) -> str:
    return subprocess.run(
        ["tc", "-n", namespace, "qdisc", "show", "dev", "lo"], capture_output=True, text=True, check=True
    ).stdout


def _gone(pid: int, within_s: float = 5.0) -> bool:
    """Whether ``pid`` has ended (absent, or a zombie nobody has reaped yet)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


@pytest.fixture
def no_leftovers():
    """Fail (after removing them) if a test leaves a namespace of this process or a dead child."""
    before = _namespaces()
    yield
    icm.reap_stale_namespaces()
    ours = {n for n in _namespaces() - before if n.startswith(f"{icm.NETNS_PREFIX}{os.getpid()}-")}
    for name in ours:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    assert not ours, f"namespaces left behind: {ours}"


@needs_netns
def test_namespace_has_shaped_lo_and_is_removed_on_exit(no_leftovers: None) -> None:
    with world_network(resolve("tcp-1gbit")) as net:
        assert net.namespace is not None and net.namespace.startswith(f"tpbench-{os.getpid()}-")
        assert net.namespace in _namespaces()
        assert "tbf" in _qdisc(net.namespace) and "rate 1Gbit" in _qdisc(net.namespace)
        assert net.wrap(["true"]) == ["ip", "netns", "exec", net.namespace, "true"]
        assert net.env == {"GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}
        inside = subprocess.run(net.wrap(["ip", "-o", "link", "show", "up"]), capture_output=True, text=True)
        assert [line.split(":")[1].strip() for line in inside.stdout.splitlines()] == ["lo"]
        assert icm.reap_stale_namespaces() == []  # its creator (we) is alive
        name = net.namespace
    assert name not in _namespaces()


@needs_netns
@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_namespace_is_removed_on_exceptions(error: type[BaseException], no_leftovers: None) -> None:
    with pytest.raises(error):
        with world_network(resolve("tcp-10gbit")) as net:
            name = net.namespace
            raise error()
    assert name not in _namespaces()


@pytest.mark.ranks
@needs_netns
def test_processes_left_inside_are_killed_on_exit(no_leftovers: None) -> None:
    with world_network(resolve("tcp-1gbit")) as net:
        straggler = subprocess.Popen(net.wrap(["sleep", "60"]))
    try:
        assert _gone(straggler.pid)
    finally:
        straggler.kill()
        straggler.wait()


@pytest.mark.ranks
@needs_netns
def test_a_process_about_to_enter_is_killed_on_exit(no_leftovers: None) -> None:
    """``ip netns exec`` opens the namespace, then enters it: a rank spawned just before the block
    ends holds it only as a descriptor when the cleanup looks. Here one holds it as stdin."""
    with world_network(resolve("tcp-1gbit")) as net:
        with open(icm._NETNS_DIR / net.namespace) as namespace:
            opener = subprocess.Popen(["sleep", "60"], stdin=namespace)
        assert (
            net.namespace
            not in subprocess.run(["ip", "netns", "identify", str(opener.pid)], capture_output=True, text=True).stdout
        )
    try:
        assert _gone(opener.pid)
    finally:
        opener.kill()
        opener.wait()


# A stand-in for a sweep: opens an emulated link, starts a "rank" inside, reports both, waits.
_SWEEP = """
import subprocess, sys, time
from tpbench.interconnect import resolve, world_network
with world_network(resolve("tcp-1gbit")) as net:
    rank = subprocess.Popen(net.wrap(["sleep", "60"]))
    print(net.namespace, rank.pid, flush=True)
    time.sleep(60)
"""


def _start_sweep() -> tuple[subprocess.Popen, str, int]:
    sweep = subprocess.Popen([sys.executable, "-c", _SWEEP], stdout=subprocess.PIPE, text=True)
    name, rank_pid = sweep.stdout.readline().split()
    return sweep, name, int(rank_pid)


def _stop(sweep: subprocess.Popen, rank_pid: int) -> None:
    """Whatever a test did, end the stand-in sweep and its rank."""
    sweep.kill()
    sweep.wait()
    sweep.stdout.close()
    if not _gone(rank_pid, within_s=0):
        os.kill(rank_pid, signal.SIGKILL)


@pytest.mark.ranks
@needs_netns
def test_sigkilled_sweep_is_reaped(no_leftovers: None) -> None:
    sweep, name, rank_pid = _start_sweep()
    try:
        sweep.kill()
        sweep.wait()
        assert name in _namespaces()  # SIGKILL: nothing in the sweep could clean up
        reaped = icm.reap_stale_namespaces()
        assert name in reaped and name not in _namespaces()
        assert _gone(rank_pid)  # the orphaned rank held the namespace (and its qdisc) alive
    finally:
        _stop(sweep, rank_pid)


@pytest.mark.ranks
@needs_netns
def test_sigterm_cleans_up_in_the_sweep_itself(no_leftovers: None) -> None:
    sweep, name, rank_pid = _start_sweep()
    try:
        sweep.terminate()
        assert sweep.wait(timeout=10) == 128 + signal.SIGTERM
        assert name not in _namespaces()
        assert _gone(rank_pid)
    finally:
        _stop(sweep, rank_pid)


@needs_netns
def test_check_available_builds_a_real_link(no_leftovers: None) -> None:
    icm.check_available(resolve("tcp-1gbit"))


# One Gloo rank. Rank 0 reports each timed allreduce and the bytes that crossed the namespace's
# lo during them (/sys is remounted by `ip netns exec`, so it shows the namespace's lo).
_RANK = """
import json, os, sys, time
import torch, torch.distributed as dist
torch.set_num_threads(1)
n_elements, iterations = int(sys.argv[1]), int(sys.argv[2])
tx = lambda: int(open("/sys/class/net/lo/statistics/tx_bytes").read())
dist.init_process_group("gloo", init_method="env://")
x = torch.ones(n_elements)
dist.all_reduce(x)  # warm-up: connections, buffers
times = []
dist.barrier()
sent = tx()
for _ in range(iterations):
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_reduce(x)
    times.append(time.perf_counter() - t0)
dist.barrier()
sent = tx() - sent
if dist.get_rank() == 0:
    print(json.dumps({"times": times, "lo_bytes_per_allreduce": sent / iterations}))
dist.destroy_process_group()
"""


@pytest.mark.ranks
@needs_netns
def test_emulated_1gbit_link_limits_gloo_allreduce_to_its_rate(no_leftovers: None) -> None:
    """Model: Gloo's ring allreduce over 2 ranks has each rank send its whole buffer once
    (half in reduce-scatter, half in all-gather: 2(n-1)/n × bytes). Both ranks' traffic leaves
    through the one shaped ``lo``, so an allreduce moves 2 × bytes through the qdisc and takes
    2 × bytes × 8 / rate. The bytes are measured on ``lo`` (they include TCP/IP headers), the
    model is checked against them, and the time against the measured bytes."""
    n_bytes, iterations, world = 16 * 2**20, 5, 2
    ic = resolve("tcp-1gbit")
    with world_network(ic) as net:
        ranks = [
            subprocess.Popen(
                net.wrap([sys.executable, "-c", _RANK, str(n_bytes // 4), str(iterations)]),
                env={
                    **os.environ,
                    **net.env,
                    "MASTER_PORT": "29500",
                    "RANK": str(r),
                    "WORLD_SIZE": str(world),
                    "OMP_NUM_THREADS": "1",
                },
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in range(world)
        ]
        outputs = [rank.communicate(timeout=120) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], [err for _, err in outputs]
    report = json.loads(outputs[0][0])
    sent = report["lo_bytes_per_allreduce"]
    assert sent == pytest.approx(world * n_bytes, rel=0.05)
    predicted_s = sent * 8 / ic.rate_bits_per_s  # 16 MiB: ~0.27 s (unshaped lo here: ~0.017 s)
    measured_s = statistics.median(report["times"])
    detail = f"measured {measured_s:.3f}s, predicted {predicted_s:.3f}s"
    assert measured_s == pytest.approx(predicted_s, rel=0.2), detail
