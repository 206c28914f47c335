"""The sequential rule's intervals (analysis/stats.py: spent_confidence, sequential_ratio, blocked_ratios) and the
geometric mean they rank by."""

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from tpbench.analysis.stats import blocked_ratios, geometric_mean, paired_ratio, sequential_ratio, spent_confidence


def test_spent_confidence_splits_the_error_over_looks_and_comparisons():
    assert spent_confidence(0.95, 1) == pytest.approx(0.95)
    assert spent_confidence(0.95, 10, 6) == pytest.approx(1 - 0.05 / 60)
    with pytest.raises(ValueError):
        spent_confidence(1.0, 3)


def test_sequential_interval_is_wider_than_a_single_look_and_holds_when_peeking():
    """A/A data looked at after every round from round 5 to 40: the single-look 95% interval
    excludes 1 at some look far more often than 5% of the time; the spent one does not."""
    rng = np.random.default_rng(0)
    looks = range(5, 41)
    naive = spent = 0
    trials = 400
    for _ in range(trials):
        b = dict(enumerate(np.exp(rng.normal(0, 0.03, 40))))
        c = dict(enumerate(np.exp(rng.normal(0, 0.03, 40))))
        naive_hit = spent_hit = False
        for n in looks:
            bn, cn = {k: b[k] for k in range(n)}, {k: c[k] for k in range(n)}
            r = paired_ratio(bn, cn)
            s = sequential_ratio(bn, cn, looks=len(looks))
            assert s.lo <= r.lo and s.hi >= r.hi
            naive_hit |= not (r.lo <= 1 <= r.hi)
            spent_hit |= not (s.lo <= 1 <= s.hi)
        naive += naive_hit
        spent += spent_hit
    assert naive / trials > 0.10
    assert spent / trials <= 0.05


def test_the_geometric_mean_ranks_as_the_paired_ratio_compares():
    """The statistic a race's leader and the report's fastest case are ranked by: two sides' paired
    ratio over the same rounds is the ratio of their geometric means."""
    a, b = {0: 10.0, 1: 12.0, 2: 9.0}, {0: 11.0, 1: 12.5, 2: 10.0}
    assert paired_ratio(a, b).ratio == pytest.approx(geometric_mean(b.values()) / geometric_mean(a.values()))
    assert geometric_mean([2.0, 8.0]) == pytest.approx(4.0) and np.isnan(geometric_mean([]))


def test_blocked_ratios_of_two_arms_are_the_paired_interval():
    rng = np.random.default_rng(1)
    a, b = (dict(enumerate(np.exp(rng.normal(0, 0.05, 9)))) for _ in range(2))
    pooled, paired = blocked_ratios({"a": a, "b": b}, "a")["b"], paired_ratio(a, b)
    assert (pooled.ratio, pooled.lo, pooled.hi) == pytest.approx((paired.ratio, paired.lo, paired.hi))
    assert pooled.method == "paired" and pooled.n == 9


def test_blocked_ratios_fit_a_race_that_numpys_svd_solver_could_not():
    """A race's 299 values (seven arms, 111 rounds, most arms retired or out early; from
    ``benchmarks/race_cost.py``'s simulated races) on which numpy's least squares failed with "SVD
    did not converge", which would have ended a tune with a traceback. The fit is the same one:
    its residual spread matches the full-rank fit with the first arm's effect dropped."""
    raw = json.loads((Path(__file__).parent / "fixtures" / "races" / "svd_did_not_converge.json").read_text())
    values = {a: {int(r): v for r, v in per_round.items()} for a, per_round in raw.items()}
    ratios = blocked_ratios(values, "arm0")
    assert set(ratios) == set(values) - {"arm0"} and all(0 < r.lo < r.ratio < r.hi for r in ratios.values())
    cells = [(a, r, np.log(v)) for a, per_round in values.items() for r, v in per_round.items()]
    arms, rounds = sorted(values)[1:], sorted({r for _, r, _ in cells})
    design = np.array([[a == b for b in arms] + [r == q for q in rounds] for a, r, _ in cells], dtype=float)
    y = np.array([x for *_, x in cells])
    coef = np.linalg.solve(design.T @ design, design.T @ y)
    df = len(cells) - design.shape[1]
    noise = np.sqrt(((y - design @ coef) ** 2).sum() / df)
    r1 = ratios["arm1"]
    shared = len(set(values["arm1"]) & set(values["arm0"]))
    half = np.log(r1.hi / r1.ratio)
    assert half == pytest.approx(stats.t.ppf(0.975, df) * noise * np.sqrt(2 / shared))


