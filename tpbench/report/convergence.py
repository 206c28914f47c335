"""Convergence: held-out loss against step and against training time, the workload's known
optimum and the target drawn in, time to target, and parameter drift before averaging.

Post-local SGD buys shorter steps with worse gradients, so neither axis alone answers "is it
worth it": the loss per step shows what averaging less often costs, the loss per training second
shows whether the cheaper steps pay for it. Training time is the cumulative slowest-rank step
time (``analysis.convergence.curves``), so evaluation and drift measurement never count.
"""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tpbench import verdict
from tpbench.algorithms import LOCALSGD
from tpbench.analysis import convergence
from tpbench.analysis.convergence import TARGET_RELATIVE_GAP
from tpbench.analysis.stats import Ratio
from tpbench.report.data import ReportData
from tpbench.report.figures import LEGEND_BELOW, MARGIN, SERIES_COLORS
from tpbench.report.html import Page, plot_text
from tpbench.report.verdicts import ConvergenceVerdict, evaluated_to


def _curves(data: ReportData) -> pd.DataFrame:
    """Per (run, case, step): held-out loss, training time and drift, each the mean over repeats."""
    steps = data.steps()
    frames = []
    for run_id, mine in steps.groupby("run_id", sort=False):
        c = convergence.curves(mine.drop(columns="run_id"))
        cols = [k for k in ("heldout_loss", "train_time_s", "drift_max_l2") if k in c]
        frames.append(c.groupby(["case_id", "step"], as_index=False)[cols].mean().assign(run_id=run_id))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def section(page: Page, data: ReportData, verdicts: list[ConvergenceVerdict]) -> None:
    steps = data.steps()
    if steps.empty or "heldout_loss" not in steps or steps["heldout_loss"].isna().all():
        return
    curves = data.with_cases(_curves(data))
    curves["case"] = [
        plot_text(f"{r} · {lab}" if data.multi else lab) for r, lab in zip(curves["run"], curves["label"])
    ]
    switches = _switches(curves, data)
    page.heading("Convergence", anchor="convergence")
    page.paragraph(
        f"Held-out loss (mean over ranks, then over repeats) against step and against training time "
        f"(cumulative slowest-rank step time: evaluation and drift measurement excluded). Dashed: the "
        f"workload's known optimum; dotted: the target, {TARGET_RELATIVE_GAP:.0%} above it"
        + ("; dash-dot: where post-local SGD switches to local averaging (start_localSGD_iter)." if switches else "."),
        css="muted",
    )
    colors = _case_colors(curves)
    page.figure(_loss_figure(curves.dropna(subset=["heldout_loss"]), data, colors, switches))
    _time_to_target(page, data, verdicts)
    if "drift_max_l2" in curves and curves["drift_max_l2"].notna().any():
        _drift(page, curves.dropna(subset=["drift_max_l2"]), colors)


def _case_colors(curves: pd.DataFrame) -> dict[str, str]:
    """One colour per case for both charts, in the cases' order: each chart numbering its own series
    shifted every drift line one colour off the loss chart's, since DDP (which never averages) has no
    drift (its blue went to the first post-local SGD setting, drawn red beside it)."""
    cases = curves.sort_values("order", kind="stable")["case"].drop_duplicates()
    return {case: SERIES_COLORS[i % len(SERIES_COLORS)] for i, case in enumerate(cases)}


