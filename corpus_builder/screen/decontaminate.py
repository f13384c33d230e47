"""Decontamination: texts that share a run of words with an evaluation set.

A text is contaminated by an evaluation set when its normalised text (``near_dedup.normalise_text``: case,
sentence punctuation and whitespace do not count) contains a run of ``n`` consecutive words (default 13, the
convention since GPT-3) that also occurs in one of the set's texts. An evaluation text shorter than ``n``
words contaminates a text that contains it whole, provided it has at least ``min_words`` words (default 8):
MT-Bench's second turns ("Rewrite your previous response. Start every sentence with the letter A.") are
that short, while a shorter phrase would match ordinary prompts by chance.

The index holds 64-bit hashes of the evaluation sets' word runs in sorted numpy arrays (10 bytes a run with
the set it came from): 1,319 GSM8K-style problems with their worked answers are ~98k runs, 1 MB. Checking
costs a few array operations per chunk of texts whatever the number of sets; ``benchmarks/bench_dedup.py``
times the prompts and the responses of 30k conversations against a GSM8K-sized and an MT-Bench-sized set,
and against 100k evaluation texts. Two different runs share a hash with probability about runs / 2^64.

The caller reads the evaluation sets (local files or Hub ids) with ``corpus_builder.sources`` and passes
their texts, e.g. ``conversation_text(row)`` of every row (questions and reference answers: a generated
response that reproduces a reference answer is contamination too).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .normalise import NormalisedChunk, WordRuns, normalised_chunks

DEFAULT_NGRAM = 13
DEFAULT_MIN_WORDS = 8

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
U16 = npt.NDArray[np.uint16]


@dataclass(frozen=True, slots=True)
class EvalSetSummary:
    """What an index holds of one evaluation set (for the dataset card and the audit)."""

    name: str
    texts: int
    ignored: int  # texts of fewer than ``min_words`` words, which cannot contaminate anything


class Contamination:
    """Evaluation sets' word runs, and the check of texts against them."""

    def __init__(self, eval_sets: Iterable[tuple[str, Iterable[str]]], *, n: int = DEFAULT_NGRAM,
                 min_words: int = DEFAULT_MIN_WORDS) -> None:
        if not 1 <= min_words <= n:
            raise ValueError(f"need 1 <= min_words <= n, not min_words={min_words}, n={n}")
        self.n = n
        self.min_words = min_words
        summaries: list[EvalSetSummary] = []
        # Per run length (n, and the lengths of shorter evaluation texts): hashes and the set of each.
        runs: dict[int, tuple[list[U64], list[U16]]] = {}
        for set_id, (name, texts) in enumerate(eval_sets):
            if name in (summary.name for summary in summaries):
                raise ValueError(f"evaluation set {name!r} is listed twice")
            count = ignored = 0
            listed = list(texts)
            for chunk in normalised_chunks(listed):
                runs_of_chunk = chunk.runs
                count += len(runs_of_chunk.words_per_text)
                ignored += int((runs_of_chunk.words_per_text < min_words).sum())
                for length, hashes in self._eval_runs(runs_of_chunk).items():
                    hashes_of, sets_of = runs.setdefault(length, ([], []))
                    hashes_of.append(hashes)
                    sets_of.append(np.full(len(hashes), set_id, dtype=np.uint16))
            summaries.append(EvalSetSummary(name, count, ignored))
        self.eval_sets = tuple(summaries)
        self._runs: dict[int, tuple[U64, U16]] = {}
        for length, (hash_parts, set_parts) in sorted(runs.items()):
            hashes, sets = np.concatenate(hash_parts), np.concatenate(set_parts)
            # One entry per (hash, set): a run repeated within a set counts once.
            order = np.lexsort((sets, hashes))
            hashes, sets = hashes[order], sets[order]
            first = np.ones(len(hashes), dtype=bool)
            first[1:] = (hashes[1:] != hashes[:-1]) | (sets[1:] != sets[:-1])
            self._runs[length] = (hashes[first], sets[first])

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(summary.name for summary in self.eval_sets)

    @property
    def nbytes(self) -> int:
        return sum(hashes.nbytes + sets.nbytes for hashes, sets in self._runs.values())

    def _eval_runs(self, runs: WordRuns) -> dict[int, U64]:
        """Hashes of an evaluation chunk's runs by length: every n-word run, and each shorter text whole."""
        words = runs.words_per_text
        hashes, offsets = runs.hashes(self.n, whole_if_shorter=True)
        text_of_hash = np.repeat(np.arange(len(words)), np.diff(offsets))
        length_of_hash = np.minimum(words[text_of_hash], self.n)
        usable = length_of_hash >= self.min_words
        return {int(length): hashes[usable & (length_of_hash == length)]
                for length in np.unique(length_of_hash[usable])}

    def matches(self, texts: Sequence[str]) -> list[tuple[str, ...]]:
        """For each text, the evaluation sets it shares a run with (in the order the sets were given)."""
        found: list[tuple[str, ...]] = []
        for chunk in normalised_chunks(texts):
            found.extend(self.chunk_matches(chunk))
        return found

    def contaminated(self, text: str) -> tuple[str, ...]:
        """The evaluation sets one text shares a run with; empty when it is clean."""
        return self.matches([text])[0]

    def chunk_matches(self, chunk: NormalisedChunk) -> list[tuple[str, ...]]:
        """``matches`` of one chunk already normalised (e.g. shared with the dedup of the same texts)."""
        runs = chunk.runs
        pairs: list[I64] = []  # text * sets + set, for every run found
        for length, (table, sets) in self._runs.items():
            hashes, offsets = runs.hashes(length, whole_if_shorter=False)
            order = np.argsort(hashes)  # sorted queries walk the table in order, far fewer cache misses
            lows = np.searchsorted(table, hashes[order], side="left")
            counts = np.searchsorted(table, hashes[order], side="right") - lows
            hits = np.flatnonzero(counts)
            if not len(hits):
                continue
            texts_hit = np.searchsorted(offsets, order[hits], side="right") - 1
            # Every (hash, set) entry of each hit: the entries lows[h] .. highs[h]-1.
            repeats = counts[hits]
            entries = np.repeat(lows[hits] - np.cumsum(repeats) + repeats, repeats) + np.arange(int(repeats.sum()))
            pairs.append(np.repeat(texts_hit, repeats) * len(self.eval_sets) + sets[entries])
        found: list[tuple[str, ...]] = [() for _ in range(len(runs.words_per_text))]
        names = self.names
        if pairs:
            per_text: dict[int, list[str]] = {}
            for pair in np.unique(np.concatenate(pairs)).tolist():
                per_text.setdefault(pair // len(names), []).append(names[pair % len(names)])
            for text, matched in per_text.items():
                found[text] = tuple(matched)
        return found
