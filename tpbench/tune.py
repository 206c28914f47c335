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

Once the races end, ``tune_answer`` reads them into the answer (``tune_record.TuneResult``, which
tune.json keeps); nothing here prints, the CLI shows it.
"""

from __future__ import annotations

import contextlib
import selectors
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from tpbench import lockstep, store, sweep, tune_answer
from tpbench.analysis.stats import repeat_values, windows_of
from tpbench.launch import Listener, group_cases
from tpbench.racing import BUDGET, MAX_ROUNDS, Options, Race, TuneError
from tpbench.suite import Case
from tpbench.tune_record import TuneRecord, TuneResult, TuneRound, TuneWorld
from tpbench.worlds import Torchrun

# What a tune overrides in the suite: it reads no trace (docs/tune.md, "Traces").
OVERRIDES = ("capture.profiler_steps=0",)


# ---------------------------------------------------------------- starting and resuming


def start(
    suite: str | Path | sweep.Prepared,
    options: Options,
    overrides: Iterable[str] = (),
    filters: Iterable[str] = (),
    out_root: Path = Path("results"),
    launcher: Torchrun | None = None,
    allow_large: bool = False,
) -> tuple[store.Run, list[Case]]:
    """Check the options and the grid, create the run directory with every arm pending and an
    empty race in tune.json. ``suite``: a path, or already ``prepare``d with ``options.min_rounds``
    (by the CLI, which warns of what the preparation noted before the race starts)."""
    options.check()
    if isinstance(suite, sweep.Prepared):
        prepared = suite
    else:
        prepared = prepare(suite, overrides, filters, launcher, allow_large, options.min_rounds)
    run = sweep.start(prepared, out_root, launcher)
    _save(run, TuneRecord(options, 0.0, {}, []))
    return run, prepared.cases


def prepare(
    suite_path: str | Path,
    overrides: Iterable[str] = (),
    filters: Iterable[str] = (),
    launcher: Torchrun | None = None,
    allow_large: bool = False,
    min_rounds: int = Options.min_rounds,
) -> sweep.Prepared:
    """The suite's arms (``sweep.prepare`` with the tune's own overrides last), checked raceable:
    two or more, and one ``repeats`` for all (the most rounds any arm gets), no fewer than the race's
    ``min_rounds``, before which it judges nothing (fewer, and it could only end unresolved)."""
    overrides = tuple(overrides)
    for o in overrides:
        key, _, value = (part.strip() for part in o.partition("="))
        if key == "capture.profiler_steps" and value != "0":
            raise TuneError(
                f"--set {o}: a tune traces nothing (its timed steps decide); --trace traces the recommended "
                "setting and its closest rival after the race"
            )
    prepared = sweep.prepare(suite_path, [*overrides, *OVERRIDES], filters, launcher, allow_large)
    prepared = replace(prepared, overrides=overrides)  # the user's own: the tune's are its business
    n = len(prepared.cases)
    if n < 2:
        left = " after --filter" if prepared.filters else ""
        raise TuneError(f"{suite_path}: {n} case{'s' if n != 1 else ''}{left}; a tune races two or more settings")
    repeats = sorted({c.repeats for c in prepared.cases})
    if len(repeats) > 1:
        raise TuneError(
            f"{suite_path}: repeats = {repeats}: expected one value for every arm (the most rounds any arm gets; "
            "set it in [defaults] or with --set repeats=N)"
        )
    if repeats[0] < min_rounds:
        raise TuneError(
            f"{suite_path}: repeats = {repeats[0]}: expected at least --min-rounds {min_rounds}, the rounds before "
            "the race judges any (--set repeats=N)"
        )
    return prepared


def reopen(run_dir: Path) -> tuple[store.Run, Options]:
    """A tune to resume (``sweep.reopen``: owned by this process, finished repeats kept) and its options."""
    saved = store.read_tune(run_dir)
    if saved is None:
        # A folder that is no run at all (empty, a results root, a file) is said as every command says
        # it, naming the runs it holds; only a run without tune.json is "a sweep, not a tune".
        store.read_run_json(run_dir)
        raise store.StoreError(f"{run_dir}: no {store.TUNE_FILE}; not a tune (resume a sweep with tpbench sweep)")
    options = saved.options  # its keys and their kinds checked by read_tune
    try:
        options.check()
    except TuneError as e:  # a value this tpbench would refuse
        raise store.StoreError(f"{Path(run_dir) / store.TUNE_FILE}: 'options': {e}") from None
    run, _ = sweep.reopen(run_dir)
    return run, options


def _save(run: store.Run, record: TuneRecord) -> None:
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
) -> TuneResult:
    """Run (or go on with) the tune of ``run``: each world's race in turn, then the result,
    saved to tune.json, the run finalized as a sweep is (summary, status), so that report,
    compare and export read it as any run.

    ``listener`` gets the launcher's events (the CLI's progress); ``on_round`` each judged round
    (called on the conductor's thread). ``KeyboardInterrupt`` (Ctrl-C, a stop signal) leaves the
    run interrupted with the race saved as of its last round: ``--resume`` goes on from there.
    """
    saved = store.read_tune(run.dir)
    cases = [c.case for c in run.record.cases.values()]
    groups = group_cases(cases)
    races = _replayed_races(run, cases, groups, options, saved)
    base_wall, t0 = float(saved.wall_s if saved else 0.0), time.monotonic()
    # A tune resumed after it ended races nothing more: its result is rebuilt and shown again, and
    # the wall time stays the tune's own (reading it back is not tuning).
    finished = had_ended(saved) and all(rc.ended is not None for rc in races)

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
    result = tune_answer.result(run, cases, races, options, spent(), loaded.summary)
    if finished:  # what --trace found of the same answer stands
        result = replace(result, where=saved.result.where)
    _save(run, replace(_record(options, races, result.wall_s), result=result))
    return result


def had_ended(saved: TuneRecord | None) -> bool:
    """Whether tune.json (``saved``) holds the tune's answer: ``race`` writes it only once every
    world's race has ended (an interrupted race's record has none), so resuming it races nothing
    more and shows the answer again; the CLI says so instead of a race starting."""
    return saved is not None and saved.ended


def _replayed_races(
    run: store.Run, cases: list[Case], groups: list, options: Options, saved: TuneRecord | None
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
        world = saved.worlds.get(str(rc.world)) if saved else None
        rc.replay({a: stored[a] for a in rc.arms}, world.ended if world else None)
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
    suite: str | Path | sweep.Prepared | None = None,
    options: Options = Options(),
    *,
    overrides: Iterable[str] = (),
    filters: Iterable[str] = (),
    out: Path = Path("results"),
    launcher: Torchrun | None | str = None,
    resume: Path | None = None,
    allow_large: bool = False,
    progress: Progress = lambda run: contextlib.nullcontext(Watch()),
) -> TuneResult:
    """``tpbench tune``: a new tune of ``suite`` (a path, or already ``prepare``d) with ``options``
    under ``out`` (``start``), or the
    tune in ``resume`` gone on with its own options (``reopen``; ``launcher`` ``sweep.RECORDED``:
    the run's own), raced to its result (``race``)."""
    if resume is not None:
        sweep.refuse_another_launcher(resume, launcher)
        the_run, options = reopen(resume)
        launcher = sweep.resumed_with(the_run, launcher)
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


def _record(options: Options, races: list[Race], wall_s: float) -> TuneRecord:
    """tune.json: the options, how each world's race stands, every judged round (the race chart)."""
    worlds = {
        str(r.world): TuneWorld(
            list(r.arms), r.rounds, r.ended, list(r.live), dict(r.eliminated), dict(r.retired), sorted(r.failed)
        )
        for r in races
    }
    history = [
        TuneRound(**e | {"intervals": {a: tuple(v) for a, v in e["intervals"].items()}})
        for r in races
        for e in r.history
    ]
    return TuneRecord(options, wall_s, worlds, history)
