"""The eval pack: the prompts an eval replays, read from a conversations file, a directory of them, or a built
corpus (its ``eval/`` directory).

Each row gives one request, decided row by row: a row that ends with a user (or tool) turn is sent whole (a
file of prompts, MT-Bench's shape, a chat's next question); a row that ends with an assistant turn is sent up to
it (the turn the target answers again). Turns go as the generator sends them (``records.openai_messages``:
earlier reasoning as ``reasoning_content``, tool calls and results). A row keeps its own ``source`` and ``task``
fields when it has them (each on its own), else it is named by its file, so figures break down by source and
task. Rows that cannot be read are the pack's losses, counted by reason; a logged request folded into a later
request of its chat is not a loss (the later one sends its turns), and prompts that send exactly what an
earlier one sends are counted.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..errors import CorpusError, Skipped
from ..layout import EVAL, Corpus
from ..outputs import enclosing_corpus
from ..records import Conversation, openai_messages
from ..sources import iter_file
from ..sources.fold import FOLDED_PREFIX
from ..sources.formats import Format, format_of, format_suffixes

PACK_DIR = EVAL  # a built corpus's eval pack
RESULTS_DIR = "results"


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
    unreadable: dict[str, int] = field(default_factory=dict)  # rows lost: left out, by reason
    corpus: Corpus | None = None  # the built corpus the pack belongs to, if any
    folded: int = 0  # logged requests folded into a later request of their chat (its turns hold theirs)
    repeated: int = 0  # prompts that send exactly what an earlier prompt sends

    @property
    def rows(self) -> int:
        """The rows read: the prompts and the rows lost (a folded request is part of a prompt)."""
        return len(self.prompts) + sum(self.unreadable.values())

    @property
    def sha256(self) -> str:
        """What was replayed, in order: the messages, tools, source and task of every prompt."""
        canonical = [[p.source, p.task, p.messages, p.tools] for p in self.prompts]
        return hashlib.sha256(orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS)).hexdigest()

    def default_results_dir(self) -> Path:
        """Where a run is saved unless told: for a built corpus's pack ``eval/results/`` beside the corpus (a
        corpus is written by its build only; the audit shows the runs saved there); for any other pack
        ``eval/results/`` under the current directory, never in the pack's own folder (a dataset, a read-only
        mount, another repository)."""
        if self.corpus is not None:
            return self.corpus.root.parent / PACK_DIR / RESULTS_DIR
        return Path.cwd() / PACK_DIR / RESULTS_DIR

    @property
    def folders(self) -> set[Path]:
        """The folders the pack's files are read from (a run saved there would be read with them)."""
        return {file.parent for file in self.files}


def read_pack(path: Path, *, keep_history_reasoning: bool = True) -> Pack:
    """The prompts of ``path``: a conversations file (of a registered format: .jsonl, .jsonl.zst, .json, .parquet),
    a directory of such files (not its subdirectories), or a built corpus (its ``eval/`` directory)."""
    path = Path(path)
    if not path.exists():
        raise CorpusError("no such file or directory", file=str(path))
    corpus_root = enclosing_corpus(path.resolve())
    corpus = Corpus.open(corpus_root) if corpus_root is not None else None
    if corpus is not None and path.resolve() == corpus.root.resolve():
        path = corpus.root / PACK_DIR
        if not path.is_dir():
            raise CorpusError(_no_pack(corpus), file=str(corpus.root))
    if corpus is not None and path.resolve() == (corpus.root / PACK_DIR).resolve() and corpus.manifest.pack_files:
        # the pack the build held out, read as it wrote it (ids, sources and tasks as in its manifest)
        held = tuple(_prompt(row, row.source, row.task, keep_history_reasoning) for row in corpus.pack_conversations())
        return Pack(path, tuple(corpus.root / info.path for info in corpus.manifest.pack_files), held, {}, corpus,
                    repeated=_repeated(held))
    suffixes = format_suffixes()
    files = tuple(sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(suffixes))) \
        if path.is_dir() else (path,)
    if not files:
        if corpus is not None and path.resolve() == (corpus.root / PACK_DIR).resolve():
            raise CorpusError(_no_pack(corpus), file=str(corpus.root))
        raise CorpusError(f"no conversations file ({', '.join(suffixes)}) in the directory", file=str(path))
    prompts: list[PackPrompt] = []
    unreadable: Counter[str] = Counter()
    folded = 0
    for file in files:
        for item in _file_prompts(file, keep_history_reasoning):
            if isinstance(item, PackPrompt):
                prompts.append(item)
            elif item.reason == FOLDED_PREFIX:
                folded += 1
            else:
                unreadable[item.reason] += 1
    if not prompts:
        raise CorpusError("the pack holds no readable conversation", file=str(path),
                          details=[f"{reason}: {count} row(s)" for reason, count in sorted(unreadable.items())])
    return Pack(path, files, tuple(prompts), dict(sorted(unreadable.items())), corpus, folded, _repeated(prompts))


