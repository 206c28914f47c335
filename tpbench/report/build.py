"""The report page: verdicts first, then the sections that answer "why", each present only when
the runs have the data for it, then the raw material (every case, failures, traces)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pandas as pd

from tpbench import compare, store, verdict
from tpbench.environment import commit_text
from tpbench.report import (
    comm_hooks,
    convergence,
    interconnect,
    performance,
    recommendation,
    telemetry,
    timelines,
    verdicts,
    waterfall,
    zero_memory,
)
from tpbench.report.data import ReportData, load
from tpbench.report.html import Page, esc, plain_templates

ENVIRONMENT_KEYS = (
    "torch",
    "cuda",
    "nccl",
    "gpu_model",
    "gpu_count",
    "gpu_driver",
    "cpu_model",
    "cpu_count",
    "hostname",
    "platform",
    "python",
    "tpbench",
)


def default_report_path(run_dirs: list[Path], reports_root: Path = Path("reports")) -> Path:
    """Where a report goes unless told: one run's at ``<suite>-<run_id>.html``, where its sweep wrote
    it; several runs' named after the first and the others ("-vs-<run_id>", or their count and a
    digest of their ids where there are more than two runs), so that comparing runs never replaces
    the first run's own report, which its sweep wrote."""
    first, *rest = [store.read_record(d) for d in run_dirs]
    name = f"{first.suite.name}-{first.run_id}"
    if len(rest) == 1:
        name += f"-vs-{rest[0].run_id}"
    elif rest:
        digest = hashlib.sha1(" ".join(r.run_id for r in rest).encode()).hexdigest()[:8]
        name += f"-vs-{len(rest)}-runs-{digest}"
    return Path(reports_root) / f"{name}.html"


def write_report(run_dirs: list[Path], out: Path, metric: str = "step_ms") -> Path:
    """Load the runs, build their report and write it atomically to ``out``."""
    runs = [store.load(d) for d in run_dirs]
    out = Path(out)
    store.write_output(out, build_report(runs, out.parent.resolve(), metric).encode())
    return out


def build_report(runs: list[store.Loaded], out_dir: Path = Path("."), metric: str = "step_ms") -> str:
    """The whole HTML page for one run, or several runs compared side by side. ``out_dir`` is
    where the page will live: links to traces are relative to it. ``metric``: what the verdicts
    compare (``verdict.METRIC_WORDS``); the charts always show step time."""
    with plain_templates():
        return _page(load(runs, metric), runs, out_dir).render()


def _page(data: ReportData, runs: list[store.Loaded], out_dir: Path) -> Page:
    names = list(dict.fromkeys(r.record.suite.name for r in runs))
    page = Page(title=f"tpbench report: {', '.join(names)}")
    page.heading(f"tpbench: {', '.join(names)}", level=1)
    for r in runs:
        _run_line(page, data, r)

    recommendation.section(page, runs)  # a tune's answer comes before everything else
    kinds = [*verdicts.ZERO_KINDS, *verdicts.impl_kinds(data)]
    comparisons = {k.key: verdicts.compare(data, k) for k in kinds}
    conv = verdicts.convergence_verdicts(data)
    sides = verdicts.run_data(data)
    cross = verdicts.against_first_run(sides)
    _headlines(page, data, comparisons, conv, cross)
    _environment(page, data)
    performance.step_time(page, data)
    waterfall.section(page, data, sides, cross)
    telemetry.machine_load(page, data)
    performance.heatmaps(page, data, comparisons)
    interconnect.sections(page, data.runs)
    comm_hooks.section(page, data, comparisons[verdicts.ZERO_KINDS[0].key])
    convergence.section(page, data, conv)
    timelines.overlap(page, data)
    timelines.gantt(page, data)
    timelines.bandwidth(page, data)
    telemetry.nvml(page, data)
    zero_memory.section(page, data)
    telemetry.memory(page, data)
    stated = [c for cs in comparisons.values() for c in cs] + verdicts.compare(data, verdicts.LOCALSGD_KIND)
    performance.comparisons_table(page, data, stated)
    _across_runs_table(page, data, cross)
    _failures(page, data)
    _cases_table(page, data)
    _traces(page, data, out_dir)
    return page


