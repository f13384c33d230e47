"""Secrets scan: every kind found, ordinary text and code left alone, findings never echo the secret;
private keys (made here by ``cryptography``, never stored) redacted whole in every way text carries them."""

from __future__ import annotations

import base64
import datetime
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
from cryptography.x509.oid import NameOID

from corpus_builder.errors import CorpusError, Skipped
from corpus_builder.records import Conversation, Message, Provenance, ToolCall
from corpus_builder.secrets import (
    KINDS,
    _der_content,
    _is_der_private_key,
    find_secrets,
    iter_corpus_rows,
    map_strings,
    redact,
    redact_conversations,
    redact_value,
    scan_conversations,
    scan_corpus,
    scan_metadata,
    scan_row,
    scan_text,
    scrub_message,
)

_PEM = serialization.Encoding.PEM
_PLAIN = serialization.NoEncryption()


def _pem_lines(pem: bytes) -> list[str]:
    return pem.decode().strip().splitlines()


def _body_lines(pem: bytes) -> list[str]:
    """The base64 lines of a PEM block: no BEGIN/END, no encapsulated headers."""
    return [line for line in _pem_lines(pem)[1:-1] if line and ":" not in line]


_ED25519 = ed25519.Ed25519PrivateKey.generate()
# Built by concatenation so that no credential-shaped literal sits in the repository.
ALNUM = "aB3dE5gH7jK9mN1pQ2rS4tU6vW8xY0zC"
SAMPLES = {
    "hf_token": "hf_" + ALNUM + "Zq",
    "openai_key": "sk-" + "proj-" + ALNUM + "_" + ALNUM,
    "anthropic_key": "sk-" + "ant-api03-" + ALNUM + ALNUM,
    "stripe_key": "sk_" + "live_" + ALNUM,
    "aws_access_key": "AKIA" + "IOSFODNN7EXAMPLE",
    "aws_secret_key": "aws_secret_access_key = " + "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "github_token": "gh" + "p_" + ALNUM + "abcd",
    "github_pat": "github_" + "pat_" + "11ABCDEFG0" + ALNUM + "_" + ALNUM,
    "gitlab_token": "gl" + "pat-" + ALNUM[:20],
    "private_key": "-----BEGIN RSA " + "PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
    "jwt": "eyJ" + "hbGciOiJIUzI1NiJ9" + ".eyJ" + "zdWIiOiIxMjM0NTY3ODkwIn0" + "."
           + "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "slack_token": "xo" + "xb-" + "123456789012-" + ALNUM[:24],
    "slack_webhook": "https://hooks.slack.com/services/" + "T0000ABCD/B0000WXYZ/" + ALNUM[:24],
    "google_api_key": "AI" + "za" + "SyA" + ALNUM,
    "npm_token": "npm_" + ALNUM + "abcd",
    "pypi_token": "pypi-" + "AgEIcHlwaS5vcmc" + ALNUM + ALNUM,
    "der_private_key": "".join(_body_lines(_ED25519.private_bytes(_PEM, serialization.PrivateFormat.PKCS8, _PLAIN))),
    "openssh_private_key": "\n".join(_body_lines(
        _ED25519.private_bytes(_PEM, serialization.PrivateFormat.OpenSSH, _PLAIN))),
    "url_credentials": "ftp://" + "alice:" + "s3cr3t-pw" + "@files.example.com/dump.jsonl",
}
# The part of a sample that is the secret, where the sample holds more (a URL keeps scheme and host).
SPANS = {"url_credentials": "alice:" + "s3cr3t-pw"}
ORDINARY = """
Use scikit-learn (sk-learn) for the task-specific baseline; call hf_hub_download() or hf_api.list_models().
The ghost of a ghp reference, AKIA alone, eyJ alone, and xoxo hugs. A sha256 is
9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 and a uuid 123e4567-e89b-12d3-a456-426614174000.
-----BEGIN CERTIFICATE-----
-----BEGIN PUBLIC KEY-----
def risk_score(task_key: str) -> float:
    sk = "sk-short"
    return len(task_key) / 3.0  # AIza is a prefix, not a key
base64: SGVsbG8gd29ybGQhIFRoaXMgaXMgYSBwbGFpbiBzZW50ZW5jZS4gTm90aGluZyB0byBzZWUgaGVyZS4=
"""


def test_every_kind_has_a_sample() -> None:
    assert set(SAMPLES) == set(KINDS)


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_each_kind_detected_and_never_echoed(kind: str) -> None:
    sample = SAMPLES[kind]
    secret = SPANS.get(kind, sample)
    findings = scan_text(f"here is my key: {sample} thanks", "row-1", "messages[1].content")
    assert [f.kind for f in findings] == [kind]
    finding = findings[0]
    assert finding.field == "messages[1].content"
    assert (finding.offset, finding.length) == (len("here is my key: ") + sample.index(secret), len(secret))
    for shown in (str(finding), repr(finding)):
        assert secret not in shown
        assert secret[4:20] not in shown  # no fragment either
    assert redact(f"x {sample} y") == f"x {sample.replace(secret, f'[REDACTED:{kind}]')} y"
    assert list(find_secrets(redact(f"x {sample} y"))) == []  # the redacted text is clean


