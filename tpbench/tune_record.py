"""tune.json, typed: a tune's options, how each world's race stands, every judged round and, once
the races end, the answer.

The tune builds a ``TuneRecord`` after every round and writes it (``store.write_tune``); the report's
Recommendation, its Verdicts (``store.Loaded.tune``) and ``tune --resume`` read it back
(``store.read_tune``) equal, field for field, and use its attributes. One record passes between the
stages, so that the shape a reader expects and the one the tune writes are one declaration, not keys
picked out of a dict on each side, checked apart in a third place.

The JSON object is tune.json's as it has always been written: ``to_json`` writes the same keys in
the same order, so files written before this record existed read as one (keys added since, such
as ``training_note``, read as their defaults), and the answer in it is ``tpbench tune --format json``'s
object (docs/tune.md). ``from_json`` refuses anything else with ``TuneRecordError`` naming the key;
``store.read_tune`` adds the file and refuses another ``schema_version``. This module reads no file:
``store`` does, and the store cannot import a module that imports it.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Callable, Iterable, Mapping

from tpbench.racing import Options


class TuneRecordError(ValueError):
    """A parsed tune.json that is no tune record: the message names the key and what is wrong."""


def finite_number(v: Any) -> bool:
    """A JSON number that is one: not a bool, not NaN or infinite (tune.json's and run.json's checks)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _strings(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


# What a key may hold, by the words its error says.
_KINDS: dict[str, Callable[[Any], bool]] = {
    "a string": lambda v: isinstance(v, str),
    "a number": finite_number,
    "a whole number": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "a JSON object": lambda v: isinstance(v, dict),
    "a JSON list": lambda v: isinstance(v, list),
    "a list of strings": _strings,
    "an object of whole numbers": lambda v: (
        isinstance(v, dict) and all(_KINDS["a whole number"](x) for x in v.values())
    ),
}
_REQUIRED = object()


def _take(doc: dict[str, Any], key: str, kind: str, where: str, default: Any = _REQUIRED, *, null: bool = False) -> Any:
    """``doc[key]``, checked to be of ``kind`` (a key of ``_KINDS``), or None where ``null`` allows
    it; ``default`` where the key is absent (tune.json before the key existed), and without one the
    key is required. ``where``: the keys above it, for the message."""
    if key not in doc:
        if default is _REQUIRED:
            raise TuneRecordError(f"{where}{key!r} is missing")
        return default
    v = doc[key]
    if (v is None and null) or _KINDS[kind](v):
        return v
    raise TuneRecordError(f"{where}{key!r} = {v!r}, expected {kind}{' or null' if null else ''}")


def _defaults(cls: type) -> dict[str, Any]:
    """Each field's default, ``_REQUIRED`` where it has none (a key every tune.json holds)."""
    return {f.name: _REQUIRED if f.default is MISSING else f.default for f in fields(cls)}


def _object(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise TuneRecordError(f"{where.strip()} is a {type(v).__name__}, expected a JSON object")
    return v


@dataclass(frozen=True)
class TuneWorld:
    """How one world's race stands (``racing.Race``): its arms, the rounds judged, why it ended
    (None: it had not), the arms still running, those eliminated and retired (arm → the round after
    which), and those whose case failed."""

    arms: list[str]
    rounds: int = 0
    ended: str | None = None
    live: list[str] = field(default_factory=list)
    eliminated: dict[str, int] = field(default_factory=dict)
    retired: dict[str, int] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, doc: Any, where: str) -> TuneWorld:
        doc = _object(doc, where)
        return cls(
            arms=_take(doc, "arms", "a list of strings", where),
            rounds=_take(doc, "rounds", "a whole number", where, 0),
            ended=_take(doc, "ended", "a string", where, None, null=True),
            live=_take(doc, "live", "a list of strings", where, []),
            eliminated=_take(doc, "eliminated", "an object of whole numbers", where, {}),
            retired=_take(doc, "retired", "an object of whole numbers", where, {}),
            failed=_take(doc, "failed", "a list of strings", where, []),
        )


@dataclass(frozen=True)
class TuneRound:
    """One judged round of a world's race (``Race.close_round``'s entry): its leader (None: no arm
    had run), the arms that run the next one, those it eliminated, retired and brought back, each
    arm's ``(ratio, lo, hi)`` to the leader, and why the race ended with it (None: it went on)."""

    round: int
    leader: str | None
    live: list[str]
    eliminated: list[str]
    intervals: dict[str, tuple[float, float, float]]
    world: int = 0
    retired: list[str] = field(default_factory=list)
    back: list[str] = field(default_factory=list)
    ended: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The history entry as the race writes it, in its order."""
        return {
            "world": self.world,
            "round": self.round,
            "leader": self.leader,
            "live": self.live,
            "eliminated": self.eliminated,
            "retired": self.retired,
            "back": self.back,
            "intervals": {a: list(v) for a, v in self.intervals.items()},
            "ended": self.ended,
        }

    @classmethod
    def from_json(cls, doc: Any, where: str) -> TuneRound:
        doc = _object(doc, where)
        intervals = _take(doc, "intervals", "a JSON object", where)
        for arm, v in intervals.items():
            if not (isinstance(v, list) and len(v) == 3 and all(map(finite_number, v))):
                raise TuneRecordError(f"{where}'intervals' {arm!r} = {v!r}, expected [ratio, lo, hi]")
        return cls(
            round=_take(doc, "round", "a whole number", where),
            leader=_take(doc, "leader", "a string", where, None, null=True),
            live=_take(doc, "live", "a list of strings", where, []),
            eliminated=_take(doc, "eliminated", "a list of strings", where),
            intervals={a: (v[0], v[1], v[2]) for a, v in intervals.items()},
            world=_take(doc, "world", "a whole number", where, 0),
            retired=_take(doc, "retired", "a list of strings", where, []),
            back=_take(doc, "back", "a list of strings", where, []),
            ended=_take(doc, "ended", "a string", where, None, null=True),
        )


def eliminated_vs(history: Iterable[Mapping[str, Any]], arm: str) -> dict[str, Any] | None:
    """The leader of the round that eliminated ``arm`` and the arm's interval against it then (a
    ``TuneArm``'s ``eliminated_vs``), from a race's history entries (``Race.history``, or a
    ``TuneRound``'s ``to_json``: the report of an interrupted tune has no answer that holds it)."""
    went = next((e for e in history if arm in e["eliminated"]), None)
    if went is None:
        return None
    ratio, lo, hi = went["intervals"][arm]
    return {"leader": went["leader"], "ratio": float(ratio), "lo": float(lo), "hi": float(hi)}


@dataclass(frozen=True, kw_only=True)
class TuneArm:
    """One arm of the answer (``tune_answer.result`` builds them): its status, rounds, ratio to the
    recommended arm with the race's interval, and when and why it stopped. Fields in the file's order."""

    case_id: str
    label: str
    params: dict[str, Any]  # the swept keys' values: what tells this setting from the others
    status: str
    rounds: int
    ratio: float | None  # to the recommended arm (None: the recommended arm itself, or no interval)
    lo: float | None
    hi: float | None
    eliminated_at: int | None  # the round after which it went (None: not eliminated in its world's race)
    retired_at: int | None = None  # the round after which it stopped, retired (tied, or eliminated later)
    # What eliminated it, from the race's history: that round's leader and the arm's ratio to it with
    # the interval that lay above 1 ({"leader", "ratio", "lo", "hi"}). The ratio to the recommended
    # arm above may still hold 1 where the leader then was another arm, its rounds were fewer, or the
    # variance pooled over the race's later rounds is larger than the one that eliminated it.
    eliminated_vs: dict[str, Any] | None = None
    # Where the workload evaluates a held-out loss: where this setting's ends (the median over its
    # rounds), and the training seconds it takes to reach the workload's target loss (None: not in
    # every round it ran, or no target known). How far a step takes the model, which the race's
    # metric does not count (``tune_answer._training_note``).
    heldout_loss: float | None = None
    time_to_target_s: float | None = None
    # The rounds of its world's race it did not run before it stopped (retired, eliminated or the race
    # ended): retired once, then brought back when a later leader was not safe from it. Without it an
    # arm still racing at the end with 5 rounds of 12 reads as a miscount.
    sat_out: int = 0

    @classmethod
    def from_json(cls, doc: Any, where: str) -> TuneArm:
        doc = _object(doc, where)
        kinds = {
            **dict.fromkeys(("case_id", "label", "status"), "a string"),
            "params": "a JSON object",
            "rounds": "a whole number",
            **dict.fromkeys(("ratio", "lo", "hi", "heldout_loss", "time_to_target_s"), "a number"),
            **dict.fromkeys(("eliminated_at", "retired_at", "sat_out"), "a whole number"),
            "eliminated_vs": "a JSON object",
        }
        nullable = {"ratio", "lo", "hi", "eliminated_at", "retired_at", "eliminated_vs"}
        nullable |= {"heldout_loss", "time_to_target_s"}
        defaults = _defaults(cls)
        return cls(**{k: _take(doc, k, kind, where, defaults[k], null=k in nullable) for k, kind in kinds.items()})


@dataclass(frozen=True, kw_only=True)
class TuneResult:
    """The tune's answer (``tune_answer.result`` builds it; ``tpbench tune --format json``'s object,
    docs/tune.md). Fields in the file's order; those added after the first tunes default to what a
    file without them meant (None, no worlds). ``recommended`` is one of ``arms``, which the file
    names by its case id, label and params."""

    run_dir: str
    state: str  # recommended (one arm is the best), tied (within epsilon), unresolved or failed
    recommended: TuneArm | None
    epsilon: float
    confidence: float
    metric: str
    claim: str
    arms: list[TuneArm]
    wall_s: float
    timed_s: float
    grid_timed_s: float
    rounds_to_decide: int | None
    supported_epsilon: float | None = None
    next_step: str | None = None
    decide_wall_s: float | None = None
    next_repeats: int | None = None
    trace_step: str | None = None
    training_note: str | None = None
    worlds: list[str] = field(default_factory=list)
    where: dict[str, Any] | None = None  # tune --trace: ``tune_trace.WhereTime.to_json``

    def to_json(self) -> dict[str, Any]:
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        rec = self.recommended
        named = {"case_id": rec.case_id, "label": rec.label, "params": rec.params} if rec else None
        return doc | {"recommended": named, "arms": [asdict(a) for a in self.arms]}

    @classmethod
    def from_json(cls, doc: Any) -> TuneResult:
        w = "'result' "
        doc = _object(doc, w)
        kinds = {
            **dict.fromkeys(("run_dir", "state", "metric", "claim"), "a string"),
            **dict.fromkeys(("epsilon", "confidence", "wall_s", "timed_s", "grid_timed_s"), "a number"),
            **dict.fromkeys(("supported_epsilon", "decide_wall_s"), "a number"),
            **dict.fromkeys(("rounds_to_decide", "next_repeats"), "a whole number"),
            **dict.fromkeys(("next_step", "trace_step", "training_note"), "a string"),
            "worlds": "a list of strings",
            "where": "a JSON object",
        }
        required = {"run_dir", "state", "metric", "claim", "epsilon", "confidence", "wall_s", "timed_s"}
        required |= {"grid_timed_s", "rounds_to_decide"}
        nullable = set(kinds) - required - {"worlds"} | {"rounds_to_decide"}
        defaults = _defaults(cls) | {"worlds": []}
        taken = {k: _take(doc, k, kind, w, defaults[k], null=k in nullable) for k, kind in kinds.items()}
        rec = _take(doc, "recommended", "a JSON object", w, None, null=True)
        arms = [TuneArm.from_json(a, f"{w}'arms'[{i}] ") for i, a in enumerate(_take(doc, "arms", "a JSON list", w))]
        recommended = None if rec is None else _recommended(rec, arms, f"{w}'recommended' ")
        return cls(**taken, recommended=recommended, arms=arms)


def _recommended(doc: dict[str, Any], arms: list[TuneArm], where: str) -> TuneArm:
    """The arm the answer's ``recommended`` names by its case id."""
    cid = _take(doc, "case_id", "a string", where)
    arm = next((a for a in arms if a.case_id == cid), None)
    if arm is None:
        raise TuneRecordError(f"{where}'case_id' = {cid!r} is none of 'arms'")
    return arm


@dataclass(frozen=True)
class TuneRecord:
    """A tune's tune.json: its options, the wall seconds spent racing, each world's race by its
    index (as text: a JSON key), every judged round of every world, and ``result``, the answer,
    once every world's race has ended (None: interrupted, or still racing)."""

    options: Options
    wall_s: float
    worlds: dict[str, TuneWorld]
    history: list[TuneRound]
    result: TuneResult | None = None

    @property
    def ended(self) -> bool:
        """Whether it holds the tune's answer: the tune writes one only once every world's race has
        ended, so resuming it races nothing more."""
        return self.result is not None

    def to_json(self) -> dict[str, Any]:
        """The JSON object tune.json holds, less the store's ``schema_version``: ``result`` only once
        there is one."""
        doc = {
            "options": asdict(self.options),
            "wall_s": self.wall_s,
            "worlds": {k: asdict(w) for k, w in self.worlds.items()},
            "history": [e.to_json() for e in self.history],
        }
        return doc | ({"result": self.result.to_json()} if self.result else {})

    @classmethod
    def from_json(cls, doc: Any) -> TuneRecord:
        """The record of a parsed tune.json (``schema_version``, the store's, is checked there and
        ignored here); ``TuneRecordError`` naming the key where it is not one."""
        doc = _object(doc, "the file")
        return cls(
            options=_options(_take(doc, "options", "a JSON object", "")),
            wall_s=_take(doc, "wall_s", "a number", ""),
            worlds={
                k: TuneWorld.from_json(w, f"'worlds' {k!r} ")
                for k, w in _take(doc, "worlds", "a JSON object", "").items()
            },
            history=[
                TuneRound.from_json(e, f"'history'[{i}] ")
                for i, e in enumerate(_take(doc, "history", "a JSON list", ""))
            ],
            result=TuneResult.from_json(doc["result"]) if doc.get("result") is not None else None,
        )


def _options(doc: dict[str, Any]) -> Options:
    """The race's options, as the tune took them (``racing.Options``; not checked against the
    ranges ``Options.check`` holds the command line to: ``tune --resume`` does that)."""
    w = "'options' "
    for key in ("epsilon", "confidence", "min_rounds"):
        _take(doc, key, "a number", w)
    _take(doc, "metric", "a string", w)
    _take(doc, "budget_s", "a number", w, None, null=True)
    try:
        return Options(**doc)
    except TypeError as e:  # a key this tpbench does not know
        raise TuneRecordError(f"'options': {e}") from None
