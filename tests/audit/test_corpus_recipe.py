"""A built corpus's recipe.yaml is read by the recipes' safe, bounded reader wherever it is read: the audit, the
exports and the eval refuse what the publish gate refuses, naming the file."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from corpus_builder.recipe.yaml_reader import MAX_RECIPE_BYTES

ALIASES = ("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
           "c: [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n")


@pytest.mark.parametrize(("recipe", "problem"), [
    (ALIASES, "alias *a is not allowed"),
    ("name: !!python/object/apply:os.system [echo hi]\n", "tag !!python/object/apply:os.system is not allowed"),
    ("- a list\n", "the top level must be a mapping"),
    ("name: " + "x" * MAX_RECIPE_BYTES + "\n", "a recipe is at most"),
], ids=["aliases", "python tag", "a list", "huge"])
def test_a_corpus_recipe_that_is_not_plain_yaml_is_refused_by_name(corpus: Path, tmp_path: Path, recipe: str,
                                                                   problem: str) -> None:
    copy = tmp_path / "corpus"
    shutil.copytree(corpus, copy)
    (copy / "recipe.yaml").write_text(recipe, encoding="utf-8")
    for args in (["audit", str(copy), "--html", str(tmp_path / "page.html")],
                 ["export", str(copy), "--format", "speculators-tokens", "--out", str(tmp_path / "export")],
                 ["vocab", str(copy), "--out", str(tmp_path / "freq.npy")]):
        completed = subprocess.run([sys.executable, "-m", "corpus_builder", *args], capture_output=True, text=True)
        assert completed.returncode == 2, (args, completed.stderr)
        assert f"{copy / 'recipe.yaml'}" in completed.stderr and problem in completed.stderr, completed.stderr
        assert "Traceback" not in completed.stderr
    assert not (tmp_path / "page.html").exists() and not (tmp_path / "freq.npy").exists()
