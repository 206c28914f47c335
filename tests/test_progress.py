"""Progress in a log (stderr a file or a pipe: CI, nohup, Slurm; capsys's is one): the plain lines
the sweep and the tune say there instead of rich's line, paced by ``PlainPace``. The clock is a
stepped one, so each test is the same on any machine; no rank process is started."""

from __future__ import annotations

import dataclasses
import io
import random
import re
from pathlib import Path

from tpbench import racing, suite
from tpbench.cli.sweep import SweepProgress
from tpbench.cli.tune import TuneProgress
from tpbench.pace import PlainPace

REPO = Path(__file__).resolve().parents[1]


class Clock:
    """Seconds that pass only when the test says so."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def zero_cases() -> list:
    """suites/zero.toml's 18 cases of 12 repeats: the 216-line log of the finding."""
    return suite.expand(suite.load(REPO / "suites" / "zero.toml"))


def sweep_events(progress: SweepProgress, cases: list, clock: Clock, repeat_s: float) -> None:
    """One world running every case round by round, as the launcher tells it, ``repeat_s`` a repeat;
    the first case's trace window taken again in its last round."""
    rounds = cases[0].repeats
    progress(
        "world_start",
        {"world": "w0", "world_size": 2, "backend": "gloo", "interconnect": "loopback", "items": rounds * len(cases)},
    )
    for r in range(rounds):
        for c in cases:
            progress("repeat_start", {"case": c.case_id, "repeat": r})
            clock.t += repeat_s
            if r == rounds - 1 and c is cases[0]:
                progress("trace_retake", {"case": c.case_id, "window": 2})
            progress("repeat_end", {"case": c.case_id, "repeat": r})
            if r == rounds - 1:
                progress("case_end", {"case": c.case_id})
    progress("world_done", {"world": "w0"})


def test_a_sweep_in_a_log_says_a_few_paced_lines_not_one_per_repeat(capsys):
    """zero.toml away from a terminal said a line per finished repeat, 216 of them. Now: the world's
    start, a finished repeat once 30 s and a tenth of the work have passed since the log's last line
    (a line every 22 repeats at 3 s a repeat), the trace window taken again whenever it comes, and
    the world's end with the final counts."""
    cases, clock = zero_cases(), Clock()
    progress = SweepProgress(cases, {c.case_id: c.repeats for c in cases}, clock=clock)
    sweep_events(progress, cases, clock, repeat_s=3.0)
    said = capsys.readouterr().err.splitlines()
    assert said[0].startswith("starting 2 ranks on loopback… (")
    routine = [int(m.group(1)) for line in said if (m := re.match(r"repeats (\d+)/216: .* repeat \d+/12 done;", line))]
    assert routine == list(range(22, 216, 22)), said
    assert sum("tracing again, window 2 of at most 3" in line for line in said) == 1, said
    assert said[-1].startswith("repeats 216/216: world of 2 ranks on loopback finished; cases 18/18 done ("), said
    assert len(said) == 1 + len(routine) + 1 + 1


def test_a_short_sweep_in_a_log_says_its_world_start_and_end_only(capsys):
    """Under 30 s in all, no finished repeat is worth a line: the world's end says the counts."""
    cases, clock = zero_cases()[:2], Clock()
    progress = SweepProgress(cases, {c.case_id: c.repeats for c in cases}, clock=clock)
    sweep_events(progress, cases, clock, repeat_s=1.0)
    said = capsys.readouterr().err.splitlines()
    assert [line.split(" (")[0] for line in said] == [
        "starting 2 ranks on loopback…",
        said[1].split(" (")[0],  # the trace window taken again
        "repeats 24/24: world of 2 ranks on loopback finished; cases 2/2 done",
    ]
    assert "tracing again" in said[1]


