"""Recipe loading: safe YAML, schema validation with positions, defaults, semantic checks, typed Recipe."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from corpus_builder.errors import CorpusError
from corpus_builder.recipe import (
    Problem,
    check_recipe,
    load_recipe,
    match_source_pattern,
    recipe_sha256,
    resolved_yaml,
)
from corpus_builder.recipe.model import ExportSpec
from corpus_builder.recipe.reference import render_reference
from corpus_builder.recipe.schema import recipe_schema

REPO = Path(__file__).resolve().parents[2]

# Sets every key the schema knows, so the mapping onto the dataclasses is exercised in full.
FULL_RECIPE = """\
name: thinking-mix.v1
description: Replay plus on-policy regenerations.
target:
  model: Nanbeige/Nanbeige4.2-3B
  revision: abc123
  tokenizer: models/tok
  trust_remote_code: false
  endpoints: [http://127.0.0.1:8000/v1, http://127.0.0.1:8001/v1]
  launch:
    model_dir: models/tiny
    args: [--max-model-len, "2048"]
    port: 0
    startup_timeout_s: 120
    env: {VLLM_CPU_KVCACHE_SPACE: "1"}
  backend: server
  generation:
    enable_thinking: true
    temperature: 0.6
    top_p: 0.95
    top_k: 20
    max_tokens: 1024
    seed: 7
    n: 2
    history_reasoning: keep
    on_length: retry
    retry_max_tokens: 4096
    concurrency: 16
    timeout_s: 60
    max_retries: 3
sources:
  - name: chat
    kind: replay
    path: data/chat/*.jsonl
    format: jsonl
    mapping: {style: sharegpt, field: conversations, id_field: id}
    task: chat
    license: MIT
  - name: math
    kind: prompts
    path: [data/math.jsonl]
    mapping: {style: field, field: question}
    take: {count: 100, seed: 3}
    system_prompt: Think step by step.
    task: math
  - name: ultrachat
    kind: prompts
    hub: {id: HuggingFaceH4/ultrachat_200k, config: default, split: train_sft, revision: main}
    take: {fraction: 0.5}
checks:
  min_thinking_share: 0.3
  max_seq_len: 4096
  on_over_length: drop
  on_unclosed_think: drop
  dedup: exact
  near_duplicates: {threshold: 0.85, num_perm: 128, shingle: 4}
  dedup_priority: [math, chat]
decontamination:
  eval_sets:
    - {name: gsm8k-test, path: data/math.jsonl, fields: [question]}
    - {name: mt-bench, hub: {id: HuggingFaceH4/mt_bench_prompts, split: train}}
  ngram: 12
  min_words: 6
split:
  validation_fraction: 0.05
  seed: 1
output:
  dir: out/corpus
  rows_per_shard: 1000
publish:
  exports:
    - {format: speculators-tokens}
    - {format: messages, file_format: parquet}
"""

MINIMAL_RECIPE = """\
name: minimal
target: {model: m}
sources:
  - {name: chat, kind: replay, path: data/math.jsonl}
output: {dir: out}
"""


def make_workspace(root: Path) -> Path:
    """A recipe directory with the real files and directories the full recipe refers to."""
    (root / "data" / "chat").mkdir(parents=True)
    (root / "data" / "chat" / "a.jsonl").write_text('{"conversations": []}\n')
    (root / "data" / "chat" / "b.jsonl").write_text('{"conversations": []}\n')
    (root / "data" / "math.jsonl").write_text('{"question": "1+1?"}\n')
    (root / "models" / "tok").mkdir(parents=True)
    (root / "models" / "tok" / "tokenizer.json").write_text("{}")
    (root / "models" / "tiny").mkdir()
    return root


@pytest.fixture()
def workspace(tmp_path: Path) -> Path:
    return make_workspace(tmp_path)


def write(directory: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def problems_of(path: Path) -> list[Problem]:
    recipe, problems = check_recipe(path)
    assert recipe is None, "expected the recipe to be rejected"
    assert problems
    return problems


def find(problems: list[Problem], path: str, fragment: str) -> Problem:
    matches = [p for p in problems if p.path == path and fragment in p.message]
    assert matches, f"no problem at {path!r} mentioning {fragment!r} in:\n" + "\n".join(map(str, problems))
    return matches[0]


def edited(old: str, new: str, text: str = FULL_RECIPE) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


# --------------------------------------------------------------------------------------------------
# Valid recipes


def test_full_recipe_maps_onto_the_dataclasses(workspace: Path) -> None:
    recipe = load_recipe(write(workspace, FULL_RECIPE))

    assert recipe.name == "thinking-mix.v1"
    assert recipe.base_dir == workspace.resolve()
    assert recipe.path == (workspace / "recipe.yaml").resolve()
    target = recipe.target
    assert target.tokenizer == workspace.resolve() / "models" / "tok"
    assert target.endpoints == ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8001/v1")
    assert target.launch is not None
    assert target.launch.model_dir == workspace.resolve() / "models" / "tiny"
    assert target.launch.args == ("--max-model-len", "2048")
    assert target.launch.env == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    assert target.launch.startup_timeout_s == 120.0
    assert target.generation.sampling() == {"temperature": 0.6, "top_p": 0.95, "top_k": 20,
                                            "max_tokens": 1024, "seed": 7}
    assert target.generation.retry_max_tokens == 4096
    assert target.generation.n == 2

    chat, math, ultrachat = recipe.sources
    assert chat.paths == ("data/chat/*.jsonl",)  # as written: readers resolve against base_dir
    assert chat.mapping.style == "sharegpt" and chat.mapping.id_field == "id"
    assert chat.take is None and chat.license == "MIT"
    assert math.paths == ("data/math.jsonl",)
    assert math.take is not None and (math.take.count, math.take.seed) == (100, 3)
    assert math.system_prompt == "Think step by step."
    assert ultrachat.paths == () and ultrachat.hub is not None
    assert (ultrachat.hub.id, ultrachat.hub.split, ultrachat.hub.config) == (
        "HuggingFaceH4/ultrachat_200k", "train_sft", "default")
    assert ultrachat.take is not None and ultrachat.take.fraction == 0.5
    assert recipe.has_prompts

    assert recipe.checks.max_seq_len == 4096 and recipe.checks.min_thinking_share == 0.3
    assert recipe.split.validation_fraction == 0.05
    assert recipe.output.dir == workspace.resolve() / "out" / "corpus"
    assert recipe.output.rows_per_shard == 1000
    assert recipe.publish.exports == (ExportSpec("speculators-tokens", "jsonl"), ExportSpec("messages", "parquet"))
    assert load_recipe(write(workspace, MINIMAL_RECIPE)).publish.exports == ()


def test_resolved_yaml_keeps_paths_as_written_and_round_trips(workspace: Path) -> None:
    recipe = load_recipe(write(workspace, FULL_RECIPE))
    text = resolved_yaml(recipe)

    assert str(workspace) not in text  # nothing machine-local in what gets published
    assert yaml.safe_load(text) == recipe.document
    assert recipe.document["target"]["tokenizer"] == "models/tok"
    assert recipe.document["output"]["dir"] == "out/corpus"
    again = load_recipe(write(workspace, text, name="resolved.yaml"))
    assert again.document == recipe.document
    assert recipe_sha256(again) == recipe_sha256(recipe)


def test_defaults_are_filled_from_the_schema(workspace: Path) -> None:
    recipe = load_recipe(write(workspace, MINIMAL_RECIPE))
    document = recipe.document

    assert document["target"]["generation"] == {
        "enable_thinking": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 2048,
        "seed": None, "n": 1, "history_reasoning": "keep", "on_length": "drop", "concurrency": 64,
        "timeout_s": 600.0, "max_retries": 6, "max_outage_s": 120.0, "allow_partial": False,
        "share_identical_turns": False, "sampling_mixture": [], "extra_sampling": {},
    }
    assert document["target"]["endpoints"] == [] and document["target"]["backend"] == "server"
    assert document["target"]["allow_mixed_targets"] is False
    assert document["mixture"] == {"seed": 0, "max_rounds": 8, "allow_short": False}
    assert document["checks"] == {"on_over_length": "drop", "on_unclosed_think": "drop", "dedup": "exact",
                                  "dedup_priority": [], "token_mismatch": "warn", "redact_secrets": False}
    assert "decontamination" not in document and "near_duplicates" not in document["checks"]
    assert document["split"] == {"validation_fraction": 0.02, "seed": 0}
    assert document["output"]["rows_per_shard"] == 50000
    # Inside array items, through the schema's $ref:
    assert document["sources"][0]["format"] == "auto"
    assert document["sources"][0]["mapping"] == {"style": "auto"}
    assert "take" not in document["sources"][0]  # absent means all rows: no default may invent one
    assert "launch" not in document["target"]
    assert recipe.target.generation.max_tokens == 2048
    assert recipe.sources[0].take is None and recipe.target.launch is None


def test_derived_and_numeric_defaults(workspace: Path) -> None:
    text = edited("target: {model: m}", "target: {model: m, generation: {on_length: retry, temperature: 1}}",
                  MINIMAL_RECIPE)
    recipe = load_recipe(write(workspace, text))
    generation = recipe.document["target"]["generation"]
    assert generation["retry_max_tokens"] == 4096  # twice max_tokens, as the schema describes
    assert list(generation) == list(recipe_schema()["properties"]["target"]["properties"]["generation"]
                                    ["properties"])  # the schema's key order
    assert generation["temperature"] == 1.0 and isinstance(generation["temperature"], float)


def test_sha256_is_stable_under_key_order_layout_and_explicit_defaults(workspace: Path) -> None:
    block = load_recipe(write(workspace, MINIMAL_RECIPE, "a.yaml"))
    reordered = write(workspace, """\
        # same settings, other order and layout
        output:
          dir: out
        sources: [{path: data/math.jsonl, kind: replay, name: chat}]
        target:
          model: m
          backend: server          # the default, written out
          generation: {temperature: 0.6}
        name: minimal
        """, "b.yaml")
    assert recipe_sha256(load_recipe(reordered)) == recipe_sha256(block)
    other_model = edited("target: {model: m}", "target: {model: other}", MINIMAL_RECIPE)
    changed = write(workspace, other_model, "c.yaml")
    assert recipe_sha256(load_recipe(changed)) != recipe_sha256(block)


def test_a_date_like_string_stays_text(workspace: Path) -> None:
    text = edited("target: {model: m}", "target: {model: m, revision: 2024-01-01}", MINIMAL_RECIPE)
    assert load_recipe(write(workspace, text)).target.revision == "2024-01-01"


def test_glob_characters_in_the_recipe_directory_are_literal(tmp_path: Path) -> None:
    odd = tmp_path / "run[1]"
    (odd / "data").mkdir(parents=True)
    (odd / "data" / "x.jsonl").write_text("{}\n")
    assert match_source_pattern(odd, "data/*.jsonl") == [odd / "data" / "x.jsonl"]
    assert match_source_pattern(odd, "data/x.jsonl") == [odd / "data" / "x.jsonl"]
    assert match_source_pattern(odd, "data/*.parquet") == []


# --------------------------------------------------------------------------------------------------
# Schema problems


def test_every_problem_is_reported_at_once(workspace: Path) -> None:
    path = write(workspace, """\
        name: bad name
        target:
          model: m
          tokeniser: models/tok
          generation:
            temperature: hot
            history_reasoning: dorp
        sources:
          - name: chat
            kind: reply
            path: data/math.jsonl
          - name: chat
            kind: replay
        output: {}
        """)
    problems = problems_of(path)

    find(problems, "name", "does not match the pattern")
    find(problems, "target.tokeniser", "did you mean 'tokenizer'?")
    find(problems, "target.generation.temperature", "expected a number, got 'hot'")
    find(problems, "target.generation.history_reasoning", "did you mean 'drop'?")
    find(problems, "sources[0].kind", "not one of: replay, prompts")
    find(problems, "sources[1]", "needs 'path' or 'hub'")
    find(problems, "sources[1].name", "already used by sources[0]")
    find(problems, "output", "missing required key 'dir'")
    assert len(problems) == 8
    assert [p.line for p in problems] == sorted(p.line or 0 for p in problems)
    assert all(p.file == str(path) for p in problems)


def test_nested_error_has_exact_line_and_column(workspace: Path) -> None:
    text = edited("take: {count: 100, seed: 3}", "take:\n      count: many\n      seed: 3")
    problems = problems_of(write(workspace, text))
    problem = find(problems, "sources[1].take.count", "expected an integer, got 'many'")
    line = text.splitlines().index("      count: many") + 1
    assert (problem.line, problem.column) == (line, 14)
    assert str(problem) == f"{workspace / 'recipe.yaml'}:{line}:14: sources[1].take.count: {problem.message}"


def test_unknown_keys_suggest_the_closest_or_the_right_place(workspace: Path) -> None:
    text = MINIMAL_RECIPE + "tokenizer: models/tok\nchecks: {max_seq_length: 10}\nsplit: {sed: 1}\n"
    text = edited("{name: chat, kind: replay, path: data/math.jsonl}",
                  "{name: chat, kind: replay, path: data/math.jsonl, seed: 1, fromat: jsonl}", text)
    problems = problems_of(write(workspace, text))
    misplaced = find(problems, "tokenizer", "did you mean 'target.tokenizer'?")
    assert (misplaced.line, misplaced.column) == (6, 1)  # the key itself
    find(problems, "checks.max_seq_length", "did you mean 'max_seq_len'?")
    find(problems, "split.sed", "did you mean 'seed'?")
    find(problems, "sources[0].seed", "did you mean 'take.seed'?")
    find(problems, "sources[0].fromat", "did you mean 'format'?")
    nothing_close = problems_of(write(workspace, MINIMAL_RECIPE + "zzz: 1\n"))
    find(nothing_close, "zzz", "allowed here: name, description, target")


@pytest.mark.parametrize(("old", "new", "path", "fragment"), [
    ("take: {count: 100, seed: 3}", "take: {count: 0}", "sources[1].take.count",
     "less than the minimum of 1"),
    ("take: {fraction: 0.5}", "take: {fraction: 0}", "sources[2].take.fraction", "less than or equal to"),
    ("take: {fraction: 0.5}", "take: {fraction: 1.5}", "sources[2].take.fraction",
     "greater than the maximum"),
    ("take: {count: 100, seed: 3}", "take: {count: 1, fraction: 0.5}", "sources[1].take",
     "give only one of 'count' or 'fraction'"),
    ("take: {fraction: 0.5}", "take: {seed: 1}", "sources[2].take", "needs 'count' or 'fraction'"),
    ("path: [data/math.jsonl]", "path: [data/math.jsonl]\n    hub: {id: a/b}", "sources[1]",
     "give only one of 'path' or 'hub'"),
    ("path: [data/math.jsonl]", "path: [data/math.jsonl, 3]", "sources[1].path[1]",
     "expected a string, got 3"),
    ("path: [data/math.jsonl]", "path: 3", "sources[1].path", "expected a string or a list of strings"),
    ("path: [data/math.jsonl]", "path: []", "sources[1].path", "needs at least 1 item"),
    ("endpoints: [http://127.0.0.1:8000/v1, http://127.0.0.1:8001/v1]", "endpoints: [localhost:8000]",
     "target.endpoints[0]", "does not match the pattern ^https?://"),
    ("revision: abc123", "revision: no", "target.revision", "put it in quotes"),
    ("backend: server", "backend: engin", "target.backend", "did you mean 'engine'?"),
    ("port: 0", "port: 70000", "target.launch.port", "greater than the maximum of 65535"),
    ("seed: 7", "seed: .inf", "target.generation.seed", "not a finite number"),
    ("seed: 7", "seed: 7\n    extra_sampling: {min_p: 0.05, return_token_ids: false}",
     "target.generation.extra_sampling.return_token_ids", "field corpus-builder sends itself"),
    ("seed: 7", "seed: 7\n    extra_sampling: {max_completion_tokens: 10}",
     "target.generation.extra_sampling.max_completion_tokens", "has its own setting"),
    ("sources:\n", "sources: []\nunused:\n", "sources", "needs at least 1 item"),
])
def test_schema_problem(workspace: Path, old: str, new: str, path: str, fragment: str) -> None:
    find(problems_of(write(workspace, edited(old, new))), path, fragment)


# --------------------------------------------------------------------------------------------------
# Checks the schema cannot express


@pytest.mark.parametrize(("old", "new", "path", "fragment"), [
    ("- name: math", "- name: chat", "sources[1].name", "'chat' is already used by sources[0]"),
    ("path: data/chat/*.jsonl", "path: data/chat/*.parquet", "sources[0].path",
     "no file matches 'data/chat/*.parquet'"),
    ("path: [data/math.jsonl]", "path: [data/math.jsonl, data/missing.jsonl]", "sources[1].path[1]",
     "no file matches 'data/missing.jsonl'"),
    ("path: [data/math.jsonl]", "path: [data/chat]", "sources[1].path[0]", "no file matches"),  # a directory
    ("tokenizer: models/tok", "tokenizer: models/nope", "target.tokenizer", "tokenizer directory not found"),
    ("tokenizer: models/tok", "tokenizer: models/tiny", "target.tokenizer", "has no tokenizer.json"),
    # no tokenizer, and a model name that is not a Hub id: nothing to count tokens with
    ("  model: Nanbeige/Nanbeige4.2-3B\n  revision: abc123\n  tokenizer: models/tok\n", "  model: nanbeige-fp8\n",
     "checks.max_seq_len", "set target.tokenizer"),
    ("  model: Nanbeige/Nanbeige4.2-3B\n  revision: abc123\n  tokenizer: models/tok\n", "  model: nanbeige-fp8\n",
     "publish.exports[0].format", "speculators-tokens rows are in the target's tokens: set target.tokenizer"),
    ("model_dir: models/tiny", "model_dir: models/gone", "target.launch.model_dir",
     "model directory not found"),
    ("retry_max_tokens: 4096", "retry_max_tokens: 1024", "target.generation.retry_max_tokens",
     "must be larger than max_tokens (1024)"),
    ("mapping: {style: field, field: question}", "mapping: {style: field}", "sources[1].mapping",
     "needs mapping.field"),
    ("dedup_priority: [math, chat]", "dedup_priority: [math, chats]", "checks.dedup_priority[1]",
     "no source is named 'chats' (sources: 'chat', 'math', 'ultrachat')"),
    ("dedup: exact", "dedup: none", "checks.near_duplicates", "set checks.dedup to exact or prompt"),
    ("name: mt-bench", "name: gsm8k-test", "decontamination.eval_sets[1].name",
     "'gsm8k-test' is already used by eval_sets[0]"),
    ("path: data/math.jsonl, fields", "path: data/gsm.jsonl, fields", "decontamination.eval_sets[0].path",
     "file not found"),
    ("min_words: 6", "min_words: 13", "decontamination.min_words", "cannot be more than ngram (12)"),
])
def test_semantic_problem(workspace: Path, old: str, new: str, path: str, fragment: str) -> None:
    find(problems_of(write(workspace, edited(old, new))), path, fragment)


def test_near_duplicate_settings_with_no_band_layout_are_refused_where_written(workspace: Path) -> None:
    """A low threshold needs more permutations (the build's own layout rule): refused by validate, with the
    position and the num_perm that would do, not at build time."""
    near = "near_duplicates: {threshold: 0.85, num_perm: 128, shingle: 4}"
    text = edited(near, "near_duplicates: {threshold: 0.01, num_perm: 8, shingle: 4}")
    problem = find(problems_of(write(workspace, text)), "checks.near_duplicates.threshold", "needs num_perm >= 299")
    line = next(number for number, written in enumerate(text.splitlines(), 1) if "threshold: 0.01" in written)
    assert (problem.line, problem.column) == (line, text.splitlines()[line - 1].index("0.01") + 1)
    assert check_recipe(write(workspace, text.replace("num_perm: 8", "num_perm: 299")))[1] == []
    find(problems_of(write(workspace, text.replace("num_perm: 8", "num_perm: 298"))),
         "checks.near_duplicates.threshold", "no LSH band layout of 298 permutations")


def test_without_a_tokenizer_the_target_model_names_the_hub_tokenizer(workspace: Path) -> None:
    """The Hub default: target.model at target.revision, when the recipe counts in the target's tokens; a path
    whose first directory is here is a path (models/nope is a typo, not a Hub model)."""
    recipe = load_recipe(write(workspace, edited("  tokenizer: models/tok\n", "")))
    assert (recipe.target.tokenizer, recipe.target.tokenizer_hub) == (None, "Nanbeige/Nanbeige4.2-3B")
    named = load_recipe(write(workspace, edited("tokenizer: models/tok", "tokenizer: acme/tokenizer-only")))
    assert named.target.tokenizer_hub == "acme/tokenizer-only"
    local = load_recipe(write(workspace, FULL_RECIPE))
    assert local.target.tokenizer == workspace / "models" / "tok" and local.target.tokenizer_hub is None


def test_tool_settings_of_prompts_sources(workspace: Path) -> None:
    """tool_choice is sent as OpenAI's (a named function in its object form), tool_results defaults to match;
    both only make sense on a source the target generates."""
    settings = "    task: math\n    tool_choice: {function: lookup}\n    tool_results: recorded\n"
    recipe = load_recipe(write(workspace, edited("    task: math\n", settings)))
    math = recipe.sources[1]
    assert math.tool_choice == {"type": "function", "function": {"name": "lookup"}} and math.tool_results == "recorded"
    assert (recipe.sources[2].tool_choice, recipe.sources[2].tool_results) == (None, "match")
    required = load_recipe(write(workspace, edited("    task: math\n", "    task: math\n    tool_choice: required\n")))
    assert required.sources[1].tool_choice == "required"
    problems = problems_of(write(workspace, edited("    license: MIT\n",
                                                   "    license: MIT\n    tool_choice: auto\n")))
    find(problems, "sources[0].tool_choice", "only prompts sources are generated")


@pytest.mark.parametrize(("written", "loaded"), [
    ("{type: function, function: {name: lookup}}", {"type": "function", "function": {"name": "lookup"}}),
    ("{function: lookup}", {"type": "function", "function": {"name": "lookup"}}),
    ("auto", "auto"), ("none", "none"), ("required", "required"),
], ids=["openai-named", "short-named", "auto", "none", "required"])
def test_tool_choice_takes_openai_s_forms_and_the_short_one_as_openai_s(workspace: Path, written: str,
                                                                        loaded: Any) -> None:
    recipe = load_recipe(write(workspace, edited("    task: math\n", f"    task: math\n    tool_choice: {written}\n")))
    assert recipe.sources[1].tool_choice == loaded


@pytest.mark.parametrize(("written", "path", "fragment"), [
    ("{type: tool, function: {name: lookup}}", "sources[1].tool_choice.type", "'function' was expected"),
    ("{type: function, function: {}}", "sources[1].tool_choice.function", "missing required key 'name'"),
    ("{type: function, function: {name: lookup, strict: true}}", "sources[1].tool_choice.function.strict",
     "unknown key"),
    ("{name: lookup}", "sources[1].tool_choice.name", "unknown key"),
    ("always", "sources[1].tool_choice", "is not one of: auto, required, none"),
], ids=["another-type", "no-name", "unknown-key", "no-function", "unknown-mode"])
def test_tool_choice_refuses_what_is_neither_form_where_it_goes_wrong(workspace: Path, written: str, path: str,
                                                                      fragment: str) -> None:
    find(problems_of(write(workspace, edited("    task: math\n", f"    task: math\n    tool_choice: {written}\n"))),
         path, fragment)


def test_prompts_need_something_to_generate_with(workspace: Path) -> None:
    no_generator = edited("  endpoints: [http://127.0.0.1:8000/v1, http://127.0.0.1:8001/v1]\n", "")
    launch_block = no_generator[no_generator.index("  launch:"):no_generator.index("  backend:")]
    no_generator = no_generator.replace(launch_block, "")
    problem = find(problems_of(write(workspace, no_generator)), "target", "'math', 'ultrachat'")
    assert "target.endpoints, target.launch, or target.backend: engine" in problem.message
    assert problem.line == 3  # the target key
    engine = edited("backend: server", "backend: engine", no_generator)
    assert load_recipe(write(workspace, engine)).target.backend == "engine"
    assert load_recipe(write(workspace, MINIMAL_RECIPE)).has_prompts is False  # replay needs no target


def test_problems_inside_an_invalid_document_do_not_crash_the_checks(workspace: Path) -> None:
    path = write(workspace, """\
        name: x
        target: [not, a, mapping]
        sources: [3, {name: a, kind: prompts, path: {}}]
        checks: 5
        output: {dir: 1}
        """)
    problems = problems_of(path)
    find(problems, "target", "expected a mapping, got a list")
    find(problems, "sources[0]", "expected a mapping, got 3")
    find(problems, "checks", "expected a mapping, got 5")
    find(problems, "output.dir", "expected a string, got 1")


# --------------------------------------------------------------------------------------------------
# Unsafe or malformed YAML


def test_alias_bomb_is_rejected_without_expanding(workspace: Path) -> None:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for name, previous in zip("bcdefghi", "abcdefgh", strict=True):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
    problems = problems_of(write(workspace, "\n".join(lines) + "\n"))  # 9**9 strings if expanded
    anchor = find(problems, "a", "anchor &a is not allowed")
    assert (anchor.line, anchor.column) == (1, 4)
    alias = find(problems, "b[0]", "alias *a is not allowed")
    assert (alias.line, alias.column) == (2, 8)


def test_python_tags_are_rejected_and_never_run(workspace: Path) -> None:
    marker = workspace / "pwned"
    text = edited("description: Replay plus on-policy regenerations.",
                  f'description: !!python/object/apply:os.system ["touch {marker}"]')
    text = edited("revision: abc123", "revision: !!python/name:os.getcwd ''", text)
    problems = problems_of(write(workspace, text))
    find(problems, "description", "tag !!python/object/apply:os.system is not allowed")
    find(problems, "target.revision", "tag !!python/name:os.getcwd is not allowed")
    assert len(problems) == 2  # no confusing schema errors about the refused values
    assert not marker.exists()


def test_duplicate_keys_are_reported(workspace: Path) -> None:
    text = edited("  rows_per_shard: 1000", "  rows_per_shard: 1000\n  dir: elsewhere")
    problem = find(problems_of(write(workspace, text)), "output.dir", "duplicate key 'dir'")
    assert problem.line == text.splitlines().index("  dir: elsewhere") + 1
    assert f"first given on line {problem.line - 2}" in problem.message


def test_yaml_syntax_error_has_the_position_yaml_reports(workspace: Path) -> None:
    problems = problems_of(write(workspace, "name: x\ntarget: {model: m\nsources: []\n"))
    assert len(problems) == 1
    assert problems[0].message.startswith("YAML syntax error:")
    assert problems[0].line == 3


@pytest.mark.parametrize(("content", "fragment", "line"), [
    (b"", "the recipe is empty", None),
    (b"# nothing here\n", "the recipe is empty", None),
    (b"- name: x\n", "top level must be a mapping", 1),
    (b"just text\n", "top level must be a mapping", 1),
    (b"name: x\n---\nname: y\n", "more than one YAML document", 2),
    (b"name: ok\ndescription: caf\xe9\n", "not valid UTF-8 (byte 0xe9)", 2),
    (b"name: \x07\n", "control characters are not allowed", 1),
])
def test_unreadable_or_unusable_file(tmp_path: Path, content: bytes, fragment: str, line: int | None) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_bytes(content)
    problem = find(problems_of(path), "", fragment)
    assert problem.line == line


def test_missing_file_and_directory(tmp_path: Path) -> None:
    assert str(problems_of(tmp_path / "nope.yaml")[0]) == f"{tmp_path / 'nope.yaml'}: file not found"
    find(problems_of(tmp_path), "", "is a directory")


def test_keys_are_taken_as_written(workspace: Path) -> None:
    problems = problems_of(write(workspace, MINIMAL_RECIPE + "on: 1\n? [a, b]\n: 2\n"))
    find(problems, "on", "unknown key 'on'")  # not the boolean YAML 1.1 would make of it
    find(problems, "", "a key must be plain text")


def test_load_recipe_raises_one_error_listing_every_problem(workspace: Path) -> None:
    path = write(workspace, "name: x\ntarget: {model: m, colour: red}\nsources: []\noutput: {dir: o}\n")
    with pytest.raises(CorpusError) as caught:
        load_recipe(path)
    error = caught.value
    assert error.problem == "recipe is invalid" and error.file == str(path)
    assert error.details == [
        f"{path}:2:20: target.colour: unknown key 'colour'; allowed here: model, revision, tokenizer, "
        "trust_remote_code, endpoints, launch, backend, allow_mixed_targets, generation",
        f"{path}:3:10: sources: needs at least 1 item",
    ]


def test_problem_string_forms() -> None:
    assert str(Problem("r.yaml", 3, 5, "a.b", "bad")) == "r.yaml:3:5: a.b: bad"
    assert str(Problem("r.yaml", 3, None, "", "bad")) == "r.yaml:3: bad"
    assert str(Problem("r.yaml", None, None, "", "bad")) == "r.yaml: bad"


# --------------------------------------------------------------------------------------------------
# The schema, its reference, and import weight


def test_schema_is_valid_json_schema() -> None:
    from jsonschema import Draft202012Validator

    Draft202012Validator.check_schema(recipe_schema())
    assert json.loads((REPO / "schemas" / "recipe.schema.json").read_text()) == recipe_schema()


def test_reference_covers_every_key() -> None:
    reference = render_reference(recipe_schema())
    for row in ("`target.generation.on_length` | string | `drop` | `drop`, `keep`, `retry`",
                "`sources[].take` | mapping |  | exactly one of `count`, `fraction`",
                "`sources[].path` | string or list of strings",
                "`target.launch.port` | integer | `0` | ≥ 0; ≤ 65535"):
        assert row in reference


def test_importing_the_recipe_module_stays_light() -> None:
    heavy = ["torch", "transformers", "vllm", "pyarrow", "datasets", "huggingface_hub", "jsonschema"]
    code = f"import sys, corpus_builder.recipe; print([m for m in {heavy!r} if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_dedup_and_decontamination_settings_are_typed(workspace: Path) -> None:
    recipe = load_recipe(write(workspace, FULL_RECIPE))
    near = recipe.checks.near_duplicates
    assert near is not None and (near.threshold, near.num_perm, near.shingle) == (0.85, 128, 4)
    assert recipe.dedup_ranks() == {"math": 0, "chat": 1, "ultrachat": 2}
    assert [s.name for s in recipe.sources_in_dedup_order("prompts")] == ["math", "ultrachat"]
    screen = recipe.decontamination
    assert screen is not None and (screen.ngram, screen.min_words) == (12, 6)
    gsm, mt_bench = screen.eval_sets
    assert (gsm.path, gsm.hub, gsm.fields) == (workspace / "data" / "math.jsonl", None, ("question",))
    assert mt_bench.path is None and mt_bench.hub is not None and mt_bench.hub.id == "HuggingFaceH4/mt_bench_prompts"
    bare = load_recipe(write(workspace, MINIMAL_RECIPE))
    assert bare.checks.near_duplicates is None and bare.decontamination is None and bare.checks.dedup == "exact"
