"""The audit's polars engine (``audit.frames``, ``audit.profile``, ``audit.token_pass``) reads the facts of
``stats.facts`` off raw rows and corpus shards: on any rows, its facts are the definitions' facts of the
conversations the readers make of them, row by row and in total, and its token measures are ``tokens.TokenRows``'.

Each example is a few conversations written as a log (OpenAI-style or ShareGPT; reasoning in one of the reasoning
fields or as a think block in the content, tool calls with and without results, tools), built into a corpus by a real
build, and read three ways: the row-wise definitions over the corpus's rows (and ``TokenRows`` for their tokens), the
audit's engine over the corpus's shards, and the audit's engine over the log itself as traffic (``traffic_units``),
against the definitions over the conversations the readers make of the log. The facts compared are the ones the
comparison counts (``thinking``, ``thinking_mode``, ``assistant_turns``, ``tool_use``), by their names; the token
measures are a conversation's length and its assistant turns' prompt, response and reasoning tokens.
"""

from __future__ import annotations

import io
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from corpus_builder import build_corpus, load_recipe
from corpus_builder.audit import CorpusFiles
from corpus_builder.audit.frames import row_facts
from corpus_builder.audit.inputs import traffic_units
from corpus_builder.audit.options import AuditOptions
from corpus_builder.audit.profile import LENGTH_MEASURES, Profile, read_profile
from corpus_builder.audit.token_pass import Measured, TokenMeter
from corpus_builder.audit.traffic import describe, profile_corpus
from corpus_builder.layout import Corpus
from corpus_builder.records import REASONING_KEYS, ROLES, THINK_CLOSE, THINK_OPEN, Conversation, Message, ToolCall
from corpus_builder.rows import batch_to_conversations
from corpus_builder.sources import iter_file
from corpus_builder.sources.mappings import CALL_SPEAKERS, ROLE_ALIASES
from corpus_builder.stats import facts
from corpus_builder.stats.facts import ASSISTANT_TURNS, THINKING, THINKING_MODE, TOOL_CALL_TAG, TOOL_USE
from corpus_builder.tokens import TokenRows
from tests.support.fuzz import fuzz_settings

# Texts: words in several scripts, blanks of several kinds (Python's whitespace, the readers' rule for an empty
# turn), anything else hypothesis makes and, in ``TEXT``, the think and tool-call tags and the template's tokens.
WORDS = ["hello", "the answer is 4", "中文", "Привет", "🙂"]
BLANKS = [" ", "\n", "\t", "\u3000", "\u00a0", "\u2028"]
TAGS = [THINK_OPEN, THINK_CLOSE, "think>", TOOL_CALL_TAG, "</tool_call>", "<|im_end|>", "<|im_start|>"]
PLAIN_TEXT = st.lists(st.sampled_from(WORDS) | st.sampled_from(BLANKS) | st.text(max_size=6), min_size=1,
                      max_size=4).map("".join)
TEXT = PLAIN_TEXT | st.lists(PLAIN_TEXT | st.sampled_from(TAGS), max_size=4).map("".join)
TOOL_NAMES = ["search", "weather", "calc"]
ARGUMENTS = st.sampled_from(['{}', '{"q": "x"}', '{"city": "Paris", "days": 3}', "not json", "[1, 2]"])
TOOLS = [{"type": "function", "function": {"name": name, "description": f"the {name} tool",
                                           "parameters": {"type": "object", "properties": {}}}}
         for name in TOOL_NAMES]
SPEAKERS = {role: [speaker for speaker, named in ROLE_ALIASES.items() if named == role and speaker not in CALL_SPEAKERS]
            for role in ROLES}
# How an assistant turn's reasoning is written in the log: in one of the readers' fields (or in a later one, the
# first one empty: the readers take the first that is set), or in its content as a closed think block, a
# pre-opened one (``r</think>c``) or an unclosed one (``c<think>r``).
FIELD_FORMS = (*REASONING_KEYS, "shadowed")
FORMS = (*FIELD_FORMS, "block", "pre-opened", "unclosed")


@st.composite
def calls(draw: st.DrawFn, first: int) -> tuple[ToolCall, ...]:
    count = draw(st.integers(1, 2))
    return tuple(ToolCall(draw(st.sampled_from([f"call-{first + n}", ""])), draw(st.sampled_from(TOOL_NAMES)),
                          draw(ARGUMENTS)) for n in range(count))


