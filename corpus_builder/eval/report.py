"""An eval run's figures (``with_figures``), its tables, its file, and two saved runs side by side.

The figures per endpoint, mode and group (``all``, ``source:NAME``, ``task:NAME``) and the ratios of every head
to head A follow from a run's windows; ``--compare`` pairs two runs of the same pack prompt by prompt.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import orjson

from ..errors import CorpusError
from ..generate.types import IDENTITY_FIELDS, describe_identity
from ..outputs import staged
from .figures import (
    BOOTSTRAP_SEED,
    CONFIDENCE,
    MIN_INTERVAL_PAIRS,
    RATIO_FIGURES,
    RESAMPLES,
    LoopGap,
    Ratio,
    Sums,
    Window,
    figure_ratios,
    loop_gap,
    paired_ratios,
)
from .json_values import Json, JsonObject
from .loops import LOOP_NGRAM
from .pack import Pack
from .run import (
    Endpoint,
    Figure,
    HeadLoops,
    HeadRatio,
    PackInfo,
    PromptInfo,
    Reads,
    Run,
    RunSettings,
    Skip,
    as_json,
    json_value,
)

PROBE_BYTES = 64 * 1024  # what check_writable writes: room for a run of a few hundred windows
ALL = "all"
WITHOUT_LOOPS = " without loops"  # a group without the prompts on which some head's answer loops
_POSITIONS_SHOWN = 4
FIGURE_TITLES = {"acceptance_rate_pooled": "acceptance rate (pooled)",
                 "acceptance_rate_per_request": "acceptance rate (per request)",
                 "mean_acceptance_length_pooled": "mean acceptance length (pooled)",
                 "mean_acceptance_length_per_request": "mean acceptance length (per request)",
                 "output_tokens_per_s": "output tok/s (pooled)",
                 "output_tokens_per_s_per_request": "output tok/s (per request)"}


class RunNotSaved(CorpusError):
    """A finished run that could not be saved (a full disk, a directory gone): ``run`` holds it, to be printed."""

    exit_code = 2  # as a build that meets a full disk

    def __init__(self, message: str, run: Run, *, file: str) -> None:
        super().__init__(message, file=file)
        self.run = run


def run_document(pack: Pack, endpoints: Sequence[Endpoint], windows: Sequence[Window], settings: RunSettings,
                 notes: Sequence[str], remeasured: int, metrics_reads: Reads, skipped: Sequence[Skip] = ()) -> Run:
    """A run of ``pack`` on ``endpoints`` (as a replay describes them), its figures and ratios computed from
    ``windows``; ``skipped``: the prompts a server refused (each with its pack index), left out of every figure."""
    run = Run(
        created=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        pack=PackInfo(str(pack.path), pack.sha256, len(pack.prompts), pack.rows, dict(pack.unreadable), pack.folded,
                      pack.repeated),
        settings=settings,
        endpoints=tuple(endpoints),
        notes=tuple(notes),
        prompts=tuple(PromptInfo(p.id, p.source, p.task, 1 + sum(m.get("role") == "assistant" for m in p.messages))
                      for p in pack.prompts),
        windows=tuple(windows), remeasured_windows=remeasured, metrics_reads=metrics_reads,
        skipped_prompts=tuple(skipped))
    return with_figures(run)


def lost_rows(run: Run) -> tuple[int, int]:
    """(rows of the pack lost: unreadable, or refused by a server; the rows read)."""
    return sum(run.pack.unreadable_rows.values()) + len(run.skipped_prompts), run.pack.rows


def with_figures(run: Run) -> Run:
    """``run`` with its figures, ratios and loop gaps, computed from its windows."""
    labels = [endpoint.label for endpoint in run.endpoints]
    paired = run.settings.concurrency == 1
    threshold = run.settings.loop_threshold
    figures: list[Figure] = []
    ratios: list[HeadRatio] = []
    gaps: list[HeadLoops] = []
    for mode in run.settings.modes:
        groups = _run_groups(run, mode) if paired else _phase_groups(run, mode)
        for group, members in groups.items():
            chosen = {label: _chosen(run.windows, mode, label, members) for label in labels}
            measured = {label: _figure(run, label, mode, group, chosen[label]) for label in labels}
            figures += measured.values()
            for label in labels[1:]:
                compared = (paired_ratios(chosen[labels[0]], chosen[label]) if paired
                            else figure_ratios(measured[labels[0]], measured[label]))
                ratios += [HeadRatio(labels[0], label, mode, group, value) for value in compared]
                gap = _gap(chosen[labels[0]], chosen[label], threshold) if paired else None
                if gap is not None and not group.endswith(WITHOUT_LOOPS):
                    gaps.append(HeadLoops(labels[0], label, mode, group, gap))
    return replace(run, figures=tuple(figures), ratios=tuple(ratios), loop_gaps=tuple(gaps),
                   missing=_missing(run, figures))


def _figure(run: Run, endpoint: str, mode: str, group: str, windows: list[Window]) -> Figure:
    """The figures of one endpoint's windows in one mode and group."""
    method = next(e.speculator.method for e in run.endpoints if e.label == endpoint)
    return Figure.of(Sums.of(windows).figures(), endpoint=endpoint, mode=mode, group=group,
                     temperature=run.settings.temperature, method=method,
                     loops=_loops(windows, run.settings.loop_threshold))


