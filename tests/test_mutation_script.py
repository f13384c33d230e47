"""scripts/mutation.py's own tables: a slip there would score a survivor as judged, or a module on no tests."""

from __future__ import annotations

import importlib.util
import json
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_script", REPO / "scripts" / "mutation.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_equivalent_mutant_names_the_line_it_adds_and_a_reason() -> None:
    # A misplaced quote once made an entry one string: its "line" was then its first character, found in any diff.
    script = _script()
    configured = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mutmut"]["only_mutate"]
    modules = tuple(f"{path.removesuffix('.py').replace('/', '.')}." for path in configured)
    for name, judged in script.EQUIVALENT.items():
        assert isinstance(judged, tuple) and len(judged) == 2, name
        added, reason = judged
        assert isinstance(added, str) and len(added) >= 3 and isinstance(reason, str) and len(reason) >= 10, name
        assert name.startswith(modules) and "__mutmut_" in name, name


def test_every_mutated_module_has_owning_tests_that_exist() -> None:
    script = _script()
    configured = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mutmut"]["only_mutate"]
    assert set(script.OWNING_TESTS) == set(configured)
    for tests in script.OWNING_TESTS.values():
        assert tests and all((REPO / path).exists() for path in tests), tests


def test_a_judged_mutant_that_is_not_run_counts_as_equivalent_only_while_its_diff_holds(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script()
    module = "corpus_builder/secrets.py"
    judged, other = sorted(name for name in script.EQUIVALENT if name.startswith("corpus_builder.secrets."))[:2]
    statuses = {"corpus_builder.secrets.x_a__mutmut_1": "killed", judged: "no tests", other: "survived"}
    monkeypatch.setattr(script, "_statuses", lambda _: statuses)
    monkeypatch.setattr(script, "_equivalent_holds", lambda *_: True)
    assert script._report([module])
    assert "1      3      2  100.0%" in capsys.readouterr().out
    monkeypatch.setattr(script, "_equivalent_holds", lambda name, *_: name != judged)
    assert not script._report([module])
    assert f"no tests: {judged} (listed as equivalent, but its diff changed: run it with --rejudge" \
        in capsys.readouterr().out


def test_the_suite_gives_a_judged_mutant_no_test(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import _mutmut_selection

    class Item:
        nodeid = "tests/test_secrets.py::test_x"

    class Hook:
        def pytest_deselected(self, items: list[object]) -> None:
            deselected.extend(items)

    class Config:
        hook = Hook()

    deselected: list[object] = []
    mutant = next(iter(_script().EQUIVALENT))
    monkeypatch.setenv("MUTANT_UNDER_TEST", mutant)
    monkeypatch.setenv("CORPUS_MUTATION_JUDGED", json.dumps([mutant]))
    items: list[Any] = [Item()]
    _mutmut_selection(Config(), items)  # type: ignore[arg-type]
    assert items == [] and len(deselected) == 1
    monkeypatch.setenv("CORPUS_MUTATION_JUDGED", "[]")
    monkeypatch.setenv("CORPUS_MUTATION_OWNERS", json.dumps({"corpus_builder.secrets": ["tests/test_secrets.py"]}))
    items = [Item()]
    _mutmut_selection(Config(), items)  # type: ignore[arg-type]
    assert len(items) == 1
