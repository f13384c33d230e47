"""Dedup and decontamination as a build applies them: across sources, by source priority, before and after
generation.

One ``Dedup`` index per text: prompt sources' prompts are deduplicated before generation (no tokens spent on
a duplicate), and every row, replayed and generated, after it. Sources are read in their dedup order
(``Recipe.sources_in_dedup_order``), so among replayed rows, and among prompts, priority is the order read
(``near_dedup``'s order-free rule: a row is dropped when a row read before it is its duplicate). Generated
rows come after every replayed one; when one outranks the replayed row it duplicates, the replayed row is
evicted (``Evicted``: the build drops it from its spool and ledgers it) and the generated
row kept. The keys of the index carry what an eviction needs: the row's thinking flag, source and id (the
source gives its rank).

A keyed stage of the build's plan, in two forms of the one rule: the index judges a stream offered in priority
order (``decide``, ``judge_batch``: the local engine); ``bucket_entries`` and ``bucket_verdicts`` judge a block of
whole buckets in any order (an engine that shuffles the entries by bucket), each row's verdict its least
(``least_verdicts``) of the blocks that hold its buckets.

``read_eval_sets`` reads the recipe's evaluation sets (local files or Hub datasets, with the sources'
readers) into a ``Contamination`` index, counting the rows it skips; a set that contributes no text is an
error, since it would check nothing. A row matching any set is dropped as ``contaminated``, its detail naming
the sets (``errors.contamination_detail``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from ..errors import BadRow, CorpusError
from ..recipe.model import Checks, Decontamination, EvalSet, Recipe
from ..records import Conversation
from ..sources.formats import format_of
from ..sources.hub import hub_label, iter_hub_rows
from .decontaminate import Contamination, EvalSetSummary
from .near_dedup import Duplicate, ExactDuplicates, NearDuplicates, Rule, Signatures
from .normalise import ConversationText, NormalisedChunk, conversation_text
from .screened import Screened, Verdict

# The grouped form: what it reads of each bucket a row is in, and the verdicts it gives (the rank: the head's
# priority, a near verdict's with NEAR_RANK set, so that a row's least verdict is its exact one, then the head of
# least priority; the head: its ``dedup_key``).
BUCKET_VERDICTS = pa.schema([("priority", pa.int64()), ("rank", pa.int64()), ("head", pa.string())])
NEAR_RANK = 1 << 62
_SEPARATOR = "\x1f"


@dataclass(frozen=True, slots=True)
class Evicted:
    """A kept row that a later row of a higher-priority source duplicates: the build drops it."""

    source: str
    id: str
    thinking: bool
    of: str  # the id of the row kept instead
    of_source: str
    rule: Rule


class Dedup:
    """The dedup index of one text of the rows (``turns``), exact or with near duplicates, by source rank."""

    def __init__(self, checks: Checks, ranks: Mapping[str, int] | None = None, turns: ConversationText = "all") -> None:
        near = checks.near_duplicates
        self.turns = turns
        self.ranks = ranks or {}  # sources not ranked: rank 0
        if near is None:
            self.index: ExactDuplicates = ExactDuplicates()
        else:
            try:
                self.index = NearDuplicates(near.threshold, num_perm=near.num_perm, shingle=near.shingle)
            except ValueError as error:
                raise CorpusError(f"checks.near_duplicates: {error}") from None
        # key of an evicted row -> key of the row kept instead (only evictions: a handful)
        self._replaced: dict[str, str] = {}
        # keys of the rows dropped, when rows may evict (a bucket's head may be one: nothing to evict then)
        self._dropped: set[str] = set()

    @classmethod
    def for_checks(cls, checks: Checks, ranks: Mapping[str, int], turns: ConversationText | None = None) -> Dedup:
        """The dedup the checks ask for (not ``dedup: none``), sources ranked by ``ranks``; ``turns`` defaults to
        what dedup compares."""
        return cls(checks, ranks, turns or ("prompt" if checks.dedup == "prompt" else "all"))

    def signatures(self, rows: Sequence[Conversation]) -> Signatures:
        return self.index.signatures([conversation_text(row, self.turns) for row in rows])

    def chunk_signatures(self, chunk: NormalisedChunk) -> Signatures:
        """``signatures`` of rows whose ``conversation_text(row, self.turns)`` is already normalised."""
        return self.index.chunk_signatures(chunk)

    def decide(self, rows: Sequence[Conversation], ids: Sequence[str], signatures: Signatures,
               evict: Callable[[Evicted], None] | None) -> list[Verdict | None]:
        """Per row (kept under ``ids``), in order: None (kept) or why it is a duplicate. With ``evict``, a row
        that outranks the kept row it duplicates is kept and that row evicted; without, the first kept stays
        (callers read sources in rank order, so only a later phase can outrank an earlier one)."""
        keys = [dedup_key(row.thinking, row.source, row_id) for row, row_id in zip(rows, ids, strict=True)]
        return self.judge(keys, self.index.decide(keys, signatures), evict)

    def judge_batch(self, batch: Screened, evict: Callable[[Evicted], None] | None = None) -> None:
        """The verdicts of a batch's rows (under the ids the ids stage gave them), the batches offered in priority
        order: ``decide``."""
        if batch.signatures is None or not batch.rows:
            return
        ids = batch.ids if batch.ids is not None else [row.id for row in batch.rows]
        batch.verdicts = self.decide(batch.rows, ids, batch.signatures, evict)

    def bucket_entries(self, rows: pa.Table, ids: Sequence[str]) -> pa.Table:
        """The grouped form's entries of a batch's rows in their Arrow form (their priority, source, reasoning and
        signatures; ``ids``: the ids they are written under): one per bucket each row is in, keyed by ``kind`` and
        ``key`` (``ExactDuplicates.bucket_entries``), with the row's priority, the band, its sketch and its name
        (``dedup_key``, what a verdict names)."""
        index = self.index
        signatures = Signatures.from_arrow(rows)
        positions, kinds, keys, bands = index.bucket_entries(signatures)
        names = [dedup_key(thinking, source, row_id) for thinking, source, row_id in zip(
            rows.column("thinking").to_pylist(), rows.column("source").to_pylist(), ids, strict=True)]
        at = pa.array(positions)
        sketches = (rows.column("sketch").take(at) if "sketch" in rows.column_names
                    else pa.nulls(len(positions), pa.null()))
        return pa.table({"kind": kinds, "key": keys, "priority": rows.column("priority").take(at), "band": bands,
                         "sketch": sketches, "name": pa.array(names, pa.string()).take(at)})

    def bucket_verdicts(self, entries: pa.Table) -> pa.Table:
        """The grouped form's judge of a block of whole buckets (``bucket_entries``, any order): a bucket's head is
        its entry of least priority, every other entry a candidate against it, which holds when the bucket is the
        exact rule's or the sketches confirm it; each row's least verdict of the block (``BUCKET_VERDICTS``: an exact
        verdict ranks first, then the head of least priority)."""
        if not len(entries):  # an empty partition (its block may have no columns)
            return BUCKET_VERDICTS.empty_table()
        kinds, keys = np.asarray(entries.column("kind")), np.asarray(entries.column("key"))
        priorities = np.asarray(entries.column("priority"))
        order = np.lexsort((priorities, keys, kinds))  # each bucket's head first
        kinds, keys, priorities = kinds[order], keys[order], priorities[order]
        # each entry's bucket's head: the last bucket start at or before it
        heads = np.maximum.accumulate(np.where(run_starts(kinds, keys), np.arange(len(order)), 0))
        candidate = priorities != priorities[heads]
        exact = kinds == 0
        holds = candidate & exact
        near = np.flatnonzero(candidate & ~exact)
        if len(near):
            sketches = Signatures.from_arrow(entries.select(["sketch"])).sketches[order]
            holds[near] = self.index.confirmed(sketches[near], sketches[heads[near]],
                                               np.asarray(entries.column("band"))[order][near])
        rows = np.flatnonzero(holds)
        ranks = priorities[heads[rows]] | np.where(exact[rows], 0, NEAR_RANK)
        return least_verdicts(pa.table({
            "priority": priorities[rows], "rank": ranks,
            "head": entries.column("name").take(pa.array(order[heads[rows]]))}, schema=BUCKET_VERDICTS))

    def judge(self, keys: Sequence[str], found: Sequence[Duplicate | None], evict: Callable[[Evicted], None] | None
              ) -> list[Verdict | None]:
        """``decide`` for rows (``dedup_key``) whose index answers are ``found`` already, in the order offered: the
        Ray engine finds them by group-bys and judges the generated rows with this, in the local engine's order."""
        verdicts: list[Verdict | None] = []
        for key, duplicate in zip(keys, found, strict=True):
            verdict = None if duplicate is None else self._verdict(key, duplicate, evict)
            if verdict is not None and evict is not None:
                self._dropped.add(key)
            verdicts.append(verdict)
        return verdicts

    def mark_dropped(self, keys: Iterable[str]) -> None:
        """Rows judged duplicates elsewhere (the Ray engine's replayed rows, by group-bys): a head among them is out
        already, nothing to evict."""
        self._dropped.update(keys)

    def _verdict(self, key: str, found: Duplicate, evict: Callable[[Evicted], None] | None) -> Verdict | None:
        _, source, row_id = parse_dedup_key(key)
        kept = found.of
        while kept in self._replaced:
            kept = self._replaced[kept]
        kept_thinking, kept_source, kept_id = parse_dedup_key(kept)
        kept_rank = self.ranks.get(kept_source, 0)
        if evict is not None and self.ranks.get(source, 0) < kept_rank:
            if kept not in self._dropped:  # a head that was dropped itself is out already
                evict(Evicted(kept_source, kept_id, kept_thinking, row_id, source, found.rule))
                self._replaced[kept] = key
            return None
        return Verdict(kept_id, kept_source, found.rule)


