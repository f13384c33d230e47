"""`corpus vocab`: how often each target token is supervised, how much a top-k draft vocabulary covers, and the
draft vocabulary itself as speculators' trainer reads it.

A draft model with a pruned vocabulary (e.g. 32k of 166k) can only propose the tokens it keeps; the
trainer keeps the most frequent supervised tokens. Frequencies are counted under the loss mask of the
`speculators-tokens` rows (corpus_builder.tokens: served ids for generated turns; or such an export as it is,
``token_counts``), and the top k are chosen the way speculators does (by count, ties by lower id).

``--out DIR`` writes speculators 0.9's own files as its trainer builds and caches them from the same counts (d2t
and t2d byte for byte): ``token_freq.pt`` (``torch.save`` of ``{id: count}``), ``d2t-N.npy`` (int64 offsets,
target id = draft index + d2t[index]) and ``t2d-N.npy`` (bool, one per token of the verifier's vocabulary: its
config's ``vocab_size``, which may exceed the tokenizer's entries). In the directory given to ``speculators train
--data-path`` (prepare-data's output) with ``--draft-vocab-size N``, the trainer loads them as they are.

Frequency files (by the suffix of ``--out``):

* ``.npy``: a dense int64 array, index = token id, length = the tokenizer's size. Portable (numpy, or
  ``torch.from_numpy``), exact, and small (8 bytes per entry: 1.3 MB for 166k).
* ``.json``: ``{"vocab_size": n, "counts": {"id": count, ...}}`` with the non-zero counts only.
* ``.pt``: speculators' ``token_freq.pt`` alone; needs torch importable.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorpusError
from ..layout import Corpus, holds_corpus
from ..outputs import check_output_path, made_directory, staged
from ..rows import batch_to_conversations
from ..stats.vocab import coverage, top_k
from ..tokens import TurnRow
from .token_counts import Vocabulary, count_token_export, token_export_files
from .token_rows import CorpusTokenRows, check_tokenizer_dir, corpus_token_rows, tokenizer_entries

FILE_SUFFIXES = (".npy", ".json", ".pt")
TOKEN_FREQ = "token_freq.pt"
ROWS_PER_COUNT = 4096  # token rows gathered before they are counted: one bincount per source per batch of them


def _bincount(ids: list[int], size: int) -> np.ndarray:
    counts: np.ndarray = np.bincount(np.asarray(ids, dtype=np.int64), minlength=size)  # CorpusTokenRows: ids < size
    return counts


@dataclass
class Frequencies:
    """Supervised-token counts in all and, from a corpus, of reasoning apart and per source (a tokens export does
    not tell reasoning from answer, nor one source from another)."""

    total: np.ndarray
    reasoning: np.ndarray | None = None
    by_source: dict[str, list[np.ndarray]] = field(default_factory=dict)  # source -> [reasoning, answer]

    @classmethod
    def empty(cls, size: int) -> Frequencies:
        return cls(np.zeros(size, np.int64), np.zeros(size, np.int64))

    @property
    def size(self) -> int:
        return len(self.total)

    def add(self, source: str, rows: list[TurnRow]) -> None:
        assert self.reasoning is not None  # rows are counted into a corpus's frequencies, which tell reasoning
        reasoning: list[int] = []
        answer: list[int] = []
        for row in rows:
            split_at = row.start + row.reasoning
            reasoning += row.input_ids[row.start:split_at]
            answer += row.input_ids[split_at:]
        counts = (_bincount(reasoning, self.size), _bincount(answer, self.size))
        self.reasoning += counts[0]
        self.total += counts[0] + counts[1]
        mine = self.by_source.setdefault(source, [np.zeros(self.size, np.int64), np.zeros(self.size, np.int64)])
        mine[0] += counts[0]
        mine[1] += counts[1]


def iter_token_rows(corpus: Corpus, token_rows: CorpusTokenRows,
                    batch_size: int = 512) -> Iterator[tuple[str, list[TurnRow]]]:
    """(source, rows of one conversation) for every conversation of the corpus, both splits."""
    for batch in corpus.iter_batches(batch_size=batch_size):
        for item in token_rows.tokenize(batch_to_conversations(batch)):
            yield item.conversation.source, item.rows


def count_frequencies(corpus: Corpus, token_rows: CorpusTokenRows) -> Frequencies:
    frequencies = Frequencies.empty(token_rows.vocab_size)
    pending: dict[str, list[TurnRow]] = {}
    pending_rows = 0
    for source, rows in iter_token_rows(corpus, token_rows):
        pending.setdefault(source, []).extend(rows)
        pending_rows += len(rows)
        if pending_rows >= ROWS_PER_COUNT:
            for name, group in pending.items():
                frequencies.add(name, group)
            pending, pending_rows = {}, 0
    for name, group in pending.items():
        frequencies.add(name, group)
    return frequencies


def _section(total: np.ndarray, reasoning: np.ndarray | None, chosen: np.ndarray) -> dict[str, Any]:
    answer = None if reasoning is None else total - reasoning
    return {
        "supervised_tokens": int(total.sum()),
        "reasoning_tokens": None if reasoning is None else int(reasoning.sum()),
        "answer_tokens": None if answer is None else int(answer.sum()),
        "distinct_tokens": int(np.count_nonzero(total)),
        "coverage": coverage(total, chosen),
        "reasoning_coverage": None if reasoning is None else coverage(reasoning, chosen),
        "answer_coverage": None if answer is None else coverage(answer, chosen),
    }


def vocab_report(frequencies: Frequencies, size: int) -> dict[str, Any]:
    chosen = top_k(frequencies.total, size)
    report = {"draft_vocab_size": size, "target_vocab_size": frequencies.size,
              **_section(frequencies.total, frequencies.reasoning, chosen)}
    report["by_source"] = {name: _section(r + a, r, chosen) for name, (r, a) in sorted(frequencies.by_source.items())}
    return report


def speculators_mappings(counts: np.ndarray, draft_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(d2t, t2d) as speculators 0.9's ``build_vocab_mappings_from_distribution`` makes them from the same counts
    (``counts``: dense, as long as the verifier's vocabulary): the ``draft_size`` most frequent ids, ties to the
    lower id, made up to ``draft_size`` with the lowest unsupervised ids, in id order; d2t holds offsets
    (target id = draft index + d2t[index], int64), t2d marks the chosen ids (bool, one per target id)."""
    chosen = np.sort(top_k(counts, draft_size))
    draft_to_target: np.ndarray = chosen - np.arange(draft_size, dtype=np.int64)
    target_to_draft = np.zeros(len(counts), dtype=bool)
    target_to_draft[chosen] = True
    return draft_to_target.astype(np.int64), target_to_draft


