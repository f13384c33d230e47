"""`corpus audit CORPUS --against TRAFFIC`: divergences, gaps and suggestions on traffic of a known mix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import zstandard

from corpus_builder.audit import AuditOptions, audit_against
from corpus_builder.audit.token_pass import TokenMeter
from corpus_builder.audit.traffic import FACT_DIMENSIONS, TOKEN_DIMENSIONS, profile_corpus
from corpus_builder.export import corpus_token_rows
from corpus_builder.export.vocab import count_frequencies
from corpus_builder.layout import Corpus
from corpus_builder.records import Conversation, Message, Provenance
from corpus_builder.tokens import TemplateRenderer, TokenRows

from .fixtures import CHATS, DOCS, chat_row, corpus_rows, known_traffic, summary_row, write_jsonl


def tvd(report: dict[str, Any]) -> dict[str, float]:
    return {name: section["tvd"] for name, section in report["divergence"].items()}


def test_known_traffic_gives_known_divergences(corpus: Path, traffic: Path) -> None:
    report = audit_against(corpus, str(traffic))
    distances = tvd(report)
    # thinking 20% -> 100%; chat/summarization 60/40 -> 80/20; one turn everywhere, no tools, all latin
    assert distances["thinking"] == pytest.approx(0.8)
    assert distances["task"] == pytest.approx(0.2)
    assert distances["task_thinking"] == pytest.approx(0.8)  # 0.5 * (0.6 + 0.8 + 0.2 + 0)
    assert distances["turns"] == distances["tool_calls"] == distances["script"] == 0
    # chats < 128 tokens, summaries 512-1k; chat turns copy nothing, summary turns copy throughout
    assert distances["conversation_tokens"] == pytest.approx(0.2)
    assert distances["prompt_tokens"] == pytest.approx(0.2)
    assert distances["copy_share"] == pytest.approx(0.2)
    corpus_side, traffic_side = report["corpus"], report["traffic"]
    assert corpus_side["shares"]["conversation_tokens"] == {"<128": 0.6, "512-1k": 0.4}
    assert traffic_side["shares"]["conversation_tokens"] == {"<128": 0.8, "512-1k": 0.2}
    assert traffic_side["shares"]["copy_share"] == {"0": 0.8, "75-100%": 0.2}
    assert report["divergence"]["thinking"]["gaps"] == [
        {"bucket": "non-thinking", "corpus": 0.8, "traffic": 0.0, "gap": -0.8},
        {"bucket": "thinking", "corpus": 0.2, "traffic": 1.0, "gap": 0.8}]
    assert report["max_divergence"]["tvd"] == pytest.approx(0.8)
    assert corpus_side["thinking_share"] == 0.2 and traffic_side["thinking_share"] == 1.0
    assert traffic_side["served"] == {"on": 80, "unrecorded": 20}  # summaries do not record the mode
    assert corpus_side["by_task"]["summarization"]["thinking_share"] == 0.5
    copies = traffic_side["copies"]["by_task"]
    assert copies["chat"]["copied_tokens"] == 0
    assert copies["summarization"]["share"] > 0.85 and copies["summarization"]["longest"] > 50
    assert 0 < report["divergence"]["token_frequencies"]["tvd"] < 1


def test_known_traffic_gives_the_rows_to_add_and_drop(corpus: Path, traffic: Path, tmp_path: Path) -> None:
    report = audit_against(corpus, str(traffic))
    plan = {entry["source"]: entry for entry in report["plan"]}
    assert (plan["chats"]["rows"], plan["chats"]["target_rows"], plan["chats"]["change"]) == (CHATS, 80, 20)
    assert (plan["docs"]["rows"], plan["docs"]["target_rows"], plan["docs"]["change"]) == (DOCS, 20, -20)
    suggestions = "\n".join(report["suggestions"])
    assert "task chat: the traffic is 100% thinking, its sources reach 0% at most" in suggestions
    assert "task summarization: the traffic is 100% thinking, its sources reach 50% at most" in suggestions
    assert "source chats: all 60 of its rows are read already: find 20 more rows of task chat" in suggestions
    assert "task summarization: " in suggestions and "prompt-lookup (n-gram) speculation" in suggestions
    # The diff applies to the corpus's recipe and asks for exactly the planned rows.
    recipe = tmp_path / "recipe.yaml"
    recipe.write_bytes((corpus / "recipe.yaml").read_bytes())
    patched = subprocess.run(["patch", str(recipe)], input=report["recipe_diff"], text=True, capture_output=True)
    assert patched.returncode == 0, patched.stdout + patched.stderr
    import yaml

    takes = {spec["name"]: spec.get("take") for spec in yaml.safe_load(recipe.read_text())["sources"]}
    assert takes == {"chats": {"count": 80, "seed": 0}, "docs": {"count": 20, "seed": 0}}


def test_traffic_identical_to_the_corpus_is_at_distance_zero(corpus: Path, tmp_path: Path) -> None:
    chats, docs = corpus_rows()
    traffic = write_jsonl(tmp_path / "same.jsonl", docs + chats)  # another order: order never matters
    report = audit_against(corpus, str(traffic))
    assert set(report["divergence"]) == {*FACT_DIMENSIONS, *TOKEN_DIMENSIONS}
    assert tvd(report) == dict.fromkeys(report["divergence"], 0.0)
    assert all(entry["change"] == 0 for entry in report["plan"])
    assert report["recipe_diff"] is None
    vocab = report["vocab"]
    assert vocab["traffic_coverage"] == vocab["corpus_coverage"] == vocab["traffic_oracle_coverage"]


def test_daily_logs_compressed_with_bad_lines_read_like_one_file(corpus: Path, traffic: Path, tmp_path: Path) -> None:
    rows = known_traffic()
    logs = tmp_path / "logs"
    logs.mkdir()
    write_jsonl(logs / "2026-11-30.jsonl", rows[::2], extra=b"{not json\n\n")
    plain = b"".join(orjson.dumps(row) + b"\n" for row in rows[1::2]) + b"[1, 2]\n"
    (logs / "2026-12-01.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(plain))
    together = audit_against(corpus, str(logs / "*.jsonl*"))
    alone = audit_against(corpus, str(traffic))
    assert tvd(together) == tvd(alone)
    assert together["traffic"]["conversations"] == 100
    assert together["traffic"]["skipped"] == {"invalid_json": 1, "not_an_object": 1}
    assert together["plan"] == alone["plan"]


def test_a_recipe_names_the_traffic_tasks(corpus: Path, tmp_path: Path) -> None:
    """Rows without a task field take their recipe source's task tag."""
    def untagged(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{key: value for key, value in row.items() if key != "task"} for row in rows]

    write_jsonl(tmp_path / "chat-log.jsonl", untagged([chat_row(i, thinking=False) for i in range(70)]))
    write_jsonl(tmp_path / "docs-log.jsonl", untagged([summary_row(i, thinking=False) for i in range(30)]))
    (tmp_path / "traffic.yaml").write_text("""
name: serving
target: {model: tiny/target}
sources:
  - {name: chat-app, kind: replay, path: chat-log.jsonl, task: chat}
  - {name: doc-app, kind: replay, path: docs-log.jsonl, task: summarization}
output: {dir: unused}
""", encoding="utf-8")
    report = audit_against(corpus, str(tmp_path / "traffic.yaml"))
    assert report["traffic"]["shares"]["task"] == {"chat": 0.7, "summarization": 0.3}
    assert tvd(report)["task"] == pytest.approx(0.1)
    assert set(report["traffic"]["by_source"]) == {"chat-app", "doc-app"}


