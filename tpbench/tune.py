"""``tpbench tune``: race a suite's swept grid and name the best setting, with a margin and a confidence.

The suite's cases are the candidate settings ("arms"); its ``repeats`` is the most rounds any arm
may get. The arms of one world run round by round as a sweep runs them (``launch.interleave``:
round r holds repeat r of every arm, in a seeded order), but each round's arms together, their
steps taken in turn (``Plan.steps_interleaved``), paced item by item over the lockstep
protocol (``tpbench.lockstep``): this process serves the socket its worlds ask before each item and
answers ``go``, ``skip`` (an eliminated arm: it costs nothing more) or ``stop`` (the race is over).

The rule (``racing``, docs/tune.md): after each round, once ``min_rounds`` have run, an arm clearly
slower than the leader is eliminated and one that can no longer be more than epsilon faster than
it is retired; every interval is paired by round at the confidence the whole race spends, so the
race may look after every round. It ends with one arm left (recommended), or with the leader alone
and every other arm eliminated or retired (tied: the leader is within epsilon of the best); or with
the most rounds or the budget spent (unresolved: the best guess, and about how many rounds would
decide it).

Arms of different worlds (world size, backend, device, interconnect) share no rounds: each world
is raced on its own, then the world winners are compared unpaired (``stats.unpaired_ratio``) at the
same spent confidence. The race is saved to ``tune.json`` after every round; a resumed tune replays
it from the stored repeats, round by round, and goes on from where the race stood.

Nothing here prints; the CLI shows ``Result``.
"""

from __future__ import annotations

import contextlib
import math
import selectors
import shlex
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pandas as pd

from tpbench import lockstep, store, sweep, verdict
from tpbench.analysis.convergence import LEVEL_NATS
from tpbench.analysis.stats import (
    Ratio,
    repeat_values,
    slowest_rank,
    spent_confidence,
    unpaired_ratio,
    windows_of,
)
from tpbench.launch import Listener, group_cases
from tpbench.racing import (
    ALL_TIED,
    BUDGET,
    MAX_ROUNDS,
    ONE_LEFT,
    Options,
    Race,
    TuneError,
    geomean,
    settling_rounds,
    supported_epsilon,
    within_epsilon,
)
from tpbench.suite import Case, labels, varying_keys
from tpbench.worlds import Torchrun

RECOMMENDED, TIED, ELIMINATED, UNRESOLVED, FAILED = "recommended", "tied", "eliminated", "unresolved", "failed"
# What a tune overrides in the suite: it reads no trace (docs/tune.md, "Traces").
OVERRIDES = ("capture.profiler_steps=0",)


# ---------------------------------------------------------------- the result


@dataclass
class Arm:
    case_id: str
    label: str
    params: dict[str, Any]  # the swept keys' values: what tells this setting from the others
    world: int
    status: str
    rounds: int
    ratio: float | None  # to the recommended arm (None: the recommended arm itself, or no interval)
    lo: float | None
    hi: float | None
    eliminated_at: int | None  # the round after which it went (None: not eliminated in its world's race)
    retired_at: int | None = None  # the round after which it stopped, retired (tied, or eliminated later)
    # What eliminated it, from the race's history: that round's leader and the arm's ratio to it with
    # the interval that lay above 1 ({"leader", "ratio", "lo", "hi"}). The ratio to the recommended
    # arm above may still hold 1 where the leader then was another arm, or its rounds were fewer.
    eliminated_vs: dict[str, Any] | None = None
    # Where the workload evaluates a held-out loss: where this setting's ends (the median over its
    # rounds), and the training seconds it takes to reach the workload's target loss (None: not in
    # every round it ran, or no target known). How far a step takes the model, which the race's
    # metric does not count (``_training_note``).
    heldout_loss: float | None = None
    time_to_target_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        keep = (
            *("case_id", "label", "params", "status", "rounds", "ratio", "lo", "hi"),
            *("eliminated_at", "retired_at", "eliminated_vs", "heldout_loss", "time_to_target_s"),
        )
        return {k: v for k, v in asdict(self).items() if k in keep}


