"""Find credentials in corpus text before anything leaves the machine, and redact them at build time.

One compiled alternation covers every kind; a substring prefilter skips the regex for the (vast)
majority of texts that contain none of the literal prefixes. Findings name the row, the field and the
kind, never the secret itself: only its length is kept.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from .errors import Skipped
from .records import Conversation

# kind -> pattern. Each pattern starts with a literal that the prefilter looks for. Patterns require
# the lengths and alphabets real credentials have, so prose and code identifiers do not match.
_PATTERNS: dict[str, str] = {
    "hf_token": r"\bhf_[A-Za-z0-9]{30,}\b",
    "anthropic_key": r"\bsk-ant-[A-Za-z0-9_-]{32,}",
    "openai_key": r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{32,}",
    "stripe_key": r"\b[sr]k_(?:live|test)_[A-Za-z0-9]{24,}\b",
    "aws_access_key": r"\b(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b",
    "aws_secret_key": r"(?i:aws_secret_access_key)[\"']?\s*[:=]\s*[\"']?[A-Za-z0-9/+=]{40}(?![A-Za-z0-9/+=])",
    "github_token": r"\bgh[pousr]_[A-Za-z0-9]{36,}\b",
    "github_pat": r"\bgithub_pat_[A-Za-z0-9_]{50,}\b",
    "gitlab_token": r"\bglpat-[A-Za-z0-9_-]{20,}",
    "private_key": r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----",
    "jwt": r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{16,}",
    "slack_token": r"\bxox[abposr]-[A-Za-z0-9-]{10,}",
    "slack_webhook": r"https://hooks\.slack\.com/services/T[A-Za-z0-9_]+/B[A-Za-z0-9_]+/[A-Za-z0-9_]{16,}",
    "google_api_key": r"\bAIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])",
    "npm_token": r"\bnpm_[A-Za-z0-9]{36}\b",
    "pypi_token": r"\bpypi-AgE[A-Za-z0-9_-]{50,}",
}
_PREFIXES = ("hf_", "sk-", "k_live_", "k_test_", "AKIA", "ASIA", "ABIA", "ACCA", "ecret_access_key",
             "ECRET_ACCESS_KEY",
             "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "PRIVATE KEY", "eyJ", "xox",
             "hooks.slack.com", "AIza", "npm_", "pypi-")
_SECRET_RE = re.compile("|".join(f"(?P<{kind}>{pattern})" for kind, pattern in _PATTERNS.items()))
KINDS: tuple[str, ...] = tuple(_PATTERNS)


@dataclass(frozen=True, slots=True)
class Finding:
    """One secret: where it is and what kind, with its length as the only trace of its value."""

    row_id: str  # a row id, or a file name for metadata files
    field: str  # e.g. messages[2].reasoning, provenance.generation.turns[0].endpoint
    kind: str
    length: int
    offset: int  # character offset inside the field

    def __str__(self) -> str:
        return f"{self.row_id} {self.field}: {self.kind} ({self.length} chars at offset {self.offset})"


def _may_contain_secret(text: str) -> bool:
    return any(prefix in text for prefix in _PREFIXES)


def find_secrets(text: str) -> Iterator[tuple[str, int, int]]:
    """(kind, offset, length) for every secret in ``text``."""
    if not _may_contain_secret(text):
        return
    for match in _SECRET_RE.finditer(text):
        kind = match.lastgroup or "secret"
        yield kind, match.start(), match.end() - match.start()


def redact(text: str) -> str:
    """Replace every secret with ``[REDACTED:kind]``; text without one is returned unchanged."""
    if not _may_contain_secret(text):
        return text
    return _SECRET_RE.sub(lambda m: f"[REDACTED:{m.lastgroup}]", text)


def scan_text(text: str, where: str, field: str = "text") -> list[Finding]:
    """Findings in one text, e.g. a metadata file about to be uploaded."""
    return [Finding(where, field, kind, length, offset) for kind, offset, length in find_secrets(text)]


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """Every string inside a JSON-like value, keys included, with its field path."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield f"{path}.{key}[key]", str(key)
            yield from _strings(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _strings(item, f"{path}[{index}]")


def _row_texts(row: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for name in ("source", "task", "license"):
        if isinstance(row.get(name), str):
            yield name, row[name]
    for index, message in enumerate(row.get("messages") or ()):
        for name in ("content", "reasoning"):
            text = message.get(name)
            if isinstance(text, str):
                yield f"messages[{index}].{name}", text
    provenance = row.get("provenance")
    if isinstance(provenance, str | bytes):
        text = provenance if isinstance(provenance, str) else provenance.decode(errors="replace")
        if not _may_contain_secret(text):
            return  # the common case, decided on the raw JSON without walking its token-id arrays
        # Decoded so that field paths point inside it; a string that is not JSON is scanned whole.
        try:
            provenance = orjson.loads(provenance)
        except orjson.JSONDecodeError:
            yield "provenance", text
            return
    yield from _strings(provenance, "provenance")


def scan_row(row: dict[str, Any]) -> list[Finding]:
    """Findings in one row dict (the on-disk shape; provenance as a JSON string or an object)."""
    row_id = str(row.get("id"))
    return [Finding(row_id, field, kind, length, offset)
            for field, text in _row_texts(row)
            for kind, offset, length in find_secrets(text)]


def scan_conversations(rows: Iterable[Conversation | dict[str, Any]]) -> list[Finding]:
    """Findings in a stream of Conversation objects or row dicts, in stream order."""
    findings: list[Finding] = []
    for row in rows:
        findings.extend(scan_row(row.to_row() if isinstance(row, Conversation) else row))
    return findings


def iter_corpus_rows(corpus_dir: Path, batch_size: int = 2048) -> Iterator[tuple[str, dict[str, Any]]]:
    """(shard path, row dict) for every row of every parquet shard under ``data/``."""
    import pyarrow.parquet as pq

    for shard in sorted((corpus_dir / "data").glob("*.parquet")):
        for batch in pq.ParquetFile(shard).iter_batches(batch_size=batch_size):
            for row in batch.to_pylist():
                yield f"data/{shard.name}", row


def scan_corpus(corpus_dir: Path) -> list[Finding]:
    """Findings in every shard row and in the metadata files a publish uploads."""
    corpus_dir = Path(corpus_dir)
    findings = scan_conversations(row for _, row in iter_corpus_rows(corpus_dir))
    for name in ("recipe.yaml", "manifest.json", "audit.json"):
        path = corpus_dir / name
        if path.is_file():
            findings.extend(scan_text(path.read_text(encoding="utf-8", errors="replace"), name))
    return findings


def redact_conversations(items: Iterable[Conversation | Skipped]) -> Iterator[Conversation | Skipped]:
    """The build's redaction step (checks.redact_secrets): secrets in turns become ``[REDACTED:kind]``.

    A row keeps its id (a hash: it reveals nothing); its dedup digest is recomputed from the redacted text."""
    for item in items:
        if isinstance(item, Conversation):
            for message in item.messages:
                redacted = redact(message.content)
                reasoning = redact(message.reasoning) if message.reasoning else message.reasoning
                if redacted != message.content or reasoning != message.reasoning:
                    message.content, message.reasoning = redacted, reasoning
                    item.digest = None
        yield item
