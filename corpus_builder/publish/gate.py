"""The publish gate: re-verify a built corpus from its files before anything is uploaded.

Nothing written by the build is trusted as a verdict: shard checksums, sizes and row counts are
recomputed, every row is validated against schemas/conversation.schema.json, the thinking share is
recounted from the turns themselves (not the ``thinking`` column, not audit.json) and every text field is
scanned for credentials. Every failing check is collected so one run lists them all.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import orjson

from ..errors import CorpusError
from ..layout import AUDIT, MANIFEST, RECIPE, Corpus, Manifest, open_parquet
from ..recipe.yaml_reader import read_corpus_recipe_file
from ..secrets import Finding, scan_metadata, scan_row
from ..stats import facts
from ..stats.corpus import CorpusFigures, corpus_problems

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schemas" / "conversation.schema.json"
SHARD_PATH_RE = re.compile(r"^data/[A-Za-z0-9_.-]+\.parquet$")
PACK_PATH_RE = re.compile(r"^eval/[A-Za-z0-9_.-]+\.parquet$")  # the eval pack's shards (manifest eval.files)
# A check with thousands of failing rows lists the first few and counts the rest.
MAX_LISTED_PER_CHECK = 20


class GateFailed(CorpusError):
    """The corpus failed one or more publish checks; ``failures`` lists every one (the CLI exits 1)."""

    exit_code = 1

    def __init__(self, corpus_dir: Path, failures: list[str]) -> None:
        self.failures = failures
        super().__init__(f"refusing to publish: {len(failures)} check failure(s)", file=str(corpus_dir),
                         details=failures)


def mapping(value: Any) -> dict[str, Any]:
    """``value`` when it is a mapping, else {}: the corpus's files may have been edited into any shape."""
    return value if isinstance(value, dict) else {}


def _is_share(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1


@dataclass(frozen=True, slots=True)
class CorpusDocuments:
    """The metadata files of a built corpus, parsed: what the card is rendered from."""

    root: Path
    manifest: Manifest
    audit: dict[str, Any]
    recipe: dict[str, Any]
    recipe_text: str

    @classmethod
    def load(cls, root: Path) -> CorpusDocuments:
        corpus = Corpus.open(Path(root))
        recipe_text, recipe = read_corpus_recipe_file(corpus.root / RECIPE)
        return cls(corpus.root, corpus.manifest, mapping(corpus.audit()), recipe, recipe_text)

    def setting(self, *keys: str) -> Any:
        """recipe[k1][k2]... when each step is a mapping, else None."""
        value: Any = self.recipe
        for key in keys:
            value = mapping(value).get(key)
        return value

    @property
    def min_thinking_share(self) -> float | None:
        """checks.min_thinking_share when it is a share (the gate fails a recipe whose value is not one)."""
        value = self.setting("checks", "min_thinking_share")
        return float(value) if _is_share(value) else None


@cache
def _row_validator() -> Any:
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema)


def _sample_int_arrays(value: Any) -> Any:
    """Long integer arrays (token ids) are type-checked here in one pass and validated as a one-item
    sample: jsonschema spends microseconds per item, which made a token-exact row cost ~25 ms."""
    if isinstance(value, dict):
        return {key: _sample_int_arrays(item) for key, item in value.items()}
    if isinstance(value, list):
        if len(value) > 8 and all(type(item) is int for item in value):
            return value[:1]
        return [_sample_int_arrays(item) for item in value]
    return value


@dataclass
class _Counts:
    conversations: int = 0
    thinking: int = 0

    def add(self, thinking: bool) -> None:
        self.conversations += 1
        self.thinking += thinking


@dataclass
class GateReport:
    """What the gate recomputed from the shards, and every failure it found."""

    documents: CorpusDocuments
    failures: list[str] = field(default_factory=list)
    overall: _Counts = field(default_factory=_Counts)
    by_split: dict[str, _Counts] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    @property
    def thinking_share(self) -> float:
        return self.overall.thinking / self.overall.conversations if self.overall.conversations else 0.0


