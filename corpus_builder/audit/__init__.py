"""The audit stage: statistics of what was written (a built corpus), or of a raw source file or dump.

It reads files, never the pipeline's memory, with the same statistics the build computes while writing
(``build.stats``); ``report`` is the table people read. ``audit_against`` compares a built corpus with
serving traffic (``traffic``, on the polars engine of ``frames``/``inputs``/``profile`` and the token
measures of ``token_pass``); ``write_html_report`` writes the self-contained report (``html``). The
comparison's modules, polars and plotly load only when one of those is called.
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..build.checks import Checker
from ..build.dedup import Dedup
from ..build.near_dedup import NearDuplicates, conversation_text
from ..build.stats import CorpusStats, corpus_problems
from ..build.token_stats import TokenStats
from ..errors import CorpusError, DropCounts, Skipped
from ..layout import Corpus
from ..recipe.model import Checks, NearDuplicateSettings
from ..records import Conversation
from ..rows import batch_to_conversations, conversations_to_batch
from ..secrets import Finding, scan_conversations, scan_corpus
from ..tokens import TokenRows, TokenSettings
from .report import format_report

__all__ = ["AuditOptions", "audit", "audit_against", "audit_conversations", "audit_corpus", "corpus_problems",
           "describe_corpus", "divergence_problems", "format_comparison", "format_report", "write_html_report"]

# The comparison's names, loaded on first use: they import polars (and plotly, for the page).
_TRAFFIC_API = {"AuditOptions": "traffic", "audit_against": "traffic", "describe_corpus": "traffic",
                "divergence_problems": "traffic", "format_comparison": "traffic", "write_html_report": "html"}

SECRET_EXAMPLES = 20
FLAG_REPEATED_SOURCE_ID = "repeated_source_id"  # raw audits: a row whose own id an earlier row had

if TYPE_CHECKING:
    from .html import write_html_report
    from .traffic import AuditOptions, audit_against, describe_corpus, divergence_problems, format_comparison


def __getattr__(name: str) -> Any:
    module = _TRAFFIC_API.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def audit_conversations(items: Iterable[Conversation | Skipped], batch_size: int = 4096,
                        near: NearDuplicateSettings | None = None) -> dict[str, Any]:
    """Audit a stream (e.g. a raw source file read by the source readers). Rows whose own id (``source_id``)
    an earlier row had are counted in ``flags``; with ``near``, the rows that near-duplicate an earlier one
    are counted (``near_duplicates``), not dropped."""
    auditor = CorpusStats()
    skipped = DropCounts()
    index = NearDuplicates(near.threshold, num_perm=near.num_perm, shingle=near.shingle) if near else None
    near_by_source: Counter[str] = Counter()
    # Hashes of the dump's own row ids seen: a repeated id (a chat cut into chunks, a row logged twice) is
    # counted as a flag. A dict of ints, not a set: the garbage collector does not walk it.
    source_ids: dict[int, None] = {}
    repeated_ids = 0

    def add(batch: list[Conversation]) -> None:
        nonlocal repeated_ids
        auditor.add_rows(batch, conversations_to_batch(batch))
        for row in batch:
            source_id = row.provenance.get("source_id")
            if source_id is not None:
                key = hash((row.source, source_id))
                repeated_ids += key in source_ids
                source_ids[key] = None
        if index is not None:
            found = index.offer([row.id for row in batch], [conversation_text(row) for row in batch])
            near_by_source.update(row.source for row, duplicate in zip(batch, found, strict=True) if duplicate)

    batch: list[Conversation] = []
    for item in items:
        if isinstance(item, Skipped):
            skipped.add(item.source, item.reason, item.detail)
            continue
        batch.append(item)
        if len(batch) >= batch_size:
            add(batch)
            batch = []
    if batch:
        add(batch)
    auditor.add_skipped(skipped)
    report = auditor.report()
    if repeated_ids:
        report["flags"] = dict(sorted({**report["flags"], FLAG_REPEATED_SOURCE_ID: repeated_ids}.items()))
    if near is not None:
        report["near_duplicates"] = {"threshold": near.threshold, "rows": sum(near_by_source.values()),
                                     "by_source": dict(sorted(near_by_source.items()))}
    return report


def audit_corpus(corpus: Corpus) -> dict[str, Any]:
    """Audit a corpus from its files: the shards its manifest lists, plus the ledger; token statistics when
    the target's tokenizer named by its recipe is at hand."""
    settings = TokenSettings.from_corpus(corpus)
    tokens = TokenStats(settings, TokenRows(settings.renderer())) if settings is not None else None
    auditor = CorpusStats(tokens=tokens)
    for batch in corpus.iter_batches():
        auditor.add_rows(batch_to_conversations(batch) if tokens is not None else [], batch)
    auditor.add_skipped(corpus.ledger_drops())
    return auditor.report()


def audit(path: str | Path, *, endpoint: str | None = None, secrets: bool = True) -> dict[str, Any]:
    """Statistics of a built corpus directory, a raw source file, or ``hf://datasets/ORG/NAME`` (downloaded
    first). With ``secrets`` a local corpus or file is also scanned for credentials (``report["secrets"]``;
    a published corpus passed that scan at publish)."""
    where = str(path)
    if where.startswith("hf://"):
        from ..hub import download_corpus

        with download_corpus(where, endpoint=endpoint) as local:
            return audit_corpus(Corpus.open(local))
    target = Path(where)
    if target.is_dir():
        report = audit_corpus(Corpus.open(target))
        findings = scan_corpus(target) if secrets else None
    elif target.exists():
        from ..sources import iter_file

        # The row checks of a build with the recipe defaults (unclosed think blocks, exact duplicates): a raw
        # dump's audit and a default build of it agree on every count. Near duplicates are counted besides:
        # what checks.near_duplicates (off by default) would drop.
        checks = Checks()
        report = audit_conversations(Checker(checks, None, dedup=Dedup(checks)).run(iter_file(target)),
                                     near=NearDuplicateSettings())
        findings = (scan_conversations(item for item in iter_file(target) if isinstance(item, Conversation))
                    if secrets else None)
    else:
        raise CorpusError("no such file or directory", file=where)
    if findings is not None:
        report["secrets"] = _secrets_section(findings)
    return report


def _secrets_section(findings: list[Finding]) -> dict[str, Any]:
    """Counts by kind and the first findings by row id and field, never the secret itself."""
    by_kind: dict[str, int] = {}
    for finding in findings:
        by_kind[finding.kind] = by_kind.get(finding.kind, 0) + 1
    return {"findings": len(findings), "by_kind": dict(sorted(by_kind.items())),
            "examples": [str(finding) for finding in findings[:SECRET_EXAMPLES]]}
