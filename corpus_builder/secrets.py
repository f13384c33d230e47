"""Find credentials in corpus text before anything leaves the machine, and redact them at build time.

One compiled alternation covers every kind; a substring prefilter skips the regex for the (vast)
majority of texts that contain none of the literal prefixes. Findings name the row, the field and the
kind, never the secret itself: only its length is kept.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from .errors import Skipped, scrub_url_credentials
from .layout import AUDIT, DATA, MANIFEST, RECIPE, open_parquet
from .records import Conversation, Provenance

# A run of base64 as keys are written: chunks of the base64 alphabet separated by line breaks, real or
# escaped (``\n`` inside a JSON or code string, possibly closing one quoted line of code and opening the
# next), with indentation, or by spaces before a long chunk (a key pasted into a box that joined its lines).
# A blank line ends the run, so the text after a truncated key stays.
_NEWLINE = r"(?:\r?\n|\\(?:r\\)?n(?:[\"',+ \t]*\r?\n)?)"
_LINE_BREAK = rf"[ \t]*{_NEWLINE}[ \t\"']*"
_CHUNK_GAP = rf"(?:{_LINE_BREAK}|[ \t]+(?=[A-Za-z0-9+/]{{16}}))"
_BASE64_RUN = rf"[A-Za-z0-9+/=]+(?:{_CHUNK_GAP}[A-Za-z0-9+/=]+)*"
_PEM_LABEL = r"(?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?"
# A PEM block whole: BEGIN, the encapsulated headers of encrypted and PGP keys (``Proc-Type: 4,ENCRYPTED``,
# ``Version: ...``, then a blank line), the base64 body and END; a block cut short ends with its base64 run.
_PEM_PRIVATE_KEY = (rf"-----BEGIN {_PEM_LABEL}-----"
                    rf"(?:(?:{_LINE_BREAK}[A-Za-z][A-Za-z-]*: [^\r\n\\]*)+(?:{_LINE_BREAK}(?={_LINE_BREAK}))?)?"
                    rf"(?:{_CHUNK_GAP}{_BASE64_RUN})?"
                    rf"(?:(?:{_LINE_BREAK}|[ \t]*)-----END {_PEM_LABEL}-----)?")

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
    "private_key": _PEM_PRIVATE_KEY,
    # A key body without its PEM lines: base64 DER whose first bytes are a private key's structure
    # (checked by _is_der_private_key: a certificate or a public key starts the same way), ...
    "der_private_key": rf"(?<![A-Za-z0-9+/])M[CEHI][A-Za-z0-9+/]{{38,}}={{0,2}}(?:{_CHUNK_GAP}[A-Za-z0-9+/=]+)*",
    # ... or OpenSSH's private key format, whose base64 always starts with "openssh-key-v1".
    "openssh_private_key": rf"(?<![A-Za-z0-9+/])b3BlbnNzaC1rZXktdjE{_BASE64_RUN}",
    "jwt": r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{16,}",
    "slack_token": r"\bxox[abposr]-[A-Za-z0-9-]{10,}",
    "slack_webhook": r"https://hooks\.slack\.com/services/T[A-Za-z0-9_]+/B[A-Za-z0-9_]+/[A-Za-z0-9_]{16,}",
    "google_api_key": r"\bAIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])",
    "npm_token": r"\bnpm_[A-Za-z0-9]{36}\b",
    "pypi_token": r"\bpypi-AgE[A-Za-z0-9_-]{50,}",
    # user:password in a URL (the span is the pair, so redaction keeps scheme and host; brackets never occur
    # in userinfo, so the redacted form is not found again). A password that is a template placeholder
    # (${DB_PASSWORD}, %s, <password>, ***, ..., "password", xxxx) holds no credential.
    "url_credentials": r"(?<=://)[^\s/?#@:\"'<>\[\]]+:(?![$%*.…]|(?i:password|passwd|x+|changeme)@)"
                       r"[^\s/?#@\"'<>{}\[\]]+(?=@)",
}
_PREFIXES = ("hf_", "sk-", "k_live_", "k_test_", "AKIA", "ASIA", "ABIA", "ACCA", "ecret_access_key",
             "ECRET_ACCESS_KEY",
             "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "PRIVATE KEY", "MC", "ME", "MH",
             "MI", "b3BlbnNzaC1rZXktdjE", "eyJ", "xox", "hooks.slack.com", "AIza", "npm_", "pypi-", "://")
# Where a secret can start: the first character of one of the patterns above, or right after "://". Tested
# before the alternation, it halves the time of a scan (the engine would try every pattern at every position).
_SECRET_START = r"(?=[-AMabeghnprsx]|(?<=://))"
_SECRET_RE = re.compile(
    _SECRET_START + "(?:" + "|".join(f"(?P<{kind}>{pattern})" for kind, pattern in _PATTERNS.items()) + ")")
KINDS: tuple[str, ...] = tuple(_PATTERNS)

_DER_SEQUENCE = 0x30
# After the outer SEQUENCE, a private key starts with INTEGER 0 or 1 (its version), then the modulus
# (PKCS#1 RSA, DSA: INTEGER), the algorithm (PKCS#8: SEQUENCE) or the key itself (SEC1 EC: OCTET STRING).
_DER_VERSIONS = (b"\x02\x01\x00", b"\x02\x01\x01")
_DER_AFTER_VERSION = (b"\x02", b"\x30", b"\x04")
# An encrypted PKCS#8 key starts with its algorithm, a SEQUENCE holding a password-based encryption OID
# (PKCS#5 1.2.840.113549.1.5.*, PKCS#12 1.2.840.113549.1.12.1.*). Certificates and public keys start with
# a SEQUENCE too, but never with a version or these OIDs.
_DER_PBE_OIDS = (b"\x06\x09\x2a\x86\x48\x86\xf7\x0d\x01\x05", b"\x06\x0a\x2a\x86\x48\x86\xf7\x0d\x01\x0c\x01")


def _der_content(der: bytes) -> bytes:
    """What follows the tag and length of the DER element at the start of ``der`` (b"" when malformed)."""
    if len(der) < 2:
        return b""
    length_byte = der[1]
    if length_byte < 0x80:
        return der[2:]
    length_bytes = length_byte - 0x80
    return der[2 + length_bytes:] if 1 <= length_bytes <= 3 else b""


def _is_der_private_key(text: str) -> bool:
    """Whether base64 ``text`` (at least 24 characters) decodes to the start of a DER private key."""
    try:
        head = base64.b64decode(text[:24], validate=True)  # 18 bytes: the structure up to the version or OID
    except binascii.Error:
        return False
    if head[0] != _DER_SEQUENCE:
        return False
    content = _der_content(head)
    if content[:3] in _DER_VERSIONS:
        return content[3:4] in _DER_AFTER_VERSION
    return content[:1] == bytes([_DER_SEQUENCE]) and _der_content(content).startswith(_DER_PBE_OIDS)


# Kinds whose pattern only finds candidates: the match counts when its check agrees.
_CONFIRM: dict[str, Callable[[str], bool]] = {"der_private_key": _is_der_private_key}


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
    """(kind, offset, length) for every secret in ``text``, in order; a multi-line secret is one finding."""
    if not _may_contain_secret(text):
        return
    for match in _SECRET_RE.finditer(text):
        kind = match.lastgroup or "secret"
        confirm = _CONFIRM.get(kind)
        if confirm is None or confirm(match.group()):
            yield kind, match.start(), match.end() - match.start()


def redact(text: str) -> str:
    """Replace every secret with ``[REDACTED:kind]``; text without one is returned unchanged."""
    pieces: list[str] = []
    end = 0
    for kind, offset, length in find_secrets(text):
        pieces += [text[end:offset], f"[REDACTED:{kind}]"]
        end = offset + length
    return "".join([*pieces, text[end:]]) if pieces else text


def scrub_message(text: str) -> str:
    """A message for a person (an error, a recipe problem): no URL userinfo at all, no secret of any kind."""
    return redact(scrub_url_credentials(text))


def map_strings(transform: Callable[[str], str], value: Any) -> Any:
    """A copy of a JSON-like value with ``transform`` applied to every string inside it; the keys of its
    objects are kept as they are."""
    if isinstance(value, str):
        return transform(value)
    if isinstance(value, dict):
        return {key: map_strings(transform, item) for key, item in value.items()}
    if isinstance(value, list):
        return [map_strings(transform, item) for item in value]
    return value


def redact_value(value: Any) -> Any:
    """``redact`` applied to every string inside a JSON-like value (keys are ours, not the input's)."""
    return map_strings(redact, value)


def scan_text(text: str, where: str, field: str = "text") -> list[Finding]:
    """Findings in one text, e.g. a metadata file about to be uploaded."""
    return [Finding(where, field, kind, length, offset) for kind, offset, length in find_secrets(text)]


def scan_metadata(text: str, name: str) -> list[Finding]:
    """Findings in a metadata file of a corpus (recipe.yaml, manifest.json, audit.json) as it is published:
    the upload removes the userinfo of URLs (an endpoint's login), so that is not a finding here."""
    return scan_text(scrub_url_credentials(text), name)


def _strings(value: object, path: str) -> Iterator[tuple[str, str]]:
    """Every string inside a JSON-like value, keys included, with its field path (a key that is a secret is
    named redacted there: the path is shown with the finding)."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            name = redact(str(key))
            yield f"{path}.{name}[key]", str(key)
            yield from _strings(item, f"{path}.{name}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _strings(item, f"{path}[{index}]")


def _row_texts(row: Mapping[str, object]) -> Iterator[tuple[str, str]]:
    for name in ("source", "task", "license"):
        text = row.get(name)
        if isinstance(text, str):
            yield name, text
    for index, message in enumerate(_objects(row.get("messages"))):
        for name in ("content", "reasoning"):
            text = message.get(name)
            if isinstance(text, str):
                yield f"messages[{index}].{name}", text
        for number, call in enumerate(_objects(message.get("tool_calls"))):
            for name in ("name", "arguments"):
                text = call.get(name)
                if isinstance(text, str):
                    yield f"messages[{index}].tool_calls[{number}].{name}", text
    tools = row.get("tools")
    if isinstance(tools, str):
        yield "tools", tools
    elif tools is not None:
        yield from _strings(tools, "tools")
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


def _objects(value: object) -> list[dict[str, object]]:
    """The JSON objects of a list (a row's turns, a turn's calls); nothing from a value of another shape."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def scan_row(row: Mapping[str, object]) -> list[Finding]:
    """Findings in one row dict (the on-disk shape; provenance as a JSON string or an object)."""
    row_id = str(row.get("id"))
    return [Finding(row_id, field, kind, length, offset)
            for field, text in _row_texts(row)
            for kind, offset, length in find_secrets(text)]


def scan_conversations(rows: Iterable[Conversation | Mapping[str, object]]) -> list[Finding]:
    """Findings in a stream of Conversation objects or row dicts, in stream order."""
    findings: list[Finding] = []
    for row in rows:
        findings.extend(scan_row(row.to_row() if isinstance(row, Conversation) else row))
    return findings


def iter_corpus_rows(corpus_dir: Path, batch_size: int = 2048) -> Iterator[tuple[str, dict[str, object]]]:
    """(shard path, row dict) for every row of every parquet shard under ``data/``."""
    for shard in sorted((corpus_dir / DATA).glob("*.parquet")):
        for batch in open_parquet(shard).iter_batches(batch_size=batch_size):
            for row in batch.to_pylist():
                yield f"{DATA}/{shard.name}", row


def scan_corpus(corpus_dir: Path) -> list[Finding]:
    """Findings in every shard row and in the metadata files a publish uploads."""
    corpus_dir = Path(corpus_dir)
    findings = scan_conversations(row for _, row in iter_corpus_rows(corpus_dir))
    for name in (RECIPE, MANIFEST, AUDIT):
        path = corpus_dir / name
        if path.is_file():
            findings.extend(scan_metadata(path.read_text(encoding="utf-8", errors="replace"), name))
    return findings


def redact_conversations(items: Iterable[Conversation | Skipped]) -> Iterator[Conversation | Skipped]:
    """The build's redaction step (checks.redact_secrets): secrets in turns, and in the provenance the
    readers copied from the input (the row's own id, a reference answer), become ``[REDACTED:kind]``.

    A row keeps its id (a hash: it reveals nothing); dedup compares the redacted text."""
    for item in items:
        if isinstance(item, Conversation):
            for message in item.messages:
                redacted = redact(message.content)
                reasoning = redact(message.reasoning) if message.reasoning else message.reasoning
                calls = tuple(replace(call, arguments=redact(call.arguments)) for call in message.tool_calls)
                if redacted != message.content or reasoning != message.reasoning or calls != message.tool_calls:
                    message.content, message.reasoning, message.tool_calls = redacted, reasoning, calls
            if item.tools:
                tools = redact_value(item.tools)
                if tools != item.tools:
                    item.tools = tools
            provenance = item.provenance.to_json()
            redacted_provenance = redact_value(provenance)
            if redacted_provenance != provenance:
                item.provenance = Provenance.from_json(redacted_provenance)
        yield item
