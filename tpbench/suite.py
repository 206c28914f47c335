"""Suite files: TOML → validated ``Suite`` → list of ``Case``.

Everything a user can get wrong is caught here, before any process starts: every error is a
``SuiteError`` whose one-line message names the file, the key and what was expected. The CLI turns
it into exit code 2.

A ``Case`` is fully resolved (no "auto" left) and carries only the keys that matter to its
algorithm; the others are collapsed to ``None`` so a dimension that does not apply never runs a
case twice. Its identity is those normalized parameters less the budget keys (how long and how
often it is measured, what is captured, test-only knobs): runs are matched case by case on it.
Its id is a hash of the identity (plus any budget key the suite sweeps, so that such cases stay
apart within a run), so the same case gets the same id in every run.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import functools
import hashlib
import itertools
import json
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from tpbench import comm_hooks, user_files
from tpbench.algorithms import ALGORITHM_SPECIFIC_KEYS, ALGORITHMS
from tpbench.record import ADDED_ALGORITHM_KEYS, ADDED_KEYS, Case  # Case: defined below the suite, with the record
from tpbench.workload_params import PARAMS, UserWorkloadError, is_import_path, shards_by_node, unknown

# Keys that set a case's measurement budget or capture, and test-only knobs (an injected slowdown
# exists to be compared against a run without it): recorded with a case, not part of what it
# measures, so runs that differ only in them compare case by case.
BUDGET_KEYS = frozenset(
    {
        "repeats",
        "passes",
        "steps",
        "warmup_steps",
        "timeout_s",
        "profiler_steps",
        "trace_windows",
        "nvml_interval_ms",
        "slowdown_pct",
        "slowdown_kind",
        "slowdown_ranks",
        "fault",
    }
)
# DDP's own bucketing: ``bucket_cap_mb = "default"`` passes nothing, so DDP uses 25 MB buckets and a
# 1 MB first bucket; any number passed also sets the first bucket to it (torch's ``_BucketCapacityConfig``).
DDP_DEFAULT = "default"
# Keys whose value is itself a list: in ``--set`` a list of lists sweeps them, a flat list sets them.
LIST_KEYS = frozenset({"bucket_cap_mb_list", "slowdown_ranks"})
# The first torch whose DistributedDataParallel takes ``bucket_cap_mb_list`` (public since 2.13).
BUCKET_CAP_MB_LIST_TORCH = (2, 13)


class SuiteError(ValueError):
    """A suite that cannot run; the message names file, key and expectation."""


@dataclass(frozen=True)
class KeySpec:
    default: Any
    expected: str
    check: Callable[[Any], bool]


def _int(lo: int, *extra: str) -> Callable[[Any], bool]:
    return lambda v: (isinstance(v, int) and not isinstance(v, bool) and v >= lo) or v in extra


def _num(lo: float, *, strict: bool, hi: float) -> Callable[[Any], bool]:
    """A finite number above ``lo`` and at most ``hi``: inf or NaN would be accepted by every
    comparison below and fail only later (a case "done" with NaN losses, a timer that never fires)."""

    def ok(v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v > hi:
            return False
        return v > lo if strict else v >= lo

    return ok


def _one_of(*choices: str) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, str) and v in choices


def _caps(v: Any) -> bool:
    """A non-empty list of bucket caps in MB, each as ``bucket_cap_mb`` takes it (None: not set)."""
    return v is None or (isinstance(v, list) and bool(v) and all(_num(0, strict=True, hi=1e6)(x) for x in v))


def _ranks(v: Any) -> bool:
    """``"all"`` or a non-empty list of distinct rank numbers (checked against world_size later)."""
    return v == "all" or (isinstance(v, list) and bool(v) and len(set(v)) == len(v) and all(_int(0)(r) for r in v))


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


def _str(v: Any) -> bool:
    return isinstance(v, str) and v != ""


# Test-only faults (the ``fault`` key, KIND:RANK): that rank is killed by SIGKILL in a step of repeat 0, hangs
# there, aborts as its case's trace starts (once per run: the launcher's retry then traces it), runs its
# first trace window's forward passes at under a third of their timed speed, or burns CPU after each step of
# that window, its training thread's CPU time more than tripled (either way the window is traced again).
FAULTS = ("crash", "hang", "abort-trace", "slow-trace", "busy-trace")

# Every key a case has, with its default: the single source for [defaults], [sweep], --set.
CASE_KEYS: dict[str, KeySpec] = {
    "algorithm": KeySpec("ddp", "an algorithm name (see `tpbench list`)", _str),
    "impl": KeySpec("tpbench", '"tpbench" or "torch"', _one_of("tpbench", "torch")),
    "world_size": KeySpec("auto", 'an integer >= 1 or "auto"', _int(1, "auto")),
    "backend": KeySpec("auto", '"nccl", "gloo" or "auto"', _one_of("nccl", "gloo", "auto")),
    "device": KeySpec("auto", '"cuda", "cpu" or "auto"', _one_of("cuda", "cpu", "auto")),
    "workload": KeySpec("mlp", "a workload name (see `tpbench list`)", _str),
    "optimizer": KeySpec("adamw", '"adamw", "adam" or "sgd"', _one_of("adamw", "adam", "sgd")),
    "lr": KeySpec(1e-3, "a finite number > 0 and <= 100", _num(0, strict=True, hi=100)),
    "batch_size": KeySpec(32, "an integer >= 1", _int(1)),
    "warmup_steps": KeySpec(5, "an integer >= 0", _int(0)),
    "steps": KeySpec(30, "an integer >= 1", _int(1)),
    "repeats": KeySpec(3, "an integer >= 1", _int(1)),
    "passes": KeySpec(1, "an integer >= 1 (the sweep runs each world's rounds in this many turns)", _int(1)),
    "seed": KeySpec(0, "an integer >= 0", _int(0)),
    "timeout_s": KeySpec(300, "a number of seconds > 0 and <= 604800 (a week)", _num(0, strict=True, hi=604800)),
    "bucket_cap_mb": KeySpec(
        25,
        f'a number of megabytes > 0 and <= 1000000, or "{DDP_DEFAULT}" (DDP\'s own: 25 MB, the first bucket 1 MB)',
        lambda v: v == DDP_DEFAULT or _num(0, strict=True, hi=1e6)(v),
    ),
    "bucket_cap_mb_list": KeySpec(
        None,
        "a non-empty list of megabytes > 0 and <= 1000000, one cap per bucket in DDP's order, the last for the rest "
        "(torch >= 2.13; replaces bucket_cap_mb)",
        _caps,
    ),
    "gradient_as_bucket_view": KeySpec(False, "true or false", _bool),
    "static_graph": KeySpec(False, "true or false", _bool),
    "find_unused_parameters": KeySpec(False, "true or false", _bool),
    "shard_buckets": KeySpec(False, "true or false", _bool),
    "parameters_as_bucket_view": KeySpec(False, "true or false", _bool),
    "comm_hook": KeySpec("allreduce", comm_hooks.EXPECTED, comm_hooks.valid_name),
    "comm_hook_state": KeySpec(comm_hooks.NO_STATE, comm_hooks.STATE_EXPECTED, comm_hooks.valid_state),
    "interconnect": KeySpec("loopback", "an interconnect profile name", _str),
    "start_localSGD_iter": KeySpec("never", 'an integer >= 0 or "never"', _int(0, "never")),
    "post_local_gradient_allreduce": KeySpec(True, "true or false", _bool),
    "averaging_period": KeySpec(4, "an integer >= 1", _int(1)),
    "ranks_per_node": KeySpec("auto", 'an integer >= 1 or "auto"', _int(1, "auto")),
    "eval_every": KeySpec(0, "an integer >= 0 (steps between held-out evaluations; 0 = never)", _int(0)),
    "slowdown_pct": KeySpec(0.0, "a percentage >= 0 and <= 1000", _num(0, strict=False, hi=1000)),
    "slowdown_kind": KeySpec(
        "sleep",
        '"sleep" (slowdown_pct waits) or "cpu" (slowdown_pct burns CPU on the training thread)',
        _one_of("sleep", "cpu"),
    ),
    "slowdown_ranks": KeySpec(
        "all", '"all" or a list of ranks, e.g. [1]: the ranks slowdown_pct slows (the others wait for them)', _ranks
    ),
    "fault": KeySpec("none", f'"none" or KIND:RANK, KIND {"/".join(FAULTS)} (test-only fault injection)', _str),
}

CAPTURE_KEYS: dict[str, KeySpec] = {
    "profiler_steps": KeySpec(3, "an integer >= 0", _int(0)),
    "trace_windows": KeySpec(3, "an integer >= 1", _int(1)),
    "nvml_interval_ms": KeySpec(50, "an integer >= 1", _int(1)),
}

_TABLES = {"suite", "defaults", "sweep", "capture", "workloads", "interconnects"}


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    path: str
    text: str
    defaults: dict[str, Any]
    sweep: dict[str, list[Any]]
    capture: dict[str, Any]
    workloads: dict[str, dict[str, Any]] = field(default_factory=dict)
    interconnects: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Machine:
    """What "auto" resolves against: this machine's GPUs and, under torchrun, the world's layout.

    ``nnodes`` is None for the local launcher (every rank on this machine). Under torchrun every
    world spans ``nnodes`` machines assumed to look like this one, with ``nproc_per_node`` ranks
    each (None: whatever ``world_size`` divided by ``nnodes`` gives).
    """

    gpus: int
    nnodes: int | None = None
    nproc_per_node: int | None = None
    # What this machine can take (None: no limit): ranks in a local world, cases in a sweep.
    max_ranks: int | None = None
    max_cases: int | None = None
    capacity: str = ""

    @classmethod
    def detect(cls, limited: bool = True) -> Machine:
        """This machine; ``limited``: with the limits sized from its cores and memory (a world
        far beyond them thrashes the machine rather than measuring anything)."""
        gpus = _gpu_count()
        if not limited:
            return cls(gpus)
        cores = os.cpu_count() or 1
        memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
        ranks = max(2, min(RANKS_PER_CORE * cores, memory_mb // MB_PER_RANK))
        return cls(gpus, max_ranks=ranks, max_cases=MAX_CASES, capacity=f"{cores} cores, {memory_mb / 1024:.0f} GiB")


# Where a GPU driver shows itself (NVIDIA's, AMD's): without one torch sees no GPU either, so a
# CPU machine validates a suite without importing torch (seconds).
GPU_DRIVERS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd")


def _gpu_count() -> int:
    if not any(os.path.exists(p) for p in GPU_DRIVERS):
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# Limits of a sweep on one machine, lifted by ``--allow-large``: a rank process needs a few
# hundred MB (torch, the model, Gloo's buffers) and a share of a core; 64 ranks on 2 cores
# reached 8.7 GB in 40 s. A sweep of more cases than this would not finish in a working day.
RANKS_PER_CORE = 4
MB_PER_RANK = 512
MAX_CASES = 10_000


def _fail(path: str, key: str, msg: str) -> SuiteError:
    return SuiteError(f"{path}: {key}: {msg}")


def _unknown(what: str, name: str, known: Iterable[str]) -> str:
    """ "unknown key; did you mean steps? expected one of ...": the closest name first (``_closest``)."""
    known = list(known)
    return f"unknown {what};{_closest(name, known)} expected one of {', '.join(known)}"


def _closest(name: str, known: Iterable[str]) -> str:
    """ " did you mean steps?" for a misspelt name (empty: none is close), as a mistyped command or
    option is answered, so that a typo need not be spotted among the 35 keys a case has."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" did you mean {close[0]}?" if close else ""


