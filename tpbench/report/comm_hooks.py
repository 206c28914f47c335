"""Report section: the communication hook, its bytes on the wire, and whether it changes which
ZeRO hook wins.

PyTorch's advice (interleaved when communication is relatively fast, sequential when it is slow)
depends on how much each bucket sends, which the wrapped hook decides. With ``comm_hook`` swept,
every interleaved/sequential comparison of ``verdicts.compare`` is already made within one wrapped
hook (the two cases agree on every other parameter); this section lines those comparisons up per
bucket size and setting and says, in words, whether a compression hook's winner differs from the
all-reduce hook's. Bytes per step come from the traces (``summary.parquet``'s
``allreduce_bytes_per_step`` and ``comm_bytes_per_step``).
"""

from __future__ import annotations

import json

import pandas as pd
import plotly.graph_objects as go

from tpbench import verdict
from tpbench.report.data import ReportData, context_text, sentence_start
from tpbench.report.figures import LEGEND_BELOW, MARGIN, log_ratio_ticks, ratio_trace
from tpbench.report.html import Page, plot_text
from tpbench.report.verdicts import Comparison, resolution

BASELINE = "allreduce"
_WINNER = {
    verdict.FASTER: "interleaved",
    verdict.SLOWER: "sequential",
    verdict.NO_DIFFERENCE: "no clear winner",
    verdict.NO_INTERVAL: "undecided (one repeat)",
}


def section(page: Page, data: ReportData, interleaved_vs_sequential: list[Comparison]) -> None:
    """The section, when the runs sweep ``comm_hook`` (absent otherwise)."""
    if "comm_hook" not in data.context_keys or data.done.empty:
        return
    page.heading("Communication hook: bytes on the wire and which ZeRO hook wins", anchor="comm-hook")
    _bytes(page, data)
    lines = winner_lines(interleaved_vs_sequential)
    if not lines:
        return
    page.heading("Interleaved vs sequential within each wrapped hook", level=3)
    page.paragraph(
        "Each line is one bucket size (and setting): the winner of hook_with_zero_step_interleaved against "
        "hook_with_zero_step when both wrap the same communication hook (interleaved / sequential step time, 95% "
        "t interval over rounds, paired by round when the two ran in one world; a winner is named only when the "
        "interval excludes 1; ± is its half-width, the smallest difference the run could resolve), and whether "
        "compression changes it from the all-reduce hook's.",
        css="muted",
    )
    page.bullets(lines, css="verdicts")
    page.figure(_figure(interleaved_vs_sequential))


def _bytes(page: Page, data: ReportData) -> None:
    done = data.done
    if "allreduce_bytes_per_step" not in done or done["allreduce_bytes_per_step"].isna().all():
        return
    keys = ["run", "algo", "comm_hook"] if data.multi else ["algo", "comm_hook"]
    cols = ["allreduce_bytes_per_step", "comm_bytes_per_step"]
    table = done.groupby(keys, sort=False)[cols].median().reset_index()
    ref = table.loc[table["comm_hook"] == BASELINE, keys[:-1] + cols]
    table = table.merge(ref, on=keys[:-1], how="left", suffixes=("", "_ref"))
    table = table.assign(
        **{
            "all-reduce MB/step": table["allreduce_bytes_per_step"] / 1e6,
            "all collectives MB/step": table["comm_bytes_per_step"] / 1e6,
            f"all-reduce bytes vs {BASELINE}": table["allreduce_bytes_per_step"]
            / table["allreduce_bytes_per_step_ref"],
            f"all bytes vs {BASELINE}": table["comm_bytes_per_step"] / table["comm_bytes_per_step_ref"],
        }
    ).drop(columns=cols + [f"{c}_ref" for c in cols])
    page.paragraph(
        "Collective payload per traced step, as nccl-tests counts it (an all-reduce of B bytes is B), from the "
        "traces' recorded tensor sizes and dtypes; median over the cases of each algorithm and hook. fp16/bf16 "
        "compression halves the all-reduce; the ZeRO hooks' parameter broadcasts stay in the parameters' dtype, "
        "so their total falls by less.",
        css="muted",
    )
    page.table(table.rename(columns={"algo": "algorithm"}))


