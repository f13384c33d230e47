"""A replay file of tool-calling conversations (parallel calls included), as serving logs and ShareGPT
function-call dumps keep them, built, audited and exported: the trainers' formats carry the tools, the calls and
the results; speculators-tokens rows are checked token for token against transformers' own
``apply_chat_template(..., tools=...)``; SpecForge's export leaves them out and says why."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from corpus_builder.assemble import build_corpus
from corpus_builder.audit import audit_against, audit_corpus
from corpus_builder.errors import CorpusError
from corpus_builder.export import export_corpus
from corpus_builder.export.formats import SPECFORGE_NO_TOOLS
from corpus_builder.layout import Corpus, SplitCount
from corpus_builder.recipe import load_recipe
from corpus_builder.records import Conversation
from corpus_builder.sources import iter_file
from corpus_builder.testing.tiny_model import IM_END, TOOL_CALL_OPEN
from tests.support.hf_template import hf_ids, mask_start, through_end_of_turn
from tests.support.tool_chats import WEATHER, call, calling, glaive_rows, log_rows, result, say

RECIPE = """\
name: tools
target: {{model: tiny-target, tokenizer: {tokenizer}}}
sources:
  - {{name: logs, kind: replay, path: logs.jsonl, task: agent, license: MIT}}
  - {{name: glaive, kind: replay, path: glaive.jsonl, task: agent, license: Apache-2.0}}
checks: {{max_seq_len: 4096}}
split: {{validation_fraction: 0.01}}
output:
  dir: out
  exports: [{{format: speculators}}, {{format: speculators-tokens}}]
"""


@pytest.fixture(scope="module")
def corpus_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tools")
    for name, rows in (("logs.jsonl", log_rows()), ("glaive.jsonl", glaive_rows())):
        (directory / name).write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    (directory / "recipe.yaml").write_text(RECIPE.format(tokenizer=tiny_model_dir))
    result = build_corpus(load_recipe(directory / "recipe.yaml"))
    assert result.manifest.conversations == 6 and result.manifest.splits == {"train": SplitCount(rows=6, shards=1)}
    return result.out_dir


def lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_the_publish_gate_validates_the_tool_rows_against_the_row_schema(corpus_dir: Path) -> None:
    from corpus_builder.publish.gate import check_corpus

    assert check_corpus(corpus_dir).failures == []


def test_the_audit_counts_tool_calling_conversations(corpus_dir: Path, tmp_path: Path) -> None:
    report = audit_corpus(corpus_dir)
    assert (report["tool_call_conversations"], report["conversations"]) == (5, 6)
    assert report["by_source"]["logs"]["tool_call_conversations"] == 3
    assert report["by_source"]["glaive"]["tool_call_share"] == 1.0
    assert audit_corpus(corpus_dir.parent / "logs.jsonl")["tool_call_conversations"] == 3  # a raw dump, before a build
    # The traffic comparison reads the corpus's own tool_calls field: the logs hold 3 of 4 rows with calls.
    compared = audit_against(corpus_dir, str(corpus_dir.parent / "logs.jsonl"))
    assert compared["corpus"]["shares"]["tool_calls"] == {"with tool calls": pytest.approx(5 / 6),
                                                          "without": pytest.approx(1 / 6)}
    assert compared["traffic"]["shares"]["tool_calls"] == {"with tool calls": 0.75, "without": 0.25}


def test_speculators_rows_carry_tools_calls_and_results(corpus_dir: Path) -> None:
    by_id = {c.id: c for c in Corpus.open(corpus_dir).iter_conversations()}
    rows = lines(corpus_dir / "exports/speculators/train.jsonl")
    assert len(rows) == 6
    for row in rows:
        conversation = by_id[row["id"]]
        assert row["tools"] == (json.dumps(conversation.tools, separators=(",", ":"), ensure_ascii=False)
                                if conversation.tools else None)
        for turn, message in zip(row["conversations"], conversation.messages, strict=True):
            assert set(turn) == {"role", "content", "reasoning_content", "tool_calls", "tool_call_id"}
            assert turn["tool_calls"] == ([{"id": c.id, "type": "function", "function": {
                "name": c.name, "arguments": c.arguments}} for c in message.tool_calls] or None)
            assert turn["tool_call_id"] == message.tool_call_id
    parallel = next(row for row in rows if row["conversations"][1]["content"] == "Weather and local time in Rome?")
    assert [call["function"]["name"] for call in parallel["conversations"][2]["tool_calls"]] == ["get_weather",
                                                                                                "get_time"]


def test_speculators_tokens_are_exact_against_transformers(corpus_dir: Path, tiny_model_dir: Path) -> None:
    """Every assistant turn's row is the transformers render of its conversation through the turn (ending at the
    turn's <|im_end|>), masked from where the render of the turns before it with the generation prompt ends:
    tool-call tokens supervised, tool results in the masked prompt."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tiny_model_dir)
    eos, call_open = hf.convert_tokens_to_ids(IM_END), hf.convert_tokens_to_ids(TOOL_CALL_OPEN)
    by_id = {c.id: c for c in Corpus.open(corpus_dir).iter_conversations()}
    rows = lines(corpus_dir / "exports/speculators-tokens/train.jsonl")
    assert len(rows) == sum(m.role == "assistant" for c in by_id.values() for m in c.messages) == 12
    supervised_calls = 0
    for row in rows:
        conversation_id, index = row["id"].split("/")
        conversation, j = by_id[conversation_id], int(index)
        messages = as_transformers_input(conversation)
        full = hf_ids(hf, messages[:j + 1], conversation.tools)
        prompt = hf_ids(hf, messages[:j], conversation.tools, generation_prompt=True)
        expected, start = through_end_of_turn(full, eos), mask_start(prompt, full)
        assert row["input_ids"] == expected and row["loss_mask"] == [0] * start + [1] * (len(expected) - start)
        supervised = row["input_ids"][start:]
        assert supervised.count(call_open) == len(conversation.messages[j].tool_calls)
        supervised_calls += supervised.count(call_open)
    assert supervised_calls == 8  # every call of every row, the two parallel pairs included, is trained on


