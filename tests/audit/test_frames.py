"""The audit's per-row facts on raw rows (scripts, think and tool-call tags, roles by the readers' aliases), and
the line blocks they come from."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
import polars as pl

from corpus_builder.audit.frames import FACT_KEYS, RAW_SCHEMA, row_facts, scripts
from corpus_builder.audit.inputs import TrafficRows, _arrow_schema
from corpus_builder.recipe import Mapping
from corpus_builder.records import RepairRules
from corpus_builder.sources.raw import DecodedLines, arrow_lines
from corpus_builder.stats.facts import ASSISTANT_TURNS, SERVED, THINKING, TOOL_USE


def _frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=RAW_SCHEMA)


def _chat(user: str, assistant: str, **assistant_fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": user},
                         {"role": "assistant", "content": assistant, **assistant_fields}]}


def test_scripts_name_the_first_non_latin_letter_unless_latin_letters_are_most() -> None:
    texts = ["Summarise this article, please.", "你好，请帮我总结一下这篇文章", "Привет, как дела?",
             "καλημέρα σας", "こんにちは", "ｺﾝﾆﾁﾊ",  # halfwidth katakana: the name's second word is the script
             "안녕하세요", "مرحبا بك", "नमस्ते", "สวัสดีครับ", "שלום לכם",
             "Please translate 你好 into English for me",  # mostly latin letters
             "🙂🙂 ✔", "12345 + 678",  # no letters at all: other, unless plain ASCII
             None]
    expected = ["latin", "han", "cyrillic", "greek", "kana", "kana", "hangul", "arabic", "devanagari", "thai",
                "hebrew", "latin", "other", "latin", "other"]
    assert scripts(pl.Series(texts, dtype=pl.String)).to_list() == expected


def test_tool_call_tags_count_in_assistant_turns_only() -> None:
    rows = [
        _chat("Explain the <think> tag and <tool_call> blocks", "They are markup."),  # tags in the prompt
        _chat("Weather?", '<tool_call>\n{"name": "weather", "arguments": {}}\n</tool_call>'),
        _chat("Hi", "Hello!", reasoning_content="The user greets me."),
        _chat("Hi", "Hello!", reasoning=" \n", reasoning_content="shadowed"),  # the first field set: blank
        {"messages": []},
    ]
    facts = row_facts(_frame(rows), source="traffic")
    assert facts.get_column(THINKING).to_list() == [False, False, True, False, False]
    assert facts.get_column(TOOL_USE).to_list() == [False, True, False, False, False]
    assert facts.get_column(ASSISTANT_TURNS).to_list() == [1, 1, 1, 1, 0]
    assert facts.get_column("conversation").to_list() == [True] * 4 + [False]
    assert facts.get_column(SERVED).to_list() == ["unrecorded"] * 5


def test_think_blocks_are_split_by_the_readers_once() -> None:
    """A think block in a log's assistant turn makes the row the readers' (never read from the frame): its facts
    are those of the conversation their split makes, whose content holds no reasoning, a close tag left there
    included (split again, it once read as a pre-opened block: reasoning the row does not have)."""
    messages = [_chat("What is 2+2?", "<think>2 plus 2 is 4</think>The answer is 4."),
                _chat("What is 2+2?", "<think>\n\n</think>\n\nThe answer is 4."),  # an empty think block: none
                _chat("Hi", "greeting</think>Hello"),  # pre-opened
                _chat("Hi", "</think>Hello</think> again")]  # pre-opened and empty; the second close is content
    sharegpt = [{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hi</think>Hello"}]}]
    for rows, expected in ((messages, {True: 2, False: 2}), (sharegpt, {True: 1})):
        lines = [orjson.dumps(row) for row in rows]
        chunk = TrafficRows("traffic.jsonl", Mapping(), RepairRules()).chunk(
            DecodedLines.of(b"".join(line + b"\n" for line in lines)).batch(_arrow_schema()))
        assert chunk.frame.is_empty()
        facts, skipped = _chunk_facts(lines)
        assert not skipped
        reasoning: Counter[bool] = Counter()
        for fact, count in facts.items():
            reasoning[fact[FACT_KEYS.index(THINKING)]] += count
        assert reasoning == expected, rows


def _chunk_facts(lines: list[bytes]) -> tuple[Counter[tuple[object, ...]], Counter[str]]:
    """The facts of a block's rows (as a multiset: the rows the readers take as they are come first) and its skips."""
    rows = TrafficRows("traffic.jsonl", Mapping(), RepairRules())
    chunk = rows.chunk(DecodedLines.of(b"".join(line + b"\n" for line in lines)).batch(_arrow_schema()))
    facts = row_facts(chunk.frame, source="traffic", turns_field=chunk.turns_field)
    if chunk.normalised is not None:
        facts = pl.concat([facts, row_facts(chunk.normalised, source="traffic")])
    return Counter(facts.drop("conversation").iter_rows()), chunk.skipped


def test_blocks_pyarrow_refuses_are_read_by_the_readers_alike() -> None:
    """pyarrow parses a clean block; a value of another type or a line that is not an object makes it refuse the
    block, whose rows the readers' normaliser then reads: every readable row is judged alike, every other line
    skipped for the readers' reason."""
    good = [orjson.dumps(_chat("Hi", "Hello", name="bot")) + b"  ",
            orjson.dumps({"messages": [{"role": "user", "content": "你好"},
                                       {"role": "assistant", "content": "<think>hm</think>嗨"}],
                          "model": "m", "usage": {"tokens": 3}}),
            b"   ",  # blank: not a row
            orjson.dumps({"task": "math", "messages": [{"role": "user", "content": "1+1"},
                                                       {"role": "assistant", "content": "2",
                                                        "reasoning_content": "one and one"}]})]
    data = b"".join(line + b"\n" for line in good)
    table = arrow_lines(data, _arrow_schema())
    assert table is not None and pl.from_arrow(table).equals(pl.read_ndjson(b"\n".join(good), schema=RAW_SCHEMA))
    expected, skipped = _chunk_facts(good)
    assert not skipped
    by_script = {(fact[2], fact[8]): fact[4] for fact in expected}  # task and script: reasoning
    assert by_script == {("(none)", "latin"): False, ("(none)", "han"): True, ("math", "latin"): True}
    for odd, reason in ((b'{"task": 7, "messages": []}', "bad_messages"), (b"[1, 2]", "not_an_object"),
                        (b'{"task": "chat", "messages": [{"role": "user", "content": "\xff"}]}', "invalid_utf8"),
                        (b"{not json", "invalid_json")):
        assert arrow_lines(odd + b"\n", _arrow_schema()) is None, odd
        facts, counted = _chunk_facts([*good, odd])
        assert facts == expected, odd
        assert counted == Counter({reason: 1}), odd
    # pyarrow takes these (a block of bare nulls crashes it): the readers' decoder refuses them, never pyarrow sees them
    for odd, reason in ((b"null", "not_an_object"), (b"NaN", "invalid_json"),
                        (good[0] + b" " + good[0], "invalid_json")):
        facts, counted = _chunk_facts([*good, odd])
        assert facts == expected, odd
        assert counted == Counter({reason: 1}), odd