def _check_value(path: str, where: str, spec: KeySpec, value: Any) -> Any:
    """The value checked and in canonical form (see ``canonical``)."""
    if not spec.check(value):
        raise _fail(path, where, f"expected {spec.expected}, got {value!r}")
    return canonical(spec.default, value)


def canonical(default: Any, value: Any) -> Any:
    """One form per number, so that equal values make one case with one id: the type of the
    key's default. A float key's integer becomes a float (``lr = 1`` is ``1.0``); an integer
    key's integral float becomes an integer (``bucket_cap_mb = 25.0`` is ``25``). Values written
    in the default's type are unchanged, so the ids of existing results are too."""
    if isinstance(value, list) and isinstance(default, str):  # slowdown_ranks: rank numbers as they are
        return value
    if isinstance(value, list):  # bucket_cap_mb_list: its caps in bucket_cap_mb's form
        return [canonical(CASE_KEYS["bucket_cap_mb"].default, v) for v in value]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if isinstance(default, float):
        return float(value)
    if isinstance(default, int) and not isinstance(default, bool) and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def parse(text: str, path: str = "<suite>") -> Suite:
    """Validate the shape and value types of a suite's TOML text."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SuiteError(f"{path}: TOML syntax error: {e}") from None
    except RecursionError:
        raise SuiteError(f"{path}: TOML nested too deeply to be a suite") from None
    if not doc:
        # Probably the wrong file (or an unsaved one): say so rather than run the full defaults.
        raise SuiteError(
            f"{path}: empty suite: expected at least one of the tables {', '.join(sorted(_TABLES))} "
            "(a [suite] table alone runs the defaults)"
        )
    return dataclasses.replace(_validate(doc, path), text=text)


def _validate(doc: dict[str, Any], path: str) -> Suite:
    for table in doc:
        if table not in _TABLES:
            raise _fail(path, table, _unknown("table", table, sorted(_TABLES)))
        if not isinstance(doc[table], dict):
            raise _fail(path, table, "expected a table, e.g. [" + table + "]")

    name, description = _suite_meta(doc, path)
    defaults = dict(doc.get("defaults", {}))
    for k, v in defaults.items():
        if k not in CASE_KEYS:
            raise _fail(path, f"[defaults] {k}", _unknown("key", k, CASE_KEYS))
        defaults[k] = _check_value(path, f"[defaults] {k}", CASE_KEYS[k], v)

    sweep = dict(doc.get("sweep", {}))
    for k, values in sweep.items():
        if k not in CASE_KEYS:
            raise _fail(path, f"[sweep] {k}", _unknown("key", k, CASE_KEYS))
        if not isinstance(values, list) or not values:
            raise _fail(path, f"[sweep] {k}", f"expected a non-empty list of {CASE_KEYS[k].expected}, got {values!r}")
        sweep[k] = [_check_value(path, f"[sweep] {k}[{i}]", CASE_KEYS[k], v) for i, v in enumerate(values)]
        if len(set(map(repr, sweep[k]))) != len(values):
            raise _fail(path, f"[sweep] {k}", f"expected distinct values, got {values!r}")
        if k in defaults:
            raise _fail(path, f"[sweep] {k}", "is also set in [defaults]; set it in one place")

    capture = {k: s.default for k, s in CAPTURE_KEYS.items()}
    for k, v in doc.get("capture", {}).items():
        if k not in CAPTURE_KEYS:
            raise _fail(path, f"[capture] {k}", _unknown("key", k, CAPTURE_KEYS))
        capture[k] = _check_value(path, f"[capture] {k}", CAPTURE_KEYS[k], v)

    workloads = _workload_tables(doc, path)

    interconnects = doc.get("interconnects", {})
    from tpbench.interconnect import resolve

    for iname in interconnects:
        # Every profile, used or not: a mistake in one should not wait until a case uses it.
        try:
            resolve(iname, interconnects)
        except ValueError as e:
            raise _fail(path, f"[interconnects.{iname}]", str(e)) from None

    return Suite(name, description, path, "", defaults, sweep, capture, workloads, dict(interconnects))


def _suite_meta(doc: dict[str, Any], path: str) -> tuple[str, str]:
    """The [suite] table's name (default: the file's stem) and description, checked."""
    meta = doc.get("suite", {})
    for k in meta:
        if k not in ("name", "description"):
            raise _fail(path, f"[suite] {k}", _unknown("key", k, ("name", "description")))
    name = meta.get("name", Path(path).stem)
    if not _good_name(name):
        raise _fail(
            path,
            "[suite] name",
            f"expected a non-empty name without '/', control characters or a leading '.', "
            f"of at most {_MAX_NAME} characters, got {name!r}",
        )
    description = meta.get("description", "")
    if not isinstance(description, str):
        raise _fail(path, "[suite] description", "expected a string")
    return name, description


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _workload_table(name: str) -> str:
    """The workload's table header as the suite file spells it: an import path is not a bare TOML
    key (``[workloads.mypkg.bench:build]`` would be three nested tables and a syntax error), so its
    table is ``[workloads."mypkg.bench:build"]``, which is what errors must name for the user to find it."""
    return f"workloads.{name}" if _BARE_KEY.fullmatch(name) else f'workloads."{name}"'


def _workload_tables(doc: dict[str, Any], path: str) -> dict[str, dict[str, Any]]:
    """The [workloads.NAME] tables, each key checked against the workload's parameters."""
    workloads: dict[str, dict[str, Any]] = {}
    for wname, table in doc.get("workloads", {}).items():
        try:
            wl_params = params_of(wname)
        except UserWorkloadError as e:
            raise _fail(path, f"[{_workload_table(wname)}]", f"unknown workload: {e}") from None
        if not isinstance(table, dict):
            raise _fail(path, f"[{_workload_table(wname)}]", "expected a table")
        fields = {f.name: f for f in dataclasses.fields(wl_params)}
        # A built-in workload's positive defaults are sizes and counts, which must stay above 0; a
        # factory of the user's own gets any finite number (a dropout of 0.1 may well be set to 0)
        # and checks its own ranges, where its errors name it.
        sized = not is_import_path(wname)
        for k, v in table.items():
            if k not in fields:
                raise _fail(path, f"[{_workload_table(wname)}] {k}", _unknown("key", k, fields))
            want = type(fields[k].default)
            if type(v) is not want and not (want is float and type(v) is int):
                said = _TYPE_WORDS.get(want, want.__name__)
                raise _fail(path, f"[{_workload_table(wname)}] {k}", f"expected {said}, got {v!r}")
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                continue
            positive = sized and fields[k].default > 0
            if v <= 0 and positive or not math.isfinite(v):
                raise _fail(
                    path,
                    f"[{_workload_table(wname)}] {k}",
                    f"expected a finite value{' > 0' if positive else ''}, got {v!r}",
                )
        workloads[wname] = {k: canonical(fields[k].default, v) for k, v in table.items()}
    return workloads


