"""The documentation's reference pages: generated from their single sources, committed, and current."""

from __future__ import annotations

import fnmatch
import importlib
import json
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import corpus_builder
from corpus_builder.assemble import build_corpus
from corpus_builder.cli import EXIT_CODES, cli, exit_codes
from corpus_builder.errors import FLAGS, REASONS, REPAIR_FLAG
from corpus_builder.layout import LAYOUT
from corpus_builder.recipe import load_recipe
from corpus_builder.reference import PAGES, stale_pages, write_pages
from corpus_builder.reference.commands import render_commands
from corpus_builder.reference.python_api import render_python_api
from corpus_builder.reference.skip_reasons import render_skip_reasons

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
REGENERATE = "python -m corpus_builder.reference --write"


def section(page: str, heading: str) -> str:
    """The text of a page from ``heading`` to the next heading of the same level."""
    level = heading.split(" ")[0]
    start = page.index(heading + "\n")
    following = re.search(rf"^{level} ", page[start + len(heading):], flags=re.MULTILINE)
    return page[start:start + len(heading) + following.start()] if following else page[start:]


def test_every_generated_page_is_committed_and_current() -> None:
    assert stale_pages(DOCS) == [], f"stale reference pages: run {REGENERATE}"


def test_a_stale_or_missing_page_is_named_with_the_command_that_regenerates_it(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    assert {path.relative_to(docs).as_posix() for path in write_pages(docs)} == {page.path for page in PAGES}
    assert write_pages(docs) == []  # current: nothing rewritten
    edited = docs / "reference" / "cli.md"
    edited.write_text(edited.read_text().replace("--dry-run", "--dryrun"))
    (docs / "reference" / "recipe.md").unlink()
    assert stale_pages(docs) == ["reference/recipe.md", "reference/cli.md"]
    checked = subprocess.run([sys.executable, "-m", "corpus_builder.reference", "--check", "--docs", str(docs)],
                             capture_output=True, text=True, cwd=REPO)
    assert checked.returncode == 1
    assert f"{edited}: stale: run {REGENERATE}" in checked.stderr
    assert write_pages(docs) == [docs / "reference" / "recipe.md", edited]
    assert stale_pages(docs) == []


def test_the_cli_reference_has_every_command_option_default_and_exit_code() -> None:
    page = render_commands()
    assert set(EXIT_CODES) == set(cli.commands), "every command needs its exit codes in cli.EXIT_CODES"
    for name, command in cli.commands.items():
        text = section(page, f"## `corpus {name}`")
        for param in command.params:
            for option in getattr(param, "opts", []):
                if option != "--help" and param.param_type_name == "option":
                    assert f"`{option}" in text, (name, option)
            if param.param_type_name == "option" and param.show_default and param.default is not None:
                assert f"`{param.default}`" in text, (name, param.name)
        for code, meaning in exit_codes(name):
            assert f"| {code} | {meaning} |" in text, (name, code)


def test_a_commands_help_prints_the_exit_codes_the_reference_lists() -> None:
    runner = CliRunner()
    for name in cli.commands:
        shown = runner.invoke(cli, [name, "--help"], terminal_width=400)
        assert shown.exit_code == 0, shown.output
        lines = shown.output.split("Exit codes:")[1].strip().splitlines()
        assert [line.split(None, 1) for line in lines] == [[str(code), meaning] for code, meaning in exit_codes(name)]


def test_the_python_api_reference_documents_every_exported_name() -> None:
    page = render_python_api()
    headings = re.findall(r"^### `([^`]+)`$", page, flags=re.MULTILINE)
    assert sorted(headings) == sorted(corpus_builder.__all__)
    for name in corpus_builder.__all__:
        value = getattr(corpus_builder, name)
        if callable(value) and not isinstance(value, type):
            assert value.__doc__, f"{name} is exported without a docstring"
            first_line = value.__doc__.strip().splitlines()[0].strip()
            assert first_line in section(page, f"### `{name}`"), name


def test_the_layout_reference_names_every_entry_of_a_built_corpus(tmp_path: Path) -> None:
    """The serving-logs example (with an eval pack) built for real: every file it wrote is an entry of LAYOUT, and
    every entry but the journal (a replay-only corpus generates nothing) is there."""
    examples = tmp_path / "examples"
    shutil.copytree(REPO / "examples", examples)
    (tmp_path / ".cache").symlink_to(REPO / ".cache")
    result = build_corpus(load_recipe(examples / "serving_logs.yaml"), tmp_path / "corpus")
    patterns = {path: re.sub(r"\{[^}]+\}", "*", path) for path, _ in LAYOUT}
    written = [path.relative_to(result.out_dir).as_posix() for path in result.out_dir.rglob("*") if path.is_file()]
    unnamed = [path for path in written if not path.startswith(".")
               and not any(fnmatch.fnmatch(path, pattern) for pattern in patterns.values())]
    assert unnamed == []
    matched = {entry for entry, pattern in patterns.items() if any(fnmatch.fnmatch(path, pattern) for path in written)}
    assert set(patterns) - matched == {"journal/"}


def test_every_flag_the_code_sets_or_the_row_schema_allows_is_described() -> None:
    constants = set()
    for module in pkgutil.walk_packages(corpus_builder.__path__, "corpus_builder."):
        if module.name.endswith("__main__") or ".ray_data" in module.name:
            continue
        for name, value in vars(importlib.import_module(module.name)).items():
            if name.startswith("FLAG_") and isinstance(value, str):
                constants.add(value)
    assert constants, "the flags' constants moved: this test reads them by their FLAG_ names"
    assert constants - set(FLAGS) == set()
    schema = json.loads((REPO / "schemas" / "conversation.schema.json").read_text())
    allowed = set(schema["properties"]["flags"]["items"]["enum"])
    assert {flag for flag in allowed if not flag.startswith("repaired:")} - set(FLAGS) == set()
    page = render_skip_reasons()
    repairs = section(page, "## Flags").split(REPAIR_FLAG)[-1]
    for flag in (flag for flag in allowed if flag.startswith("repaired:")):
        _, rule, policy = flag.split(":")
        row = next(line for line in repairs.splitlines() if line.startswith(f"| `{rule}` |"))
        assert f"`{policy}`" in row, flag
    for reason in REASONS:
        assert f"| `{reason}` |" in page


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.path)
def test_each_page_says_what_it_is_generated_from(page: object) -> None:
    text = page.text()  # type: ignore[attr-defined]
    assert text.startswith("<!-- Generated by `python -m corpus_builder.reference --write` from ")
    assert re.search(r"^# \S", text, flags=re.MULTILINE), "a page needs a title"
