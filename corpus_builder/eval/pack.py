"""The eval pack: the prompts an eval replays, read from a conversations file, a directory of them, or a built
corpus (its ``eval/`` directory).

Each conversation gives one request: its turns before its last assistant turn (the turn the target answers
again), as the generator sends turns (``records.openai_messages``: earlier reasoning as ``reasoning_content``,
tool calls and results); a conversation without an assistant turn (a file of prompts) is sent whole. A row
keeps its own ``source`` and ``task`` fields when it has them (the corpus's row form), else it is named by its
file, so figures break down by source and task. Rows that cannot be read are counted by reason.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from ..errors import CorpusError, Skipped
from ..layout import EVAL, Corpus
from ..outputs import enclosing_corpus
from ..records import Conversation, openai_messages
from ..sources import iter_file
from ..sources.readers import FORMATS, detect_format, iter_rows, position_key

PACK_DIR = EVAL  # a built corpus's eval pack
RESULTS_DIR = "results"
_SUFFIXES = tuple(f".{fmt}" for fmt in FORMATS)


@dataclass(frozen=True, slots=True)
class PackPrompt:
    """One request of the pack: OpenAI chat messages (and the tools the conversation was served with), and the
    conversation they come from, through the answer the target gives again (whole for a prompt), for the pack's
    other forms (``eval.bench``); two prompts that send the same are equal whatever their rows held besides."""

    id: str
    source: str
    task: str | None
    messages: tuple[dict[str, Any], ...]
    conversation: Conversation = field(compare=False, repr=False)
    tools: tuple[dict[str, Any], ...] | None = None


@dataclass(frozen=True)
class Pack:
    path: Path
    files: tuple[Path, ...]
    prompts: tuple[PackPrompt, ...]
    unreadable: dict[str, int] = field(default_factory=dict)  # rows left out, by reason
    corpus: Corpus | None = None  # the built corpus the pack belongs to, if any

    @property
    def sha256(self) -> str:
        """What was replayed, in order: the messages, tools, source and task of every prompt."""
        canonical = [[p.source, p.task, p.messages, p.tools] for p in self.prompts]
        return hashlib.sha256(orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS)).hexdigest()

    def default_results_dir(self) -> Path:
        """``eval/results/`` beside the pack (``results/`` when the pack's directory is ``eval/`` itself); for a
        pack inside a built corpus, beside the corpus (a corpus is written by its build only)."""
        if self.corpus is not None:
            return self.corpus.root.parent / PACK_DIR / RESULTS_DIR
        home = self.path if self.path.is_dir() else self.path.parent
        return home / RESULTS_DIR if home.name == PACK_DIR else home / PACK_DIR / RESULTS_DIR


def read_pack(path: Path, *, keep_history_reasoning: bool = True) -> Pack:
    """The prompts of ``path``: a conversations file (.jsonl, .jsonl.zst, .json, .parquet), a directory of such
    files (not its subdirectories), or a built corpus (its ``eval/`` directory)."""
    path = Path(path)
    if not path.exists():
        raise CorpusError("no such file or directory", file=str(path))
    corpus_root = enclosing_corpus(path.resolve())
    corpus = Corpus.open(corpus_root) if corpus_root is not None else None
    if corpus is not None and path.resolve() == corpus.root.resolve():
        path = corpus.root / PACK_DIR
        if not path.is_dir():
            raise CorpusError(f"the corpus has no eval pack ({PACK_DIR}/): give a conversations file instead",
                              file=str(corpus.root))
    if corpus is not None and path.resolve() == (corpus.root / PACK_DIR).resolve() and corpus.manifest.pack_files:
        # the pack the build held out, read as it wrote it (ids, sources and tasks as in its manifest)
        held = tuple(_prompt(row, row.source, row.task, keep_history_reasoning, answered=True)
                     for row in corpus.pack_conversations())
        return Pack(path, tuple(corpus.root / info.path for info in corpus.manifest.pack_files), held, {}, corpus)
    files = tuple(sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(_SUFFIXES))) \
        if path.is_dir() else (path,)
    if not files:
        raise CorpusError(f"no conversations file ({', '.join(_SUFFIXES)}) in the directory", file=str(path))
    prompts: list[PackPrompt] = []
    unreadable: Counter[str] = Counter()
    for file in files:
        for item in _file_prompts(file, keep_history_reasoning):
            if isinstance(item, Skipped):
                unreadable[item.reason] += 1
            else:
                prompts.append(item)
    if not prompts:
        raise CorpusError("the pack holds no readable conversation", file=str(path),
                          details=[f"{reason}: {count} row(s)" for reason, count in sorted(unreadable.items())])
    return Pack(path, files, tuple(prompts), dict(sorted(unreadable.items())), corpus)


def _file_prompts(file: Path, keep_history_reasoning: bool) -> Iterator[PackPrompt | Skipped]:
    """A file's prompts, in file order. Read as conversations; a file none of whose rows has an assistant turn
    is a file of prompts, read as such."""
    rows = list(iter_file(file, kind="replay"))
    as_prompts = not any(isinstance(row, Conversation) for row in rows) and any(
        isinstance(row, Skipped) and row.reason == "no_assistant_turn" for row in rows)
    if as_prompts:
        rows = list(iter_file(file, kind="prompts"))
    fmt = detect_format(file)
    labels = _row_labels(file, fmt)
    key = position_key(fmt)
    for row in rows:
        if isinstance(row, Skipped):
            yield row
            continue
        source, task = labels.get(row.provenance[key], (row.source, row.task))
        yield _prompt(row, source, task, keep_history_reasoning, answered=not as_prompts)


def _row_labels(file: Path, fmt: str) -> dict[int, tuple[str, str | None]]:
    """position -> (source, task) of the rows that carry their own (the corpus's row form)."""
    labels = {}
    for position, row in iter_rows(file, fmt, file.name):
        if isinstance(row, dict) and isinstance(row.get("source"), str):
            task = row.get("task")
            labels[position] = (row["source"], task if isinstance(task, str) else None)
    return labels


def _prompt(conversation: Conversation, source: str, task: str | None, keep_history_reasoning: bool, *,
            answered: bool) -> PackPrompt:
    """An answered conversation is sent up to its last assistant turn; a prompt is sent whole."""
    messages = conversation.messages
    answer = max(i for i, m in enumerate(messages) if m.role == "assistant") if answered else len(messages)
    sent = messages[:answer]
    tools = tuple(conversation.tools) if conversation.tools else None
    return PackPrompt(conversation.id, source, task, tuple(openai_messages(
        sent, keep_history_reasoning=keep_history_reasoning, current=len(sent))),
        replace(conversation, messages=messages[:answer + 1]), tools)
