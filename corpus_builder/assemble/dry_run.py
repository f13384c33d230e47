"""`corpus build --dry-run` and the preflight that runs before any generation.

A dry run reads every source through the real readers (so bad rows are counted now, not after hours of
generation), probes the endpoints (health, served model, engine version, context length), checks that
first-turn prompts fit the server's context together with max_tokens, and estimates the requests and
tokens to generate, minus what the journal already holds. It generates nothing and starts no server.

The build's preflight is the same report for its prompt sources, filled from the one pass the prompt
stage makes over them (``SourceCounter``), so a build reads its prompt sources once.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CorpusError, Skipped
from ..generate import EndpointInfo, JournalCoverage, journal_coverage
from ..layout import JOURNAL
from ..ray_extra import named_cluster, probe_cluster, ray_missing
from ..recipe.model import Engine, Recipe
from ..records import Conversation
from ..screen.dedup import EvalSets, read_eval_sets
from ..sources import iter_source, prompt_stream
from ..sources.formats import check_source_formats
from ..tokens import TemplateRenderer, TokenSettings
from .mixture import RowBounds, SelectStage, certain_shortfalls

MEASURE_BATCH = 512


@dataclass
class SourceCount:
    name: str
    kind: str
    rows: int = 0  # rows that will enter the pipeline (after take)
    thinking: int = 0  # of them, rows with reasoning (replay sources)
    skipped: Counter[str] = field(default_factory=Counter)
    requests: int = 0  # assistant turns to generate (prompts sources): user turns x n


@dataclass
class BuildPlan:
    """What a build would do: rows per source, the requests, the endpoints, the journal, prompt lengths."""

    recipe: Recipe
    sources: list[SourceCount]
    endpoints: list[EndpointInfo] = field(default_factory=list)
    launch: str | None = None  # what would be launched when the recipe has no endpoint
    journal_cached_rows: int = 0
    prompt_lengths: Counter[int] = field(default_factory=Counter)  # first-turn prompt tokens -> prompts
    context_limit: int | None = None
    eval_sets: EvalSets | None = None  # the decontamination's sets, read and indexed
    cluster: str | None = None  # with the Ray engine: the cluster the build would run on, and what was checked of it
    problems: list[str] = field(default_factory=list)  # the build would not start
    warnings: list[str] = field(default_factory=list)  # it starts, but should be looked at (an endpoint down)

    @property
    def requests(self) -> int:
        return sum(s.requests for s in self.sources)

    @property
    def max_output_tokens(self) -> int:
        return self.requests * self.recipe.target.generation.max_tokens

    @property
    def prompts_measured(self) -> int:
        return sum(self.prompt_lengths.values())

    @property
    def prompts_over_context(self) -> int:
        """First-turn prompts that leave less than max_tokens of the context: the server refuses them."""
        if self.context_limit is None:
            return 0
        room = self.context_limit - self.recipe.target.generation.max_tokens
        return sum(count for length, count in self.prompt_lengths.items() if length > room)


class SourceCounter:
    """Counts rows as they stream by, per source; first-turn prompts are measured in the target's tokens
    (with the renderer when the recipe names a tokenizer)."""

    def __init__(self, recipe: Recipe, renderer: TemplateRenderer | None) -> None:
        self.samples = recipe.target.generation.n
        self.renderer = renderer
        self.counts: dict[str, SourceCount] = {}
        self.kinds = {spec.name: spec.kind for spec in recipe.sources}
        self.prompt_lengths: Counter[int] = Counter()
        self._first_prompts: list[str] = []  # rendered, waiting to be tokenized in one batch

    def count(self, items: Iterable[Conversation | Skipped]) -> Iterator[Conversation | Skipped]:
        """Pass ``items`` through, counting each."""
        for item in items:
            count = self.counts.get(item.source)
            if count is None:
                count = self.counts[item.source] = SourceCount(item.source, self.kinds.get(item.source, "replay"))
            if isinstance(item, Skipped):
                count.skipped[item.reason] += 1
            else:
                count.rows += 1
                count.thinking += item.thinking
                if count.kind == "prompts":
                    count.requests += sum(1 for m in item.messages if m.role == "user") * self.samples
                    if self.renderer is not None:
                        self._measure(item)
            yield item
        self._measure_pending()

    def sources(self, recipe: Recipe, kinds: tuple[str, ...]) -> list[SourceCount]:
        """One count per recipe source of the given kinds, in recipe order (zero for a source that gave none)."""
        return [self.counts.get(spec.name) or SourceCount(spec.name, spec.kind)
                for spec in recipe.sources if spec.kind in kinds]

    def bounds(self, recipe: Recipe) -> dict[str, RowBounds]:
        """The most rows each source can give the corpus: the replay rows read less the eval pack's, each
        prompt's samples."""
        shares = recipe.pack_shares()
        bounds = {}
        for count in self.sources(recipe, ("replay", "prompts")):
            if count.kind == "prompts":
                bounds[count.name] = RowBounds.of_prompts(count.rows, self.samples)
                continue
            share = shares.get(count.name)
            rows = count.rows - (share.held(count.rows) if share is not None else 0)
            bounds[count.name] = RowBounds.of_rows(rows, min(count.thinking, rows),
                                                   "rows read, less the eval pack's" if share else "rows read")
        return bounds

    def _measure(self, conversation: Conversation) -> None:
        """The prompt of the conversation's first assistant turn (its tools included), as the server renders it."""
        assert self.renderer is not None
        first_user = next(index for index, message in enumerate(conversation.messages) if message.role == "user")
        self._first_prompts.append(self.renderer.render_prompt(conversation, first_user + 1))
        if len(self._first_prompts) >= MEASURE_BATCH:
            self._measure_pending()

    def _measure_pending(self) -> None:
        if self.renderer is None or not self._first_prompts:
            return
        self.prompt_lengths.update(len(ids) for ids in self.renderer.encode(self._first_prompts))
        self._first_prompts.clear()