@st.composite
def exchange(draw: st.DrawFn, number: int, text: st.SearchStrategy[str], tooled: bool) -> list[Message]:
    """A user turn, tool-calling steps (their calls answered: mostly all, else some or none, and the row may stop
    there), then mostly an answer."""
    reasoning = st.none() | st.sampled_from(["", *BLANKS]) | text
    turns = [Message("user", draw(text), draw(st.none() | st.none() | text))]  # reasoning on a user turn is no answer's
    for step in range(draw(st.integers(0, 2)) if tooled else 0):
        made = draw(calls(10 * number + 3 * step))
        turns.append(Message("assistant", draw(text), draw(reasoning), made))
        answered = draw(st.sampled_from([len(made)] * 3 + list(range(len(made)))))
        turns += [Message("tool", draw(text), tool_call_id=call.id or None) for call in made[:answered]]
    if draw(st.integers(0, 4)):
        turns.append(Message("assistant", draw(text), draw(reasoning)))
    return turns


@st.composite
def conversations(draw: st.DrawFn, plain: bool) -> Conversation:
    """A conversation of a log: a system turn or not, one to three exchanges; plain (no tags, no tool traffic:
    most of a log, whose facts the audit reads from the parsed frame) or anything, with tools or not; now and then
    a turn lost or said twice (what the readers' repairs mend or skip)."""
    text = PLAIN_TEXT if plain else TEXT
    messages = [Message("system", draw(text))] if draw(st.booleans()) else []
    for number in range(draw(st.integers(1, 3))):
        messages += draw(exchange(number, text, not plain))
    mishap = draw(st.sampled_from(["none"] * 6 + ["drop", "repeat"]))
    if mishap != "none":
        at = draw(st.integers(0, len(messages) - 1))
        messages[at:at + 1] = [] if mishap == "drop" else [messages[at], messages[at]]
    tools = None if plain else draw(st.none() | st.lists(st.sampled_from(TOOLS), min_size=1, max_size=2,
                                                          unique_by=str))
    return Conversation(id="", source="log", origin="replay", messages=messages, tools=tools)


def log_turn(message: Message, form: str, null_content: bool) -> dict[str, Any]:
    """A turn as an OpenAI-style log writes it: its reasoning in ``form`` (a think block only in an assistant turn:
    the readers split no other), the content of a turn that only calls tools null or empty."""
    turn: dict[str, Any] = {"role": message.role, "content": message.content}
    reasoning = message.reasoning
    if reasoning is not None:
        if form == "shadowed":
            turn.update({REASONING_KEYS[0]: "", REASONING_KEYS[1]: reasoning})
        elif form in REASONING_KEYS or message.role != "assistant":
            turn[form if form in REASONING_KEYS else REASONING_KEYS[0]] = reasoning
        else:
            turn["content"] = {"block": f"{THINK_OPEN}{reasoning}{THINK_CLOSE}{message.content}",
                               "pre-opened": f"{reasoning}{THINK_CLOSE}{message.content}",
                               "unclosed": f"{message.content}{THINK_OPEN}{reasoning}"}[form]
    if message.tool_calls:
        turn["tool_calls"] = [call.to_openai() for call in message.tool_calls]
        if null_content and not turn["content"]:
            turn["content"] = None
    if message.tool_call_id is not None:
        turn["tool_call_id"] = message.tool_call_id
    return turn


def sharegpt_turn(turn: dict[str, Any], speaker: str) -> dict[str, Any]:
    """An OpenAI-style turn as a ShareGPT dump writes it: ``from``/``value``, a turn that calls tools as the JSON of
    its calls (its text is lost: the dump holds none), a tool's result without the id of its call."""
    if "tool_calls" in turn:
        return {"from": next(iter(CALL_SPEAKERS)),
                "value": orjson.dumps([call["function"] for call in turn["tool_calls"]]).decode()}
    shared = {key: value for key, value in turn.items() if key not in ("role", "content", "tool_call_id")}
    return {"from": speaker, "value": turn["content"], **shared}


