"""The results store: the on-disk layout of a run, atomic writes, and loading back into DataFrames.

Layout (docs/architecture.md, "The record of a run")::

    results/<suite>/<run_id>/
      run.json                     suite text, cases, environment, per-case status
      cases/<case_id>/steps.parquet
      cases/<case_id>/parts/       one parquet per finished repeat, merged when the case ends
      cases/<case_id>/trace/rank<r>.json.gz
      summary.parquet
      logs/                        per-world, per-rank stdout/stderr

Every file is written to a temporary name in its own folder and renamed into place, so a reader
(or a resume after a crash) never sees half a file. Repeats are persisted as they finish because
repeats of different cases are interleaved: a world that dies in the last round must not take the
earlier rounds of every case with it.

Writes: ``run.json`` has a single writer, the sweeping process's ``Run``, the recorder: the sweep
and the launcher tell it what happened (a case started, finished, failed, was captured; a world
started) and it applies and saves each event; ``Run.case_done`` is the one place a case directory
is finished. Reads: ``load`` gives the one view every reader takes of a run (``Loaded``): its
typed record (``tpbench.record``), the case table with one label per case, steps and summary.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import functools
import json
import os
import secrets
import shlex
import shutil
import socket
import stat
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from tpbench import user_files
from tpbench.record import (  # the case states are the store's vocabulary too
    CAPTURED_KEYS,
    CASE_STATES,
    DONE,
    FAILED,
    INTERRUPTED,
    PENDING,
    RUNNING,
    SCHEMA_VERSION,
    RunRecord,
    migrate,
    version_problem,
)
from tpbench.tune_record import TuneRecord, TuneRecordError, finite_number

RUN_FILE = "run.json"
LOCK_FILE = ".lock"
# run.json holds every case's parameters: 10 000 cases (the most a sweep has) take a few MiB.
MAX_RUN_JSON_BYTES = 256 << 20
# Space held back while a run is swept, given up when the disk fills so that run.json can still
# say how the sweep ended (an atomic write needs room for a second copy): at least 256 KiB, and
# four run.jsons' worth.
RESERVE_FILE = ".reserve"
RESERVE_MIN_BYTES = 256 * 1024
SUMMARY_FILE = "summary.parquet"
STEPS_FILE = "steps.parquet"

# Summary.parquet's key-value metadata entry holding the record's schema version.
SUMMARY_VERSION_KEY = b"tpbench.schema_version"


class StoreError(RuntimeError):
    """A results directory that is missing, unwritable or broken; the message says what and where."""


class RunBusy(StoreError):
    """A run directory that another process (a sweep, a resume) is writing."""


class RunLock:
    """Ownership of a run directory: an exclusive ``flock`` on its ``.lock`` file, which records
    the owner (pid, host, since) so that a second sweep or resume can name it.

    The lock lives as long as the file descriptor: it ends with the owning process, however that
    ends (SIGKILL included), so a stale lock never blocks a resume. Rank processes do not inherit
    it (Python's descriptors are not inheritable).
    """

    def __init__(self, run_dir: Path) -> None:
        path = Path(run_dir) / LOCK_FILE
        self.fd = -1
        try:
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:
            if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            # A run on a read-only disk (a mounted archive, a shared results store): the OS's words
            # (".lock: Read-only file system") say nothing of what still works or what to do.
            raise StoreError(
                f"{run_dir}: cannot be written here ({e.strerror}); a resume writes into the run: copy it to a "
                "writable folder and resume the copy (report, compare, export, explain and whatif read it where it is)"
            ) from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.read(self.fd, 4096).decode(errors="replace").strip() or "another process"
            self.release()
            raise RunBusy(f"{run_dir}: in use by {owner}; wait for it to end (or stop it) and try again") from None
        since = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        os.ftruncate(self.fd, 0)
        os.write(self.fd, f"pid {os.getpid()} on host {socket.gethostname()} since {since}".encode())

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the last descriptor of the file ends the flock
            self.fd = -1

    __del__ = release


def _umask() -> int:
    """The process's umask, read without changing it (Linux ≥ 4.7), else by setting it back."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def _atomic(path: Path) -> Iterator[tuple[int, str]]:
    """A temporary file beside ``path`` (fd, name), renamed onto it when the block ends.

    The file gets the mode a plain ``open`` would give (0666 less the umask; ``mkstemp`` alone
    makes 0600), so a team can share a results directory. Any failure removes the temporary
    file and raises ``StoreError`` naming ``path``, the user's file, not the temporary one.
    """
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.fchmod(fd, 0o666 & ~_umask())
        yield fd, tmp
        os.replace(tmp, path)
    except OSError as e:
        raise StoreError(f"{path}: cannot write: {e.strerror or e}") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with _atomic(Path(path)) as (fd, _):
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def write_output(path: Path, data: bytes) -> Path:
    """Write a file the user named (``report -o``, ``export -o``): through a symlink to its target,
    in place into an existing special file (``/dev/null``, a FIFO), atomically otherwise; a device
    node is never replaced by a regular file. Returns where it landed.

    Missing folders above the file are made, as for ``sweep --report`` and ``--out``; one that cannot
    be is said as ``sweep --report`` says it (``check_writable``): the OS says only "File exists" or
    "Not a directory" of a file in the way."""
    target, in_place = user_files.output_target(path)
    if not in_place:
        check_writable(target.parent, f"folder of {path}")
        atomic_write_bytes(target, data)
        return target
    try:
        user_files.write_in_place(target, data)
    except OSError as e:
        raise StoreError(f"{path}: cannot write: {e.strerror or e}") from None
    return target


def atomic_write_parquet(path: Path, df: pd.DataFrame, metadata: dict[bytes, bytes] | None = None) -> None:
    """``metadata``: key-value entries added to the file's schema metadata (beside pandas' own)."""
    with _atomic(Path(path)) as (fd, tmp):
        os.close(fd)
        _write_table(df, tmp, metadata)


def atomic_write_parquets(tables: Mapping[Path, pd.DataFrame]) -> None:
    """Tables that belong together (a what-if's projections and their validation), each written to a
    temporary file first and renamed onto its path only once every one is written: a write that fails
    leaves every path as it was, never a new table beside an old one."""
    with contextlib.ExitStack() as stack:
        for path, df in tables.items():
            fd, tmp = stack.enter_context(_atomic(Path(path)))
            os.close(fd)
            _write_table(df, tmp)


def _write_table(df: pd.DataFrame, tmp: str, metadata: dict[bytes, bytes] | None = None) -> None:
    table = pa.Table.from_pandas(df, preserve_index=False)
    if metadata:
        table = table.replace_schema_metadata((table.schema.metadata or {}) | metadata)
    pq.write_table(table, tmp)


def new_run_id(now: _dt.datetime | None = None) -> str:
    """Sortable by time; the random suffix keeps two sweeps started in the same second apart."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return now.strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def case_dir(run_dir: Path, case_id: str) -> Path:
    return Path(run_dir) / "cases" / case_id


def trace_dir(run_dir: Path, case_id: str) -> Path:
    return case_dir(run_dir, case_id) / "trace"


def write_repeat(run_dir: Path, case_id: str, repeat: int, rows: pd.DataFrame) -> None:
    """Persist one finished repeat of a case (called by rank 0 of the world)."""
    atomic_write_parquet(case_dir(run_dir, case_id) / "parts" / f"r{repeat:04d}.parquet", rows)


# Telemetry parts of a case (one per repeat, written by rank 0) and the file they are merged into.
NVML_PARTS, NVML_FILE = "nvml-parts", "nvml.parquet"


def finish_case(run_dir: Path, case_id: str, repeats: int, clock_sync: dict[str, Any] | None = None) -> Path:
    """Finish a case's directory once all its repeats are there (the one place that does): merge
    its repeats into steps.parquet and its telemetry parts into nvml.parquet, where each rank's
    samples get their time on the rank's trace clock from ``clock_sync`` (rank → ``ClockSync``
    as a dict, or None: no trace, no alignment). Returns the steps file's path."""
    parts_dir = case_dir(run_dir, case_id) / "parts"
    parts = sorted(parts_dir.glob("r*.parquet"))
    if len(parts) != repeats:
        raise StoreError(f"{parts_dir}: expected {repeats} repeats, found {len(parts)}")
    out = case_dir(run_dir, case_id) / STEPS_FILE
    _merge_parts(parts, out, lambda df: df)
    finish_telemetry(run_dir, case_id, clock_sync)
    return out


