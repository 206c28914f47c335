"""The "Recommendation" section of a tune's report: the claim, every setting's outcome, and the race
chart (each setting's ratio interval to the round's leader against rounds, eliminations marked).

It reads the run's tune.json (``tpbench.tune`` writes it; ``store.Loaded.tune`` reads it back, once
for the whole report), so the report needs none of the tune's machinery."""

from __future__ import annotations

import math
from typing import Any, Mapping

import pandas as pd
import plotly.graph_objects as go

from tpbench import store, verdict
from tpbench.analysis.explain import PARTS
from tpbench.report.figures import LEGEND_BELOW, LEGEND_TOP, MARGIN, SERIES_COLORS
from tpbench.report.html import Page, plot_text
from tpbench.tune_record import TuneRecord, TuneResult, TuneRound, TuneWorld, eliminated_vs


def section(page: Page, runs: list[store.Loaded]) -> None:
    tuned = [(r, r.tune) for r in runs if r.tune is not None]
    if not tuned:
        return
    page.heading("Recommendation", anchor="recommendation")
    for run, saved in tuned:
        if len(tuned) > 1:
            page.heading(f"run {run.record.run_id}", level=3)
        result = saved.result
        if result is None:  # interrupted (or still racing): the race so far, and how to get an answer
            _race_so_far(page, run, saved)
            continue
        page.paragraph(result.claim)
        if result.training_note:  # None in tune.json before it had one
            page.paragraph(result.training_note)
        if result.worlds:  # empty in tune.json before it had them, or of one world
            page.paragraph(verdict.WORLDS_SAY)
            page.bullets(result.worlds)
        if result.next_step:  # None in tune.json before it had one
            rec = next(a for a in result.arms if a.status == "recommended")
            more = result.rounds_to_decide  # None: nothing judged, no estimate (verdict.decide_words)
            rounds = more and rec.rounds + more
            said = verdict.decide_words(rounds, result.decide_wall_s, result.next_repeats)
            page.paragraph(said + result.next_step)
        if result.trace_step and not result.where:  # None in tune.json before it had one
            page.paragraph(
                "Where the time goes: a tune traces nothing (tpbench tune --trace does, after the race); this sweep "
                "traces the recommended setting and its closest rival, if any, and its report splits their steps "
                "into compute, exposed communication and idle (under the same launcher): "
                f"{result.trace_step}"
            )
        page.paragraph(
            f"Raced by tpbench tune on {result.metric}: after each round, once "
            f"{saved.options.min_rounds} had run, a setting was eliminated when its paired ratio to the "
            "leader (the lowest geometric mean) was clearly above 1, its variance pooled over every value the race "
            "had, and retired (it runs no more rounds) once it could no longer be more than "
            f"{verdict.percent(result.epsilon)} faster than the leader, brought back should a later leader not be "
            "safe from it; a race ends when one setting is left, tied once the leader alone is left running, or "
            "unresolved when its rounds or its budget run out; "
            + (
                "settings that cannot share a world race within their own and are set against the recommended "
                "setting at the end on an unpaired interval; "
                if len(saved.worlds) > 1
                else ""
            )
            + "intervals at "
            f"{verdict.percent(result.confidence)} "
            "confidence spent over every round the race could look at and every setting (docs/tune.md). "
            f"Timed steps: {result.timed_s:.1f} s of the {result.grid_timed_s:.1f} s the whole grid "
            "would have timed.",
            css="muted",
        )
        page.table(_table(result))
        names = {a.case_id: a.label for a in result.arms}
        if not _race_charts(page, saved, names, {a.case_id: a.params for a in result.arms}, result.epsilon):
            page.paragraph(f"No race chart: {_no_chart(saved, result)}.", css="muted")
        if result.where:  # tune --trace; an id names one element of a page
            _where(page, result.where, "where-time-goes" if len(tuned) == 1 else None)