# A workload parameter's type as the other keys' errors say it ("expected an integer >= 1"), not
# Python's name for it: the suite is TOML, where "int" and "str" name nothing.
_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def unused_workload_tables(suite: Suite, cases: Iterable[Case]) -> list[str]:
    """Each ``[workloads.NAME]`` table whose workload none of ``cases`` runs, as the file spells it.

    Such a table is most likely a mistake (``workload`` never set to it, or set under another name),
    and its parameters then silently change nothing. It is warned of, not refused: a suite may keep
    tables for workloads that ``--set workload=...`` picks, as it keeps unused ``[interconnects.X]``."""
    used = {c.workload for c in cases}
    return [f"[{_workload_table(name)}]" for name in suite.workloads if name not in used]


# A suite name becomes a folder and a report file name, and is printed: keep it short and printable.
_MAX_NAME = 100


def _good_name(name: Any) -> bool:
    return (
        isinstance(name, str)
        and 0 < len(name) <= _MAX_NAME
        and "/" not in name
        and not name.startswith(".")
        and name.isprintable()
    )


def load(path: str | Path) -> Suite:
    p = Path(path)
    try:
        text = user_files.read_text(p, "suite file")
    except ValueError as e:
        raise SuiteError(str(e)) from None
    return parse(text, str(p))


