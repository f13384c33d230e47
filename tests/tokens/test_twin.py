"""The tiktoken twin counts exactly what ``tokenizers`` counts, and is refused where it could not."""

from __future__ import annotations

import itertools
import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from corpus_builder.records import Conversation, Message
from corpus_builder.tokens import NoTwin, TemplateRenderer, twin_of
from tests.support.real_data import sharegpt_records

EDGE_TEXTS = [
    "",
    " ",
    "   leading and trailing   ",
    "tabs\tand\t\tnew\nlines\n\n\r\n  indented\n    code()",
    "digits 1234567890 3.14159 1e-9 0x1F",
    "punctuation!!! ... ??? ;;; --- ''' \"\"\" it's we're I'll they've I'd",
    "unicode: café naïve Ærøskøbing Straße ünïcödé",
    "中文测试：你好，世界。日本語のテキスト。한국어 텍스트",
    "emoji 😀👍🏽🇫🇷 and combining e\u0301 a\u0308",
    "rtl مرحبا بالعالم שלום",
    "control \x00\x01\x1f\x7f and nbsp\u00a0here\u2003em\u2028line",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm</think>\n\nok<|im_end|>",
    "glued<think>tags</think>inside words<|im_end|><|im_start|>",
    "half tags <|im_sta rt|> <thin k> </think",
    "a" * 300 + " " + "ab" * 150,
]


def real_texts(count: int) -> list[str]:
    """Turns of real ShareGPT conversations: code, markdown, many languages."""
    turns = (turn.get("value") for record in sharegpt_records() for turn in record.get("conversations") or [])
    return list(itertools.islice((t for t in turns if isinstance(t, str) and t), count))


def random_texts(count: int, seed: int = 0) -> list[str]:
    """Adversarial mixes of letters, digits, whitespace runs, marks and symbols from many scripts."""
    rng = random.Random(seed)
    pieces = ["a", "Z", "é", "ß", "中", "ع", "😀", "\u0301", "7", "٣", " ", "  ", "\t", "\n", "\r\n", "\u00a0",
              "'s", "'ll", "!", "...", "_", "-", "<think>", "</think>", "<|im_end|>", "\x00", "word", " the"]
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 60))) for _ in range(count)]


