"""Token-exact rows, the served-ids check, budgets and the audit's token statistics (tiny model's tokenizer)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from corpus_builder.assemble import build_corpus
from corpus_builder.assemble.local import handed_over
from corpus_builder.assemble.plan import TargetTokens
from corpus_builder.audit import audit_corpus, format_report
from corpus_builder.layout import Corpus, iter_ledger
from corpus_builder.recipe import load_recipe
from corpus_builder.records import Conversation, Message, Provenance
from corpus_builder.screen.checks import Checker
from corpus_builder.screen.ids import UniqueIds
from corpus_builder.screen.row_checks import FLAG_TRUNCATED_TO_BUDGET
from corpus_builder.screen.stream import screened_in_order
from corpus_builder.testing.tiny_model import DEFAULT_SYSTEM_PROMPT
from corpus_builder.tokens import TemplateRenderer, TokenRows, served_turns
from tests.support.corpora import write_corpus
from tests.support.hf_template import hf_ids

ID = "0123456789abcdef0123"


def conversation(*messages: Message, origin: str = "replay", source: str = "log") -> Conversation:
    return Conversation(ID, source, origin, list(messages), task="chat", license="MIT")


def chat() -> Conversation:
    return conversation(Message("user", "hi there"), Message("assistant", "hello", "greet back"),
                        Message("user", "what is 2+2?"), Message("assistant", "4", None))


def template_messages(conversation: Conversation) -> list[dict[str, str]]:
    """The conversation as chat-template input (reasoning in ``reasoning_content``)."""
    out = []
    for m in conversation.messages:
        message = {"role": m.role, "content": m.content}
        if m.reasoning is not None:
            message["reasoning_content"] = m.reasoning
        out.append(message)
    return out


def served(hf: Any, base: Conversation) -> Conversation:
    """``base`` as a generated row whose served ids come from transformers' own apply_chat_template (not the
    renderer under test), as a server makes them: the prompt of each assistant turn tokenized alone, then the
    tokens of the turn's text through <|im_end|>."""
    messages = template_messages(base)
    turns = []
    for j, message in enumerate(base.messages):
        if message.role != "assistant":
            continue
        prompt = hf.apply_chat_template(messages[:j], tokenize=False, add_generation_prompt=True)
        full = hf.apply_chat_template(messages[:j + 1], tokenize=False)
        assert full.startswith(prompt)
        completion = full[len(prompt):full.index(hf.eos_token, len(prompt)) + len(hf.eos_token)]
        ids = [hf(text, add_special_tokens=False)["input_ids"] for text in (prompt, completion)]
        turns.append({"message_index": j, "endpoint": "http://127.0.0.1:1/v1", "finish_reason": "stop",
                      "prompt_token_ids": ids[0], "token_ids": ids[1]})
    generation = {"turns": turns, "enable_thinking": True}
    return replace(base, origin="generated", provenance=Provenance.from_json({"generation": generation}))


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def renderer(tiny_model_dir: Path) -> TemplateRenderer:
    return TemplateRenderer(tiny_model_dir)


def decode(renderer: TemplateRenderer, ids: list[int]) -> str:
    return renderer.tokenizer.decode(ids, skip_special_tokens=False)


