"""Decontamination against evaluation sets: planted contamination in prompts and in responses is found with
the set it comes from, and real conversations are clean."""

from __future__ import annotations

from pathlib import Path

import pytest

from corpus_builder.build.decontaminate import Contamination, EvalSetSummary
from corpus_builder.build.near_dedup import conversation_text
from corpus_builder.records import Conversation, Message
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
