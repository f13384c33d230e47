"""``corpus publish``: gate a built corpus, render its card and upload it to a Hub in one commit.

    publish_corpus(corpus_dir, "org/name")     private dataset repository, one commit, verified read-back
    publish_corpus(..., dry_run=True)          what would be uploaded and the card; no network at all
    publish_corpus(..., exports=[ExportSpec("speculators-tokens")])
                                               also the trainer's files, at exports/{format}/{split}.{ext}
    publish_corpus(..., profiles=[Path("speculation_profile.json")])
                                               also a head's speculation profile, named in the card
"""

from __future__ import annotations

from ..recipe.model import ExportSpec
from .card import render_card
from .commit import PublishReport, prepare_upload, publish_corpus
from .exports import parse_export
from .gate import CorpusDocuments, GateFailed, GateReport, check_corpus, require_gate

__all__ = [
    "CorpusDocuments", "ExportSpec", "GateFailed", "GateReport", "PublishReport", "check_corpus", "parse_export",
    "prepare_upload", "publish_corpus", "render_card", "require_gate",
]
