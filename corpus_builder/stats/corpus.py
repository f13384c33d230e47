"""Corpus statistics computed from Arrow batches, and the corpus-level checks decided from them.

The build computes them from exactly the rows it writes (audit.json); `corpus audit` recomputes them from
the files, or from a raw source file normalised by the source readers and converted with the row form's
own ``conversations_to_batch``, so a serving log and a built corpus are measured the same way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, NotRequired, TypedDict

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import DropCounts, DropReport
from ..records import Conversation, Provenance
from .facts import BatchFacts, logged_request, parsed_provenance, served
from .tokens import TokenReport, TokenStats, mismatch_problem

GROUPINGS = ("source", "split", "origin")
# What the audit groups generated rows by: the target that made them and how it was asked.
TARGET_FIELDS = ("model", "served_model", "model_revision", "model_root", "quantization", "dtype", "engine_version")
GENERATION_SETTINGS = (*TARGET_FIELDS, "enable_thinking", "history_reasoning", "sampling")


class TotalsReport(TypedDict):
    """The figures of a corpus, or of one source, split or origin of it (audit.json)."""

    conversations: int
    thinking_conversations: int
    thinking_share: float
    turns: int
    characters: int
    reasoning_char_share: float
    tool_call_conversations: int
    tool_call_share: float


class SourceReport(TotalsReport):
    """A source's figures (``by_source``), with what its rows say of it and their flags."""

    origin: str | None
    license: str | None
    task: str | None
    flags: dict[str, int]


class SourceInfo(TypedDict):
    """What a source's rows say of it (its first row's)."""

    origin: str | None
    license: str | None
    task: str | None


class NearDuplicatesReport(TypedDict):
    """A raw file's rows that near-duplicate an earlier one: counted, not dropped (what checks.near_duplicates would
    drop)."""

    threshold: float
    rows: int
    by_source: dict[str, int]


class PackEntry(TypedDict):
    """A source's or task's rows in the eval pack beside its rows in the corpus (``stats.pack``)."""

    conversations: int
    share: float
    corpus_conversations: int
    corpus_share: float
    thinking_share: float
    corpus_thinking_share: float


class PackMix(TypedDict):
    """audit.json's ``eval_pack``: the pack's rows, thinking share, and mix by source and by task."""

    conversations: int
    thinking_conversations: int
    thinking_share: float
    by_source: dict[str, PackEntry]
    by_task: dict[str, PackEntry]


class SecretsReport(TypedDict):
    findings: int
    by_kind: dict[str, int]
    examples: list[str]


class _AddedSections(TypedDict, total=False):
    """The sections of audit.json added by whoever knows them: the token statistics (a tokenizer at hand), the
    corpus checks (a build), the secrets scan and the near duplicates (an audit of a raw file)."""

    tokens: TokenReport
    checks: dict[str, Any]
    secrets: SecretsReport
    near_duplicates: NearDuplicatesReport
    eval_pack: PackMix  # the eval pack's mix beside the corpus's (stats.pack)
    served: ServedReport  # replayed rows that record how they were served (logged requests)


class ServedModes(TypedDict):
    """A source's replayed rows by the thinking mode they were served in, beside whether they carry reasoning."""

    on: int
    off: int
    unrecorded: int
    on_with_reasoning: int
    off_with_reasoning: int


class ServedReport(TypedDict):
    by_source: dict[str, ServedModes]
    models: dict[str, int]  # the models that served them


class AuditReport(TotalsReport, _AddedSections):
    """audit.json and ``corpus audit --json``: the statistics of a corpus (what its rows hold, what was dropped),
    computed by ``CorpusStats`` from the rows a build writes and again by the audit from the files."""

    strata: dict[str, dict[str, dict[str, int]]]  # conversations per source, thinking or not, and split
    skipped: dict[str, int]
    skipped_by_source: dict[str, dict[str, int]]
    contaminated_by_eval_set: dict[str, int]
    flags: dict[str, int]
    by_source: dict[str, SourceReport]
    by_split: dict[str, TotalsReport]
    by_origin: dict[str, TotalsReport]
    generation: list[dict[str, object]] | None  # the generation settings recorded, each with its conversations
    finish_reasons: dict[str, int] | None