def _run_line(page: Page, data: ReportData, run: store.Loaded) -> None:
    record = run.record
    statuses = pd.Series([c.status for c in record.cases.values()]).value_counts().to_dict()
    counts = ", ".join(f"{n} {s}" for s, n in statuses.items())
    desc = record.suite.description or record.suite_table("suite").get("description", "")
    tag = f"{data.tags[record.run_id]}: " if data.multi else ""
    page.paragraph(
        f"{tag}run {record.run_id} of suite {record.suite.name} ({record.status or '?'}; "
        f"{len(record.cases)} case{'' if len(record.cases) == 1 else 's'}: {counts}). {desc}",
        css="muted",
    )


def _no_overlap_baselines(data: ReportData) -> str:
    """The zero_no_overlap baselines the folded comparisons are against: packed broadcasts only where
    a run has them (crossover, compression and most suites of one's own sweep only the default)."""
    done = data.done
    packed = verdicts.PACKED in done and bool(done[verdicts.PACKED].astype(object).eq(True).any())
    return "zero_no_overlap (unpacked and packed)" if packed else verdicts.UNPACKED_WORD


def _headlines(
    page: Page,
    data: ReportData,
    comparisons: dict[str, list[verdicts.Comparison]],
    conv: list[verdicts.ConvergenceVerdict],
    cross: list[compare.Comparison],
) -> None:
    """The recommendation per setting, the headline comparison (interleaved against sequential,
    PyTorch's hooks against ours, local SGD against DDP, runs against runs) in the open; the
    comparisons against zero_no_overlap folded below them, one click away."""
    secondary = {k.key for k in verdicts.ZERO_KINDS[1:]}
    lines, more = verdicts.fastest_lines(data), []
    for key, kind_comps in comparisons.items():
        by_run: dict[str, list[verdicts.Comparison]] = {}
        for c in kind_comps:
            by_run.setdefault(c.run_id, []).append(c)
        for run_id, cs in by_run.items():
            (more if key in secondary else lines).extend(
                verdicts.group_sentences(cs, prefix=f"[{data.tags[run_id]}] " if data.multi else "")
            )
    attrs = verdicts.attributions(comparisons)
    lines += verdicts.attribution_lines(attrs, lambda run_id: f"[{data.tags[run_id]}] " if data.multi else "")
    keys = data.context_keys  # each post-local SGD line names its own varying settings (_localsgd_who)
    lines += [
        (f"[{data.tags[v.comparison.run_id]}] " if data.multi else "") + verdicts.convergence_sentence(v, keys)
        for v in conv
    ]
    lines += verdicts.soonest_lines(data)
    lines += verdicts.step_time_only_sentences(data, conv, keys, tags=data.tags if data.multi else None)
    lines += verdicts.across_runs_lines(data, cross)
    if not lines and not more:
        return
    page.heading("Verdicts", anchor="verdicts")
    page.bullets(lines, css="verdicts")
    if attrs:
        page.heading("Where the hooks' lead over per-parameter broadcasts comes from", level=3, anchor="attribution")
        page.table(verdicts.attribution_table(attrs, data.tags if data.multi else None))
    if more:
        page.details_list(f"{len(more)} more: each ZeRO hook against {_no_overlap_baselines(data)}", more)
    notes = (
        f"Verdicts compare {data.what} ({data.metric}). "
        "Intervals: 95% t interval over rounds, paired by round for cases of one world (each round's ratio "
        "measured side by side), unpaired (Welch) for cases of different worlds; a direction (slower, faster) is "
        "named only when its interval excludes no change, and judged against the "
        f"±{verdict.THRESHOLD:.0%} threshold in the words tpbench compare uses for the same interval; "
        '"this run resolves ±x%" is the interval\'s half-width, the smallest difference it could have told from '
        "none."
    )
    notes += _median_interval_note(data)
    if any(comparisons.get(k.key) for k in verdicts.ZERO_KINDS):
        notes += " " + "; ".join(f"{short} = {name}" for name, short in verdicts.SHORT.items()) + "."
    page.paragraph(notes, css="muted")


