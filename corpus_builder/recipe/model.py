"""Typed view of a validated recipe. The shape is defined once, in schemas/recipe.schema.json; these
classes only give the validated, default-filled document names and types."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..records import RepairRules
from ..trainer_formats import ExportFormat, FileFormat
from .yaml_reader import Parsed

# The recipe's closed choices, as the schema's enums spell them (tests/recipe/test_model.py ties the two).
HistoryReasoning = Literal["keep", "drop"]
OnLength = Literal["drop", "keep", "retry"]
Backend = Literal["server", "engine"]
# What runs a build: this machine, or a Ray cluster (assemble/ray_data.py); the same corpus either way.
Engine = Literal["local", "ray"]
MappingStyle = Literal["auto", "sharegpt", "messages", "gsm8k", "field", "log"]
SourceKind = Literal["replay", "prompts"]
# A source's format when its files' names tell it; else a registered source format's name, checked against
# the names of the formats' registry, which sits above the recipe (``schema.source_format_problems``).
AUTO_FORMAT = "auto"
ToolResults = Literal["match", "recorded"]
OnOverLength = Literal["drop", "truncate"]
OnUnclosedThink = Literal["drop", "keep"]
DedupMode = Literal["exact", "prompt", "none"]
TokenMismatch = Literal["warn", "fail"]


@dataclass(frozen=True, slots=True)
class GenerationSettings:
    enable_thinking: bool = True
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    max_tokens: int = 2048
    seed: int | None = None
    n: int = 1
    history_reasoning: HistoryReasoning = "keep"
    on_length: OnLength = "drop"
    retry_max_tokens: int | None = None
    concurrency: int = 64
    timeout_s: float = 600.0
    max_retries: int = 6
    max_outage_s: float = 120.0
    allow_partial: bool = False
    share_identical_turns: bool = False
    # (weight, overrides) entries: each generated row draws one, seeded by its id, and records what it got
    sampling_mixture: tuple[dict[str, float], ...] = ()
    extra_sampling: dict[str, object] = field(default_factory=dict)  # the schema keeps out the fields above

    def sampling(self) -> dict[str, object]:
        """The sampling fields sent with every request (and recorded in provenance and the journal key)."""
        sampling: dict[str, object] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "max_tokens": self.max_tokens,
        }
        if self.seed is not None:
            sampling["seed"] = self.seed
        return sampling | self.extra_sampling


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    model_dir: Path
    args: tuple[str, ...] = ()
    port: int = 0
    startup_timeout_s: float = 600.0
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Target:
    model: str
    revision: str | None = None
    tokenizer: Path | None = None  # a local directory ...
    tokenizer_hub: str | None = None  # ... or a Hub model id, fetched (tokenizer and template files only)
    trust_remote_code: bool = False
    endpoints: tuple[str, ...] = ()
    launch: LaunchSpec | None = None
    backend: Backend = "server"
    allow_mixed_targets: bool = False
    generation: GenerationSettings = field(default_factory=GenerationSettings)


@dataclass(frozen=True, slots=True)
class HubRef:
    id: str
    config: str | None = None
    split: str = "train"
    revision: str | None = None


@dataclass(frozen=True, slots=True)
class Mapping:
    style: MappingStyle = "auto"
    field: str | None = None
    id_field: str | None = None


@dataclass(frozen=True, slots=True)
class Fold:
    """How the requests of a logged multi-turn chat become one conversation (sources.fold)."""

    enabled: bool = True
    max_open: int = 50_000  # conversations held open at once: the fold's memory bound


@dataclass(frozen=True, slots=True)
class Take:
    count: int | None = None
    fraction: float | None = None
    seed: int = 0


@dataclass(frozen=True, slots=True)
class PackShare:
    """A replay source's part of the eval pack: a number of conversations, or a share of them."""

    rows: int | None = None
    fraction: float | None = None

    def held(self, size: int) -> int:
        """Conversations held out of a source of ``size``: at most all of them, a share rounded half up."""
        if self.rows is not None:
            return min(self.rows, size)
        return math.floor((self.fraction or 0.0) * size + 0.5)