def _race_so_far(page: Page, run: store.Loaded, saved: TuneRecord) -> None:
    """A tune without an answer (interrupted, or still racing): the race tune.json keeps, as of each
    world's last judged round, the table and the race chart, each saying so, and no claim: a setting
    still racing may yet lead, and the answer needs the races to end (a resume). The interrupt's
    "The race so far is kept" sends the user here, where the section used to say only how many
    rounds had run."""
    resume = f"tpbench tune --resume {run.run_dir}"
    rounds = max((e.round for e in saved.history), default=0)
    min_rounds = int(saved.options.min_rounds)
    if not _charted_worlds(saved):
        page.paragraph(
            f"Interrupted race: no recommendation. This tune stopped after {rounds} round{'s' if rounds != 1 else ''}"
            f" (interrupted, or still running), before any round the race could decide (round {min_rounds}, "
            f"--min-rounds), so there is no race to show yet. Resume it with {resume}."
        )
        return
    page.paragraph(
        f"Interrupted race: no recommendation. This tune stopped after round {rounds} (interrupted, or still "
        "running); below is the race so far, each setting as of the last round its world's race judged, against "
        "that round's leader. It claims nothing: a setting still racing may yet lead or be eliminated. Resume it "
        f"with {resume}."
    )
    names = dict(zip(run.cases["case_id"], run.cases["label"]))
    page.table(_table_so_far(saved, names))
    params = {cid: c.params for cid, c in run.record.cases.items()}
    _race_charts(page, saved, names, params, saved.options.epsilon, interrupted=True)


def _table_so_far(saved: TuneRecord, names: Mapping[str, str]) -> pd.DataFrame:
    """Each setting of an interrupted tune as of the last judged round of its world: its standing
    (that round's leader, racing, retired, eliminated or failed), the rounds it ran until then, and
    its ratio to that round's leader with the race's interval (an eliminated one: the interval that
    eliminated it, as the finished table's "what eliminated it" says)."""
    line = verdict.tie_line(saved.options.epsilon)
    interval = verdict.interval_heading(saved.options.confidence, False)
    rows = []
    for key, world in saved.worlds.items():
        history = [e for e in saved.history if e.world == int(key)]
        last = history[-1] if history else None
        ran = dict.fromkeys(world.arms, 0)  # each judged round was run by the arms live after the one before
        for before in [world.arms, *(e.live for e in history)][: len(history)]:
            for arm in before:
                ran[arm] += 1
        for arm in world.arms:
            ratio, lo, hi = last.intervals.get(arm, (None, None, None)) if last else (None, None, None)
            went = eliminated_vs([e.to_json() for e in history], arm)
            rows.append(
                {
                    "setting": names.get(arm, arm),
                    "status": _standing(arm, world, last),
                    "rounds": ran[arm],
                    "as of round": last.round if last else 0,
                    verdict.ratio_heading(saved.options.metric, "that round's leader"): verdict.change(
                        ratio, line=line
                    ),
                    interval: ""
                    if lo is None
                    else f"[{verdict.change(lo, line=line)}, {verdict.change(hi, line=line)}]",
                    "eliminated after round": world.eliminated.get(arm, ""),
                    "what eliminated it": verdict.eliminated_vs_text(went),
                    "retired after round": world.retired.get(arm, ""),
                }
            )
    return pd.DataFrame(rows)


def _standing(arm: str, world: TuneWorld, last: TuneRound | None) -> str:
    """An interrupted tune's setting as its world's race left it: failed, eliminated, retired, the
    leader of the last judged round, or still racing."""
    for status, held in (("failed", world.failed), ("eliminated", world.eliminated), ("retired", world.retired)):
        if arm in held:
            return status
    return "leader" if last and arm == last.leader else "racing"


# What tells a tune's worlds apart (``Case.launch_key``): arms that differ in one of these cannot
# share a world, so they race in races of their own.
WORLD_KEYS = ("world_size", "backend", "device", "interconnect")


def _charted_worlds(saved: TuneRecord) -> list[int]:
    """The worlds with a round the rule could decide (``judged_rounds``) that set two settings side by side."""
    judged = judged_rounds(saved.history, int(saved.options.min_rounds))
    return list(dict.fromkeys(e.world for e in judged if e.intervals))


def _race_charts(
    page: Page,
    saved: TuneRecord,
    names: Mapping[str, str],
    params: Mapping[str, Mapping[str, Any]],
    epsilon: float,
    interrupted: bool = False,
) -> bool:
    """One race chart per world that raced two settings or more, each titled with its world where
    the tune spans several: each world has its own rounds and its own leader, and drawn in one
    chart their lines run side by side, two leaders at 1, with nothing saying which race a line
    belongs to. ``names`` and ``params``: each arm's label and params. ``interrupted``: a tune
    without an answer, each title saying the round its world's race was cut short after. Whether
    any chart was drawn."""
    min_rounds = int(saved.options.min_rounds)
    worlds = _charted_worlds(saved)
    for world in worlds:
        history = [e for e in saved.history if e.world == world]  # _race_figure keeps the judged rounds
        title = _world_name(saved, params, world) if len(saved.worlds) > 1 else None
        head = f"The race so far (interrupted after round {history[-1].round})" if interrupted else "The race"
        page.figure(_race_figure(history, names, epsilon, min_rounds, title, head))
    return bool(worlds)


