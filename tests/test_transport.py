"""Observed transport: the NCCL_DEBUG log parser, Gloo's sockets, and the verdict against the profile.

The multi-rank NCCL logs in tests/fixtures/nccl_logs are hand-written from NCCL 2.7–2.26 INFO line
formats (see the README there): no multi-GPU machine was at hand; the single-rank H200 log is
recorded. The Gloo observation runs in a real 2-rank Gloo world.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from pathlib import Path

import pytest
from world import run_world

from tpbench.capture import transport
from tpbench.capture.transport import GlooRank, NcclRank
from tpbench.interconnect import resolve

LOGS = Path(__file__).parent / "fixtures" / "nccl_logs"


def _parse(name: str, rank: int = 0) -> NcclRank:
    return transport.observe_nccl(rank, LOGS / name)


def test_p2p_log_counts_one_connection_per_channel():
    obs = _parse("p2p_cumem.log")
    assert obs.transports == {"P2P": 4}
    assert obs.modes == {"P2P/CUMEM/read": 4}
    assert (obs.version, obs.network, obs.nnodes) == ("2.21.5+cuda12.4", "Socket", 1)
    assert obs.net_devices == ("Socket:eth0:10.0.0.11",)
    assert obs.error is None


def test_shm_socket_and_legacy_logs():
    assert _parse("shm.log").transports == {"SHM": 2}
    sock = _parse("socket.log", rank=1)
    # NET connections are logged once per direction ([send] and [receive]).
    assert sock.transports == {"NET/Socket": 4}
    assert sock.modes == {"NET/Socket/0": 2, "NET/Socket/1": 2}
    assert sock.net_devices == ("Socket:eth0:10.0.0.11", "Socket:eth1:192.168.8.11")
    legacy = _parse("legacy_p2p_ipc.log")
    assert legacy.transports == {"P2P": 2}
    assert legacy.version == "2.10.3+cuda11.3"


def test_two_node_ib_log_mixes_p2p_inside_and_ib_between_nodes():
    obs = _parse("ib_two_nodes.log", rank=8)
    assert obs.transports == {"NET/IB": 6, "P2P": 2}
    assert obs.network == "IB"
    assert obs.nnodes == 2
    assert obs.net_devices[:2] == ("IB:mlx5_0:1/IB", "IB:mlx5_1:1/IB")


def test_transport_family_names():
    assert transport.transport_family("P2P/CUMEM/read") == "P2P"
    assert transport.transport_family("P2P/direct pointer") == "P2P"
    assert transport.transport_family("NET/IB/0/GDRDMA") == "NET/IB"
    assert transport.transport_family("SHM/direct/direct") == "SHM"


def test_asked_shm_but_log_shows_p2p_is_a_mismatch():
    verdict = transport.summarize(resolve("nccl-shm"), [_parse("p2p_cumem.log", 0), _parse("p2p_cumem.log", 1)])
    assert verdict["mismatch"] is True
    assert "nccl-shm" in verdict["reason"] and "P2P" in verdict["reason"]
    assert verdict["transports"] == ["P2P"] and verdict["expected"] == ["SHM"]
    assert set(verdict["ranks"]) == {"0", "1"}


@pytest.mark.parametrize(
    ("profile", "log"),
    [
        ("nccl-p2p", "p2p_cumem.log"),
        ("nccl-shm", "shm.log"),
        ("nccl-socket", "socket.log"),
        ("nccl-default", "ib_two_nodes.log"),
        ("nccl-default", "p2p_cumem.log"),
    ],
)
def test_matching_profiles(profile, log):
    verdict = transport.summarize(resolve(profile), [_parse(log)])
    assert verdict["mismatch"] is False and verdict["reason"] is None


def test_profile_env_forbids_transports_for_user_profiles():
    no_ib = resolve("no-ib", {"no-ib": {"backend": "nccl", "env": {"NCCL_IB_DISABLE": "1"}}})
    verdict = transport.summarize(no_ib, [_parse("ib_two_nodes.log", 8)])
    assert verdict["mismatch"] is True and "NET/IB" in verdict["reason"]
    # nccl-ib disables P2P too: the P2P connections inside a node contradict it.
    assert transport.summarize(resolve("nccl-ib"), [_parse("ib_two_nodes.log", 8)])["mismatch"] is True


def test_single_rank_and_missing_log_are_not_judged(tmp_path):
    alone = transport.summarize(resolve("nccl-default"), [_parse("single_rank.log")])
    assert alone["mismatch"] is None and "single rank" in alone["reason"]
    missing = transport.summarize(resolve("nccl-p2p"), [transport.observe_nccl(0, tmp_path / "none.log")])
    assert missing["mismatch"] is None and "cannot read the NCCL log" in missing["reason"]


def test_nccl_log_path_expands_host_and_pid_like_nccl(tmp_path):
    host = socket.gethostname().split(".", 1)[0]
    path = transport.nccl_log_path({"NCCL_DEBUG_FILE": f"{tmp_path}/nccl.%h.%p.%r.log"}, pid=42)
    assert path == tmp_path / f"nccl.{host}.42.%r.log"  # %r is no NCCL pattern: left as is
    assert transport.nccl_log_path({}) is None


def test_launcher_env_names_a_file_per_rank_and_refuses_percent(tmp_path):
    env = transport.nccl_debug_env(tmp_path / "nccl-w0-rank1.log")
    assert env == {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,P2P,SHM,NET",
        "NCCL_DEBUG_FILE": str(tmp_path / "nccl-w0-rank1.log"),
    }
    with pytest.raises(ValueError, match="%"):
        transport.nccl_debug_env(tmp_path / "100%" / "x.log")


def test_proc_net_addresses_decode():
    assert transport._hex_address("0100007F:1F90") == ("127.0.0.1", 8080)
    assert transport._hex_address("00000000000000000000000001000000:0016") == ("::1", 22)
    assert transport._hex_address("0000000000000000FFFF00000100007F:0050") == ("127.0.0.1", 80)


def _observe(rank: int, world_size: int) -> GlooRank:
    return transport.observe_gloo(rank)


@pytest.mark.ranks
def test_gloo_world_is_observed_on_loopback(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    ranks = run_world(_observe, 2)
    for r, obs in enumerate(ranks):
        assert obs.rank == r and obs.socket_ifname == "lo"
        assert obs.connections >= 1  # the full mesh: one pair to the other rank
        assert obs.interfaces == ("lo",)
        assert obs.local_addresses == ("127.0.0.1",) and obs.peer_addresses == ("127.0.0.1",)
    verdict = transport.summarize(resolve("loopback"), ranks)
    assert verdict["mismatch"] is False and verdict["interfaces"] == ["lo"]
    elsewhere = resolve("eth", {"eth": {"backend": "gloo", "env": {"GLOO_SOCKET_IFNAME": "eth0"}}})
    wrong = transport.summarize(elsewhere, ranks)
    assert wrong["mismatch"] is True and "lo" in wrong["reason"]


def test_observations_survive_the_event_pipe():
    obs = [_parse("shm.log"), _parse("shm.log", 1)]
    back = transport.from_dicts("nccl", json.loads(json.dumps([dataclasses.asdict(o) for o in obs])))
    assert transport.summarize(resolve("nccl-shm"), back)["mismatch"] is False


def test_network_plugin_names_with_spaces_and_versions_are_kept_whole():
    aws = _parse("aws_libfabric_two_nodes.log")
    assert aws.network == "AWS Libfabric"
    assert aws.transports == {"NET/AWS Libfabric": 4, "P2P": 2}
    assert aws.modes["NET/AWS Libfabric/0/GDRDMA"] == 4
    ibext = _parse("ibext_two_nodes.log", rank=1)
    assert (ibext.network, ibext.nnodes) == ("IBext_v8", 2)
    assert ibext.transports == {"P2P": 2, "NET/IBext_v8": 2}
    assert transport.transport_family("NET/AWS Libfabric/0/GDRDMA") == "NET/AWS Libfabric"


@pytest.mark.parametrize("log", ["aws_libfabric_two_nodes.log", "ibext_two_nodes.log", "ib_two_nodes.log"])
@pytest.mark.parametrize("profile", ["nccl-p2p", "nccl-shm"])
def test_any_network_plugin_is_accepted_between_nodes(profile, log):
    verdict = transport.summarize(resolve(profile), [_parse(log)])
    if profile == "nccl-shm":  # these logs use P2P inside the node: that alone contradicts nccl-shm
        assert verdict["mismatch"] is True and verdict["reason"].endswith("shows P2P")
    else:
        assert verdict["mismatch"] is False, verdict["reason"]
    assert verdict["nnodes"] == 2 and "NET/*" in verdict["expected"]


def test_network_without_a_node_count_is_not_judged_as_one_node():
    obs = _parse("two_nodes_no_nnodes.log")
    assert obs.nnodes is None and obs.transports == {"NET/IB": 2, "P2P": 2} and obs.version == "2.7.8+cuda11.0"
    verdict = transport.summarize(resolve("nccl-p2p"), [obs])
    assert verdict["nnodes"] == "unknown"
    assert verdict["mismatch"] is None and "not how many nodes" in verdict["reason"]
    # What the log does place is still judged: P2P contradicts nccl-shm whatever the node count.
    assert transport.summarize(resolve("nccl-shm"), [obs])["mismatch"] is True


def test_recorded_h200_log_of_a_lone_rank():
    """Recorded by the GPU check (NCCL 2.28.9, one H200, no InfiniBand): IB fails to initialise
    (``NET/IB : Using [RO]`` names no device), Socket is used, a lone rank connects to nobody."""
    obs = _parse("h200_single_rank.log")
    assert (obs.version, obs.network, obs.nnodes) == ("2.28.9+cuda13.0", "Socket", 1)
    assert obs.net_devices == ("Socket:eth0:192.0.2.2",)
    assert obs.transports == {} and obs.modes == {}
    assert transport.summarize(resolve("nccl-default"), [obs])["mismatch"] is None


def _gloo_over(interface: str, subnet: str) -> list[GlooRank]:
    """Two Gloo ranks connected to each other over ``interface`` (addresses in ``subnet``.0/24)."""
    return [GlooRank(r, None, 2, (f"{subnet}.{r}",), (f"{subnet}.{1 - r}",), (interface,)) for r in (0, 1)]


def test_gloo_across_nodes_expects_the_network_not_lo():
    """Under torchrun across nodes Gloo is not pinned to ``lo`` (``worlds.torchrun_env``): a 2-node
    loopback world whose connections ran over eth0 was recorded as a mismatch ("asked loopback (Gloo
    on lo) but connections run over eth0"). Across nodes the nodes' network is expected and said;
    ``lo`` there means the world never left one machine. One node is judged as before."""
    across = transport.summarize(resolve("loopback"), _gloo_over("eth0", "10.0.0"), nnodes=2)
    assert across["mismatch"] is False and across["nnodes"] == 2
    assert across["expected"] == ["network"] and across["reason"] == "across 2 nodes over eth0"
    looped = transport.summarize(resolve("loopback"), _gloo_over("lo", "127.0.0"), nnodes=2)
    assert looped["mismatch"] is True
    assert (
        looped["reason"] == "asked loopback across 2 nodes (Gloo over the nodes' network) but connections run over lo"
    )
    one = transport.summarize(resolve("loopback"), _gloo_over("eth0", "10.0.0"))
    assert one["mismatch"] is True and one["expected"] == ["lo"] and one["nnodes"] == 1
    assert one["reason"] == "asked loopback (Gloo on lo) but connections run over eth0"
    # A profile naming an interface is held to it, across nodes too.
    ib = resolve("ib", {"ib": {"backend": "gloo", "env": {"GLOO_SOCKET_IFNAME": "ib0"}}})
    wrong = transport.summarize(ib, _gloo_over("eth0", "10.0.0"), nnodes=2)
    assert wrong["mismatch"] is True and wrong["expected"] == ["ib0"]


@pytest.mark.parametrize(
    ("hosts", "interface", "judged"),
    [
        (("node0", "node1"), "eth0", (False, "across 2 nodes over eth0", 2)),
        # Agents standing in for nodes on one machine (tests/test_cluster.py's) meet at its host name,
        # which may resolve to 127.0.0.1: Gloo runs over lo there, as on any one machine.
        (("vm", "vm"), "lo", (False, None, 1)),
    ],
)
def test_the_launcher_judges_gloo_by_the_machines_its_world_reported(tmp_path, hosts, interface, judged):
    """The launcher judges a case's transport by the host names the world's ``world_ready`` named
    (under torchrun the sweeping process sees only its own machine): events as a 2-node torchrun
    world writes them, read back as ``--resume`` reads a printed world's."""
    from conftest import tiny_suite

    from tpbench import store
    from tpbench.launch import PrintedWorldRecord, Supervisor
    from tpbench.suite import Machine, expand, load

    (tmp_path / "tiny.toml").write_text(tiny_suite('algorithm = ["ddp"]', repeats=1))
    case = expand(load(tmp_path / "tiny.toml"), Machine(gpus=0))[0]
    run = store.Run.create(tmp_path / "results", "tiny", "tiny.toml", "", [case.params()], {})
    events = run.dir / "events" / "w0"
    events.mkdir(parents=True)
    nodes = [{"node": n, "hostname": host, "ranks": [n], "fingerprint": {}} for n, host in enumerate(hosts)]
    ranks = [dataclasses.asdict(r) for r in _gloo_over(interface, "10.0.0" if interface == "eth0" else "127.0.0")]
    capture = {"nvml": {}, "clock_sync": {}, "transport": {"backend": "gloo", "ranks": ranks}, "trace": None}
    lines = [
        {"event": "world_ready", "t": 0.0, "world": "w0", "nodes": nodes},
        {"event": "repeat_start", "t": 0.0, "case": case.case_id, "repeat": 0},
        {"event": "repeat_end", "t": 0.1, "case": case.case_id, "repeat": 0, "median_ms": 1.0},
        {"event": "capture", "t": 0.1, "case": case.case_id, **capture},
        {"event": "world_done", "t": 0.2, "world": "w0"},
    ]
    (events / "rank0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    world = PrintedWorldRecord(run.dir, "w0", 2)
    Supervisor(world, {case.case_id: case}, run, lambda k, e: None, interconnect=resolve("loopback")).supervise()
    seen = run.record.cases[case.case_id].capture.observed_transport
    assert (seen.mismatch, seen.reason, seen.nnodes) == judged
