"""An eval run as a typed record that reads and writes its JSON (the saved file, what ``--json`` prints).

A run holds what was measured: the pack's hash, the endpoints with their identities and speculators, the
settings, the prompts, and every measurement window; its figures and ratios follow from those (``report``) and
are written beside them for a reader of the file. Reading a run computes them again from its windows, so a run
saved by an earlier eval (``corpus-eval/1``) gives the figures its windows allow, and ``missing`` names the
ones they do not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, TypeAlias

from ..errors import CorpusError
from .figures import LoopGap, Measures, Ratio, Window
from .json_values import Json, JsonObject
from .loops import DEFAULT_LOOP_THRESHOLD

DEFAULT_LENGTH_EDGES = (512, 2048, 8192, 32768)  # input-length slices: under 512 target tokens, 512 to 2k, ...

RUN_FORMAT = "corpus-eval/2"
FORMAT_1 = "corpus-eval/1"  # before answers were recorded: no input lengths, turns or loop shares


@dataclass(frozen=True, slots=True)
class PackInfo:
    path: str
    sha256: str
    prompts: int
    rows: int
    unreadable_rows: dict[str, int]
    folded_requests: int = 0
    repeated_prompts: int = 0


@dataclass(frozen=True, slots=True)
class Speculator:
    """What a server told of its speculator (``told_by`` None: it told nothing, the positions come from its
    counters)."""

    told_by: str | None = None
    method: str | None = None
    model: str | None = None
    num_speculative_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Endpoint:
    label: str  # A, B, ...
    url: str
    identity: dict[str, str | None]  # the target as the server reports it (IDENTITY_FIELDS and its revision)
    speculator: Speculator
    counters: str = "/metrics"  # how its windows were read (runs of format 1 before per-request counts: /metrics)

    @classmethod
    def from_json(cls, saved: Mapping[str, Any]) -> Endpoint:
        """An endpoint as a run saved it (checked against ``_RUN_SHAPE``)."""
        told = saved["speculator"]
        speculator = Speculator(told.get("told_by"), told.get("method"), told.get("model"),
                                told.get("num_speculative_tokens"))
        return cls(saved["label"], saved["url"], dict(saved["identity"]), speculator, saved.get("counters", "/metrics"))


@dataclass(frozen=True, slots=True)
class RunSettings:
    modes: tuple[str, ...]
    concurrency: int
    temperature: float | None  # None: the target's default, not readable here
    temperature_from: str
    max_tokens: int
    top_p: float | None = None
    sent: dict[str, float] = field(default_factory=dict)  # the sampling fields sent
    recipe_top_k: int | None = None
    loop_threshold: float = DEFAULT_LOOP_THRESHOLD  # an answer whose repetition is this or more loops
    length_edges: tuple[int, ...] = DEFAULT_LENGTH_EDGES  # the input-length slices' edges, in target tokens

    @classmethod
    def from_json(cls, settings: Mapping[str, Any]) -> RunSettings:
        """Settings as saved (checked against ``_RUN_SHAPE``); what an earlier run did not record, its default."""
        return cls(tuple(settings["modes"]), settings["concurrency"], settings["temperature"],
                   settings["temperature_from"], settings["max_tokens"], settings.get("top_p"),
                   dict(settings.get("sent", {})), settings.get("recipe_top_k"),
                   settings.get("loop_threshold", DEFAULT_LOOP_THRESHOLD),
                   tuple(settings.get("length_edges", DEFAULT_LENGTH_EDGES)))


@dataclass(frozen=True, slots=True)
class PromptInfo:
    id: str
    source: str
    task: str | None
    turn: int | None = None  # the answer's turn: 1 the first answer of its conversation (None: not recorded)


@dataclass(frozen=True, slots=True)
class Skip:
    """A prompt a server refused: left out of every head's figures."""

    prompt: int
    id: str
    source: str
    endpoint: str
    mode: str
    reason: str


@dataclass(frozen=True, slots=True)
class Reads:
    """GET /metrics the eval made, and the seconds they took (fetched and parsed): its own cost."""

    count: int = 0
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Figure(Measures):
    """The figures of one endpoint, mode and group: what its windows measure, with how."""

    endpoint: str
    mode: str
    group: str
    temperature: float | None
    method: str | None
    loops: int | None  # answers that loop (None: their repetition is not known)

    @classmethod
    def of(cls, measures: Measures, *, endpoint: str, mode: str, group: str, temperature: float | None,
           method: str | None, loops: int | None) -> Figure:
        measured = {f.name: getattr(measures, f.name) for f in fields(measures)}
        return cls(**measured, endpoint=endpoint, mode=mode, group=group, temperature=temperature, method=method,
                   loops=loops)