def _parse_value(raw: str) -> Any:
    """A ``--set`` value: TOML syntax when it parses (numbers, booleans, lists), else a bare string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):
        return raw


def _key_value(key: str, raw: str) -> Any:
    """A value given to ``key`` on the command line (``--set``, ``--filter``), as ``_parse_value``
    reads it. A boolean key also takes the labels' ``True``/``False``, so a value copied from a dry
    run's table works in both; another key's ``True`` stays the word it is."""
    spec = CASE_KEYS.get(key) or CAPTURE_KEYS.get(key)
    if spec is not None and spec.check is _bool and raw in ("True", "False"):
        return raw == "True"
    return _parse_value(raw)


def _read_set(assignment: str) -> tuple[tuple[str, ...], Any]:
    """One ``--set key=value`` as the path of the key it sets and the value: ``("steps",)``,
    ``("capture", KEY)`` or ``("workloads", NAME, KEY)``, NAME unquoted, so that two spellings of one
    key are one path. Refused when it is none of them or its value is not one."""
    key, sep, raw = (part.strip() for part in assignment.partition("="))
    if not sep or not key:
        raise SuiteError(f"--set {assignment}: expected KEY=VALUE")
    value = _key_value(key, raw)
    if isinstance(value, str) and raw[:1] in ("[", "{"):
        # Meant as a list or a table: taken for a word, ``[ddp]`` was refused as an odd algorithm name
        # inside a list, the missing quotes never said.
        kind = "list" if raw[0] == "[" else "table"
        raise SuiteError(
            f"--set {assignment}: not a TOML {kind}; write it as in a suite file, its strings quoted "
            """(--set 'algorithm=["ddp", "zero_no_overlap"]')"""
        )
    parts = key.split(".")
    workload = _workload_key(key)
    if workload:
        return ("workloads", *workload), value
    if len(parts) == 1 or (parts[0] == "capture" and len(parts) == 2):
        return tuple(parts), value
    raise SuiteError(f"--set {assignment}: expected KEY, capture.KEY or workloads.NAME.KEY")


def _apply_override(doc: dict[str, Any], assignment: str) -> None:
    """One ``--set key=value``: a swept key gets a new list, any other key a new default.

    ``capture.KEY`` and ``workloads.NAME.KEY`` reach those tables.
    """
    path, value = _read_set(assignment)
    key = path[-1]
    if path[0] == "workloads" and len(path) == 3:
        doc.setdefault("workloads", {}).setdefault(path[1], {})[key] = value
    elif path[0] == "capture" and len(path) == 2:
        doc.setdefault("capture", {})[key] = value
    elif key in doc.get("sweep", {}) or _sweeps(key, value):
        doc.setdefault("sweep", {})[key] = value if isinstance(value, list) else [value]
        doc.get("defaults", {}).pop(key, None)
    else:
        doc.setdefault("defaults", {})[key] = value


def _workload_key(key: str) -> tuple[str, str] | None:
    """``workloads.NAME.KEY`` as (NAME, KEY), or None. NAME may hold dots, as an import path does
    (``workloads.examples.own_model.bench:build.width``), and may be quoted as in TOML; KEY, a
    parameter name, cannot, so the last dot ends NAME."""
    if not key.startswith("workloads."):
        return None
    name, _, param = key.removeprefix("workloads.").rpartition(".")
    if len(name) >= 2 and name[0] == name[-1] and name[0] in "\"'":
        name = name[1:-1]
    return (name, param) if name and param else None


def _sweeps(key: str, value: Any) -> bool:
    """Whether a ``--set`` value is a list of values to sweep (for a list key: a list of lists)."""
    if key in LIST_KEYS:
        return isinstance(value, list) and bool(value) and all(isinstance(v, list) for v in value)
    return isinstance(value, list)


def override_note(assignments: Iterable[str]) -> str:
    """The comment lines that ``with_overrides`` appends to a suite's text, one per ``--set``, so that
    the text a run records says what ran; ``file_text`` takes them off again."""
    return "".join(f"\n# --set {a}" for a in assignments)


def file_text(recorded: str, assignments: Iterable[str]) -> str:
    """The suite file's own text, from the text a run recorded with these ``--set`` assignments: a
    resume given the file it was started from compares the file with this, not with the notes."""
    return recorded.removesuffix(override_note(assignments))


def with_overrides(suite: Suite, assignments: Iterable[str]) -> Suite:
    """The suite with ``--set`` overrides applied, validated again as a whole like the file itself."""
    assignments = list(assignments)
    if not assignments:
        return suite
    doc = tomllib.loads(suite.text)
    for a in assignments:
        _apply_override(doc, a)
    note = override_note(assignments)
    return dataclasses.replace(_validate(doc, f"{suite.path} (with --set)"), path=suite.path, text=suite.text + note)


def refuse_repeated_sets(assignments: Iterable[str]) -> None:
    """``SuiteError`` for a key ``--set`` twice to two values (``steps=5``, then ``steps=6``): applied in
    turn, the last won without a word, so a run measured a value the user may not have meant. The same
    value twice changes nothing and passes. Checked where a command takes ``--set`` (``sweep.prepare``),
    not in ``with_overrides``: a run stored before keeps loading as it ran. Keys are compared as
    ``--set`` reads them: ``workloads."gpt".n_layer`` is ``workloads.gpt.n_layer``."""
    seen: dict[tuple[str, ...], tuple[str, str]] = {}
    for a in assignments:
        path, parsed = _read_set(a)
        value = _set_text(parsed)
        if path in seen and seen[path][0] != value:
            key = a.partition("=")[0].strip()
            raise SuiteError(
                f"--set {a}: {key} is already set to {seen[path][0]} (--set {seen[path][1]}); give each key once"
            )
        seen.setdefault(path, (value, a))


def measured_overrides(assignments: Iterable[str]) -> dict[str, str]:
    """``--set`` assignments as key → value, for the keys that change what a case measures: one per
    key (the last, as ``with_overrides`` applies them), sorted, each value spelled alike however it
    was typed (``bucket_cap_mb = 4.0`` is ``bucket_cap_mb=4``). Budget keys, capture's included, are
    left out: runs that differ only in them measure the same cases (``identity``). ``export`` names a
    run's settings by them."""
    found: dict[str, str] = {}
    for a in assignments:
        key, _, raw = a.partition("=")
        key = key.strip()
        if key.removeprefix("capture.") not in BUDGET_KEYS:
            found[key] = _set_text(_key_value(key, raw.strip()))
    return dict(sorted(found.items()))


