"""corpus-builder: build, audit and publish on-policy training corpora for speculative-decoding drafters.

The public API, loaded lazily so that ``import corpus_builder`` (and ``corpus --help``) stays light::

    from corpus_builder import load_recipe, plan_build, build, audit, export, publish

    recipe = load_recipe("recipes/quickstart.yaml")   # CorpusError listing every problem, located
    result = build(recipe)                            # BuildResult: out_dir, manifest, audit, problems
    report = audit(result.out_dir)                    # the statistics, recomputed from the files
    compared = audit_against(result.out_dir, "logs/*.jsonl.zst")  # divergences from serving traffic
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__

# name -> module that defines it
_API = {
    "load_recipe": "corpus_builder.recipe",
    "check_recipe": "corpus_builder.recipe",
    "Recipe": "corpus_builder.recipe",
    "build": "corpus_builder.build",
    "plan_build": "corpus_builder.build",
    "BuildResult": "corpus_builder.build",
    "BuildPlan": "corpus_builder.build",
    "audit": "corpus_builder.audit",
    "audit_against": "corpus_builder.audit",
    "export": "corpus_builder.export",
    "publish": "corpus_builder.publish",
    "Corpus": "corpus_builder.layout",
    "Conversation": "corpus_builder.records",
    "Message": "corpus_builder.records",
    "ToolCall": "corpus_builder.records",
    "CorpusError": "corpus_builder.errors",
}
__all__ = sorted(_API)

if TYPE_CHECKING:
    from .audit import audit as audit
    from .audit import audit_against as audit_against
    from .build import BuildPlan as BuildPlan
    from .build import BuildResult as BuildResult
    from .build import build as build
    from .build import plan_build as plan_build
    from .errors import CorpusError as CorpusError
    from .export import export as export
    from .layout import Corpus as Corpus
    from .publish import publish as publish
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


class _Package(ModuleType):
    """Four stages share their name with their entry function (``corpus_builder.build`` the package,
    ``corpus_builder.build(recipe)`` the call). Importing a subpackage binds it as an attribute of its
    parent, which would shadow the function; the API name wins, and the subpackage stays reachable
    through ``import corpus_builder.build.pipeline`` and the like (sys.modules)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _API and isinstance(value, ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
