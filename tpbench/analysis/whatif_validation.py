"""A run's what-if: its reference-link cases projected, and the model checked against their twins.

``run_whatif`` models every case on the run's reference link (``whatif.case_model``, through the
caller's ``model``) and projects it onto the given fabrics (``whatif.project``). Where the run also
has emulated links, the same settings on another link are the model's test: each is predicted from
its twin on another link, in both directions (``validate``), knowing nothing of the target but its
link's description, and the predictions are scored (``error_summary``, ``ranking_agreement``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import kendalltau

from tpbench.analysis.replay import Fabric
from tpbench.analysis.skeletons import NotModelled
from tpbench.analysis.stats import bootstrap_ci, repeat_values
from tpbench.analysis.whatif import CaseModel, forward_times, project, refused_model

VALIDATION_COLUMNS = (
    "direction",
    "reference_case",
    "reference_link",
    "case_id",
    "interconnect",
    "measured_ms",
    "ci_lo_ms",
    "ci_hi_ms",
    "predicted_ms",
    "predicted_lo_ms",
    "predicted_hi_ms",
    "error_pct",
    "host_ratio",
    "refused",
)
SLOWER = "slower link from a faster twin"
FASTER = "faster link from a slower twin"


@dataclass(frozen=True)
class Target:
    """A case to predict: its id and link, the fabric that describes the link, its step rows, and
    why that description cannot be trusted (None when it can)."""

    case_id: str
    interconnect: str
    fabric: Fabric
    step_rows: pd.DataFrame
    refused: str | None = None


class UnknownReference(ValueError):
    """``--reference`` names a link on which the run finished no case: a bad option (exit 2)."""


def validate(reference: CaseModel, targets: Iterable[Target], direction: str) -> pd.DataFrame:
    """Predict cases measured on other links from a reference case: the reference's skeletons and
    compute factor replayed on each target's fabric; nothing of the target but its link's
    description is used. ``error_pct`` = 100 · (predicted − measured) / measured, measured being
    the median of repeat medians; predicted_lo_ms/predicted_hi_ms the prediction's 95 % interval
    (``CaseModel.step_interval_ms``). A refused reference or link description refuses the prediction
    (``refused`` says why; the numbers are NaN).

    ``host_ratio``, beside it and not used by it: the target's timed forward pass over the
    reference's (``forward_times``; NaN where either has none). Each link's cases run in a world of
    their own, and on a small shared machine one world's host may run the same ops 10–20 % slower
    or faster than another's, which no model of the link can know: a miss with a ratio far from 1
    is at least partly the machine's."""
    rows = []
    for t in targets:
        reps = repeat_values(t.step_rows)["step_ms"].to_numpy()
        lo, hi = bootstrap_ci(reps)
        refused = reference.refused or t.refused
        pred = float("nan") if refused else reference.step_ms(t.fabric)
        pred_lo, pred_hi = (float("nan"),) * 2 if refused else reference.step_interval_ms(t.fabric)
        meas = float(np.median(reps))
        rows.append(
            {
                "direction": direction,
                "reference_case": reference.case_id,
                "reference_link": reference.params.get("interconnect"),
                "case_id": t.case_id,
                "interconnect": t.interconnect,
                "measured_ms": meas,
                "ci_lo_ms": lo,
                "ci_hi_ms": hi,
                "predicted_ms": pred,
                "predicted_lo_ms": pred_lo,
                "predicted_hi_ms": pred_hi,
                "error_pct": 100 * (pred - meas) / meas,
                "host_ratio": forward_times(t.step_rows, None)[0] / reference.forward_ms,
                "refused": refused,
            }
        )
    return pd.DataFrame(rows, columns=list(VALIDATION_COLUMNS))