def test_the_pace_says_a_line_at_least_every_5_minutes_when_a_tenth_of_the_work_takes_longer():
    """A tenth of 100 repeats of 40 s is 400 s; CI services kill a job silent for 10 minutes, so the
    line comes after 300 s anyway, every 8th repeat. Quick work waits 30 s between lines."""
    clock = Clock()
    pace = PlainPace(100, clock)
    due = []
    for done in range(1, 101):
        clock.t += 40
        if pace.due(done):
            pace.said(done)
            due.append(done)
    assert due == list(range(8, 101, 8))
    clock = Clock()
    pace = PlainPace(1000, clock)
    clock.t += 29.9
    assert not pace.due(900)
    clock.t += 0.1
    assert pace.due(900) and not pace.due(99)


def test_a_long_tune_in_a_log_says_the_rounds_that_decided_something_and_a_few_others(capsys):
    """A 120-round race (a real ``racing.Race`` judging noisy values, a round every 2 s) said a line
    per judged round. Now a round is said when it eliminated, retired or brought back an arm, when
    the race ended, and otherwise once 30 s and a tenth of the rounds passed since the last line."""
    cases = [dataclasses.replace(c, repeats=120) for c in zero_cases()[:3]]
    clock = Clock()
    progress = TuneProgress(cases, clock=clock)
    arms = [c.case_id for c in cases]
    race = racing.Race(arms, 120, racing.Options(), comparisons=2)
    rng, slow = random.Random(1), arms[2]
    while race.ended is None:
        for a in race.live:
            race.record(a, race.rounds, (400.0 if a == slow else 100.0) * rng.uniform(0.5, 1.5))
        clock.t += 2
        progress.round(race, race.close_round())
    said = capsys.readouterr().err.splitlines()
    judged = [line for line in said if line.startswith("tune round ")]
    decided = [e["round"] for e in race.history if e["eliminated"] or e["retired"] or e["back"]]
    assert decided and race.history[-1]["round"] == 120
    numbers = [int(line.split()[2].split("/")[0]) for line in judged]
    assert set(decided) | {120} <= set(numbers), judged
    assert len(judged) <= len(decided) + 1 + 10, judged
    assert "eliminated" in judged[numbers.index(race.eliminated[slow])]


def test_a_judged_round_counts_the_retired_and_eliminated_arms_apart_from_those_still_racing(capsys):
    """A tie's last line said "round 6/8: 1 of 7 left" while its claim said "tied with 2": "left"
    counted only the arms still running, not the retired ones the tie keeps. Each judged round now
    says how many arms still race, and how many are retired and eliminated."""
    cases = [dataclasses.replace(c, repeats=40) for c in zero_cases()[:3]]
    progress = TuneProgress(cases, clock=Clock())
    arms = [c.case_id for c in cases]
    race = racing.Race(arms, 40, racing.Options(), comparisons=2)
    rng = random.Random(3)
    factors = dict(zip(arms, (1.0, 1.005, 3.0)))  # the leader, one it retires, one it eliminates
    while race.ended is None:
        for a in race.live:
            race.record(a, race.rounds, 100.0 * factors[a] * rng.uniform(0.98, 1.02))
        progress.round(race, race.close_round())
    last = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tune round ")][-1]
    assert race.ended == racing.ALL_TIED and len(race.live) == len(race.retired) == len(race.eliminated) == 1
    assert f"tune round {race.rounds}/40: 1 of 3 still racing, 1 retired, 1 eliminated, leader " in last, last
    assert " left" not in last


def test_a_judged_rounds_counts_add_up_to_the_settings_where_one_failed(capsys):
    """A setting whose case failed leaves the race (``Race.drop``): the round's line counted the arms
    racing, retired and eliminated, and the failed one went unsaid, the counts short of the settings."""
    cases = [dataclasses.replace(c, repeats=40) for c in zero_cases()[:3]]
    progress = TuneProgress(cases, clock=Clock())
    arms = [c.case_id for c in cases]
    race = racing.Race(arms, 40, racing.Options(), comparisons=2)
    race.drop(arms[2])
    rng = random.Random(3)
    while race.ended is None:  # the two alike: the race ends tied or with its rounds spent
        for a in race.live:
            race.record(a, race.rounds, 100.0 * rng.uniform(0.9, 1.1))
        progress.round(race, race.close_round())
    last = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tune round ")][-1]
    assert " 2 of 3 still racing, 1 failed, leader " in last, last