@dataclass(frozen=True, slots=True)
class EvalPackSpec:
    """The eval pack held out of the replay sources (``eval`` in the recipe)."""

    share: PackShare = field(default_factory=PackShare)  # every replay source's, unless it gives its own
    seed: int = 0


@dataclass(frozen=True, slots=True)
class SourceTarget:
    """Rows of one source in the final corpus: a count, or a share of the corpus."""

    count: int | None = None
    share: float | None = None


@dataclass(frozen=True, slots=True)
class SourceSpec:
    name: str
    kind: SourceKind
    paths: tuple[str, ...] = ()  # as written (globs allowed), resolved against Recipe.base_dir
    hub: HubRef | None = None
    format: str = AUTO_FORMAT  # else a registered source format's name
    mapping: Mapping = field(default_factory=Mapping)
    take: Take | None = None
    repair: RepairRules = field(default_factory=RepairRules)
    system_prompt: str | None = None
    task: str | None = None
    license: str | None = None
    thinking_off_share: float = 0.0  # prompts: share of rows regenerated with thinking off
    tool_choice: str | dict[str, Any] | None = None  # prompts: sent as OpenAI's tool_choice with rows that have tools
    tool_results: ToolResults = "match"  # prompts with tool traffic
    target: SourceTarget | None = None  # rows in the final corpus, met after every drop (see Mixture)
    eval: PackShare | None = None  # replay: its part of the eval pack, instead of the recipe's eval share
    fold: Fold = field(default_factory=Fold)  # logged exchanges (mapping style log): one row per conversation

    @property
    def tool_choice_function(self) -> str | None:
        """The function a named tool_choice makes the target call (OpenAI's form, as loaded); None otherwise."""
        return self.tool_choice["function"]["name"] if isinstance(self.tool_choice, dict) else None


@dataclass(frozen=True, slots=True)
class NearDuplicateSettings:
    threshold: float = 0.8
    num_perm: int = 64
    shingle: int = 5


# The probability with which a pair at exactly the near-duplicate threshold becomes an LSH candidate
# (screen.near_dedup); the band layout is the steepest one that keeps it.
CANDIDATE_AT_THRESHOLD = 0.95


