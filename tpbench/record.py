"""The record of a run: what run.json holds, as frozen dataclasses with a schema version.

run.json is written by one process (the sweep's, through ``store.Run``) and read by every later
stage (report, compare, gate, export, whatif, resume, tune). Readers get a ``RunRecord`` rather
than the raw dict, so a key is spelled once, here: its cases (``CaseRecord``, whose ``case`` is the
``Case`` it ran, and what its capture saw), its worlds, launcher, efficiency and adaptive phase,
each typed. Older runs keep loading: ``migrate`` is the one place that brings a stored run.json to
today's layout, and every sub-record reads a key it does not find as its default.

``schema_version`` is written into run.json and into summary.parquet's metadata; a reader refuses
a version it does not know (a newer tpbench wrote it) instead of misreading it. Version history:

- 0: run.json without ``schema_version`` (tpbench before the record had one). Its layout is
  version 1's; ``migrate`` only adds the version. Its case ids were hashed from more keys (budget
  keys included), which is why runs are matched by ``suite.identity`` and never by stored id.
- 1: ``schema_version`` in run.json and summary.parquet.

Within a version, keys added to a case since results existed (``ADDED_KEYS``) are given their old
behaviour by ``migrate``.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from tpbench import comm_hooks
from tpbench.algorithms import ALGORITHMS, display_name, named_keys

SCHEMA_VERSION = 1
KNOWN_VERSIONS = (0, 1)

# Case states in run.json.
PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
CASE_STATES = (PENDING, RUNNING, DONE, FAILED)
# Run states in run.json: running (a run is RUNNING as its cases are), interrupted, printed (a
# torchrun plan printed with --print), and complete or complete_with_failures once the summary is
# written.
INTERRUPTED, PRINTED, COMPLETE, COMPLETE_WITH_FAILURES = "interrupted", "printed", "complete", "complete_with_failures"
RUN_STATES = (RUNNING, INTERRUPTED, PRINTED, COMPLETE, COMPLETE_WITH_FAILURES)
FINISHED = (COMPLETE, COMPLETE_WITH_FAILURES)
# What a case's capture leaves in its entry (``Capture``): telemetry, clock offsets, observed
# transport, how its trace window went.
CAPTURED_KEYS = ("nvml", "clock_sync", "observed_transport", "trace")

# Keys added after results existed, with the value that is the behaviour before them: at it they
# stay out of the identity (``suite.identity``), so the cases of earlier runs compare with new runs
# case by case, and a stored case without them reads as having it (``migrate``).
ADDED_KEYS: dict[str, Any] = {
    "comm_hook": comm_hooks.ALLREDUCE,
    "comm_hook_state": None,
    "slowdown_kind": "sleep",
    "slowdown_ranks": "all",
    "parameters_as_bucket_view": False,
    "bucket_cap_mb_list": None,
    "trace_windows": 1,
    "passes": 1,
    "find_unused_parameters": False,
}
# Added keys that only some algorithms use: collapsed (None) for the others, which had no such key
# before either, so there None is the old behaviour too.
ADDED_ALGORITHM_KEYS = frozenset({"parameters_as_bucket_view"})


def version_problem(version: Any) -> str | None:
    """Why this tpbench cannot read a record of this schema version, or None. Only an integer above
    the versions it knows is said to come from a newer tpbench: "1" or null is no tpbench's writing
    (an edited or damaged file), and "upgrade tpbench" would send its user the wrong way."""
    # In words: version 0 stands for a record written before versions were (an unversioned run reads
    # as version 1), so "(0, 1)" told its user of a version no tpbench writes.
    written = " or ".join(str(v) for v in KNOWN_VERSIONS if v)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        return (
            f"schema_version {version!r} is not a version (expected the integer {written}, or no schema_version "
            "at all): a damaged record"
        )
    if version not in KNOWN_VERSIONS:
        return (
            f"schema_version {version!r} is not one this tpbench reads ({written}, or none); a newer tpbench "
            "wrote it: upgrade tpbench to read it"
        )
    return None


def migrate(meta: Any) -> Any:
    """A parsed run.json of a known version in today's layout: version 0 gets its version, every
    case the keys added since it ran, at their old behaviour. Anything not shaped like a run.json
    is returned as it is, for the store's shape check to name."""
    if not isinstance(meta, dict):
        return meta
    if meta.get("schema_version", 0) == 0:
        meta = meta | {"schema_version": SCHEMA_VERSION}
    if isinstance(meta.get("cases"), dict):
        for entry in meta["cases"].values():
            if isinstance(entry, dict) and isinstance(entry.get("params"), dict):
                _add_keys(entry["params"])
    return meta