def test_no_false_positive_on_ordinary_text_and_code() -> None:
    assert scan_text(ORDINARY, "prose") == []
    assert redact(ORDINARY) == ORDINARY


def test_findings_name_row_and_field_in_every_text_field() -> None:
    conversation = Conversation(
        id="0123456789abcdef0123", source="chat", origin="generated",
        messages=[Message("user", "hello"), Message("assistant", "fine", SAMPLES["hf_token"]),
                  Message("user", "and?"), Message("assistant", SAMPLES["aws_access_key"])],
        provenance=Provenance.from_json({"source_file": "chat.jsonl",
                                         "generation": {"turns": [{"endpoint": SAMPLES["github_token"]}]}}),
    )
    found = {(f.row_id, f.field, f.kind) for f in scan_conversations([conversation])}
    assert found == {
        ("0123456789abcdef0123", "messages[1].reasoning", "hf_token"),
        ("0123456789abcdef0123", "messages[3].content", "aws_access_key"),
        ("0123456789abcdef0123", "provenance.generation.turns[0].endpoint", "github_token"),
    }
    # The on-disk shape (provenance as a JSON string) gives the same findings.
    row = conversation.to_row()
    import orjson

    row["provenance"] = orjson.dumps(row["provenance"]).decode()
    assert {(f.field, f.kind) for f in scan_row(row)} == {(field, kind) for _, field, kind in found}


# --------------------------------------------------------------------------------------------------
# Private keys: whole blocks, cut blocks, bodies without their PEM lines


@pytest.fixture(scope="module")
def private_keys() -> dict[str, bytes]:
    """Real private keys in PEM, in the formats tools write."""
    formats = serialization.PrivateFormat
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    password = serialization.BestAvailableEncryption(b"correct horse")
    return {
        "rsa_pkcs1": rsa_key.private_bytes(_PEM, formats.TraditionalOpenSSL, _PLAIN),
        "rsa_pkcs8": rsa_key.private_bytes(_PEM, formats.PKCS8, _PLAIN),
        "rsa_pkcs8_encrypted": rsa_key.private_bytes(_PEM, formats.PKCS8, password),
        "rsa_pkcs1_encrypted": rsa_key.private_bytes(_PEM, formats.TraditionalOpenSSL, password),
        "ec_sec1": ec.generate_private_key(ec.SECP256R1()).private_bytes(_PEM, formats.TraditionalOpenSSL, _PLAIN),
        "ec_pkcs8": ec.generate_private_key(ec.SECP384R1()).private_bytes(_PEM, formats.PKCS8, _PLAIN),
        "ed25519_pkcs8": _ED25519.private_bytes(_PEM, formats.PKCS8, _PLAIN),
        "openssh": _ED25519.private_bytes(_PEM, formats.OpenSSH, _PLAIN),
        "pgp": ("-----BEGIN PGP " + "PRIVATE KEY BLOCK-----\nVersion: GnuPG v2\n\n"
                + "\n".join(_wrapped(base64.b64encode(random.Random(1).randbytes(300)).decode()))
                + "\n=tVy4\n-----END PGP PRIVATE KEY BLOCK-----\n").encode(),
    }


def _wrapped(text: str, width: int = 64) -> list[str]:
    return [text[start:start + width] for start in range(0, len(text), width)]


# How text carries a key: (name, text around the key's lines, the same text with the key redacted).
R = "[REDACTED:private_key]"
CARRIERS = {
    "as written": (lambda lines: "my key:\n" + "\n".join(lines) + "\nthanks", f"my key:\n{R}\nthanks"),
    "crlf": (lambda lines: "key\r\n" + "\r\n".join(lines) + "\r\nbye", f"key\r\n{R}\r\nbye"),
    "in a JSON string": (lambda lines: json.dumps({"private_key": "\n".join(lines), "id": 3}),
                         json.dumps({"private_key": R, "id": 3})),
    "in a YAML block": (lambda lines: "tls:\n  key: |\n    " + "\n    ".join(lines) + "\n  port: 443",
                        f"tls:\n  key: |\n    {R}\n  port: 443"),
    "in Python source": (lambda lines: 'KEY = (\n    "' + '\\n"\n    "'.join(lines) + '"\n)\nsign(KEY)',
                         f'KEY = (\n    "{R}"\n)\nsign(KEY)'),
    "on one line": (lambda lines: "pasted: " + " ".join(lines) + " ok", f"pasted: {R} ok"),
}
PEM_KEYS = ("rsa_pkcs1", "rsa_pkcs8", "rsa_pkcs8_encrypted", "rsa_pkcs1_encrypted", "ec_sec1", "ec_pkcs8",
            "ed25519_pkcs8", "openssh", "pgp")
