"""Report sections for interconnects: the interleaved/sequential crossover and what-if projections.

Each section appears only when a run has the data for it: the crossover needs both ZeRO hooks on
more than one comm:compute ratio; the what-if needs traced cases (and, for its validation,
emulated ``tcp-<rate>`` cases next to reference-link twins). Projections are labelled as such
everywhere they appear: they are this machine's compute with another fabric's α–β costs.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tpbench import store, verdict, whatif_run
from tpbench.analysis import crossover, replay, whatif, whatif_validation
from tpbench.record import label_value
from tpbench.report.figures import log_ratio_ticks, ratio_trace
from tpbench.report.html import Page, plot_text


def sections(page: Page, runs: list[store.Loaded], fabrics: dict[str, replay.Fabric] | None = None) -> None:
    """Add the crossover and what-if sections for each run that supports them."""
    fabrics = fabrics if fabrics is not None else whatif_run.load_fabrics()
    many = len(runs) > 1
    for run in runs:
        suffix = f" (run {run.record.run_id})" if many else ""
        anchor = f"-{run.record.run_id}" if many else ""
        _crossover_section(page, run, suffix, anchor)
        _whatif_section(page, run, fabrics, suffix, anchor)


def _crossover_section(page: Page, run: store.Loaded, suffix: str, anchor: str) -> None:
    if run.steps.empty or run.summary.empty:
        return
    points = crossover.ratio_points(run.cases, run.steps, run.summary)
    if points.empty or points["comm_compute"].dropna().nunique() < 2:
        return
    page.heading(f"Interleaved vs sequential ZeRO hook across links{suffix}", anchor=f"crossover{anchor}")
    page.paragraph(
        "Each point is one link, bucket size and wrapped communication hook: the step time of "
        "hook_with_zero_step_interleaved over that of hook_with_zero_step (geometric mean of per-round ratios; "
        "error bars: 95% t interval over rounds, paired by round), "
        "against the communication:computation ratio of the no-overlap reference case on the same link and hook "
        f"({points['comm_compute_from'].iloc[0]}: traced communication time per step over compute time per step). "
        "Below 1 the interleaved hook is faster. A crossover is named only where the points place it: a point where "
        "each hook is clearly faster, on opposite sides. The line is a weighted fit of log ratio against log "
        "comm:compute; the shaded band, drawn only then, is its crossing's 95% CI from refitting on bootstrap "
        "resamples of the rounds (each round's pair kept together).",
        css="muted",
    )
    try:
        est = crossover.estimate_crossover(points)
    except ValueError as e:
        page.paragraph(f"No crossover estimate: {e}.", css="warn")
        est = None
    if est is not None:
        page.bullets([est.sentence(verdict.THRESHOLD)], css="verdicts")
        by_bucket = []
        if "bucket_cap_mb" in points and points["bucket_cap_mb"].nunique() > 1:
            for bucket, grp in points.groupby("bucket_cap_mb"):
                try:
                    said = crossover.estimate_crossover(grp).sentence(verdict.THRESHOLD)
                    by_bucket.append(f"bucket_cap_mb={label_value(bucket)}: {said}")
                except ValueError as e:
                    by_bucket.append(f"bucket_cap_mb={label_value(bucket)}: {e}")
            page.bullets(by_bucket)
    other = _other_keys(points)
    page.figure(_crossover_figure(points, est, other))
    page.paragraph(
        "sequential and interleaved median ms: each case's median over its rounds; ratio: the geometric mean of "
        "the per-round ratios (with its 95% CI), which the medians' quotient need not equal.",
        css="muted",
    )
    page.table(_crossover_table(points, other))


def _crossover_table(points: pd.DataFrame, other: list[str]) -> pd.DataFrame:
    """The points as rows, by comm:compute. The ratio and its interval take two decimals, as in the All
    comparisons table and the heatmaps ("1.09", "[0.90, 1.33]"): as plain floats the page's three
    significant figures wrote them "0.81", "1.1" and "1.2" in one row."""
    bounds = zip(points["ratio_lo"], points["ratio_hi"], points["half_width"])
    shown = points.assign(
        **{
            "allreduce MB/step": points["allreduce_bytes_per_step"] / 1e6,
            "ratio": points["ratio"].map(lambda x: f"{x:.2f}"),
            "95% CI": [f"[{lo:.2f}, {hi:.2f}]" if np.isfinite(w) else "" for lo, hi, w in bounds],
            "resolves": [verdict.half_width_pct(w) if np.isfinite(w) else "one repeat" for w in points["half_width"]],
        }
    )
    cols = [
        "interconnect",
        "bucket_cap_mb",
        "comm_hook",
        *other,
        "allreduce MB/step",
        "comm_compute",
        "sequential_ms",
        "interleaved_ms",
        "ratio",
        "95% CI",
        "resolves",
    ]
    # Points of one comm:compute (one link and bucket size) by their other keys, not as they came: zero.toml's
    # 4 MB rows read shard_buckets True then False, its 0.5 MB rows False then True.
    ties = [c for c in other if c in shown]
    shown = shown.sort_values(
        ["comm_compute", *ties], kind="stable", key=lambda col: col if col.name == "comm_compute" else col.astype(str)
    )
    return shown[[c for c in cols if c in shown]].rename(
        columns={"sequential_ms": "sequential median ms", "interleaved_ms": "interleaved median ms"}
    )


def _other_keys(points: pd.DataFrame) -> list[str]:
    """The swept keys besides link, bucket size and wrapped hook that tell the points apart
    (``shard_buckets`` on the front door): without them two rows read alike."""
    shown = {"interconnect", "bucket_cap_mb", "comm_hook", "algorithm", "case_id", "label"}
    params = points.columns[: points.columns.get_loc("sequential_case")]
    return [k for k in params if k not in shown and points[k].astype(str).nunique() > 1]


def _crossover_figure(points: pd.DataFrame, est: crossover.Crossover | None, other: list[str]) -> go.Figure:
    fig = go.Figure()
    # One series per bucket size and wrapped hook (a symbol per hook), so compressed points show apart.
    points = points.assign(comm_hook=points["comm_hook"] if "comm_hook" in points else "allreduce")
    hooks = list(dict.fromkeys(points["comm_hook"]))
    keys = [k for k in ("bucket_cap_mb", *other, "comm_hook") if k in points]
    for values, grp in points.groupby(keys, sort=False):
        named = dict(zip(keys, values))
        name = " ".join(f"{k}={label_value(v)}" for k, v in named.items() if k != "comm_hook" or len(hooks) > 1)
        grp = grp.sort_values("comm_compute")
        fig.add_trace(
            ratio_trace(
                grp,
                "comm_compute",
                name,
                lo="ratio_lo",
                hi="ratio_hi",
                mode="markers",
                marker=dict(symbol=_SYMBOLS[hooks.index(named["comm_hook"]) % len(_SYMBOLS)], size=9),
                text=[
                    plot_text(
                        f"{link}, {hook}"
                        + "".join(f", {k}={label_value(v)}" for k, v in zip(other, rest))
                        + (f", all-reduce {b / 1e6:.3g} MB/step" if np.isfinite(b) else "")
                    )
                    for link, hook, b, *rest in zip(
                        grp["interconnect"], grp["comm_hook"], grp["allreduce_bytes_per_step"], *(grp[k] for k in other)
                    )
                ],
                hovertemplate="%{text}<br>comm:compute %{x:.2f}<br>interleaved/sequential %{y:.2f}<extra></extra>",
            )
        )
    xs = points["comm_compute"].dropna()
    lo_x, hi_x = float(xs.min()) / 1.3, float(xs.max()) * 1.3
    fig.add_hline(y=1.0, line_dash="dot", line_color="#5b6475")
    if est is not None:
        grid = np.geomspace(lo_x, hi_x, 50)
        fig.add_trace(go.Scatter(x=grid, y=est.ratio_at(grid), mode="lines", name="fit", line=dict(color="#5b6475")))
        if est.fit_placed:
            fig.add_vrect(x0=max(est.lo, lo_x), x1=min(est.hi, hi_x), fillcolor="#f0a202", opacity=0.15, line_width=0)
            fig.add_vline(
                x=est.x, line_color="#f0a202", annotation_text=f"crossover ≈ {est.x:.2g} [{est.lo:.2g}, {est.hi:.2g}]"
            )
    fig.update_xaxes(
        type="log", title="communication : computation (no-overlap reference)", range=[np.log10(lo_x), np.log10(hi_x)]
    )
    # A ratio on a log axis, as the fit is of its log; a single wide interval then leaves the other
    # points and the line readable.
    fig.update_yaxes(
        type="log",
        title="step time, interleaved / sequential (log scale)",
        **log_ratio_ticks([*points["ratio"], *points["ratio_lo"], *points["ratio_hi"]]),
    )
    fig.update_layout(height=430, margin=dict(l=10, r=10, t=30, b=10))
    return fig


_SYMBOLS = ("circle", "diamond", "square", "triangle-up", "x", "star")


def _whatif_section(page: Page, run: store.Loaded, fabrics: dict[str, replay.Fabric], suffix: str, anchor: str) -> None:
    # A run traced nothing (profiler_steps = 0): no section, rather than one saying there is nothing.
    if run.steps.empty or not any(
        (store.case_dir(run.run_dir, cid) / "marks.parquet").exists() for cid in run.record.cases
    ):
        return
    try:
        result = whatif_run.run_whatif(run, fabrics)
    except ValueError as e:
        page.heading(f"What-if: other fabrics{suffix}", anchor=f"whatif{anchor}")
        page.paragraph(f"No projection for this run: {e}.", css="warn")
        return
    if result.projections.empty:
        return
    labels = dict(zip(run.cases["case_id"], run.cases["label"]))
    page.heading(f"What-if: other fabrics (projections){suffix}", anchor=f"whatif{anchor}")
    page.paragraph(
        "PROJECTIONS, not measurements: each case's traced steps on this machine, replayed with every collective "
        "costed by a model of another fabric and the compute beside a collective slowed as the case's own traces "
        "show it slowed. Each projection has a 95% interval; a case the model cannot describe, or whose traced steps "
        f"it does not reproduce, is refused with the reason. Reference link: {result.reference}. Fabric parameters "
        "are nominal (achievable bandwidth is lower); extend or override them with a fabrics TOML file "
        "(tpbench whatif --fabrics FILE).",
        css="warn",
    )
    page.details_list("How a projection is made, bounded and refused", _method(result.reference))
    if len(result.validation):
        _validation(page, result, labels)
    proj = result.projections.assign(case=[labels.get(c, c) for c in result.projections["case_id"]])
    numbers = pd.Series(
        [
            whatif_run.ms_interval(v, lo, hi)
            for v, lo, hi in zip(proj["projected_ms"], proj["predicted_lo_ms"], proj["predicted_hi_ms"])
        ],
        index=proj.index,
    )
    marks, notes = _refusal_notes(proj["refused"], proj["case"])
    numbers = numbers.where(proj["refused"].isna(), marks)
    wide = proj.assign(projected=numbers).pivot(index="case", columns="fabric", values="projected")
    wide = wide.reindex(index=list(dict.fromkeys(proj["case"])), columns=list(dict.fromkeys(proj["fabric"])))
    wide.columns.name = None
    first = proj.groupby("case", sort=False).first()
    wide.insert(0, f"measured on {result.reference}", first["measured_ms"].map(lambda x: f"{x:.1f}"))
    wide.insert(1, "compute critical path", first["compute_ms"].map(lambda x: "" if pd.isna(x) else f"{x:.1f}"))
    wide.insert(2, "compute beside comm (×, 95% CI)", [whatif_run.interference_text(r) for _, r in first.iterrows()])
    wide.insert(
        3,
        "own traced steps replayed (median miss)",
        first["own_miss_pct"].map(lambda x: "" if pd.isna(x) else f"{x:+.1f}%"),
    )
    page.heading("Projected step time (ms) per fabric, with its 95% interval: projections, not measurements", level=3)
    refused = int(first["refused"].notna().sum())
    if refused:
        n = len(first)
        page.paragraph(
            f"{refused} of {n} case{'' if n == 1 else 's'} refused; each reason is listed under the table.", css="warn"
        )
    page.table(wide.reset_index())
    if notes:
        page.bullets(notes)
    answer = whatif_run.answer_lines(result.projections, labels)
    if answer:
        page.heading("Which setting each fabric would favour (projected)", level=3)
        page.paragraph(
            "The setting with the lowest projection on each fabric; it is decided only where every other "
            "setting's 95% interval lies above the top of its interval.",
            css="muted",
        )
        page.bullets(answer, css="verdicts")
    fab = pd.DataFrame(
        [
            {
                "fabric": f.name,
                "latency_us": f.alpha_s * 1e6,
                "bandwidth_GBps": f.beta_Bps / 1e9,
                # In words, as the rest of the page: a cell of Python's True/False reads as code.
                "shared medium": "yes" if f.shared else "no",
                "description": f.description,
            }
            for f in fabrics.values()
        ]
    )
    page.table(fab)


def _method(reference: str) -> list[str]:
    """The what-if's method, step by step, folded under the section's short warning: in one paragraph
    it would be a screen of text above the tables it explains."""
    return [
        "Replay: each case's traced timeline (compute, and when each collective is issued and waited for under "
        "its hook) with every collective costed by an α–β ring model of the fabric (t = hops·α + bytes·busbw "
        "factor / β), collectives one at a time.",
        "Interference: compute that runs while a collective is in flight is stretched by the case's interference "
        "factor, measured on its own traces (the same op's time beside a collective over its time alone; pooled "
        "over the run's cases on one backend, device and link where a case's own ops do not pin it to ±10% and "
        "the pool's do, or pin it closer; where neither pins it, \"unresolved\", the projection's interval holds "
        "its interval's ends; an "
        "estimate below 1 is replayed as 1, since nothing on a host speeds compute while a collective runs), so "
        "a faster fabric also gives compute its cores back.",
        "Calibration: the traced host is scaled (the factor nearest 1: compute, and on CPU ranks the host's own "
        f"communication with it) so the replay on the case's own measured link ({reference} is the reference) "
        "lands within its timed median's 95% interval, not above the median (and above 1 raising the replay by "
        "no more than the timed steps over the traced ones: the model's own miss is not put on the host). On a "
        "shaped link where communication is most of the step, which the timed step cannot pin it on, the factor "
        "is the forward passes' timed over traced instead, where below 1, or the training thread's CPU time timed "
        f"over traced where that is lower (down to ×{whatif.THREAD_FACTOR_FLOOR:.2f}: the tracer's cost on many "
        "small ops).",
        "Bounds: a projection is never below the case's compute critical path (its replay with free "
        "communication) and, on a fabric no slower than the measured link, never above the measured step.",
        f"Refusals: a case is refused, with the reason, when its traced steps replay more than "
        f"{whatif.REPLAY_RESIDUAL:.0%} away from themselves (each step's replay against its own span, the median "
        "over the steps), or when matching the timed steps would need a factor outside "
        f"×{whatif.COMPUTE_FACTOR[0]:.2f}–{whatif.COMPUTE_FACTOR[1]:.2f} (traced steps unrepresentative of timed "
        "ones; on such a shaped link, also when the forward passes' factor lies outside it, or the thread's below "
        "its floor).",
        "Intervals: each projection's 95% interval comes from what it rests on: its replays over the traced steps "
        "(a bootstrap of their median) and every compute factor that matches the timed median's 95% interval as "
        "well, widened by the model's own miss of the traced steps it was built from, and on CPU ranks holding "
        "the other reading of the timed steps (the tracer's cost on compute alone, or on a shaped link the wire's "
        "time kept) and, where the forward passes or the thread set the factor, the readings not taken, and the "
        "scatter the timed repeats' median has (in ms), which a run measuring the projection would carry too. "
        "What else it leaves out is not in it (the validation's coverage measures that). An interval's low end "
        "can lie below the compute critical path shown beside it: that path is at the calibrated factor, and the "
        "interval spans the factors the traced steps allow.",
    ]


def _validation(page: Page, result: whatif_validation.RunWhatIf, labels: dict[str, str]) -> None:
    """Predictions of the run's emulated-link cases from their twins, in both directions."""
    v = result.validation.assign(case=[labels.get(c, c) for c in result.validation["case_id"]])
    page.heading("Validation against emulated links", level=3)
    page.paragraph(
        "Each case predicted from its twin on another link (same parameters): a slower link from a faster twin, "
        "and a faster link from the twin on the slowest emulated link. Only the target link's description is "
        "used: a tcp-<rate> link's rate, and the reference link's bandwidth as its traced collectives reached "
        "it (as nccl-tests would report a real fabric's); never the target's step times. Measured: median of "
        "repeat medians with 95% bootstrap CI. Target's host ×: the target's timed forward passes over its twin's, "
        "shown beside and not used: each link's cases ran in a world of their own, and a host that ran slower "
        "there makes a miss that no model of the link could avoid.",
        css="muted",
    )
    page.bullets([whatif_run.error_line(e) for e in result.errors().to_dict("records")], css="verdicts")
    made = v[v["refused"].isna()]
    if len(made):
        page.figure(_validation_figure(made))
    sources = [f"predictions from {r} {labels.get(c, c)}" for r, c in zip(v["reference_link"], v["reference_case"])]
    marks, notes = _refusal_notes(v["refused"], sources)
    shown = v.assign(
        measured=[whatif_run.ms_interval(*r) for r in zip(v["measured_ms"], v["ci_lo_ms"], v["ci_hi_ms"])],
        predicted=pd.Series(
            [
                whatif_run.ms_interval(x, lo, hi)
                for x, lo, hi in zip(v["predicted_ms"], v["predicted_lo_ms"], v["predicted_hi_ms"])
            ],
            index=v.index,
        ).where(v["refused"].isna(), marks),
        error=v["error_pct"].map(lambda x: f"{x:+.1f}%").where(v["refused"].isna(), ""),
        host=v["host_ratio"].map(whatif_run.host_ratio_text),
    )
    page.table(
        shown[
            [
                "direction",
                "case",
                "reference_link",
                "interconnect",
                "measured",
                "predicted",
                "error",
                "host",
            ]
        ].rename(
            columns={
                "reference_link": "from",
                "interconnect": "link",
                "measured": "measured ms [95% CI]",
                "predicted": "predicted ms [95% interval]",
                "host": "target's host ×",
            }
        ),
        scroll=len(shown) > 12,
    )
    if notes:
        page.bullets(notes)


