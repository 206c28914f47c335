"""GPU telemetry (NVML samples over time, with step boundaries), the machine's load per repeat, and
peak memory per rank."""

from __future__ import annotations

import collections

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tpbench.analysis.noise import OTHER_CORES_NOISY, STEAL_PCT_NOISY, noisy_repeats
from tpbench.report import zero_memory
from tpbench.report.data import ReportData
from tpbench.report.figures import LEGEND_TOP, MARGIN, display
from tpbench.report.html import Page

# Panels in drawing order: (title, columns drawn in it).
PANELS = (
    ("GPU utilisation %", ("gpu_util_pct",)),
    ("memory used (MiB)", ("mem_used_mb",)),  # bytes / 2**20, as the _mb columns all are
    ("power (W)", ("power_w",)),
    ("SM clock (MHz)", ("sm_clock_mhz",)),
    ("PCIe (MB/s)", ("pcie_tx_mb_s", "pcie_rx_mb_s")),
    ("NVLink (MB/s)", ("nvlink_tx_mb_s", "nvlink_rx_mb_s")),
)
PHASE_COLORS = {"warmup": "rgba(245,133,24,0.10)", "timed": "rgba(76,120,168,0.08)", "profile": "rgba(84,162,75,0.12)"}
# More step boundaries than this would hide the data under lines; phases are still shaded.
MAX_STEP_LINES = 120


def nvml(page: Page, data: ReportData) -> None:
    cases = data.representative("nvml")
    if not cases:
        reasons = _unavailable(data)
        if reasons:
            total = sum(len(run.record.cases) for run in data.runs)
            said = [f"{why} ({_how_many(n, total)})" for why, n in sorted(reasons.items())]
            page.heading("GPU telemetry", anchor="telemetry")
            page.paragraph("No NVML samples in this report: " + "; ".join(said) + ".", css="muted")
        return
    page.heading("GPU telemetry", anchor="telemetry")
    page.paragraph(
        "NVML samples of one repeat per algorithm (the case with the median step time), every rank's own "
        "GPU. Shaded: warm-up (orange), timed (blue) and traced (green) steps; vertical lines: step "
        "boundaries, placed between the last sample of a step and the first of the next, so within one "
        "sampling interval.",
        css="muted",
    )
    for row, mine in cases:
        repeat = int(mine["repeat"].min())
        title = f"{row['run']} · {row['label']}" if data.multi else row["label"]
        page.heading(f"{title} (case {row['case_id']}, repeat {repeat})", level=3)
        page.figure(_nvml_figure(mine[mine["repeat"] == repeat].sort_values("t_ns")))


def _unavailable(data: ReportData) -> collections.Counter[str]:
    """Why cases have no telemetry, as run.json records it (a CPU case, no driver, ...), and for how
    many: "the case runs on CPU" alone read as if one case of zero.toml's 18 had."""
    reasons: collections.Counter[str] = collections.Counter()
    for run in data.runs:
        for case in run.record.cases.values():
            info = case.capture.nvml
            if info is not None and not info.available and info.reason:
                reasons[str(info.reason)] += 1
    return reasons


def _how_many(n: int, total: int) -> str:
    if n == total:
        return "the only case" if n == 1 else f"all {n} cases"
    return f"{n} case{'s' if n != 1 else ''} of {total}"


def _nvml_figure(df: pd.DataFrame) -> go.Figure:
    panels = [(t, [c for c in cols if c in df and df[c].notna().any()]) for t, cols in PANELS]
    panels = [(t, cols) for t, cols in panels if cols]
    t0 = int(df["t_ns"].min())
    df = df.assign(t_s=(df["t_ns"] - t0) / 1e9)
    fig = make_subplots(
        rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.04, subplot_titles=[t for t, _ in panels]
    )
    colors = px.colors.qualitative.Plotly
    ranks = sorted(int(r) for r in df["rank"].unique())
    for i, (_, cols) in enumerate(panels, start=1):
        for rank in ranks:
            mine = df[df["rank"] == rank]
            for j, col in enumerate(cols):
                fig.add_scatter(
                    x=mine["t_s"],
                    y=mine[col],
                    mode="lines",
                    row=i,
                    col=1,
                    name=f"rank {rank}" + (f" {col.split('_')[1]}" if len(cols) > 1 else ""),
                    legendgroup=f"rank {rank}",
                    showlegend=(i == 1 and j == 0),
                    line=dict(color=colors[rank % len(colors)], dash="dot" if j else "solid", width=1.5),
                    hovertemplate=f"rank {rank} {col}: %{{y:.4g}} at %{{x:.3f}} s<extra></extra>",
                )
    first = df[df["rank"] == ranks[0]]
    shapes = _phase_bands(first) + _step_lines(first)
    fig.update_layout(shapes=shapes, height=170 * len(panels) + 120, margin=MARGIN, legend=LEGEND_TOP)
    fig.update_xaxes(title_text="seconds since the repeat's first sample", row=len(panels), col=1)
    return fig