# Legacy encrypted PEM and PGP keep header lines ("Proc-Type: 4,ENCRYPTED", "Version: ..."), which a
# line-joining paste makes indistinguishable from prose: those two keys on one line are left out.
_HEADER_LINES = ("rsa_pkcs1_encrypted", "pgp")


@pytest.mark.parametrize(("key", "carrier"), [(key, carrier) for key in PEM_KEYS for carrier in sorted(CARRIERS)
                                              if not (key in _HEADER_LINES and carrier == "on one line")])
def test_a_pem_private_key_is_redacted_from_begin_to_end(private_keys: dict[str, bytes], key: str,
                                                          carrier: str) -> None:
    embed, expected = CARRIERS[carrier]
    text = embed(_pem_lines(private_keys[key]))
    assert redact(text) == expected
    assert [kind for kind, _, _ in find_secrets(text)] == ["private_key"]


@pytest.mark.parametrize("key", ["rsa_pkcs1", "ec_pkcs8", "openssh"])
def test_a_cut_off_key_is_redacted_through_its_base64_and_no_further(private_keys: dict[str, bytes],
                                                                     key: str) -> None:
    lines = _pem_lines(private_keys[key])
    text = "here it is:\n" + "\n".join(lines[:3]) + "\n\nThat is all the log kept. Is it valid?"
    assert redact(text) == f"here it is:\n{R}\n\nThat is all the log kept. Is it valid?"


@pytest.mark.parametrize(("key", "kind"), [
    ("rsa_pkcs1", "der_private_key"), ("rsa_pkcs8", "der_private_key"), ("rsa_pkcs8_encrypted", "der_private_key"),
    ("ec_sec1", "der_private_key"), ("ec_pkcs8", "der_private_key"), ("ed25519_pkcs8", "der_private_key"),
    ("openssh", "openssh_private_key"),
])
def test_a_key_body_without_its_pem_lines_is_found_and_redacted_whole(private_keys: dict[str, bytes], key: str,
                                                                      kind: str) -> None:
    body = "\n".join(_body_lines(private_keys[key]))
    text = f"the server printed\n{body}\n\nand then stopped."
    assert list(find_secrets(text)) == [(kind, len("the server printed\n"), len(body))]
    assert redact(text) == f"the server printed\n[REDACTED:{kind}]\n\nand then stopped."
    one_line = "".join(_body_lines(private_keys[key]))
    assert redact(f"key={one_line};") == f"key=[REDACTED:{kind}];"


def test_public_keys_certificates_and_other_base64_are_not_secrets() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "example.org")])
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(1).not_valid_before(datetime.datetime(2024, 1, 1))
                   .not_valid_after(datetime.datetime(2034, 1, 1)).sign(key, hashes.SHA256()))
    public = serialization.PublicFormat
    texts = [
        certificate.public_bytes(_PEM).decode(),
        key.public_key().public_bytes(_PEM, public.SubjectPublicKeyInfo).decode(),
        key.public_key().public_bytes(_PEM, public.PKCS1).decode(),
        ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(_PEM, public.SubjectPublicKeyInfo).decode(),
        _ED25519.public_key().public_bytes(serialization.Encoding.OpenSSH, public.OpenSSH).decode(),
        "MIT License. MIDI files, MIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIII is not base64 DER.",
    ]
    texts += ["\n".join(_pem_lines(text.encode())[1:-1]) for text in texts[:4]]  # their bodies alone
    # DER-looking base64 of other data: a SEQUENCE with a long length, then anything but a key's version.
    rng = random.Random(7)
    texts += [base64.b64encode(b"\x30\x82" + rng.randbytes(60)).decode() for _ in range(200)]
    for text in texts:
        assert list(find_secrets(text)) == [], text[:80]


# --------------------------------------------------------------------------------------------------
# URL credentials, provenance, messages


@pytest.mark.parametrize(("text", "found"), [
    ("get ftp://" + "user:" + "pass" + "@host/x.jsonl now", "user:" + "pass"),
    ("postgresql://" + "app:" + "Tr0ub4dor&3" + "@db.internal:5432/prod", "app:" + "Tr0ub4dor&3"),
    ("https://" + "bob:" + "pw%40home" + "@example.com", "bob:" + "pw%40home"),
    ("ssh://git@github.com/org/repo.git", None),  # a user name alone is no credential
    ("https://example.com/users/a@b.com and mailto:a@b.com", None),
    ("http://127.0.0.1:8000/v1 and http://host:8080/x@y", None),
    ("postgresql://user:${PGPASSWORD}@db/prod or mysql://root:%s@localhost or ftp://u:***@h", None),
    ("postgresql://doadmin:...@db.example.com or postgres://user:password@localhost or http://a:XXXX@h", None),
])
def test_url_credentials_are_the_user_and_password_of_a_url(text: str, found: str | None) -> None:
    expected = [("url_credentials", text.index(found), len(found))] if found else []
    assert list(find_secrets(text)) == expected


