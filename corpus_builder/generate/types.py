"""The generator's request/result types, shared by the HTTP client, the scheduler and the journal."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """One assistant turn to generate.

    ``messages`` are OpenAI chat messages (``{"role", "content"}``), plus ``reasoning_content``/``reasoning``
    on earlier assistant turns when history reasoning is kept. ``sampling`` holds the already-resolved
    sampling fields (temperature, top_p, top_k, max_tokens, optional seed), sent as they are.
    """

    messages: tuple[dict[str, Any], ...]
    sampling: dict[str, Any]
    enable_thinking: bool
    model: str  # the served model name expected


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


class PermanentError(Exception):
    """The server refused for good (4xx other than 408/409/425/429), or retries were exhausted.

    ``status`` is the last HTTP status seen (None when the last failure was a connection error, a
    timeout or a malformed body); ``endpoint`` is the base URL that answered last.
    """

    def __init__(self, message: str, *, status: int | None, endpoint: str | None) -> None:
        self.message = message
        self.status = status
        self.endpoint = endpoint
        super().__init__(message)


@dataclass
class EndpointInfo:
    url: str
    healthy: bool
    models: list[str]
    engine_version: str | None
    max_model_len: int | None
    error: str | None


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