def _world_name(saved: TuneRecord, params: Mapping[str, Mapping[str, Any]], world: int) -> str:
    """A world by the keys that make it one ("world_size=2", "interconnect=tcp-1gbit"): those of
    ``WORLD_KEYS`` whose value differs between the worlds' first arms (``params``: case id → params),
    as its first arm has them; a tune's worlds come from its grid, so those keys are swept."""
    firsts = [params.get(w.arms[0], {}) for w in saved.worlds.values()]
    mine = params.get(saved.worlds[str(world)].arms[0], {})
    said = [f"{k}={mine[k]}" for k in WORLD_KEYS if k in mine and len({str(p.get(k)) for p in firsts}) > 1]
    return " ".join(said) or f"world {world}"


def _no_chart(saved: TuneRecord, result: TuneResult) -> str:
    """Why no round set two settings side by side: all failed, the race stopped before, or each
    world held one setting."""
    if all(a.status == "failed" for a in result.arms):
        return "every setting failed (the table), so no round was judged"
    if any(len(w.arms) - len(w.failed) > 1 for w in saved.worlds.values()):
        return "no round with two settings in it was judged (the budget or the failures ended the race first)"
    return (
        "no world held two of these settings, so no round set one beside another; the settings were compared "
        "across worlds, unpaired (the table)"
    )


def _where(page: Page, where: dict, anchor: str | None) -> None:
    """``tune --trace``: each traced setting's step split into explain's parts, and the rival against
    the recommended setting part by part (``tune_trace``)."""
    arms = where["arms"]
    page.heading("Where the time goes", level=3, anchor=anchor)
    page.paragraph(
        f"Traced after the race ({where['run_dir']}): "
        f"{verdict.traced_steps_words([a['traced_steps'] for a in arms])} after one repeat, split as tpbench explain "
        "splits a step (compute, exposed communication, optimizer, idle, waiting for the slowest rank) and scaled "
        "to the race's step times (the recommended setting's geometric mean over its rounds, the rival's that times "
        "its ratio in the table above): the mean per step.",
        css="muted",
    )
    fig = go.Figure()
    names = [plot_text(f"{a['label']} ({a['role']})") for a in arms]
    for i, part in enumerate(PARTS):
        ms = [a["parts_ms"][part] for a in arms]
        fig.add_bar(
            y=names,
            x=ms,
            orientation="h",
            name=part.replace("_", " "),
            marker_color=SERIES_COLORS[i % len(SERIES_COLORS)],
            text=[f"{v:.1f}" for v in ms],
            hovertemplate="%{y}: %{x:.2f} ms<extra>" + part.replace("_", " ") + "</extra>",
        )
    fig.update_layout(
        barmode="stack",
        height=160 + 50 * len(arms),
        margin=MARGIN,
        legend=LEGEND_TOP | dict(traceorder="normal"),
        xaxis_title="ms per step",
    )
    fig.update_yaxes(autorange="reversed")
    page.figure(fig)
    said = verdict.rival_line(where)
    if said:
        page.paragraph(said)


def _table(result: TuneResult) -> pd.DataFrame:
    """The race's arms, as the terminal's table has them: with each arm's held-out loss and its training
    seconds to the target loss (the median over its rounds, "—" where a round never reached it) where the
    workload measures them; the training note above ranks the arms by that time, and without the column
    the report gave it only for the arms the note names."""
    losses = any(a.heldout_loss is not None for a in result.arms)  # None in tune.json before it had one
    reached = any(a.time_to_target_s is not None for a in result.arms)
    interval = verdict.interval_heading(result.confidence, bool(result.worlds))
    line = verdict.tie_line(result.epsilon)  # a tied arm's low end reads as clear of the margin, as it is
    return pd.DataFrame(
        [
            {
                "setting": a.label,
                "status": a.status,
                "rounds": a.rounds,
                verdict.ratio_heading(result.metric): verdict.change(a.ratio, line=line),
                interval: ""
                if a.lo is None
                else f"[{verdict.change(a.lo, line=line)}, {verdict.change(a.hi, line=line)}]",
                "eliminated after round": "" if a.eliminated_at is None else a.eliminated_at,
                "what eliminated it": verdict.what_eliminated(a.status, a.eliminated_vs),
                "retired after round": verdict.brought_back(a.sat_out)
                if a.retired_at is None
                else f"{a.retired_at}{verdict.sat_out(a.sat_out)}",
                **({"held-out loss": _loss(a.heldout_loss)} if losses else {}),
                **({verdict.TO_TARGET: verdict.to_target(a.time_to_target_s)} if reached else {}),
            }
            for a in result.arms
        ]
    )