def test_token_sample_is_spread_seeded_and_the_rest_still_counted(corpus: Path, tmp_path: Path) -> None:
    rows = [chat_row(i, thinking=i % 3 == 0) for i in range(3000)]
    traffic = write_jsonl(tmp_path / "big.jsonl", rows)
    options = AuditOptions(token_sample=600)
    first, second = (audit_against(corpus, str(traffic), options) for _ in range(2))
    sample = first["traffic"]["token_sample"]
    assert sample["of"] == first["traffic"]["conversations"] == 3000
    assert 450 <= sample["conversations"] <= 750
    assert first["traffic"]["counts"] == second["traffic"]["counts"]  # the same rows, run after run
    assert first["traffic"]["thinking_share"] == pytest.approx(1000 / 3000, abs=1e-6)
    reasoning = first["traffic"]["counts"]["reasoning_tokens"]
    assert sum(reasoning.values()) == pytest.approx(sample["conversations"] / 3, rel=0.2)


def conversation(*messages: Message) -> Conversation:
    return Conversation("c", "log", "replay", list(messages), task="chat")


TRICKY = [
    conversation(Message("user", "hi there"), Message("assistant", "hello", "greet back"),
                 Message("user", "what is 2+2?"), Message("assistant", "4", None)),
    conversation(Message("system", "Be brief."), Message("user", "quote <|im_end|> back"),
                 Message("assistant", "here: <|im_end|> done", "they want the marker")),
    conversation(Message("user", "a " * 40), Message("assistant", "a " * 30 + "b", "think a lot " * 20)),
    conversation(Message("user", "no reasoning here"), Message("assistant", "none at all")),
]


