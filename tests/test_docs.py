"""The documentation in the repository: its relative links resolve and it points nowhere outside the repository,
neither to a file beside the tree nor to a web address.

A moved or renamed page, module or example breaks a link silently on GitHub; these tests catch it. The project's
docs are self-contained, so nothing may send a reader to a design file outside the tree.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The examples' own READMEs too: docs/ links into examples/, and an example's page moves with its folder.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").glob("**/README.md"))]
# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
OUTSIDE = re.compile(r"DESIGN\.md|\.\./shared")
# A web address in prose: a scheme (https://, chrome://), www., or a host name ending in a common top-level domain
# (ui.perfetto.dev). The docs name the tools and papers they cite; they link to none of them.
WEB = re.compile(r"\b[a-z][a-z0-9+.-]*://|\bwww\.|\b[a-z0-9-]+(?:\.[a-z0-9-]+)*\.(?:com|org|net|io|dev|ai)\b", re.I)
# What the last test reads: the project's text files, not outputs, environments or hidden folders.
TEXT = {".py", ".md", ".toml", ".sh", ".yml", ".yaml", ".txt", ".cfg", ".json", ""}
SKIP = {"results", "reports", "build", "dist"}


def relative_links(page: Path) -> list[str]:
    """Links to files of the repository (not web addresses or in-page anchors), outside code blocks."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lowercase, punctuation dropped, spaces to hyphens."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    heads = re.findall(r"^#+\s+(.+?)\s*$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def test_there_are_pages_and_links():
    assert (ROOT / "docs" / "architecture.md") in PAGES
    assert (ROOT / "examples" / "slurm" / "README.md") in PAGES
    assert sum(len(relative_links(p)) for p in PAGES) > 20


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve()
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif not dest.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_in_page_anchors_resolve(page: Path):
    """A `[text](#heading)` link to this page's own heading: renaming the heading breaks it as silently."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    own = anchors(page)
    broken = [t for t in LINK.findall(text) if t.startswith("#") and t[1:] not in own]
    assert not broken, f"{page.relative_to(ROOT)}: no heading for " + ", ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_give_no_web_address(page: Path):
    """The docs are self-contained: a page says what a tool or paper is by name, never where on the web it lives
    (code blocks included: a command that fetches from the web would point outside too)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    hits = [f"{n}: {m.group(0)}" for n, line in enumerate(lines, 1) for m in WEB.finditer(line)]
    assert not hits, f"{page.relative_to(ROOT)}: " + "; ".join(hits)


def test_the_web_address_finder_finds_them():
    for address in ("https://example.com/x", "see www.example", "open ui.perfetto.dev", "chrome://tracing"):
        assert WEB.search(address), address
    for name in ("plotly.js", "store.Run.case_done", "tpbench.load", "results/zero/run.json", "tcp-2.5gbit", "e.g. x"):
        assert not WEB.search(name), name


def test_pages_keep_within_120_columns():
    long = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in PAGES
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if len(line) > 120
    ]
    assert not long, long


def test_nothing_points_outside_the_repository():
    hits = []
    for path in ROOT.rglob("*"):
        parts = path.relative_to(ROOT).parts
        generated = parts[0] in SKIP or parts[0].endswith(".egg-info") or "__pycache__" in parts
        if generated or any(p.startswith(".") for p in parts) or path.suffix not in TEXT or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        hits += [f"{path.relative_to(ROOT)}:{n}" for n, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)]
    assert hits == []


def test_the_architecture_names_exactly_the_fingerprint_keys_that_compare_judges():
    """architecture.md said runs whose "fingerprints differ" are incomparable, which reads as if hostname,
    Python or platform counted; only ``environment.COMPARABLE_KEYS`` do. The page names them all, and
    the keys it says are not compared are none of them."""
    from tpbench.environment import COMPARABLE_KEYS

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    sentence = re.search(r"Only its `COMPARABLE_KEYS` make two runs incomparable: ([^.]+)\.", text)
    assert sentence, "architecture.md no longer names the keys compare judges"
    assert set(re.findall(r"`(\w+)`", sentence.group(1))) == set(COMPARABLE_KEYS)
    rest = re.search(r"The rest, ([^.]+?), is recorded to explain a difference, never compared", text)
    assert rest and not {k for k in COMPARABLE_KEYS if k in rest.group(1).replace(" ", "_").lower()}