def finish_telemetry(run_dir: Path, case_id: str, clock_sync: dict[str, Any] | None) -> None:
    """Merge a case's telemetry parts into nvml.parquet, each rank's samples on its trace clock."""

    def on_trace_clock(samples: pd.DataFrame) -> pd.DataFrame:
        for rank, clock in (clock_sync or {}).items():
            if clock is not None:
                mine = samples["rank"] == int(rank)
                samples.loc[mine, "ts_us"] = samples.loc[mine, "t_ns"] / 1e3 + clock["offset_us"]
        return samples

    _merge_parts(
        sorted((case_dir(run_dir, case_id) / NVML_PARTS).glob("r*.parquet")),
        case_dir(run_dir, case_id) / NVML_FILE,
        on_trace_clock,
    )


def _merge_parts(parts: list[Path], out: Path, transform: Callable[[pd.DataFrame], pd.DataFrame]) -> None:
    """Concatenate part files into ``out`` (through ``transform``), then remove them and their folder."""
    if not parts:
        return
    atomic_write_parquet(out, transform(pd.concat([_read_parquet(p) for p in parts], ignore_index=True)))
    for p in parts:
        p.unlink()
    parts[0].parent.rmdir()


def finished_repeats(run_dir: Path, case_id: str) -> set[int]:
    """Repeats of a case already on disk (after a world died mid-case)."""
    return {int(p.stem[1:]) for p in (case_dir(run_dir, case_id) / "parts").glob("r*.parquet")}


def unreadable_parts(run_dir: Path, case_id: str) -> list[Path]:
    """A case's repeat parts whose parquet footer cannot be read (cut short, overwritten): their
    repeats are missing, whatever ``finished_repeats`` counts."""
    bad = []
    for part in sorted((case_dir(run_dir, case_id) / "parts").glob("r*.parquet")):
        try:
            pq.read_metadata(part)
        except Exception:  # pyarrow raises several types for truncated or foreign files
            bad.append(part)
    return bad


def set_aside_unreadable(run_dir: Path, case_id: str) -> list[Path]:
    """Move a case's unreadable repeat parts (``unreadable_parts``) out of its parts, to
    ``unreadable-rNNNN.parquet`` beside them, and return their new paths, so that ``--resume`` runs
    those repeats again. Left in place, the merge of the case's parts failed with a bare pyarrow
    traceback on every resume. Moved, not deleted: they stay for whoever looks."""
    folder = case_dir(run_dir, case_id)
    return [part.rename(folder / f"unreadable-{part.name}") for part in unreadable_parts(run_dir, case_id)]


def case_steps(run_dir: Path, case_id: str) -> pd.DataFrame:
    """Every finished repeat of a case as rows, whether merged (a done case) or still in parts
    (a case in progress): what ``tpbench tune --resume`` replays its race from."""
    d = case_dir(run_dir, case_id)
    files = [d / STEPS_FILE] if (d / STEPS_FILE).exists() else sorted((d / "parts").glob("r*.parquet"))
    return pd.concat([_read_parquet(f) for f in files], ignore_index=True) if files else pd.DataFrame()


TUNE_FILE = "tune.json"


def resume_command(run_dir: Path) -> str:
    """The command that finishes a run: a tune's (it holds tune.json) or a sweep's resume."""
    command = "tune" if (Path(run_dir) / TUNE_FILE).is_file() else "sweep"
    return shlex.join(["tpbench", command, "--resume", str(run_dir)])


def states_words(run_dir: Path, statuses: Iterable[str]) -> str:
    """The states of a run's cases, "1 done, 1 failed", and where some are pending or running what
    finishes them: "2 pending: an unfinished run; tpbench tune --resume RUN finishes it, …". Said
    where a run has nothing to compare or export: an interrupted run's cases are pending, not
    failed, and the resume is what the user needs. A tune's report shows its race so far."""
    states = Counter(statuses)
    said = ", ".join(f"{n} {state}" for state, n in states.most_common())
    if not states[PENDING] + states[RUNNING]:
        return said
    shown = (
        f", {shlex.join(['tpbench', 'report', str(run_dir)])} shows how far it got"
        if (Path(run_dir) / TUNE_FILE).is_file()
        else ""
    )
    return f"{said}: an unfinished run; {resume_command(run_dir)} finishes it{shown}"