def plan_build(recipe: Recipe, out: Path | None = None, *, allow_short: bool | None = None,
               engine: Engine | None = None, address: str | None = None) -> BuildPlan:
    """The dry run: read every source once, probe the endpoints, measure first-turn prompts against the
    context and count what the journal already holds. Sends no generation request, starts no server. An
    evaluation set that would check nothing is a CorpusError, as it is for the build.

    What the declared corpus certainly misses with the rows read is a problem, or with ``allow_short``
    (default: ``mixture.allow_short``) a warning: the build would write it short. With the Ray engine
    (``engine``, else the recipe's), the cluster the build would run on (``address``, else RAY_ADDRESS, else one
    it starts here): a named cluster's head is probed, not joined; Ray missing or a cluster that does not answer is
    a problem."""
    check_source_formats(recipe)
    eval_sets = read_eval_sets(recipe.decontamination)
    settings = TokenSettings.from_recipe(recipe)
    counter = SourceCounter(recipe, settings.renderer() if settings is not None else None)
    for spec in recipe.sources:
        if spec.kind == "replay":
            for _ in counter.count(iter_source(spec, recipe.base_dir)):
                pass
    coverage = None
    if recipe.has_prompts:
        prompts = (item for item in counter.count(prompt_stream(recipe)) if isinstance(item, Conversation))
        journal_dir = (out if out is not None else recipe.output.dir) / JOURNAL
        if _has_journal(journal_dir):
            coverage = journal_coverage(prompts, recipe, journal_dir)
        else:
            for _ in prompts:
                pass
    plan = complete_plan(recipe, counter, ("replay", "prompts"), coverage)
    if (engine or recipe.engine) == "ray":
        _check_ray_cluster(plan, address)
    plan.eval_sets = eval_sets
    plan.warnings += eval_sets.warnings() if eval_sets is not None else []
    allowed = recipe.mixture.allow_short if allow_short is None else allow_short
    for line in certain_shortfalls(SelectStage.of(recipe), counter.bounds(recipe)):
        if allowed:
            plan.warnings.append(f"declared corpus: {line} (--allow-short: the build writes it short)")
        else:
            plan.problems.append(f"declared corpus: {line}")
    return plan


def _check_ray_cluster(plan: BuildPlan, address: str | None) -> None:
    """Where a Ray build would run, and what the dry run checked of it (Ray installed; a named cluster's head
    answering, ``ray_extra.probe_cluster``), into the plan; what fails a problem."""
    if importlib.util.find_spec("ray") is None:
        plan.problems.append(ray_missing("build"))
    try:
        cluster = named_cluster(address)
    except CorpusError as error:
        plan.cluster = "ray, on a cluster named by what is not an address (see the problems)"
        plan.problems.append(str(error))
        return
    if cluster is None:
        plan.cluster = ("ray, on a cluster the build starts on this machine (loopback alone, no dashboard, no usage "
                        "statistics) and stops when it ends")
    elif cluster.address == "auto":
        plan.cluster = (f"ray, on the cluster Ray finds on this machine ({cluster}): not checked (Ray finds it when "
                        "the build joins)")
    else:
        plan.cluster = f"ray, on the cluster at {cluster.address} ({cluster.named_by})"
        try:
            probe_cluster(cluster)
        except CorpusError as error:
            plan.cluster += ": does not answer"
            plan.problems.append(str(error))
        else:
            plan.cluster += ": its head answers (probed, not joined: the dry run runs nothing on it)"


def _has_journal(journal_dir: Path) -> bool:
    return journal_dir.is_dir() and any(journal_dir.iterdir())


