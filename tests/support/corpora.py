"""A corpus written from rows a test makes, through the build's own write stage and finish (no sources read)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from corpus_builder.assemble.local import write_rows
from corpus_builder.assemble.pipeline import BuildResult, finish_corpus
from corpus_builder.assemble.plan import TargetTokens
from corpus_builder.assemble.shards import LedgerWriter
from corpus_builder.assemble.split import Splitter
from corpus_builder.errors import Skipped
from corpus_builder.layout import LEDGER
from corpus_builder.recipe.model import Recipe
from corpus_builder.records import Conversation


def write_corpus(items: Iterable[Conversation | Skipped], recipe: Recipe, staging: Path,
                 tokens: TargetTokens) -> BuildResult:
    """``items`` split and written into ``staging`` as the recipe's corpus (its manifest, audit and ledger too)."""
    ledger = LedgerWriter(staging / LEDGER)
    auditor = tokens.auditor()
    shards = write_rows(items, staging, recipe.output.rows_per_shard, Splitter.of(recipe.split), ledger, auditor)
    return finish_corpus(recipe, staging, shards, auditor, ledger.drops)
