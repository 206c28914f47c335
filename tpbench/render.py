"""A comparison (``tpbench.compare``) as text for CI logs, Markdown for job summaries and PR
comments, or JSON for machines: what ``tpbench compare`` and ``tpbench gate`` write on stdout.

Every verdict is the call (what the exit code follows) with the words of ``tpbench.verdict``, the
report's too: "inconclusive: slower, not shown beyond the ±5% threshold", "inconclusive: no
difference shown, could only resolve ±12.0%", "pass: no difference shown, within the ±5% threshold";
the "resolves" column is each interval's half-width, the smallest change it could have told from
none. Runs compared case by case (``Comparison``) and the cases of one run compared pair by pair
(``WithinRun``) share the columns, the verdict words and the footer. ``EXPLAIN_RENDERERS`` write
``tpbench explain``'s reports (``tpbench.explain.Report``) in the same three forms."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from tpbench import explain, verdict
from tpbench.analysis.explain import detail_noun
from tpbench.compare import (
    IMPROVEMENT,
    INCOMPARABLE,
    INCONCLUSIVE,
    MISSING,
    PASS,
    REGRESSION,
    CasePair,
    CaseResult,
    Comparison,
    WithinRun,
)

Result = Comparison | WithinRun


def _ignored(differences: list[str]) -> list[str]:
    """The environment differences ``--ignore-env`` let through, a line each, as compare and explain say them."""
    return [f"environment differs, ignored (--ignore-env): {d}" for d in differences]


def _num(x: float | None) -> str:
    return "" if x is None or not math.isfinite(x) else verdict.ms(x)


def _resolves(r: CaseResult) -> str:
    """The half-width as "±3.1%" (``verdict.half_width_pct``; "" without an interval)."""
    hw = r.half_width
    return "" if hw is None or not math.isfinite(hw) else verdict.half_width_pct(hw)


def verdict_text(r: CaseResult) -> str:
    """The call with the verdict's words (``CaseResult.words``): "inconclusive: slower, not shown
    beyond the ±5% threshold"; the bare word where there are none (missing, incomparable)."""
    return f"{r.verdict}: {r.words}" if r.words and r.verdict not in (INCOMPARABLE, MISSING) else r.verdict


def _rounds(p: CasePair) -> str:
    """What a within-run interval rests on: "6 paired" rounds, or each side's repeats."""
    if p.method == "paired":
        return f"{p.result.pairs} paired"
    how = "unpaired" if p.method == "unpaired" else "no interval"
    return f"{how} {p.result.baseline_repeats}/{p.result.candidate_repeats}"


def _rows(c: Result) -> list[list[str]]:
    if isinstance(c, WithinRun):
        entries = [(p.result, _rounds(p)) for p in c.pairs]
    else:
        entries = [(r, f"{r.baseline_repeats}/{r.candidate_repeats}") for r in c.cases]
    rows = []
    for r, basis in entries:
        ci = f"[{verdict.change(r.ci_lo)}, {verdict.change(r.ci_hi)}]" if r.half_width is not None else ""
        rows.append(
            [
                r.label,
                _num(r.baseline_compared),
                _num(r.candidate_compared),
                verdict.change(r.ratio),
                ci,
                _resolves(r),
                basis,
                verdict_text(r),
                "" if r.reason and r.reason in r.words else r.reason,
            ]
        )
    return rows


def _header(c: Result) -> list[str]:
    within = isinstance(c, WithinRun)
    return [
        "comparison (baseline → candidate)" if within else "case",
        f"baseline {c.metric}",
        f"candidate {c.metric}",
        "change",
        f"{c.confidence:.0%} CI",
        "resolves",
        "rounds" if within else "repeats b/c",
        "verdict",
        "note",
    ]


def _preamble(c: Result) -> list[str]:
    if isinstance(c, WithinRun):
        return [
            f"metric {c.metric} (lower is better), threshold ±{c.threshold:.1%}, {c.confidence:.0%} t interval of the "
            "ratio of geometric means over repeats: paired by round for cases of one world, Welch otherwise; "
            "the baseline and candidate columns are those geometric means",
            f"run {c.run}, commit {c.commit}: pairs of cases that differ in one of {', '.join(c.keys) or 'no key'}",
        ]
    lines = [
        f"metric {c.metric} (lower is better), threshold ±{c.threshold:.1%}, "
        + {
            "rounds": f"{c.confidence:.0%} t interval of the ratio over paired rounds "
            "(geometric mean of per-round ratios of medians; the baseline and candidate columns: each side's "
            "geometric mean of its round medians)",
            "repeats": f"{c.confidence:.0%} t interval of the ratio over repeats paired in lockstep "
            "(geometric mean of per-pair ratios; the baseline and candidate columns: each side's geometric mean)",
        }.get(
            c.pairing,
            f"{c.confidence:.0%} bootstrap CI of the ratio of medians over repeats (the baseline and candidate "
            "columns: those medians)",
        ),
        f"baseline: {len(c.baseline_runs)} run(s), commit {', '.join(c.baseline_commits)}",
        f"candidate: {len(c.candidate_runs)} run(s), commit {', '.join(c.candidate_commits)}",
    ]
    lines += [note] if (note := _few_repeats(c)) else []
    lines += [c.suites_differ] if c.suites_differ else []
    lines += [f"environment differs: {d}" for d in c.environment_differences]
    lines += _ignored(c.ignored_environment_differences)
    return lines


