"""Files as editors and file systems leave them: a UTF-8 byte order mark, symlinks and symlink loops."""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import zstandard

from corpus_builder.errors import CorpusError, Skipped
from corpus_builder.recipe import SourceSpec, check_recipe, match_source_pattern
from corpus_builder.records import Conversation
from corpus_builder.sources import iter_file, iter_source, resolve_paths
from corpus_builder.sources.formats import JsonLines
from corpus_builder.sources.readers import MIN_RANGE_BYTES, LineRange, iter_line_range
from corpus_builder.sources.source import source_parts

BOM = b"\xef\xbb\xbf"  # written out here, not taken from the reader under test
ROWS = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
        for i in range(3)]
JSONL = b"".join(orjson.dumps(row) + b"\n" for row in ROWS)


def _ids(items: list[Conversation | Skipped]) -> list[str | None]:
    assert [item for item in items if isinstance(item, Skipped)] == []
    return [item.provenance.source_id for item in items if isinstance(item, Conversation)]


@pytest.mark.parametrize("suffix", ["jsonl", "jsonl.zst", "json"])
def test_a_byte_order_mark_does_not_cost_the_first_row(tmp_path: Path, suffix: str) -> None:
    content = {"jsonl": JSONL, "jsonl.zst": zstandard.ZstdCompressor().compress(BOM + JSONL),
               "json": orjson.dumps(ROWS)}[suffix]
    path = tmp_path / f"excel-export.{suffix}"
    path.write_bytes(content if suffix == "jsonl.zst" else BOM + content)
    assert _ids(list(iter_file(path))) == ["r0", "r1", "r2"]


