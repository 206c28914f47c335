"""Interconnect profiles: which fabric a world's ranks talk over, real or emulated.

A profile is what the suite key ``interconnect`` names. For NCCL it is a set of environment
variables that steers NCCL's transport choice (peer-to-peer, shared memory, sockets,
InfiniBand); whether NCCL really used that transport is observed by capture, not assumed here.
For Gloo it is either plain loopback or an *emulated link*: the world runs inside a network
namespace created for it, whose own loopback is rate-limited by a ``tbf`` qdisc. Gloo ranks
then talk over 127.0.0.1 on that shaped ``lo``, so a single machine can stand in for a slower
fabric and the communication:computation ratio becomes a dial. (``netem`` delay is not
assumed: the kernels tpbench runs on do not all have it; a rate is what ``tbf`` gives.)

Namespaces are machine-wide state, so their removal is guaranteed three ways: the context
manager deletes its namespace on every exit (exceptions, ``KeyboardInterrupt``, and SIGTERM,
which it turns into ``SystemExit`` while active); and names carry the creating pid, so
``reap_stale_namespaces()`` (called by the launcher at sweep start) removes whatever a sweep
killed with SIGKILL left behind.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BACKENDS = ("gloo", "nccl")

# NCCL profiles: each pins the transport NCCL would otherwise pick by topology.
# nccl-p2p lifts NCCL's topology limit on P2P (NCCL_P2P_LEVEL=SYS) so P2P is used wherever the
# hardware allows it at all; the others switch off the faster transports one by one.
_NCCL_PROFILES: dict[str, dict[str, str]] = {
    "nccl-default": {},
    "nccl-p2p": {"NCCL_P2P_DISABLE": "0", "NCCL_P2P_LEVEL": "SYS", "NCCL_SHM_DISABLE": "0"},
    "nccl-shm": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "0"},
    "nccl-socket": {
        "NCCL_P2P_DISABLE": "1",
        "NCCL_SHM_DISABLE": "1",
        "NCCL_NET": "Socket",
        "NCCL_IB_DISABLE": "1",
    },
    "nccl-ib": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NET": "IB", "NCCL_IB_DISABLE": "0"},
}

BUILTIN_NAMES: tuple[str, ...] = (*_NCCL_PROFILES, "loopback", "tcp-<rate>")

# tc's own decimal bit units. Byte units ("mbps" means megaBYTES per second to tc) are refused
# on purpose: they read like bits and would be off by eight.
_RATE_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_RATE_RE = re.compile(r"(?P<num>\d+(?:\.\d+)?)(?P<unit>[a-z]+)")
# Below 1 Mbit/s tbf's bucket, which tc stores as a 32-bit time, overflows for the burst we need
# (256 KiB at 1 kbit/s is half an hour), and a 16 MB collective would take minutes anyway.
_MIN_RATE_BITS_PER_S = 1e6
_MAX_RATE_BITS_PER_S = 1e12
_RATE_EXPECTED = (
    "a rate like '500mbit', '1gbit' or '2.5gbit' (units: bit, kbit, mbit, gbit, tbit; lowercase; 1mbit to 1tbit)"
)
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Variables that change which program or library a rank runs rather than how it communicates,
# and the ones the launcher sets for the world itself: a profile needs ``allow_env`` for them.
_CODE_ENV_PREFIXES = ("LD_", "DYLD_", "PYTHON")
_CODE_ENV = frozenset({"PATH", "BASH_ENV", "ENV", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"})


def _changes_what_runs(key: str) -> bool:
    return key in _CODE_ENV or key.startswith(_CODE_ENV_PREFIXES)


LOOPBACK_ADDR = "127.0.0.1"
# Keys the namespace dictates: inside it only `lo` exists, so a profile may not point Gloo elsewhere.
_NAMESPACE_OWNED_ENV = {"GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": LOOPBACK_ADDR}


class InterconnectUnavailable(RuntimeError):
    """This machine cannot provide the asked interconnect (not root, no iproute2, no tbf)."""


@dataclass(frozen=True)
class Interconnect:
    """A resolved interconnect profile: what the launcher needs to start a world on it.

    ``env`` is excluded from the hash (dicts are unhashable) but not from equality, so profiles
    can key the launcher's grouping of cases into worlds.
    """

    name: str
    backend: str
    env: Mapping[str, str] = field(hash=False)
    rate_bits_per_s: float | None = None

    @property
    def shaped(self) -> bool:
        """Whether the world needs its own rate-limited network namespace."""
        return self.rate_bits_per_s is not None


def parse_rate(text: str) -> float:
    """``'2.5gbit'`` → ``2.5e9`` bits/s. Raises ``ValueError`` saying what is expected."""
    m = _RATE_RE.fullmatch(text) if isinstance(text, str) else None
    if m is None or m["unit"] not in _RATE_UNITS:
        raise ValueError(f"bad rate {text!r}: expected {_RATE_EXPECTED}")
    bits = float(m["num"]) * _RATE_UNITS[m["unit"]]
    if bits < _MIN_RATE_BITS_PER_S:
        raise ValueError(f"bad rate {text!r}: must be at least 1mbit")
    if bits > _MAX_RATE_BITS_PER_S:
        raise ValueError(
            f"bad rate {text!r}: must be at most 1tbit (no loopback comes near it; above, tc's numbers overflow)"
        )
    return bits


def resolve(name: str, user_profiles: Mapping[str, Mapping[str, Any]] | None = None) -> Interconnect:
    """Turn a profile name from a suite into an ``Interconnect``.

    Builtins: ``nccl-default``, ``nccl-p2p``, ``nccl-shm``, ``nccl-socket``, ``nccl-ib``,
    ``loopback`` and ``tcp-<rate>`` (Gloo over an emulated link of that rate). ``user_profiles``
    is the suite's ``[interconnects]`` table: ``NAME = {backend = "gloo"|"nccl", env = {...},
    rate = "2.5gbit"}``; ``backend`` is required, ``env`` and ``rate`` optional. User names may
    not shadow builtins, so a name means the same thing in every suite. Errors are ``ValueError``
    naming what was expected; the suite module adds file and key.
    """
    user_profiles = user_profiles or {}
    for user_name in user_profiles:
        if _is_builtin(user_name):
            raise ValueError(f"interconnect profile {user_name!r} shadows a builtin; builtins are {_builtins_text()}")
    if name in _NCCL_PROFILES:
        return Interconnect(name, "nccl", dict(_NCCL_PROFILES[name]), None)
    if name == "loopback":
        return Interconnect(name, "gloo", {}, None)
    if name.startswith("tcp-"):
        try:
            rate = parse_rate(name[len("tcp-") :])
        except ValueError as e:
            raise ValueError(f"bad interconnect {name!r}: expected tcp-<rate> with {_RATE_EXPECTED}") from e
        return Interconnect(name, "gloo", {}, rate)
    if name in user_profiles:
        return _user_profile(name, user_profiles[name])
    defined = f"; defined in this suite: {', '.join(sorted(user_profiles))}" if user_profiles else ""
    raise ValueError(f"unknown interconnect {name!r}: expected one of {_builtins_text()}{defined}")


def _is_builtin(name: str) -> bool:
    return name in _NCCL_PROFILES or name == "loopback" or name.startswith("tcp-")


def _builtins_text() -> str:
    return ", ".join(BUILTIN_NAMES) + " (e.g. tcp-1gbit, tcp-10gbit)"


# The keys of an ``[interconnects.NAME]`` table, in one place: the message for a profile that is not a
# table left out allow_env, which the unknown-key message named.
PROFILE_KEYS = ("backend", "env", "rate", "allow_env")


def _user_profile(name: str, table: Mapping[str, Any]) -> Interconnect:
    """Validate one ``[interconnects.NAME]`` table."""
    where = f"interconnect profile {name!r}"
    if not _NAME_RE.fullmatch(name):
        raise ValueError(f"{where}: names may hold letters, digits, '_', '.', '-' and start with a letter or digit")
    if not isinstance(table, Mapping):
        raise ValueError(f"{where}: expected a table with keys {', '.join(PROFILE_KEYS)}")
    unknown = sorted(set(table) - set(PROFILE_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; expected {', '.join(PROFILE_KEYS)}")
    backend = table.get("backend")
    if backend not in BACKENDS:
        got = f"got {backend!r}" if "backend" in table else "it has none"
        raise ValueError(f"{where}: backend must be one of {', '.join(BACKENDS)}, {got}")
    env = table.get("env", {})
    if not isinstance(env, Mapping):
        raise ValueError(f"{where}: env must be a table of strings")
    for key, value in env.items():
        if not (isinstance(key, str) and _ENV_KEY_RE.fullmatch(key)):
            raise ValueError(f"{where}: env key {key!r} is not a valid environment variable name")
        if not isinstance(value, str):
            raise ValueError(f"{where}: env.{key} must be a string, got {type(value).__name__} (quote it)")
    allowed = table.get("allow_env", [])
    if not isinstance(allowed, list) or not all(isinstance(a, str) for a in allowed):
        raise ValueError(f"{where}: allow_env must be a list of variable names")
    for key in env:
        if _changes_what_runs(key) and key not in allowed:
            raise ValueError(
                f"{where}: env.{key} changes what every rank runs (a suite is code); "
                f'to mean it, add allow_env = ["{key}"] to the profile'
            )
    rate = None
    if "rate" in table:
        rate = parse_rate(table["rate"])
        if backend != "gloo":
            # The shaped `lo` only carries what crosses loopback sockets; NCCL's P2P/SHM
            # transports bypass it, so a rate on NCCL would silently not apply.
            raise ValueError(
                f"{where}: rate applies to backend 'gloo' only (NCCL traffic does not cross the shaped lo)"
            )
        for key, required in _NAMESPACE_OWNED_ENV.items():
            if key in env and env[key] != required:
                raise ValueError(f"{where}: env.{key} must be {required!r} (or unset) on an emulated link")
    return Interconnect(name, backend, dict(env), rate)


# ---------------------------------------------------------------------------------------------
# Emulated links: one network namespace per world


# tbf needs a bucket bigger than the largest packet or it splits/drops them; a fresh namespace's
# lo sends TSO/GSO super-packets of up to 64 KiB (its gso_max_size), so four of them is the floor.
# Above that the bucket holds 1 ms of traffic, so the qdisc's timer need not fire per packet at
# high rates. The bucket is also the "free" head start a burst gets after an idle period; at
# 1 Gbit/s 256 KiB is <1% of a 16 MB allreduce.
_MIN_BURST_BYTES = 4 * 65536
_BURST_SECONDS = 1e-3
# The queue must absorb what the ranks' TCP sockets hand it (TCP small queues allow up to
# tcp_limit_output_bytes = 4 MiB per socket on current kernels); a drop on loopback costs a
# 200 ms retransmission timeout and would swamp the rate being emulated.
_MIN_LIMIT_BYTES = 16 * 2**20
_LIMIT_SECONDS = 0.1
_MAX_LIMIT_BYTES = 2**32 - 1  # tbf's limit is a 32-bit byte count

NETNS_PREFIX = "tpbench-"
_NETNS_DIR = Path("/var/run/netns")
# How long deleting a namespace keeps killing what holds it (SIGKILL ends a process in milliseconds).
_KILL_WAIT_S = 10.0
_ns_counter = itertools.count()


def tbf_parameters(rate_bits_per_s: float) -> tuple[int, int]:
    """``(burst_bytes, limit_bytes)`` for a tbf qdisc at this rate (see the constants above)."""
    bytes_per_s = rate_bits_per_s / 8
    burst = max(_MIN_BURST_BYTES, math.ceil(bytes_per_s * _BURST_SECONDS))
    limit = min(_MAX_LIMIT_BYTES, max(_MIN_LIMIT_BYTES, math.ceil(bytes_per_s * _LIMIT_SECONDS)))
    return burst, limit


@dataclass(frozen=True)
class WorldNetwork:
    """Where a world's ranks run: a command prefix and the environment they need."""

    namespace: str | None
    env: dict[str, str]
    master_addr: str = LOOPBACK_ADDR

    def wrap(self, argv: list[str]) -> list[str]:
        """The command line that runs ``argv`` as a rank process on this network."""
        if self.namespace is None:
            return list(argv)
        return ["ip", "netns", "exec", self.namespace, *argv]


