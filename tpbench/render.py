"""A comparison (``tpbench.compare``) as text for CI logs, Markdown for job summaries and PR
comments, or JSON for machines: what ``tpbench compare`` and ``tpbench gate`` write on stdout."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from tpbench.compare import IMPROVEMENT, INCOMPARABLE, INCONCLUSIVE, MISSING, PASS, REGRESSION, Comparison


def _pct(x: float | None) -> str:
    return "" if x is None or not math.isfinite(x) else f"{(x - 1) * 100:+.1f}%"


def _num(x: float | None) -> str:
    return "" if x is None or not math.isfinite(x) else f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def _rows(c: Comparison) -> list[list[str]]:
    rows = []
    for r in c.cases:
        ci = f"[{_pct(r.ci_lo)}, {_pct(r.ci_hi)}]" if r.ci_lo is not None else ""
        reps = f"{r.baseline_repeats}/{r.candidate_repeats}"
        rows.append(
            [r.label, _num(r.baseline_median), _num(r.candidate_median), _pct(r.ratio), ci, reps, r.verdict, r.reason]
        )
    return rows


def _header(c: Comparison) -> list[str]:
    return [
        "case",
        f"baseline {c.metric}",
        f"candidate {c.metric}",
        "change",
        f"{c.confidence:.0%} CI",
        "repeats b/c",
        "verdict",
        "note",
    ]


def _preamble(c: Comparison) -> list[str]:
    lines = [
        f"metric {c.metric} (lower is better), threshold ±{c.threshold:.1%}, "
        + {
            "rounds": f"{c.confidence:.0%} t interval of the ratio over paired rounds "
            "(geometric mean of per-round ratios of medians)",
            "repeats": f"{c.confidence:.0%} t interval of the ratio over repeats paired in lockstep "
            "(geometric mean of per-pair ratios)",
        }.get(c.pairing, f"{c.confidence:.0%} bootstrap CI of the ratio of medians over repeats"),
        f"baseline: {len(c.baseline_runs)} run(s), commit {', '.join(c.baseline_commits)}",
        f"candidate: {len(c.candidate_runs)} run(s), commit {', '.join(c.candidate_commits)}",
    ]
    lines += [f"environment differs: {d}" for d in c.environment_differences]
    return lines


def _footer(c: Comparison) -> str:
    counts = {}
    for r in c.cases:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
    tally = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
    return f"verdict: {c.verdict} ({tally}); exit code {c.exit_code}"


def render_text(c: Comparison) -> str:
    """A plain aligned table (no colour: it ends up in CI logs)."""
    table = [_header(c)] + _rows(c)
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    right = {1, 2, 3, 4, 5}
    lines = _preamble(c) + [""]
    for row in table:
        cells = [cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines + ["", _footer(c)]) + "\n"


_MARK = {
    REGRESSION: "🔴 **regression**",
    IMPROVEMENT: "🟢 improvement",
    PASS: "✅ pass",
    INCONCLUSIVE: "⚪ inconclusive",
    INCOMPARABLE: "⚠️ incomparable",
    MISSING: "⚠️ missing",
}


def render_markdown(c: Comparison) -> str:
    """For CI job summaries and PR comments: a headline, the table, the method in one line."""

    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    lines = [f"### tpbench gate: {_MARK[c.verdict]}", ""]
    lines += [f"- {esc(line)}" for line in _preamble(c)]
    header = _header(c)
    lines += ["", "| " + " | ".join(header) + " |", "|" + "|".join(["---", *["---:"] * 5, "---", "---"]) + "|"]
    for row, r in zip(_rows(c), c.cases):
        row[6] = _MARK[r.verdict]
        lines.append("| " + " | ".join(esc(x) for x in row) + " |")
    lines += ["", f"{_footer(c)}.", ""]
    return "\n".join(lines)


def render_json(c: Comparison) -> str:
    return json.dumps(c.to_dict(), indent=2, allow_nan=False, default=_json_default) + "\n"


def _json_default(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"{type(x).__name__} is not JSON serializable")


RENDERERS = {"text": render_text, "md": render_markdown, "json": render_json}
