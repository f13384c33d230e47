"""The trainer formats of `corpus export`, each one record (``TRAINER_FORMATS``): its name, the converter that gives
its rows, their Arrow schema, the note the dataset card prints and the commands that train on it. The export, the
draft vocabulary and the publish read every fact of a format from here.

Formats (reasoning always travels in its own field, except in sharegpt, which has none):

* ``speculators``: ``{id, conversations: [{role, content, reasoning_content, tool_calls, tool_call_id}],
  tools}``, one row per conversation; speculators' ``prepare-data`` renders it through a vLLM server
  (``--render-endpoint``, with the row's ``tools``) and fans it out per assistant turn. Earlier reasoning
  stays in the history, as a Nanbeige-style template renders it.
* ``speculators-tokens``: ``{id, input_ids, loss_mask}``, one row per assistant turn (id
  ``{conversation id}/{message index}``), built by corpus_builder.tokens: served ids for generated turns,
  the rendered template for replayed ones; the mask covers the turn's tokens through its end-of-turn token
  (a turn's tool calls included; tool results are never supervised).
* ``specforge``: ``{id, conversations}`` as speculators, checked against SpecForge's rules
  (``specforge_problems``); a conversation that breaks them is left out and counted, and so is one with tool
  traffic (SpecForge's rows, as its validators state them, hold no tool turns or tools).
* ``messages``: OpenAI chat style ``{id, source, messages: [{role, content, reasoning_content, tool_calls,
  tool_call_id}], tools}`` (``reasoning_content`` is the field chat templates read, so rows feed
  ``apply_chat_template`` as they are, with ``tools=json.loads(row["tools"])``; a call's arguments are the
  model's text, as OpenAI writes them, where vLLM decodes them to an object before its template renders them:
  a template that prints a string verbatim then shows the model's own spacing).
* ``sharegpt``: ``{id, conversations: [{from: system|human|gpt|function_call|observation, value}], tools}``;
  ShareGPT has no reasoning field, so an assistant turn's reasoning is written back as a leading
  ``<think>\\n...\\n</think>\\n\\n`` block (the form corpus-builder's readers split out again). Tool traffic
  takes the glaive/LLaMA-Factory form: a ``function_call`` turn whose value is the call's JSON (a list for
  parallel calls; an assistant turn's text or reasoning before its calls is a ``gpt`` turn of its own, which
  the readers merge back), one ``observation`` turn per result (one holding the JSON list of the results
  after parallel calls).

Tool calls are OpenAI's ``{id, type: "function", function: {name, arguments}}`` with the arguments' text,
and ``tools`` is the row's function schemas as a JSON string (null without tools), as the Hermes and glaive
function-calling datasets store them and speculators reads them: free-form JSON Schema has no one column type.
Every turn carries ``reasoning_content``, ``tool_calls`` and ``tool_call_id`` (null where a turn has none):
with a key missing from some turns, ``datasets``' JSON loader types the turns as opaque ``Json`` instead of
``List({role, content, ...})``.

To add a format: its converter and its record in ``TRAINER_FORMATS`` here, and its name in
``trainer_formats.ExportFormat`` (the recipe's and the CLI's choices, held to the recipe schema's enum by a test;
in ``IN_TARGET_TOKENS`` too when its rows are in the target's tokens).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final, TypedDict

import orjson
import pyarrow as pa

from ..errors import CorpusError
from ..records import THINK_CLOSE, THINK_OPEN, Conversation, Message, ToolCall
from ..rows import tools_json
from ..tokens import TokenRows
from ..trainer_formats import EXPORT_FORMATS, IN_TARGET_TOKENS, ExportFormat, FileFormat


class Turn(TypedDict):
    role: str
    content: str
    reasoning_content: str | None
    tool_calls: list[Mapping[str, object]] | None  # OpenAI's {id, type, function: {name, arguments}}
    tool_call_id: str | None


class PlainTurn(TypedDict):
    role: str
    content: str
    reasoning_content: str | None


SharegptTurn = TypedDict("SharegptTurn", {"from": str, "value": str})


class SharegptCall(TypedDict):
    name: str
    arguments: str | Mapping[str, object]  # the arguments' object, or their text when it is not one


class SpeculatorsRow(TypedDict):
    id: str
    conversations: list[Turn]
    tools: str | None


class SpecforgeRow(TypedDict):
    id: str
    conversations: list[PlainTurn]


class MessagesRow(TypedDict):
    id: str
    source: str
    messages: list[Turn]
    tools: str | None


class SharegptRow(TypedDict):
    id: str
    conversations: list[SharegptTurn]
    tools: str | None


class TokenRow(TypedDict):
    id: str
    input_ids: list[int]
    loss_mask: list[int]


ExportRow = SpeculatorsRow | SpecforgeRow | MessagesRow | SharegptRow | TokenRow
# A converter turns a batch of conversations into output rows and counts what it leaves out, by reason.
Converter = Callable[[list[Conversation], Counter[str]], Iterator[ExportRow]]

# The format `corpus vocab` counts (an export of it, or the same rows made from a corpus), and its token columns.
TOKEN_FORMAT: Final[ExportFormat] = "speculators-tokens"
TOKEN_COLUMNS: Final = ("input_ids", "loss_mask")

_TOOL_CALL = pa.struct([("id", pa.string()), ("type", pa.string()),
                        ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
_PLAIN_TURN = pa.struct([("role", pa.string()), ("content", pa.string()), ("reasoning_content", pa.string())])
_TURN = pa.struct([*_PLAIN_TURN, ("tool_calls", pa.list_(_TOOL_CALL)), ("tool_call_id", pa.string())])
_SHAREGPT_TURN = pa.struct([("from", pa.string()), ("value", pa.string())])
SHAREGPT_ROLES = {"system": "system", "user": "human", "assistant": "gpt", "tool": "observation"}
SHAREGPT_CALL = "function_call"
SPECFORGE_NO_TOOLS = "tool calls or tools (SpecForge's conversations hold no tool turns)"


def _turns(conversation: Conversation) -> list[Turn]:
    return [{"role": m.role, "content": m.content, "reasoning_content": m.reasoning,
             "tool_calls": [call.to_openai() for call in m.tool_calls] or None, "tool_call_id": m.tool_call_id}
            for m in conversation.messages]


def specforge_problems(row: Mapping[str, object]) -> list[str]:
    """SpecForge's rules for a ``{id, conversations}`` row: roles alternate user/assistant after an optional
    leading system turn, every content is a non-empty string, no think markers are left in the content,
    and ``reasoning_content`` (a string) appears on assistant turns only."""
    problems = []
    row_id = row.get("id")
    if not isinstance(row_id, str) or not row_id:
        problems.append("id is not a non-empty string")
    turns = row.get("conversations")
    if not isinstance(turns, list) or not turns:
        return [*problems, "conversations is not a non-empty list"]
    start = 1 if isinstance(turns[0], dict) and turns[0].get("role") == "system" else 0
    if len(turns) == start:
        problems.append("no user turn")
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict):
            problems.append(f"turn {index} is not an object")
            continue
        expected = "system" if index < start else ("user", "assistant")[(index - start) % 2]
        if turn.get("role") != expected:
            problems.append(f"turn {index} has role {turn.get('role')!r}, expected {expected!r}")
        content = turn.get("content")
        if not isinstance(content, str) or not content.strip():
            problems.append(f"turn {index} has empty or non-string content")
        elif THINK_OPEN in content or THINK_CLOSE in content:
            problems.append(f"turn {index} content holds a think marker")
        reasoning = turn.get("reasoning_content")
        if reasoning is not None and (turn.get("role") != "assistant" or not isinstance(reasoning, str)):
            problems.append(f"turn {index} has reasoning_content but is not an assistant turn with a string")
    return problems


def inline_reasoning(message: Message) -> str:
    """A turn's text for a form with no reasoning field (sharegpt, vLLM's multi-turn benchmark): an assistant
    turn's reasoning written back as a leading think block, as the target generated it."""
    if message.role == "assistant" and message.reasoning:
        return f"{THINK_OPEN}\n{message.reasoning}\n{THINK_CLOSE}\n\n{message.content}"
    return message.content


