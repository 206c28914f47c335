"""Step time: per case against bucket size, speedup heatmaps, and the table of every comparison."""

from __future__ import annotations

import collections
import math
from typing import Any

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from tpbench import verdict
from tpbench.analysis.stats import CONFIDENCE, averaging_window, range_confidence
from tpbench.report.data import ReportData, context_text, run_letter
from tpbench.report.figures import (
    LEGEND_TOP,
    MARGIN,
    bucket_axis,
    display,
    facet_common,
    lines_against_bucket_size,
    on_bucket_axis,
    series,
)
from tpbench.report.html import Page, plot_text
from tpbench.report.verdicts import Comparison, mb_text
from tpbench.suite import DDP_DEFAULT


def step_time(page: Page, data: ReportData) -> None:
    done = data.done
    if done.empty:
        return
    page.heading("Step time", anchor="step-time")
    page.paragraph(step_time_caption(done), css="muted")
    buckets = ddp_bucket_lines(done)
    if buckets:
        page.paragraph("The gradient buckets DDP really built: " + "; ".join(buckets) + ".", css="muted")
    done = done.assign(err_plus=done["ci_hi_ms"] - done["median_ms"], err_minus=done["median_ms"] - done["ci_lo_ms"])
    if bucket_axis(data, done):
        page.figure(_against_bucket_size(data, done))
    else:
        page.figure(_bars(data, done))


def step_time_caption(done: pd.DataFrame) -> str:
    """What the points are. Post-local SGD after its switch is not the median over its steps: its
    repeat value is the median over whole averaging periods of each one's mean step
    (``stats.repeat_values``), so that the averaging steps count, and the caption says so where such a
    case is shown."""
    said = (
        "Median of the slowest rank's step time over timed steps; error bars: 95% bootstrap CI over "
        "repeats (the repeat is the independent unit)."
    )
    if note := verdict.few_repeats_note(verdict.repeat_counts(done)):
        said += " " + note
    if any(averaging_window(row) > 1 for row in done.to_dict("records")):
        said += (
            " Post-local SGD after its switch: per repeat, the median over whole averaging periods of each "
            "period's mean step, so that the averaging steps, which a median over steps drops, count."
        )
    return said


def ddp_bucket_lines(done: pd.DataFrame) -> list[str]:
    """Per bucket setting, the buckets DDP built (summary's ``ddp_bucket_bytes``, in reduction order):
    "bucket_cap_mb = 0.5 → 7 buckets of 0.39–0.52 MiB (first 0.39 MiB)". A setting that built different
    buckets for different cases (other models) says for which."""
    if "ddp_bucket_bytes" not in done:
        return []
    seen: dict[tuple[str, tuple[int, ...]], list[str]] = {}
    for row in done.to_dict("records"):
        sizes = row.get("ddp_bucket_bytes")
        if sizes is None or (isinstance(sizes, float) and pd.isna(sizes)) or not len(sizes):
            continue
        seen.setdefault((_asked(row), tuple(int(b) for b in sizes)), []).append(row["label"])
    per_setting = collections.Counter(asked for asked, _ in seen)
    lines = []
    for (asked, sizes), cases in seen.items():
        mb = [b / 2**20 for b in sizes]
        built = f"{len(mb)} bucket{'s' if len(mb) > 1 else ''} of " + (
            f"{mb[0]:.2f} MiB" if len(mb) == 1 else f"{min(mb):.2f}–{max(mb):.2f} MiB (first {mb[0]:.2f} MiB)"
        )
        which = f" ({', '.join(cases)})" if per_setting[asked] > 1 else ""
        lines.append(f"{asked} → {built}{which}")
    return lines


def _asked(row: dict) -> str:
    """The bucketing a case asked DDP for, as the suite writes it."""
    caps = row.get("bucket_cap_mb_list")
    if caps is not None and not (isinstance(caps, float) and pd.isna(caps)):
        return f"bucket_cap_mb_list = [{', '.join(f'{float(c):g}' for c in caps)}]"
    v = row.get("bucket_cap_mb")
    return f'bucket_cap_mb = "{v}"' if v == DDP_DEFAULT else f"bucket_cap_mb = {float(v):g}"