@dataclass
class Result:
    run_dir: Path
    state: str  # RECOMMENDED (one arm is the best), TIED (within epsilon) or UNRESOLVED
    recommended: Arm | None
    claim: str
    arms: list[Arm]
    epsilon: float
    confidence: float
    metric: str
    wall_s: float
    timed_s: float
    grid_timed_s: float
    rounds_to_decide: int | None
    supported_epsilon: float | None = None  # the margin the rounds run do show (see supported_epsilon)
    history: list[dict[str, Any]] = field(default_factory=list)
    next_step: str | None = None  # unresolved: the command that would likely decide it (see _next_step)
    decide_wall_s: float | None = None  # about how long that command would take here (_decide_wall_s)
    trace_step: str | None = None  # the sweep that traces the recommended arm and its closest rival (_trace_step)
    # The settings do not train alike: other samples a step (_work_note), a worse loss (_training_note).
    training_note: str | None = None
    worlds: list[str] = field(default_factory=list)  # each world's own answer, where the arms span worlds
    where: dict[str, Any] | None = None  # --trace: where the time goes (``tune_trace.WhereTime.to_json``)

    def to_json(self) -> dict[str, Any]:
        rec = self.recommended
        return {
            "run_dir": str(self.run_dir),
            "state": self.state,
            "recommended": {"case_id": rec.case_id, "label": rec.label, "params": rec.params} if rec else None,
            "epsilon": self.epsilon,
            "confidence": self.confidence,
            "metric": self.metric,
            "claim": self.claim,
            "arms": [a.to_json() for a in self.arms],
            "wall_s": self.wall_s,
            "timed_s": self.timed_s,
            "grid_timed_s": self.grid_timed_s,
            "rounds_to_decide": self.rounds_to_decide,
            "supported_epsilon": self.supported_epsilon,
            "next_step": self.next_step,
            "decide_wall_s": self.decide_wall_s,
            "trace_step": self.trace_step,
            "training_note": self.training_note,
            "worlds": self.worlds,
            "where": self.where,
        }


# ---------------------------------------------------------------- starting and resuming


def start(
    suite_path: str | Path,
    options: Options,
    overrides: Iterable[str] = (),
    filters: Iterable[str] = (),
    out_root: Path = Path("results"),
    launcher: Torchrun | None = None,
    allow_large: bool = False,
) -> tuple[store.Run, list[Case]]:
    """Check the options and the grid, create the run directory with every arm pending and an
    empty race in tune.json."""
    options.check()
    prepared = prepare(suite_path, overrides, filters, launcher, allow_large)
    run = sweep.start(prepared, out_root, launcher)
    _save(run, {"options": asdict(options), "wall_s": 0.0, "worlds": {}, "history": []})
    return run, prepared.cases


def prepare(
    suite_path: str | Path,
    overrides: Iterable[str] = (),
    filters: Iterable[str] = (),
    launcher: Torchrun | None = None,
    allow_large: bool = False,
) -> sweep.Prepared:
    """The suite's arms (``sweep.prepare`` with the tune's own overrides last), checked raceable."""
    prepared = sweep.prepare(suite_path, [*overrides, *OVERRIDES], filters, launcher, allow_large)
    if len(prepared.cases) < 2:
        raise TuneError(f"{suite_path}: {len(prepared.cases)} case(s) after --filter; a tune races two or more")
    short = [c for c in prepared.cases if c.repeats < 2]
    if short:
        raise TuneError(
            f"{suite_path}: repeats = {short[0].repeats}: expected at least 2 (the most rounds an arm gets)"
        )
    return prepared


def reopen(run_dir: Path) -> tuple[store.Run, Options]:
    """A tune to resume (``sweep.reopen``: owned by this process, finished repeats kept) and its options."""
    if not Path(run_dir).is_dir():
        raise store.StoreError(f"{run_dir}: no such run directory")
    saved = store.read_tune(run_dir)
    if saved is None:
        raise store.StoreError(f"{run_dir}: no {store.TUNE_FILE}; not a tune (resume a sweep with tpbench sweep)")
    run, _ = sweep.reopen(run_dir)
    return run, Options(**saved["options"])


def _save(run: store.Run, record: dict[str, Any]) -> None:
    store.write_tune(run.dir, record)


# ---------------------------------------------------------------- racing


class _Conductor:
    """The tune's end of the lockstep protocol, served on a thread while ``sweep.execute`` runs a
    world: answers each item from the current race and records each item's value."""

    def __init__(self, path: Path, metric: str, on_round: Callable[[Race, dict[str, Any]], None]) -> None:
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(4)
        self.metric = metric
        self.on_round = on_round
        self.race: Race | None = None
        self.deadline: Callable[[], bool] = lambda: False
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, name="tpbench-tune", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.server, selectors.EVENT_READ, None)
        buffers: dict[socket.socket, bytes] = {}
        try:
            while not self.closing.is_set():
                for key, _ in sel.select(0.2):
                    if key.data is None:
                        conn, _ = self.server.accept()
                        buffers[conn] = b""
                        sel.register(conn, selectors.EVENT_READ, "conn")
                        continue
                    conn = key.fileobj
                    try:
                        chunk = conn.recv(65536)
                    except ConnectionError:
                        chunk = b""
                    if not chunk:  # the world ended (or died): its item in flight is over
                        sel.unregister(conn)
                        conn.close()
                        buffers.pop(conn, None)
                        continue
                    messages, buffers[conn] = lockstep.split_lines(buffers[conn] + chunk)
                    for m in messages:
                        self._handle(conn, m)
        except BaseException as e:  # the main thread reports it; the worlds see the socket close
            self.error = e
            self.server.close()  # and a fresh world is refused at once instead of waiting unanswered
        finally:
            for conn in buffers:
                conn.close()
            sel.close()

    def _handle(self, conn: socket.socket, m: dict[str, Any]) -> None:
        with self.lock:
            race = self.race
            if m["msg"] == lockstep.DONE:
                if race is not None and m.get("value") is not None:
                    race.record(m["case"], int(m["repeat"]), float(m["value"]))
                return
            if m["msg"] != lockstep.READY:
                return
            answer = lockstep.STOP
            if race is not None:
                self.settle()
                if race.ended is None:
                    answer = lockstep.GO if m["case"] in race.live else lockstep.SKIP
        with contextlib.suppress(OSError):  # a world that died meanwhile is simply over
            lockstep.send(conn, answer, metric=self.metric)

    def settle(self) -> None:
        """Judge every round the race has completed; after each, end the race if its budget is
        spent. Called with the lock held."""
        race = self.race
        while race is not None and race.round_complete():
            entry = race.close_round()
            if race.ended is None and self.deadline():
                race.end(BUDGET)
                entry["ended"] = BUDGET
            self.on_round(race, entry)

    def drop(self, arm: str) -> None:
        with self.lock:
            if self.race is not None:
                self.race.drop(arm)

    def close(self) -> None:
        self.closing.set()
        self.thread.join()
        self.server.close()