def test_redaction_covers_the_provenance_the_readers_copy_from_the_input() -> None:
    token = SAMPLES["hf_token"]
    conversation = Conversation(
        id="0123456789abcdef0123", source="math", origin="prompt", messages=[Message("user", "2+2?")],
        provenance=Provenance(source_file="math.jsonl", source_line=3, source_id=f"run-{token}",
                              reference_answer=f"4 (checked with {SAMPLES['github_token']})"),
    )
    [redacted] = list(redact_conversations([conversation]))
    assert isinstance(redacted, Conversation)
    assert redacted.provenance == Provenance(source_file="math.jsonl", source_line=3,
                                             source_id="run-[REDACTED:hf_token]",
                                             reference_answer="4 (checked with [REDACTED:github_token])")
    assert scan_conversations([redacted]) == []


def test_tool_calls_results_and_tools_are_scanned_and_redacted() -> None:
    """A call's arguments, a tool's result and the tools' schemas are text from the input too."""
    tools = [{"type": "function", "function": {"name": "deploy", "description": f"uses {SAMPLES['hf_token']}",
                                               "parameters": None}}]
    deploy = ToolCall("c1", "deploy", json.dumps({"key": SAMPLES["github_token"]}, separators=(",", ":")))
    conversation = Conversation(
        id="0123456789abcdef0123", source="agent", origin="replay", tools=tools,
        messages=[Message("user", "deploy it"), Message("assistant", "", None, (deploy,)),
                  Message("tool", f"ok, {SAMPLES['aws_access_key']}", tool_call_id="c1"), Message("assistant", "done")])
    found = {(f.field, f.kind) for f in scan_conversations([conversation])}
    assert found == {("messages[1].tool_calls[0].arguments", "github_token"), ("messages[2].content", "aws_access_key"),
                     ("tools[0].function.description", "hf_token")}
    [redacted] = list(redact_conversations([conversation]))
    assert isinstance(redacted, Conversation) and scan_conversations([redacted]) == []
    assert redacted.messages[1].tool_calls[0].arguments == '{"key":"[REDACTED:github_token]"}'


def test_messages_to_people_lose_url_userinfo_and_every_secret() -> None:
    token = SAMPLES["hf_token"]
    error = CorpusError(f"cannot read {token}", file="ftp://" + "user:pass" + "@host/x.jsonl",
                        details=["https://" + "deploy-token" + "@git.example.com/r.git"])
    shown = str(error)
    assert "user:pass" not in shown and "deploy-token" not in shown
    assert "ftp://***@host/x.jsonl" in shown and "https://***@git.example.com/r.git" in shown
    assert scrub_message(shown) == shown.replace(token, "[REDACTED:hf_token]")


def test_map_strings_changes_every_string_inside_and_nothing_else() -> None:
    value = {"a": ["x", 1, None, {"b": "y", "c": [True, 2.5, "z"]}], "d": "w", "e": {}}
    assert map_strings(str.upper, value) == {"a": ["X", 1, None, {"b": "Y", "c": [True, 2.5, "Z"]}], "d": "W",
                                             "e": {}}
    assert value["a"][0] == "x"  # a copy: the value given is left as it was
    assert map_strings(str.upper, "plain") == "PLAIN" and map_strings(str.upper, 7) == 7


# --------------------------------------------------------------------------------------------------
# Every literal a kind can start with, alone in a text (the prefilter skips a text holding none of them)

