"""Page assembly: sections of escaped text, tables and plotly figures in one offline HTML file.

Every piece of user-supplied text (suite names, descriptions, case parameters, error messages)
goes through ``esc`` or pandas' escaping table writer; plotly figures carry their text as JSON data,
which plotly.js renders as text. plotly.js itself is inlined exactly once, so the file opens with
no network at all.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

import pandas as pd
import plotly.graph_objects as go
import plotly.offline

_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 0 auto; max-width: 1200px;
       padding: 1.5rem; color: #1d2330; }
h1 { margin-bottom: 0.2rem; } h2 { border-bottom: 1px solid #d9dde5; padding-bottom: 0.3rem; margin-top: 2rem; }
.muted { color: #5b6475; } .verdicts li { margin: 0.3rem 0; font-size: 1.05rem; }
table { border-collapse: collapse; font-size: 0.85rem; margin: 0.5rem 0; }
th, td { border: 1px solid #d9dde5; padding: 0.25rem 0.5rem; text-align: left; vertical-align: top; }
th { background: #f3f5f9; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f7f7f9; padding: 0.5rem; overflow-x: auto; font-size: 0.8rem; max-height: 20rem; }
.failed { color: #a4262c; }
"""


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


@dataclass
class Page:
    title: str
    parts: list[str] = field(default_factory=list)
    figures: int = 0

    def heading(self, text: str, level: int = 2, anchor: str | None = None) -> None:
        a = f' id="{esc(anchor)}"' if anchor else ""
        self.parts.append(f"<h{level}{a}>{esc(text)}</h{level}>")

    def paragraph(self, text: str, css: str | None = None) -> None:
        c = f' class="{esc(css)}"' if css else ""
        self.parts.append(f"<p{c}>{esc(text)}</p>")

    def bullets(self, items: list[str], css: str | None = None) -> None:
        c = f' class="{esc(css)}"' if css else ""
        self.parts.append(f"<ul{c}>" + "".join(f"<li>{esc(i)}</li>" for i in items) + "</ul>")

    def preformatted(self, text: str) -> None:
        self.parts.append(f"<pre>{esc(text)}</pre>")

    def table(self, df: pd.DataFrame, float_format: str = "{:.3g}") -> None:
        fmt = {c: (lambda v, f=float_format: "" if pd.isna(v) else f.format(v)) for c in df.select_dtypes("number").columns}
        self.parts.append(df.to_html(index=False, escape=True, formatters=fmt, border=0, na_rep=""))

    def link(self, href: str, text: str) -> str:
        return f'<a href="{esc(href)}">{esc(text)}</a>'

    def raw_list(self, html_items: list[str]) -> None:
        """Items already built from escaped parts (e.g. with ``link``)."""
        self.parts.append("<ul>" + "".join(f"<li>{i}</li>" for i in html_items) + "</ul>")

    def figure(self, fig: go.Figure) -> None:
        self.figures += 1
        self.parts.append(
            fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig{self.figures}",
                        config={"displaylogo": False, "responsive": True})
        )

    def render(self) -> str:
        return (
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{esc(self.title)}</title><style>{_CSS}</style>"
            f"<script type=\"text/javascript\">{plotly.offline.get_plotlyjs()}</script></head><body>"
            + "\n".join(self.parts)
            + "</body></html>\n"
        )
