"""scripts/mutation.py's own tables: a slip there would score a survivor as judged, or a module on no tests."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path
from types import ModuleType

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
