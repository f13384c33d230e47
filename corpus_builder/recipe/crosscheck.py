"""Recipe checks the schema cannot express: cross-field rules, files that must exist, derived defaults."""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

from .yaml_reader import KeyPath, Parsed, Problem


def match_source_pattern(base_dir: Path, pattern: str) -> list[Path]:
    """Files a source's path pattern names (a path or a glob, `**` allowed), relative to base_dir.

    One rule for the recipe check and the readers, so a recipe that validates reads the same files.
    """
    # The recipe's own directory may contain glob characters: only the pattern may expand.
    full = pattern if os.path.isabs(pattern) else os.path.join(glob.escape(str(base_dir)), pattern)
    return sorted(Path(p) for p in glob.glob(full, recursive=True) if os.path.isfile(p))



def _section(document: Any, *keys: str) -> dict[str, Any]:
    """document[k1][k2]... when each step is a mapping, else {}: checks must survive invalid documents,
    since the schema's own problems are reported alongside theirs."""
    for key in keys:
        document = document.get(key) if isinstance(document, dict) else None
    return document if isinstance(document, dict) else {}


def fill_derived(document: dict[str, Any]) -> dict[str, Any]:
    """Defaults computed from other settings (the schema's descriptions state them)."""
    generation = _section(document, "target", "generation")
    max_tokens = generation.get("max_tokens")
    if generation.get("on_length") == "retry" and "retry_max_tokens" not in generation and isinstance(
        max_tokens, int
    ):
        generation["retry_max_tokens"] = 2 * max_tokens
    return document


def local_path(base_dir: Path, written: str) -> Path:
    """A path setting as the tools use it: relative to the recipe's directory unless absolute."""
    return base_dir / written


def cross_field_problems(document: dict[str, Any], base_dir: Path, parsed: Parsed) -> list[Problem]:
    problems: list[Problem] = []

    def report(path: KeyPath, message: str, at_key: bool = False) -> None:
        problems.append(parsed.problem(path, message, at_key))

    target = _section(document, "target")
    written_sources = document.get("sources")
    sources: list[Any] = written_sources if isinstance(written_sources, list) else []

    first_use: dict[str, int] = {}
    for index, source in enumerate(sources):
        if not isinstance(source, dict):
            continue
        name = source.get("name")
        if isinstance(name, str):
            if name in first_use:
                report(("sources", index, "name"), f"source name '{name}' is already used by "
                                                   f"sources[{first_use[name]}]; names must be unique")
            else:
                first_use[name] = index
        written = source.get("path")
        patterns: list[tuple[KeyPath, str]]
        if isinstance(written, str):
            patterns = [(("sources", index, "path"), written)]
        elif isinstance(written, list):
            patterns = [(("sources", index, "path", i), pattern)
                        for i, pattern in enumerate(written) if isinstance(pattern, str)]
        else:
            patterns = []
        for key_path, pattern in patterns:
            if not match_source_pattern(base_dir, pattern):
                report(key_path, f"no file matches '{pattern}' (looked in {base_dir})")
        mapping = _section(source, "mapping")
        if mapping.get("style") == "field" and "field" not in mapping:
            report(("sources", index, "mapping"), "mapping style 'field' needs mapping.field "
                                                  "(the field that holds the prompt text)", at_key=True)

    tokenizer = target.get("tokenizer")
    if isinstance(tokenizer, str):
        directory = local_path(base_dir, tokenizer)
        if not directory.is_dir():
            report(("target", "tokenizer"), f"tokenizer directory not found: {directory}")
        elif not (directory / "tokenizer.json").is_file():
            report(("target", "tokenizer"), f"tokenizer directory has no tokenizer.json: {directory}")
    if "max_seq_len" in _section(document, "checks") and tokenizer is None:
        report(("checks", "max_seq_len"), "max_seq_len counts tokens in the target's tokenizer: "
                                          "set target.tokenizer")
    exports = _section(document, "output").get("exports")
    for index, export in enumerate(exports if isinstance(exports, list) else []):
        if isinstance(export, dict) and export.get("format") == "speculators-tokens" and tokenizer is None:
            report(("output", "exports", index, "format"), "speculators-tokens rows are in the target's tokens: "
                                                             "set target.tokenizer")

    launch = _section(target, "launch")
    model_dir = launch.get("model_dir")
    if isinstance(model_dir, str) and not local_path(base_dir, model_dir).is_dir():
        report(("target", "launch", "model_dir"),
               f"model directory not found: {local_path(base_dir, model_dir)}")

    prompt_sources = [s.get("name") for s in sources if isinstance(s, dict) and s.get("kind") == "prompts"]
    if prompt_sources and not (target.get("endpoints") or launch or target.get("backend") == "engine"):
        names = ", ".join(f"'{n}'" for n in prompt_sources)
        report(("target",), f"prompts source(s) {names} need the target to generate: set target.endpoints, "
                            "target.launch, or target.backend: engine", at_key=True)

    generation = _section(target, "generation")
    retry_budget, budget = generation.get("retry_max_tokens"), generation.get("max_tokens")
    if (generation.get("on_length") == "retry" and isinstance(retry_budget, int)
            and isinstance(budget, int) and retry_budget <= budget):
        report(("target", "generation", "retry_max_tokens"),
               f"retry_max_tokens ({retry_budget}) must be larger than max_tokens ({budget}): "
               "the retry exists to give a truncated generation more room")
    return problems

