"""Exact and near-duplicate detection on real conversations with planted copies whose pairs are known."""

from __future__ import annotations

import gc
import json
import math
import mmap
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from corpus_builder.records import Conversation, Message
from corpus_builder.screen import near_dedup, normalise
from corpus_builder.screen.near_dedup import Duplicate, ExactDuplicates, NearDuplicates, Signatures, band_layout
from corpus_builder.screen.normalise import WordRuns, conversation_text, normalise_text, normalise_texts
from tests.support.fuzz import fuzz_settings
from tests.support.real_data import write_chitchat

REPOSITORY = Path(__file__).resolve().parents[2]


def chitchat(tmp_path: Path, count: int, min_words: int = 100) -> list[Conversation]:
    """Real conversations of at least ``min_words`` words (a one-word edit keeps them near-duplicates)."""
    rows = write_chitchat(tmp_path / "chitchat.jsonl", 600)
    conversations = [Conversation(row["id"], "chitchat", "replay",
                                  [Message(m["role"], m["content"]) for m in row["messages"]]) for row in rows]
    long = [c for c in conversations if len(conversation_text(c).split()) >= min_words]
    assert len(long) >= count
    return long[:count]


def copy_of(original: Conversation, source: str, index: int, transform: str) -> Conversation:
    """A planted copy: ``"renormalised"`` (other case, punctuation, whitespace: an exact duplicate after
    normalisation) or ``"edited"`` (one word of the longest turn replaced: a near duplicate)."""
    messages = [Message(m.role, m.content, m.reasoning) for m in original.messages]
    if transform == "renormalised":
        for message in messages:
            message.content = "  " + message.content.upper().replace(" ", " ,  ") + " ?!\n"
    else:
        longest = max(messages, key=lambda m: len(m.content.split()))
        words = longest.content.split()
        words[len(words) // 2] = "zebra"
        longest.content = " ".join(words)
    return Conversation(f"{source}-{index}", source, "replay", messages)


def shingle_jaccard(first: str, second: str) -> float:
    hashes, offsets = WordRuns(normalise_texts([first, second])).hashes(5, whole_if_shorter=True)
    a, b = set(hashes[:offsets[1]].tolist()), set(hashes[offsets[1]:].tolist())
    return len(a & b) / len(a | b)


def decide(index: ExactDuplicates, rows: list[Conversation], batch: int) -> dict[str, Duplicate]:
    """Offer rows in order, ``batch`` at a time; the duplicates found, by key."""
    found: dict[str, Duplicate] = {}
    for start in range(0, len(rows), batch):
        part = rows[start:start + batch]
        for row, decision in zip(part, index.offer([r.id for r in part], [conversation_text(r) for r in part]),
                                 strict=True):
            if decision is not None:
                found[row.id] = decision
    return found


@pytest.fixture()
def planted(tmp_path: Path) -> tuple[list[Conversation], dict[str, Duplicate]]:
    """Three sources in priority order: workload and chat are real conversations, mirror holds renormalised
    copies of ten workload rows and edited copies of ten chat rows; the pairs are the expected answer."""
    base = chitchat(tmp_path, 120)
    workload = [Conversation(f"workload-{i}", "workload", "replay", c.messages) for i, c in enumerate(base[:60])]
    chat = [Conversation(f"chat-{i}", "chat", "replay", c.messages) for i, c in enumerate(base[60:])]
    mirror = [copy_of(workload[i * 3], "mirror", i, "renormalised") for i in range(10)]
    mirror += [copy_of(chat[i * 5], "mirror", 10 + i, "edited") for i in range(10)]
    random.Random(0).shuffle(mirror)
    expected = {f"mirror-{i}": Duplicate(f"workload-{i * 3}", "exact") for i in range(10)}
    expected |= {f"mirror-{10 + i}": Duplicate(f"chat-{i * 5}", "near") for i in range(10)}
    return workload + chat + mirror, expected


def test_planted_duplicates_across_sources_are_found_with_their_originals(
        planted: tuple[list[Conversation], dict[str, Duplicate]]) -> None:
    rows, expected = planted
    by_id = {row.id: row for row in rows}
    for copy, duplicate in expected.items():
        similarity = shingle_jaccard(conversation_text(by_id[copy]), conversation_text(by_id[duplicate.of]))
        assert similarity >= (1.0 if duplicate.rule == "exact" else 0.85), (copy, similarity)
    index = NearDuplicates()
    assert decide(index, rows, batch=len(rows)) == expected  # every planted pair, and nothing else
    assert len(index) == len(rows)  # every row offered is indexed, kept or not


def test_answers_do_not_depend_on_batches_chunks_or_runs(planted: tuple[list[Conversation], dict[str, Duplicate]],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    rows, expected = planted
    assert decide(NearDuplicates(), rows, batch=1) == expected
    assert decide(NearDuplicates(), rows, batch=7) == expected
    monkeypatch.setattr(normalise, "CHUNK_BYTES", 500)  # many chunks inside one batch
    assert decide(NearDuplicates(), rows, batch=len(rows)) == expected
    monkeypatch.setattr(near_dedup, "RUN_ENTRIES", 64)  # many capped runs in every table
    assert decide(NearDuplicates(), rows, batch=3) == expected


def test_the_first_offered_is_kept(planted: tuple[list[Conversation], dict[str, Duplicate]]) -> None:
    """Offered mirror first (the caller's source priority), the originals are the duplicates."""
    rows, expected = planted
    mirror_first = [r for r in rows if r.source == "mirror"] + [r for r in rows if r.source != "mirror"]
    reversed_pairs = {duplicate.of: Duplicate(copy, duplicate.rule) for copy, duplicate in expected.items()}
    assert decide(NearDuplicates(), mirror_first, batch=len(rows)) == reversed_pairs


def test_a_copy_of_a_dropped_row_is_matched_to_it_as_the_first_row_of_its_text(tmp_path: Path) -> None:
    """The order-free rule: the first row of a text is its head whether it is kept or not."""
    original, = chitchat(tmp_path, 1)
    near = copy_of(original, "b", 0, "edited")
    again = copy_of(near, "c", 0, "renormalised")  # exact copy of a row that is not kept
    for batch in (1, 2, 3):
        found = decide(NearDuplicates(), [original, near, again], batch=batch)
        assert found == {"b-0": Duplicate(original.id, "near"), "c-0": Duplicate(near.id, "exact")}


def test_exact_rule_alone_ignores_near_copies(planted: tuple[list[Conversation], dict[str, Duplicate]]) -> None:
    rows, expected = planted
    exact_only = {copy: duplicate for copy, duplicate in expected.items() if duplicate.rule == "exact"}
    assert decide(ExactDuplicates(), rows, batch=50) == exact_only


def test_threshold() -> None:
    """A pair of known shingle similarity is flagged at thresholds well below it, and kept above."""
    vocabulary = [f"w{i}" for i in range(5000)]
    rng = random.Random(1)
    original = rng.sample(vocabulary, 400)

    def edited(share: float) -> str:
        words = list(original)
        for position in rng.sample(range(len(words)), round(share * len(words))):
            words[position] = rng.choice(vocabulary)
        return " ".join(words)

    close, far = edited(0.005), edited(0.1)
    text = " ".join(original)
    assert shingle_jaccard(text, close) > 0.9
    assert 0.4 < shingle_jaccard(text, far) < 0.55
    for threshold, flagged in [(0.9, {"close"}), (0.8, {"close"}), (0.3, {"close", "far"})]:
        index = NearDuplicates(threshold)
        decisions = index.offer(["original", "close", "far"], [text, close, far])
        assert {key for key, d in zip(["original", "close", "far"], decisions, strict=True) if d} == flagged
    with pytest.raises(ValueError, match="threshold"):
        NearDuplicates(0.0)


def test_settings_default_as_documented_and_out_of_range_ones_are_refused() -> None:
    index = NearDuplicates()
    assert (index.threshold, index.num_perm, index.shingle, index.seed) == (0.8, 64, 5, 0)
    assert (index.bands, index.rows_per_band) == band_layout(0.8, 64)
    assert NearDuplicates(0.7).threshold == 0.7
    for threshold in (0.0, -0.5, 1.0001, 1.5):
        with pytest.raises(ValueError, match=rf"threshold must be in \(0, 1\], not {threshold}"):
            NearDuplicates(threshold)
    with pytest.raises(ValueError, match="shingle must be at least one word, not 0"):
        NearDuplicates(shingle=0)


def test_threshold_one_flags_only_the_same_shingle_set() -> None:
    """At 1.0 (one band of every value) a text of the same shingle set (five words three times, not twice) is a
    near duplicate, a one-word edit is not."""
    words = "alpha beta gamma delta epsilon"
    index = NearDuplicates(1.0)
    decisions = index.offer(["twice", "thrice", "edited"], [f"{words} {words}", f"{words} {words} {words}",
                                                          f"{words} {words} zeta"])
    assert decisions == [None, Duplicate("twice", "near"), None]


def test_related_rows_are_kept() -> None:
    """Pairs at about half the threshold's similarity share a band now and then (LSH alone flags ~15% of
    them); the sketch confirmation keeps them apart, while near copies are all still found."""
    rng = random.Random(3)
    vocabulary = [f"w{i}" for i in range(20000)]
    keys, texts, similarities = [], [], []
    for pair in range(300):
        words = rng.sample(vocabulary, 300)
        related = list(words)
        for position in rng.sample(range(300), 30):
            related[position] = rng.choice(vocabulary)
        keys += [f"a{pair}", f"b{pair}"]
        texts += [" ".join(words), " ".join(related)]
        similarities.append(shingle_jaccard(texts[-2], texts[-1]))
    assert max(similarities) < 0.6
    assert sum(decision is not None for decision in NearDuplicates().offer(keys, texts)) <= 3


def test_band_layout_keeps_pairs_at_the_threshold() -> None:
    assert band_layout(0.8, 64) == (10, 6)
    bands, rows = band_layout(0.9, 128)
    assert 1.0 - (1.0 - 0.9**rows) ** bands >= 0.95 > 1.0 - (1.0 - 0.9 ** (rows + 1)) ** (128 // (rows + 1))


def test_same_answers_in_another_process(planted: tuple[list[Conversation], dict[str, Duplicate]],
                                         tmp_path: Path) -> None:
    """Nothing depends on Python's per-process string hashing or on memory layout."""
    rows, expected = planted
    data = tmp_path / "rows.json"
    data.write_text(json.dumps([[r.id, conversation_text(r)] for r in rows]))
    script = ("import json, sys\nfrom corpus_builder.screen.near_dedup import NearDuplicates\n"
              "rows = json.load(open(sys.argv[1]))\n"
              "found = NearDuplicates().offer([k for k, _ in rows], [t for _, t in rows])\n"
              "print(json.dumps([[d.of, d.rule] if d else None for d in found]))\n")
    outputs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        run = subprocess.run([sys.executable, "-c", script, str(data)], capture_output=True, text=True, env=env,
                             cwd=REPOSITORY, check=True)
        outputs.append(json.loads(run.stdout))
    assert outputs[0] == outputs[1] == [[expected[r.id].of, expected[r.id].rule] if r.id in expected else None
                                        for r in rows]


def test_signatures_computed_in_another_process_are_the_ones_compared_here(tmp_path: Path) -> None:
    """The processes that read rows hash them (``signatures``) for the index that decides them."""
    texts = ["the quick brown fox jumps over the lazy dog", "a b", "", "one two three four five six seven"]
    script = ("import json, sys\nfrom corpus_builder.screen.near_dedup import NearDuplicates\n"
              "signatures = NearDuplicates().signatures(json.loads(sys.argv[1]))\n"
              "print(json.dumps([signatures.hashes.tolist(), signatures.present.tolist(), "
              "signatures.sketches.tolist()]))\n")
    here = NearDuplicates().signatures(texts)
    for hash_seed in ("1", "2"):
        run = subprocess.run([sys.executable, "-c", script, json.dumps(texts)], capture_output=True, text=True,
                             env={**os.environ, "PYTHONHASHSEED": hash_seed}, cwd=REPOSITORY, check=True)
        assert json.loads(run.stdout) == [here.hashes.tolist(), here.present.tolist(), here.sketches.tolist()]


@pytest.mark.parametrize(("text", "normalised"), [
    ("  Hello,   World!\n\tHow are you?  ", "hello world how are you"),
    ("What is 2+2?", "what is 2+2"),
    ("2-2 = 0; (a*b)/c", "2-2 = 0 a*b /c"),
    ("\"Quoted\" [brackets] {braces} `code`", "quoted brackets braces code"),
    ("Ｆｕｌｌｗｉｄｔｈ！", "fullwidth"),  # NFKC
    ("em\u2014dash \u201cquotes\u201d\u3002", "em-dash quotes"),
    ("Ünïcode\u00a0space\u2028line", "ünïcode space line"),
    ("", ""),
    (" \n\t ", ""),
    ("a\x00b", "a b"),  # a NUL in a text cannot split it in a batch
    ("@AZ[\\]^_`az{|}~\x7f\x1f!", "@az \\ ^_ az | ~"),  # edges: letters, dropped punctuation, controls
])
def test_normalisation(text: str, normalised: str) -> None:
    assert normalise_text(text) == normalised
    assert normalise_texts(["first", text, "last"]).text(1).decode() == normalised


def test_word_runs_hash_alike_wherever_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    """A text's shingle hashes do not depend on its neighbours in a batch, nor on whether it is longer than
    the power tables kept between batches."""
    text = "the quick brown fox jumps over the lazy dog " * 20

    def hashes(texts: list[str], index: int) -> list[int]:
        found, offsets = WordRuns(normalise_texts(texts)).hashes(5, whole_if_shorter=True)
        return found[offsets[index]:offsets[index + 1]].tolist()

    alone = hashes([text], 0)
    assert hashes(["some other words first", "and more", text], 2) == alone
    monkeypatch.setattr(normalise, "_POWERS", normalise._Powers())
    monkeypatch.setattr(normalise._Powers, "KEPT", 64)
    assert hashes([text], 0) == alone
    assert hashes(["a b c d e f"], 0) == hashes(["x y", "a b c d e f"], 1)


def test_conversation_text_all_turns_or_prompts() -> None:
    conversation = Conversation("c", "s", "generated", [
        Message("system", "Be brief."), Message("user", "Hi?"), Message("assistant", "Hello.", "The user greets."),
    ])
    assert conversation_text(conversation) == "Be brief.\nHi?\nThe user greets.\nHello."
    assert conversation_text(conversation, "prompt") == "Be brief.\nHi?"


def test_prompt_dedup_compares_prompts_only() -> None:
    """Dedup before generation: the same prompt with other old answers is a duplicate prompt."""
    first = Conversation("a", "s", "replay", [Message("user", "Tell me about whales."), Message("assistant", "Big.")])
    second = Conversation("b", "s", "replay", [Message("user", "tell me about whales"), Message("assistant", "Wet.")])
    by_prompt = NearDuplicates().offer(["a", "b"], [conversation_text(c, "prompt") for c in (first, second)])
    by_all = NearDuplicates().offer(["a", "b"], [conversation_text(c) for c in (first, second)])
    assert by_prompt == [None, Duplicate("a", "exact")]
    assert by_all == [None, None]


def test_short_and_empty_texts() -> None:
    found = NearDuplicates().offer(["a", "b", "c", "d", "e"], ["Hi!", "hi", "hello", "", "..."])
    assert found == [None, Duplicate("a", "exact"), None, None, Duplicate("d", "exact")]


def test_state_is_bytes_not_python_objects() -> None:
    """Kept rows cost bytes in arrays: offering thousands more rows leaves the count of objects the
    collector tracks where it was."""
    rng = random.Random(2)
    index = NearDuplicates()

    def rows(start: int, count: int) -> tuple[list[str], list[str]]:
        return ([f"row-{i}" for i in range(start, start + count)],
                [" ".join(f"w{rng.randrange(100000)}" for _ in range(60)) for _ in range(count)])

    index.offer(*rows(0, 2000))
    gc.collect()
    before, state_before = len(gc.get_objects()), index.nbytes
    index.offer(*rows(2000, 6000))
    gc.collect()
    assert len(index) == 8000
    assert len(gc.get_objects()) - before < 200
    assert 100 < (index.nbytes - state_before) / 6000 < 250  # bytes per row


def test_offer_needs_one_key_per_text() -> None:
    with pytest.raises(ValueError, match="2 keys for 1 texts"):
        NearDuplicates().offer(["a", "b"], ["text"])


# Planted signatures, for the rules of decide apart from MinHash's chances. A text is (its exact hash, its
# hash of each band or None when it has no words, the value of every field of its sketch): texts of one
# sketch value are confirmed against each other through any band they share, texts of two are not.
Planted = tuple[int, tuple[int, ...] | None, int]


def planted_signatures(index: NearDuplicates, texts: list[Planted]) -> Signatures:
    hashes = np.zeros((len(texts), 1 + index.bands), dtype=np.uint64)
    present = np.ones(hashes.shape, dtype=bool)
    for row, (exact, bands, _) in enumerate(texts):
        hashes[row, 0] = exact
        # the band's number in the high bits too: hashes differ by band, as the salts make them. A text with
        # no words has the hashes of bands of value 0, which other texts may share: they must be ignored.
        values = bands or (0,) * index.bands
        hashes[row, 1:] = [(value * index.bands + band + 1) << 32 for band, value in enumerate(values)]
        present[row, 1:] = bands is not None
    words = -(-index.num_perm // 16)
    sketches = np.array([[sketch * 0x1111111111111111] * words for _, _, sketch in texts], dtype=np.uint64)
    return Signatures(hashes, present, sketches)


def alone(band: int, value: int, *, row: int, bands: int = 10) -> tuple[int, ...]:
    """Band hashes of a text that shares band ``band`` (its value ``value``) and no other."""
    return tuple(value if b == band else 1000 + 10 * row + b for b in range(bands))


def decide_in_batches(texts: list[Planted], batches: list[int], *, threshold: float = 0.8,
                      sketches: list[list[int]] | None = None) -> list[Duplicate | None]:
    """Decisions for the planted texts offered in order (keys t0, t1, ...), in batches of the given sizes; with
    ``sketches``, the texts' sketch words are those."""
    index = NearDuplicates(threshold)
    signatures = planted_signatures(index, texts)
    if sketches is not None:
        signatures = Signatures(signatures.hashes, signatures.present, np.array(sketches, dtype=np.uint64))
    decisions: list[Duplicate | None] = []
    for size in batches:
        rows = list(range(len(decisions), len(decisions) + size))
        decisions += index.decide([f"t{row}" for row in rows], signatures.rows(rows))
    return decisions


def test_a_row_near_duplicates_the_earliest_head_it_is_confirmed_against_whatever_the_batches() -> None:
    """t2 shares band 5 with t0 and band 1 with t1 (t0 and t1 share none) and is confirmed against both."""
    texts: list[Planted] = [(1, alone(5, 7, row=0), 0), (2, alone(1, 8, row=1), 0),
                            (3, tuple(7 if b == 5 else 8 if b == 1 else 2000 + b for b in range(10)), 0)]
    expected = [None, None, Duplicate("t0", "near")]
    for batches in ([3], [1, 1, 1], [2, 1], [1, 2]):
        assert decide_in_batches(texts, batches) == expected, batches


def test_a_band_hash_is_owned_by_the_first_row_that_has_it() -> None:
    """t0 and t1 are kept with band 5 alike (not confirmed: other sketches); t2 has t1's sketch and t3 t0's,
    and band 5 alike: only the owner of the hash, t0, is compared, so t2 is kept and t3 near-duplicates t0."""
    texts: list[Planted] = [(row + 1, alone(5, 7, row=row), sketch) for row, sketch in enumerate([0, 1, 1, 0])]
    expected = [None, None, None, Duplicate("t0", "near")]
    for batches in ([4], [1, 1, 1, 1], [2, 2], [3, 1], [1, 3]):
        assert decide_in_batches(texts, batches) == expected, batches


def first_seen(texts: list[Planted]) -> list[Duplicate | None]:
    """The order-free rules, from the whole set of rows: each hash's head is the first row that has it; a row is
    an exact duplicate of the head of its exact hash, another row, else a near duplicate of the earliest head,
    another row, of one of its band hashes it is confirmed against (the same sketch); else kept."""
    heads: dict[tuple[int, int], int] = {}
    for row, (exact, bands, _) in enumerate(texts):
        for column in [(0, exact), *((1 + band, value) for band, value in enumerate(bands or ()))]:
            heads.setdefault(column, row)
    decisions: list[Duplicate | None] = []
    for row, (exact, bands, sketch) in enumerate(texts):
        if heads[0, exact] != row:
            decisions.append(Duplicate(f"t{heads[0, exact]}", "exact"))
            continue
        confirmed = [head for band, value in enumerate(bands or ()) if (head := heads[1 + band, value]) != row
                     and texts[head][2] == sketch]
        decisions.append(Duplicate(f"t{min(confirmed)}", "near") if confirmed else None)
    return decisions


@st.composite
def planted_rows(draw: st.DrawFn) -> tuple[list[Planted], list[int]]:
    """Rows of a few distinct texts (a text repeated is an exact copy) that may share their first three bands
    (of two values each; the other bands are the text's alone), of two sketches; and the batches they are
    offered in."""
    distinct: list[Planted] = []
    for text in range(draw(st.integers(1, 6))):
        values = draw(st.lists(st.integers(0, 2), min_size=3, max_size=3))
        bands = None if draw(st.integers(0, 7)) == 0 else tuple(
            values[band] if band < 3 and values[band] < 2 else 1000 + 10 * text + band for band in range(10))
        distinct.append((text + 1, bands, draw(st.integers(0, 3)) // 3))
    rows = [distinct[i] for i in draw(st.lists(st.integers(0, len(distinct) - 1), min_size=1, max_size=10))]
    batches: list[int] = []
    while sum(batches) < len(rows):
        batches.append(min(draw(st.integers(1, 3)), len(rows) - sum(batches)))
    return rows, batches


@given(planted_rows())
@fuzz_settings(200)
def test_decisions_follow_the_order_free_rules_in_any_batches(case: tuple[list[Planted], list[int]]) -> None:
    texts, batches = case
    assert decide_in_batches(texts, batches) == first_seen(texts)


def test_signatures_of_no_texts_and_of_rows_picked_or_replaced() -> None:
    """Signatures cross from the reading processes: none for no texts, a row's the same wherever it is picked
    from or put, and of the same types, so that parts concatenate."""
    index = NearDuplicates()
    texts = ["one two three four five six", "seven eight nine ten eleven", "twelve thirteen"]
    full, empty = index.signatures(texts), index.signatures([])
    assert len(empty) == 0 and index.decide([], empty) == []
    replaced = full.replaced([1], index.signatures(["other words"]))
    for got, wanted in ((Signatures.concat([empty, full]), full), (full.rows([]), empty),
                        (full.replaced([], empty), full), (full.rows([2, 0]), index.signatures([texts[2], texts[0]])),
                        (replaced, index.signatures([texts[0], "other words", texts[2]]))):
        for part in ("hashes", "present", "sketches"):
            assert getattr(got, part).dtype == getattr(wanted, part).dtype
            assert np.array_equal(getattr(got, part), getattr(wanted, part)), part
    assert np.array_equal(full.hashes[1], index.signatures([texts[1]]).hashes[0])  # replaced a copy only
    exact = ExactDuplicates().signatures([])
    assert (exact.hashes.shape, exact.present.shape, exact.sketches.shape) == ((0, 1), (0, 1), (0, 0))
    some = Signatures.concat([exact, ExactDuplicates().signatures(texts)])
    assert (some.hashes.shape, some.present.shape, some.sketches.shape) == ((3, 1), (3, 1), (3, 0))
    assert (some.hashes.dtype, some.present.dtype, some.sketches.dtype) == (np.uint64, np.bool_, np.uint64)
    assert (empty.hashes.shape, empty.sketches.shape) == ((0, 1 + index.bands), (0, 4))


def test_a_first_batch_with_no_words_hashes_to_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The power tables as a process starts them serve a batch of no bytes at all."""
    monkeypatch.setattr(normalise, "_POWERS", normalise._Powers())
    hashes, offsets = WordRuns(normalise_texts([""])).hashes(5, whole_if_shorter=True)
    assert len(hashes) == 0 and offsets.tolist() == [0, 0]


@given(lengths=st.lists(st.integers(0, 30), max_size=20), chunk=st.integers(1, 40))
@fuzz_settings(150)
def test_texts_are_chunked_in_order_until_a_chunk_reaches_chunk_bytes(lengths: list[int], chunk: int) -> None:
    texts = ["x" * length for length in lengths]
    original = normalise.CHUNK_BYTES
    normalise.CHUNK_BYTES = chunk
    try:
        slices = list(normalise.text_chunks(texts))
    finally:
        normalise.CHUNK_BYTES = original
    assert [i for part in slices for i in range(len(texts))[part]] == list(range(len(texts)))
    for position, part in enumerate(slices):
        sizes = lengths[part]
        assert sizes and sum(sizes[:-1]) < chunk  # at least one text; none added once the chunk is full
        assert position == len(slices) - 1 or sum(sizes) >= chunk  # only the last chunk is short


@pytest.mark.parametrize("num_perm", [48, 64, 128])
def test_a_near_copy_of_a_row_kept_in_an_earlier_batch_is_found_with_any_sketch_width(num_perm: int) -> None:
    """48 permutations make 24-byte sketches, which do not tile a memory page: the kept ones are still read."""
    rng = random.Random(num_perm)
    words = [f"w{rng.randrange(10**6)}" for _ in range(300)]
    index = NearDuplicates(num_perm=num_perm)
    index.offer([f"k{i}" for i in range(3)], [" ".join(rng.sample(words, 200)) for _ in range(3)])
    index.offer(["original"], [" ".join(words)])
    words[150] = "zebra"
    assert index.offer(["copy"], [" ".join(words)]) == [Duplicate("original", "near")]


def test_a_text_with_no_words_owns_no_band_hash() -> None:
    """A kept row with no words holds no band hash, whatever the hashes its signature carries."""
    texts: list[Planted] = [(1, None, 0), (2, alone(5, 0, row=1), 0)]
    assert decide_in_batches(texts, [1, 1]) == [None, None]


def test_a_band_hash_stays_with_its_first_owner_when_a_later_row_has_it_too() -> None:
    """t30 shares t0's band 5 and is kept (another sketch), in a run of its own beside the first batch's: t31,
    of t0's sketch, is still compared with t0, the hash's owner."""
    texts: list[Planted] = [(1, alone(5, 7, row=0), 0), *((row + 1, alone(5, 100 + row, row=row), 1)
                                                          for row in range(1, 30)),
                            (31, alone(5, 7, row=30), 1), (32, alone(5, 7, row=31), 0)]
    assert decide_in_batches(texts, [30, 1, 1]) == [None] * 31 + [Duplicate("t0", "near")] == first_seen(texts)


def test_exact_hashes_compare_in_all_64_bits_however_the_runs_merge() -> None:
    index = ExactDuplicates()

    def decide(key: str, exact: int) -> list[Duplicate | None]:
        return index.decide([key], Signatures(np.array([[exact]], dtype=np.uint64), np.ones((1, 1), dtype=bool),
                                              np.zeros((1, 0), dtype=np.uint64)))

    top = (1 << 64) - 1024  # it and its neighbours round to one float64
    assert decide("a", top) == decide("b", top + 2) == [None]  # the two runs merge
    assert decide("c", top + 1) == [None]
    assert decide("d", top + 2) == [Duplicate("b", "exact")]


def test_state_bytes_are_the_documented_ones() -> None:
    """Per row offered: 12 bytes of exact hash and row, 8 bytes a band hash no row held before, and the sketch's
    8-byte words (the keys and their ends are in files); before and after the tables' runs merge. A key is read
    back whole (non-ASCII too) to name the row a duplicate duplicates."""
    index = NearDuplicates()
    words = -(-index.num_perm // 16)
    texts: list[Planted] = [(row + 1, alone(5, 7 if row < 2 else 100 + row, row=row), row % 2) for row in range(8)]
    keys = [f"clé-{row}" for row in range(8)]
    signatures = planted_signatures(index, texts)
    for kept in (4, 8):
        assert index.decide(keys[kept - 4:kept], signatures.rows(list(range(kept - 4, kept)))) == [None] * 4
        held_bands = index.bands * kept - 1  # t0 and t1 share band 5: its hash is held once
        assert index.nbytes == 12 * kept + 8 * held_bands + 8 * words * kept
    exact = ExactDuplicates()
    exact.offer(keys, [f"text {row}" for row in range(8)])
    assert exact.nbytes == 12 * 8
    assert exact.offer(["copy", "new"], ["text 3", "text 8"]) == [Duplicate("clé-3", "exact"), None]


def test_a_duplicate_names_its_row_whichever_call_offered_it() -> None:
    """The keys read back from their files: the first key, the last, keys of every length (none empty, non-ASCII)
    offered over many calls; each copy names the row of its text."""
    index = ExactDuplicates()
    keys = [f"{'é' * (row % 7)}k{row}" + "x" * (row % 300) for row in range(3000)]
    for start in range(0, 3000, 250):
        assert index.offer(keys[start:start + 250], [f"text {row}" for row in range(start, start + 250)]) \
            == [None] * 250
    rows = [0, 1, 249, 250, 1234, 2999]
    assert index.offer([f"copy {row}" for row in rows], [f"text {row}" for row in rows]) \
        == [Duplicate(keys[row], "exact") for row in rows]
    assert len(index) == 3000 + len(rows)


def packed(fields: list[int]) -> list[int]:
    """Sketch words of 4-bit values, 16 to a word from its lowest bits."""
    return [sum(value << 4 * i for i, value in enumerate(fields[start:start + 16]))
            for start in range(0, len(fields), 16)]


@pytest.mark.parametrize("threshold", [0.5, 0.7, 0.8, 0.9])
@pytest.mark.parametrize("difference", [1, 2, 4, 8])
def test_a_candidate_is_confirmed_when_enough_sketch_values_outside_its_band_agree(threshold: float,
                                                                                   difference: int) -> None:
    """The cut is the least count of agreeing sketch values, of those outside the shared band, that a pair at
    the threshold reaches with probability >= 0.99 (each value agrees with probability t + (1 - t) / 16): a
    pair sharing a band is confirmed at the cut and not one below, whichever bit of a value differs, wherever
    the differing values are and whether the earlier row is in the batch or kept before."""
    index = NearDuplicates(threshold)
    rows, num_perm = index.rows_per_band, index.num_perm
    compared = num_perm - rows
    agree = threshold + (1.0 - threshold) / 16

    def reached(least: int) -> float:
        return sum(math.comb(compared, k) * agree**k * (1.0 - agree) ** (compared - k)
                   for k in range(least, compared + 1))

    cut = max(least for least in range(compared + 1) if reached(least) >= 0.99)
    for band in (0, 1, index.bands - 1):
        inside, before = range(band * rows, (band + 1) * rows), range(max(band - 1, 0) * rows, band * rows)
        # the values differing: first the band after it (after the last, the ones no band holds), the band
        # before it last
        outside = [f for f in range(num_perm) if f not in inside and f not in before]
        order = sorted(outside, key=lambda f: (f < (band + 1) * rows, f)) + list(before)
        for differing, expected in ((compared - cut, Duplicate("t0", "near")), (compared - cut + 1, None)):
            fields = [15 if f in inside else 0 for f in range(num_perm)]  # the shared band's are not compared
            for f in order[:differing]:
                fields[f] = difference
            texts: list[Planted] = [(1, alone(band, 7, row=0, bands=index.bands), 0),
                                    (2, alone(band, 7, row=1, bands=index.bands), 0)]
            for batches in ([2], [1, 1]):
                decisions = decide_in_batches(texts, batches, threshold=threshold,
                                              sketches=[packed([0] * num_perm), packed(fields)])
                assert decisions == [None, expected], (band, differing, batches)


class PlantedMinHash:
    """Stands in for rensa: the given MinHash values of each text offered, in order, whatever its shingles."""

    def __init__(self, values: list[list[int]]) -> None:
        self.values = values

    def digest_matrix_from_flat_token_hashes(self, shingles: object, offsets: np.ndarray, num_perm: int,
                                             seed: int) -> PlantedMinHash:
        assert len(offsets) - 1 == len(self.values) and all(len(row) == num_perm for row in self.values)
        return self

    def to_rows(self) -> list[list[int]]:
        return self.values


def with_minhash(monkeypatch: pytest.MonkeyPatch, texts: list[str], values: list[list[int]]
                 ) -> list[Duplicate | None]:
    """Decisions for texts of the given MinHash values (keys t0, t1, ...), the same offered in one batch or one
    row at a time (then every band of every row is looked up among all the kept rows' bands)."""
    keys = [f"t{row}" for row in range(len(texts))]
    index = NearDuplicates()
    monkeypatch.setattr(index, "_minhash", PlantedMinHash(values))
    together = index.offer(keys, texts)
    index = NearDuplicates()
    one_by_one: list[Duplicate | None] = []
    for key, text, row in zip(keys, texts, values, strict=True):
        monkeypatch.setattr(index, "_minhash", PlantedMinHash([row]))
        one_by_one += index.offer([key], [text])
    assert together == one_by_one
    return together


_BASE = random.Random(5).choices(range(1 << 32), k=64)
_FAR = [value ^ 0x10 for value in _BASE]  # other values of the same sketch: no band shared, every sketch value


@pytest.mark.parametrize(("second", "expected"), [
    (_BASE, Duplicate("t0", "near")),
    (_BASE[:6] + _FAR[6:], Duplicate("t0", "near")),  # band 0 shared, the sketch bits of the others agree
    (_BASE[:6] + [value ^ 0x11 for value in _BASE[6:]], None),  # band 0 shared, no sketch value agrees
    (_BASE[1:6] + _BASE[:1] + _FAR[6:], None),  # band 0's values in another order: no band shared
    (_FAR[:18] + _BASE[30:36] + _FAR[24:], None),  # t0's band 5 values in band 3: no band shared
], ids=["same", "one band", "one band, other sketch", "band reordered", "band moved"])
def test_a_band_is_shared_when_its_values_are_in_the_same_band_in_the_same_order(
        monkeypatch: pytest.MonkeyPatch, second: list[int], expected: Duplicate | None) -> None:
    words = "a b c d e f g"
    assert with_minhash(monkeypatch, [words, f"{words} h"], [_BASE, second]) == [None, expected]


def test_every_text_with_a_word_has_a_signature_and_one_with_none_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shorter than a shingle, a text is one; with no words, it is near nothing whatever its MinHash values."""
    texts = ["...", "alpha", "alpha beta gamma delta epsilon zeta"]
    assert with_minhash(monkeypatch, texts, [_BASE] * 3) == [None, None, Duplicate("t1", "near")]


def test_bucket_entries_are_the_tables_keys_of_every_hash_a_row_has() -> None:
    """(row, kind, key, band) per hash a row has, keyed as the index's tables compare them: the exact hash whole
    (kind 0, band -1), a band's hash by its high 32 bits (kind 1, the band's number); a text with no words has its
    exact hash alone. In the dtypes the Ray engine's Arrow columns take. The exact rule alone confirms nothing."""
    index = NearDuplicates()
    signatures = index.signatures(["alpha beta gamma delta epsilon zeta", "...", "one two three"])
    rows, kinds, keys, bands = index.bucket_entries(signatures)
    expected = [(row, int(column > 0), int(hashes[column] >> np.uint64(32)) if column else int(hashes[column]),
                 column - 1) for row, hashes in enumerate(signatures.hashes) for column in range(len(hashes))
                if signatures.present[row, column]]
    assert list(zip(rows.tolist(), kinds.tolist(), keys.tolist(), bands.tolist(), strict=True)) == expected
    assert [row for row, *_ in expected].count(1) == 1  # "...": its exact hash alone
    assert all(key != int(signatures.hashes[row, band + 1]) for row, kind, key, band in expected if kind)
    assert (rows.dtype, kinds.dtype, keys.dtype, bands.dtype) == (np.int64, np.uint8, np.uint64, np.int64)
    with pytest.raises(ValueError, match=r"^the exact rule has no sketches to confirm against$"):
        ExactDuplicates().confirmed(signatures.sketches, signatures.sketches, np.zeros(3, dtype=np.int64))


def test_a_lookup_names_the_indexed_row_a_text_duplicates_and_adds_none() -> None:
    """The eval pack's keep-apart index: a copy names the indexed row exactly, a near copy by its head, another
    text nothing; nothing looked up is added, so a text looked up twice is not a copy of itself."""
    base = " ".join(f"word{i}" for i in range(60))
    other = "a different text altogether with words of its own"
    index = NearDuplicates()
    index.offer(["kept", "other"], [base, other])  # rows 0 and 1
    texts = [base, base.replace("word30", "changed"), "nothing like the indexed rows at all", other]
    assert index.lookup(index.signatures(texts)) == [Duplicate("kept", "exact"), Duplicate("kept", "near"), None,
                                                     Duplicate("other", "exact")]
    assert len(index) == 2 and index.lookup(index.signatures(texts[2:3])) == [None]
    assert index.lookup(index.signatures([])) == []


def decided_by_group_by(texts: list[Planted], partitions: list[list[int]]) -> list[Duplicate | None]:
    """The Ray engine's way (assemble/ray_data.py), in plain dicts: each partition's rows (in any order) give their
    bucket entries; a bucket's head is its least priority; a row's verdict is its exact head, else the least
    near head it is confirmed against, each another row."""
    index = NearDuplicates()
    signatures = planted_signatures(index, texts)
    entries: list[tuple[int, int, int, int]] = []
    for partition in partitions:
        rows, kinds, keys, bands = index.bucket_entries(signatures.rows(partition))
        entries += [(int(kind), int(key), partition[row], int(band))
                    for row, kind, key, band in zip(rows, kinds, keys, bands, strict=True)]
    heads: dict[tuple[int, int], int] = {}
    for kind, key, priority, _ in entries:
        heads[kind, key] = min(heads.get((kind, key), priority), priority)
    verdicts: dict[int, tuple[int, int]] = {}
    for kind, key, priority, band in entries:
        head = heads[kind, key]
        if head == priority or (kind == 1 and not index.confirmed(
                signatures.sketches[[priority]], signatures.sketches[[head]], np.array([band]))[0]):
            continue
        verdicts[priority] = min(verdicts.get(priority, (kind, head)), (kind, head))
    return [Duplicate(f"t{verdicts[row][1]}", "exact" if verdicts[row][0] == 0 else "near")
            if row in verdicts else None for row in range(len(texts))]


@given(planted_rows(), st.randoms(use_true_random=False))
@fuzz_settings(200)
def test_the_group_by_of_any_partitioning_decides_as_the_index_in_any_batches(
        case: tuple[list[Planted], list[int]], rng: random.Random) -> None:
    """The order-free rule cut into independent tasks: rows shuffled, cut into partitions at random."""
    texts, batches = case
    shuffled = list(range(len(texts)))
    rng.shuffle(shuffled)
    cuts = sorted(rng.sample(range(1, len(texts)), rng.randint(0, len(texts) - 1))) if len(texts) > 1 else []
    partitions = [shuffled[start:end] for start, end in zip([0, *cuts], [*cuts, len(texts)], strict=True)]
    assert decided_by_group_by(texts, partitions) == decide_in_batches(texts, batches)


@given(texts=st.lists(st.text(st.sampled_from(["a", "B", " ", "\n", "é", "!"]), max_size=8), max_size=6))
@fuzz_settings(100)
def test_the_exact_hash_is_the_documented_digest_of_the_normalised_text(texts: list[str]) -> None:
    """The 64-bit XXH3 of each normalised text, whichever path hashed it (the row path's texts, the kernels' arrays)."""
    expected = [xxhash.xxh3_64_intdigest(normalise_text(text).encode()) for text in texts]
    assert ExactDuplicates().signatures(texts).hashes[:, 0].tolist() == expected


@pytest.mark.parametrize("rows", [True, False])
def test_runs_merged_in_pages_of_their_own_find_every_hash(rows: bool) -> None:
    """Runs of over a MB merge into an anonymous map of their own, out of malloc's heap; their rows stay theirs."""
    table = near_dedup.FirstSeen(whole_hashes=True, rows=rows)
    hashes = np.random.default_rng(0).integers(0, 1 << 63, size=300_000, dtype=np.int64).view(np.uint64) << np.uint64(1)
    for start in range(0, len(hashes), 100_000):
        table.add_first(hashes[start:start + 100_000], np.arange(start, start + 100_000, dtype=np.uint32))
    [(entries, _)] = table._runs  # merged into one
    assert isinstance(entries.base, memoryview) and isinstance(entries.base.obj, mmap.mmap)
    assert table.find(hashes).tolist() == (list(range(len(hashes))) if rows else [0] * len(hashes))
    assert (table.find(hashes[:1000] | np.uint64(1)) == -1).all()
