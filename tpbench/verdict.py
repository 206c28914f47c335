"""One interval, one verdict: the words every comparison states its result in.

A ratio candidate / baseline with its confidence interval (``analysis.stats.Ratio``) and a
threshold give one ``Verdict``, used by the report, ``tpbench compare`` (runs, and the cases of one
run), ``tpbench gate`` and the exports, so the same interval never reads as "sequential wins" in
one place and "inconclusive" in another. It says two things:

- the *direction*, from whether the interval excludes 1: ``slower`` (it lies above), ``faster``
  (below), ``no difference shown`` (it contains 1), ``no interval`` (one repeat);
- the *call* against the threshold t, the word ``compare`` and ``gate`` exit by
  (docs/gates.md): ``regression`` (the interval lies above 1 + t), ``improvement`` (below 1 − t),
  ``pass`` (inside [1 − t, 1 + t]: any change is within tolerance), ``inconclusive`` otherwise, or
  with fewer than ``MIN_REPEATS`` values on a side.

Its clause says which, in words: "beyond the ±5% threshold", "within the ±5% threshold", "not
shown beyond the ±5% threshold" (the interval excludes no change but reaches across the threshold:
a difference was resolved, one beyond the threshold was not), "could only resolve ±7.9%" (said
only when the interval contains no change), "too few to judge (2 pairs; need 3)", "not judged"
(no interval). In full:
"slower: +9.0% [+1.0%, +17.6%], not shown beyond the ±5% threshold". A slower-but-not-beyond
result is ``inconclusive`` (exit 0, 4 with ``--fail-on-inconclusive``) when its interval reaches
past 1 + t, ``pass`` when it stays inside it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tpbench.analysis.stats import CONFIDENCE, Ratio, range_confidence

# What a comparison's or a race's metric (``--metric``) is called in sentences and headings.
METRIC_WORDS = {"step_ms": "step time", "cpu_ms": "CPU time per step"}


def ratio_heading(metric: str, against: str = "recommended") -> str:
    """A tune's ratio column, naming what was raced where it is not the default step time: with
    ``--metric cpu_ms`` the text, Markdown and the report's table would otherwise read exactly as a
    step_ms race's, and only the JSON would say the ratios are CPU time. ``against``: what the
    ratios are to (an interrupted tune's report has no recommended setting: "that round's leader")."""
    return f"vs {against}" if metric == "step_ms" else f"vs {against} ({METRIC_WORDS[metric]})"


PASS, REGRESSION, IMPROVEMENT, INCONCLUSIVE = "pass", "regression", "improvement", "inconclusive"
FASTER, SLOWER, NO_DIFFERENCE, NO_INTERVAL = "faster", "slower", "no difference shown", "no interval"
# The threshold a comparison judges by unless told otherwise (``--threshold``; the report's).
THRESHOLD = 0.05
# Fewer per-repeat values than this on a side (or pairs, for a paired interval) and the interval
# is not judged: a t interval on one degree of freedom is 12.7 standard errors wide.
MIN_REPEATS = 3
# The clause of an interval that holds no change: it says the smallest change it could have told.
ONLY_RESOLVES = "could only resolve"


def judge(lo: float, hi: float, threshold: float) -> str:
    """The call of one ratio interval against ``threshold`` (see the module docstring)."""
    if lo > 1 + threshold:
        return REGRESSION
    if hi < 1 - threshold:
        return IMPROVEMENT
    if lo >= 1 - threshold and hi <= 1 + threshold:
        return PASS
    return INCONCLUSIVE


def enough(est: Ratio, baseline_n: int, candidate_n: int) -> bool:
    """Whether an interval rests on enough values to be judged: ``MIN_REPEATS`` on each side, and
    as many pairs when it is paired."""
    return min(baseline_n, candidate_n) >= MIN_REPEATS and (est.method != "paired" or est.n >= MIN_REPEATS)


def signed_pct(ratio: float, line: float | None = None) -> str:
    """A ratio as a signed change, "+9.0%", with as many decimals (up to three) as it takes to keep
    its side of no change: an interval that lies above 1 must not read "[+0.0%, …]". Closer to
    1 than that, "+0.0%". Beyond ±100,000 %, three figures ("+5.2e+21%"): such an end says only that
    the rounds run bound nothing (a confidence of ten nines over three rounds).

    ``line``: another ratio whose side it keeps as well, a tune's 1 / (1 + ε) (``tie_line``). An arm
    that can no longer be 2 % faster has its interval's low end at or above 1 / 1.02, a change of
    -1.96 %, which one decimal writes "-2.0%": beside "it could no longer be 2% faster" it read as
    the very margin it was said to be clear of. It then reads "-1.96%"."""
    x = (ratio - 1) * 100
    if abs(x) >= 1e5:
        return f"{x:+.3g}%"
    edge = None if line is None else (line - 1) * 100
    for digits in (1, 2, 3):
        said = f"{x:+.{digits}f}%"
        shown = float(said[:-1])
        if shown != 0 and (edge is None or (shown >= edge) == (x >= edge)):
            return said
    return f"{x:+.1f}%"


def tie_line(epsilon: float) -> float:
    """The ratio to the leader at or above which a tune arm can no longer be ``epsilon`` faster
    (``racing.within_epsilon``): its interval's low end there retires it."""
    return 1 / (1 + epsilon)


def signed_ms(x: float) -> str:
    """Milliseconds as a signed change, "+0.88", with as many decimals (two to four) as it takes to keep
    its side of no change: ``tune --trace`` names the parts whose interval excludes no change, and a
    low end of +0.004 reads "+0.004", not "+0.00". Closer to 0 than four decimals, "+0.00"."""
    for digits in (2, 3, 4):
        said = f"{x:+.{digits}f}"
        if float(said) != 0:
            return said
    return f"{x:+.2f}"


def half_width_pct(half_width: float) -> str:
    """An interval's half-width (a fraction of its ratio: what it resolves) as "±4.0%", written as
    ``signed_pct`` writes a change, so that every output says it alike: two repeats' t interval on one
    degree of freedom can be 10⁶ % wide, "±1.65e+06%", which a fixed format writes as "±1653912.0%"."""
    return "±" + signed_pct(1 + abs(half_width))[1:]


def percent(share: float) -> str:
    """A share the user stated (a tune's margin or confidence) as a percentage, never rounded: "2%",
    "2.5%", "97.5%". Rounded to whole percents, a margin of 2.5 % would read "within 2%" and a
    confidence of 0.9999999999 "100%": claims the race does not make."""
    return f"{share * 100:.10g}%"


def change(ratio: float | None, lo: float | None = None, hi: float | None = None, line: float | None = None) -> str:
    """A ratio as a signed change with its interval when given: "+9.0% [+1.0%, +17.6%]"; a ratio
    that is None or not finite as nothing (a table's empty cell); ``line`` as ``signed_pct``'s."""

    def pct(r: float | None) -> str:
        return "" if r is None or not math.isfinite(r) else signed_pct(r, line)

    return pct(ratio) + (f" [{pct(lo)}, {pct(hi)}]" if lo is not None and hi is not None else "")


@dataclass(frozen=True)
class Verdict:
    """What one interval says (module docstring): ``call`` decides exit codes, ``direction`` and
    ``clause`` are the words every output uses, ``change`` the numbers."""

    call: str
    direction: str
    clause: str
    change: str

    @property
    def words(self) -> str:
        """The verdict without its numbers: "slower, not shown beyond the ±5% threshold"."""
        return f"{self.direction}, {self.clause}"

    @property
    def says_resolution(self) -> bool:
        """Whether the clause already states what the interval resolves ("could only resolve ±7.9%"),
        so that an output adding "this run resolves ±7.9%" beside it would say it twice."""
        return self.clause.startswith(ONLY_RESOLVES)

    @property
    def text(self) -> str:
        """The verdict in full: "slower: +9.0% [+1.0%, +17.6%], not shown beyond the ±5% threshold"."""
        return f"{self.direction}: {self.change}, {self.clause}"


def of(
    est: Ratio, threshold: float = THRESHOLD, *, baseline_n: int | None = None, candidate_n: int | None = None
) -> Verdict:
    """The verdict of ``est`` (candidate / baseline) against ``threshold``; ``baseline_n`` and
    ``candidate_n`` (each side's values, default: the interval's own count) decide ``enough``."""
    if not est.has_interval:
        return Verdict(INCONCLUSIVE, NO_INTERVAL, "not judged", change(est.ratio))
    numbers = change(est.ratio, est.lo, est.hi)
    direction = SLOWER if est.lo > 1 else FASTER if est.hi < 1 else NO_DIFFERENCE
    limit = f"the ±{threshold * 100:g}% threshold"
    b = est.n if baseline_n is None else baseline_n
    c = est.n if candidate_n is None else candidate_n
    if not enough(est, b, c):
        have = f"{est.n} pairs" if est.method == "paired" else f"{b} baseline, {c} candidate repeats"
        return Verdict(INCONCLUSIVE, direction, f"too few to judge ({have}; need {MIN_REPEATS})", numbers)
    call = judge(est.lo, est.hi, threshold)
    if call in (REGRESSION, IMPROVEMENT):
        clause = f"beyond {limit}"
    elif call == PASS:
        clause = f"within {limit}"
    elif direction == NO_DIFFERENCE:
        clause = f"{ONLY_RESOLVES} {half_width_pct(est.half_width)}"
    else:
        clause = f"not shown beyond {limit}"
    return Verdict(call, direction, clause, numbers)


# Before a tune's per-world answers (``tune_record.TuneResult.worlds``), in the terminal and the report alike.
WORLDS_SAY = "Within each world (its own race, on the same intervals):"


def interval_heading(confidence: float, across_worlds: bool) -> str:
    """The tune table's interval column, in the terminal and the report alike. The confidence is
    spent over every arm and look (``stats.spent_confidence``), so it holds for all rows at once, not
    for each; "jointly" says so, where "95% interval" alone reads as each row's own. Where the settings
    span worlds, another world's arm has its own unpaired interval against the recommended arm there
    (``tune_answer._ratios_to_best``), not one paired by round."""
    return f"interval ({percent(confidence)} jointly{'; other worlds unpaired' if across_worlds else ''})"


# What eliminated a tune arm that no round of its own world did: its world's winner, set against the
# recommended arm's world after the races, on the unpaired interval (``tune_answer._statuses``).
ACROSS_WORLDS = "the recommended setting's world, at the end, unpaired (the interval beside it)"


def what_eliminated(status: str, vs: Mapping[str, Any] | None) -> str:
    """What eliminated a tune arm, as the terminal's table and the report say it: the interval against
    that round's leader (``eliminated_vs_text``), or ``ACROSS_WORLDS`` for an arm eliminated with no
    such round; nothing for an arm not eliminated."""
    if status == "eliminated" and not vs:
        return ACROSS_WORLDS
    return eliminated_vs_text(vs)


def eliminated_vs_text(vs: Mapping[str, Any] | None) -> str:
    """A tune arm's ``eliminated_vs`` (``tune_record.TuneArm``: the interval that eliminated it) as the terminal's
    table and the report say it, "+9.1% [+0.4%, +18.6%] vs that round's leader"; nothing where the
    arm was not eliminated in its world's race."""
    if not vs:
        return ""
    return f"{change(vs['ratio'], vs['lo'], vs['hi'])} vs that round's leader"


def traced_steps_words(counts: list[int]) -> str:
    """How many steps ``tune --trace`` traced of each setting, in the terminal and the report alike:
    "5 steps each", or "5 and 16 steps" where a setting's averaging window asked for more."""
    if len(set(counts)) == 1:
        return f"{counts[0]} steps each"
    return " and ".join(map(str, counts)) + " steps"


def rival_line(where: Mapping[str, Any]) -> str | None:
    """``tune --trace``'s closing line, in the terminal and the report alike: the rival against the
    recommended setting, part by part (``where["sentence"]``); None where no rival was traced."""
    if not where.get("sentence"):
        return None
    arms = where["arms"]
    return f"{arms[1]['label']} against {arms[0]['label']}: {where['sentence']}"


def decide_words(rounds: int | None, wall_s: float | None, repeats: int | None = None) -> str:
    """What an unresolved tune says before the command that would likely decide it, in the terminal
    and the report alike: the rounds, and at most about how long they would take here
    (``tune_answer._decide_wall_s``, which runs every arm still in reach for all of them; a race that
    decides sooner stops sooner); left out where the tune timed no steps. ``rounds`` None: the budget
    ended it before its first look, so there is no estimate, and the command gives the suite's
    rounds the time they take here. ``repeats``: the command's ``--set repeats``, said where it is more
    than ``rounds`` (this tune's own, kept), so that "about 30 rounds" beside "repeats=200" does not
    read as a mistake. "This tune's", not "the suite's": with ``--set repeats=30`` the tune's rounds
    are 30 where the suite's file may say 300."""
    took = ""
    if wall_s is not None and math.isfinite(wall_s):
        took = f"at most about {duration(wall_s)} here at this tune's pace; "
    if rounds is None:
        return f"To judge it, race again with the time its rounds take ({took}under the same launcher): "
    if repeats is not None and repeats > rounds:
        took = f"the command keeps this tune's {repeats} as the most; " + (took and f"{rounds} take {took}")
    return f"To decide it, race again from the start for about {rounds} rounds ({took}under the same launcher): "


def duration(seconds: float) -> str:
    """A wait in the unit a reader plans by: "45 s", "6 min", "5 h", "9 days" (a margin of 0.01 % asks
    for months of rounds, which "12855 min" hides)."""
    for unit, size, beyond in (("s", 1, 90), ("min", 60, 90 * 60), ("h", 3600, 48 * 3600)):
        if seconds < beyond:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds / 86400:.0f} days"


