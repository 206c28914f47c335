"""A run's what-if, read from the store: the I/O around the pure model of ``tpbench.analysis.whatif``.

It reads each finished case's analysed tables (intervals, overlap, marks) and step rows, resolves
the run's interconnects to their rates, and reads the user's fabric files; ``tpbench whatif`` and
the report's what-if section call it. ``write`` is ``tpbench whatif``: the what-if computed and
stored beside the run, with the rows its tables print.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tpbench import store, user_files, verdict
from tpbench.algorithms import switches_to_local_sgd
from tpbench.analysis import interference, replay, whatif, whatif_validation
from tpbench.analysis.replay import Fabric
from tpbench.analysis.whatif_validation import RunWhatIf
from tpbench.interconnect import resolve, tbf_parameters
from tpbench.record import CaseRecord

# Why a case on a GPU is not projected (``case_models``; the whole run, where every case ran on one).
ON_GPU = (
    "the what-if replays CPU ranks: the training thread's work between the collectives it issues and waits for. "
    "On a GPU, compute is CUDA kernels queued ahead of the thread and autograd's device thread issues the "
    "collectives, which that model does not describe; GPU runs are not projected"
)
# Cases the replay cannot describe (``case_models``): a world of one rank (its collectives record bytes and move
# none: zero_no_overlap's broadcasts were projected as if they crossed a link), and post-local SGD once it
# switches (its subgroups and averaging steps).
ONE_RANK = "a world of one rank communicates nothing: there is no link to fit or to swap"
AFTER_SWITCH = (
    "post-local SGD after its switch: its gradients are all-reduced within each node's subgroup and every "
    "averaging_period-th step averages the model, where the replay prices each traced collective over the whole "
    "world and calibrates on steps of one kind; such cases are not projected"
)
# The same, where post_local_gradient_allreduce = false leaves the gradients local after the switch.
AFTER_SWITCH_NO_ALLREDUCE = AFTER_SWITCH.replace(
    "its gradients are all-reduced within each node's subgroup", "its gradients are not all-reduced at all"
)


BUILT_IN = "built-in fabrics"  # the built-in fabrics' ``Fabric.source``


def load_fabrics(extra: Iterable[str | Path] = ()) -> dict[str, Fabric]:
    """The built-in fabrics, then each user file's (a user file may redefine a built-in:
    ``replaced_fabrics`` says which it did)."""
    fabrics = replay.parse_fabrics(replay.FABRICS_TOML, BUILT_IN)
    for path in extra:
        fabrics |= replay.parse_fabrics(user_files.read_text(path, "fabrics file"), str(path))
    return fabrics


def replaced_fabrics(fabrics: Mapping[str, Fabric]) -> list[str]:
    """A line per built-in fabric a user's file redefined, naming the file and its numbers: the
    projections show no table of fabrics, so ``nvlink4``'s column would hold the file's numbers
    under the built-in's name with nothing to say so."""
    built_in = replay.parse_fabrics(replay.FABRICS_TOML, BUILT_IN)
    return [
        f"{name}: replaced by {f.source} (latency {f.alpha_s * 1e6:g} µs, {f.beta_Bps / 1e9:g} GB/s)"
        for name, f in fabrics.items()
        if name in built_in and f.source != BUILT_IN
    ]


def run_whatif(loaded: store.Loaded, fabrics: Mapping[str, Fabric], reference: str | None = None) -> RunWhatIf:
    """``whatif_validation.run_whatif`` on a run's finished cases (see there for what is modelled and validated)."""
    done = loaded.cases[loaded.cases["status"] == store.DONE]
    if done.empty:
        raise ValueError(f"{loaded.run_dir}: no finished case")
    if "profiler_steps" in done and not (done["profiler_steps"].fillna(0) > 0).any():
        # A tune is a run with tune.json; whether it is one is all this error needs, so the file is
        # not read: a damaged one is the report's and ``tune --resume``'s to refuse, not the what-if's.
        tune = (Path(loaded.run_dir) / store.TUNE_FILE).exists()
        what = "a tune traces nothing" if tune else "capture.profiler_steps = 0"
        raise ValueError(
            f"{loaded.run_dir}: no case was traced ({what}), and the what-if replays traced steps; sweep the "
            "settings to project with traces, e.g. `tpbench sweep SUITE --filter ... --set capture.profiler_steps=3`"
        )
    if (done["device"] != "cpu").all():
        raise ValueError(f"{loaded.run_dir}: its cases ran on {', '.join(sorted(set(done['device'])))}; {ON_GPU}")
    steps_by_case = dict(tuple(loaded.steps.groupby("case_id")))
    wires = link_wires(loaded, done)
    models = case_models(loaded, done, wires)
    return whatif_validation.run_whatif(done, steps_by_case, wires, models, fabrics, reference)