FILL = "Zq8" * 20  # alphanumeric, and no prefix of any kind inside
VARIANTS = [
    ("hf_token", "hf_" + FILL[:34]),
    ("openai_key", "sk-" + FILL[:40]),
    *[("openai_key", f"sk-{scope}-" + FILL[:40]) for scope in ("proj", "svcacct", "admin")],
    ("anthropic_key", "sk-ant-" + "api03-" + FILL[:40]),
    *[("stripe_key", f"{kind}k_{mode}_" + FILL[:30]) for kind in "sr" for mode in ("live", "test")],
    *[("aws_access_key", prefix + "Q7RZ3XK2W9PL4VBN") for prefix in ("AKIA", "ASIA", "ABIA", "ACCA")],
    *[("aws_secret_key", f"{name}{sep}" + "Zq8/Zq8+" * 5) for name, sep in (
        ("aws_secret_access_key", " = "), ("AWS_SECRET_ACCESS_KEY", "="), ('"aws_secret_access_key"', ': "'))],
    *[("github_token", f"gh{kind}_" + FILL[:40]) for kind in "pousr"],
    ("github_pat", "github_" + "pat_" + FILL[:55]),
    ("gitlab_token", "gl" + "pat-" + FILL[:24]),
    *[("slack_token", f"xox{kind}-" + "1234567890-" + FILL[:12]) for kind in "abposr"],
    ("slack_webhook", "https://hooks.slack.com/services/" + "TZq8/BZq8/" + FILL[:24]),
    ("google_api_key", "AI" + "za" + FILL[:35]),
    ("npm_token", "npm_" + FILL[:36]),
    ("pypi_token", "pypi-" + "AgE" + FILL[:54]),
    ("jwt", "eyJ" + FILL[:12] + ".eyJ" + FILL[:12] + "." + FILL[:20]),
    ("url_credentials", "sftp://" + "deploy:" + "Zq8Zq8" + "@files.example.org/x"),
    ("private_key", "-----BEGIN OPENSSH " + "PRIVATE KEY-----"),  # a log cut after the first line: no body to see
]


@pytest.mark.parametrize(("kind", "secret"), VARIANTS, ids=[secret[:12] for _, secret in VARIANTS])
def test_every_variant_of_a_kind_is_found_in_plain_text(kind: str, secret: str) -> None:
    text = f"config: {secret} (rotate)"
    # A URL keeps scheme and host; a quoted name's opening quote is not part of the secret.
    span = "deploy:" + "Zq8Zq8" if kind == "url_credentials" else secret.lstrip('"')
    assert list(find_secrets(text)) == [(kind, text.index(span), len(span))]
    assert redact(text) == text.replace(span, f"[REDACTED:{kind}]")


def _der_key(key: Any, private_format: Any = None) -> str:
    der = key.private_bytes(serialization.Encoding.DER, private_format or serialization.PrivateFormat.PKCS8, _PLAIN)
    return base64.b64encode(der).decode()


@pytest.mark.parametrize("make", [
    lambda: _der_key(_ED25519),  # MC: a short DER length under 0x40
    lambda: _der_key(ed448.Ed448PrivateKey.generate()),  # ME: a short length from 0x40
    lambda: _der_key(ec.generate_private_key(ec.SECP256R1()), serialization.PrivateFormat.TraditionalOpenSSL),  # MH
    lambda: _der_key(dsa.generate_private_key(1024), serialization.PrivateFormat.TraditionalOpenSSL),  # MI: long
], ids=["MC", "ME", "MH", "MI"])
def test_a_der_key_body_is_found_whatever_its_first_base64_letters(make: Any) -> None:
    body = make()
    assert [(kind, length) for kind, _, length in find_secrets(f"key: {body}\n")] == [("der_private_key", len(body))]


def test_the_content_of_a_truncated_or_malformed_der_element_is_nothing() -> None:
    assert [_der_content(der) for der in (b"", b"\x30", b"\x30\x00", b"\x30\x01\x05")] == [b"", b"", b"", b"\x05"]
    assert _der_content(b"\x30\x81\x05\x02") == b"\x02"
    assert _der_content(b"\x30\x80\x02\x01") == b"" and _der_content(b"\x30\x84\x00\x00\x00\x05\x02") == b""


def test_only_base64_of_a_der_sequence_is_confirmed_as_a_key() -> None:
    """The confirmation on its own, for text its pattern never hands it: not base64, not a SEQUENCE."""
    key = _der_key(_ED25519)
    assert _is_der_private_key(key)
    assert not _is_der_private_key(key[:4] + "----" + key[4:20])  # base64 once the dashes are dropped: not here
    assert not _is_der_private_key(_der_text(b"\x31\x2e\x02\x01\x00\x30"))


def _der_text(der: bytes) -> str:
    """Base64 of a DER head, padded to the pattern's length with the base64 of zero bytes."""
    return base64.b64encode(der + bytes(48 - len(der))).decode()


