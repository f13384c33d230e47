"""The acceptance eval: a pack replayed against vLLM servers that serve the target with a speculator.

``api`` holds the entry points (``evaluate``, ``compare``, ``profiles_from_run``); ``pack`` reads a pack,
``replay`` sends it and reads each server's counters (``metrics``), ``figures`` and ``report`` turn the windows
into figures, ratios and tables, ``run`` is the saved run as a typed record, ``loops`` measures an answer's
repetition, ``profile`` writes and reads speculation profiles, ``html`` the report's section and ``bench`` the
pack as vLLM's own benchmark datasets.
"""

from __future__ import annotations

from .api import (
    EvalResult,
    PackLosses,
    acceptance_sections,
    compare,
    corpus_pack_sha256,
    evaluate,
    profiles_from_run,
)
from .bench import BenchExport, export_bench
from .pack import Pack, read_pack
from .profile import ProfileFile, read_profile, speculation_profile
from .replay import MODES, EvalIncomplete, EvalSettings
from .report import Comparison, RunNotSaved, format_comparison, format_run, load_run
from .run import RUN_FORMAT, Run

__all__ = ["MODES", "RUN_FORMAT", "BenchExport", "Comparison", "EvalIncomplete", "EvalResult", "EvalSettings", "Pack",
           "PackLosses", "ProfileFile", "Run", "RunNotSaved",
           "acceptance_sections", "compare", "corpus_pack_sha256", "evaluate", "export_bench", "format_comparison",
           "format_run", "load_run", "profiles_from_run", "read_pack", "read_profile", "speculation_profile"]