def generated(renderer: TemplateRenderer) -> Conversation:
    """A generated conversation: its second turn has served ids (the truth for it), the first is re-rendered."""
    close = renderer.token_id("</think>")
    served = {"message_index": 3, "prompt_token_ids": list(range(10, 60)), "token_ids": [5, 6, 7, close, 8, 9]}
    made = conversation(Message("user", "hi there"), Message("assistant", "hello", "greet back"),
                        Message("user", "and now?"), Message("assistant", "now this", "think"))
    made.origin = "generated"
    made.provenance = Provenance.from_json({"generation": {"turns": [served]}})
    return made


@pytest.mark.parametrize("history", ["keep", "drop"])
def test_the_token_pass_measures_the_rows_of_token_rows(tiny_model_dir: Path, history: str) -> None:
    """One render cut into pieces gives TokenRows' own rows: prompt, supervised ids, reasoning, budget."""
    renderer = TemplateRenderer(tiny_model_dir, history_reasoning=history)
    conversations = [*TRICKY, generated(renderer)]
    expected = TokenRows(renderer).tokenize(conversations)
    measured = TokenMeter(renderer).measure(conversations)
    rows = [(number, row) for number, item in enumerate(expected) for row in item.rows]
    # Per turn (in any order: served turns are measured on views of their own): conversation, prompt,
    # response, reasoning, and the supervised ids.
    ends = np.cumsum(measured.turn_response)
    ids = measured.supervised_ids.tolist()
    got = sorted((int(n), int(p), int(r), int(q), tuple(ids[e - r:e])) for n, p, r, q, e in zip(
        measured.turn_conversation, measured.turn_prompt, measured.turn_response, measured.turn_reasoning, ends,
        strict=True))
    assert got == sorted((number, row.start, row.supervised, row.reasoning, tuple(row.input_ids[row.start:]))
                         for number, row in rows)
    assert (4, 50, 6, 4) in [entry[:4] for entry in got]  # the served turn: its own ids, reasoning through </think>
    assert measured.conversation_tokens.tolist() == [item.tokens for item in expected]
    assert measured.unmeasured_turns == 0


def test_copy_spans_count_the_copied_response_tokens(tiny_model_dir: Path) -> None:
    document = " ".join(f"word{i}" for i in range(200))
    renderer = TemplateRenderer(tiny_model_dir)
    copied = conversation(Message("user", f"Repeat: {document}"), Message("assistant", document))
    fresh = conversation(Message("user", "Say something new."), Message("assistant", document))
    measured = TokenMeter(renderer, span_tokens=8).measure([copied, fresh])
    response = measured.turn_response
    assert measured.turn_copied[1] == 0  # a long answer that is in no prompt copies nothing
    assert measured.turn_copied[0] >= response[0] - 8  # all but the edges of the copied answer
    assert measured.turn_longest_copy[0] == measured.turn_copied[0]  # one span
    # Only the context before the response counts (prompt lookup's source): an answer repeating itself is no copy.
    twice = conversation(Message("user", "Say it twice."), Message("assistant", f"{document} {document}"))
    assert TokenMeter(renderer, span_tokens=8).measure([twice]).turn_copied.tolist() == [0]


def test_the_corpus_vocabulary_is_the_one_corpus_vocab_chooses(corpus: Path) -> None:
    opened = Corpus.open(corpus)
    profile, _ = profile_corpus(opened, AuditOptions())
    token_rows = corpus_token_rows(opened)
    assert token_rows is not None and profile.tokens is not None
    assert np.array_equal(profile.tokens.frequencies, count_frequencies(opened, token_rows).total)


def corpus_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corpus_builder", *args], capture_output=True, text=True)


def test_cli_exit_codes_json_and_html(corpus: Path, traffic: Path, tmp_path: Path) -> None:
    failed = corpus_cli("audit", str(corpus), "--against", str(traffic), "--max-divergence", "0.5", "--json",
                        "--html", str(tmp_path / "report.html"))
    assert failed.returncode == 1, failed.stderr
    assert "check failed: thinking: total variation distance 0.800 exceeds --max-divergence 0.5" in failed.stderr
    document = json.loads(failed.stdout)
    assert document["divergence"]["thinking"]["tvd"] == pytest.approx(0.8)
    assert document["audit"]["conversations"] == CHATS + DOCS
    assert (tmp_path / "report.html").stat().st_size > 1_000_000  # plotly.js is inside
    passed = corpus_cli("audit", str(corpus), "--against", str(traffic), "--max-divergence", "0.85")
    assert passed.returncode == 0, passed.stderr
    assert "thinking" in passed.stdout and "recipe.yaml (matched to the traffic)" in passed.stdout
    alone = corpus_cli("audit", str(corpus), "--max-divergence", "0.5")
    assert alone.returncode == 2 and "--max-divergence needs --against" in alone.stderr
    raw = corpus_cli("audit", str(traffic), "--against", str(traffic))
    assert raw.returncode == 2 and "compare a built corpus" in raw.stderr and "Traceback" not in raw.stderr


