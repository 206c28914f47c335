"""The rules that peek and stop early (``gate --target-ci``, ``sweep --target-ci``) decide by the
one sequential interval (``stats.sequential_ratio``), so peeking after every round raises no more
false alarms than the stated confidence allows. Synthetic values: deterministic, no worlds."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from synthetic_runs import make_run

from tpbench import compare, gate, store, sweep
from tpbench.analysis.stats import paired_ratio


def sides(base: dict, cand: dict) -> list:
    """The two sides as ``gate.answers`` reads them: case → repeat → value."""
    return [SimpleNamespace(values={"c": base}), SimpleNamespace(values={"c": cand})]


def aa_gate(rng: np.random.Generator, cfg: gate.Lockstep, noise: float, effect: float = 1.0) -> tuple[str, int]:
    """One simulated gate peeking after every round: its answer and the rounds it took; the rounds
    share a machine state (what pairing cancels)."""
    base: dict[int, float] = {}
    cand: dict[int, float] = {}
    for r in range(cfg.repeats):
        common = rng.lognormal(0, 0.1)
        base[r] = 10 * common * rng.lognormal(0, noise)
        cand[r] = 10 * effect * common * rng.lognormal(0, noise)
        per_case = gate.answers(sides(base, cand), cfg)
        if gate.UNKNOWN not in per_case.values():
            return gate.answer_of(per_case), r + 1
    return gate.answer_of(gate.answers(sides(base, cand), cfg)), cfg.repeats


def test_an_aa_gate_that_peeks_every_round_says_different_at_most_as_often_as_its_confidence_allows():
    rng = np.random.default_rng(0)
    cfg = gate.Lockstep(repeats=60, target_ci=0.005, min_pairs=10)
    said = [aa_gate(rng, cfg, noise=0.03)[0] for _ in range(200)]
    assert said.count(gate.DIFFERENT) <= 200 * 0.05
    # Plain 95 % intervals at every peek would cry wolf far more often: what the rule is for.
    rng = np.random.default_rng(0)
    plain = 0
    for _ in range(200):
        base, cand = {}, {}
        for r in range(60):
            common = rng.lognormal(0, 0.1)
            base[r], cand[r] = 10 * common * rng.lognormal(0, 0.03), 10 * common * rng.lognormal(0, 0.03)
            if r + 1 >= 10 and not (paired_ratio(base, cand).lo <= 1 <= paired_ratio(base, cand).hi):
                plain += 1
                break
    assert plain > said.count(gate.DIFFERENT)


def test_a_gate_answers_different_same_or_unknown():
    rng = np.random.default_rng(1)
    cfg = gate.Lockstep(repeats=100, target_ci=0.02, min_pairs=10)
    answer, rounds = aa_gate(rng, cfg, noise=0.01, effect=1.10)
    assert answer == gate.DIFFERENT and rounds < 100
    answer, rounds = aa_gate(rng, cfg, noise=0.005)
    assert answer == gate.SAME and rounds < 100
    # Noise far above the target in too few rounds: neither.
    answer, rounds = aa_gate(rng, gate.Lockstep(repeats=12, target_ci=0.001, min_pairs=10), noise=0.05)
    assert answer == gate.UNKNOWN and rounds == 12
    assert gate.answer_of({"a": gate.SAME, "b": gate.DIFFERENT}) == gate.DIFFERENT
    assert gate.answer_of({"a": gate.SAME, "b": gate.UNKNOWN}) == gate.UNKNOWN
    assert gate.answer_of({}) == gate.UNKNOWN


def test_the_adaptive_sweep_judges_its_half_widths_by_the_spent_confidence(tmp_path):
    run_dir = make_run(tmp_path, {"ddp": [10, 10.4, 9.9, 10.2, 10.1], "zero_no_overlap": [12, 12.1, 11.7, 12.6, 12.2]})
    loaded = store.load(run_dir)
    plain = compare.within_run(loaded).pairs
    spent = sweep._sequential_pairs(loaded)
    assert len(plain) == len(spent) == 1
    assert spent[0].result.half_width > plain[0].result.half_width
