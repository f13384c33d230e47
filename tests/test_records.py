"""A row's location: one function names it for the ledger, the row checks and the generator's messages."""

from __future__ import annotations

from pathlib import Path

from corpus_builder.recipe.model import HubRef
from corpus_builder.records import Conversation, Message, Provenance, row_location
from corpus_builder.sources.hub import hub_label, hub_provenance


def row(provenance: Provenance) -> Conversation:
    return Conversation("r1", "chats", "replay", [Message("user", "hi")], provenance=provenance)


def test_a_file_row_is_named_by_line_or_row_and_a_bare_row_by_its_source() -> None:
    assert row_location(row(Provenance(source_file="logs/a.jsonl", source_line=7))) == "logs/a.jsonl:7"
    assert row_location(row(Provenance(source_file="logs/a.parquet", source_row=3))) == "logs/a.parquet#3"
    assert row_location(row(Provenance())) == "chats"


def test_a_hub_row_is_named_as_its_reader_names_the_rows_it_skips() -> None:
    for ref in (HubRef(id="org/chats", split="train"), HubRef(id="org/chats", split="test", config="en")):
        located = row_location(row(Provenance(hub=hub_provenance(ref), source_row=12)))
        assert located == f"{hub_label(ref)}#12"
    assert hub_label(HubRef(id="org/chats", split="test", config="en")) == "org/chats/en/test"


def test_the_origins_are_the_schemas_and_a_prompt_row_is_no_corpus_row() -> None:
    """A prompt source's row is typed as such but never written: the corpus row schema leaves it out."""
    import json
    from typing import get_args

    from corpus_builder.records import Origin

    schema = json.loads((Path(__file__).resolve().parents[1] / "corpus_builder" / "schemas" /
                         "conversation.schema.json").read_text(encoding="utf-8"))
    assert set(schema["properties"]["origin"]["enum"]) == set(get_args(Origin)) - {"prompt"}


def test_a_pickled_turn_comes_back_with_every_field() -> None:
    """Rows cross the forked readers' queues pickled: a turn comes back with every field."""
    import dataclasses
    import pickle

    from corpus_builder.records import ToolCall

    turn = Message("assistant", "the answer", reasoning="because", tool_calls=(ToolCall("c1", "look", "{}"),),
                   tool_call_id="t1")
    assert all(getattr(turn, field.name) != field.default for field in dataclasses.fields(Message))
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(turn, protocol=protocol))
        assert back == turn and type(back) is Message
