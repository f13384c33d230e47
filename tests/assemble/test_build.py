"""End-to-end `corpus build` / `corpus audit` on replay sources made of real conversations."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

import jsonschema
import orjson
import pyarrow.parquet as pq
import pytest
import zstandard

from corpus_builder.assemble import build_corpus
from corpus_builder.assemble.split import Splitter, split_balance, within_tolerance
from corpus_builder.draws import split_draw, split_draws
from corpus_builder.errors import CorpusError
from corpus_builder.layout import Corpus, iter_ledger
from corpus_builder.recipe import load_recipe
from corpus_builder.records import Conversation, Message
from corpus_builder.rows import conversations_to_batch
from tests.support.real_data import write_chitchat, write_gsm8k, write_rows, write_sharegpt

REPO = Path(__file__).resolve().parents[2]
CONVERSATION_SCHEMA = json.loads((REPO / "schemas" / "conversation.schema.json").read_text())


def write_serving_log(path: Path, n: int) -> None:
    """Real chit-chat turns with reasoning the way serving logs keep it: every other conversation has a
    ``reasoning_content`` field or a ``<think>`` block on its assistant turns."""
    # Conversations 60.. of chitchat: the chitchat source below takes its first 60, and dedup is corpus-wide.
    rows = write_chitchat(path.with_suffix(".tmp.jsonl"), 60 + n)[60:]
    path.with_suffix(".tmp.jsonl").unlink()
    logged = []
    for index, row in enumerate(rows):
        messages = []
        for message in row["messages"]:
            message = dict(message)
            if message["role"] == "assistant" and index % 2 == 0:
                if index % 4 == 0:
                    message["reasoning_content"] = f"The user said something; reply kindly ({index})."
                else:
                    message["content"] = f"<think>\nConsider the tone ({index}).\n</think>\n\n{message['content']}"
            messages.append(message)
        logged.append({"id": row["id"], "messages": messages})
    write_rows(path, logged)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    write_serving_log(root / "serving.jsonl.zst", 120)
    write_sharegpt(root / "sharegpt.jsonl", 150)
    write_gsm8k(root / "gsm8k.parquet", 80)
    write_chitchat(root / "chitchat.json", 60)
    return root


def write_recipe(path: Path, data: Path, *, min_share: float | None = None, extra_source: str = "",
                 out: str = "out") -> Path:
    checks = f"checks: {{min_thinking_share: {min_share}}}\n" if min_share is not None else ""
    path.write_text(
        "name: test-corpus\n"
        "target: {model: tiny/target}\n"
        "sources:\n"
        f"  - {{name: serving, kind: replay, path: {data}/serving.jsonl.zst, task: chat, license: Apache-2.0}}\n"
        f"  - {{name: sharegpt, kind: replay, path: {data}/sharegpt.jsonl, mapping: {{style: sharegpt}}}}\n"
        f"  - {{name: gsm8k, kind: replay, path: {data}/gsm8k.parquet, task: math, license: MIT}}\n"
        f"  - {{name: chitchat, kind: replay, path: {data}/chitchat.json, take: {{count: 40, seed: 1}}}}\n"
        f"{extra_source}"
        f"{checks}"
        "split: {validation_fraction: 0.1, seed: 7}\n"
        f"output: {{dir: {out}, rows_per_shard: 100}}\n",
        encoding="utf-8",
    )
    return path


def read_rows(corpus_dir: Path) -> list[dict]:
    rows = []
    for path in sorted((corpus_dir / "data").glob("*.parquet")):
        rows.extend(pq.read_table(path).to_pylist())
    return rows


def test_build_writes_a_complete_verified_corpus(tmp_path: Path, data_dir: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path / "recipe.yaml", data_dir))
    result = build_corpus(recipe)
    out = tmp_path / "out"
    assert result.out_dir == out and result.passed
    assert sorted(p.name for p in out.iterdir()) == [".build.lock", "audit.json", "data", "ledger.jsonl.zst",
                                                     "manifest.json", "recipe.yaml"]
    manifest = json.loads((out / "manifest.json").read_text())
    corpus = Corpus.open(out)
    assert corpus.verify_files() == []
    # shard names follow the Hub layout and the shard count is right
    for split, info in manifest["splits"].items():
        names = sorted(p.name for p in (out / "data").glob(f"{split}-*.parquet"))
        assert names == [f"{split}-{i:05d}-of-{info['shards']:05d}.parquet" for i in range(info["shards"])]
    assert manifest["splits"]["train"]["shards"] >= 2  # rows_per_shard 100 forces several shards

    rows = read_rows(out)
    assert len(rows) == manifest["conversations"] == sum(f["rows"] for f in manifest["files"])
    ids = [row["id"] for row in rows]
    assert len(set(ids)) == len(ids)
    for row in rows:
        row["provenance"] = orjson.loads(row["provenance"])
        jsonschema.validate(row, CONVERSATION_SCHEMA)
        assert "<think>" not in row["messages"][-1]["content"]
        assert row["provenance"]["source_file"] and not row["provenance"]["source_file"].startswith("/")
    by_source = Counter(row["source"] for row in rows)
    assert by_source["chitchat"] == 40
    assert by_source["gsm8k"] == 80
    # serving: half the conversations carry reasoning in one of two representations
    serving = [row for row in rows if row["source"] == "serving"]
    assert sum(row["thinking"] for row in serving) == 60
    # every split decision is per conversation, and validation carries thinking traces
    assert {row["split"] for row in rows} == {"train", "validation"}
    assert any(row["thinking"] for row in rows if row["split"] == "validation")

    # audit.json is exactly what `corpus audit --json` recomputes from the files
    audit = json.loads((out / "audit.json").read_text())
    completed = subprocess.run([sys.executable, "-m", "corpus_builder", "audit", str(out), "--json"],
                               capture_output=True, text=True, check=True)
    recomputed = json.loads(completed.stdout)
    assert recomputed.pop("secrets") == {"findings": 0, "by_kind": {}, "examples": []}
    assert {k: v for k, v in audit.items() if k != "checks"} == recomputed
    assert audit["conversations"] == len(rows)
    assert audit["thinking_conversations"] == sum(row["thinking"] for row in rows)
    assert audit["by_source"]["serving"]["thinking_share"] == 0.5
    # ShareGPT's real mess is skipped and counted, with the ledger as the record
    ledger = list(iter_ledger(out / "ledger.jsonl.zst"))
    assert audit["skipped"] == dict(Counter(r["reason"] for r in ledger))
    assert sum(audit["skipped"].values()) > 0
    assert all(r["location"].startswith(("sharegpt.jsonl:", "serving.jsonl.zst:", "chitchat.json#",
                                         "gsm8k.parquet#")) for r in ledger)


def test_rebuild_is_deterministic(tmp_path: Path, data_dir: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path / "recipe.yaml", data_dir))
    first = build_corpus(recipe, tmp_path / "a").manifest
    second = build_corpus(recipe, tmp_path / "b").manifest
    assert first == second  # same shard bytes (sha256), same counts, same recipe hash


def test_thinking_share_below_minimum_fails_the_build(tmp_path: Path, data_dir: Path) -> None:
    recipe_path = write_recipe(tmp_path / "recipe.yaml", data_dir, min_share=0.45)
    completed = subprocess.run([sys.executable, "-m", "corpus_builder", "build", str(recipe_path)],
                               capture_output=True, text=True)
    assert completed.returncode == 1
    assert "thinking share" in completed.stderr and "below the minimum 45.0%" in completed.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["checks"]["passed"] is False


def test_failed_build_leaves_no_complete_corpus_and_keeps_the_previous_one(tmp_path: Path, data_dir: Path) -> None:
    good = load_recipe(write_recipe(tmp_path / "recipe.yaml", data_dir))
    build_corpus(good)
    before = (tmp_path / "out" / "manifest.json").read_bytes()
    broken = tmp_path / "broken.jsonl.zst"
    payload = zstandard.ZstdCompressor().compress(b'{"messages": []}\n' * 2000)
    broken.write_bytes(payload[: len(payload) // 2])
    recipe = load_recipe(write_recipe(tmp_path / "recipe.yaml", data_dir,
                                      extra_source=f"  - {{name: broken, kind: replay, path: {broken}}}\n"))
    with pytest.raises(CorpusError, match=r"broken\.jsonl\.zst"):
        build_corpus(recipe)
    out = tmp_path / "out"
    assert (out / "manifest.json").read_bytes() == before
    assert Corpus.open(out).verify_files() == []
    assert not [p for p in out.iterdir() if p.name.startswith(".staging")]


def test_failed_first_build_leaves_nothing(tmp_path: Path, data_dir: Path) -> None:
    broken = tmp_path / "broken.jsonl.zst"
    payload = zstandard.ZstdCompressor().compress(b'{"messages": []}\n' * 2000)
    broken.write_bytes(payload[: len(payload) // 2])
    recipe = load_recipe(write_recipe(tmp_path / "recipe.yaml", data_dir,
                                      extra_source=f"  - {{name: broken, kind: replay, path: {broken}}}\n"))
    with pytest.raises(CorpusError, match="truncated zstd"):
        build_corpus(recipe)
    assert not (tmp_path / "out").exists()


def test_killed_build_never_looks_complete(tmp_path: Path, data_dir: Path) -> None:
    out = tmp_path / "fresh"
    recipe_path = write_recipe(tmp_path / "recipe.yaml", data_dir, out=str(out))
    process = subprocess.Popen([sys.executable, "-c", (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from corpus_builder.assemble import pipeline\n"
        "from corpus_builder.recipe import load_recipe\n"
        "real = pipeline.finish_corpus\n"
        "def dying(*args, **kwargs):\n"
        "    result = real(*args, **kwargs)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "pipeline.finish_corpus = dying\n"
        f"pipeline.build_corpus(load_recipe(Path({str(recipe_path)!r})))\n")])
    assert process.wait() == -9
    assert not (out / "manifest.json").exists()
    with pytest.raises(CorpusError, match=r"manifest\.json is missing"):
        Corpus.open(out)
    build_corpus(load_recipe(recipe_path))  # a re-run cleans the staging left behind and completes
    assert [p.name for p in out.iterdir() if p.name.startswith(".staging")] == []
    assert Corpus.open(out).verify_files() == []


def test_refuses_an_output_directory_that_is_not_a_corpus(tmp_path: Path, data_dir: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(CorpusError, match="not part of a corpus"):
        build_corpus(load_recipe(write_recipe(tmp_path / "recipe.yaml", data_dir)))
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"


def _conversation(index: int, source: str, thinking: bool) -> Conversation:
    reasoning = "because" if thinking else None
    return Conversation(f"{index:020x}", source, "replay",
                        [Message("user", f"q{index}"), Message("assistant", "a", reasoning)])


def test_split_is_stratified_within_tolerance_and_depends_on_identity_and_seed_only() -> None:
    rows = [_conversation(i, f"s{i % 3}", i % 5 == 0) for i in range(30000)]
    splitter = Splitter(0.05, seed=3)
    assigned = [(row.source, row.thinking, splitter.assign(row)) for row in rows]
    strata = Counter((s, t) for s, t, _ in assigned)
    validation = Counter((s, t) for s, t, split in assigned if split == "validation")
    for stratum, size in strata.items():  # binomial: 3 sigma + 1 row, the tolerance build.split states
        assert abs(validation[stratum] - 0.05 * size) <= 3 * (0.05 * 0.95 * size) ** 0.5 + 1, stratum
        assert within_tolerance(size, validation[stratum], 0.05)
    assert not within_tolerance(1000, 80, 0.05) and within_tolerance(1000, 55, 0.05)
    other = Splitter(0.05, seed=4)
    assert [other.assign(r) for r in rows] != [a[2] for a in assigned]
    again = Splitter(0.05, seed=3)
    assert [again.assign(r) for r in reversed(rows)] == [a[2] for a in reversed(assigned)]  # order: irrelevant
    # A row added or dropped moves no other row across the split (a top-up filled in 5 rows and moved 19).
    fewer = [r for i, r in enumerate(rows) if i % 7]
    assert [Splitter(0.05, seed=3).assign(r) for r in fewer] == [a[2] for i, a in enumerate(assigned) if i % 7]


@pytest.mark.parametrize("fraction", [0.0, 0.02, 0.5])
def test_a_batch_of_ids_is_split_as_each_id_alone(fraction: float) -> None:
    """The columnar path splits a block's ids at once (``assign_ids``): the same split as one id at a time, the
    draws the same floats (a draw equal to the fraction goes to train)."""
    ids = [f"{index:020x}" for index in range(5000)] + ["", "é", "x" * 300]
    splitter = Splitter(fraction, seed=11)
    assert splitter.assign_ids(ids).to_pylist() == [splitter.assign_id(row_id) for row_id in ids]
    assert split_draws(11, ids).tolist() == [split_draw(11, row_id) for row_id in ids]
    edge = Splitter(split_draw(11, ids[7]), seed=11)
    assert edge.assign_ids(ids[7:8]).to_pylist() == [edge.assign_id(ids[7])] == ["train"]
    assert Splitter(0.3, seed=0).assign_ids([]).to_pylist() == []


@pytest.mark.parametrize("fraction", [0.02, 0.05, 0.3])
@pytest.mark.parametrize("rows", [40, 1000, 30000])
def test_a_validation_stratum_is_checked_on_both_sides_of_its_fraction(rows: int, fraction: float) -> None:
    """The tolerance is two-sided: a stratum under-filled in validation is outside it as much as one over-filled,
    at the same distance from the expected count (3 standard deviations plus one row, as build.split states)."""
    expected = rows * fraction
    tolerance = 3 * math.sqrt(expected * (1 - fraction)) + 1
    lowest, highest = math.ceil(expected - tolerance), math.floor(expected + tolerance)
    assert within_tolerance(rows, highest, fraction) and not within_tolerance(rows, highest + 1, fraction)
    assert not within_tolerance(rows, lowest - 1, fraction)
    assert within_tolerance(rows, lowest, fraction) or lowest < 0  # no count is below zero
    under, over = lowest - 1, highest + 1
    outside = split_balance({"logs": {"thinking": {"train": rows - max(0, under), "validation": max(0, under)},
                                      "no_thinking": {"train": rows - over, "validation": over}},
                             "chats": {"no_thinking": {"train": rows}}}, fraction)  # none in validation
    line = f"{{}}: {{:,}} of {rows:,} rows in validation, expected {expected:,.1f}".format
    assert outside == ([line("logs (thinking)", under)] if under >= 0 else []) + [line("logs (no_thinking)", over)] + (
        [line("chats (no_thinking)", 0)] if lowest > 0 else [])


def test_parallel_parsing_gives_the_same_corpus_as_a_sequential_read(tmp_path: Path, data_dir: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Byte ranges of one .jsonl across worker processes: same rows, ids, splits and shard bytes."""
    import corpus_builder.sources.readers as readers

    big = tmp_path / "big.jsonl"
    # real ShareGPT rows, repeated with a counter so they stay distinct: several ranges of ~4 kB each
    rows = [json.loads(line) for line in (data_dir / "sharegpt.jsonl").read_text().split("\n") if line]
    with big.open("w") as handle:
        for copy in range(3):
            for row in rows:
                turns = [dict(turn) for turn in row.get("conversations", [])]
                if turns:
                    turns[0]["value"] = f"{turns[0].get('value')} ({copy})"
                handle.write(json.dumps({**row, "conversations": turns}) + "\n")
        handle.write("{broken\n")
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(
        "name: parallel\ntarget: {model: m}\n"
        "sources:\n"
        f"  - {{name: big, kind: replay, path: {big}, mapping: {{style: sharegpt}}, take: {{fraction: 0.8}}}}\n"
        f"  - {{name: serving, kind: replay, path: {data_dir}/serving.jsonl.zst}}\n"
        "checks: {dedup: exact}\nsplit: {validation_fraction: 0.2}\noutput: {dir: out, rows_per_shard: 70}\n")
    monkeypatch.setattr(readers, "MIN_RANGE_BYTES", 4096)
    manifests = {}
    for workers in ("1", "3"):
        monkeypatch.setenv("CORPUS_WORKERS", workers)
        result = build_corpus(load_recipe(recipe_path), tmp_path / f"out-{workers}")
        manifests[workers] = result.manifest.to_json()
        ledger = sorted((r["location"], r["reason"]) for r in iter_ledger(result.out_dir / "ledger.jsonl.zst"))
        if ("big.jsonl:" + str(3 * len(rows) + 1), "invalid_json") not in ledger:  # sampled out by take
            assert not any(location.startswith("big.jsonl") and reason == "invalid_json"
                           for location, reason in ledger)
        manifests[workers]["ledger"] = ledger
    assert manifests["1"] == manifests["3"]
    assert manifests["1"]["conversations"] > 100


