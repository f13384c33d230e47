"""The audit stage: statistics of what was written (a built corpus), or of a raw source file or dump.

It reads files, never the pipeline's memory, with the same statistics the build computes while writing
(``stats``); ``report`` is the table people read. ``audit_against`` compares a built corpus with
serving traffic (``traffic``, on the polars engine of ``frames``/``inputs``/``profile`` and the token
measures of ``token_pass``); ``write_html_report`` writes the self-contained report (``html``). The
comparison's modules, polars and plotly load only when one of those is called. ``audited`` keeps the corpus
it audited open for a comparison (``CorpusFiles``: recipe, drops and renderer read once for both).
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CorpusError, DropCounts, Skipped
from ..layout import LEDGER, Corpus
from ..outputs import check_output_path
from ..recipe.model import Checks, NearDuplicateSettings
from ..records import Conversation
from ..rows import batch_to_conversations, conversations_to_batch
from ..screen.checks import Checker
from ..screen.dedup import Dedup
from ..screen.ids import UniqueIds
from ..screen.near_dedup import NearDuplicates
from ..screen.normalise import conversation_text
from ..screen.stream import outcomes, screened_in_order
from ..secrets import Finding, scan_conversations, scan_corpus
from ..stats.corpus import AuditReport, CorpusStats, SecretsReport, corpus_problems
from ..stats.pack import pack_mix, stratum
from ..stats.tokens import TokenStats
from ..tokens import TemplateRenderer, TokenSettings, TurnTokens
from ..tokens.settings import read_corpus_recipe
from .options import AuditOptions, check_ray_engine
from .report import format_report

__all__ = ["AuditOptions", "AuditOutcome", "CorpusFiles", "audit_against", "audit_conversations", "audit_corpus",
           "audit_corpus_files", "audit_inputs", "audited", "check_corpus", "corpus_problems", "describe_corpus",
           "divergence_problems", "format_comparison", "format_report", "opened_corpus", "write_html_report"]

# The comparison's names, loaded on first use: they import polars (and plotly, for the page).
_TRAFFIC_API = {"audit_against": "traffic", "describe_corpus": "traffic",
                "divergence_problems": "traffic", "format_comparison": "traffic", "write_html_report": "html"}

SECRET_EXAMPLES = 20
FLAG_REPEATED_SOURCE_ID = "repeated_source_id"  # raw audits: a row whose own id an earlier row had
HUB_PREFIX = "hf://"

if TYPE_CHECKING:
    from ..report import PageSection
    from .html import write_html_report
    from .traffic import audit_against, describe_corpus, divergence_problems, format_comparison


def __getattr__(name: str) -> Any:
    module = _TRAFFIC_API.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def audit_conversations(items: Iterable[Conversation | Skipped], batch_size: int = 4096,
                        near: NearDuplicateSettings | None = None) -> AuditReport:
    """Audit a stream (e.g. a raw source file read by the source readers). Rows whose own id (``source_id``)
    an earlier row had are counted in ``flags``; with ``near``, the rows that near-duplicate an earlier one
    are counted (``near_duplicates``), not dropped."""
    auditor = CorpusStats()
    skipped = DropCounts()
    index = NearDuplicates(near.threshold, num_perm=near.num_perm, shingle=near.shingle) if near else None
    near_by_source: Counter[str] = Counter()
    # Hashes of the dump's own row ids seen: a repeated id (a chat cut into chunks, a row logged twice) is
    # counted as a flag (overall only: a raw row's flags by source are the repairs'). A dict of ints, not a
    # set: the garbage collector does not walk it.
    source_ids: dict[int, None] = {}

    def add(batch: list[Conversation]) -> None:
        auditor.add_rows(batch, conversations_to_batch(batch))
        for row in batch:
            source_id = row.provenance.source_id
            if source_id is not None:
                key = hash((row.source, source_id))
                if key in source_ids:
                    auditor.flags[FLAG_REPEATED_SOURCE_ID] += 1
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
    if near is not None:
        report["near_duplicates"] = {"threshold": near.threshold, "rows": sum(near_by_source.values()),
                                     "by_source": dict(sorted(near_by_source.items()))}
    return report


class CorpusFiles:
    """A built corpus and what both its audit and its comparison with traffic read from it, each read once
    and only when first needed: the parsed recipe.yaml, the drops, the target's token settings and renderer."""

    def __init__(self, corpus: Corpus) -> None:
        self.corpus = corpus

    @cached_property
    def recipe(self) -> Any:
        """recipe.yaml as parsed, whatever its shape (None: the corpus has none)."""
        return read_corpus_recipe(self.corpus)

    @cached_property
    def drops(self) -> DropCounts:
        """Drops by reason and source: the ledger's, or audit.json's where a published copy has no ledger."""
        return self.corpus.ledger_drops()

    @property
    def has_ledger(self) -> bool:
        return (self.corpus.root / LEDGER).exists()

    @cached_property
    def token_settings(self) -> TokenSettings | None:
        """The recipe's target tokenizer and template options, or None when its tokenizer is not at hand."""
        return TokenSettings.from_corpus_recipe(self.corpus, self.recipe)

    @cached_property
    def renderer(self) -> TemplateRenderer | None:
        """The renderer of ``token_settings``: one tokenizer load and one twin check for every pass."""
        return self.token_settings.renderer() if self.token_settings is not None else None

    def renderer_for(self, tokenizer: Path | None) -> TemplateRenderer | None:
        """The recipe's renderer, or one of ``tokenizer`` (a user's override) with the recipe's options."""
        if tokenizer is None:
            return self.renderer
        settings = TokenSettings.from_corpus_recipe(self.corpus, self.recipe, tokenizer)
        return settings.renderer() if settings is not None else None


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


def is_hub_path(where: str | Path) -> bool:
    return str(where).startswith(HUB_PREFIX)


@contextmanager
def opened_corpus(where: str | Path, endpoint: str | None = None) -> Iterator[Corpus]:
    """A built corpus directory, or ``hf://datasets/ORG/NAME`` downloaded for the duration."""
    if is_hub_path(where):
        from ..hub import download_corpus

        with download_corpus(str(where), endpoint=endpoint) as local:
            yield Corpus.open(local)
        return
    yield Corpus.open(Path(where))


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
    comparison: dict[str, Any] | None
    problems: list[str]
    against: str | None = None
    html: Path | None = None

    def to_json(self) -> dict[str, Any] | AuditReport:
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
