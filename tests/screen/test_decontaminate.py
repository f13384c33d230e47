"""Decontamination against evaluation sets: planted contamination in prompts and in responses is found with
the set it comes from, and real conversations are clean."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from corpus_builder.assemble import build_corpus, format_plan, plan_build
from corpus_builder.errors import CorpusError
from corpus_builder.layout import MANIFEST
from corpus_builder.publish.card import render_card
from corpus_builder.publish.gate import CorpusDocuments
from corpus_builder.recipe import load_recipe
from corpus_builder.records import Conversation, Message
from corpus_builder.screen import normalise
from corpus_builder.screen.decontaminate import Contamination, EvalSetSummary
from corpus_builder.screen.normalise import conversation_text
from tests.support.fuzz import fuzz_settings
from tests.support.real_data import write_chitchat, write_gsm8k

# MT-Bench-style prompts: first turns and the short second turns that follow them.
MT_BENCH = [
    "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences "
    "and must-see attractions.",
    "Rewrite your previous response. Start every sentence with the letter A.",
    "Draft a professional email seeking your supervisor's feedback on the 'Quarterly Financial Report' you "
    "prepared.",
    "Take a moment to evaluate and critique your own response.",
    "Hi there.",  # too short to contaminate anything
]


@pytest.fixture()
def gsm8k(tmp_path: Path) -> list[str]:
    """Real grade-school problems with their worked answers, as an evaluation set's texts."""
    return [f"{row['question']}\n{row['answer']}" for row in write_gsm8k(tmp_path / "gsm8k.jsonl", 40, seed=3)]


@pytest.fixture()
def clean(tmp_path: Path) -> list[Conversation]:
    rows = write_chitchat(tmp_path / "chitchat.jsonl", 200)
    return [Conversation(row["id"], "chitchat", "replay", [Message(m["role"], m["content"]) for m in row["messages"]])
            for row in rows]


def test_planted_contamination_in_prompts_and_responses(gsm8k: list[str], clean: list[Conversation]) -> None:
    index = Contamination([("gsm8k", gsm8k), ("mt-bench", MT_BENCH)])
    question, answer = gsm8k[7].split("\n", 1)
    planted = {
        # a prompt quoting a test problem, with other case and punctuation
        "prompt-gsm8k": Conversation("p1", "prompts", "replay", [
            Message("user", "Solve this: " + question.upper().replace(",", " ;")),
            Message("assistant", "Let me think.")]),
        # a generated response reproducing a reference answer in the middle of other text
        "response-gsm8k": Conversation("p2", "prompts", "generated", [
            Message("user", "How much is it?"),
            Message("assistant", "Sure. " + answer.split("\n")[0] + " That is all.", "thinking first")]),
        # an MT-Bench second turn (shorter than 13 words) as a follow-up prompt
        "prompt-mt-bench": Conversation("p3", "prompts", "replay", [
            Message("user", "Tell me a story."), Message("assistant", "Once upon a time."),
            Message("user", "rewrite your previous response: start every sentence with the letter a!"),
            Message("assistant", "A story.")]),
        "both": Conversation("p4", "prompts", "generated", [
            Message("user", MT_BENCH[0]), Message("assistant", question)]),
    }
    expected = {"prompt-gsm8k": ("gsm8k",), "response-gsm8k": ("gsm8k",), "prompt-mt-bench": ("mt-bench",),
                "both": ("gsm8k", "mt-bench")}
    rows = [*clean[:100], *planted.values(), *clean[100:]]
    found = index.matches([conversation_text(row) for row in rows])
    by_id = {row.id: names for row, names in zip(rows, found, strict=True) if names}
    assert by_id == {planted[name].id: names for name, names in expected.items()}
    # Prompts and responses apart, as the build checks them before and after generation.
    assert index.contaminated(conversation_text(planted["response-gsm8k"], "prompt")) == ()
    assert index.contaminated(planted["response-gsm8k"].messages[1].content) == ("gsm8k",)


def test_run_length_is_configurable(gsm8k: list[str]) -> None:
    words = gsm8k[0].split()[:12]
    twelve = "We were told: " + " ".join(words) + " and nothing more."
    assert Contamination([("gsm8k", gsm8k)]).contaminated(twelve) == ()
    assert Contamination([("gsm8k", gsm8k)], n=12).contaminated(twelve) == ("gsm8k",)
    assert Contamination([("gsm8k", gsm8k)], n=13).contaminated(twelve + " " + gsm8k[0]) == ("gsm8k",)


