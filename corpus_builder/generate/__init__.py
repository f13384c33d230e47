"""The generation stage: the target regenerates the assistant turns of prompt conversations.

``generate`` is the one entry: it takes prompt conversations (system/user turns only) and yields, in
input order, one generated ``Conversation`` per prompt and sample index, or a ``Skipped`` for a row that
was truncated or refused. Every finished turn is journaled first, so a rerun after a crash, or a
rebuild with other checks, only asks the server for what never finished; ``journal_only`` rebuilds
without any server and ``journal_coverage`` says beforehand what such a rebuild would miss.

The HTTP client (aiohttp) and the in-process engine (vllm) are imported only when a run needs them.
"""

from __future__ import annotations

from .backend import Backend
from .journal import Journal, turn_key
from .progress import GenerationProgress
from .run import JournalCoverage, check_served_model, generate, journal_coverage
from .scheduler import RunSettings
from .types import (
    EndpointInfo,
    FaultCounters,
    GenerationIncomplete,
    PermanentError,
    RetriesExhausted,
    TurnRequest,
    TurnResult,
)

__all__ = [
    "Backend", "EndpointInfo", "FaultCounters", "GenerationIncomplete", "GenerationProgress", "Journal",
    "JournalCoverage", "PermanentError", "RetriesExhausted", "RunSettings", "TurnRequest", "TurnResult",
    "check_served_model", "generate", "journal_coverage", "turn_key",
]
