"""The "What ZeRO saves" section: optimizer state per rank against plain DDP, and how evenly ranks
share the step, from the exact per-rank figures (``tpbench.analysis.memory``)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from tpbench.algorithms import PACKED, ZERO_HOOKS
from tpbench.analysis.memory import per_case
from tpbench.report.data import ReportData, context_text, sentence_start
from tpbench.report.figures import LEGEND_TOP, MARGIN, display
from tpbench.report.html import Page

MIB = 2**20


def shown(data: ReportData) -> bool:
    """Whether the section appears: only beside a ZeRO case (one whose ranks partition the optimizer's
    parameters). A run of DDP and post-local SGD alone was headed "What ZeRO saves" over no ZeRO."""
    return not data.table("memory").empty and not data.table("partition").empty


def section(page: Page, data: ReportData) -> None:
    if not shown(data):
        return
    memory = data.table("memory")
    cases = data.with_cases(
        per_case(memory, data.table("partition")), ["algorithm", "bucket_cap_mb", "shard_buckets", "workload"]
    )
    cases = cases.sort_values("order", kind="stable")
    page.heading("What ZeRO saves", anchor="zero-saves")
    page.paragraph(
        "Counted from the tensors each rank holds after the timed steps (exact on CPU and GPU alike): "
        "optimizer state (e.g. AdamW's two moments and step per parameter), and the parameters each rank's "
        "optimizer steps. Plain DDP holds the whole optimizer state on every rank; ZeRO shards it, so each "
        "rank steps only its part. Imbalance is max / mean over ranks of the parameters stepped: 1 is even, "
        "the world size means one rank does the whole step while the others wait for its broadcast.",
        css="muted",
    )
    page.bullets(_sentences(cases, data.context_keys))
    page.figure(_state_figure(data, memory, cases))
    page.table(_table(data, cases), scroll=len(cases) > 20)
    partition = data.table("partition")
    if len(partition):
        page.details_list(
            "The partition: which rank steps which parameters of each case", _partition_lines(data, partition)
        )


def _mb(v: float) -> str:
    return f"{v / MIB:.3g} MiB"  # as bucket_cap_mb counts them; the MB/step columns are 1e6


def _sentences(cases: pd.DataFrame, context_keys: list[str]) -> list[str]:
    out = []
    # What ZeRO is tuned by is compared within one sentence; the rest (model, world) makes sentences.
    tuning = ("algorithm", "impl", "shard_buckets", "bucket_cap_mb", "bucket_cap_mb_list", PACKED)
    model_keys = [k for k in context_keys if k not in tuning]
    # Sentences in the cases' order (runs as given, links as ``data.link_order``): sorted by value,
    # they said crossover.toml's links as loopback, tcp-1gbit, tcp-2.5gbit, tcp-500mbit.
    for _, sharded in cases[cases["sharded"]].groupby(["run_id", *model_keys], sort=False, dropna=False):
        best = sharded.loc[sharded["state_max_bytes"].idxmin()]
        worst = sharded.loc[sharded["state_max_bytes"].idxmax()]
        where = _where(cases, best, model_keys)
        held = f"{_mb(best['state_max_bytes'])} ({best['state_saved_pct']:.0f} % saved)"
        # One ZeRO case (smoke.toml's) is no best and worst: it read the same figures twice.
        held += (
            f" ({best['label']})"
            if len(sharded) == 1
            else f" at best ({best['label']}) and {_mb(worst['state_max_bytes'])} "
            f"({worst['state_saved_pct']:.0f} % saved) at worst ({worst['label']})"
        )
        out.append(
            f"{where}Plain DDP holds {_mb(worst['ddp_state_bytes'])} of optimizer state on every rank. On its "
            f"fullest rank ZeRO holds {held}; an even split over {int(best['ranks'])} ranks would save "
            f"{100 * (1 - 1 / best['ranks']):.0f} %."
        )
    hooks = cases[cases["algorithm"].isin(ZERO_HOOKS)].dropna(subset=["bucket_cap_mb"])
    # Both hooks partition alike: one sentence per setting (bucket size, model, ...) of each run.
    keys = ["bucket_cap_mb", *model_keys]
    for _, grp in hooks.groupby(["run_id", *keys], sort=False, dropna=False):
        by_shard = {bool(s): g.iloc[0] for s, g in grp.groupby("shard_buckets")}
        parts = []
        for shard, row in sorted(by_shard.items()):
            how = "with shard_buckets" if shard else "without shard_buckets"
            if row["stepped_min"] == 0 and row["ranks"] > 1:
                idle = (
                    "one rank steps everything and the others nothing"
                    if row["buckets"] == 1
                    else f"the busiest rank steps {row['busiest_share_pct']:.0f} % and some rank none"
                )
                parts.append(f"{how} {idle} (imbalance {row['imbalance']:.2f})")
            else:
                parts.append(
                    f"{how} the busiest rank steps {row['busiest_share_pct']:.0f} % (imbalance {row['imbalance']:.2f})"
                )
        first = grp.iloc[0]
        nb = (
            ""
            if pd.isna(first["buckets"])
            else f"{int(first['buckets'])} bucket{'s' if first['buckets'] != 1 else ''}; "
        )
        sharded = by_shard.get(True)
        if sharded is not None and sharded["busiest_share_pct"] >= 90:
            parts.append("one tensor dominates the model, and a tensor is never split")
        out.append(f"{_where(cases, first, [])}ZeRO hooks {context_text(first, keys)}: {nb}" + "; ".join(parts) + ".")
    return out


def _where(cases: pd.DataFrame, row: pd.Series, keys: list[str]) -> str:
    """The run (when several) and the settings a sentence is about, as its opening words: "On loopback: "
    (``sentence_start``; it read "on loopback: Plain DDP holds …")."""
    run = f"{row['run']}: " if cases["run_id"].nunique() > 1 else ""
    settings = sentence_start(context_text(row, keys))
    return run + (f"{settings}: " if settings else "")


def _state_figure(data: ReportData, memory: pd.DataFrame, cases: pd.DataFrame) -> go.Figure:
    per_rank = data.with_cases(memory).merge(cases[["run_id", "case_id", "ddp_state_bytes"]], on=["run_id", "case_id"])
    per_rank = display(per_rank.sort_values(["order", "rank"], kind="stable"), ["label", "run"])
    per_rank["case"] = [f"{r} · {lab}" if data.multi else lab for r, lab in zip(per_rank["run"], per_rank["label"])]
    fig = go.Figure()
    for rank, grp in per_rank.groupby("rank"):
        fig.add_bar(x=grp["optimizer_state_bytes"] / MIB, y=grp["case"], orientation="h", name=f"rank {rank}")
    ddp = per_rank.drop_duplicates("case")
    fig.add_scatter(
        x=ddp["ddp_state_bytes"] / MIB,
        y=ddp["case"],
        mode="markers",
        name="plain DDP (every rank)",
        marker=dict(symbol="line-ns-open", size=18, line=dict(width=3), color="black"),
    )
    n = per_rank["case"].nunique()
    fig.update_layout(
        barmode="group",
        height=max(280, 22 * n * max(1, per_rank["rank"].nunique() // 2) + 140),
        margin=MARGIN,
        legend=LEGEND_TOP,
        xaxis_title="optimizer state per rank (MiB)",
    )
    fig.update_yaxes(autorange="reversed")
    return fig


def _partition_lines(data: ReportData, partition: pd.DataFrame) -> list[str]:
    """Per ZeRO case, each rank's runs: bucket, [first:stop) parameter indices within it, elements."""
    lines = []
    for _, grp in (
        data.with_cases(partition).sort_values(["order", "rank", "bucket"], kind="stable").groupby("order", sort=True)
    ):
        first = grp.iloc[0]
        ranks = []
        for rank, runs in grp.groupby("rank", sort=True):
            parts = [
                f"{int(r['tensors'])} tensors, {int(r['params']):,} elements"
                if pd.isna(r["bucket"])
                else f"bucket {int(r['bucket'])} [{int(r['first'])}:{int(r['first'] + r['tensors'])}] "
                f"{int(r['params']):,}"
                for r in runs.to_dict("records")
            ]
            ranks.append(f"rank {rank}: " + ", ".join(parts))
        prefix = f"{first['run']} · {first['label']}" if data.multi else first["label"]
        lines.append(f"{prefix}: " + "; ".join(ranks))
    return lines


def _table(data: ReportData, cases: pd.DataFrame) -> pd.DataFrame:
    df = pd.DataFrame(
        {
            "case": [f"{r} · {lab}" if data.multi else lab for r, lab in zip(cases["run"], cases["label"])],
            "optimizer state, fullest rank (MiB)": cases["state_max_bytes"] / MIB,
            "plain DDP, every rank (MiB)": cases["ddp_state_bytes"] / MIB,
            "saved (%)": cases["state_saved_pct"],
            "params stepped per rank (min–max)": [
                f"{int(a):,}–{int(b):,}" for a, b in zip(cases["stepped_min"], cases["stepped_max"])
            ],
            "imbalance (max/mean)": cases["imbalance"],
            "buckets": cases["buckets"],
            "parameters + gradients per rank (MiB)": (cases["param_bytes"] + cases["grad_bytes"]) / MIB,
        }
    )
    return df