def link_wires(loaded: store.Loaded, done: pd.DataFrame) -> dict[str, Fabric | None]:
    """Each link of the finished cases as the what-if prices it: a shaped one by its tbf rate and
    bucket, as the run built them (``replay.emulated_link``, no floor); None for an unshaped one."""
    profiles = loaded.record.suite_table("interconnects")
    wires: dict[str, Fabric | None] = {}
    for link in dict.fromkeys(done["interconnect"]):
        rate = resolve(link, profiles).rate_bits_per_s
        wires[link] = replay.emulated_link(rate, None, link, tbf_parameters(rate)[0]) if rate else None
    return wires


# What a case's model reads of its analysed traces (``whatif.case_model``), in its order.
TABLES = ("intervals", "overlap", "marks")


def case_models(
    loaded: store.Loaded, done: pd.DataFrame, wires: Mapping[str, Fabric | None]
) -> Callable[[Mapping[str, Any]], whatif.CaseModel]:
    """Each finished case's model (``whatif.case_model``), from its tables in the store, its link's
    wire from ``wires`` (``link_wires``).

    Its interference is its own where its matched ops pin it, else the factor over all the run's
    matched ops on its backend, device and link (``interference.chosen_interference``): one machine's
    compute slowed by one kind of communication. The link is part of the key: a collective that
    waits on a slow shaped link keeps Gloo's threads asleep more than one on loopback. Each case's
    ops are matched once, here. On CPU ranks calibration scales the host's own communication too."""
    steps_by_case = dict(tuple(loaded.steps.groupby("case_id")))
    own: dict[str, interference.Interference] = {}
    pairs: dict[tuple[Any, ...], list[pd.DataFrame]] = {}
    for row in done.to_dict("records"):
        intervals = store.read_case_table(loaded.run_dir, row["case_id"], "intervals")
        if intervals is not None:
            mine = interference.interference_pairs(intervals)
            own[row["case_id"]] = interference.interference(mine)
            pairs.setdefault(_pool_key(row), []).append(mine)
    pooled = {key: interference.interference(pd.concat(p, ignore_index=True), "pooled") for key, p in pairs.items()}

    def model(row: Mapping[str, Any]) -> whatif.CaseModel:
        cid = row["case_id"]
        if row["device"] != "cpu":
            raise whatif.NotModelled(f"it ran on {row['device']}; {ON_GPU}")
        if row["world_size"] == 1:  # its broadcasts and all-reduces record bytes, but move none
            raise whatif.NotModelled(ONE_RANK)
        if switches_to_local_sgd(row):
            allreduce = row.get("post_local_gradient_allreduce")  # None in a record older than the key: true
            raise whatif.NotModelled(
                AFTER_SWITCH_NO_ALLREDUCE if allreduce is not None and not allreduce else AFTER_SWITCH
            )
        if lost := store.lost_tables(loaded.run_dir, cid, TABLES):
            raise whatif.NotModelled(f"case {cid}: {lost}")
        return whatif.case_model(
            cid,
            row,
            *(store.read_case_table(loaded.run_dir, cid, t) for t in TABLES),
            steps_by_case[cid],
            interference.chosen_interference(own[cid], pooled.get(_pool_key(row))) if cid in own else None,
            comm_on_host=True,
            wire=wires[row["interconnect"]],
            thread_speed=_thread_speed(loaded.record.cases.get(cid)),
        )

    return model


def _thread_speed(case: CaseRecord | None) -> float:
    """The kept trace window's training-thread speed, timed over traced (``record.TraceWindow``);
    NaN where not recorded (GPU ranks, older runs)."""
    window = case.capture.trace if case is not None else None
    if window is None or window.kept >= len(window.thread_speed) or window.thread_speed[window.kept] is None:
        return math.nan
    return float(window.thread_speed[window.kept])


def _pool_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return (row["backend"], row["device"], row["interconnect"])


PROJECTIONS_FILE, VALIDATION_FILE = "whatif.parquet", "whatif_validation.parquet"


# The titles and headers of ``tpbench whatif``'s two tables, in text and in Markdown alike.
PROJECTIONS_TITLE = (
    "PROJECTED step time (ms) [95% interval]: this machine's compute with each fabric's α–β communication"
)
VALIDATION_TITLE = "validation: emulated links predicted from their twins on other links"
VALIDATION_HEAD = (
    "direction",
    "case",
    "from",
    "link",
    "measured ms [95% CI]",
    "predicted ms [95% interval]",
    "error",
    "target's host ×",
)


