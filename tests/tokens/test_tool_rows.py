"""Tool traffic in the target's tokens: every assistant turn of logged tool-calling conversations (parallel calls
included) checked token for token against transformers' own ``apply_chat_template(..., tools=...)`` on the
raw log messages; tool-call tokens supervised, tool results masked; history reasoning dropped except inside the
current exchange; a template without tool support refused with the source named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from corpus_builder.records import Conversation
from corpus_builder.sources import iter_source
from corpus_builder.testing.tiny_model import IM_END, TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from corpus_builder.tokens import TemplateRenderer, TemplateWithoutTools, TokenRows
from tests.sources.test_sources import spec, split, write_lines
from tests.support.hf_template import hf_ids, mask_start, occurrences, through_end_of_turn
from tests.support.tool_chats import log_rows


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def read_logs(directory: Path) -> dict[str, Conversation]:
    write_lines(directory / "log.jsonl", log_rows())
    kept, skipped = split(list(iter_source(spec(name="log", paths=("log.jsonl",)), directory)))
    assert skipped == []
    return {c.provenance.source_id: c for c in kept}


def template_messages(raw: list[dict[str, Any]], *, drop_before: int | None = None) -> list[dict[str, Any]]:
    """Log messages as transformers' docs ask for them: a call's arguments as an object. ``drop_before``: the
    reasoning of assistant turns before that index is left out (history reasoning dropped)."""
    messages = []
    for index, message in enumerate(raw):
        message = dict(message)
        if "tool_calls" in message:
            message["tool_calls"] = [{**c, "function": {**c["function"],
                                                        "arguments": json.loads(c["function"]["arguments"])}}
                                     for c in message["tool_calls"]]
        if drop_before is not None and index < drop_before:
            message.pop("reasoning_content", None)
        messages.append(message)
    return messages


@pytest.mark.parametrize("row_id", ["one-call", "parallel", "unanswered"])
def test_tool_turns_are_token_exact_against_transformers(tiny_model_dir: Path, tmp_path: Path, hf: Any,
                                                         row_id: str) -> None:
    conversation = read_logs(tmp_path)[row_id]
    raw = next(row for row in log_rows() if row["id"] == row_id)["messages"]
    rows = TokenRows(TemplateRenderer(tiny_model_dir)).tokenize([conversation])[0].rows
    eos, call_open, call_close = (hf.convert_tokens_to_ids(t) for t in (IM_END, TOOL_CALL_OPEN, TOOL_CALL_CLOSE))
    response = hf.encode("<tool_response>", add_special_tokens=False)
    assistant = [j for j, m in enumerate(raw) if m["role"] == "assistant"]
    assert [row.message_index for row in rows] == assistant
    for row in rows:
        j = row.message_index
        full = hf_ids(hf, template_messages(raw[:j + 1]), conversation.tools)
        prompt = hf_ids(hf, template_messages(raw[:j]), conversation.tools, generation_prompt=True)
        assert row.input_ids == through_end_of_turn(full, eos)
        assert row.start == mask_start(prompt, full)
        supervised, masked = row.input_ids[row.start:], row.input_ids[:row.start]
        calls = len(raw[j].get("tool_calls") or ())
        assert (supervised.count(call_open), supervised.count(call_close)) == (calls, calls)
        results_before = sum(m["role"] == "tool" for m in raw[:j])
        # the results of earlier calls are in the prompt, each inside <tool_response>, never supervised
        assert occurrences(masked, response) == results_before and occurrences(supervised, response) == 0
        assert supervised[-1] == eos


def test_history_reasoning_drop_keeps_the_current_exchange(tiny_model_dir: Path, tmp_path: Path, hf: Any) -> None:
    """With history reasoning dropped, a turn after tool results still sees the reasoning of the call turn of its
    own exchange (templates that drop history, e.g. Qwen3's, keep it), but not that of earlier exchanges."""
    conversation = read_logs(tmp_path)["parallel"]
    raw = next(row for row in log_rows() if row["id"] == "parallel")["messages"]
    renderer = TemplateRenderer(tiny_model_dir, history_reasoning="drop")
    for turn, exchange_start in ((5, 2), (9, 7)):  # the final answers of the two exchanges
        expected = hf_ids(hf, template_messages(raw[:turn], drop_before=exchange_start), conversation.tools,
                          generation_prompt=True)
        assert renderer.encode([renderer.render_prompt(conversation, turn)])[0] == expected
    assert "Two tools, one question." in renderer.render_prompt(conversation, 5)
    assert "Two tools, one question." not in renderer.render_prompt(conversation, 9)


def tokenizer_with_template(source: Path, directory: Path, template: str) -> Path:
    directory.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, directory / name)
    config = orjson.loads((directory / "tokenizer_config.json").read_bytes())
    config["chat_template"] = template
    (directory / "tokenizer_config.json").write_bytes(orjson.dumps(config))
    return directory


PLAIN_CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
STRICT_ROLES = ("{% for m in messages %}{% if m.role not in ['system', 'user', 'assistant'] %}"
                "{{ raise_exception('roles must be system, user or assistant') }}{% endif %}"
                "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")


@pytest.mark.parametrize(("template", "problem"), [
    (PLAIN_CHATML, "its render leaves out the tools, the call's name, the call's arguments"),
    (STRICT_ROLES, "rendering a tool call raised: chat template raised: roles must be system, user or assistant"),
], ids=["ignores-tools", "raises-on-tool-turns"])
def test_a_template_without_tool_support_is_refused_naming_the_source(tiny_model_dir: Path, tmp_path: Path,
                                                                       template: str, problem: str) -> None:
    conversations = read_logs(tmp_path)
    renderer = TemplateRenderer(tokenizer_with_template(tiny_model_dir, tmp_path / "tok", template))
    with pytest.raises(TemplateWithoutTools) as raised:
        renderer.count_tokens([conversations["one-call"]])
    assert "source 'log'" in str(raised.value) and problem in str(raised.value)
    with pytest.raises(TemplateWithoutTools):
        TokenRows(renderer).tokenize([conversations["unanswered"]])
    assert renderer.count_tokens([conversations["plain"]])[0] > 0  # rows without tool traffic render as before
