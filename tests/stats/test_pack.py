"""The eval pack's strata (``stats.pack.stratum``): a row's source, task and thinking mode, by the facts' one
definition (``facts.thinking_mode``): the mode the row was served in where it records it, a logged request's or a
generated row's, else whether it carries reasoning."""

from __future__ import annotations

import pytest

from corpus_builder.records import Conversation, Message, Origin, Provenance
from corpus_builder.stats import facts
from corpus_builder.stats.pack import stratum

REASONED = [Message("user", "hi"), Message("assistant", "hello", "greet")]
PLAIN = [Message("user", "hi"), Message("assistant", "hello")]


@pytest.mark.parametrize(("origin", "messages", "provenance", "mode"), [
    ("replay", REASONED, {"served": {"enable_thinking": False}}, False),  # served off, its reasoning kept
    ("replay", REASONED, {"served": {"enable_thinking": None}}, True),  # the log does not say: the reasoning does
    ("replay", PLAIN, {}, False),
    ("generated", PLAIN, {"generation": {"enable_thinking": True}}, True),  # asked to think, no trace in the answer
    ("generated", REASONED, {"generation": {"enable_thinking": False}}, False),  # asked not to, a trace anyway
    # regenerated from a request logged in the other mode: the mode it was generated in
    ("generated", PLAIN, {"served": {"enable_thinking": True}, "generation": {"enable_thinking": False}}, False),
])
def test_a_rows_stratum_is_its_thinking_mode_as_the_facts_define_it(
        origin: Origin, messages: list[Message], provenance: dict[str, object], mode: bool) -> None:
    row = Conversation("row-0", "chat", origin, messages, task="qa", provenance=Provenance.from_json(provenance))
    assert stratum(row) == ("chat", "qa", mode)
    written = row.to_row()  # the row form a shard holds: the definition over it gives the same mode
    turns = written["messages"]
    assert isinstance(turns, list)
    assert facts.thinking_mode(turns, written["origin"], written["provenance"]) is mode
