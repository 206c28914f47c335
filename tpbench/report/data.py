"""The report's view of one or several runs: one table of cases with labels, and the store's
derived tables, read only when a section asks for them.

Case parameters come from run.json (the suite's own values, e.g. ``start_localSGD_iter`` is
``"never"`` or an int), and the numbers from summary.parquet: parquet needs one type per column,
so the summary's copy of a mixed parameter may have been coerced.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import pandas as pd

from tpbench import store, verdict
from tpbench.algorithms import ALGORITHMS, display_name
from tpbench.analysis.stats import repeat_values, windows_of
from tpbench.environment import commit_text
from tpbench.interconnect import resolve
from tpbench.record import RunRecord
from tpbench.suite import DDP_DEFAULT, Case, labels, shown_keys

# Plot and table order: baselines first, then what is measured against them.

# Environment keys that make runs differ, in the order a run's tag names them.
_TAG_KEYS = ("gpu_model", "torch", "cuda", "nccl", "gpu_driver", "cpu_model", "hostname", "commit")


@dataclass
class ReportData:
    """Everything sections draw from. ``cases`` has one row per (run, case): parameters, status,
    error, summary numbers, plus ``run_id``, ``run`` (a short tag), ``algo`` (algorithm with a
    non-default impl), ``label`` and ``order`` (the position plots and tables use)."""

    runs: list[store.Loaded]
    tags: dict[str, str]
    cases: pd.DataFrame
    context_keys: list[str]
    # The per-step column comparisons are made on; ``cases``' per-repeat values are of it.
    metric: str = "step_ms"
    _tables: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)
    _steps: pd.DataFrame | None = field(default=None, repr=False)

    @property
    def what(self) -> str:
        """The compared quantity in words: "step time" or "CPU time per step"."""
        return verdict.METRIC_WORDS[self.metric]

    @property
    def multi(self) -> bool:
        return len(self.runs) > 1

    @property
    def done(self) -> pd.DataFrame:
        """Cases with step-time numbers."""
        return self.cases[self.cases["median_ms"].notna()]

    def run(self, run_id: str) -> store.Loaded:
        return next(r for r in self.runs if r.record.run_id == run_id)

    def steps(self) -> pd.DataFrame:
        """All runs' per-step rows with ``run_id``."""
        if self._steps is None:
            frames = [r.steps.assign(run_id=r.record.run_id) for r in self.runs if not r.steps.empty]
            self._steps = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        return self._steps

    def table(self, name: str) -> pd.DataFrame:
        """A derived per-case table (``overlap``, ``collectives``, ``nvml``) of every run, with
        ``run_id`` and ``case_id``; empty when no case has it. ``intervals`` are read per case
        with ``case_table`` instead: they are the one table that grows with trace size."""
        if name not in self._tables:
            frames = []
            for r in self.runs:
                t = store.read_case_tables(r, name)
                if not t.empty:
                    frames.append(t.assign(run_id=r.record.run_id))
            self._tables[name] = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        return self._tables[name]

    def case_table(self, run_id: str, case_id: str, name: str) -> pd.DataFrame | None:
        return store.read_case_table(self.run(run_id).run_dir, case_id, name)

    def representative(self, name: str | None = None) -> list[tuple[dict[str, Any], pd.DataFrame | None]]:
        """Per run and algorithm, the case with the median step time (the middle of the
        algorithm's range, neither its best nor its worst configuration); with ``name``, the
        case nearest that median which has the derived table ``name``, and the table. Tables are
        read one case at a time, nearest the median first."""
        picked = []
        for _, grp in self.cases.groupby(["run_id", "algo"], sort=False):
            rows = grp.sort_values("median_ms", na_position="last").to_dict("records")
            mid = (len(rows) - 1) // 2
            for i in sorted(range(len(rows)), key=lambda i: abs(i - mid)):
                table = self.case_table(rows[i]["run_id"], rows[i]["case_id"], name) if name else None
                if name is None or (table is not None and len(table)):
                    picked.append((rows[i], table))
                    break
        return picked

    def with_cases(self, df: pd.DataFrame, columns: list[str] | None = None) -> pd.DataFrame:
        """``df`` (keyed by run_id, case_id) joined with the cases' labels and parameters."""
        cols = ["run_id", "case_id", "run", "algo", "label", "order", *self.context_keys] + (columns or [])
        keep = list(dict.fromkeys(c for c in cols if c in self.cases))
        return df.merge(self.cases[keep], on=["run_id", "case_id"], how="inner")


