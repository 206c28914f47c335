"""The summary's point and its interval are of one statistic (``stats.summarize``): the median of
the per-repeat values, which for post-local SGD are period-aware, and its bootstrap interval."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
from rich.console import Console
from synthetic_runs import make_run

from tpbench import store, sweep
from tpbench.analysis.stats import repeat_values, summarize
from tpbench.cli.sweep import _summary_table
from tpbench.report import data as report_data
from tpbench.report.verdicts import fastest_lines


def _steps(repeats: int = 6, steps: int = 16, period: int = 4) -> pd.DataFrame:
    """Post-local SGD's shape: every ``period``-th step also averages the model and costs 3× a
    plain one, so the median over steps drops that cost and the period-aware value keeps it."""
    rng = np.random.default_rng(0)
    rows = [
        {
            "case_id": "lsgd",
            "repeat": r,
            "rank": rank,
            "step": s,
            "phase": "timed",
            "step_ms": (30.0 if s % period == period - 1 else 10.0) * (1 + 0.02 * rng.standard_normal()),
        }
        for r in range(repeats)
        for rank in (0, 1)
        for s in range(steps)
    ]
    return pd.DataFrame(rows)


def test_the_point_is_the_statistic_its_interval_is_of():
    cases = pd.DataFrame(
        [
            {
                "case_id": "lsgd",
                "algorithm": "post_localSGD_hook",
                "start_localSGD_iter": 0,
                "averaging_period": 4,
                "batch_size": 8,
                "world_size": 2,
                "status": "done",
            }
        ]
    )
    steps = _steps()
    (row,) = summarize(steps, cases).to_dict("records")
    values = repeat_values(steps, windows={"lsgd": 4})["step_ms"]
    assert row["median_ms"] == np.median(values) and row["repeat_medians_ms"] == values.tolist()
    assert row["ci_lo_ms"] <= row["median_ms"] <= row["ci_hi_ms"]
    # The period-aware value holds the averaging step's cost (mean of 10, 10, 10, 30 = 15 ms); the
    # pooled median over steps, kept under its own name, does not, and lies outside the interval.
    assert abs(row["median_ms"] - 15.0) < 0.5 and abs(row["step_median_ms"] - 10.0) < 0.5
    assert row["step_median_ms"] < row["ci_lo_ms"]
    assert row["samples_per_s"] == 8 * 2 / (row["median_ms"] / 1e3)


def test_one_repeat_has_no_interval_rather_than_one_of_no_width():
    """One value resamples only to itself: "[7.91, 7.91]" would say the step time is known exactly."""
    cases = pd.DataFrame([{"case_id": "lsgd", "algorithm": "ddp", "batch_size": 8, "world_size": 2, "status": "done"}])
    (row,) = summarize(_steps(repeats=1), cases).to_dict("records")
    assert np.isfinite(row["median_ms"]) and np.isnan(row["ci_lo_ms"]) and np.isnan(row["ci_hi_ms"])
    (two,) = summarize(_steps(repeats=2), cases).to_dict("records")
    assert two["ci_lo_ms"] < two["ci_hi_ms"]


def test_one_repeat_is_shown_without_an_interval_in_the_table_and_the_verdict(tmp_path):
    loaded = sweep.finalize(store.Run.open(make_run(tmp_path, {"ddp": [10.0], "zero_no_overlap": [20.0]})))
    console = Console(record=True, width=200)
    console.print(_summary_table(loaded))
    rows = [line for line in console.export_text().splitlines() if "ddp" in line or "zero_no_overlap" in line]
    assert len(rows) == 2 and all("—" in r and "nan" not in r and "[" not in r for r in rows), rows
    (line,) = fastest_lines(report_data.load([loaded]), alone=False)
    assert "ms/step (one repeat, no interval)" in line and "nan" not in line, line


def test_the_tables_caption_is_left_justified_in_a_file(tmp_path):
    """Written to a file (``tpbench sweep ... > out.txt``: 160 columns, no terminal), the caption,
    wrapped to the table's width, was centred under it: its second line began 7 spaces in. Its lines
    now start at the table's left edge and read as the caption's words in order."""
    loaded = sweep.finalize(store.Run.open(make_run(tmp_path, {"ddp": [10.0, 10.2], "zero_no_overlap": [20.0, 20.1]})))
    file = io.StringIO()
    Console(file=file, width=160, highlight=False).print(_summary_table(loaded))
    lines = file.getvalue().splitlines()
    caption = lines[next(i for i, line in enumerate(lines) if line.startswith("└")) + 1 :]
    assert len(caption) > 1 and all(line and not line.startswith(" ") for line in caption), caption
    assert " ".join(line.strip() for line in caption).startswith("ms/step: the median of the repeats' values")


def test_a_median_interval_of_fewer_than_six_repeats_is_their_range_and_says_its_confidence(tmp_path):
    """With 2 to 5 repeats the percentile bootstrap interval of the median is exactly the repeats'
    range, which holds the median only when they do not all fall on one side of it: 50 % of the time
    with 2, 75 % with the README tour's 3, never 95 %. The terminal's table and the report's step-time
    caption, which call it a 95% CI, say so; from 6 repeats on they say nothing more."""
    from tpbench import verdict
    from tpbench.analysis.stats import bootstrap_ci, range_confidence
    from tpbench.report import performance

    rng = np.random.default_rng(1)
    for n in range(2, 6):
        values = rng.normal(100, 5, n)
        assert bootstrap_ci(values) == (values.min(), values.max())
    assert [range_confidence(n) for n in (2, 3, 5, 6)] == [0.5, 0.75, 0.9375, 0.96875]
    assert verdict.few_repeats_note([3, 3, 12]) == (
        "With fewer than 6 repeats a median's interval is the repeats' range, which holds the median with less "
        "confidence than 95% (3 repeats: 75%)."
    )
    assert verdict.few_repeats_note([1, 6, 12]) == ""
    loaded = sweep.finalize(store.Run.open(make_run(tmp_path / "few", {"ddp": [10.0, 11.0, 12.0]})))
    console = Console(file=io.StringIO(), width=400)
    console.print(_summary_table(loaded))
    assert "(3 repeats: 75%)." in " ".join(console.file.getvalue().split())  # the caption wraps at the table's width
    assert "(3 repeats: 75%)" in performance.step_time_caption(report_data.load([loaded]).done)


def test_the_verdicts_say_what_the_fastest_cases_own_interval_is(tmp_path):
    """The Verdicts' note called every interval there a 95% t interval over rounds; the Fastest line's
    bracket beside its step time is its median's, a bootstrap CI, and with the README tour's 3 repeats
    their range, which holds the median with 75 % confidence: the note says both, as the step-time
    caption does, and from 6 repeats on only the first."""
    import html
    import re

    from tpbench.report.build import build_report

    def note(name: str, repeats: int) -> str:
        values = {"ddp": [10.0 + i / 10 for i in range(repeats)], "zero_no_overlap": [20.0 + i for i in range(repeats)]}
        loaded = sweep.finalize(store.Run.open(make_run(tmp_path / name, values)))
        page = html.unescape(build_report([loaded], tmp_path))
        (said,) = re.findall(r"Verdicts compare [^<]*", page)
        return said

    few, many = note("few", 3), note("many", 6)
    own = "own step time in these lines (the fastest, or a setting's only case) carries its median's 95% bootstrap CI"
    assert own in few and "(3 repeats: 75%)" in few
    assert own in many and "repeats:" not in many


def test_the_tables_interval_column_is_called_a_95_ci_only_where_every_row_holds_one(tmp_path):
    """The README tour's 3 repeats printed their range under a "95% CI" header, the caption below it
    saying that range holds the median with 75 % confidence; the header now says "interval" where a
    row's interval is a range of 2 to 5 repeats, and "95% CI" from 6 repeats on."""

    def header(name: str, repeats: int) -> tuple[str, str]:
        values = {"ddp": [10.0 + i / 10 for i in range(repeats)], "zero_no_overlap": [20.0 + i for i in range(repeats)]}
        loaded = sweep.finalize(store.Run.open(make_run(tmp_path / name, values)))
        console = Console(file=io.StringIO(), width=400)
        console.print(_summary_table(loaded))
        lines = console.file.getvalue().splitlines()
        caption = next(line for line in lines if line.startswith("ms/step: "))
        return next(line for line in lines if "ms/step" in line and "case" in line), caption

    (few, few_caption), (enough, enough_caption) = header("few", 3), header("enough", 6)
    assert "95% CI" not in few and "interval" in few, few
    assert "95% CI" in enough and "interval" not in enough, enough
    # The caption names it as the header does (it said "the 95% CI of that median" above "interval").
    assert "with an interval of that median" in few_caption and "95% CI" not in few_caption, few_caption
    assert "with the 95% CI of that median" in enough_caption, enough_caption
