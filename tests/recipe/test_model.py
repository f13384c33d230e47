"""The recipe's closed choices are Literals of the typed model, and each is the schema's enum at its place, with
the same default: the schema says what a recipe may hold, the types let mypy catch code that drifts from it."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any, Literal, get_args, get_origin

import click
import pytest

from corpus_builder.cli import cli
from corpus_builder.recipe import model
from corpus_builder.recipe.schema import SCHEMA_PATH
from corpus_builder.records import RepairRules
from corpus_builder.trainer_formats import BENCH_FORMAT, BENCH_TURNS, EXPORT_FORMATS, FILE_FORMATS

SOURCE = ("$defs", "source", "properties")
PLACES: dict[tuple[type, str], tuple[str, ...]] = {
    (model.GenerationSettings, "history_reasoning"): ("properties", "target", "properties", "generation",
                                                      "properties", "history_reasoning"),
    (model.GenerationSettings, "on_length"): ("properties", "target", "properties", "generation", "properties",
                                              "on_length"),
    (model.Target, "backend"): ("properties", "target", "properties", "backend"),
    (model.Recipe, "engine"): ("properties", "engine"),
    (model.Mapping, "style"): (*SOURCE, "mapping", "properties", "style"),
    (model.SourceSpec, "kind"): (*SOURCE, "kind"),
    (model.SourceSpec, "tool_results"): (*SOURCE, "tool_results"),
    (model.Checks, "on_over_length"): ("properties", "checks", "properties", "on_over_length"),
    (model.Checks, "on_unclosed_think"): ("properties", "checks", "properties", "on_unclosed_think"),
    (model.Checks, "dedup"): ("properties", "checks", "properties", "dedup"),
    (model.Checks, "token_mismatch"): ("properties", "checks", "properties", "token_mismatch"),
    (model.ExportSpec, "format"): ("$defs", "export", "properties", "format"),  # output's and publish's exports
    (model.ExportSpec, "file_format"): ("$defs", "export", "properties", "file_format"),
    **{(RepairRules, rule.name): (*SOURCE, "repair", "properties", rule.name)
       for rule in dataclasses.fields(RepairRules)},
}


def literal_fields() -> list[tuple[type, str, tuple[str, ...]]]:
    """Every field of the recipe's dataclasses whose type is a Literal (alone or with None), and its choices."""
    found = []
    classes = [value for value in vars(model).values() if dataclasses.is_dataclass(value)] + [RepairRules]
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            hint = hints[field.name]
            options = [hint] if get_origin(hint) is Literal else [arg for arg in get_args(hint)
                                                                  if get_origin(arg) is Literal]
            for option in options:
                found.append((cls, field.name, get_args(option)))
    return found


def schema_at(place: tuple[str, ...]) -> dict[str, Any]:
    node: Any = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    for key in place:
        node = node[key]
    return typing.cast(dict[str, Any], node)


def test_every_closed_choice_of_the_model_has_its_place_in_the_schema() -> None:
    assert {(cls, name) for cls, name, _ in literal_fields()} == set(PLACES)


@pytest.mark.parametrize(("cls", "name", "choices"), literal_fields(),
                         ids=lambda value: value.__name__ if isinstance(value, type) else None)
def test_a_literal_is_the_schemas_enum_with_its_default(cls: type, name: str, choices: tuple[str, ...]) -> None:
    node = schema_at(PLACES[cls, name])
    assert list(choices) == node["enum"]
    default = {field.name: field.default for field in dataclasses.fields(cls)}[name]
    if "default" in node:  # the schema fills it in the document; the model's default must agree
        assert node["default"] == default


def test_the_export_commands_choices_are_the_trainer_formats_and_the_bench_format() -> None:
    export = cli.commands["export"]
    assert isinstance(export, click.Command)
    choices = {param.name: param.type.choices for param in export.params if isinstance(param.type, click.Choice)}
    assert tuple(choices["fmt"]) == (*EXPORT_FORMATS, BENCH_FORMAT) and tuple(choices["file_format"]) == FILE_FORMATS
    assert tuple(choices["turns"]) == BENCH_TURNS