@pytest.mark.parametrize(("head", "private"), [
    (b"\x30\x2e\x02\x01\x00\x30", True),  # short length, version 0, then the algorithm (PKCS#8)
    (b"\x30\x77\x02\x01\x01\x04", True),  # version 1, then the key (SEC1 EC)
    (b"\x30\x81\x90\x02\x01\x00\x02", True),  # one length byte, then the modulus (PKCS#1 RSA)
    (b"\x30\x82\x01\x00\x02\x01\x00\x02", True),  # two length bytes
    (b"\x30\x83\x00\x01\x00\x02\x01\x00\x02", True),  # three length bytes
    (b"\x30\x84\x00\x00\x01\x00\x02\x01\x00\x02", False),  # four: no key is that long
    (b"\x30\x80\x02\x01\x00\x02", False),  # indefinite length: not DER
    (b"\x30\x2e\x02\x01\x02\x30", False),  # version 2: no private key's
    (b"\x30\x2e\x02\x01\x00\x05", False),  # version 0, then NULL: not a key's structure
    (b"\x31\x2e\x02\x01\x00\x30", False),  # a SET, not a SEQUENCE
    (b"\x30\x82\x01\x00\x30\x1a\x06\x09\x2a\x86\x48\x86\xf7\x0d\x01\x05\x0d", True),  # encrypted PKCS#8 (PBES2)
    (b"\x30\x82\x01\x00\x30\x1a\x06\x0a\x2a\x86\x48\x86\xf7\x0d\x01\x0c\x01\x03", True),  # PKCS#12 PBE
    (b"\x30\x82\x01\x00\x30\x1a\x06\x09\x2a\x86\x48\x86\xf7\x0d\x01\x01\x01", False),  # rsaEncryption: a public key
    (b"\x30\x82\x01\x00\x31\x1a\x06\x09\x2a\x86\x48\x86\xf7\x0d\x01\x05\x0d", False),  # a SET before the OID
])
def test_a_der_candidate_counts_only_with_a_private_keys_structure(head: bytes, private: bool) -> None:
    text = _der_text(head)
    assert text.startswith("M")
    assert [kind for kind, _, _ in find_secrets(f"blob {text} end")] == (["der_private_key"] if private else [])


# --------------------------------------------------------------------------------------------------
# Where a secret starts and ends: what redaction keeps around it


TOKEN = SAMPLES["hf_token"]
R_HF = "[REDACTED:hf_token]"


@pytest.mark.parametrize(("text", "redacted"), [
    (TOKEN, R_HF),  # the whole text
    (f"{TOKEN}. Next", f"{R_HF}. Next"),  # punctuation after it stays
    (f"({TOKEN})", f"({R_HF})"),
    (f"a {TOKEN} b {SAMPLES['github_token']} c", f"a {R_HF} b [REDACTED:github_token] c"),  # two, in order
    (f"{TOKEN},{TOKEN}", f"{R_HF},{R_HF}"),  # one character between them
    (f"my{TOKEN}", f"my{TOKEN}"),  # inside a word: an identifier, not a token
    (f"{TOKEN}_suffix", f"{TOKEN}_suffix"),
    ("hf_" + "Zq8" * 9 + "Z", "hf_" + "Zq8" * 9 + "Z"),  # 28 characters after hf_: too short
    ("AI" + "za" + FILL[:35] + "x", "AI" + "za" + FILL[:35] + "x"),  # a Google key is exactly 35 after AIza
    ("aws_secret_access_key=" + "Zq8/" * 10 + "Z", "aws_secret_access_key=" + "Zq8/" * 10 + "Z"),  # 41: not a key
    ("AKIA" + "Q7RZ3XK2W9PL4VBN" + "Q", "AKIA" + "Q7RZ3XK2W9PL4VBN" + "Q"),  # 17 after AKIA
    ("npm_" + FILL[:36] + ".", "[REDACTED:npm_token]."),
    ("postgres://" + "app:" + "pw" + "@db/x", "postgres://[REDACTED:url_credentials]@db/x"),  # scheme and host stay
])
def test_redaction_replaces_the_secret_and_nothing_around_it(text: str, redacted: str) -> None:
    assert redact(text) == redacted


def test_text_without_a_secret_is_returned_as_it_is() -> None:
    text = "nothing to see: hf_hub_download() and sk-learn"
    assert redact(text) is text and list(find_secrets(text)) == []


def test_findings_are_in_text_order_with_offsets_into_the_field() -> None:
    text = f"{SAMPLES['github_token']} then {TOKEN}"
    findings = scan_text(text, "row-7", "messages[0].content")
    assert [(f.kind, f.offset, f.length) for f in findings] == [
        ("github_token", 0, len(SAMPLES["github_token"])), ("hf_token", text.index(TOKEN), len(TOKEN))]
    assert str(findings[1]) == f"row-7 messages[0].content: hf_token ({len(TOKEN)} chars at offset {text.index(TOKEN)})"
    assert scan_text(text, "recipe.yaml")[0].field == "text"


# --------------------------------------------------------------------------------------------------
# Which parts of a row are scanned: every text field, object keys too, never echoing a secret