def _against_bucket_size(data: ReportData, done: pd.DataFrame) -> go.Figure:
    df, (frow, fcol) = facet_common(data, done, ["shard_buckets", "interconnect"])
    df = df.assign(
        series=series(data, df, {"bucket_cap_mb", "shard_buckets", "interconnect"}),
        ci=[
            _interval_hover(lo, hi, reps)
            for lo, hi, reps in zip(df["ci_lo_ms"], df["ci_hi_ms"], verdict.repeat_counts(df))
        ],
    )
    return lines_against_bucket_size(
        data,
        df,
        "median_ms",
        ["series", "run", "label", *filter(None, (frow, fcol))],
        row_height=300,
        facet_row=frow,
        facet_col=fcol,
        labels={"median_ms": "step time (ms)", "ci": "interval (ms)"},
        error_y="err_plus",
        error_y_minus="err_minus",
        hover_data={"ci": True, "run": data.multi, "series": False, "err_plus": False, "err_minus": False},
    )


def _interval_hover(lo: float, hi: float, repeats: int | None) -> str:
    """A point's interval in its hover, with the confidence it holds: "[9.8, 10.4] (95%)", or with 2 to 5
    repeats "[9.8, 10.4] (the range of 3 repeats: 75%)" (``verdict.few_repeats_note``): the hover said
    "95% CI" of every interval."""
    if lo != lo:
        return "none (one repeat)"
    if repeats is not None and range_confidence(repeats) < CONFIDENCE:
        return f"[{lo:.3g}, {hi:.3g}] (the range of {repeats} repeats: {verdict.percent(range_confidence(repeats))})"
    return f"[{lo:.3g}, {hi:.3g}] ({verdict.percent(CONFIDENCE)})"


def _bars(data: ReportData, done: pd.DataFrame) -> go.Figure:
    """A bar per case (and run). Several runs group each case's bars, one slot per run; one run's
    bars, coloured by algorithm, overlay: grouped, each label would keep a slot for every
    algorithm and its one bar would sit beside it."""
    df = display(done, ["label", "run", "algo"])
    fig = px.bar(
        df,
        x="median_ms",
        y="label",
        color="run" if data.multi else "algo",
        orientation="h",
        barmode="group" if data.multi else "overlay",
        opacity=1,  # plotly express pales overlaid bars, which here never overlap
        error_x="err_plus",
        error_x_minus="err_minus",
        hover_data={"err_plus": False, "err_minus": False},
        labels={"median_ms": "step time (ms)", "label": "", "algo": "algorithm", "run": "run"},
    )
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(height=max(300, 26 * len(df) + 120), margin=MARGIN, legend=LEGEND_TOP)
    return fig


def heatmaps(page: Page, data: ReportData, comparisons: dict[str, list[Comparison]]) -> None:
    """One heatmap per kind of comparison: bucket size across, every other setting down."""
    present = {k: cs for k, cs in comparisons.items() if cs}
    if not present:
        return
    page.heading("Speedups", anchor="speedups")
    page.paragraph(
        "Step time ratio (candidate / baseline) per matched pair of cases, with its 95% interval (paired by "
        "round when the two ran in one world) and its half-width (±, what the run could resolve); below 1 (blue) "
        "the candidate is faster. A cell is coloured only where its interval excludes 1: one that holds it is "
        "left white, whichever way its ratio leans. The colour scale is the ratio's logarithm: twice as fast is as "
        "deep a blue as twice as slow is red.",
        css="muted",
    )
    for key, cs in present.items():
        page.figure(_heatmap(data, key, cs))


def _heatmap(data: ReportData, key: str, cs: list[Comparison]) -> go.Figure:
    rows = []
    for c in cs:
        shared = context_text(c.context, [k for k in c.context if k != "bucket_cap_mb"])
        y = ", ".join(filter(None, [shared, *(f"{k}={v}" for k, v in c.variant.items())])) or "all"
        bucket = _shared_bucket(c)
        rows.append(
            {
                "x": "all" if bucket is None else mb_text(bucket),
                "bucket": float(on_bucket_axis(pd.Series([0 if bucket is None else bucket])).iloc[0]),
                "y": plot_text((f"{data.tags[c.run_id]} · " if data.multi else "") + y),
                # Colour says shown faster or slower; a ratio whose interval holds 1 shows nothing.
                "shade": math.log2(c.ratio) if c.est.has_interval and not c.lo <= 1 <= c.hi else 0.0,
                "text": f"{c.ratio:.2f}<br>[{c.lo:.2f}, {c.hi:.2f}]"
                + (f"<br>{verdict.half_width_pct(c.est.half_width)}" if c.est.has_interval else "<br>one repeat"),
            }
        )
    df = pd.DataFrame(rows)
    xs = list(dict.fromkeys(df.sort_values("bucket")["x"]))
    ys = list(dict.fromkeys(df["y"]))
    z = df.pivot_table(index="y", columns="x", values="shade", aggfunc="first").reindex(index=ys, columns=xs)
    text = df.pivot_table(index="y", columns="x", values="text", aggfunc="first").reindex(index=ys, columns=xs)
    # Coloured by log2(ratio), 0 (white) at no change: twice as fast is as blue as twice as slow is red.
    # On the ratio itself a scale 1 ± 2.1 (a ratio of 3.1) reached a ratio of -1.1, and 0.5 was pale.
    spread = max(math.log2(1.05), float(df["shade"].abs().max()))
    ticks = [spread * k / 2 for k in range(-2, 3)]
    kind = cs[0].kind
    fig = go.Figure(
        go.Heatmap(
            z=z.to_numpy(),
            x=xs,
            y=ys,
            text=text.fillna("").to_numpy(),
            texttemplate="%{text}",
            colorscale="RdBu_r",
            zmid=0,
            zmin=-spread,
            zmax=spread,
            # Three figures: at the narrowest bar (±5 %) two did not tell 1.025 from 1 ("1.1, 1, 1, 0.98").
            colorbar=dict(title="ratio", tickvals=ticks, ticktext=[f"{2**t:.3g}" for t in ticks]),
            hovertemplate="%{y}<br>%{x}: %{text}<extra></extra>",
        )
    )
    fig.update_layout(
        # Two lines: the packing comparison's names alone fill the width of the plot.
        title=plot_text(key) + "<br>" + plot_text(f"step time ratio (< 1: {kind.candidate} faster)"),
        height=max(280, 70 * len(ys) + 160),
        margin=MARGIN | dict(t=70),
    )
    fig.update_yaxes(autorange="reversed")
    return fig


