"""The public Python API: what ``corpus_builder`` exports, that it stays lazy, and the README's example."""

from __future__ import annotations

import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import corpus_builder

REPO = Path(__file__).resolve().parents[1]
EXPORTED = ["BuildPlan", "BuildResult", "Conversation", "Corpus", "CorpusError", "Message", "Recipe", "ToolCall",
            "audit", "audit_against", "build", "check_recipe", "export", "load_recipe", "plan_build", "publish"]


def test_all_is_the_public_api() -> None:
    assert corpus_builder.__all__ == EXPORTED


def test_every_name_resolves_even_after_every_subpackage_is_imported() -> None:
    """Four stages share their name with their entry function: importing the subpackage must not shadow it."""
    for module in pkgutil.walk_packages(corpus_builder.__path__, "corpus_builder."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    importlib.import_module("corpus_builder.build.pipeline")

    for name in EXPORTED:
        value = getattr(corpus_builder, name)
        assert callable(value), name
        assert value.__module__.startswith("corpus_builder."), name
    assert corpus_builder.build.__module__ == "corpus_builder.build.pipeline"
    assert corpus_builder.audit.__module__ == "corpus_builder.audit"
    assert corpus_builder.export.__module__ == "corpus_builder.export"
    assert corpus_builder.publish.__module__ == "corpus_builder.publish"
    assert "build" in dir(corpus_builder)


def test_importing_the_package_loads_no_stage() -> None:
    code = ("import sys, corpus_builder\n"
            "print(sorted(m for m in sys.modules if m.startswith('corpus_builder')))\n"
            "from corpus_builder import load_recipe\n"
            "print('jsonschema' in sys.modules, 'pyarrow' in sys.modules)\n")
    lines = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           cwd=REPO).stdout.splitlines()
    assert lines == ["['corpus_builder', 'corpus_builder._version']", "False False"]


def readme_example() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Python API"):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README's Python API section has no python block"
    return match.group(1)


def test_the_readme_example_runs(tmp_path: Path) -> None:
    """The README's example, as written, on a replay recipe of its own (no server needed)."""
    script = tmp_path / "example.py"
    script.write_text(readme_example(), encoding="utf-8")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "conversations" in result.stdout
    assert (tmp_path / "out" / "api-example" / "manifest.json").exists()
