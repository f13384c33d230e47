"""How much of an answer repeats itself: a degenerate answer that loops is drafted almost perfectly, so a head
whose target looped more can look better than it is (model-serving-minefield #108).

An answer's repetition is the share of its tokens that lie inside an n-gram (``LOOP_NGRAM`` tokens) seen earlier
in the same answer: about 0 for prose, near 1 for an answer stuck in a loop. The tokens are the target's own
(the token ids the server returns), else the answer's words. An answer at or past the threshold (``--loop-
threshold``, default ``DEFAULT_LOOP_THRESHOLD``) loops.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

LOOP_NGRAM = 8  # long enough that prose rarely repeats one; any loop, whatever its period, repeats every n-gram
DEFAULT_LOOP_THRESHOLD = 0.5


def repetition(tokens: Sequence[Hashable], n: int = LOOP_NGRAM) -> float:
    """The share of ``tokens`` inside an ``n``-gram that occurred earlier in them (0.0 for fewer than n tokens)."""
    if len(tokens) <= n:
        return 0.0
    seen: set[tuple[Hashable, ...]] = set()
    inside = [False] * len(tokens)
    for start in range(len(tokens) - n + 1):
        gram = tuple(tokens[start:start + n])
        if gram in seen:
            inside[start:start + n] = [True] * n
        else:
            seen.add(gram)
    return sum(inside) / len(tokens)


def answer_tokens(token_ids: Sequence[int] | None, reasoning: str | None, content: str | None) -> Sequence[Hashable]:
    """The tokens of an answer as the server returned them, else its words (reasoning, then content)."""
    if token_ids:
        return token_ids
    return f"{reasoning or ''} {content or ''}".split()
