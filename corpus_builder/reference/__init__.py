"""The documentation site's reference pages, each generated from its single source and tested to be current.

    python -m corpus_builder.reference --write   # regenerate docs/reference/*.md
    python -m corpus_builder.reference --check   # exit 1, naming each stale page, when one is
"""

from .pages import PAGES, Page, stale_pages, write_pages

__all__ = ["PAGES", "Page", "stale_pages", "write_pages"]
