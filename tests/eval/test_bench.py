"""`corpus export --format vllm-bench`: an eval pack as vLLM's benchmark datasets, read back by vLLM's own loader
(``vllm.benchmarks.datasets.CustomDataset``, in-process, with the tiny model's tokenizer) and, for the multi-turn
file, checked against the rules vLLM's multi-turn benchmark asserts (that script is not in the installed wheel)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest

from corpus_builder.errors import CorpusError
from corpus_builder.eval import export_bench, read_pack
from corpus_builder.layout import RECIPE

from .conftest import chat_rows, write_jsonl
from .test_pack import fake_corpus

CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "a city's weather", "parameters": CITY}}]
CALL = {"id": "call_0", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
HISTORY = [{"role": "system", "content": "be brief"},
           {"role": "user", "content": "hi there"},
           {"role": "assistant", "content": "hello", "reasoning_content": "greet them"},
           {"role": "user", "content": "and what now?"},
           {"role": "assistant", "content": "the answer given again", "reasoning_content": "think it over"}]
WITH_TOOLS = [{"role": "user", "content": "weather in Paris?"},
              {"role": "assistant", "content": "", "tool_calls": [CALL]},
              {"role": "tool", "content": "sunny", "tool_call_id": "call_0"},
              {"role": "assistant", "content": "It is sunny.", "reasoning_content": "read the result"}]
TWO_EXCHANGES = [{"role": "user", "content": "first question"},
                 {"role": "assistant", "content": "first answer", "reasoning_content": "first thought"},
                 {"role": "user", "content": "second question"},
                 {"role": "assistant", "content": "second answer"}]


@pytest.fixture(scope="module")
def vllm_datasets() -> ModuleType:
    return pytest.importorskip("vllm.benchmarks.datasets", reason="vLLM's own loader reads the files back")


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model_dir: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(tiny_model_dir))


def corpus_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corpus_builder", *map(str, args)], capture_output=True, text=True)


def loaded(vllm_datasets: ModuleType, path: Path, tokenizer: Any, output_len: int) -> list[Any]:
    """The samples `vllm bench serve --dataset-name custom --skip-chat-template --disable-shuffle` sends."""
    dataset = vllm_datasets.CustomDataset(dataset_path=str(path), disable_shuffle=True)
    return list(dataset.sample(tokenizer=tokenizer, num_requests=len(dataset.data), output_len=output_len,
                               skip_chat_template=True, no_oversample=True))


def answer_length(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    """The recorded answer's tokens as the target generates them, by transformers' own render: the whole
    conversation's tokens after those it shares with the prompt's (a token may straddle the two), through the
    end-of-turn token."""
    def ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False).input_ids)

    prompt = ids(tokenizer.apply_chat_template(messages[:-1], tools=tools, add_generation_prompt=True, tokenize=False))
    whole = ids(tokenizer.apply_chat_template(messages, tools=tools, tokenize=False))
    shared = next(i for i, (a, b) in enumerate(zip(prompt, whole, strict=False)) if a != b) \
        if whole[:len(prompt)] != prompt else len(prompt)
    return whole.index(tokenizer.convert_tokens_to_ids(tokenizer.eos_token), shared) + 1 - shared


def test_single_turn_prompts_are_the_rendered_history_and_the_answer_sizes_the_output(
        tmp_path: Path, tiny_model_dir: Path, vllm_datasets: ModuleType, hf_tokenizer: Any) -> None:
    rows = [{"messages": HISTORY}, {"messages": WITH_TOOLS, "tools": TOOLS},
            *({"messages": row["messages"]} for row in chat_rows(2))]
    pack_file = write_jsonl(tmp_path / "pack.jsonl", rows)
    completed = corpus_cli("export", pack_file, "--format", "vllm-bench", "--out", tmp_path / "bench",
                           "--tokenizer", tiny_model_dir)
    assert completed.returncode == 0, completed.stderr
    out = tmp_path / "bench" / "single_turn.jsonl"
    assert "--custom-output-len -1 --num-prompts 4" in completed.stdout and str(out) in completed.stdout
    samples = loaded(vllm_datasets, out, hf_tokenizer, output_len=-1)
    prompts = read_pack(pack_file).prompts
    assert len(samples) == len(prompts) == len(rows)
    for sample, prompt, row in zip(samples, prompts, rows, strict=True):
        tools = list(prompt.tools) if prompt.tools else None
        # what the chat endpoint renders from the messages `corpus eval` sends, by transformers' own template code
        assert sample.prompt == hf_tokenizer.apply_chat_template(list(prompt.messages), tools=tools,
                                                                 add_generation_prompt=True, tokenize=False)
        assert sample.expected_output_len == answer_length(hf_tokenizer, [*prompt.messages, row["messages"][-1]],
                                                           tools)
    assert "be brief" in samples[0].prompt and "greet them" in samples[0].prompt  # the history, its reasoning
    assert '"city": "Paris"' in samples[1].prompt and "sunny" in samples[1].prompt and "weather" in samples[1].prompt


def test_a_corpus_pack_is_rendered_with_the_corpus_recipes_tokenizer_and_thinking_mode(
        tmp_path: Path, tiny_model_dir: Path, vllm_datasets: ModuleType, hf_tokenizer: Any) -> None:
    corpus = fake_corpus(tmp_path / "corpus")
    (corpus / RECIPE).write_text(orjson.dumps({"target": {"tokenizer": str(tiny_model_dir),
                                                          "generation": {"enable_thinking": False}}}).decode())
    report = export_bench(corpus, tmp_path / "bench")
    samples = loaded(vllm_datasets, report.path, hf_tokenizer, output_len=-1)
    expected = [hf_tokenizer.apply_chat_template(list(p.messages), add_generation_prompt=True, enable_thinking=False,
                                                 tokenize=False) for p in read_pack(corpus).prompts]
    assert [s.prompt for s in samples] == expected and len(expected) == 2
    assert all(s.prompt.endswith("<think>\n\n</think>\n\n") for s in samples)  # the recipe's non-thinking mode


def test_prompts_without_answers_carry_no_output_tokens_and_run_with_a_fixed_length(
        tmp_path: Path, tiny_model_dir: Path, vllm_datasets: ModuleType, hf_tokenizer: Any) -> None:
    pack_file = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "write a haiku"}, {"prompt": "count to 3"}])
    report = export_bench(pack_file, tmp_path / "bench", tokenizer=tiny_model_dir)
    lines = [orjson.loads(line) for line in report.path.read_bytes().splitlines()]
    assert [set(line) for line in lines] == [{"prompt"}, {"prompt"}]
    assert "give --custom-output-len N" in report.describe()
    with pytest.raises(ValueError, match="output_tokens"):  # what vLLM says when asked for the recorded lengths
        loaded(vllm_datasets, report.path, hf_tokenizer, output_len=-1)
    samples = loaded(vllm_datasets, report.path, hf_tokenizer, output_len=7)
    assert [s.expected_output_len for s in samples] == [7, 7]
    assert samples[0].prompt == hf_tokenizer.apply_chat_template([{"role": "user", "content": "write a haiku"}],
                                                                 add_generation_prompt=True, tokenize=False)


def test_multi_turn_is_the_conversations_the_multi_turn_benchmark_replays(tmp_path: Path) -> None:
    pack = tmp_path / "pack"
    write_jsonl(pack / "a.jsonl", [{"messages": TWO_EXCHANGES}, {"messages": TWO_EXCHANGES},
                                   {"messages": HISTORY}, {"messages": WITH_TOOLS, "tools": TOOLS}])
    write_jsonl(pack / "b.jsonl", [{"prompt": "a lone prompt"}])
    completed = corpus_cli("export", pack, "--format", "vllm-bench", "--turns", "multi", "--out", tmp_path / "bench")
    assert completed.returncode == 0, completed.stderr
    out = tmp_path / "bench" / "multi_turn.json"
    assert f"--input-file {out}" in completed.stdout and "2 conversations, 4 user turns" in completed.stdout
    for reason in ("a system turn", "tool calls or tools", "no recorded answer"):
        assert f"left out: {reason}" in completed.stdout
    conversations = orjson.loads(out.read_bytes())
    # What the benchmark asserts (bench_dataset.conversations_list_to_dict, send_turn, client_main): a list of
    # {id, messages} with distinct string ids; user and assistant turns alternate from the user's, each exactly
    # {role, content} with text content.
    assert isinstance(conversations, list) and all(set(c) == {"id", "messages"} for c in conversations)
    ids = [c["id"] for c in conversations]
    assert all(isinstance(i, str) for i in ids) and len(set(ids)) == len(ids) == 2
    assert ids[1] == f"{ids[0]}#2"  # the same conversation twice: its id made unique
    for conversation in conversations:
        assert [m["role"] for m in conversation["messages"]] == ["user", "assistant"] * 2
        assert all(set(m) == {"role", "content"} and isinstance(m["content"], str) for m in conversation["messages"])
    # The recorded answers only size their turns: the reasoning is in the content, so that it counts.
    assert [m["content"] for m in conversations[0]["messages"]] == [
        "first question", "<think>\nfirst thought\n</think>\n\nfirst answer", "second question", "second answer"]


def test_the_export_refuses_what_it_cannot_write_and_writes_nothing(tmp_path: Path, tiny_model_dir: Path) -> None:
    pack_file = write_jsonl(tmp_path / "pack.jsonl", chat_rows(2))
    out = tmp_path / "new" / "bench"
    unreadable = write_jsonl(tmp_path / "bad.jsonl", [{"other": 1}])
    refused = corpus_cli("export", unreadable, "--format", "vllm-bench", "--out", out, "--tokenizer", tiny_model_dir)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert f"{unreadable}: the pack holds no readable conversation" in refused.stderr
    with pytest.raises(CorpusError, match="give --tokenizer DIR") as error:  # a file outside a corpus has no recipe
        export_bench(pack_file, out)
    assert str(pack_file) in str(error.value)
    with pytest.raises(CorpusError, match="every one was left out") as error:
        export_bench(write_jsonl(tmp_path / "system.jsonl", [{"messages": HISTORY}]), out, turns="multi")
    assert "a system turn" in str(error.value)
    corpus = fake_corpus(tmp_path / "corpus")
    with pytest.raises(CorpusError, match="inside the built corpus"):
        export_bench(corpus, corpus / "bench", turns="multi")
    assert not (tmp_path / "new").exists() and not (corpus / "bench").exists()
    taken = tmp_path / "taken"
    taken.write_text("keep me")
    with pytest.raises(CorpusError, match="exists and is not a directory"):
        export_bench(pack_file, taken, tokenizer=tiny_model_dir)
    assert taken.read_text() == "keep me"
    (tmp_path / "dir" / "multi_turn.json").mkdir(parents=True)  # the file's name taken by a directory
    with pytest.raises(CorpusError, match="a directory; give the path of a file"):
        export_bench(pack_file, tmp_path / "dir", turns="multi")


def test_the_options_of_one_kind_of_export_are_refused_for_the_other(tmp_path: Path) -> None:
    pack_file = write_jsonl(tmp_path / "pack.jsonl", chat_rows(1))
    for options, problem in ((["--format", "vllm-bench", "--file-format", "parquet"], "--file-format does not apply"),
                             (["--format", "messages", "--turns", "multi"], "--turns applies to --format vllm-bench")):
        refused = corpus_cli("export", pack_file, *options, "--out", tmp_path / "out")
        assert refused.returncode == 2 and problem in refused.stderr, refused.stderr
    assert not (tmp_path / "out").exists()
