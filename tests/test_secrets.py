"""Secrets scan: every kind found, ordinary text and code left alone, findings never echo the secret."""

from __future__ import annotations

import pytest

from corpus_builder.records import Conversation, Message
from corpus_builder.secrets import KINDS, redact, scan_conversations, scan_row, scan_text

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
}
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
    secret = SAMPLES[kind]
    findings = scan_text(f"here is my key: {secret} thanks", "row-1", "messages[1].content")
    assert [f.kind for f in findings] == [kind]
    finding = findings[0]
    assert finding.field == "messages[1].content" and finding.offset == len("here is my key: ")
    for shown in (str(finding), repr(finding)):
        assert secret not in shown
        assert secret[4:20] not in shown  # no fragment either
    assert secret not in redact(f"x {secret} y") and f"[REDACTED:{kind}]" in redact(f"x {secret} y")


def test_no_false_positive_on_ordinary_text_and_code() -> None:
    assert scan_text(ORDINARY, "prose") == []
    assert redact(ORDINARY) == ORDINARY


def test_findings_name_row_and_field_in_every_text_field() -> None:
    conversation = Conversation(
        id="0123456789abcdef0123", source="chat", origin="generated",
        messages=[Message("user", "hello"), Message("assistant", "fine", SAMPLES["hf_token"]),
                  Message("user", "and?"), Message("assistant", SAMPLES["aws_access_key"])],
        provenance={"source_file": "chat.jsonl", "generation": {"turns": [{"endpoint": SAMPLES["github_token"]}]}},
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