def _loss(v: float | None) -> str:
    return "" if v is None else f"{v:.3f}"


# The race chart's top: a setting half again as slow as the leader is plainly out, and drawing it
# would squash the ratios near 1, where the race is decided, into a few pixels.
RACE_TOP = 1.5


def judged_rounds(history: list[TuneRound], min_rounds: int) -> list[TuneRound]:
    """The rounds of ``history`` at which the rule could decide: from ``min_rounds`` on. The race
    computes an interval from round 2, but before ``--min-rounds`` it eliminates and retires
    nothing, and at so few rounds the interval spans most of the chart: drawn, those rounds read as
    a race that was already under way."""
    return [e for e in history if e.round >= min_rounds]


# The race chart's top margin per line of its title (the title and the key's two lines): plotly sets
# the title's first baseline at the margin's middle, and at 70 px the key's last line reached the
# plot's top edge, where a cross kept there (an elimination beyond the axis) covered its words.
RACE_TITLE_LINE_PX = 34

# How far apart, in rounds, the race chart draws the settings at one round, and how wide the group
# may spread at most: half a round, clear of the next round's group.
RACE_DODGE, RACE_DODGE_SPREAD = 0.15, 0.5


def _dodge(i: int, n: int) -> float:
    """The ``i``-th of ``n`` settings' offset along the round axis: drawn at the round itself, the
    settings' bars at one round lay on one another, and in a short race, where they are widest,
    each hid the others'. The hover gives the round itself."""
    step = min(RACE_DODGE, RACE_DODGE_SPREAD / max(n - 1, 1))
    return (i - (n - 1) / 2) * step


def _arm_traces(
    fig: go.Figure, d: pd.DataFrame, name: str, color: str, offset: float, high: float, retired_why: str
) -> None:
    """One setting's line with its bars, and a cross where it was eliminated and a ring where it was
    retired, drawn ``offset`` rounds aside (``_dodge``)."""
    fig.add_trace(
        go.Scatter(
            x=d["round"] + offset,
            y=d["ratio"],
            customdata=d["round"],
            hovertemplate="round %{customdata}: %{y:.3g}× the leader",
            mode="lines+markers",
            name=name,
            line=dict(color=color),
            error_y=dict(
                type="data", symmetric=False, array=d["hi"] - d["ratio"], arrayminus=d["ratio"] - d["lo"], color=color
            ),
        )
    )
    for flag, symbol, mark, what, why in (
        ("out", "x", "#a4262c", "eliminated", ""),
        ("retired", "circle-open", "#2e7d32", "retired", f": {retired_why}"),
    ):
        marked = d[d[flag]]
        if len(marked):
            fig.add_trace(
                go.Scatter(
                    x=marked["round"] + offset,
                    y=marked["ratio"].clip(upper=high),
                    customdata=marked["round"],
                    mode="markers",
                    marker=dict(symbol=symbol, size=14, color=mark, line=dict(width=2)),
                    name=f"{name} {what}",
                    text=[f"{what} at {r:.3g}× the leader{why}" for r in marked["ratio"]],
                    hovertemplate="round %{customdata}: %{text}",
                    cliponaxis=False,  # on the top edge: drawn whole, not cut in half
                    showlegend=False,
                )
            )


def _race_rows(history: list[TuneRound]) -> pd.DataFrame:
    """The race chart's points: per judged round, each setting's ratio to that round's leader with
    its interval and whether it went (``out``) or was retired then; the leader itself at 1, since it
    has no interval against itself: left out, its line would run straight across the rounds it led
    as if it had trailed a leader in them."""
    rows = [
        {
            "arm": arm,
            "round": e.round,
            "ratio": v[0],
            "lo": v[1],
            "hi": v[2],
            "out": arm in e.eliminated,
            "retired": arm in e.retired,
        }
        for e in history
        for arm, v in e.intervals.items()
    ]
    rows += [
        {"arm": e.leader, "round": e.round, "ratio": 1.0, "lo": 1.0, "hi": 1.0, "out": False, "retired": False}
        for e in history
        if e.intervals and e.leader
    ]
    return pd.DataFrame(rows, columns=["arm", "round", "ratio", "lo", "hi", "out", "retired"]).sort_values("round")