def test_redaction_step_removes_secrets_before_they_reach_the_corpus(tmp_path: Path) -> None:
    from corpus_builder.publish import check_corpus

    token = "hf_" + "Zq7" * 12
    key = "sk-proj-" + "Ab9x" * 10
    rows = [{"messages": [{"role": "user", "content": f"use {token} please"},
                          {"role": "assistant", "content": "ok", "reasoning_content": f"the key {key} is live"}]},
            {"messages": [{"role": "user", "content": "plain"}, {"role": "assistant", "content": "text"}]}]
    write_rows(tmp_path / "log.jsonl", rows)
    recipe = tmp_path / "recipe.yaml"
    body = ("name: redact\ntarget: {model: m}\nsources:\n  - {name: log, kind: replay, path: log.jsonl}\n"
            "split: {validation_fraction: 0}\noutput: {dir: out}\n")
    recipe.write_text(body)
    assert any("secrets" in failure for failure in check_corpus(build_corpus(load_recipe(recipe)).out_dir).failures)
    recipe.write_text(body + "checks: {redact_secrets: true}\n")
    out = build_corpus(load_recipe(recipe)).out_dir
    texts = json.dumps(read_rows(out))
    assert token not in texts and key not in texts
    assert "[REDACTED:hf_token]" in texts and "[REDACTED:openai_key]" in texts
    assert not [f for f in check_corpus(out).failures if "secrets" in f]


