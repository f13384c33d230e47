"""The generator's request/result types, shared by the HTTP client, the scheduler and the journal."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import CorpusError
from ..records import ToolCall


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """One assistant turn to generate.

    ``messages`` are OpenAI chat messages (``{"role", "content"}``), plus ``reasoning_content``/``reasoning``
    on earlier assistant turns when history reasoning is kept, ``tool_calls`` on assistant turns that made
    calls and ``tool_call_id`` on tool turns. ``sampling`` holds the already-resolved sampling fields
    (temperature, top_p, top_k, max_tokens, optional seed), sent as they are. ``tools`` (the row's function
    schemas) and ``tool_choice`` are sent when the row has tools.
    """

    messages: tuple[dict[str, object], ...]
    sampling: Mapping[str, object]
    enable_thinking: bool
    model: str  # the served model name expected
    tools: tuple[dict[str, object], ...] | None = None
    tool_choice: str | dict[str, object] | None = None


@dataclass(frozen=True, slots=True)
class TurnResult:
    content: str | None
    reasoning: str | None
    finish_reason: str | None
    prompt_token_ids: list[int] | None
    token_ids: list[int] | None
    prompt_tokens: int | None
    completion_tokens: int | None
    reasoning_tokens: int | None
    endpoint: str  # base URL that answered (credentials removed)
    served_model: str  # the "model" field of the response
    # The calls the server's tool-call parser found, each {"id", "name", "arguments"} (arguments: its text);
    # None when the turn made none.
    tool_calls: list[dict[str, str]] | None = None
    # vLLM's per-request metrics (``metrics`` of the response: speculative decoding with
    # --per-request-spec-decode-metrics, timing with --enable-per-request-metrics); None when it sends none.
    metrics: dict[str, object] | None = None


class PermanentError(Exception):
    """The server refused the request for good (a 4xx other than 408/409/425/429): it would fail the same
    way again, so the row is dropped (and, for a refusal of the content, journaled).

    ``status`` is the last HTTP status seen (None when the last failure was a connection error, a
    timeout or a malformed body); ``endpoint`` is the base URL that answered last.
    """

    def __init__(self, message: str, *, status: int | None, endpoint: str | None) -> None:
        self.message = message
        self.status = status
        self.endpoint = endpoint
        super().__init__(message)


class RetriesExhausted(Exception):
    """A request failed transiently (timeout, connection error, 429, 5xx, an unreadable body) more times than
    its retries allow. Nothing is journaled: the row is unfinished, and a rerun asks for it again."""

    def __init__(self, message: str, *, fault: str, endpoint: str | None) -> None:
        self.message = message
        self.fault = fault
        self.endpoint = endpoint
        super().__init__(message)


class GenerationIncomplete(CorpusError):
    """Generation cannot go on (the launched server exited, no endpoint answered for too long). Every turn
    finished so far is journaled; nothing is written; a rerun resumes."""

    exit_code = 3

    def __init__(self, problem: str, *, unfinished_rows: int | None = None, details: list[str] | None = None) -> None:
        super().__init__(problem, details=details)
        self.unfinished_rows = unfinished_rows  # None where the build stopped before counting them


@dataclass
class EndpointInfo:
    url: str
    healthy: bool
    models: list[str]
    engine_version: str | None
    max_model_len: int | None
    error: str | None
    model_root: str | None = None  # what the server loaded for the model it serves: a path or a Hub id


# What a journal record and a generated row say of the target that made them.
IDENTITY_FIELDS = ("served_model", "model_root", "quantization", "dtype", "engine_version")
# The fields that make two targets different models (an engine upgrade alone serves the same weights).
MODEL_FIELDS = ("served_model", "model_root", "quantization", "dtype")


@dataclass(frozen=True, slots=True)
class TargetIdentity:
    """The served target as the server reports it, plus its quantization and dtype when its config is readable
    here (a launched server's model directory, or a local root path)."""

    served_model: str | None
    model_root: str | None
    quantization: str | None
    dtype: str | None
    engine_version: str | None

    @classmethod
    def of(cls, info: EndpointInfo, served_model: str) -> TargetIdentity:
        quantization, dtype = _model_config(info.model_root)
        return cls(served_model, info.model_root, quantization, dtype, info.engine_version)

    def fields(self) -> dict[str, str | None]:
        return {name: getattr(self, name) for name in IDENTITY_FIELDS}

    def describe(self) -> str:
        return describe_identity(self.fields())


def describe_identity(fields: Mapping[str, object]) -> str:
    """An identity as a person reads it ("served_model m, model_root /r"): the fields that say something."""
    return ", ".join(f"{name} {value}" for name, value in fields.items() if value is not None)


def same_model(a: TargetIdentity, b: TargetIdentity) -> bool:
    """Two identities name the same model wherever both say something (older journals recorded less)."""
    return all(mine is None or theirs is None or mine == theirs
               for mine, theirs in ((getattr(a, name), getattr(b, name)) for name in MODEL_FIELDS))


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ids(value: object) -> list[int] | None:
    return value if isinstance(value, list) else None


@dataclass(frozen=True, slots=True)
class JournaledTurn:
    """A generated turn as the journal holds it (``scheduler.result_record`` writes it): the server's answer, and
    what the target that answered said it was. Fields an older journal did not record read as None (no calls)."""

    result: TurnResult
    identity: TargetIdentity

    @classmethod
    def from_json(cls, record: Mapping[str, object]) -> JournaledTurn:
        calls = record.get("tool_calls")
        return cls(TurnResult(
            _text(record.get("content")), _text(record.get("reasoning")), _text(record.get("finish_reason")),
            _ids(record.get("prompt_token_ids")), _ids(record.get("token_ids")), _count(record.get("prompt_tokens")),
            _count(record.get("completion_tokens")), _count(record.get("reasoning_tokens")),
            _text(record.get("endpoint")) or "", _text(record.get("served_model")) or "",
            [{name: str(call[name]) for name in ("id", "name", "arguments")} for call in calls
             if isinstance(call, dict)] if isinstance(calls, list) else None),
            TargetIdentity(*(_text(record.get(name)) for name in IDENTITY_FIELDS)))

    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(ToolCall(call["id"], call["name"], call["arguments"]) for call in self.result.tool_calls or ())


@dataclass(frozen=True, slots=True)
class FailedTurn:
    """A request that ended its row: a refusal of its content (journaled, reason ``generation_error``) or retries run
    out in this run (never journaled)."""

    error: str
    skip_reason: str


def journal_entry(record: Mapping[str, object]) -> JournaledTurn | FailedTurn:
    """A journal record (or a failure's, never journaled) as the scheduler takes it into a row."""
    if "error" in record:  # journaled refusals carry no skip_reason
        return FailedTurn(str(record["error"]), _text(record.get("skip_reason")) or "generation_error")
    return JournaledTurn.from_json(record)


def _model_config(root: str | None) -> tuple[str | None, str | None]:
    """(quantization method, dtype) from config.json when ``root`` is a model directory on this machine."""
    if not root:
        return None, None
    import json
    from pathlib import Path

    try:
        config = json.loads((Path(root) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, None
    if not isinstance(config, dict):
        return None, None
    quantization = config.get("quantization_config")
    method = quantization.get("quant_method") if isinstance(quantization, dict) else None
    dtype = config.get("dtype") or config.get("torch_dtype")
    return (str(method) if method else None), (str(dtype) if dtype else None)


# Fault classes. "4xx" holds 408/409/425 when retried and the other 4xx as permanent errors.
FAULT_CLASSES = ("429", "5xx", "4xx", "timeout", "connection", "malformed")


class FaultCounters:
    """Per-class counts for progress displays: retries taken, and requests that finally failed."""

    __slots__ = ("errors", "retries")

    def __init__(self) -> None:
        self.retries: dict[str, int] = dict.fromkeys(FAULT_CLASSES, 0)
        self.errors: dict[str, int] = dict.fromkeys(FAULT_CLASSES, 0)

    def retry(self, fault: str) -> None:
        self.retries[fault] += 1

    def error(self, fault: str) -> None:
        self.errors[fault] += 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        """A copy safe to serialise: {"retries": {class: n}, "errors": {class: n}} (zero classes omitted)."""
        return {
            "retries": {k: v for k, v in self.retries.items() if v},
            "errors": {k: v for k, v in self.errors.items() if v},
        }
