"""The per-row facts the audit compares, computed with polars over raw rows or corpus shards.

``row_facts`` turns a frame of rows into one row of facts per conversation: task, the facts of ``stats.facts`` the
comparison counts (thinking mode, thinking, served, assistant turns, tool use) and script. It reads the rows the way the
source readers do (``sources.mappings``): the turns of ``conversations`` or ``messages``, roles by the
readers' aliases, reasoning from the first ``reasoning``/``reasoning_content``/``thinking`` field that is set.
A think block in an assistant turn's content is the readers' to move out (``records.split_think``), once: a raw
row with one is never plain, and what the split leaves in a conversation's content is content (a second
``</think>`` there is text, not a pre-opened block). A built corpus's shards and a raw serving log go through
the same query, so the same rows give the same facts.

Which rows count is the readers' decision: ``plain_rows`` picks the rows of a raw frame that the readers take
exactly as they are (most rows of a log), so their facts are read from the frame; ``audit.inputs`` gives every
other row to the readers themselves and reads the facts of the conversations they make of it.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Sequence
from typing import Final

import numpy as np
import polars as pl

from ..records import REASONING_KEYS
from ..sources.mappings import CALL_SPEAKERS, ROLE_ALIASES, TURN_FIELDS, TURN_KEYS
from ..stats.facts import ASSISTANT_TURNS, SERVED, THINKING, THINKING_MODE, TOOL_CALL_TAG, TOOL_USE, per_row

# What a raw row may hold that the audit reads; anything else on the row is not parsed into columns.
# ``tool_calls``, the legacy ``function_call`` and the row's ``tools`` are read for their presence only (a row
# with any of them goes to the readers), so the shape of one call or tool does not matter.
TURN_FIELD_TYPES: Final[dict[str, pl.DataType]] = {
    "role": pl.String(), "from": pl.String(), "content": pl.String(), "value": pl.String(),
    **{key: pl.String() for key in REASONING_KEYS},
    "tool_calls": pl.List(pl.Struct({"id": pl.String})), "function_call": pl.Struct({"name": pl.String}),
}
ROW_FIELD_TYPES: Final[dict[str, pl.DataType]] = {
    "task": pl.String(), "enable_thinking": pl.Boolean(),
    "chat_template_kwargs": pl.Struct({"enable_thinking": pl.Boolean}),
    "tools": pl.List(pl.Struct({"type": pl.String})),
}
RAW_SCHEMA: Final = pl.Schema({**{name: pl.List(pl.Struct(TURN_FIELD_TYPES)) for name in TURN_FIELDS},
                               **ROW_FIELD_TYPES})
# Speakers of tool traffic, as the readers map them: a tool's result (OpenAI ``tool``/``function``, ShareGPT
# variants) or a ShareGPT turn whose value is the call(s).
TOOL_ROLES: Final = (*(speaker for speaker, role in ROLE_ALIASES.items() if role == "tool"), *sorted(CALL_SPEAKERS))
SCRIPT_PREFIX_CHARS: Final = 200  # the cheap classifier reads the first user turn's start only
# Unicode scripts the classifier tells apart, by the first word of a letter's Unicode name (a Han letter is
# "CJK UNIFIED IDEOGRAPH-4E2D"); ASCII-only text is "latin" without looking further.
_SCRIPT_OF_NAME: Final = {"CJK": "han", "HIRAGANA": "kana", "KATAKANA": "kana", "HANGUL": "hangul",
                          "CYRILLIC": "cyrillic", "ARABIC": "arabic", "DEVANAGARI": "devanagari", "THAI": "thai",
                          "GREEK": "greek", "HEBREW": "hebrew"}
_WIDTH_WORDS: Final = ("HALFWIDTH", "FULLWIDTH")  # "HALFWIDTH KATAKANA LETTER A": the script is the next word
# The speakers of the turns the readers take as they are (a tool's turns and calls are linked and checked).
PLAIN_ROLES: Final = {speaker: role for speaker, role in ROLE_ALIASES.items()
                      if role != "tool" and speaker not in CALL_SPEAKERS}
OTHER_SCRIPT: Final = "other"
NO_TASK: Final = "(none)"
UNRECORDED: Final = "unrecorded"

# The columns ``row_facts`` yields, in order; every count table of the audit is keyed by a subset.
FACT_KEYS: Final = ("source", "split", "task", THINKING_MODE, THINKING, SERVED, ASSISTANT_TURNS, TOOL_USE, "script")


@functools.cache
def _not_whitespace() -> str:
    """A character that is not whitespace as Python sees it (``str.strip``, ``isspace``: the readers' rule for an
    empty turn or reasoning), which counts more characters as whitespace than the regex engine's ``\\s``. Every
    whitespace character is in the Basic Multilingual Plane."""
    return "[^" + "".join(f"\\x{{{code:x}}}" for code in range(0x10000) if chr(code).isspace()) + "]"


def _nonblank(text: pl.Expr) -> pl.Expr:
    return text.str.contains(_not_whitespace()).fill_null(False)  # stops at the first non-space: no copy of the text


def _first_nonblank(names: Sequence[str], present: set[str]) -> pl.Expr:
    """Whether the first of these fields that is set holds more than whitespace (``make_message`` takes the
    first reasoning field that is not null, as the readers do)."""
    verdict: pl.Expr = pl.lit(False)
    for name in reversed([name for name in names if name in present]):
        verdict = pl.when(pl.col(name).is_not_null()).then(_nonblank(pl.col(name))).otherwise(verdict)
    return verdict


def _letter_script(letter: str | None) -> str:
    words = unicodedata.name(letter, "").split(" ") if letter else []
    if words and words[0] in _WIDTH_WORDS:
        words = words[1:]
    return _SCRIPT_OF_NAME.get(words[0], OTHER_SCRIPT) if words else OTHER_SCRIPT


def scripts(text: pl.Series) -> pl.Series:
    """The script of each text (null: other): latin when most of its letters are, else the script of its first
    letter that is not. ASCII-only text, most traffic, is latin at once; the rest takes two regex scans, and
    only their distinct first non-Latin letters are named (Unicode classes per script would cost a regex
    compilation each, per chunk)."""
    plain = (text.str.len_bytes() == text.str.len_chars()).fill_null(False)
    named = pl.select(pl.when(pl.lit(plain)).then(pl.lit("latin")).otherwise(pl.lit(OTHER_SCRIPT))).to_series()
    rest = (~plain & text.is_not_null()).arg_true()
    if not len(rest):
        return named.alias("script")
    unplain = pl.lit(text.gather(rest))
    measured = pl.select(latin=unplain.str.count_matches(r"\p{Latin}"),
                         others=unplain.str.count_matches(r"[\p{L}&&[^\p{Latin}]]"),
                         first_other=unplain.str.extract(r"([\p{L}&&[^\p{Latin}]])"))
    letters = measured.get_column("first_other")
    of_letter = {letter: _letter_script(letter) for letter in letters.unique().to_list()}
    judged = measured.select(
        pl.when(pl.col("latin") + pl.col("others") == 0).then(pl.lit(OTHER_SCRIPT))
        .when(pl.col("latin") >= pl.col("others")).then(pl.lit("latin"))
        .otherwise(pl.col("first_other").replace_strict(of_letter, default=OTHER_SCRIPT, return_dtype=pl.String)))
    return named.scatter(rest, judged.to_series()).alias("script")


def _turns(frame: pl.DataFrame, turns_field: str | None) -> pl.Series | None:
    """The turns of each row: ``turns_field``, else ``conversations`` or ``messages`` (the readers' order; a
    column that is null throughout, as the other one of a log's two is, is not read)."""
    names = (turns_field,) if turns_field else TURN_FIELDS
    present = [frame.get_column(name) for name in names
               if isinstance(frame.schema.get(name), pl.List) and frame.get_column(name).null_count() < frame.height]
    if not present:
        return None
    return present[0] if len(present) == 1 else pl.select(pl.coalesce(*map(pl.lit, present))).to_series()


def plain_rows(frame: pl.DataFrame, style: str, field: str) -> np.ndarray:
    """Which rows of a raw frame the readers (``RowNormaliser``, layout ``style`` on ``field``) take exactly as
    they are, so their facts are the facts of the conversation the readers make of them: a non-empty list of
    system, user and assistant turns in the strict order (``[system] user assistant ...``, ending on an
    assistant turn), each with text content that is not blank and has no other turn's keys, no think tag, tool
    call or legacy function call in an assistant turn, and no tools on the row. A row this cannot prove plain
    (a column of another type, a null) is left to the readers, which may take it all the same."""
    rows = frame.height
    dtype = frame.schema.get(field)
    role_key, content_key = TURN_KEYS[style]
    fields = {part.name: part.dtype for part in dtype.inner.fields} \
        if isinstance(dtype, pl.List) and isinstance(dtype.inner, pl.Struct) else {}
    other_keys = [key for key in TURN_KEYS["messages" if style == "sharegpt" else "sharegpt"] if key in fields]
    if fields.get(role_key) != pl.String or fields.get(content_key) != pl.String or any(
            fields.get(key, pl.String) != pl.String for key in (*REASONING_KEYS, *other_keys)):
        return np.zeros(rows, dtype=bool)
    turns = frame.get_column(field)
    lengths = turns.list.len().fill_null(0).to_numpy()
    turn = (turns.filter(pl.Series(lengths > 0)) if (lengths == 0).any() else turns).explode().struct.unnest()
    content = pl.col(content_key)
    assistant = (pl.col("role") == "assistant").fill_null(False)
    risky = content.str.contains("think>", literal=True).fill_null(False)  # a think tag, or a call of a tool:
    if "tool_calls" in fields:
        risky |= ((pl.col("tool_calls").list.len() > 0).fill_null(False) if isinstance(fields["tool_calls"], pl.List)
                  else pl.col("tool_calls").is_not_null())
    if "function_call" in fields:
        risky |= pl.col("function_call").is_not_null()
    judged = turn.with_columns(role=pl.col(role_key).replace_strict(PLAIN_ROLES, default=None,
                                                                    return_dtype=pl.String)).select(
        code=pl.col("role").replace_strict({"system": 0, "user": 1, "assistant": 2}, default=-1,
                                           return_dtype=pl.Int8),
        fit=_nonblank(content) & ~(assistant & risky)
        & pl.all_horizontal(pl.lit(True), *(pl.col(key).is_null() for key in other_keys)))
    code = judged.get_column("code").to_numpy()
    parent = np.repeat(np.arange(rows), lengths)
    first = np.cumsum(lengths) - lengths  # each row's first turn among the flattened turns
    leading_system = np.zeros(rows, dtype=np.int64)
    spoken = lengths > 0
    leading_system[spoken] = code[first[spoken]] == 0
    # The strict order: after a leading system turn, user on even steps and assistant on odd ones.
    step = np.arange(len(code)) - np.repeat(first + leading_system, lengths)
    expected = np.where(step < 0, 0, np.where(step % 2 == 0, 1, 2))
    misfit = (code != expected) | ~judged.get_column("fit").to_numpy()
    speakers = lengths - leading_system
    plain: np.ndarray = (spoken & (speakers >= 2) & (speakers % 2 == 0)
                         & (np.bincount(parent[misfit], minlength=rows) == 0))
    tools = frame.schema.get("tools")
    if tools is not None:
        absent = frame.get_column("tools").is_null()
        if isinstance(tools, pl.List):
            absent = absent | (frame.get_column("tools").list.len() == 0)
        plain &= absent.to_numpy()
    return plain


def _served(schema: pl.Schema) -> pl.Expr:
    """Whether the row was served with thinking on, where it says (``facts.served``): a request's
    ``chat_template_kwargs``, a top-level ``enable_thinking``, or a corpus row's provenance (a generated row's
    ``generation``, a replayed logged request's ``served``)."""
    found: list[pl.Expr] = []
    kwargs = schema.get("chat_template_kwargs")
    if isinstance(kwargs, pl.Struct) and "enable_thinking" in {f.name for f in kwargs.fields}:
        found.append(pl.col("chat_template_kwargs").struct.field("enable_thinking").cast(pl.Boolean, strict=False))
    if "enable_thinking" in schema:
        found.append(pl.col("enable_thinking").cast(pl.Boolean, strict=False))
    if schema.get("provenance") == pl.String:
        generated = _recorded_mode(pl.col("provenance"), "$.generation.enable_thinking")
        if "origin" in schema:  # a replayed row's mode is its logged request's (``served``), as facts.served reads it
            logged = _recorded_mode(pl.col("provenance"), "$.served.enable_thinking")
            found.append(pl.when(pl.col("origin") == "generated").then(generated)
                         .when(pl.col("origin") == "replay").then(logged))
        else:
            found.append(generated)
    return pl.coalesce(*found) if found else pl.lit(None, dtype=pl.Boolean)


def _recorded_mode(provenance: pl.Expr, path: str) -> pl.Expr:
    """The ``enable_thinking`` at ``path`` of a row's provenance (JSON text, compact as the build writes it) when it
    is a boolean (``facts.served``): the path gives "true" for a boolean and for a string alike, the text tells them
    apart (a string there with a boolean of that key elsewhere in the row's provenance is the one case it would not:
    no row the build writes has a string there)."""
    value = provenance.str.json_path_match(path)
    return (pl.when((value == "true") & provenance.str.contains('"enable_thinking":true', literal=True)).then(True)
            .when((value == "false") & provenance.str.contains('"enable_thinking":false', literal=True)).then(False)
            .otherwise(None).cast(pl.Boolean))


def row_facts(frame: pl.DataFrame, *, source: str | None = None, task: str | None = None,
              turns_field: str | None = None) -> pl.DataFrame:
    """One row of facts per row of ``frame``, in order: ``FACT_KEYS`` and ``conversation`` (the row has turns;
    the others are counted as skipped). The facts are ``stats.facts``'s, by their names there; ``served`` is
    the mode as a bucket (on, off or unrecorded).

    ``source`` names every row (traffic); without it the frame's own ``source`` column does (a corpus).
    ``task`` is the task tag of rows whose own ``task`` field is empty (a recipe source's tag).
    ``thinking_mode`` is as served where the row records it: a request's own fields, or a generated corpus
    row's provenance (how the target was asked).

    The turns are flattened and judged one by one (the tool-call tag is looked for in assistant turns only), and
    per-row verdicts are sums of the turns' (``facts.per_row``).
    """
    rows = frame.height
    turns = _turns(frame, turns_field)
    lengths = turns.list.len().fill_null(0).to_numpy() if turns is not None else np.zeros(rows, dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(lengths, dtype=np.int64)))
    if turns is None:
        turn = pl.DataFrame({"role": pl.Series([], dtype=pl.String)})
    else:
        # Rows without turns are left out first: polars explodes a null list to one null turn but an empty one
        # to none (a log line with "messages": [] once broke the turns' alignment). Strings are views: no copy.
        turn = (turns.filter(pl.Series(lengths > 0)) if (lengths == 0).any() else turns).explode().struct.unnest()
    user, content, assistant, reasoned, tooled = _judge_turns(turn)
    first_user_text = pl.repeat(None, rows, dtype=pl.String, eager=True)
    users = np.flatnonzero(user)
    if len(users):
        parent = np.repeat(np.arange(rows), lengths)
        owners, first = np.unique(parent[users], return_index=True)
        first_user_text = first_user_text.scatter(owners, content.gather(users[first])
                                                  .str.slice(0, SCRIPT_PREFIX_CHARS))
    schema = frame.schema
    thinking = pl.Series(THINKING, per_row(offsets, reasoned) > 0)
    row_task = pl.col("task").cast(pl.String, strict=False).replace("", None) if "task" in schema \
        else pl.lit(None, pl.String)
    # select broadcasts the literals (a tag, a field no row has) to the frame's height
    tagged = frame.select(_served(schema).alias(SERVED),
                          pl.coalesce(row_task, pl.lit(task, pl.String), pl.lit(NO_TASK)).alias("task"),
                          pl.lit(thinking).alias(THINKING)) if rows else \
        pl.DataFrame(schema={SERVED: pl.Boolean, "task": pl.String, THINKING: pl.Boolean})
    tagged = tagged.with_columns(pl.coalesce(SERVED, THINKING).alias(THINKING_MODE))
    served = tagged.get_column(SERVED)
    return pl.DataFrame({
        "source": pl.repeat(source, rows, dtype=pl.String, eager=True) if source is not None
        else frame.get_column("source").cast(pl.String),
        "split": frame.get_column("split").cast(pl.String) if "split" in schema
        else pl.repeat(None, rows, dtype=pl.String, eager=True),
        "task": tagged.get_column("task"),
        THINKING_MODE: tagged.get_column(THINKING_MODE),
        THINKING: thinking,
        SERVED: served.replace_strict({True: "on", False: "off"}, default=UNRECORDED, return_dtype=pl.String),
        ASSISTANT_TURNS: pl.Series(per_row(offsets, assistant), dtype=pl.Int32),
        TOOL_USE: pl.Series(per_row(offsets, tooled) > 0),
        "script": scripts(first_user_text),
        "conversation": pl.Series(lengths > 0),
    })


