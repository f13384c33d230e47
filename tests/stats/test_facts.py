"""The facts of a conversation (``stats.facts``): the row-wise definition is the answer every engine gives, on any
rows: the build's statistics over an Arrow batch (``BatchFacts``, ``CorpusStats``), the audit's polars engine over
the same rows (``audit.frames.row_facts``), a typed row's mode (``thinking_mode_of``: the eval pack's strata). The
publish gate recounts ``thinking`` with the definition itself, over a shard's rows read back
(tests/publish/test_gate.py holds it to the turns)."""

from __future__ import annotations

import orjson
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from corpus_builder.audit.frames import row_facts
from corpus_builder.records import ROLES, Conversation, Message, Provenance, ToolCall
from corpus_builder.rows import conversations_to_batch
from corpus_builder.stats import facts
from corpus_builder.stats.corpus import CorpusStats
from corpus_builder.stats.facts import (
    ASSISTANT_TURNS,
    SERVED,
    THINKING,
    THINKING_MODE,
    TOOL_CALL_TAG,
    TOOL_USE,
    BatchFacts,
)
from tests.support.fuzz import fuzz_settings

MODE_BUCKETS = {True: "on", False: "off", None: "unrecorded"}  # the comparison's buckets of ``served``

# Texts with the tags a fact looks for, code points outside the BMP (a character is a code point, not a byte) and
# blanks. A record's reasoning is never blank (``records.make_message`` strips it to None), so reasoning is drawn
# stripped; content may be anything.
WORDS = ["hello", "中文", "🙂", TOOL_CALL_TAG, "</tool_call>", "<think>", " ", "\n", ""]
TEXT = st.lists(st.sampled_from(WORDS) | st.text(max_size=4), max_size=4).map("".join)
REASONING = st.none() | TEXT.map(lambda text: text.strip() or None)
CALLS = st.lists(st.builds(ToolCall, st.sampled_from(["call-1", "call-2", ""]), st.sampled_from(["search", "calc"]),
                           st.sampled_from(["{}", "not json"])), max_size=2).map(tuple)
# What a row may record of how it was served: nothing, a mode, something that is not one, a shape that is not a
# mapping; under ``served`` (a logged request) or ``generation`` (generated turns), whatever the row's origin.
LOGGED_OFF: dict[str, object] = {"served": {"enable_thinking": False}}
MODES = st.sampled_from([True, False, None, "true", 1])
PROVENANCE = st.one_of(
    st.just({}),
    st.fixed_dictionaries({"served": st.fixed_dictionaries({"enable_thinking": MODES, "model": st.just("m")})}),
    st.fixed_dictionaries({"generation": st.fixed_dictionaries({"enable_thinking": MODES})}),
    st.fixed_dictionaries({"served": st.sampled_from(["on", None, [True]])}),
)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    """Any turn: reasoning and tool calls on any role (a fact counts the assistant's only), a tool's turn with or
    without the id of a call."""
    role = draw(st.sampled_from(ROLES))
    return Message(role, draw(TEXT), draw(REASONING), draw(CALLS) if role == "assistant" or draw(st.booleans())
                   else (), draw(st.none() | st.just("call-1")) if role == "tool" else None)


Drawn = tuple[Conversation, dict[str, object]]  # a row, and the provenance its JSON form holds (hostile or not)


@st.composite
def conversations(draw: st.DrawFn, number: int) -> Drawn:
    """A row whose provenance is read as the typed record reads it, beside the JSON the row form then holds: a
    hand-edited shard can hold any JSON there, and every engine reads that text."""
    provenance = draw(PROVENANCE)
    return Conversation(id=f"row-{number}", source=draw(st.sampled_from(["a", "b"])),
                        origin=draw(st.sampled_from(["replay", "generated"])),
                        messages=draw(st.lists(messages(), min_size=1, max_size=6)),
                        provenance=Provenance.from_json(provenance),
                        split=draw(st.sampled_from(["train", "validation"]))), provenance


@st.composite
def batches(draw: st.DrawFn) -> list[Drawn]:
    return [draw(conversations(number)) for number in range(draw(st.integers(1, 6)))]


def row_form(drawn: list[Drawn]) -> pa.RecordBatch:
    """The rows' Arrow form with the provenance JSON as drawn."""
    batch = conversations_to_batch([row for row, _ in drawn])
    index = batch.schema.get_field_index("provenance")
    return batch.set_column(index, batch.schema.field(index),
                            pa.array([orjson.dumps(provenance).decode() for _, provenance in drawn], pa.string()))


def row_wise(row: dict[str, object]) -> dict[str, object]:
    """The definitions, over a row of the JSON form (a shard's row read back is this shape)."""
    turns = row["messages"]
    assert isinstance(turns, list)
    origin, provenance = row["origin"], facts.parsed_provenance(row["provenance"])
    return {THINKING: facts.thinking(turns), SERVED: facts.served(origin, provenance),
            THINKING_MODE: facts.thinking_mode(turns, origin, provenance), "messages": facts.messages(turns),
            ASSISTANT_TURNS: facts.assistant_turns(turns), "tool_calls": facts.tool_calls(turns),
            TOOL_USE: facts.tool_use(turns), "characters": facts.characters(turns),
            "assistant_characters": facts.assistant_characters(turns),
            "reasoning_characters": facts.reasoning_characters(turns)}


