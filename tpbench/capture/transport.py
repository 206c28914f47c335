"""The transport a world's ranks really used, and whether it is the one their profile asked for.

An interconnect profile only *asks*: NCCL falls back silently (P2P disabled by the topology, SHM
refused by a container, a network plugin missing), and Gloo binds to whatever interface its
environment names. So capture observes, per rank and per case:

- NCCL: the launcher runs NCCL ranks with ``NCCL_DEBUG=INFO`` and the INIT, P2P, SHM and NET
  subsystems, logging to a file per rank (``nccl_debug_env``). NCCL expands only ``%h`` (host
  name up to the first dot) and ``%p`` (pid) in ``NCCL_DEBUG_FILE`` — there is no rank pattern,
  so the local launcher gives each rank its own path, and ``nccl_log_path`` expands the patterns
  for worlds started by others (torchrun). ``parse_nccl_log`` reads the ``Channel …  via …``
  connection lines: one per channel and peer (per direction for NET). P2P covers NVLink and PCIe
  peer access alike (the mode, e.g. ``P2P/CUMEM/read``, is kept verbatim); telling NVLink from
  PCIe needs the GRAPH subsystem, which is not logged.
- Gloo: the TCP connections this process holds (``/proc/self/net/tcp*``, matched to the
  process's own socket inodes), their local and peer addresses, and the interfaces those
  addresses belong to; plus ``GLOO_SOCKET_IFNAME`` as the rank saw it. Gloo's options do not
  expose the device it bound (``ProcessGroupGloo.Device`` is opaque), so the sockets are the
  observation; with a FileStore rendezvous every TCP connection of a rank is Gloo's, and under
  torchrun the store's connections (``MASTER_PORT``) are left out.

``summarize`` turns the ranks' observations into the ``observed_transport`` entry of a case in
run.json, with ``mismatch`` (True/False, or None when there was nothing to compare) and a
``reason``.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import re
import socket
import struct
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tpbench.interconnect import Interconnect

NCCL_DEBUG_SUBSYS = "INIT,P2P,SHM,NET"

# What each builtin NCCL profile is for: the transport families its channels should use.
_EXPECTED_FAMILIES: dict[str, frozenset[str]] = {
    "nccl-p2p": frozenset({"P2P", "NVLS"}),
    "nccl-shm": frozenset({"SHM"}),
    "nccl-socket": frozenset({"NET/Socket"}),
    "nccl-ib": frozenset({"NET/IB"}),
}


def nccl_debug_env(log_path: Path) -> dict[str, str]:
    """Environment that makes one NCCL rank log its transport choices to ``log_path``."""
    if "%" in str(log_path):
        # NCCL would treat it as a pattern (and has no escape for a literal '%').
        raise ValueError(f"{log_path}: NCCL_DEBUG_FILE may not contain '%' (NCCL expands %h and %p)")
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": NCCL_DEBUG_SUBSYS, "NCCL_DEBUG_FILE": str(log_path)}


def nccl_log_path(env: Mapping[str, str] = os.environ, pid: int | None = None) -> Path | None:
    """This process's NCCL log, with ``%h``/``%p`` expanded the way NCCL does; None if NCCL logs
    to stdout."""
    pattern = env.get("NCCL_DEBUG_FILE")
    if not pattern:
        return None
    host = socket.gethostname().split(".", 1)[0]
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "%" and i + 1 < len(pattern) and pattern[i + 1] in "hp":
            out.append(host if pattern[i + 1] == "h" else str(pid if pid is not None else os.getpid()))
            i += 2
        else:
            out.append(c)
            i += 1
    return Path("".join(out))


# ---------------------------------------------------------------------------------------------
# NCCL

# "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read", "Channel 02/1 : 1[1] -> 0[0] [receive] via
# NET/Socket/0", older "Channel 00 : 0[1a000] -> 1[1b000] via P2P/IPC" (busId in brackets).
_CHANNEL_RE = re.compile(
    r"Channel (?P<channel>\d+)(?:/(?P<conn>\d+))?\s*:\s*(?P<src>\d+)\[[0-9a-fA-Fx]+\]\s*->\s*"
    r"(?P<dst>\d+)\[[0-9a-fA-Fx]+\]\s*(?:\[(?P<dir>send|receive)\]\s*)?via\s+(?P<via>.+?)\s*$"
)
_COMM_RE = re.compile(r"\bcomm 0x[0-9a-fA-F]+ rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nnodes>\d+)")
_VERSION_RE = re.compile(r"NCCL version (?P<version>\S+)")
# Network names may hold spaces: "Using network AWS Libfabric" (AWS's EFA plugin), "Using network IBext_v8".
_NETWORK_RE = re.compile(r"Using network (?P<net>.+?)\s*$")
# "NET/Socket : Using [0]eth0:10.0.0.1<0> [1]eth1:…", "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB eth0:…"
_NET_DEVICES_RE = re.compile(r"NET/(?P<net>\w[\w ]*?)\s*:\s*Using\s+(?P<devs>\[.*?)(?:\s*;\s*OOB.*)?$")
_NET_DEVICE_RE = re.compile(r"\[\d+\]([^\s<]+)")


def transport_family(via: str) -> str:
    """``P2P/CUMEM/read`` → ``P2P``; ``NET/IB/0/GDRDMA`` → ``NET/IB``; ``SHM/direct/direct`` → ``SHM``;
    ``NET/AWS Libfabric/0/GDRDMA`` → ``NET/AWS Libfabric`` (a network plugin's name may hold spaces)."""
    parts = via.strip().split("/")
    if parts[0] == "NET" and len(parts) > 1:
        return f"NET/{parts[1]}"
    return parts[0]


@dataclass(frozen=True)
class NcclRank:
    """What one rank's NCCL log says about its connections."""

    rank: int
    log: str | None
    version: str | None = None
    network: str | None = None  # "Using network Socket|IB|<plugin>"
    net_devices: tuple[str, ...] = ()
    nnodes: int | None = None  # None: the log has no nNodes line (NCCL before 2.12 wrote none)
    transports: dict[str, int] = field(default_factory=dict)  # family → connections
    modes: dict[str, int] = field(default_factory=dict)  # verbatim "via" text → connections
    error: str | None = None


def parse_nccl_log(text: str, rank: int, log: str | None = None) -> NcclRank:
    """The connection summary of one NCCL_DEBUG=INFO log (all communicators of the process)."""
    families: Counter[str] = Counter()
    modes: Counter[str] = Counter()
    version = network = None
    devices: list[str] = []
    nnodes: int | None = None
    for line in text.splitlines():
        if "NCCL" not in line:
            continue
        if m := _CHANNEL_RE.search(line):
            via = m["via"]
            families[transport_family(via)] += 1
            modes[via] += 1
        elif m := _COMM_RE.search(line):
            nnodes = max(nnodes or 0, int(m["nnodes"]))
        elif m := _VERSION_RE.search(line):
            version = m["version"]
        elif m := _NETWORK_RE.search(line):
            network = m["net"]
        elif m := _NET_DEVICES_RE.search(line):
            devices += [
                f"{m['net']}:{d}" for d in _NET_DEVICE_RE.findall(m["devs"]) if f"{m['net']}:{d}" not in devices
            ]
    return NcclRank(rank, log, version, network, tuple(devices), nnodes, dict(families), dict(modes))


def observe_nccl(rank: int, path: Path | None) -> NcclRank:
    if path is None:
        return NcclRank(rank, None, error="NCCL_DEBUG_FILE is not set: NCCL logged to stdout, not parsed")
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return NcclRank(rank, str(path), error=f"cannot read the NCCL log: {e.strerror or e}")
    return parse_nccl_log(text, rank, str(path))


# ---------------------------------------------------------------------------------------------
# Gloo


@dataclass(frozen=True)
class GlooRank:
    """The TCP connections one Gloo rank holds, and the interfaces they run over."""

    rank: int
    socket_ifname: str | None
    connections: int
    local_addresses: tuple[str, ...]
    peer_addresses: tuple[str, ...]
    interfaces: tuple[str, ...]
    error: str | None = None


def _socket_inodes(fd_dir: Path) -> set[int]:
    inodes = set()
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _hex_address(text: str) -> tuple[str, int]:
    """/proc/net/tcp address ``0100007F:1F90`` → ("127.0.0.1", 8080); IPv6 in 32-bit host-order words."""
    addr, port = text.split(":")
    raw = bytes.fromhex(addr)
    words = b"".join(struct.pack("<I", struct.unpack(">I", raw[i : i + 4])[0]) for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(words)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return str(ip), int(port, 16)


def established_connections(proc: Path = Path("/proc/self")) -> list[tuple[tuple[str, int], tuple[str, int]]]:
    """(local, remote) of this process's ESTABLISHED TCP connections, IPv4 and IPv6."""
    mine = _socket_inodes(proc / "fd")
    out = []
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == "01" and int(cols[9]) in mine:  # 01 = ESTABLISHED
                out.append((_hex_address(cols[1]), _hex_address(cols[2])))
    return out


def interface_networks() -> dict[str, list[ipaddress.IPv4Network | ipaddress.IPv6Network]]:
    """Interface name → the networks of its addresses (IPv4 via ioctl, IPv6 from /proc/net/if_inet6)."""
    nets: dict[str, list] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            req = struct.pack("256s", name.encode()[:15])
            try:
                addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])  # SIOCGIFADDR
                mask = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x891B, req)[20:24])  # SIOCGIFNETMASK
            except OSError:
                continue  # no IPv4 address
            nets.setdefault(name, []).append(ipaddress.ip_network(f"{addr}/{mask}", strict=False))
    try:
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            hexaddr, _, plen, _, _, name = line.split()
            addr = ipaddress.IPv6Address(bytes.fromhex(hexaddr))
            nets.setdefault(name, []).append(ipaddress.ip_network(f"{addr}/{int(plen, 16)}", strict=False))
    except OSError:
        pass
    return nets


