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
from corpus_builder.records import Conversation, Message
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


def test_the_folders_a_pack_is_read_from(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "pack" / "a.jsonl", chat_rows(1))
    write_jsonl(tmp_path / "pack" / "b.jsonl", chat_rows(1))
    assert read_pack(tmp_path / "pack").folders == {tmp_path / "pack"}
    assert read_pack(tmp_path / "pack" / "a.jsonl").folders == {tmp_path / "pack"}


def corpus_with_eval_section(root: Path, section: object) -> Path:
    fake_corpus(root, with_pack=False)
    manifest = orjson.loads((root / MANIFEST).read_bytes())
    (root / MANIFEST).write_bytes(orjson.dumps({**manifest, "eval": section}))
    return root


def test_a_corpus_without_a_pack_says_whether_one_was_asked_for(tmp_path: Path) -> None:
    bare = fake_corpus(tmp_path / "bare", with_pack=False)
    for given in (bare, bare / "eval"):
        if given.name == "eval":
            given.mkdir()  # an empty eval/ of a corpus, as an earlier build left one
        with pytest.raises(CorpusError) as refused:
            read_pack(given)
        assert str(refused.value) == (f"{bare}: the corpus has no eval pack (eval/): give a conversations file "
                                      "instead")
    empty = corpus_with_eval_section(tmp_path / "empty", {
        "seed": 0, "conversations": 0, "files": [],
        "sources": {"b": {"read": 7, "held": 0}, "a": {"read": 3, "held": 0}, "c": "not an entry"}})
    with pytest.raises(CorpusError) as refused:
        read_pack(empty)
    assert str(refused.value) == (
        f"{empty}: the corpus's eval pack holds no conversation: the recipe's eval share held none of the rows its "
        "replay sources gave (a 0 of 3, b 0 of 7; a fraction that rounds to 0 rows holds none): rebuild with a "
        "larger eval.rows or eval.fraction, or give a conversations file instead")
    odd = corpus_with_eval_section(tmp_path / "odd", {"seed": 0, "conversations": 0, "files": [], "sources": []})
    with pytest.raises(CorpusError, match=r"held none of the rows its replay sources gave \(none read; a fraction"):
        read_pack(odd)


