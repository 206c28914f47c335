"""The report in a real headless Chromium: the report of a real 2-rank Gloo sweep opens with no
JavaScript error, every plotly figure draws, nothing is fetched from the network, and markup in
user text stays text. A full-page screenshot goes to ``test-artifacts/`` for people to look at.

``make test`` installs Debian's chromium when it is missing and we are root; these tests install
it the same way when run directly, and skip only where it is neither there nor installable.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from browser import ALL_FIGURES_DRAWN, Browser, ensure_chromium
from conftest import run_cli
from synthetic_runs import ENVIRONMENT, make_run
from test_report import hostile_copy, synth_run

from tpbench import report, store
from tpbench.sweep import finalize

pytestmark = pytest.mark.ranks  # starts rank processes: not in `make test-fast`

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="module")
def chromium() -> str:
    path = ensure_chromium()
    if path is None:
        pytest.skip(
            "no chromium found, and it cannot be installed here (not root, or no apt-get): "
            "install Debian's chromium package to run the browser tests"
        )
    return path


@pytest.fixture(scope="module")
def browser(chromium):
    with Browser(chromium) as b:
        yield b


@pytest.fixture(scope="module")
def smoke_run(traced_tiny_run) -> Path:
    """A real sweep: 2 Gloo ranks, 2 cases, 2 repeats, traced steps (conftest's, test_capture_sweep.py's
    too; its own report is not used: each test writes the report it looks at)."""
    loaded = traced_tiny_run
    assert loaded.record.status == "complete" and set(loaded.cases["status"]) == {"done"}, loaded.record.cases
    run_dir = loaded.run_dir
    # The sweep parsed the traces into the tables the report reads (it never opens a trace itself).
    assert all(
        store.read_case_table(run_dir, cid, "intervals") is not None for cid in store.read_run_json(run_dir)["cases"]
    )
    return run_dir


def figures(browser: Browser) -> tuple[int, int]:
    """(figures on the page, figures plotly drew: an svg.main-svg inside)."""
    total = browser.evaluate("document.querySelectorAll('.js-plotly-plot, div.figure').length")
    drawn = browser.evaluate(
        "[...document.querySelectorAll('div.figure')].filter(d => d.querySelector('svg.main-svg')).length"
    )
    return total, drawn


def test_smoke_report_renders_every_figure_without_errors(browser, smoke_run, tmp_path):
    out = report.write_report([smoke_run], tmp_path / "smoke.html")
    page = browser.load(out)
    assert page.errors == []
    assert page.dialogs == []
    total, drawn = figures(browser)
    # step time, overlap, one timeline per algorithm, collectives, memory
    assert total >= 6 and drawn == total
    assert browser.evaluate(ALL_FIGURES_DRAWN)
    text = browser.evaluate("document.body.innerText")
    for heading in (
        "Verdicts",
        "Environment",
        "Step time",
        "Overlap, exposed communication and idle time",
        "Timeline of one step",
        "Collectives",
        "Memory per rank",
        "All cases",
        "Raw traces",
    ):
        assert heading in text
    # It names the trace viewers and points at none of them: the project points at nothing outside itself.
    assert "Perfetto's trace viewer" in text and "perfetto.dev" not in text and "chrome://" not in text
    assert browser.evaluate("document.querySelectorAll('a[href$=\".json.gz\"]').length") == 4  # 2 cases x 2 ranks
    shot = browser.screenshot(ARTIFACTS / "report-smoke.png")
    assert shot.stat().st_size > 50_000


def test_report_makes_no_network_request(browser, smoke_run, tmp_path):
    out = report.write_report([smoke_run], tmp_path / "offline.html")
    page = browser.load(out)
    # In-document data: URLs (plotly draws heatmaps as images) never leave the page.
    fetched = [u for u in page.requests if u != page.url and not u.startswith(("data:", "blob:"))]
    assert fetched == []
    assert page.requests[0] == page.url


def test_markup_in_user_text_renders_as_text(browser, smoke_run, tmp_path):
    hostile = hostile_copy(smoke_run, tmp_path / "hostile")
    out = report.write_report([hostile], tmp_path / "hostile.html")
    page = browser.load(out)
    assert page.dialogs == []  # no alert() ran
    assert page.errors == []
    text = browser.evaluate("document.body.innerText")
    assert "<script>alert(1)</script>" in text  # the suite name, as typed
    assert "<img src=y onerror=alert(4)>" in text  # a failure's cause
    assert browser.evaluate("document.querySelectorAll('img').length") == 0
    assert (
        browser.evaluate("document.querySelectorAll('body script').length") == figures(browser)[0]
    )  # one per figure, nothing else
    # Inside the figures (legend, ticks, hover labels are SVG text): shown literally, not as bold markup.
    svg_text = browser.evaluate("[...document.querySelectorAll('svg text')].map(t => t.textContent).join('\\n')")
    assert "<b>lo</b><script>alert(3)</script>" in svg_text
    browser.screenshot(ARTIFACTS / "report-hostile.png", max_height=3000)


def test_several_runs_in_one_report(browser, smoke_run, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(smoke_run, other)
    meta = json.loads((other / "run.json").read_text())
    meta["run_id"] += "b"
    meta["environment"]["torch"] = "9.9.9"
    (other / "run.json").write_text(json.dumps(meta))
    out = tmp_path / "compare.html"
    # The CLI in this process: a fresh interpreter would spend seconds importing torch.
    assert run_cli(["report", str(smoke_run), str(other), "-o", str(out)]) == 0
    page = browser.load(out)
    assert page.errors == [] and page.dialogs == []
    total, drawn = figures(browser)
    assert total >= 6 and drawn == total
    text = browser.evaluate("document.body.innerText")
    assert "Across runs" in text and "B · torch 9.9.9" in text
    browser.screenshot(ARTIFACTS / "report-compare.png", max_height=6000)


@pytest.fixture(scope="module")
def synthetic_runs(tmp_path_factory) -> dict[str, Path]:
    """What a CPU sweep here cannot produce in seconds: a ZeRO sweep over bucket sizes, shard_buckets
    and interconnects with NVML samples, and a post-local SGD sweep with held-out losses and drift."""
    root = tmp_path_factory.mktemp("synthetic")
    return {
        "zero": synth_run.make_run(
            root, buckets=(1, 4, 16), interconnects=("loopback", "tcp-1gbit"), repeats=2, steps=6
        ),
        "localsgd": synth_run.make_localsgd_run(root, steps=60, repeats=2),
    }


@pytest.mark.parametrize(
    "which, sections",
    [
        (
            "zero",
            [
                "Speedups",
                "Overlap, exposed communication and idle time",
                "Timeline of one step",
                "Collectives",
                "GPU telemetry",
                "Memory per rank",
                "All comparisons",
                "Failed cases (1)",
            ],
        ),
        ("localsgd", ["Convergence", "Time to target", "Parameter drift before averaging"]),
    ],
)
def test_every_section_renders(browser, synthetic_runs, tmp_path, which, sections):
    out = report.write_report([synthetic_runs[which]], tmp_path / f"{which}.html")
    page = browser.load(out)
    assert page.errors == [] and page.dialogs == []
    total, drawn = figures(browser)
    assert total >= 4 and drawn == total
    text = browser.evaluate("document.body.innerText")
    for heading in sections:
        assert heading in text
    browser.screenshot(ARTIFACTS / f"report-synthetic-{which}.png")


# The "All comparisons" table of a report on several runs: its wrapper, the table, and where its last column ends.
COMPARISONS_TABLE = """(() => {
  let el = document.getElementById('comparisons').nextElementSibling;
  while (!el.classList.contains('wide')) el = el.nextElementSibling;
  const verdict = [...el.querySelectorAll('th')].pop();
  return {client: el.clientWidth, scroll: el.scrollWidth, head: verdict.innerText,
          right: verdict.getBoundingClientRect().right, page: window.innerWidth};
})()"""


def test_several_runs_comparisons_table_shows_its_verdict_on_a_1400px_page(browser, tmp_path):
    """Each row named its run by the whole tag ("A · commit 0123456789+dirty"): beside the ZeRO
    settings' long labels the table outgrew a 1400 px page and its last column, the verdict, was cut
    off behind a horizontal scroll. The run column now holds the letter alone."""
    medians = {"zero_no_overlap": [100.0] * 4, "hook_with_zero_step": [90.0] * 4}
    medians["hook_with_zero_step_interleaved"] = [95.0] * 4
    swept = {"shard_buckets": "[false, true]", "parameters_as_bucket_view": "[false, true]"}
    runs = []
    for name, commit in (("a", "0123456789abcdef"), ("b", "fedcba9876543210")):
        env = ENVIRONMENT | {"git": {"commit": commit, "dirty": True}}
        runs.append(make_run(tmp_path / name, medians, sweep=swept, environment=env, seed=len(runs)))
        finalize(store.Run.open(runs[-1]))  # the summary, as a sweep leaves it
    page = browser.load(report.write_report(runs, tmp_path / "several.html"))
    assert page.errors == []
    table = browser.evaluate(COMPARISONS_TABLE)
    assert table["page"] == 1400 and table["head"] == "verdict"
    assert table["scroll"] <= table["client"] and table["right"] <= table["page"], table
    text = browser.evaluate("document.body.innerText")
    assert "run: the run's letter, as the Environment table's columns name the runs" in text


# Per cell of the All comparisons table's 95% CI column: the lines its text takes on the page.
INTERVAL_LINES = """(() => {
  let el = document.getElementById('comparisons').nextElementSibling;
  while (!el.classList.contains('wide')) el = el.nextElementSibling;
  const column = [...el.querySelectorAll('th')].findIndex(th => th.innerText === '95% CI');
  return [...el.querySelectorAll('tbody tr')].map(tr => {
    const text = document.createTreeWalker(tr.children[column], NodeFilter.SHOW_TEXT).nextNode();
    const range = document.createRange();
    range.selectNodeContents(text);
    return [text.textContent, range.getClientRects().length];
  });
})()"""


def test_an_interval_stays_on_one_line_in_a_narrow_column_on_a_1400px_page(browser, tmp_path):
    """Beside the ZeRO settings' long labels the All comparisons table's 95% CI column is narrow,
    and each interval broke at its comma, "[0.86," over "1.20]": two numbers, at a glance. The what-if's
    projections ("32.3 [20.4, 127.5]") broke alike; every table keeps an interval on one line
    (``html.Page.table``)."""
    medians = {"zero_no_overlap": [100.0] * 4, "hook_with_zero_step": [90.0] * 4}
    medians["hook_with_zero_step_interleaved"] = [95.0] * 4
    swept = {"shard_buckets": "[false, true]", "parameters_as_bucket_view": "[false, true]"}
    run = make_run(tmp_path / "a", medians, sweep=swept, jitter=0.2)
    finalize(store.Run.open(run))
    page = browser.load(report.write_report([run], tmp_path / "narrow.html"))
    assert page.errors == []
    cells = browser.evaluate(INTERVAL_LINES)
    assert cells and all(text.startswith("[") for text, _ in cells), cells
    assert all(lines == 1 for _, lines in cells), cells
