"""The generation journal: keys, torn tails, resume, no duplicates."""

from __future__ import annotations

import pytest
import zstandard

from corpus_builder.errors import CorpusError
from corpus_builder.generate import Journal, generate, turn_key
from corpus_builder.testing.fault_server import FaultServer
from tests.support.generate_run import make_prompts, make_recipe

MODEL = "fault-model"
SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 64}


def key(messages=({"role": "user", "content": "hi"},), sampling=SAMPLING, **overrides) -> bytes:
    fields = {"model": MODEL, "revision": None, "enable_thinking": True, "sample_index": 0, **overrides}
    return turn_key(messages, sampling, **fields)


def record(i: int) -> dict:
    return {"content": f"answer {i}", "token_ids": list(range(i, i + 50)), "finish_reason": "stop"}


def segments(directory):
    return sorted(directory.glob("segment-*.zst"))


def test_key_depends_on_what_determines_the_generation_only():
    base = key()
    assert key() == base and len(base) == 16
    assert key(sampling=dict(reversed(SAMPLING.items()))) == base  # field order is not content
    assert key(messages=({"role": "user", "content": "hi!"},)) != base
    assert key(sampling={**SAMPLING, "max_tokens": 128}) != base
    assert key(model="other") != base
    assert key(revision="abc123") != base
    assert key(enable_thinking=False) != base
    assert key(sample_index=1) != base


def test_records_round_trip_across_runs_in_one_segment_per_run(tmp_path):
    with Journal(tmp_path) as journal:
        for i in range(10):
            journal.append(key(sample_index=i), record(i))
        assert journal.get(key(sample_index=3)) == record(3)  # readable before the flush
        journal.flush()
        assert journal.get(key(sample_index=3)) == record(3)
    with Journal(tmp_path) as journal:
        assert len(journal) == journal.loaded_records == 10
        assert [journal.get(key(sample_index=i)) for i in range(10)] == [record(i) for i in range(10)]
        assert journal.get(key(sample_index=99)) is None
        journal.append(key(sample_index=10), record(10))
    assert len(segments(tmp_path)) == 2
    # Every segment is a plain zstd stream: standard tools read it.
    text = zstandard.ZstdDecompressor().stream_reader(segments(tmp_path)[0].open("rb"),
                                                      read_across_frames=True).read()
    assert text.count(b"\n") == 10


def test_a_run_that_writes_nothing_leaves_no_segment(tmp_path):
    with Journal(tmp_path):
        pass
    assert segments(tmp_path) == []


def test_duplicate_keys_are_stored_once(tmp_path):
    with Journal(tmp_path) as journal:
        journal.append(key(), record(1))
        journal.append(key(), record(2))
        journal.flush()
        journal.append(key(), record(3))
    with Journal(tmp_path) as journal:
        assert len(journal) == 1 and journal.loaded_records == 1
        assert journal.get(key()) == record(1)


@pytest.mark.parametrize("cut", [1, 7, 12, 20, -3])
def test_a_torn_final_frame_is_ignored_and_the_next_run_starts_a_new_segment(tmp_path, cut):
    with Journal(tmp_path) as journal:
        for batch in range(3):
            for i in range(5):
                journal.append(key(sample_index=batch * 5 + i), record(i))
            journal.flush()
    first = segments(tmp_path)[0]
    intact = first.read_bytes()
    with Journal(tmp_path) as journal:  # a fourth batch, torn by SIGKILL in the middle of its write
        journal.append(key(sample_index=15), record(15))
    fourth = segments(tmp_path)[1].read_bytes()
    segments(tmp_path)[1].unlink()
    torn = intact + fourth[:cut if cut > 0 else len(fourth) + cut]
    first.write_bytes(torn)

    with Journal(tmp_path) as journal:
        assert journal.loaded_records == 15 and journal.ignored_tail_bytes == len(torn) - len(intact)
        assert journal.get(key(sample_index=14)) == record(4)
        journal.append(key(sample_index=15), record(15))
    assert first.read_bytes() == torn  # never appended after garbage
    with Journal(tmp_path) as journal:
        assert len(journal) == 16 and journal.get(key(sample_index=15)) == record(15)


def test_garbage_inside_a_frame_is_treated_as_the_tail(tmp_path):
    with Journal(tmp_path) as journal:
        journal.append(key(sample_index=0), record(0))
        journal.flush()
        journal.append(key(sample_index=1), record(1))
    path = segments(tmp_path)[0]
    data = bytearray(path.read_bytes())
    data[-6] ^= 0xFF  # corrupt the last frame's body: its checksum no longer matches
    path.write_bytes(bytes(data))
    with Journal(tmp_path) as journal:
        assert journal.loaded_records == 1 and journal.get(key(sample_index=0)) == record(0)