@dataclass(frozen=True, slots=True)
class HeadRatio:
    """A ratio of head ``b`` to head ``a`` within one run, in one mode and group."""

    a: str
    b: str
    mode: str
    group: str
    value: Ratio


@dataclass(frozen=True, slots=True)
class HeadLoops:
    """Head ``b``'s loop share beside head ``a``'s within one run, in one mode and group."""

    a: str
    b: str
    mode: str
    group: str
    value: LoopGap


@dataclass(frozen=True, slots=True)
class Run:
    created: str
    pack: PackInfo
    settings: RunSettings
    endpoints: tuple[Endpoint, ...]
    notes: tuple[str, ...]
    prompts: tuple[PromptInfo, ...]
    windows: tuple[Window, ...]
    remeasured_windows: int = 0
    metrics_reads: Reads = Reads()
    skipped_prompts: tuple[Skip, ...] = ()
    figures: tuple[Figure, ...] = ()
    ratios: tuple[HeadRatio, ...] = ()
    loop_gaps: tuple[HeadLoops, ...] = ()
    format: str = RUN_FORMAT  # the format it was saved in (a run read from an older file keeps its own)
    missing: tuple[str, ...] = ()  # figures its format did not record, named

    def to_json(self) -> JsonObject:
        """The saved form (``from_json`` reads it back)."""
        return {
            "format": RUN_FORMAT, "created": self.created, "pack": as_json(self.pack),
            "settings": as_json(self.settings), "endpoints": [as_json(e) for e in self.endpoints],
            "notes": list(self.notes), "remeasured_windows": self.remeasured_windows,
            "metrics_reads": as_json(self.metrics_reads), "prompts": [as_json(p) for p in self.prompts],
            "skipped_prompts": [as_json(s) for s in self.skipped_prompts],
            "windows": [w.to_dict() for w in self.windows], "figures": [as_json(f) for f in self.figures],
            "ratios": [{"a": r.a, "b": r.b, "mode": r.mode, "group": r.group, **as_json(r.value)} for r in self.ratios],
            "loop_gaps": [{"a": g.a, "b": g.b, "mode": g.mode, "group": g.group, **as_json(g.value)}
                          for g in self.loop_gaps],
            "missing": list(self.missing),
        }

    @classmethod
    def from_json(cls, document: object, file: str) -> Run:
        """A run as saved (format 1 or 2), without its figures (``report.with_figures`` computes them again from its
        windows, which is what ``load_run`` gives); CorpusError naming the key of a document that is not a whole
        run."""
        if not isinstance(document, dict) or document.get("format") not in (FORMAT_1, RUN_FORMAT):
            raise CorpusError(f"not a saved eval run (format {RUN_FORMAT} or {FORMAT_1})", file=file)
        problem = _shape_problem(document, _RUN_SHAPE if document["format"] == FORMAT_1 else _RUN_SHAPE_2, "")
        if problem is not None:
            raise CorpusError(f"not a whole saved eval run: {problem.lstrip('.')}", file=file)
        pack, settings = document["pack"], document["settings"]
        return cls(
            created=document["created"],
            pack=PackInfo(pack["path"], pack["sha256"], pack["prompts"],
                          pack.get("rows", pack["prompts"] + sum(pack["unreadable_rows"].values())),
                          dict(pack["unreadable_rows"]), pack.get("folded_requests", 0),
                          pack.get("repeated_prompts", 0)),
            settings=RunSettings.from_json(settings),
            endpoints=tuple(Endpoint.from_json(e) for e in document["endpoints"]),
            notes=tuple(document["notes"]),
            prompts=tuple(PromptInfo(p["id"], p["source"], p["task"], p.get("turn")) for p in document["prompts"]),
            windows=tuple(Window.from_dict(w) for w in document["windows"]),
            remeasured_windows=document.get("remeasured_windows", 0),
            metrics_reads=Reads(document["metrics_reads"]["count"], document["metrics_reads"]["seconds"]),
            skipped_prompts=tuple(Skip(**s) for s in document["skipped_prompts"]),
            format=document["format"],
        )


