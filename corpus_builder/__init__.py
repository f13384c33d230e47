"""corpus-builder: build, audit and publish on-policy training corpora for speculative-decoding drafters.

The public API, loaded lazily so that ``import corpus_builder`` (and ``corpus --help``) stays light::

    from corpus_builder import load_recipe, plan_build, build_corpus, audit_corpus, check_corpus, export_corpus, ...

    recipe = load_recipe("recipes/quickstart.yaml")   # CorpusError listing every problem, located
    result = build_corpus(recipe)                     # BuildResult: out_dir, manifest, audit, problems
    report = audit_corpus(result.out_dir)             # the statistics, recomputed from the files
    compared = audit_against(result.out_dir, "logs/*.jsonl.zst")  # divergences from serving traffic
    outcome = check_corpus(result.out_dir, against="logs/*.jsonl.zst", max_divergence=0.1)  # `corpus audit`
    vocab = draft_vocab(result.out_dir, "token_freq.npy", size=32000)  # `corpus vocab`
    measured = evaluate(result.out_dir, ["http://127.0.0.1:8000/v1"], temperature=0)  # `corpus eval`: EvalResult
    compared = compare(run_a, run_b)                  # `corpus eval --compare`: Comparison, B / A with intervals
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__

# name -> module that defines it
_API = {
    "load_recipe": "corpus_builder.recipe",
    "check_recipe": "corpus_builder.recipe",
    "Recipe": "corpus_builder.recipe",
    "build_corpus": "corpus_builder.assemble",
    "plan_build": "corpus_builder.assemble",
    "BuildResult": "corpus_builder.assemble",
    "BuildPlan": "corpus_builder.assemble",
    "audit_corpus": "corpus_builder.audit",
    "audit_against": "corpus_builder.audit",
    "check_corpus": "corpus_builder.audit",
    "AuditOutcome": "corpus_builder.audit",
    "AuditOptions": "corpus_builder.audit",
    "export_corpus": "corpus_builder.export",
    "draft_vocab": "corpus_builder.export",
    "VocabReport": "corpus_builder.export",
    "publish_corpus": "corpus_builder.publish",
    "evaluate": "corpus_builder.eval",
    "compare": "corpus_builder.eval",
    "EvalResult": "corpus_builder.eval",
    "Comparison": "corpus_builder.eval",
    "Corpus": "corpus_builder.layout",
    "Conversation": "corpus_builder.records",
    "Message": "corpus_builder.records",
    "ToolCall": "corpus_builder.records",
    "CorpusError": "corpus_builder.errors",
}
__all__ = sorted(_API)

if TYPE_CHECKING:
    from .assemble import BuildPlan as BuildPlan
    from .assemble import BuildResult as BuildResult
    from .assemble import build_corpus as build_corpus
    from .assemble import plan_build as plan_build
    from .audit import AuditOptions as AuditOptions
    from .audit import AuditOutcome as AuditOutcome
    from .audit import audit_against as audit_against
    from .audit import audit_corpus as audit_corpus
    from .audit import check_corpus as check_corpus
    from .errors import CorpusError as CorpusError
    from .eval import Comparison as Comparison
    from .eval import EvalResult as EvalResult
    from .eval import compare as compare
    from .eval import evaluate as evaluate
    from .export import VocabReport as VocabReport
    from .export import draft_vocab as draft_vocab
    from .export import export_corpus as export_corpus
    from .layout import Corpus as Corpus
    from .publish import publish_corpus as publish_corpus
    from .recipe import Recipe as Recipe
    from .recipe import check_recipe as check_recipe
    from .recipe import load_recipe as load_recipe
    from .records import Conversation as Conversation
    from .records import Message as Message
    from .records import ToolCall as ToolCall


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'corpus_builder' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