def write_tune(run_dir: Path, record: TuneRecord) -> None:
    """Save a tune's record (``tpbench.tune``) beside run.json, versioned like it: tune.json's keys
    as they have always been (``TuneRecord.to_json``)."""
    doc = {"schema_version": SCHEMA_VERSION, **record.to_json()}
    atomic_write_bytes(Path(run_dir) / TUNE_FILE, json.dumps(doc, indent=1, allow_nan=False).encode())


def read_tune(run_dir: Path) -> TuneRecord | None:
    """A run's tune.json as its ``TuneRecord``, or None when the run is no tune. A file that is not
    JSON, of another version, or of the wrong shape (``TuneRecord.from_json``) is refused with one
    error naming the file and the key, so that its readers (``tune --resume``, the report's
    Recommendation) meet that instead of a TypeError inside, as ``_problem`` does for run.json."""
    path = Path(run_dir) / TUNE_FILE
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise StoreError(f"{path}: unreadable ({e})") from e
    if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION:
        raise StoreError(f"{path}: expected a tune record of schema_version {SCHEMA_VERSION}")
    try:
        return TuneRecord.from_json(doc)
    except TuneRecordError as e:
        raise StoreError(f"{path}: {e}") from None


def unmerge_case(run_dir: Path, case_id: str) -> None:
    """Split a finished case's steps.parquet and nvml.parquet back into their per-repeat parts, the
    state of a case whose world stopped mid-way, so that more repeats can be added (an adaptive
    sweep) and ``finish_case`` merges them all. Parts are written before the merged files go: an
    interruption in between leaves both, and the merge rewrites the same rows."""
    d = case_dir(run_dir, case_id)
    for merged, parts in ((d / STEPS_FILE, d / "parts"), (d / NVML_FILE, d / NVML_PARTS)):
        if not merged.exists():
            continue
        df = _read_parquet(merged)
        for repeat, rows in df.groupby("repeat"):
            # ts_us is derived from the case's clock offsets when the parts are merged again.
            atomic_write_parquet(parts / f"r{int(repeat):04d}.parquet", rows.drop(columns="ts_us", errors="ignore"))
        merged.unlink()


def discard_partial(run_dir: Path, case_id: str) -> None:
    """Drop everything a case left (repeats, traces, telemetry parts) so that a rerun starts it clean."""
    d = case_dir(run_dir, case_id)
    if d.exists():
        shutil.rmtree(d)


