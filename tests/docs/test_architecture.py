"""docs/architecture.md's "to add a feature, touch" table, held to the code: each row names one or two places,
every place exists and defines the name given, and each registry holds what its row says it holds."""

from __future__ import annotations

import ast
import inspect
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "corpus_builder"
HEADING = "## To add a feature, touch"
# A place: a file under corpus_builder/ (or schemas/), and the name it defines, if one is given.
PLACE = re.compile(r"`((?:\w+/)*[\w.]+\.(?:py|json))`(?: `([\w$]+)`)?")
# Written by another change at the same time; until it lands, its row is checked no further than its file.
def table() -> dict[str, str]:
    """Each row's "to add" and its "touch" cell."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text[text.index(HEADING) + len(HEADING):]
    following = re.search(r"^## ", section, re.MULTILINE)
    section = section[:following.start()] if following is not None else section
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| ") and not line.startswith("| to")]
    return {cells[0].removeprefix("| "): cells[1] for cells in rows}


def places(cell: str) -> list[tuple[str, str | None]]:
    return [(path, name or None) for path, name in PLACE.findall(cell)]


def defined(path: Path, name: str) -> bool:
    """``name`` is bound at the module level of ``path``: a class, a function or an assignment."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef) and node.name == name:
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        if any(isinstance(target, ast.Name) and target.id == name for target in targets):
            return True
    return False


def source_formats() -> None:
    from corpus_builder.recipe.schema import recipe_schema
    from corpus_builder.sources import formats as module

    written = [value for value in vars(module).values() if inspect.isclass(value) and issubclass(value, module.Format)
               and not inspect.isabstract(value) and value.__module__ == module.__name__]
    assert written and {type(fmt) for fmt in module.REGISTRY.values()} == set(written), "a format outside REGISTRY"
    # a recipe names a format by the registry's names, checked against it: no second list of them in the schema
    assert "enum" not in recipe_schema()["$defs"]["source"]["properties"]["format"]


def export_formats() -> None:
    from corpus_builder.export.formats import TRAINER_FORMATS, TrainerFormat
    from corpus_builder.trainer_formats import EXPORT_FORMATS

    assert tuple(TRAINER_FORMATS) == EXPORT_FORMATS
    fields = {field.name for field in TrainerFormat.__dataclass_fields__.values()}
    assert {"name", "convert", "schema", "card_note", "train_commands"} <= fields


def row_checks() -> None:
    from corpus_builder.errors import REASONS
    from corpus_builder.screen import row_checks as module

    written = [value for value in vars(module).values() if inspect.isclass(value) and issubclass(value, module.RowCheck)
               and not inspect.isabstract(value) and value.__module__ == module.__name__]
    assert written and set(written) == set(module.ROW_CHECKS), "a row check outside ROW_CHECKS is never applied"
    assert all(check.reason in REASONS for check in module.ROW_CHECKS)


def commands() -> None:
    from corpus_builder.cli import EXIT_CODES, cli

    assert set(EXIT_CODES) == set(cli.commands)


# What each registry must hold, by the row that names it.
REGISTRIES: dict[str, Callable[[], None]] = {
    "a source format": source_formats,
    "an export format": export_formats,
    "a row check": row_checks,
    "a CLI command": commands,
}


def test_every_row_names_one_or_two_places_and_every_registry_has_its_row() -> None:
    rows = table()
    assert set(REGISTRIES) <= set(rows)
    for added, cell in rows.items():
        assert 1 <= len(places(cell)) <= 2, (added, places(cell))


@pytest.mark.parametrize(("added", "path", "name"), [(added, path, name) for added, cell in table().items()
                                                     for path, name in places(cell)])
def test_every_place_exists_and_defines_its_name(added: str, path: str, name: str | None) -> None:
    where = PACKAGE / path
    assert where.is_file(), f"{added}: {path} does not exist"
    if path.endswith(".json"):
        json.loads(where.read_text(encoding="utf-8"))
    elif name is not None:
        assert defined(where, name), f"{added}: {path} defines no {name}"


@pytest.mark.parametrize("added", REGISTRIES)
def test_each_registry_holds_what_its_row_says(added: str) -> None:
    REGISTRIES[added]()


def test_the_check_itself_finds_places_and_definitions(tmp_path: Path) -> None:
    assert places("`export/formats.py` `TRAINER_FORMATS` (one record); `trainer_formats.py` `ExportFormat`") == [
        ("export/formats.py", "TRAINER_FORMATS"), ("trainer_formats.py", "ExportFormat")]
    assert places("`schemas/recipe.schema.json` (its place)") == [("schemas/recipe.schema.json", None)]
    module = tmp_path / "m.py"
    module.write_text("A: int = 1\nB = 2\nclass C: ...\ndef d() -> None:\n    E = 3\n")
    assert [defined(module, name) for name in "ABCdE"] == [True, True, True, True, False]


def test_the_train_guide_has_a_row_for_every_registered_export_format() -> None:
    """A format added to the registry is named in the guide that says which export to use."""
    from corpus_builder.export.formats import TRAINER_FORMATS

    guide = (REPO / "docs" / "guides" / "train.md").read_text(encoding="utf-8")
    section = guide[guide.index("## Which export"):]
    section = section[:section.index("\n## ", 1)] if "\n## " in section[1:] else section
    listed = [line.split(" | ")[0].removeprefix("| ").strip("`") for line in section.splitlines()
              if line.startswith("| `")]
    assert sorted(listed) == sorted(TRAINER_FORMATS)