def complete_plan(recipe: Recipe, counter: SourceCounter, kinds: tuple[str, ...],
                  coverage: JournalCoverage | None) -> BuildPlan:
    """The plan from counted sources: the endpoints probed (or what would be launched) and the context."""
    plan = BuildPlan(recipe, counter.sources(recipe, kinds), prompt_lengths=counter.prompt_lengths,
                     journal_cached_rows=coverage.cached_rows if coverage is not None else 0)
    if not recipe.has_prompts:
        return plan
    plan.problems += _thinking_problems(recipe, counter.renderer)
    target = recipe.target
    if target.endpoints and target.backend == "server":
        plan.endpoints = asyncio.run(_probe(recipe))
        limits = [info.max_model_len for info in plan.endpoints if info.healthy and info.max_model_len]
        plan.context_limit = min(limits) if limits else None
        # A build starts on the endpoints that answer; the others join when they recover.
        unusable = [f"{info.url}: {info.error}" for info in plan.endpoints if not info.healthy]
        if len(unusable) == len(plan.endpoints):
            plan.problems += unusable
        else:
            plan.warnings += [f"{line} (the build starts without it and takes it back when it recovers)"
                              for line in unusable]
    elif target.launch is not None and not target.endpoints:
        plan.launch = f"local vLLM server on {target.launch.model_dir} ({' '.join(target.launch.args)})"
        plan.context_limit = _launch_context_limit(recipe)
    return plan


def _thinking_problems(recipe: Recipe, renderer: TemplateRenderer | None) -> list[str]:
    """A recipe that asks for thinking from a template without a thinking mode: every answer would come back
    as reasoning that never closes (vLLM's reasoning parser reads an answer as reasoning until ``</think>``)
    and be dropped, an empty corpus after a whole generation. The template is the recipe's tokenizer's, or the
    launched model's (of a server the recipe only names, nothing is known here without target.tokenizer)."""
    target = recipe.target
    asks = target.generation.enable_thinking and any(spec.kind == "prompts" and spec.thinking_off_share < 1
                                                     for spec in recipe.sources)
    if not asks:
        return []
    if renderer is None and target.launch is not None and not target.endpoints:
        try:
            renderer = TemplateRenderer(target.launch.model_dir)
        except CorpusError:  # no template there: the server refuses to chat, saying so
            return []
    problem = renderer.thinking_mode_problem if renderer is not None else None
    if renderer is None or problem is None:
        return []
    return [f"target.generation.enable_thinking is true, but the chat template of {renderer.tokenizer_dir} has no "
            f"thinking mode ({problem}): every answer would come back as unclosed reasoning and be dropped; set "
            "enable_thinking: false for this target"]


async def _probe(recipe: Recipe) -> list[EndpointInfo]:
    from ..generate.client import EndpointPool

    settings = recipe.target.generation
    async with EndpointPool(list(recipe.target.endpoints), timeout_s=settings.timeout_s, max_retries=0,
                            concurrency=1) as pool:
        try:
            return await pool.check(recipe.target.model)
        except CorpusError:
            return pool.last_check


def _launch_context_limit(recipe: Recipe) -> int | None:
    """--max-model-len from the launch args, else the model config's max_position_embeddings."""
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


def format_plan(plan: BuildPlan) -> str:
    recipe = plan.recipe
    lines = [f"{'source':<20} {'kind':<8} {'rows':>9} {'skipped':>8}  {'requests':>9}"]
    for source in plan.sources:
        requests = f"{source.requests:>9,}" if source.kind == "prompts" else f"{'-':>9}"
        lines.append(f"{source.name:<20} {source.kind:<8} {source.rows:>9,} {sum(source.skipped.values()):>8,}  "
                     f"{requests}")
        for reason, count in sorted(source.skipped.items()):
            lines.append(f"{'':<20}   skipped {reason}: {count:,}")
    shares = recipe.pack_shares()
    held = [f"{source.name} {shares[source.name].held(source.rows):,} of {source.rows:,}"
            for source in plan.sources if source.name in shares]
    if held:
        lines += ["", f"eval pack: conversations held out of {', '.join(held)} (stratified by task and thinking)"]
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
        if plan.prompts_measured and plan.context_limit is not None:
            lines.append(f"prompt lengths: {plan.prompts_measured:,} first-turn prompts measured; "
                         f"{plan.prompts_over_context:,} leave less than max_tokens of the "
                         f"{plan.context_limit:,}-token context (the server will refuse them)")
    if plan.cluster is not None:
        lines += ["", f"engine: {plan.cluster}"]
    if plan.eval_sets is not None:
        lines += ["", f"decontamination against {len(plan.eval_sets.reads)} eval set(s), "
                      f"{plan.eval_sets.index.n}-word runs:"]
        for read, summary in zip(plan.eval_sets.reads, plan.eval_sets.index.eval_sets, strict=True):
            skipped = read.describe_skipped()
            lines.append(f"  {read.spec.name:<18} {read.where}  {summary.texts - summary.ignored:,} texts "
                         f"({summary.ignored:,} shorter than {plan.eval_sets.index.min_words} words, left out)"
                         f"{'; ' + skipped if skipped else ''}")
    if plan.warnings:
        lines += ["", "warnings:"] + [f"  {warning}" for warning in plan.warnings]
    if plan.problems:
        lines += ["", "problems:"] + [f"  {problem}" for problem in plan.problems]
    return "\n".join(lines)