def _judge_turns(turn: pl.DataFrame) -> tuple[np.ndarray, pl.Series, np.ndarray, np.ndarray, np.ndarray]:
    """Per flattened turn (roles by the readers' aliases): whether it is a user turn, its content, and whether
    it is an assistant turn, has reasoning, has a tool call or is a tool's result."""
    present = set(turn.columns)
    raw_role = pl.coalesce(*(pl.col(name) for name in ("role", "from") if name in present), pl.lit(None, pl.String))
    content_fields = [pl.col(name) for name in ("content", "value")
                      if name in present and turn.get_column(name).null_count() < turn.height]
    judged = turn.select(
        (role := raw_role.replace_strict(ROLE_ALIASES, default=None, return_dtype=pl.String)).eq("user")
        .fill_null(False).alias("user"),
        role.eq("assistant").fill_null(False).alias("assistant"),
        raw_role.is_in(TOOL_ROLES).fill_null(False).alias("tool_role"),
        (pl.coalesce(*content_fields) if content_fields else pl.lit(None, pl.String)).alias("content"),
        _first_nonblank(REASONING_KEYS, present).alias("field_reasoning"),
        ((pl.col("tool_calls").list.len().fill_null(0) > 0) if "tool_calls" in present else pl.lit(False))
        .alias("called"),
    )
    content = judged.get_column("content")
    assistant = judged.get_column("assistant").to_numpy()
    reasoned = assistant & judged.get_column("field_reasoning").to_numpy()
    tooled = (assistant & judged.get_column("called").to_numpy()) | judged.get_column("tool_role").to_numpy()
    spoken = np.flatnonzero(assistant)
    tooled[spoken] |= content.gather(spoken).str.contains(TOOL_CALL_TAG, literal=True).fill_null(False).to_numpy()
    return judged.get_column("user").to_numpy(), content, assistant, reasoned, tooled