def _set_text(v: Any) -> str:
    """A ``--set`` value as the command line writes it (``value_text``), a list's items alike: [4, 8]."""
    return "[" + ", ".join(_set_text(x) for x in v) + "]" if isinstance(v, list) else value_text(v)


def _resolve_machine(raw: dict[str, Any], machine: Machine) -> dict[str, Any]:
    """Resolve "auto": the node's GPUs with NCCL when there are >= 2 of them, else 2 Gloo ranks on CPU."""
    multi_gpu = machine.gpus >= 2
    r = dict(raw)
    if r["device"] == "auto":
        r["device"] = "cuda" if multi_gpu else "cpu"
    if r["backend"] == "auto":
        r["backend"] = "nccl" if r["device"] == "cuda" and multi_gpu else "gloo"
    per_node = machine.gpus if r["device"] == "cuda" and multi_gpu else 2
    if r["world_size"] == "auto":
        r["world_size"] = (machine.nnodes or 1) * (machine.nproc_per_node or per_node)
    if r["ranks_per_node"] == "auto":
        # The real nodes: one machine for the local launcher, each torchrun agent's ranks under torchrun.
        r["ranks_per_node"] = r["world_size"] // (machine.nnodes or 1)
    return r


def expand(suite: Suite, machine: Machine | None = None) -> list[Case]:
    """The cartesian product of ``[sweep]`` over ``[defaults]``, resolved, checked, collapsed, deduplicated."""
    return expand_noting_unused(suite, machine)[0]


