"""The build stage: the one place that decides what runs, from a recipe to a written corpus.

``pipeline`` is the orchestrator (staging, the one renderer, checks, split, shards, audit, commit,
exports); ``prompt_stage`` reads the prompt sources once and chooses journal-only rebuild or
preflight-then-backend; ``dry_run`` is `corpus build --dry-run` and the preflight's report; ``checks``,
``split`` and ``shards`` are the row checks, the per-conversation split and the writers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the module that defines it, imported on first use: a stage that needs one leaf of the build
# (the publish gate's corpus_problems, the audit's stats) does not load the orchestrator and what it pulls in.
_EXPORTS = {"BuildPlan": "dry_run", "format_plan": "dry_run", "plan_build": "dry_run",
            "BuildResult": "pipeline", "build_corpus": "pipeline"}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from .dry_run import BuildPlan as BuildPlan
    from .dry_run import format_plan as format_plan
    from .dry_run import plan_build as plan_build
    from .pipeline import BuildResult as BuildResult
    from .pipeline import build_corpus as build_corpus


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