def _stored_values(run: store.Run, cases: list[Case], metric: str) -> dict[str, dict[int, float]]:
    """Each arm's value per finished round, from its stored repeats, computed as its world
    reported them (``stats.repeat_values``)."""
    out: dict[str, dict[int, float]] = {}
    windows = windows_of({c.case_id: c.params() for c in cases})
    for c in cases:
        rows = store.case_steps(run.dir, c.case_id)
        if rows.empty or metric not in rows:
            out[c.case_id] = {}
            continue
        v = repeat_values(rows.assign(case_id=c.case_id), metric, windows)
        out[c.case_id] = {int(r): float(x) for r, x in zip(v["repeat"], v[metric])}
    return out


def race(
    run: store.Run,
    options: Options,
    listener: Listener = lambda kind, data: None,
    launcher: Torchrun | None = None,
    on_round: Callable[[Race, dict[str, Any]], None] = lambda race, entry: None,
) -> Result:
    """Run (or go on with) the tune of ``run``: each world's race in turn, then the result,
    saved to tune.json, the run finalized as a sweep is (summary, status), so that report,
    compare and export read it as any run.

    ``listener`` gets the launcher's events (the CLI's progress); ``on_round`` each judged round
    (called on the conductor's thread). ``KeyboardInterrupt`` (Ctrl-C, a stop signal) leaves the
    run interrupted with the race saved as of its last round: ``--resume`` goes on from there.
    """
    saved = store.read_tune(run.dir) or {"wall_s": 0.0, "worlds": {}, "history": []}
    cases = [c.case for c in run.record.cases.values()]
    groups = group_cases(cases)
    races = _replayed_races(run, cases, groups, options, saved)
    base_wall, t0 = float(saved.get("wall_s", 0.0)), time.monotonic()
    # A tune resumed after it ended races nothing more: its result is rebuilt and shown again, and
    # the wall time stays the tune's own (reading it back is not tuning).
    finished = "result" in saved and all(rc.ended is not None for rc in races)

    def spent() -> float:
        return base_wall if finished else base_wall + time.monotonic() - t0

    def persist() -> None:
        _save(run, _record(options, races, spent()))

    def round_judged(rc: Race, entry: dict[str, Any]) -> None:
        persist()
        on_round(rc, entry)

    sockets = Path(tempfile.mkdtemp(prefix="tpbt-"))  # short: a socket path has ~100 bytes
    conductor = _Conductor(sockets / "s", options.metric, round_judged)

    def watch(kind: str, data: dict[str, Any]) -> None:
        if kind == "case_failed":
            conductor.drop(data["case"])
        listener(kind, data)

    try:
        for i, (rc, g) in enumerate(zip(races, groups)):
            until = _world_deadline(races, i, options, spent()) if rc.ended is None else None
            if rc.ended is None:
                with conductor.lock:
                    conductor.race = rc
                    conductor.deadline = (lambda: False) if until is None else (lambda u=until: spent() >= u)
                sweep.execute(
                    run,
                    [c for c in g.cases if run.case_status()[c.case_id] != store.DONE],
                    watch,
                    launcher,
                    str(sockets / "s"),
                    steps_interleaved=True,
                )
                if conductor.error is not None:
                    raise conductor.error
                with conductor.lock:
                    conductor.settle()
                    rc.end(MAX_ROUNDS)  # the world ran its whole plan
                    conductor.race = None
            _cut(run, g.cases)
            persist()
    except KeyboardInterrupt:
        with conductor.lock:
            persist()
        raise
    finally:
        conductor.close()
        shutil.rmtree(sockets, ignore_errors=True)
    loaded = sweep.finalize(run)
    result = _result(run, cases, races, options, spent(), loaded.summary)
    if finished:  # what --trace found of the same answer stands
        result = replace(result, where=saved["result"].get("where"))
    _save(run, _record(options, races, result.wall_s) | {"result": result.to_json()})
    return result


