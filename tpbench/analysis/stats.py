"""Step-time statistics: the per-repeat value, intervals for one case and for ratios of two.

A repeat is the independent unit: steps within one repeat share a warm-up, a bucket rebuild and
whatever the machine was doing at the time, so they are correlated and a CI over steps would be
far too narrow. Each repeat is reduced to one value (``repeat_values``) and intervals are over
those values.

A ratio of two cases (or of one case in two runs) is stated as ``Ratio``, always with its
half-width: the smallest change the data could have told from no change. Two kinds:

- ``paired_ratio``: the two sides ran in the same rounds (the cases of one world, round by round;
  the two sides of a lockstep gate, item by item), so round i of one and round i of the other
  were measured next to each other. Each round gives one log ratio, in which whatever the machine
  was doing then cancels, and the interval is Student's t over the rounds.
- ``unpaired_ratio``: no such pairing (cases of different worlds, stored runs). Welch's t interval
  of the difference of mean log values.

Both work on logs because step times are positive and their noise multiplies; the estimate is a
ratio of geometric means. t quantiles come from scipy.stats: the intervals of a gate with few
rounds depend on the tails of t, which is not something to integrate by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pandas as pd

BOOTSTRAP_SAMPLES = 4000
CONFIDENCE = 0.95
# Post-local SGD's algorithm name (algorithms.LOCALSGD; not imported: analysis/ stays torch-free
# and below the declarations).
_LOCALSGD = "post_localSGD_hook"


def per_step(steps: pd.DataFrame, metric: str = "step_ms") -> pd.DataFrame:
    """Timed steps only, one row per (case_id, repeat, step) with its value of ``metric``: ``step_ms``
    the slowest rank's (a step lasts as long as it does), any other metric (``cpu_ms``, memory) the
    mean over ranks."""
    timed = steps[steps["phase"] == "timed"]
    how = "max" if metric == "step_ms" else "mean"
    return timed.groupby(["case_id", "repeat", "step"], as_index=False, sort=True)[metric].agg(how)


def slowest_rank(steps: pd.DataFrame) -> pd.DataFrame:
    """Timed steps only, one row per (case_id, repeat, step): a step lasts as long as its slowest rank."""
    return per_step(steps, "step_ms")


def averaging_window(params: Mapping[str, Any]) -> int:
    """How many consecutive steps make one unit of a case's work: 1, except post-local SGD after its
    switch, where one step in ``averaging_period`` also averages the model and costs more."""
    if params.get("algorithm") != _LOCALSGD or params.get("start_localSGD_iter") in (None, "never"):
        return 1
    return int(params.get("averaging_period") or 1)


def metric_columns(steps: pd.DataFrame) -> list[str]:
    """The per-step columns ``repeat_values`` can compare (``--metric``): the numeric ones but the
    row's own coordinates. What a run records depends on its device and workload (GPU memory,
    held-out loss), so this reads the columns rather than listing them."""
    return sorted(c for c in steps.select_dtypes("number").columns if c not in ("repeat", "rank", "step"))


def repeat_values(
    steps: pd.DataFrame, metric: str = "step_ms", windows: Mapping[str, int] | None = None
) -> pd.DataFrame:
    """One row per (case_id, repeat): that repeat's value of ``metric``.

    Per step, ``step_ms`` is the slowest rank's (a step lasts as long as it does), any other metric
    (``cpu_ms``, memory) the mean over ranks. Per repeat, the median over steps: robust to the odd
    step the machine interrupted. A case whose work repeats over several steps (``windows``:
    case_id → ``averaging_window``, e.g. post-local SGD averaging every 4th step) is first
    averaged over whole windows of consecutive timed steps and the median taken over windows,
    so the periodic cost is in the value instead of being the outlier a median drops. Fewer timed
    steps than one window: their mean.
    """
    windows = windows or {}
    rows = []
    for (cid, rep), g in per_step(steps, metric).groupby(["case_id", "repeat"], sort=True):
        v = g[metric].to_numpy(dtype=float)
        w = max(1, int(windows.get(cid, 1)))
        if w > 1:
            whole = v.size // w
            v = v[: whole * w].reshape(whole, w).mean(axis=1) if whole else np.array([np.nanmean(v)])
        rows.append(
            {"case_id": cid, "repeat": int(rep), metric: float(np.nanmedian(v)) if np.isfinite(v).any() else math.nan}
        )
    return pd.DataFrame(rows, columns=["case_id", "repeat", metric])


def windows_of(cases: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """``averaging_window`` of each case (case_id → params)."""
    return {cid: averaging_window(p) for cid, p in cases.items()}


@dataclass(frozen=True)
class Ratio:
    """candidate / baseline with its confidence interval.

    ``n``: the pairs (paired) or the fewer values of the two sides (unpaired) it rests on.
    ``method``: "paired", "unpaired" or "single" (too few values for an interval: lo = hi = ratio).
    ``sides``: the baseline's and the candidate's values whose ratio ``ratio`` is (geometric means
    for the t intervals, medians for the bootstrap's), for a table that shows them beside it: a
    side's median may move the other way from its geometric mean where its repeats are skewed.
    """

    ratio: float
    lo: float
    hi: float
    n: int
    method: str
    sides: tuple[float, float] = (math.nan, math.nan)

    @property
    def half_width(self) -> float:
        """The interval's half-width as a fraction of the ratio (0.04: "resolves ±4%"), the
        smallest change this comparison could have told from none; NaN without an interval."""
        return half_width(self.lo, self.hi) if self.method != "single" else math.nan

    @property
    def has_interval(self) -> bool:
        return self.method != "single"


def half_width(lo: float, hi: float) -> float:
    """Half-width of a ratio interval, as a fraction: half its width in log space, back as a ratio
    (symmetric for the t intervals, the mean of both sides for a bootstrap's)."""
    if not (lo > 0 and hi > 0):
        return math.nan
    return math.exp((math.log(hi) - math.log(lo)) / 2) - 1


def _t(confidence: float, df: float) -> float:
    # Imported here: scipy.stats takes about a second to import, and every rank process imports this
    # module (for ``repeat_values``) without ever needing a t quantile.
    from scipy import stats

    return float(stats.t.ppf(1 - (1 - confidence) / 2, df))


def geometric_mean(values: Iterable[float]) -> float:
    """The geometric mean of per-repeat values (NaN for none): what a ratio of two sides compares
    (``paired_ratio``, ``unpaired_ratio``), so a side ranked by it is never "slower" than one it leads."""
    logs = np.log(np.fromiter(values, float))
    return float(np.exp(logs.mean())) if logs.size else math.nan


def paired_ratio(
    baseline: Mapping[int, float], candidate: Mapping[int, float], *, confidence: float = CONFIDENCE
) -> Ratio:
    """The ratio of two sides measured in the same rounds, from the rounds both have.

    ``baseline``/``candidate``: round (repeat index) → that repeat's value. ``d_i = log(c_i / b_i)``;
    estimate ``exp(mean(d))`` with a Student t interval over the rounds (n−1 degrees of freedom:
    exact for normal log ratios, and honest about few or disagreeing rounds, where a percentile
    bootstrap cannot reach past the most extreme round). One common round: no interval.
    """
    common = sorted(set(baseline) & set(candidate))
    d = np.log([candidate[k] / baseline[k] for k in common]) if common else np.array([])
    if d.size == 0:
        raise ValueError("paired_ratio needs at least one round both sides ran")
    mean = float(np.mean(d))
    sides = (geometric_mean(baseline[k] for k in common), geometric_mean(candidate[k] for k in common))
    if d.size < 2:
        return Ratio(math.exp(mean), math.exp(mean), math.exp(mean), 1, "single", sides)
    half = _t(confidence, d.size - 1) * float(np.std(d, ddof=1)) / math.sqrt(d.size)
    return Ratio(math.exp(mean), *_ends(mean, half), int(d.size), "paired", sides)


def _ends(mean: float, half: float) -> tuple[float, float]:
    """An interval's ends, ``exp(mean ∓ half)``, kept within a float: at a confidence of ten nines
    over a few rounds the t quantile runs to hundreds of thousands, and ``exp`` of the sum would
    overflow. Clipped at e^±700 (about 1e±304), the ends still decide nothing they would not have
    (every rule compares them with ratios near 1) and stay finite numbers for JSON."""
    return math.exp(max(mean - half, -700.0)), math.exp(min(mean + half, 700.0))


def unpaired_ratio(baseline: np.ndarray, candidate: np.ndarray, *, confidence: float = CONFIDENCE) -> Ratio:
    """The ratio of geometric means of two independent sets of per-repeat values, with Welch's t
    interval on the difference of mean logs (Welch–Satterthwaite degrees of freedom). Fewer than
    two values on a side: no interval."""
    b, c = np.log(np.asarray(baseline, dtype=float)), np.log(np.asarray(candidate, dtype=float))
    if b.size == 0 or c.size == 0:
        raise ValueError("unpaired_ratio needs at least one value on each side")
    diff = float(c.mean() - b.mean())
    n = int(min(b.size, c.size))
    sides = (math.exp(b.mean()), math.exp(c.mean()))
    if n < 2:
        return Ratio(math.exp(diff), math.exp(diff), math.exp(diff), n, "single", sides)
    vb, vc = b.var(ddof=1) / b.size, c.var(ddof=1) / c.size
    se = math.sqrt(vb + vc)
    if se == 0:
        return Ratio(math.exp(diff), math.exp(diff), math.exp(diff), n, "unpaired", sides)
    df = (vb + vc) ** 2 / (vb**2 / (b.size - 1) + vc**2 / (c.size - 1))
    half = _t(confidence, df) * se
    return Ratio(math.exp(diff), *_ends(diff, half), n, "unpaired", sides)


def unpaired_difference(
    baseline: np.ndarray, candidate: np.ndarray, *, confidence: float = CONFIDENCE
) -> tuple[float, float, float]:
    """mean(candidate) − mean(baseline) of two independent samples, with Welch's t interval:
    (estimate, lo, hi). On the values themselves, not their logs: the parts of a step that
    ``tpbench explain`` compares may be zero on one side, and their changes add up only as
    differences. Fewer than two values on a side, or no spread: lo = hi = the estimate."""
    b, c = np.asarray(baseline, dtype=float), np.asarray(candidate, dtype=float)
    if b.size == 0 or c.size == 0:
        raise ValueError("unpaired_difference needs at least one value on each side")
    diff = float(c.mean() - b.mean())
    if min(b.size, c.size) < 2:
        return diff, diff, diff
    vb, vc = b.var(ddof=1) / b.size, c.var(ddof=1) / c.size
    if vb + vc == 0:
        return diff, diff, diff
    df = (vb + vc) ** 2 / (vb**2 / (b.size - 1) + vc**2 / (c.size - 1))
    half = _t(confidence, df) * math.sqrt(vb + vc)
    return diff, diff - half, diff + half


def spent_confidence(confidence: float, looks: int, comparisons: int = 1) -> float:
    """The confidence each single interval must have so that all of them hold together.

    A rule that looks at its intervals after every round (a race eliminating arms, a gate or an
    adaptive sweep that stops once it is sure) gets ``looks`` chances per comparison to be fooled
    by noise, and ``comparisons`` comparisons per look. Uniform alpha spending with a Bonferroni
    union bound: each interval is built at ``1 - (1 - confidence) / (looks * comparisons)``, so the
    chance that any interval at any look misses its true ratio is at most ``1 - confidence``,
    whenever and however the rule stops (anytime-valid over at most ``looks`` looks). Conservative,
    exact per interval under normal log ratios (the t interval) and needing no assumption on how
    the looks depend on each other; ``looks`` is the most the rule can take (the budget's rounds),
    not the number it happens to take.
    """
    return 1 - spent_miss(confidence, looks, comparisons)


def spent_miss(confidence: float, looks: int, comparisons: int = 1) -> float:
    """``1 - spent_confidence(...)``, the chance each single interval may miss, computed without the
    round trip through 1: for a race asked how long it would take at a tiny margin and a confidence
    of ten nines, ``looks`` runs to millions and the spent confidence rounds to exactly 1.0, whose
    normal quantile does not exist (a tune would end with a traceback)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    return (1 - confidence) / (max(1, int(looks)) * max(1, int(comparisons)))


def blocked_ratios(
    values: Mapping[str, Mapping[int, float]], base: str, *, confidence: float = CONFIDENCE
) -> dict[str, Ratio]:
    """Every other arm / ``base``, from arms that ran round by round in one world: a randomised block
    design whose blocks are the rounds, complete or not (an arm may have sat rounds out).

    ``values``: arm → round → value. Model ``log v[a, r] = arm effect + round effect + noise``, the
    noise of one variance for every arm: the round effect is what pairing removes (a slow round slows
    every arm), and the residual variance is estimated from every value there is, by least squares,
    with ``N − rank`` degrees of freedom (``(A − 1)(R − 1)`` when every arm ran every round) instead
    of a pair's ``R − 1``. With many arms and few rounds that is what lets a race decide early: a t
    quantile at 2 degrees of freedom is several times the one at 12. Each interval is the mean log
    difference over the rounds the two arms share ``± t · s · √(2/n)``; for two arms and complete
    rounds this is exactly ``paired_ratio``. The price is the equal-variance assumption (in logs:
    equal relative noise), which settings of one case in one world meet and the race's measured
    accuracy checks.
    """
    logs = {a: {r: math.log(v) for r, v in per_round.items()} for a, per_round in values.items()}
    noise, df = _block_noise(logs)
    out = {}
    for a, per_round in logs.items():
        if a == base:
            continue
        shared = sorted(set(per_round) & set(logs[base]))
        if not shared:
            raise ValueError(f"blocked_ratios: {a} shares no round with {base}")
        m = sum(per_round[r] - logs[base][r] for r in shared) / len(shared)
        if df < 1 or len(shared) < 2:
            out[a] = Ratio(math.exp(m), math.exp(m), math.exp(m), len(shared), "single")
            continue
        half = _t(confidence, df) * noise * math.sqrt(2 / len(shared))
        out[a] = Ratio(math.exp(m), *_ends(m, half), len(shared), "paired")
    return out


def _block_noise(logs: Mapping[str, Mapping[int, float]]) -> tuple[float, int]:
    """The residual standard deviation of ``arm effect + round effect`` fitted by least squares to
    every (arm, round) value, and its degrees of freedom (values less the fit's rank).

    The first arm's effect is left out of the design (the others are relative to it): with a column
    for every arm and every round, both sets sum to ones, and on such a rank-deficient design of a
    race's 299 values numpy's solver can fail to converge ("SVD did not converge"), which would end a
    tune with a traceback (tests/fixtures/races/svd_did_not_converge.json). The fitted values, and so
    the residuals, are the same."""
    cells = [(a, r, x) for a, per_round in logs.items() for r, x in per_round.items()]
    arm_col = {a: i - 1 for i, a in enumerate(logs) if i}
    round_col = {r: len(arm_col) + i for i, r in enumerate(sorted({r for _, r, _ in cells}))}
    design = np.zeros((len(cells), len(arm_col) + len(round_col)))
    for i, (a, r, _) in enumerate(cells):
        if a in arm_col:
            design[i, arm_col[a]] = 1
        design[i, round_col[r]] = 1
    y = np.array([x for _, _, x in cells])
    coef, _, rank, _ = np.linalg.lstsq(design, y, rcond=None)
    df = len(cells) - int(rank)
    if df < 1:
        return 0.0, df
    return math.sqrt(float(((y - design @ coef) ** 2).sum()) / df), df


def sequential_ratio(
    baseline: Mapping[int, float],
    candidate: Mapping[int, float],
    *,
    looks: int,
    comparisons: int = 1,
    confidence: float = CONFIDENCE,
) -> Ratio:
    """``paired_ratio`` at the confidence a rule that peeks needs (``spent_confidence``): the one
    interval ``tpbench tune``, ``gate --target-ci`` and ``sweep --target-ci`` decide by."""
    return paired_ratio(baseline, candidate, confidence=spent_confidence(confidence, looks, comparisons))


def case_ratio(
    baseline: Mapping[int, float], candidate: Mapping[int, float], *, paired: bool, confidence: float = CONFIDENCE
) -> Ratio:
    """Two cases of one run, each as repeat → value: paired by repeat when they ran round by round
    in the same world (``paired``, see ``suite.ran_together``) and share at least two rounds,
    else unpaired. The rule every within-run comparison (report, ``tpbench compare RUN``) uses."""
    if paired and len(set(baseline) & set(candidate)) >= 2:
        return paired_ratio(baseline, candidate, confidence=confidence)
    return unpaired_ratio(
        np.fromiter(baseline.values(), float), np.fromiter(candidate.values(), float), confidence=confidence
    )


def bootstrap_ci(
    values: np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray] = lambda a: np.median(a, axis=-1),
    *,
    samples: int = BOOTSTRAP_SAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic`` over ``values`` (seeded: reports are reproducible).

    NaN at both ends for fewer than two values: one value resamples only to itself, and an interval
    of no width would claim the value is known exactly ("[7.91, 7.91]" for a case of one repeat)."""
    values = np.asarray(values, dtype=float)
    if values.size < 2:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, values.size, size=(samples, values.size))
    stats = statistic(values[idx])
    alpha = (1 - confidence) / 2
    return (float(np.quantile(stats, alpha)), float(np.quantile(stats, 1 - alpha)))


def range_confidence(n: int) -> float:
    """How often the range of ``n`` independent values holds their distribution's median: 1 − 2^(1−n),
    since it misses only when all ``n`` fall on one side of it. With 2 to 5 values the percentile
    bootstrap interval of the median (``bootstrap_ci``) is that range exactly (a resample takes the
    least value as its median more often than 2.5 % of the time), so a "95 %" interval of 3 repeats'
    median holds it with 75 % confidence; 6 values are the fewest whose range reaches 95 %."""
    return 1 - 2.0 ** (1 - n)


def summarize(steps: pd.DataFrame, cases: pd.DataFrame) -> pd.DataFrame:
    """One row per case: the case's parameters and status, its step time with its CI, spreads.

    ``repeat_medians_ms`` holds each repeat's value (``repeat_values``, in ``repeat_ids`` order),
    the unit every comparison of cases works on. ``median_ms`` is the median of those values and
    ``ci_lo_ms``/``ci_hi_ms`` the bootstrap interval of that same median, so a point never falls
    outside its own interval (for post-local SGD the repeat values are period-aware, and the
    median over steps would drop the averaging steps). The step-level figures keep names that say
    so: ``step_median_ms`` (the median over every timed step, pooled) and ``p10_ms``/``p90_ms``
    (the spread of single steps).

    ``cases`` is the store's per-case table (params + status); failed cases keep a row with
    their error and no numbers, so a summary never silently drops a case.
    """
    rows = []
    per_step = (
        slowest_rank(steps) if not steps.empty else pd.DataFrame(columns=["case_id", "repeat", "step", "step_ms"])
    )
    by_case = dict(tuple(per_step.groupby("case_id"))) if not per_step.empty else {}
    windows = {c["case_id"]: averaging_window(c) for c in cases.to_dict("records")}
    per_repeat = repeat_values(steps, "step_ms", windows) if not steps.empty else pd.DataFrame()
    by_repeat = dict(tuple(per_repeat.groupby("case_id"))) if not per_repeat.empty else {}
    memory_cols = [c for c in ("peak_rss_mb", "peak_allocated_mb", "peak_reserved_mb") if c in steps]
    # One groupby for every case's memory peaks: filtering the steps table per case is quadratic.
    peaks = steps.groupby("case_id")[memory_cols].max().to_dict("index") if memory_cols and not steps.empty else {}
    for case in cases.to_dict("records"):
        row = dict(case)
        data = by_case.get(case["case_id"])
        if data is not None and len(data):
            mine = by_repeat[case["case_id"]]
            reps = mine["step_ms"].to_numpy()
            ms = data["step_ms"].to_numpy()
            median = float(np.median(reps))
            lo, hi = bootstrap_ci(reps)
            row |= {
                "median_ms": median,
                "step_median_ms": float(np.median(ms)),
                "p10_ms": float(np.quantile(ms, 0.1)),
                "p90_ms": float(np.quantile(ms, 0.9)),
                "ci_lo_ms": lo,
                "ci_hi_ms": hi,
                "repeat_medians_ms": reps.tolist(),
                "repeat_ids": mine["repeat"].astype(int).tolist(),
                "samples_per_s": case["batch_size"] * case["world_size"] / (median / 1e3),
                "timed_steps": int(len(ms)),
            }
            row |= {f"max_{col}": float(v) for col, v in peaks.get(case["case_id"], {}).items()}
        rows.append(row)
    return pd.DataFrame(rows)


def _two_stage_medians(groups: list[np.ndarray], pick: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap medians of pooled groups: ``pick`` (samples × groups) says which groups (runs)
    each sample draws; values are then resampled within each drawn group.

    Padded to a (groups × longest) table so one vectorised draw serves every sample; positions past
    a drawn group's own length are masked, so each group keeps its size.
    """
    samples = pick.shape[0]
    sizes = np.array([g.size for g in groups])
    width = int(sizes.max())
    table = np.full((len(groups), width), np.nan)
    for i, g in enumerate(groups):
        table[i, : g.size] = g
    n = sizes[pick][..., None]
    within = (rng.random((samples, len(groups), width)) * n).astype(int)
    values = np.where(np.arange(width) < n, table[pick[..., None], within], np.nan)
    return np.nanmedian(values.reshape(samples, -1), axis=1)


def run_effects(groups: list[np.ndarray]) -> np.ndarray:
    """Each run's median relative to the median of the run medians: how far one run lands by chance."""
    medians = np.array([np.median(g) for g in groups])
    return medians / np.median(medians)


def hierarchical_ratio_ci(
    baseline: list[np.ndarray],
    candidate: list[np.ndarray],
    *,
    samples: int = BOOTSTRAP_SAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> Ratio:
    """Ratio of medians candidate/baseline when each side is several runs of per-repeat values.

    Repeats of one run share a process start, a machine state and (for stored baselines) a job, so
    runs differ more than repeats do. A side of two or more runs is bootstrapped in two stages
    (resample runs, then repeats within each drawn run), which carries that between-run spread
    into the interval and slightly overstates it, as suits a gate that must not cry wolf.

    A side of one run cannot show its own between-run spread. When the other side has several
    runs, the single run is judged against their spread: each bootstrap draw of its repeats is
    also scaled by one of the other side's run effects (``run_effects``), i.e. the candidate is
    treated as one more run that could have landed anywhere the baselines did. With one run on
    each side only the repeats are resampled, and between-run noise is not in the interval at all;
    the gate documents that stored single baselines are the weakest evidence. The point estimate
    pools all repeats of each side. Runs made side by side in lockstep: ``paired_ratio``.
    """
    b = [np.asarray(g, dtype=float) for g in baseline if len(g)]
    c = [np.asarray(g, dtype=float) for g in candidate if len(g)]
    if not b or not c:
        raise ValueError("hierarchical_ratio_ci needs at least one value on each side")
    sides = (float(np.median(np.concatenate(b))), float(np.median(np.concatenate(c))))
    point = sides[1] / sides[0]
    n = min(sum(g.size for g in b), sum(g.size for g in c))
    if sum(g.size for g in b) < 2 and sum(g.size for g in c) < 2:
        return Ratio(point, point, point, n, "single", sides)
    rng = np.random.default_rng(seed)
    cs = _two_stage_medians(c, rng.integers(0, len(c), size=(samples, len(c))), rng)
    bs = _two_stage_medians(b, rng.integers(0, len(b), size=(samples, len(b))), rng)
    if len(c) == 1 and len(b) >= 2:
        cs = cs * rng.choice(run_effects(b), size=samples)
    elif len(b) == 1 and len(c) >= 2:
        bs = bs * rng.choice(run_effects(c), size=samples)
    r = cs / bs
    alpha = (1 - confidence) / 2
    return Ratio(point, float(np.quantile(r, alpha)), float(np.quantile(r, 1 - alpha)), n, "unpaired", sides)
