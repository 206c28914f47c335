"""The same-job gate (``tpbench gate``): baseline and candidate measured side by side in this job.

Each side runs through its own ``tpbench`` command in a subprocess (a Python environment, a source
tree, or any command prefix): that is how two versions of the code under test are measured side
by side, and why this module never imports the worker or the launcher.

``run_lockstep`` (the default) starts each side's sweep once and paces their worlds item by item
over ``tpbench.lockstep``: per round one (case, repeat) item of each side, in a seeded random
order, never both at once, until the plans end, every case's interval is as narrow as asked, or
the time budget is spent. ``run_gate`` (``--mode rounds``) sweeps whole suites alternately, for a
side whose tpbench predates lockstep. The runs either leaves are judged by ``tpbench.compare``
(paired by repeats or by rounds) and written by ``tpbench.render``. ``run`` is ``tpbench gate``:
the sides resolved, the gate of either mode, its judgement.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import random
import selectors
import shlex
import shutil
import signal
import site
import socket
import struct
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from tpbench import compare, explain, gate_record, lockstep, store, user_code
from tpbench.analysis.stats import sequential_ratio
from tpbench.compare import GateError
from tpbench.gate_record import GATE_FILE, GateItem, GateRecord, GateRound, GateSide
from tpbench.pace import PlainPace


class SideError(RuntimeError):
    """A side's sweep failed or left no run behind, so there is nothing to compare: exit 3; exit 2
    (``usage``) where a side's sweep itself exited 2, its input bad (a suite key, an option)."""

    def __init__(self, message: str, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


# What a side's ``tpbench sweep`` exits with on bad input (``tpbench.cli.common.EXIT_USAGE``).
SIDE_USAGE = 2
# What ``--baseline``/``--candidate`` may be, as an error names them.
SIDE_FORMS = (
    "a python executable, a venv, a tpbench source tree with pyproject.toml, a folder of your own code, or a command"
)


@dataclass(frozen=True)
class Side:
    """How to run one side's ``tpbench``: a command prefix, extra environment, a working directory.
    ``env`` names where the suite's own code is imported from (``user_code.USER_PATH_ENV``): every
    sweep of the side (lockstep, ``--mode rounds``, ``--explain``) runs with it."""

    name: str
    spec: str
    kind: str  # "python", "venv", "source", "project" or "command"
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None


def resolve_side(name: str, spec: str, work_dir: Path) -> Side:
    """Interpret ``--baseline``/``--candidate``.

    A python executable or a venv directory runs ``python -m tpbench`` of that environment (no
    PYTHONPATH entry that holds a tpbench package comes before it: ``own_pythonpath``); a source
    tree (a directory with pyproject.toml and a tpbench package) runs this interpreter with the
    tree first on PYTHONPATH. Both run in ``work_dir``, never in the caller's directory: ``python
    -m`` puts the working directory first on sys.path, and a checkout there would shadow the side's
    own code (a source tree runs in its own root for the same reason). Any other directory is a
    folder of the user's own code (``project_side``). Anything else is a command prefix such as
    ``"uv run tpbench"``. An empty spec is refused: ``Path("")`` is the current directory, which,
    in a checkout, read as that source tree, and the gate measured it without a word.
    """
    if not spec:
        raise GateError(f"--{name} '': empty; expected {SIDE_FORMS}")
    path = Path(spec).expanduser()
    kept = own_pythonpath()
    # The sides run elsewhere; the suite's own code (a workload or hook named MODULE:NAME) is
    # imported from the caller's folder, as validation here found it.
    user = {user_code.USER_PATH_ENV: os.getcwd()}
    env = {"PYTHONPATH": kept, **user}
    if path.is_file() and os.access(path, os.X_OK):
        return Side(name, spec, "python", (str(path.absolute()), "-m", "tpbench"), env, work_dir)
    if path.is_dir() and (path / "pyvenv.cfg").exists():
        python = path / "bin" / "python"
        if not python.exists():
            raise GateError(f"--{name} {spec}: a virtual environment without bin/python")
        return Side(name, spec, "venv", (str(python.absolute()), "-m", "tpbench"), env, work_dir)
    if path.is_dir() and (path / "pyproject.toml").exists() and (path / "tpbench" / "__init__.py").exists():
        tree = str(path.resolve())
        env = {"PYTHONPATH": os.pathsep.join(p for p in (tree, kept) if p), **user}
        return Side(name, spec, "source", (sys.executable, "-m", "tpbench"), env, cwd=Path(tree))
    if path.is_dir() and (path / "bin" / "python").exists():
        # A conda environment, say: read as a folder of code, it would run under this interpreter.
        raise GateError(f"--{name} {spec}: a Python environment without pyvenv.cfg; give its bin/python")
    if path.is_dir() and not (path / "tpbench" / "__init__.py").exists():
        return project_side(name, spec, path, kept)
    if path.exists():
        raise GateError(f"--{name} {spec}: expected {SIDE_FORMS}")
    try:
        argv = tuple(shlex.split(spec))
    except ValueError as e:  # an unclosed quote: shlex's own words, not a traceback
        raise GateError(f"--{name} {spec}: expected a file, a directory or a command line ({e})") from None
    if not argv or shutil.which(argv[0]) is None:
        raise GateError(f"--{name} {spec}: no such file, directory or command")
    return Side(name, spec, "command", argv, user)


def project_side(name: str, spec: str, path: Path, kept: str) -> Side:
    """A folder of the user's own code (a workload or hook the suite names ``MODULE:NAME``), run by
    this tpbench: its modules come from that folder, so two checkouts of one project are gated
    against each other, each side measuring its own copy.

    The folder (and its ``src/``, for a src layout) comes first on PYTHONPATH and is the side's
    working directory and its only ``TPBENCH_USER_PATH``: the caller's folder, which is the
    candidate's checkout when the gate runs there, must not supply the baseline's modules. This
    tpbench's own root follows where the interpreter would not find it alone (a checkout run with
    ``PYTHONPATH``, or from its root), then the caller's other PYTHONPATH entries."""
    folder = path.resolve()
    src = folder / "src"
    paths = [str(folder), *([str(src)] if src.is_dir() else []), *this_tpbench_root(), kept]
    env = {"PYTHONPATH": os.pathsep.join(p for p in paths if p), user_code.USER_PATH_ENV: str(folder)}
    return Side(name, spec, "project", (sys.executable, "-m", "tpbench"), env, cwd=folder)


# The suite keys that name the user's code by import path (MODULE:NAME).
_CODE_KEYS = ("workload", "comm_hook", "comm_hook_state")


def suite_file(suite: str | Path) -> Path:
    """The suite file's absolute path (the sides' sweeps run in other folders); ``GateError``, naming
    the path as typed, as ``tpbench sweep`` does, when it is not a file."""
    if not Path(suite).is_file():
        raise GateError(f"{suite}: no such suite file")
    return Path(suite).absolute()


def _refuse_a_project_without_code(side: Side, suite: str | Path, overrides: Sequence[str]) -> None:
    """``GateError`` for a folder of one's own code (``project_side``) given with a suite that names
    none of it (no ``workload``, ``comm_hook`` or ``comm_hook_state`` ``MODULE:NAME`` in its tables
    or the ``--set`` values): both sides would run this tpbench on the same built-in code, and a
    mistyped or wrong folder (``--baseline results``) gated the code against itself without a word.
    Read from the file's text as written: the suite is validated where each side imports its code."""
    try:
        data = tomllib.loads(Path(suite).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return  # the sides' own sweeps refuse it, naming what is wrong
    assigned = (o.partition("=") for o in overrides)  # a value without "=" is the sides' to refuse
    values: list[Any] = [value for key, _, value in assigned if key.strip() in _CODE_KEYS]
    for table in (data.get("defaults"), data.get("sweep")):
        if isinstance(table, dict):
            values += [v for k in _CODE_KEYS for v in _as_list(table.get(k))]
    workloads = data.get("workloads")
    if isinstance(workloads, dict):
        values += list(workloads)
    if not any(isinstance(v, str) and ":" in v for v in values):
        raise GateError(
            f"--{side.name} {side.spec}: a folder of your own code, but {suite} names none (no workload, comm_hook "
            "or comm_hook_state MODULE:NAME): both sides would run this tpbench alike; expected "
            f"{SIDE_FORMS.replace(', a folder of your own code', '')} for a side of tpbench itself"
        )


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def this_tpbench_root() -> list[str]:
    """The folder this tpbench package is imported from, unless it is one of this interpreter's
    site-packages, which a project side finds by itself: a site-packages folder put first on
    PYTHONPATH would come before the standard library."""
    root = Path(__file__).resolve().parent.parent
    site_dirs = {Path(d).resolve() for d in [*site.getsitepackages(), site.getusersitepackages()]}
    return [] if root in site_dirs else [str(root)]


def own_pythonpath() -> str:
    """The caller's PYTHONPATH less the entries that hold a tpbench package.

    Such an entry comes before a side's own site-packages: with ``PYTHONPATH=checkout`` set (as one
    runs tpbench from a clone), a venv or python side would import the checkout's tpbench, not its
    own, and the gate would measure one version of the code against itself without a word. The other
    entries (a workload's own module, say) stay."""
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    return os.pathsep.join(p for p in entries if p and not (Path(p) / "tpbench" / "__init__.py").exists())


@dataclass(frozen=True)
class GateRun:
    """The run directories a gate produced, per side, in round order."""

    out: Path
    baseline: list[Path]
    candidate: list[Path]


def sweep_command(side: Side, suite: Path, out: Path, overrides: Sequence[str], filters: Sequence[str]) -> list[str]:
    return [
        *side.argv,
        "sweep",
        str(suite),
        "--no-report",
        "--out",
        str(out),
        *(a for o in overrides for a in ("--set", o)),
        *(a for f in filters for a in ("--filter", f)),
    ]


def run_gate(
    suite: str | Path,
    baseline: Side,
    candidate: Side,
    out: Path,
    *,
    rounds: int = 3,
    overrides: Sequence[str] = (),
    filters: Sequence[str] = (),
    candidate_overrides: Sequence[str] = (),
    announce: Callable[[str], None] = lambda line: None,
    metric: str = "step_ms",
) -> GateRun:
    """Sweep the suite with both sides in this job, alternating, ``rounds`` times each.

    The order alternates between rounds (AB BA AB …): machine drift that is linear in time then
    falls on both sides equally instead of always on the one that goes second. Each sweep's
    output goes to stderr so that stdout stays clean for the table. ``candidate_overrides`` are
    ``--set`` values for the candidate only (e.g. ``slowdown_pct=10`` to check the gate itself).
    ``announce`` is given a line before each sweep (the CLI writes it to stderr). The first run is
    checked for ``metric`` (``compare.RunData.of``) before the others are swept.
    """
    if rounds < 1:
        raise GateError(f"--rounds {rounds}: expected at least 1")
    suite = suite_file(suite)
    out = Path(out).absolute()
    store.check_writable(out, "gate's --out folder")  # as the lockstep gate says it (``_claim``)
    runs: dict[str, list[Path]] = {"baseline": [], "candidate": []}
    for r in range(rounds):
        for side in (baseline, candidate) if r % 2 == 0 else (candidate, baseline):
            root = out / side.name / f"round{r + 1:02d}"
            root.mkdir(parents=True, exist_ok=True)
            extra = list(candidate_overrides) if side is candidate else []
            cmd = sweep_command(side, suite, root, [*overrides, *extra], filters)
            announce(f"tpbench gate: round {r + 1}/{rounds}, {side.name}: {shlex.join(cmd)}")
            proc = subprocess.run(
                cmd, env=os.environ | side.env, cwd=side.cwd, stdout=sys.stderr.fileno(), stdin=subprocess.DEVNULL
            )
            found = list(store.iter_runs(root))
            # Exit 1 means some case failed: the run still exists and the comparison reports the case.
            if proc.returncode not in (0, 1) or len(found) != 1:
                raise SideError(
                    f"{side.name} ({side.spec}), round {r + 1}: `{shlex.join(cmd)}` exited with {proc.returncode}"
                    f" and left {len(found)} run(s) in {root}; its output is above",
                    usage=proc.returncode == SIDE_USAGE,
                )
            if not any(runs.values()):
                compare.RunData.of(found[0], metric)  # GateError, naming what the run has
            runs[side.name].append(found[0])
    return GateRun(out, runs["baseline"], runs["candidate"])


# ---------------------------------------------------------------- lockstep


# How long the gate waits without a word from a side (a message, a world connecting, its sweep
# exiting) before it gives up on the gate: longer than a world's start-up limit (180 s) plus a repeat.
STALL_S = 600.0
# The fewest pairs per case before --target-ci may stop the gate.
MIN_PAIRS = 10
# The most repeats per case a --target-ci gate plans: the target or the budget ends it first.
ADAPTIVE_REPEATS = 500
# The most repeats a gate accepts (--repeats): each is planned up front, and no budget runs past it.
MAX_REPEATS = 10_000
# Traced steps per case of each side for ``gate --explain``, after the verdict.
EXPLAIN_STEPS = 5


@dataclass(frozen=True)
class Lockstep:
    """How a lockstep gate runs: overrides for both sides, and when to stop."""

    repeats: int = 30
    target_ci: float | None = None  # stop once every case's half-width is at most this (a fraction)
    budget_s: float = 480.0
    min_pairs: int = MIN_PAIRS
    metric: str = "step_ms"
    seed: int = 0
    stall_s: float = STALL_S
    finish_grace_s: float = 60.0  # once the budget is spent, how long a side may take to end its world

    def overrides(self) -> list[str]:
        """``--set`` values for both sides (before the user's own): the planned repeats, and no
        profiling, which a gate never reads. Both are budget keys: cases keep their identity. Their
        keys are ``GATE_KEYS``'."""
        return [f"repeats={self.repeats}", "capture.profiler_steps=0"]


# The keys ``Lockstep.overrides`` sets for both sides, and what to give instead: a user's --set of one
# would come after the gate's and win, unseen by the gate (``tpbench gate`` refuses it).
GATE_KEYS = {
    "repeats": "the gate sets repeats; use --repeats",
    "capture.profiler_steps": "a gate never traces while it measures; use --explain",
}


@dataclass
class _Side:
    """One side's sweep process as the gate follows it."""

    side: Side
    proc: subprocess.Popen
    log: Path
    root: Path  # where its sweep writes its run
    server: socket.socket
    conn: socket.socket | None = None
    buffer: bytes = b""
    parked: tuple[str, int] | None = None  # the item its world asked to run, waiting for an answer
    inflight: tuple[str, int] | None = None  # the item its world runs now
    values: dict[str, dict[int, float]] = field(default_factory=dict)
    items: int = 0
    last_done: dict[str, Any] = field(default_factory=dict)  # the last ``done`` message

    @property
    def exited(self) -> bool:
        return self.proc.poll() is not None and self.conn is None

    @property
    def idle(self) -> bool:
        """Doing nothing that could disturb the other side: waiting for an answer, or gone."""
        return self.parked is not None or self.exited


class _Conductor:
    """The gate's end of the lockstep protocol: one listening socket per side, the sides' worlds
    connecting (again, after a failed world) and asking before each item."""

    def __init__(self, sides: list[_Side], stall_s: float, deadline: float = math.inf, grace_s: float = 60.0) -> None:
        self.sides = sides
        self.stall_s = stall_s
        self.deadline = deadline  # time.monotonic() when the budget is spent: no wait outlasts it
        self.grace_s = grace_s  # past it, how long an item in flight may take to end (``Lockstep.finish_grace_s``)
        self.sel = selectors.DefaultSelector()
        for s in sides:
            self.sel.register(s.server, selectors.EVENT_READ, (s, "server"))
        self.last = time.monotonic()

    def pump(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            side, what = key.data
            self.last = time.monotonic()
            if what == "server":
                conn, _ = side.server.accept()
                if not _descends_from(_peer_pid(conn), side.proc.pid):
                    # Only the side's own worlds may take its turns: another sweep given this
                    # socket would displace the real one.
                    conn.close()
                    continue
                self._drop(side)  # a new world: the previous one is over
                side.conn = conn
                self.sel.register(conn, selectors.EVENT_READ, (side, "conn"))
                continue
            try:
                chunk = side.conn.recv(65536)
            except ConnectionError:
                chunk = b""
            if not chunk:
                self._drop(side)
                continue
            messages, side.buffer = lockstep.split_lines(side.buffer + chunk)
            for m in messages:
                self._handle(side, m)
        for s in self.sides:
            code = s.proc.poll()
            if code is None or s.conn is not None:
                continue
            # Exit 1 means some case failed: the run still exists and the comparison reports the case.
            if code not in (0, 1):
                raise SideError(_failed(s, f"exited with {code}"), usage=code == SIDE_USAGE)
            if not any(store.iter_runs(s.root)):
                raise SideError(_failed(s, f"exited with {code} and left no run in {s.root}"))

    def _drop(self, side: _Side) -> None:
        """The side's world closed its connection: it ended, or died (its item in flight is over)."""
        if side.conn is not None:
            self.sel.unregister(side.conn)
            side.conn.close()
        side.conn, side.buffer, side.parked, side.inflight = None, b"", None, None

    def _handle(self, side: _Side, m: dict[str, Any]) -> None:
        if m["msg"] == lockstep.READY:
            side.parked = (m["case"], int(m["repeat"]))
        elif m["msg"] == lockstep.DONE:
            side.inflight = None
            side.items += 1
            side.last_done = m
            if m.get("value") is not None:
                side.values.setdefault(m["case"], {})[int(m["repeat"])] = float(m["value"])

    def answer(self, side: _Side, msg: str, **data: Any) -> None:
        """Answer the side's waiting world; a world that died meanwhile is simply over."""
        try:
            lockstep.send(side.conn, msg, **data)
        except OSError:
            self._drop(side)
            return
        if msg == lockstep.GO:
            side.inflight = side.parked
        side.parked = None

    def wait_until(self, ready: Callable[[], bool], what: str, deadline: float | None = None) -> None:
        """Pump until ``ready()``; a SideError naming the sides that went silent after ``stall_s``,
        ``BudgetSpent`` once ``deadline`` (default: the budget's) passes."""
        self.last = time.monotonic()
        while not ready():
            self.pump(0.2)
            if time.monotonic() >= (self.deadline if deadline is None else deadline):
                raise BudgetSpent(what)
            self._check_stall(what)

    def _check_stall(self, what: str) -> None:
        if time.monotonic() - self.last > self.stall_s:
            silent = [s for s in self.sides if not s.idle] or self.sides
            raise SideError(
                "; ".join(
                    _failed(s, f"said nothing for {self.stall_s:.0f} s while the gate waited for {what}")
                    for s in silent
                )
            )

    def run_item(self, side: _Side, metric: str) -> GateItem | None:
        """Let ``side`` run the item it asked for once every side is idle; None if it has exited.
        Returns the item as gate.json records it."""
        self.wait_until(lambda: all(o.idle for o in self.sides), "both sides to be ready")
        if side.exited:
            return None
        (case, repeat), start, before = side.parked, time.time(), side.items
        self.answer(side, lockstep.GO, metric=metric)
        what = f"{item_words(side.side.name, case, repeat)} to end"
        try:
            self.wait_until(lambda: side.inflight is None, what)
        except BudgetSpent as spent:
            # The item runs on: the gate waits for its world to end anyway (``finish``), and an item
            # that ends is on its side's disk and among the pairs judged. Seen to its end (within the
            # grace), it is kept in gate.json's round too, which the stop line counts.
            with contextlib.suppress(BudgetSpent):  # outlasted the grace: ``finish`` stops its world
                self.wait_until(lambda: side.inflight is None, what, self.deadline + self.grace_s)
            spent.item = self._item(side, case, repeat, start, before, metric)
            raise
        return self._item(side, case, repeat, start, before, metric)

    def _item(self, side: _Side, case: str, repeat: int, start: float, before: int, metric: str) -> GateItem:
        """The item ``side`` was told to run at ``start`` (its items then ``before``), as gate.json records it."""
        done = side.items > before  # False: its world died in it (or, past the budget, outlasted the grace)
        if done and "recorded" in side.last_done:  # minutes before the comparison would say so
            raise GateError(
                f"--metric {metric}: not recorded by the {item_words(side.side.name, case, repeat)}; "
                f"expected one of {', '.join(side.last_done['recorded'])}"
            )
        # When the item ran by the world's own clock (rank 0's).
        ran = {k: side.last_done[k] for k in ("began", "ended")} if done else {}
        return GateItem(side.side.name, case, repeat, start, time.time(), done, **ran)

    def finish(self, grace_s: float | None = None) -> None:
        """Answer stop to whatever asks from now on, until every side's sweep has exited. With
        ``grace_s`` (the budget is spent), a side still running that long after the budget's deadline is
        stopped: one grace in all, an item in flight at the deadline having been waited for within it."""
        self.last = started = time.monotonic()
        while not all(s.exited for s in self.sides):
            for s in self.sides:
                if s.parked is not None:
                    self.answer(s, lockstep.STOP)
            self.pump(0.2)
            if grace_s is not None and time.monotonic() > min(started, self.deadline) + grace_s:
                for s in self.sides:
                    if not s.exited:
                        _kill(s.proc)
                        self._drop(s)
                return
            self._check_stall("the sweeps to finish")


def item_words(side: str, case: str, repeat: int) -> str:
    """One side's item as the gate's lines name it: "baseline's item (case 40ff2cc6b19e, repeat 45)".
    Bare, "item 40ff2cc6b19e 45" read as two ids, or an id and a count."""
    return f"{side}'s item (case {case}, repeat {repeat})"


class BudgetSpent(Exception):
    """The gate's budget ran out while it waited (``what``): it stops, whatever is left. ``item``: the
    item it was waiting for to end, seen to its end or to the grace (``_Conductor.run_item``), or None."""

    item: GateItem | None = None


def _peer_pid(conn: socket.socket) -> int | None:
    """The pid of the process at the other end of a Unix socket (SO_PEERCRED; None elsewhere)."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None
    return struct.unpack("3i", creds)[0]


def _descends_from(pid: int | None, ancestor: int) -> bool:
    """Whether ``pid`` is ``ancestor`` or one of its descendants, by /proc's parent links; True
    where that cannot be told (no peer credentials, no /proc), as before the check existed."""
    if pid is None or not Path("/proc/self/stat").exists():
        return True
    for _ in range(64):
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # "pid (comm) state ppid ...": the ppid
    return False


def _failed(s: _Side, what: str) -> str:
    """What went wrong with a side, with the end of its log (and the way out for an old tpbench)."""
    text = s.log.read_text(errors="replace") if s.log.exists() else ""
    tail = "\n".join(text.strip().splitlines()[-15:])
    hint = ""
    if "--lockstep" in text and "unrecognized arguments" in text:
        hint = "; its tpbench predates lockstep gates: run the gate with --mode rounds"
    return f"{s.side.name} ({s.side.spec}): its sweep {what}{hint}; log: {s.log}\n{tail}"


@dataclass(frozen=True)
class LockstepRun:
    """What a lockstep gate left: one run per side, and gate.json (the rounds, their order, why it stopped)."""

    out: Path
    baseline: Path
    candidate: Path
    record: GateRecord


# What a gate with --target-ci answers, as Chromium's Pinpoint does: the sides differ, they are the
# same to within the target, or the budget ran out first.
SAME, DIFFERENT, UNKNOWN = "same", "different", "unknown"


def answers(sides: list[_Side], cfg: Lockstep) -> dict[str, str]:
    """Per case, what its pairs say so far at the confidence a rule that peeks after every round
    needs (``stats.sequential_ratio``: looks = the rounds from ``min_pairs`` to ``repeats``,
    comparisons = the cases): DIFFERENT when the interval excludes 1, SAME when it lies within
    ±``target_ci`` (and so holds 1), else UNKNOWN (also before ``min_pairs`` pairs)."""
    base, cand = sides
    cases = sorted(set(base.values) | set(cand.values))
    looks = max(1, cfg.repeats - cfg.min_pairs + 1)
    out = {}
    for cid in cases:
        b, c = base.values.get(cid, {}), cand.values.get(cid, {})
        if len(b.keys() & c.keys()) < cfg.min_pairs:
            out[cid] = UNKNOWN
            continue
        r = sequential_ratio(b, c, looks=looks, comparisons=len(cases))
        target = cfg.target_ci or 0.0
        out[cid] = DIFFERENT if r.lo > 1 or r.hi < 1 else SAME if r.half_width <= target else UNKNOWN
    return out


def answer_of(per_case: dict[str, str]) -> str:
    """The gate's one answer: different if any case differs, same if every case is the same, else unknown."""
    if any(a == DIFFERENT for a in per_case.values()):
        return DIFFERENT
    return SAME if per_case and all(a == SAME for a in per_case.values()) else UNKNOWN


def _stop_reason(sides: list[_Side], cfg: Lockstep, started: float) -> str | None:
    """Why the gate should stop now (budget spent; with --target-ci, every case decided: the same
    or different by ``answers``), or None."""
    if time.monotonic() - started >= cfg.budget_s:
        return f"budget of {cfg.budget_s:g} s spent"
    if cfg.target_ci is None:
        return None
    per_case = answers(sides, cfg)
    if per_case and UNKNOWN not in per_case.values():
        return "every case decided"  # the answer, the rule and the target: the "Gate answer" line says them
    return None


def run_lockstep(
    suite: str | Path,
    baseline: Side,
    candidate: Side,
    out: Path,
    cfg: Lockstep = Lockstep(),
    *,
    overrides: Sequence[str] = (),
    filters: Sequence[str] = (),
    candidate_overrides: Sequence[str] = (),
    announce: Callable[[str], None] = lambda line: None,
) -> LockstepRun:
    """Start both sides' sweeps once and pace them item by item (module docstring).

    Each round gives one item to each side in an order drawn from ``cfg.seed``; an item starts
    only while the other side's world is parked, waiting for its own answer (or gone), so no
    start-up, analysis or measurement of one side overlaps the other's measured item. Both sides
    sweep the same suite with the same filters, so item i of one is item i of the other. Sweep
    output goes to ``out/<side>.log``; gate.json in ``out`` records every item's side, case,
    repeat, start and end, the rounds' orders and why the gate stopped.
    """
    if not 1 <= cfg.repeats <= MAX_REPEATS or not 0 < cfg.budget_s < math.inf:
        raise GateError(
            f"--repeats {cfg.repeats}, --budget-s {cfg.budget_s:g}: expected 1 to {MAX_REPEATS} repeats and a "
            "finite budget > 0"
        )
    suite = suite_file(suite)
    out = Path(out).absolute()
    lock, sockets = _claim(out, baseline, candidate)
    sides: list[_Side] = []
    rounds: list[GateRound] = []
    started = time.monotonic()
    try:
        for side in (baseline, candidate):
            sides.append(_start(side, suite, out, sockets, cfg, overrides, filters, candidate_overrides, announce))
        conductor = _Conductor(sides, cfg.stall_s, started + cfg.budget_s, cfg.finish_grace_s)
        stopped = _pace(conductor, sides, cfg, started, rounds, announce)
        if stopped:
            announce(f"tpbench gate: stopping after {_rounds_run(rounds)}: {stopped}")
        conductor.finish(cfg.finish_grace_s if stopped and stopped.startswith("budget") else None)
    except BaseException:
        for s in sides:
            _kill(s.proc)
        raise
    finally:
        for s in sides:
            s.server.close()
        shutil.rmtree(sockets, ignore_errors=True)
        lock.release()
    per_case = answers(sides, cfg) if cfg.target_ci is not None else None
    runs = _side_runs(sides, out, stopped)
    record = GateRecord(
        seed=cfg.seed,
        metric=cfg.metric,
        repeats=cfg.repeats,
        target_ci=cfg.target_ci,
        budget_s=cfg.budget_s,
        stopped=stopped or "the plans ended",
        answer=answer_of(per_case) if per_case is not None else None,
        answers=per_case,
        wall_s=time.monotonic() - started,
        sides={
            s.side.name: GateSide(s.side.spec, s.side.kind, str(r), str(s.log), s.proc.returncode)
            for s, r in zip(sides, runs)
        },
        rounds=rounds,
    )
    gate_record.write(out, record)
    return LockstepRun(out, runs[0], runs[1], record)


def _rounds_run(rounds: list[GateRound]) -> str:
    """The rounds run, as the stop line says them: "3 rounds", or "3 rounds and 1 item of round 4"
    when the budget ended a round after one side's item."""
    whole = [r for r in rounds if not r.partial]
    said = f"{len(whole)} round{'' if len(whole) == 1 else 's'}"
    if len(whole) < len(rounds):
        n = len(rounds[-1].items)
        said += f" and {n} item{'' if n == 1 else 's'} of round {len(rounds)}"
    return said


def _pace(
    conductor: _Conductor,
    sides: list[_Side],
    cfg: Lockstep,
    started: float,
    rounds: list[GateRound],
    announce: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
) -> str | None:
    """Round after round, one item of each side in an order drawn from ``cfg.seed``, each round
    appended to ``rounds``, until the plans end (None) or the gate should stop (why). The rounds run
    are said when ``PlainPace`` has one due (``clock`` its clock, ``started`` by it), the work being
    the rounds the sides' runs plan (``_planned_rounds``, once the first round has run): a line every
    10 rounds made a 500-repeat ``--target-ci`` gate's log dozens of lines. The warning is said at once."""
    rng = random.Random(cfg.seed)
    pace = PlainPace(0, clock)
    misaligned = False
    stopped = None
    while stopped is None and not all(s.exited for s in sides):
        order = rng.sample(sides, len(sides))
        this = GateRound(len(rounds) + 1, [s.side.name for s in order])
        items = this.items
        try:
            for s in order:
                if (item := conductor.run_item(s, cfg.metric)) is not None:
                    items.append(item)
        except BudgetSpent as e:
            # An item the round had finished is on its side's disk: gate.json keeps it too, in a round
            # marked partial unless that item was its last, which the stop line counts.
            if e.item is not None:
                items.append(e.item)
            if items:
                rounds.append(replace(this, partial=len(items) < len(order)))
            return f"budget of {cfg.budget_s:g} s spent while waiting for {e}"
        if items:
            rounds.append(this)
            if len(rounds) == 1:
                pace.planned = _planned_rounds(sides)
            if not misaligned and len({(i.case, i.repeat) for i in items}) > 1:
                misaligned = True
                announce(
                    f"tpbench gate: warning: in round {len(rounds)} the sides ran different items "
                    "(their plans differ): pairs of repeats are no longer neighbours in time"
                )
                pace.said(len(rounds))
            if pace.due(len(rounds)):
                announce(f"tpbench gate: {len(rounds)} rounds, {clock() - started:.0f} s")
                pace.said(len(rounds))
        stopped = _stop_reason(sides, cfg, started)
    return stopped


def _planned_rounds(sides: list[_Side]) -> int:
    """The rounds the sides' plans hold, as their runs' run.json say (each case's repeats, summed;
    the larger side's), or 0 where neither side's run can be read by this tpbench (not written yet,
    or another version's record): the gate's rounds line is then paced by time alone."""
    planned = 0
    for s in sides:
        with contextlib.suppress(store.StoreError, OSError):
            for run in store.iter_runs(s.root):
                cases = store.read_record(run).cases.values()
                planned = max(planned, sum(c.case.repeats for c in cases))
    return planned


def _claim(out: Path, baseline: Side, candidate: Side) -> tuple[store.RunLock, Path]:
    """``out`` locked for this gate (a second gate into it is refused, naming this one) and
    checked free of an earlier gate's runs, and a folder for the sides' sockets. A file in the way, a
    virtual filesystem or a missing permission is said as a sweep's ``--out`` says it (``check_writable``):
    the OS says only "File exists"."""
    store.check_writable(out, "gate's --out folder")
    lock = store.RunLock(out)
    try:
        earlier = [out / s.name for s in (baseline, candidate) if (out / s.name).is_dir()]
        if (out / GATE_FILE).exists() or any(any(store.iter_runs(d)) for d in earlier):
            raise GateError(f"--out {out}: holds an earlier gate's runs; give a new folder")
        return lock, _socket_folder()
    except BaseException:
        lock.release()
        raise


def _side_runs(sides: list[_Side], out: Path, stopped: str | None) -> list[Path]:
    """Each side's one run; ``SideError`` (with the end of its log) for a side that left none or several."""
    runs, problems, usage = [], [], False
    for s in sides:
        found = list(store.iter_runs(out / s.side.name))
        if not found and not s.items:
            problems.append(_failed(s, f"ran no item before the gate stopped ({stopped or 'its sweep exited'})"))
        elif len(found) != 1:
            problems.append(_failed(s, f"exited with {s.proc.returncode} and left {len(found)} run(s)"))
            usage |= s.proc.returncode == SIDE_USAGE
        else:
            runs.append(found[0])
    if problems:
        raise SideError("\n".join(problems), usage=usage)
    return runs


# A Unix socket's path holds at most 107 bytes (sun_path, Linux).
_SUN_PATH_MAX = 107


def _socket_folder() -> Path:
    """A private folder for the sides' sockets: in TMPDIR, or in /tmp where TMPDIR's path is too
    long for a socket path; an error naming TMPDIR where neither will do."""
    for parent in (None, "/tmp"):
        folder = Path(tempfile.mkdtemp(prefix="tpbg-", dir=parent))
        if len(os.fsencode(folder / "c")) <= _SUN_PATH_MAX:
            return folder
        folder.rmdir()
    raise GateError(
        f"TMPDIR={tempfile.gettempdir()}: too long for a Unix socket path (at most {_SUN_PATH_MAX} bytes), "
        "and so is /tmp's; set TMPDIR to a shorter folder"
    )


def _start(
    side: Side,
    suite: Path,
    out: Path,
    sockets: Path,
    cfg: Lockstep,
    overrides: Sequence[str],
    filters: Sequence[str],
    candidate_overrides: Sequence[str],
    announce: Callable[[str], None],
) -> _Side:
    """Listen on the side's socket, then start its sweep (output to ``out/<side>.log``)."""
    path = sockets / side.name[0]
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)
    root = out / side.name
    root.mkdir(parents=True, exist_ok=True)
    extra = list(candidate_overrides) if side.name == "candidate" else []
    cmd = [*sweep_command(side, suite, root, [*cfg.overrides(), *overrides, *extra], filters), "--lockstep", str(path)]
    announce(f"tpbench gate: {side.name}: {shlex.join(cmd)}")
    log = out / f"{side.name}.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            cmd,
            env=os.environ | side.env,
            cwd=side.cwd,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_gate,
        )
    return _Side(side, proc, log, root, server)


def _die_with_gate() -> None:
    """In a side's sweep before exec: a stop signal if the gate dies, so the sweep ends its run cleanly."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _kill(proc: subprocess.Popen) -> None:
    """Stop a side's sweep: SIGTERM (it marks its run interrupted and ends its worlds), then SIGKILL."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# ---------------------------------------------------------------- the whole gate


@dataclass(frozen=True)
class Judged:
    """A gate run and judged: where its runs are, the comparison, and (lockstep) gate.json's record."""

    out: Path
    comparison: compare.Comparison
    record: GateRecord | None = None  # a lockstep gate's gate.json; None for --mode rounds


def _cannot_fail(mode: str, pairs: int, fail_on_inconclusive: bool) -> str | None:
    """A warning, once the sides resolve and before any sweep, for a gate of fewer pairs than a case
    is judged on (``compare.MIN_REPEATS``): every case ends "too few to judge", inconclusive, and the
    gate exits 0 whatever the candidate does, so a CI job set up with ``--repeats 2`` to be quick
    never goes red."""
    if pairs >= compare.MIN_REPEATS or fail_on_inconclusive:
        return None
    flag = "--rounds" if mode == "rounds" else "--repeats"
    return (
        f"tpbench gate: warning: {flag} {pairs}: a case is judged on at least {compare.MIN_REPEATS} pairs; with "
        f"{pairs} every case ends inconclusive and this gate cannot fail (--fail-on-inconclusive fails on that)"
    )


def run(
    suite: str | Path,
    baseline: str,
    candidate: str,
    out: Path,
    *,
    mode: str = "lockstep",
    rounds: int = 5,
    cfg: Lockstep = Lockstep(),
    overrides: Sequence[str] = (),
    filters: Sequence[str] = (),
    candidate_overrides: Sequence[str] = (),
    announce: Callable[[str], None] = lambda line: None,
    threshold: float = compare.THRESHOLD,
    fail_on_inconclusive: bool = False,
    ignore_env: Sequence[str] = (),
    explain_steps: int = 0,
) -> Judged:
    """``tpbench gate``: resolve the ``baseline`` and ``candidate`` specs (``resolve_side``), run
    them in ``mode`` (``run_lockstep`` with ``cfg``, or ``run_gate``'s ``rounds``) into ``out``, and
    judge the candidate's runs against the baseline's (``compare.compare_runs``, on ``cfg.metric``,
    paired by repeats or by rounds). ``explain_steps`` (``--explain``): once a regression is called,
    trace that many steps of each side (``trace_sides``) and name each regression's top contributor."""
    suite_file(suite)  # before either side is resolved and announced, as sweep refuses it first
    base = resolve_side("baseline", baseline, out / "baseline")
    cand = resolve_side("candidate", candidate, out / "candidate")
    for side in (base, cand):
        if side.kind == "project":
            _refuse_a_project_without_code(side, suite, [*overrides, *candidate_overrides])
            announce(
                f"tpbench gate: {side.name} {side.spec}: a folder of your own code, run by this tpbench "
                f"({Path(__file__).parent}); its modules are imported from {side.cwd}"
            )
    if warning := _cannot_fail(mode, rounds if mode == "rounds" else cfg.repeats, fail_on_inconclusive):
        announce(warning)
    sides = dict(overrides=overrides, filters=filters, candidate_overrides=candidate_overrides, announce=announce)
    record = None
    if mode == "rounds":
        done = run_gate(suite, base, cand, out, rounds=rounds, metric=cfg.metric, **sides)
        baseline_runs, candidate_runs, pairing, where = done.baseline, done.candidate, "rounds", done.out
    else:
        stepped = run_lockstep(suite, base, cand, out, cfg, **sides)
        baseline_runs, candidate_runs, pairing, where = [stepped.baseline], [stepped.candidate], "repeats", stepped.out
        record = stepped.record
    comparison = compare.compare_runs(
        baseline_runs,
        candidate_runs,
        metric=cfg.metric,
        threshold=threshold,
        pairing=pairing,
        fail_on_inconclusive=fail_on_inconclusive,
        ignore_env=ignore_env,
    )
    if record is not None and record.gate_answer is not None:
        comparison = replace(comparison, answer=record.gate_answer)
    if explain_steps and comparison.verdict == compare.REGRESSION:
        traced = trace_sides(suite, base, cand, out, explain_steps, **sides)
        comparison = explain.annotate(comparison, traced)
    return Judged(where, comparison, record)


def trace_sides(
    suite: str | Path,
    baseline: Side,
    candidate: Side,
    out: Path,
    steps: int,
    *,
    overrides: Sequence[str] = (),
    filters: Sequence[str] = (),
    candidate_overrides: Sequence[str] = (),
    announce: Callable[[str], None] = lambda line: None,
) -> tuple[Path, Path]:
    """``gate --explain``, after the verdict: sweep each side once more (one repeat per case) with
    ``steps`` traced steps, into ``out/<side>/explain``, and return the two runs. The gate's own
    measurement traced nothing (``Lockstep.overrides``), so tracing never touches what it judged."""
    runs = []
    for side in (baseline, candidate):
        root = Path(out).absolute() / side.name / "explain"
        root.mkdir(parents=True, exist_ok=True)
        extra = list(candidate_overrides) if side is candidate else []
        traced = ["repeats=1", f"capture.profiler_steps={steps}"]
        cmd = sweep_command(side, Path(suite).absolute(), root, [*overrides, *extra, *traced], filters)
        announce(f"tpbench gate --explain: tracing {side.name}: {shlex.join(cmd)}")
        proc = subprocess.run(
            cmd, env=os.environ | side.env, cwd=side.cwd, stdout=sys.stderr.fileno(), stdin=subprocess.DEVNULL
        )
        found = list(store.iter_runs(root))
        if proc.returncode not in (0, 1) or len(found) != 1:
            raise SideError(f"{side.name} ({side.spec}), --explain: `{shlex.join(cmd)}` exited with {proc.returncode}")
        runs.append(found[0])
    return runs[0], runs[1]