@dataclass(frozen=True)
class Written:
    """A run's what-if as ``write`` stored it: the result, the case labels, the two tables' paths, and
    why they were not written (``unwritten``, the store's error naming the file; "" when they were)."""

    result: RunWhatIf
    labels: dict[str, str]  # case_id → label
    projections_path: Path
    validation_path: Path
    unwritten: str = ""

    def validation_rows(self) -> list[tuple[str, ...]]:
        """Per prediction of an emulated link: direction, case, from, link, measured ms [95% CI],
        predicted ms [95% interval] (or "refused"), the error and the target's host against the twin's
        (``whatif_validation.validate``'s host_ratio)."""
        rows = []
        for r in self.result.validation.to_dict("records"):
            made = pd.isna(r["refused"])
            rows.append(
                (
                    r["direction"],
                    self.labels[r["case_id"]],
                    r["reference_link"],
                    r["interconnect"],
                    ms_interval(r["measured_ms"], r["ci_lo_ms"], r["ci_hi_ms"]),
                    ms_interval(r["predicted_ms"], r["predicted_lo_ms"], r["predicted_hi_ms"]) if made else "refused",
                    f"{r['error_pct']:+.1f}%" if made else "",
                    host_ratio_text(r["host_ratio"]),
                )
            )
        return rows

    def refused_references(self) -> list[str]:
        """Per reference case whose predictions were refused: which link, which case, and why."""
        refused = self.result.validation.dropna(subset=["refused"]).drop_duplicates(["reference_case", "refused"])
        return [
            f"predictions from {r['reference_link']} {self.labels[r['reference_case']]}: {r['refused']}"
            for r in refused.to_dict("records")
        ]

    def fabrics(self) -> list[str]:
        """The fabrics projected onto, in the order of the projections."""
        return list(dict.fromkeys(self.result.projections["fabric"]))

    def projection_rows(self) -> list[tuple[str, ...]]:
        """Per case: its label ("(*)" when its model was refused), measured ms, the compute critical
        path, its interference factor [95% interval] and the projected ms [95% interval] on each of
        ``fabrics()``."""
        names = self.fabrics()
        rows = []
        for cid, grp in self.result.projections.groupby("case_id", sort=False):
            by = grp.set_index("fabric")
            refused = pd.notna(grp["refused"].iloc[0])
            rows.append(
                (
                    self.labels[cid] + (" (*)" if refused else ""),
                    f"{grp['measured_ms'].iloc[0]:.1f}",
                    "" if refused else f"{grp['compute_ms'].iloc[0]:.1f}",
                    interference_text(grp.iloc[0]),
                    *(
                        "refused"
                        if refused
                        else ms_interval(
                            by.at[n, "projected_ms"], by.at[n, "predicted_lo_ms"], by.at[n, "predicted_hi_ms"]
                        )
                        for n in names
                    ),
                )
            )
        return rows

    def projection_head(self) -> tuple[str, ...]:
        """The headers of ``projection_rows``' columns."""
        reference = f"measured ({self.result.reference})"
        return ("case", reference, "compute critical path", "compute beside comm", *self.fabrics())

    def refused_models(self) -> list[str]:
        """Per case whose model was refused: its label and why."""
        return [f"{self.labels[m.case_id]}: {m.refused}" for m in self.result.models if m.refused is not None]

    def ranking_lines(self) -> list[str]:
        """The answer the projections give: which setting ranks first on each fabric (and whether
        the intervals decide it), whether that changes across fabrics, and which settings cannot
        rank first on any of them."""
        return answer_lines(self.result.projections, self.labels)

    def to_markdown(self) -> str:
        """``tpbench whatif --format md``: what the text output says, as Markdown for a CI comment or
        a page: the validation (where the run has emulated links), the projections with their
        intervals, each refusal with its reason and the ranking per fabric."""
        lines: list[str] = []
        if len(self.result.validation):
            lines += [f"**{VALIDATION_TITLE}**", "", *_md_table(VALIDATION_HEAD, self.validation_rows()), ""]
            lines += [f"- refused {line}" for line in self.refused_references()]
            lines += [f"- {error_line(e)}" for e in self.result.errors().to_dict("records")]
            lines += [""] if lines[-1] else []
        lines += [f"**{PROJECTIONS_TITLE}**", "", *_md_table(self.projection_head(), self.projection_rows()), ""]
        lines += [f"- (*) refused {line}" for line in self.refused_models()]
        lines += [f"- projection: {line}" for line in self.ranking_lines()]
        return "\n".join(lines).rstrip("\n") + "\n"

    def to_json(self) -> dict[str, Any]:
        """``tpbench whatif --format json``: the projections with their intervals and refusals, the
        validation, its error summary and the ranking per fabric."""
        p = self.result.projections
        rank = whatif.ranking(p)

        def records(df: pd.DataFrame) -> list[dict[str, Any]]:
            return json.loads(df.to_json(orient="records", double_precision=15))  # NaN and NA as null

        return {
            "run_dir": str(self.projections_path.parent),
            "reference": self.result.reference,
            "projections": records(p.assign(label=p["case_id"].map(self.labels))),
            "validation": records(self.result.validation),
            "errors": records(self.result.errors()),
            "ranking_agreement": records(whatif_validation.ranking_agreement(self.result.validation)),
            "ranking": records(rank),
            "cannot_win": whatif.cannot_win(p),
            "answer": self.ranking_lines(),
        }


