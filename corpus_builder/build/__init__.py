"""The build stage: the one place that decides what runs, from a recipe to a written corpus.

``pipeline`` is the orchestrator (staging, the one renderer, checks, split, shards, audit, commit,
exports); ``prompt_stage`` reads the prompt sources once and chooses journal-only rebuild or
preflight-then-backend; ``dry_run`` is `corpus build --dry-run` and the preflight's report; ``checks``,
``split`` and ``shards`` are the row checks, the per-conversation split and the writers.
"""

from .dry_run import BuildPlan, format_plan, plan_build
from .pipeline import BuildResult, build

__all__ = ["BuildPlan", "BuildResult", "build", "format_plan", "plan_build"]