def _missing(run: Run, figures: list[Figure]) -> tuple[str, ...]:
    """The figures a run cannot give, named (printed under its heading; n/a in its tables)."""
    missing = []
    if any(f.drafts and f.mean_acceptance_length_per_request is None for f in figures):
        missing.append("per-request acceptance: each request's own counts are not known (a phase at concurrency > 1 "
                       "counted by /metrics: a server with --per-request-spec-decode-metrics gives them)")
    if any(f.drafts and f.acceptance_by_position_per_request is None for f in figures):
        missing.append("per-request acceptance by position and accepted lengths: each request's own counts by "
                       "position are not known (a phase at concurrency > 1 counted by /metrics, or a run saved before "
                       "they were recorded: a server with --per-request-spec-decode-metrics gives them)")
    if any(f.output_tokens is not None and f.output_tokens_per_s_per_request is None and f.requests
           for f in figures):
        missing.append("per-request output tok/s: a request in a phase at concurrency > 1 has no time of its own "
                       "(concurrency 1 gives it)")
    if any(f.loops is None for f in figures):
        missing.append("loops: the answers' repetition is not recorded (a run saved before it was: format "
                       "corpus-eval/1), so no loop share and no figures without loops")
    elif run.settings.concurrency > 1 and any(f.loops for f in figures):
        if any(f.group == ALL + WITHOUT_LOOPS for f in figures):
            missing.append("output tok/s and TPOT without loops: a phase at concurrency > 1 has one time, not one per "
                           "answer (its other figures without loops are its answers' own counts)")
        else:
            missing.append("figures without loops: a phase at concurrency > 1 is counted as a whole, and its answers "
                           "carry no counts of their own (a server with --per-request-spec-decode-metrics gives them)")
    for endpoint in run.endpoints:
        answers = [answer for w in run.windows if w.endpoint == endpoint.label for answer in w.answers]
        if not any(answer.drafts is not None for answer in answers):
            missing.append(f"per-step counts of {endpoint.label}: counted by /metrics, whose pooled counters give the "
                           "histogram of accepted lengths exactly but no request's own and no verify step's; a server "
                           "with --per-request-spec-decode-metrics detailed gives each step")
        elif not any(answer.per_step_accepted is not None for answer in answers):
            missing.append(f"per-step counts of {endpoint.label}: --per-request-spec-decode-metrics summary gives each "
                           "request's totals and histogram, not its verify steps in order (detailed does)")
    if run.settings.concurrency == 1:  # slices need a window a request
        if any(not w.answers or w.answers[0].input_tokens is None for w in run.windows):
            missing.append("input-length slices: the prompts' lengths in target tokens are not known (a run saved as "
                           "corpus-eval/1, or a server that told no usage)")
        if any(prompt.turn is None for prompt in run.prompts):
            missing.append("turn slices: the prompts' turns are not recorded (a run saved as corpus-eval/1)")
    return tuple(missing)


