"""The audit's statistics (``stats``, the build's own) of a built corpus from its files, of a raw source file or dump
read by the source readers, or of a stream of rows; ``check_corpus`` is `corpus audit`: those statistics, the
comparison with traffic (``traffic``, loaded only when asked for: it imports polars) and the checks that fail."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import CorpusError, DropCounts, Skipped
from ..layout import Corpus
from ..outputs import check_output_path
from ..recipe.model import Checks, NearDuplicateSettings
from ..records import Conversation
from ..rows import batch_to_conversations, conversations_to_batch
from ..screen.checks import Checker
from ..screen.dedup import Dedup
from ..screen.ids import UniqueIds
from ..screen.near_dedup import FirstSeen, NearDuplicates
from ..screen.normalise import conversation_text
from ..screen.stream import outcomes, screened_in_order
from ..secrets import Finding, scan_conversations, scan_corpus
from ..stats.corpus import AuditReport, CorpusStats, SecretsReport, corpus_problems
from ..stats.pack import pack_mix, stratum
from ..stats.tokens import TokenStats
from ..tokens import TokenSettings, TurnTokens
from .files import CorpusFiles, is_hub_path, opened_corpus
from .options import AuditOptions, check_ray_engine
from .report import format_report

if TYPE_CHECKING:
    from ..report import PageSection
    from .comparison import AuditedComparison, Comparison

SECRET_EXAMPLES = 20
FLAG_REPEATED_SOURCE_ID = "repeated_source_id"  # raw audits: a row whose own id an earlier row had


def audit_conversations(items: Iterable[Conversation | Skipped], batch_size: int = 4096,
                        near: NearDuplicateSettings | None = None) -> AuditReport:
    """Audit a stream (e.g. a raw source file read by the source readers). Rows whose own id (``source_id``)
    an earlier row had are counted in ``flags``; with ``near``, the rows that near-duplicate an earlier one
    are counted (``near_duplicates``), not dropped."""
    auditor = CorpusStats()
    skipped = DropCounts()
    index = NearDuplicates(near.threshold, num_perm=near.num_perm, shingle=near.shingle) if near else None
    near_by_source: Counter[str] = Counter()
    # The 64-bit hashes of the dump's own row ids seen (8 bytes an id, as ``screen.ids`` keeps its ids): a
    # repeated id (a chat cut into chunks, a row logged twice) is counted as a flag (overall only: a raw row's
    # flags by source are the repairs').
    source_ids = FirstSeen(whole_hashes=True, rows=False)

    def add(batch: list[Conversation]) -> None:
        auditor.add_rows(batch, conversations_to_batch(batch))
        keys = np.fromiter((hash((row.source, row.provenance.source_id)) for row in batch
                            if row.provenance.source_id is not None), dtype=np.int64).view(np.uint64)
        new = keys[source_ids.find(keys) < 0]
        first_of_new = np.unique(new, return_index=True)[1]
        if repeated := len(keys) - len(first_of_new):
            auditor.flags[FLAG_REPEATED_SOURCE_ID] += repeated
        source_ids.add_absent(new[first_of_new])
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
    if near is not None:
        report["near_duplicates"] = {"threshold": near.threshold, "rows": sum(near_by_source.values()),
                                     "by_source": dict(sorted(near_by_source.items()))}
    return report


def audit_corpus_files(corpus: Corpus | CorpusFiles) -> AuditReport:
    """Audit a corpus from its files: the shards its manifest lists, plus the ledger; token statistics when
    the target's tokenizer named by its recipe is at hand."""
    files = corpus if isinstance(corpus, CorpusFiles) else CorpusFiles(corpus)
    settings, renderer = files.token_settings, files.renderer
    tokens = TokenStats(settings, TurnTokens(renderer)) if settings is not None and renderer is not None else None
    auditor = CorpusStats(tokens=tokens)
    for batch in files.corpus.iter_batches():
        auditor.add_rows(batch_to_conversations(batch) if tokens is not None else [], batch)
    auditor.add_skipped(files.drops)
    report = auditor.report()
    if files.corpus.manifest.pack_files:
        report["eval_pack"] = pack_mix(Counter(map(stratum, files.corpus.pack_conversations())), report)
    return report


def audit_corpus(path: str | Path, *, endpoint: str | None = None, secrets: bool = True) -> AuditReport:
    """Statistics of a built corpus directory, a raw source file, or ``hf://datasets/ORG/NAME`` (downloaded
    first). With ``secrets`` a local corpus or file is also scanned for credentials (``report["secrets"]``;
    a published corpus passed that scan at publish)."""
    with audited(path, endpoint=endpoint, secrets=secrets) as (report, _):
        return report