def answer_lines(projections: pd.DataFrame, labels: Mapping[str, str]) -> list[str]:
    """``Written.ranking_lines`` for any projections table (the report has no ``Written``)."""
    rank = whatif.ranking(projections)
    if rank.empty:
        return []
    made = projections[projections["refused"].isna()].groupby("fabric")["case_id"].nunique()
    # The cases the what-if had (a run's finished ones), refused or not: a run that finished one case
    # has no others, refused or otherwise, and nothing was ranked.
    cases = projections.groupby("fabric")["case_id"].nunique()
    # A projection made without an interval (its case timed once) leaves its fabric's ranking undecided.
    untimed = (
        projections[projections["refused"].isna()].groupby("fabric")["predicted_hi_ms"].apply(lambda x: x.isna().any())
    )
    lines = []
    for r in rank.to_dict("records"):
        ms = ms_interval(r["projected_ms"], r["predicted_lo_ms"], r["predicted_hi_ms"])
        first = f"{labels.get(r['first'], r['first'])}, {ms} ms"
        if cases[r["fabric"]] == 1:
            lines.append(f"on {r['fabric']}: {first}, the run's only finished setting (nothing to rank it against)")
        elif made[r["fabric"]] == 1:
            lines.append(f"on {r['fabric']}: {first}, the only setting projected (the others were refused)")
        elif r["decided"]:
            lines.append(
                f"on {r['fabric']}: {first} would be fastest; every other setting's interval lies above this one's"
            )
        elif untimed[r["fabric"]]:
            lines.append(f"on {r['fabric']}: {first} ranks first, undecided: a setting timed once has no interval")
        else:
            names = [labels.get(c, c) for c in r["tied_with"]]
            others = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            whose = "the interval of {} reaches" if len(names) == 1 else "the intervals of {} reach"
            lines.append(f"on {r['fabric']}: {first} ranks first, undecided: {whose.format(others)} below its top")
    firsts = list(dict.fromkeys(rank["first"]))
    # One setting projected on each fabric ranks nothing; one fabric (--fabric NAME) has no "across".
    across = (made[rank["fabric"]] > 1).any() and len(rank) > 1
    if across and len(firsts) == 1:
        # Ranked first on each, but decided only where the per-fabric lines said so: on a busy run,
        # undecided everywhere, the line alone read as a firm result.
        decided = int(rank["decided"].sum())
        said = "" if decided == len(rank) else f", decided on {decided or 'none'} of them"
        lines.append(f"the same setting ranks first on every fabric projected ({len(rank)}){said}")
    elif across:
        where = "; ".join(f"{', '.join(rank.loc[rank['first'] == c, 'fabric'])}: {labels.get(c, c)}" for c in firsts)
        lines.append(f"the ranking changes across fabrics ({where})")
    if across and (alike := _fabrics_alike(projections)):
        lines.append(alike)
    beaten = whatif.cannot_win(projections)
    if beaten:
        lines.append("cannot rank first on any projected fabric: " + ", ".join(labels.get(c, c) for c in beaten))
    return lines


# A setting whose projections on every fabric lie within this share of each other: the fabric moves little.
FABRICS_ALIKE = 0.02


def _fabrics_alike(projections: pd.DataFrame) -> str | None:
    """Said where every setting projects within ``FABRICS_ALIKE`` across the fabrics: its communication
    is then a small part of its step on each, and which fabric it runs on hardly matters. On zero.toml
    the four built-in fabrics project each setting within 0.5 ms, and a ranking per fabric alone
    reads as though the fabric chose between the settings, where their compute does."""
    made = projections[projections["refused"].isna()].groupby("case_id")["projected_ms"]
    low, high = made.min(), made.max()
    share = ((high - low) / low).max()
    if not share < FABRICS_ALIKE:
        return None
    return (
        f"every setting projects within {100 * share:.1f}% across these fabrics ({(high - low).max():.2f} ms at most): "
        "its communication is a small part of its step on each, so the fabric hardly moves it; its compute decides"
    )