def _sharegpt_turns(conversation: Conversation) -> list[SharegptTurn]:
    turns: list[SharegptTurn] = []
    results: list[str] = []  # the tool turns in a row, written as one observation when there are several

    def flush() -> None:
        if results:
            turns.append({"from": SHAREGPT_ROLES["tool"],
                          "value": results[0] if len(results) == 1 else orjson.dumps(results).decode()})
            results.clear()

    for message in conversation.messages:
        if message.role == "tool":
            results.append(message.content)
            continue
        flush()
        if not message.tool_calls or message.content or message.reasoning:
            turns.append({"from": SHAREGPT_ROLES[message.role], "value": inline_reasoning(message)})
        if message.tool_calls:
            calls = [_sharegpt_call(call) for call in message.tool_calls]
            value = calls[0] if len(calls) == 1 else calls
            turns.append({"from": SHAREGPT_CALL, "value": orjson.dumps(value).decode()})
    flush()
    return turns


def _sharegpt_call(call: ToolCall) -> SharegptCall:
    """glaive/LLaMA-Factory's call: the arguments as an object (their text when it is not one)."""
    arguments = call.arguments_object()
    return {"name": call.name, "arguments": call.arguments if arguments is None else arguments}


def _speculators(conversations: list[Conversation], skipped: Counter[str]) -> Iterator[SpeculatorsRow]:
    for c in conversations:
        yield {"id": c.id, "conversations": _turns(c), "tools": tools_json(c)}


