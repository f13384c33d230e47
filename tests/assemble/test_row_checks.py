"""Row checks and what the build records of them, each checked against values computed here by hand: the
default drop of unclosed think blocks (replayed and generated), redaction of prompt sources before the target
sees them, every field of the ledger, and the audit's fields beyond counts."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from corpus_builder.assemble import build_corpus
from corpus_builder.layout import Corpus, iter_ledger
from corpus_builder.recipe import load_recipe
from corpus_builder.testing.fault_server import Fault, FaultServer

MODEL = "tiny-target"
AWS_KEY = "AKIA" + "ABCDEFGHIJKLMNOP"


def turns(*pairs: tuple[str, str]) -> dict[str, list[dict[str, str]]]:
    return {"messages": [{"role": role, "content": content} for role, content in pairs]}


LOG = [
    turns(("user", "first question"), ("assistant", "<think>fine reasoning</think>first answer")),  # line 1
    "{not json",  # line 2
    turns(("user", "second question"), ("assistant", "<think>never closed, the answer is lost")),  # line 3
    turns(("user", "first question"), ("assistant", "<think>fine reasoning</think>first answer")),  # 4: dup of 1
    turns(("user", "third question"), ("assistant", "plain answer")),  # line 5
]


def write_log(path: Path) -> None:
    path.write_bytes(b"".join((row.encode() if isinstance(row, str) else orjson.dumps(row)) + b"\n" for row in LOG))


def write_recipe(root: Path, *, checks: str = "", endpoint: str | None = None, prompts: bool = False) -> Path:
    write_log(root / "log.jsonl")
    target = f"{{model: {MODEL}}}" if endpoint is None else (
        f"{{model: {MODEL}, endpoints: [{endpoint}], generation: {{max_tokens: 16, timeout_s: 5, max_retries: 1}}}}")
    extra = "  - {name: asks, kind: prompts, path: prompts.jsonl}\n" if prompts else ""
    (root / "recipe.yaml").write_text(f"""\