def _interface_of(address: str, nets: Mapping[str, Sequence[Any]]) -> str:
    ip = ipaddress.ip_address(address)
    for name, networks in nets.items():
        if any(ip.version == n.version and ip in n for n in networks):
            return name
    return "?"


def observe_gloo(rank: int, env: Mapping[str, str] = os.environ) -> GlooRank:
    """Gloo's connections as this process holds them right now (call while the world is up)."""
    store_port = int(env["MASTER_PORT"]) if env.get("MASTER_PORT", "").isdigit() else None
    try:
        conns = [(here, peer) for here, peer in established_connections() if store_port not in (here[1], peer[1])]
        nets = interface_networks()
    except OSError as e:
        return GlooRank(rank, env.get("GLOO_SOCKET_IFNAME"), 0, (), (), (), error=f"cannot read /proc: {e}")
    local = sorted({here[0] for here, _ in conns})
    return GlooRank(
        rank=rank,
        socket_ifname=env.get("GLOO_SOCKET_IFNAME"),
        connections=len(conns),
        local_addresses=tuple(local),
        peer_addresses=tuple(sorted({peer[0] for _, peer in conns})),
        interfaces=tuple(sorted({_interface_of(a, nets) for a in local})),
    )


# ---------------------------------------------------------------------------------------------
# Per case: all ranks, compared with the profile


