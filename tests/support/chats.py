"""Synthetic OpenAI-style chat rows for tests that need a small, varied replay log, or rows the loopback server
(``corpus_builder.testing.fault_server``) would generate."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TurnText = Callable[[int, int], str]  # (row index, turn index) -> text


def synthetic_chats(count: int, *, max_turns: int, system: str, system_every: int, question: TurnText,
                    answer: TurnText, reasoning: TurnText) -> list[dict[str, Any]]:
    """``count`` rows of ``{"messages": [...]}``: row i has ``1 + i % max_turns`` user/assistant turns, a
    system turn when ``i % system_every == 0``, and on odd rows every answer carries its reasoning in a
    ``<think>`` block inside the content (the way many serving logs store it)."""
    rows = []
    for i in range(count):
        messages = [{"role": "system", "content": system}] if i % system_every == 0 else []
        for turn in range(1 + i % max_turns):
            messages.append({"role": "user", "content": question(i, turn)})
            content = answer(i, turn)
            if i % 2:
                content = f"<think>\n{reasoning(i, turn)}\n</think>\n\n{content}"
            messages.append({"role": "assistant", "content": content})
        rows.append({"messages": messages})
    return rows


def served(prompt: str) -> dict[str, Any]:
    """The row the loopback server generates for a one-turn ``prompt``, as a replay log holds it: its reasoning
    "Let me think about P[:60]." and its answer "Answer to P[:60]." (a replayed duplicate of a generated row)."""
    return {"messages": [{"role": "user", "content": prompt},
                         {"role": "assistant",
                          "content": f"<think>Let me think about {prompt[:60]}.</think>Answer to {prompt[:60]}."}]}