def _refusal_notes(reasons: pd.Series, names: pd.Series | list[str]) -> tuple[pd.Series, list[str]]:
    """Each refused row's cell, "refused (k)", and the notes listed under its table, "(k) name: reason",
    one per distinct name and reason. A reason is a sentence or three: in a column of the table it
    was squeezed into a narrow strip and clipped at the page's edge, beyond the fabrics' columns."""
    pairs = list(zip(names, reasons))
    number = {p: k for k, p in enumerate(dict.fromkeys(p for p in pairs if pd.notna(p[1])), 1)}
    marks = pd.Series([f"refused ({number[p]})" if p in number else None for p in pairs], index=reasons.index)
    return marks, [f"({k}) {name}: {reason}" for (name, reason), k in number.items()]


def _validation_figure(v: pd.DataFrame) -> go.Figure:
    """Each made prediction against its measured median, both with their intervals, one trace per
    direction and target link, beside the line where prediction equals measurement."""
    fig = go.Figure()
    for (direction, link), grp in v.groupby(["direction", "interconnect"], sort=False):
        fig.add_trace(
            go.Scatter(
                x=grp["measured_ms"],
                y=grp["predicted_ms"],
                mode="markers",
                name=plot_text(f"{link} ({'from faster' if direction == whatif_validation.SLOWER else 'from slower'})"),
                marker=dict(symbol="circle" if direction == whatif_validation.SLOWER else "diamond"),
                error_x=dict(
                    type="data",
                    array=grp["ci_hi_ms"] - grp["measured_ms"],
                    arrayminus=grp["measured_ms"] - grp["ci_lo_ms"],
                ),
                error_y=dict(
                    type="data",
                    array=grp["predicted_hi_ms"] - grp["predicted_ms"],
                    arrayminus=grp["predicted_ms"] - grp["predicted_lo_ms"],
                ),
                text=[plot_text(c) for c in grp["case"]],
                hovertemplate="%{text}<br>measured %{x:.1f} ms<br>predicted %{y:.1f} ms<extra></extra>",
            )
        )
    top = float(max(v["ci_hi_ms"].max(), v["predicted_hi_ms"].max())) * 1.05
    fig.add_trace(
        go.Scatter(
            x=[0, top], y=[0, top], mode="lines", name="predicted = measured", line=dict(dash="dot", color="#5b6475")
        )
    )
    # Both axes name their bars. The y values are predictions of a link the run measured, as the table
    # and the legend call them: "projected" is the word for a fabric no run measured.
    fig.update_xaxes(title="measured step time (ms), 95% CI", range=[0, top])
    fig.update_yaxes(title="predicted step time (ms), 95% interval", range=[0, top])
    fig.update_layout(height=420, margin=dict(l=10, r=10, t=30, b=10))
    return fig
