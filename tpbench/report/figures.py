"""What every figure shares: plot-safe copies of user text, series names, layout constants."""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from tpbench.algorithms import named_keys
from tpbench.report.data import ReportData
from tpbench.report.html import plot_text
from tpbench.suite import DDP_DEFAULT

MARGIN = dict(l=10, r=10, t=50, b=10)
# Legends sit above the plot area, left-aligned, so they never cover bars or lines.
LEGEND_TOP = dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0, title_text="")
LEGEND_BELOW = dict(orientation="h", yanchor="top", y=-0.12, xanchor="left", x=0, title_text="")
# One colour per series, picked by the figure: enough distinct ones for the front door's eighteen settings.
SERIES_COLORS = px.colors.qualitative.Plotly + px.colors.qualitative.Dark24
# How far a byte axis reaches past its sizes on each side, in decades, where it sets its own range.
_BYTE_AXIS_PAD = 0.35


def display(df: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """A copy whose ``columns`` are plot-safe text (see ``html.plot_text``), for legends, facets and ticks."""
    out = df.copy()
    for c in columns:
        if c in out:
            out[c] = out[c].map(lambda v: plot_text("–" if v is None or (isinstance(v, float) and pd.isna(v)) else v))
    return out


def series(data: ReportData, df: pd.DataFrame, exclude: set[str]) -> pd.Series:
    """What tells lines apart: the algorithm as cases are named (``display_name``, with its impl) plus
    every other varying key not on an axis or facet (``exclude``), less those the name says."""
    others = [k for k in data.context_keys if k not in exclude | {"impl"}]

    def line(row: dict) -> str:
        said = named_keys(row["algo"])
        shown = [k for k in others if k not in said and row.get(k) is not None and not pd.isna(row.get(k))]
        return " ".join([row["algo"], *(f"{k}={row[k]}" for k in shown)])

    return pd.Series([line(row) for row in df.to_dict("records")], index=df.index)


def facet_common(data: ReportData, df: pd.DataFrame, keys: list[str]) -> tuple[pd.DataFrame, list[str | None]]:
    """Facet by each of ``keys`` that varies; a case where the key does not apply (None, e.g.
    ``shard_buckets`` of ``zero_no_overlap``) is drawn in every facet as the common reference.
    Returns the frame and, per key, the column to facet by or None."""
    facets = [k if k in data.context_keys else None for k in keys]
    for key in filter(None, facets):
        values = list(df[key].dropna().unique())
        missing = df[df[key].isna()]
        if len(missing) and values:
            df = pd.concat([df[df[key].notna()], *[missing.assign(**{key: v}) for v in values]], ignore_index=True)
    return df, facets


# Where ``bucket_cap_mb = "default"`` (DDP's own bucketing) sits on a bucket-size axis: its 25 MB cap.
DEFAULT_AT_MB = 25.0


def on_bucket_axis(values: pd.Series) -> pd.Series:
    """``bucket_cap_mb`` values as positions on a bucket-size axis ("default" at DDP's 25 MB cap)."""
    return pd.to_numeric(values.map(lambda v: DEFAULT_AT_MB if v == DDP_DEFAULT else v), errors="coerce")


def bucket_axis(data: ReportData, df: pd.DataFrame) -> bool:
    """Whether the cases go on a bucket-size axis: bucket_cap_mb varies and every case has one (a
    case with ``bucket_cap_mb_list`` has none, and would drop off the axis)."""
    return "bucket_cap_mb" in data.context_keys and bool(on_bucket_axis(df["bucket_cap_mb"]).notna().all())


def bucket_ticks(fig, values: pd.Series) -> None:
    """Log-scale bucket axes labelled with the swept sizes only, not plotly's 2-3-4-…-9 minor ticks;
    ``values`` as the cases have them, so DDP's default reads as such."""
    sizes = sorted(set(on_bucket_axis(values).dropna()))
    default = (values == DDP_DEFAULT).any()
    text = [f"{v:g}" + (" (default)" if default and v == DEFAULT_AT_MB else "") for v in sizes]
    fig.update_xaxes(tickvals=sizes, ticktext=text)


def lines_against_bucket_size(
    data: ReportData,
    df: pd.DataFrame,
    y: str,
    keep: list[str],
    row_height: int,
    facet_row: str | None = None,
    facet_col: str | None = None,
    labels: dict[str, str] | None = None,
    **line_args: object,
) -> go.Figure:
    """A line per ``series`` of ``y`` against ``bucket_cap_mb`` on a log axis ticked with the swept
    sizes (DDP's default as such), a dash per run when several are compared, each y axis from 0.
    ``keep``: the columns ``display`` makes plot-safe; ``row_height``: pixels per facet row."""
    sizes = df["bucket_cap_mb"]
    df = display(
        df.assign(bucket_cap_mb=on_bucket_axis(sizes)).sort_values(["bucket_cap_mb", "order"], kind="stable"), keep
    )
    fig = px.line(
        df,
        x="bucket_cap_mb",
        y=y,
        color="series",
        line_dash="run" if data.multi else None,
        facet_row=facet_row,
        facet_col=facet_col,
        markers=True,
        log_x=True,
        hover_name="label",
        labels={"bucket_cap_mb": "bucket_cap_mb (MB)", "series": "", **(labels or {})},
        **line_args,
    )
    rows = df[facet_row].nunique() if facet_row else 1
    bucket_ticks(fig, sizes)
    fig.update_yaxes(matches=None, rangemode="tozero")
    fig.update_layout(height=row_height * rows + 160, margin=MARGIN, legend=LEGEND_BELOW)
    return fig


def log_ratio_ticks(values: Iterable[float]) -> dict[str, list]:
    """Ticks for a ratio's log axis, each labelled as the ratio it is (0.5, 1, 2, 5, 10): over more than
    a decade plotly labels the ticks between decades with a bare digit ("5, 2, 1, 5, 2, 0.1"), so the
    "5" under 1 means 0.5. The 1-2-5 steps of each decade the values span (1 always), or the decades
    alone where those would crowd the axis; where the values lie so close to 1 that fewer than three of
    those fall among them, even steps of 0.01 to 0.5 across them instead (0.9, 1, 1.1, 1.2). Counted
    among the values, not within half as much again: plotly's axis spans the values, so for 0.72-1.36
    the 0.5 and 2 that such a margin counted were never drawn, and "1" was the axis's only label."""
    finite = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    lo, hi = min([*finite, 1.0]), max([*finite, 1.0])
    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    steps = (1, 2, 5) if math.log10(hi / lo) <= 3 else (1,)
    ticks = [m * 10.0**d for d in decades for m in steps if lo / 1.5 <= m * 10.0**d <= hi * 1.5]
    if sum(lo <= t <= hi for t in ticks) < 3:  # within a factor of 2 or so (0.85-1.3): "1" alone read nothing
        step = next((s for s in (0.01, 0.02, 0.05, 0.1, 0.2) if (hi - lo) / s <= 8), 0.5)
        ticks = [round(k * step, 2) for k in range(math.floor(lo / step), math.ceil(hi / step) + 1)]
    return dict(tickvals=ticks, ticktext=[f"{t:g}" for t in ticks])


def log_byte_ticks(values: Iterable[float]) -> dict[str, list]:
    """Ticks for a log axis of bytes, one a decade the values span, each labelled as the size it is
    ("100 B", "1 kB", "10 MB", 1 kB = 1000 B): plotly labels the ticks between decades with a bare
    digit ("5, 1000, 2, 5, 10k"), so the "5" before "1000" means 500 bytes.

    Sizes that hold fewer than two decade ticks between them (DDP buckets of 16.6 and 20.8 kB) would
    draw an axis with one label or none, plotly's range ending short of the decades. Then the range is
    set, a third of a decade wider than the sizes on each side, and ticked at 1, 2 and 5 a decade, or at
    every digit where those still give fewer than two: at least two ticks in a range 0.7 decades wide."""
    finite = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if not finite:
        return {}
    lo, hi = math.log10(min(finite)), math.log10(max(finite))
    decades = range(math.floor(lo), math.ceil(hi) + 1)
    ticks = [10.0**d for d in decades]
    axis: dict[str, list] = {}
    if sum(min(finite) <= t <= max(finite) for t in ticks) < 2:
        lo, hi = lo - _BYTE_AXIS_PAD, hi + _BYTE_AXIS_PAD
        for digits in ((1,), (1, 2, 5), range(1, 10)):
            ticks = [m * 10.0**d for d in range(math.floor(lo), math.ceil(hi) + 1) for m in digits]
            ticks = [t for t in ticks if lo <= math.log10(t) <= hi]
            if len(ticks) >= 2:
                break
        axis["range"] = [lo, hi]
    units = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1.0, "B"))
    text = [next(f"{t / size:g} {unit}" for size, unit in units if t >= size or size == 1.0) for t in ticks]
    return dict(tickvals=ticks, ticktext=text, **axis)


def ratio_trace(grp: pd.DataFrame, x: str, name: str, lo: str = "lo", hi: str = "hi", **scatter: object) -> go.Scatter:
    """One series of ratios (``grp["ratio"]``) against ``x``, their intervals (``lo``, ``hi``) as
    error bars, ``name`` plot-safe ("cases" when empty)."""
    return go.Scatter(
        x=grp[x],
        y=grp["ratio"],
        name=plot_text(name or "cases"),
        error_y=dict(type="data", array=grp[hi] - grp["ratio"], arrayminus=grp["ratio"] - grp[lo]),
        **scatter,
    )
