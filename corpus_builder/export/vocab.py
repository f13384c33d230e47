"""`corpus vocab`: how often each target token is supervised, and how much a top-k draft vocabulary covers.

A draft model with a pruned vocabulary (e.g. 32k of 166k) can only propose the tokens it keeps; the
trainer keeps the most frequent supervised tokens. Frequencies are counted under the loss mask of the
`speculators-tokens` rows (corpus_builder.tokens: served ids for generated turns), and the top k are
chosen the way speculators does (by count, ties by lower id).

Files (by the suffix of ``--out``):

* ``.npy``: a dense int64 array, index = token id, length = the tokenizer's size. Portable (numpy, or
  ``torch.from_numpy``), exact, and small (8 bytes per entry: 1.3 MB for 166k).
* ``.json``: ``{"vocab_size": n, "counts": {"id": count, ...}}`` with the non-zero counts only.
* ``.pt``: speculators' own ``token_freq.pt`` (``torch.save`` of ``{id: count}``), for ``--token-freq-path``
  style options as is; needs torch importable.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorpusError
from ..layout import Corpus
from ..outputs import check_output_path, staged
from ..rows import batch_to_conversations
from ..tokens import TurnRow
from .token_rows import CorpusTokenRows, corpus_token_rows

FILE_SUFFIXES = (".npy", ".json", ".pt")


def _bincount(ids: list[int], size: int) -> np.ndarray:
    counts: np.ndarray = np.bincount(np.asarray(ids, dtype=np.int64), minlength=size)  # CorpusTokenRows: ids < size
    return counts


@dataclass
class Frequencies:
    """Supervised-token counts: reasoning and answer apart, per source."""

    size: int
    reasoning: np.ndarray
    answer: np.ndarray
    by_source: dict[str, list[np.ndarray]] = field(default_factory=dict)  # source -> [reasoning, answer]

    @classmethod
    def empty(cls, size: int) -> Frequencies:
        return cls(size, np.zeros(size, np.int64), np.zeros(size, np.int64))

    @property
    def total(self) -> np.ndarray:
        total: np.ndarray = self.reasoning + self.answer
        return total

    def add(self, source: str, rows: list[TurnRow]) -> None:
        reasoning: list[int] = []
        answer: list[int] = []
        for row in rows:
            split_at = row.start + row.reasoning
            reasoning += row.input_ids[row.start:split_at]
            answer += row.input_ids[split_at:]
        counts = (_bincount(reasoning, self.size), _bincount(answer, self.size))
        self.reasoning += counts[0]
        self.answer += counts[1]
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
        if pending_rows >= 4096:  # one bincount per source per few thousand rows, not per row
            for name, group in pending.items():
                frequencies.add(name, group)
            pending, pending_rows = {}, 0
    for name, group in pending.items():
        frequencies.add(name, group)
    return frequencies


def top_k(counts: np.ndarray, k: int) -> np.ndarray:
    """The k most frequent ids, ties to the lower id (speculators' order)."""
    order: np.ndarray = np.lexsort((np.arange(len(counts)), -counts))
    return order[:k]


def _coverage(counts: np.ndarray, chosen: np.ndarray) -> float | None:
    total = int(counts.sum())
    return round(int(counts[chosen].sum()) / total, 6) if total else None


def _section(reasoning: np.ndarray, answer: np.ndarray, chosen: np.ndarray) -> dict[str, Any]:
    total = reasoning + answer
    return {
        "supervised_tokens": int(total.sum()),
        "reasoning_tokens": int(reasoning.sum()),
        "answer_tokens": int(answer.sum()),
        "distinct_tokens": int(np.count_nonzero(total)),
        "coverage": _coverage(total, chosen),
        "reasoning_coverage": _coverage(reasoning, chosen),
        "answer_coverage": _coverage(answer, chosen),
    }


def vocab_report(frequencies: Frequencies, size: int) -> dict[str, Any]:
    chosen = top_k(frequencies.total, size)
    report = {"draft_vocab_size": size, "target_vocab_size": frequencies.size,
              **_section(frequencies.reasoning, frequencies.answer, chosen)}
    report["by_source"] = {name: _section(r, a, chosen) for name, (r, a) in sorted(frequencies.by_source.items())}
    return report


def _check_suffix(path: Path) -> None:
    if path.suffix not in FILE_SUFFIXES:
        raise CorpusError(f"frequency file must end in one of {', '.join(FILE_SUFFIXES)}", file=str(path))


def write_frequencies(counts: np.ndarray, path: Path) -> None:
    """``counts`` as the frequency file ``path`` (its suffix says the format), complete or not at all."""
    _check_suffix(path)
    suffix = path.suffix
    path.parent.mkdir(parents=True, exist_ok=True)
    nonzero = np.flatnonzero(counts)
    with staged(path) as partial:
        if suffix == ".npy":
            with partial.open("wb") as handle:
                np.save(handle, counts.astype(np.int64))
        elif suffix == ".json":
            import orjson

            document = {"vocab_size": len(counts), "counts": {str(i): int(counts[i]) for i in nonzero}}
            partial.write_bytes(orjson.dumps(document))
        else:
            try:
                import torch
            except ImportError:
                raise CorpusError("writing .pt needs torch; write .npy or .json instead", file=str(path)) from None
            torch.save({int(i): int(counts[i]) for i in nonzero}, partial)


@dataclass(frozen=True)
class VocabReport:
    """What ``corpus vocab`` wrote (``file``) and how much its top ``draft_vocab_size`` tokens cover
    (``coverage``: overall, of reasoning and answer tokens, and by source)."""

    file: Path
    coverage: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {**self.coverage, "file": str(self.file)}

    def describe(self) -> str:
        return format_vocab_report(self.coverage)


def draft_vocab(corpus_dir: Path | str, out: Path | str, *, size: int = 32000, tokenizer: Path | None = None
                ) -> VocabReport:
    """`corpus vocab`: the supervised-token frequencies of the corpus in ``corpus_dir``, written to ``out``
    (checked, as every output path, before the corpus is read), and the coverage of their top ``size``; a
    corpus without any supervised token is refused."""
    corpus = Corpus.open(Path(corpus_dir))
    token_rows = corpus_token_rows(corpus, tokenizer)
    if token_rows is None:
        raise CorpusError("the corpus recipe names no target.tokenizer found here: give --tokenizer DIR",
                          file=str(corpus_dir))
    path = check_output_path(out, what="--out", inputs=[corpus.root, token_rows.renderer.tokenizer_dir])
    _check_suffix(path)
    frequencies = count_frequencies(corpus, token_rows)
    if not frequencies.total.any():
        conversations = corpus.manifest.conversations
        raise CorpusError(f"no supervised tokens to count (the corpus holds {conversations:,} conversations): nothing "
                          f"was written to {out}", file=str(corpus.root))
    write_frequencies(frequencies.total, path)
    return VocabReport(Path(out), vocab_report(frequencies, size))


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def format_vocab_report(report: dict[str, Any]) -> str:
    size = report["draft_vocab_size"]
    lines = [f"top {size:,} of {report['target_vocab_size']:,} tokens covers {_share(report['coverage'])} of "
             f"{report['supervised_tokens']:,} supervised tokens, {_share(report['reasoning_coverage'])} of "
             f"reasoning tokens, {_share(report['answer_coverage'])} of answer tokens "
             f"({report['distinct_tokens']:,} distinct tokens supervised)"]
    sources = report["by_source"]
    if sources:
        width = max(6, *(len(name) for name in sources))
        lines += ["", f"{'source':<{width}}  {'supervised':>11}  {'coverage':>8}  {'reasoning':>9}  {'answer':>7}"]
        for name, section in sources.items():
            lines.append(f"{name:<{width}}  {section['supervised_tokens']:>11,}  {_share(section['coverage']):>8}  "
                         f"{_share(section['reasoning_coverage']):>9}  {_share(section['answer_coverage']):>7}")
    return "\n".join(lines)
