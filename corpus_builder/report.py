"""The HTML report kit the stages that write pages share (the audit's report, the eval's runs): one self-contained
page (styles and plotly.js inline, opened with no network at all), the sections later stages add to it, tables,
grouped bar charts, and writing the page atomically. What a page shows is its stage's own (``audit.html``,
``eval.html``); this leaf knows nothing of either.

Why plotly. Both well-kept choices were installed and measured here (PyPI, Python 3.11):

* plotly 7.1: a 9.7 MB wheel (64 MB installed) that ships plotly.js itself; ``get_plotlyjs()`` hands the
  4.8 MB script over in ~3 ms, figures build in milliseconds, and ``import plotly.graph_objects`` costs
  ~30 ms. The report is ~5 MB, and plotly's bar and line charts render as SVG.
* altair 6.3 (Vega-Lite): the report would be smaller (a ~0.9 MB JS bundle), but altair ships no JS:
  inlining it offline needs ``vl-convert-python`` (a 33.5 MB wheel, 84 MB installed, an embedded Deno) whose
  ``javascript_bundle()`` took 1.2 s per report here, and ``import altair`` 0.19 s; without it the page
  loads Vega from a CDN, which this report must never do.

So plotly: less to install, no per-report bundling step, and the library brings its own JS. It is
imported only when a page is written (``corpus --help`` and the plain audit never load it).
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .outputs import staged

_CONFIG = {"displaylogo": False, "responsive": True}
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.2rem; margin-top: 2.5rem; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5rem 0; } td, th { padding: 0.2rem 0.8rem; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child, td.text, th.text { text-align: left; }
pre { background: #f7f7f7; padding: 0.8rem; overflow-x: auto; } .plot { margin: 1rem 0; }
"""


def figure_html(figure: Any) -> str:
    """A plotly figure as a fragment of the page (plotly.js itself is inlined once, by ``page``)."""
    return str(figure.to_html(full_html=False, include_plotlyjs=False, config=_CONFIG))


def layout(figure: Any, title: str, *, y_title: str = "share", percent: bool = True) -> Any:
    figure.update_layout(title=title, barmode="group", height=380, margin={"t": 50, "b": 60},
                         legend={"orientation": "h", "y": -0.2}, yaxis_title=y_title)
    if percent:
        figure.update_yaxes(tickformat=".0%")
    return figure


def bars(title: str, series: Iterable[tuple[str, dict[str, float], str | None]], order: Iterable[str] | None = None,
         *, y_title: str = "share", percent: bool = True) -> Any:
    """Grouped bars: for each key (``order``, else every key sorted) a bar per series (name, {key: value}, color)."""
    import plotly.graph_objects as go

    figure = go.Figure()
    series = list(series)
    keys = list(order) if order is not None else sorted({key for _, values, _ in series for key in values})
    for name, values, color in series:
        figure.add_trace(go.Bar(name=name, x=keys, y=[values.get(key, 0.0) for key in keys],
                                marker_color=color))
    return layout(figure, title, y_title=y_title, percent=percent)


def table(headers: list[str], rows: Iterable[Iterable[Any]], *, text_last: bool = False, names: int = 1) -> str:
    """A table of numbers (right-aligned) after its first ``names`` columns of names; ``text_last``: the last is
    text too."""
    def cells(tag: str, values: Iterable[Any]) -> str:
        values = list(values)
        text = {*range(1, names), *([len(values) - 1] if text_last else [])}  # the first is left-aligned by the style
        return "".join(f'<{tag}{" class=text" if index in text else ""}>'
                       f"{html.escape(str(value))}</{tag}>" for index, value in enumerate(values))
    body = "".join(f"<tr>{cells('td', row)}</tr>" for row in rows)
    return f"<table><tr>{cells('th', headers)}</tr>{body}</table>"


@dataclass(frozen=True)
class PageSection:
    """A section a stage adds to another stage's page (the acceptance eval's on the audit's): its heading, its
    HTML (escaped by its maker, plots through ``figure_html``) and the files it was made from, which writing the
    page must not overwrite."""

    title: str
    body: str
    inputs: tuple[Path, ...] = ()

    def to_html(self) -> str:
        return f"<h2>{html.escape(self.title)}</h2>{self.body}"


def page(title: str, *parts: str) -> str:
    """A self-contained page: the styles and plotly.js inline, then the title and ``parts`` (HTML)."""
    from plotly.offline import get_plotlyjs

    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style><script>{get_plotlyjs()}</script></head><body>"
            f"<h1>{html.escape(title)}</h1>{''.join(parts)}</body></html>")


def write_page(path: Path, text: str) -> None:
    """Write a page atomically (a reader never sees half a report): staged beside it, renamed over it once whole,
    removed on any failure (a write error is a ``CorpusError`` naming the path)."""
    with staged(path) as partial:
        partial.write_text(text, encoding="utf-8")
