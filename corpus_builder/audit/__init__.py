"""The audit stage: statistics of what was written (a built corpus), or of a raw source file or dump.

It reads files, never the pipeline's memory, with the same statistics the build computes while writing
(``stats``): ``run`` audits a corpus, a raw file or a stream of rows and is `corpus audit` (``check_corpus``);
``files`` opens a built corpus (``CorpusFiles``: recipe, drops and renderer read once for the audit and the
comparison); ``report`` is the table people read. ``audit_against`` compares a built corpus with serving traffic
(``traffic``, on the polars engine of ``frames``/``inputs``/``profile`` and the token measures of ``token_pass``);
``write_html_report`` writes the self-contained report (``html``). The comparison's modules, polars and plotly
load only when one of those is called.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ..stats.corpus import corpus_problems
from .files import CorpusFiles, opened_corpus
from .options import AuditOptions
from .report import format_report
from .run import (
    AuditOutcome,
    audit_conversations,
    audit_corpus,
    audit_corpus_files,
    audit_inputs,
    audited,
    check_corpus,
)

__all__ = ["AuditOptions", "AuditOutcome", "CorpusFiles", "audit_against", "audit_conversations", "audit_corpus",
           "audit_corpus_files", "audit_inputs", "audited", "check_corpus", "corpus_problems", "describe_corpus",
           "divergence_problems", "format_comparison", "format_report", "opened_corpus", "write_html_report"]

# The comparison's names, loaded on first use: they import polars (and plotly, for the page).
_TRAFFIC_API = {"audit_against": "traffic", "describe_corpus": "traffic",
                "divergence_problems": "traffic", "format_comparison": "traffic", "write_html_report": "html"}

if TYPE_CHECKING:
    from .html import write_html_report
    from .traffic import audit_against, describe_corpus, divergence_problems, format_comparison


def __getattr__(name: str) -> Any:
    module = _TRAFFIC_API.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