ANY_NETWORK = "NET/*"
"""In an expected set: any network family (NET/Socket, NET/IB, or a plugin's: NET/IBext_v8, NET/AWS Libfabric…)."""


def expected_nccl_families(ic: Interconnect, nnodes: int | None) -> frozenset[str] | None:
    """Transport families a profile allows; None when it allows anything (nccl-default).

    ``nnodes``: None when no log says (then the one-node rule applies; ``summarize`` does not judge
    network families it cannot place)."""
    allowed = _EXPECTED_FAMILIES.get(ic.name)
    if allowed is not None and (nnodes or 1) > 1 and ic.name in ("nccl-p2p", "nccl-shm"):
        allowed = allowed | {ANY_NETWORK}  # between nodes only a network can carry it, whichever plugin
    forbidden = set()
    env = ic.env
    if env.get("NCCL_P2P_DISABLE") == "1":
        forbidden.add("P2P")
    if env.get("NCCL_SHM_DISABLE") == "1":
        forbidden.add("SHM")
    if env.get("NCCL_IB_DISABLE") == "1" or env.get("NCCL_NET", "IB") != "IB":
        forbidden.add("NET/IB")
    if env.get("NCCL_NET", "Socket") != "Socket":
        forbidden.add("NET/Socket")
    if allowed is None and not forbidden:
        return None
    base = allowed if allowed is not None else frozenset({"P2P", "SHM", "NVLS", "NET/Socket", "NET/IB", "COLLNET"})
    return frozenset(base - forbidden)