def _missing_requirements() -> list[str]:
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network namespaces and qdiscs need CAP_SYS_ADMIN and CAP_NET_ADMIN)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            missing.append(f"the `{tool}` command (install iproute2)")
    return missing


def _require_emulation_tools(ic: Interconnect) -> None:
    missing = _missing_requirements()
    if missing:
        raise InterconnectUnavailable(f"interconnect {ic.name!r} emulates a link and needs: {'; '.join(missing)}")


def _run(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise InterconnectUnavailable(f"{what} failed: `{' '.join(argv)}`: {proc.stderr.strip() or proc.returncode}")


def check_available(ic: Interconnect) -> None:
    """Raise ``InterconnectUnavailable`` naming what is missing for ``ic`` on this machine.

    For an emulated link this really builds and removes a namespace with a tbf qdisc: only
    trying tells whether the kernel has tbf and the container lets us create namespaces.
    Profiles that need nothing from the machine (loopback, NCCL environments) always pass;
    whether NCCL honoured its environment is observed during the run, not guessed here.
    """
    if not ic.shaped:
        return
    with world_network(ic):
        pass


@contextmanager
def world_network(ic: Interconnect) -> Iterator[WorldNetwork]:
    """The network a world of ranks on ``ic`` runs in, for the duration of the block.

    Unshaped profiles need nothing: ranks run as they are, with the profile's environment.
    Emulated links get a fresh namespace ``tpbench-<pid>-<n>`` whose ``lo`` is up and shaped by
    tbf. On exit, processes still inside are killed (the namespace — and its qdisc — lives as
    long as any process in it) and the namespace is deleted, whatever ended the block.
    """
    env = dict(ic.env)
    if ic.backend == "gloo":
        env = {"GLOO_SOCKET_IFNAME": "lo", **env}
    if not ic.shaped:
        master_addr = env.setdefault("MASTER_ADDR", LOOPBACK_ADDR)
        yield WorldNetwork(namespace=None, env=env, master_addr=master_addr)
        return
    _require_emulation_tools(ic)
    name = f"{NETNS_PREFIX}{os.getpid()}-{next(_ns_counter)}"
    burst, limit = tbf_parameters(ic.rate_bits_per_s)
    with _sigterm_as_exit():
        try:
            if (_NETNS_DIR / name).exists():
                # Our pid, a counter value we never handed out: left by a dead process that had our pid.
                _delete_namespace(name)
            _run(["ip", "netns", "add", name], "creating a network namespace")
            _run(["ip", "-n", name, "link", "set", "lo", "up"], "bringing up lo in the namespace")
            _run(
                [
                    "tc",
                    "-n",
                    name,
                    "qdisc",
                    "add",
                    "dev",
                    "lo",
                    "root",
                    "tbf",
                    "rate",
                    f"{round(ic.rate_bits_per_s)}bit",
                    "burst",
                    str(burst),
                    "limit",
                    str(limit),
                ],
                "adding a tbf qdisc (is the kernel's sch_tbf available?)",
            )
            yield WorldNetwork(namespace=name, env={**env, **_NAMESPACE_OWNED_ENV})
        finally:
            _delete_namespace(name)


def _delete_namespace(name: str) -> None:
    """Delete ``name`` and kill every process in it or about to enter it; gone already is fine.

    The name is removed first, so no new ``ip netns exec`` can open it. A process that opened it
    just before (a rank spawned a moment before a SIGTERM) holds the namespace as a file
    descriptor and enters it a moment later, so the kill looks for processes whose network
    namespace *or* any open descriptor is this namespace, until none is left.
    """
    try:
        st = (_NETNS_DIR / name).stat()
    except OSError:
        return
    held = (st.st_dev, st.st_ino)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    deadline = time.monotonic() + _KILL_WAIT_S
    while (pids := _processes_holding(held)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)


def _processes_holding(namespace: tuple[int, int]) -> list[int]:
    """Pids whose network namespace, or an open file descriptor, is ``namespace`` (device, inode)."""

    def _is_it(path: Path) -> bool:
        try:
            st = path.stat()
        except OSError:  # a descriptor closed meanwhile
            return False
        return (st.st_dev, st.st_ino) == namespace

    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if _is_it(proc / "ns" / "net") or any(_is_it(fd) for fd in (proc / "fd").iterdir()):
                found.append(int(proc.name))
        except OSError:  # ended meanwhile, a zombie, or not ours to look at
            continue
    return found


@contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """While active, SIGTERM raises ``SystemExit`` so ``finally`` blocks (our clean-up) run.

    Only when SIGTERM still has its default action (which would end the process without any
    clean-up) and we are on the main thread (the only one that may set handlers); a handler
    installed by the application is left alone, it has its own plan.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def _raise(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


_STALE_RE = re.compile(re.escape(NETNS_PREFIX) + r"(?P<pid>\d+)-\d+")


def reap_stale_namespaces() -> list[str]:
    """Delete ``tpbench-<pid>-<n>`` namespaces whose creator is gone; return their names.

    This is the guarantee against SIGKILL, which no handler sees: the next sweep removes the
    leftovers (and kills ranks still running inside them). A creator counts as gone when its
    pid is dead or a zombie, or when that pid now belongs to a process started after the
    namespace was made (pid reuse). Without root or ``ip`` there is nothing we could have made.
    """
    if _missing_requirements():
        return []
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    reaped = []
    for line in listing.splitlines():
        name = line.split(" ", 1)[0]
        m = _STALE_RE.fullmatch(name)
        if m and not _creator_alive(int(m["pid"]), name):
            _delete_namespace(name)
            reaped.append(name)
    return reaped


def _creator_alive(pid: int, namespace: str) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # Fields after the parenthesised command name: state is the first, starttime the 20th.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return False
    try:
        created = os.stat(_NETNS_DIR / namespace).st_mtime
    except OSError:
        return True
    started = _boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return started <= created + 1.0  # btime has whole-second resolution


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise RuntimeError("/proc/stat has no btime line")