def as_json(record: object) -> JsonObject:
    """A record (a dataclass) as a JSON object (records within it as objects, tuples as lists)."""
    if not is_dataclass(record) or isinstance(record, type):
        raise TypeError(f"not a record: {record!r}")
    return {f.name: json_value(getattr(record, f.name)) for f in fields(record)}


def json_value(value: object) -> Json:
    """A field's value as JSON: a record as an object, a tuple or list as a list, a dict's values each."""
    if is_dataclass(value) and not isinstance(value, type):
        return as_json(value)
    if isinstance(value, tuple | list):
        return [json_value(item) for item in value]
    if isinstance(value, dict):
        return {str(key): json_value(item) for key, item in value.items()}
    if value is None or isinstance(value, str | int | float):
        return value
    raise TypeError(f"not a JSON value: {value!r}")


class _Number:
    """A finite number in a saved run (JSON has no NaN: a figure that was one is saved as null)."""


_OR_NONE = type(None)
# A key's shape: a type, a tuple of alternatives, {key: shape} for an object, [shape] for a list of them
_Kind: TypeAlias = "type | list[Shape]"
Shape: TypeAlias = "_Kind | tuple[_Kind, ...] | dict[str, Shape] | list[Shape]"
# What reading a saved run relies on (format 1 and 2; the figures and ratios are computed again, not read).
_SETTINGS_SHAPE: dict[str, Shape] = {
    "modes": [str], "concurrency": int, "temperature": (_Number, _OR_NONE), "temperature_from": str, "max_tokens": int}
_PROMPT_SHAPE: dict[str, Shape] = {"id": str, "source": str, "task": (str, _OR_NONE)}
_WINDOW_SHAPE: dict[str, Shape] = {
    "endpoint": str, "mode": str, "prompt": (int, _OR_NONE), "requests": int, "output_tokens": (int, _OR_NONE),
    "seconds": _Number, "drafts": _Number, "draft_tokens": _Number, "accepted": _Number,
    "accepted_by_position": [_Number], "tpot_sum": _Number, "tpot_count": _Number}
_RUN_SHAPE: dict[str, Shape] = {
    "created": str,
    "pack": {"path": str, "sha256": str, "prompts": int, "unreadable_rows": dict},
    "settings": _SETTINGS_SHAPE,
    "endpoints": [{"label": str, "url": str, "identity": dict, "speculator": dict}],
    "notes": [str],
    "metrics_reads": {"count": int, "seconds": _Number},
    "prompts": [_PROMPT_SHAPE],
    "skipped_prompts": [{"prompt": int, "id": str, "source": str, "endpoint": str, "mode": str, "reason": str}],
    "windows": [_WINDOW_SHAPE],
}
_ANSWER_SHAPE: dict[str, Shape] = {
    "prompt": int, "drafts": (_Number, _OR_NONE), "draft_tokens": (_Number, _OR_NONE), "accepted": (_Number, _OR_NONE),
    "repetition": (_Number, _OR_NONE), "input_tokens": (int, _OR_NONE), "per_step_accepted": ([int], _OR_NONE)}
_RUN_SHAPE_2 = _RUN_SHAPE | {"windows": [_WINDOW_SHAPE | {"answers": [_ANSWER_SHAPE]}],
                             "settings": _SETTINGS_SHAPE | {"loop_threshold": _Number, "length_edges": [int]},
                             "prompts": [_PROMPT_SHAPE | {"turn": int}]}


def _shape_problem(value: object, shape: Shape, where: str) -> str | None:
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
           else _shape_problem(value, kind, where) is None if isinstance(kind, list)
           else isinstance(value, kind) and not isinstance(value, bool) for kind in kinds):
        return None
    return f"{where} is {_shown(value)}, not {' or '.join(_kind_name(kind) for kind in kinds)}"


def _kind_name(kind: Shape) -> str:
    if isinstance(kind, list):
        return f"a list of {_kind_name(kind[0]).removeprefix('a ').removeprefix('an ')}s"
    return _KIND_NAMES[kind] if isinstance(kind, type) else "an object"


def _shown(value: object) -> str:
    import orjson

    return orjson.dumps(value).decode()[:40]


_KIND_NAMES: dict[type, str] = {str: "a string", int: "an integer", dict: "an object", _Number: "a number",
                                _OR_NONE: "null"}
