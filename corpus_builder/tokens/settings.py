"""What measuring a corpus in the target's tokens needs, from a recipe or from a built corpus."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..hub import fetch_tokenizer
from ..layout import AUDIT, RECIPE, Corpus
from ..recipe.model import Recipe
from ..recipe.yaml_reader import read_corpus_recipe_file
from .template import TemplateRenderer


@dataclass(frozen=True, slots=True)
class TokenSettings:
    """What measuring a corpus in the target's tokens needs, from a recipe or a built corpus."""

    tokenizer: Path
    enable_thinking: bool = True
    history_reasoning: str = "keep"
    max_seq_len: int | None = None
    mismatch_policy: str = "warn"  # warn | fail

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> TokenSettings | None:
        """The recipe's target tokenizer: its directory, or the Hub model it names (fetched into the cache)."""
        target = recipe.target
        if target.tokenizer is not None:
            directory = Path(target.tokenizer).resolve()
        elif target.tokenizer_hub is not None:
            directory = fetch_tokenizer(target.tokenizer_hub, target.revision).resolve()
        else:
            return None
        generation = recipe.target.generation
        return cls(directory, generation.enable_thinking,
                   generation.history_reasoning, recipe.checks.max_seq_len, recipe.checks.token_mismatch)

    @classmethod
    def from_corpus(cls, corpus: Corpus, tokenizer: Path | None = None) -> TokenSettings | None:
        """From the corpus's resolved recipe.yaml. Its tokenizer path is as written in the original recipe,
        so the absolute path the build recorded in audit.json is tried first; ``tokenizer`` overrides."""
        return cls.from_corpus_recipe(corpus, read_corpus_recipe(corpus), tokenizer)

    @classmethod
    def from_corpus_recipe(cls, corpus: Corpus, recipe: Any, tokenizer: Path | None = None) -> TokenSettings | None:
        """``from_corpus`` with the corpus's recipe.yaml already read (``read_corpus_recipe``), so a caller
        that needs the recipe too parses it once."""
        document = recipe or {}
        target = document.get("target") or {}
        generation = target.get("generation") or {}
        checks = document.get("checks") or {}
        if tokenizer is None:
            recorded = None
            if (corpus.root / AUDIT).exists():
                recorded = (corpus.audit().get("tokens") or {}).get("tokenizer")
            tokenizer = _find_tokenizer(corpus.root, recorded, target.get("tokenizer"))
            if tokenizer is None:
                return None
        return cls(tokenizer, bool(generation.get("enable_thinking", True)),
                   generation.get("history_reasoning", "keep"), checks.get("max_seq_len"),
                   checks.get("token_mismatch", "warn"))

    def renderer(self) -> TemplateRenderer:
        return TemplateRenderer(self.tokenizer, enable_thinking=self.enable_thinking,
                                history_reasoning=self.history_reasoning)


def read_corpus_recipe(corpus: Corpus) -> dict[str, Any] | None:
    """The corpus's recipe.yaml, read by the recipes' safe, bounded reader (``read_corpus_recipe_file``); None
    when the corpus has none."""
    path = corpus.root / RECIPE
    if not path.exists() and not path.is_symlink():
        return None
    return read_corpus_recipe_file(path)[1]


def _find_tokenizer(root: Path, recorded: str | None, written: str | None) -> Path | None:
    candidates = [Path(recorded)] if recorded else []
    if written:
        candidates += [Path(written)] if Path(written).is_absolute() else [root / written, Path.cwd() / written]
    return next((c for c in candidates if (c / "tokenizer.json").exists()), None)

