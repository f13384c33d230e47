"""A built corpus as the audit reads it: opened from its directory or downloaded from the Hub (``opened_corpus``), and
what both its statistics and its comparison with traffic read from it, each read once (``CorpusFiles``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path

from ..errors import DropCounts
from ..layout import LEDGER, Corpus
from ..tokens import TemplateRenderer, TokenSettings
from ..tokens.settings import read_corpus_recipe

HUB_PREFIX = "hf://"


class CorpusFiles:
    """A built corpus and what both its audit and its comparison with traffic read from it, each read once
    and only when first needed: the parsed recipe.yaml, the drops, the target's token settings and renderer."""

    def __init__(self, corpus: Corpus) -> None:
        self.corpus = corpus

    @cached_property
    def recipe(self) -> object:
        """recipe.yaml as parsed, whatever its shape (None: the corpus has none)."""
        return read_corpus_recipe(self.corpus)

    @cached_property
    def drops(self) -> DropCounts:
        """Drops by reason and source: the ledger's, or audit.json's where a published copy has no ledger."""
        return self.corpus.ledger_drops()

    @property
    def has_ledger(self) -> bool:
        return (self.corpus.root / LEDGER).exists()

    @cached_property
    def token_settings(self) -> TokenSettings | None:
        """The recipe's target tokenizer and template options, or None when its tokenizer is not at hand."""
        return TokenSettings.from_corpus_recipe(self.corpus, self.recipe)

    @cached_property
    def renderer(self) -> TemplateRenderer | None:
        """The renderer of ``token_settings``: one tokenizer load and one twin check for every pass."""
        return self.token_settings.renderer() if self.token_settings is not None else None

    def renderer_for(self, tokenizer: Path | None) -> TemplateRenderer | None:
        """The recipe's renderer, or one of ``tokenizer`` (a user's override) with the recipe's options."""
        if tokenizer is None:
            return self.renderer
        settings = TokenSettings.from_corpus_recipe(self.corpus, self.recipe, tokenizer)
        return settings.renderer() if settings is not None else None


def is_hub_path(where: str | Path) -> bool:
    return str(where).startswith(HUB_PREFIX)


@contextmanager
def opened_corpus(where: str | Path, endpoint: str | None = None) -> Iterator[Corpus]:
    """A built corpus directory, or ``hf://datasets/ORG/NAME`` downloaded for the duration."""
    if is_hub_path(where):
        from ..hub import download_corpus

        with download_corpus(str(where), endpoint=endpoint) as local:
            yield Corpus.open(local)
        return
    yield Corpus.open(Path(where))
