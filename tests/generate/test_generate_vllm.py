"""Generation against real vLLM servers (the tiny thinking model from corpus_builder/testing/tiny_model.py)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from tokenizers import Tokenizer

from corpus_builder.errors import Skipped
from corpus_builder.generate import GenerationProgress, Journal, generate
from corpus_builder.recipe import SourceSpec
from corpus_builder.records import FLAG_TOOL_RESULT_UNKNOWN, Conversation
from corpus_builder.sources import iter_source
from corpus_builder.tokens import TemplateRenderer, TokenRows
from tests.sources.test_sources import spec, split, write_lines
from tests.support.generate_run import make_prompts, make_recipe, script_recipe
from tests.support.tool_chats import call, calling, result, say, tool

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[2]


def tokenizer(server) -> Tokenizer:
    return Tokenizer.from_file(str(Path(server.model_dir) / "tokenizer.json"))


def rows_of(server, prompts, journal_dir, endpoints=None, **generation) -> list[Conversation]:
    recipe = make_recipe(server.model, **{"max_tokens": 96, "on_length": "keep", "concurrency": 8, **generation})
    rows = list(generate(prompts, recipe, journal_dir, endpoints=endpoints or [server.base_url]))
    assert all(isinstance(r, Conversation) for r in rows)  # on_length keep: no row is dropped
    return rows


@pytest.mark.parametrize("thinking", [True, False])
def test_single_turn_records_served_tokens(vllm_server, tmp_path, thinking):
    rows = rows_of(vllm_server, make_prompts(6), tmp_path, enable_thinking=thinking)
    decode = tokenizer(vllm_server).decode
    for row in rows:
        generation = row.provenance.generation
        assert generation.served_model == vllm_server.model and generation.engine_version
        assert generation.enable_thinking is thinking
        (turn,) = generation.turns
        assert turn.finish_reason in ("stop", "length")
        assert turn.token_ids and all(isinstance(t, int) for t in turn.token_ids)
        assert len(turn.token_ids) == turn.completion_tokens
        assert len(turn.prompt_token_ids) == turn.prompt_tokens
        # The generation prompt the server rendered is the one the thinking flag asks for.
        prompt_text = decode(turn.prompt_token_ids, skip_special_tokens=False)
        tail = "<think>\n" if thinking else "<think>\n\n</think>\n\n"
        assert prompt_text.endswith("<|im_start|>assistant\n" + tail)
        if not thinking:
            assert row.messages[-1].reasoning is None and not turn.reasoning_tokens
    if thinking:
        assert any(row.messages[-1].reasoning for row in rows)


@pytest.mark.parametrize("history_reasoning", ["keep", "drop"])
def test_multi_turn_conditions_on_the_regenerated_history(vllm_server, tmp_path, history_reasoning):
    rows = rows_of(vllm_server, make_prompts(4, turns=2), tmp_path, history_reasoning=history_reasoning)
    decode = tokenizer(vllm_server).decode
    with_reasoning = 0
    for row in rows:
        assert [m.role for m in row.messages] == ["system", "user", "assistant", "user", "assistant"]
        first, second = row.provenance.generation.turns
        assert (first.message_index, second.message_index) == (2, 4)
        # Turn two's prompt is turn one's conversation followed by the regenerated answer (compared as
        # text: the template re-renders the answer's think block, so tokens at the seam can differ).
        history = decode(second.prompt_token_ids, skip_special_tokens=False)
        first_prompt = decode(first.prompt_token_ids, skip_special_tokens=False)
        assert history.startswith(first_prompt.removesuffix("<think>\n"))
        answer = row.messages[2]
        assert answer.content.strip() in history
        # The first assistant turn's think block, as the server rendered it into turn two's prompt (a
        # substring test on the whole history would be fooled by a short trace that recurs elsewhere).
        rendered_turn = history.split("<|im_start|>assistant\n", 2)[1]
        think_block = rendered_turn.removeprefix("<think>").split("</think>", 1)[0].strip()
        if answer.reasoning:
            with_reasoning += 1
            assert think_block == (answer.reasoning.strip() if history_reasoning == "keep" else "")
    assert with_reasoning


def test_two_endpoints_share_the_load(vllm_server, vllm_server_b, tmp_path):
    assert vllm_server_b.model == vllm_server.model, "both servers must serve one model name"
    endpoints = [vllm_server.base_url, vllm_server_b.base_url]
    rows = rows_of(vllm_server, make_prompts(12), tmp_path, endpoints=endpoints, max_tokens=48)
    used = {turn.endpoint for row in rows for turn in row.provenance.generation.turns}
    assert used == set(endpoints)


def run_script_args(base_url: str, model: str, journal_dir: Path, out_file: Path, *, count: int,
                    turns: int) -> list[str]:
    args = [base_url, model, str(journal_dir), str(out_file), str(count), str(turns), "64"]
    return [sys.executable, "-m", "tests.support.generate_run", *args]


def run_script(server, journal_dir: Path, out_file: Path, count: int, turns: int) -> subprocess.Popen:
    return subprocess.Popen(run_script_args(server.base_url, server.model, journal_dir, out_file, count=count,
                                            turns=turns), cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_resume_after_sigkill(vllm_server, tmp_path):
    count, turns = 40, 2
    journal_dir, out_file = tmp_path / "journal", tmp_path / "rows.tsv"
    first = run_script(vllm_server, journal_dir, out_file, count, turns)
    deadline = time.monotonic() + 120
    while not any(p.stat().st_size for p in journal_dir.glob("segment-*.zst")):
        assert first.poll() is None, "the first run ended before writing its journal"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_rows = [orjson.loads(line) for line in out_file.read_text().splitlines()]
    assert len(killed_rows) < count, "the run finished before it was killed"
    with Journal(journal_dir) as journal:
        cached = len(journal)
    assert cached > 0

    progress = GenerationProgress(stream=io.StringIO())
    prompts = make_prompts(count, turns=turns)
    rows = list(generate(prompts, script_recipe(vllm_server.model, 64), journal_dir,
                         endpoints=[vllm_server.base_url], progress=progress))

    ids = [r.id for r in rows]
    assert ids == [p.id for p in prompts] and len(set(ids)) == count
    # What the killed run yielded is yielded again, identically (from the journal).
    killed_ids = [line["id"] for line in killed_rows]
    assert killed_ids == ids[: len(killed_ids)]
    # Only what never finished was asked for again: the rerun sent fewer requests than a fresh run.
    assert progress.turns_cached == cached
    with Journal(journal_dir) as journal:
        fresh_requests = len(journal)
    assert progress.turns_generated == fresh_requests - cached < fresh_requests


@pytest.mark.slow
def test_in_process_engine_backend(tiny_model_dir, tmp_path):
    """vllm.LLM in a script of its own (the engine wants the main module guarded); then the rows are
    rebuilt from the journal alone, identically."""
    journal_dir, out_file = tmp_path / "journal", tmp_path / "rows.jsonl"
    model_dir = str(tiny_model_dir)
    script = run_script_args("engine", model_dir, journal_dir, out_file, count=4, turns=2)
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", **os.environ,
           "PYTHONPATH": str(REPO)}
    subprocess.run(script, cwd=REPO, env=env, check=True, timeout=600)
    lines = [orjson.loads(line) for line in out_file.read_text().splitlines()]
    rows = [line["row"] for line in lines]
    assert len(rows) == 4 and all(rows)
    for row in rows:
        assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant", "user", "assistant"]
        for turn in row["provenance"]["generation"]["turns"]:
            assert turn["endpoint"] == "in-process" and len(turn["token_ids"]) == turn["completion_tokens"]
    assert any(m["reasoning"] for row in rows for m in row["messages"])
    rebuilt = generate(make_prompts(4, turns=2), script_recipe(model_dir, 64), journal_dir, endpoints=[],
                       journal_only=True)
    assert [orjson.loads(orjson.dumps(r.to_row())) for r in rebuilt] == rows


# One possible call, so a regenerated call can match the recorded one; strict: vLLM constrains the arguments to
# the schema only for a strict tool (else just the call's envelope, and the arguments are any JSON).
CITY = {"type": "function", "function": {
    **tool("lookup_city", "Facts about a city", city={"enum": ["Paris"]})["function"], "strict": True}}


def tool_prompts(directory: Path, *rows: dict) -> list[Conversation]:
    directory.mkdir(exist_ok=True)
    write_lines(directory / "tools.jsonl", list(rows))
    kept, skipped = split(list(iter_source(spec(name="tools", kind="prompts", paths=("tools.jsonl",)), directory)))
    assert skipped == []
    return kept


def tool_rows(server, rows: list[Conversation], directory: Path, **tool_settings) -> list[Conversation | Skipped]:
    source = SourceSpec(name="tools", kind="prompts", paths=("tools.jsonl",),
                        tool_choice={"type": "function", "function": {"name": "lookup_city"}}, **tool_settings)
    # thinking off: the constrained call comes right after the generation prompt, well inside the budget
    recipe = replace(make_recipe(server.model, max_tokens=96, enable_thinking=False), sources=(source,))
    return list(generate(rows, recipe, directory / "journal", endpoints=[server.base_url]))


def test_prompts_with_tools_are_regenerated_with_the_target_s_calls(vllm_server, tmp_path):
    """vLLM (hermes parser) returns the target's calls in message.tool_calls; the recorded result of the
    matching call is reused (a second request), the call the target makes next has none (cut, flagged); a prompt
    whose recorded history is kept (tool_results: recorded) gets its final turn; and every served prompt,
    tools, calls and results included, re-renders exactly through our template rendering."""
    recorded = {"tools": [CITY], "messages": [
        say("user", "Tell me about Paris."), calling(call("rec-1", "lookup_city", {"city": "Paris"})),
        result("rec-1", "Paris is the capital of France."), say("assistant", "(the recorded answer)")]}
    unrecorded = {"tools": [CITY], "messages": [say("user", "Any city?")]}
    matched, skipped = tool_rows(vllm_server, tool_prompts(tmp_path, recorded, unrecorded), tmp_path)
    with Journal(tmp_path / "journal") as journal:
        assert len(journal) == 3  # the first call, the turn after its reused result, the unrecorded prompt's call
    assert isinstance(skipped, Skipped) and skipped.reason == "tool_result_unknown"
    assert isinstance(matched, Conversation) and matched.flags == [FLAG_TOOL_RESULT_UNKNOWN]
    (made,) = matched.messages[1].tool_calls
    assert made.name == "lookup_city" and made.arguments_object() == {"city": "Paris"} and made.id != "rec-1"
    assert [m.role for m in matched.messages] == ["user", "assistant"]  # cut before the second call
    served = tokenizer(vllm_server).decode(matched.provenance.generation.turns[0].token_ids,
                                           skip_special_tokens=False)
    assert served.count("<tool_call>") == 1 and '"lookup_city"' in served

    (final,) = tool_rows(vllm_server, tool_prompts(tmp_path / "recorded", recorded), tmp_path / "recorded",
                         tool_results="recorded")
    assert [m.role for m in final.messages] == ["user", "assistant", "tool", "assistant"]
    assert final.messages[1].tool_calls[0].id == "rec-1" and final.messages[3].tool_calls[0].name == "lookup_city"
    renderer = TemplateRenderer(Path(vllm_server.model_dir), enable_thinking=False)
    checked = TokenRows(renderer).tokenize([matched, final])
    assert sum(item.checked_turns for item in checked) == 2
    assert [m for item in checked for m in item.mismatches if m.part == "prompt"] == []