def _replayed_races(
    run: store.Run, cases: list[Case], groups: list, options: Options, saved: dict[str, Any]
) -> list[Race]:
    """One race per world, replayed from what the run holds (a resumed tune goes on where it was):
    the failed arms dropped, the stored values judged again, a world's end as tune.json says."""
    races = [
        Race(
            [c.case_id for c in g.cases],
            max(c.repeats for c in g.cases),
            options,
            len(cases) - 1,
            world=i,
            runs_on=len(groups) > 1,
        )
        for i, g in enumerate(groups)
    ]
    stored = _stored_values(run, cases, options.metric)
    status = run.case_status()
    for rc in races:
        for a in rc.arms:
            if status[a] == store.FAILED:
                rc.drop(a)
        rc.replay({a: stored[a] for a in rc.arms}, saved["worlds"].get(str(rc.world), {}).get("ended"))
    return races


def _world_deadline(races: list[Race], i: int, options: Options, spent: float) -> float | None:
    """When world ``i``'s race must end (seconds spent; None: no budget): its share of what is left
    of the budget, by its share of the arms left to race. None left: the race ends (``BUDGET``) here."""
    if options.budget_s is None:
        return None
    rc = races[i]
    share = (options.budget_s - spent) * len(rc.arms) / sum(len(r.arms) for r in races[i:])
    if share <= 0:
        rc.end(BUDGET)  # an earlier world spent it all: this one starts no world
    return spent + share


@dataclass(frozen=True)
class Watch:
    """Who follows a race: the launcher's events (the item running) and each judged round (called
    on the conductor's thread)."""

    listener: Listener = lambda kind, data: None
    on_round: Callable[[Race, dict[str, Any]], None] = lambda race, entry: None


# Given the tune's run once its directory exists, its ``Watch`` as a context (the CLI's progress
# display stays open while the race runs).
Progress = Callable[[store.Run], contextlib.AbstractContextManager[Watch]]


def run(
    suite: str | Path | None = None,
    options: Options = Options(),
    *,
    overrides: Iterable[str] = (),
    filters: Iterable[str] = (),
    out: Path = Path("results"),
    launcher: Torchrun | None | str = None,
    resume: Path | None = None,
    allow_large: bool = False,
    progress: Progress = lambda run: contextlib.nullcontext(Watch()),
) -> Result:
    """``tpbench tune``: a new tune of ``suite`` with ``options`` under ``out`` (``start``), or the
    tune in ``resume`` gone on with its own options (``reopen``; ``launcher`` ``sweep.RECORDED``:
    the run's own), raced to its result (``race``)."""
    if resume is not None:
        the_run, options = reopen(resume)
        launcher = sweep.launcher_of(the_run.record) if launcher == sweep.RECORDED else launcher
    else:
        the_run, _ = start(suite, options, overrides, filters, out, launcher, allow_large)
    with progress(the_run) as watch:
        return race(the_run, options, watch.listener, launcher, watch.on_round)


def _cut(run: store.Run, cases: list[Case]) -> None:
    """After a world's race: every arm it ran that is not done yet is done with the rounds it ran
    (a race ended by the budget, or replayed as ended on a resume)."""
    status = run.case_status()
    for c in cases:
        ran = store.finished_repeats(run.dir, c.case_id)
        if status[c.case_id] not in (store.DONE, store.FAILED) and ran:
            run.case_cut(c.case_id, len(ran))


def _record(options: Options, races: list[Race], wall_s: float) -> dict[str, Any]:
    """tune.json: the options, how each world's race stands, every judged round (the race chart)."""
    return {
        "options": asdict(options),
        "wall_s": wall_s,
        "worlds": {
            str(r.world): {
                "arms": r.arms,
                "rounds": r.rounds,
                "ended": r.ended,
                "live": r.live,
                "eliminated": r.eliminated,
                "retired": r.retired,
                "failed": sorted(r.failed),
            }
            for r in races
        },
        "history": [e for r in races for e in r.history],
    }


