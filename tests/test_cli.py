"""The `corpus` command as a user runs it: exit codes, messages, start-up cost."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import zstandard

HEAVY = ("torch", "transformers", "vllm", "datasets", "huggingface_hub")


def corpus(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corpus_builder", *args], capture_output=True, text=True,
                          cwd=cwd)


def imported_modules(*args: str) -> set[str]:
    completed = subprocess.run([sys.executable, "-X", "importtime", "-m", "corpus_builder", *args],
                               capture_output=True, text=True)
    names = set()
    for line in completed.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


def write_recipe(path: Path, body: str) -> Path:
    path.write_text(body, encoding="utf-8")
    return path


VALID = """\
name: cli-test
target: {model: tiny/target}
sources:
  - {name: log, kind: replay, path: log.jsonl}
output: {dir: out}
"""


@pytest.fixture
def log_file(tmp_path: Path) -> Path:
    rows = [
        {"messages": [{"role": "user", "content": "hi"},
                      {"role": "assistant", "content": "<think>\ngreet back\n</think>\n\nhello"}]},
        {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]},
        {"messages": [{"role": "assistant", "content": "wrong order"}, {"role": "user", "content": "x"}]},
    ]
    path = tmp_path / "log.jsonl"
    bad = [b"{not json", b"[1, 2]", b'{"messages": [{"role": "user", "content": "\xff"}]}']
    lines = [orjson.dumps(r) for r in rows] + bad
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_help_validate_and_audit_import_no_heavy_modules(tmp_path: Path, log_file: Path) -> None:
    recipe = write_recipe(tmp_path / "recipe.yaml", VALID)
    for args in (["--help"], ["validate", str(recipe)], ["audit", str(log_file)]):
        heavy = imported_modules(*args) & set(HEAVY)
        assert not heavy, (args, heavy)


def test_validate_ok_and_problems(tmp_path: Path, log_file: Path) -> None:
    ok = corpus("validate", str(write_recipe(tmp_path / "ok.yaml", VALID)))
    assert ok.returncode == 0, ok.stderr
    assert "ok" in ok.stdout
    bad = write_recipe(tmp_path / "bad.yaml", VALID.replace("output:", "outptu:") + "  extra: [\n")
    completed = corpus("validate", str(bad))
    assert completed.returncode == 2
    assert "bad.yaml:" in completed.stderr
    typo = write_recipe(tmp_path / "typo.yaml", VALID.replace("output:", "outptu:"))
    completed = corpus("validate", str(typo))
    assert completed.returncode == 2
    assert "typo.yaml:5:" in completed.stderr and "did you mean 'output'" in completed.stderr


def test_build_with_a_bad_recipe_exits_2_and_writes_nothing(tmp_path: Path, log_file: Path) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", VALID.replace("kind: replay", "kind: replya"))
    completed = corpus("build", str(recipe))
    assert completed.returncode == 2
    assert "r.yaml:4:" in completed.stderr and "Traceback" not in completed.stderr
    assert not (tmp_path / "out").exists()


def test_audit_raw_file_counts_skipped_rows(log_file: Path) -> None:
    completed = corpus("audit", str(log_file), "--json")
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout)
    assert report["conversations"] == 2
    assert report["thinking_conversations"] == 1
    assert report["thinking_share"] == 0.5
    assert report["skipped"] == {"invalid_json": 1, "invalid_utf8": 1, "not_an_object": 1, "wrong_role_order": 1}
    assert report["by_source"]["log.jsonl"] == {**report["by_source"]["log.jsonl"], "conversations": 2,
                                                "thinking_share": 0.5}
    human = corpus("audit", str(log_file))
    assert "thinking" in human.stdout and "50.0%" in human.stdout and "invalid_json" in human.stdout
    below = corpus("audit", str(log_file), "--min-thinking-share", "0.6")
    assert below.returncode == 1 and "below the minimum 60.0%" in below.stderr
    assert corpus("audit", str(log_file), "--min-thinking-share", "0.5").returncode == 0


def test_audit_scans_for_secrets_without_echoing_them(tmp_path: Path) -> None:
    token = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz012345"
    aws = "AKIA" + "IOSFODNN7EXAMPLE"
    path = tmp_path / "log.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"deploy with {token}"},
                          {"role": "assistant", "content": "done", "reasoning_content": f"key {aws} seen"}]},
            {"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]}]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    completed = corpus("audit", str(path), "--json")
    assert completed.returncode == 1
    secrets = json.loads(completed.stdout)["secrets"]
    assert secrets["findings"] == 2 and set(secrets["by_kind"]) == {"hf_token", "aws_access_key"}
    assert any("messages[0].content" in e for e in secrets["examples"])
    assert any("messages[1].reasoning" in e for e in secrets["examples"])
    assert token not in completed.stdout + completed.stderr and aws not in completed.stdout + completed.stderr
    assert corpus("audit", str(path), "--no-secrets").returncode == 0


@pytest.mark.parametrize("problem", ["missing", "empty", "truncated_zstd", "not_a_corpus_dir"])
def test_audit_unreadable_input_exits_2_naming_the_file(tmp_path: Path, problem: str) -> None:
    if problem == "missing":
        target = tmp_path / "nope.jsonl"
    elif problem == "empty":
        target = tmp_path / "empty.jsonl"
        target.write_bytes(b"")
    elif problem == "truncated_zstd":
        target = tmp_path / "cut.jsonl.zst"
        data = zstandard.ZstdCompressor().compress(b'{"messages": [{"role": "user", "content": "x"}]}\n' * 500)
        target.write_bytes(data[:-20])
    else:
        target = tmp_path / "dir"
        target.mkdir()
    completed = corpus("audit", str(target))
    assert completed.returncode == 2, completed.stderr
    assert target.name in completed.stderr and "Traceback" not in completed.stderr


def test_validate_never_prints_a_credential_from_the_recipe(tmp_path: Path) -> None:
    password, token = "s3cret-" + "pw", "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz012345"
    recipe = write_recipe(tmp_path / "leaky.yaml", f"""\