def _median_interval_note(data: ReportData) -> str:
    """What the bracket beside a case's step time in the Verdicts (Fastest, the only case there) is:
    its median's interval, not the 95 % t interval over rounds the note gives the ratios; with 2 to 5
    repeats the repeats' range, which the README tour's 3 hold the median with 75 % confidence, as the
    step-time caption says. A tune's run points to its Recommendation instead, and ``--metric cpu_ms``
    gives a geometric mean, no bracket."""
    done = data.done[data.done["run_id"].isin([r.record.run_id for r in data.runs if r.tune is None])]
    if data.metric != "step_ms" or done.empty:
        return ""
    said = (
        " A case's own step time in these lines (the fastest, or a setting's only case) carries its median's "
        "95% bootstrap CI over repeats, as the Step time section's error bars do."
    )
    if note := verdict.few_repeats_note(verdict.repeat_counts(done)):
        said += " " + note
    return said


def _environment(page: Page, data: ReportData) -> None:
    page.heading("Environment", anchor="environment")
    cols = {}
    for r in data.runs:
        env = r.environment
        # What this machine has not (no CUDA, no GPU on a CPU build) is "none", not Python's None.
        values = [env.get(k) for k in ENVIRONMENT_KEYS]
        cols[data.tags[r.record.run_id]] = ["none" if v is None else v for v in values] + [commit_text(env)]
    table = pd.DataFrame(cols, index=[*ENVIRONMENT_KEYS, "git commit"]).reset_index(names="")
    if data.multi:
        values = table.drop(columns="").astype(str)
        table.insert(1, "differs", ["yes" if values.loc[i].nunique() > 1 else "" for i in table.index])
    page.table(table)
    transport = _transport(data)
    if not transport.empty:
        page.paragraph(
            "Transport observed per interconnect (the sockets or NCCL transports the ranks actually used):", css="muted"
        )
        page.table(transport)
    for r in data.runs:
        eff = r.record.efficiency
        if eff is not None and (eff.wall_s or eff.processes_by_hand):
            share = eff.timed_share
            timed = f"{eff.timed_s:.1f} s in timed steps" + (f" ({share:.0%})" if share is not None else "")
            worlds = f"{eff.worlds_started} world(s)" if eff.worlds_started else ""
            said = ", ".join(t for t in (eff.worlds_text(), timed, worlds, eff.started_text()) if t)
            page.paragraph((f"{data.tags[r.record.run_id]}: " if data.multi else "") + f"{said}.", css="muted")
    for r in data.runs:
        page.details(
            f"Suite file of {data.tags[r.record.run_id]} ({r.record.suite.path or 'unknown path'})",
            r.record.suite.text,
        )


def _transport(data: ReportData) -> pd.DataFrame:
    rows = {}
    for r in data.runs:
        for case in r.record.cases.values():
            t = case.capture.observed_transport
            if t is None:
                continue
            key = (data.tags[r.record.run_id], t.asked, t.backend)
            rows[key] = {
                **({"run": key[0]} if data.multi else {}),
                "interconnect": t.asked,
                "backend": t.backend,
                "observed": ", ".join(map(str, t.interfaces)),
                "expected": ", ".join(map(str, t.expected or [])),
                "mismatch": "yes" if t.mismatch else "",
                "note": t.reason or "",
            }
    return pd.DataFrame(list(rows.values()))