def test_short_evaluation_texts(clean: list[Conversation]) -> None:
    index = Contamination([("mt-bench", MT_BENCH)])
    assert index.eval_sets == (EvalSetSummary("mt-bench", texts=5, ignored=1),)
    assert index.contaminated("Oh hi there. How are you?") == ()  # "hi there" is below min_words
    assert index.contaminated("please take a moment to evaluate and critique your own response") == ("mt-bench",)
    assert index.contaminated("take a moment to evaluate and critique your own") == ()  # not whole
    assert index.matches([conversation_text(row) for row in clean]) == [()] * len(clean)


def test_determinism_and_order(gsm8k: list[str]) -> None:
    texts = [gsm8k[3], "nothing here at all", "x " + gsm8k[5].lower()]
    forward = Contamination([("gsm8k", gsm8k), ("mt-bench", MT_BENCH)])
    backward = Contamination([("gsm8k", gsm8k[::-1]), ("mt-bench", MT_BENCH[::-1])])
    assert forward.matches(texts) == backward.matches(texts) == [("gsm8k",), (), ("gsm8k",)]
    assert [forward.contaminated(text) for text in texts] == forward.matches(texts)


def test_an_evaluation_set_is_named_once(gsm8k: list[str]) -> None:
    with pytest.raises(ValueError, match="listed twice"):
        Contamination([("gsm8k", gsm8k), ("gsm8k", MT_BENCH)])
    with pytest.raises(ValueError, match="min_words"):
        Contamination([("gsm8k", gsm8k)], n=5, min_words=8)


# A recipe that replays real chit-chat and checks it against a usable set and the set under test ("probe").
DECONTAMINATED_RECIPE = """\
name: decon
target: {{model: tiny-target}}
sources:
  - {{name: chitchat, kind: replay, path: chitchat.jsonl}}
decontamination:
  eval_sets:
    - {{name: gsm, path: gsm.jsonl}}
    - {{name: probe, path: {probe}{fields}}}
split: {{validation_fraction: 0.0}}
output: {{dir: out}}
"""
GARBAGE = bytes(range(128, 256)) * 4 + b"\n\x00\xff{\x9c not json\n[1, 2, 3]\n"
LONG = "Natalia sold clips to forty eight of her friends in April and then half as many in May"
# eval set under test -> (file name, its bytes, fields, what the error says)
UNUSABLE = {
    "garbage bytes": ("probe.jsonl", GARBAGE, "", "no row of it can be read"),
    "fields naming nothing present": ("probe.jsonl", orjson.dumps({"question": LONG, "answer": "72"}) + b"\n",
                                      ", fields: [prompt, turns]", "none of its rows has the fields prompt, turns"),
    "rows of numbers only": ("probe.jsonl", b'{"id": 1, "score": 0.5}\n{"id": 2, "score": [1, 2]}\n', "",
                             "no text of at least 8 words"),
    "texts too short": ("probe.jsonl", b'{"turns": ["Hi there.", "Rewrite it."]}\n', "",
                        "no text of at least 8 words"),
    "a parquet file of garbage": ("probe.parquet", GARBAGE, "", "cannot read parquet"),
}


def write_decontaminated(root: Path, probe: str, content: bytes, fields: str = "") -> Path:
    write_chitchat(root / "chitchat.jsonl", 20)
    write_gsm8k(root / "gsm.jsonl", 5, seed=1)
    (root / probe).write_bytes(content)
    recipe = root / "recipe.yaml"
    recipe.write_text(DECONTAMINATED_RECIPE.format(probe=probe, fields=fields), encoding="utf-8")
    return recipe


@pytest.mark.parametrize("case", sorted(UNUSABLE))
def test_an_eval_set_that_yields_no_usable_text_stops_the_build_and_the_dry_run(tmp_path: Path, case: str) -> None:
    name, content, fields, why = UNUSABLE[case]
    recipe = load_recipe(write_decontaminated(tmp_path, name, content, fields))
    for attempt in (lambda: build_corpus(recipe, progress=io.StringIO()), lambda: plan_build(recipe)):
        with pytest.raises(CorpusError) as caught:
            attempt()
        message = str(caught.value)
        assert "eval set 'probe'" in message and str(tmp_path / name) in message and why in message, message
        assert not (tmp_path / "out").exists()  # raised before anything is written