def test_every_text_field_of_a_row_is_scanned() -> None:
    row = {"id": "row-1", "source": f"src {TOKEN}", "task": f"t {TOKEN}", "license": f"l {TOKEN}",
           "messages": [{"role": "user", "content": f"c {TOKEN}", "reasoning": None},
                        {"role": "assistant", "content": "", "reasoning": f"r {TOKEN}",
                         "tool_calls": [{"id": "c1", "name": f"n {TOKEN}", "arguments": f'{{"k": "{TOKEN}"}}'}]}],
           "tools": json.dumps([{"description": TOKEN}]), "provenance": json.dumps({"source_id": TOKEN})}
    assert [(f.row_id, f.field) for f in scan_row(row)] == [("row-1", field) for field in (
        "source", "task", "license", "messages[0].content", "messages[1].reasoning",
        "messages[1].tool_calls[0].name", "messages[1].tool_calls[0].arguments", "tools", "provenance.source_id")]


def test_fields_that_are_not_text_are_skipped() -> None:
    row = {"id": 5, "source": 3, "task": None, "license": ["x"], "tools": None, "provenance": None,
           "messages": [{"role": "assistant", "content": None, "reasoning": 7, "tool_calls": [{"name": 1}]}]}
    assert scan_row(row) == []
    assert [f.row_id for f in scan_row({"id": 5, "source": TOKEN})] == ["5"]
    assert [f.row_id for f in scan_row({"source": TOKEN})] == ["None"]


@pytest.mark.parametrize("provenance", [
    json.dumps({"hub": {"note": TOKEN}}), json.dumps({"hub": {"note": TOKEN}}).encode(), {"hub": {"note": TOKEN}},
], ids=["JSON text", "JSON bytes", "object"])
def test_provenance_is_scanned_inside_whatever_its_form(provenance: Any) -> None:
    [finding] = scan_row({"id": "r", "provenance": provenance})
    assert (finding.field, finding.offset, finding.length) == ("provenance.hub.note", 0, len(TOKEN))


def test_provenance_that_is_not_json_is_scanned_whole() -> None:
    text = f"not json {TOKEN}"
    [finding] = scan_row({"id": "r", "provenance": text})
    assert (finding.field, finding.offset) == ("provenance", text.index(TOKEN))
    [finding] = scan_row({"id": "r", "provenance": text.encode()})
    assert (finding.field, finding.offset) == ("provenance", text.index(TOKEN))


def test_provenance_bytes_that_are_not_utf8_are_scanned_with_replacements() -> None:
    raw = b"\xff\xfe log line " + TOKEN.encode()
    [finding] = scan_row({"id": "r", "provenance": raw})
    assert (finding.field, finding.offset) == ("provenance", raw.decode(errors="replace").index(TOKEN))


def test_lists_and_tuples_in_provenance_are_walked_by_index() -> None:
    findings = scan_row({"id": "r", "provenance": {"turns": [{"endpoint": "x"}, {"endpoint": TOKEN}],
                                                    "pair": ("a", TOKEN), "count": 3}})
    assert [f.field for f in findings] == ["provenance.turns[1].endpoint", "provenance.pair[1]"]


def test_a_secret_used_as_an_object_key_is_found_and_never_named() -> None:
    tools = [{"type": "function", "function": {"name": "f", "description": None,
                                               "parameters": {"properties": {TOKEN: {"note": TOKEN}}}}}]
    findings = scan_row({"id": "r", "tools": tools, "provenance": {TOKEN: 1}})
    properties = "tools[0].function.parameters.properties"
    assert [(f.field, f.kind) for f in findings] == [
        (f"{properties}.{R_HF}[key]", "hf_token"), (f"{properties}.{R_HF}.note", "hf_token"),
        (f"provenance.{R_HF}[key]", "hf_token")]
    assert not any(TOKEN[3:] in str(finding) for finding in findings)


def test_scan_conversations_takes_rows_and_conversations_in_stream_order() -> None:
    conversation = Conversation(id="0123456789abcdef0123", source="chat", origin="replay",
                                messages=[Message("user", TOKEN), Message("assistant", "ok")])
    found = scan_conversations([{"id": "first", "source": TOKEN}, conversation, {"id": "none"}])
    assert [(f.row_id, f.field) for f in found] == [("first", "source"), (conversation.id, "messages[0].content")]


# --------------------------------------------------------------------------------------------------
# A corpus on disk: every shard in name order, then the metadata files a publish uploads