def test_a_failure_or_a_kept_trace_in_a_log_is_one_line_however_long(capsys):
    """A log's console is 80 columns wide: a failed case's cause, a world's retry and the trace
    window kept were wrapped there into pieces of 80 ('trace of … kept: its forward' / 'passes at
    ×0.66 …'), so that a grep for the case's label found a sentence's first piece only. Each is one
    line now, as the progress lines are."""
    cases, clock = zero_cases()[:2], Clock()
    progress = SweepProgress(cases, {c.case_id: c.repeats for c in cases}, clock=clock)
    cause = "rank 1 raised RuntimeError: " + "a cause long enough to pass the width of a log's console, " * 2
    progress("world_retry", {"world": "w0", "cause": cause})
    progress("trace_retry", {"case": cases[0].case_id, "cause": cause})
    progress("case_failed", {"case": cases[1].case_id, "cause": cause})
    TuneProgress(cases, clock=clock)("case_failed", {"case": cases[1].case_id, "cause": cause})
    speeds = {"forward_speed": [0.3, 0.66], "step_speed": [0.4, 1.23], "thread_speed": [0.3, 0.88]}
    window = {"windows": 2, "kept": 1, **speeds}
    progress("capture", {"case": cases[0].case_id, "trace": window})
    said = capsys.readouterr().err.splitlines()
    assert sum(cause in line for line in said) == 4, said
    kept = [line for line in said if line.startswith("trace of ")]
    tail = "its training thread's CPU time at ×0.88 (1 window before it ran below half speed)"
    assert kept and kept[0].endswith(tail), said


def _drawn(progress, width: int) -> str:
    """What a terminal of ``width`` columns shows of ``progress``'s live display."""
    from rich.console import Console

    screen = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    screen.print(progress.get_renderable())
    return screen.export_text()


def test_the_live_lines_cut_nothing_on_an_80_column_terminal():
    """On one line an 80-column terminal showed "re…  hook_with_zero_step bucket_cap_mb=0.5
    shard_buckets=True (repeat 5/12); ca…" for a sweep (its bar, count and times gone) and the tune's
    leader cut to "zero_no_over…": the long fields are now lines of their own, folded, not cut."""
    cases = zero_cases()
    sweep = SweepProgress(cases, {c.case_id: c.repeats for c in cases})
    sweep("repeat_start", {"case": cases[7].case_id, "repeat": 4})
    tune = TuneProgress(cases)
    race = racing.Race([c.case_id for c in cases], 12, racing.Options(), comparisons=17)
    leader = cases[5].case_id
    entry = {"round": 4, "live": [c.case_id for c in cases[:9]], "leader": leader, "ended": None}
    tune.round(race, entry | {"eliminated": [], "retired": [], "back": []})
    tune("repeat_start", {"case": cases[7].case_id, "repeat": 4})
    labels = suite.labels([cases])[0]
    for progress, words in (
        (sweep.progress, ["0/216", "ETA", *labels[cases[7].case_id].split(), "(repeat", "5/12);", "0/18"]),
        (tune.progress, ["tune", "4/12:", "9", "of", "18", *labels[leader].split(), *labels[cases[7].case_id].split()]),
    ):
        drawn = _drawn(progress, 80)
        assert "…" not in drawn and all(len(line) <= 80 for line in drawn.splitlines()), drawn
        said = drawn.split()
        assert all(word in said for word in words), drawn


