"""The protocol every generation backend implements: the HTTP endpoint pool and the in-process engine.

The scheduler only ever calls ``complete``; ``check`` probes what is served before the first request and
``counters`` feed the progress line. A backend is an async context manager: resources (a connection
pool, an engine) live exactly as long as the ``async with`` block.
"""

from __future__ import annotations

from types import TracebackType
from typing import Protocol, Self

from .types import EndpointInfo, FaultCounters, TurnRequest, TurnResult


class Backend(Protocol):
    counters: FaultCounters

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        traceback: TracebackType | None) -> None: ...

    async def check(self, expected_model: str | None = None) -> list[EndpointInfo]:
        """Probe what is served: one entry per endpoint (healthy or not, models, engine version, context)."""
        ...

    async def complete(self, request: TurnRequest) -> TurnResult:
        """One assistant turn. Raises ``PermanentError`` for a refusal or exhausted retries."""
        ...