def sat_out(n: int) -> str:
    """Beside a tune arm's last retirement, in the terminal and the report alike, the rounds it sat out
    before it (``Arm.sat_out``: "… after round 42 (it sat out 24 of them: retired, then brought
    back)"): a retired arm is brought back when a later leader is not safe from it, so it may have run
    fewer rounds than the round it last went after, which its "rounds" column alone leaves unexplained."""
    return f" (it sat out {n} of them: retired, then brought back)" if n else ""


def brought_back(n: int) -> str:
    """The same for an arm with no retirement standing (still racing at the end, or eliminated while
    racing) that sat out ``n`` rounds: "retired, then brought back: it sat out 7 rounds"."""
    return f"retired, then brought back: it sat out {n} round{'s' if n != 1 else ''}" if n else ""


# A tune arm's training seconds to the target loss, the median over its rounds (``Arm.time_to_target_s``),
# as the terminal's table and the report's Recommendation table head and write it (``to_target``). The
# training note ranks the arms by this time (by the geometric mean, which its ratios compare), and without
# the column only the arms it names had one.
TO_TARGET = "to target s (median)"


def to_target(seconds: float | None) -> str:
    """An arm's ``TO_TARGET`` cell: three significant figures, as the note gives the times, or "—" where a
    round it ran never reached the target (None), one function so that the two tables cannot drift apart."""
    return "—" if seconds is None else f"{seconds:.3g}"


