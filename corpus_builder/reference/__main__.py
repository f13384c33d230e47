"""python -m corpus_builder.reference [--write | --check] [--docs DIR]"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .pages import REGENERATE, stale_pages, write_pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m corpus_builder.reference",
                                     description="Generate the documentation's reference pages from their sources.")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="write every page")
    action.add_argument("--check", action="store_true", help="exit 1 when a page is stale")
    parser.add_argument("--docs", type=Path, default=Path("docs"), help="the documentation directory (default: docs)")
    args = parser.parse_args(argv)
    if args.write:
        for path in write_pages(args.docs):
            print(f"wrote {path}")
        return 0
    stale = stale_pages(args.docs)
    for page in stale:
        print(f"{args.docs / page}: stale: run {REGENERATE}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
