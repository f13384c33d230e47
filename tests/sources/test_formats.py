"""The formats' registry: a format is one entry that every reader takes (the build, ``corpus audit FILE``, the audit
against traffic, the eval pack), and a file no entry names is refused in one place, the same way by each."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from corpus_builder.assemble import build_corpus
from corpus_builder.audit import audit_against
from corpus_builder.audit.inputs import traffic_units
from corpus_builder.errors import CorpusError, Skipped
from corpus_builder.eval.pack import read_pack
from corpus_builder.layout import Corpus
from corpus_builder.recipe import load_recipe
from corpus_builder.records import Conversation
from corpus_builder.sources import formats, iter_file
from corpus_builder.sources.formats import Format, format_of, register
from corpus_builder.sources.readers import PositionFilter, RowReader

QUESTIONS = [f"What is {n} + {n}?" for n in range(12)]


class TabSeparated(Format):
    """A throwaway format: one exchange a line, the question and the answer apart by a tab."""

    name = "tsv-test"
    suffixes = (".tsv",)
    by_line = True

    def rows(self, path: Path, label: str, keep: PositionFilter | None) -> RowReader:
        any_row = False
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            any_row = True
            if keep is None or keep(number):
                question, answer = line.split("\t")
                yield number, {"messages": [{"role": "user", "content": question},
                                            {"role": "assistant", "content": answer}]}
        return any_row


@pytest.fixture()
def tsv(tmp_path: Path) -> Path:
    path = tmp_path / "chats.tsv"
    path.write_text("".join(f"{question}\t{2 * n}\n" for n, question in enumerate(QUESTIONS)), encoding="utf-8")
    return path


@pytest.fixture()
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[Format]:
    """The throwaway format in the registry for one test."""
    fmt = TabSeparated()
    monkeypatch.setitem(formats.REGISTRY, fmt.name, fmt)
    yield fmt


def _recipe(root: Path, source: Path) -> Path:
    path = root / "recipe.yaml"
    path.write_text(f"name: tsv\ntarget: {{model: m}}\nsources:\n"
                    f"  - {{name: chats, kind: replay, path: {source.name}, task: math}}\n"
                    "split: {validation_fraction: 0}\noutput: {dir: out}\n", encoding="utf-8")
    return path


def test_a_registered_format_is_read_by_the_build_the_audit_and_the_eval_pack(tmp_path: Path, tsv: Path,
                                                                             registered: Format) -> None:
    rows = [item for item in iter_file(tsv)]
    assert all(isinstance(row, Conversation) for row in rows)
    assert [row.provenance.source_line for row in rows if isinstance(row, Conversation)] == list(range(1, 13))

    result = build_corpus(load_recipe(_recipe(tmp_path, tsv)), tmp_path / "out")
    built = sorted(row.messages[0].content for row in Corpus.open(result.out_dir).iter_conversations())
    assert built == sorted(QUESTIONS)

    report = audit_against(result.out_dir, str(tsv))
    assert report["traffic"]["conversations"] == len(QUESTIONS)
    assert report["traffic"]["skipped"] == {}

    pack = read_pack(tsv)
    assert [prompt.messages[-1]["content"] for prompt in pack.prompts] == QUESTIONS
    folder = tmp_path / "pack"
    folder.mkdir()
    tsv.rename(folder / tsv.name)
    assert read_pack(folder).files == (folder / tsv.name,)  # a directory's files of the registered format


def test_a_format_no_entry_names_is_refused_the_same_way_by_every_reader(tmp_path: Path, tsv: Path) -> None:
    with pytest.raises(CorpusError) as refused:
        format_of(tsv)
    message = str(refused.value)
    assert message.startswith(f"{tsv}: cannot tell the format from the file name")
    readers = {
        "iter_file": lambda: list(iter_file(tsv)),
        "build": lambda: build_corpus(load_recipe(_recipe(tmp_path, tsv)), tmp_path / "out"),
        "traffic": lambda: traffic_units(str(tsv)),
        "pack": lambda: read_pack(tsv),
    }
    for name, read in readers.items():
        with pytest.raises(CorpusError) as caught:
            read()
        assert str(caught.value).endswith(message.split(": ", 1)[1]), name
    assert not (tmp_path / "out").exists()
    with pytest.raises(CorpusError, match=r"unknown format 'tsv-test' \(expected one of jsonl, jsonl.zst, json, "):
        list(iter_file(tsv, fmt="tsv-test"))


def test_the_longest_suffix_names_a_file_and_a_suffix_or_name_is_one_format_s(monkeypatch: pytest.MonkeyPatch) -> None:
    class Zstd(TabSeparated):
        name = "zst-test"
        suffixes = (".zst",)

    builtin = list(formats.REGISTRY.values())
    monkeypatch.setattr(formats, "REGISTRY", {})
    register(Zstd())  # first: its shorter suffix is met before the built-in one
    for fmt in builtin:
        register(fmt)
    assert format_of(Path("day.jsonl.zst")).name == "jsonl.zst"
    assert format_of(Path("day.ZST")).name == "zst-test"
    with pytest.raises(ValueError, match="already registered"):
        register(Zstd())
    with pytest.raises(ValueError, match=r"suffix \.jsonl is another format's"):
        register(type("Lines", (TabSeparated,), {"name": "lines-test", "suffixes": (".jsonl",)})())


def test_a_declared_format_reads_a_file_whatever_its_name(tmp_path: Path) -> None:
    path = tmp_path / "export.txt"
    path.write_bytes(orjson.dumps({"messages": [{"role": "user", "content": "hi"},
                                                {"role": "assistant", "content": "hello"}]}) + b"\n")
    with pytest.raises(CorpusError, match="cannot tell the format"):
        list(iter_file(path))
    items = list(iter_file(path, fmt="jsonl"))
    assert [type(item) for item in items] == [Conversation] and not isinstance(items[0], Skipped)