@dataclass(slots=True)
class Totals:
    """Conversations and the sums of their facts (``facts``: one field each, by the fact's name)."""

    conversations: int = 0
    thinking: int = 0
    messages: int = 0
    characters: int = 0
    assistant_characters: int = 0
    reasoning_characters: int = 0
    tool_calls: int = 0

    def add(self, other: Totals) -> None:
        self.conversations += other.conversations
        self.thinking += other.thinking
        self.messages += other.messages
        self.characters += other.characters
        self.assistant_characters += other.assistant_characters
        self.reasoning_characters += other.reasoning_characters
        self.tool_calls += other.tool_calls

    def report(self) -> TotalsReport:
        """The totals under audit.json's labels (``facts`` names each fact's)."""
        reasoning_and_answer = self.assistant_characters + self.reasoning_characters
        return {
            "conversations": self.conversations,
            "thinking_conversations": self.thinking,
            "thinking_share": round(self.thinking / self.conversations, 6) if self.conversations else 0.0,
            "turns": self.messages,
            "characters": self.characters,
            "reasoning_char_share": round(self.reasoning_characters / reasoning_and_answer, 6)
            if reasoning_and_answer else 0.0,
            "tool_call_conversations": self.tool_calls,
            "tool_call_share": round(self.tool_calls / self.conversations, 6) if self.conversations else 0.0,
        }


class StatsJson(TypedDict):
    """``CorpusStats`` as JSON (``to_json``), what a task that wrote rows sends the driver; the token statistics
    apart (``TokenFigures.to_json``)."""

    overall: dict[str, int]
    groups: dict[str, dict[str, dict[str, int]]]
    strata: list[tuple[str, bool, str | None, int]]
    source_info: dict[str, SourceInfo]
    flags: dict[str, int]
    flags_by_source: dict[str, dict[str, int]]
    skipped: DropReport
    generation: list[tuple[str, int]]
    finish_reasons: dict[str, int]
    served: list[tuple[str, bool | None, bool, int]]
    served_models: dict[str, int]