def test_the_cli_exits_2_on_an_unusable_eval_set_before_writing_anything(tmp_path: Path) -> None:
    recipe = write_decontaminated(tmp_path, "probe.jsonl", GARBAGE)
    for dry_run in ((), ("--dry-run",)):
        completed = subprocess.run([sys.executable, "-m", "corpus_builder", "build", str(recipe), *dry_run],
                                   capture_output=True, text=True)
        assert completed.returncode == 2, completed.stderr
        assert completed.stderr.startswith("error: ") and "Traceback" not in completed.stderr
        assert "eval set 'probe'" in completed.stderr and str(tmp_path / "probe.jsonl") in completed.stderr
        assert not (tmp_path / "out").exists()


def test_bad_rows_of_an_eval_set_are_counted_and_a_mostly_unreadable_set_is_reported(tmp_path: Path) -> None:
    good = [orjson.dumps({"turns": [f"{LONG} on day {day}"]}) for day in range(2)]
    bad = [b"\xff\xfe not utf-8", b"{broken", b"{broken too", b"[1, 2]", b'{"question": "no turns field"}']
    recipe_path = write_decontaminated(tmp_path, "probe.jsonl", b"\n".join([*good, *bad]) + b"\n",
                                       ", fields: [turns]")
    recipe = load_recipe(recipe_path)
    plan = plan_build(recipe)
    text = format_plan(plan)
    assert re.search(r"probe\s.*probe\.jsonl\s.*2 texts", text), text
    assert "5 of 7 rows skipped (fields_absent 1, invalid_json 2, invalid_utf8 1, not_an_object 1)" in text
    assert any("probe" in warning and "5 of 7 rows" in warning for warning in plan.warnings), plan.warnings
    progress = io.StringIO()
    result = build_corpus(recipe, progress=progress)
    assert "5 of 7 rows" in progress.getvalue()  # the build says so too
    [gsm, probe] = result.manifest.section("decontamination")["eval_sets"]
    assert probe["texts"] == 2 and probe["skipped_rows"] == {"fields_absent": 1, "invalid_json": 2,
                                                             "invalid_utf8": 1, "not_an_object": 1}
    assert gsm["skipped_rows"] == {}


def test_the_card_lists_a_set_as_checked_only_with_the_texts_it_contributed(tmp_path: Path) -> None:
    short = orjson.dumps({"turns": [f"{LONG} again", "Rewrite it.", "Shorter still."]})
    recipe = load_recipe(write_decontaminated(tmp_path, "probe.jsonl", short + b"\n"))
    out = build_corpus(recipe, progress=io.StringIO()).out_dir
    card = render_card(CorpusDocuments.load(out))
    assert re.search(r"^\| probe \| probe\.jsonl \| 1 \| 0 \|$", card, re.MULTILINE), card  # 1 of 3 texts used
    manifest = json.loads((out / MANIFEST).read_text())
    manifest["decontamination"]["eval_sets"][1].update(texts=3, too_short=3)  # a set that contributed nothing
    (out / MANIFEST).write_text(json.dumps(manifest))
    card = render_card(CorpusDocuments.load(out))
    assert not re.search(r"^\| probe \|", card, re.MULTILINE), card
    gsm = manifest["decontamination"]["eval_sets"][0]
    assert re.search(rf"^\| gsm \| gsm\.jsonl \| {gsm['texts'] - gsm['too_short']} \| 0 \|$", card, re.MULTILINE)
    assert "Not checked: probe contributed no text" in card


def words(count: int, start: int = 0) -> str:
    return " ".join(f"word{i}" for i in range(start, start + count))


def test_an_evaluation_text_of_exactly_min_words_words_counts() -> None:
    """The defaults (13-word runs, min_words 8): an evaluation text of 8 words contaminates a text holding
    it whole, one of 7 words is ignored; a text of 13 words is one run, of 14 two."""
    index = Contamination([("set", [words(8), words(7, start=100), words(13, start=200), words(14, start=300)])])
    assert index.eval_sets == (EvalSetSummary("set", texts=4, ignored=1),)
    assert index.contaminated(f"before {words(8)} after") == ("set",)
    assert index.contaminated(f"before {words(7, start=100)} after") == ()
    assert index.contaminated(words(7)) == ()  # the 8-word text, cut short
    assert index.contaminated(f"x {words(13, start=200)}") == ("set",)
    assert index.contaminated(words(12, start=200)) == ()
    assert index.contaminated(words(13, start=301)) == ("set",)  # the second run of the 14 words
    assert index.contaminated(words(12, start=301)) == ()