def as_transformers_input(conversation: Conversation) -> list[dict[str, Any]]:
    """The row as transformers' docs ask for chat messages: reasoning in reasoning_content, a call's arguments as
    an object, a tool's result with its tool_call_id."""
    messages = []
    for m in conversation.messages:
        message: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.reasoning is not None:
            message["reasoning_content"] = m.reasoning
        if m.tool_calls:
            message["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.name, "arguments": json.loads(c.arguments)}} for c in m.tool_calls]
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        messages.append(message)
    return messages


def test_messages_export_is_openai_chat_with_its_tools(corpus_dir: Path, tmp_path: Path) -> None:
    export_corpus(corpus_dir, "messages", tmp_path)
    rows = lines(tmp_path / "train.jsonl")
    one = next(row for row in rows if row["messages"][0]["content"] == "What is the weather in Paris?")
    assert json.loads(one["tools"])[0]["function"]["name"] == "get_weather"
    assert one["messages"][1]["tool_calls"] == [{"id": "call_p", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city":"Paris"}'}}]
    assert (one["messages"][2]["role"], one["messages"][2]["tool_call_id"]) == ("tool", "call_p")


def test_sharegpt_export_reads_back_as_the_same_traffic(corpus_dir: Path, tmp_path: Path) -> None:
    """glaive/LLaMA-Factory's form: function_call and observation turns, tools as a JSON string. Read back, the
    calls, arguments and results are the same; ids are the readers' (call_N), and an assistant's text or
    reasoning before its calls, a gpt turn of its own there, is merged back into the call turn (flagged)."""
    export_corpus(corpus_dir, "sharegpt", tmp_path)
    rows = lines(tmp_path / "train.jsonl")
    parallel = next(row for row in rows if any(t["value"] == "Weather and local time in Rome?"
                                               for t in row["conversations"]))
    assert [t["from"] for t in parallel["conversations"][:5]] == ["system", "human", "gpt", "function_call",
                                                                  "observation"]
    back = [c for c in iter_file(tmp_path / "train.jsonl") if isinstance(c, Conversation)]
    original = Corpus.open(corpus_dir).iter_conversations()

    def traffic(conversation: Conversation) -> tuple[Any, ...]:
        return (json.dumps(conversation.tools, sort_keys=True), tuple(
            (m.role, m.content, m.reasoning, tuple((c.name, canonical(c.arguments)) for c in m.tool_calls))
            for m in conversation.messages))

    assert Counter(map(traffic, back)) == Counter(map(traffic, original))
    # the call turns with text or reasoning: Rome's ("Let me check both.") and Paris's (its reasoning)
    assert Counter(flag for c in back for flag in c.flags) == {"repaired:consecutive_turns:merge": 2}


def canonical(arguments: str) -> str:
    return json.dumps(json.loads(arguments), sort_keys=True)


def test_specforge_leaves_tool_traffic_out_and_says_why(corpus_dir: Path, tmp_path: Path) -> None:
    report = export_corpus(corpus_dir, "specforge", tmp_path)
    assert report.skipped == {SPECFORGE_NO_TOOLS: 5} and report.files["train"].rows == 1
    assert f"left out: {SPECFORGE_NO_TOOLS}: 5 conversations" in report.describe()


def test_a_specforge_export_that_leaves_every_row_out_writes_nothing(tmp_path: Path) -> None:
    calling_tools = log_rows()[:3]
    (tmp_path / "logs.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in calling_tools))
    (tmp_path / "recipe.yaml").write_text("name: tools\ntarget: {model: m}\nsources:\n"
                                          "  - {name: logs, kind: replay, path: logs.jsonl}\noutput: {dir: out}\n")
    corpus = build_corpus(load_recipe(tmp_path / "recipe.yaml")).out_dir
    out = tmp_path / "specforge"
    with pytest.raises(CorpusError, match=r"the specforge export would hold no rows: every conversation was left out "
                                          rf"\({re.escape(SPECFORGE_NO_TOOLS)}: 3\); nothing was written"):
        export_corpus(corpus, "specforge", out)
    assert not out.exists()


def test_specforge_leaves_out_tools_without_calls_and_calls_without_tools(tmp_path: Path) -> None:
    """Either side of tool traffic alone is left out: a row served with tools that calls none (the tools are in its
    prompt) and a row whose calls came without a tools list; the rows without either are exported."""
    rows = [{"tools": [WEATHER], "messages": [say("user", "Hello?"), say("assistant", "Hi.")]},
            {"messages": [say("user", "Weather in Oslo?"), calling(call("c1", "get_weather", {"city": "Oslo"})),
                          result("c1", "3 °C"), say("assistant", "3 °C.")]},
            *({"messages": [say("user", f"Say {word}."), say("assistant", f"{word}!")]} for word in ("one", "two"))]
    (tmp_path / "rows.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    (tmp_path / "recipe.yaml").write_text("name: r\ntarget: {model: m}\nsources:\n"
                                          "  - {name: rows, kind: replay, path: rows.jsonl}\n"
                                          "split: {validation_fraction: 0}\noutput: {dir: out}\n")
    corpus = build_corpus(load_recipe(tmp_path / "recipe.yaml")).out_dir
    report = export_corpus(corpus, "specforge", tmp_path / "specforge")
    assert report.skipped == {SPECFORGE_NO_TOOLS: 2} and report.files["train"].rows == 2
    exported = lines(tmp_path / "specforge" / "train.jsonl")
    assert sorted(turn["content"] for row in exported for turn in row["conversations"]) == [
        "Say one.", "Say two.", "one!", "two!"]
