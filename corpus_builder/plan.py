"""`corpus build --dry-run` and the preflight that runs before any generation.

A dry run reads every source through the real readers (so bad rows are counted now, not after hours of
generation), probes the endpoints (health, served model, engine version, context length), checks that
first-turn prompts fit the server's context together with max_tokens, and estimates the requests and
tokens to generate, minus what the journal already holds. It generates nothing and starts no server.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .corpus import JOURNAL
from .errors import Skipped
from .generate.types import EndpointInfo
from .recipe_types import Recipe
from .records import Conversation


@dataclass
class SourcePlan:
    name: str
    kind: str
    rows: int = 0  # rows that will enter the pipeline (after take)
    skipped: Counter[str] = field(default_factory=Counter)
    requests: int = 0  # assistant turns to generate (prompts sources): user turns x n


@dataclass
class BuildPlan:
    recipe: Recipe
    sources: list[SourcePlan]
    endpoints: list[EndpointInfo] = field(default_factory=list)
    launch: str | None = None  # what would be launched when the recipe has no endpoint
    journal_cached_rows: int = 0
    prompt_tokens_known: int = 0  # first-turn prompts measured
    prompts_over_context: int = 0
    context_limit: int | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return sum(s.requests for s in self.sources)

    @property
    def max_output_tokens(self) -> int:
        return self.requests * self.recipe.target.generation.max_tokens


def _user_turns(conversation: Conversation) -> int:
    return sum(1 for m in conversation.messages if m.role == "user")


def plan_build(recipe: Recipe, out: Path | None = None, *, kinds: tuple[str, ...] = ("replay", "prompts")
               ) -> BuildPlan:
    """Read the sources of the given kinds, probe the endpoints and measure first-turn prompts."""
    from .sources import iter_source

    n = recipe.target.generation.n
    plans = []
    first_turns: list[list[dict[str, Any]]] = []
    for spec in (s for s in recipe.sources if s.kind in kinds):
        plan = SourcePlan(spec.name, spec.kind)
        for item in iter_source(spec, recipe.base_dir):
            if isinstance(item, Skipped):
                plan.skipped[item.reason] += 1
                continue
            plan.rows += 1
            if spec.kind == "prompts":
                plan.requests += _user_turns(item) * n
                first_turns.append(_first_turn(item))
        plans.append(plan)
    build_plan = BuildPlan(recipe, plans)
    if not recipe.has_prompts:
        return build_plan
    journal_dir = (out if out is not None else recipe.output.dir) / JOURNAL
    if journal_dir.is_dir():
        from .build import iter_prompts
        from .generate import journal_coverage
        from .generation import split_skipped

        coverage = journal_coverage(split_skipped(iter_prompts(recipe), deque()), recipe, journal_dir)
        build_plan.journal_cached_rows = coverage.cached_rows
    target = recipe.target
    if target.endpoints and target.backend == "server":
        build_plan.endpoints = asyncio.run(_probe(recipe))
        limits = [info.max_model_len for info in build_plan.endpoints if info.healthy and info.max_model_len]
        build_plan.context_limit = min(limits) if limits else None
        build_plan.problems += [f"{info.url}: {info.error}" for info in build_plan.endpoints if not info.healthy]
    elif target.launch is not None and not target.endpoints:
        build_plan.launch = f"local vLLM server on {target.launch.model_dir} ({' '.join(target.launch.args)})"
        build_plan.context_limit = _launch_context_limit(recipe)
    _check_prompt_lengths(build_plan, first_turns)
    return build_plan


def _first_turn(conversation: Conversation) -> list[dict[str, Any]]:
    turns = []
    for message in conversation.messages:
        turns.append({"role": message.role, "content": message.content})
        if message.role == "user":
            break
    return turns


async def _probe(recipe: Recipe) -> list[EndpointInfo]:
    from .errors import CorpusError
    from .generate.client import EndpointPool

    settings = recipe.target.generation
    async with EndpointPool(list(recipe.target.endpoints), timeout_s=settings.timeout_s, max_retries=0,
                            concurrency=1) as pool:
        try:
            return await pool.check(recipe.target.model)
        except CorpusError:
            return pool.last_check


def _launch_context_limit(recipe: Recipe) -> int | None:
    """--max-model-len from the launch args, else the model config's max_position_embeddings."""
    import json

    launch = recipe.target.launch
    assert launch is not None
    args = list(launch.args)
    for index, arg in enumerate(args):
        if arg == "--max-model-len" and index + 1 < len(args):
            return int(args[index + 1])
        if arg.startswith("--max-model-len="):
            return int(arg.split("=", 1)[1])
    config = launch.model_dir / "config.json"
    if config.exists():
        value = json.loads(config.read_text(encoding="utf-8")).get("max_position_embeddings")
        return value if isinstance(value, int) else None
    return None