name: checks
target: {target}
sources:
  - {{name: log, kind: replay, path: log.jsonl, task: chat, license: MIT}}
{extra}checks: {{{checks}}}
split: {{validation_fraction: 0.0}}
output: {{dir: out}}
""", encoding="utf-8")
    return root / "recipe.yaml"


def written(out: Path) -> list[dict]:
    return [row for f in sorted((out / "data").glob("*.parquet")) for row in pq.read_table(f).to_pylist()]


def test_unclosed_think_is_dropped_by_default_and_every_ledger_field_is_right(tmp_path: Path) -> None:
    result = build_corpus(load_recipe(write_recipe(tmp_path)), progress=io.StringIO())
    rows = written(result.out_dir)
    assert [row["messages"][0]["content"] for row in rows] == ["first question", "third question"]
    # The ids the ledger names are the ids those rows get when they are kept (the checks off).
    keep = tmp_path / "keep"
    keep.mkdir()
    kept = build_corpus(load_recipe(write_recipe(keep, checks="on_unclosed_think: keep")), progress=io.StringIO())
    ids = {row["messages"][0]["content"]: row["id"] for row in written(kept.out_dir)}
    ledger = list(iter_ledger(result.out_dir / "ledger.jsonl.zst"))
    assert [(r["source"], r["reason"], r["location"]) for r in ledger] == [
        ("log", "invalid_json", "log.jsonl:2"), ("log", "unclosed_think", "log.jsonl:3"),
        ("log", "duplicate", "log.jsonl:4")]
    assert ledger[0]["id"] is None and ledger[0]["detail"].startswith("unexpected character")
    assert ledger[1]["id"] == ids["second question"] and ledger[1]["detail"] == ""
    assert ledger[2]["id"] == ids["first question"] == rows[0]["id"]  # a copy has the first one's content id
    assert result.audit["skipped"] == {"duplicate": 1, "invalid_json": 1, "unclosed_think": 1}


def test_a_generated_turn_ending_inside_its_think_block_is_dropped_by_default(tmp_path: Path) -> None:
    (tmp_path / "prompts.jsonl").write_bytes(b"".join(orjson.dumps(turns(("user", f"ask {i}"))) + b"\n"
                                                      for i in range(4)))
    with FaultServer(model=MODEL, by_prompt={"ask 2": Fault("unclosed")}) as server:
        result = build_corpus(load_recipe(write_recipe(tmp_path, endpoint=server.base_url, prompts=True)),
                              progress=io.StringIO())
    generated = [row for row in written(result.out_dir) if row["origin"] == "generated"]
    assert sorted(row["messages"][-2]["content"] for row in generated) == ["ask 0", "ask 1", "ask 3"]
    (dropped,) = [r for r in iter_ledger(result.out_dir / "ledger.jsonl.zst") if r["source"] == "asks"]
    assert (dropped["reason"], dropped["location"]) == ("unclosed_think", "prompts.jsonl:3")
    assert result.audit["thinking_conversations"] == 1 + 3  # line 1 of the log, and the three generated rows


def test_secrets_in_prompt_sources_are_redacted_before_the_target_sees_them(tmp_path: Path) -> None:
    (tmp_path / "prompts.jsonl").write_bytes(orjson.dumps(turns(("user", f"my key is {AWS_KEY}, keep it"))) + b"\n")
    with FaultServer(model=MODEL) as server:
        result = build_corpus(load_recipe(write_recipe(tmp_path, endpoint=server.base_url, prompts=True,
                                                       checks="redact_secrets: true")), progress=io.StringIO())
        sent = b"".join(orjson.dumps(r.body) for r in server.chat_requests)
    assert AWS_KEY.encode() not in sent and b"[REDACTED:aws_access_key]" in sent
    corpus_text = b"".join(f.read_bytes() for f in (result.out_dir / "data").glob("*.parquet"))
    assert AWS_KEY.encode() not in corpus_text


def test_audit_fields_beyond_counts_match_the_rows_written(tmp_path: Path) -> None:
    (tmp_path / "prompts.jsonl").write_bytes(b"".join(orjson.dumps(turns(("user", f"ask {i}"))) + b"\n"
                                                      for i in range(3)))
    with FaultServer(model=MODEL, by_prompt={"ask 1": Fault("length")}) as server:
        result = build_corpus(load_recipe(write_recipe(tmp_path, endpoint=server.base_url, prompts=True,
                                                       checks="dedup: none")), progress=io.StringIO())
    rows = written(result.out_dir)
    audit = Corpus.open(result.out_dir).audit()
    characters = sum(len(m["content"]) + len(m["reasoning"] or "") for row in rows for m in row["messages"])
    answers = sum(len(m["content"]) for row in rows for m in row["messages"] if m["role"] == "assistant")
    reasoning = sum(len(m["reasoning"] or "") for row in rows for m in row["messages"])
    assert audit["characters"] == characters
    assert audit["turns"] == sum(len(row["messages"]) for row in rows)
    assert audit["reasoning_char_share"] == pytest.approx(reasoning / (answers + reasoning), abs=1e-6)
    by_origin = Counter(row["origin"] for row in rows)
    assert {k: v["conversations"] for k, v in audit["by_origin"].items()} == dict(by_origin)
    assert audit["by_source"]["log"]["task"] == "chat" and audit["by_source"]["log"]["license"] == "MIT"
    (setting,) = audit["generation"]
    assert setting["model"] == MODEL and setting["served_model"] == MODEL and setting["enable_thinking"] is True
    assert setting["sampling"] == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 16}
    assert setting["conversations"] == by_origin["generated"] == 2  # "ask 1" was cut by max_tokens: dropped
    assert audit["finish_reasons"] == {"stop": 2}
    assert audit["skipped"]["truncated_generation"] == 1


def test_a_raw_file_audit_and_a_default_build_agree_on_every_count(tmp_path: Path) -> None:
    from corpus_builder.audit import audit_corpus

    result = build_corpus(load_recipe(write_recipe(tmp_path)), progress=io.StringIO())
    raw = audit_corpus(tmp_path / "log.jsonl", secrets=False)
    built = result.audit
    for key in ("conversations", "thinking_conversations", "thinking_share", "turns", "characters",
                "reasoning_char_share", "skipped", "flags"):
        assert raw[key] == built[key], key
    assert raw["by_source"]["log.jsonl"]["conversations"] == built["by_source"]["log"]["conversations"]