def _few_repeats(c: Result) -> str:
    """``verdict.few_repeats_ratio_note`` of a comparison's bootstrap cases (``Comparison.bootstrap_repeats``):
    the heading above says 95 %, which 3 repeats a side do not hold. A run's own pairs are t intervals."""
    return "" if isinstance(c, WithinRun) else verdict.few_repeats_ratio_note(c.bootstrap_repeats())


def _footer(c: Result) -> str:
    counts: dict[str, int] = {}
    for r in c.cases:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
    tally = ", ".join(f"{n} {v}" for v, n in sorted(counts.items())) or "nothing to compare"
    widths = [r for r in c.cases if _resolves(r)]
    widest = ""
    if widths:
        worst = max(widths, key=lambda r: r.half_width or 0.0)
        widest = f"; the widest interval resolves {_resolves(worst)} ({worst.label})"
    return f"verdict: {c.verdict} ({tally}){widest}; exit code {c.exit_code}"


def render_text(c: Result) -> str:
    """A plain aligned table (no colour: it ends up in CI logs)."""
    table = [_header(c)] + _rows(c)
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    right = {1, 2, 3, 4, 5, 6}
    lines = _preamble(c) + [""]
    for row in table:
        cells = [cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines + _contributors(c) + _training(c) + _not_in_candidate(c) + ["", _footer(c)]) + "\n"


def _not_in_candidate(c: Result, bullet: str = "") -> list[str]:
    """The line naming the baseline's cases the candidate lacks (``Comparison.not_in_candidate``), if any."""
    names = c.not_in_candidate if isinstance(c, Comparison) else []
    said = "not in candidate (baseline cases it did not run, not judged)"
    return ["", f"{bullet}{said}: {', '.join(names)}"] if names else []


def _contributors(c: Result, bullet: str = "") -> list[str]:
    """One line per regression whose top contributor is known (``explain.annotate``): its interval is
    over the few traced steps, not the verdict's rounds, and the line says so."""
    named = [r for r in c.cases if r.top_contributor]
    said = "where the time went, over its traced steps (tpbench explain)"
    return ([""] if named else []) + [f"{bullet}{r.label}, {said}: {r.top_contributor}" for r in named]


def _training(c: Result, bullet: str = "") -> list[str]:
    """One line per pair of one run whose cases do not train alike (``CaseResult.training``): the verdict
    compared their steps, not how soon each reaches the target loss."""
    named = [r for r in c.cases if r.training]
    return ([""] if named else []) + [f"{bullet}{r.label}: {r.training}" for r in named]


_MARK = {
    REGRESSION: "🔴 **regression**",
    IMPROVEMENT: "🟢 improvement",
    PASS: "✅ pass",
    INCONCLUSIVE: "⚪ inconclusive",
    INCOMPARABLE: "⚠️ incomparable",
    MISSING: "⚠️ missing",
}


def render_markdown(c: Result, command: str = "tpbench compare") -> str:
    """For CI job summaries and PR comments: a headline (``command``: compare or gate), the table, the
    method in one line."""

    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    title = f"{command} (within one run)" if isinstance(c, WithinRun) else command
    lines = [f"### {title}: {_MARK[c.verdict]}", ""]
    if isinstance(c, Comparison) and c.answer is not None:
        lines.append(f"- {esc(c.answer.line)}")
    lines += [f"- {esc(line)}" for line in _preamble(c)]
    header = _header(c)
    lines += ["", "| " + " | ".join(header) + " |", "|" + "|".join(["---", *["---:"] * 6, "---", "---"]) + "|"]
    for row, r in zip(_rows(c), c.cases):
        row[7] = _MARK[r.verdict] + row[7].removeprefix(r.verdict)
        lines.append("| " + " | ".join(esc(x) for x in row) + " |")
    lines += [esc(line) for line in _contributors(c, "- ") + _training(c, "- ") + _not_in_candidate(c, "- ")]
    lines += ["", f"{_footer(c)}.", ""]
    return "\n".join(lines)


def render_json(c: Result) -> str:
    return json.dumps(c.to_dict(), indent=2, allow_nan=False, default=_json_default) + "\n"


def _json_default(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"{type(x).__name__} is not JSON serializable")