def _check_prompt_lengths(plan: BuildPlan, first_turns: list[list[dict[str, Any]]]) -> None:
    """First-turn prompts measured with the target's template and tokenizer (when the recipe names it):
    a prompt that cannot fit max_tokens into the context is refused by the server (a 400 in the ledger)."""
    recipe = plan.recipe
    if plan.context_limit is None or recipe.target.tokenizer is None or not first_turns:
        return
    from .render import TemplateRenderer

    renderer = TemplateRenderer(recipe.target.tokenizer, enable_thinking=recipe.target.generation.enable_thinking)
    room = plan.context_limit - recipe.target.generation.max_tokens
    for start in range(0, len(first_turns), 512):
        texts = [renderer.render(turns, add_generation_prompt=True) for turns in first_turns[start:start + 512]]
        for encoding in renderer.tokenizer.encode_batch(texts, add_special_tokens=False):
            plan.prompt_tokens_known += 1
            if len(encoding.ids) > room:
                plan.prompts_over_context += 1


def format_plan(plan: BuildPlan) -> str:
    recipe = plan.recipe
    lines = [f"{'source':<20} {'kind':<8} {'rows':>9} {'skipped':>8}  {'requests':>9}"]
    for source in plan.sources:
        requests = f"{source.requests:>9,}" if source.kind == "prompts" else f"{'-':>9}"
        lines.append(f"{source.name:<20} {source.kind:<8} {source.rows:>9,} {sum(source.skipped.values()):>8,}  "
                     f"{requests}")
        for reason, count in sorted(source.skipped.items()):
            lines.append(f"{'':<20}   skipped {reason}: {count:,}")
    if recipe.has_prompts:
        settings = recipe.target.generation
        lines += ["", f"generation: {plan.requests:,} requests (n={settings.n}), at most "
                      f"{plan.max_output_tokens:,} output tokens (max_tokens {settings.max_tokens}), "
                      f"enable_thinking={settings.enable_thinking}, temperature {settings.temperature}, "
                      f"top_p {settings.top_p}, top_k {settings.top_k}"]
        if plan.journal_cached_rows:
            lines.append(f"journal: {plan.journal_cached_rows:,} generated rows already cached "
                         "(not requested again)")
        for info in plan.endpoints:
            state = "healthy" if info.healthy else f"NOT USABLE: {info.error}"
            lines.append(f"endpoint {info.url}: {state}; serves {info.models}; engine {info.engine_version}; "
                         f"max_model_len {info.max_model_len}")
        if plan.launch:
            lines.append(f"would launch: {plan.launch}")
        if plan.prompt_tokens_known:
            lines.append(f"prompt lengths: {plan.prompt_tokens_known:,} first-turn prompts measured; "
                         f"{plan.prompts_over_context:,} leave less than max_tokens of the "
                         f"{plan.context_limit:,}-token context (the server will refuse them)")
    if plan.problems:
        lines += ["", "problems:"] + [f"  {problem}" for problem in plan.problems]
    return "\n".join(lines)