@fuzz_settings(60)
@given(drawn=batches())
@example(drawn=[(Conversation("row-0", "a", "replay", [Message("user", "🙂" + TOOL_CALL_TAG, "why"),
                                                       Message("tool", "result"), Message("assistant", "", None)],
                              provenance=Provenance.from_json(LOGGED_OFF)), LOGGED_OFF)])
def test_every_engine_gives_the_row_wise_facts(drawn: list[Drawn]) -> None:
    """The build's batch facts and statistics, and the audit's polars facts of the same rows, are the row-wise
    definitions' (the example: reasoning and a tool-call tag on a user turn count for nothing, a tool's result is
    tool use without a call, a logged request served without thinking is in that mode)."""
    rows, batch = [row for row, _ in drawn], row_form(drawn)
    read_back = batch.to_pylist()
    expected = [row_wise(row) for row in read_back]  # the row form read back, as a shard's rows are

    columns = BatchFacts.of(batch)
    for name in ("thinking", "messages", "characters", "assistant_characters", "reasoning_characters",
                 "tool_calls"):
        assert getattr(columns, name).tolist() == [int(row[name]) for row in expected], name  # type: ignore[call-overload]

    stats = CorpusStats()
    stats.add_rows(rows, batch)
    report = stats.report()
    assert report["thinking_conversations"] == sum(row[THINKING] for row in expected)  # type: ignore[misc]
    assert report["turns"] == sum(row["messages"] for row in expected)  # type: ignore[misc]
    assert report["tool_call_conversations"] == sum(row["tool_calls"] for row in expected)  # type: ignore[misc]
    logged = [(row[SERVED], row[THINKING]) for row, written in zip(expected, read_back, strict=True)
              if facts.logged_request(written["origin"], facts.parsed_provenance(written["provenance"])) is not None]
    served = report.get("served")
    counted = {mode: sum(modes[mode] for modes in served["by_source"].values())  # type: ignore[literal-required]
               for mode in ("on", "off", "unrecorded")} \
        if served else {"on": 0, "off": 0, "unrecorded": 0}
    assert counted == {"on": sum(mode is True for mode, _ in logged), "off": sum(mode is False for mode, _ in logged),
                       "unrecorded": sum(mode is None for mode, _ in logged)}

    # a typed row's mode (the eval pack's strata) is the definition's over the row form it writes
    assert [facts.thinking_mode_of(row) for row in rows] == [row_wise(row.to_row())[THINKING_MODE] for row in rows]

    audited = row_facts(pl.from_arrow(batch))  # type: ignore[arg-type]
    assert audited.select(THINKING, ASSISTANT_TURNS, TOOL_USE).rows() == [
        (row[THINKING], row[ASSISTANT_TURNS], row[TOOL_USE]) for row in expected]
    assert audited.select(THINKING_MODE, SERVED).rows() == [
        (row[THINKING_MODE], MODE_BUCKETS[row[SERVED]]) for row in expected]  # type: ignore[index]


def test_the_audit_reads_a_replayed_rows_served_mode() -> None:
    """A corpus built from logs is at distance 0 from those logs: its replayed rows carry their request's mode."""
    row = Conversation("row-0", "a", "replay", [Message("user", "q"), Message("assistant", "a", "because")],
                       provenance=Provenance.from_json(LOGGED_OFF))
    audited = row_facts(pl.from_arrow(conversations_to_batch([row])))  # type: ignore[arg-type]
    assert audited.select(THINKING_MODE, SERVED).row(0) == (False, "off")


def test_a_fact_is_counted_on_the_assistants_turns_only() -> None:
    """Reasoning, tool calls and a tool-call tag on any other turn are no fact of the conversation's; a tool's result
    is tool use; characters are code points."""
    turns: list[dict[str, object]] = [{"role": "system", "content": TOOL_CALL_TAG, "reasoning": "r"},
             {"role": "user", "content": "🙂", "reasoning": "why", "tool_calls": [{"id": "c"}]}]
    assert (facts.thinking(turns), facts.tool_use(turns), facts.assistant_turns(turns)) == (False, False, 0)
    assert facts.tool_calls(turns)  # a structured call counts wherever it is (audit.json's tool_call_conversations)
    assert facts.characters(turns) == len(TOOL_CALL_TAG) + 1 + 1 + 3
    answered: list[dict[str, object]] = [*turns, {"role": "tool", "content": "42"},
                {"role": "assistant", "content": f"x {TOOL_CALL_TAG}", "reasoning": ""}]
    assert (facts.thinking(answered), facts.tool_use(answered), facts.assistant_turns(answered)) == (False, True, 1)
    assert facts.thinking([{"role": "assistant", "content": "", "reasoning": "because"}])


@pytest.mark.parametrize(("origin", "provenance", "mode"), [
    ("replay", {"served": {"enable_thinking": False}}, False),
    ("replay", {"generation": {"enable_thinking": False}}, None),  # a replayed row's mode is its logged request's
    ("generated", {"generation": {"enable_thinking": True}}, True),
    ("generated", {"served": {"enable_thinking": True}}, None),
    ("replay", {"served": {"enable_thinking": "false"}}, None),  # not a mode
    ("replay", '{"served": {"enable_thinking": true}}', True),  # as the row form holds it: JSON text
    ("replay", "{not json", None),
])
def test_served_is_what_the_row_records_of_its_request(origin: str, provenance: object, mode: bool | None) -> None:
    parsed = facts.parsed_provenance(provenance)
    assert facts.served(origin, parsed) is mode
    assert facts.thinking_mode([{"role": "assistant", "content": "", "reasoning": "r"}], origin, parsed) is \
        (True if mode is None else mode)
