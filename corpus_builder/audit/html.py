"""`corpus audit ... --html report.html`: one self-contained HTML file, opened with no network at all.

Plots: length histograms by source and thinking mode, thinking share by source and split, drop and repair
reasons, copy-span distribution by task, the draft vocabulary's coverage curve and, with ``--against``,
corpus versus traffic side by side for every dimension, with the divergence table, the suggestions and the
recipe diff. Everything comes from the audit's own report (the JSON of ``--json``), so the page shows the
numbers the command printed. Later stages add sections of their own (``report.PageSection``: the acceptance
eval's).

The page itself (styles, plotly.js inline, tables, bars, writing it atomically) is the shared kit of
``corpus_builder.report``, where why plotly is told.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from ..report import PageSection, bars, figure_html, layout, page, table, write_page
from ..stats.corpus import AuditReport
from .comparison import Comparison, Side, Vocab
from .profile import COPY_BUCKETS, LENGTH_BUCKETS, LENGTH_MEASURES
from .traffic import as_shares

CORPUS_COLOR = "#4C78A8"
TRAFFIC_COLOR = "#F58518"


def _length_plots(sides: list[tuple[str, Side, str]]) -> list[object]:
    """Per measure, the length buckets of every source and thinking mode (and the traffic's, when given)."""
    plots = []
    for measure in LENGTH_MEASURES:
        series = []
        for role, side, color in sides:
            groups: dict[str, Counter[str]] = {}
            for row in side.get("length_buckets") or ():
                if row["measure"] == measure:
                    owner = row["source"] if role == "corpus" else "traffic"
                    groups.setdefault(f"{owner} · {row['thinking']}", Counter())[row["bucket"]] += row["count"]
            series += [(name, as_shares(dict(counts)), color if role == "traffic" else None)
                       for name, counts in sorted(groups.items())]
        if series:
            plots.append(bars(f"{measure.replace('_', ' ')} (target tokens) by source and thinking mode", series,
                              LENGTH_BUCKETS))
    return plots


def _thinking_plot(sides: list[tuple[str, Side, str]]) -> object:
    series = []
    for role, side, color in sides:
        values = {f"source {k}": v["thinking_share"] for k, v in side["by_source"].items()}
        values |= {f"split {k}": v["thinking_share"] for k, v in (side.get("by_split") or {}).items()}
        if role == "traffic":
            values = {"traffic": side["thinking_share"]}
        series.append((role, values, color))
    keys = [key for _, values, _ in series for key in values]
    return bars("thinking share by source and split", series, keys, y_title="thinking share")


def _reasons_plot(audit: AuditReport, sides: list[tuple[str, Side, str]]) -> object:
    series: list[tuple[str, dict[str, float], str | None]] = []
    corpus_reasons = {f"dropped: {k}": float(v) for k, v in (audit.get("skipped") or {}).items()}
    corpus_reasons |= {f"flag: {k}": float(v) for k, v in (audit.get("flags") or {}).items()}
    series.append(("corpus", corpus_reasons, CORPUS_COLOR))
    for role, side, color in sides:
        if role == "traffic":
            series.append(("traffic", {f"dropped: {k}": float(v) for k, v in side["skipped"].items()}, color))
    keys = sorted({key for _, values, _ in series for key in values}) or ["(none)"]
    return bars("drop and repair reasons (rows)", series, keys, y_title="rows", percent=False)


def _copy_plot(sides: list[tuple[str, Side, str]]) -> object | None:
    series = []
    spans = []  # the same on both sides: one meter measures them
    for role, side, color in sides:
        copies = side.get("copies")
        if copies is None:
            continue
        spans.append(copies["span_tokens"])
        for task, section in copies["by_task"].items():
            series.append((f"{role} · {task}", as_shares(section["buckets"]), color if role == "traffic" else None))
    if not series:
        return None
    plot: object = bars(f"copy-spans by task: share of a turn's response tokens in spans of {spans[0]}+ tokens "
                        "copied from the context (turns)", series, COPY_BUCKETS)
    return plot


def _coverage_plot(vocab: Vocab | None) -> object | None:
    if not vocab:
        return None
    import plotly.graph_objects as go

    figure = go.Figure()
    curve = vocab["curve"]
    ks = [point["k"] for point in curve]
    lines = (("corpus (its own top-k)", "corpus", CORPUS_COLOR), ("traffic, by the corpus's top-k", "traffic",
                                                                  TRAFFIC_COLOR),
             ("traffic, by its own top-k", "traffic_own", "#54A24B"))
    for name, key, color in lines:
        if key in curve[0]:
            figure.add_trace(go.Scatter(name=name, x=ks, y=[point.get(key) for point in curve], mode="lines+markers",
                                        line={"color": color}))
    figure.add_vline(x=vocab["draft_vocab_size"], line_dash="dot")
    figure.update_xaxes(type="log", title="draft vocabulary size k")
    plot: object = layout(figure, "supervised tokens covered by the top-k draft vocabulary", y_title="coverage")
    return plot


def _comparison_plots(report: Comparison) -> list[object]:
    plots = []
    corpus, traffic = report["corpus"]["shares"], report["traffic"]["shares"]
    for name, section in report["divergence"].items():
        if name == "token_frequencies":
            continue
        order = LENGTH_BUCKETS if name in LENGTH_MEASURES else COPY_BUCKETS if name == "copy_share" else None
        plots.append(bars(f"{name.replace('_', ' ')}: corpus vs traffic (TVD {section['tvd']:.3f})",
                          [("corpus", corpus.get(name, {}), CORPUS_COLOR),
                           ("traffic", traffic.get(name, {}), TRAFFIC_COLOR)],
                          order))
    divergence = {name: section["tvd"] for name, section in report["divergence"].items()}
    plots.insert(0, bars("total variation distance per dimension", [("TVD", divergence, TRAFFIC_COLOR)],
                         list(divergence), y_title="TVD", percent=False))
    return plots


def _summary(report: Comparison) -> str:
    rows = []
    for role, side in (("corpus", report["corpus"]), ("traffic", report.get("traffic"))):
        if side:
            rows.append([role, side["label"], f"{side['conversations']:,}", f"{sum(side['skipped'].values()):,}",
                         f"{side['thinking_share']:.1%}", f"{side['reasoning_share']:.1%}"])
    readable = report.get("readable")
    parts = [f"<p><strong>{html.escape(readable['note'])}</strong></p>"] if readable and readable["partial"] else []
    parts.append(table(["", "input", "conversations", "rows skipped", "thinking (mode)", "with reasoning"], rows))
    if report.get("divergence"):
        parts.append("<h2>Divergence</h2>")
        parts.append(table(["dimension", "TVD", "biggest gaps (bucket: corpus → traffic)"], (
            [name, f"{section['tvd']:.3f}",
             "; ".join(f"{g['bucket']}: {g['corpus']:.1%} → {g['traffic']:.1%}" for g in section["gaps"])]
            for name, section in report["divergence"].items()), text_last=True))
    if report.get("plan"):
        parts.append("<h2>Rows per source to follow the traffic</h2>")
        parts.append(table(["source", "task", "rows", "target", "change"], (
            [entry["source"], entry["task"], f"{entry['rows']:,}", f"{entry['target_rows']:,}",
             f"{entry['change']:+,}"] for entry in report["plan"])))
    if report.get("suggestions"):
        parts.append("<h2>Suggestions</h2><ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in report["suggestions"])
                     + "</ul>")
    diff = report.get("recipe_diff")
    if diff:
        parts.append(f"<h2>Recipe diff</h2><pre>{html.escape(diff)}</pre>")
    parts += [f"<p>note: {html.escape(note)}</p>" for note in report.get("notes") or ()]
    return "".join(parts)


def render(report: Comparison, audit: AuditReport, title: str, sections: Sequence[PageSection] = ()) -> str:
    """The page: ``report`` is ``audit_against``'s (corpus and traffic) or ``describe_corpus``'s (corpus only);
    ``audit`` is the corpus's plain audit (its drop reasons and flags); ``sections`` follow the plots."""
    sides = [("corpus", report["corpus"], CORPUS_COLOR)]
    if report.get("traffic"):
        sides.append(("traffic", report["traffic"], TRAFFIC_COLOR))
    plots = [*(_comparison_plots(report) if report.get("divergence") else []), *_length_plots(sides),
             _thinking_plot(sides), _reasons_plot(audit, sides), _copy_plot(sides), _coverage_plot(report.get("vocab"))]
    body = "".join(f'<div class="plot">{figure_html(plot)}</div>' for plot in plots if plot is not None)
    return page(title, _summary(report), "<h2>Plots</h2>", body, *(section.to_html() for section in sections))


def write_html_report(path: Path, report: Comparison, audit: AuditReport, title: str,
                      sections: Sequence[PageSection] = ()) -> None:
    """Write the page (``write_page``)."""
    write_page(path, render(report, audit, title, sections))