def test_replayed_rows_supervise_exactly_each_assistant_turn(renderer: TemplateRenderer, tiny_model_dir: Path) -> None:
    (item,) = TokenRows(renderer).tokenize([chat()])
    first, second = item.rows
    assert (first.id, first.message_index, second.message_index) == (f"{ID}/1", 1, 3)
    # The default system prompt is there (the row had none), the prompt ends with the opened think block.
    assert decode(renderer, first.input_ids[:first.start]) == (
        f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nhi there<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n")
    assert decode(renderer, first.input_ids[first.start:]) == "greet back\n</think>\n\nhello<|im_end|>"
    assert decode(renderer, first.input_ids[first.start:first.start + first.reasoning]) == "greet back\n</think>"
    assert first.loss_mask == [0] * first.start + [1] * first.supervised
    # History reasoning is kept in the second turn's context.
    assert "greet back" in decode(renderer, second.input_ids[:second.start])
    assert decode(renderer, second.input_ids[second.start:]).endswith("</think>\n\n4<|im_end|>")
    # The length as served, from transformers' own apply_chat_template (not the renderer under test).
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": "hi there"},
                {"role": "assistant", "content": "hello", "reasoning_content": "greet back"},
                {"role": "user", "content": "what is 2+2?"}, {"role": "assistant", "content": "4"}]
    expected = AutoTokenizer.from_pretrained(tiny_model_dir).apply_chat_template(messages, tokenize=True)
    assert item.tokens == len(expected if isinstance(expected, list) else expected["input_ids"])
    assert item.checked_turns == 0 and item.mismatches == []


def test_generated_rows_use_served_ids_and_match_their_render(renderer: TemplateRenderer, hf: Any) -> None:
    row = served(hf, chat())
    (item,) = TokenRows(renderer).tokenize([row])
    turns = served_turns(row)
    for turn_row in item.rows:
        turn = turns[turn_row.message_index]
        assert turn_row.served
        assert turn_row.input_ids == turn.prompt_token_ids + turn.token_ids
        assert turn_row.start == len(turn.prompt_token_ids)
    assert item.checked_turns == 2 and item.mismatches == []


def test_mismatches_are_reported_by_row_turn_and_position(renderer: TemplateRenderer, hf: Any) -> None:
    row = served(hf, chat())
    # The stored system prompt is not the one the server saw: every turn differs inside the prompt.
    generation = row.provenance.generation
    assert generation is not None
    shifted = tuple(replace(turn, message_index=turn.message_index + 1) for turn in generation.turns)
    changed_prompt = replace(row, messages=[Message("system", "Another system prompt."), *row.messages],
                             provenance=replace(row.provenance, generation=replace(generation, turns=shifted)))
    # The stored answer of the last turn is not what was generated: a completion mismatch.
    changed_answer = served(hf, chat())
    changed_answer.messages[3] = Message("assistant", "5", None)
    items = TokenRows(renderer).tokenize([changed_prompt, changed_answer])
    prompt_side = items[0].mismatches
    assert [(m.message_index, m.part) for m in prompt_side] == [(2, "prompt"), (4, "prompt")]
    assert prompt_side[0].position == 3  # <|im_start|> system \n, then the system text differs
    (answer_side,) = items[1].mismatches
    last = served_turns(changed_answer)[3]
    assert (answer_side.id, answer_side.message_index, answer_side.part) == (ID, 3, "completion")
    assert answer_side.position == len(last.prompt_token_ids) + last.token_ids.index(
        renderer.encode(["4"])[0][0])
    assert "4" in answer_side.served_text and "5" in answer_side.rendered_text


def test_history_reasoning_drop_renders_what_was_sent(tiny_model_dir: Path) -> None:
    keep = TemplateRenderer(tiny_model_dir)
    drop = TemplateRenderer(tiny_model_dir, history_reasoning="drop")
    long_reasoning = " ".join(["ponder"] * 200)
    row = conversation(Message("user", "a"), Message("assistant", "b", long_reasoning),
                       Message("user", "c"), Message("assistant", "d", "short"))
    (item,) = TokenRows(drop).tokenize([row])
    first, second = item.rows
    assert long_reasoning in decode(drop, first.input_ids[first.start:])
    assert "ponder" not in decode(drop, second.input_ids[:second.start])  # dropped from the history
    assert "short" in decode(drop, second.input_ids[second.start:])
    # The budget is the longest view: here the first turn's, which carries the long reasoning.
    assert item.tokens == drop.count_tokens([row])[0] == len(first.input_ids) + 1  # + the "\n" after <|im_end|>
    assert keep.count_tokens([row])[0] > item.tokens


