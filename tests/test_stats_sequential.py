"""The sequential rule's intervals (analysis/stats.py: spent_confidence, sequential_ratio)."""

import numpy as np
import pytest

from tpbench.analysis.stats import paired_ratio, sequential_ratio, spent_confidence


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
