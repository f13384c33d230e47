"""The audit stage: statistics of what was written (a built corpus), or of a raw source file or dump.

It reads files, never the pipeline's memory, with the same statistics the build computes while writing
(``build.stats``); ``report`` is the table people read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..build.stats import CorpusStats, corpus_problems
from ..build.token_stats import TokenStats
from ..errors import CorpusError, Skipped
from ..layout import Corpus
from ..records import Conversation
from ..rows import batch_to_conversations, conversations_to_batch
from ..secrets import Finding, scan_conversations, scan_corpus
from ..tokens import TokenRows, TokenSettings
from .report import format_report

__all__ = ["audit", "audit_conversations", "audit_corpus", "corpus_problems", "format_report"]

SECRET_EXAMPLES = 20


def audit_conversations(items: Iterable[Conversation | Skipped], batch_size: int = 4096) -> dict[str, Any]:
    """Audit a stream (e.g. a raw source file read by the source readers)."""
    auditor = CorpusStats()
    skipped: Counter[str] = Counter()
    batch: list[Conversation] = []
    for item in items:
        if isinstance(item, Skipped):
            skipped[item.reason] += 1
            continue
        batch.append(item)
        if len(batch) >= batch_size:
            auditor.add_rows(batch, conversations_to_batch(batch))
            batch = []
    if batch:
        auditor.add_rows(batch, conversations_to_batch(batch))
    auditor.add_skipped(dict(skipped))
    return auditor.report()


def audit_corpus(corpus: Corpus) -> dict[str, Any]:
    """Audit a corpus from its files: the shards its manifest lists, plus the ledger; token statistics when
    the target's tokenizer named by its recipe is at hand."""
    settings = TokenSettings.from_corpus(corpus)
    tokens = TokenStats(settings, TokenRows(settings.renderer())) if settings is not None else None
    auditor = CorpusStats(tokens=tokens)
    for batch in corpus.iter_batches():
        auditor.add_rows(batch_to_conversations(batch) if tokens is not None else [], batch)
    auditor.add_skipped(corpus.ledger_counts())
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

        report = audit_conversations(iter_file(target))
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