def test_the_batch_thinking_column_follows_the_conversation_rule() -> None:
    """conversations_to_batch computes `thinking` on the Arrow columns: it must equal Conversation.thinking."""
    def conversation(*messages: Message) -> Conversation:
        return Conversation("c", "s", "replay", list(messages))

    user, plain = Message("user", "q"), Message("assistant", "a")
    conversations = [
        conversation(),
        conversation(user, plain),
        conversation(user, Message("assistant", "a", "")),  # empty reasoning is no reasoning
        conversation(Message("user", "q", "user-side notes"), plain),  # only assistant reasoning counts
        conversation(user, Message("assistant", "a", "why")),
        conversation(user, plain, user, Message("assistant", "b", "why")),  # the last turn alone
        conversation(Message("system", "s"), user, Message("assistant", "a", "why"), user, plain),
    ]
    column = conversations_to_batch(conversations).column("thinking").to_pylist()
    assert column == [c.thinking for c in conversations] == [False, False, False, False, True, True, True]


def test_a_build_that_drops_every_row_writes_nothing_unless_asked(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: empty\ntarget: {model: m}\nsources:\n  - {name: log, kind: replay, path: log.jsonl}\n"
                      "output: {dir: out}\n")

    def corpus_build(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "corpus_builder", "build", str(recipe), *flags],
                              capture_output=True, text=True)

    dropped = [{"messages": [{"role": "user", "content": f"a question alone {i}"}]} for i in range(3)]
    write_rows(tmp_path / "log.jsonl", [*dropped, {"messages": "not a list"}, {"messages": []}])
    failed = corpus_build()
    assert failed.returncode == 1 and "Traceback" not in failed.stderr, failed.stderr
    assert f"{recipe}: the corpus would be empty: all 5 rows were dropped or skipped" in failed.stderr
    assert "no_assistant_turn: 3 rows" in failed.stderr and "bad_messages: 2 rows" in failed.stderr
    assert "--allow-empty" in failed.stderr and "wrote 0" not in failed.stderr
    assert not (tmp_path / "out").exists()  # a first build: nothing at all
    write_rows(tmp_path / "log.jsonl", [{"messages": [{"role": "user", "content": "hi"},
                                                      {"role": "assistant", "content": "hello"}]}])
    assert corpus_build().returncode == 0
    before = (tmp_path / "out" / "manifest.json").read_bytes()
    write_rows(tmp_path / "log.jsonl", dropped)
    assert corpus_build().returncode == 1
    assert (tmp_path / "out" / "manifest.json").read_bytes() == before  # the earlier corpus stays as it was
    allowed = corpus_build("--allow-empty")
    assert allowed.returncode == 0 and "wrote 0 conversations" in allowed.stderr, allowed.stderr
    assert Corpus.open(tmp_path / "out").manifest.conversations == 0