def test_the_prompts_of_a_pack_and_its_hash_follow_what_is_sent(tmp_path: Path) -> None:
    rows = [{"source": "s", "task": "t", "messages": [{"role": "user", "content": "q"}],
             "tools": [{"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}}]}]
    pack = read_pack(write_jsonl(tmp_path / "p.jsonl", rows))
    [prompt] = pack.prompts
    assert prompt.tools == ({"type": "function", "function": {"name": "look", "description": None,
                                                              "parameters": {"type": "object"}}},)
    import hashlib

    expected = hashlib.sha256(orjson.dumps([["s", "t", prompt.messages, prompt.tools]],
                                           option=orjson.OPT_SORT_KEYS)).hexdigest()
    assert pack.sha256 == expected and pack.rows == 1 and pack.files == (tmp_path / "p.jsonl",)
    assert pack.path == tmp_path / "p.jsonl" and pack.corpus is None
    assert read_pack(write_jsonl(tmp_path / "q.jsonl", [{**rows[0], "task": "u"}])).sha256 != pack.sha256
    assert read_pack(write_jsonl(tmp_path / "plain.jsonl", chat_rows(1))).prompts[0].tools is None


def test_earlier_reasoning_is_kept_or_dropped_and_the_last_answer_never_sent(tmp_path: Path) -> None:
    row = {"messages": [{"role": "user", "content": "a"},
                        {"role": "assistant", "content": "b", "reasoning_content": "r1"},
                        {"role": "user", "content": "c"},
                        {"role": "assistant", "content": "d", "reasoning_content": "r2"}]}
    path = write_jsonl(tmp_path / "p.jsonl", [row])
    kept, dropped = read_pack(path).prompts[0], read_pack(path, keep_history_reasoning=False).prompts[0]
    assert kept.messages == ({"role": "user", "content": "a"},
                             {"role": "assistant", "content": "b", "reasoning_content": "r1"},
                             {"role": "user", "content": "c"})
    assert dropped.messages[1] == {"role": "assistant", "content": "b"}
    assert kept.conversation.messages[-1].reasoning == "r2" and kept.id == kept.conversation.id


def packed_corpus(root: Path, held: list[Conversation]) -> Path:
    """A built corpus's layout with an eval pack of ``held`` (its shard listed in the manifest, as a build writes)."""
    from corpus_builder.layout import file_sha256

    fake_corpus(root, with_pack=False)
    shard = root / "eval" / "eval-00000-of-00001.parquet"
    shard.parent.mkdir()
    for row in held:
        row.split = "eval"
    pq.write_table(pa.Table.from_batches([conversations_to_batch(held)]), shard)
    info = {"path": "eval/eval-00000-of-00001.parquet", "split": "eval", "rows": len(held),
            "bytes": shard.stat().st_size, "sha256": file_sha256(shard)}
    manifest = orjson.loads((root / MANIFEST).read_bytes())
    (root / MANIFEST).write_bytes(orjson.dumps({**manifest, "eval": {"conversations": len(held), "files": [info]}}))
    return root


def test_a_built_corpus_pack_is_read_as_its_build_wrote_it(tmp_path: Path) -> None:
    held = [*conversations(2, "chat", "dialogue"), *conversations(1, "code", None)]
    held[1].messages[0] = Message("user", held[0].messages[0].content)  # a repeat of the first row's question
    held[1].messages[1] = held[0].messages[1]
    held[2].messages = [Message("user", "code question 0"), Message("assistant", "plan", reasoning="think first"),
                        Message("user", "go on"), Message("assistant", "done")]
    corpus = packed_corpus(tmp_path / "corpus", held)
    for given in (corpus, corpus / "eval"):
        pack = read_pack(given)
        assert (pack.path, pack.files, pack.corpus is not None) == (
            corpus / "eval", (corpus / "eval" / "eval-00000-of-00001.parquet",), True)
        assert [(p.id, p.source, p.task) for p in pack.prompts] == [
            ("chat-0", "chat", "dialogue"), ("chat-1", "chat", "dialogue"), ("code-0", "code", None)]
        assert [p.messages for p in pack.prompts] == [({"role": "user", "content": "chat question 0"},),
                                                      ({"role": "user", "content": "chat question 0"},),
                                                      ({"role": "user", "content": "code question 0"},
                                                       {"role": "assistant", "content": "plan",
                                                        "reasoning_content": "think first"},
                                                       {"role": "user", "content": "go on"})]
        assert (pack.unreadable, pack.folded, pack.repeated, pack.rows) == ({}, 0, 1, 3)
        assert pack.default_results_dir() == tmp_path / "eval" / "results"
    kept = read_pack(corpus).prompts[0].conversation
    assert kept.messages[-1].reasoning == "thought 0"
    assert read_pack(corpus, keep_history_reasoning=False).prompts[2].messages[1] == {"role": "assistant",
                                                                                      "content": "plan"}


def test_a_missing_path_and_a_folder_without_conversations_are_named(tmp_path: Path) -> None:
    with pytest.raises(CorpusError) as missing:
        read_pack(tmp_path / "missing.jsonl")
    assert str(missing.value) == f"{tmp_path / 'missing.jsonl'}: no such file or directory"
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError) as empty:
        read_pack(tmp_path / "empty")
    assert str(empty.value) == (f"{tmp_path / 'empty'}: no conversations file (.jsonl, .jsonl.zst, .json, "
                                ".parquet) in the directory")
    (tmp_path / "blank.jsonl").write_bytes(b"")
    with pytest.raises(CorpusError) as blank:
        read_pack(tmp_path / "blank.jsonl")
    assert str(blank.value).startswith("blank.jsonl: ")
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"other": 1}, {"other": 2}])
    with pytest.raises(CorpusError) as unreadable:
        read_pack(bad)
    assert str(unreadable.value) == f"{bad}: the pack holds no readable conversation\n  - missing_messages: 2 row(s)"


def test_losses_and_folds_are_counted_one_by_one(tmp_path: Path) -> None:
    from tests.support.serving_logs import logged_conversation

    chat = [{"role": "user", "content": f"turn {i}"} if i % 2 == 0 else {"role": "assistant", "content": f"a {i}"}
            for i in range(6)]
    logged = read_pack(write_jsonl(tmp_path / "log.jsonl", logged_conversation("nested", {"messages": chat})))
    assert (logged.folded, len(logged.prompts), logged.rows) == (2, 1, 1)
    rows = [*chat_rows(1), {"messages": "nope"}, {"messages": 3}, {"other": 1}]
    assert read_pack(write_jsonl(tmp_path / "p.jsonl", rows)).unreadable == {"bad_messages": 2, "missing_messages": 1}


def test_a_source_or_task_that_is_not_a_name_is_not_taken(tmp_path: Path) -> None:
    rows = [{"source": 3, "task": "math", "messages": [{"role": "user", "content": "a"}]},
            {"source": "bench", "task": {"not": "a name"}, "messages": [{"role": "user", "content": "b"}]}]
    pack = read_pack(write_jsonl(tmp_path / "p.jsonl", rows))
    assert [(p.source, p.task) for p in pack.prompts] == [("p.jsonl", "math"), ("bench", None)]


def test_repeats_are_what_is_sent_whatever_the_order_of_keys(tmp_path: Path) -> None:
    def row(parameters: dict[str, object]) -> dict[str, object]:
        return {"messages": [{"role": "user", "content": "same"}],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}]}

    rows = [row({"type": "object", "required": []}), row({"required": [], "type": "object"}),
            row({"type": "object", "required": ["x"]})]
    assert read_pack(write_jsonl(tmp_path / "p.jsonl", rows)).repeated == 1
