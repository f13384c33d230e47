"""`corpus build` against a real small instruct model (SmolLM2-135M-Instruct, or CORPUS_REAL_MODEL) on a real vLLM
server: real answers to real prompts (grade-school maths, two-turn chit-chat), thinking off since the model has
none; answers cut at max_tokens handled as on_length says; the audit's token statistics on real text; and the
served ids of real text re-rendering to the same tokens, as the tiny model's noise never does.

Nothing here depends on what the model writes: the assertions are what the engine and the pipeline guarantee
for any answer (a stop ends on the end-of-turn token, a cut is exactly max_tokens long, the stored text is the
served text, a prompt re-renders to the served prompt); what real text does (the share that re-renders, the
answers that loop) is measured and reported, with bounds far from the figures."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from corpus_builder.layout import LEDGER, iter_ledger
from corpus_builder.tokens import TemplateRenderer
from tests.conftest import ServedModel
from tests.support.hf_template import hf_ids
from tests.support.real_data import write_chitchat, write_gsm8k, write_rows

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
MAX_TOKENS = 64
CUT_TOKENS = 16
GSM8K_PROMPTS, CHATS = 4, 3
# an answer loops when most of its word 4-grams repeat earlier ones (measured, reported, never asserted)
LOOP_REPEAT_SHARE = 0.3


def corpus(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corpus_builder", *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def prompt_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("real-prompts")
    write_gsm8k(root / "gsm8k.parquet", GSM8K_PROMPTS, seed=7)
    # two user turns each: the second answer is generated on the regenerated first one
    chats = [chat for chat in write_chitchat(root / "chat-all.jsonl", 40) if len(chat["messages"]) >= 3][:CHATS]
    write_rows(root / "chat.jsonl", [{"id": chat["id"], "messages": chat["messages"][:3]} for chat in chats])
    return root


def write_recipe(path: Path, data: Path, server: ServedModel, *, on_length: str, max_tokens: int = MAX_TOKENS,
                 extra: dict[str, Any] | None = None, chats: bool = True, out: str = "out") -> Path:
    chat_source = f"\n  - {{name: chat, kind: prompts, path: {data}/chat.jsonl, task: chat}}" if chats else ""
    path.write_text(f"""\
name: real-text
target:
  model: {server.model}
  tokenizer: {server.model_dir}
  endpoints: [{server.base_url}]
  generation: {{enable_thinking: false, temperature: 0, max_tokens: {max_tokens}, on_length: {on_length},
               concurrency: 8, timeout_s: 300, max_retries: 2, extra_sampling: {json.dumps(extra or {})}}}
sources:
  - {{name: gsm8k, kind: prompts, path: {data}/gsm8k.parquet, task: math}}{chat_source}
