"""Expected token rows from transformers' own ``apply_chat_template``: the reference the renderer is checked
against (never the renderer under test)."""

from __future__ import annotations

from typing import Any


def hf_ids(hf: Any, messages: list[dict[str, Any]], tools: Any = None, *, generation_prompt: bool = False
           ) -> list[int]:
    encoded = hf.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=generation_prompt)
    return list(encoded if isinstance(encoded, list) else encoded["input_ids"])


def mask_start(prompt: list[int], full: list[int]) -> int:
    """Where a turn's supervision starts: the end of its generation prompt in the full render, or the token that
    straddles that end (an empty think block's "\\n\\n" after the prompt's "<think>\\n"), as speculators masks."""
    return next((i for i, (a, b) in enumerate(zip(prompt, full, strict=False)) if a != b), min(len(prompt), len(full)))


def through_end_of_turn(ids: list[int], eos: int) -> list[int]:
    """A render cut after its last end-of-turn token (the template's separator after it is never generated)."""
    return ids[:len(ids) - ids[::-1].index(eos)]


def occurrences(ids: list[int], piece: list[int]) -> int:
    """How often the token sequence ``piece`` occurs in ``ids``."""
    return sum(ids[i:i + len(piece)] == piece for i in range(len(ids) - len(piece) + 1))
