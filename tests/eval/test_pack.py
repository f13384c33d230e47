"""Reading an eval pack: what each conversation sends, where its source and task come from, where runs go."""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpus_builder.errors import CorpusError
from corpus_builder.eval import read_pack
from corpus_builder.layout import FORMAT_VERSION, MANIFEST
from corpus_builder.rows import conversations_to_batch

from .conftest import chat_rows, conversations, write_jsonl


def test_a_conversation_sends_its_turns_before_its_last_answer(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "pack.jsonl", [
        {"source": "chat", "task": "dialogue", "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "<think>\ngreet\n</think>\n\nhello"},
            {"role": "user", "content": "and now?"},
            {"role": "assistant", "content": "the answer the target gives again"}]},
        *chat_rows(1)])
    pack = read_pack(path)
    first, second = pack.prompts
    assert first.messages == ({"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                              {"role": "assistant", "content": "hello", "reasoning_content": "greet"},
                              {"role": "user", "content": "and now?"})
    assert (first.source, first.task) == ("chat", "dialogue")  # the row's own fields
    assert (second.source, second.task) == ("pack.jsonl", None)  # a row without them: its file
    assert read_pack(path, keep_history_reasoning=False).prompts[0].messages[2] == {"role": "assistant",
                                                                                    "content": "hello"}


def test_a_file_of_prompts_is_sent_whole(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "write a haiku"}, {"prompt": "count to three"}])
    assert [p.messages for p in read_pack(path).prompts] == [({"role": "user", "content": "write a haiku"},),
                                                             ({"role": "user", "content": "count to three"},)]


def test_unreadable_rows_are_counted_and_an_empty_pack_refused(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "pack.jsonl", [*chat_rows(2), {"messages": "nope"}, {"other": 1}])
    pack = read_pack(path)
    assert len(pack.prompts) == 2
    assert pack.unreadable == {"bad_messages": 1, "missing_messages": 1}
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"other": 1}])
    with pytest.raises(CorpusError, match="no readable conversation") as error:
        read_pack(bad)
    assert "missing_messages: 1 row(s)" in str(error.value) and str(bad) in str(error.value)


def test_a_directory_is_its_conversations_files(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "pack" / "b.jsonl", chat_rows(1, source="b"))
    write_jsonl(tmp_path / "pack" / "a.jsonl", chat_rows(2, source="a"))
    (tmp_path / "pack" / "notes.txt").write_text("not a pack file")
    write_jsonl(tmp_path / "pack" / "results" / "old.json", [{"not": "read"}])
    pack = read_pack(tmp_path / "pack")
    assert [p.source for p in pack.prompts] == ["a", "a", "b"]
    assert [f.name for f in pack.files] == ["a.jsonl", "b.jsonl"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CorpusError, match="no conversations file"):
        read_pack(empty)


def test_the_hash_is_what_is_sent_not_the_file_format(tmp_path: Path) -> None:
    rows = [c.to_row() for c in conversations(3, "math", "gsm8k")]
    as_jsonl = read_pack(write_jsonl(tmp_path / "pack.jsonl", rows))
    parquet = tmp_path / "pack.parquet"
    pq.write_table(pa.Table.from_batches([conversations_to_batch(conversations(3, "math", "gsm8k"))]), parquet)
    as_parquet = read_pack(parquet)
    assert as_parquet.sha256 == as_jsonl.sha256
    assert [(p.source, p.task) for p in as_parquet.prompts] == [("math", "gsm8k")] * 3
    rows[0]["messages"][0]["content"] += "!"
    assert read_pack(write_jsonl(tmp_path / "other.jsonl", rows)).sha256 != as_jsonl.sha256


def fake_corpus(root: Path, *, with_pack: bool = True) -> Path:
    root.mkdir(parents=True)
    (root / MANIFEST).write_bytes(orjson.dumps({"format_version": FORMAT_VERSION, "files": []}))
    if with_pack:
        write_jsonl(root / "eval" / "pack.jsonl", [c.to_row() for c in conversations(2, "chat", None)])
    return root


def test_a_corpus_is_read_through_its_eval_directory_and_runs_go_beside_it(tmp_path: Path) -> None:
    corpus = fake_corpus(tmp_path / "corpus")
    for given in (corpus, corpus / "eval", corpus / "eval" / "pack.jsonl"):
        pack = read_pack(given)
        assert [p.source for p in pack.prompts] == ["chat", "chat"]
        assert pack.default_results_dir() == tmp_path / "eval" / "results"  # never inside the corpus
    with pytest.raises(CorpusError, match="no eval pack") as error:
        read_pack(fake_corpus(tmp_path / "bare", with_pack=False))
    assert str(tmp_path / "bare") in str(error.value)


def test_runs_of_a_pack_file_go_to_eval_results_beside_it(tmp_path: Path) -> None:
    assert read_pack(write_jsonl(tmp_path / "p.jsonl", chat_rows(1))).default_results_dir() == \
        tmp_path / "eval" / "results"
    assert read_pack(write_jsonl(tmp_path / "eval" / "p.jsonl", chat_rows(1))).default_results_dir() == \
        tmp_path / "eval" / "results"
    with pytest.raises(CorpusError, match="no such file"):
        read_pack(tmp_path / "missing.jsonl")