def expand_noting_unused(suite: Suite, machine: Machine | None = None) -> tuple[list[Case], list[str]]:
    """``expand``'s cases, and each ``[defaults]`` key collapsed in every one of them, with why:
    "[defaults] bucket_cap_mb = 4: no case uses it (bucket_cap_mb_list replaces it)". Such a value
    changes nothing, which the collapse alone would leave unsaid; it is warned of, not refused, as a
    shared ``[defaults]`` may serve a ``--set algorithm=...`` that uses it."""
    machine = machine or Machine.detect()
    path = suite.path
    base = {k: s.default for k, s in CASE_KEYS.items()} | suite.defaults | suite.capture
    keys = list(suite.sweep)
    combinations = math.prod(len(v) for v in suite.sweep.values())
    if machine.max_cases is not None and combinations > machine.max_cases:
        raise _fail(
            path,
            "[sweep]",
            f"expected at most {machine.max_cases} combinations, got {combinations} (--allow-large runs it anyway)",
        )
    swept_budget = [k for k in keys if k in BUDGET_KEYS]
    cases: dict[str, Case] = {}
    unused = {k: set[str]() for k in suite.defaults if k not in suite.sweep}  # key → why, while no case uses it
    for combo in itertools.product(*(suite.sweep[k] for k in keys)):
        raw = base | dict(zip(keys, combo))
        where = functools.partial(_where, suite, raw)
        algo = ALGORITHMS.get(raw["algorithm"])
        if algo is None:
            raise _fail(path, where("algorithm"), f"expected one of {', '.join(ALGORITHMS)}, got {raw['algorithm']!r}")
        r = _resolve_machine(raw, machine)
        _check_combination(path, r, machine, suite, where)
        workload_params = _workload_params(suite, r["workload"], r["batch_size"], where("workload"))
        why = {k: f"{algo.name} does not use it" for k in (ALGORITHM_SPECIFIC_KEYS - algo.uses) | algo.moot(r)}
        why |= {k: "it is for a comm_hook of one's own" for k in comm_hooks.moot(r)}
        why |= {k: "bucket_cap_mb_list replaces it" for k in _moot_bucketing(r)}
        if shards_by_node(r["workload"], dict(workload_params)):
            why.pop("ranks_per_node", None)  # the nodes the data is split by: DDP must train on the same split
        moot = why.keys()
        for k in [k for k in unused if k not in moot]:
            del unused[k]
        for k in unused:
            unused[k].add(why[k])
        for k in moot:
            r[k] = None
        r["workload_params"] = workload_params
        case = Case(**r)
        why = algo.check(case)
        if why:
            raise _fail(path, where(why[0]), f"{why[1]} (case {case.label(keys)})")
        case = dataclasses.replace(case, case_id=case_id(case, swept_budget))
        cases.setdefault(case.case_id, case)
    notes = [
        f"[defaults] {k} = {value_text(suite.defaults[k])}: no case uses it ({'; '.join(sorted(why))})"
        for k, why in unused.items()
    ]
    return list(cases.values()), notes


def _where(suite: Suite, raw: Mapping[str, Any], key: str) -> str:
    """A key that a case's combination refuses, named as the per-key checks name it: with the table
    its value comes from and, in ``[sweep]``, the value's index ("[sweep] world_size[1]"), so that a
    suite of many lists says which value is at fault. ``--set`` values are in those tables too (the
    suite's path then says "with --set"); a key neither table sets has its built-in default: bare."""
    if key in suite.sweep and raw.get(key) in suite.sweep[key]:
        return f"[sweep] {key}[{suite.sweep[key].index(raw[key])}]"
    return f"[defaults] {key}" if key in suite.defaults else key


def _moot_bucketing(r: dict[str, Any]) -> frozenset[str]:
    """``bucket_cap_mb`` when ``bucket_cap_mb_list`` is set: DDP ignores it then."""
    return frozenset({"bucket_cap_mb"}) if r["bucket_cap_mb_list"] is not None else frozenset()


def torch_version() -> tuple[int, int] | None:
    """The installed torch's (major, minor), read from its package metadata without importing it
    (validation stays torch-free); None when torch is not installed here."""
    from importlib import metadata

    try:
        major, minor = metadata.version("torch").split("+")[0].split(".")[:2]
        return int(major), int(minor)
    except (metadata.PackageNotFoundError, ValueError):
        return None


def params_of(name: str) -> type:
    """The ``Params`` of a built-in workload, or of a user's factory named by import path, which
    imports it (and so torch: a suite of built-in workloads validates without). Raises
    ``UserWorkloadError`` saying what was expected."""
    if is_import_path(name):
        from tpbench.workloads import resolve

        return resolve(name).Params
    if name not in PARAMS:
        raise unknown(name)
    return PARAMS[name]


@functools.cache
def _checked_workload(
    path: str, name: str, table: tuple[tuple[str, Any], ...], batch_size: int, key: str
) -> tuple[tuple[str, Any], ...]:
    """``key``: the workload key as its errors name it (``_where``)."""
    try:
        params_cls = params_of(name)
    except UserWorkloadError as e:
        raise _fail(path, key, str(e)) from None
    where = f"[{_workload_table(name)}]"
    try:
        params = params_cls(**dict(table))
    except ValueError as e:
        raise _fail(path, where, str(e)) from None
    if is_import_path(name):
        from tpbench.workloads import imported, resolve

        try:
            imported.check(resolve(name), params, batch_size)
        except UserWorkloadError as e:
            raise _fail(path, where if table else key, str(e)) from None
    return tuple(sorted(dataclasses.asdict(params).items()))


def _workload_params(suite: Suite, name: str, batch_size: int, key: str) -> tuple[tuple[str, Any], ...]:
    """The case's resolved workload parameters; a user's factory is also called once on the meta
    device (see ``tpbench.workloads.imported``), once per distinct (workload, parameters)."""
    table = tuple(sorted(suite.workloads.get(name, {}).items()))
    return _checked_workload(suite.path, name, table, batch_size, key)


