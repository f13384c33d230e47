"""Saved runs made without a server, and what a page of them shows.

A run is put together by the eval's own ``run_document``, as ``evaluate`` does: a pack, endpoints as a replay
describes them, and measurement windows whose counters follow from each head's strength (its chance that a
drafted token survives, per position), so heads, modes and prompts all differ. The page's tables are read back
(from the HTML here, from the DOM in the browser test) and every number is checked against the run itself.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from corpus_builder.eval.figures import Window
from corpus_builder.eval.metrics import Counters
from corpus_builder.eval.pack import Pack, PackPrompt
from corpus_builder.eval.report import FIGURE_TITLES, Comparison, format_run, run_document, with_figures
from corpus_builder.eval.run import Endpoint, Reads, Run, RunSettings, Speculator
from corpus_builder.records import Conversation, Message

POSITIONS = 3
HEADS = {"A": (0.8, "eagle3"), "B": (0.6, None)}  # label: (strength, the method the server tells, if it does)
LABELS = [("code", "coding"), ("code", "coding"), ("chat", None), ("chat", None), ("math", "gsm8k")]


def pack_of(labels: Sequence[tuple[str, str | None]] = LABELS, path: Path = Path("pack.jsonl")) -> Pack:
    prompts = tuple(PackPrompt(f"p{i}", source, task, ({"role": "user", "content": f"question {i}"},),
                               Conversation(f"p{i}", source, "replay", [Message("user", f"question {i}")], task=task))
                    for i, (source, task) in enumerate(labels))
    return Pack(path, (path,), prompts)


def endpoint(label: str, method: str | None) -> Endpoint:
    identity = {"served_model": "target", "model_root": "/models/target", "quantization": None, "dtype": "bfloat16",
                "engine_version": "0.32.0", "revision": None}
    speculator = Speculator(num_speculative_tokens=POSITIONS) if method is None else \
        Speculator("/server_info", method, f"/heads/{label}", POSITIONS)
    return Endpoint(label, f"http://127.0.0.1:{8000 + ord(label)}", identity, speculator)


def window(label: str, mode: str, prompt: int, strength: float) -> Window:
    drafts = 4 + prompt % 3
    wobble = 1.15 if prompt % 2 else 0.85
    survived = tuple(float(min(drafts, round(drafts * wobble * strength ** (position + 1))))
                     for position in range(POSITIONS))
    accepted = sum(survived)
    output_tokens = int(drafts + accepted)  # each step: the accepted drafts and the target's own token
    seconds = 0.05 * drafts + 0.01 * prompt
    return Window(label, mode, prompt, 1, output_tokens, seconds,
                  Counters(True, drafts, POSITIONS * drafts, accepted, survived, 1, output_tokens, seconds, 1))


def synthetic_run(pack: Pack | None = None, heads: dict[str, tuple[float, str | None]] | None = None, *,
                  modes: Sequence[str] = ("thinking", "non-thinking"), temperature: float | None = 0.0,
                  shift: float = 0.0) -> Run:
    """A run of ``pack`` on ``heads`` (each strength moved by ``shift``; the non-thinking mode's is lower)."""
    pack = pack or pack_of()
    heads = heads or HEADS
    windows = [window(label, mode, index, strength + shift - 0.1 * (mode == "non-thinking"))
               for mode in modes for index in range(len(pack.prompts)) for label, (strength, _) in heads.items()]
    settings = RunSettings(tuple(modes), 1, temperature, "--temperature", 64, sent={"max_tokens": 64, "top_k": -1})
    return run_document(pack, [endpoint(label, method) for label, (_, method) in heads.items()], windows, settings,
                        ["a synthetic run"], 0, Reads())


def text_of(run: dict[str, Any]) -> str:
    """A run's text, from its JSON (read back as a saved run is)."""
    return format_run(with_figures(Run.from_json(run, "run.json")))


# ---- what a page shows -----------------------------------------------------------------------------

Table = list[list[str]]  # the header row, then the rows


class _Tables(HTMLParser):
    """The tables of a page, each with the class of the part it is in (``acceptance-figures``, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.found: list[tuple[str, Table]] = []
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "div":
            self.parts.append(dict(attrs).get("class") or "")
        elif tag == "table":
            self.found.append((next((p for p in reversed(self.parts) if p.startswith("acceptance-")), ""), []))
        elif tag == "tr":
            self.found[-1][1].append([])
        elif tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "div":
            self.parts.pop()
        elif tag in ("td", "th") and self.cell is not None:
            self.found[-1][1][-1].append("".join(self.cell))
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def page_tables(page: str) -> list[tuple[str, Table]]:
    parser = _Tables()
    parser.feed(page)
    return parser.found


def shows(cell: str, value: float | None) -> bool:
    """The cell shows ``value`` at the cell's own precision ("n/a": no value)."""
    if value is None:
        return cell == "n/a"
    digits = len(cell.partition(".")[2])
    return cell == f"{value:.{digits}f}"


_NUMBER = re.compile(r"-?\d+\.\d+")


def shows_interval(cell: str, ratio: dict[str, Any]) -> bool:
    """The cell shows the ratio and, where there is one, its interval: "1.234 [1.100, 1.300]"."""
    if ratio["ratio"] is None:
        return cell == "n/a"
    expected = [ratio["ratio"]] + ([ratio["low"], ratio["high"]] if ratio["low"] is not None else [])
    numbers = _NUMBER.findall(cell)
    return len(numbers) == len(expected) and all(shows(n, v) for n, v in zip(numbers, expected, strict=True))


def check_figures(table: Table, record: Run) -> int:
    """Every row of a figures table shows its figures as the run has them, the temperature and method beside
    them; the number of rows checked."""
    run = record.to_json()
    header, *rows = table
    figures = {(f["mode"], f["endpoint"], f["group"]): f for f in run["figures"]}
    methods = {e["label"]: e["speculator"].get("method") for e in run["endpoints"]}
    for cells in rows:
        row = dict(zip(header, cells, strict=True))
        figure = figures[row["mode"], row["head"], row["group"]]
        assert row["requests"] == str(figure["requests"]) and row["output tokens"] == str(figure["output_tokens"])
        assert row["loops"] == ("n/a" if figure["loops"] is None else str(figure["loops"]))
        for column, key in [*((title, key) for key, title in FIGURE_TITLES.items()), ("TPOT ms", "tpot_ms")]:
            assert shows(row[column], figure[key]), (column, row[column], figure[key])
        for column, key in (("acceptance by position (pooled)", "acceptance_by_position"),
                            ("acceptance by position (per request)", "acceptance_by_position_per_request")):
            positions = row[column].removesuffix(" ...").split()
            if not figure[key]:
                assert positions == ["n/a"], (column, row[column])
                continue
            assert len(positions) == min(len(figure[key]), 4) and all(
                shows(cell, value) for cell, value in zip(positions, figure[key], strict=False)), (column, row[column])
        assert row["temperature"] == f"{run['settings']['temperature']:g}"
        assert row["method"] == (methods[row["head"]] or "not told")
    return len(rows)


def check_ratios(table: Table, record: Run) -> int:
    run = record.to_json()
    header, *rows = table
    ratios = {(r["mode"], f"{r['b']} / {r['a']}", r["group"], FIGURE_TITLES[r["figure"]]): r for r in run["ratios"]}
    for cells in rows:
        row = dict(zip(header, cells, strict=True))
        for title in FIGURE_TITLES.values():
            assert shows_interval(row[title], ratios[row["mode"], row["heads"], row["group"], title]), row
    return len(rows)


def check_comparison(table: Table, compared: Comparison) -> int:
    comparison = compared.to_json()
    header, *rows = table
    compared = {(r["mode"], r["endpoint"], r["group"]): r for r in comparison["rows"]}
    for cells in rows:
        expected = compared[cells[0], cells[1], cells[2]]
        for index, (figure, title) in enumerate(FIGURE_TITLES.items()):
            a, b, ratio = cells[3 + 3 * index: 6 + 3 * index]
            assert header[3 + 3 * index] == f"{title} A"
            assert shows(a, expected["a"][figure]) and shows(b, expected["b"][figure])
            assert shows_interval(ratio, expected["ratios"][figure])
    return len(rows)