def load(runs: list[store.Loaded], metric: str = "step_ms") -> ReportData:
    """The report's view of ``runs``; comparisons by ``metric`` (``verdict.METRIC_WORDS``): with ``cpu_ms``
    each case's per-repeat values (``repeat_medians_ms``, ``repeat_ids``) are its CPU times."""
    if metric not in verdict.METRIC_WORDS:
        raise ValueError(f"--metric {metric}: expected one of {', '.join(verdict.METRIC_WORDS)}")
    for run in runs:
        store.require_summary(run)  # a finished run's numbers are its summary's
    tags = run_tags(runs)
    frames = [_run_cases(r, tags[r.record.run_id], metric) for r in runs]
    # Each run's table has the step-time columns (``store.STEP_TIME_COLUMNS``), an interrupted run's too.
    cases = _concat_runs(frames, {k for r in runs for c in r.record.cases.values() for k in c.params})
    # Repeats as planned: an adaptive sweep's raised repeats must not split its cases into settings.
    run_cases = [[Case.from_params(r.record.planned_params(cid)) for cid in r.record.cases] for r in runs]
    # impl stays a context key (pairs of cases must agree on it); labels show it with the algorithm.
    context = [k for k in shown_keys(run_cases) if k != "algorithm"]
    if not cases.empty:
        cases["algo"] = [display_name(row) for row in cases.to_dict("records")]
        cases["label"] = _labels(cases, runs, run_cases)
        keys = _order_keys(cases, runs, context)
        cases = cases.iloc[sorted(range(len(cases)), key=keys.__getitem__)].reset_index(drop=True)
        cases["order"] = range(len(cases))
    return ReportData(runs, tags, cases, context, metric)


def _concat_runs(frames: list[pd.DataFrame], params: set[str]) -> pd.DataFrame:
    """The runs' cases as one table. A parameter that one run's cases lack (a key of another
    workload) is NaN there, which turns the other runs' integers into floats (``2.0`` in sentences
    for the suite's ``2``): such a column keeps each run's own values, None where a run has none, as
    ``store.cases_table`` keeps a collapsed key within a run."""
    if not frames:
        return pd.DataFrame()
    cases = pd.concat(frames, ignore_index=True)
    for col in params & set(cases.columns):
        if cases[col].dtype == float and any(col in f and f[col].dtype != float for f in frames):
            values = [v for f in frames for v in (f[col] if col in f else [None] * len(f))]
            cases[col] = pd.Series(values, dtype=object)
    return cases


def _run_cases(run: store.Loaded, tag: str, metric: str) -> pd.DataFrame:
    table = run.table.assign(run_id=run.record.run_id, run=tag)
    if metric == "step_ms" or table.empty:
        return table
    if metric not in run.steps:
        raise store.StoreError(f"{run.run_dir}: --metric {metric} was not recorded in this run's steps")
    windows = windows_of({cid: c.params for cid, c in run.record.cases.items()})
    per_repeat = repeat_values(run.steps, metric, windows).dropna(subset=[metric])
    by_case = {cid: g for cid, g in per_repeat.groupby("case_id")}
    values = [by_case.get(cid) for cid in table["case_id"]]
    return table.assign(
        repeat_medians_ms=[None if g is None else g[metric].tolist() for g in values],
        repeat_ids=[None if g is None else g["repeat"].astype(int).tolist() for g in values],
    )


def _labels(cases: pd.DataFrame, runs: list[store.Loaded], run_cases: list[list[Case]]) -> list[str]:
    """Each row's label (``suite.labels``, the one labelling every output uses)."""
    per_run = labels(run_cases)
    by_run = {r.record.run_id: names for r, names in zip(runs, per_run)}
    return [by_run[rid].get(cid, cid) for rid, cid in zip(cases["run_id"], cases["case_id"])]


def link_order(records: Sequence[RunRecord]) -> dict[str, int]:
    """Each link (``interconnect``) the runs' cases ran on → its place wherever the report lists links
    (its charts, tables and verdicts follow the cases' order, ``_order_keys``). One suite's order where one
    run lists every link in an order the other runs keep: its cases' expansion order, as the user wrote
    the list (fastest first in the shipped suites). By rate where runs list them otherwise, fastest
    first: links without a tbf rate (loopback, NCCL's) before the emulated ones, ties as first met.
    Sorted by name, tcp-2.5gbit fell between tcp-1gbit and tcp-500mbit."""
    per_run = [list(dict.fromkeys(_links(r))) for r in records]
    met = list(dict.fromkeys(link for links in per_run for link in links))
    full = next((links for links in per_run if len(links) == len(met)), None)
    if full is not None and all(_keeps_order(links, full) for links in per_run):
        return {link: i for i, link in enumerate(full)}
    rates = link_rates(records)
    ranked = sorted(met, key=lambda link: -rates[link] if rates.get(link) else -math.inf)
    return {link: i for i, link in enumerate(ranked)}


def _links(record: RunRecord) -> list[str]:
    return [c.params["interconnect"] for c in record.cases.values() if c.params.get("interconnect") is not None]