def _no_pack(corpus: Corpus) -> str:
    """Why a built corpus has no pack to replay: none was asked for, or the share asked for held no row."""
    section = corpus.manifest.section("eval")
    if not isinstance(section, dict):
        return f"the corpus has no eval pack ({PACK_DIR}/): give a conversations file instead"
    sources = section.get("sources")
    read = ", ".join(f"{name} 0 of {entry.get('read')}" for name, entry in sorted(sources.items())
                     if isinstance(entry, dict)) if isinstance(sources, dict) else ""
    return (f"the corpus's eval pack holds no conversation: the recipe's eval share held none of the rows its replay "
            f"sources gave ({read or 'none read'}; a fraction that rounds to 0 rows holds none): rebuild with a "
            "larger eval.rows or eval.fraction, or give a conversations file instead")


def _repeated(prompts: Sequence[PackPrompt]) -> int:
    """Prompts that send exactly what an earlier one sends (their turns and tools)."""
    sent = {orjson.dumps([prompt.messages, prompt.tools], option=orjson.OPT_SORT_KEYS) for prompt in prompts}
    return len(prompts) - len(sent)


def _file_prompts(file: Path, keep_history_reasoning: bool) -> Iterator[PackPrompt | Skipped]:
    """A file's prompts, in file order, each row read with every turn it holds."""
    fmt = format_of(file)
    labels = _row_labels(file, fmt)
    for row in iter_file(file, kind="pack", fmt=fmt.name):
        if isinstance(row, Skipped):
            yield row
            continue
        position = row.provenance.position
        source, task = labels.get(position, (None, None)) if position is not None else (None, None)
        yield _prompt(row, source or row.source, task or row.task, keep_history_reasoning)


def _row_labels(file: Path, fmt: Format) -> dict[int, tuple[str | None, str | None]]:
    """position -> (source, task) of the rows that carry either (the corpus's row form, a benchmark's category)."""
    labels = {}
    for position, row in fmt.read(file, file.name):
        if isinstance(row, dict):
            source, task = row.get("source"), row.get("task")
            if isinstance(source, str) or isinstance(task, str):
                labels[position] = (source if isinstance(source, str) else None, task if isinstance(task, str)
                                    else None)
    return labels


def _prompt(conversation: Conversation, source: str, task: str | None, keep_history_reasoning: bool) -> PackPrompt:
    """A row that ends with an assistant turn is sent up to it (the answer the target gives again); any other is
    sent whole (its last turn is the question)."""
    messages = conversation.messages
    sent = messages[:-1] if messages[-1].role == "assistant" else messages
    tools = tuple(conversation.tools) if conversation.tools else None
    return PackPrompt(conversation.id, source, task, tuple(openai_messages(
        sent, keep_history_reasoning=keep_history_reasoning, current=len(sent))), conversation, tools)