class Run:
    """The recorder of a run: its directory and run.json, held in memory by the one process that
    writes it (the sweep's).

    Every change of a run's record goes through the methods below, each one an event of the sweep
    (a case started, finished, failed; a world started; the run interrupted) applied and saved at
    once; nothing else writes run.json. ``record`` is the typed, read-only view of it.
    """

    def __init__(self, run_dir: Path, meta: dict[str, Any], lock: RunLock | None = None) -> None:
        self.dir = run_dir
        self._meta = meta
        self.lock = lock

    @property
    def run_id(self) -> str:
        return self._meta["run_id"]

    @property
    def record(self) -> RunRecord:
        return RunRecord.from_json(self._meta)

    @classmethod
    def create(
        cls,
        root: Path,
        suite_name: str,
        suite_path: str,
        suite_text: str,
        cases: list[dict[str, Any]],
        environment: dict[str, Any],
        launcher: dict[str, Any] | None = None,
        overrides: Sequence[str] = (),
        filters: Sequence[str] = (),
    ) -> Run:
        """A new run directory under ``root/suite_name`` with every case pending; ``launcher``: how
        its worlds are started (so that ``--resume`` starts them the same way); ``overrides`` and
        ``filters``: the ``--set`` and ``--filter`` the cases were made with (``SuiteSource``)."""
        # Absolute: rank processes get file:// rendezvous paths and plan paths from it.
        root = Path(root).resolve()
        check_writable(root)
        while True:
            run_id = new_run_id()
            run_dir = root / suite_name / run_id
            try:
                run_dir.mkdir(parents=True, exist_ok=False)
                break
            except FileExistsError:
                continue
        lock = RunLock(run_dir)
        meta = {
            "schema_version": SCHEMA_VERSION,
            "run_id": run_id,
            "suite": {
                "name": suite_name,
                "path": suite_path,
                "text": suite_text,
                "set": list(overrides),
                "filter": list(filters),
            },
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(),
            "status": RUNNING,
            "environment": environment,
            "launcher": launcher or {"name": "local"},
            "cases": {c["case_id"]: {"params": c, "status": PENDING} for c in cases},
        }
        run = cls(run_dir, meta, lock)
        run._save()
        run.hold_reserve()
        return run

    @classmethod
    def open(cls, run_dir: Path, own: bool = False) -> Run:
        """A run read back; ``own``: take the run's lock first (to write it, as ``--resume`` does),
        raising ``RunBusy`` naming the owner when another process holds it."""
        run_dir = Path(run_dir).resolve()
        meta = read_run_json(run_dir)  # first: a missing or broken run says so, not "busy"
        lock = RunLock(run_dir) if own else None
        return cls(run_dir, read_run_json(run_dir) if own else meta, lock)

    def _save(self) -> None:
        data = json.dumps(self._meta, indent=2, default=str).encode()
        try:
            atomic_write_bytes(self.dir / RUN_FILE, data)
        except StoreError:
            if not self.release_reserve():
                raise
            atomic_write_bytes(self.dir / RUN_FILE, data)

    def hold_reserve(self) -> None:
        """Set aside space (``RESERVE_FILE``) while the run is swept; best effort: a disk too full
        for it is found by the space check or by the first write."""
        size = max(RESERVE_MIN_BYTES, 4 * _size(self.dir / RUN_FILE))
        path = self.dir / RESERVE_FILE
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, size)  # blocks really allocated, not a sparse file
            finally:
                os.close(fd)
        except OSError:
            path.unlink(missing_ok=True)

    def release_reserve(self) -> bool:
        """Give the reserved space back (the disk is full, or the sweep is over); whether there was any."""
        path = self.dir / RESERVE_FILE
        existed = path.exists()
        path.unlink(missing_ok=True)
        return existed

    # --- events of a case

    def set_case(self, case_id: str, status: str, **info: Any) -> None:
        """A case changed state (``info``: why it failed, ``error``, ``detail``, ``failed_at``)."""
        entry = self._meta["cases"][case_id]
        entry["status"] = status
        for stale in ("error", "failed_at"):
            if status != FAILED:
                entry.pop(stale, None)
        entry.update(info)
        self._save()

    def case_done(self, case_id: str, repeats: int) -> None:
        """A case's last repeat ended: its directory is finished (``finish_case``, on the clocks its
        capture recorded) and it is done."""
        finish_case(self.dir, case_id, repeats, self._meta["cases"][case_id].get("clock_sync"))
        self.set_case(case_id, DONE)

    def case_cut(self, case_id: str, repeats_run: int) -> None:
        """A lockstep gate stopped the case's world before its last repeat: the case is done with
        the repeats it ran, 0 .. ``repeats_run`` - 1 (``repeats_run`` in its entry; its params keep
        the planned ``repeats``)."""
        finish_case(self.dir, case_id, repeats_run, self._meta["cases"][case_id].get("clock_sync"))
        self.set_case(case_id, DONE, repeats_run=repeats_run)

    def case_captured(self, case_id: str, capture: dict[str, Any]) -> None:
        """What a case's capture recorded (``record.Capture``: ``record.CAPTURED_KEYS``), into its entry."""
        self._meta["cases"][case_id].update(capture)
        self._save()

    def reset_case(self, case_id: str) -> None:
        """A case to run again (``--resume``): a failed one starts clean, a pending one keeps its repeats."""
        if self._meta["cases"][case_id]["status"] == FAILED:
            discard_partial(self.dir, case_id)
        self.set_case(case_id, PENDING)

    # --- events of a world and of the run
    def extend_case(self, case_id: str, repeats: int) -> None:
        """A done case gets more repeats (an adaptive sweep): its ``repeats`` raised, its files back
        in parts (``unmerge_case``) and its state pending, so the next world runs only the new ones."""
        entry = self._meta["cases"][case_id]
        if repeats <= entry["params"]["repeats"]:
            raise StoreError(f"case {case_id}: cannot extend {entry['params']['repeats']} repeats to {repeats}")
        unmerge_case(self.dir, case_id)
        entry["params"]["repeats"] = repeats
        self.set_case(case_id, PENDING)

    def set_adaptive(self, adaptive: dict[str, Any]) -> None:
        """The adaptive phase's record: its target and budget, its batches, where it stands."""
        self._meta["adaptive"] = adaptive
        self._save()

    def next_world(self) -> str:
        """The name the next world started will have."""
        return f"w{len(self._meta.get('worlds', []))}"

    def world_started(self, entry: dict[str, Any]) -> None:
        """A world's entry (``world``, ``key``, ``items``, ``started``, ``launcher`` ...)."""
        self._meta.setdefault("worlds", []).append(entry)
        self._save()

    def world_nodes(self, world: str, nodes: list[dict[str, Any]]) -> None:
        """Where a world really ran: its nodes and ranks in the world's entry, every node's
        fingerprint in the run's environment (under torchrun the sweeping process sees only its
        own machine)."""
        for entry in self._meta.get("worlds", []):
            if entry["world"] == world:
                entry["nodes"] = [{k: n[k] for k in ("node", "hostname", "ranks")} for n in nodes]
        self._meta["environment"]["nodes"] = nodes
        self._save()

    def world_ingested(self, world: str) -> None:
        """A printed world's events were read back, or its cases taken over since it had none
        (``--resume`` after ``--print``): its printed command is spent."""
        for entry in self._meta.get("worlds", []):
            if entry["world"] == world:
                entry["ingested"] = time.time()
        self._save()

    def add_wall_time(self, seconds: float) -> None:
        """Time a sweep (or a resume of it) spent running worlds."""
        self._meta["wall_s"] = self._meta.get("wall_s", 0.0) + seconds
        self._save()

    def set_launcher(self, entry: dict[str, Any]) -> None:
        """How the run's worlds start from now on (``record.LauncherRecord``'s JSON): a resume in a
        new allocation gives its own rendezvous and agents, which a later bare ``--resume`` there reuses."""
        self._meta["launcher"] = entry
        self._save()

    def set_status(self, status: str, **info: Any) -> None:
        """The run's state (``record.RUN_STATES``: running, printed, interrupted, complete ...), with
        when (``resumed``, ``interrupted``) or its ``efficiency`` figures."""
        self._meta["status"] = status
        self._meta.update(info)
        self._save()

    def case_status(self) -> dict[str, str]:
        return {cid: c["status"] for cid, c in self._meta["cases"].items()}


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def check_writable(root: Path, what: str = "results directory") -> None:
    """Fail before any case runs when results (or the report) cannot be written, saying why: a file
    where the directory, or one above it, should be (the OS says only "File exists"), a filesystem
    that takes no new files (/proc: "No such file or directory" for a folder that exists), or the
    OS's reason (missing permission, full disk). ``what``: the directory as the user knows it."""
    root = Path(root)
    if (blocker := _file_in_the_way(root)) is not None:
        said = "is a file" if blocker == root else f"cannot be made: {blocker} is a file"
        raise StoreError(f"{root}: the {what} {said}, not a directory")
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=root, prefix=".write-probe-")
        try:
            os.write(fd, b"\0" * 65536)
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except FileNotFoundError:
        raise StoreError(
            f"{root}: the {what} takes no new files (a virtual filesystem, as /proc and /sys are); expected a "
            "directory on a disk"
        ) from None
    except OSError as e:
        raise StoreError(f"{root}: the {what} is not writable: {e.strerror or e}") from None