def test_help_and_the_plain_audit_load_neither_polars_nor_plotly(traffic: Path) -> None:
    for args in (["--help"], ["audit", str(traffic)]):
        completed = subprocess.run([sys.executable, "-X", "importtime", "-m", "corpus_builder", *args],
                                   capture_output=True, text=True)
        assert completed.returncode == 0, completed.stderr
        loaded = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in completed.stderr.splitlines()
                  if line.startswith("import time:") and "|" in line}
        assert not loaded & {"polars", "plotly"}, args


def test_script_and_tool_call_mix(corpus: Path, tmp_path: Path) -> None:
    """10 of 100 chats in Chinese, 5 with a tool call (an OpenAI ``tool_calls`` turn and the tool's result)."""
    rows = [chat_row(i, thinking=False) for i in range(100)]
    for row in rows[:10]:
        row["messages"][0]["content"] = "你好，请帮我总结一下这篇关于机器学习的文章。"
    for index, row in enumerate(rows[10:15]):
        call = {"id": f"call-{index}", "type": "function", "function": {"name": "search", "arguments": "{}"}}
        row["messages"][1:1] = [{"role": "assistant", "content": "", "tool_calls": [call]},
                                {"role": "tool", "tool_call_id": f"call-{index}", "content": "found it"}]
    report = audit_against(corpus, str(write_jsonl(tmp_path / "mixed.jsonl", rows)))
    shares = report["traffic"]["shares"]
    assert shares["script"] == {"han": 0.1, "latin": 0.9}
    assert shares["tool_calls"] == {"with tool calls": 0.05, "without": 0.95}
    assert tvd(report)["script"] == pytest.approx(0.1)
    assert tvd(report)["tool_calls"] == pytest.approx(0.05)
    # All of that traffic is chat: the summaries' source goes, and the suggestions say so.
    plan = {entry["source"]: entry["target_rows"] for entry in report["plan"]}
    assert plan == {"chats": CHATS + DOCS, "docs": 0}
    assert any(note.startswith("task summarization: none of the traffic; the diff removes its sources (docs)")
               for note in report["suggestions"])
    assert "- name: docs" in report["recipe_diff"]


def test_a_conversation_the_template_refuses_is_counted_not_fatal(tiny_model_dir: Path, tmp_path: Path) -> None:
    import shutil

    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny_model_dir / name, tmp_path / name)
    template = (tmp_path / "chat_template.jinja").read_text()
    (tmp_path / "chat_template.jinja").write_text(
        "{%- for m in messages %}{%- if m.content == 'boom' %}{{ raise_exception('no boom') }}{%- endif %}"
        "{%- endfor %}" + template)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)  # so chat_template.jinja is the template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    refused = conversation(Message("user", "boom"), Message("assistant", "no"))
    measured = TokenMeter(TemplateRenderer(tmp_path)).measure([TRICKY[0], refused, TRICKY[3]])
    assert measured.unmeasured_turns == 1
    assert measured.turn_conversation.tolist() == [0, 0, 2]
    assert measured.conversation_tokens[1] == 0 and measured.conversation_tokens[2] > 0


def test_blank_lines_do_not_shift_the_token_sample(corpus: Path, traffic: Path, tmp_path: Path) -> None:
    """Rows of a chunk are found again by line for the token pass: blank and whitespace-only lines (which
    the parser skips) must not pair a row's facts with another row's tokens."""
    lines = traffic.read_bytes().splitlines(keepends=True)
    spaced = tmp_path / "spaced.jsonl"
    spaced.write_bytes(b"\n" + b"".join(line + (b"   \n" if i % 7 == 0 else b"\n" if i % 5 == 0 else b"")
                                        for i, line in enumerate(lines)))
    with_blanks, clean = (audit_against(corpus, str(path))["traffic"] for path in (spaced, traffic))
    for section in ("counts", "copies", "length_buckets", "lengths"):  # keyed by task and mode too
        assert with_blanks[section] == clean[section], section


def test_a_hub_dataset_mirrored_locally_reads_like_its_file(corpus: Path, traffic: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    mirror = tmp_path / "mirror" / "acme" / "serving-logs"
    mirror.mkdir(parents=True)
    (mirror / "train.jsonl").write_bytes(traffic.read_bytes())
    monkeypatch.setenv("CORPUS_HUB_MIRROR", str(tmp_path / "mirror"))
    hub = audit_against(corpus, "hf://datasets/acme/serving-logs")
    assert hub["traffic"]["conversations"] == 100
    assert tvd(hub) == tvd(audit_against(corpus, str(traffic)))