def _result(
    run: store.Run, cases: list[Case], races: list[Race], options: Options, wall_s: float, summary: pd.DataFrame
) -> Result:
    """The recommendation across worlds, each arm's status and ratio to it, the claim and the cost;
    ``summary``: the finalized run's, for the held-out loss each arm ends at."""
    n_arms = len(cases)
    across = spent_confidence(options.confidence, 1, n_arms - 1)
    winners = [(r, r.leader()) for r in races if r.leader() is not None]
    best_race, best = min(winners, key=lambda w: geomean(w[0].judged(w[1]))) if winners else (None, None)
    status = _statuses(races, best_race, best, options.epsilon, across)
    ratios = _ratios_to_best(cases, races, best_race, best, across) if best is not None else {}
    if best is not None:
        status[best] = RECOMMENDED
    arms = _arms(cases, races, status, ratios, summary)
    order = {RECOMMENDED: 0, TIED: 1, UNRESOLVED: 2, ELIMINATED: 3, FAILED: 4}
    arms.sort(key=lambda x: (order[x.status], x.ratio if x.ratio is not None else math.inf))
    counts = {s: sum(x.status == s for x in arms) for s in order}
    rec = next((x for x in arms if x.status == RECOMMENDED), None)
    # Every arm failed: nothing was raced, and nothing is recommended (exit 1, as a failed sweep).
    state = FAILED if rec is None else UNRESOLVED if counts[UNRESOLVED] else TIED if counts[TIED] else RECOMMENDED
    across_rounds = _across_rounds(races, best_race, best, options.epsilon, across) if best is not None else 0
    more = _more_rounds([r for r in races if r.decided is None], rec.rounds if rec else 0, across_rounds)
    seconds = _round_seconds(run, cases)
    timed_s, grid_timed_s = _timed(seconds, rec.rounds if rec else 0)
    shown = supported_epsilon(ratios.get(a.case_id) for a in arms if a.status in (TIED, UNRESOLVED)) if rec else None
    claim = _claim(rec, state, counts, n_arms, options, races, more, shown)
    history = [e for r in races for e in r.history]
    step = _next_step(run, races, rec, more, options, wall_s) if state == UNRESOLVED else None
    decide_s = _decide_wall_s(arms, seconds, rec.rounds + more, wall_s, timed_s) if step and rec and more else None
    trace = _trace_step(run, arms)
    samples = {c.case_id: c.world_size * c.batch_size for c in cases}
    notes = (
        _work_note(rec, arms, samples, options.metric),
        _training_note(rec, arms, options.metric, _has_target(summary)),
    )
    note = " ".join(n for n in notes if n) or None
    return Result(
        run_dir=run.dir,
        state=state,
        recommended=rec,
        claim=claim,
        arms=arms,
        epsilon=options.epsilon,
        confidence=options.confidence,
        metric=options.metric,
        wall_s=wall_s,
        timed_s=timed_s,
        grid_timed_s=grid_timed_s,
        rounds_to_decide=more,
        supported_epsilon=shown,
        history=history,
        next_step=step,
        decide_wall_s=decide_s,
        trace_step=trace,
        training_note=note,
        worlds=_world_lines(races, {a.case_id: a.label for a in arms}, options.epsilon),
    )


def _world_lines(races: list[Race], names: dict[str, str], epsilon: float) -> list[str]:
    """Each world's own answer, where the arms span worlds (another link, world size or backend):
    the claim across worlds sets a setting against another machine's and mostly says which link or
    world is faster, while a world's race says which setting to use on it, on the same intervals
    (paired by round, at the confidence spent over every arm of the tune)."""
    if len(races) < 2:
        return []
    lines = []
    for r in races:
        leader = r.leader()
        if leader is None:  # no round judged: the budget ended first, or every setting failed
            failed = len(r.failed) == len(r.arms)
            why = "failed" if failed else "not raced: the budget was spent before their world started"
            lines.append(f"{', '.join(names[a] for a in r.arms)}: {why}")
            continue
        n, out = len(r.arms) - len(r.failed), len(r.eliminated)
        if n == 1:
            said = "the only setting in its world"
        elif r.decided == ONE_LEFT:
            said = f"the best of {n} in its world"
        elif r.decided == ALL_TIED:
            said = f"within {verdict.percent(epsilon)} of the best of {n} in its world, tied with {len(r.retired)}"
        else:
            said = f"the best guess of {n} in its world, unresolved"
        lines.append(f"{names[leader]}: {said}" + (f"; {out} eliminated" if out else ""))
    return lines


def _statuses(races: list[Race], best_race: Race | None, best: str | None, eps: float, across: float) -> dict[str, str]:
    """Each arm's status but the recommended one's: eliminated or failed in its world; in the best
    arm's world tied with it (or unresolved); in another world, its winner's outcome against the
    best arm, unpaired at the confidence spent ``across`` the arms."""
    status: dict[str, str] = {}
    for r in races:
        for a in r.eliminated:
            status[a] = ELIMINATED
        for a in r.failed:
            status[a] = FAILED
        decided = r.decided is not None
        if r is best_race:
            for a in r.live:
                if a != best:
                    status[a] = TIED if decided else UNRESOLVED
            for a in r.retired:  # checked against this leader after the last round: safe from it
                status[a] = TIED
            continue
        winner = r.leader()
        if winner is None:
            continue
        w = _unpaired_to(best_race, best, r, winner, across)  # a leader has judged rounds: never None
        # The world's arms left share its winner's outcome: they are tied with it (or undecided),
        # unless an arm's own interval against the best shows it slower. Without an interval (a
        # value a side) nothing is decided.
        known = w.method != "single"
        tied = decided and known and within_epsilon(w, eps)
        for a in [*r.live, *r.retired]:
            own = w if a == winner else _unpaired_to(best_race, best, r, a, across)
            out = (known and w.lo > 1) or (own is not None and own.method != "single" and own.lo > 1)
            status[a] = ELIMINATED if out else TIED if tied else UNRESOLVED
    return status