def _file_in_the_way(root: Path) -> Path | None:
    """The nearest existing path at or above ``root`` when it is not a directory, else None."""
    for path in (root, *root.parents):
        if path.exists():
            return None if path.is_dir() else path
    return None


def check_space(root: Path, need_bytes: int, why: str) -> None:
    """Fail before cases run when the results filesystem cannot hold what they will write: a
    sweep that fills the disk half-way has spent its hours for a run it must resume elsewhere.
    ``why`` says how ``need_bytes`` was estimated (the message shows it)."""
    free = shutil.disk_usage(root).free
    if free < need_bytes:
        raise StoreError(
            f"{root}: {size_words(free)} free, the cases to run need about {size_words(need_bytes)} ({why}); "
            "free some space, or sweep fewer cases or traced steps"
        )


def size_words(n: float) -> str:
    """Bytes in MiB, GiB or TiB, whichever keeps the number under 1024: "32.5 GiB" free against a
    suite that needs "100.6 TiB" reads at a glance, where MiB alone ran to nine digits."""
    n /= 2**20
    for unit in ("MiB", "GiB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def case_bytes(run_dir: Path, case_id: str) -> int:
    """Bytes a case's directory holds on disk now (its traces, steps and derived tables)."""
    folder = case_dir(run_dir, case_id)
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else 0


def read_record(run_dir: Path) -> RunRecord:
    """A run's run.json as its typed record, without its tables (``load`` reads those too)."""
    return RunRecord.from_json(read_run_json(run_dir))


def read_run_json(run_dir: Path) -> dict[str, Any]:
    """A run's run.json as the raw dict, checked for shape and migrated: for the store's own
    recorder (``Run``); readers take ``read_record`` or ``load``."""
    path = Path(run_dir) / RUN_FILE
    if not Path(run_dir).is_dir():
        raise StoreError(_not_a_run_dir(Path(run_dir)))
    if not path.exists() and not path.is_symlink():
        raise StoreError(f"{path}: missing; {run_dir} is not a tpbench run{_runs_below(Path(run_dir))}")
    try:
        # Only a regular file, and only so much of it: a run.json replaced by /dev/zero is refused, not read.
        meta = json.loads(user_files.read_text(path, "run.json", MAX_RUN_JSON_BYTES))
    except json.JSONDecodeError as e:
        raise StoreError(f"{path}: corrupted ({e})") from None
    except ValueError as e:  # not a regular file, too large or not UTF-8: the first is no corruption
        said = str(e).removeprefix(f"{path}: ")
        raise StoreError(f"{path}: corrupted ({said})" if path.is_file() else f"{path}: {said}") from None
    except RecursionError:
        raise StoreError(f"{path}: corrupted (nested too deeply to be a run.json)") from None
    if isinstance(meta, dict) and (problem := version_problem(meta.get("schema_version", 0))):
        raise StoreError(f"{path}: {problem}")
    meta = migrate(meta)  # older runs (no version, cases without keys added since) keep loading
    problem = _run_json_problem(meta)
    if problem:
        raise StoreError(f"{path}: corrupted ({problem})")
    return meta


def _not_a_run_dir(path: Path) -> str:
    """Why ``path`` is not a run directory: it does not exist, or it is a file (a run's own run.json
    given where its folder is asked for reads as the folder)."""
    if not path.exists():
        return f"{path}: no such run directory"
    hint = f": the run is its folder, {path.parent}" if path.name == RUN_FILE else ""
    return f"{path}: not a directory; expected a run directory (results/<suite>/<run_id>){hint}"


def _runs_below(folder: Path) -> str:
    """What to give instead of a folder that is not a run but holds runs: a results root
    (``ROOT/<suite>/<run_id>``) or one suite's folder of them, named with its latest run; else that
    its sweep may never have started. Said where a run was expected, so that the reader sees which
    level of the results tree a run is."""
    with contextlib.suppress(OSError):
        if (folder / "gate.json").is_file():  # a gate's --out: baseline/<suite>/<id>, candidate/<suite>/<id>
            sides = [
                max(runs, key=lambda p: p.name)
                for side in ("baseline", "candidate")
                if (runs := list(iter_runs(folder / side)))
            ]
            if sides:
                return f" but a gate's folder, whose runs are {' and '.join(map(str, sides))}: give one of those"
        found = [p for p in folder.iterdir() if (p / RUN_FILE).is_file()] or list(iter_runs(folder))
        if found:
            many = f"{len(found)} runs" if len(found) > 1 else "1 run"
            return f" but holds {many} (the latest: {max(found, key=lambda p: p.name)}): give a run's own folder"
    return " (or its sweep never started)"


# Case keys that are never collapsed to None.
_ALWAYS_SET = ("algorithm", "world_size", "backend", "device", "workload", "repeats", "steps")


def _run_json_problem(meta: Any) -> str | None:
    """What makes a parsed run.json unusable (valid JSON of the wrong shape), or None.

    Checked up front so that readers (report, compare, export, resume) meet one error naming
    the file rather than a KeyError or TypeError deep inside.
    """
    if not isinstance(meta, dict):
        return f"expected a JSON object, got {type(meta).__name__}"
    for key, kind in (("run_id", str), ("suite", dict), ("cases", dict), ("environment", dict)):
        if key not in meta:
            return f"no {key!r} entry"
        if not isinstance(meta[key], kind):
            return f"{key!r} is a {type(meta[key]).__name__}, expected a {'string' if kind is str else 'JSON object'}"
    for key in ("name", "text"):
        if not isinstance(meta["suite"].get(key), str):
            return f"'suite' has no string {key!r}"
    for key in ("set", "filter"):
        given = meta["suite"].get(key, [])
        if not isinstance(given, list) or not all(isinstance(v, str) for v in given):
            return f"'suite' {key!r} is not a list of strings"
    if not meta["cases"]:
        return "'cases' is empty"
    if not isinstance(meta.get("worlds", []), list) or not all(isinstance(w, dict) for w in meta.get("worlds", [])):
        return "'worlds' is not a list of objects"
    for key in ("launcher", "efficiency", "adaptive"):
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            return f"{key!r} is a {type(meta[key]).__name__}, expected a JSON object"
    if meta.get("status") is not None and not isinstance(meta["status"], str):
        return f"'status' is a {type(meta['status']).__name__}, expected a string"
    if meta.get("wall_s") is not None and not finite_number(meta["wall_s"]):
        return f"'wall_s' = {meta['wall_s']!r}, expected a number of seconds"
    problem = _adaptive_problem(meta.get("adaptive") or {})
    if problem:
        return f"'adaptive': {problem}"
    for cid, entry in meta["cases"].items():
        if not isinstance(entry, dict) or not isinstance(entry.get("params"), dict):
            return f"case {cid}: expected an object with 'params' and 'status'"
        if entry.get("status") not in CASE_STATES:
            return f"case {cid}: status {entry.get('status')!r}, expected one of {', '.join(CASE_STATES)}"
        for key in CAPTURED_KEYS:
            if entry.get(key) is not None and not isinstance(entry[key], dict):
                return f"case {cid}: {key!r} is a {type(entry[key]).__name__}, expected a JSON object"
        problem = _params_problem(entry["params"])
        if problem:
            return f"case {cid}: {problem}"
    return None


def _adaptive_problem(adaptive: dict[str, Any]) -> str | None:
    """An adaptive sweep's record (``sweep.start_adaptive``) checked where its readers index it."""
    if not adaptive:
        return None
    for key in ("target_ci", "budget_s"):
        if key in adaptive and not finite_number(adaptive[key]):
            return f"{key} = {adaptive[key]!r}, expected a finite number"
    if "state" in adaptive and not isinstance(adaptive["state"], str):
        return f"state = {adaptive['state']!r}, expected a string"
    for key, kind in (("planned_repeats", dict), ("rounds_added", dict), ("batches", list)):
        if key in adaptive and not isinstance(adaptive[key], kind):
            return f"{key} is a {type(adaptive[key]).__name__}, expected a {'JSON object' if kind is dict else 'list'}"
    planned = adaptive.get("planned_repeats", {})
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in planned.values()):
        return "planned_repeats must map case ids to repeat counts"
    if not isinstance(adaptive.get("half_widths_after", []), list):
        return "half_widths_after is not a list"
    return None