def _add_keys(params: dict[str, Any]) -> None:
    algorithm = ALGORITHMS.get(params.get("algorithm"))
    for key, value in ADDED_KEYS.items():
        # An algorithm-specific key the case's algorithm does not use is collapsed, as the suite does.
        unused = key in ADDED_ALGORITHM_KEYS and (algorithm is None or key not in algorithm.uses)
        params.setdefault(key, None if unused else value)


def _frozen(d: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(d or {}))


def _no_entries() -> Mapping[str, Any]:
    return MappingProxyType({})


def _plain(value: Any) -> Any:
    """``json.dumps``'s fallback for what a record holds: read-only mappings, sub-records."""
    if isinstance(value, MappingProxyType):
        return dict(value)
    if isinstance(value, _Entry):
        return value.to_json()
    raise TypeError(f"{type(value).__name__} is not JSON")


class _Entry:
    """A sub-record of run.json: read from its JSON object, a missing key as the field's default
    (runs written before the key existed), and written back the same way."""

    @classmethod
    def from_json(cls, entry: Mapping[str, Any] | None) -> Any:
        """Keys this tpbench does not know are left out; a null where the field takes none reads
        as the default."""
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return cls(
            **{
                k: _field_value(str(fields[k].type), v)
                for k, v in (entry or {}).items()
                if k in fields and (v is not None or "None" in str(fields[k].type))
            }
        )

    def to_json(self) -> dict[str, Any]:
        """As run.json holds it: fields that are None left out, sequences as lists."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        return json.loads(json.dumps({k: v for k, v in values.items() if v is not None}, default=_plain))


def _field_value(kind: str, value: Any) -> Any:
    """A JSON value as a frozen field of type ``kind`` holds it (the annotation as written: this
    module's annotations are strings): objects read-only, lists as tuples."""
    if value is None:
        return None
    if kind.startswith("Mapping"):
        return _frozen(value)
    if kind.startswith("tuple") and isinstance(value, list):
        return tuple(tuple(v) if kind.startswith("tuple[tuple") and isinstance(v, list) else v for v in value)
    return value


@dataclass(frozen=True)
class Telemetry(_Entry):
    """A case's NVML record (``capture.case_info``): whether any rank sampled, why not, the
    interval asked, the samples' file, each rank's figures."""

    available: bool = False
    reason: str | None = None
    interval_ms: int | None = None
    file: str | None = None
    ranks: Mapping[str, Any] = field(default_factory=_no_entries)


@dataclass(frozen=True)
class ObservedTransport(_Entry):
    """The transport a case's ranks really used, judged against the profile asked
    (``capture.transport.summarize``): Gloo's ``interfaces``, NCCL's ``transports`` and ``nnodes``,
    what was ``expected``, ``mismatch`` (None: not judged) and why."""

    asked: str | None = None
    backend: str | None = None
    ranks: Mapping[str, Any] = field(default_factory=_no_entries)
    interfaces: tuple[str, ...] = ()
    transports: tuple[str, ...] = ()
    expected: tuple[str, ...] | None = None
    nnodes: int | str | None = None
    mismatch: bool | None = None
    reason: str | None = None


@dataclass(frozen=True)
class TraceWindow(_Entry):
    """How a case's trace window went (``capture.retrace``): the windows traced, the one kept
    (from 0), and per window the speeds of the forward pass, the step and the training thread's CPU
    time per step (its work without its waits: what the tracer adds to it shows whatever the
    link), each the timed median over the traced one on the slowest rank (None where not measured:
    GPU ranks, whose host clock times kernel launches; no thread speeds in runs from before they
    were recorded)."""

    windows: int = 1
    kept: int = 0
    forward_speed: tuple[float | None, ...] = ()
    step_speed: tuple[float | None, ...] = ()
    thread_speed: tuple[float | None, ...] = ()


@dataclass(frozen=True)
class Capture(_Entry):
    """What a case's capture recorded: telemetry, each rank's clock offsets (rank → the
    ``capture.nvml.ClockSync`` fields, None for a rank without a trace), the observed transport and
    the trace window. None: not recorded (the case never finished, no interconnect was judged, or
    a run from before trace windows were recorded)."""

    nvml: Telemetry | None = None
    clock_sync: Mapping[str, Any] = field(default_factory=_no_entries)
    observed_transport: ObservedTransport | None = None
    trace: TraceWindow | None = None

    @classmethod
    def from_json(cls, entry: Mapping[str, Any] | None) -> Capture:
        entry = entry or {}
        return cls(
            Telemetry.from_json(entry["nvml"]) if entry.get("nvml") is not None else None,
            _frozen(entry.get("clock_sync")),
            ObservedTransport.from_json(entry["observed_transport"]) if entry.get("observed_transport") else None,
            TraceWindow.from_json(entry["trace"]) if entry.get("trace") else None,
        )


@dataclass(frozen=True)
class WorldRecord(_Entry):
    """One launched world (``launch``): its name, launch key (world size, backend, device,
    interconnect), the (case, repeat) items it ran in order, when it started, how (``launcher``),
    what was done against noise, and for a printed world (``--print``) whether its events were read
    back; under torchrun the nodes and ranks it really ran on; in a sweep of several passes
    (``Case.passes``) the pass it ran, from 1."""

    world: str = ""
    key: tuple[Any, ...] = ()
    items: int = 0
    schedule: tuple[tuple[Any, ...], ...] = ()
    started: float | None = None
    launcher: str = "local"
    noise_controls: Mapping[str, Any] = field(default_factory=_no_entries)
    printed: bool = False
    ingested: float | None = None
    nodes: tuple[Mapping[str, Any], ...] = ()
    sweep_pass: int | None = None

    @property
    def world_size(self) -> int:
        return int(self.key[0])


@dataclass(frozen=True)
class LauncherRecord:
    """How a run's worlds are started, so that ``--resume`` starts them the same way: ``local``,
    or ``torchrun`` with the ``worlds.Torchrun`` fields in ``options``."""

    name: str = "local"
    options: Mapping[str, Any] = field(default_factory=_no_entries)

    @classmethod
    def from_json(cls, entry: Mapping[str, Any] | None) -> LauncherRecord:
        entry = dict(entry or {"name": "local"})
        return cls(entry.pop("name", "local"), _frozen(entry))


@dataclass(frozen=True)
class Efficiency(_Entry):
    """The sweep's accounting of its wall time, written when it finished (``sweep.finalize``).

    ``wall_s``, ``worlds_started`` and ``processes_started`` are the worlds tpbench started and
    clocked itself; ``processes_by_hand`` the ranks of worlds the user started from the commands
    ``--print`` printed, whose time no tpbench saw (``timed_share`` is then None: their timed steps
    are in ``timed_s`` but their running is not in ``wall_s``)."""

    wall_s: float | None = None
    timed_s: float = 0.0
    timed_share: float | None = None
    worlds_started: int = 0
    processes_started: int | None = None
    processes_by_hand: int = 0

    def worlds_text(self) -> str:
        """The seconds spent running worlds, as the sweep's closing line and the report say them:
        "16.2 s running worlds", or where some were started by hand "0.4 s running tpbench's worlds",
        since the time of those was not counted; "" where tpbench ran none: its 0.0 s is not theirs."""
        if not self.processes_by_hand:
            return f"{self.wall_s or 0.0:.1f} s running worlds"
        return f"{self.wall_s or 0.0:.1f} s running tpbench's worlds" if self.processes_started else ""

    def started_text(self) -> str:
        """Who started the run's rank processes: "2 rank processes started"; with worlds started by
        hand from ``--print``'s commands, those apart, "2 rank processes started by hand from the
        printed commands, none by tpbench": counted as its own, they read as if tpbench had started
        them and run their worlds in no time."""
        own = self.processes_started or 0
        if not self.processes_by_hand:
            return f"{_processes(own)} started"
        by_hand = f"{_processes(self.processes_by_hand)} started by hand from the printed commands"
        return f"{by_hand}, none by tpbench" if not own else f"{_processes(own)} started by tpbench, {by_hand}"


def _processes(n: int) -> str:
    """ "1 rank process", "2 rank processes"."""
    return f"{n} rank process{'es' if n != 1 else ''}"


@dataclass(frozen=True)
class Adaptive(_Entry):
    """What an adaptive sweep (``--target-ci``, ``sweep.start_adaptive``) did after its planned
    repeats: its target and budget, where it stands (``state``), each case's planned repeats, its
    batches, and once it ended the half-widths before and after, the repeats added and the wall
    time spent."""

    target_ci: float | None = None
    budget_s: float | None = None
    state: str | None = None
    planned_repeats: Mapping[str, int] = field(default_factory=_no_entries)
    batches: tuple[Mapping[str, Any], ...] = ()
    half_widths_before: tuple[Mapping[str, Any], ...] | None = None
    half_widths_after: tuple[Mapping[str, Any], ...] | None = None
    rounds_added: Mapping[str, int] | None = None
    wall_s: float | None = None


@dataclass(frozen=True)
class SuiteSource:
    """The suite file a run was started from, kept whole so that a resume runs the same suite, and
    the ``--set`` and ``--filter`` it was started with, so that a command the run tells the user to
    run (``tpbench tune``'s next step) races the same settings (none in a run.json from before)."""

    name: str
    path: str | None
    text: str
    description: str | None = None
    overrides: tuple[str, ...] = ()
    filters: tuple[str, ...] = ()

    @property
    def command_path(self) -> str:
        """The suite file to name in a command the user is told to run: its path, else its name (a
        run.json from before runs kept the path)."""
        return self.path or self.name + ".toml"


@dataclass(frozen=True)
class Case:
    """One fully resolved configuration to measure. Built only by ``suite.expand`` (and read back
    from run.json and plans by ``from_params``); defined here, below the suite, because it is what
    a run records of each case and the keys added since results existed are its defaults."""

    algorithm: str
    impl: str | None
    world_size: int
    backend: str
    device: str
    workload: str
    optimizer: str
    lr: float
    batch_size: int
    warmup_steps: int
    steps: int
    repeats: int
    seed: int
    timeout_s: float
    bucket_cap_mb: float | str | None
    gradient_as_bucket_view: bool
    static_graph: bool
    shard_buckets: bool | None
    interconnect: str
    start_localSGD_iter: int | str | None
    post_local_gradient_allreduce: bool | None
    averaging_period: int | None
    ranks_per_node: int | None
    eval_every: int
    slowdown_pct: float
    fault: str
    profiler_steps: int
    nvml_interval_ms: int
    workload_params: tuple[tuple[str, Any], ...] = ()
    # Defaults: what runs recorded before these keys existed ran (``ADDED_KEYS``).
    comm_hook: str = ADDED_KEYS["comm_hook"]
    comm_hook_state: str | None = ADDED_KEYS["comm_hook_state"]
    slowdown_kind: str = ADDED_KEYS["slowdown_kind"]
    slowdown_ranks: str | list[int] = ADDED_KEYS["slowdown_ranks"]
    parameters_as_bucket_view: bool | None = ADDED_KEYS["parameters_as_bucket_view"]
    bucket_cap_mb_list: list[float] | None = ADDED_KEYS["bucket_cap_mb_list"]
    trace_windows: int = ADDED_KEYS["trace_windows"]
    passes: int = ADDED_KEYS["passes"]
    find_unused_parameters: bool = ADDED_KEYS["find_unused_parameters"]
    case_id: str = ""

    def params(self) -> dict[str, Any]:
        """The case as a flat, JSON-friendly dict (workload params as ``workload.KEY``)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "workload_params"}
        d.update({f"workload.{k}": v for k, v in self.workload_params})
        return d

    @classmethod
    def from_params(cls, d: Mapping[str, Any]) -> Case:
        """Inverse of ``params`` (used to read cases back from run.json and plans)."""
        names = {f.name for f in dataclasses.fields(cls)}
        wl = tuple(sorted((k.split(".", 1)[1], v) for k, v in d.items() if k.startswith("workload.")))
        return cls(**{k: v for k, v in d.items() if k in names}, workload_params=wl)

    @property
    def launch_key(self) -> tuple[int, str, str, str]:
        """Cases with the same key share one world of rank processes."""
        return (self.world_size, self.backend, self.device, self.interconnect)

    @classmethod
    def world_of(cls, params: Mapping[str, Any]) -> tuple[int, str, str, str]:
        """``launch_key`` from a case's stored parameters."""
        return (params["world_size"], params["backend"], params["device"], params["interconnect"])

    def label(self, varying: Iterable[str] = ()) -> str:
        """A short human name: the algorithm (``algorithms.display_name``) plus the values of the keys that
        vary in the suite."""
        name = display_name(self.params())
        parts, said = [name], named_keys(name) | {"algorithm"}
        for k in varying:
            v = getattr(self, k, None)
            if k not in said and v is not None:
                parts.append(f"{k}={label_value(v)}")
        return " ".join(parts)


def label_value(v: Any) -> str:
    """A parameter value as case labels write it, wherever the value comes from: a bool as Python
    spells it (shard_buckets=True), a whole float as an integer (bucket_cap_mb=4), since a stored
    column of 0.5 and 4 MB holds 4.0 where the suite said 4. ``suite.value_text`` is the other
    spelling, the command line's (``--filter shard_buckets=true``)."""
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


@dataclass(frozen=True)
class CaseRecord:
    """One case of a run: its parameters (``Case.params``), where it stands, why it failed, how
    many repeats it ran when a lockstep gate cut it short (``repeats_run``), and what its capture
    recorded."""

    case_id: str
    params: Mapping[str, Any]
    status: str
    error: str | None = None
    detail: str | None = None
    failed_at: float | None = None
    capture: Capture = field(default_factory=Capture)
    repeats_run: int | None = None

    @classmethod
    def from_json(cls, case_id: str, entry: Mapping[str, Any]) -> CaseRecord:
        return cls(
            case_id,
            _frozen(entry["params"]),
            entry["status"],
            entry.get("error"),
            entry.get("detail"),
            entry.get("failed_at"),
            Capture.from_json(entry),
            entry.get("repeats_run"),
        )

    @property
    def case(self) -> Case:
        """The case as it ran (its stored parameters back as a ``Case``)."""
        return Case.from_params(self.params)


@dataclass(frozen=True)
class RunRecord:
    """A run's run.json, read back and migrated to ``SCHEMA_VERSION``.

    ``environment`` is the fingerprint of ``environment.fingerprint`` (``nodes`` added when the
    world reported them); ``worlds`` the launched worlds in order; ``wall_s`` the time spent
    running them; ``efficiency`` the sweep's accounting of its wall time, written when it finished
    (None before); ``adaptive`` what an adaptive sweep (``--target-ci``) did after its planned
    repeats (None: not adaptive).
    """

    schema_version: int
    run_id: str
    suite: SuiteSource
    created: str | None
    status: str | None
    environment: Mapping[str, Any]
    cases: Mapping[str, CaseRecord]
    launcher: LauncherRecord
    worlds: tuple[WorldRecord, ...]
    efficiency: Efficiency | None
    wall_s: float | None
    adaptive: Adaptive | None = None

    @classmethod
    def from_json(cls, meta: Mapping[str, Any]) -> RunRecord:
        """From a run.json already checked for shape (``store.read_run_json``)."""
        meta = migrate(dict(meta))
        suite = meta["suite"]
        return cls(
            meta["schema_version"],
            meta["run_id"],
            SuiteSource(
                suite["name"],
                suite.get("path"),
                suite["text"],
                suite.get("description"),
                tuple(suite.get("set", ())),
                tuple(suite.get("filter", ())),
            ),
            meta.get("created"),
            meta.get("status"),
            _frozen(meta["environment"]),
            MappingProxyType({cid: CaseRecord.from_json(cid, e) for cid, e in meta["cases"].items()}),
            LauncherRecord.from_json(meta.get("launcher")),
            tuple(WorldRecord.from_json(w) for w in meta.get("worlds", [])),
            Efficiency.from_json(meta["efficiency"]) if meta.get("efficiency") else None,
            meta.get("wall_s"),
            Adaptive.from_json(meta["adaptive"]) if meta.get("adaptive") else None,
        )

    @property
    def finished(self) -> bool:
        """Whether the run's summary was written (``COMPLETE`` or ``COMPLETE_WITH_FAILURES``)."""
        return self.status in FINISHED

    def planned_params(self, case_id: str) -> dict[str, Any]:
        """A case's parameters with ``repeats`` as the suite planned them: an adaptive sweep raises
        some cases' repeats (``adaptive.planned_repeats``), which does not make them other cases."""
        params = dict(self.cases[case_id].params)
        planned = self.adaptive.planned_repeats if self.adaptive else {}
        return params | {"repeats": planned.get(case_id, params["repeats"])}

    def suite_table(self, table: str) -> dict[str, Any]:
        """One table of the suite file the run was started from (``suite``, ``interconnects``, ...),
        read back from its text; empty when the suite has no such table."""
        try:
            return tomllib.loads(self.suite.text).get(table, {})
        except tomllib.TOMLDecodeError:
            return {}