def _across_runs_table(page: Page, data: ReportData, cross: list[compare.Comparison]) -> None:
    if not cross:
        return
    page.heading("Across runs", anchor="across-runs")
    page.paragraph(
        f"The same case (same identity: parameters less budget keys such as repeats) in each run "
        f"against the first run, judged as `tpbench compare FIRST RUN` judges it: ratio of median step "
        f"times with its {cross[0].confidence:.0%} bootstrap interval over repeats, threshold "
        f'±{cross[0].threshold:.0%}; "resolves": the interval\'s half-width. The note says where the runs timed '
        "other steps (steps, warmup_steps).",
        css="muted",
    )
    if note := verdict.few_repeats_ratio_note(n for c in cross for n in c.bootstrap_repeats()):
        page.paragraph(note, css="muted")
    rows = [
        {
            "run": verdicts.run_tag(data, c.candidate_runs[0]),
            "against": verdicts.run_tag(data, c.baseline_runs[0]),
            "case": verdicts.case_label(data, c, r.case_id),
            "ratio": r.ratio,
            f"{c.confidence:.0%} CI": f"[{r.ci_lo:.3g}, {r.ci_hi:.3g}]" if r.ci_lo is not None else "",
            "resolves": f"±{r.half_width:.1%}" if r.half_width is not None else "",
            "verdict": r.verdict,
            "note": r.reason,
        }
        for c in cross
        for r in c.cases
    ]
    page.table(pd.DataFrame(rows), scroll=len(rows) > 20)
    for c in cross:  # the table has a row per case of the later run: the first run's others are named here
        if c.not_in_candidate:
            run, first = (verdicts.run_tag(data, side[0]) for side in (c.candidate_runs, c.baseline_runs))
            page.paragraph(
                f"Not in run {run} (cases of run {first} it did not run, not judged): {', '.join(c.not_in_candidate)}.",
                css="muted",
            )


def _failures(page: Page, data: ReportData) -> None:
    failed = data.cases[data.cases["status"] == store.FAILED] if "status" in data.cases else data.cases.iloc[:0]
    if failed.empty:
        return
    page.heading(f"Failed cases ({len(failed)})", anchor="failed")
    table = failed[["run", "label", "case_id", "error"]] if data.multi else failed[["label", "case_id", "error"]]
    page.table(table.rename(columns={"label": "case", "error": "cause"}))
    for row in failed.to_dict("records"):
        if row.get("detail"):
            page.details(f"{row['label']} ({row['case_id']}): logs", str(row["detail"])[-6000:])


def _cases_table(page: Page, data: ReportData) -> None:
    if data.cases.empty:
        return
    page.heading("All cases", anchor="cases")
    cols = [
        "run",
        "label",
        "case_id",
        "status",
        "median_ms",
        "ci_lo_ms",
        "ci_hi_ms",
        "p10_ms",
        "p90_ms",
        "samples_per_s",
        "timed_steps",
        "overlap_pct",
        "exposed_comm_ms",
        "allreduce_bytes_per_step",
        "comm_bytes_per_step",
        "max_peak_rss_mb",
        "max_peak_allocated_mb",
        "final_heldout_loss",
        "time_to_target_s",
    ]
    if not data.multi:
        cols.remove("run")
    table = data.cases[[c for c in cols if c in data.cases]]
    if "overlap_pct" in table:
        page.paragraph(
            "overlap_pct is over Holistic Trace Analysis' window (every traced step but the last, as HTA counts it, "
            "averaged over ranks) and exposed_comm_ms is the median traced step's: the Overlap section's figures "
            "are over every traced step, their times means, so the two may differ by a step's worth.",
            css="muted",
        )
    if any(c.endswith("_mb") for c in table):
        page.paragraph("The *_mb columns are in MiB (2^20 bytes), as the Memory chart's axis says.", css="muted")
    page.table(table.rename(columns={"label": "case"}), scroll=len(table) > 25)


def _traces(page: Page, data: ReportData, out_dir: Path) -> None:
    items = []
    for row in data.cases.to_dict("records"):
        files = store.traces(data.run(row["run_id"]).run_dir, row["case_id"])
        if files:
            links = ", ".join(page.link(Path(os.path.relpath(f.resolve(), out_dir)).as_posix(), f.name) for f in files)
            name = f"{row['run']} · {row['label']}" if data.multi else row["label"]
            items.append(f"{esc(name)} ({esc(row['case_id'])}): {links}")
    if items:
        page.heading("Raw traces", anchor="traces")
        page.paragraph(
            "torch.profiler Chrome traces, one per rank, linked relative to this file: open one in "
            "Perfetto's trace viewer (\"Open trace file\") or Chrome's tracing page, or load a case's folder "
            "with Holistic Trace Analysis.",
            css="muted",
        )
        page.raw_list(items)
