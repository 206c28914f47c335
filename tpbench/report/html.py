"""Page assembly: sections of escaped text, tables and plotly figures in one offline HTML file.

Two kinds of escaping, because user text (suite names, descriptions, case parameters, error
messages) reaches the page two ways:

- into HTML markup: through ``esc`` or pandas' escaping table writer;
- into plotly figures, as JSON data: plotly.py already writes ``<`` as ``\\u003c`` there, so the
  JSON cannot close its ``<script>``; but plotly.js renders a small HTML-like markup in labels
  (``<b>``, ``<br>``, ``<a href>``), so ``plot_text`` turns ``&``, ``<`` and ``>`` into the
  entities plotly.js decodes back to literal characters: a parameter ``<b>x</b>`` shows as typed.

plotly.js itself is inlined exactly once, in the head, so the file opens with no network at all.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import plotly.io as pio
import plotly.offline
from plotly.io.json import to_json_plotly

_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 0 auto; max-width: 1280px;
       padding: 1.5rem; color: #1d2330; }
h1 { margin-bottom: 0.2rem; } h2 { border-bottom: 1px solid #d9dde5; padding-bottom: 0.3rem; margin-top: 2.2rem; }
h3 { margin-top: 1.4rem; }
nav.toc { font-size: 0.9rem; margin: 0.8rem 0; } nav.toc a { margin-right: 0.9rem; white-space: nowrap; }
.muted { color: #5b6475; } .verdicts li { margin: 0.35rem 0; font-size: 1.05rem; }
table { border-collapse: collapse; font-size: 0.85rem; margin: 0.5rem 0; }
th, td { border: 1px solid #d9dde5; padding: 0.25rem 0.5rem; text-align: left; vertical-align: top; }
th { background: #f3f5f9; }
.wide { overflow-x: auto; } .scroll { max-height: 32rem; overflow: auto; }
pre { background: #f7f7f9; padding: 0.5rem; overflow-x: auto; font-size: 0.8rem; max-height: 20rem; }
.failed { color: #a4262c; } .warn { color: #8a5300; } .interval { white-space: nowrap; }
"""

# An interval as the tables write it, "[0.86, 1.20]" or "[+1.0%, +17.6%]": two short parts, no markup;
# with the figure it bounds where one comes first ("0.30× [0.23, 0.40]", "32.3 [20.4, 127.5]"): a narrow
# column broke between the two, leaving the interval alone on the next line as if it were a cell of its own.
_INTERVAL = re.compile(r"(?:[-+−]?\d[\d.,]*[×%]? )?\[[^\[\]<>,]{1,24}, [^\[\]<>,]{1,24}\]")


def esc(text: object) -> str:
    """User text for HTML markup (element content or a quoted attribute)."""
    return html.escape(str(text), quote=True)


