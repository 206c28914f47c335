"""gate.json, typed: what a lockstep gate ran (its rounds, each side's items), why it stopped and,
with ``--target-ci``, its answer.

The gate builds a ``GateRecord``, writes it (``write``), and judges from that same record; a reader
of a gate's folder (``read``: ``examples/ci/gate_accuracy.py``) gets it back equal, field for field.
One record passes between the stages, so the answer a gate prints and the one its file keeps cannot
drift apart as they could when each stage picked keys out of a dict.

The file is the JSON object gate.json has always been, with ``schema_version`` added: a file
without one (written before it was) reads as version 1; another version is refused, naming the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tpbench import store
from tpbench.compare import GateAnswer, GateError

GATE_FILE = "gate.json"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class GateItem:
    """One item a side ran at the gate's word: its case and repeat, when the gate said go and heard
    it end (``start``, ``end``: the gate's clock), whether it finished (False: its world died in it)
    and, finished, when it ran by the world's own clock (``began``, ``ended``: rank 0's)."""

    side: str
    case: str
    repeat: int
    start: float
    end: float
    done: bool
    began: float | None = None
    ended: float | None = None

    def to_json(self) -> dict[str, Any]:
        """gate.json's item: ``began`` and ``ended`` only where the item finished."""
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: v for k, v in doc.items() if k not in ("began", "ended") or v is not None}


@dataclass(frozen=True)
class GateRound:
    """One round: its number (from 1), the sides' order (drawn from the seed), the items they ran in
    it, and ``partial`` where the budget ended it after some side's item."""

    round: int
    order: list[str]
    items: list[GateItem] = field(default_factory=list)
    partial: bool = False

    def to_json(self) -> dict[str, Any]:
        """gate.json's round: ``partial`` only where it is."""
        doc = {"round": self.round, "order": self.order, "items": [i.to_json() for i in self.items]}
        return doc | ({"partial": True} if self.partial else {})


@dataclass(frozen=True)
class GateSide:
    """One side as the gate ran it: the spec given, its kind (``gate.Side``), its run, its log, and
    how its sweep exited."""

    spec: str
    kind: str
    run: str
    log: str
    exit_code: int | None


@dataclass(frozen=True)
class GateRecord:
    """A lockstep gate's gate.json. ``answer`` and ``answers`` (per case id) are there with
    ``--target-ci`` only (``gate.answers``), as in the file."""

    seed: int
    metric: str
    repeats: int
    target_ci: float | None
    budget_s: float
    stopped: str
    wall_s: float
    sides: dict[str, GateSide]
    rounds: list[GateRound]
    answer: str | None = None
    answers: dict[str, str] | None = None
    mode: str = "lockstep"
    schema_version: int = SCHEMA_VERSION

    @property
    def gate_answer(self) -> GateAnswer | None:
        """The answer the gate says beside its verdict (``compare.GateAnswer``), None without ``--target-ci``."""
        if self.answer is None:
            return None
        return GateAnswer(self.answer, dict(self.answers or {}), self.target_ci or 0.0, self.stopped)

    def to_json(self) -> dict[str, Any]:
        """The JSON object gate.json holds: its version, then the keys in the order the gate has always
        written them."""
        answered = {"answer": self.answer, "answers": self.answers} if self.answer is not None else {}
        return {
            "schema_version": self.schema_version,
            "mode": self.mode,
            "seed": self.seed,
            "metric": self.metric,
            "repeats": self.repeats,
            "target_ci": self.target_ci,
            "budget_s": self.budget_s,
            "stopped": self.stopped,
            **answered,
            "wall_s": self.wall_s,
            "sides": {name: {f.name: getattr(s, f.name) for f in fields(s)} for name, s in self.sides.items()},
            "rounds": [r.to_json() for r in self.rounds],
        }

    @classmethod
    def from_json(cls, doc: Any, path: Path | str = GATE_FILE) -> GateRecord:
        """The record of a parsed gate.json; ``GateError`` naming ``path`` and what is wrong where
        it is not one (another version, a key missing or of the wrong kind)."""
        if not isinstance(doc, dict):
            raise GateError(f"{path}: expected a JSON object, found {type(doc).__name__}")
        version = doc.get("schema_version", 1)
        if version != SCHEMA_VERSION:
            raise GateError(f"{path}: schema_version {version!r}; this tpbench reads {SCHEMA_VERSION}")
        try:
            rounds = [
                GateRound(r["round"], list(r["order"]), [GateItem(**i) for i in r["items"]], r.get("partial", False))
                for r in doc["rounds"]
            ]
            sides = {name: GateSide(**s) for name, s in doc["sides"].items()}
            keys = {f.name for f in fields(cls)} - {"sides", "rounds"}
            return cls(sides=sides, rounds=rounds, **{k: v for k, v in doc.items() if k in keys})
        except (KeyError, TypeError, AttributeError) as e:
            raise GateError(f"{path}: not a gate record ({type(e).__name__}: {e})") from e


def write(out: Path, record: GateRecord) -> Path:
    """``record`` as ``out``/gate.json, written atomically (``store.atomic_write_bytes``)."""
    path = Path(out) / GATE_FILE
    store.atomic_write_bytes(path, json.dumps(record.to_json(), indent=1).encode())
    return path


def read(out: Path) -> GateRecord:
    """The record in ``out``/gate.json (``GateRecord.from_json``); ``GateError`` naming the file
    where it cannot be read."""
    path = Path(out) / GATE_FILE
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise GateError(f"{path}: unreadable ({e})") from e
    return GateRecord.from_json(doc, path)
