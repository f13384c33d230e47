"""Typed view of a validated recipe. The shape is defined once, in schemas/recipe.schema.json; these
classes only give the validated, default-filled document names and types."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class GenerationSettings:
    enable_thinking: bool = True
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    max_tokens: int = 2048
    seed: int | None = None
    n: int = 1
    history_reasoning: str = "keep"  # keep | drop
    on_length: str = "drop"  # drop | keep | retry
    retry_max_tokens: int | None = None
    concurrency: int = 64
    timeout_s: float = 600.0
    max_retries: int = 6
    extra_sampling: dict[str, Any] = field(default_factory=dict)  # the schema keeps out the fields above

    def sampling(self) -> dict[str, Any]:
        """The sampling fields sent with every request (and recorded in provenance and the journal key)."""
        sampling: dict[str, Any] = {
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
    tokenizer: Path | None = None
    trust_remote_code: bool = False
    endpoints: tuple[str, ...] = ()
    launch: LaunchSpec | None = None
    backend: str = "server"  # server | engine
    generation: GenerationSettings = field(default_factory=GenerationSettings)


@dataclass(frozen=True, slots=True)
class HubRef:
    id: str
    config: str | None = None
    split: str = "train"
    revision: str | None = None


@dataclass(frozen=True, slots=True)
class Mapping:
    style: str = "auto"  # auto | sharegpt | messages | gsm8k | field
    field: str | None = None
    id_field: str | None = None


@dataclass(frozen=True, slots=True)
class Take:
    count: int | None = None
    fraction: float | None = None
    seed: int = 0


@dataclass(frozen=True, slots=True)
class SourceSpec:
    name: str
    kind: str  # replay | prompts
    paths: tuple[str, ...] = ()  # as written (globs allowed), resolved against Recipe.base_dir
    hub: HubRef | None = None
    format: str = "auto"
    mapping: Mapping = field(default_factory=Mapping)
    take: Take | None = None
    system_prompt: str | None = None
    task: str | None = None
    license: str | None = None


@dataclass(frozen=True, slots=True)
class Checks:
    min_thinking_share: float | None = None
    max_seq_len: int | None = None
    on_over_length: str = "drop"
    on_unclosed_think: str = "drop"
    dedup: str = "exact"
    token_mismatch: str = "warn"  # warn | fail
    redact_secrets: bool = False


@dataclass(frozen=True, slots=True)
class SplitSpec:
    validation_fraction: float = 0.02
    seed: int = 0


@dataclass(frozen=True, slots=True)
class ExportSpec:
    format: str  # speculators | speculators-tokens | specforge | messages | sharegpt
    file_format: str = "jsonl"  # jsonl | jsonl.zst | parquet


@dataclass(frozen=True, slots=True)
class OutputSpec:
    dir: Path
    rows_per_shard: int = 50000
    exports: tuple[ExportSpec, ...] = ()


@dataclass(frozen=True, slots=True)
class Recipe:
    name: str
    target: Target
    sources: tuple[SourceSpec, ...]
    output: OutputSpec
    checks: Checks = field(default_factory=Checks)
    split: SplitSpec = field(default_factory=SplitSpec)
    description: str | None = None
    base_dir: Path = Path(".")  # the recipe file's directory: relative paths resolve against it
    path: Path | None = None  # the recipe file itself
    document: dict[str, Any] = field(default_factory=dict)  # the validated document, defaults filled

    @property
    def has_prompts(self) -> bool:
        return any(s.kind == "prompts" for s in self.sources)