def band_layout(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows per band) using at most ``num_perm`` MinHash values: the most rows per band for which a
    pair at ``threshold`` becomes a candidate with probability >= CANDIDATE_AT_THRESHOLD. Here, not in the
    build, so that `corpus validate` refuses settings that have none."""
    for rows in range(num_perm, 0, -1):
        bands = num_perm // rows
        if _candidate_probability(threshold, bands, rows) >= CANDIDATE_AT_THRESHOLD:
            return bands, rows
    raise ValueError(f"no band layout of {num_perm} permutations makes pairs at {threshold} candidates "
                     f"with probability {CANDIDATE_AT_THRESHOLD}")


def least_permutations(threshold: float, most: int) -> int | None:
    """The fewest permutations, up to ``most``, with a band layout at ``threshold`` (None: none up to it): one
    value per band is the layout that makes the most candidates."""
    return next((permutations for permutations in range(1, most + 1)
                 if _candidate_probability(threshold, permutations, 1) >= CANDIDATE_AT_THRESHOLD), None)


def _candidate_probability(similarity: float, bands: int, rows: int) -> float:
    """The probability that a pair whose shingle sets have this Jaccard similarity share a band."""
    return 1.0 - (1.0 - similarity**rows) ** bands


@dataclass(frozen=True, slots=True)
class Checks:
    min_thinking_share: float | None = None
    max_seq_len: int | None = None
    on_over_length: OnOverLength = "drop"
    on_unclosed_think: OnUnclosedThink = "drop"
    dedup: DedupMode = "exact"
    near_duplicates: NearDuplicateSettings | None = None
    dedup_priority: tuple[str, ...] = ()  # source names first kept first; the others follow in recipe order
    token_mismatch: TokenMismatch = "warn"
    redact_secrets: bool = False


@dataclass(frozen=True, slots=True)
class EvalSet:
    name: str
    path: Path | None = None  # a local file (resolved) ...
    hub: HubRef | None = None  # ... or a Hub dataset
    fields: tuple[str, ...] = ()  # empty: every string in a row


@dataclass(frozen=True, slots=True)
class Decontamination:
    eval_sets: tuple[EvalSet, ...]
    ngram: int = 13
    min_words: int = 8


@dataclass(frozen=True, slots=True)
class ThinkingShare:
    target: float
    tolerance: float = 0.02
    per_split: bool = False  # each split (validation too) within the tolerance


@dataclass(frozen=True, slots=True)
class Mixture:
    """The corpus a build must reach (with SourceSpec.target): met after every check, or reported short."""

    total: int | None = None
    thinking_share: ThinkingShare | None = None
    seed: int = 0
    max_rounds: int = 8
    allow_short: bool = False

    def declared(self, sources: tuple[SourceSpec, ...]) -> bool:
        return (self.total is not None or self.thinking_share is not None
                or any(spec.target is not None for spec in sources))


@dataclass(frozen=True, slots=True)
class SplitSpec:
    validation_fraction: float = 0.02
    seed: int = 0


@dataclass(frozen=True, slots=True)
class ExportSpec:
    format: ExportFormat
    file_format: FileFormat = "jsonl"


@dataclass(frozen=True, slots=True)
class OutputSpec:
    dir: Path
    rows_per_shard: int = 50000
    exports: tuple[ExportSpec, ...] = ()


@dataclass(frozen=True, slots=True)
class PublishSpec:
    exports: tuple[ExportSpec, ...] = ()  # uploaded with the corpus at exports/{format}/{split}.{file_format}


@dataclass(frozen=True, slots=True)
class Recipe:
    name: str
    target: Target
    sources: tuple[SourceSpec, ...]
    output: OutputSpec
    checks: Checks = field(default_factory=Checks)
    split: SplitSpec = field(default_factory=SplitSpec)
    mixture: Mixture = field(default_factory=Mixture)
    decontamination: Decontamination | None = None
    eval: EvalPackSpec | None = None
    publish: PublishSpec = field(default_factory=PublishSpec)
    engine: Engine = "local"
    description: str | None = None
    base_dir: Path = Path(".")  # the recipe file's directory: relative paths resolve against it
    path: Path | None = None  # the recipe file itself
    document: dict[str, Any] = field(default_factory=dict)  # the validated document, defaults filled
    written: Parsed | None = field(default=None, compare=False, repr=False)  # the file as read: where each value is,
    # for a check that needs what sits above the recipe (``sources.formats.check_source_formats``)

    @property
    def has_prompts(self) -> bool:
        return any(s.kind == "prompts" for s in self.sources)

    def pack_shares(self) -> dict[str, PackShare]:
        """The replay sources the eval pack holds conversations out of, each with its share (none: no pack)."""
        default = self.eval.share if self.eval is not None else PackShare()
        shares = {spec.name: spec.eval or default for spec in self.sources if spec.kind == "replay"}
        return {name: share for name, share in shares.items() if share.rows or share.fraction}

    def dedup_ranks(self) -> dict[str, int]:
        """Each source's rank in dedup (0 first): ``checks.dedup_priority``, then the others in recipe order."""
        listed = [name for name in self.checks.dedup_priority if any(s.name == name for s in self.sources)]
        order = listed + [s.name for s in self.sources if s.name not in listed]
        return {name: rank for rank, name in enumerate(order)}

    def sources_in_dedup_order(self, kind: str) -> list[SourceSpec]:
        """The sources of one kind in the order dedup keeps them (the first read is the one kept)."""
        ranks = self.dedup_ranks()
        return sorted((s for s in self.sources if s.kind == kind), key=lambda s: ranks[s.name])