def few_repeats_note(repeats: Iterable[int | None]) -> str:
    """What a median's interval holds where a case ran too few repeats for its label: from 2 to 5 it is
    the repeats' range (``stats.range_confidence``), which the step-time tables and error bars showed as a
    95 % interval; the tour's 3 repeats hold the median with 75 % confidence. Empty where no case has so few."""
    few = sorted({int(n) for n in repeats if n is not None and n >= 2 and range_confidence(n) < CONFIDENCE})
    if not few:
        return ""
    held = "; ".join(f"{n} repeats: {percent(range_confidence(n))}" for n in few)
    fewest = next(n for n in range(2, 64) if range_confidence(n) >= CONFIDENCE)
    return (
        f"With fewer than {fewest} repeats a median's interval is the repeats' range, which holds the median with "
        f"less confidence than {percent(CONFIDENCE)} ({held})."
    )


# The share of bootstrap intervals of two single runs' ratio of medians that held the true ratio, by
# repeats a side (the fewer of the two), drawn log-normal: ``python benchmarks/ratio_coverage.py``
# (1000 trials a line, at sd 0.1 and 0.3 alike). From 5 repeats a side they held at least 95 %.
BOOTSTRAP_RATIO_HELD = {2: 0.69, 3: 0.90, 4: 0.93}