def _specforge(conversations: list[Conversation], skipped: Counter[str]) -> Iterator[SpecforgeRow]:
    for c in conversations:
        if c.has_tool_traffic:
            skipped[SPECFORGE_NO_TOOLS] += 1
            continue
        row: SpecforgeRow = {"id": c.id, "conversations": [
            {"role": m.role, "content": m.content, "reasoning_content": m.reasoning} for m in c.messages]}
        problems = specforge_problems(row)
        if problems:
            skipped[re.sub(r"^turn \d+ ", "", problems[0])] += 1  # counted by kind, not by turn
            continue
        yield row


def _messages(conversations: list[Conversation], skipped: Counter[str]) -> Iterator[MessagesRow]:
    for c in conversations:
        yield {"id": c.id, "source": c.source, "messages": _turns(c), "tools": tools_json(c)}


def _sharegpt(conversations: list[Conversation], skipped: Counter[str]) -> Iterator[SharegptRow]:
    for c in conversations:
        yield {"id": c.id, "conversations": _sharegpt_turns(c), "tools": tools_json(c)}


def _in_text(convert: Converter) -> Callable[[TokenRows | None], Converter]:
    """A format whose rows are the conversations' text: no token rows needed."""
    return lambda _token_rows: convert


def _in_tokens(token_rows: TokenRows | None) -> Converter:
    """speculators-tokens: each assistant turn's token row, on the target's tokenizer."""
    if token_rows is None:
        raise CorpusError(f"{TOKEN_FORMAT} needs the target's tokenizer: the corpus recipe has no target.tokenizer "
                          "that can be found here (give --tokenizer DIR)")

    def convert(conversations: list[Conversation], skipped: Counter[str]) -> Iterator[TokenRow]:
        for item in token_rows.tokenize(conversations):
            for row in item.rows:
                yield {"id": row.id, "input_ids": row.input_ids, "loss_mask": row.loss_mask}

    return convert


@dataclass(frozen=True)
class TrainingFile:
    """A published export's train split, as the commands that train on it name it."""

    repo_id: str
    path: str  # in the repository
    target: str  # the target model

    def command(self, template: str) -> str:
        return template.format(target=self.target, path=self.path,
                               hub_url=f"hf://datasets/{self.repo_id}/{self.path}",
                               download=f"hf download {self.repo_id} {self.path} --repo-type dataset --local-dir .")