RENDERERS = {"text": render_text, "md": render_markdown, "json": render_json}


# ---------------------------------------------------------------- tpbench explain


def _ms(x: float) -> str:
    return f"{x:+.2f}" if math.isfinite(x) else "n/a"


# The exposed communication's split shows at most this many lines (the largest changes, in bucket
# order) and one line for the rest: a bucket cap of 10 KB builds one bucket per layer. JSON has them all.
MAX_DETAIL = 8


def _explain_rows(c: explain.CaseExplanation) -> list[list[str]]:
    e = c.explanation
    rows = [[p.name, _ms(p.delta_ms), f"[{_ms(p.lo)}, {_ms(p.hi)}]"] for p in e.components]
    largest = sorted(e.detail, key=lambda d: -abs(d.delta_ms))[:MAX_DETAIL]
    shown = [d for d in e.detail if d in largest]
    rows += [[f"  exposed_comm: {d.name}", _ms(d.delta_ms), f"[{_ms(d.lo)}, {_ms(d.hi)}]"] for d in shown]
    if rest := [d for d in e.detail if d not in largest]:
        more = f"  exposed_comm: {len(rest)} more {detail_noun(rest)}"
        rows.append([more, _ms(sum(d.delta_ms for d in rest)), "(--format json)"])
    rows.append(["step time", _ms(e.delta_ms), f"[{_ms(e.lo)}, {_ms(e.hi)}]"])
    return rows


def _explain_note(c: explain.CaseExplanation) -> str:
    e, t = c.explanation, c.traced
    return (
        f"timed steps {e.base_ms:.2f} → {e.cand_ms:.2f} ms (compare's figures, and its interval of the step "
        "time), split as the traced steps went "
        f"({t.base_ms:.2f} → {t.cand_ms:.2f} ms, {_ms(t.delta_ms)} ms over {t.base_steps}/{t.cand_steps} steps, "
        f"each side's parts scaled to its timed step; residual {e.residual_ms:+.3f} ms)"
        + (f"; DDP buckets {c.buckets[0]} → {c.buckets[1]}" if None not in c.buckets else "")
        + (f"; warning: {c.unlike_timed}" if c.unlike_timed else "")
    )


def _incomparable(r: explain.Report) -> list[str]:
    """The note above an explanation of runs whose environments differ, in compare's words, those
    ``--ignore-env`` set aside included."""
    ignored = _ignored(r.ignored_environment_differences)
    if not r.environment_differences:
        return ignored
    return [
        "incomparable: the environments differ, so a part may have moved with them (exit 3; --ignore-env KEY "
        "explains the runs as comparable)",
        *(f"environment differs: {d}" for d in r.environment_differences),
        *ignored,
    ]


def render_explain_text(r: explain.Report) -> str:
    """Per case: the sentence, then each part's change (ms per step) with its 95 % interval."""
    lines = [f"tpbench explain: baseline {r.baseline} → candidate {r.candidate}", *_incomparable(r)]
    lines += [r.suites_differ, ""] if r.suites_differ else [""]
    for c in r.cases:
        table = [["part", "change ms", "95% CI"], *_explain_rows(c)]
        widths = [max(len(row[i]) for row in table) for i in range(3)]
        lines += [f"{c.label} (case {c.case_id})", f"  {c.top}"]
        lines += [
            "  " + "  ".join([row[0].ljust(widths[0]), *(x.rjust(w) for x, w in zip(row[1:], widths[1:]))])
            for row in table
        ]
        lines += [f"  {_explain_note(c)}", ""]
    lines += [f"skipped {label}: {why}" for label, why in r.skipped.items()]
    return "\n".join(lines).rstrip() + "\n"


def render_explain_markdown(r: explain.Report) -> str:
    lines = ["### tpbench explain", "", f"baseline `{r.baseline}` → candidate `{r.candidate}`", ""]
    noted = _incomparable(r) + ([r.suites_differ] if r.suites_differ else [])
    lines += [f"- {line}" for line in noted] + ([""] if noted else [])
    for c in r.cases:
        lines += [f"#### {c.label}", "", c.top, "", "| part | change ms | 95% CI |", "|---|---:|---:|"]
        lines += ["| " + " | ".join(x.replace("|", "\\|") for x in row) + " |" for row in _explain_rows(c)]
        lines += ["", _explain_note(c) + ".", ""]
    lines += [f"- skipped {label}: {why}" for label, why in r.skipped.items()]
    return "\n".join(lines).rstrip() + "\n"


def render_explain_json(r: explain.Report) -> str:
    return json.dumps(_finite(r.to_dict()), indent=2, allow_nan=False, default=_json_default) + "\n"


def _finite(x: Any) -> Any:
    """NaN and infinities as null: JSON has no such numbers."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


EXPLAIN_RENDERERS = {"text": render_explain_text, "md": render_explain_markdown, "json": render_explain_json}