def _params_problem(params: dict[str, Any]) -> str | None:
    """A case's parameters checked against the suite schema (a collapsed key is None)."""
    from tpbench.suite import CAPTURE_KEYS, CASE_KEYS

    for key, spec in (CASE_KEYS | CAPTURE_KEYS).items():
        if key not in params:
            return f"params have no {key!r}"
        value = params[key]
        if value is None and key not in _ALWAYS_SET:
            continue
        if not spec.check(value):
            return f"params {key!r} = {value!r}, expected {spec.expected}"
    return None


def _read_parquet(path: Path) -> pd.DataFrame:
    """A table of the run, refused naming it unless it is a regular parquet file: pandas reads a
    directory as a dataset, so a folder in a table's place would read as a table of no columns ("no
    'repeat' column") or, for the summary, escape as a bare OSError that names no file."""
    try:
        mode = path.stat().st_mode
    except OSError as e:
        raise StoreError(f"{path}: unreadable parquet ({type(e).__name__}: {e.strerror or e})") from None
    if not stat.S_ISREG(mode):
        raise StoreError(f"{path}: {user_files.file_kind(mode)}, expected a parquet file")
    try:
        return pd.read_parquet(path)
    except Exception as e:  # pyarrow raises several types for truncated or foreign files
        raise StoreError(f"{path}: unreadable parquet ({type(e).__name__}: {e})") from None


# The summary's step-time columns every reader of ``Loaded.table`` may rely on (NaN, or None for
# the per-repeat values, where a case has no numbers).
STEP_TIME_COLUMNS = ("median_ms", "ci_lo_ms", "ci_hi_ms", "p10_ms", "p90_ms", "repeat_medians_ms")

# The columns every steps.parquet has (the worker writes more), and whether each is numeric.
STEPS_COLUMNS = {"repeat": True, "rank": True, "step": True, "phase": False, "step_ms": True, "loss": True}


def _read_steps(path: Path) -> pd.DataFrame:
    """A finished case's steps.parquet, checked for the shape every reader relies on."""
    df = _read_parquet(path)
    for col, numeric in STEPS_COLUMNS.items():
        if col not in df.columns:
            raise StoreError(f"{path}: not a tpbench steps table (no {col!r} column)")
        if numeric and not pd.api.types.is_numeric_dtype(df[col]):
            raise StoreError(f"{path}: column {col!r} holds {df[col].dtype}, expected numbers")
    if not (df["phase"] == "timed").any():
        raise StoreError(f"{path}: no timed steps, but run.json says the case is done")
    return df


@dataclass
class Loaded:
    """A run read back, the one view every reader (report, compare, gate, export, whatif, CLI)
    takes of it: its typed record (run.json; nothing else reads the raw dict), cases, per-step rows
    and summary."""

    run_dir: Path
    record: RunRecord
    cases: pd.DataFrame  # one row per case: params, label, status, error, detail (``cases_table``)
    steps: pd.DataFrame  # all cases' steps.parquet, with a case_id column (no rows: no case done)
    summary: pd.DataFrame  # summary.parquet (empty if not written yet)

    @functools.cached_property
    def table(self) -> pd.DataFrame:
        """The tidy cases table: ``cases`` with the summary's numbers (median_ms, CIs, overlap,
        memory ...) beside each case; cases without numbers (failed, or no summary yet) have NaN.

        The step-time columns (``STEP_TIME_COLUMNS``) are always there, so that a script's
        ``table["median_ms"]`` reads an interrupted run (no summary yet) or one whose cases all
        failed (a summary without numbers) as NaN rather than raising ``KeyError``."""
        table = self.cases
        if not self.summary.empty and "case_id" in self.summary:
            numbers = [c for c in self.summary.columns if c == "case_id" or c not in self.cases.columns]
            table = table.merge(self.summary[numbers], on="case_id", how="left")
        kinds = {col: object if col == "repeat_medians_ms" else float for col in STEP_TIME_COLUMNS}
        missing = {
            col: pd.Series([None] * len(table), index=table.index, dtype=kind)
            for col, kind in kinds.items()
            if col not in table
        }
        return table.assign(**missing) if missing else table

    @functools.cached_property
    def tune(self) -> TuneRecord | None:
        """The run's tune.json (``read_tune``; None: the run is no tune), read on first use and kept:
        the report asks it twice (its Recommendation, and its Verdicts leaving a tune's settings to
        it), and read twice it was parsed and checked twice. Lazily, so that the readers that never
        ask (compare, export) do not fail on a damaged one."""
        return read_tune(self.run_dir)

    @property
    def environment(self) -> dict[str, Any]:
        """The run's environment fingerprint, a copy (exports write it out as JSON)."""
        return dict(self.record.environment)