def _phase_bands(df: pd.DataFrame) -> list[dict]:
    """One shaded band per run of consecutive samples in the same phase (on one rank)."""
    bands = []
    phase = df["phase"].astype(str).to_numpy()
    t = df["t_s"].to_numpy()
    start = 0
    for i in range(1, len(phase) + 1):
        if i == len(phase) or phase[i] != phase[start]:
            if phase[start] in PHASE_COLORS:
                end = t[i] if i < len(t) else t[-1]
                bands.append(
                    dict(
                        type="rect",
                        xref="x",
                        yref="paper",
                        x0=t[start],
                        x1=end,
                        y0=0,
                        y1=1,
                        fillcolor=PHASE_COLORS[phase[start]],
                        line_width=0,
                        layer="below",
                    )
                )
            start = i
    return bands


def _step_lines(df: pd.DataFrame) -> list[dict]:
    step = df["step"].to_numpy()
    t = df["t_s"].to_numpy()
    at = [(t[i - 1] + t[i]) / 2 for i in range(1, len(step)) if step[i] != step[i - 1] and step[i] >= 0]
    if len(at) > MAX_STEP_LINES:
        return []
    return [
        dict(
            type="line", xref="x", yref="paper", x0=x, x1=x, y0=0, y1=1, line=dict(color="rgba(60,60,60,0.35)", width=1)
        )
        for x in at
    ]


# The noisiest repeats listed (by step time against their case's median); the count says how many more.
MAX_NOISY_ROWS = 15


def machine_load(page: Page, data: ReportData) -> None:
    """The repeats that ran on a busy machine, with their step time against their case's median;
    a line saying none did when the runs recorded load but nothing was flagged."""
    repeats = _judged_repeats(data)
    if repeats is None:
        return
    # Noisiest first: furthest from its case's median either way, so that the table's rows keep those.
    noisy = data.with_cases(repeats[repeats["noisy"]]).sort_values(
        "relative", key=lambda r: (r - 1).abs(), ascending=False, kind="stable"
    )
    page.heading("Machine load", anchor="machine-load")
    criteria = (
        f"other processes, the world's own ranks not counted, used more than {OTHER_CORES_NOISY:g} cores beyond "
        f"the cores the world leaves spare, or CPU steal above {STEAL_PCT_NOISY:g}%; the 1-minute load average "
        "is shown but not judged: it counts the world's own ranks"
    )
    if noisy.empty:
        page.paragraph(f"No repeat ran on a busy machine ({criteria}).", css="muted")
        return
    page.paragraph(
        f"{len(noisy)} of {len(repeats)} repeats ran on a busy machine ({criteria}); the noisiest first, "
        "with their median step time against their case's median over repeats.",
        css="muted",
    )
    shown = noisy.head(MAX_NOISY_ROWS)
    rows = pd.DataFrame(
        {
            **({"run": shown["run"]} if data.multi else {}),
            "case": shown["label"],
            "repeat": shown["repeat"],
            "step time vs case median": [_change_pct(r) for r in shown["relative"]],
            **({"other CPU (cores)": shown["other_cores"].round(2)} if "other_cores" in shown else {}),
            "load1": shown["load1"].round(2),
            "other runnable": shown["runnable"],
            "steal %": shown["steal_pct"].round(1),
            "why": shown["why"],
        }
    )
    page.table(rows)
    if len(noisy) > len(shown):
        left = len(noisy) - len(shown)
        page.paragraph(f"{left} more noisy repeat{'s' if left > 1 else ''} not listed.", css="muted")


