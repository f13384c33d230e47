"""Data flows one way: no module imports from a stage later in the flow, and there is no import cycle.

The layer order is written once, here; every import of every module of corpus_builder (module level and
inside functions, absolute and relative) is checked against it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "corpus_builder"

# Lowest first. A module may import from its own layer and from the layers before it. The leaves are shared
# by every stage; the CLI and the package's lazy front door sit on top. The flow is recipe -> sources ->
# generate -> assemble (the build) -> audit / export -> eval -> publish; export (trainer formats and vocab, which
# read a written corpus) sits below assemble because a build writes its recipe's exports as its last step.
LAYERS: list[tuple[str, ...]] = [
    ("_version", "trainer_formats", "draws"),  # __version__ (pyproject.toml reads it too); the export format names
    ("errors",),
    ("records",),
    ("collector", "progress", "ray_extra", "ray_cluster"),  # the optional Ray engine: imported by name when asked for
    ("rows",),
    ("layout",),
    ("secrets",),
    ("outputs",),
    ("report",),  # the HTML kit the audit's and the eval's pages share
    ("hub",),
    ("recipe",),
    ("sources",),
    ("tokens",),
    ("stats",),
    ("screen",),
    ("generate",),
    ("export",),
    ("assemble",),
    ("audit",),
    ("eval",),
    ("publish",),
    ("testing",),
    ("cli", "__main__", "__init__", "reference"),  # reference: the docs pages generated from the CLI and the API
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def unit(module: str) -> str:
    """The layer of a module inside the package ("assemble.split" -> "assemble"; the package itself "__init__")."""
    return module.split(".", 1)[0] if module else "__init__"


def module_name(path: Path) -> str:
    """corpus_builder/screen/checks.py -> "screen.checks"; corpus_builder/assemble/__init__.py -> "assemble"."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def targets(name: str, is_package: bool, nodes: Iterable[ast.AST]) -> list[tuple[int, str]]:
    """(line, module inside corpus_builder, without the package prefix) of every import among ``nodes``."""
    package = name.split(".") if is_package else name.split(".")[:-1]
    package = [part for part in package if part]
    found = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            if node.module:
                found.append((node.lineno, ".".join([*base, node.module])))
            else:  # from . import name: each name may be a module
                found += [(node.lineno, ".".join([*base, alias.name])) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "corpus_builder":
            found.append((node.lineno, node.module.removeprefix("corpus_builder").lstrip(".")))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.removeprefix("corpus_builder").lstrip("."))
                      for alias in node.names if alias.name.split(".")[0] == "corpus_builder"]
    return found


def upward(name: str, is_package: bool, tree: ast.AST) -> list[str]:
    mine = unit(name)
    return [f"line {line}: imports corpus_builder.{target} ({unit(target)} comes after {mine})"
            for line, target in targets(name, is_package, ast.walk(tree))
            if RANK.get(unit(target), -1) > RANK[mine]]


def root_imports(name: str, is_package: bool, tree: ast.AST) -> list[str]:
    """Imports of a name from the package root (``from .. import __version__``, ``from corpus_builder import X``,
    ``import corpus_builder``): the root is the lazy front door over every stage, so a module that imports from
    it goes through the facade (and, from a stage, round a cycle) instead of to the module defining the name."""
    units = {unit(module_name(path)) for path in modules()}
    return [f"line {line}: imports {f'{target} from ' if target else ''}the package root corpus_builder"
            for line, target in targets(name, is_package, ast.walk(tree))
            if not target or ("." not in target and target not in units)]


def test_every_module_is_in_a_layer() -> None:
    units = {unit(module_name(path)) for path in modules()}
    assert units <= set(RANK), f"add these to LAYERS: {sorted(units - set(RANK))}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_only_run_down_the_flow(path: Path) -> None:
    problems = upward(module_name(path), path.name == "__init__.py", ast.parse(path.read_text(encoding="utf-8")))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", [path for path in modules() if path != PACKAGE / "__init__.py"],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_the_package_root(path: Path) -> None:
    problems = root_imports(module_name(path), path.name == "__init__.py", ast.parse(path.read_text(encoding="utf-8")))
    assert not problems, "\n".join(problems)


