"""A tiktoken twin of a byte-level BPE tokenizer: the same token ids, three to four times faster.

Counting tokens for budgets and audits is bound by the ``tokenizers`` pre-tokenizer; tiktoken runs the
same byte-level BPE far faster. The two agree exactly when the tokenizer has no normalizer, a plain
regex pre-tokenizer, added tokens without strip rules, and merges whose order is the order of the ids
they create (tiktoken merges by the rank of the merged token, ``tokenizers`` by the rank of the merge
rule). ``twin_of`` checks all of that, and that every vocabulary entry is what ``tokenizers`` itself
produces for its text, and says why when a tokenizer does not qualify; callers then keep ``tokenizers``.
The ids stay those of the ``tokenizers`` vocabulary, so a twin is a drop-in for counting.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tiktoken import Encoding
    from tokenizers import Tokenizer

# The pattern of the ByteLevel pre-tokenizer with use_regex (GPT-2's).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class NoTwin(Exception):
    """The tokenizer cannot be reproduced exactly by tiktoken; the message says why."""


@cache
def _byte_table() -> dict[int, str]:
    """str.translate table from the byte-level alphabet (printable bytes stand for themselves, the rest
    shift above 255) to latin-1 characters, so ``.encode("latin-1")`` gives the bytes. Raw characters that
    are not in the alphabet map to a character latin-1 cannot encode, so they fail loudly."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    shifted = [b for b in range(256) if b not in printable]
    table = {b: "\uffff" for b in shifted}
    table |= {256 + n: chr(b) for n, b in enumerate(shifted)}
    return table


def _to_bytes(text: str) -> bytes:
    try:
        return text.translate(_byte_table()).encode("latin-1")
    except UnicodeEncodeError:
        raise NoTwin(f"vocabulary entry {text!r} is not byte-level") from None


def _pattern(spec: dict[str, Any] | None) -> str:
    """The split regex of a supported pre-tokenizer."""
    if spec and spec.get("type") == "ByteLevel":
        if spec.get("add_prefix_space") or not spec.get("use_regex", True):
            raise NoTwin("ByteLevel pre-tokenizer with add_prefix_space or without its regex")
        return GPT2_PATTERN
    steps = (spec or {}).get("pretokenizers") or []
    if (spec or {}).get("type") == "Sequence" and len(steps) == 2:
        split, byte_level = steps
        regex = (split.get("pattern") or {}).get("Regex")
        if (split.get("type") == "Split" and isinstance(regex, str) and regex and split.get("behavior") == "Isolated"
                and not split.get("invert") and byte_level.get("type") == "ByteLevel"
                and not byte_level.get("add_prefix_space") and not byte_level.get("use_regex", True)):
            return regex
    raise NoTwin(f"pre-tokenizer {json.dumps(spec)[:120]} is not a regex split + byte-level")


def _special_tokens(added: list[dict[str, Any]]) -> dict[str, int]:
    tokens = {}
    for token in added:
        if token.get("lstrip") or token.get("rstrip") or token.get("single_word"):
            raise NoTwin(f"added token {token['content']!r} has strip or single-word rules")
        tokens[token["content"]] = token["id"]
    # tiktoken tries added tokens in no set order, tokenizers takes the longest: equal only without prefixes
    for content in tokens:
        if any(other != content and other.startswith(content) for other in tokens):
            raise NoTwin(f"added token {content!r} is a prefix of another")
    return tokens


def cut_problem(tokenizer_json: Path) -> str | None:
    """Why cutting a text right after an added token might change the ids of what follows (a normalizer or a
    pre-tokenizer that sees across the cut, or an added token that takes the whitespace around it), or None:
    then the pieces' ids are the whole text's ids, since ``tokenizers`` splits added tokens out first."""
    spec = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    if spec.get("normalizer") is not None:
        return "the tokenizer has a normalizer"
    try:
        _pattern(spec.get("pre_tokenizer"))
        _special_tokens(spec.get("added_tokens") or [])
    except NoTwin as why:
        return str(why)
    return None


def _ranks(model: dict[str, Any], special: dict[str, int]) -> dict[bytes, int]:
    """Token bytes -> id, after checking that merge order is id order and each entry has one origin."""
    ranks = {_to_bytes(text): token_id for text, token_id in model["vocab"].items() if text not in special}
    if len(ranks) + len(special) != len(set(ranks.values()) | set(special.values())):
        raise NoTwin("two entries share an id")
    if any(bytes([byte]) not in ranks for byte in range(256)):
        raise NoTwin("the vocabulary lacks some of the 256 single bytes")
    vocab = model["vocab"]
    previous = -1
    created: set[str] = set()
    for merge in model["merges"]:
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        merged = left + right
        token_id = vocab.get(merged)
        if token_id is None or token_id <= previous or merged in created:
            raise NoTwin(f"merge {left!r} + {right!r} does not create the next id in order")
        previous = token_id
        created.add(merged)
    if len(created) != sum(len(entry) > 1 for entry in ranks):
        raise NoTwin("some multi-byte entries are not created by any merge")
    return ranks


def _check_reachable(tokenizer: Tokenizer, model: dict[str, Any], special: dict[str, int]) -> None:
    """tiktoken takes a pre-token found whole in the vocabulary as one token; tokenizers (without
    ignore_merges) only reaches it by merging, so every entry must come out of the merges as itself."""
    if model.get("ignore_merges"):
        return
    bpe = tokenizer.model
    for text, token_id in model["vocab"].items():
        if len(text) > 1 and text not in special:
            produced = bpe.tokenize(text)
            if len(produced) != 1 or produced[0].id != token_id:
                raise NoTwin(f"vocabulary entry {text!r} is not what the merges produce for its text")


def twin_of(tokenizer_json: Path, tokenizer: Tokenizer) -> Encoding:
    """A ``tiktoken.Encoding`` that yields exactly ``tokenizer``'s ids (``add_special_tokens=False``,
    added tokens allowed anywhere), or raises NoTwin. ``tokenizer`` is the ``tokenizers.Tokenizer``
    loaded from ``tokenizer_json``."""
    import tiktoken

    spec = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("dropout") or model.get("byte_fallback"):
        raise NoTwin("the model is not a plain BPE (dropout or byte fallback)")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise NoTwin("the BPE uses subword prefixes or suffixes")
    if spec.get("normalizer") is not None:
        raise NoTwin("the tokenizer has a normalizer")
    pattern = _pattern(spec.get("pre_tokenizer"))
    special = _special_tokens(spec.get("added_tokens") or [])
    ranks = _ranks(model, special)
    _check_reachable(tokenizer, model, special)
    try:
        return tiktoken.Encoding(tokenizer_json.parent.name or "target", pat_str=pattern,
                                 mergeable_ranks=ranks, special_tokens=special)
    except ValueError as error:  # e.g. a regex tiktoken's engine does not accept
        raise NoTwin(f"tiktoken refused the tokenizer: {error}") from None