def test_thinking_off_recipe_rows(tiny_model_dir: Path) -> None:
    renderer = TemplateRenderer(tiny_model_dir, enable_thinking=False)
    row = conversation(Message("user", "a"), Message("assistant", "b", None),
                       Message("user", "c"), Message("assistant", "d", "reasoned"))
    first, second = TokenRows(renderer).tokenize([row])[0].rows
    # Thinking off: the closed think block is part of the prompt, nothing supervised is reasoning. The prompt's
    # last token ("\n\n") is split differently once the answer follows; as speculators does, the mask then
    # starts at the common prefix of the two tokenizations.
    assert decode(renderer, first.input_ids[first.start:]) in ("b<|im_end|>", "\n\nb<|im_end|>")
    assert first.reasoning == 0
    # A turn that carries reasoning was made in thinking mode: its prompt is the thinking one.
    supervised = second.input_ids[second.start:]
    assert decode(renderer, supervised) == "reasoned\n</think>\n\nd<|im_end|>"
    assert decode(renderer, supervised[:second.reasoning]) == "reasoned\n</think>"


RECIPE = """\
name: budget
target: {{model: tiny-target, tokenizer: {tokenizer}}}
sources:
  - {{name: log, kind: replay, path: log.jsonl}}
checks: {{max_seq_len: {limit}, on_over_length: {policy}, dedup: none}}
split: {{validation_fraction: 0.25, seed: 1}}
output: {{dir: out}}
"""


def write_log(path: Path, conversations: list[list[dict[str, str]]]) -> None:
    import orjson

    path.write_bytes(b"".join(orjson.dumps({"messages": m}) + b"\n" for m in conversations))


def log_rows() -> list[list[dict[str, str]]]:
    rows = []
    for i in range(40):
        messages = []
        for turn in range(1 + i % 4):
            messages += [{"role": "user", "content": f"question {i}.{turn} " + "word " * (5 * (i % 7))},
                         {"role": "assistant", "content": f"<think>\nstep {i}\n</think>\n\nanswer {i}.{turn}"}]
        rows.append(messages)
    return rows