@dataclass
class CorpusStats:
    """Accumulates statistics batch by batch; memory is per group, never per row."""

    overall: Totals = field(default_factory=Totals)
    groups: dict[str, dict[str, Totals]] = field(default_factory=lambda: {g: {} for g in GROUPINGS})
    strata: Counter[tuple[str, bool, str | None]] = field(default_factory=Counter)  # (source, thinking, split)
    source_info: dict[str, SourceInfo] = field(default_factory=dict)
    flags: Counter[str] = field(default_factory=Counter)
    flags_by_source: dict[str, Counter[str]] = field(default_factory=dict)
    skipped: DropCounts = field(default_factory=DropCounts)
    generation: Counter[bytes] = field(default_factory=Counter)
    finish_reasons: Counter[str] = field(default_factory=Counter)
    served: Counter[tuple[str, bool | None, bool]] = field(default_factory=Counter)  # (source, as served, reasoning)
    served_models: Counter[str] = field(default_factory=Counter)
    tokens: TokenStats | None = None  # target-token statistics, when the target's tokenizer is known

    def add_rows(self, conversations: list[Conversation], batch: pa.RecordBatch) -> None:
        """One group of rows, in both forms (the token statistics read the conversations)."""
        if batch.num_rows and self.tokens is not None:
            self.tokens.add_conversations(conversations)
        self.add_batch(batch)

    def add_batch(self, batch: pa.RecordBatch) -> None:
        """One group of rows in the Arrow form: every statistic but the token statistics, which read the
        conversations (``add_rows``)."""
        if batch.num_rows == 0:
            return
        rows = asdict(BatchFacts.of(batch))
        rows["conversations"] = np.ones(batch.num_rows, dtype=np.int64)
        self.overall.add(Totals(**{k: int(v.sum()) for k, v in rows.items()}))
        for grouping in GROUPINGS:
            encoded = pc.dictionary_encode(pc.fill_null(batch.column(grouping), ""))
            codes = encoded.indices.to_numpy(zero_copy_only=False)
            sums = {k: np.bincount(codes, weights=v, minlength=len(encoded.dictionary)) for k, v in rows.items()}
            for code, key in enumerate(encoded.dictionary.to_pylist()):
                totals = Totals(**{k: round(v[code]) for k, v in sums.items()})
                self.groups[grouping].setdefault(key, Totals()).add(totals)
        self._add_source_info(batch)
        self._add_flags(batch)
        self._add_generation(batch)
        self._add_served(batch)
        self.strata.update(zip(batch.column("source").to_pylist(), batch.column("thinking").to_pylist(),
                               batch.column("split").to_pylist(), strict=True))

    def _add_flags(self, batch: pa.RecordBatch) -> None:
        """Rows per flag, overall and by source (e.g. how many rows of each source a repair rule changed)."""
        flags = batch.column("flags")
        flat = pc.list_flatten(flags)
        if not len(flat):
            return
        sources = pc.take(batch.column("source"), pc.list_parent_indices(flags))
        for source, flag in zip(sources.to_pylist(), flat.to_pylist(), strict=True):
            self.flags[flag] += 1
            self.flags_by_source.setdefault(source, Counter())[flag] += 1

    def _add_source_info(self, batch: pa.RecordBatch) -> None:
        sources = batch.column("source")
        for source in pc.unique(sources).to_pylist():
            if source not in self.source_info:
                index = pc.index(sources, source).as_py()
                self.source_info[source] = {"origin": batch.column("origin")[index].as_py(),
                                            "license": batch.column("license")[index].as_py(),
                                            "task": batch.column("task")[index].as_py()}

    def _add_generation(self, batch: pa.RecordBatch) -> None:
        generated = pc.equal(batch.column("origin"), "generated")
        if not pc.any(generated).as_py():
            return
        for text in pc.filter(batch.column("provenance"), generated).to_pylist():
            generation = Provenance.from_json(orjson.loads(text)).generation
            settings = {k: getattr(generation, k, None) for k in GENERATION_SETTINGS}
            self.generation[orjson.dumps(settings, option=orjson.OPT_SORT_KEYS)] += 1
            for turn in generation.turns if generation is not None else ():
                self.finish_reasons[str(turn.finish_reason)] += 1

    def _add_served(self, batch: pa.RecordBatch) -> None:
        """Replayed rows that record how they were served: by source, mode as served and reasoning present."""
        provenance = batch.column("provenance")
        logged = pc.and_(pc.equal(batch.column("origin"), "replay"), pc.match_substring(provenance, '"served"'))
        if not pc.any(logged).as_py():
            return
        rows = zip(pc.filter(batch.column("source"), logged).to_pylist(), pc.filter(provenance, logged).to_pylist(),
                   pc.filter(batch.column("thinking"), logged).to_pylist(), strict=True)
        for source, text, thinking in rows:
            parsed = parsed_provenance(text)
            request = logged_request("replay", parsed)
            if request is None:
                continue
            self.served[source, served("replay", parsed), bool(thinking)] += 1
            model = request.get("model")
            if isinstance(model, str):
                self.served_models[model] += 1

    def served_report(self) -> ServedReport | None:
        if not self.served:
            return None
        by_source: dict[str, ServedModes] = {}
        for (source, mode, reasoning), count in sorted(self.served.items(), key=str):
            modes = by_source.setdefault(source, {"on": 0, "off": 0, "unrecorded": 0, "on_with_reasoning": 0,
                                                  "off_with_reasoning": 0})
            name = "unrecorded" if mode is None else "on" if mode else "off"
            modes[name] += count  # type: ignore[literal-required]
            if reasoning and mode is not None:
                modes[f"{name}_with_reasoning"] += count  # type: ignore[literal-required]
        return {"by_source": by_source, "models": dict(sorted(self.served_models.items()))}

    def merge(self, other: CorpusStats) -> None:
        """Add what another accumulator saw (the Ray engine keeps one per task that writes rows). The report is
        the one of a single accumulator of every row, but for generation settings of equal counts, listed in the
        order met: replayed rows have none. The other's token statistics must travel apart, as their figures
        (``TokenStats.figures``, merged into this one's): a TokenStats holds the tokenizer."""
        if other.tokens is not None:
            raise ValueError("token statistics merge as their figures (TokenFigures.merge)")
        self.overall.add(other.overall)
        for grouping, groups in other.groups.items():
            for key, totals in groups.items():
                self.groups[grouping].setdefault(key, Totals()).add(totals)
        self.strata.update(other.strata)
        for source, info in other.source_info.items():
            self.source_info.setdefault(source, info)
        self.flags.update(other.flags)
        for source, counts in other.flags_by_source.items():
            self.flags_by_source.setdefault(source, Counter()).update(counts)
        self.skipped.update(other.skipped)
        self.generation.update(other.generation)
        self.finish_reasons.update(other.finish_reasons)
        self.served.update(other.served)
        self.served_models.update(other.served_models)

    def to_json(self) -> StatsJson:
        """The counts as JSON; ``from_json`` reads them back (its token statistics are not among them)."""
        return {"overall": asdict(self.overall),
                "groups": {grouping: {key: asdict(totals) for key, totals in groups.items()}
                           for grouping, groups in self.groups.items()},
                "strata": [(*stratum, count) for stratum, count in self.strata.items()],
                "source_info": self.source_info, "flags": dict(self.flags),
                "flags_by_source": {source: dict(counts) for source, counts in self.flags_by_source.items()},
                "skipped": self.skipped.report(),
                "generation": [(settings.decode(), count) for settings, count in self.generation.items()],
                "finish_reasons": dict(self.finish_reasons),
                "served": [(*served, count) for served, count in self.served.items()],
                "served_models": dict(self.served_models)}

    @classmethod
    def from_json(cls, document: StatsJson) -> CorpusStats:
        return cls(overall=Totals(**document["overall"]),
                   groups={grouping: {key: Totals(**totals) for key, totals in groups.items()}
                           for grouping, groups in document["groups"].items()},
                   strata=Counter({(source, thinking, split): count
                                   for source, thinking, split, count in document["strata"]}),
                   source_info=document["source_info"], flags=Counter(document["flags"]),
                   flags_by_source={source: Counter(counts) for source, counts in document["flags_by_source"].items()},
                   skipped=DropCounts.from_report(dict(document["skipped"])),
                   generation=Counter({settings.encode(): count for settings, count in document["generation"]}),
                   finish_reasons=Counter(document["finish_reasons"]),
                   served=Counter({(source, mode, reasoning): count
                                   for source, mode, reasoning, count in document["served"]}),
                   served_models=Counter(document["served_models"]))

    def add_skipped(self, drops: DropCounts) -> None:
        self.skipped.update(drops)

    def report(self) -> AuditReport:
        strata: dict[str, dict[str, dict[str, int]]] = {}
        for (source, thinking, split), count in sorted(self.strata.items(), key=str):
            stratum = strata.setdefault(source, {}).setdefault("thinking" if thinking else "no_thinking", {})
            stratum[split or ""] = count
        dropped = self.skipped.report()

        def grouped(grouping: str) -> dict[str, TotalsReport]:
            return {key: totals.report() for key, totals in sorted(self.groups[grouping].items())}

        by_source: dict[str, SourceReport] = {}
        for key, totals in sorted(self.groups["source"].items()):
            info = self.source_info.get(key, {"origin": None, "license": None, "task": None})
            by_source[key] = {**totals.report(), "origin": info["origin"], "license": info["license"],
                              "task": info["task"],
                              "flags": dict(sorted(self.flags_by_source.get(key, Counter()).items()))}
        overall = self.overall.report()
        report: AuditReport = {
            "conversations": overall["conversations"], "thinking_conversations": overall["thinking_conversations"],
            "thinking_share": overall["thinking_share"], "turns": overall["turns"], "characters": overall["characters"],
            "reasoning_char_share": overall["reasoning_char_share"],
            "tool_call_conversations": overall["tool_call_conversations"],
            "tool_call_share": overall["tool_call_share"],
            "strata": strata, "skipped": dropped["skipped"],
            "skipped_by_source": dropped["skipped_by_source"],
            "contaminated_by_eval_set": dropped["contaminated_by_eval_set"], "flags": dict(sorted(self.flags.items())),
            "by_source": by_source, "by_split": grouped("split"), "by_origin": grouped("origin"),
            "generation": [{**orjson.loads(settings), "conversations": count}
                           for settings, count in self.generation.most_common()] or None,
            "finish_reasons": dict(sorted(self.finish_reasons.items())) or None}
        if self.tokens is not None:
            report["tokens"] = self.tokens.report()
        served = self.served_report()
        if served is not None:
            report["served"] = served
        return report




