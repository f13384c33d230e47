"""The build stage: the orchestrator, the one place that decides what runs, from a recipe to a written corpus.

``pipeline`` is the orchestrator (staging, the one renderer, the row checks of ``screen``, split, shards,
statistics, commit, exports); ``prompt_stage`` reads the prompt sources once and chooses journal-only rebuild or
preflight-then-backend; ``collect`` and ``mixture`` meet a declared mixture; ``dry_run`` is `corpus build
--dry-run` and the preflight's report; ``split`` and ``shards`` are the per-conversation split and the writers.
No other stage imports the build: the engines it drives (``screen``, ``stats``) are their own.
"""

from __future__ import annotations

from .dry_run import BuildPlan, format_plan, plan_build
from .pipeline import BuildResult, build_corpus

__all__ = ["BuildPlan", "BuildResult", "build_corpus", "format_plan", "plan_build"]