def assert_same_ids(tokenizer: Tokenizer, twin: Any, texts: list[str]) -> None:
    expected = [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    got = twin.encode_batch(texts, allowed_special="all")
    differing = [text for text, a, b in zip(texts, got, expected, strict=True) if a != b]
    assert not differing, differing[:3]


def test_twin_of_the_tiny_target_gives_the_same_ids(tiny_model_dir: Path) -> None:
    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    twin = twin_of(tiny_model_dir / "tokenizer.json", tokenizer)
    assert_same_ids(tokenizer, twin, EDGE_TEXTS + real_texts(400) + random_texts(2000))


def train_split_tokenizer(out: Path) -> Path:
    """A Qwen/Llama-3-style tokenizer: a regex Split then a byte-level step without its own regex."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, trainers

    pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(real_texts(3000), trainer)
    tokenizer.add_special_tokens([AddedToken("<|im_start|>", special=True, normalized=False),
                                  AddedToken("<|im_end|>", special=True, normalized=False)])
    tokenizer.add_tokens([AddedToken("<think>", normalized=False), AddedToken("</think>", normalized=False)])
    out.mkdir()
    tokenizer.save(str(out / "tokenizer.json"))
    return out / "tokenizer.json"


def test_twin_of_a_regex_split_tokenizer_gives_the_same_ids(tmp_path: Path) -> None:
    path = train_split_tokenizer(tmp_path / "split")
    tokenizer = Tokenizer.from_file(str(path))
    twin = twin_of(path, tokenizer)
    assert_same_ids(tokenizer, twin, EDGE_TEXTS + real_texts(400)[200:] + random_texts(2000, seed=1))


def altered(tiny_model_dir: Path, tmp_path: Path, change: Any) -> tuple[Path, Tokenizer]:
    spec = json.loads((tiny_model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    change(spec)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    return path, Tokenizer.from_file(str(path))


def _swap_two_merges(spec: dict[str, Any]) -> None:
    merges = spec["model"]["merges"]
    merges[10], merges[11] = merges[11], merges[10]


def _vocab_entry_without_merge(spec: dict[str, Any]) -> None:
    top = max([*spec["model"]["vocab"].values(), *(token["id"] for token in spec["added_tokens"])])
    spec["model"]["vocab"]["ĠzzzzqQ"] = top + 1


def _unreachable_entry(spec: dict[str, Any]) -> None:
    """"\x00\x01\x02" is an entry, but "\x01\x02" merges first, and no rule merges "\x00" + "\x01\x02"."""
    top = max([*spec["model"]["vocab"].values(), *(token["id"] for token in spec["added_tokens"])])
    for offset, (left, right) in enumerate([("ā", "Ă"), ("Ā", "ā"), ("Āā", "Ă")], start=1):
        spec["model"]["vocab"][left + right] = top + offset
        spec["model"]["merges"].append([left, right] if isinstance(spec["model"]["merges"][0], list)
                                       else f"{left} {right}")


def _strip_rule(spec: dict[str, Any]) -> None:
    spec["added_tokens"][0]["lstrip"] = True


def _prefix_added_token(spec: dict[str, Any]) -> None:
    top = max(token["id"] for token in spec["added_tokens"])
    spec["added_tokens"].append({**spec["added_tokens"][0], "id": top + 1, "content": "<|im_start|>x"})


@pytest.mark.parametrize(("change", "reason"), [
    (lambda spec: spec.update(normalizer={"type": "NFKC"}), "normalizer"),
    (lambda spec: spec.update(pre_tokenizer={"type": "Metaspace", "replacement": "▁",
                                             "prepend_scheme": "always", "split": True}), "pre-tokenizer"),
    (lambda spec: spec["model"].update(byte_fallback=True), "plain BPE"),
    (_swap_two_merges, "next id in order"),
    (_vocab_entry_without_merge, "not created by any merge"),
    (_unreachable_entry, "not what the merges produce"),
    (_strip_rule, "strip"),
    (_prefix_added_token, "prefix"),
])
def test_tokenizers_the_twin_cannot_match_are_refused(tiny_model_dir: Path, tmp_path: Path, change: Any,
                                                      reason: str) -> None:
    path, tokenizer = altered(tiny_model_dir, tmp_path, change)
    with pytest.raises(NoTwin, match=reason):
        twin_of(path, tokenizer)


def copy_model_files(tiny_model_dir: Path, out: Path) -> Path:
    out.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tiny_model_dir / name).exists():
            shutil.copy(tiny_model_dir / name, out / name)
    return out


def conversations() -> list[Conversation]:
    texts = real_texts(120)
    return [Conversation(f"c{i}", "log", "replay", [Message("user", texts[2 * i]),
                                                    Message("assistant", texts[2 * i + 1], "why" * i or None)])
            for i in range(60)]


def test_renderer_counts_equal_with_and_without_the_twin(tiny_model_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    fast = TemplateRenderer(tiny_model_dir)
    counted = fast.count_tokens(conversations())
    assert fast.twin is not None and fast.twin_refusal is None
    monkeypatch.setenv("CORPUS_TOKEN_COUNTER", "tokenizers")
    exact = TemplateRenderer(tiny_model_dir)
    assert exact.count_tokens(conversations()) == counted
    assert exact.twin is None and exact.twin_refusal == "CORPUS_TOKEN_COUNTER=tokenizers"


def test_a_refused_tokenizer_is_counted_by_tokenizers(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = copy_model_files(tiny_model_dir, tmp_path / "model")
    spec = json.loads((model / "tokenizer.json").read_text(encoding="utf-8"))
    _swap_two_merges(spec)
    (model / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    renderer = TemplateRenderer(model)
    counts = renderer.count_tokens(conversations())
    assert renderer.twin is None and "next id in order" in (renderer.twin_refusal or "")
    views = [renderer.budget_views(c)[-1] for c in conversations()]
    assert counts == [len(ids) for ids in renderer.encode(views)]


class OffByOne:
    """A twin that is wrong on one text (the first one counted): the renderer's own check must catch it."""

    def __init__(self, twin: Any, wrong_on: str) -> None:
        self.twin = twin
        self.wrong_on = wrong_on

    def encode(self, text: str, **options: Any) -> list[int]:
        ids: list[int] = self.twin.encode(text, **options)
        return [*ids, 0] if text == self.wrong_on else ids


def test_a_twin_that_differs_on_the_first_batch_is_dropped(tiny_model_dir: Path) -> None:
    renderer = TemplateRenderer(tiny_model_dir)
    renderer.twin = OffByOne(renderer.twin, renderer.budget_views(conversations()[0])[-1])
    with pytest.warns(RuntimeWarning, match="fall back to tokenizers"):
        counts = renderer.count_tokens(conversations())
    assert renderer.twin is None and renderer.twin_refusal == "tiktoken differed from tokenizers on text 0"
    views = [renderer.budget_views(c)[-1] for c in conversations()]
    assert counts == [len(ids) for ids in renderer.encode(views)]
