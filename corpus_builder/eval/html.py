"""The acceptance eval as a section of the HTML report, from saved runs (``report.run_document``) and from two runs
side by side (``report.compare_runs``), on a page of the shared kit (``corpus_builder.report``: its styles,
plotly inline, escaping).

A run: the pack, the settings and the endpoints; the figures of every head and mode over the whole pack, the
temperature and the speculative method beside them; acceptance by draft position, grouped by head and mode; head
B / head A with its bootstrap interval (points with error bars, and the table); the figures by source and task.
Two runs: run B beside run A (the table, B / A with its interval, acceptance by position of both), then each run.
The tables are ``report``'s, so the page shows the numbers ``corpus eval`` printed.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..report import PageSection, bars, figure_html, layout, page, table, write_page
from .figures import Ratio
from .report import (
    ALL,
    FIGURE_HEADER,
    FIGURE_TITLES,
    WITHOUT_LOOPS,
    Comparison,
    comparison_table,
    describe_comparison,
    describe_run,
    figure_cells,
    length_table,
    loop_table,
    ratio_table,
    routing,
    winner_table,
)
from .run import Run

SECTION = "Acceptance"
_NAMES = 3  # the tables' columns of names: mode, head(s), group


def _lines(lines: Iterable[str]) -> str:
    return "".join(f"<p>{html.escape(line)}</p>" for line in lines)


def _part(kind: str, title: str, *content: str) -> str:
    """A titled part of a run, classed ``kind`` (what a reader's script, or a test, finds it by)."""
    return f'<div class="{kind}"><h4>{html.escape(title)}</h4>{"".join(content)}</div>'


def _plot(figure: Any | None) -> str:
    return f'<div class="plot">{figure_html(figure)}</div>' if figure is not None else ""


def _positions_plot(series: Sequence[tuple[str, Sequence[float]]]) -> Any | None:
    """Acceptance at each draft position (accepted there / drafts): in each position a bar per series."""
    width = max((len(values) for _, values in series), default=0)
    if not width:
        return None
    order = [str(position) for position in range(1, width + 1)]
    figure = bars("acceptance by draft position (accepted at the position / drafts)",
                  [(name, dict(zip(order, values, strict=False)), None) for name, values in series], order,
                  y_title="acceptance")
    figure.update_xaxes(title="draft position", type="category")
    return figure


def _ratio_plot(title: str, series: Sequence[tuple[str, Sequence[Ratio]]]) -> Any | None:
    """B / A for each ratio figure: a point per series with its interval as error bars (none where not paired)."""
    import plotly.graph_objects as go

    figure = go.Figure()
    for name, ratios in series:
        defined = [(FIGURE_TITLES[r.figure], r.ratio, r) for r in ratios if r.figure in FIGURE_TITLES
                   and r.ratio is not None]
        if not defined:
            continue
        # a percentile interval need not hold the point estimate: an error bar is never of negative length
        above = [max(0.0, r.high - point) if r.high is not None else 0.0 for _, point, r in defined]
        below = [max(0.0, point - r.low) if r.low is not None else 0.0 for _, point, r in defined]
        figure.add_trace(go.Scatter(name=name, x=[label for label, _, _ in defined], y=[p for _, p, _ in defined],
                                    mode="markers", marker={"size": 9},
                                    error_y={"type": "data", "symmetric": False, "array": above, "arrayminus": below}))
    if not figure.data:
        return None
    figure.add_hline(y=1, line_dash="dot")
    figure.update_layout(scattermode="group")
    return layout(figure, title, y_title="B / A", percent=False)


def run_body(run: Run, name: str) -> str:
    """One run (``name``: how it is named, its file) as HTML."""
    settings = run.settings
    whole = (ALL, ALL + WITHOUT_LOOPS)
    every = [figure for figure in run.figures if figure.group in whole]
    by_group = [figure_cells(figure, settings) for figure in run.figures if figure.group not in whole]
    parts = [f"<h3>run {html.escape(name)}</h3>", _lines(describe_run(run)),
             _part("acceptance-figures", "figures over the whole pack",
                   table(list(FIGURE_HEADER), [figure_cells(figure, settings) for figure in every], text_last=True,
                         names=_NAMES),
                   _plot(_positions_plot([(f"{figure.endpoint} · {figure.mode}"
                                           + (WITHOUT_LOOPS if figure.group != ALL else ""),
                                           figure.acceptance_by_position) for figure in every])))]
    if run.ratios:
        caption, header, rows = ratio_table(run)
        keyed: dict[tuple[str, str, str], list[Ratio]] = {}
        for ratio in run.ratios:
            if ratio.group == ALL:
                keyed.setdefault((ratio.mode, ratio.a, ratio.b), []).append(ratio.value)
        parts.append(_part("acceptance-ratios", f"head B / head A: {caption}", table(header, rows, names=_NAMES),
                           _plot(_ratio_plot("head B / head A over the whole pack",
                                             [(f"{b} / {a} · {mode}", ratios)
                                              for (mode, a, b), ratios in keyed.items()]))))
    caption, header, rows = length_table(run)
    parts.append(_part("acceptance-lengths", caption, table(header, rows, names=_NAMES)))
    if run.loop_gaps:
        caption, header, rows = loop_table(run)
        parts.append(_part("acceptance-loops", caption, table(header, rows, names=_NAMES)))
    caption, header, rows = winner_table(run)
    if rows:
        parts.append(_part("acceptance-winners", caption, table(header, rows, names=2), _lines(routing(run))))
    if by_group:
        parts.append(_part("acceptance-groups", "by source, task, input length and turn",
                           table(list(FIGURE_HEADER), by_group, text_last=True, names=_NAMES)))
    return "".join(parts)


def comparison_body(comparison: Comparison, names: tuple[str, str]) -> str:
    """Run B beside run A (``report.compare_runs``; ``names``: their files) as HTML."""
    caption, header, rows = comparison_table(comparison)
    every = [row for row in comparison.rows if row.group == ALL]
    return "".join([
        "<h3>run B / run A</h3>", _lines(describe_comparison(comparison, names)),
        _part("acceptance-comparison", caption, table(header, rows, names=_NAMES),
              _plot(_ratio_plot("run B / run A over the whole pack",
                                [(f"{row.endpoint} · {row.mode}", row.ratios) for row in every])),
              _plot(_positions_plot([(f"run {side} · {row.endpoint} · {row.mode}", figure.acceptance_by_position)
                                     for row in every for side, figure in (("A", row.a), ("B", row.b))])))])


def runs_section(runs: Sequence[tuple[Path, Run]], notes: Sequence[str] = (),
                 inputs: Sequence[Path] = ()) -> PageSection:
    """The section of saved runs (each with its file), in the order given, after ``notes``; ``inputs``: every file
    read to find them."""
    body = _lines(f"note: {note}" for note in notes) + "".join(run_body(run, str(file)) for file, run in runs)
    return PageSection(SECTION, body, tuple(inputs))


def write_run_page(path: Path, run: Run, name: str, title: str) -> None:
    write_page(path, page(title, PageSection(SECTION, run_body(run, name)).to_html()))


def write_comparison_page(path: Path, comparison: Comparison, names: tuple[str, str]) -> None:
    """Run B beside run A, then each run."""
    body = comparison_body(comparison, names) + "".join(
        run_body(run, f"{side} {name}") for side, run, name in zip("AB", comparison.runs, names, strict=True))
    write_page(path, page(f"corpus eval --compare {names[0]} {names[1]}", PageSection(SECTION, body).to_html()))