def _ratios_to_best(
    cases: list[Case], races: list[Race], best_race: Race, best: str, across: float
) -> dict[str, Ratio]:
    """Each other arm's ratio to the best one: in the best arm's world the race's own interval (for
    an arm still in it, the one it was tied or left unresolved by; for one that went, over its
    rounds); unpaired elsewhere."""
    ratios: dict[str, Ratio] = dict(best_race.intervals(best))
    for c in cases:
        a = c.case_id
        if a == best:
            continue
        home = next(r for r in races if a in r.arms)
        if a in ratios:
            continue
        if home is best_race:
            if best_race.judged(a):
                ratios[a] = best_race.interval(best, a)
        elif (r := _unpaired_to(best_race, best, home, a, across)) is not None:
            ratios[a] = r
    return ratios


def _unpaired_to(best_race: Race, best: str, race: Race, arm: str, across: float) -> Ratio | None:
    """``arm`` (of another world) / the best arm, unpaired at the confidence spent ``across`` the
    arms; None where the arm ran no round."""
    if not race.judged(arm):
        return None
    return unpaired_ratio(
        np.fromiter(best_race.judged(best).values(), float),
        np.fromiter(race.judged(arm).values(), float),
        confidence=across,
    )


def _across_rounds(races: list[Race], best_race: Race, best: str, eps: float, across: float) -> int:
    """About how many rounds each world would need to decide its winner against the best arm,
    unpaired (``racing.settling_rounds``; 0 where every such comparison is decided). One look, so
    no quantile grows."""
    need = 0
    for r in races:
        winner = r.leader()
        if r is best_race or winner is None:
            continue
        w = _unpaired_to(best_race, best, r, winner, across)
        if w is None or w.method == "single" or w.lo > 1 or within_epsilon(w, eps):
            continue
        need = max(need, settling_rounds(w, eps))
    return need


def _arms(
    cases: list[Case], races: list[Race], status: dict[str, str], ratios: dict[str, Ratio], summary: pd.DataFrame
) -> list[Arm]:
    """Each arm as the result shows it, in the grid's order."""
    convergence = summary.set_index("case_id") if "final_heldout_loss" in summary else None
    names = labels([cases])[0]
    swept = varying_keys(cases)
    world_of = {a: r.world for r in races for a in r.arms}
    arms = []
    for c in cases:
        a, rr = c.case_id, ratios.get(c.case_id)
        home = next(r for r in races if a in r.arms)
        arms.append(
            Arm(
                a,
                names[a],
                {k: c.params()[k] for k in swept},
                world_of[a],
                status.get(a, UNRESOLVED),
                len(home.judged(a)),
                rr.ratio if rr else None,
                rr.lo if rr and rr.method != "single" else None,
                rr.hi if rr and rr.method != "single" else None,
                home.eliminated.get(a),
                home.retired.get(a, home.retired_then_out.get(a)),
                _eliminated_vs(home, a),
                *_converged(convergence, a),
            )
        )
    return arms


def _converged(convergence: pd.DataFrame | None, arm: str) -> tuple[float | None, float | None]:
    """The arm's final held-out loss and time to the target loss from the run's summary (None
    where not measured: JSON has no NaN)."""
    if convergence is None or arm not in convergence.index:
        return None, None
    row = convergence.loc[arm]
    return tuple(None if pd.isna(row.get(k)) else float(row[k]) for k in ("final_heldout_loss", "time_to_target_s"))


def _has_target(summary: pd.DataFrame) -> bool:
    return "target_loss" in summary and bool(summary["target_loss"].notna().any())


def _training_note(rec: Arm | None, arms: list[Arm], metric: str, target: bool) -> str | None:
    """Said where the settings do not train alike (post-local SGD averaging now and then, a hook
    that compresses gradients): the race compared the time of a step, which says nothing of how
    far the step takes the model. When the recommended setting's held-out loss ends more than
    ``LEVEL_NATS`` above the lowest one's, the faster steps may have bought a worse model, and the
    claim alone would hide it: the note gives both losses and, where the workload knows its target
    loss, the training time the recommended setting took to reach it against the setting that
    reached it soonest. Settings that compute the same update (DDP and the ZeRO variants) end
    level and get no note."""
    scored = [a for a in arms if a.heldout_loss is not None and a.status != FAILED]
    if rec is None or rec.heldout_loss is None or len(scored) < 2:
        return None
    low = min(scored, key=lambda a: a.heldout_loss)
    gap = rec.heldout_loss - low.heldout_loss
    if gap <= LEVEL_NATS:
        return None

    said = (
        f"The settings do not train alike: the recommended one's held-out loss ends at {rec.heldout_loss:.3f}, "
        f"{gap:.3f} nats above the lowest ({low.label}, {low.heldout_loss:.3f})"
    )
    if target:
        said += ", and " + _to_target(rec, scored)
    return (
        f"{said}. The race compared {metric} alone, which does not count how far a step takes the model: weigh "
        "the two (the report's Convergence section has the curves)."
    )