def _keeps_order(links: list[str], order: list[str]) -> bool:
    places = [order.index(link) for link in links]
    return places == sorted(places)


def link_rates(records: Sequence[RunRecord]) -> dict[str, float | None]:
    """Each link's tbf rate in bits/s (None: not shaped), resolved with its run's own profiles
    (``[interconnects]``), the first run that names it deciding: what orders the links of runs of
    several suites (``link_order``), and the ceiling the Collectives chart draws."""
    rates: dict[str, float | None] = {}
    for record in records:
        profiles = record.suite_table("interconnects")
        for link in _links(record):
            if link not in rates:
                try:
                    rates[link] = resolve(link, profiles).rate_bits_per_s
                except ValueError:
                    rates[link] = None  # a profile that no longer resolves: listed with the unshaped links
    return rates


def _order_keys(cases: pd.DataFrame, runs: list[store.Loaded], context: list[str]) -> list[tuple]:
    """Sort keys: run, algorithm (baselines first), then the varying parameters by value, links in
    ``link_order``'s order (by name, tcp-2.5gbit fell between tcp-1gbit and tcp-500mbit)."""
    run_pos = {r.record.run_id: i for i, r in enumerate(runs)}
    links = link_order([r.record for r in runs])

    def key(k: str, v: Any) -> tuple:
        # None first, numbers by value, anything else by its text: mixed columns ("never", 0, 60) sort.
        if v is None or (isinstance(v, float) and pd.isna(v)):
            return (0, 0.0, "")
        if k == "interconnect" and v in links:
            return (1, float(links[v]), "")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return (1, float(v), "")
        return (2, 0.0, json.dumps(v, default=str))

    algo_pos = {a: i for i, a in enumerate(ALGORITHMS)}
    return [
        (
            run_pos[row["run_id"]],
            algo_pos.get(row["algorithm"], len(algo_pos)),
            row["algo"],
            *(key(k, row.get(k)) for k in context),
        )
        for row in cases.to_dict("records")
    ]


def run_tags(runs: list[store.Loaded]) -> dict[str, str]:
    """A short name per run: the run id alone, or with several runs a letter and what differs
    between their environments ("A · torch 2.13.0", "B · torch 2.14.0"), so legends say why two
    runs differ rather than when they ran."""
    ids = [r.record.run_id for r in runs]
    if len(runs) == 1:
        return {ids[0]: ids[0]}
    envs = [_tag_env(r) for r in runs]
    differing = [k for k in _TAG_KEYS if len({json.dumps(e.get(k), default=str) for e in envs}) > 1]
    tags = {}
    for i, (rid, env) in enumerate(zip(ids, envs)):
        letter = chr(ord("A") + i) if i < 26 else str(i + 1)
        what = ", ".join(f"{k} {env.get(k)}" for k in differing[:2]) or rid
        tags[rid] = f"{letter} · {what}"
    return tags


def run_letter(tag: str) -> str:
    """The letter of a several-runs tag (``run_tags``): "A" of "A · torch 2.13.0", for a column too
    narrow for the whole tag."""
    return tag.split(" · ", 1)[0]


def _tag_env(run: store.Loaded) -> dict[str, Any]:
    return dict(run.environment) | {"commit": commit_text(run.environment)}


def context_text(row: dict[str, Any], keys: list[str]) -> str:
    """Shared parameters in words: "at 4 MB buckets on loopback, shard_buckets=True"."""
    parts = []
    for k in keys:
        v = row.get(k)
        if v is None or (isinstance(v, float) and pd.isna(v)):
            continue
        if k == "bucket_cap_mb" and v == DDP_DEFAULT:
            parts.append("at DDP's default buckets")
        elif k == "bucket_cap_mb":
            parts.append(f"at {v:g} MB buckets" if isinstance(v, (int, float)) else f"at {v} MB buckets")
        elif k == "interconnect":
            parts.append(f"on {v}")
        elif k == "world_size":
            parts.append(f"with {v} rank{'' if v == 1 else 's'}")
        else:
            parts.append(f"{k}={v}")
    return _join(parts)


def sentence_start(text: str) -> str:
    """``context_text`` opening a sentence: a phrase capitalised ("On loopback"), a key left as the
    suite spells it ("slowdown_pct=0.0", not "Slowdown_pct=0.0": a key is a name to type)."""
    return text[0].upper() + text[1:] if text and text.split()[0].isalpha() else text


def _join(parts: list[str]) -> str:
    """Phrases ("at …", "on …", "with …") read as a sentence; key=value pairs follow after a comma."""
    phrases = [p for p in parts if p.startswith(("at ", "on ", "with "))]
    pairs = [p for p in parts if p not in phrases]
    return " ".join(phrases) + (", " if phrases and pairs else "") + ", ".join(pairs)