def generation_targets(audit: AuditReport) -> list[dict[str, object]]:
    """The targets that generated rows of a corpus (its audit's generation settings grouped by target), with
    their row counts: one entry for a corpus built as it should be."""
    targets: dict[bytes, dict[str, object]] = {}
    rows: Counter[bytes] = Counter()
    for setting in audit.get("generation") or ():
        identity = {name: setting.get(name) for name in TARGET_FIELDS}
        key = orjson.dumps(identity, option=orjson.OPT_SORT_KEYS)
        targets.setdefault(key, identity)
        conversations = setting.get("conversations", 0)
        rows[key] += conversations if isinstance(conversations, int) else 0
    return [{**identity, "conversations": rows[key]} for key, identity in targets.items()]


def _share(value: float) -> str:
    return f"{100 * value:.1f}%"


class CorpusFigures(TypedDict):
    """What the corpus-level checks read: an audit's report, or the publish gate's recount."""

    conversations: int
    thinking_conversations: int
    thinking_share: float
    tokens: NotRequired[TokenReport]
    secrets: NotRequired[SecretsReport]


def corpus_problems(report: CorpusFigures | AuditReport, min_thinking_share: float | None) -> Iterator[str]:
    """Corpus-level check failures, shared by `corpus build`, `corpus audit` and the publish gate."""
    problem = mismatch_problem(report.get("tokens"))
    if problem is not None:
        yield problem
    if min_thinking_share is not None and report["thinking_share"] < min_thinking_share:
        yield (f"thinking share {_share(report['thinking_share'])} is below the minimum "
               f"{_share(min_thinking_share)} ({report['thinking_conversations']:,} of "
               f"{report['conversations']:,} conversations carry reasoning)")
    secrets = report.get("secrets")
    findings = secrets["findings"] if secrets is not None else 0
    if findings:
        yield f"{findings:,} secrets found: remove them or build with checks.redact_secrets: true"
