"""Corpus statistics computed from Arrow batches, and the corpus-level checks decided from them.

The build computes them from exactly the rows it writes (audit.json); `corpus audit` recomputes them from
the files, or from a raw source file normalised by the source readers and converted with the row form's
own ``conversations_to_batch``, so a serving log and a built corpus are measured the same way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ..records import Conversation
from .token_stats import TokenStats, mismatch_problem

GROUPINGS = ("source", "split", "origin")


@dataclass(slots=True)
class Totals:
    conversations: int = 0
    thinking_conversations: int = 0
    turns: int = 0
    characters: int = 0
    assistant_characters: int = 0
    reasoning_characters: int = 0

    def add(self, other: Totals) -> None:
        self.conversations += other.conversations
        self.thinking_conversations += other.thinking_conversations
        self.turns += other.turns
        self.characters += other.characters
        self.assistant_characters += other.assistant_characters
        self.reasoning_characters += other.reasoning_characters

    def report(self) -> dict[str, Any]:
        reasoning_and_answer = self.assistant_characters + self.reasoning_characters
        return {
            "conversations": self.conversations,
            "thinking_conversations": self.thinking_conversations,
            "thinking_share": round(self.thinking_conversations / self.conversations, 6) if self.conversations else 0.0,
            "turns": self.turns,
            "characters": self.characters,
            "reasoning_char_share": round(self.reasoning_characters / reasoning_and_answer, 6)
            if reasoning_and_answer else 0.0,
        }


def _per_row_sums(offsets: np.ndarray, per_message: np.ndarray) -> np.ndarray:
    cumulative = np.concatenate(([0], np.cumsum(per_message, dtype=np.int64)))
    sums: np.ndarray = cumulative[offsets[1:]] - cumulative[offsets[:-1]]
    return sums


@dataclass
class CorpusStats:
    """Accumulates statistics batch by batch; memory is per group, never per row."""

    overall: Totals = field(default_factory=Totals)
    groups: dict[str, dict[str, Totals]] = field(default_factory=lambda: {g: {} for g in GROUPINGS})
    source_info: dict[str, dict[str, Any]] = field(default_factory=dict)
    flags: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    generation: Counter[bytes] = field(default_factory=Counter)
    finish_reasons: Counter[str] = field(default_factory=Counter)
    tokens: TokenStats | None = None  # target-token statistics, when the target's tokenizer is known

    def add_rows(self, conversations: list[Conversation], batch: pa.RecordBatch) -> None:
        """One group of rows, in both forms (the token statistics read the conversations)."""
        if batch.num_rows == 0:
            return
        if self.tokens is not None:
            self.tokens.add_conversations(conversations)
        messages = batch.column("messages")
        offsets = messages.offsets.to_numpy(zero_copy_only=False) - messages.offsets[0].as_py()
        flat = messages.flatten()
        content_len = pc.fill_null(pc.utf8_length(flat.field("content")), 0).to_numpy(zero_copy_only=False)
        reasoning_len = pc.fill_null(pc.utf8_length(flat.field("reasoning")), 0).to_numpy(zero_copy_only=False)
        is_assistant = pc.equal(flat.field("role"), "assistant").to_numpy(zero_copy_only=False)
        rows = {
            "conversations": np.ones(batch.num_rows, dtype=np.int64),
            "thinking_conversations": batch.column("thinking").to_numpy(zero_copy_only=False).astype(np.int64),
            "turns": np.diff(offsets),
            "characters": _per_row_sums(offsets, content_len + reasoning_len),
            "assistant_characters": _per_row_sums(offsets, content_len * is_assistant),
            "reasoning_characters": _per_row_sums(offsets, reasoning_len),
        }
        self.overall.add(Totals(**{k: int(v.sum()) for k, v in rows.items()}))
        for grouping in GROUPINGS:
            encoded = pc.dictionary_encode(pc.fill_null(batch.column(grouping), ""))
            codes = encoded.indices.to_numpy(zero_copy_only=False)
            sums = {k: np.bincount(codes, weights=v, minlength=len(encoded.dictionary)) for k, v in rows.items()}
            for code, key in enumerate(encoded.dictionary.to_pylist()):
                totals = Totals(**{k: round(v[code]) for k, v in sums.items()})
                self.groups[grouping].setdefault(key, Totals()).add(totals)
        self._add_source_info(batch)
        flags = pc.list_flatten(batch.column("flags"))
        if len(flags):
            self.flags.update(flags.to_pylist())
        self._add_generation(batch)

    def _add_source_info(self, batch: pa.RecordBatch) -> None:
        sources = batch.column("source")
        for source in pc.unique(sources).to_pylist():
            if source not in self.source_info:
                index = pc.index(sources, source).as_py()
                self.source_info[source] = {name: batch.column(name)[index].as_py()
                                            for name in ("origin", "license", "task")}

    def _add_generation(self, batch: pa.RecordBatch) -> None:
        generated = pc.equal(batch.column("origin"), "generated")
        if not pc.any(generated).as_py():
            return
        for text in pc.filter(batch.column("provenance"), generated).to_pylist():
            generation = orjson.loads(text).get("generation") or {}
            settings = {k: generation.get(k) for k in ("model", "served_model", "model_revision", "engine_version",
                                                       "enable_thinking", "history_reasoning", "sampling")}
            self.generation[orjson.dumps(settings, option=orjson.OPT_SORT_KEYS)] += 1
            for turn in generation.get("turns") or ():
                self.finish_reasons[str(turn.get("finish_reason"))] += 1

    def add_skipped(self, counts: dict[str, int]) -> None:
        self.skipped.update(counts)

    def report(self) -> dict[str, Any]:
        report = self.overall.report()
        report["skipped"] = dict(sorted(self.skipped.items()))
        report["flags"] = dict(sorted(self.flags.items()))
        for grouping in GROUPINGS:
            section = {}
            for key, totals in sorted(self.groups[grouping].items()):
                section[key] = totals.report()
                if grouping == "source":
                    section[key].update(self.source_info.get(key, {}))
            report[f"by_{grouping}"] = section
        report["generation"] = [
            {**orjson.loads(settings), "conversations": count} for settings, count in self.generation.most_common()
        ] or None
        report["finish_reasons"] = dict(sorted(self.finish_reasons.items())) or None
        if self.tokens is not None:
            report["tokens"] = self.tokens.report()
        return report




def _share(value: float) -> str:
    return f"{100 * value:.1f}%"


def corpus_problems(report: dict[str, Any], min_thinking_share: float | None) -> Iterator[str]:
    """Corpus-level check failures, shared by `corpus build`, `corpus audit` and the publish gate."""
    problem = mismatch_problem(report.get("tokens"))
    if problem is not None:
        yield problem
    if min_thinking_share is not None and report["thinking_share"] < min_thinking_share:
        yield (f"thinking share {_share(report['thinking_share'])} is below the minimum "
               f"{_share(min_thinking_share)} ({report['thinking_conversations']:,} of "
               f"{report['conversations']:,} conversations carry reasoning)")
    findings = (report.get("secrets") or {}).get("findings")
    if findings:
        yield f"{findings:,} secrets found: remove them or build with checks.redact_secrets: true"
