"""The facts of a conversation: one name and one definition each, for the build's statistics (``stats.corpus``,
audit.json), the audit's comparison with traffic (``audit.frames``, which reads the same facts off raw rows with
polars) and the publish gate (``publish.gate``, which recounts them from a shard's turns).

Each fact is defined here row by row, over a row in the JSON form of schemas/conversation.schema.json (what
``Conversation.to_row`` gives and a shard's ``to_pylist`` reads back): that is the definition. ``BatchFacts`` is the
same facts over an Arrow batch of the row form, for the build; the audit's polars engine computes the ones it
compares under the same names. tests/stats/test_facts.py pins that every form gives the row-wise answer, on hostile
rows.

The facts (a turn is a message; the published reports keep their own labels, named beside each):

* ``thinking``: some assistant turn carries a reasoning trace (non-empty). The row form's ``thinking`` column;
  audit.json's ``thinking_conversations``; the comparison's ``reasoning_share``.
* ``served``: the thinking mode a logged request was served in, or a generated row's turns were asked in (their
  ``enable_thinking``), None where the row does not record it. audit.json's ``served`` counts the replayed rows'.
* ``thinking_mode``: ``served`` where the row records it, else ``thinking``: what the comparison's ``thinking``
  dimension and ``thinking_share`` count, and what the eval pack is stratified by (``thinking_mode_of``, over a
  typed row: ``stats.pack.stratum``). One gap is left, to keep the comparison's output as it was: on a built
  corpus's rows the comparison reads a generated row's mode, not a replayed row's logged one (a raw log's it
  reads), so a corpus replayed from logs counts its rows by ``thinking`` there
  (tests/stats/test_facts.py marks it).
* ``messages``: the turns of every role. audit.json's ``turns``.
* ``assistant_turns``: the assistant turns. The comparison's ``turns`` dimension.
* ``tool_calls``: some turn carries structured tool calls. audit.json's ``tool_call_conversations``.
* ``tool_use``: tool traffic as the comparison sees it, whether or not the server parsed the calls: an assistant
  turn with structured calls or whose text holds a ``<tool_call>`` block, or a tool's result. The comparison's
  ``tool_calls`` dimension.
* ``characters``, ``assistant_characters``, ``reasoning_characters``: code points of every turn's content and
  reasoning, of the assistant turns' content, and of every reasoning trace. audit.json's ``characters`` and
  ``reasoning_char_share``.

The token facts (a conversation's length as served, its supervised and reasoning tokens) are ``tokens.TokenFacts``,
measured once by ``tokens.TurnTokens`` for both the build's token statistics and the audit's token pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ..records import Conversation

THINKING: Final = "thinking"
SERVED: Final = "served"
THINKING_MODE: Final = "thinking_mode"
MESSAGES: Final = "messages"
ASSISTANT_TURNS: Final = "assistant_turns"
TOOL_CALLS: Final = "tool_calls"
TOOL_USE: Final = "tool_use"
CHARACTERS: Final = "characters"
ASSISTANT_CHARACTERS: Final = "assistant_characters"
REASONING_CHARACTERS: Final = "reasoning_characters"

# The block a server without a tool-call parser leaves in an assistant turn's text.
TOOL_CALL_TAG: Final = "<tool_call>"

Turn = Mapping[str, object]  # a message of the JSON row form: role, content, reasoning, tool_calls, tool_call_id


# --- row by row: the definitions ----------------------------------------------------------------------------


def _is_assistant(turn: Turn) -> bool:
    return turn.get("role") == "assistant"


def _text(turn: Turn, key: str) -> str:
    value = turn.get(key)
    return value if isinstance(value, str) else ""


def thinking(turns: Sequence[Turn]) -> bool:
    return any(_is_assistant(turn) and _text(turn, "reasoning") for turn in turns)


def logged_request(origin: object, provenance: object) -> Mapping[str, object] | None:
    """How a replayed row's logged request was served (its provenance's ``served``: mode, model), None for a row
    that does not record it. ``provenance``: the row's, parsed (the row form holds it as JSON text:
    ``parsed_provenance``)."""
    if origin != "replay" or not isinstance(provenance, Mapping):
        return None
    request = provenance.get("served")
    return request if isinstance(request, Mapping) else None


def served(origin: object, provenance: object) -> bool | None:
    """The mode a logged request was served in, or a generated row's turns were asked in (its provenance's
    ``generation``)."""
    if origin == "generated" and isinstance(provenance, Mapping):
        generation = provenance.get("generation")
        request = generation if isinstance(generation, Mapping) else None
    else:
        request = logged_request(origin, provenance)
    mode = request.get("enable_thinking") if request is not None else None
    return mode if isinstance(mode, bool) else None


def thinking_mode(turns: Sequence[Turn], origin: object, provenance: object) -> bool:
    mode = served(origin, provenance)
    return thinking(turns) if mode is None else mode


def thinking_mode_of(conversation: Conversation) -> bool:
    """``thinking_mode`` of a typed row: the definition over its row form (``Conversation.to_row``: the provenance
    as JSON, ``thinking`` the turns' fact), the turns read only where the provenance leaves the mode unrecorded."""
    mode = served(conversation.origin, conversation.provenance.to_json())
    return conversation.thinking if mode is None else mode


def messages(turns: Sequence[Turn]) -> int:
    return len(turns)


def assistant_turns(turns: Sequence[Turn]) -> int:
    return sum(map(_is_assistant, turns))


def tool_calls(turns: Sequence[Turn]) -> bool:
    return any(turn.get("tool_calls") for turn in turns)


def tool_use(turns: Sequence[Turn]) -> bool:
    return any(turn.get("role") == "tool" or (_is_assistant(turn) and (
        bool(turn.get("tool_calls")) or TOOL_CALL_TAG in _text(turn, "content"))) for turn in turns)


def characters(turns: Sequence[Turn]) -> int:
    return sum(len(_text(turn, "content")) + len(_text(turn, "reasoning")) for turn in turns)


def assistant_characters(turns: Sequence[Turn]) -> int:
    return sum(len(_text(turn, "content")) for turn in turns if _is_assistant(turn))


def reasoning_characters(turns: Sequence[Turn]) -> int:
    return sum(len(_text(turn, "reasoning")) for turn in turns)


def parsed_provenance(value: object) -> object:
    """A row's provenance as an object: the row form's JSON text parsed (None when it is not JSON)."""
    if not isinstance(value, str | bytes):
        return value
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return None


# --- over an Arrow batch of the row form --------------------------------------------------------------------


def per_row(offsets: np.ndarray, per_turn: np.ndarray) -> np.ndarray:
    """Each row's sum of a per-turn figure: row ``i``'s turns are ``offsets[i]:offsets[i + 1]`` of the flattened
    turns."""
    cumulative = np.concatenate(([0], np.cumsum(per_turn, dtype=np.int64)))
    sums: np.ndarray = cumulative[offsets[1:]] - cumulative[offsets[:-1]]
    return sums


def _calls_per_turn(turns: pa.StructArray) -> np.ndarray:
    """Tool calls of each turn (a shard written before tool traffic existed has none)."""
    if turns.type.get_field_index("tool_calls") < 0:
        return np.zeros(len(turns), dtype=np.int64)
    counts: np.ndarray = pc.fill_null(pc.list_value_length(turns.field("tool_calls")), 0).to_numpy(
        zero_copy_only=False)
    return counts


@dataclass(frozen=True)
class BatchFacts:
    """The facts of every row of an Arrow batch of the row form, as integer arrays (a boolean fact as 0 or 1): what
    the build's statistics sum by group. ``thinking`` is the row form's own column, which the row form computes by
    this module's definition (the gate checks a shard's column against its turns)."""

    thinking: np.ndarray
    messages: np.ndarray
    characters: np.ndarray
    assistant_characters: np.ndarray
    reasoning_characters: np.ndarray
    tool_calls: np.ndarray

    @classmethod
    def of(cls, batch: pa.RecordBatch) -> BatchFacts:
        column = batch.column("messages")
        offsets = column.offsets.to_numpy(zero_copy_only=False) - column.offsets[0].as_py()
        turns = column.flatten()
        content = pc.fill_null(pc.utf8_length(turns.field("content")), 0).to_numpy(zero_copy_only=False)
        reasoning = pc.fill_null(pc.utf8_length(turns.field("reasoning")), 0).to_numpy(zero_copy_only=False)
        assistant = pc.equal(turns.field("role"), "assistant").to_numpy(zero_copy_only=False)
        return cls(thinking=batch.column(THINKING).to_numpy(zero_copy_only=False).astype(np.int64),
                   messages=np.diff(offsets),
                   characters=per_row(offsets, content + reasoning),
                   assistant_characters=per_row(offsets, content * assistant),
                   reasoning_characters=per_row(offsets, reasoning),
                   tool_calls=(per_row(offsets, _calls_per_turn(turns)) > 0).astype(np.int64))