def _md_table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """A Markdown table's lines; a "|" in a cell (a label may hold one) is escaped so that it stays one cell."""

    def row(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return [row(head), "|" + "---|" * len(head), *map(row, rows)]


def error_line(e: Mapping[str, Any]) -> str:
    """One direction's validation (a row of ``whatif_validation.error_summary``), as the terminal and the report
    say it: the errors, the intervals' coverage, and how well the ranking was kept."""
    tau = e["min_kendall_tau"]
    ranked = f"lowest Kendall τ of a link's ranking {tau:.2f}, " if math.isfinite(tau) else ""
    if e["decided_pairs"]:
        decided = e["decided_pairs"]
        ranked += f"{e['kept_pairs']} of the {decided} pairs the measurement orders (disjoint intervals) kept, "
    covered = e["inside_interval_pct"]
    inside = (
        f"{covered:.0f}% of measured medians inside their predicted interval, "
        if math.isfinite(covered)
        else "no predicted interval (a reference timed once), "
    )
    return (
        f"{e['direction']}: mean |error| {e['mean_abs_error_pct']:.1f}%, worst {e['worst_abs_error_pct']:.1f}%, "
        f"{inside}{ranked}"
        f"over {e['predicted']} predictions" + (f" ({e['refused']} refused)" if e["refused"] else "")
    )


def interference_text(row: Mapping[str, Any]) -> str:
    """A projections row's interference, as the terminal and the report show it: "×1.10 [1.00, 1.22]
    pooled" (pooled: the run's cases on its backend, device and link; case: its own ops). An
    estimate printed below 1 says so, "replayed as ×1" (``Interference.replay_factor``): a reader who
    sees ×0.85 beside a projection should not take it that compute was sped up there. One that prints
    as ×1.00 (0.998) does not: "×1.00 …, replayed as ×1" read as if the 1.00 shown had been replaced,
    and the replay's 0.2 % is below what the text shows. One that neither the case's ops nor the pool
    pin says "unresolved" (``Interference.resolved``) beside a projection: its interval's ends are in
    the projection's."""
    if not row["interference_ops"]:
        return "not measured"
    factor, lo, hi = row["interference"], row["interference_lo"], row["interference_hi"]
    shown = f"{factor:.2f}"
    text = f"×{shown} [{lo:.2f}, {hi:.2f}] {row['interference_source']}"
    if float(shown) < 1:
        text += ", replayed as ×1"
    resolved = interference.Interference(factor, lo, hi, int(row["interference_ops"])).resolved
    if not resolved and pd.isna(row.get("refused")):  # a refused case has no interval to hold it
        text += ", unresolved"
    return text


def host_ratio_text(ratio: float) -> str:
    """A validation row's ``host_ratio`` (the target world's forward passes against its twin's), as
    the terminal and the report show it: "×1.05", or nothing where a run has no forward passes."""
    return f"×{ratio:.2f}" if math.isfinite(ratio) else ""


def ms_interval(ms: float, lo: float, hi: float) -> str:
    """A step time with its interval, as the terminal and the report print them: CPU steps of a few
    to a few hundred ms, to a tenth of one each, so that a column's numbers line up ("19.0", not "19");
    "no interval" where there is none (one repeat)."""
    if math.isnan(lo) or math.isnan(hi):
        return f"{ms:.1f} [{verdict.NO_INTERVAL}]"
    return f"{ms:.1f} [{lo:.1f}, {hi:.1f}]"


def write(run_dir: str | Path, fabrics: Mapping[str, Fabric], reference: str | None = None) -> Written:
    """``run_whatif`` on the run in ``run_dir``, its projections and validation written beside it
    (whatif.parquet, whatif_validation.parquet). ``ValueError`` when the run cannot be modelled.
    A run that cannot be written (a read-only disk, as an archive is) is still projected, the reason
    in ``Written.unwritten``: the tables are a copy of the answer, and the run is read where it is."""
    loaded = store.load(run_dir)
    result = run_whatif(loaded, fabrics, reference)
    projections, validation = loaded.run_dir / PROJECTIONS_FILE, loaded.run_dir / VALIDATION_FILE
    labels = dict(zip(loaded.cases["case_id"], loaded.cases["label"]))
    try:
        store.atomic_write_parquets({projections: result.projections, validation: result.validation})
    except store.StoreError as e:
        return Written(result, labels, projections, validation, unwritten=str(e))
    return Written(result, labels, projections, validation)