checks: {{max_seq_len: 2048}}
split: {{validation_fraction: 0}}
output: {{dir: {out}}}
""", encoding="utf-8")
    return path


@dataclass
class Built:
    out: Path
    rows: list[dict[str, Any]]
    audit: dict[str, Any]

    def turns(self) -> Iterator[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
        """(row, generated turn's provenance, its message) of every generated turn."""
        for row in self.rows:
            for turn in row["provenance"]["generation"]["turns"]:
                yield row, turn, row["messages"][turn["message_index"]]


def read_built(out: Path) -> Built:
    rows = [row for path in sorted((out / "data").glob("*.parquet")) for row in pq.read_table(path).to_pylist()]
    for row in rows:
        row["provenance"] = json.loads(row["provenance"])
    return Built(out, rows, json.loads((out / "audit.json").read_text()))


def build(recipe: Path, *extra: str) -> Built:
    done = corpus("build", str(recipe), *extra)
    assert done.returncode == 0, done.stderr
    return read_built(recipe.parent / "out")


@pytest.fixture(scope="module")
def real_build(real_vllm_server: ServedModel, prompt_files: Path, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """One build of real answers, cut answers kept (flagged)."""
    root = tmp_path_factory.mktemp("real-build")
    return build(write_recipe(root / "recipe.yaml", prompt_files, real_vllm_server, on_length="keep"))


@pytest.fixture(scope="module")
def renderer(real_model_dir: Path) -> TemplateRenderer:
    return TemplateRenderer(real_model_dir, enable_thinking=False)


def test_every_prompt_is_answered_in_text_with_thinking_off(real_build: Built, renderer: TemplateRenderer,
                                                            prompt_files: Path) -> None:
    rows = real_build.rows
    assert sorted(row["source"] for row in rows) == ["chat"] * CHATS + ["gsm8k"] * GSM8K_PROMPTS
    eos = renderer.token_id(renderer.eos_token)
    for row, turn, message in real_build.turns():
        generation = row["provenance"]["generation"]
        assert generation["enable_thinking"] is False and row["thinking"] is False
        assert not message["reasoning"] and turn["finish_reason"] in ("stop", "length")
        answer = turn["token_ids"][:-1] if turn["finish_reason"] == "stop" else turn["token_ids"]
        text = renderer.tokenizer.decode(answer, skip_special_tokens=True)
        if turn["finish_reason"] == "length":  # cut inside a character: the server holds its first bytes back
            text = text.rstrip("\ufffd")
        # the stored answer is the text the server generated, nothing parsed off as reasoning
        assert message["content"] == text
        if turn["finish_reason"] == "stop":
            assert turn["token_ids"][-1] == eos and len(turn["token_ids"]) <= MAX_TOKENS
    # two-turn chats: both answers regenerated, the second one asked on the regenerated first one
    recorded = {json.loads(line)["id"]: json.loads(line)["messages"]
                for line in (prompt_files / "chat.jsonl").read_text().splitlines()}
    for row in (row for row in rows if row["source"] == "chat"):
        first, second = row["provenance"]["generation"]["turns"]
        assert (first["message_index"], second["message_index"]) == (1, 3)
        answer = row["messages"][1]["content"]
        assert answer != recorded[row["provenance"]["source_id"]][1]["content"]
        assert answer in renderer.tokenizer.decode(second["prompt_token_ids"], skip_special_tokens=False)


def test_answers_cut_at_max_tokens_are_kept_flagged(real_build: Built) -> None:
    """Real answers run past max_tokens (and those that loop nearly always do): each cut is exactly max_tokens
    long and its row carries the truncated_generation flag (on_length: keep); a row without a cut has none."""
    cut_rows = set()
    for row, turn, _ in real_build.turns():
        if turn["finish_reason"] == "length":
            assert len(turn["token_ids"]) == MAX_TOKENS
            cut_rows.add(row["id"])
    for row in real_build.rows:
        assert ("truncated_generation" in row["flags"]) is (row["id"] in cut_rows)
    assert real_build.audit["flags"].get("truncated_generation", 0) == len(cut_rows)


def test_on_length_drop_and_keep_of_answers_the_engine_cuts(real_vllm_server: ServedModel, prompt_files: Path,
                                                             tmp_path: Path) -> None:
    """With ignore_eos every answer runs to max_tokens (the engine's guarantee): kept, each is flagged and exactly
    max_tokens long; the same recipe with on_length: drop rebuilds from the journal alone (its endpoint is now
    a dead port) and drops every row, counted in the ledger."""
    recipe = write_recipe(tmp_path / "recipe.yaml", prompt_files, real_vllm_server, on_length="keep",
                          max_tokens=CUT_TOKENS, extra={"ignore_eos": True}, chats=False)
    kept = build(recipe)
    assert len(kept.rows) == GSM8K_PROMPTS
    for row, turn, message in kept.turns():
        assert turn["finish_reason"] == "length" and len(turn["token_ids"]) == CUT_TOKENS and message["content"]
        assert "truncated_generation" in row["flags"]
    dead = ServedModel("http://127.0.0.1:9/v1", real_vllm_server.model, real_vllm_server.model_dir,
                       real_vllm_server.log_path)
    dropping = write_recipe(tmp_path / "recipe.yaml", prompt_files, dead, on_length="drop", max_tokens=CUT_TOKENS,
                            extra={"ignore_eos": True}, chats=False)
    done = corpus("build", str(dropping), "--allow-empty")
    assert done.returncode == 0, done.stderr
    reasons = [entry["reason"] for entry in iter_ledger(tmp_path / "out" / LEDGER)]
    assert reasons == ["truncated_generation"] * GSM8K_PROMPTS
    assert not any(pq.read_table(path).num_rows for path in (tmp_path / "out" / "data").glob("*.parquet"))


def repeat_share(text: str, n: int = 4) -> float:
    words = text.split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def test_served_ids_of_real_text_re_render(real_build: Built, record_property: Any) -> None:
    """Every generated turn is checked. A prompt always re-renders to the served prompt (the server's template
    and tokenizer, rendered here); an answer re-renders unless the model wrote a tokenization the tokenizer would
    not (the tiny model's noise: 0 of 46 turns re-render in the quickstart). Real text re-renders."""
    mismatches = real_build.audit["tokens"]["mismatches"]
    turns = list(real_build.turns())
    assert mismatches["checked_turns"] == len(turns)
    assert [turn for turn in mismatches["turns"] if turn["part"] == "prompt"] == []
    share = 1 - mismatches["count"] / len(turns)
    looping = [turn["finish_reason"] for _, turn, message in turns
               if repeat_share(message["content"]) >= LOOP_REPEAT_SHARE]
    record_property("re_render_share", share)
    record_property("looping_turns", f"{len(looping)} of {len(turns)} ({looping.count('length')} cut)")
    print(f"real text: {len(turns) - mismatches['count']} of {len(turns)} generated turns re-render; "
          f"{len(looping)} loop ({looping.count('length')} of them cut at max_tokens)")
    assert share > 0


def test_the_audits_token_statistics_count_real_text_as_the_target_does(real_build: Built,
                                                                        real_model_dir: Path) -> None:
    """The conversations' lengths as transformers' own apply_chat_template counts them (not the renderer under
    test), and the supervised tokens: the served ids of every generated answer, none of them reasoning."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(real_model_dir)
    lengths = []
    for row in real_build.rows:
        lengths.append(len(hf_ids(tokenizer, [{"role": message["role"], "content": message["content"]}
                                              for message in row["messages"]])))
    tokens = real_build.audit["tokens"]
    assert (tokens["conversations"], tokens["tokens"], tokens["max"]) == (len(lengths), sum(lengths), max(lengths))
    assert tokens["supervised_tokens"] == sum(len(turn["token_ids"]) for _, turn, _ in real_build.turns())
    assert tokens["reasoning_tokens"] == 0 and tokens["over_budget"] == 0
