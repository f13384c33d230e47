"""The public Python API: what ``corpus_builder`` exports, that it stays lazy, and the documentation's example."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import corpus_builder

REPO = Path(__file__).resolve().parents[1]
EXPORTED = ["AuditOptions", "AuditOutcome", "BuildPlan", "BuildResult", "Comparison", "Conversation", "Corpus",
            "CorpusError", "EvalResult", "Message", "Recipe", "ToolCall", "VocabReport", "audit_against",
            "audit_corpus", "build_corpus", "check_corpus", "check_recipe", "compare", "draft_vocab", "evaluate",
            "export_corpus", "load_recipe", "plan_build", "publish_corpus"]
STAGES = ["audit", "assemble", "eval", "export", "publish"]

# Imports each module named on the command line in the `import a.b.c as m` form, each in a namespace of its own,
# and prints those that fail or bind anything but the module itself.
IMPORT_AS = """
import json, sys
failures = {}
for name in sys.argv[1:]:
    namespace = {}
    try:
        exec(f"import {name} as m", namespace)
    except Exception as error:
        failures[name] = f"{type(error).__name__}: {error}"
    else:
        if namespace["m"] is not sys.modules[name]:
            failures[name] = f"bound {namespace['m']!r}"
print(json.dumps(failures))
"""


def package_modules() -> list[str]:
    """Every module of the package (``__main__`` runs the CLI when imported)."""
    return sorted(module.name for module in pkgutil.walk_packages(corpus_builder.__path__, "corpus_builder.")
                  if not module.name.endswith("__main__"))


def test_all_is_the_public_api() -> None:
    assert corpus_builder.__all__ == EXPORTED


def test_every_module_imports_as_a_b_c_as_m_in_a_fresh_interpreter() -> None:
    """`import corpus_builder.assemble.pipeline as m` binds the module: no name on the way is a function."""
    modules = package_modules()
    assert "corpus_builder.assemble.pipeline" in modules
    ran = subprocess.run([sys.executable, "-c", IMPORT_AS, *modules], capture_output=True, text=True, cwd=REPO)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == {}


def test_every_module_imports_by_importlib_and_as_m_here() -> None:
    for name in package_modules():
        module = importlib.import_module(name)
        namespace: dict[str, object] = {}
        exec(f"import {name} as m", namespace)
        assert namespace["m"] is module is sys.modules[name], name


def test_a_stage_module_is_patched_by_its_dotted_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from corpus_builder.assemble import pipeline

    monkeypatch.setattr("corpus_builder.assemble.pipeline.STAGING_PREFIX", ".patched-")
    assert pipeline.STAGING_PREFIX == ".patched-"


def test_every_name_resolves_and_no_package_exports_a_name_of_its_own_modules() -> None:
    """After every module is imported, each exported name is still what it names, the stages are the
    subpackages (no function shadows them), and no package's ``__all__`` holds the name of one of its modules."""
    for name in package_modules():
        importlib.import_module(name)
    for name in EXPORTED:
        value = getattr(corpus_builder, name)
        assert callable(value), name
        assert value.__module__.startswith("corpus_builder."), name
    assert corpus_builder.build_corpus.__module__ == "corpus_builder.assemble.pipeline"
    assert corpus_builder.audit_corpus.__module__ == "corpus_builder.audit.run"
    assert corpus_builder.export_corpus.__module__ == "corpus_builder.export.write"
    assert corpus_builder.publish_corpus.__module__ == "corpus_builder.publish.commit"
    assert corpus_builder.evaluate.__module__ == corpus_builder.compare.__module__ == "corpus_builder.eval.api"
    for stage in STAGES:
        assert getattr(corpus_builder, stage) is sys.modules[f"corpus_builder.{stage}"], stage
    assert "build_corpus" in dir(corpus_builder)
    for package in [corpus_builder, *(sys.modules[name] for name in package_modules())]:
        if hasattr(package, "__path__"):
            children = {child.name for child in pkgutil.iter_modules(package.__path__)}
            assert not set(getattr(package, "__all__", ())) & children, package.__name__


def test_importing_the_package_loads_no_stage() -> None:
    code = ("import sys, corpus_builder\n"
            "print(sorted(m for m in sys.modules if m.startswith('corpus_builder')))\n"
            "from corpus_builder import load_recipe\n"
            "print('jsonschema' in sys.modules, 'pyarrow' in sys.modules)\n")
    lines = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           cwd=REPO).stdout.splitlines()
    assert lines == ["['corpus_builder', 'corpus_builder._version']", "False False"]


def documented_example() -> Path:
    """The script the documentation shows as the Python API end to end (docs/examples.md embeds it)."""
    text = (REPO / "docs" / "examples.md").read_text(encoding="utf-8")
    section = text[text.index("## The Python API in one script"):]
    match = re.search(r'```python\n--8<-- "(examples/[^"]+\.py)"\n```', section)
    assert match, "the Python API section of docs/examples.md embeds no script"
    return REPO / match.group(1)


def test_the_documented_example_runs(tmp_path: Path) -> None:
    """The documentation's example, as written, in an empty directory (no server needed)."""
    result = subprocess.run([sys.executable, str(documented_example()), str(tmp_path)], capture_output=True,
                            text=True, cwd=tmp_path,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "conversations" in result.stdout
    assert (tmp_path / "out" / "api-example" / "manifest.json").exists()