class _CheckLog:
    """Failures of one check: the first few verbatim, the rest counted."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.lines: list[str] = []
        self.count = 0

    def add(self, line: str) -> None:
        self.count += 1
        if len(self.lines) < MAX_LISTED_PER_CHECK:
            self.lines.append(line)

    def render(self) -> list[str]:
        more = [f"{self.title}: ... and {self.count - len(self.lines)} more"] if self.count > len(self.lines) else []
        return [f"{self.title}: {line}" for line in self.lines] + more


def _check_rows(corpus: Corpus, report: GateReport) -> list[_CheckLog]:
    """One pass over every row: schema, split, thinking flag, duplicate ids, secrets."""
    validator = _row_validator()
    schema_log, consistency_log = _CheckLog("schema"), _CheckLog("rows")
    seen_ids: set[str] = set()
    for entry in corpus.files:
        path = corpus.root / entry.path
        if not SHARD_PATH_RE.match(entry.path) or not path.is_file():
            continue  # reported by the file checks
        try:
            batches = open_parquet(path).iter_batches(batch_size=2048)
            rows = (row for batch in batches for row in batch.to_pylist())
            for index, row in enumerate(rows):
                where = f"{entry.path}#{index} (id {row.get('id')})"
                document = dict(row)
                try:
                    provenance = orjson.loads(row["provenance"]) if row.get("provenance") else None
                    document["provenance"] = _sample_int_arrays(provenance)
                except orjson.JSONDecodeError:
                    schema_log.add(f"{where}: provenance is not valid JSON")
                    continue
                try:
                    if isinstance(row.get("tools"), str):
                        document["tools"] = orjson.loads(row["tools"])
                except orjson.JSONDecodeError:
                    schema_log.add(f"{where}: tools is not valid JSON")
                    continue
                error = next(iter(validator.iter_errors(document)), None)
                if error is not None:
                    location = "/".join(str(p) for p in error.absolute_path) or "(row)"
                    schema_log.add(f"{where}: {location}: {error.message[:200]}")
                    continue
                thinking = facts.thinking(row["messages"])
                if row["thinking"] != thinking:
                    consistency_log.add(f"{where}: thinking column says {row['thinking']}, turns say {thinking}")
                if row["split"] != entry.split:
                    consistency_log.add(f"{where}: split {row['split']!r} in a {entry.split!r} shard")
                if row["id"] in seen_ids:
                    consistency_log.add(f"{where}: duplicate id")
                seen_ids.add(row["id"])
                report.overall.add(thinking)
                report.by_split.setdefault(entry.split, _Counts()).add(thinking)
                report.findings.extend(scan_row(row))
        except (OSError, ValueError) as error:
            consistency_log.add(f"{entry.path}: cannot read shard: {error}")
    return [schema_log, consistency_log]


def check_corpus(corpus_dir: Path) -> GateReport:
    """Run every publish check; a corpus that cannot be opened at all raises CorpusError."""
    documents = CorpusDocuments.load(Path(corpus_dir))
    corpus = Corpus(documents.root, documents.manifest)
    report = GateReport(documents)

    files_log = _CheckLog("files")
    for entry in corpus.files:
        if not SHARD_PATH_RE.match(entry.path):
            files_log.add(f"{entry.path!r}: manifest path is not data/<name>.parquet")
    for entry in documents.manifest.pack_files:
        if not PACK_PATH_RE.match(entry.path):
            files_log.add(f"{entry.path!r}: manifest path is not eval/<name>.parquet")
    if not files_log.count:
        for problem in corpus.verify_files():
            files_log.add(problem)
    logs = [files_log, *_check_rows(corpus, report)]

    manifest_log = _CheckLog("manifest")
    rows_by_split = Counter({split: counts.conversations for split, counts in report.by_split.items()})
    for split, declared in documents.manifest.splits.items():
        if declared.rows != rows_by_split.get(split, 0):
            manifest_log.add(f"split {split!r} declares {declared.rows} rows, shards have "
                             f"{rows_by_split.get(split, 0)}")
    if documents.manifest.conversations != report.overall.conversations:
        manifest_log.add(f"declares {documents.manifest.conversations} conversations, shards have "
                         f"{report.overall.conversations}")
    logs.append(manifest_log)

    # The card is rendered from audit.json, so a stale or edited audit would publish wrong numbers.
    audit_log = _CheckLog("audit.json")
    for key, actual in (("conversations", report.overall.conversations),
                        ("thinking_conversations", report.overall.thinking)):
        if documents.audit.get(key) != actual:
            audit_log.add(f"{key} is {documents.audit.get(key)}, shards have {actual} (re-run the build)")
    logs.append(audit_log)

    share_log = _CheckLog("thinking share")
    written_minimum = documents.setting("checks", "min_thinking_share")
    if written_minimum is not None and documents.min_thinking_share is None:
        share_log.add(f"{RECIPE}: checks.min_thinking_share is {written_minimum!r}, not a share from 0 to 1")
    counts: CorpusFigures = {"thinking_share": report.thinking_share, "thinking_conversations": report.overall.thinking,
                             "conversations": report.overall.conversations}
    for problem in corpus_problems(counts, documents.min_thinking_share):
        share_log.add(problem)
    logs.append(share_log)

    for name, text in ((RECIPE, documents.recipe_text), (MANIFEST, orjson.dumps(documents.manifest.to_json()).decode()),
                       (AUDIT, orjson.dumps(documents.audit).decode())):
        report.findings.extend(scan_metadata(text, name))
    secrets_log = _CheckLog("secrets")
    for finding in report.findings:
        secrets_log.add(str(finding))
    logs.append(secrets_log)

    report.failures = [line for log in logs for line in log.render()]
    return report


def require_gate(corpus_dir: Path) -> GateReport:
    """The gate report of a corpus that passes every check; GateFailed listing every failure otherwise."""
    report = check_corpus(corpus_dir)
    if report.failures:
        raise GateFailed(report.documents.root, report.failures)
    return report
