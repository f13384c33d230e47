"""Synthetic prompt conversations, as the source readers yield them, for generation tests and benchmarks."""

from __future__ import annotations

from ..records import Conversation, Message, Provenance, conversation_id


def make_prompts(count: int, *, turns: int = 1, system: bool = True, source: str = "prompts",
                 words: str = "question") -> list[Conversation]:
    """Prompt conversations as the readers yield them: [system] user [user ...], no assistant turns."""
    prompts = []
    for i in range(count):
        messages = [Message("system", "You are a careful assistant.")] if system else []
        messages += [Message("user", f"{words} {i} part {t}: what is {i} plus {t}?") for t in range(turns)]
        prompts.append(Conversation(id=conversation_id(source, messages), source=source, origin="prompt",
                                    messages=messages, task="chat", license="MIT",
                                    provenance=Provenance(source_file="prompts.jsonl", source_line=i + 1)))
    return prompts