def _loops(windows: list[Window], threshold: float) -> int | None:
    """How many of the windows' answers loop; None when an answer's repetition is not known."""
    shares = [answer.repetition for w in windows for answer in w.answers]
    if len(shares) != sum(w.requests for w in windows) or None in shares:
        return None
    return sum(share >= threshold for share in shares if share is not None)


def _looped(window: Window, threshold: float) -> bool | None:
    """Whether the answer of a window of one request loops (None: not known)."""
    count = _loops([window], threshold) if window.requests == 1 else None
    return None if count is None else count > 0


def _gap(a: list[Window], b: list[Window], threshold: float) -> LoopGap | None:
    """B's loop share minus A's over the same prompts (windows of one request, paired in pack order)."""
    looped = [[_looped(w, threshold) for w in side] for side in (a, b)]
    if any(flag is None for side in looped for flag in side):
        return None
    return loop_gap(*(tuple(bool(flag) for flag in side) for side in looped))


SLICE_KINDS = ("source", "task", "length", "turn")
LATER_TURNS = 4  # turns from the fourth on are one slice


def _length_slice(tokens: int, edges: tuple[int, ...]) -> str:
    """The input-length slice of a prompt of ``tokens`` target tokens: length:<512, length:512-2k, ...,
    length:>=32k."""
    below = next((index for index, edge in enumerate(edges) if tokens < edge), len(edges))
    if below == 0:
        return f"length:<{_tokens(edges[0])}"
    if below == len(edges):
        return f"length:>={_tokens(edges[-1])}"
    return f"length:{_tokens(edges[below - 1])}-{_tokens(edges[below])}"


def _tokens(count: int) -> str:
    return f"{count // 1024}k" if count >= 1024 and count % 1024 == 0 else str(count)


def _turn_slice(turn: int) -> str:
    return f"turn:{turn}" if turn < LATER_TURNS else f"turn:{LATER_TURNS}+"


def _group_order(edges: tuple[int, ...]) -> Callable[[str], tuple[int, int, str]]:
    """Sources, tasks, input lengths (shortest first), turns; by name within each."""
    slices = [_length_slice(tokens, edges) for tokens in (0, *edges)]

    def order(group: str) -> tuple[int, int, str]:
        kind = group.partition(":")[0]
        return SLICE_KINDS.index(kind), slices.index(group) if group in slices else 0, group

    return order


def _chosen(windows: tuple[Window, ...], mode: str, endpoint: str, members: set[int] | None) -> list[Window]:
    """The windows of one endpoint, mode and group (None: every prompt), in pack order; within a group, a phase
    gives its answers' own counts (``Window.by_answer``)."""
    mine = [w for w in windows if w.endpoint == endpoint and w.mode == mode]
    if members is not None:
        mine = [part for w in mine for part in (w.by_answer() if w.prompt is None else [w]) if part.prompt in members]
    return sorted(mine, key=lambda w: w.prompt or 0)


def _phase_groups(run: Run, mode: str) -> dict[str, set[int] | None]:
    """The groups of a run at concurrency > 1: all, and all without the prompts on which some head's answer loops
    where every answer of the mode carries its own counts (``--per-request-spec-decode-metrics``)."""
    answers = [answer for w in run.windows if w.mode == mode for answer in w.answers]
    if len(answers) != sum(w.requests for w in run.windows if w.mode == mode) or \
            any(answer.counts() is None for answer in answers):
        return {ALL: None}
    threshold = run.settings.loop_threshold
    looping = {a.prompt for a in answers if a.repetition is not None and a.repetition >= threshold}
    if not looping:
        return {ALL: None}
    return {ALL: None, ALL + WITHOUT_LOOPS: {a.prompt for a in answers} - looping}