def load(run_dir: str | Path, *, summary: bool = True) -> Loaded:
    """Everything of a run as DataFrames. Broken files raise ``StoreError`` naming the file.
    ``summary=False`` leaves summary.parquet unread (empty): what writes it again (``--resume``)
    must get past one that is broken."""
    run_dir = Path(run_dir)
    record = read_record(run_dir)
    if record.status == RUNNING and not owned(run_dir):
        record = _left_interrupted(record)
    frames = []
    for cid, case in record.cases.items():
        steps_path = case_dir(run_dir, cid) / STEPS_FILE
        if case.status == DONE:
            if not steps_path.exists():
                raise StoreError(f"{steps_path}: missing, but run.json says case {cid} is done")
            frames.append(_read_steps(steps_path).assign(case_id=cid))
    steps = pd.concat(frames, ignore_index=True) if frames else _no_steps()
    table = read_summary(run_dir, record) if summary else pd.DataFrame()
    return Loaded(run_dir, record, cases_table(record), steps, table)


def _no_steps() -> pd.DataFrame:
    """The steps of a run with no finished case (interrupted before one, or every case failed): no
    rows, but the columns every steps.parquet has, so that a script's ``stats.repeat_values(run.steps)``
    or ``run.steps.groupby("case_id")`` reads it as no steps rather than raising ``KeyError``."""
    kinds = {col: float if numeric else object for col, numeric in STEPS_COLUMNS.items()} | {"case_id": object}
    return pd.DataFrame({col: pd.Series(dtype=kind) for col, kind in kinds.items()})


def owned(run_dir: Path) -> bool:
    """Whether a process holds the run's lock (``RunLock``): a sweep, tune or resume running it now."""
    try:
        fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released with the descriptor, below
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _left_interrupted(record: RunRecord) -> RunRecord:
    """A run that says it is running, but whose process is gone (killed outright: SIGKILL, the OOM
    killer, a lost node), as Ctrl-C would have left it: interrupted, the cases it had in flight
    pending. Read so, not written (a resume takes it over as it is), so that a report or compare of
    it does not say "2 running" for ever."""
    cases = {cid: replace(c, status=PENDING) if c.status == RUNNING else c for cid, c in record.cases.items()}
    return replace(record, status=INTERRUPTED, cases=MappingProxyType(cases))


def require_summary(loaded: Loaded) -> None:
    """Refuse a finished run whose summary.parquet is missing, with a ``StoreError`` naming it.

    run.json says ``complete`` only once the summary is written (``sweep.finalize``), so a finished
    run without one is broken, as a done case without its steps.parquet is; a reader of the summary's
    numbers (the report) would otherwise drop its verdicts without a word. ``load`` does not check
    it: compare and export work from the steps, and ``--resume`` loads such a run to write it again.
    """
    if not loaded.record.finished or not loaded.summary.empty:
        return
    path = loaded.run_dir / SUMMARY_FILE
    raise StoreError(
        f"{path}: {'no rows' if path.exists() else 'missing'}, but run.json says the run is {loaded.record.status}; "
        f"`tpbench sweep --resume {loaded.run_dir}` writes it again"
    )


def cases_table(record: RunRecord) -> pd.DataFrame:
    """A run's cases as a table, built here only: one row per case with its parameters as the
    suite gave them, its label (``suite.labels``), status, error and failure detail."""
    from tpbench.suite import labels

    names = labels([[c.case for c in record.cases.values()]])[0]
    rows = [
        dict(c.params) | {"label": names[cid], "status": c.status, "error": c.error, "detail": c.detail}
        for cid, c in record.cases.items()
    ]
    table = pd.DataFrame(rows)
    for col in table.columns:
        # A parameter collapsed to None for some cases would turn ints into floats (4 → 4.0) in
        # labels and verdicts: keep such columns as the suite's own values.
        if table[col].dtype == float and any(r.get(col) is None for r in rows):
            table[col] = pd.Series([r.get(col) for r in rows], dtype=object)
    return table


def read_summary(run_dir: Path, record: RunRecord) -> pd.DataFrame:
    """A run's summary.parquet alone (empty when it has none); a broken one raises ``StoreError``
    naming it, and so does one holding cases that are not ``record``'s (another run's summary copied
    here matches none of its cases). What asks only whether the summary stands need not read every
    case's steps."""
    path = Path(run_dir) / SUMMARY_FILE
    summary = _read_summary(path) if path.exists() else pd.DataFrame()
    if not summary.empty and "case_id" in summary and (foreign := set(summary["case_id"]) - set(record.cases)):
        raise StoreError(
            f"{path}: {len(foreign)} of its cases are not this run's (e.g. {min(foreign)}); "
            f"another run's summary? `tpbench sweep --resume {run_dir}` writes it again"
        )
    return summary


def _read_summary(path: Path) -> pd.DataFrame:
    """summary.parquet, refused when a newer tpbench wrote it (no version: today's layout) or when
    it is not a summary: every summary with columns has ``case_id`` (``stats.summarize`` keeps a row
    per case), and a foreign table read as one gave a report without its verdicts, not a word said."""
    df = _read_parquet(path)
    raw = (pq.read_schema(path).metadata or {}).get(SUMMARY_VERSION_KEY)
    if raw is not None:
        problem = version_problem(int(raw) if raw.isdigit() else raw.decode(errors="replace"))
        if problem:
            raise StoreError(f"{path}: {problem}")
    if len(df.columns) and "case_id" not in df:
        raise StoreError(
            f"{path}: not a tpbench summary table (no 'case_id' column); "
            f"`tpbench sweep --resume {path.parent}` writes it again"
        )
    # The step times every reader does arithmetic on (``Loaded.table``'s promise): a column of text
    # there would escape from the report as a TypeError in its verdicts, while compare and export,
    # which read the steps, go on. All-null is a summary whose cases have no numbers, not a wrong type.
    for col in STEP_TIME_COLUMNS:
        if col in df and col != "repeat_medians_ms" and not _numbers_or_null(df[col]):
            raise StoreError(
                f"{path}: column {col!r} holds {df[col].dtype}, expected numbers (ms); "
                f"`tpbench sweep --resume {path.parent}` writes it again"
            )
    return df