name: leaky
target: {{model: tiny/target, endpoints: ['http://ops:{password}@gpu-box:8000/v1'], revision: [{token}]}}
sources:
  - {{name: dump, kind: replay, path: 'ftp://loader:{password}@files.example.com/dump.jsonl'}}
  - {{name: other, kind: replay, path: log.jsonl, {token}: 1}}
output: {{dir: out}}
""")
    completed = corpus("validate", str(recipe))
    assert completed.returncode == 2 and "Traceback" not in completed.stderr
    shown = completed.stdout + completed.stderr
    assert "ftp://***@files.example.com/dump.jsonl" in shown  # the problem is still named
    assert password not in shown and token not in shown and "loader" not in shown


@pytest.mark.parametrize("command", [["audit"], ["export", "--format", "messages", "--out", "x"], ["vocab"],
                                     ["publish", "--repo", "org/name", "--dry-run"]])
def test_a_missing_corpus_path_is_no_such_file_and_an_empty_directory_has_no_manifest(tmp_path: Path,
                                                                                      command: list[str]) -> None:
    name, *options = command
    missing = corpus(name, str(tmp_path / "no-such-corpus"), *options, cwd=tmp_path)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "no-such-corpus: no such file or directory" in missing.stderr
    assert "manifest" not in missing.stderr
    (tmp_path / "half-built").mkdir()
    half = corpus(name, str(tmp_path / "half-built"), *options, cwd=tmp_path)
    assert half.returncode == 2 and "manifest.json is missing (interrupted or failed build?)" in half.stderr


def test_the_documented_exit_codes_of_audit_include_the_secrets_scan() -> None:
    reference = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    audit = reference[reference.index("## `corpus audit`"):reference.index("## `corpus publish`")]
    [row] = [line for line in audit.splitlines() if line.startswith("| 1 |")]
    assert re.search(r"\bthe secrets scan found a credential\b", row)  # test_audit_scans_for_secrets...: exit 1