def test_scan_corpus_reads_every_shard_and_each_metadata_file(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "data").mkdir()
    rows = {"b": [{"id": f"b{i}", "source": TOKEN if i == 2 else "chat"} for i in range(5)],
            "a": [{"id": "a0", "source": f"x {TOKEN}"}]}
    for name, shard_rows in rows.items():
        pq.write_table(pa.Table.from_pylist(shard_rows), tmp_path / "data" / f"{name}.parquet", row_group_size=2)
    (tmp_path / "data" / "notes.txt").write_text(TOKEN)  # not a shard
    assert [(path, row["id"]) for path, row in iter_corpus_rows(tmp_path, batch_size=2)] == [
        ("data/a.parquet", "a0"), *(("data/b.parquet", f"b{i}") for i in range(5))]
    (tmp_path / "recipe.yaml").write_text(f"name: x\ndescription: {TOKEN}\nendpoint: http://u:" + "pw@host/v1\n")
    (tmp_path / "audit.json").write_text(json.dumps({"note": TOKEN}))
    found = scan_corpus(tmp_path)  # no manifest.json: the files that exist are scanned
    assert [(f.row_id, f.field) for f in found] == [("a0", "source"), ("b2", "source"), ("recipe.yaml", "text"),
                                                    ("audit.json", "text")]
    (tmp_path / "manifest.json").write_bytes(b'{"note": "\xff ' + TOKEN.encode() + b'"}')  # not UTF-8 throughout
    assert [f.row_id for f in scan_corpus(tmp_path)][2:] == ["recipe.yaml", "manifest.json", "audit.json"]


def test_metadata_url_logins_are_left_to_the_upload_but_other_secrets_are_found() -> None:
    text = "endpoint: https://" + "alice:" + "pw" + f"@gpu:8000/v1\ntoken: {TOKEN}\n"
    assert [(f.row_id, f.kind) for f in scan_metadata(text, "recipe.yaml")] == [("recipe.yaml", "hf_token")]
    assert [f.kind for f in scan_text(text, "recipe.yaml")] == ["url_credentials", "hf_token"]


# --------------------------------------------------------------------------------------------------
# The build's redaction: each place a secret can sit, alone


def _conversation(**fields: Any) -> Conversation:
    base: dict[str, Any] = {"id": "0123456789abcdef0123", "source": "chat", "origin": "replay",
                            "messages": [Message("user", "hi"), Message("assistant", "hello")]}
    return Conversation(**{**base, **fields})


@pytest.mark.parametrize("where", ["content", "reasoning", "arguments"])
def test_a_secret_in_one_part_of_one_turn_is_redacted(where: str) -> None:
    call = ToolCall("c1", "deploy", f'{{"key": "{TOKEN}"}}' if where == "arguments" else "{}")
    turn = Message("assistant", f"use {TOKEN}" if where == "content" else "done",
                   f"think {TOKEN}" if where == "reasoning" else None, (call,))
    conversation = _conversation(messages=[Message("user", "go"), turn])
    [redacted] = list(redact_conversations([conversation]))
    assert isinstance(redacted, Conversation)
    message = redacted.messages[1]
    assert (message.content, message.reasoning, message.tool_calls[0].arguments) == {
        "content": (f"use {R_HF}", None, "{}"), "reasoning": ("done", f"think {R_HF}", "{}"),
        "arguments": ("done", None, f'{{"key": "{R_HF}"}}')}[where]
    assert message.tool_calls[0].name == "deploy" and redacted.messages[0] == Message("user", "go")


def test_redaction_keeps_clean_rows_and_skipped_rows_as_they_are() -> None:
    clean = _conversation(tools=[{"type": "function", "function": {"name": "f"}}], provenance=Provenance(source_line=1))
    skipped = Skipped("chat", "bad_row", "chat.jsonl:3", detail=TOKEN)
    out = list(redact_conversations([clean, skipped]))
    assert out[0] == _conversation(tools=[{"type": "function", "function": {"name": "f"}}],
                                   provenance=Provenance(source_line=1))
    assert out[1] is skipped  # the ledger keeps its detail (local, never published)


def test_redaction_covers_tools_and_keeps_their_keys() -> None:
    tools = [{"type": "function", "function": {"name": "f", "description": f"key {TOKEN}", "parameters": None}}]
    [redacted] = list(redact_conversations([_conversation(tools=tools)]))
    assert isinstance(redacted, Conversation)
    assert redacted.tools == [{"type": "function", "function": {"name": "f", "description": f"key {R_HF}",
                                                                 "parameters": None}}]
    assert tools[0]["function"]["description"] == f"key {TOKEN}"  # the input's value is not changed in place
    assert redact_value({"a": [TOKEN, 1]}) == {"a": [R_HF, 1]}


def test_metadata_files_are_read_as_utf8_whatever_the_locale(tmp_path: Path) -> None:
    """Offsets count characters of the UTF-8 text, also where the locale's encoding is ASCII."""
    (tmp_path / "audit.json").write_text(json.dumps({"note": f"café {TOKEN}"}, ensure_ascii=False), encoding="utf-8")
    [expected] = scan_corpus(tmp_path)
    code = ("import sys; from pathlib import Path; from corpus_builder.secrets import scan_corpus; "
            "print([f.offset for f in scan_corpus(Path(sys.argv[1]))])")
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    completed = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                               check=True)
    assert completed.stdout.strip() == f"[{expected.offset}]"
