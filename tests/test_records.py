"""A row's location: one function names it for the ledger, the row checks and the generator's messages."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from corpus_builder.recipe.model import HubRef
from corpus_builder.records import Conversation, Message, Provenance, ToolSettings, row_location
from corpus_builder.rows import batch_to_conversations, conversations_to_batch
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


# A generated row's provenance, and a logged row's, as the readers and the generator wrote them when provenance was
# a dict: every key, in the order it was written.
GENERATED = (
    b'{"source_file":"prompts.jsonl","source_line":3,"source_part":1,"source_id":"p-3","reference_answer":"4",'
    b'"generation":{"model":"m","served_model":"m-served","model_revision":"r1","engine_version":"0.32",'
    b'"model_root":"/models/m","quantization":null,"dtype":"bfloat16","enable_thinking":false,'
    b'"history_reasoning":"drop","sampling":{"temperature":0.6,"top_p":0.95,"top_k":20,"max_tokens":64,"seed":9},'
    b'"sample_index":1,"turns":[{"message_index":2,"endpoint":"http://127.0.0.1:1/v1","finish_reason":"length",'
    b'"prompt_tokens":5,"completion_tokens":2,"reasoning_tokens":null,"prompt_token_ids":[1,2,3,4,5],'
    b'"token_ids":[6,7],"retried_for_length":true}],"tool_choice":{"type":"function","function":{"name":"f"}},'
    b'"tool_results":"recorded"}}')
LOGGED = (
    b'{"hub":{"id":"org/logs","config":null,"split":"train","revision":"abc"},"source_row":7,'
    b'"served":{"enable_thinking":null,"model":"tiny/target","sampling":{"temperature":0.6},"finish_reason":"stop",'
    b'"reasoning_effort":"low","usage":{"completion_tokens":5}},"folded_requests":3}')


@pytest.mark.parametrize("written", [GENERATED, LOGGED, b'{"source_file":"a.jsonl","source_line":1}', b"{}"])
def test_provenance_reads_and_writes_its_json_in_the_same_bytes(written: bytes) -> None:
    provenance = Provenance.from_json(orjson.loads(written))
    assert orjson.dumps(provenance.to_json()) == written
    row = Conversation("r1", "chats", "replay", [Message("user", "hi")], provenance=provenance)
    assert batch_to_conversations(conversations_to_batch([row]))[0].provenance == provenance


def test_provenance_is_read_by_attribute() -> None:
    generated = Provenance.from_json(orjson.loads(GENERATED))
    generation = generated.generation
    assert generation is not None and generated.position == 3 and generated.source_id == "p-3"
    assert (generation.enable_thinking, generation.sampling["seed"], generation.tools) == (
        False, 9, ToolSettings({"type": "function", "function": {"name": "f"}}, "recorded"))
    assert [(turn.finish_reason, turn.token_ids, turn.retried_for_length) for turn in generation.turns] == [
        ("length", [6, 7], True)]
    logged = Provenance.from_json(orjson.loads(LOGGED))
    assert logged.served is not None and logged.hub is not None and logged.position == 7
    assert (logged.served.enable_thinking, logged.served.usage, logged.folded_requests) == (
        None, {"completion_tokens": 5}, 3)
    assert row_location(row(logged)) == "org/logs/train#7"


def test_a_value_of_another_shape_is_read_as_not_recorded() -> None:
    """A hand-edited row: what does not have the schema's type is not taken for something it is not."""
    odd = Provenance.from_json({"source_line": "three", "source_id": 4, "served": "on",
                                "generation": {"enable_thinking": "yes", "turns": [{"token_ids": "1 2"}]}})
    assert (odd.source_line, odd.source_id, odd.served) == (None, 4, None)
    assert odd.generation is not None and odd.generation.enable_thinking is False
    assert odd.generation.turns[0].token_ids is None