def _run_groups(run: Run, mode: str) -> dict[str, set[int] | None]:
    """Group -> the pack indices in it (None: every prompt): all, then each source, task, input length (the
    slices of ``length_edges``, in target tokens as the server counted them in ``mode``) and turn, by name; the
    prompts a server refused are in none. Where some head's answer loops in ``mode``, each group is followed by
    itself without the prompts of those answers (every head's, so that the heads stay paired)."""
    skipped = {skip.prompt for skip in run.skipped_prompts}
    kept = {index for index in range(len(run.prompts)) if index not in skipped}
    lengths = {answer.prompt: answer.input_tokens for w in run.windows if w.mode == mode for answer in w.answers
               if answer.input_tokens is not None}
    named: dict[str, set[int]] = {}
    for index in sorted(kept):
        prompt = run.prompts[index]
        names = [f"source:{prompt.source}", f"task:{prompt.task}" if prompt.task is not None else None,
                 _length_slice(lengths[index], run.settings.length_edges) if index in lengths else None,
                 _turn_slice(prompt.turn) if prompt.turn is not None else None]
        for name in filter(None, names):
            named.setdefault(name, set()).add(index)
    order = sorted(named, key=_group_order(run.settings.length_edges))
    groups: dict[str, set[int] | None] = {ALL: None, **{group: named[group] for group in order}}
    threshold = run.settings.loop_threshold
    looping = {w.prompt for w in run.windows if w.mode == mode and w.prompt is not None and _looped(w, threshold)}
    if not looping:
        return groups
    with_loops_apart: dict[str, set[int] | None] = {}
    for group, members in groups.items():
        with_loops_apart[group] = members
        with_loops_apart[group + WITHOUT_LOOPS] = (kept if members is None else members) - looping
    return with_loops_apart


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
    return with_figures(Run.from_json(document, str(path)))


# ---- tables --------------------------------------------------------------------------------------

