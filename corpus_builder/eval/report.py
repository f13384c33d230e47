"""An eval run's figures (``with_figures``), its tables, its file, and two saved runs side by side.

The figures per endpoint, mode and group (``all``, ``source:NAME``, ``task:NAME``) and the ratios of every head
to head A follow from a run's windows; ``--compare`` pairs two runs of the same pack prompt by prompt.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from contextlib import suppress
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from ..errors import CorpusError
from ..generate.types import IDENTITY_FIELDS, describe_identity
from ..outputs import staged
from .figures import (
    BOOTSTRAP_SEED,
    CONFIDENCE,
    RATIO_FIGURES,
    RESAMPLES,
    Ratio,
    Sums,
    Window,
    figure_ratios,
    paired_ratios,
)
from .pack import Pack
from .run import (
    Endpoint,
    Figure,
    HeadRatio,
    PackInfo,
    PromptInfo,
    Reads,
    Run,
    RunSettings,
    Skip,
    as_json,
    endpoint_of,
    json_value,
)

PROBE_BYTES = 64 * 1024  # what check_writable writes: room for a run of a few hundred windows
ALL = "all"
_POSITIONS_SHOWN = 4
FIGURE_TITLES = {"acceptance_rate_pooled": "acceptance rate (pooled)",
                 "acceptance_rate_per_request": "acceptance rate (per request)",
                 "mean_acceptance_length_pooled": "mean acceptance length (pooled)",
                 "mean_acceptance_length_per_request": "mean acceptance length (per request)",
                 "output_tokens_per_s": "output tok/s"}


class RunNotSaved(CorpusError):
    """A finished run that could not be saved (a full disk, a directory gone): ``run`` holds it, to be printed."""

    exit_code = 2  # as a build that meets a full disk

    def __init__(self, message: str, run: Run, *, file: str) -> None:
        super().__init__(message, file=file)
        self.run = run


def run_document(pack: Pack, endpoints: list[dict[str, Any]], windows: list[Window], settings: dict[str, Any],
                 notes: list[str], remeasured: int, metrics_reads: Reads,
                 skipped: list[dict[str, Any]] | None = None) -> Run:
    """A run of ``pack`` (endpoints as a replay describes them, settings as ``evaluate`` records them), its figures
    and ratios computed from ``windows``; ``skipped``: the prompts a server refused (each with its pack index),
    left out of every figure."""
    run = Run(
        created=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        pack=PackInfo(str(pack.path), pack.sha256, len(pack.prompts), pack.rows, dict(pack.unreadable), pack.folded,
                      pack.repeated),
        settings=RunSettings(tuple(settings["modes"]), settings["concurrency"], settings["temperature"],
                             settings["temperature_from"], settings["max_tokens"], settings.get("top_p"),
                             dict(settings.get("sent", {})), settings.get("recipe_top_k")),
        endpoints=tuple(endpoint_of(endpoint) for endpoint in endpoints),
        notes=tuple(notes),
        prompts=tuple(PromptInfo(p.id, p.source, p.task) for p in pack.prompts),
        windows=tuple(windows), remeasured_windows=remeasured, metrics_reads=metrics_reads,
        skipped_prompts=tuple(Skip(**skip) for skip in skipped or ()))
    return with_figures(run)


def lost_rows(run: Run) -> tuple[int, int]:
    """(rows of the pack lost: unreadable, or refused by a server; the rows read)."""
    return sum(run.pack.unreadable_rows.values()) + len(run.skipped_prompts), run.pack.rows


def with_figures(run: Run) -> Run:
    """``run`` with its figures and ratios, computed from its windows."""
    labels = [endpoint.label for endpoint in run.endpoints]
    methods = {endpoint.label: endpoint.speculator.method for endpoint in run.endpoints}
    paired = run.settings.concurrency == 1
    groups = _run_groups(run) if paired else {ALL: None}
    figures: list[Figure] = []
    ratios: list[HeadRatio] = []
    for mode in run.settings.modes:
        for group, members in groups.items():
            chosen = {label: _chosen(run.windows, mode, label, members) for label in labels}
            measured = {label: Sums.of(chosen[label]).figures() for label in labels}
            figures += [Figure(label, mode, group, run.settings.temperature, methods[label], **measured[label])
                        for label in labels]
            for label in labels[1:]:
                compared = (paired_ratios(chosen[labels[0]], chosen[label]) if paired
                            else figure_ratios(measured[labels[0]], measured[label]))
                ratios += [HeadRatio(labels[0], label, mode, group, value) for value in compared]
    return replace(run, figures=tuple(figures), ratios=tuple(ratios), missing=_missing(figures))


def _missing(figures: list[Figure]) -> tuple[str, ...]:
    """The figures a run cannot give, named (printed under its heading; n/a in its tables)."""
    missing = []
    if any(f.drafts and f.mean_acceptance_length_per_request is None for f in figures):
        missing.append("per-request acceptance: each request's own counts are not known (a phase at concurrency > 1 "
                       "counted by /metrics: a server with --per-request-spec-decode-metrics gives them)")
    return tuple(missing)


def _chosen(windows: tuple[Window, ...], mode: str, endpoint: str, members: set[int] | None) -> list[Window]:
    """The windows of one endpoint, mode and group (None: every prompt), in pack order."""
    return sorted((w for w in windows if w.endpoint == endpoint and w.mode == mode
                   and (members is None or w.prompt in members)), key=lambda w: w.prompt or 0)


def _run_groups(run: Run) -> dict[str, set[int] | None]:
    """Group -> the pack indices in it (None: every prompt): all, then each source, then each task, by name; the
    prompts a server refused are in none."""
    skipped = {skip.prompt for skip in run.skipped_prompts}
    named: dict[str, set[int]] = {}
    for index, prompt in enumerate(run.prompts):
        if index in skipped:
            continue
        named.setdefault(f"source:{prompt.source}", set()).add(index)
        if prompt.task is not None:
            named.setdefault(f"task:{prompt.task}", set()).add(index)
    order = sorted(named, key=lambda group: (not group.startswith("source:"), group))
    return {ALL: None, **{group: named[group] for group in order}}


def check_writable(directory: Path, what: str) -> None:
    """Write ``PROBE_BYTES`` to a file in ``directory`` (made for it) and remove both again: a run is saved only
    once it is finished, so a place that cannot take it (read-only, full) is found before the first request."""
    made = [folder for folder in (directory, *directory.parents) if not folder.exists()]
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory) as probe:
            probe.write(b"\0" * PROBE_BYTES)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as error:
        raise CorpusError(f"{what}: cannot save a run there: {error.strerror or error}", file=str(directory)) from None
    finally:
        for folder in made:  # deepest first: nothing is left behind by the check
            with suppress(OSError):
                folder.rmdir()


def save_run(run: Run, directory: Path) -> Path:
    """Write ``run`` as ``directory/<timestamp>-<hash>.json`` (staged, then renamed into place; readable by all,
    as every output is); RunNotSaved, holding the run, when it cannot be written."""
    body = orjson.dumps(run.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
    stamp = run.created.replace("-", "").replace(":", "")
    path = directory / f"{stamp}-{hashlib.sha256(body).hexdigest()[:12]}.json"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with staged(path) as partial:
            partial.write_bytes(body)
    except (OSError, CorpusError) as error:
        cause = error.__cause__ if isinstance(error, CorpusError) else error  # staged's error names the file
        problem = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(cause or error)
        raise RunNotSaved(f"the run is finished but cannot be saved: {problem}", run, file=str(path)) from None
    return path


def load_run(path: Path) -> Run:
    """A run ``evaluate`` saved, checked to hold what its readers read (a run cut short or edited by hand, or saved
    by an eval that let a NaN through as null, is refused, naming the key)."""
    try:
        document = orjson.loads(Path(path).read_bytes())
    except FileNotFoundError:
        raise CorpusError("no such file", file=str(path)) from None
    except (OSError, orjson.JSONDecodeError) as error:
        raise CorpusError(f"not a saved eval run: {error}", file=str(path)) from None
    return Run.from_json(document, str(path))


# ---- tables --------------------------------------------------------------------------------------

def _number(value: Any, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _temperature(settings: RunSettings) -> str:
    return "target default" if settings.temperature is None else f"{settings.temperature:g}"


def _markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    """An aligned Markdown table (as a model card has): readable in a terminal, pasteable into a card."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)) + " |"

    return [line(header), "|" + "|".join("-" * (width + 2) for width in widths) + "|", *map(line, rows)]