def summarize(ic: Interconnect, ranks: Sequence[NcclRank | GlooRank], nnodes: int = 1) -> dict[str, Any]:
    """The ``observed_transport`` entry of a case: per-rank observations plus the verdict.

    ``nnodes``: the machines the world spans (its ``world_ready`` event's host names), for Gloo,
    which is pinned to ``lo`` on one node only; NCCL's logs say it themselves."""
    entry: dict[str, Any] = {"asked": ic.name, "backend": ic.backend, "ranks": {str(r.rank): asdict(r) for r in ranks}}
    errors = [f"rank {r.rank}: {r.error}" for r in ranks if r.error]
    if ic.backend == "nccl":
        families = sorted({f for r in ranks if isinstance(r, NcclRank) for f in r.transports})
        logged = max((r.nnodes for r in ranks if isinstance(r, NcclRank) and r.nnodes), default=None)
        expected = expected_nccl_families(ic, logged)
        entry |= {
            "transports": families,
            "expected": sorted(expected) if expected is not None else None,
            "nnodes": logged if logged is not None else "unknown",
        }
        if errors:
            return entry | {"mismatch": None, "reason": "; ".join(errors)}
        if not families:
            return entry | {
                "mismatch": None,
                "reason": "no inter-rank connection in the NCCL logs (a single rank connects to nobody)",
            }
        if expected is None:
            return entry | {"mismatch": False, "reason": None}
        unexpected = [
            f for f in families if f not in expected and not (ANY_NETWORK in expected and f.startswith("NET/"))
        ]
        if logged is None and unexpected and all(f.startswith("NET/") for f in unexpected):
            return entry | {
                "mismatch": None,
                "reason": f"the NCCL logs show {', '.join(unexpected)} but not how many "
                "nodes the world spans (no nNodes line): a network is expected "
                "between nodes, so this is not judged",
            }
        if unexpected:
            return entry | {
                "mismatch": True,
                "reason": f"asked {ic.name} (allows {', '.join(sorted(expected))}) "
                f"but the NCCL log shows {', '.join(unexpected)}",
            }
        return entry | {"mismatch": False, "reason": None}
    return entry | _judge_gloo(ic, ranks, nnodes, errors)


def _judge_gloo(ic: Interconnect, ranks: Sequence[NcclRank | GlooRank], nnodes: int, errors: list[str]) -> dict:
    """Gloo's part of the entry. On one node the launcher points Gloo at ``lo`` unless the profile
    names another interface (``worlds.world_network``, ``worlds.torchrun_env``); across nodes it
    leaves Gloo on the nodes' network, any interface but ``lo`` (there ``lo`` would mean the world
    never left one machine)."""
    named = ic.env.get("GLOO_SOCKET_IFNAME")
    network = named is None and nnodes > 1
    want = "network" if network else named or "lo"
    interfaces = sorted({i for r in ranks if isinstance(r, GlooRank) for i in r.interfaces})
    entry = {"interfaces": interfaces, "expected": [want], "nnodes": nnodes}
    if errors:
        return entry | {"mismatch": None, "reason": "; ".join(errors)}
    if not interfaces:
        return entry | {"mismatch": None, "reason": "no Gloo TCP connection found (a single rank connects to nobody)"}
    wrong = [i for i in interfaces if i == "lo"] if network else [i for i in interfaces if i != want]
    if wrong:
        asked = f"across {nnodes} nodes (Gloo over the nodes' network)" if network else f"(Gloo on {want})"
        return entry | {
            "mismatch": True,
            "reason": f"asked {ic.name} {asked} but connections run over {', '.join(wrong)}",
        }
    return entry | {
        "mismatch": False,
        "reason": f"across {nnodes} nodes over {', '.join(interfaces)}" if network else None,
    }


def observe(backend: str, rank: int) -> NcclRank | GlooRank:
    """This rank's observation for its world's backend (call while the world is up)."""
    return observe_nccl(rank, nccl_log_path()) if backend == "nccl" else observe_gloo(rank)


def from_dicts(backend: str, ranks: Sequence[Mapping[str, Any]]) -> list[NcclRank | GlooRank]:
    """Observations back from their JSON form (they cross the worker → launcher pipe as dicts)."""
    cls = NcclRank if backend == "nccl" else GlooRank
    return [cls(**d) for d in ranks]