def ranking_agreement(validation: pd.DataFrame) -> pd.DataFrame:
    """Per direction and target link: whether the predictions rank that link's cases (the same
    settings but the link: the algorithms of suites/whatif.toml) as their measured medians do.
    ``kendall_tau``: Kendall's τ-b of predicted against measured, over the predictions made
    (1: the same order; NaN below 2 predictions, or where every prediction or measurement ties).
    τ counts every pair, also pairs whose measured medians differ by less than their own noise,
    whose order a second run need not repeat; ``decided_pairs`` are the pairs whose measured 95 %
    intervals are disjoint, ``kept_pairs`` those of them the predictions put in the same order."""
    rows = []
    for (direction, link), g in validation.groupby(["direction", "interconnect"], sort=False):
        made = g[g["refused"].isna()].to_dict("records")
        tau = math.nan
        if len(made) >= 2:
            tau = float(kendalltau([r["predicted_ms"] for r in made], [r["measured_ms"] for r in made]).statistic)
        decided = [
            (a, b) if a["measured_ms"] < b["measured_ms"] else (b, a)
            for i, a in enumerate(made)
            for b in made[i + 1 :]
            if a["ci_hi_ms"] < b["ci_lo_ms"] or b["ci_hi_ms"] < a["ci_lo_ms"]
        ]
        kept = sum(fast["predicted_ms"] < slow["predicted_ms"] for fast, slow in decided)
        rows.append(
            {
                "direction": direction,
                "interconnect": link,
                "cases": len(made),
                "kendall_tau": tau,
                "decided_pairs": len(decided),
                "kept_pairs": kept,
            }
        )
    return pd.DataFrame(
        rows, columns=["direction", "interconnect", "cases", "kendall_tau", "decided_pairs", "kept_pairs"]
    )


def error_summary(validation: pd.DataFrame) -> pd.DataFrame:
    """Per direction: predictions made, refused, the mean and worst absolute error (%) of those
    made, the share (%) of them whose measured median lies inside the predicted interval (of those
    with one), the
    lowest Kendall τ of any target link's ranking, and the pairs the measurement decides and the
    predictions keep, over all links (``ranking_agreement``)."""
    rows = []
    taus = ranking_agreement(validation)
    for direction, g in validation.groupby("direction", sort=False):
        made = g[g["refused"].isna()]
        err = made["error_pct"].abs()
        # Over the predictions with an interval: one from a reference timed once has none.
        ranged = made[made["predicted_lo_ms"].notna()]
        inside = ranged["measured_ms"].between(ranged["predicted_lo_ms"], ranged["predicted_hi_ms"])
        mine = taus[taus["direction"] == direction]
        tau = mine["kendall_tau"].dropna()
        rows.append(
            {
                "direction": direction,
                "predicted": len(err),
                "refused": int(g["refused"].notna().sum()),
                "mean_abs_error_pct": float(err.mean()) if len(err) else float("nan"),
                "worst_abs_error_pct": float(err.max()) if len(err) else float("nan"),
                "inside_interval_pct": 100 * float(inside.mean()) if len(inside) else float("nan"),
                "min_kendall_tau": float(tau.min()) if len(tau) else float("nan"),
                "decided_pairs": int(mine["decided_pairs"].sum()),
                "kept_pairs": int(mine["kept_pairs"].sum()),
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "direction",
            "predicted",
            "refused",
            "mean_abs_error_pct",
            "worst_abs_error_pct",
            "inside_interval_pct",
            "min_kendall_tau",
            "decided_pairs",
            "kept_pairs",
        ],
    )


# Parameters that say which cases are "the same case on another link".
_NOT_LINK = ("case_id", "interconnect", "label", "status", "error", "detail")


def _same_but_link(cases: pd.DataFrame) -> list[pd.DataFrame]:
    """Cases grouped by every parameter but the link (missing values are a value too)."""
    keys = [c for c in cases.columns if c not in _NOT_LINK]
    label = cases[keys].astype(object).apply(lambda r: repr(tuple(r)), axis=1)
    return [g for _, g in cases.groupby(label, sort=False)]


@dataclass(frozen=True)
class RunWhatIf:
    """A run's what-if: projections of its reference-link cases onto fabrics, and the model's
    validation against its emulated-link cases in both directions (empty when the run has none)."""

    reference: str
    projections: pd.DataFrame
    validation: pd.DataFrame
    models: list[CaseModel]

    def errors(self) -> pd.DataFrame:
        return error_summary(self.validation)