def _positions(values: tuple[float, ...]) -> str:
    shown = " ".join(f"{value:.2f}" for value in values[:_POSITIONS_SHOWN])
    return shown + (" ..." if len(values) > _POSITIONS_SHOWN else "") if values else "n/a"


def _interval(ratio: Ratio) -> str:
    if ratio.ratio is None:
        return "n/a"
    if ratio.low is None or ratio.high is None:
        return f"{ratio.ratio:.3f}"
    return f"{ratio.ratio:.3f} [{ratio.low:.3f}, {ratio.high:.3f}]"


def describe_endpoint(endpoint: Endpoint) -> str:
    identity = describe_identity({key: endpoint.identity.get(key) for key in (*IDENTITY_FIELDS, "revision")})
    speculator = endpoint.speculator
    if speculator.told_by:
        told = f"{speculator.method} {speculator.model or ''}".rstrip()
        told += f", {speculator.num_speculative_tokens} tokens (told by {speculator.told_by})"
    else:
        told = (f"not told ({speculator.num_speculative_tokens} draft positions in the counters; "
                "VLLM_SERVER_DEV_MODE=1 opens /server_info)")
    return f"{endpoint.label} {endpoint.url}: {identity}; speculator: {told}; counted by {endpoint.counters}"


FIGURE_HEADER = ("mode", "head", "group", "requests", "output tokens", *(FIGURE_TITLES[f] for f in RATIO_FIGURES[:4]),
                 "acceptance by position", "output tok/s", "TPOT ms", "temperature", "method")


