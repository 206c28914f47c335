"""The "Where the time went" section of a report of several runs: per matched case with traces on
both sides, a waterfall from the first run's step to the later run's (the timed steps as ``compare``
shows them, split as the traced steps went), one bar per part of
``tpbench explain`` (compute, exposed communication, optimizer, idle, straggler wait).

The parts come from ``tpbench.explain`` (the cases matched as ``compare`` matches them, the
derived tables the sweeps wrote), so the bars add up to the change exactly, as the command's do."""

from __future__ import annotations

import itertools

import plotly.graph_objects as go

from tpbench import explain
from tpbench.compare import Comparison, RunData
from tpbench.report import verdicts
from tpbench.report.data import ReportData
from tpbench.report.figures import MARGIN
from tpbench.report.html import Page, plot_text

# Beyond this many cases a page would hold a chart per case of a large suite: the largest changes.
MAX_CASES = 12
# The value axis runs this far above the highest bar, room for a label drawn above it.
LABEL_ROOM = 1.12


def section(page: Page, data: ReportData, sides: list[RunData], cross: list[Comparison]) -> None:
    """``cross``: each later run of ``sides`` against the first, as the verdicts judged them
    (``verdicts.against_first_run``), used again here rather than judged twice; judged anew only when
    the report compares by another metric than step time, the time explain splits."""
    if not cross:
        return
    if cross[0].metric != "step_ms":
        sides = verdicts.run_data(data, "step_ms")
        cross = verdicts.against_first_run(sides)
    found = []
    for run, side, comparison in zip(data.runs[1:], sides[1:], cross):
        matched = explain.matched_in(comparison, sides[0], side)
        cases, _ = explain.explain_cases(sides[0].dir, side.dir, matched)
        found += [(data.tags[run.record.run_id], c) for c in cases]
    if not found:
        return
    found.sort(key=lambda tc: -abs(tc[1].explanation.delta_ms))
    page.heading("Where the time went", anchor="where-the-time-went")
    shown = f"the {MAX_CASES} largest changes of {len(found)}" if len(found) > MAX_CASES else f"{len(found)}"
    page.paragraph(
        "Per case traced in both runs: the first run's step, then each part's change (ms per step, "
        "candidate − baseline), then the later run's step (the timed steps as tpbench compare shows them, each "
        "split as its traced steps "
        "went); the parts add up to the change exactly "
        f"(tpbench explain; docs/explain.md). Cases shown: {shown}.",
        css="muted",
    )
    for tag, case in found[:MAX_CASES]:
        page.paragraph(case_line(tag, case))
        page.figure(_waterfall(tag, case))


def case_line(tag: str, case: explain.CaseExplanation) -> str:
    """The words above a case's waterfall: explain's sentence, and its warning where the traced change is
    off the timed one (the parts then are the traces' composition, a weak guide to the change), as
    ``tpbench explain`` prints it beside the same parts."""
    warning = f" Warning: {case.unlike_timed}." if case.unlike_timed else ""
    return f"{tag}, {case.label}: {case.top}{warning}"


def _waterfall(tag: str, case: explain.CaseExplanation) -> go.Figure:
    e = case.explanation
    names = ["baseline step", *(c.name.replace("_", " ") for c in e.components), "candidate step"]
    measure = ["absolute", *["relative"] * len(e.components), "total"]
    values = [e.base_ms, *(c.delta_ms for c in e.components), e.cand_ms]
    fig = go.Figure(
        go.Waterfall(
            x=names,
            y=values,
            measure=measure,
            text=[f"{v:+.2f}" if m == "relative" else f"{v:.2f}" for v, m in zip(values, measure)],
            hovertext=["", *(f"95% CI {c.lo:+.2f} to {c.hi:+.2f}" for c in e.components), ""],
            increasing=dict(marker=dict(color="#a4262c")),
            decreasing=dict(marker=dict(color="#107c10")),
            totals=dict(marker=dict(color="#5c6b7a")),
        )
    )
    # The bars' levels: the baseline, the running sum after each part, the candidate. The range runs
    # past the highest bar, whose part's label sits above it.
    levels = [*itertools.accumulate(values[:-1]), e.cand_ms]
    fig.update_layout(
        # Two lines, so that a long case's title stays clear of the chart's tool buttons at the top right.
        title=plot_text(f"{tag}, {case.label}") + "<br>" + plot_text("step time (ms), baseline → candidate"),
        yaxis=dict(title="ms per step", range=[min(0.0, *levels), max(levels) * LABEL_ROOM]),
        margin=MARGIN | dict(t=70),
        height=380,
        showlegend=False,
    )
    return fig