def speculators_file_names(draft_size: int) -> tuple[str, str, str]:
    """The names speculators' trainer looks for in its data directory (token_freq.pt, d2t-N.npy, t2d-N.npy)."""
    return TOKEN_FREQ, f"d2t-{draft_size}.npy", f"t2d-{draft_size}.npy"


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise CorpusError(f"writing {TOKEN_FREQ} (speculators' torch.save of {{id: count}}) needs torch: pip install "
                          "torch (or write a .npy or .json frequency file)") from None
    return torch


def _save_token_freq(counts: np.ndarray, path: Path) -> None:
    """speculators' token_freq.pt: ``torch.save`` of {token id: count} over the ids that occur, Python ints. Saved
    to memory, then written by Python: torch's own file writer turns a full disk into a RuntimeError."""
    serialised = io.BytesIO()
    _torch().save({int(i): int(counts[i]) for i in np.flatnonzero(counts)}, serialised)
    path.write_bytes(serialised.getbuffer())


def _check_suffix(path: Path) -> None:
    if path.suffix not in FILE_SUFFIXES:
        raise CorpusError(f"--out: a frequency file must end in one of {', '.join(FILE_SUFFIXES)} (or name a directory "
                          f"for speculators' {TOKEN_FREQ}, d2t-N.npy and t2d-N.npy)", file=str(path))


def write_frequencies(counts: np.ndarray, path: Path) -> None:
    """``counts`` as the frequency file ``path`` (its suffix says the format), complete or not at all."""
    _check_suffix(path)
    with staged(path) as partial:
        if path.suffix == ".npy":
            with partial.open("wb") as handle:
                np.save(handle, counts.astype(np.int64))
        elif path.suffix == ".json":
            import orjson

            nonzero = np.flatnonzero(counts)
            document = {"vocab_size": len(counts), "counts": {str(i): int(counts[i]) for i in nonzero}}
            partial.write_bytes(orjson.dumps(document))
        else:
            _save_token_freq(counts, partial)


