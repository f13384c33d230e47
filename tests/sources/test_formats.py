"""The formats' registry: a format is one entry that every reader takes (the build, ``corpus audit FILE``, the audit
against traffic, the eval pack) and a recipe may name, and a file no entry names is refused in one place, the same
way by each, as is a name no entry has where a recipe writes it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from corpus_builder.assemble import build_corpus, plan_build
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
from tests.test_hostile_outputs import run_cli  # the CLI in this process: it sees a format registered here

QUESTIONS = [f"What is {n} + {n}?" for n in range(12)]


class TabSeparated(Format):
    """A throwaway format: one exchange a line, the question and the answer apart by a tab."""

    name = "tsv"
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


def _recipe(root: Path, source: Path, fmt: str = "auto") -> Path:
    path = root / "recipe.yaml"
    path.write_text(f"name: tsv\ntarget: {{model: m}}\nsources:\n"
                    f"  - {{name: chats, kind: replay, path: {source.name}, task: math, format: {fmt}}}\n"
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
    with pytest.raises(CorpusError, match=r"unknown format 'tsv' \(expected one of jsonl, jsonl.zst, json, "):
        list(iter_file(tsv, fmt="tsv"))


def test_a_recipe_names_a_registered_format_and_its_sources_are_read_with_it(
        tmp_path: Path, tsv: Path, registered: Format, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    named = tsv.rename(tmp_path / "chats.txt")  # no suffix tells the format: the recipe's name does
    recipe = _recipe(tmp_path, named, "tsv")
    assert run_cli(["validate", str(recipe)], capsys, monkeypatch)[0] == 0
    result = build_corpus(load_recipe(recipe), tmp_path / "out")
    built = sorted(row.messages[0].content for row in Corpus.open(result.out_dir).iter_conversations())
    assert built == sorted(QUESTIONS)


def test_a_format_name_no_entry_has_is_refused_where_the_recipe_writes_it_with_the_names_registered(
        tmp_path: Path, tsv: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = _recipe(tmp_path, tsv, "tvs")
    line = recipe.read_text(encoding="utf-8").splitlines()[3]
    where = f"{recipe}:4:{line.index('tvs') + 1}: sources[0].format: 'tvs' is not one of the registered source formats"
    code, err = run_cli(["validate", str(recipe)], capsys, monkeypatch)
    assert (code, err.splitlines()[0]) == (2, f"{where}: auto, jsonl, jsonl.zst, json, parquet")

    monkeypatch.setitem(formats.REGISTRY, "tsv", TabSeparated())  # the names are the registry's, whatever it holds
    expected = f"{where}: auto, jsonl, jsonl.zst, json, parquet, tsv; did you mean 'tsv'?"
    code, err = run_cli(["validate", str(recipe)], capsys, monkeypatch)
    assert (code, err.splitlines()[0]) == (2, expected)
    code, err = run_cli(["build", str(recipe)], capsys, monkeypatch)
    assert code == 2 and f"  - {expected}\n" in err
    for read in (lambda: build_corpus(load_recipe(recipe)), lambda: plan_build(load_recipe(recipe)),
                 lambda: traffic_units(str(recipe))):
        with pytest.raises(CorpusError) as refused:
            read()
        assert refused.value.details == [expected]
    assert not (tmp_path / "out").exists()

    code, err = run_cli(["validate", str(_recipe(tmp_path, tmp_path / "gone.tsv", "tvs"))], capsys, monkeypatch)
    assert code == 2 and [line.split(": ")[1] for line in err.splitlines()[:2]] == [  # every problem in one round
        "sources[0].path", "sources[0].format"]


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