def _numbers_or_null(column: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(column) or bool(column.isna().all())


def write_summary(run_dir: Path, summary: pd.DataFrame) -> Path:
    """Write summary.parquet. A parameter column whose values mix types (``start_localSGD_iter``
    is an integer or "never") is stored as text, since a parquet column has one type; run.json
    keeps the original values."""
    path = Path(run_dir) / SUMMARY_FILE
    summary = summary.copy()
    for col in [col for col, dtype in summary.dtypes.items() if pd.api.types.is_object_dtype(dtype)]:
        kinds = {type(v) for v in summary[col] if v is not None and not (isinstance(v, float) and pd.isna(v))}
        if len(kinds) > 1 and not kinds <= {int, float}:
            summary[col] = [None if v is None else str(v) for v in summary[col]]
    atomic_write_parquet(path, summary, {SUMMARY_VERSION_KEY: str(SCHEMA_VERSION).encode()})
    return path


# Per-case tables derived from traces and telemetry at the end of a sweep (see sweep.finalize):
# intervals (analysis.timeline), overlap per rank and step (analysis.overlap), collectives with
# bandwidth (analysis.bandwidth), marks for the what-if replay (analysis.whatif), nvml samples
# (capture.nvml), exact bytes and step work per rank and ZeRO's partition (accounting).
CASE_TABLES = ("intervals", "overlap", "collectives", "marks", "nvml", "memory", "partition", "ddp_buckets")


def write_case_table(run_dir: Path, case_id: str, name: str, df: pd.DataFrame) -> Path:
    if name not in CASE_TABLES:
        raise ValueError(f"unknown case table {name!r}; expected one of {CASE_TABLES}")
    path = case_dir(run_dir, case_id) / f"{name}.parquet"
    atomic_write_parquet(path, df)
    return path


# Columns the readers of each derived table index by (a table written with none is an empty one).
CASE_TABLE_KEYS = {
    "intervals": ("rank", "step", "lane", "start_ns", "end_ns"),
    "overlap": ("rank", "step", "compute_ns", "comm_ns"),
    "collectives": ("collective", "step", "bytes", "time_ns"),
    "marks": ("rank", "kind", "start_ns", "end_ns"),
    "memory": ("rank", "param_bytes", "grad_bytes", "optimizer_state_bytes", "stepped_params"),
    "partition": ("rank", "bucket", "first", "tensors", "params"),
    "ddp_buckets": ("bucket", "bytes"),
}
# The columns of those tables that hold text; every other column holds numbers (or nothing).
CASE_TABLE_TEXT = {
    "intervals": ("lane", "stream_or_thread", "name", "collective", "process_group"),
    "marks": ("kind", "collective"),
    "collectives": ("process_group", "collective"),
}


def read_case_table(run_dir: Path, case_id: str, name: str) -> pd.DataFrame | None:
    """A derived per-case table, or None when the case has none (e.g. no traces, no GPU);
    ``StoreError`` naming the file when it is not the table it should be."""
    path = case_dir(run_dir, case_id) / f"{name}.parquet"
    if not path.exists():
        return None
    df = _read_parquet(path)
    missing = [c for c in CASE_TABLE_KEYS.get(name, ()) if c not in df.columns]
    if missing and len(df.columns):
        raise StoreError(f"{path}: not a tpbench {name} table (no {', '.join(map(repr, missing))} column)")
    if name in CASE_TABLE_KEYS:
        _check_numbers(path, df, CASE_TABLE_TEXT.get(name, ()))
    return df


def _check_numbers(path: Path, df: pd.DataFrame, text: Iterable[str]) -> None:
    """Refuse a derived table whose number column holds text, as ``_read_steps`` does: the readers
    do arithmetic on them, and a text column reached the report as a TypeError traceback. A column
    of nulls only (an empty table, a bucket-less partition) is no number and no text."""
    for col in df.columns.difference(list(text)):
        if not pd.api.types.is_numeric_dtype(df[col]) and df[col].notna().any():
            raise StoreError(f"{path}: column {col!r} holds {df[col].dtype}, expected numbers")


def read_case_tables(loaded: Loaded, name: str) -> pd.DataFrame:
    """One derived table for every case of a loaded run that has it, with a case_id column."""
    frames = [
        t.assign(case_id=cid)
        for cid in loaded.record.cases
        if (t := read_case_table(loaded.run_dir, cid, name)) is not None
    ]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def traces(run_dir: Path, case_id: str) -> list[Path]:
    return sorted(trace_dir(run_dir, case_id).glob("rank*.json.gz"))


def lost_tables(run_dir: Path, case_id: str, names: Iterable[str]) -> str:
    """Which of the derived tables ``names`` a traced case lacks (deleted, or its analysis cut short),
    as a sentence naming the files; "" when it has them all, or has no traces to derive them from.
    A reader that finds no analysed traces says this rather than "trace the case": its traces are there."""
    if not traces(run_dir, case_id):
        return ""
    lost = [str(path) for name in names if not (path := case_dir(run_dir, case_id) / f"{name}.parquet").exists()]
    if not lost:
        return ""
    return (
        f"{', '.join(lost)}: missing, though the case was traced ({trace_dir(run_dir, case_id)}); the sweep "
        "derives its tables from those traces when the run finishes"
    )


def iter_runs(root: Path, suite: str | None = None) -> Iterable[Path]:
    """Run directories under a results root, oldest first (run ids sort by time)."""
    root = Path(root)
    suites = [root / suite] if suite else sorted(p for p in root.iterdir() if p.is_dir())
    for s in suites:
        if s.is_dir():
            yield from sorted(p for p in s.iterdir() if (p / RUN_FILE).exists())
