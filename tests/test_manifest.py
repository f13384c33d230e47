"""manifest.json and audit.json have their types: what a build writes reads back as it was, a manifest edited into
another shape is refused naming its key, never its value, before any stage relies on it, and audit.json holds the
keys its type declares."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from corpus_builder.assemble import build_corpus
from corpus_builder.errors import CorpusError
from corpus_builder.layout import MANIFEST, Corpus, Manifest
from corpus_builder.recipe import load_recipe

TOKEN = "hf_" + "a1B2c3D4e5F6g7H8i9J0kLmNoPqRsTuVwX"  # a Hub token's shape


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("manifest")
    rows = [{"messages": [{"role": "user", "content": f"Question {i}?"},
                          {"role": "assistant", "content": f"<think>Thinking {i}.</think>Answer {i}."}]}
            for i in range(12)]
    (root / "chats.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    (root / "recipe.yaml").write_text("name: manifest\ntarget: {model: m/t}\nsources:\n"
                                      "  - {name: chats, kind: replay, path: chats.jsonl, task: chat}\n"
                                      "split: {validation_fraction: 0.25}\noutput: {dir: out, rows_per_shard: 5}\n")
    return build_corpus(load_recipe(root / "recipe.yaml")).out_dir


def test_what_a_build_writes_reads_back_as_it_was(corpus: Path) -> None:
    written = orjson.loads((corpus / MANIFEST).read_bytes())
    manifest = Corpus.open(corpus).manifest
    assert manifest.to_json() == written
    assert manifest.conversations == 12 == sum(entry.rows for entry in manifest.files)
    assert sum(count.rows for count in manifest.splits.values()) == 12 and manifest.section("dedup") is not None
    assert manifest.section("mixture") is None and manifest.name == "manifest"


def test_a_minimal_manifest_counts_its_shards() -> None:
    files = [{"path": "data/train-00000-of-00001.parquet", "split": "train", "rows": 3, "bytes": 9, "sha256": "ab"}]
    manifest = Manifest.from_json({"format_version": 1, "files": files}, "m.json")
    assert manifest.conversations == 3 and manifest.name is None and manifest.splits == {}


EDITS: list[tuple[str, Callable[[dict[str, Any]], Any], str]] = [
    ("a split that is not a mapping", lambda m: m["splits"].update(train=TOKEN), "splits.train is not a mapping"),
    ("rows that are text", lambda m: m["files"][0].update(rows=TOKEN), "files[0].rows is not a count"),
    ("a negative count", lambda m: m.update(conversations=-1), "conversations is negative, not a count"),
    ("a count that is true", lambda m: m.update(conversations=True), "conversations is not a count"),
    ("files that are no list", lambda m: m.update(files={"a": 1}), "files is not a list of shards"),
    ("no files", lambda m: m.pop("files"), "files is missing"),
    ("a section of the wrong kind", lambda m: m.update(short=TOKEN), "short is not a list"),
]


@pytest.mark.parametrize(("edit", "problem"), [(edit, problem) for _, edit, problem in EDITS],
                         ids=[name for name, _, _ in EDITS])
def test_a_manifest_of_another_shape_is_refused_naming_its_key(corpus: Path, tmp_path: Path,
                                                               edit: Callable[[dict[str, Any]], Any],
                                                               problem: str) -> None:
    document = orjson.loads((corpus / MANIFEST).read_bytes())
    edit(document)
    path = tmp_path / MANIFEST
    path.write_bytes(orjson.dumps(document))
    with pytest.raises(CorpusError) as refused:
        Manifest.from_json(document, str(path))
    assert problem in str(refused.value) and refused.value.file == str(path) and TOKEN not in str(refused.value)


def test_the_gate_refuses_an_edited_manifest_with_a_clear_error_not_a_traceback(corpus: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "corpus"
    shutil.copytree(corpus, copy)
    document = orjson.loads((copy / MANIFEST).read_bytes())
    document["splits"]["train"] = [1, 2]
    (copy / MANIFEST).write_bytes(orjson.dumps(document))
    for args in (["publish", str(copy), "--repo", "me/x", "--dry-run"], ["audit", str(copy)],
                 ["export", str(copy), "--format", "messages", "--out", str(tmp_path / "x")]):
        completed = subprocess.run([sys.executable, "-m", "corpus_builder", *args], capture_output=True, text=True,
                                   env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
        assert completed.returncode == 2 and "Traceback" not in completed.stderr, completed.stderr
        assert f"{copy / MANIFEST}" in completed.stderr and "splits.train is not a mapping" in completed.stderr


def test_audit_json_holds_the_keys_its_type_declares(corpus: Path) -> None:
    from corpus_builder.stats.corpus import AuditReport, SourceReport, TotalsReport

    written = orjson.loads((corpus / "audit.json").read_bytes())
    declared = AuditReport.__required_keys__ | AuditReport.__optional_keys__
    assert AuditReport.__required_keys__ <= set(written) <= declared
    for source in written["by_source"].values():
        assert set(source) == SourceReport.__required_keys__
    for section in (*written["by_split"].values(), *written["by_origin"].values()):
        assert set(section) == TotalsReport.__required_keys__