def test_blocked_ratios_cover_at_their_confidence_and_are_narrower_in_few_rounds():
    """Seven arms, three rounds, a common round effect and equal relative noise: each 95 % interval
    holds its true ratio about 95 % of the time (the pooled variance is honest), and is far
    narrower than the pair's own, which rests on 2 degrees of freedom instead of 12."""
    rng = np.random.default_rng(2)
    truth = np.log([1.0, 1.03, 1.06, 1.1, 1.15, 1.25, 1.4])
    covered = total = 0
    narrower = []
    for _ in range(1500):
        common = rng.normal(0, 0.2, 3)
        values = {f"a{i}": dict(enumerate(np.exp(t + common + rng.normal(0, 0.03, 3)))) for i, t in enumerate(truth)}
        pooled = blocked_ratios(values, "a0")
        for i, t in enumerate(truth[1:], start=1):
            r = pooled[f"a{i}"]
            covered += r.lo <= np.exp(t) <= r.hi
            total += 1
        narrower.append(pooled["a6"].half_width < paired_ratio(values["a0"], values["a6"]).half_width)
    assert 0.93 <= covered / total <= 0.97
    assert np.mean(narrower) > 0.8


def test_blocked_ratios_of_complete_rounds_are_the_closed_form_of_a_block_design():
    """Every arm in every round: the least-squares fit is the two-way table's closed form (residual
    ``x − arm mean − round mean + grand mean`` on (A − 1)(R − 1) degrees of freedom)."""
    from scipy import stats

    rng = np.random.default_rng(3)
    x = np.log([1.0, 1.02, 1.1, 1.3])[:, None] + rng.normal(0, 0.2, 6) + rng.normal(0, 0.04, (4, 6))
    values = {f"a{i}": dict(enumerate(np.exp(row))) for i, row in enumerate(x)}
    resid = x - x.mean(axis=1, keepdims=True) - x.mean(axis=0, keepdims=True) + x.mean()
    df = 3 * 5
    half = stats.t.ppf(0.975, df) * np.sqrt(2 * (resid**2).sum() / df / 6)
    for i in range(1, 4):
        m = x[i].mean() - x[0].mean()
        r = blocked_ratios(values, "a0")[f"a{i}"]
        assert (r.ratio, r.lo, r.hi) == pytest.approx((np.exp(m), np.exp(m - half), np.exp(m + half)))


def test_blocked_ratios_pair_an_arm_that_sat_rounds_out_over_the_rounds_it_shares():
    """An arm that ran rounds 0–2 only (a tune's retired arm): its ratio is the mean log difference
    over those three rounds, its interval √(2/3) wide in units of the noise, the noise itself
    estimated from every value (the other arms' later rounds included); and it covers at its
    confidence."""
    rng = np.random.default_rng(4)
    covered = 0
    for _ in range(2000):
        common = rng.normal(0, 0.2, 12)
        full = {a: dict(enumerate(np.exp(f + common + rng.normal(0, 0.03, 12)))) for a, f in (("a", 0.0), ("b", 0.01))}
        short = dict(enumerate(np.exp(0.1 + common[:3] + rng.normal(0, 0.03, 3))))
        r = blocked_ratios({**full, "c": short}, "a")["c"]
        assert r.n == 3 and r.ratio == pytest.approx(
            np.exp(np.mean([np.log(short[k] / full["a"][k]) for k in range(3)]))
        )
        covered += r.lo <= np.exp(0.1) <= r.hi
    assert 0.93 <= covered / 2000 <= 0.97