def test_a_resumed_sweep_counts_from_the_repeats_on_disk_and_the_run_s_earlier_time(capsys):
    """A resumed sweep's progress started at "repeats 0/16" and "0:00:00 elapsed", as if the run had
    just begun, though 8 of its cases' 24 repeats were on disk and it had run worlds for 10 minutes.
    Now it counts from the repeats on disk and the time run.json records (``earlier_s``); the ETA is
    this session's pace over what is left, 14 repeats at 30 s each after two, not skewed by them."""
    cases, clock = zero_cases()[:2], Clock()
    first, second = (c.case_id for c in cases)
    progress = SweepProgress(cases, {first: 4, second: 12}, clock=clock, earlier_s=600)
    progress(
        "world_start", {"world": "w0", "world_size": 2, "backend": "gloo", "interconnect": "loopback", "items": 16}
    )
    for case, repeats in ((first, range(8, 12)), (second, range(12))):
        for r in repeats:
            progress("repeat_start", {"case": case, "repeat": r})
            clock.t += 30
            progress("repeat_end", {"case": case, "repeat": r})
        progress("case_end", {"case": case})
    progress("world_done", {"world": "w0"})
    said = capsys.readouterr().err.splitlines()
    assert said[0] == "starting 2 ranks on loopback… (0:10:00 elapsed)", said
    label = "zero_no_overlap parameters_as_bucket_view=False"
    assert said[1] == f"repeats 10/24: {label} repeat 10/12 done; cases 0/2 done (0:11:00 elapsed, ETA 0:07:00)", said
    end = "repeats 24/24: world of 2 ranks on loopback finished; cases 2/2 done (0:18:00 elapsed, ETA 0:00:00)"
    assert said[-1] == end, said


def test_a_resumed_tune_counts_its_elapsed_time_from_the_tune_s_earlier_time(capsys):
    """As a resumed sweep does: a tune's elapsed time went on from 0:00:00, though its budget
    (``--budget-s``) counts the time of its earlier sessions too."""
    clock = Clock()
    TuneProgress(zero_cases()[:2], clock=clock, earlier_s=90)
    assert capsys.readouterr().err == "tune 2 settings, starting… (0:01:30 elapsed)\n"


def test_a_resumed_sweep_s_display_counts_the_time_run_json_records(tmp_path, capsys):
    """The display of a phase takes the run's earlier time from run.json's ``wall_s``: the time the
    run spent running worlds before it, which the closing line of a resume calls the whole run's."""
    from tpbench import sweep
    from tpbench.cli.sweep import SweepDisplay

    prepared = sweep.prepare(REPO / "suites" / "smoke.toml")
    run = sweep.start(prepared, tmp_path)
    run.add_wall_time(600)
    phase = sweep.Phase(run, prepared.cases, {c.case_id: c.repeats for c in prepared.cases})
    with SweepDisplay()(phase) as listener:
        listener(
            "world_start", {"world": "w0", "world_size": 2, "backend": "gloo", "interconnect": "loopback", "items": 4}
        )
    assert "starting 2 ranks on loopback… (0:10:00 elapsed)" in capsys.readouterr().err


def test_a_world_across_nodes_is_said_the_way_the_dry_run_says_it(tmp_path, capsys):
    """Across nodes Gloo's loopback runs over the nodes' network (``worlds.torchrun_env``) and the
    dry run says so, "2×gloo/cpu network across 2 nodes"; the progress of the same run said
    "starting 2 ranks on loopback…". The sweep and the tune take the nodes from the run's recorded
    launcher, as the dry run of a resume does (``nodes_of``)."""
    from tpbench import sweep
    from tpbench.cli.sweep import SweepDisplay
    from tpbench.cli.tune import _TuneDisplay
    from tpbench.worlds import Torchrun

    prepared = sweep.prepare(REPO / "suites" / "smoke.toml")
    launcher = Torchrun(nnodes=2, nproc_per_node=1, rdzv_endpoint="192.0.2.1:29500", agent_prefix=("srun", "-N2"))
    run = sweep.start(prepared, tmp_path, launcher, print_only=True)
    start = {"world": "w0", "world_size": 2, "backend": "gloo", "interconnect": "loopback", "items": 4}
    phase = sweep.Phase(run, prepared.cases, {c.case_id: c.repeats for c in prepared.cases})
    with SweepDisplay()(phase) as listener:
        listener("world_start", start)
        listener("world_done", {"world": "w0"})
    with _TuneDisplay()(run) as watch:
        watch.listener("world_start", start)
    said = [line.split(" (")[0] for line in capsys.readouterr().err.splitlines()]
    assert "starting 2 ranks on network across 2 nodes…" in said, said
    assert "tune starting 2 ranks on network across 2 nodes…" in said, said
    assert "repeats 0/4: world of 2 ranks on network across 2 nodes finished; cases 0/2 done" in said, said
    assert not any("loopback" in line for line in said), said
