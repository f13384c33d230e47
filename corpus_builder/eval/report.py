"""An eval run as a document (what is saved, what ``--json`` prints), its tables, and two saved runs side by side.

A run holds the pack's hash, the endpoints with their identities and speculators, the settings, the figures
per endpoint, mode and group (``all``, ``source:NAME``, ``task:NAME``), the ratios of every head to head A,
and every measurement window, so that ``--compare`` can pair two runs of the same pack prompt by prompt.
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from ..errors import CorpusError
from ..generate.types import IDENTITY_FIELDS, describe_identity
from ..outputs import staged
from .figures import BOOTSTRAP_SEED, CONFIDENCE, RATIO_FIGURES, RESAMPLES, Sums, Window, figure_ratios, paired_ratios
from .pack import Pack

RUN_FORMAT = "corpus-eval/1"
PROBE_BYTES = 64 * 1024  # what check_writable writes: room for a run of a few hundred windows
ALL = "all"
_POSITIONS_SHOWN = 4
FIGURE_TITLES = {"acceptance_rate": "acceptance rate", "mean_acceptance_length": "mean acceptance length",
                 "output_tokens_per_s": "output tok/s"}


class RunNotSaved(CorpusError):
    """A finished run that could not be saved (a full disk, a directory gone): ``run`` holds it, to be printed."""

    exit_code = 2  # as a build that meets a full disk

    def __init__(self, message: str, run: dict[str, Any], *, file: str) -> None:
        super().__init__(message, file=file)
        self.run = run


def run_document(pack: Pack, endpoints: list[dict[str, Any]], windows: list[Window], settings: dict[str, Any],
                 notes: list[str], remeasured: int, metrics_reads: dict[str, Any],
                 skipped: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The saved form of a run; figures and ratios are computed from ``windows``; ``skipped``: the prompts a server
    refused (each with its pack index), left out of every figure."""
    prompts = [{"id": p.id, "source": p.source, "task": p.task} for p in pack.prompts]
    document = {
        "format": RUN_FORMAT,
        "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "pack": {"path": str(pack.path), "sha256": pack.sha256, "prompts": len(pack.prompts), "rows": pack.rows,
                 "unreadable_rows": pack.unreadable, "folded_requests": pack.folded,
                 "repeated_prompts": pack.repeated},
        "settings": settings,
        "endpoints": endpoints,
        "notes": notes,
        "remeasured_windows": remeasured,
        "metrics_reads": metrics_reads,
        "prompts": prompts,
        "skipped_prompts": skipped or [],
        "windows": [w.to_dict() for w in windows],
    }
    return document | _figures_and_ratios(document)


def lost_rows(run: dict[str, Any]) -> tuple[int, int]:
    """(rows of the pack lost: unreadable, or refused by a server; the rows read)."""
    pack = run["pack"]
    lost = sum(pack["unreadable_rows"].values()) + len(run.get("skipped_prompts", ()))
    return lost, pack.get("rows", pack["prompts"] + sum(pack["unreadable_rows"].values()))


def _figures_and_ratios(run: dict[str, Any]) -> dict[str, Any]:
    windows = [Window.from_dict(doc) for doc in run["windows"]]
    labels = [endpoint["label"] for endpoint in run["endpoints"]]
    methods = {endpoint["label"]: endpoint["speculator"].get("method") for endpoint in run["endpoints"]}
    paired = run["settings"]["concurrency"] == 1
    groups = _run_groups(run) if paired else {ALL: None}
    figures, ratios = [], []
    for mode in run["settings"]["modes"]:
        for group, members in groups.items():
            chosen = {label: _chosen(windows, mode, label, members) for label in labels}
            measured = {label: Sums.of(chosen[label]).figures() for label in labels}
            figures += [{"endpoint": label, "mode": mode, "group": group, "temperature": run["settings"]["temperature"],
                         "method": methods[label], **measured[label]} for label in labels]
            for label in labels[1:]:
                compared = (paired_ratios(chosen[labels[0]], chosen[label]) if paired
                            else figure_ratios(measured[labels[0]], measured[label]))
                ratios += [{"a": labels[0], "b": label, "mode": mode, "group": group, "figure": figure, **value}
                           for figure, value in compared.items()]
    return {"figures": figures, "ratios": ratios}


def _chosen(windows: list[Window], mode: str, endpoint: str, members: set[int] | None) -> list[Window]:
    """The windows of one endpoint, mode and group (None: every prompt), in pack order."""
    return sorted((w for w in windows if w.endpoint == endpoint and w.mode == mode
                   and (members is None or w.prompt in members)), key=lambda w: w.prompt or 0)