def _check_combination(
    path: str, r: dict[str, Any], machine: Machine, suite: Suite, where: Callable[[str], str]
) -> None:
    """A resolved case's keys checked against each other and the machine; each refusal names the
    key at fault as ``where`` does (``_where``)."""
    if r["device"] == "cuda" and machine.gpus == 0:
        raise _fail(path, where("device"), 'expected a machine with CUDA GPUs for device = "cuda"; this one has none')
    if r["backend"] == "nccl" and r["device"] != "cuda":
        raise _fail(path, where("backend"), 'expected device = "cuda" with backend = "nccl"')
    if machine.nnodes is not None:
        _check_torchrun_layout(path, r, machine, where)
    elif r["backend"] == "nccl" and r["world_size"] > machine.gpus:
        raise _fail(
            path,
            where("world_size"),
            f"expected at most {machine.gpus} NCCL ranks (one per GPU), got {r['world_size']}",
        )
    elif machine.max_ranks is not None and r["world_size"] > machine.max_ranks:
        raise _fail(
            path,
            where("world_size"),
            f"expected at most {machine.max_ranks} ranks on this machine ({machine.capacity}: "
            f"{RANKS_PER_CORE} per core, {MB_PER_RANK} MiB each), got {r['world_size']} (--allow-large runs it anyway)",
        )
    if r["world_size"] % r["ranks_per_node"] != 0:
        raise _fail(
            path,
            where("ranks_per_node"),
            f"expected a divisor of world_size {r['world_size']}, got {r['ranks_per_node']}",
        )
    if r["bucket_cap_mb_list"] is not None and (torch_version() or (0, 0)) < BUCKET_CAP_MB_LIST_TORCH:
        have = ".".join(map(str, torch_version() or ())) or "none"
        need = ".".join(map(str, BUCKET_CAP_MB_LIST_TORCH))
        raise _fail(
            path,
            where("bucket_cap_mb_list"),
            f"expected torch >= {need}, whose DistributedDataParallel takes a cap per bucket; the installed torch is "
            f'{have} (use bucket_cap_mb, or bucket_cap_mb = "{DDP_DEFAULT}" for DDP\'s 1 MB first bucket)',
        )
    _check_eval_every(path, r, where)
    if r["slowdown_pct"] and r["warmup_steps"] < 1:
        raise _fail(
            path, where("slowdown_pct"), "expected warmup_steps >= 1: the delay is calibrated on the warm-up steps"
        )
    if comm_hooks.is_import_path(r["comm_hook"]) and r["warmup_steps"] < 1:
        raise _fail(
            path,
            where("comm_hook"),
            "a hook of your own needs warmup_steps >= 1: the first warm-up step checks that it reduced the "
            "gradients across the ranks",
        )
    if r["slowdown_ranks"] != "all" and max(r["slowdown_ranks"]) >= r["world_size"]:
        raise _fail(
            path,
            where("slowdown_ranks"),
            f"expected ranks < world_size {r['world_size']}, got {r['slowdown_ranks']}",
        )
    fault = r["fault"]
    if fault != "none":
        kind, _, rank = fault.partition(":")
        if kind not in FAULTS or not rank.isdigit() or int(rank) >= r["world_size"]:
            expected = f'"none" or KIND:RANK (KIND {"/".join(FAULTS)}) with RANK < world_size'
            raise _fail(path, where("fault"), f"expected {expected}, got {fault!r}")
    from tpbench.interconnect import resolve

    try:
        ic = resolve(r["interconnect"], suite.interconnects)
    except ValueError as e:
        raise _fail(path, where("interconnect"), str(e)) from None
    if ic.backend != r["backend"]:
        raise _fail(
            path,
            where("interconnect"),
            f"profile {ic.name!r} is for backend {ic.backend}, but the case uses {r['backend']}",
        )


def _check_eval_every(path: str, r: dict[str, Any], where: Callable[[str], str]) -> None:
    """A held-out evaluation interval longer than the steps a repeat trains (warm-up and timed, counted
    from the first) evaluates nothing: the run would have no loss curve, no time to target and no
    convergence verdict, the report only saying none was evaluated, as though eval_every were 0."""
    every, trained = r["eval_every"], r["warmup_steps"] + r["steps"]
    if every > trained:
        raise _fail(
            path,
            where("eval_every"),
            f"expected 0 (never) or at most {trained} (warmup_steps {r['warmup_steps']} + steps {r['steps']}): "
            f"a repeat trains {trained} steps, so no held-out loss would ever be evaluated, got {every}",
        )


def _check_torchrun_layout(path: str, r: dict[str, Any], machine: Machine, where: Callable[[str], str]) -> None:
    """Under torchrun a world is nnodes x nproc_per_node ranks, whatever the suite says: a case
    that asks for another size, or for node subgroups that span machines, is refused here."""
    nnodes, world_size = machine.nnodes, r["world_size"]
    if machine.nproc_per_node is not None and world_size != nnodes * machine.nproc_per_node:
        raise _fail(
            path,
            where("world_size"),
            f'expected "auto" or {nnodes * machine.nproc_per_node} '
            f"(--nnodes {nnodes} x --nproc-per-node {machine.nproc_per_node}) under torchrun, got {world_size}",
        )
    if world_size % nnodes != 0:
        raise _fail(
            path, where("world_size"), f"expected a multiple of --nnodes {nnodes} under torchrun, got {world_size}"
        )
    per_node = world_size // nnodes
    if r["backend"] == "nccl" and per_node > machine.gpus:
        raise _fail(
            path,
            where("world_size"),
            f"expected at most {machine.gpus} NCCL ranks per node (one per GPU), got {per_node}",
        )
    if per_node % r["ranks_per_node"] != 0:
        raise _fail(
            path,
            where("ranks_per_node"),
            f'expected "auto" or a divisor of the {per_node} ranks per node under torchrun '
            f"(a node subgroup cannot span machines), got {r['ranks_per_node']}",
        )


def identity(params: Mapping[str, Any]) -> dict[str, Any]:
    """What a case measures: its parameters in canonical form (``25.0`` is ``25``) less the budget
    keys, the id, and keys added later at their old behaviour (``ADDED_KEYS``). Two cases of any
    two runs measure the same thing when their identities agree (on the keys both have: a key
    added by a newer tpbench must not orphan every stored case)."""
    specs = CASE_KEYS | CAPTURE_KEYS
    return {
        k: canonical(specs[k].default, v) if k in specs else v
        for k, v in params.items()
        if k not in BUDGET_KEYS and k != "case_id" and not (k in ADDED_KEYS and _old_behaviour(k, v))
    }


def _old_behaviour(key: str, value: Any) -> bool:
    """Whether an added key's value is what cases ran before the key existed."""
    return value == ADDED_KEYS[key] or (value is None and key in ADDED_ALGORITHM_KEYS)


