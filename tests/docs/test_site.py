"""The documentation site, checked like code: built strict (a broken link or anchor, a page missing from the nav, a
stale reference page fail), served over loopback and opened page by page in headless Chromium (tests/audit/browser.py):
every page renders with its title, nothing logs an error or asks another host for anything, and the search finds the
glossary's terms."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson
import pytest
import yaml

from tests.audit.browser import DevTools, chromium, require_chromium, visit

REPO = Path(__file__).resolve().parents[2]
SITE_NAME = "corpus-builder"
LOADED = "document.readyState === 'complete'"
SEARCH_RESULTS = "document.querySelectorAll('.md-search-result__item').length"
TITLES = "[document.title, document.querySelector('article h1')?.firstChild?.textContent]"  # the h1 without its ¶
RESULT_TITLES = "[...document.querySelectorAll('.md-search-result__item h1')].map(e => e.textContent)"


def require_mkdocs() -> None:
    """CI installs the docs extra (scripts/setup.sh): there its absence fails."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        message = "mkdocs and mkdocs-material are missing: pip install -e '.[docs]'"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def build_site(out: Path, config: Path = REPO / "mkdocs.yml") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(out)], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=300)


def nav_pages(nav: list[object]) -> list[tuple[str, str]]:
    """(title, Markdown file) of every page the nav lists, in order."""
    pages: list[tuple[str, str]] = []
    for entry in nav:
        assert isinstance(entry, dict), f"a nav entry without a title: {entry}"
        title, value = next(iter(entry.items()))
        pages += nav_pages(value) if isinstance(value, list) else [(title, str(value))]
    return pages


def glossary_terms() -> list[str]:
    """The bold terms of docs/index.md's glossary table."""
    index = (REPO / "docs" / "index.md").read_text(encoding="utf-8")
    glossary = index.split("## Glossary", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| \*\*([^*]+)\*\* \|", glossary, flags=re.MULTILINE)


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # the test's output is its assertions
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_mkdocs()
    out = tmp_path_factory.mktemp("site")
    built = build_site(out)
    assert built.returncode == 0, built.stdout + built.stderr
    return out


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[DevTools]:
    require_chromium()
    with chromium() as tools:
        yield tools


def test_every_page_of_the_nav_renders_with_its_title_and_no_error(served: str, browser: DevTools) -> None:
    config = yaml.load((REPO / "mkdocs.yml").read_text(encoding="utf-8"), Loader=yaml.BaseLoader)
    pages = nav_pages(config["nav"])
    assert len(pages) >= 25 and ("Home", "index.md") in pages
    for nav_title, page in pages:
        path = "" if page == "index.md" else page.removesuffix(".md") + "/"
        browser.events.clear()
        seen = visit(browser, f"{served}/{path}", LOADED)
        assert seen.console_errors == [] and seen.exceptions == [], (page, seen.console_errors, seen.exceptions)
        foreign = [request for request in seen.requests  # data: URLs are the theme's inlined icons
                   if not request.startswith((served, "data:"))]
        assert foreign == [], (page, foreign)
        title, heading = browser.evaluate(TITLES)
        assert heading and heading.strip(), f"{page}: no h1"
        assert title == (SITE_NAME if page == "index.md" else f"{nav_title} - {SITE_NAME}"), (page, title)


def test_the_search_index_holds_every_glossary_term_and_the_search_finds_it(site: Path, served: str,
                                                                          browser: DevTools) -> None:
    terms = glossary_terms()
    assert len(terms) == 10, terms
    index = orjson.loads((site / "search" / "search_index.json").read_bytes())
    for term in terms:
        pages = {doc["location"].split("#")[0] for doc in index["docs"]
                 if term.lower() in (doc["title"] + " " + doc["text"]).lower()}
        assert len(pages) >= 2, (term, pages)  # the glossary and the page that explains it
    for term in ("ledger", "journal", "eval pack"):
        browser.events.clear()
        visit(browser, f"{served}/?q={term.replace(' ', '+')}", f"{SEARCH_RESULTS} > 0")
        titles = browser.evaluate(RESULT_TITLES)
        assert any(term.split()[0] in title.lower() for title in titles), (term, titles)


def test_a_broken_link_or_a_page_left_out_of_the_nav_fails_the_strict_build(tmp_path: Path) -> None:
    require_mkdocs()
    docs = Path(shutil.copytree(REPO / "docs", tmp_path / "docs"))
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8").replace("strict: true", "strict: true\ndocs_dir: docs")
    (tmp_path / "mkdocs.yml").write_text(config)
    (tmp_path / "examples").symlink_to(REPO / "examples")  # the snippets the examples page includes
    built = build_site(tmp_path / "site", tmp_path / "mkdocs.yml")
    assert built.returncode == 0, built.stdout + built.stderr  # the copy builds as it is
    with (docs / "guides" / "build.md").open("a") as page:
        page.write("\nSee [the journal](../concepts/journal.md#no-such-section).\n")
    (docs / "orphan.md").write_text("# Orphan\n")
    built = build_site(tmp_path / "site", tmp_path / "mkdocs.yml")
    assert built.returncode != 0
    assert "does not contain an anchor '#no-such-section'" in built.stderr
    assert "orphan.md" in built.stderr