def _judged_repeats(data: ReportData) -> pd.DataFrame | None:
    """Every repeat of the runs that recorded the machine's load, judged noisy or not
    (``noise.noisy_repeats``); None where none recorded it."""
    frames = []
    for run in data.runs:
        nodes = max(1, len(run.environment.get("nodes") or []))
        per_node = {cid: int(c.params["world_size"]) // nodes for cid, c in run.record.cases.items()}
        flagged = noisy_repeats(run.steps, int(run.environment.get("cpu_count") or 1), per_node)
        if not flagged.empty:
            frames.append(flagged.assign(run_id=run.record.run_id))
    return pd.concat(frames, ignore_index=True) if frames else None


def busy_line(data: ReportData) -> str:
    """How many repeats ran on a busy machine, by the Machine load section's criteria, in a line for the
    sweep's terminal beside its verdicts; "" where none did or no load was recorded."""
    repeats = _judged_repeats(data)
    noisy = 0 if repeats is None else int(repeats["noisy"].sum())
    if not noisy:
        return ""
    return (
        f"{noisy} of {len(repeats)} repeats ran on a busy machine (other processes' CPU beyond the cores the world "
        f"leaves spare, or CPU steal above {STEAL_PCT_NOISY:g}%): their step times may scatter more; the report's "
        "Machine load lists them."
    )


def _change_pct(relative: float) -> str:
    """A repeat's step time against its case's median as a whole percentage; a change that rounds to
    none reads "+0%", never "-0%"."""
    return f"{round((relative - 1) * 100):+d}%"  # an int: no negative zero


# Beyond this many cases, memory per rank is drawn for one representative case per algorithm.
MAX_MEMORY_CASES = 30
MEMORY_COLUMNS = {"peak_rss_mb": "host RSS", "peak_allocated_mb": "GPU allocated", "peak_reserved_mb": "GPU reserved"}


def memory(page: Page, data: ReportData) -> None:
    steps = data.steps()
    cols = [c for c in MEMORY_COLUMNS if c in steps and steps[c].notna().any()]
    if steps.empty or not cols:
        return
    peaks = steps.groupby(["run_id", "case_id", "rank"], as_index=False)[cols].max()
    df = data.with_cases(peaks).sort_values(["order", "rank"], kind="stable")
    few = len(df[["run_id", "case_id"]].drop_duplicates()) <= MAX_MEMORY_CASES
    if not few:
        keep = {(row["run_id"], row["case_id"]) for row, _ in data.representative()}
        df = df[[k in keep for k in zip(df["run_id"], df["case_id"])]]
    df["case"] = [f"{r} · {lab}" if data.multi else lab for r, lab in zip(df["run"], df["label"])]
    # The *_mb columns are MiB (VmHWM's KiB / 1024, CUDA's bytes / 2**20), as "What ZeRO saves" says them.
    long = df.melt(id_vars=["case", "rank"], value_vars=cols, var_name="metric", value_name="MiB")
    long["metric"] = long["metric"].map(MEMORY_COLUMNS)
    long["rank"] = "rank " + long["rank"].astype(str)
    long = display(long, ["case"])
    page.heading("Memory per rank", anchor="memory")
    exact = '; the exact optimizer state is in "What ZeRO saves"' if zero_memory.shown(data) else ""
    page.paragraph(
        "Peak per rank over all steps of a case: process RSS (on CPU mostly the runtime, about the same for "
        f"every case{exact}), and on GPU the CUDA caching allocator's allocated and reserved bytes."
        + (
            ""
            if few
            else " Many cases: shown for the case with the median "
            "step time of each algorithm; every case's maximum over ranks is in the table of all cases."
        ),
        css="muted",
    )
    fig = px.bar(
        long,
        x="MiB",
        y="case",
        color="rank",
        facet_col="metric" if len(cols) > 1 else None,
        orientation="h",
        barmode="group",
        labels={"case": ""},
    )
    fig.update_xaxes(matches=None)
    fig.update_yaxes(autorange="reversed")
    n = long["case"].nunique() * max(1, long["rank"].nunique() // 2)
    fig.update_layout(height=max(280, 18 * n + 140), margin=MARGIN, legend=LEGEND_TOP)
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=")[-1]))
    page.figure(fig)