def _loss_figure(
    curves: pd.DataFrame, data: ReportData, colors: dict[str, str], switches: dict[int, list[str]]
) -> go.Figure:
    fig = make_subplots(
        rows=1,
        cols=2,
        shared_yaxes=True,
        horizontal_spacing=0.03,
        subplot_titles=["held-out loss vs step", "held-out loss vs training time"],
    )
    for case, c in curves.sort_values(["order", "step"], kind="stable").groupby("case", sort=False):
        color = colors[case]
        for col, x in ((1, "step"), (2, "train_time_s")):
            fig.add_scatter(
                x=c[x] + (1 if x == "step" else 0),
                y=c["heldout_loss"],
                mode="lines+markers",
                name=case,
                legendgroup=case,
                showlegend=col == 1,
                line=dict(color=color),
                marker=dict(size=5),
                row=1,
                col=col,
                hovertemplate=f"{case}<br>%{{x:.4g}}: %{{y:.4f}}<extra></extra>",
            )
    optima = data.cases["optimal_loss"].dropna().unique() if "optimal_loss" in data.cases else []
    for opt in optima:
        fig.add_hline(
            y=float(opt),
            line=dict(dash="dash", color="#333"),
            annotation_text=f"optimum {opt:.4f}",
            annotation_position="bottom left",
        )
        fig.add_hline(
            y=float(opt) * (1 + TARGET_RELATIVE_GAP),
            line=dict(dash="dot", color="#777"),
            annotation_text="target",
            annotation_position="top left",
        )
    for at, cases in switches.items():
        fig.add_vline(
            x=at,
            line=dict(dash="dashdot", width=1, color=colors[cases[0]] if len(cases) == 1 else "#777"),
            annotation_text=f"local SGD from {at}",
            annotation_position="top right",
            annotation_font_size=10,
            row=1,
            col=1,
        )
    fig.update_xaxes(title_text="steps trained", row=1, col=1)
    fig.update_xaxes(title_text="training time (s)", row=1, col=2)
    fig.update_yaxes(title_text="held-out loss (nats)", row=1, col=1)
    fig.update_layout(height=480, margin=MARGIN, legend=LEGEND_BELOW)
    return fig


def _switches(curves: pd.DataFrame, data: ReportData) -> dict[int, list[str]]:
    """Where each post-local SGD case leaves global averaging, for a dash-dot line on the loss-per-step
    chart (a curve that bends there bends because of the switch): step → the cases (as ``curves``
    names them) that switch after that many steps trained. The hook counts iterations from the
    first warm-up step, as the chart's steps do. Cases that switch at one step share one line."""
    if "start_localSGD_iter" not in data.cases:
        return {}
    shown = curves.drop_duplicates("case")[["run_id", "case_id", "case"]]
    cases = shown.merge(data.cases[["run_id", "case_id", "algo", "start_localSGD_iter"]], on=["run_id", "case_id"])
    cases = cases.assign(at=pd.to_numeric(cases["start_localSGD_iter"], errors="coerce"))
    cases = cases[(cases["algo"] == LOCALSGD) & cases["at"].notna()]
    return {int(at): list(grp["case"]) for at, grp in cases.groupby("at", sort=True)}


def _time_to_target(page: Page, data: ReportData, verdicts: list[ConvergenceVerdict]) -> None:
    cols = ["final_heldout_loss", "optimal_loss", "gap_to_optimum", "steps_to_target", "time_to_target_s", "median_ms"]
    rows = (
        data.cases.dropna(subset=["final_heldout_loss"]) if "final_heldout_loss" in data.cases else data.cases.iloc[:0]
    )
    if rows.empty:
        return
    vs = {(v.comparison.run_id, v.comparison.candidate["case_id"], v.comparison.baseline_named): v for v in verdicts}
    # A run with both forms of plain DDP sets each candidate against each: a column pair per DDP, named
    # as the verdict lines name it (one pair, "vs DDP", kept only the last of them).
    against = list(dict.fromkeys(v.comparison.baseline_named for v in verdicts)) or [""]
    records = rows.to_dict("records")
    evaluated = [evaluated_to(data, r) for r in records]
    # Where eval_every does not divide the steps trained, the final held-out loss is the last evaluation's.
    short = any(e is not None and e[0] != e[1] for e in evaluated)
    table = []
    for r, at in zip(records, evaluated):
        row = {
            **({"run": r["run"]} if data.multi else {}),
            "case": r["label"],
            **{c: r.get(c) for c in cols},
            **({"last held-out evaluation (step)": f"{at[0]} of {at[1]}" if at else ""} if short else {}),
        }
        for named in against:
            v = vs.get((r["run_id"], r["case_id"], named))
            ddp = f"DDP ({named})" if named else "DDP"
            row[f"time to target vs {ddp}"] = _ratio_cell(v.reach_ratio if v else None)
            # Signed, in the level band's decimals and one more: four significant figures wrote 0.0004154.
            row[f"final loss − {ddp} (nats)"] = f"{v.final_delta:+.4f}" if v else ""
        table.append(row)
    page.heading("Time to target", level=3)
    page.paragraph(
        "Median over repeats; a case reaches the target only if every repeat does (otherwise blank). The final "
        "held-out loss is the last evaluation's: where eval_every does not divide the steps trained, a column "
        "gives its step."
        + _granularity(rows)
        + " Ratios: candidate / DDP training time to target, with its 95% t interval over repeats (paired by round "
        "when both ran in one world) and its half-width, the smallest difference it could resolve."
        + (TUNED_NOTE if any(r.tune is not None for r in data.runs) else ""),
        css="muted",
    )
    page.table(
        pd.DataFrame(table).rename(
            columns={
                "final_heldout_loss": "final held-out loss (nats)",
                "optimal_loss": "optimum (nats)",
                "gap_to_optimum": "gap to optimum (nats)",
                "steps_to_target": "steps to target",
                "time_to_target_s": "time to target (s)",
                "median_ms": "step ms",
            }
        ),
        float_format="{:.4g}",
        scroll=len(table) > 20,
    )