@given(n=st.integers(1, 16), data=st.data())
@fuzz_settings(150)
def test_an_evaluation_text_contaminates_exactly_when_it_has_min_words_words(n: int, data: st.DataObject) -> None:
    """An evaluation text of k words contaminates a text holding it whole iff k >= min_words; a text holding
    it but its last word iff that leaves an n-word run of it (k - 1 >= n); shorter texts are counted ignored."""
    min_words = data.draw(st.integers(1, n), label="min_words")
    k = data.draw(st.integers(1, n + 2), label="words")
    index = Contamination([("set", [words(k)])], n=n, min_words=min_words)
    assert index.eval_sets == (EvalSetSummary("set", texts=1, ignored=int(k < min_words)),)
    assert index.contaminated(f"alpha {words(k)} omega") == (("set",) if k >= min_words else ())
    assert index.contaminated(f"alpha {words(k - 1)} omega") == (("set",) if k - 1 >= n else ())
    assert index.contaminated(f"alpha {words(k, start=1)} omega") == (("set",) if k - 1 >= n else ())


def test_min_words_lies_between_one_and_the_run_length() -> None:
    assert Contamination([("set", [words(5)])], n=5, min_words=5).contaminated(words(5)) == ("set",)
    assert Contamination([("set", [words(1)])], n=5, min_words=1).contaminated(f"a {words(1)} b") == ("set",)
    for min_words, n in ((0, 5), (6, 5)):
        with pytest.raises(ValueError, match=f"not min_words={min_words}, n={n}"):
            Contamination([("set", [words(5)])], n=n, min_words=min_words)


def runs_of(words: list[str], length: int) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + length]) for i in range(len(words) - length + 1)}


@given(n=st.integers(1, 5), data=st.data())
@fuzz_settings(150)
def test_a_text_matches_the_sets_it_shares_a_run_of_words_with(n: int, data: st.DataObject) -> None:
    """Against word-by-word containment, on a vocabulary of three words (many shared runs, runs repeated within
    and across sets): a set matches a text when one of its texts of at least min_words words shares an n-word
    run with it, or, shorter than n words, lies in it whole."""
    min_words = data.draw(st.integers(1, n), label="min_words")
    sentence = st.lists(st.sampled_from(["ant", "bee", "cat"]), max_size=8)
    sets = data.draw(st.lists(st.lists(sentence, max_size=3), min_size=1, max_size=4), label="sets")
    texts = data.draw(st.lists(sentence, max_size=6), label="texts")
    index = Contamination([(f"set{i}", [" ".join(text) for text in texts_of]) for i, texts_of in enumerate(sets)],
                          n=n, min_words=min_words)

    def shares(words: list[str], text: list[str]) -> bool:
        if len(text) < min_words:
            return False
        if len(text) < n:
            return tuple(text) in runs_of(words, len(text))
        return bool(runs_of(text, n) & runs_of(words, n))

    assert index.matches([" ".join(words) for words in texts]) == [
        tuple(f"set{i}" for i, texts_of in enumerate(sets) if any(shares(words, text) for text in texts_of))
        for words in texts]
    assert index.eval_sets == tuple(EvalSetSummary(f"set{i}", len(texts_of), sum(len(t) < min_words for t in texts_of))
                                    for i, texts_of in enumerate(sets))


def test_the_index_holds_ten_bytes_a_distinct_run_of_each_set() -> None:
    """A 64-bit hash and a 16-bit set number a run; a run repeated within a set is held once, one in two sets
    twice."""
    assert Contamination([("a", [words(14)])]).nbytes == 2 * 10
    assert Contamination([("a", [words(13), words(13)]), ("b", [words(13), words(8, start=50)])]).nbytes == 3 * 10
    assert Contamination([("a", [words(16), words(16, start=1)])]).nbytes == 5 * 10  # runs 0-12 .. 4-16


def test_eval_sets_and_texts_of_many_chunks(gsm8k: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The texts of a set, and the texts checked, are read a chunk at a time: the counts and the matches are
    those of one chunk."""
    texts = [gsm8k[3], "nothing here at all", "x " + gsm8k[5].lower(), MT_BENCH[1]]
    sets = [("gsm8k", gsm8k), ("mt-bench", MT_BENCH[::-1])]  # the short text first: its chunk is not the last
    whole = Contamination(sets)
    monkeypatch.setattr(normalise, "CHUNK_BYTES", 60)
    chunked = Contamination(sets)
    assert chunked.eval_sets == whole.eval_sets == (EvalSetSummary("gsm8k", 40, 0), EvalSetSummary("mt-bench", 5, 1))
    assert chunked.matches(texts) == whole.matches(texts) == [("gsm8k",), (), ("gsm8k",), ("mt-bench",)]