def winner_lines(comparisons: list[Comparison]) -> list[str]:
    """Per run, setting and bucket size: each wrapped hook's winner, and whether compression
    changes it from the all-reduce hook's (only where the all-reduce hook ran too)."""
    groups: dict[str, list[Comparison]] = {}
    for c in comparisons:
        rest = {k: v for k, v in (c.context | c.variant).items() if k != "comm_hook"}
        groups.setdefault(json.dumps([c.run_id, rest], default=str, sort_keys=True), []).append(c)
    lines = []
    for group in groups.values():
        by_hook = {c.context.get("comm_hook"): c for c in group}
        if len(by_hook) < 2:
            continue
        keys = [k for k in group[0].context if k != "comm_hook"]
        where = context_text(group[0].context, keys) or "every case"
        parts = [f"with {hook}, {_wins(c)} ({_ratio(c)})" for hook, c in by_hook.items()]
        line = f"{sentence_start(where)}: " + "; ".join(parts) + "."
        if BASELINE in by_hook:
            line += " " + _compression_effect(by_hook)
        lines.append(line)
    return lines


def _decided(c: Comparison) -> bool:
    """Whether the comparison gives an answer to hold another against: a winner, or a tie within the
    threshold. An interval that holds no change but reaches beyond the threshold (or no interval)
    could hide either winner, so it neither keeps nor changes an answer."""
    return c.verdict in (verdict.FASTER, verdict.SLOWER) or c.said.call == verdict.PASS


def _compression_effect(by_hook: dict[str, Comparison]) -> str:
    """Whether each compressing hook's winner differs from the all-reduce hook's, said only between
    decided comparisons; the undecided are named instead."""
    undecided = [h for h, c in by_hook.items() if not _decided(c)]
    decided = {h: _WINNER[c.verdict] for h, c in by_hook.items() if h != BASELINE and _decided(c)}
    if BASELINE in undecided or not decided:
        return f"Whether compression changes the answer is not shown: undecided with {', '.join(undecided)}."
    base = _WINNER[by_hook[BASELINE].verdict]
    changed = {h: w for h, w in decided.items() if w != base}
    said = (
        f"Compression changes the answer: {base} with {BASELINE}, "
        + ", ".join(f"{w} with {h}" for h, w in changed.items())
        if changed
        else f"Compression does not change the answer ({base})"
    )
    return said + (f"; not shown with {', '.join(undecided)} (undecided)." if undecided else ".")


def _wins(c: Comparison) -> str:
    who = _WINNER[c.verdict]
    return f"{who} wins" if c.verdict in (verdict.FASTER, verdict.SLOWER) else who


def _ratio(c: Comparison) -> str:
    """The ratio with the verdict's words (``verdict.Verdict.words``), which say whether the win
    reaches beyond the threshold; two decimals, as the page's tables and heatmaps write ratios."""
    interval = "" if c.verdict == verdict.NO_INTERVAL else f" [{c.lo:.2f}, {c.hi:.2f}]"
    said = c.said.words + ("" if c.said.says_resolution else f"; {resolution([c.est])}")
    return f"interleaved/sequential {c.ratio:.2f}{interval}: {said}"


def _figure(comparisons: list[Comparison]) -> go.Figure:
    """Interleaved/sequential per wrapped hook (across), one line per bucket size and setting."""
    rows = pd.DataFrame(
        [
            {
                "hook": str(c.context.get("comm_hook")),
                "series": context_text(
                    rest := {k: v for k, v in (c.context | c.variant).items() if k != "comm_hook"}, list(rest)
                ),
                "ratio": c.ratio,
                "lo": c.lo,
                "hi": c.hi,
                "label": f"{_wins(c)} ({_ratio(c)})",
            }
            for c in comparisons
        ]
    )
    fig = go.Figure()
    for name, grp in rows.groupby("series", sort=False):
        fig.add_trace(
            ratio_trace(
                grp,
                "hook",
                name,
                mode="lines+markers",
                text=[plot_text(t) for t in grp["label"]],
                hovertemplate="%{x}<br>interleaved/sequential %{y:.2f}<br>%{text}<extra></extra>",
            )
        )
    fig.add_hline(y=1.0, line_dash="dot", line_color="#5b6475")
    fig.update_xaxes(type="category", title="wrapped communication hook")
    # A ratio on a log axis, as the crossover chart's: twice as fast as far below 1 as twice as slow
    # above it, and one wide interval (two rounds: [0.40, 1.70] and wider) does not press the rest flat.
    fig.update_yaxes(
        type="log",
        title="step time, interleaved / sequential (log scale)",
        **log_ratio_ticks([*rows["ratio"], *rows["lo"], *rows["hi"]]),
    )
    # Series side by side at each hook, so their intervals do not hide one another.
    fig.update_layout(height=420, margin=MARGIN, legend=LEGEND_BELOW, scattermode="group")
    return fig