def _race_figure(
    history: list[TuneRound],
    names: Mapping[str, str],
    epsilon: float,
    min_rounds: int,
    world: str | None = None,
    head: str = "The race",
) -> go.Figure:
    """Per setting, its ratio to that round's leader with the race's interval, round by round from
    ``min_rounds``, the first round the rule may decide (``judged_rounds``; the title says the
    rounds before it had too few to decide), the leader itself at 1, without an interval; a cross
    where it was eliminated, a ring where it was retired. ``world``: the world's name, in the title,
    where the tune raced in several (one chart each, ``_race_charts``); ``head``: the title's start
    ("The race so far (interrupted after round 6)" for a tune without an answer).
    The band runs from 1 / (1 + epsilon) to 1: a setting whose interval's lower end is inside it or
    above can no longer be more than epsilon faster than the leader and is retired (it runs no more
    rounds); one whose lower end is above 1 is eliminated. The key and the ring's hover say what
    retiring means, as the table does ("it could no longer be 2% faster than the leader"), not
    "tied": a ring at 1.3× the leader called tied read as "as fast".

    The axis is logarithmic (a ratio and its inverse lie equally far from 1) and spans at most
    1 / ``RACE_TOP`` to ``RACE_TOP``: a front door's unpacked ``zero_no_overlap`` at 2.3× would
    otherwise leave the tie zone and the settings still racing for it a sliver at the bottom.
    Settings further behind run off the top, which the title says; their crosses and rings stay on
    the top edge (the hover gives the ratio): a setting's elimination is the chart's event, and one
    drawn off the chart (the whatif suite's ``zero_no_overlap``, eliminated at 1.62× after round 5)
    would leave none to see."""
    fig = go.Figure()
    df = _race_rows(judged_rounds(history, min_rounds))
    retired_why = f"it could no longer be {verdict.percent(epsilon)} faster than the leader"
    top = float(df["ratio"].max()) if len(df) else 1.0
    bottom = float(df["ratio"].min()) if len(df) else 1.0
    low = max(1 / RACE_TOP, min(0.9, bottom * 0.97, 1 / (1 + epsilon) ** 2))  # as far below 1 at most
    high = min(RACE_TOP, max(top * 1.03, (1 + epsilon) ** 2))
    order = {a: i for i, a in enumerate(names)}  # the table's order, in the legend too
    arms = sorted(df["arm"].unique(), key=lambda a: order.get(a, len(order)))
    for i, arm in enumerate(arms):
        d = df[df["arm"] == arm]
        # The first rounds' intervals are astronomically wide: clip the bars to the chart.
        d = d.assign(hi=d["hi"].clip(upper=2 * top), lo=d["lo"].clip(lower=bottom / 2))
        # One colour per setting, picked here: left to plotly, the cross and ring traces below would
        # take palette slots too, and settings next to each other would share a colour.
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        _arm_traces(fig, d, plot_text(names.get(arm, arm)), color, _dodge(i, len(arms)), high, retired_why)
    fig.add_hrect(y0=1 / (1 + epsilon), y1=1, fillcolor="#d9dde5", opacity=0.5, line_width=0)
    off = f"; settings more than {RACE_TOP:g}× the leader run off the top" if top > high else ""
    early = f"; before round {min_rounds}, too few rounds to decide (--min-rounds {min_rounds})"
    # The key on a line of its own, clear of plotly's toolbar.
    title = (
        f"{head}{f' in the world of {world}' if world else ''}: ratio to the round's leader, from round "
        f"{min_rounds}<br><sup>×: eliminated; ○: retired ({retired_why}); at 1 without a bar: the "
        f"round's leader<br>shaded: 1 / {1 + epsilon:g} to 1, a lower end in it or above retires{off}{early}</sup>"
    )
    fig.update_layout(
        title=title,
        # Rounds are whole: no tick at 2.5 in a short race, at most a dozen in a long one.
        xaxis=dict(
            title="round (the settings side by side at each)", tick0=0, dtick=max(1, math.ceil(df["round"].max() / 12))
        ),
        yaxis=dict(title="ratio to the leader (log scale)", type="log", range=[math.log10(low), math.log10(high)]),
        margin=MARGIN | dict(t=RACE_TITLE_LINE_PX * (title.count("<br>") + 1)),  # the title and the key's lines
        # Below the plot, one row per two settings: eighteen names above it would run into the title.
        legend=LEGEND_BELOW | dict(y=-0.18),
        height=460 + 24 * math.ceil(df["arm"].nunique() / 2),
    )
    return fig