@pytest.mark.parametrize("policy", ["drop", "truncate"])
def test_budget_drops_or_truncates_and_counts_in_the_ledger(tmp_path: Path, tiny_model_dir: Path, hf: Any,
                                                            policy: str) -> None:
    """Lengths expected from transformers' apply_chat_template, not from the counter that enforces the budget."""
    write_log(tmp_path / "log.jsonl", log_rows())
    from corpus_builder.sources import iter_file

    def length(conversation: Conversation) -> int:
        return len(hf_ids(hf, template_messages(conversation)))

    lengths = [length(c) for c in iter_file(tmp_path / "log.jsonl") if isinstance(c, Conversation)]
    limit = int(np.percentile(lengths, 60))
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(RECIPE.format(tokenizer=tiny_model_dir, limit=limit, policy=policy))
    result = build_corpus(load_recipe(recipe_path))
    kept = list(Corpus.open(result.out_dir).iter_conversations())
    kept_lengths = [length(c) for c in kept]
    assert max(kept_lengths) <= limit
    ledger = Counter(r["reason"] for r in iter_ledger(result.out_dir / "ledger.jsonl.zst"))
    over = sum(length > limit for length in lengths)
    truncated = [c for c in kept if FLAG_TRUNCATED_TO_BUDGET in c.flags]
    if policy == "drop":
        assert ledger["over_length"] == over and not truncated
        assert len(kept) == len(lengths) - over
    else:  # every over-long row either lost trailing turn pairs or (one pair already too long) was dropped
        assert ledger["over_length"] + len(truncated) == over and truncated
        assert all(len(c.messages) % 2 == 0 and c.messages[-1].role == "assistant" for c in truncated)
    tokens = result.audit["tokens"]
    assert tokens["over_budget"] == 0 and tokens["max"] == max(kept_lengths) and tokens["max_seq_len"] == limit
    assert tokens["conversations"] == len(kept)
    assert tokens["p50"] == sorted(kept_lengths)[(len(kept_lengths) + 1) // 2 - 1]
    assert set(tokens["by_split"]) == {"train", "validation"} and set(tokens["by_source"]) == {"log"}
    assert 0 < tokens["reasoning_token_share"] < 1
    # `corpus audit` recomputes the same statistics from the files.
    assert audit_corpus(str(result.out_dir))["tokens"] == tokens


def test_audit_without_tokenizer_has_no_token_section(tmp_path: Path) -> None:
    write_log(tmp_path / "log.jsonl", log_rows()[:5])
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(RECIPE.replace("tokenizer: {tokenizer}", "").replace(
        "checks: {{max_seq_len: {limit}, on_over_length: {policy}, dedup: none}}\n", "").format())
    result = build_corpus(load_recipe(recipe_path))
    assert "tokens" not in result.audit and "tokens" not in audit_corpus(str(result.out_dir))


@pytest.mark.parametrize("upstream", [False, True], ids=["measured-by-the-writer", "measured-where-read"])
@pytest.mark.parametrize("policy", ["warn", "fail"])
def test_mismatches_warn_or_fail_the_build(tmp_path: Path, tiny_model_dir: Path, hf: Any, policy: str,
                                           upstream: bool) -> None:
    """The same verdict whether the checks measure the rows (their figures handed to the writer under the id each
    row is written under) or the writer does."""
    write_log(tmp_path / "log.jsonl", log_rows()[:1])
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(RECIPE.format(tokenizer=tiny_model_dir, limit=4096, policy="drop").replace(
        "dedup: none}", f"dedup: none, token_mismatch: {policy}}}"))
    recipe = load_recipe(recipe_path)
    good = served(hf, chat())
    bad = served(hf, chat())
    bad.messages[1] = Message("assistant", "hello!", "greet back")  # the same id: written as ID-1
    staging = tmp_path / "staging"
    staging.mkdir()
    tokens = TargetTokens.for_recipe(recipe)
    judged = screened_in_order([good, bad], Checker(recipe.checks, tokens.renderer, facts=upstream),
                               [UniqueIds().judge])
    result = write_corpus(handed_over(judged, tokens.measured), recipe, staging, tokens)
    mismatches = result.audit["tokens"]["mismatches"]
    assert bad.id == f"{ID}-1" and not tokens.measured  # every figure handed over was taken
    # The changed answer differs in its own turn and in the next turn's prompt, which re-renders it.
    assert mismatches["checked_turns"] == 4 and mismatches["count"] == 2
    assert [(m["id"], m["message_index"], m["part"]) for m in mismatches["turns"]] == [
        (bad.id, 1, "completion"), (bad.id, 3, "prompt")]
    assert result.passed is (policy == "warn")
    if policy == "fail":
        assert "served token ids" in result.problems[0]
    text = format_report(result.audit)
    assert "target tokens per conversation" in text
    assert f"served-ids check: 2 of 4 generated turns do not re-render to their served tokens " \
           f"({'fatal' if policy == 'fail' else 'warning'})" in text
    assert f"{bad.id} turn 1 at token" in text


def test_a_turn_without_reasoning_has_no_reasoning_tokens(renderer: TemplateRenderer, tmp_path: Path) -> None:
    """The empty think block the template renders around an answer without reasoning is template, not reasoning:
    a dump with no reasoning reports none, in the rows and in the audit."""
    plain = conversation(Message("user", "hi"), Message("assistant", "hello"), Message("user", "and?"),
                         Message("assistant", "bye"))
    (item,) = TokenRows(renderer).tokenize([plain])
    assert [row.reasoning for row in item.rows] == [0, 0]
    assert "</think>" in decode(renderer, item.rows[0].input_ids[item.rows[0].start:])  # the block is there
    write_log(tmp_path / "log.jsonl", [[{"role": "user", "content": f"q {i}"},
                                        {"role": "assistant", "content": f"a {i}"}] for i in range(5)])
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(RECIPE.format(tokenizer=renderer.tokenizer_dir, limit=4096, policy="drop"))
    tokens = build_corpus(load_recipe(recipe_path)).audit["tokens"]
    assert tokens["reasoning_tokens"] == 0 and tokens["reasoning_token_share"] == 0.0


def test_a_row_far_over_the_budget_is_never_tokenized_whole(tmp_path: Path, tiny_model_dir: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A row that cannot fit is known from its characters alone: it is dropped as over_length without being
    rendered or tokenized (a 50 MB row used to cost gigabytes), and the ledger says it is at least that long."""
    huge = "word " * 400_000  # 2 MB of text
    write_log(tmp_path / "log.jsonl", [[{"role": "user", "content": "short"}, {"role": "assistant", "content": "ok"}],
                                       [{"role": "user", "content": huge}, {"role": "assistant", "content": "ok"}]])
    seen: list[int] = []
    real = TemplateRenderer.budget_views

    def rendering(self: TemplateRenderer, conversation: Conversation) -> list[str]:
        seen.append(sum(len(m.content) for m in conversation.messages))
        return real(self, conversation)

    monkeypatch.setattr(TemplateRenderer, "budget_views", rendering)
    monkeypatch.setenv("CORPUS_WORKERS", "1")  # rows read (and rendered) in this process, where the spy sees them
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(RECIPE.format(tokenizer=tiny_model_dir, limit=4096, policy="truncate"))
    result = build_corpus(load_recipe(recipe_path))
    assert max(seen) < 1000  # only the short row was rendered
    (dropped,) = [r for r in iter_ledger(result.out_dir / "ledger.jsonl.zst") if r["reason"] == "over_length"]
    assert dropped["detail"].startswith("at least ") and dropped["detail"].endswith("tokens > 4096")
    assert result.manifest.conversations == 1


def test_a_tool_row_over_the_budget_loses_whole_exchanges(tmp_path: Path, tiny_model_dir: Path, hf: Any) -> None:
    """Truncation cuts before a user turn: an exchange goes with its tool calls and their results."""
    import orjson


    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    call = {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    first = [{"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": "", "tool_calls": [call]},
             {"role": "tool", "tool_call_id": "call_0", "content": "sunny, 21 C"},
             {"role": "assistant", "content": "It is sunny."}]
    second = [{"role": "user", "content": "And in Lyon? " + "word " * 300},
              {"role": "assistant", "content": "", "tool_calls": [{**call, "id": "call_1"}]},
              {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
              {"role": "assistant", "content": "Rain."}]
    hf_call = {**call, "function": {**call["function"], "arguments": {"city": "Paris"}}}
    as_hf = [{**m, "tool_calls": [hf_call]} if "tool_calls" in m else m for m in first]
    limit = len(hf_ids(hf, as_hf, tools)) + 8  # the first exchange fits, with a few tokens to spare
    (tmp_path / "log.jsonl").write_bytes(orjson.dumps({"messages": first + second, "tools": tools}) + b"\n")
    (tmp_path / "recipe.yaml").write_text(RECIPE.format(tokenizer=tiny_model_dir, limit=limit, policy="truncate"))
    result = build_corpus(load_recipe(tmp_path / "recipe.yaml"))
    [row] = Corpus.open(result.out_dir).iter_conversations()
    assert [m.role for m in row.messages] == ["user", "assistant", "tool", "assistant"]
    assert row.messages[3].content == "It is sunny."
    assert row.messages[1].tool_calls[0].name == "get_weather" and FLAG_TRUNCATED_TO_BUDGET in row.flags
