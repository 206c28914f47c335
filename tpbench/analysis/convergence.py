"""Convergence: how fast and how far the loss goes, per case.

Post-local SGD trades communication for convergence, so its step time alone says nothing. These
functions turn the per-step records (training loss every step, held-out loss every ``eval_every``
steps) into curves and a few numbers: final held-out loss, its gap to the workload's known optimum,
and the steps and training time needed to reach a target.

Training time is the cumulative slowest-rank step time, not wall time: held-out evaluation and
drift measurement happen outside the timed step and must not count against an algorithm.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# A case "reaches the target" when its held-out loss is within this fraction of the optimum.
TARGET_RELATIVE_GAP = 0.05
# Two final held-out losses closer than this (nats) end level: the repeats of one setting scatter by about
# as much, and no one would choose between settings on a smaller difference.
LEVEL_NATS = 0.005


def nats_apart(delta: float) -> str:
    """A gap between two held-out losses in nats, in three decimals, or four where three would round it
    to the level band or below (0.0055 as "0.005"): a gap said beyond the band must not read as on it,
    beside a "level (within 0.005 nats)" of another setting."""
    gap = abs(delta)
    return f"{gap:.3f}" if round(gap, 3) > LEVEL_NATS else f"{gap:.4f}"


def ends_against(delta: float, other: str) -> str:
    """Where a final held-out loss ends against ``other``'s, ``delta`` (nats) above it: "level" within
    ``LEVEL_NATS``, on the band included, else how far above or below (``nats_apart``). One wording for
    the report's post-local SGD lines and ``tpbench compare``'s pairs, whose loss gaps they judge alike."""
    if abs(delta) <= LEVEL_NATS:
        return f"ends level with {other} (held-out loss within {LEVEL_NATS:g} nats)"
    return f"ends {nats_apart(delta)} nats {'above' if delta > 0 else 'below'} {other}'s held-out loss"


def curves(steps: pd.DataFrame) -> pd.DataFrame:
    """Per (case_id, repeat, step): mean training loss and mean held-out loss over ranks, and the
    cumulative training time in seconds (slowest rank per step). Warm-up steps are included:
    convergence starts at the first step, timed or not."""
    per_step = steps.groupby(["case_id", "repeat", "step"], as_index=False).agg(
        loss=("loss", "mean"),
        step_ms=("step_ms", "max"),
        **({"heldout_loss": ("heldout_loss", "mean")} if "heldout_loss" in steps else {}),
        **({"drift_max_l2": ("drift_max_l2", "max")} if "drift_max_l2" in steps else {}),
    )
    per_step = per_step.sort_values(["case_id", "repeat", "step"])
    per_step["train_time_s"] = per_step.groupby(["case_id", "repeat"])["step_ms"].cumsum() / 1e3
    return per_step


def target_loss(optimal_loss: float | None) -> float | None:
    return None if optimal_loss is None or not np.isfinite(optimal_loss) else optimal_loss * (1 + TARGET_RELATIVE_GAP)


def summarize(steps: pd.DataFrame) -> pd.DataFrame:
    """One row per case with held-out evaluations: final held-out loss (median over repeats), its
    gap to the optimum, and the median steps / training seconds to reach the target (NaN when a
    repeat never does, so a case that misses the target never looks fast)."""
    if steps.empty or "heldout_loss" not in steps:
        return pd.DataFrame(columns=["case_id"])
    optimal = _optima(steps)
    evals = curves(steps).dropna(subset=["heldout_loss"])
    rows = []
    for case_id, grp in evals.groupby("case_id"):
        opt = optimal.get(case_id)
        target = target_loss(opt)
        finals, reach_steps, reach_times = [], [], []
        for _, rep in grp.groupby("repeat"):
            rep = rep.sort_values("step")
            finals.append(rep["heldout_loss"].iloc[-1])
            if target is not None:
                at_step, at_s = _reach(rep, target)
                reach_steps.append(at_step)
                reach_times.append(at_s)
        final = float(np.median(finals))
        rows.append(
            {
                "case_id": case_id,
                "final_heldout_loss": final,
                "optimal_loss": opt,
                "target_loss": target,
                "gap_to_optimum": final - opt if opt is not None else np.nan,
                # A median of values containing NaN is NaN: one repeat that misses makes the case miss.
                "steps_to_target": float(np.median(reach_steps)) if reach_steps else np.nan,
                "time_to_target_s": float(np.median(reach_times)) if reach_times else np.nan,
            }
        )
    return pd.DataFrame(rows)


def reach_by_repeat(steps: pd.DataFrame) -> dict[int, float]:
    """One case's steps: per repeat, the training seconds until its held-out loss first reaches the
    workload's target (NaN: never; empty without a held-out loss or a known optimum). Each repeat's
    own value, so that two settings' times to the target pair by round as their step times do."""
    if steps.empty or "heldout_loss" not in steps:
        return {}
    steps = steps.assign(case_id=0)
    target = target_loss(next(iter(_optima(steps).values()), None))
    if target is None:
        return {}
    evals = curves(steps).dropna(subset=["heldout_loss"])
    return {int(r): _reach(rep.sort_values("step"), target)[1] for r, rep in evals.groupby("repeat")}


def _optima(steps: pd.DataFrame) -> dict[object, float | None]:
    """Each case's known optimal loss (None: the workload knows none)."""
    if "optimal_loss" not in steps:
        return {}
    first = steps.groupby("case_id")["optimal_loss"].first()
    return {k: None if pd.isna(v) else float(v) for k, v in first.items()}


def _reach(rep: pd.DataFrame, target: float) -> tuple[float, float]:
    """One repeat's evaluations in step order: the steps and training seconds until its held-out
    loss first reaches ``target`` (NaN, NaN: never)."""
    hit = rep[rep["heldout_loss"] <= target]
    return (float(hit["step"].iloc[0] + 1), float(hit["train_time_s"].iloc[0])) if len(hit) else (np.nan, np.nan)
