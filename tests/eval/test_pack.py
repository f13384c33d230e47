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


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def test_each_row_is_sent_as_it_ends_whatever_the_other_rows_hold(tmp_path: Path) -> None:
    """MT-Bench's and SPEED-Bench's shape mixed with answered rows: a row that ends with a question is sent whole
    (its earlier turns with it), a row that ends with an answer up to it; none is left out."""
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "look", "arguments": "{}"}}]}
    rows = [{"messages": [user("first question"), assistant("its answer"), user("second question")]},
            {"messages": [user("a lone question")]},
            {"messages": [{"role": "system", "content": "be brief"}, user("asked"), assistant("answered")]},
            {"messages": [user("look it up"), call, {"role": "tool", "tool_call_id": "c1", "content": "found"}]},
            {"messages": [user("q1"), assistant("a1"), user("q2"), assistant("a2")]}]
    pack = read_pack(write_jsonl(tmp_path / "mixed.jsonl", rows))
    assert pack.unreadable == {} and pack.rows == 5
    sent = [[(m["role"], m["content"]) for m in prompt.messages] for prompt in pack.prompts]
    assert sent == [[("user", "first question"), ("assistant", "its answer"), ("user", "second question")],
                    [("user", "a lone question")],
                    [("system", "be brief"), ("user", "asked")],
                    [("user", "look it up"), ("assistant", ""), ("tool", "found")],
                    [("user", "q1"), ("assistant", "a1"), ("user", "q2")]]
    assert pack.prompts[3].messages[1]["tool_calls"][0]["id"] == "c1"
    # what the other forms of the pack read (eval.bench): the row whole, the answer last where it has one
    assert [len(prompt.conversation.messages) for prompt in pack.prompts] == [3, 1, 3, 3, 4]


def test_a_rows_own_source_and_task_are_kept_each_on_its_own(tmp_path: Path) -> None:
    rows = [{"task": "writing", "messages": [user("a")]},
            {"source": "mt-bench", "messages": [user("b")]},
            {"source": "mt-bench", "task": "math", "messages": [user("c")]},
            {"source": 3, "task": ["not", "a", "name"], "messages": [user("d")]}]
    pack = read_pack(write_jsonl(tmp_path / "bench.jsonl", rows))
    assert [(p.source, p.task) for p in pack.prompts] == [("bench.jsonl", "writing"), ("mt-bench", None),
                                                          ("mt-bench", "math"), ("bench.jsonl", None)]


def test_losses_folded_requests_and_repeats_are_told_apart(tmp_path: Path) -> None:
    from tests.support.serving_logs import logged_conversation

    chat = [user("what is 2 + 2?"), assistant("4."), user("and times 3?"), assistant("12.")]
    logged = write_jsonl(tmp_path / "log.jsonl", logged_conversation("nested", {"messages": chat}))
    pack = read_pack(logged)
    assert (pack.folded, pack.unreadable, pack.rows, len(pack.prompts)) == (1, {}, 1, 1)
    assert [m["content"] for m in pack.prompts[0].messages] == ["what is 2 + 2?", "4.", "and times 3?"]
    rows = [*chat_rows(2), chat_rows(2)[1], chat_rows(1)[0], {"messages": "nope"}, {"messages": [assistant("x")]}]
    pack = read_pack(write_jsonl(tmp_path / "pack.jsonl", rows))
    assert (len(pack.prompts), pack.repeated, pack.rows, pack.folded) == (4, 2, 6, 0)
    assert pack.unreadable == {"bad_messages": 1, "wrong_role_order": 1}


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


def test_runs_of_a_pack_file_go_under_the_current_directory_not_beside_the_pack(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for pack in (write_jsonl(tmp_path / "data" / "p.jsonl", chat_rows(1)),
                 write_jsonl(tmp_path / "eval" / "p.jsonl", chat_rows(1)), tmp_path / "eval"):
        assert read_pack(pack).default_results_dir() == work / "eval" / "results"
    with pytest.raises(CorpusError, match="no such file"):
        read_pack(tmp_path / "missing.jsonl")