@contextmanager
def audited(path: str | Path, *, endpoint: str | None = None, secrets: bool = True
            ) -> Iterator[tuple[AuditReport, CorpusFiles | None]]:
    """``audit_corpus``'s report, with the built corpus it read (None for a raw file) kept open, downloaded for
    hf://, for the duration: a comparison with traffic then reuses its download, recipe, drops and renderer."""
    where = str(path)
    target = Path(where)
    if is_hub_path(where) or target.is_dir():
        with opened_corpus(where, endpoint) as corpus:
            files = CorpusFiles(corpus)
            report = audit_corpus_files(files)
            if secrets and not is_hub_path(where):
                report["secrets"] = _secrets_section(scan_corpus(target))
            yield report, files
        return
    if not target.exists():
        raise CorpusError("no such file or directory", file=where)
    from ..sources import iter_file

    # The row checks of a build with the recipe defaults (unclosed think blocks, exact duplicates): a raw
    # dump's audit and a default build of it agree on every count. Near duplicates are counted besides:
    # what checks.near_duplicates (off by default) would drop.
    checks = Checks()
    dedup = Dedup(checks)
    judged = screened_in_order(iter_file(target), Checker(checks, None, dedup=dedup),
                               [UniqueIds().judge, dedup.judge_batch])
    report = audit_conversations(outcomes(judged), near=NearDuplicateSettings())
    if secrets:
        report["secrets"] = _secrets_section(
            scan_conversations(item for item in iter_file(target) if isinstance(item, Conversation)))
    yield report, None


@dataclass(frozen=True)
class AuditOutcome:
    """What ``corpus audit`` finds: the corpus's statistics, the comparison (with traffic; or the corpus side alone
    when only the page was asked for), and the checks that failed (the CLI's exit 1)."""

    report: AuditReport
    comparison: Comparison | None
    problems: list[str]
    against: str | None = None
    html: Path | None = None

    def to_json(self) -> AuditedComparison | AuditReport:
        """``corpus audit --json``: the comparison with the statistics under ``audit``, or the statistics."""
        if self.against is not None and self.comparison is not None:
            return {**self.comparison, "audit": self.report}
        return self.report

    def describe(self) -> str:
        """The tables ``corpus audit`` prints."""
        text = format_report(self.report)
        if self.against is not None and self.comparison is not None:
            from .traffic import format_comparison

            text += "\n\n" + format_comparison(self.comparison)
        return text


def check_corpus(path: str | Path, *, against: str | None = None, html: str | Path | None = None,
                 options: AuditOptions | None = None, min_thinking_share: float | None = None,
                 max_divergence: float | None = None, allow_skipped: bool = False, secrets: bool = True,
                 sections: Sequence[PageSection] = ()) -> AuditOutcome:
    """``corpus audit``: the statistics of ``path`` (a built corpus, a raw file or ``hf://datasets/ORG/NAME``),
    compared with the serving traffic ``against`` when given, with the checks that fail: a thinking share below
    ``min_thinking_share``, a secret found, a divergence past ``max_divergence`` (or too much unreadable traffic
    unless ``allow_skipped``). With ``html`` the self-contained page is written there, its path checked first:
    one that must not be written fails before anything is computed; ``sections`` (made by a later stage: the
    acceptance eval's) follow the audit's own, and their inputs are guarded as the audit's are."""
    options = options or AuditOptions()
    if max_divergence is not None and against is None:
        raise CorpusError("--max-divergence needs --against TRAFFIC")
    if options.engine == "ray":
        if against is None:
            raise CorpusError("--engine ray reads the traffic of a comparison: it needs --against TRAFFIC")
        check_ray_engine()
    page = check_output_path(html, what="--html", inputs=[*audit_inputs(path, against, options.tokenizer),
                                                          *(file for part in sections for file in part.inputs)]) \
        if html is not None else None
    # The corpus stays open (downloaded, for hf://) while it is compared: read once for both.
    with audited(path, endpoint=options.endpoint, secrets=secrets) as (report, files):
        problems = list(corpus_problems(report, min_thinking_share))
        comparison = None
        if against is not None or page is not None:
            from .traffic import audit_against, describe_corpus, divergence_problems

            compared = files if files is not None else path  # a raw file: the comparison refuses it by name
            comparison = audit_against(compared, against, options) if against is not None \
                else describe_corpus(compared, options)
            problems += divergence_problems(comparison, max_divergence, allow_skipped=allow_skipped)
    if page is not None and comparison is not None:
        from .html import write_html_report

        write_html_report(page, comparison, report, f"corpus audit {path}" +
                          (f" against {against}" if against is not None else ""), sections)
    return AuditOutcome(report, comparison, problems, against, page)


def audit_inputs(path: str | Path, traffic: str | None = None, tokenizer: Path | None = None) -> list[str | Path]:
    """The local paths an audit of ``path`` (against ``traffic``) reads, which nothing the same run writes may
    overwrite: the corpus or file, the traffic (a recipe's own sources too) and the tokenizer (the one given,
    else the corpus recipe's)."""
    inputs: list[str | Path] = [path]
    if traffic is not None:
        from .inputs import traffic_inputs

        inputs += traffic_inputs(traffic)
    if tokenizer is None and not is_hub_path(path) and Path(path).is_dir():
        settings = TokenSettings.from_corpus(Corpus.open(Path(path)))
        tokenizer = settings.tokenizer if settings is not None else None
    return inputs + ([tokenizer] if tokenizer is not None else [])


def _secrets_section(findings: list[Finding]) -> SecretsReport:
    """Counts by kind and the first findings by row id and field, never the secret itself."""
    by_kind: dict[str, int] = {}
    for finding in findings:
        by_kind[finding.kind] = by_kind.get(finding.kind, 0) + 1
    return {"findings": len(findings), "by_kind": dict(sorted(by_kind.items())),
            "examples": [str(finding) for finding in findings[:SECRET_EXAMPLES]]}