def _number(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _temperature(settings: RunSettings) -> str:
    return "target default" if settings.temperature is None else f"{settings.temperature:g}"


def _markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    """An aligned Markdown table (as a model card has): readable in a terminal, pasteable into a card."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)) + " |"

    return [line(header), "|" + "|".join("-" * (width + 2) for width in widths) + "|", *map(line, rows)]


def _positions(values: tuple[float, ...] | None) -> str:
    """The first few positions' acceptance; n/a where none is known."""
    if not values:
        return "n/a"
    shown = " ".join(f"{value:.2f}" for value in values[:_POSITIONS_SHOWN])
    return shown + (" ..." if len(values) > _POSITIONS_SHOWN else "")


def _too_few(pairs: int | None) -> str:
    """What stands for an interval a slice is too small for ("" where it is not: unpaired, or enough pairs)."""
    return f" (no interval: {pairs} prompts, under {MIN_INTERVAL_PAIRS})" if pairs is not None and \
        pairs < MIN_INTERVAL_PAIRS else ""


def _interval(ratio: Ratio) -> str:
    if ratio.ratio is None:
        return "n/a"
    if ratio.low is None or ratio.high is None:
        return f"{ratio.ratio:.3f}{_too_few(ratio.pairs)}"
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


FIGURE_HEADER = ("mode", "head", "group", "requests", "loops", "output tokens",
                 *(FIGURE_TITLES[f] for f in RATIO_FIGURES[:4]), "acceptance by position (pooled)",
                 "acceptance by position (per request)", *(FIGURE_TITLES[f] for f in RATIO_FIGURES[4:]), "TPOT ms",
                 "temperature", "method")


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
    return [row.mode, row.endpoint, row.group, str(row.requests), "n/a" if row.loops is None else str(row.loops),
            "n/a" if tokens is None else str(tokens),
            _number(row.acceptance_rate_pooled), _number(row.acceptance_rate_per_request),
            _number(row.mean_acceptance_length_pooled, 2), _number(row.mean_acceptance_length_per_request, 2),
            _positions(row.acceptance_by_position),
            _positions(row.acceptance_by_position_per_request),
            _number(row.output_tokens_per_s, 1), _number(row.output_tokens_per_s_per_request, 1),
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


LENGTH_HEADER = ("mode", "head", "group", "verify steps", "accepted 0..k (pooled: share of steps)",
                 "accepted 0..k (per request: each one's shares, then their mean)", "marginal by position",
                 "conditional by position")


def _shares(values: tuple[float, ...]) -> str:
    return " ".join(f"{value:.2f}" for value in values) if values else "n/a"


def length_table(run: Run) -> tuple[str, list[str], list[list[str]]]:
    """The accepted lengths over the whole pack: (how, header, rows)."""
    caption = ("accepted lengths: the share of verify steps that accepted exactly 0, 1, ..., k drafted tokens; "
               "marginal: the first i+1 drafted tokens all accepted; conditional: position i accepted given every "
               "one before it")
    rows = [[f.mode, f.endpoint, f.group, f"{f.drafts:g}", _shares(f.accepted_histogram),
             _shares(f.accepted_histogram_per_request or ()), _shares(f.acceptance_by_position),
             _shares(f.conditional_by_position)]
            for f in run.figures if f.group in (ALL, ALL + WITHOUT_LOOPS)]
    return caption, list(LENGTH_HEADER), rows


LOOP_HEADER = ("mode", "heads", "group", "loop share A", "loop share B", "B - A", "loops")


def _gap_cells(gap: LoopGap) -> list[str]:
    if gap.low is None or gap.high is None:
        return [f"{gap.share_a:.3f}", f"{gap.share_b:.3f}", f"{gap.difference:+.3f}{_too_few(gap.pairs)}", "n/a"]
    return [f"{gap.share_a:.3f}", f"{gap.share_b:.3f}", f"{gap.difference:+.3f} [{gap.low:+.3f}, {gap.high:+.3f}]",
            "DIFFER: compare without loops" if gap.flagged else "alike"]


def loop_table(run: Run) -> tuple[str, list[str], list[list[str]]]:
    """Each head's share of looping answers beside head A's: (how, header, rows); flagged where they differ."""
    caption = (f"loop share: answers whose repetition (the share of their tokens inside {LOOP_NGRAM}-grams seen "
               f"earlier in them) is {run.settings.loop_threshold:g} or more; B - A paired over the same prompts, "
               f"{100 * CONFIDENCE:g}% bootstrap interval, DIFFER where it excludes 0")
    rows = [[gap.mode, f"{gap.b} / {gap.a}", gap.group, *_gap_cells(gap.value)] for gap in run.loop_gaps]
    return caption, list(LOOP_HEADER), rows


WIN_FIGURES = ("mean_acceptance_length_pooled", "mean_acceptance_length_per_request", "output_tokens_per_s",
               "output_tokens_per_s_per_request")


def _ratios_of(run: Run, mode: str, group: str, figure: str) -> list[HeadRatio]:
    return [r for r in run.ratios if (r.mode, r.group, r.value.figure) == (mode, group, figure)]


def _winner(run: Run, mode: str, group: str, figure: str) -> str | None:
    """The head that wins ``figure`` in a mode and group: one whose ratio to head A has an interval above 1 (the
    highest such), else head A when every other's is below 1; None for a tie or where there is no interval."""
    ratios = _ratios_of(run, mode, group, figure)
    if not ratios or any(r.value.low is None or r.value.high is None for r in ratios):
        return None
    above = [r for r in ratios if r.value.low is not None and r.value.low > 1]
    if above:
        return max(above, key=lambda r: r.value.ratio or 0.0).b
    return ratios[0].a if all(r.value.high is not None and r.value.high < 1 for r in ratios) else None


def _drafter(run: Run, label: str | None) -> str:
    if label is None:
        return "tie"
    method = next(e.speculator.method for e in run.endpoints if e.label == label)
    return f"{label} ({method})" if method else label


def _won(run: Run, mode: str, group: str, figure: str) -> str:
    """A cell of the winners' table: the winner (or tie), then each head's ratio to head A with its interval (or
    why it has none)."""
    ratios = _ratios_of(run, mode, group, figure)
    shown = ", ".join(f"{r.b} / {r.a} {_interval(r.value)}" for r in ratios)
    return f"{_drafter(run, _winner(run, mode, group, figure))}: {shown}"


def _routed(run: Run, mode: str, group: str) -> str:
    """Where a slice routes: the winner by mean acceptance length pooled, and the winner per request beside it where
    that one has an interval and names another head (or a tie)."""
    pooled = _winner(run, mode, group, WIN_FIGURES[0])
    own = _ratios_of(run, mode, group, WIN_FIGURES[1])
    per_request = _winner(run, mode, group, WIN_FIGURES[1])
    measured = bool(own) and all(r.value.low is not None and r.value.high is not None for r in own)
    return _drafter(run, pooled) + (f" (per request: {_drafter(run, per_request)})"
                                    if measured and per_request != pooled else "")


def winner_table(run: Run) -> tuple[str, list[str], list[list[str]]]:
    """Which head wins where: per mode and slice, the head with the higher mean acceptance length and output tok/s,
    each pooled and per request, where the interval excludes a tie, with B / A and its interval: (how, header,
    rows)."""
    caption = (f"which drafter wins where: the head whose B / A interval ({100 * CONFIDENCE:g}%) excludes 1, with "
               "B / A and its interval; tie where it does not, or where a slice is too small for an interval")
    keys = dict.fromkeys((r.mode, r.group) for r in run.ratios if not r.group.endswith(WITHOUT_LOOPS))
    requests = {(f.mode, f.group): f.requests for f in run.figures if f.endpoint == run.endpoints[0].label}
    rows = [[mode, group, str(requests[mode, group]), *(_won(run, mode, group, figure) for figure in WIN_FIGURES)]
            for mode, group in keys] if run.settings.concurrency == 1 else []
    return caption, ["mode", "group", "requests", *(FIGURE_TITLES[figure] for figure in WIN_FIGURES)], rows


def routing(run: Run) -> list[str]:
    """The routing the winners imply, per mode (with two heads or more, at concurrency 1): the slices whose winner by
    mean acceptance length (pooled; ``_routed``) differs from the whole pack's, only where the interval excludes a
    tie, then everything else; a mode where none does says so."""
    if len(run.endpoints) < 2 or run.settings.concurrency != 1:
        return []
    lines = []
    for mode in run.settings.modes:
        overall = _winner(run, mode, ALL, WIN_FIGURES[0])
        groups = dict.fromkeys(r.group for r in run.ratios if r.mode == mode and r.group != ALL
                               and not r.group.endswith(WITHOUT_LOOPS))
        parts = [f"{group}: {_routed(run, mode, group)}" for group in groups
                 if (winner := _winner(run, mode, group, WIN_FIGURES[0])) is not None and winner != overall]
        parts.append(f"everything else: {_routed(run, mode, ALL)}" if overall is not None else
                     "everything else: no winner (tie)")
        lines.append(f"routing, {mode} mode: " + "; ".join(parts))
    return lines


def format_run(run: Run) -> str:
    rows = [figure_cells(row, run.settings) for row in run.figures]
    lines = [*describe_run(run), "", *_markdown(list(FIGURE_HEADER), rows)]
    for part in (length_table, ratio_table, loop_table, winner_table):
        caption, header, rows = part(run)
        if rows:
            lines += ["", caption, *_markdown(header, rows)]
    return "\n".join([*lines, *routing(run)])


@dataclass(frozen=True, slots=True)
class ComparedRow:
    """One (mode, head, group) both runs have: its figures in each, and B over A."""

    mode: str
    endpoint: str
    group: str
    a: Figure
    b: Figure
    ratios: tuple[Ratio, ...]
    loops: LoopGap | None = None  # B's loop share minus A's, where both runs' answers tell theirs

    def ratio(self, figure: str) -> Ratio:
        return next(ratio for ratio in self.ratios if ratio.figure == figure)


@dataclass(frozen=True, slots=True)
class Comparison:
    """Two saved runs side by side (``runs``: A and B); ``paired``: B / A paired prompt by prompt."""

    runs: tuple[Run, Run]
    paired: bool
    notes: tuple[str, ...]
    rows: tuple[ComparedRow, ...]

    def to_json(self) -> JsonObject:
        """What ``--compare --json`` prints: each run's heading (not its windows), the notes and the rows."""
        sides: dict[str, Json] = {side: {"created": run.created, "format": run.format, "pack": as_json(run.pack),
                        "settings": as_json(run.settings), "endpoints": [as_json(e) for e in run.endpoints],
                        "missing": list(run.missing)} for side, run in zip("ab", self.runs, strict=True)}
        rows: list[Json] = [{"mode": row.mode, "endpoint": row.endpoint, "group": row.group, "a": as_json(row.a),
                 "b": as_json(row.b), "ratios": {ratio.figure: as_json(ratio) for ratio in row.ratios},
                 "loops": None if row.loops is None else as_json(row.loops)}
                for row in self.rows]
        return {**sides, "paired": self.paired, "notes": list(self.notes), "rows": rows}


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
    rows = _paired_rows(run_a, run_b) if paired else _unpaired_rows(run_a, run_b)
    return Comparison((run_a, run_b), paired, tuple(notes), tuple(rows))


def _unpaired_rows(run_a: Run, run_b: Run) -> list[ComparedRow]:
    """The (mode, head, group) both runs have, B over A from their figures."""
    figures_b = {(f.mode, f.endpoint, f.group): f for f in run_b.figures}
    return [ComparedRow(a.mode, a.endpoint, a.group, a, b, tuple(figure_ratios(a, b)))
            for a in run_a.figures if (b := figures_b.get((a.mode, a.endpoint, a.group))) is not None]


def _paired_rows(run_a: Run, run_b: Run) -> list[ComparedRow]:
    """Every (mode, head, group) of two runs of one pack, over the prompts the group has in both (a group without
    loops leaves out the prompts either run's heads looped on), B over A paired prompt by prompt."""
    rows = []
    endpoints = [e.label for e in run_a.endpoints if e.label in {other.label for other in run_b.endpoints}]
    for mode in (mode for mode in run_a.settings.modes if mode in run_b.settings.modes):
        groups = [_run_groups(run, mode) for run in (run_a, run_b)]
        for group in dict.fromkeys([*groups[0], *groups[1]]):
            members = _both(*(_members_of(each, group) for each in groups))
            for endpoint in endpoints:
                a, b = (_chosen(run.windows, mode, endpoint, members) for run in (run_a, run_b))
                if not a or not b:
                    continue
                gap = None if group.endswith(WITHOUT_LOOPS) else _gap(a, b, run_a.settings.loop_threshold)
                rows.append(ComparedRow(mode, endpoint, group, _figure(run_a, endpoint, mode, group, a),
                                        _figure(run_b, endpoint, mode, group, b), tuple(paired_ratios(a, b)), gap))
    return rows


def _members_of(groups: dict[str, set[int] | None], group: str) -> set[int] | None:
    """A group's prompts in one run; a group without loops that a run does not have is the group itself there (no
    head of that run looped in it)."""
    return groups[group] if group in groups else groups.get(group.removesuffix(WITHOUT_LOOPS))


def _both(a: set[int] | None, b: set[int] | None) -> set[int] | None:
    """The prompts in both (None: every prompt)."""
    return b if a is None else a if b is None else a & b


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
    header += ["loop share B - A", "loops"]
    rows = []
    for row in comparison.rows:
        cells = [row.mode, row.endpoint, row.group]
        for figure in RATIO_FIGURES:
            digits = 1 if figure.startswith("output_tokens_per_s") else 3
            cells += [_number(getattr(row.a, figure), digits), _number(getattr(row.b, figure), digits),
                      _interval(row.ratio(figure))]
        rows.append(cells + (_gap_cells(row.loops)[2:] if row.loops is not None else ["n/a", "n/a"]))
    caption = ("B / A paired prompt by prompt (the same pack at concurrency 1), "
               f"{100 * CONFIDENCE:g}% bootstrap interval") if comparison.paired else "B / A (not paired)"
    return caption, header, rows


def format_comparison(comparison: Comparison, names: tuple[str, str]) -> str:
    caption, header, rows = comparison_table(comparison)
    return "\n".join([*describe_comparison(comparison, names), "", caption, *_markdown(header, rows)])