def test_an_import_of_the_package_root_is_caught() -> None:
    """The check itself: a name from the root, relative or absolute, or the root itself is reported; a module
    of the package (the version's leaf among them) is not."""
    assert root_imports("build.pipeline", False, ast.parse("from .. import __version__\n")) == [
        "line 1: imports __version__ from the package root corpus_builder"]
    assert root_imports("cli", False, ast.parse("def f():\n    from corpus_builder import build_corpus\n")) == [
        "line 2: imports the package root corpus_builder"]
    assert root_imports("audit", True, ast.parse("import corpus_builder\n")) != []
    fine = "from . import errors\nfrom ._version import __version__\nimport corpus_builder.assemble.pipeline as p\n"
    assert root_imports("cli", False, ast.parse(fine)) == []
    relative = "from . import pipeline\nfrom .pipeline import BuildResult\n"
    assert root_imports("assemble", True, ast.parse(relative)) == []


def test_an_upward_import_is_caught() -> None:
    """The check itself: a leaf importing a stage (in a function, relatively) is reported; a stage importing
    a leaf or an earlier stage is not."""
    leaf = ast.parse("def f():\n    from .assemble import build_corpus\n")
    assert upward("records", False, leaf) == ["line 2: imports corpus_builder.assemble (assemble comes after records)"]
    stage = ast.parse("from ..records import Conversation\nfrom ..recipe.model import Recipe\n"
                      "import corpus_builder.rows\n")
    assert upward("assemble.split", False, stage) == []
    assert upward("recipe", True, ast.parse("from corpus_builder.publish import publish_corpus\n")) != []


def loaded(name: str, target: str, known: Iterable[str]) -> set[str]:
    """The modules of the package an import of ``target`` from module ``name`` loads: the module itself (or, for
    ``from pkg import a_name``, the package, even ``name``'s own) and every package ``__init__`` on the way that is
    not already running because ``name`` lives inside it."""
    known = set(known)
    while target and target not in known:  # "audit.check_corpus" is a name from audit/__init__, not a module
        target = target.rpartition(".")[0]
    parts = target.split(".") if target else []
    mine = name.split(".")
    running = {".".join(mine[:depth]) for depth in range(len(mine) + 1)}
    chain = {".".join(parts[:depth]) for depth in range(1, len(parts) + 1)}
    return {module for module in chain if module in known and module not in running} | ({target} - {name, ""})


def import_graph(sources: dict[str, tuple[bool, str]]) -> dict[str, set[str]]:
    """module -> the modules its imports load; ``sources`` maps a module to (is a package, its text)."""
    return {name: {module for _, target in targets(name, is_package, ast.walk(ast.parse(text)))
                   for module in loaded(name, target, sources)}
            for name, (is_package, text) in sources.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for following in sorted(graph[node]):
            if state.get(following) == 1:
                return [*stack[stack.index(following):], following]
            if following not in state and (cycle := visit(following)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def package_sources() -> dict[str, tuple[bool, str]]:
    return {module_name(path): (path.name == "__init__.py", path.read_text(encoding="utf-8")) for path in modules()}


def test_no_import_cycle_between_modules() -> None:
    """Over every import, inside functions and under ``TYPE_CHECKING`` too: an import deferred to dodge a cycle
    (to a call, or to the type checker) is still a cycle of the design; a package's ``__init__`` counts as the
    module it is."""
    cycle = find_cycle(import_graph(package_sources()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_cycle_through_a_package_init_or_a_function_is_caught() -> None:
    """The check itself: a submodule taking a name from its own package's ``__init__`` that imports it back, and a
    cycle closed by an import inside a function or only for type checking, are cycles; a package re-exporting its
    submodules and a sibling import are not."""
    through_init = {"audit": (True, "from .traffic import compare\n"),
                    "audit.traffic": (False, "def f():\n    from . import audit_corpus\n")}
    assert find_cycle(import_graph(through_init)) == ["audit", "audit.traffic", "audit"]
    in_function = {"stats": (True, ""), "stats.a": (False, "from .b import x\n"),
                   "stats.b": (False, "def f():\n    from .a import y\n")}
    assert find_cycle(import_graph(in_function)) == ["stats.a", "stats.b", "stats.a"]
    for_types = {"eval.run": (False, "from .figures import Window\n"),
                 "eval.figures": (False, "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                         "    from .run import JsonObject\n")}
    assert find_cycle(import_graph(for_types)) == ["eval.figures", "eval.run", "eval.figures"]
    fine = {"eval": (True, "from .run import Run\nfrom .report import save\n"),
            "eval.run": (False, "from ..records import X\n"), "records": (False, ""),
            "eval.report": (False, "from .run import Run\n")}
    assert find_cycle(import_graph(fine)) is None