@st.composite
def logs(draw: st.DrawFn) -> list[dict[str, Any]]:
    """One to four rows of a log, each a conversation of ``conversations``: OpenAI-style ``messages``, or ShareGPT
    ``conversations`` under any of the readers' speaker names (one layout a file: its first row fixes it)."""
    sharegpt = draw(st.booleans())
    rows = []
    for plain in draw(st.lists(st.booleans(), min_size=1, max_size=4)):
        conversation = draw(conversations(plain))
        forms = st.sampled_from(FIELD_FORMS if plain else FORMS)  # a think block would make a plain row the readers'
        turns = [log_turn(message, draw(forms), draw(st.booleans())) for message in conversation.messages]
        if sharegpt:
            turns = [sharegpt_turn(turn, draw(st.sampled_from(SPEAKERS[turn["role"]]))) for turn in turns]
        rows.append({"conversations" if sharegpt else "messages": turns,
                     **({"tools": conversation.tools} if conversation.tools else {})})
    return rows


@dataclass(frozen=True)
class RowFigures:
    """The facts of one conversation the audit counts, its length and its assistant turns' prompt, response and
    reasoning tokens, in turn order."""

    thinking: bool
    assistant_turns: int
    tool_use: bool
    conversation_tokens: int
    prompt_tokens: tuple[int, ...]
    response_tokens: tuple[int, ...]
    reasoning_tokens: tuple[int, ...]


@dataclass
class Figures:
    """A side's figures as multisets (the traffic audit reads a log's rows in its own order): per conversation
    (thinking, assistant turns, tool use) and each length measure's nonzero values (the audit's length tables
    leave zeros out: a turn without reasoning, a conversation not measured)."""

    rows: Counter[tuple[bool, int, bool]] = field(default_factory=Counter)
    lengths: dict[str, Counter[int]] = field(default_factory=lambda: {m: Counter() for m in LENGTH_MEASURES})

    @classmethod
    def of(cls, rows: list[RowFigures]) -> Figures:
        figures = cls()
        for row in rows:
            figures.rows[(row.thinking, row.assistant_turns, row.tool_use)] += 1
            for measure in LENGTH_MEASURES:
                value = getattr(row, measure)
                figures.lengths[measure].update(v for v in (value if isinstance(value, tuple) else (value,)) if v)
        return figures


def defined_rows(conversations: list[Conversation], token_rows: TokenRows) -> list[RowFigures]:
    """The definitions' facts of conversations (over their JSON form), and their token rows (``TokenRows``)."""
    figures = []
    for conversation, tokens in zip(conversations, token_rows.tokenize(conversations), strict=True):
        turns = conversation.to_row()["messages"]
        figures.append(RowFigures(
            facts.thinking(turns), facts.assistant_turns(turns), facts.tool_use(turns), tokens.tokens,
            tuple(turn.start for turn in tokens.rows), tuple(turn.supervised for turn in tokens.rows),
            tuple(turn.reasoning for turn in tokens.rows)))
    return figures


def audit_rows(audited: pl.DataFrame, measured: Measured) -> list[RowFigures]:
    """The audit's facts of rows (``row_facts``) and their token measures (``TokenMeter``)."""
    figures = []
    for index, (thinking, mode, turns, tool_use) in enumerate(
            audited.select(THINKING, THINKING_MODE, ASSISTANT_TURNS, TOOL_USE).iter_rows()):
        assert mode == thinking  # no served mode recorded: the mode is thinking
        mine = measured.turn_conversation == index
        prompt, response, reasoned = (tuple(values[mine].tolist()) for values in (
            measured.turn_prompt, measured.turn_response, measured.turn_reasoning))
        figures.append(RowFigures(thinking, turns, tool_use, int(measured.conversation_tokens[index]),
                                  prompt, response, reasoned))
    return figures


def profile_figures(profile: Profile) -> Figures:
    """The figures of a whole side as the audit counts them (its fact table and exact length tables)."""
    figures = Figures()
    table = profile.facts.frame()
    for thinking, mode, turns, tool_use, count in table.select(
            THINKING, THINKING_MODE, ASSISTANT_TURNS, TOOL_USE, "count").iter_rows() if table.height else ():
        assert mode == thinking
        figures.rows[(thinking, turns, tool_use)] += count
    assert profile.tokens is not None
    exact = profile.tokens.exact.frame()
    for measure, tokens, count in exact.select("measure", "tokens", "count").iter_rows() if exact.height else ():
        figures.lengths[measure][tokens] += count
    return figures