def case_id(case: Case, budget: Iterable[str] = ()) -> str:
    """A stable id: a hash of the case's identity and of the ``budget`` keys named (those a suite
    sweeps, which make cases of one run that measure the same thing under different budgets)."""
    params = case.params()
    d = identity(params) | {k: params[k] for k in budget}
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def varying_keys(cases: list[Case]) -> list[str]:
    """The case keys with two or more values among the cases (collapsed ``None`` aside), in schema
    order: what a label should show."""
    if not cases:
        return []
    params = [c.params() for c in cases]
    return [
        k for k in params[0] if k != "case_id" and len({json.dumps(p[k]) for p in params if p.get(k) is not None}) > 1
    ]


def shown_keys(runs: list[list[Case]]) -> list[str]:
    """The keys that tell the cases of several runs apart: those that vary among them, budget keys
    only where they vary within a run (a run of 5 repeats against one of 3 is the same cases)."""
    within = {k for cases in runs for k in varying_keys(cases)}
    return [k for k in varying_keys([c for cases in runs for c in cases]) if k not in BUDGET_KEYS or k in within]


def labels(runs: list[list[Case]]) -> list[dict[str, str]]:
    """The one labelling of cases, used by the CLI's tables, the report, the gate and the exports:
    per run, case id → the algorithm (with ``[torch]`` for PyTorch's own hook) and the values of
    the keys that vary among all the cases given. A budget key is shown only where it varies
    within a run, so runs that differ only in ``repeats`` label their cases alike. Cases of one run
    that a label cannot tell apart (they differ in workload parameters) get their id appended."""
    keys = [k for k in shown_keys(runs) if k != "impl"]
    out = []
    for cases in runs:
        named = {c.case_id: c.label(keys) for c in cases}
        count = collections.Counter(named.values())
        out.append({cid: f"{name} ({cid})" if count[name] > 1 else name for cid, name in named.items()})
    return out


def select(cases: list[Case], filters: Iterable[str], *, where: str | None = None) -> list[Case]:
    """Keep cases matching every filter. A filter is ``key=v1|v2`` or ``key!=v``; ``id=PREFIX`` matches case ids.

    With ``where`` (the suite's path), an unknown key is said after it, as ``--set``'s is; filters
    that leave no case are an error naming the first
    that did and the values the cases before it had: a typo in a value reads as such, not as an
    empty suite. So is a ``key!=v`` that excludes nothing (``algorithm!=zero_no_overlp``): it would
    run every case it was meant to drop. And
    so is one value of several that no case has (``algorithm=ddp|zero_no_overlp``): the filter keeps
    cases, so the typo would go unseen and the cases it names would silently be left out."""
    out, filters = cases, list(filters)
    for f in filters:
        neg = "!=" in f
        key, _, raw = f.partition("!=" if neg else "=")
        key = key.strip()
        if not raw or not key:
            raise SuiteError(f"--filter {f}: expected KEY=VALUE[|VALUE...] or KEY!=VALUE")
        wanted = [w.strip() for w in raw.split("|")]
        if key != "id":
            wanted = [value_text(_key_value(key, w)) for w in wanted]  # 25.0 matches 25, as in the suite
        if key != "id" and key not in CASE_KEYS and key not in CAPTURE_KEYS:
            named = f"{where}: --filter {f}" if where is not None else f"--filter {f}"
            raise SuiteError(f"{named}: {_unknown('key', key, ['id', *CASE_KEYS])}")
        kept = [c for c in out if _matches(c, key, wanted) != neg]
        if where is not None and out:
            before = " the filters before it left" if f != filters[0] else ""
            unmatched = [w for w in wanted if not any(_matches(c, key, [w]) for c in out)]
            if not kept or (neg and len(kept) == len(out)):
                what = "no case has that value, so it excludes nothing" if kept else "no case matches"
                raise SuiteError(f"{where}: --filter {f}: {what}; {_values_had(out, key, before)}")
            if unmatched:
                what = f"no case has {key} {' | '.join(unmatched)} (each value must match a case)"
                raise SuiteError(f"{where}: --filter {f}: {what}; {_values_had(out, key, before)}")
        out = kept
    return out


def _values_had(cases: list[Case], key: str, before: str) -> str:
    """The values of ``key`` among ``cases``, as a filter writes them, for the error of a filter that
    kept none. A key collapsed for a case's algorithm holds ``None``, which no suite sets: it is said
    apart, with the filter that keeps those cases, rather than listed as a value the suite swept."""
    values = [c.case_id if key == "id" else getattr(c, key) for c in cases]
    had = list(dict.fromkeys(value_text(v) for v in values if v is not None))
    moot = sum(v is None for v in values)
    collapsed = f"collapsed: --filter {key}={value_text(None)} keeps them"
    if not had:
        return f"{key} does not apply to any of the {len(cases)} case(s){before} ({collapsed})"
    shown = " | ".join(had[:12]) + (f" … ({len(had)} in all)" if len(had) > 12 else "")
    where_moot = f", or none where it does not apply ({moot}, {collapsed})" if moot else ""
    return f"the {len(cases)} case(s){before} have {key} {shown}{where_moot}"


def _matches(case: Case, key: str, wanted: list[str]) -> bool:
    """Whether ``case`` has one of the ``wanted`` values of ``key`` (``id``: one of the id prefixes)."""
    if key == "id":
        return any(case.case_id.startswith(w) for w in wanted)
    return value_text(getattr(case, key)) in wanted


def value_text(v: Any) -> str:
    """A parameter value as the command line writes it (true, 25 for 25.0): how ``--filter`` matches."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def ran_together(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two cases of one run (stored parameters) shared a world, and so ran round by round:
    repeat i of each in round i, next to each other in time (``launch.interleave``)."""
    return Case.world_of(a) == Case.world_of(b)
