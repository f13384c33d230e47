"""`corpus vocab`: supervised-token frequencies and top-k coverage, checked against a count by hand."""

from __future__ import annotations

import errno
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import orjson
import pytest

from corpus_builder import draft_vocab
from corpus_builder.errors import CorpusError
from corpus_builder.export import corpus_token_rows, export_corpus
from corpus_builder.export.vocab import count_frequencies, top_k, vocab_report, write_frequencies
from corpus_builder.layout import Corpus
from tests.export.test_export import corpus  # noqa: F401  (the module-scoped built corpus fixture)


def by_hand(built: Corpus, tmp_path: Path) -> Counter[int]:
    """Frequencies from the speculators-tokens export: the ids under the loss mask."""
    export_corpus(built, "speculators-tokens", tmp_path)
    counts: Counter[int] = Counter()
    for split in ("train", "validation"):
        for line in (tmp_path / f"{split}.jsonl").read_bytes().splitlines():
            row = orjson.loads(line)
            counts.update(i for i, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m)
    return counts


def test_frequencies_and_coverage(corpus: Corpus, tmp_path: Path) -> None:  # noqa: F811
    frequencies = count_frequencies(corpus, corpus_token_rows(corpus))
    expected = by_hand(corpus, tmp_path)
    assert {i: int(c) for i, c in enumerate(frequencies.total) if c} == dict(expected)
    assert frequencies.reasoning.sum() > 0 and frequencies.answer.sum() > 0
    size = 10
    report = vocab_report(frequencies, size)
    ranked = sorted(expected, key=lambda i: (-expected[i], i))[:size]  # speculators' order
    assert sorted(top_k(frequencies.total, size).tolist()) == sorted(ranked)
    assert report["coverage"] == round(sum(expected[i] for i in ranked) / sum(expected.values()), 6)
    assert report["supervised_tokens"] == sum(expected.values()) == report["reasoning_tokens"] + report[
        "answer_tokens"]
    reasoning_cover = frequencies.reasoning[ranked].sum() / frequencies.reasoning.sum()
    assert report["reasoning_coverage"] == round(float(reasoning_cover), 6)
    assert set(report["by_source"]) == {"log"} and report["by_source"]["log"]["coverage"] == report["coverage"]
    full = vocab_report(frequencies, frequencies.size)
    assert full["coverage"] == full["reasoning_coverage"] == full["answer_coverage"] == 1.0


@pytest.mark.parametrize("suffix", [".npy", ".json", ".pt"])
def test_frequency_files(tmp_path: Path, suffix: str) -> None:
    counts = np.array([0, 5, 0, 2], dtype=np.int64)
    path = tmp_path / f"token_freq{suffix}"
    write_frequencies(counts, path)
    if suffix == ".npy":
        assert np.load(path).tolist() == [0, 5, 0, 2]
    elif suffix == ".json":
        assert orjson.loads(path.read_bytes()) == {"vocab_size": 4, "counts": {"1": 5, "3": 2}}
    else:
        import torch

        assert torch.load(path, weights_only=True) == {1: 5, 3: 2}  # speculators' token_freq.pt


def test_vocab_command(corpus: Corpus, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "freq.npy"
    completed = subprocess.run([sys.executable, "-m", "corpus_builder", "vocab", str(corpus.root), "--size", "50",
                                "--out", str(out), "--json"], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
    report = orjson.loads(completed.stdout)
    assert report["draft_vocab_size"] == 50 and 0 < report["coverage"] <= 1 and report["file"] == str(out)
    assert int(np.load(out).sum()) == report["supervised_tokens"]
    text = subprocess.run([sys.executable, "-m", "corpus_builder", "vocab", str(corpus.root), "--size", "50",
                           "--out", str(tmp_path / "f.json")], capture_output=True, text=True)
    assert text.returncode == 0 and "top 50 of" in text.stdout and "reasoning tokens" in text.stdout
    called = draft_vocab(corpus.root, tmp_path / "api.npy", size=50)  # the command is parse, call, print
    assert {**called.to_json(), "file": str(out)} == report and called.file == tmp_path / "api.npy"
    assert np.array_equal(np.load(called.file), np.load(out))
    assert text.stdout == f"{called.describe()}\nwrote {tmp_path / 'f.json'}\n"


def test_vocab_refuses_an_out_inside_the_corpus_or_on_the_tokenizer(corpus: Corpus, tmp_path: Path,  # noqa: F811
                                                                     tiny_model_dir: Path) -> None:
    tokenizer = tmp_path / "tokenizer"  # a copy: a missing guard must not write into the shared tiny model
    tokenizer.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (tokenizer / name).write_bytes((tiny_model_dir / name).read_bytes())
    before = {path: path.read_bytes() for path in (*tokenizer.iterdir(), *corpus.root.rglob("*")) if path.is_file()}
    for out, problem in ((corpus.root / "token_freq.npy", "inside the built corpus"),
                         (tokenizer / "tokenizer.json", "this run reads"), (tmp_path, "a directory")):
        completed = subprocess.run([sys.executable, "-m", "corpus_builder", "vocab", str(corpus.root), "--tokenizer",
                                    str(tokenizer), "--out", str(out)], capture_output=True, text=True)
        assert completed.returncode == 2 and f"{out}: --out: " in completed.stderr, completed.stderr
        assert problem in completed.stderr and "Traceback" not in completed.stderr
    after = {path: path.read_bytes() for path in (*tokenizer.iterdir(), *corpus.root.rglob("*")) if path.is_file()}
    assert after == before


def test_a_frequency_file_that_fails_to_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "save", full_disk)
    out = tmp_path / "token_freq.npy"
    with pytest.raises(CorpusError, match=re.escape(f"{out}: cannot write: No space left on device")):
        write_frequencies(np.array([0, 5], dtype=np.int64), out)
    assert list(tmp_path.iterdir()) == []
