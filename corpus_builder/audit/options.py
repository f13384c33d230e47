"""How a comparison with traffic is measured (``AuditOptions``): a leaf of the audit stage, importable without
polars, so that a plain audit and the CLI name it without loading the comparison's engine."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from ..errors import CorpusError
from ..ray_extra import ray_engine

DEFAULT_TOKEN_SAMPLE: Final = 100_000
DEFAULT_MAX_SKIPPED_SHARE: Final = 0.05
DEFAULT_DRAFT_VOCAB: Final = 32_000
DEFAULT_SPAN_TOKENS: Final = 8  # a response stretch of 8+ tokens copied from the context: prompt lookup drafts it whole


@dataclass(frozen=True)
class AuditOptions:
    tokenizer: Path | None = None  # the target's tokenizer directory (default: the corpus recipe's)
    token_sample: int = DEFAULT_TOKEN_SAMPLE  # conversations per side measured in tokens (0: all)
    span_tokens: int = DEFAULT_SPAN_TOKENS
    draft_vocab_size: int = DEFAULT_DRAFT_VOCAB
    seed: int = 0
    endpoint: str | None = None  # Hub endpoint for an hf:// corpus
    # Past this share of skipped traffic rows the figures describe only the readable part: said everywhere, and
    # a failure of --max-divergence unless allowed.
    max_skipped_share: float = DEFAULT_MAX_SKIPPED_SHARE
    # Traffic served by another model than the corpus's target is refused: a draft is judged against its own
    # target's traffic. True compares it all the same.
    allow_other_models: bool = False
    # What reads the traffic: this machine, or a Ray cluster through Ray Data (``ray_data``): the same figures.
    engine: Literal["local", "ray"] = "local"
    address: str | None = None  # with the Ray engine: the cluster to join (None: RAY_ADDRESS, else one started here)

    def __post_init__(self) -> None:
        if not 0 <= self.max_skipped_share <= 1:  # nan too
            raise CorpusError(f"max_skipped_share must be a share from 0 to 1, not {self.max_skipped_share!r}")
        if self.address is not None and self.engine != "ray":
            raise CorpusError("--address names a Ray cluster: it needs --engine ray")


def check_ray_engine() -> None:
    """Refuse, before anything is read, a Ray audit without Ray installed."""
    ray_engine("corpus_builder.audit.ray_data", "audit")