def _granularity(rows: pd.DataFrame) -> str:
    """Steps and time to target are only as fine as ``eval_every``: the held-out loss is evaluated every
    that many steps, so a case is counted at its first evaluation at or below the target, and two cases
    that got there a step apart can read ``eval_every`` steps apart (40 → 60 of suites/localsgd.toml)."""
    every = sorted({int(v) for v in rows.get("eval_every", pd.Series(dtype=float)).dropna() if v > 0})
    if not every:
        return ""
    said = f"every {every[0]} steps" if len(every) == 1 else "every " + ", ".join(map(str, every)) + " steps, by case"
    return (
        f" Steps and time to target are only as fine as eval_every ({said}): they are the first held-out "
        "evaluation's at or below the target, and the case got there within the eval_every steps before it."
    )


# A tune's note sets its arms' times to the target against one another at the confidence its race spent on
# each comparison, so that all of them hold together: wider than this table's 95 %, and for the same pair
# (the recommended setting against DDP) it may call unresolved what a cell here resolves.
TUNED_NOTE = (
    " The tune's note in the Recommendation gives times to the target at the confidence its race spent on each "
    "comparison (it says which), wider intervals than these."
)


def _ratio_cell(est: Ratio | None) -> str:
    if est is None:
        return ""
    if not est.has_interval:
        return f"{est.ratio:.2f} (one repeat)"
    return f"{est.ratio:.2f} [{est.lo:.2f}, {est.hi:.2f}] {verdict.half_width_pct(est.half_width)}"


def _drift(page: Page, curves: pd.DataFrame, colors: dict[str, str]) -> None:
    page.heading("Parameter drift before averaging", level=3)
    page.paragraph(
        "Largest L2 distance of a rank's parameters from their mean across ranks, measured just before "
        "each model averaging (mean over repeats): how far local steps let the replicas wander.",
        css="muted",
    )
    page.figure(_drift_figure(curves, colors))


def _drift_figure(curves: pd.DataFrame, colors: dict[str, str]) -> go.Figure:
    """Drift against steps trained, as the loss chart above counts them: a drift stored at step s was
    measured after that step's optimizer step, s + 1 steps in, where the loss chart's axis puts it.
    Its legend sits lower than the shared one, clear of the axis title at this height."""
    fig = px.line(
        curves.sort_values(["order", "step"], kind="stable").assign(trained=lambda c: c["step"] + 1),
        x="trained",
        y="drift_max_l2",
        color="case",
        color_discrete_map=colors,
        markers=True,
        labels={"drift_max_l2": "max L2 drift", "case": "", "trained": "steps trained"},
    )
    fig.update_layout(height=380, margin=MARGIN, legend=LEGEND_BELOW | dict(y=-0.2))
    return fig