def few_repeats_ratio_note(repeats: Iterable[int]) -> str:
    """What the bootstrap interval of two single runs compared (``tpbench compare A B``, the report's
    Across runs) holds where a side ran fewer than 5 repeats (``repeats``: each case's fewer of the
    two): a percentile bootstrap draws from the few values there are, and with 3 and 3 (the README
    tour's) its "95%" interval held the ratio 90 % of the time. Empty where no case has so few."""
    few = sorted({n for n in repeats if n in BOOTSTRAP_RATIO_HELD})
    if not few:
        return ""
    held = "; ".join(f"{n} repeats: about {percent(BOOTSTRAP_RATIO_HELD[n])}" for n in few)
    return (
        f"With fewer than {max(BOOTSTRAP_RATIO_HELD) + 1} repeats a side the bootstrap interval of two runs holds "
        f"the ratio with less confidence than {percent(CONFIDENCE)} ({held}, simulated for log-normal repeats)."
    )


def repeat_counts(summary: Any) -> list[int | None]:
    """How many repeats each row of a summary table ran (its ``repeat_medians_ms``), in row order; None
    where it has none (a failed case, a summary older than the column)."""
    values = summary["repeat_medians_ms"] if "repeat_medians_ms" in summary else [None] * len(summary)
    return [len(v) if hasattr(v, "__len__") and not isinstance(v, str) else None for v in values]


def ms(x: float) -> str:
    """A step time as the verdicts print it: to three significant figures, trailing zeros kept
    ("17.0 ms/step", not "17 ms/step"; "100"; "0.500")."""
    return f"{x:.{_decimals(x)}f}"


def _decimals(x: float) -> int:
    """The decimals that give ``x`` three significant figures (one where it is zero or not finite)."""
    ref = abs(x)
    return max(0, 2 - math.floor(math.log10(ref))) if ref > 0 and math.isfinite(ref) else 1


def ms_interval(median: float, lo: float, hi: float) -> tuple[str, str, str]:
    """A median and its interval's ends as ``ms`` prints them, with one or two decimals more where
    three significant figures would print an end the same as the median it differs from ("178.2
    [177.9, 179.1]", not "178 [178, 179]", which reads as a median at its interval's edge)."""
    decimals = _decimals(median)
    for extra in range(3):
        shown = [f"{v:.{decimals + extra}f}" for v in (median, lo, hi)]
        if all(shown[0] != end or v == median for end, v in zip(shown[1:], (lo, hi))):
            break
    return shown[0], shown[1], shown[2]
