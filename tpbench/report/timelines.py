"""What a step is made of, from the store's trace-derived tables (never from the traces):
overlap / exposed communication / idle per case, a per-rank Gantt of one representative step
per algorithm, and bandwidth per collective.

These tables cover the traced steps, which run after the timed ones (tracing must not perturb
timing), so their durations include the profiler's overhead: compare them with each other, and
read absolute step times from the step-time section.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from tpbench.analysis.overlap import overlap_totals, union
from tpbench.report.data import ReportData, link_rates
from tpbench.report.figures import (
    LEGEND_TOP,
    MARGIN,
    bucket_axis,
    display,
    facet_common,
    lines_against_bucket_size,
    log_byte_ticks,
    series,
)
from tpbench.report.html import Page, plot_text

LANE_COLORS = {"compute": "#4c78a8", "comm": "#f58518", "optimizer": "#54a24b", "memcpy": "#b279a2", "other": "#9d9da0"}
# More cases than this get lines against bucket size instead of one stacked bar each.
MAX_BARS = 24
# A Gantt with more bars than this merges each rank's lane into its union: the picture stays
# the same at the report's zoom, and the file stays small for GPU traces with many kernels.
MAX_GANTT_BARS = 4000
# Symbols told apart at a glance, filled then open: one per case and collective of an algorithm.
_SHAPES = ("circle", "square", "diamond", "triangle-up", "cross", "x", "star", "triangle-down", "pentagon", "hexagon")
MARKER_SYMBOLS = [*_SHAPES, *(f"{shape}-open" for shape in _SHAPES)]
# Why an instance with bytes has no busbw (``analysis.bandwidth.collective_bandwidth``): its group size is unknown.
GROUP_SIZE_UNKNOWN = (
    "Gloo's trace ranges name no process group, and these traces hold groups of several sizes (post-local SGD's "
    "node subgroups beside the world): how many ranks ran a collective, busbw's n, is unknown"
)


def overlap(page: Page, data: ReportData) -> None:
    per_step = data.table("overlap")
    if per_step.empty:
        return
    totals = overlap_totals(per_step, by=("run_id", "case_id"))
    counts = per_step.groupby(["run_id", "case_id"]).size().rename("rank_steps").reset_index()
    df = data.with_cases(totals.merge(counts, on=["run_id", "case_id"]))
    if df.empty:
        return

    def ms(col: str) -> pd.Series:
        """Mean per traced step and rank, in ms."""
        return df[col] / df["rank_steps"] / 1e6

    df = df.assign(
        compute_only=ms("compute_ns") - ms("overlap_ns"),
        overlapped=ms("overlap_ns"),
        exposed=ms("exposed_comm_ns"),
        idle=ms("idle_ns"),
        # Memory copies and other threads' work that neither compute nor comm covers (GPU traces' memcpy
        # kernels): without it the stack fell short of the step, by 2 ms of 57 on an H200 capture. In whole
        # ns, so that a trace with none has exactly 0, not the rounding of four differences in ms.
        other_work=(df["span_ns"] - df["compute_ns"] - df["exposed_comm_ns"] - df["idle_ns"]) / df["rank_steps"] / 1e6,
        comm=ms("comm_ns"),
        compute=ms("compute_ns"),
        optimizer=ms("optimizer_ns"),
        span=ms("span_ns"),
    ).sort_values("order", kind="stable")
    df["name"] = [f"{r} · {lab}" if data.multi else lab for r, lab in zip(df["run"], df["label"])]
    page.heading("Overlap, exposed communication and idle time", anchor="overlap")
    page.paragraph(
        "Per traced step and rank (mean): compute that ran alone, compute and communication at the "
        "same time (overlapped), communication nothing hid (exposed), other work (memory copies, other "
        "threads' ops outside both; only where a trace has some) and time with nothing running (idle): "
        "together the traced step. overlap % = overlapped / communication, as Holistic Trace Analysis defines it. "
        "Traced steps run after the timed ones, under the profiler. In the table, compute and comm are each "
        "whole, overlapped part included; its overlap % counts every traced step, where summary.parquet's "
        "overlap_pct, as Holistic Trace Analysis counts it, leaves out the last: the two can differ. "
        "optimizer ms is the time inside the optimizer's ranges (its step, a ZeRO hook's steps per bucket), "
        "whatever ran there, compute or communication (zero_no_overlap's broadcasts run inside its step): "
        "no part of the stack, it overlaps the columns before it; tpbench explain's optimizer part counts "
        "only the compute there.",
        css="muted",
    )
    timed = df[["run_id", "case_id", "span"]].merge(
        data.done[["run_id", "case_id", "median_ms"]], on=["run_id", "case_id"]
    )
    if len(timed):
        page.paragraph(traced_vs_timed((timed["span"] / timed["median_ms"]).to_numpy()), css="muted")
    if bucket_axis(data, df) and len(df) > MAX_BARS:
        page.figure(_overlap_against_bucket_size(data, df))
    else:
        page.figure(_overlap_bars(df))
    table = df[
        ["name", "overlap_pct", "compute", "comm", "overlapped", "exposed", "idle", "optimizer", "span", "rank_steps"]
    ]
    page.table(
        table.rename(
            columns={
                "name": "case",
                "overlap_pct": "overlap %",
                "compute": "compute ms (with overlapped)",
                "comm": "comm ms (with overlapped)",
                "overlapped": "overlapped ms",
                "exposed": "exposed comm ms",
                "idle": "idle ms",
                "optimizer": "optimizer ms",
                "span": "step ms (traced)",
                "rank_steps": "rank-steps",
            }
        ),
        scroll=len(table) > 20,
    )


def _overlap_bars(df: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    names = [plot_text(n) for n in df["name"]]
    parts = [
        ("compute_only", "compute only", LANE_COLORS["compute"]),
        ("overlapped", "overlapped", "#72b7b2"),
        ("exposed", "exposed comm", LANE_COLORS["comm"]),
        ("other_work", "other work", LANE_COLORS["memcpy"]),
        ("idle", "idle", "#d3d3d3"),
    ]
    if not (df["other_work"] > 0).any():  # CPU traces: every op is compute or comm
        parts = [p for p in parts if p[0] != "other_work"]
    for col, title, color in parts:
        fig.add_bar(
            y=names,
            x=df[col],
            name=title,
            orientation="h",
            marker_color=color,
            hovertemplate="%{y}<br>" + title + ": %{x:.3g} ms<extra></extra>",
        )
    fig.add_scatter(
        y=names,
        x=df[[col for col, _, _ in parts]].sum(axis=1),
        mode="text",
        text=[f"  {p:.0f}% overlap" if pd.notna(p) else "" for p in df["overlap_pct"]],
        textposition="middle right",
        showlegend=False,
        hoverinfo="skip",
        cliponaxis=False,
    )
    fig.update_layout(
        barmode="stack",
        height=max(260, 30 * len(df) + 130),
        margin=dict(MARGIN, r=110),
        xaxis_title="ms per step and rank",
        # Plotly reverses a stacked chart's legend by default (right for a vertical stack); these stack
        # left to right beside a horizontal legend, which lists them in that order.
        legend=LEGEND_TOP | dict(traceorder="normal"),
    )
    fig.update_yaxes(autorange="reversed")
    return fig


def traced_vs_timed(ratios: np.ndarray) -> str:
    """How long the traced steps took against each case's timed median. Over several cases, the median
    with its range: a median alone can read "0.99×" beside a case whose traced steps took 1.59× its
    timed ones, which the table under it shows. Two decimals throughout: two significant figures
    write 1.036 "1×" beside "0.99×", as if the traced steps had cost nothing more."""
    if len(ratios) == 1:
        said = f"Traced steps took {ratios[0]:.2f}× as long as the timed steps' median"
    else:
        said = (
            f"Traced steps took {np.median(ratios):.2f}× as long as their case's timed median (the median over "
            f"{len(ratios)} cases; {ratios.min():.2f}× to {ratios.max():.2f}×)"
        )
    return (
        f"{said}: the profiler's overhead, and whatever sets the few traced steps apart from the median (for "
        "post-local SGD, whether an averaging step was among them; the machine's load then)."
    )


def _overlap_against_bucket_size(data: ReportData, df: pd.DataFrame) -> go.Figure:
    """Many cases: overlap %, exposed communication and idle time as lines over bucket size."""
    df, (fcol,) = facet_common(data, df, ["interconnect"])
    df = df.assign(series=series(data, df, {"bucket_cap_mb", "interconnect"}))
    long = df.melt(
        id_vars=["series", "label", "run", "bucket_cap_mb", "order", *([fcol] if fcol else [])],
        value_vars=["overlap_pct", "exposed", "idle"],
        var_name="metric",
        value_name="value",
    )
    long["metric"] = long["metric"].map(
        {"overlap_pct": "overlap %", "exposed": "exposed comm (ms)", "idle": "idle (ms)"}
    )
    fig = lines_against_bucket_size(
        data,
        long,
        "value",
        ["series", "label", "run", *([fcol] if fcol else [])],
        row_height=260,
        facet_row="metric",
        facet_col=fcol,
        labels={"value": ""},
    )
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=", 1)[-1]))
    return fig


def gantt(page: Page, data: ReportData) -> None:
    cases = data.representative("intervals")
    if not cases:
        return
    page.heading("Timeline of one step", anchor="timeline")
    page.paragraph(
        "Per algorithm, the case with its median step time, and of that case's traced steps the one with "
        "the median span. Lanes per rank: compute, communication, optimizer (the optimizer lane marks "
        "ranges whose work is also in compute or comm). Each rank's intervals are cut to its span of the step, "
        "as the overlap figures count them: a collective still running from the step before shows from the "
        "step's start. Time from the step's earliest event on any rank.",
        css="muted",
    )
    overlap_steps = data.table("overlap")
    for row, iv in cases:
        spans = (
            overlap_steps[(overlap_steps["run_id"] == row["run_id"]) & (overlap_steps["case_id"] == row["case_id"])]
            if not overlap_steps.empty
            else overlap_steps
        )
        step = _median_step(iv, spans)
        title = f"{row['run']} · {row['label']}" if data.multi else row["label"]
        page.heading(f"{title} (case {row['case_id']}, step {step})", level=3)
        marks = data.case_table(row["run_id"], row["case_id"], "marks")
        page.figure(_gantt_figure(_step_pieces(iv, marks, step)))


def _step_pieces(iv: pd.DataFrame, marks: pd.DataFrame | None, step: int) -> pd.DataFrame:
    """The intervals of ``step`` cut to each rank's span of it (``marks``' step rows), the pieces
    ``overlap.step_overlap`` counts, so that the chart shows what the overlap figures count: drawn
    whole, by the step each started in, a Gloo collective that runs on past its step's end would show
    beyond it, and one still running from the step before would be left out. Without step marks: the
    intervals that started in the step, whole."""
    spans = marks[(marks["kind"] == "step") & (marks["index"] == step)] if marks is not None else None
    if spans is None or spans.empty:
        return iv[iv["step"] == step]
    pieces = []
    for rank, span in spans.groupby("rank"):
        lo, hi = int(span["start_ns"].min()), int(span["end_ns"].max())
        mine = iv[(iv["rank"] == rank) & (iv["end_ns"] > lo) & (iv["start_ns"] < hi)]
        pieces.append(mine.assign(start_ns=mine["start_ns"].clip(lower=lo), end_ns=mine["end_ns"].clip(upper=hi)))
    return pd.concat(pieces, ignore_index=True)


def _median_step(iv: pd.DataFrame, spans: pd.DataFrame) -> int:
    """The traced step whose slowest rank's span is the median one."""
    if not spans.empty:
        per_step = spans.groupby("step")["span_ns"].max()
    else:
        traced = iv[iv["step"] >= 0]
        per_step = traced.groupby("step")["end_ns"].max() - traced.groupby("step")["start_ns"].min()
    per_step = per_step.sort_values(kind="stable")
    return int(per_step.index[(len(per_step) - 1) // 2])


def _gantt_figure(iv: pd.DataFrame) -> go.Figure:
    origin = int(iv["start_ns"].min())
    lanes = [lane for lane in LANE_COLORS if lane in set(iv["lane"].astype(str))]
    ranks = sorted(int(r) for r in iv["rank"].unique())
    merge = len(iv) > MAX_GANTT_BARS
    fig = go.Figure()
    for lane in lanes:
        part = iv[iv["lane"].astype(str) == lane]
        ys, base, width, hover = [], [], [], []
        for rank in ranks:
            mine = part[part["rank"] == rank]
            if mine.empty:
                continue
            if merge:
                s, e = union(mine["start_ns"].to_numpy(), mine["end_ns"].to_numpy())
                names = [f"{lane} (merged)"] * len(s)
            else:
                s, e = mine["start_ns"].to_numpy(), mine["end_ns"].to_numpy()
                names = [plot_text(n) for n in mine["name"].astype(str)]
            ys += [f"rank {rank} · {lane}"] * len(s)
            base += list((s - origin) / 1e6)
            width += list((e - s) / 1e6)
            hover += names
        fig.add_bar(
            y=ys,
            x=width,
            base=base,
            orientation="h",
            name=lane,
            marker_color=LANE_COLORS[lane],
            marker_line_width=0,
            hovertext=hover,
            hovertemplate="%{hovertext}<br>%{base:.3f} ms + %{x:.3f} ms<extra></extra>",
        )
    order = [f"rank {r} · {lane}" for r in ranks for lane in lanes]
    fig.update_yaxes(categoryorder="array", categoryarray=order, autorange="reversed")
    fig.update_layout(
        barmode="overlay",
        bargap=0.25,
        height=max(220, 26 * len(order) + 110),
        margin=MARGIN,
        xaxis_title="ms since the step's first event",
        legend=LEGEND_TOP,
    )
    return fig


def bandwidth(page: Page, data: ReportData) -> None:
    coll = data.table("collectives")
    if coll.empty:
        return
    df = data.with_cases(coll)
    if df.empty:
        return
    page.heading("Collectives", anchor="collectives")
    df = df.assign(time_ms=df["time_ns"] / 1e6)
    fig = _busbw(page, data, df) if df["busbw_gbps"].notna().any() else _transfer_times(page, data, df)
    fig.update_layout(margin=MARGIN)
    page.figure(fig)
    _collectives_table(page, data, df)


def _busbw(page: Page, data: ReportData, df: pd.DataFrame) -> go.Figure:
    """Bus bandwidth against message size, per collective and case (traces that record sizes)."""
    page.paragraph(
        "Bus bandwidth per collective as nccl-tests defines it (algbw = bytes / time, GB = 1e9; busbw = "
        "algbw × 2(n−1)/n for allreduce, (n−1)/n for allgather and reduce-scatter, 1 for broadcast); "
        "time is the collective's shortest duration across ranks (a broadcast's, reduce's or point-to-point's "
        "longest: its root can return as soon as its bytes are handed over, a receiver only once they have crossed). "
        "Median per case, collective and size. A dotted line marks each emulated link's rate, which no busbw on "
        "that link can exceed.",
        css="muted",
    )
    if n := int((_group_size_unknown(df) & df["busbw_gbps"].isna()).sum()):
        page.paragraph(
            f"Left out of the chart: {n} instances without a busbw. {GROUP_SIZE_UNKNOWN} (a broadcast's factor is 1 "
            "whatever n). The table below gives their times.",
            css="muted",
        )
    agg = (
        df.dropna(subset=["busbw_gbps"])
        .groupby(["run_id", "case_id", "collective", "bytes"], as_index=False, observed=True)
        .agg(busbw_gbps=("busbw_gbps", "median"), time_ms=("time_ms", "median"), n=("busbw_gbps", "size"))
    )
    # In the cases' order, as the step-time chart draws them: plotly colours each algorithm in the order it
    # first appears, so each algorithm has the step-time chart's colour here.
    agg = display(data.with_cases(agg).sort_values("order", kind="stable"), ["algo", "label", "run", "collective"])
    agg["bytes"] = agg["bytes"].astype(float)
    agg["setting"] = agg["label"] + ", " + agg["collective"]
    fig = px.scatter(
        agg,
        x="bytes",
        y="busbw_gbps",
        color="algo",
        symbol="setting",
        symbol_map=_symbols_within_algorithm(agg),
        log_x=True,
        facet_col="run" if data.multi else None,
        hover_name="label",
        hover_data={"time_ms": ":.3g", "n": True},
        labels={
            "bytes": "message size (bytes)",
            "busbw_gbps": "busbw (GB/s)",
            "algo": "algorithm",
            "n": "instances",
            "time_ms": "median time (ms)",
        },
    )
    fig.update_xaxes(**log_byte_ticks(agg["bytes"]))
    # From zero: around one point plotly centres the axis on it, and busbw read down to -0.75 GB/s.
    fig.update_yaxes(rangemode="tozero")
    # px names a trace "algo, setting"; the setting (the case's label) already starts with the algorithm.
    fig.for_each_trace(lambda t: t.update(name=t.name.split(", ", 1)[-1]))
    _link_ceilings(fig, data, agg)
    return fig


def _link_ceilings(fig: go.Figure, data: ReportData, agg: pd.DataFrame) -> None:
    """A dotted line at each emulated link's rate (tbf's, in GB/s): no busbw measured on that link
    can lie above it, so a point above it says the time is not the transfer's (a broadcast timed on
    its root read 2.41 GB/s on a 0.125 GB/s link). Unshaped links (loopback, NCCL's) have none."""
    if "interconnect" not in data.done:
        return
    shown = data.done[data.done["case_id"].isin(agg["case_id"])]
    rates = link_rates([r.record for r in data.runs])
    for link in dict.fromkeys(shown["interconnect"].dropna()):
        if rate := rates.get(link):
            fig.add_hline(
                y=rate / 8e9,
                line={"dash": "dot", "width": 1, "color": "#888"},
                annotation_text=plot_text(f"{link}: {rate / 8e9:.3g} GB/s"),
                annotation_position="top left",
                annotation_font_size=10,
            )


def _symbols_within_algorithm(agg: pd.DataFrame) -> dict[str, str]:
    """A marker symbol per case and collective (``setting``), distinct among one algorithm's.

    Colour is the algorithm's, as in the step-time chart; with a symbol per collective only, the
    settings of one algorithm (post-local SGD's periods, packed and unpacked zero_no_overlap) drew
    alike and could be told apart only by hovering."""
    out: dict[str, str] = {}
    for _, group in agg.groupby("algo", sort=False):
        for i, setting in enumerate(dict.fromkeys(group["setting"])):
            out[setting] = MARKER_SYMBOLS[i % len(MARKER_SYMBOLS)]
    return out


def _transfer_times(page: Page, data: ReportData, df: pd.DataFrame) -> go.Figure:
    """Each collective's transfer time per case, for traces that give no busbw: without message sizes
    (Gloo without recorded input shapes), or without group sizes (``GROUP_SIZE_UNKNOWN``)."""
    why = (
        f"{GROUP_SIZE_UNKNOWN}, so bus bandwidth cannot be computed"
        if _group_size_unknown(df).any()
        else "These traces do not record message sizes (Gloo on this PyTorch records no input shapes for "
        "its collectives), so bandwidth cannot be computed"
    )
    page.paragraph(
        f"{why}; shown instead: each collective's transfer time (its shortest duration across ranks; a broadcast's, "
        "reduce's or point-to-point's longest), median per case.",
        css="muted",
    )
    agg = df.groupby(["run_id", "case_id", "collective"], as_index=False, observed=True).agg(
        time_ms=("time_ms", "median"), n=("time_ms", "size")
    )
    agg = display(data.with_cases(agg).sort_values("order", kind="stable"), ["algo", "label", "run", "collective"])
    agg["case"] = [f"{r} · {lab}" if data.multi else lab for r, lab in zip(agg["run"], agg["label"])]
    fig = px.scatter(
        agg,
        x="time_ms",
        y="case",
        color="collective",
        hover_data={"n": True},
        labels={"time_ms": "median transfer time (ms)", "case": "", "n": "instances"},
    )
    fig.update_traces(marker_size=10)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(height=max(260, 26 * agg["case"].nunique() + 140))
    return fig


def _group_size_unknown(df: pd.DataFrame | pd.Series) -> pd.Series | bool:
    """Instances (rows, or one row) whose bytes are known but whose group size is not."""
    return pd.notna(df["bytes"]) & pd.isna(df["group_size"])


def _collectives_table(page: Page, data: ReportData, df: pd.DataFrame) -> None:
    """Per case and collective: instances, and the median instance by time (its time, bytes and
    busbw, one collective's: a median per column would set a time beside a size no instance had and
    a busbw its own bytes and time do not give)."""
    keys = ["run", "label", "collective"]
    rows = []
    for (run, label, collective), g in df.groupby(keys, observed=True, sort=False):
        m = g.sort_values("time_ms", kind="stable").iloc[(len(g) - 1) // 2]  # the lower median: an instance
        busbw = "unknown: group size" if pd.isna(m["busbw_gbps"]) and _group_size_unknown(m) else m["busbw_gbps"]
        rows.append([run, label, collective, len(g), m["time_ms"], m["bytes"], busbw])
    summary = pd.DataFrame(rows, columns=[*keys, "instances", "time_ms", "bytes", "busbw_gbps"])
    if not data.multi:
        summary = summary.drop(columns="run")
    page.paragraph(
        "Per case and collective: how many instances the traced steps held, and the median one by time (the lower "
        "of the two middle ones for an even count): its time, bytes and busbw.",
        css="muted",
    )
    page.table(
        summary.rename(
            columns={
                "label": "case",
                "time_ms": "median instance: time ms",
                "bytes": "its bytes",
                "busbw_gbps": "its busbw GB/s",
            }
        ),
        scroll=len(summary) > 20,
    )
