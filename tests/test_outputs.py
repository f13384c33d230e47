"""The one guard every output path goes through (corpus_builder.outputs.check_output_path)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corpus_builder.errors import CorpusError
from corpus_builder.layout import MANIFEST
from corpus_builder.outputs import check_output_path, enclosing_corpus


def refused(path: Path | str, **kwargs: object) -> str:
    with pytest.raises(CorpusError) as caught:
        check_output_path(path, what="--out", **kwargs)  # type: ignore[arg-type]
    return str(caught.value)


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    (root / "data").mkdir(parents=True)
    (root / MANIFEST).write_text("{}")
    return root


def test_a_new_file_in_a_writable_directory_is_accepted(tmp_path: Path) -> None:
    assert check_output_path(tmp_path / "report.html", what="--html") == tmp_path / "report.html"
    existing = tmp_path / "old.html"
    existing.write_text("x")
    assert check_output_path(existing, what="--html") == existing


def test_empty_path_is_refused() -> None:
    assert "empty" in refused("")
    assert "empty" in refused("   ")


def test_a_directory_is_refused_for_a_file(tmp_path: Path) -> None:
    assert "a directory" in refused(tmp_path)


def test_a_device_is_refused() -> None:
    assert "not a regular file" in refused("/dev/null")


def test_a_regular_file_is_refused_for_a_directory(tmp_path: Path) -> None:
    existing = tmp_path / "file"
    existing.write_text("x")
    assert "not a directory" in refused(existing, directory=True)
    assert check_output_path(tmp_path / "new" / "deeper", what="--out", directory=True) == tmp_path / "new" / "deeper"


def test_anything_inside_a_corpus_is_refused(corpus_dir: Path) -> None:
    message = refused(corpus_dir / MANIFEST)
    assert "inside the built corpus" in message and str(corpus_dir) in message
    assert "inside the built corpus" in refused(corpus_dir / "data" / "x.html")
    assert "inside the built corpus" in refused(corpus_dir, directory=True)
    assert "inside the built corpus" in refused(corpus_dir / "export", directory=True)
    assert enclosing_corpus(corpus_dir / "data") == corpus_dir
    assert enclosing_corpus(corpus_dir.parent) is None


def test_an_input_of_the_run_is_refused(tmp_path: Path) -> None:
    traffic = tmp_path / "traffic.jsonl"
    traffic.write_text("{}\n")
    assert "overwrite its input" in refused(traffic, inputs=[traffic])
    link = tmp_path / "link.jsonl"
    link.symlink_to(traffic)
    assert "overwrite its input" in refused(link, inputs=[traffic])
    assert "overwrite its input" in refused(traffic, inputs=[str(tmp_path / "*.jsonl")])
    assert "overwrite its input" in refused(tmp_path / "sub", inputs=[tmp_path], directory=True)
    assert check_output_path(tmp_path / "other.html", what="--html", inputs=[traffic, None, "hf://datasets/a/b"])


def test_a_missing_or_non_directory_parent_is_refused(tmp_path: Path) -> None:
    assert "does not exist" in refused(tmp_path / "missing" / "report.html")
    plain = tmp_path / "plain"
    plain.write_text("x")
    assert "is not a directory" in refused(plain / "report.html")


def test_an_unwritable_directory_is_refused(tmp_path: Path) -> None:
    if os.geteuid() == 0:  # root writes anywhere a mode allows; the kernel still refuses /proc/1 to everyone
        assert "not writable" in refused("/proc/1/report.html")
        return
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert "not writable" in refused(locked / "report.html")
    finally:
        locked.chmod(0o700)


def test_a_nul_byte_is_refused_not_a_traceback(tmp_path: Path) -> None:
    assert "NUL byte" in refused(f"{tmp_path}/report\0.html")
    assert "NUL byte" in refused(f"{tmp_path}/out\0", directory=True)


def test_a_build_may_replace_the_corpus_it_rebuilds_but_nothing_inside_one(corpus_dir: Path) -> None:
    assert check_output_path(corpus_dir, what="--out", directory=True, rebuilds_corpus=True) == corpus_dir
    assert "inside the built corpus" in refused(corpus_dir / "data", directory=True, rebuilds_corpus=True)
    assert "inside the built corpus" in refused(corpus_dir / "journal", directory=True, rebuilds_corpus=True)
    assert "inside the built corpus" in refused(corpus_dir, directory=True)


def test_a_parent_step_after_a_missing_directory_is_refused(tmp_path: Path) -> None:
    assert "not a directory" in refused(tmp_path / "missing" / ".." / "report.html")
    assert "not a directory" in refused(tmp_path / "missing" / ".." / "out", directory=True)
    (tmp_path / "there").mkdir()
    assert check_output_path(tmp_path / "there" / ".." / "report.html", what="--html")
