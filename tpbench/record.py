"""The record of a run: what run.json holds, as frozen dataclasses with a schema version.

run.json is written by one process (the sweep's, through ``store.Run``) and read by every later
stage (report, compare, gate, export, whatif, resume). Readers get a ``RunRecord`` rather than the
raw dict, so a key is spelled once, here. ``schema_version`` is written into run.json and into
summary.parquet's metadata; a reader refuses a version it does not know (a newer tpbench wrote
it) instead of misreading it. Version history:

- 0: run.json without ``schema_version`` (tpbench before the record had one). Its layout is
  version 1's; ``migrate`` only adds the version. Its case ids were hashed from more keys (budget
  keys included), which is why runs are matched by ``suite.identity`` and never by stored id.
- 1: ``schema_version`` in run.json and summary.parquet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

import tomllib

SCHEMA_VERSION = 1
KNOWN_VERSIONS = (0, 1)

# Case states in run.json.
PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
CASE_STATES = (PENDING, RUNNING, DONE, FAILED)
# What a case's capture left in its entry (telemetry summary, clock offsets, observed transport).
CAPTURE_KEYS = ("nvml", "clock_sync", "transport", "observed_transport")


def version_problem(version: Any) -> str | None:
    """Why this tpbench cannot read a record of this schema version, or None."""
    if isinstance(version, bool) or not isinstance(version, int) or version not in KNOWN_VERSIONS:
        return (
            f"schema_version {version!r} is not one this tpbench reads "
            f"({', '.join(map(str, KNOWN_VERSIONS))}); a newer tpbench wrote it: upgrade tpbench to read it"
        )
    return None


def migrate(meta: dict[str, Any]) -> dict[str, Any]:
    """A run.json of a known older version in today's layout (version 0 differs only by the key)."""
    return meta | {"schema_version": SCHEMA_VERSION} if meta.get("schema_version", 0) == 0 else meta


def _frozen(d: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(d or {}))


@dataclass(frozen=True)
class SuiteSource:
    """The suite file a run was started from, kept whole so that a resume runs the same suite."""

    name: str
    path: str | None
    text: str
    description: str | None = None


@dataclass(frozen=True)
class CaseRecord:
    """One case of a run: its parameters (``suite.Case.params``), where it stands, why it failed,
    and what its capture recorded."""

    case_id: str
    params: Mapping[str, Any]
    status: str
    error: str | None = None
    detail: str | None = None
    failed_at: float | None = None
    capture: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, case_id: str, entry: Mapping[str, Any]) -> CaseRecord:
        return cls(
            case_id,
            _frozen(entry["params"]),
            entry["status"],
            entry.get("error"),
            entry.get("detail"),
            entry.get("failed_at"),
            _frozen({k: entry[k] for k in CAPTURE_KEYS if k in entry}),
        )


@dataclass(frozen=True)
class RunRecord:
    """A run's run.json, read back and migrated to ``SCHEMA_VERSION``.

    ``environment`` is the fingerprint of ``environment.fingerprint`` (``nodes`` added when the
    world reported them); ``worlds`` the launched worlds in order; ``wall_s`` the time spent
    running them; ``efficiency`` the sweep's accounting of its wall time, written when it finished;
    ``adaptive`` what an adaptive sweep (``--target-ci``) did after its planned repeats (empty: none).
    """

    schema_version: int
    run_id: str
    suite: SuiteSource
    created: str | None
    status: str | None
    environment: Mapping[str, Any]
    cases: Mapping[str, CaseRecord]
    launcher: Mapping[str, Any]
    worlds: tuple[Mapping[str, Any], ...]
    efficiency: Mapping[str, Any]
    wall_s: float | None
    adaptive: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, meta: Mapping[str, Any]) -> RunRecord:
        """From a run.json already checked for shape (``store.read_run_json``)."""
        meta = migrate(dict(meta))
        suite = meta["suite"]
        return cls(
            meta["schema_version"],
            meta["run_id"],
            SuiteSource(suite["name"], suite.get("path"), suite["text"], suite.get("description")),
            meta.get("created"),
            meta.get("status"),
            _frozen(meta["environment"]),
            MappingProxyType({cid: CaseRecord.from_json(cid, e) for cid, e in meta["cases"].items()}),
            _frozen(meta.get("launcher") or {"name": "local"}),
            tuple(_frozen(w) for w in meta.get("worlds", [])),
            _frozen(meta.get("efficiency")),
            meta.get("wall_s"),
            _frozen(meta.get("adaptive")),
        )

    def planned_params(self, case_id: str) -> dict[str, Any]:
        """A case's parameters with ``repeats`` as the suite planned them: an adaptive sweep raises
        some cases' repeats (``adaptive.planned_repeats``), which does not make them other cases."""
        params = dict(self.cases[case_id].params)
        return params | {"repeats": self.adaptive.get("planned_repeats", {}).get(case_id, params["repeats"])}

    def suite_table(self, table: str) -> dict[str, Any]:
        """One table of the suite file the run was started from (``suite``, ``interconnects``, ...),
        read back from its text; empty when the suite has no such table."""
        try:
            return tomllib.loads(self.suite.text).get(table, {})
        except tomllib.TOMLDecodeError:
            return {}
