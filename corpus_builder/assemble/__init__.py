"""The build stage: the orchestrator, the one place that decides what runs, from a recipe to a written corpus.

``plan`` is the build as one plan of stages (which run per batch, which need every row's keys) and the protocol an
engine implements to run it; ``pipeline`` is the orchestrator (staging, the one renderer, the eval pack, the
engine it picks, commit, exports); ``local`` is the engine of one machine, ``ray_data`` the Ray cluster's;
``prompt_stage`` reads the prompt sources once and chooses journal-only rebuild or preflight-then-backend;
``collect`` and ``mixture`` meet a declared mixture; ``dry_run`` is `corpus build --dry-run` and the preflight's
report; ``split`` and ``shards`` are the per-conversation split and the writers. No other stage imports the build:
the stages it runs (``screen``, ``stats``) are their own.
"""

from __future__ import annotations

from .dry_run import BuildPlan, format_plan, plan_build
from .pipeline import BuildResult, build_corpus

__all__ = ["BuildPlan", "BuildResult", "build_corpus", "format_plan", "plan_build"]