def _shared_bucket(c: Comparison) -> Any:
    """The ``bucket_cap_mb`` both sides of ``c`` ran at, or None where they differ or DDP ignored it.

    The context holds only keys the run varies: with one bucket size (``--filter bucket_cap_mb=1``)
    it has none, and the heatmap's only column would read "all" though every case ran at 1 MB."""
    if "bucket_cap_mb" in c.context:
        return c.context["bucket_cap_mb"]
    sides = (c.candidate, c.baseline)
    if any(isinstance(side.get("bucket_cap_mb_list"), list) for side in sides):
        return None  # DDP ignores bucket_cap_mb beside a list of caps
    value = c.candidate.get("bucket_cap_mb")
    return value if value is not None and value == c.baseline.get("bucket_cap_mb") else None


def comparisons_table(page: Page, data: ReportData, comparisons: list[Comparison]) -> None:
    """Every comparison of every run, a row each (``comparison_rows``)."""
    if not comparisons:
        return
    page.heading("All comparisons", anchor="comparisons")
    page.paragraph(
        ("run: the run's letter, as the Environment table's columns name the runs; " if data.multi else "")
        + "candidate and baseline ms: the geometric means over repeats whose ratio the ratio column is (a case's "
        "median, in the tables above, may move the other way where its repeats are skewed); resolves: the "
        "half-width of the ratio's 95% interval, the smallest difference the comparison could have told from none; "
        "paired: the rounds of a paired ratio (the two cases ran in one world), else unpaired; verdict: the call "
        "on that interval, in the words of the verdicts above.",
        css="muted",
    )
    rows = comparison_rows(data, comparisons)
    page.table(rows, scroll=len(rows) > 20)


def comparison_rows(data: ReportData, comparisons: list[Comparison]) -> pd.DataFrame:
    """The All comparisons table, each figure said once: the verdict column has the call's words
    alone (``verdict.Verdict.words``), as the ratio, 95% CI and resolves columns hold its numbers;
    the change and interval written again in it made the table's narrowest column its tallest. Ratios
    take two decimals, as the heatmaps give the same pairs ("[0.86, 1.20]", not "[0.864, 1.2]").
    With several runs the run column holds the run's letter alone (``run_letter``), which the
    paragraph above the table ties to the Environment table's columns: the whole tag ("A · commit
    55493a0ac4+dirty") widened the table past a 1400 px page and cut off its last column."""
    return pd.DataFrame(
        [
            {
                **({"run": run_letter(data.tags[c.run_id])} if data.multi else {}),
                "comparison": c.kind.key,
                "candidate": c.candidate["label"],
                "baseline": c.baseline["label"],
                "candidate ms": c.est.sides[1],
                "baseline ms": c.est.sides[0],
                "ratio": f"{c.ratio:.2f}",
                "95% CI": f"[{c.lo:.2f}, {c.hi:.2f}]" if c.est.has_interval else "",
                "resolves": verdict.half_width_pct(c.est.half_width) if c.est.has_interval else "",
                "paired": f"{c.est.n} rounds" if c.est.method == "paired" else c.est.method,
                "verdict": c.said.words,
            }
            for c in comparisons
        ]
    )