def least_verdicts(verdicts: pa.Table) -> pa.Table:
    """Each row's least verdict of those given (``BUCKET_VERDICTS``, by priority, sorted): a row whose buckets fall
    in several blocks has a verdict from each."""
    ordered = verdicts.sort_by([("priority", "ascending"), ("rank", "ascending")])
    return ordered.filter(pa.array(run_starts(np.asarray(ordered.column("priority")))))


def run_starts(*columns: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
    """Of sorted ``columns``, whether each record starts a run of equal values (its group's first)."""
    starts = np.zeros(len(columns[0]), dtype=bool)
    starts[:1] = True
    for column in columns:
        starts[1:] |= column[1:] != column[:-1]
    return starts


@dataclass(frozen=True, slots=True)
class Head:
    """A verdict's head: its priority, and what the local engine's index answers for the row (``Duplicate``)."""

    priority: int
    duplicate: Duplicate

    @property
    def verdict(self) -> Verdict:
        """Why the row is dropped: the row of its index answer."""
        _, source, row_id = parse_dedup_key(self.duplicate.of)
        return Verdict(row_id, source, self.duplicate.rule)


def heads_of(ranks: pa.Array | pa.ChunkedArray, heads: pa.Array | pa.ChunkedArray) -> list[Head | None]:
    """The heads of verdicts given as their ``rank`` and ``head`` columns (null: no verdict)."""
    return [None if rank is None else
            Head(rank & ~NEAR_RANK, Duplicate(head, "near" if rank & NEAR_RANK else "exact"))
            for rank, head in zip(ranks.to_pylist(), heads.to_pylist(), strict=True)]


def dedup_key(thinking: bool, source: str, row_id: str) -> str:
    """What the index keeps of a row: what an eviction needs, its thinking flag, source and id."""
    return _SEPARATOR.join(("1" if thinking else "0", source, row_id))


def parse_dedup_key(key: str) -> tuple[bool, str, str]:
    """The thinking flag, source and id of a ``dedup_key``."""
    thinking, source, row_id = key.split(_SEPARATOR, 2)
    return thinking == "1", source, row_id


# Why an evaluation set's row gives no text, beside the readers' own reasons for a line that does not decode.
NOT_AN_OBJECT = "not_an_object"
FIELDS_ABSENT = "fields_absent"  # none of the set's ``fields`` is in the row
# A set that skips more of its rows than this is reported: it is probably the wrong file, or fields.
MOSTLY_SKIPPED = 0.5


@dataclass
class EvalSetRead:
    """One evaluation set as it is read: its rows, and those skipped by reason (lines that do not decode,
    rows that are not objects, rows with none of the fields named), for the error, the dry run and the manifest."""

    spec: EvalSet
    rows: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    keys: tuple[str, ...] = ()  # the keys of the first row read, to name what is there when the fields are not

    @property
    def where(self) -> str:
        """The file, or the Hub dataset, the set is read from."""
        if self.spec.path is not None:
            return str(self.spec.path)
        assert self.spec.hub is not None  # the recipe gives a set a path or a hub dataset
        return f"hf://datasets/{hub_label(self.spec.hub)}"

    def texts(self) -> Iterator[str]:
        """Every text of the set, counting its rows as they go by; a file that cannot be read at all is a
        CorpusError naming the set."""
        spec = self.spec
        try:
            if spec.path is not None:
                rows = (row for _, row in format_of(spec.path).read(spec.path, str(spec.path)))
            else:
                assert spec.hub is not None
                rows = (row for _, row in iter_hub_rows(spec.hub, f"eval set {spec.name}"))
            for row in rows:
                self.rows += 1
                if isinstance(row, BadRow) or not isinstance(row, dict):
                    self.skipped[row.reason if isinstance(row, BadRow) else NOT_AN_OBJECT] += 1
                    continue
                self.keys = self.keys or tuple(map(str, row))
                if spec.fields and not any(name in row for name in spec.fields):
                    self.skipped[FIELDS_ABSENT] += 1
                    continue
                yield from _strings([row.get(name) for name in spec.fields] if spec.fields else list(row.values()))
        except CorpusError as error:
            raise CorpusError(f"decontamination: eval set '{spec.name}': {error.problem}", file=error.file,
                              line=error.line, details=error.details) from None

    def describe_skipped(self) -> str:
        """"3 of 10 rows skipped (invalid_json 2, not_an_object 1)", or "" when none was."""
        if not self.skipped:
            return ""
        reasons = ", ".join(f"{reason} {count:,}" for reason, count in sorted(self.skipped.items()))
        return f"{sum(self.skipped.values()):,} of {self.rows:,} rows skipped ({reasons})"

    def unusable(self, summary: EvalSetSummary, min_words: int) -> CorpusError | None:
        """Why the set contributes no text to the index (it would check nothing), or None when it does."""
        if summary.texts > summary.ignored:
            return None
        undecoded = sum(count for reason, count in self.skipped.items() if reason != FIELDS_ABSENT)
        if undecoded == self.rows:
            why = f"no row of it can be read: {self.describe_skipped()}"
        elif self.skipped[FIELDS_ABSENT] == self.rows - undecoded:
            why = (f"none of its rows has the fields {', '.join(self.spec.fields)} (its rows have "
                   f"{', '.join(self.keys) or 'no key'})")
        elif summary.texts:
            why = f"no text of at least {min_words} words: all its texts ({summary.texts:,}) are shorter"
        else:
            why = f"no text of at least {min_words} words: its rows hold no text at all"
        return CorpusError(f"decontamination: eval set '{self.spec.name}': {why}; it would check nothing (fix its "
                           "path or fields, or remove it)", file=self.where)

    def warning(self) -> str | None:
        """A note when most of the set's rows were skipped."""
        skipped = sum(self.skipped.values())
        if not self.rows or skipped <= self.rows * MOSTLY_SKIPPED:
            return None
        return (f"eval set '{self.spec.name}' ({self.where}): {self.describe_skipped()}; is this the right file "
                "and fields?")


@dataclass(frozen=True, slots=True)
class EvalSets:
    """The recipe's evaluation sets, read and indexed."""

    index: Contamination
    reads: tuple[EvalSetRead, ...]

    def warnings(self) -> list[str]:
        return [warning for read in self.reads if (warning := read.warning()) is not None]


def read_eval_sets(decontamination: Decontamination | None) -> EvalSets | None:
    """The recipe's evaluation sets, read and indexed. A set that cannot be read, or that contributes no text
    (no readable row, none of the fields named, no text of min_words words), is a CorpusError: the build and
    the dry run call this before they write or generate anything."""
    if decontamination is None:
        return None
    reads = tuple(EvalSetRead(spec) for spec in decontamination.eval_sets)
    try:
        index = Contamination(((read.spec.name, read.texts()) for read in reads), n=decontamination.ngram,
                              min_words=decontamination.min_words)
    except ValueError as error:
        raise CorpusError(f"decontamination: {error}") from None
    for read, summary in zip(reads, index.eval_sets, strict=True):
        if (problem := read.unusable(summary, decontamination.min_words)) is not None:
            raise problem
    return EvalSets(index, reads)


def describe_eval_sets(recipe: Recipe, eval_sets: EvalSets) -> list[dict[str, Any]]:
    """What the corpus was checked against, for the manifest and the card (paths as the recipe writes them)."""
    written = recipe.document["decontamination"]["eval_sets"]
    return [{"name": read.spec.name, "from": read.where if read.spec.hub is not None else written[position]["path"],
             "texts": summary.texts, "too_short": summary.ignored, "skipped_rows": dict(sorted(read.skipped.items()))}
            for position, (read, summary) in enumerate(zip(eval_sets.reads, eval_sets.index.eval_sets, strict=True))]


def _strings(value: Any) -> Iterator[str]:
    """Every string in a value, through lists and mappings (MT-Bench keeps its turns in a list)."""
    if isinstance(value, str):
        if value.strip():
            yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)


def describe_screening(recipe: Recipe, eval_sets: EvalSets | None) -> dict[str, Any]:
    """How a build deduplicates and decontaminates, for the manifest and the card."""
    near = recipe.checks.near_duplicates
    ranks = recipe.dedup_ranks()
    described: dict[str, Any] = {"dedup": {
        "rule": recipe.checks.dedup,
        "near_duplicates": {"threshold": near.threshold, "num_perm": near.num_perm, "shingle": near.shingle}
        if near is not None else None,
        "priority": sorted(ranks, key=ranks.__getitem__)}}
    if recipe.decontamination is not None and eval_sets is not None:
        described["decontamination"] = {"ngram": recipe.decontamination.ngram,
                                        "min_words": recipe.decontamination.min_words,
                                        "eval_sets": describe_eval_sets(recipe, eval_sets)}
    return described