def run_whatif(
    cases: pd.DataFrame,
    steps_by_case: Mapping[str, pd.DataFrame],
    wires: Mapping[str, Fabric | None],
    model: Callable[[Mapping[str, Any]], CaseModel],
    fabrics: Mapping[str, Fabric],
    reference: str | None = None,
) -> RunWhatIf:
    """Model every case on the reference link (default: loopback if the run has it, else its
    first interconnect) and project those onto ``fabrics``. Then validate the model on the run's
    emulated links, in both directions, among cases with the same parameters but the link:

    - slower from faster: each ``tcp-<rate>`` case slower than the reference link, predicted from
      its reference twin (the target link: a shared medium at its rate, behind the twin's own
      fitted path as floor);
    - faster from slower: each case on a faster link than the slowest emulated one (the reference
      link included), predicted from its twin on that slowest link. The target link is described
      as a user would describe a real fabric, never by its step times: a ``tcp-<rate>`` by its
      rate with the reference twin's path as floor, the reference link by that path (the busbw
      its traced collectives reached, as nccl-tests would report it for a real fabric).

    ``cases``: the run's finished cases, one row each; ``steps_by_case``: their step rows;
    ``wires``: each link's shaped wire (``emulated_link`` without floor; None: unshaped);
    ``model``: a case row's calibrated model (see ``case_model``), asked for at most once per
    case: the caller reads its tables.
    """
    if cases.empty:
        raise ValueError("no finished case")
    links = list(dict.fromkeys(cases["interconnect"]))
    if reference is None:  # only absent: an empty --reference is a link the run does not have, refused below
        reference = "loopback" if "loopback" in links else links[0]
    if reference not in links:
        raise UnknownReference(f"--reference {reference!r}: no case finished on it; expected one of {', '.join(links)}")
    rate = {link: math.inf if wires[link] is None else wires[link].beta_Bps for link in links}
    slowest = min((link for link in links if rate[link] < math.inf), key=rate.__getitem__, default=None)
    cache: dict[str, CaseModel] = {}

    def model_of(row: Mapping[str, Any]) -> CaseModel:
        cid = row["case_id"]
        if cid not in cache:
            try:
                cache[cid] = model(row)
            except NotModelled as e:
                cache[cid] = refused_model(cid, row, steps_by_case[cid], str(e))
        return cache[cid]

    def target(row: Mapping[str, Any], host: Fabric | None, refused: str | None = None) -> Target:
        link = row["interconnect"]
        wire = wires[link]
        fabric = host if wire is None else dataclasses.replace(wire, floor=host)
        return Target(row["case_id"], link, fabric, steps_by_case[row["case_id"]], refused)

    models, rows = [], []
    for group in _same_but_link(cases):
        by_link = {r["interconnect"]: r for r in group.to_dict("records")}
        ref_model = model_of(by_link[reference]) if reference in by_link else None
        if ref_model is not None:
            models.append(ref_model)
            slower = [link for link in by_link if rate[link] < rate[reference]]
            if slower:
                rows.append(
                    validate(ref_model, [target(by_link[link], ref_model.host_path) for link in slower], SLOWER)
                )
        # This host's own path, the floor under faster emulated links: only an unshaped link shows it,
        # and only a twin whose fit is trusted describes it (a refused fit is refused for its path).
        host = ref_model.host_path if ref_model is not None and rate[reference] == math.inf else None
        why = None
        if host is not None and ref_model.refused:
            why = f"the link's description comes from the {reference} twin, itself refused: {ref_model.refused}"
        if slowest in by_link:
            faster = [
                link
                for link in by_link
                if rate[slowest] < rate[link] and (rate[link] < math.inf or (link == reference and host is not None))
            ]
            if faster:
                targets = [target(by_link[link], host, why) for link in faster]
                rows.append(validate(model_of(by_link[slowest]), targets, FASTER))
    validation = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=list(VALIDATION_COLUMNS))
    return RunWhatIf(reference, project(models, fabrics), validation, models)