def test_short_writes_are_continued_and_every_record_kept(tmp_path, monkeypatch):
    """A write that takes only part of the bytes (what a nearly full disk or a signal does) is continued:
    nothing is lost, and the journal reads back whole."""
    import corpus_builder.generate.journal as journal_module

    real_write = journal_module.os.write
    monkeypatch.setattr(journal_module.os, "write", lambda fd, data: real_write(fd, data[:max(1, len(data) // 3)]))
    with Journal(tmp_path) as journal:
        for i in range(178):
            journal.append(key(sample_index=i), record(i))
            if i % 20 == 19:
                journal.flush()
        journal.flush()
    monkeypatch.undo()
    with Journal(tmp_path) as journal:
        assert len(journal) == 178 and journal.ignored_tail_bytes == 0
        assert all(journal.get(key(sample_index=i)) == record(i) for i in range(178))


def test_a_full_disk_stops_the_run_and_leaves_the_journal_valid(tmp_path, monkeypatch):
    import errno

    import corpus_builder.generate.journal as journal_module

    real_write = journal_module.os.write
    writes = {"count": 0}

    def filling_disk(fd, data):  # the third frame finds the disk full half way through
        writes["count"] += 1
        if writes["count"] == 3:
            real_write(fd, data[:len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(journal_module.os, "write", filling_disk)
    with Journal(tmp_path) as journal:
        for batch in range(2):
            for i in range(batch * 10, batch * 10 + 10):
                journal.append(key(sample_index=i), record(i))
            journal.flush()
        for i in range(20, 30):
            journal.append(key(sample_index=i), record(i))
        with pytest.raises(CorpusError, match="cannot write the journal: No space left on device"):
            journal.flush()
    monkeypatch.undo()
    with Journal(tmp_path) as journal:
        assert len(journal) == 20 and journal.ignored_tail_bytes == 0  # cut back to the last whole frame
        assert journal.get(key(sample_index=19)) == record(19) and journal.get(key(sample_index=20)) is None


def test_a_second_run_on_the_same_journal_is_refused(tmp_path):
    with Journal(tmp_path), pytest.raises(CorpusError, match="in use by another run"):
        Journal(tmp_path).open()


def test_big_batches_are_split_into_several_frames_and_read_back(tmp_path):
    big = {"token_ids": list(range(60_000))}
    with Journal(tmp_path) as journal:
        for i in range(6):
            journal.append(key(sample_index=i), {**big, "i": i})
    with Journal(tmp_path) as journal:
        assert [journal.get(key(sample_index=i))["i"] for i in range(6)] == list(range(6))
        assert len(set(journal._index.values())) > 1


@pytest.fixture
def server():
    with FaultServer(model=MODEL) as fault_server:
        yield fault_server


def test_keys_do_not_depend_on_input_order(server, tmp_path):
    prompts = make_prompts(6, turns=2)
    recipe = make_recipe(MODEL)
    forward = list(generate(prompts, recipe, tmp_path / "a", endpoints=[server.base_url]))
    list(generate(reversed(prompts), recipe, tmp_path / "b", endpoints=[server.base_url]))
    with Journal(tmp_path / "a") as a, Journal(tmp_path / "b") as b:
        assert set(a._index) == set(b._index) and len(a) == 12
    requests = len(server.chat_requests)
    backward = list(generate(reversed(prompts), recipe, tmp_path / "a", endpoints=[server.base_url]))
    assert len(server.chat_requests) == requests  # every turn found whatever the order
    assert [r.to_row() for r in reversed(backward)] == [r.to_row() for r in forward]


def test_resume_asks_only_for_what_is_missing_and_never_duplicates(server, tmp_path):
    # More rows than the scheduler admits ahead of the consumer, so some are never started however fast
    # the server answers: taking 4 rows journals at most the turns of 3 + window rows.
    prompts, window = make_prompts(80, turns=2), 64
    recipe = make_recipe(MODEL)
    rows = generate(prompts, recipe, tmp_path, endpoints=[server.base_url], window=window)
    first = [next(rows) for _ in range(4)]
    rows.close()  # the consumer stops early: what finished is journaled, what was in flight is not
    with Journal(tmp_path) as journal:
        cached = len(journal)
    assert 8 <= cached <= 2 * (3 + window)
    # A server of its own for the rerun: a request cancelled by close() may still reach the first one late.
    with FaultServer(model=MODEL) as rerun_server:
        again = list(generate(prompts, recipe, tmp_path, endpoints=[rerun_server.base_url], window=window))
        assert len(rerun_server.chat_requests) == 160 - cached
    ids = [r.id for r in again]
    assert ids == [p.id for p in prompts] and len(set(ids)) == 80
    assert [r.to_row() for r in again[:4]] == [r.to_row() for r in first]
    with Journal(tmp_path) as journal:
        assert len(journal) == journal.loaded_records == 160