def describe_run(run: Run) -> list[str]:
    """The lines above a run's tables: the pack, the settings, the endpoints, the notes, what reading the counters
    cost, and what a run saved in an older format did not record."""
    settings, pack = run.settings, run.pack
    lines = [f"eval of {pack.path} ({pack.prompts} prompts, sha256 {pack.sha256[:12]}) at concurrency "
             f"{settings.concurrency}, temperature {_temperature(settings)} ({settings.temperature_from}), "
             f"max_tokens {settings.max_tokens}"]
    lines += [describe_endpoint(endpoint) for endpoint in run.endpoints]
    lines += [f"note: {note}" for note in run.notes]
    reads, requests = run.metrics_reads, sum(w.seconds for w in run.windows)
    if reads.count:
        lines.append(f"counters read {reads.count} times, {1000 * reads.seconds / reads.count:.1f} ms each "
                     f"({100 * reads.seconds / requests if requests else 0:.1f}% of the time the requests took)")
    lines += [f"missing: {missing}" for missing in run.missing]
    return lines


def figure_cells(row: Figure, settings: RunSettings) -> list[str]:
    """One of a run's ``figures`` as a row of its table (``FIGURE_HEADER``)."""
    tokens = row.output_tokens
    return [row.mode, row.endpoint, row.group, str(row.requests), "n/a" if tokens is None else str(tokens),
            _number(row.acceptance_rate_pooled), _number(row.acceptance_rate_per_request),
            _number(row.mean_acceptance_length_pooled, 2), _number(row.mean_acceptance_length_per_request, 2),
            _positions(row.acceptance_by_position), _number(row.output_tokens_per_s, 1),
            _number(row.tpot_ms, 2), _temperature(settings), str(row.method or "not told")]


def ratio_table(run: Run) -> tuple[str, list[str], list[list[str]]]:
    """A run's ratios of every head to head A: (how they were measured, header, rows)."""
    paired = run.settings.concurrency == 1
    caption = (("paired over the same prompts, sent in a rotating order; "
                f"{100 * CONFIDENCE:g}% bootstrap interval ({RESAMPLES} resamples, seed {BOOTSTRAP_SEED})")
               if paired else "whole phases (no interval: pairing prompts needs concurrency 1)")
    keyed: dict[tuple[str, str, str, str], dict[str, str]] = {}
    for ratio in run.ratios:
        keyed.setdefault((ratio.mode, ratio.group, ratio.a, ratio.b), {})[ratio.value.figure] = _interval(ratio.value)
    rows = [[mode, f"{b} / {a}", group, *(values.get(figure, "n/a") for figure in RATIO_FIGURES)]
            for (mode, group, a, b), values in keyed.items()]
    return caption, ["mode", "heads", "group", *(FIGURE_TITLES[f] for f in RATIO_FIGURES)], rows


def format_run(run: Run) -> str:
    rows = [figure_cells(row, run.settings) for row in run.figures]
    lines = [*describe_run(run), "", *_markdown(list(FIGURE_HEADER), rows)]
    if run.ratios:
        caption, header, rows = ratio_table(run)
        lines += ["", caption, *_markdown(header, rows)]
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class ComparedRow:
    """One (mode, head, group) both runs have: its figures in each, and B over A."""

    mode: str
    endpoint: str
    group: str
    a: Figure
    b: Figure
    ratios: tuple[Ratio, ...]

    def ratio(self, figure: str) -> Ratio:
        return next(ratio for ratio in self.ratios if ratio.figure == figure)