def test_the_byte_range_reader_strips_the_mark_of_the_first_range_only(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    path.write_bytes(BOM + JSONL)
    first_line_end = len(BOM) + JSONL.index(b"\n") + 1
    first = [row for _, row in iter_line_range(path, LineRange(0, first_line_end, 1))]
    rest = [row for _, row in iter_line_range(path, LineRange(first_line_end, path.stat().st_size, 2))]
    assert [row["id"] for row in first + rest] == ["r0", "r1", "r2"]


def test_each_range_of_a_cut_file_starts_at_its_line_in_the_file(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The cuts' pass counts each range's first line: blank lines and a line longer than a part (the cuts that fall
    in it move to the lines after it) are counted; the ranges read apart give the whole read's lines."""
    monkeypatch.setattr("corpus_builder.sources.readers.MIN_RANGE_BYTES", 100)
    lines = [orjson.dumps({"id": f"r{index}", "pad": "x" * (index % 13)}) if index % 5 else b"" for index in range(60)]
    lines[20] = orjson.dumps({"id": "long", "pad": "y" * 700})
    path = tmp_path / "cut.jsonl"
    content = b"\n".join(lines) + b"\n"
    path.write_bytes(content)
    ranges = JsonLines().ranges(path, 12, "cut.jsonl")
    assert len(ranges) == 12 and ranges[2].end - ranges[2].start > 700
    assert [span.first_line for span in ranges] == [content[:span.start].count(b"\n") + 1 for span in ranges]
    assert [span.start for span in ranges] == [0, *(span.end for span in ranges[:-1])]
    assert ranges[-1].end == len(content)
    ranged = [(line, row) for span in ranges for line, row in JsonLines().range_rows(path, span, None)]
    assert ranged == list(JsonLines().read(path, "cut.jsonl"))


@pytest.mark.parametrize("suffix", ["jsonl", "jsonl.zst"])
def test_files_concatenated_with_their_marks_lose_no_row(tmp_path: Path, suffix: str) -> None:
    """`cat a.jsonl b.jsonl` of two files an editor saved: the second file's mark starts a line inside the joined one
    (a line holding only a mark is blank)."""
    joined = BOM + JSONL + BOM + JSONL + BOM + b"\n" + BOM + JSONL.replace(b'"id":"r', b'"id":"s')
    path = tmp_path / f"joined.{suffix}"
    path.write_bytes(zstandard.ZstdCompressor().compress(joined) if suffix == "jsonl.zst" else joined)
    items = list(iter_file(path))
    assert _ids(items) == ["r0", "r1", "r2", "r0", "r1", "r2", "s0", "s1", "s2"]
    assert [item.provenance.source_line for item in items if isinstance(item, Conversation)] == [
        1, 2, 3, 4, 5, 6, 8, 9, 10]
    first_range = len(JSONL) + len(BOM) + JSONL.index(b"\n") + 1 + len(BOM)  # the byte reader: a mark past line 1
    if suffix == "jsonl":
        ranged = [row for span in (LineRange(0, first_range, 1), LineRange(first_range, len(joined), 5))
                  for _, row in iter_line_range(path, span)]
        assert [row["id"] for row in ranged] == ["r0", "r1", "r2", "r0", "r1", "r2", "s0", "s1", "s2"]


@pytest.fixture
def looping_tree(tmp_path: Path) -> Path:
    """data/chat.jsonl and data/nested/more.jsonl; data/nested/up -> data (a loop), data/alias.jsonl ->
    data/chat.jsonl, and a hidden directory."""
    data = tmp_path / "data"
    (data / "nested").mkdir(parents=True)
    (data / ".cache").mkdir()
    (data / "chat.jsonl").write_bytes(JSONL)
    (data / "nested" / "more.jsonl").write_bytes(JSONL)
    (data / ".cache" / "stale.jsonl").write_bytes(JSONL)
    os.symlink(data, data / "nested" / "up")
    os.symlink(data / "chat.jsonl", data / "alias.jsonl")
    return tmp_path


def test_a_glob_through_a_symlink_loop_matches_each_file_once_by_its_own_name(looping_tree: Path) -> None:
    matches = match_source_pattern(looping_tree, "data/**/*.jsonl")
    assert [path.relative_to(looping_tree).as_posix() for path in matches] == ["data/chat.jsonl",
                                                                                "data/nested/more.jsonl"]
    assert match_source_pattern(looping_tree, "data/**") == matches  # a trailing ** means every file below


def test_two_symlink_loops_do_not_make_the_glob_endless(looping_tree: Path) -> None:
    os.symlink(looping_tree / "data", looping_tree / "data" / "again")  # glob alone would walk 2**40 paths
    code = ("import sys; from pathlib import Path; from corpus_builder.recipe import match_source_pattern; "
            "print(len(match_source_pattern(Path(sys.argv[1]), 'data/**/*.jsonl')))")
    completed = subprocess.run([sys.executable, "-c", code, str(looping_tree)], capture_output=True, text=True,
                               timeout=60)
    assert completed.stdout.strip() == "2", completed.stderr


def test_the_readers_read_each_real_file_once_as_the_recipe_check_counts_it(looping_tree: Path) -> None:
    source = SourceSpec(name="chat", kind="replay", paths=("data/**/*.jsonl", "data/alias.jsonl", "data/chat.jsonl"))
    assert [path.relative_to(looping_tree).as_posix() for path in resolve_paths(source, looping_tree)] == [
        "data/chat.jsonl", "data/nested/more.jsonl"]
    items = list(iter_source(source, looping_tree))
    assert len(_ids(items)) == 2 * len(ROWS)  # the symlink loops and the alias add no row
    recipe = looping_tree / "recipe.yaml"
    recipe.write_text("name: loops\ntarget: {model: m}\nsources:\n"
                      "  - {name: chat, kind: replay, path: ['data/**/*.jsonl', data/alias.jsonl]}\n"
                      "output: {dir: out}\n")
    loaded, problems = check_recipe(recipe)
    assert problems == [] and loaded is not None


# --- files that are not UTF-8 JSON under a JSON name ------------------------------------------------------------

NOT_TEXT = {  # how each is made from the rows' bytes, and the words that say what it is
    "gzip": (lambda data: gzip.compress(data), "gzip-compressed"),
    "utf-16 with a mark": (lambda data: data.decode().encode("utf-16"), "UTF-16"),
    "utf-16-le without a mark": (lambda data: data.decode().encode("utf-16-le"), "UTF-16"),
    "utf-16-be without a mark": (lambda data: data.decode().encode("utf-16-be"), "UTF-16"),
    "utf-32 with a mark": (lambda data: data.decode().encode("utf-32"), "UTF-32"),
    "bzip2": (lambda data: bz2.compress(data), "bzip2-compressed"),
    "xz": (lambda data: lzma.compress(data), "xz-compressed"),
    "zstd": (lambda data: zstandard.ZstdCompressor().compress(data), "zstd-compressed"),
}


@pytest.mark.parametrize("suffix", ["jsonl", "jsonl.zst", "json"])
@pytest.mark.parametrize("kind", sorted(NOT_TEXT))
def test_a_file_that_is_not_utf8_text_is_a_located_error_not_a_file_of_skipped_rows(tmp_path: Path, kind: str,
                                                                                    suffix: str) -> None:
    """A gzip download named .jsonl, a UTF-16 export from a Windows tool: read as lines every row was skipped and the
    run succeeded with no conversation. The file is named with what it is and what to do, exit 2."""
    make, what = NOT_TEXT[kind]
    if kind == "zstd" and suffix == "jsonl.zst":
        pytest.skip("a .jsonl.zst file is zstd-compressed by its name")
    content = make(orjson.dumps(ROWS) if suffix == "json" else JSONL)
    path = tmp_path / f"log.{suffix}"
    path.write_bytes(zstandard.ZstdCompressor().compress(content) if suffix == "jsonl.zst" else content)
    with pytest.raises(CorpusError) as caught:
        list(iter_file(path))
    assert str(caught.value).startswith(f"log.{suffix}: ") and what in str(caught.value)
    completed = subprocess.run([sys.executable, "-m", "corpus_builder", "audit", str(path)], capture_output=True,
                               text=True)
    assert completed.returncode == 2 and f"{path.name}: " in completed.stderr and what in completed.stderr
    assert "Traceback" not in completed.stderr


def test_a_large_gzip_file_named_jsonl_is_refused_before_it_is_split_across_processes(tmp_path: Path) -> None:
    """A plain .jsonl over twice the split size is read as byte ranges in several processes: the first range's check
    would come late, so the file is refused where it is split."""
    path = tmp_path / "big.jsonl"
    path.write_bytes(gzip.compress(os.urandom(2 * MIN_RANGE_BYTES + (1 << 20)), compresslevel=1))  # incompressible
    assert path.stat().st_size > 2 * MIN_RANGE_BYTES
    source = SourceSpec(name="big", kind="replay", paths=("big.jsonl",))
    with pytest.raises(CorpusError, match=r"^big\.jsonl: .*gzip-compressed"):
        source_parts(source, tmp_path, 4)