def write_speculators_files(counts: np.ndarray, directory: Path, draft_size: int) -> list[Path]:
    """token_freq.pt, d2t-N.npy and t2d-N.npy into ``directory`` (made when missing), all complete or none:
    ``counts`` is dense and as long as the verifier's vocabulary (t2d's length)."""
    d2t, t2d = speculators_mappings(counts, draft_size)
    paths = [directory / name for name in speculators_file_names(draft_size)]
    with made_directory(directory), ExitStack() as files:
        token_freq, d2t_path, t2d_path = (files.enter_context(staged(path)) for path in paths)
        _save_token_freq(counts, token_freq)
        for array, partial in ((d2t, d2t_path), (t2d, t2d_path)):
            with partial.open("wb") as handle:  # np.save to a handle: a path would gain a second .npy
                np.save(handle, array)
    return paths


def names_directory(out: Path | str) -> bool:
    """``--out`` names a directory, for speculators' three files: one that exists, or a new name without a suffix.
    (A path the output guard refuses, empty or with a NUL byte, is refused whichever this says.)"""
    path = Path(out)
    return path.is_dir() or (not path.suffix and not os.path.lexists(path))


def verifier_vocab_size(directory: Path) -> int | None:
    """The verifier's vocabulary size as speculators reads it (``AutoConfig``'s ``vocab_size``, its
    ``text_config``'s for a multimodal model) from the config.json in ``directory``; None without one. It can
    exceed the tokenizer's entries (padded embeddings): t2d has exactly this many."""
    path = directory / "config.json"
    if not path.is_file():
        return None
    import orjson

    try:
        config = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as error:
        raise CorpusError(f"cannot read the model config: {error}", file=str(path)) from None
    config = config if isinstance(config, dict) else {}  # a list, a number: no vocab_size either
    text = config.get("text_config")
    size = (text if isinstance(text, dict) and "vocab_size" in text else config).get("vocab_size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise CorpusError(f"vocab_size is {size!r}, not a positive integer", file=str(path))
    return size


@dataclass(frozen=True)
class VocabReport:
    """What ``corpus vocab`` wrote (``file``: the frequency file or the directory; ``written``: every file) and how
    much its top ``draft_vocab_size`` tokens cover (``coverage``: overall, of reasoning and answer tokens, and by
    source)."""

    file: Path
    coverage: dict[str, Any]
    written: tuple[Path, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {**self.coverage, "file": str(self.file), "written": [str(path) for path in self.written]}

    def describe(self) -> str:
        return format_vocab_report(self.coverage)


@dataclass(frozen=True)
class _Input:
    """What `corpus vocab` reads: a built corpus (with its token rows) or a speculators-tokens export's files."""

    paths: list[Path | None]  # everything read, kept apart from the output (None: no tokenizer given)
    config_dir: Path | None  # where the verifier's config.json may be
    vocabulary: Vocabulary | None  # the ids the counts hold (their length); None: unknown (an export alone)
    count: Callable[[], Frequencies]


def _open_input(source: Path, tokenizer: Path | None, target_vocab_size: int | None) -> _Input:
    """The input, with its vocabulary: its tokenizer's entries (the corpus recipe's, or ``tokenizer``); for an export
    without a tokenizer the size given, else none known."""
    if not holds_corpus(source):  # a corpus a build is writing may have no manifest yet: Corpus.open names the build
        files = token_export_files(source)
        if tokenizer is not None:
            vocabulary: Vocabulary | None = Vocabulary(tokenizer_entries(check_tokenizer_dir(tokenizer)),
                                                       f"the tokenizer {tokenizer}")
        else:
            vocabulary = Vocabulary(target_vocab_size, "--target-vocab-size") if target_vocab_size else None
        return _Input([*files, tokenizer], tokenizer, vocabulary,
                      lambda: Frequencies(count_token_export(files, vocabulary)))
    corpus = Corpus.open(source)
    token_rows = corpus_token_rows(corpus, tokenizer)
    if token_rows is None:
        raise CorpusError("the corpus recipe names no target.tokenizer found here: give --tokenizer DIR",
                          file=str(source))
    directory = token_rows.renderer.tokenizer_dir
    return _Input([corpus.root, directory], directory, Vocabulary(token_rows.vocab_size, f"the tokenizer {directory}"),
                  lambda: count_frequencies(corpus, token_rows))


def _verifier_vocabulary(given: int | None, source: _Input) -> Vocabulary:
    """t2d's length: the verifier's vocab_size, given or from the config.json beside the tokenizer."""
    if given is not None:
        return Vocabulary(given, "--target-vocab-size")
    size = verifier_vocab_size(source.config_dir) if source.config_dir else None
    if size is None:
        where = f"no config.json in {source.config_dir}" if source.config_dir else "no --tokenizer DIR"
        raise CorpusError(f"t2d has one entry per token of the verifier's vocabulary ({where}): give "
                          "--target-vocab-size N (its config's vocab_size) or --tokenizer with the model's config.json")
    return Vocabulary(size, f"the vocab_size of {source.config_dir}/config.json")


def _check_draft_size(draft_size: int, vocabulary: Vocabulary) -> None:
    """A draft vocabulary is chosen among the ids of ``vocabulary`` (the counts a frequency file holds, t2d's for
    speculators' files): one larger than it is refused, whichever the output."""
    if draft_size > vocabulary.size:
        raise CorpusError(f"--draft-vocab-size {draft_size:,} exceeds the vocabulary it is chosen from "
                          f"({vocabulary.size:,} tokens: {vocabulary.source})")


def _fitted(counts: np.ndarray, size: int, source: Path) -> np.ndarray:
    """``counts`` as long as the verifier's vocabulary; a supervised id beyond it is refused."""
    beyond = np.flatnonzero(counts[size:])
    if beyond.size:
        raise CorpusError(f"token id {size + int(beyond[-1]):,} is supervised but the verifier's vocabulary has "
                          f"{size:,} tokens: the counts are of another tokenizer", file=str(source))
    fitted = np.zeros(size, np.int64)
    fitted[:min(size, len(counts))] = counts[:size]
    return fitted


def draft_vocab(source: Path | str, out: Path | str, *, size: int = 32000, tokenizer: Path | None = None,
                target_vocab_size: int | None = None) -> VocabReport:
    """`corpus vocab`: the supervised-token frequencies of ``source`` (a built corpus, or a speculators-tokens
    export: a file or its directory) and the coverage of their top ``size``, written to ``out``: a directory gets
    speculators' token_freq.pt, d2t-SIZE.npy and t2d-SIZE.npy (t2d as long as ``target_vocab_size``, by default
    the config.json beside the tokenizer), a file the counts alone (.npy, .json or .pt). ``out`` is checked, as
    every output path, before anything is read; an input without any supervised token is refused."""
    source = Path(source)
    opened = _open_input(source, tokenizer, target_vocab_size)
    directory = names_directory(out)
    path = check_output_path(out, what="--out", inputs=opened.paths, directory=directory)
    if not directory:
        _check_suffix(path)
    elif path.is_dir():  # each file a regular one or none; none is an input (an export's files are named
        for name in speculators_file_names(size):  # {split}.{format}, a tokenizer is a directory, a corpus refused)
            check_output_path(path / name, what="--out")
    ranked = _verifier_vocabulary(target_vocab_size, opened) if directory else opened.vocabulary
    if ranked is not None:  # an export's counts of no known vocabulary: no size to hold the draft to
        _check_draft_size(size, ranked)
    if directory or path.suffix == ".pt":
        _torch()  # a missing torch is found before the counting, not after it
    frequencies = opened.count()
    if not frequencies.total.any():
        raise CorpusError(f"no supervised tokens to count: nothing was written to {out}", file=str(source))
    report = {**vocab_report(frequencies, size), "target_vocab_size": ranked.size if ranked is not None else None}
    if not directory:
        write_frequencies(frequencies.total, path)
        return VocabReport(path, report, (path,))
    assert ranked is not None
    written = write_speculators_files(_fitted(frequencies.total, ranked.size, source), path, size)
    return VocabReport(path, report, tuple(written))


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def format_vocab_report(report: dict[str, Any]) -> str:
    size, vocabulary = report["draft_vocab_size"], report["target_vocab_size"]
    parts = ("" if report["reasoning_tokens"] is None  # a tokens export does not tell reasoning from answer
             else f", {_share(report['reasoning_coverage'])} of reasoning tokens, "
                  f"{_share(report['answer_coverage'])} of answer tokens")
    of = f"of {vocabulary:,} tokens" if vocabulary is not None else "tokens (of a vocabulary --tokenizer would name)"
    lines = [f"top {size:,} {of} covers {_share(report['coverage'])} of "
             f"{report['supervised_tokens']:,} supervised tokens{parts} "
             f"({report['distinct_tokens']:,} distinct tokens supervised)"]
    sources = report["by_source"]
    if sources:
        width = max(6, *(len(name) for name in sources))
        lines += ["", f"{'source':<{width}}  {'supervised':>11}  {'coverage':>8}  {'reasoning':>9}  {'answer':>7}"]
        for name, section in sources.items():
            lines.append(f"{name:<{width}}  {section['supervised_tokens']:>11,}  {_share(section['coverage']):>8}  "
                         f"{_share(section['reasoning_coverage']):>9}  {_share(section['answer_coverage']):>7}")
    return "\n".join(lines)