def plot_text(text: object) -> str:
    """User text for a plotly label, title, tick or hover: shown literally, never as markup."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cell(v: object, float_format: str) -> str:
    """Missing values blank (None, NaN, pd.NA alike), floats short, counts and big numbers whole."""
    if v is None or (not isinstance(v, (str, bytes, list, tuple, dict)) and pd.api.types.is_scalar(v) and pd.isna(v)):
        return ""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float) and (abs(v) >= 1000 or v.is_integer()) and abs(v) < 1e15:
        return f"{v:,.0f}"
    if isinstance(v, float):
        return float_format.format(v)
    return str(v)


@dataclass
class Page:
    title: str
    parts: list[str] = field(default_factory=list)
    toc: list[tuple[str, str]] = field(default_factory=list)
    figures: int = 0

    def heading(self, text: str, level: int = 2, anchor: str | None = None) -> None:
        """A heading; level-2 headings with an anchor also go into the table of contents."""
        a = f' id="{esc(anchor)}"' if anchor else ""
        if anchor and level == 2:
            self.toc.append((anchor, text))
        self.parts.append(f"<h{level}{a}>{esc(text)}</h{level}>")

    def paragraph(self, text: str, css: str | None = None) -> None:
        c = f' class="{esc(css)}"' if css else ""
        self.parts.append(f"<p{c}>{esc(text)}</p>")

    def bullets(self, items: list[str], css: str | None = None) -> None:
        c = f' class="{esc(css)}"' if css else ""
        self.parts.append(f"<ul{c}>" + "".join(f"<li>{esc(i)}</li>" for i in items) + "</ul>")

    def table(self, df: pd.DataFrame, float_format: str = "{:.3g}", scroll: bool = False) -> None:
        """A DataFrame as an escaped HTML table; long tables scroll inside a box. Each interval in it
        is kept on one line with the figure before it (``_INTERVAL``): a narrow column broke
        "[0.86,⏎1.20]" at its comma, which reads as two numbers."""
        # Every cell through ``_cell``: pandas' own formatters skip a column of None only, printing "None".
        body = df.map(lambda v: _cell(v, float_format)).to_html(index=False, escape=True, border=0)
        body = _INTERVAL.sub(lambda m: f'<span class="interval">{m[0]}</span>', body)
        self.parts.append(f'<div class="{"wide scroll" if scroll else "wide"}">{body}</div>')

    def details(self, summary: str, text: str) -> None:
        """Long text (a log tail, the suite file) folded away until clicked."""
        self.parts.append(f"<details><summary>{esc(summary)}</summary><pre>{esc(text)}</pre></details>")

    def details_list(self, summary: str, items: list[str]) -> None:
        """Bullets folded away until clicked."""
        lis = "".join(f"<li>{esc(i)}</li>" for i in items)
        self.parts.append(f'<details><summary>{esc(summary)}</summary><ul class="verdicts">{lis}</ul></details>')

    def link(self, href: str, text: str) -> str:
        return f'<a href="{esc(href)}">{esc(text)}</a>'

    def raw_list(self, html_items: list[str]) -> None:
        """Items already built from escaped parts (e.g. with ``link``)."""
        self.parts.append("<ul>" + "".join(f"<li>{i}</li>" for i in html_items) + "</ul>")

    def figure(self, fig: go.Figure) -> None:
        """A figure as its JSON and one call of the page's ``tpbPlot``: the template travels once
        per page (see ``render``), not once per figure."""
        self.figures += 1
        spec = fig.to_plotly_json()
        layout = spec.get("layout", {})
        layout.pop("template", None)
        payload = to_json_plotly({"data": spec.get("data", []), "layout": layout})  # "<" etc. escaped: script-safe
        div = f"fig{self.figures}"
        self.parts.append(
            f'<div id="{div}" class="figure" style="height:{int(layout.get("height", 450))}px"></div>'
            f'<script>tpbPlot("{div}", {payload});</script>'
        )

    def render(self) -> str:
        nav = ""
        if self.toc:
            nav = '<nav class="toc">' + " ".join(f'<a href="#{esc(a)}">{esc(t)}</a>' for a, t in self.toc) + "</nav>"
        body = list(self.parts)
        # The table of contents goes after the title block (the first heading and its run lines).
        at = next((i for i, p in enumerate(body) if p.startswith("<h2")), len(body))
        body.insert(at, nav)
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{esc(self.title)}</title><style>{_CSS}</style>"
            f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>'
            f"<script>{_plot_function()}</script></head><body>" + "\n".join(body) + "</body></html>\n"
        )


# The template every figure is drawn with, in the browser (``tpbPlot``).
PAGE_TEMPLATE = "plotly_white"


def _plot_function() -> str:
    """``tpbPlot(id, figure)``: draws a figure with the page's one template."""
    template = pio.templates[PAGE_TEMPLATE].to_plotly_json()
    template["layout"]["font"] = {"family": "system-ui, sans-serif", "size": 12}
    config = {"displaylogo": False, "responsive": True}
    return (
        f"const TPB_TEMPLATE = {to_json_plotly(template)}; const TPB_CONFIG = {to_json_plotly(config)};\n"
        "function tpbPlot(id, fig) { fig.layout.template = TPB_TEMPLATE; "
        "Plotly.newPlot(id, fig.data, fig.layout, TPB_CONFIG); }"
    )


@contextmanager
def plain_templates() -> Iterator[None]:
    """Build figures without plotly's default template. Every figure object otherwise deep-copies
    it on creation (the larger part of building a report of a hundred cases) only for ``figure``
    to drop it; the page applies its own template once, in the browser.

    plotly express picks a trace's colour when the figure is built, from the template's colorway, and
    without one from D3's palette; a ``go`` trace without a colour takes the page template's in the
    browser. So express is given the page template's colorway, and a series has one colour in every
    chart of the page, whichever way the chart was built."""
    saved = pio.templates.default, px.defaults.color_discrete_sequence
    pio.templates.default = "none"
    px.defaults.color_discrete_sequence = list(pio.templates[PAGE_TEMPLATE].layout.colorway)
    try:
        yield
    finally:
        pio.templates.default, px.defaults.color_discrete_sequence = saved
