"""The served-ids check of a turn cut at max_tokens (tiny model's tokenizer). Real text showed it: an answer cut
after "\\n\\n" was served as two "\\n" tokens (what the model writes before more text), while the render closes
the turn there and "\\n\\n<|im_end|>" tokenizes as one "\\n\\n". The last piece of a cut text is the model's
unfinished business, not a mismatch; anything before it still is, and a turn that stopped is checked whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from corpus_builder.records import Conversation, Message, Provenance
from corpus_builder.tokens import TemplateRenderer, TokenRows

ID = "0123456789abcdef0123"


@pytest.fixture(scope="module")
def renderer(tiny_model_dir: Path) -> TemplateRenderer:
    return TemplateRenderer(tiny_model_dir)


def generated(renderer: TemplateRenderer, content: str, token_ids: list[int], finish_reason: str) -> Conversation:
    """A one-turn row generated with thinking off: its prompt's ids as the server tokenized them, ``token_ids``
    as the model wrote them."""
    messages = [Message("user", "say hello"), Message("assistant", content)]
    prompt = renderer.render([{"role": "user", "content": "say hello"}], add_generation_prompt=True,
                             enable_thinking=False)
    turn = {"message_index": 1, "endpoint": "http://127.0.0.1:1/v1", "finish_reason": finish_reason,
            "prompt_token_ids": renderer.encode([prompt])[0], "token_ids": token_ids}
    return Conversation(ID, "prompts", "generated", messages, task="chat", license="MIT",
                        provenance=Provenance.from_json({"generation": {"turns": [turn], "enable_thinking": False}}))


def ids(renderer: TemplateRenderer, text: str) -> list[int]:
    return renderer.encode([text])[0]


def test_a_cut_turn_may_end_in_tokens_the_closing_render_merges(renderer: TemplateRenderer) -> None:
    # the ids of "hello\n\n" as the model writes them on the way to "hello\n\nworld" (each "\n" a token)
    on_the_way = ids(renderer, "hello\n\nworld")[:-len(ids(renderer, "world"))]
    assert renderer.tokenizer.decode(on_the_way) == "hello\n\n"
    assert on_the_way != ids(renderer, "hello\n\n")  # the closing render tokenizes the tail otherwise
    (cut,) = TokenRows(renderer).tokenize([generated(renderer, "hello\n\n", on_the_way, "length")])
    assert cut.checked_turns == 1 and cut.mismatches == []
    # a turn that stopped there chose those tokens before its end-of-turn token: a real mismatch
    eos = renderer.token_id(renderer.eos_token)
    (stopped,) = TokenRows(renderer).tokenize([generated(renderer, "hello\n\n", [*on_the_way, eos], "stop")])
    (mismatch,) = stopped.mismatches
    assert mismatch.part == "completion"
    assert mismatch.position == len(stopped.conversation.provenance.generation.turns[0].prompt_token_ids) + 3


def test_a_cut_turn_that_differs_before_its_last_piece_is_a_mismatch(renderer: TemplateRenderer) -> None:
    canonical = ids(renderer, "hello world")
    letters = [token for letter in "hello" for token in ids(renderer, letter)]  # "hello" spelt a letter a token
    assert letters != canonical[:len(letters)]
    served = [*letters, *ids(renderer, " world")]
    assert renderer.tokenizer.decode(served) == "hello world"
    (cut,) = TokenRows(renderer).tokenize([generated(renderer, "hello world", served, "length")])
    (mismatch,) = cut.mismatches
    prompt_length = len(cut.conversation.provenance.generation.turns[0].prompt_token_ids)
    assert (mismatch.part, mismatch.position) == ("completion", prompt_length + next(
        index for index, (a, b) in enumerate(zip(served, canonical, strict=False)) if a != b))