@dataclass(frozen=True)
class TrainerFormat:
    """One export format, whole: everything the export, `corpus vocab` and the publish know of it."""

    name: ExportFormat
    schema: pa.Schema  # its rows' Arrow schema (a parquet export's; the JSON exports hold the same fields)
    convert: Callable[[TokenRows | None], Converter]  # the converter, given the target's token rows (or None)
    card_note: str  # what the dataset card says of it, one sentence
    # The commands that train on its train split straight from the Hub ({target}, {path}, {hub_url}, {download}),
    # for the file formats the trainers read; none for a form no trainer here reads.
    train_commands: tuple[str, ...] = ()
    trained_from: tuple[FileFormat, ...] = ("jsonl",)

    @property
    def in_target_tokens(self) -> bool:
        """Rows in the target's tokens (``trainer_formats.IN_TARGET_TOKENS``, which the recipe's checks read too):
        a tokenizer is needed, and a re-render cannot differ from what was served."""
        return self.name in IN_TARGET_TOKENS

    def commands(self, file_format: FileFormat, train: TrainingFile) -> list[str]:
        return [train.command(template) for template in self.train_commands] if file_format in self.trained_from \
            else []


_PREPARE_DATA = "speculators prepare-data --model {target} --data {hub_url} --output ./data --seq-length 8192"
_SPECFORGE_TRAIN = "specforge train -c CONFIG.yaml model.target_model_path={target}"
TRAINER_FORMATS: Final[Mapping[ExportFormat, TrainerFormat]] = {fmt.name: fmt for fmt in (
    TrainerFormat(
        "speculators",
        pa.schema([("id", pa.string()), ("conversations", pa.list_(_TURN)), ("tools", pa.string())]),
        _in_text(_speculators),
        "natural-language conversations; `prepare-data` renders them through a vLLM server serving the target "
        "(`--render-endpoint`)",
        (f"{_PREPARE_DATA} --render-endpoint http://localhost:8000",)),
    TrainerFormat(
        TOKEN_FORMAT,
        pa.schema([("id", pa.string()), *((name, pa.list_(pa.int32())) for name in TOKEN_COLUMNS)]),
        _in_tokens,
        "`{id, input_ids, loss_mask}` per assistant turn in the target's tokens (the served ids of generated turns): "
        "speculators' `prepare-data` passes them through unchanged, and SpecForge takes them as `data.prompts_path`",
        (_PREPARE_DATA, "{download}", f"{_SPECFORGE_TRAIN} data.prompts_path={{path}}")),  # SpecForge: the same rows
    TrainerFormat(
        "specforge",
        pa.schema([("id", pa.string()), ("conversations", pa.list_(_PLAIN_TURN))]),
        _in_text(_specforge),
        "SpecForge's conversations (no tool turns); its parser renders them with the chat template named by "
        "`data.chat_template` (TEMPLATE: the SpecForge template whose assistant header ends where the target's "
        "generation prompt does, e.g. `qwen3-next-thinking` for a Qwen3-style template that opens `<think>` in the "
        "prompt)",
        ("{download}", f"{_SPECFORGE_TRAIN} data.train_data_path={{path}} data.chat_template=TEMPLATE")),
    TrainerFormat(
        "messages",
        pa.schema([("id", pa.string()), ("source", pa.string()), ("messages", pa.list_(_TURN)),
                   ("tools", pa.string())]),
        _in_text(_messages),
        "OpenAI `messages` (`reasoning_content` per assistant turn), as ModelOpt's speculative-decoding example reads "
        "`data.data_path` (its collator passes no `tools` to the template)",
        ("python examples/speculative_decoding/main.py --config general/speculative_decoding/eagle3 "
         "model.model_name_or_path={target} data.data_path={hub_url} training.output_dir=ckpts/eagle3",)),
    TrainerFormat(
        "sharegpt",
        pa.schema([("id", pa.string()), ("conversations", pa.list_(_SHAREGPT_TURN)), ("tools", pa.string())]),
        _in_text(_sharegpt),
        "ShareGPT turns (reasoning as a leading think block; glaive/LLaMA-Factory tool turns)"),
)}


def trainer_format(name: object, where: str = "") -> TrainerFormat:
    """The format named ``name``; an unknown name is refused, naming the choices (``where``: the setting)."""
    found = next((fmt for fmt_name, fmt in TRAINER_FORMATS.items() if fmt_name == name), None)
    if found is None:
        raise CorpusError(f"{where}{': ' if where else ''}unknown export format {name!r} "
                          f"(one of {', '.join(EXPORT_FORMATS)})")
    return found