def _work_note(rec: Arm | None, arms: list[Arm], samples: dict[str, int], metric: str) -> str | None:
    """Said where the settings do not take the same samples a step (``batch_size`` is per rank, so
    a world of 2 ranks takes twice a world of 1's): the race ranked time per step, and a setting
    slower per step may train faster per sample. Each such arm's ratio to the recommended one per
    sample is its ratio per step times the recommended arm's samples over its own, interval and all."""
    if rec is None or len({samples[a.case_id] for a in arms}) < 2:
        return None
    mine = samples[rec.case_id]
    per_sample = [
        f"{a.label} ×{a.ratio * f:.2f} [{a.lo * f:.2f}, {a.hi * f:.2f}]"
        for a in arms
        if a is not rec and a.ratio is not None and a.lo is not None and (f := mine / samples[a.case_id]) != 1
    ]
    said = (
        f"The settings do not take the same samples a step (batch_size per rank × world_size: {mine} for the "
        f"recommended one, {', '.join(str(n) for n in sorted(set(samples.values()) - {mine}))} for others), and "
        f"the race compared time per step ({metric})."
    )
    if per_sample:
        said += " Per sample, against the recommended one: " + "; ".join(per_sample) + "."
    return said


def _to_target(rec: Arm, scored: list[Arm]) -> str:
    """Which setting reaches the workload's target loss in the least training time, against the
    recommended one: what a user who trains to a loss, not for a number of steps, would choose by."""
    reached = [a for a in scored if a.time_to_target_s is not None]
    if not reached:
        return "none reaches the target loss in every round it ran"
    soonest = min(reached, key=lambda a: a.time_to_target_s)
    if soonest is rec:
        return f"it reaches the target loss soonest of all ({rec.time_to_target_s:.3g} s of training)"
    mine = (
        "it does not reach the target loss in every round"
        if rec.time_to_target_s is None
        else f"it reaches the target loss in {rec.time_to_target_s:.3g} s of training"
    )
    return f"{mine}, where {soonest.label} takes {soonest.time_to_target_s:.3g} s"


def _eliminated_vs(race: Race, arm: str) -> dict[str, Any] | None:
    """The leader of the round that eliminated ``arm`` and the arm's interval against it then."""
    went = next((e for e in race.history if arm in e["eliminated"]), None)
    if went is None:
        return None
    ratio, lo, hi = went["intervals"][arm]
    return {"leader": went["leader"], "ratio": ratio, "lo": lo, "hi": hi}


def _claim(
    rec: Arm | None,
    state: str,
    counts: dict[str, int],
    n: int,
    options: Options,
    races: list[Race],
    more: int | None,
    shown: float | None,
) -> str:
    """The one sentence: which setting, how close to the best, how sure, and what the others did."""
    if rec is None:
        return f"no recommendation: every one of the {n} settings failed"
    conf = f"{verdict.percent(options.confidence)} confidence"
    gone = f"{counts[ELIMINATED]} eliminated"
    failed = f", {counts[FAILED]} failed" if counts[FAILED] else ""
    if state == RECOMMENDED:
        return f"{rec.label}: the best of {n} settings, {conf}; {gone}{failed}"
    if state == TIED:
        return (
            f"{rec.label}: within {verdict.percent(options.epsilon)} of the best of {n} settings, {conf}; "
            f"tied with {counts[TIED]}, {gone}{failed}"
        )
    # Why the rounds stopped: those of the worlds whose race is open, else (the worlds' winners not
    # told apart, unpaired) of any world.
    why = (
        sorted({r.ended for r in races if r.decided is None} - {None})
        or sorted({r.ended for r in races} - {None, ONE_LEFT, ALL_TIED})
        or [MAX_ROUNDS]
    )
    then = f"; about {more} more round{'' if more == 1 else 's'} would decide it" if more else ""
    resolved = f"; the rounds run show it within {shown:.1%} of the best" if shown is not None else ""
    tied = f"tied with {counts[TIED]}, " if counts[TIED] else ""
    return (
        f"{rec.label}: the best guess of {n} settings, unresolved ({', '.join(why)}): {counts[UNRESOLVED]} "
        f"still within reach of it at {conf} and ±{verdict.percent(options.epsilon)}, "
        f"{tied}{gone}{failed}{resolved}{then}"
    )


def _more_rounds(races: list[Race], rounds: int, across: int = 0) -> int | None:
    """About how many rounds beyond ``rounds`` (the recommended arm's) a race of these settings
    would need to decide the ``races`` still open (``Race.rounds_to_decide``) and the worlds'
    winners against the best (``across``: ``_across_rounds``). The race would be a fresh one given
    that many rounds in all (or its suite's repeats, if more), spending its confidence over more
    looks than these did: the estimate is asked again for a race that long until it settles. None
    without one."""
    total = max([across, *(r.rounds + n for r in races if (n := r.rounds_to_decide()))])
    if not total:
        return None
    for _ in range(20):  # the quantile grows as the log of the looks: a few steps settle it
        again = max([across, *(r.rounds + (r.rounds_to_decide(max(total, r.max_rounds)) or 0) for r in races)])
        if again <= total:
            break
        total = again
    return total - rounds if total > rounds else None