def _run_groups(run: dict[str, Any]) -> dict[str, set[int] | None]:
    """Group -> the pack indices in it (None: every prompt): all, then each source, then each task, by name; the
    prompts a server refused are in none."""
    skipped = {skip["prompt"] for skip in run.get("skipped_prompts", ())}
    named: dict[str, set[int]] = {}
    for index, prompt in enumerate(run["prompts"]):
        if index in skipped:
            continue
        named.setdefault(f"source:{prompt['source']}", set()).add(index)
        if prompt["task"] is not None:
            named.setdefault(f"task:{prompt['task']}", set()).add(index)
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


def save_run(run: dict[str, Any], directory: Path) -> Path:
    """Write ``run`` as ``directory/<timestamp>-<hash>.json`` (staged, then renamed into place; readable by all,
    as every output is); RunNotSaved, holding the run, when it cannot be written."""
    body = orjson.dumps(run, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
    stamp = run["created"].replace("-", "").replace(":", "")
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


class _Number:
    """A finite number in a saved run (JSON has no NaN: a figure that was one is saved as null)."""


_OR_NONE = type(None)
_FIGURES = {"mode": str, "endpoint": str, "group": str, "requests": int, "output_tokens": (int, _OR_NONE),
            "acceptance_rate": (_Number, _OR_NONE), "mean_acceptance_length": (_Number, _OR_NONE),
            "acceptance_by_position": [_Number], "output_tokens_per_s": (_Number, _OR_NONE),
            "tpot_ms": (_Number, _OR_NONE), "method": (str, _OR_NONE)}
# What reading a saved run (its tables, its page, a comparison, the audit's section) relies on.
_RUN_SHAPE: dict[str, Any] = {
    "created": str,
    "pack": {"path": str, "sha256": str, "prompts": int, "unreadable_rows": dict},
    "settings": {"modes": [str], "concurrency": int, "temperature": (_Number, _OR_NONE), "temperature_from": str,
                 "max_tokens": int},
    "endpoints": [{"label": str, "url": str, "identity": dict, "speculator": dict}],
    "notes": [str],
    "metrics_reads": {"count": int, "seconds": _Number},
    "prompts": [{"id": str, "source": str, "task": (str, _OR_NONE)}],
    "windows": [{"endpoint": str, "mode": str, "prompt": (int, _OR_NONE), "requests": int,
                 "output_tokens": (int, _OR_NONE), "seconds": _Number, "drafts": _Number, "draft_tokens": _Number,
                 "accepted": _Number, "accepted_by_position": [_Number], "tpot_sum": _Number, "tpot_count": _Number}],
    "figures": [_FIGURES],
    "ratios": [{"a": str, "b": str, "mode": str, "group": str, "figure": str, "ratio": (_Number, _OR_NONE),
                "low": (_Number, _OR_NONE), "high": (_Number, _OR_NONE)}],
}


def _shape_problem(value: Any, shape: Any, where: str) -> str | None:
    """Where ``value`` breaks ``shape`` (a type, a tuple of them, {key: shape} for an object, [shape] for a list of
    them), or None."""
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"{where} is not an object"
        for key, inner in shape.items():
            if key not in value:
                return f"{where}.{key} is missing".lstrip(".")
            problem = _shape_problem(value[key], inner, f"{where}.{key}")
            if problem is not None:
                return problem
        return None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"{where} is not a list"
        return next((problem for index, item in enumerate(value)
                     if (problem := _shape_problem(item, shape[0], f"{where}[{index}]")) is not None), None)
    kinds = shape if isinstance(shape, tuple) else (shape,)
    number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if any(value is None if kind is _OR_NONE else number if kind is _Number
           else isinstance(value, kind) and not isinstance(value, bool) for kind in kinds):
        return None
    return f"{where} is {orjson.dumps(value).decode()[:40]}, not {' or '.join(_KIND_NAMES[kind] for kind in kinds)}"


_KIND_NAMES = {str: "a string", int: "an integer", dict: "an object", _Number: "a number", _OR_NONE: "null"}


def load_run(path: Path) -> dict[str, Any]:
    """A run ``evaluate`` saved, checked to hold what its readers read (a run cut short or edited by hand, or saved
    by an eval that let a NaN through as null, is refused, naming the key)."""
    try:
        run = orjson.loads(Path(path).read_bytes())
    except FileNotFoundError:
        raise CorpusError("no such file", file=str(path)) from None
    except (OSError, orjson.JSONDecodeError) as error:
        raise CorpusError(f"not a saved eval run: {error}", file=str(path)) from None
    if not isinstance(run, dict) or run.get("format") != RUN_FORMAT:
        raise CorpusError(f"not a saved eval run (format {RUN_FORMAT})", file=str(path))
    problem = _shape_problem(run, _RUN_SHAPE, "")
    if problem is not None:
        raise CorpusError(f"not a whole saved eval run: {problem.lstrip('.')}", file=str(path))
    return run


# ---- tables --------------------------------------------------------------------------------------

def _number(value: Any, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _temperature(settings: dict[str, Any]) -> str:
    value = settings["temperature"]
    return "target default" if value is None else f"{value:g}"


def _markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    """An aligned Markdown table (as a model card has): readable in a terminal, pasteable into a card."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)) + " |"

    return [line(header), "|" + "|".join("-" * (width + 2) for width in widths) + "|", *map(line, rows)]


def _positions(values: list[float]) -> str:
    shown = " ".join(f"{value:.2f}" for value in values[:_POSITIONS_SHOWN])
    return shown + (" ..." if len(values) > _POSITIONS_SHOWN else "") if values else "n/a"


def _interval(ratio: dict[str, Any]) -> str:
    if ratio["ratio"] is None:
        return "n/a"
    if ratio["low"] is None:
        return f"{ratio['ratio']:.3f}"
    return f"{ratio['ratio']:.3f} [{ratio['low']:.3f}, {ratio['high']:.3f}]"


def describe_endpoint(endpoint: dict[str, Any]) -> str:
    identity = describe_identity({key: endpoint["identity"].get(key) for key in (*IDENTITY_FIELDS, "revision")})
    speculator = endpoint["speculator"]
    if speculator.get("told_by"):
        told = f"{speculator.get('method')} {speculator.get('model') or ''}".rstrip()
        told += f", {speculator.get('num_speculative_tokens')} tokens (told by {speculator['told_by']})"
    else:
        told = (f"not told ({speculator.get('num_speculative_tokens')} draft positions in the counters; "
                "VLLM_SERVER_DEV_MODE=1 opens /server_info)")
    counted = endpoint.get("counters", "/metrics")  # runs saved before per-request counts read /metrics
    return f"{endpoint['label']} {endpoint['url']}: {identity}; speculator: {told}; counted by {counted}"


FIGURE_HEADER = ("mode", "head", "group", "requests", "output tokens", "acceptance rate", "mean acceptance length",
                 "acceptance by position", "output tok/s", "TPOT ms", "temperature", "method")


def describe_run(run: dict[str, Any]) -> list[str]:
    """The lines above a run's tables: the pack, the settings, the endpoints, the notes, what reading the counters
    cost."""
    settings, pack = run["settings"], run["pack"]
    lines = [f"eval of {pack['path']} ({pack['prompts']} prompts, sha256 {pack['sha256'][:12]}) at concurrency "
             f"{settings['concurrency']}, temperature {_temperature(settings)} ({settings['temperature_from']}), "
             f"max_tokens {settings['max_tokens']}"]
    lines += [describe_endpoint(endpoint) for endpoint in run["endpoints"]]
    lines += [f"note: {note}" for note in run["notes"]]
    reads, requests = run["metrics_reads"], sum(w["seconds"] for w in run["windows"])
    if reads["count"]:
        lines.append(f"counters read {reads['count']} times, {1000 * reads['seconds'] / reads['count']:.1f} ms each "
                     f"({100 * reads['seconds'] / requests if requests else 0:.1f}% of the time the requests took)")
    return lines


def figure_cells(row: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """One of a run's ``figures`` as a row of its table (``FIGURE_HEADER``)."""
    tokens = row["output_tokens"]
    return [row["mode"], row["endpoint"], row["group"], str(row["requests"]), "n/a" if tokens is None else str(tokens),
            _number(row["acceptance_rate"]), _number(row["mean_acceptance_length"], 2),
            _positions(row["acceptance_by_position"]), _number(row["output_tokens_per_s"], 1),
            _number(row["tpot_ms"], 2), _temperature(settings), str(row["method"] or "not told")]


def ratio_table(run: dict[str, Any]) -> tuple[str, list[str], list[list[str]]]:
    """A run's ratios of every head to head A: (how they were measured, header, rows)."""
    paired = run["settings"]["concurrency"] == 1
    caption = (("paired over the same prompts, sent in a rotating order; "
                f"{100 * CONFIDENCE:g}% bootstrap interval ({RESAMPLES} resamples, seed {BOOTSTRAP_SEED})")
               if paired else "whole phases (no interval: pairing prompts needs concurrency 1)")
    keyed: dict[tuple[str, str, str, str], dict[str, str]] = {}
    for ratio in run["ratios"]:
        keyed.setdefault((ratio["mode"], ratio["group"], ratio["a"], ratio["b"]), {})[ratio["figure"]] = \
            _interval(ratio)
    rows = [[mode, f"{b} / {a}", group, *(values.get(figure, "n/a") for figure in RATIO_FIGURES)]
            for (mode, group, a, b), values in keyed.items()]
    return caption, ["mode", "heads", "group", *(FIGURE_TITLES[f] for f in RATIO_FIGURES)], rows


def format_run(run: dict[str, Any]) -> str:
    rows = [figure_cells(row, run["settings"]) for row in run["figures"]]
    lines = [*describe_run(run), "", *_markdown(list(FIGURE_HEADER), rows)]
    if run["ratios"]:
        caption, header, rows = ratio_table(run)
        lines += ["", caption, *_markdown(header, rows)]
    return "\n".join(lines)


def compare_runs(run_a: dict[str, Any], run_b: dict[str, Any]) -> dict[str, Any]:
    """Two saved runs side by side: the figures of each (mode, head, group) both have, B over A, and an interval
    paired prompt by prompt where both replayed the same pack at concurrency 1."""
    same_pack = run_a["pack"]["sha256"] == run_b["pack"]["sha256"]
    paired = same_pack and run_a["settings"]["concurrency"] == run_b["settings"]["concurrency"] == 1
    notes = []
    if not same_pack:
        notes.append("the runs replayed different packs: their figures are not paired")
    for key in ("temperature", "max_tokens", "modes", "concurrency"):
        if run_a["settings"].get(key) != run_b["settings"].get(key):
            notes.append(f"{key} differs: {run_a['settings'].get(key)} in A, {run_b['settings'].get(key)} in B")
    identities_a = {e["label"]: e["identity"] for e in run_a["endpoints"]}
    for endpoint in run_b["endpoints"]:
        if endpoint["label"] in identities_a and identities_a[endpoint["label"]] != endpoint["identity"]:
            notes.append(f"head {endpoint['label']} ran on different targets in the two runs")
    figures_b = {(f["mode"], f["endpoint"], f["group"]): f for f in run_b["figures"]}
    windows_a = [Window.from_dict(doc) for doc in run_a["windows"]]
    windows_b = [Window.from_dict(doc) for doc in run_b["windows"]]
    groups = _run_groups(run_a) if paired else {}
    rows = []
    for figure_a in run_a["figures"]:
        mode, endpoint, group = figure_a["mode"], figure_a["endpoint"], figure_a["group"]
        figure_b = figures_b.get((mode, endpoint, group))
        if figure_b is None:
            continue
        members = groups.get(group)
        ratios = (paired_ratios(*(_chosen(windows, mode, endpoint, members) for windows in (windows_a, windows_b)))
                  if paired else figure_ratios(figure_a, figure_b))
        rows.append({"mode": mode, "endpoint": endpoint, "group": group, "a": figure_a, "b": figure_b,
                     "ratios": ratios})
    return {"a": {"created": run_a["created"], "pack": run_a["pack"], "settings": run_a["settings"],
                  "endpoints": run_a["endpoints"]},
            "b": {"created": run_b["created"], "pack": run_b["pack"], "settings": run_b["settings"],
                  "endpoints": run_b["endpoints"]},
            "paired": paired, "notes": notes, "rows": rows}


def describe_comparison(comparison: dict[str, Any], names: tuple[str, str]) -> list[str]:
    """The lines above a comparison's table: each run (``names``: how they were given) with its endpoints, and the
    notes."""
    lines = []
    for side, name in zip(("a", "b"), names, strict=True):
        run = comparison[side]
        lines.append(f"run {side.upper()} {name}: {run['created']}, pack sha256 {run['pack']['sha256'][:12]}, "
                     f"temperature {_temperature(run['settings'])}, concurrency {run['settings']['concurrency']}")
        lines += ["  " + describe_endpoint(endpoint) for endpoint in run["endpoints"]]
    return lines + [f"note: {note}" for note in comparison["notes"]]


def comparison_table(comparison: dict[str, Any]) -> tuple[str, list[str], list[list[str]]]:
    """Run B beside run A: (how B / A was measured, header, rows)."""
    header = ["mode", "head", "group"]
    for figure in RATIO_FIGURES:
        header += [f"{FIGURE_TITLES[figure]} A", "B", "B / A"]
    rows = []
    for row in comparison["rows"]:
        cells = [row["mode"], row["endpoint"], row["group"]]
        for figure in RATIO_FIGURES:
            digits = 1 if figure == "output_tokens_per_s" else 3
            cells += [_number(row["a"][figure], digits), _number(row["b"][figure], digits),
                      _interval(row["ratios"][figure])]
        rows.append(cells)
    caption = ("B / A paired prompt by prompt (the same pack at concurrency 1), "
               f"{100 * CONFIDENCE:g}% bootstrap interval") if comparison["paired"] else "B / A (not paired)"
    return caption, header, rows


def format_comparison(comparison: dict[str, Any], names: tuple[str, str]) -> str:
    caption, header, rows = comparison_table(comparison)
    return "\n".join([*describe_comparison(comparison, names), "", caption, *_markdown(header, rows)])
