"""A recipe that asks for thinking from a target whose chat template has no thinking mode is refused at the
preflight (and shown by the dry run), before any server starts or any request is sent: such a target answers
every request as reasoning that never closes, and the build would end in an empty corpus."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from corpus_builder.assemble import plan_build
from corpus_builder.recipe import load_recipe
from corpus_builder.tokens import TemplateRenderer

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# R1-style: the prompt always opens the block, whatever enable_thinking says
ALWAYS_THINKS = CHATML.replace("'<|im_start|>assistant\\n'", "'<|im_start|>assistant\\n<think>\\n'")
# the flag switches a system line, and no think tag is ever written
FLAG_WITHOUT_TAGS = CHATML.replace("{% if add_generation_prompt %}",
                                   "{% if enable_thinking %}{{ 'reason first\\n' }}{% endif %}"
                                   "{% if add_generation_prompt %}")
NO_THINKING = "has no thinking mode"


def template_dir(root: Path, template: str) -> Path:
    root.mkdir(parents=True)
    (root / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "eos_token": "<|im_end|>"}))
    return root


@pytest.mark.parametrize(("template", "has_thinking_mode"), [
    (CHATML, False), (ALWAYS_THINKS, True), (FLAG_WITHOUT_TAGS, True)], ids=["chatml", "always-thinks", "flag-only"])
def test_a_template_has_a_thinking_mode_when_the_flag_changes_it_or_it_writes_think_tags(
        tmp_path: Path, template: str, has_thinking_mode: bool) -> None:
    problem = TemplateRenderer(template_dir(tmp_path / "tok", template)).thinking_mode_problem
    assert (problem is None) is has_thinking_mode
    if problem is not None:
        assert "same with enable_thinking true and false" in problem and "<think>" in problem


def test_the_tiny_models_template_has_a_thinking_mode(tiny_model_dir: Path) -> None:
    assert TemplateRenderer(tiny_model_dir).thinking_mode_problem is None


def write_recipe(root: Path, target: str, *, thinking: bool = True, off_share: float = 0.0) -> Path:
    (root / "prompts.jsonl").write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]})
                                                  for i in range(3)) + "\n")
    recipe = root / "recipe.yaml"
    recipe.write_text(f"""\
name: thinking-preflight
target:
  model: some-target
{target}
  generation: {{enable_thinking: {str(thinking).lower()}, max_tokens: 16}}
sources:
  - {{name: prompts, kind: prompts, path: prompts.jsonl, thinking_off_share: {off_share}}}
output: {{dir: out}}
""")
    return recipe


def launching(model_dir: Path) -> str:
    return f"  launch: {{model_dir: {model_dir}, args: [--enforce-eager]}}"


def test_the_preflight_refuses_thinking_from_a_template_without_it(tmp_path: Path, tiny_model_dir: Path) -> None:
    model = template_dir(tmp_path / "model", CHATML)
    (problem,) = plan_build(load_recipe(write_recipe(tmp_path, launching(model)))).problems
    assert problem.startswith("target.generation.enable_thinking is true, but the chat template of "
                              f"{model} has no thinking mode") and "set enable_thinking: false" in problem
    # the tokenizer the recipe names is the template the server renders with
    tokenizer = template_dir(tmp_path / "tokenizer", CHATML)
    shutil.copyfile(tiny_model_dir / "tokenizer.json", tokenizer / "tokenizer.json")
    named = write_recipe(tmp_path, f"  tokenizer: {tokenizer}\n  endpoints: [http://127.0.0.1:9/v1]")
    assert any(f"chat template of {tokenizer} {NO_THINKING}" in p for p in plan_build(load_recipe(named)).problems)


@pytest.mark.parametrize(("thinking", "off_share"), [(False, 0.0), (True, 1.0)], ids=["thinking-off", "all-rows-off"])
def test_a_recipe_that_asks_no_thinking_passes_the_preflight(tmp_path: Path, thinking: bool, off_share: float) -> None:
    model = template_dir(tmp_path / "model", CHATML)
    recipe = write_recipe(tmp_path, launching(model), thinking=thinking, off_share=off_share)
    assert plan_build(load_recipe(recipe)).problems == []


def test_a_thinking_model_passes_the_preflight(tmp_path: Path, tiny_model_dir: Path) -> None:
    assert plan_build(load_recipe(write_recipe(tmp_path, launching(tiny_model_dir)))).problems == []


def corpus(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corpus_builder", *args], capture_output=True, text=True)


def test_building_thinking_on_smollm2_fails_before_its_server_starts(tmp_path: Path, smollm2_dir: Path) -> None:
    """The real model's own template (ChatML with a default system prompt, no thinking mode): the build stops at
    the preflight with exit 2, starts no server, sends nothing, writes nothing; the dry run says the same."""
    recipe = write_recipe(tmp_path, launching(smollm2_dir))
    dry = corpus("build", str(recipe), "--dry-run")
    assert dry.returncode == 2 and f"chat template of {smollm2_dir} {NO_THINKING}" in dry.stdout
    built = corpus("build", str(recipe))
    assert built.returncode == 2, built.stderr
    assert "preflight failed: no request was sent" in built.stderr and NO_THINKING in built.stderr
    assert "starting a local vLLM server" not in built.stdout + built.stderr
    assert not (tmp_path / "out").exists()
