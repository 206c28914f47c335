"""Sections of the report, each present only when the run has the data for it."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from tpbench import store
from tpbench.report.html import Page, esc

# Parameters worth showing in tables when they vary.
_SHOW = ["algorithm", "impl", "bucket_cap_mb", "shard_buckets", "interconnect", "world_size", "backend",
         "start_localSGD_iter", "averaging_period", "post_local_gradient_allreduce", "workload"]


def default_report_path(run_dir: Path, reports_root: Path = Path("reports")) -> Path:
    meta = store.read_run_json(run_dir)
    return reports_root / f"{meta['suite']['name']}-{meta['run_id']}.html"


def _varying(df: pd.DataFrame) -> list[str]:
    return [c for c in _SHOW if c in df and df[c].astype(str).nunique() > 1]


def _label(df: pd.DataFrame, keys: list[str]) -> pd.Series:
    keys = keys or ["algorithm"]
    return df[keys].astype(str).apply(lambda r: " · ".join(f"{k}={v}" if k != "algorithm" else v for k, v in r.items()), axis=1)


def _combined(runs: list[store.Loaded]) -> pd.DataFrame:
    frames = []
    for run in runs:
        s = run.summary if not run.summary.empty else run.cases
        frames.append(s.assign(run_id=run.meta["run_id"]))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _environment(page: Page, runs: list[store.Loaded]) -> None:
    page.heading("Environment", anchor="environment")
    keys = ["torch", "cuda", "nccl", "gpu_model", "gpu_count", "gpu_driver", "cpu_model", "cpu_count", "hostname", "python", "tpbench"]
    table = pd.DataFrame({r.meta["run_id"]: [r.environment.get(k) for k in keys] + [(r.environment.get("git") or {}).get("commit")] for r in runs},
                         index=keys + ["git commit"]).reset_index(names="")
    page.table(table)
    for r in runs:
        eff = r.meta.get("efficiency")
        if eff and eff.get("wall_s"):
            share = eff.get("timed_share")
            page.paragraph(
                f"Run {r.meta['run_id']}: {eff['wall_s']:.1f} s wall, {eff['timed_s']:.1f} s in timed steps"
                + (f" ({share:.0%})" if share is not None else "")
                + f", {eff['worlds_started']} world(s), {eff['processes_started']} rank processes started.",
                css="muted",
            )


def _headlines(page: Page, df: pd.DataFrame) -> None:
    ok = df.dropna(subset=["median_ms"]) if "median_ms" in df else pd.DataFrame()
    if ok.empty:
        return
    items = []
    for key, grp in ok.groupby(["run_id", "interconnect", "world_size"], dropna=False):
        best = grp.loc[grp["median_ms"].idxmin()]
        worst = grp.loc[grp["median_ms"].idxmax()]
        where = f"{key[1]}, {key[2]} ranks" + (f", run {key[0]}" if ok["run_id"].nunique() > 1 else "")
        line = f"Fastest on {where}: {best['label']} at {best['median_ms']:.2f} ms/step [{best['ci_lo_ms']:.2f}, {best['ci_hi_ms']:.2f}]"
        if len(grp) > 1:
            line += f"; slowest: {worst['label']} at {worst['median_ms']:.2f} ms ({worst['median_ms'] / best['median_ms']:.2f}×)."
        items.append(line)
    page.heading("Headlines", anchor="headlines")
    page.bullets(items, css="verdicts")


def _step_time(page: Page, df: pd.DataFrame) -> None:
    ok = df.dropna(subset=["median_ms"]) if "median_ms" in df else pd.DataFrame()
    if ok.empty:
        return
    page.heading("Step time per case", anchor="step-time")
    page.paragraph("Median of the slowest rank's step time over timed steps; error bars: 95% bootstrap CI over repeats.", css="muted")
    ok = ok.assign(err_plus=ok["ci_hi_ms"] - ok["median_ms"], err_minus=ok["median_ms"] - ok["ci_lo_ms"])
    if "bucket_cap_mb" in ok and ok["bucket_cap_mb"].nunique() > 1:
        facet_col = "interconnect" if ok["interconnect"].nunique() > 1 else None
        series = ok.assign(series=_label(ok, [k for k in _varying(ok) if k not in ("bucket_cap_mb", "interconnect")]))
        fig = px.line(series.sort_values("bucket_cap_mb"), x="bucket_cap_mb", y="median_ms", color="series",
                      error_y="err_plus", error_y_minus="err_minus", facet_col=facet_col, markers=True, log_x=True,
                      labels={"bucket_cap_mb": "bucket_cap_mb (MB)", "median_ms": "step time (ms)"})
    else:
        fig = px.bar(ok, x="median_ms", y="label", color="algorithm", orientation="h",
                     error_x="err_plus", error_x_minus="err_minus", labels={"median_ms": "step time (ms)", "label": ""})
    fig.update_layout(height=max(350, 28 * len(ok) if "bucket_cap_mb" not in _varying(ok) else 420), margin=dict(l=10, r=10, t=30, b=10))
    page.figure(fig)


def _summary_table(page: Page, df: pd.DataFrame) -> None:
    page.heading("All cases", anchor="cases")
    cols = ["run_id", "case_id", "label", "status", "median_ms", "ci_lo_ms", "ci_hi_ms", "p10_ms", "p90_ms",
            "samples_per_s", "max_peak_rss_mb", "max_peak_allocated_mb"]
    if df["run_id"].nunique() == 1:
        cols.remove("run_id")
    page.table(df[[c for c in cols if c in df]])


def _failures(page: Page, df: pd.DataFrame) -> None:
    failed = df[df["status"] == store.FAILED] if "status" in df else pd.DataFrame()
    if failed.empty:
        return
    page.heading(f"Failed cases ({len(failed)})", anchor="failed")
    for row in failed.to_dict("records"):
        page.paragraph(f"{row['label']} ({row['case_id']}): {row.get('error')}", css="failed")
        if row.get("detail"):
            page.preformatted(str(row["detail"])[-4000:])


def _traces(page: Page, runs: list[store.Loaded], out_dir: Path) -> None:
    items = []
    for run in runs:
        for cid in run.cases["case_id"]:
            files = store.traces(run.run_dir, cid)
            if files:
                links = ", ".join(page.link(os.path.relpath(f, out_dir), f.name) for f in files)
                items.append(f"{esc(cid)}: {links}")
    if items:
        page.heading("Raw traces", anchor="traces")
        page.paragraph("Chrome-trace files, one per rank: open them in Perfetto (ui.perfetto.dev) or load the folder with Holistic Trace Analysis.", css="muted")
        page.raw_list(items)


def build_report(runs: list[store.Loaded], out_dir: Path = Path(".")) -> str:
    """The whole HTML page for one run, or several runs compared side by side."""
    df = _combined(runs)
    details = {}
    for run in runs:
        for cid, entry in run.meta["cases"].items():
            details[(run.meta["run_id"], cid)] = entry.get("detail")
    if not df.empty:
        df["label"] = _label(df, _varying(df))
        df["detail"] = [details.get((r, c)) for r, c in zip(df["run_id"], df["case_id"])]
    names = sorted({r.meta["suite"]["name"] for r in runs})
    page = Page(title=f"tpbench report: {', '.join(names)}")
    page.heading(f"tpbench: {', '.join(names)}", level=1)
    for r in runs:
        desc = r.meta["suite"].get("description") or _description(r)
        page.paragraph(f"Run {r.meta['run_id']} ({r.meta.get('status', '?')}), {len(r.meta['cases'])} cases. {desc}", css="muted")
    _headlines(page, df)
    _environment(page, runs)
    _step_time(page, df)
    if not df.empty:
        _summary_table(page, df)
        _failures(page, df)
    _traces(page, runs, out_dir)
    return page.render()


def _description(run: store.Loaded) -> str:
    import tomllib

    try:
        return tomllib.loads(run.meta["suite"]["text"]).get("suite", {}).get("description", "")
    except tomllib.TOMLDecodeError:
        return ""


def write_report(run_dirs: list[Path], out: Path) -> Path:
    runs = [store.load(d) for d in run_dirs]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    store.atomic_write_bytes(out, build_report(runs, out.parent.resolve()).encode())
    return out
