"""Corpus statistics computed from Arrow batches, for a built corpus or a raw source file.

Both paths go through the same batch arithmetic: a raw file is normalised by the source readers and
converted with the writer's own ``conversations_to_batch``, so a serving log and a built corpus are
measured the same way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from .corpus import Corpus
from .errors import CorpusError, Skipped
from .records import Conversation

if TYPE_CHECKING:
    from .tokens import TokenAuditor

GROUPINGS = ("source", "split", "origin")
MISMATCHES_SHOWN = 5


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
    return cumulative[offsets[1:]] - cumulative[offsets[:-1]]


@dataclass
class Auditor:
    """Accumulates statistics batch by batch; memory is per group, never per row."""

    overall: Totals = field(default_factory=Totals)
    groups: dict[str, dict[str, Totals]] = field(default_factory=lambda: {g: {} for g in GROUPINGS})
    source_info: dict[str, dict[str, Any]] = field(default_factory=dict)
    flags: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    generation: Counter[bytes] = field(default_factory=Counter)
    finish_reasons: Counter[str] = field(default_factory=Counter)
    tokens: TokenAuditor | None = None  # target-token statistics, when the target's tokenizer is known

    def add_batch(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if self.tokens is not None:
            self.tokens.add_batch(batch)
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


def audit_conversations(items: Iterable[Conversation | Skipped], batch_size: int = 4096) -> dict[str, Any]:
    """Audit a stream (e.g. a raw source file read by the source readers)."""
    from .write import conversations_to_batch

    auditor = Auditor()
    skipped: Counter[str] = Counter()
    batch: list[Conversation] = []
    for item in items:
        if isinstance(item, Skipped):
            skipped[item.reason] += 1
            continue
        batch.append(item)
        if len(batch) >= batch_size:
            auditor.add_batch(conversations_to_batch(batch))
            batch = []
    if batch:
        auditor.add_batch(conversations_to_batch(batch))
    auditor.add_skipped(dict(skipped))
    return auditor.report()


def audit_corpus_files(corpus: Corpus) -> dict[str, Any]:
    """Audit a corpus from its files: the shards its manifest lists, plus the ledger; token statistics when
    the target's tokenizer named by its recipe is at hand."""
    from .tokens import TokenAuditor, TokenSettings

    settings = TokenSettings.from_corpus(corpus)
    auditor = Auditor(tokens=TokenAuditor(settings) if settings is not None else None)
    for batch in corpus.iter_batches():
        auditor.add_batch(batch)
    auditor.add_skipped(corpus.ledger_counts())
    return auditor.report()


def audit_path(path: str, *, endpoint: str | None = None) -> dict[str, Any]:
    """A built corpus directory, a raw source file, or hf://datasets/ORG/NAME (downloaded first)."""
    if path.startswith("hf://"):
        from .publish.hub import download_corpus

        with download_corpus(path, endpoint=endpoint) as local:
            return audit_corpus_files(Corpus.open(local))
    target = Path(path)
    if target.is_dir():
        return audit_corpus_files(Corpus.open(target))
    if not target.exists():
        raise CorpusError("no such file or directory", file=path)
    from .sources import iter_file

    return audit_conversations(iter_file(target))


def _share(value: float) -> str:
    return f"{100 * value:.1f}%"


def format_report(report: dict[str, Any]) -> str:
    """A readable table for people; `--json` gives the machine form."""
    lines = [
        f"conversations        {report['conversations']:>10,}",
        f"thinking             {report['thinking_conversations']:>10,}  ({_share(report['thinking_share'])})",
        f"turns                {report['turns']:>10,}",
        f"characters           {report['characters']:>10,}",
        f"reasoning share of assistant text  {_share(report['reasoning_char_share'])}",
    ]
    for grouping in GROUPINGS:
        section = report.get(f"by_{grouping}") or {}
        if not section:
            continue
        width = max(len(grouping), *(len(k) for k in section))
        lines += ["", f"{grouping:<{width}}  {'conversations':>13}  {'thinking':>9}  {'share':>7}  {'turns':>9}"]
        for key, totals in section.items():
            lines.append(f"{key:<{width}}  {totals['conversations']:>13,}  {totals['thinking_conversations']:>9,}  "
                         f"{_share(totals['thinking_share']):>7}  {totals['turns']:>9,}")
    if report.get("skipped"):
        lines += ["", "skipped/dropped rows by reason"]
        lines += [f"  {reason:<22} {count:>9,}" for reason, count in report["skipped"].items()]
    if report.get("flags"):
        lines += ["", "flags kept on rows"]
        lines += [f"  {flag:<22} {count:>9,}" for flag, count in report["flags"].items()]
    if report.get("tokens"):
        lines += ["", *_format_tokens(report["tokens"])]
    return "\n".join(lines)


def _format_tokens(tokens: dict[str, Any]) -> list[str]:
    budget = tokens["max_seq_len"]
    lines = [f"target tokens per conversation (as served; budget {budget if budget is not None else 'none'})"]
    sections = {"all": tokens, **{f"{grouping} {key}": section for grouping in ("source", "split")
                                  for key, section in tokens[f"by_{grouping}"].items()}}
    width = max(len(name) for name in sections)
    lines.append(f"  {'':<{width}}  {'p50':>7}  {'p90':>7}  {'p99':>7}  {'max':>7}  {'reasoning':>9}  {'over':>6}")
    for name, section in sections.items():
        over = section["over_budget"]
        lines.append(f"  {name:<{width}}  {section['p50']:>7,}  {section['p90']:>7,}  {section['p99']:>7,}  "
                     f"{section['max']:>7,}  {_share(section['reasoning_token_share']):>9}  "
                     f"{'-' if over is None else f'{over:,}':>6}")
    mismatches = tokens["mismatches"]
    severity = ""
    if mismatches["count"]:
        severity = " (fatal)" if tokens["token_mismatch"] == "fail" else " (warning)"
    lines.append(f"served-ids check: {mismatches['count']:,} of {mismatches['checked_turns']:,} generated turns "
                 f"do not re-render to their served tokens{severity}")
    for turn in mismatches["turns"][:MISMATCHES_SHOWN]:
        lines.append(f"  {turn['id']} turn {turn['message_index']} at token {turn['position']} ({turn['part']}): "
                     f"served {turn['served_text']!r} vs rendered {turn['rendered_text']!r}")
    if mismatches["count"] > MISMATCHES_SHOWN:
        lines.append(f"  ... {mismatches['count'] - MISMATCHES_SHOWN:,} more in `corpus audit --json` "
                     "(tokens.mismatches)")
    return lines


def iter_report_problems(report: dict[str, Any], min_thinking_share: float | None) -> Iterator[str]:
    """Corpus-level check failures, shared by `corpus build`, `corpus audit` and the publish gate."""
    from .tokens import mismatch_problem

    problem = mismatch_problem(report.get("tokens"))
    if problem is not None:
        yield problem
    if min_thinking_share is not None and report["thinking_share"] < min_thinking_share:
        yield (f"thinking share {_share(report['thinking_share'])} is below the minimum "
               f"{_share(min_thinking_share)} ({report['thinking_conversations']:,} of "
               f"{report['conversations']:,} conversations carry reasoning)")