@dataclass(frozen=True, slots=True)
class Comparison:
    """Two saved runs side by side (``runs``: A and B); ``paired``: B / A paired prompt by prompt."""

    runs: tuple[Run, Run]
    paired: bool
    notes: tuple[str, ...]
    rows: tuple[ComparedRow, ...]

    def to_json(self) -> dict[str, Any]:
        """What ``--compare --json`` prints: each run's heading (not its windows), the notes and the rows."""
        sides = {side: {"created": run.created, "format": run.format, "pack": as_json(run.pack),
                        "settings": as_json(run.settings), "endpoints": [as_json(e) for e in run.endpoints],
                        "missing": list(run.missing)} for side, run in zip("ab", self.runs, strict=True)}
        rows = [{"mode": row.mode, "endpoint": row.endpoint, "group": row.group, "a": as_json(row.a),
                 "b": as_json(row.b), "ratios": {ratio.figure: as_json(ratio) for ratio in row.ratios}}
                for row in self.rows]
        return {**sides, "paired": self.paired, "notes": list(self.notes), "rows": rows}


def _values(figure: Figure) -> dict[str, Any]:
    return {name: getattr(figure, name) for name in RATIO_FIGURES}


def compare_runs(run_a: Run, run_b: Run) -> Comparison:
    """Two saved runs side by side: the figures of each (mode, head, group) both have, B over A, and an interval
    paired prompt by prompt where both replayed the same pack at concurrency 1."""
    same_pack = run_a.pack.sha256 == run_b.pack.sha256
    paired = same_pack and run_a.settings.concurrency == run_b.settings.concurrency == 1
    notes = []
    if not same_pack:
        notes.append("the runs replayed different packs: their figures are not paired")
    for key in ("temperature", "max_tokens", "modes", "concurrency"):
        value_a, value_b = getattr(run_a.settings, key), getattr(run_b.settings, key)
        if value_a != value_b:
            notes.append(f"{key} differs: {json_value(value_a)} in A, {json_value(value_b)} in B")
    identities_a = {e.label: e.identity for e in run_a.endpoints}
    notes += [f"head {e.label} ran on different targets in the two runs" for e in run_b.endpoints
              if e.label in identities_a and identities_a[e.label] != e.identity]
    figures_b = {(f.mode, f.endpoint, f.group): f for f in run_b.figures}
    groups = _run_groups(run_a) if paired else {}
    rows = []
    for figure_a in run_a.figures:
        mode, endpoint, group = figure_a.mode, figure_a.endpoint, figure_a.group
        figure_b = figures_b.get((mode, endpoint, group))
        if figure_b is None:
            continue
        members = groups.get(group)
        ratios = (paired_ratios(*(_chosen(run.windows, mode, endpoint, members) for run in (run_a, run_b)))
                  if paired else figure_ratios(_values(figure_a), _values(figure_b)))
        rows.append(ComparedRow(mode, endpoint, group, figure_a, figure_b, tuple(ratios)))
    return Comparison((run_a, run_b), paired, tuple(notes), tuple(rows))


def describe_comparison(comparison: Comparison, names: tuple[str, str]) -> list[str]:
    """The lines above a comparison's table: each run (``names``: how they were given) with its endpoints, and the
    notes."""
    lines = []
    for side, run, name in zip("AB", comparison.runs, names, strict=True):
        lines.append(f"run {side} {name}: {run.created}, pack sha256 {run.pack.sha256[:12]}, "
                     f"temperature {_temperature(run.settings)}, concurrency {run.settings.concurrency}")
        lines += ["  " + describe_endpoint(endpoint) for endpoint in run.endpoints]
        lines += [f"  missing: {missing}" for missing in run.missing]
    return lines + [f"note: {note}" for note in comparison.notes]


def comparison_table(comparison: Comparison) -> tuple[str, list[str], list[list[str]]]:
    """Run B beside run A: (how B / A was measured, header, rows)."""
    header = ["mode", "head", "group"]
    for figure in RATIO_FIGURES:
        header += [f"{FIGURE_TITLES[figure]} A", "B", "B / A"]
    rows = []
    for row in comparison.rows:
        cells = [row.mode, row.endpoint, row.group]
        for figure in RATIO_FIGURES:
            digits = 1 if figure == "output_tokens_per_s" else 3
            cells += [_number(getattr(row.a, figure), digits), _number(getattr(row.b, figure), digits),
                      _interval(row.ratio(figure))]
        rows.append(cells)
    caption = ("B / A paired prompt by prompt (the same pack at concurrency 1), "
               f"{100 * CONFIDENCE:g}% bootstrap interval") if comparison.paired else "B / A (not paired)"
    return caption, header, rows


def format_comparison(comparison: Comparison, names: tuple[str, str]) -> str:
    caption, header, rows = comparison_table(comparison)
    return "\n".join([*describe_comparison(comparison, names), "", caption, *_markdown(header, rows)])