def _next_step(
    run: store.Run, races: list[Race], rec: Arm | None, more: int | None, options: Options, wall_s: float
) -> str | None:
    """What to run to decide an unresolved tune: the same suite raced afresh for about the rounds
    the estimate says would decide it (``_more_rounds``; at least the repeats it had), and, where
    the budget ended it, the wall time those rounds took here, scaled. Afresh, because the rounds
    run here were judged at the confidence this tune's rounds and budget spent: a race that went on
    with more would look more often than its intervals allowed for. None without an estimate."""
    if rec is None or not more:
        return None
    rounds = rec.rounds + more
    ended = {r.ended for r in races}
    parts = [f"tpbench tune {run.record.suite.path or run.record.suite.name + '.toml'}"]
    # Always said: this tune's repeats may have come from its own --set, which the command leaves out.
    parts.append(f"--set repeats={max(rounds, *(r.max_rounds for r in races))}")
    defaults = Options()
    if options.epsilon != defaults.epsilon:
        parts.append(f"--epsilon {options.epsilon * 100:.4g}%")
    if options.confidence != defaults.confidence:
        parts.append(f"--confidence {options.confidence * 100:.4g}%")
    if options.metric != defaults.metric:
        parts.append(f"--metric {options.metric}")
    if options.min_rounds != defaults.min_rounds:
        parts.append(f"--min-rounds {options.min_rounds}")
    if BUDGET in ended or options.budget_s is not None:
        parts.append(f"--budget-s {math.ceil(wall_s * rounds / max(rec.rounds, 1))}")
    return " ".join(parts)


def traced_arms(arms: list[Arm]) -> list[Arm]:
    """The arms whose time a trace should split: the recommended one and its closest rival (the tied
    or unresolved arm nearest it, else the runner-up among the eliminated: why it is slower is then
    the question), where there is one; none where nothing is recommended."""
    rec = next((a for a in arms if a.status == RECOMMENDED), None)
    if rec is None:
        return []
    close = [a for a in arms if a.status in (TIED, UNRESOLVED) and a.ratio is not None]
    out = [a for a in arms if a.status == ELIMINATED and a.ratio is not None]
    rival = min(close or out, key=lambda a: a.ratio, default=None)
    return [rec] if rival is None else [rec, rival]


def _trace_step(run: store.Run, arms: list[Arm]) -> str | None:
    """The sweep that shows where the recommended arm's time goes, beside its closest rival's
    (``traced_arms``): a tune traces nothing, and a sweep of the two traces both, so that its report
    splits their steps into compute, exposed communication and idle and ``whatif`` can replay them
    (``--trace`` runs one itself, ``tune_trace``). Selected by case id, which the budget keys
    (``repeats``) do not change."""
    traced = traced_arms(arms)
    if not traced:
        return None
    ids = "|".join(a.case_id for a in traced)
    suite = run.record.suite.path or run.record.suite.name + ".toml"
    return f"tpbench sweep {suite} --filter {shlex.quote('id=' + ids)}"  # quoted: | is a shell pipe


def _round_seconds(run: store.Run, cases: list[Case]) -> dict[str, pd.Series]:
    """Each arm's timed-step seconds per round it ran (slowest rank per step); arms without steps left out."""
    out = {}
    for c in cases:
        rows = store.case_steps(run.dir, c.case_id)
        if not rows.empty:
            out[c.case_id] = slowest_rank(rows.assign(case_id=c.case_id)).groupby("repeat")["step_ms"].sum() / 1e3
    return out


def _timed(seconds: Mapping[str, pd.Series], rounds: int) -> tuple[float, float]:
    """The timed-step seconds the tune ran (every arm and round, ``_round_seconds``), and what
    every arm would have timed over ``rounds`` rounds (each arm's mean per round × ``rounds``)."""
    timed = sum(float(s.sum()) for s in seconds.values())
    return timed, sum(float(s.mean()) for s in seconds.values()) * rounds


def _decide_wall_s(
    arms: list[Arm], seconds: Mapping[str, pd.Series], rounds: int, wall_s: float, timed_s: float
) -> float | None:
    """At most about how long, in wall time here, the race ``_next_step`` names would take: each arm
    still in reach of the recommended one (and that one) timed for all ``rounds`` rounds at its mean
    per round, each arm this race decided for the rounds it ran here (its gap, which decided it,
    stays), the whole scaled by this tune's wall time over its timed steps (start-up, models, the
    race's own work). A race that decides sooner, or retires an arm on the way, takes less: the
    front door's said 6 min and took 4 (docs/tune.md). None without timed steps."""
    if not timed_s or not seconds:
        return None
    live = (RECOMMENDED, UNRESOLVED)
    timed = sum(
        float(seconds[a.case_id].mean()) * (rounds if a.status in live else a.rounds)
        for a in arms
        if a.case_id in seconds
    )
    return timed * wall_s / timed_s