def recipe(root: Path, tokenizer: Path) -> Path:
    (root / "recipe.yaml").write_text(f"""
name: facts-agree
target: {{model: tiny/target, tokenizer: {tokenizer}}}
sources:
  - {{name: log, kind: replay, path: log.jsonl, license: MIT}}
output: {{dir: out}}
""", encoding="utf-8")
    return root / "recipe.yaml"


def check_corpus_side(files: CorpusFiles, meter: TokenMeter, token_rows: TokenRows) -> None:
    """The definitions over a corpus's own rows against the audit's engine over its shards, and audit.json."""
    corpus = files.corpus
    defined: list[RowFigures] = []
    for batch in corpus.iter_batches():
        rows = batch_to_conversations(batch)
        mine, audited = defined_rows(rows, token_rows), \
            audit_rows(row_facts(pl.from_arrow(batch)), meter.measure(rows))  # type: ignore[arg-type]
        for conversation, defined_row, audit_row in zip(rows, mine, audited, strict=True):  # the shards' order
            assert audit_row == defined_row, conversation
        defined += mine
    profile, _ = profile_corpus(files, AuditOptions(token_sample=0))
    assert profile_figures(profile) == Figures.of(defined)  # the audit's count tables, as it reads the shards itself

    # In total, under the labels of the two reports (``stats.facts`` names each fact's).
    report, side = corpus.audit(), describe(profile)
    assert side["conversations"] == report["conversations"] == len(defined)
    if not defined:
        return
    assert side["reasoning_share"] == side["thinking_share"] == report["thinking_share"]
    assert side["counts"]["tool_calls"].get("with tool calls", 0) == sum(row.tool_use for row in defined)
    assert sum(side["counts"]["turns"].values()) == report["conversations"]
    tokens, lengths = report["tokens"], side["lengths"]["conversation_tokens"]
    assert {key: lengths[key] for key in ("count", "p50", "p90", "p99", "max")} == \
        {"count": tokens["conversations"], **{key: tokens[key] for key in ("p50", "p90", "p99", "max")}}
    assert sum(row.conversation_tokens for row in defined) == tokens["tokens"]
    assert side["token_sample"]["supervised_tokens"] == tokens["supervised_tokens"]
    assert sum(sum(row.reasoning_tokens) for row in defined) == tokens["reasoning_tokens"]


def check_traffic_side(log: Path, meter: TokenMeter, token_rows: TokenRows) -> None:
    """The definitions over the conversations the readers make of the log against the audit's engine over the log
    as traffic (its rows read from the raw frame where the readers take them as they are)."""
    made = [item for item in iter_file(log) if isinstance(item, Conversation)]
    profile = read_profile(str(log), traffic_units(str(log)), meter, token_sample=0)
    assert profile_figures(profile) == Figures.of(defined_rows(made, token_rows))


def chat(*answers: dict[str, Any]) -> dict[str, Any]:
    """A log row: a question and the assistant turns given."""
    return {"messages": [{"role": "user", "content": "What is 2+2?"}, *({"role": "assistant", **a} for a in answers)]}


@fuzz_settings(30)
@given(rows=logs())
# What the readers leave in a turn's content after moving its think block out is content: a close tag there is no
# pre-opened block (the audit's engine once split it again and counted reasoning the row does not have).
@example(rows=[chat({"content": "</think>4</think> is the answer"}),
               chat({"content": "<think> </think>4</think>", "reasoning_content": None})])
def test_the_audit_reads_the_defined_facts_off_any_rows(
        tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, rows: list[dict[str, Any]]) -> None:
    root = tmp_path_factory.mktemp("facts")
    log = root / "log.jsonl"
    log.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    result = build_corpus(load_recipe(recipe(root, tiny_model_dir)), progress=io.StringIO(), allow_empty=True)
    files = CorpusFiles(Corpus.open(result.out_dir))
    assert files.renderer is not None
    meter, token_rows = TokenMeter(files.renderer), TokenRows(files.renderer)
    check_corpus_side(files, meter, token_rows)
    check_traffic_side(log, meter, token_rows)
