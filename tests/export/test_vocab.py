"""`corpus vocab`: supervised-token frequencies and top-k coverage, checked against a count by hand."""

from __future__ import annotations

import errno
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from corpus_builder import draft_vocab
from corpus_builder.errors import CorpusError
from corpus_builder.export import corpus_token_rows, export_corpus, vocab
from corpus_builder.export.vocab import (
    Frequencies,
    count_frequencies,
    format_vocab_report,
    speculators_mappings,
    top_k,
    verifier_vocab_size,
    vocab_report,
    write_frequencies,
    write_speculators_files,
)
from corpus_builder.layout import Corpus
from corpus_builder.tokens import TurnRow
from tests.assemble.test_failures import small_disk  # noqa: F401  (a 6 MiB tmpfs: a real full disk)
from tests.export.test_export import corpus  # noqa: F401  (the module-scoped built corpus fixture)
from tests.support.trainers import speculators_python


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
    assert frequencies.reasoning is not None
    assert frequencies.reasoning.sum() > 0 and (frequencies.total - frequencies.reasoning).sum() > 0
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
    assert report["written"] == [str(out)]
    assert int(np.load(out).sum()) == report["supervised_tokens"]
    text = subprocess.run([sys.executable, "-m", "corpus_builder", "vocab", str(corpus.root), "--size", "50",
                           "--out", str(tmp_path / "f.json")], capture_output=True, text=True)
    assert text.returncode == 0 and "top 50 of" in text.stdout and "reasoning tokens" in text.stdout
    called = draft_vocab(corpus.root, tmp_path / "api.npy", size=50)  # the command is parse, call, print
    assert {**called.to_json(), "file": str(out), "written": [str(out)]} == report
    assert called.file == tmp_path / "api.npy"
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
                         (tokenizer / "tokenizer.json", "this run reads"), (tokenizer, "this run reads"),
                         (tmp_path / "freq.txt", "must end in one of .npy, .json, .pt")):
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


# Run by speculators 0.9.0 itself (.venv-speculators): its trainer's loader on our directory, then the same loader on
# a directory holding only our token_freq.pt, where it builds the mappings from the counts and caches them.
SPECULATORS_VOCAB = """\
import argparse, json, shutil, sys
from pathlib import Path
import torch
from speculators.train.cli import parse_vocab_mappings
from speculators.train.vocab_mapping import get_target_vocab_size

ours, fresh, verifier = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
result = {}
for size in map(int, sys.argv[4:]):
    def args(data_path):
        return argparse.Namespace(d2t_path=None, t2d_path=None, token_freq_path=None, data_path=str(data_path),
                                  draft_vocab_size=size, verifier_name_or_path=verifier, trust_remote_code=False)
    d2t, t2d, loaded_size = parse_vocab_mappings(args(ours))
    built = fresh / str(size)
    built.mkdir(parents=True)
    shutil.copy(ours / "token_freq.pt", built / "token_freq.pt")
    built_d2t, built_t2d, _ = parse_vocab_mappings(args(built))
    result[size] = {
        "size": loaded_size, "equal": torch.equal(d2t, built_d2t) and torch.equal(t2d, built_t2d),
        "dtypes": [str(d2t.dtype), str(t2d.dtype)], "t2d_length": t2d.shape[0], "chosen": int(t2d.sum()),
        "target_vocab_size": get_target_vocab_size(None, verifier),
        "same_bytes": [(ours / name).read_bytes() == (built / name).read_bytes()
                       for name in (f"d2t-{size}.npy", f"t2d-{size}.npy")],
        "token_freq": {str(k): v for k, v in torch.load(ours / "token_freq.pt", weights_only=True).items()},
    }
print(json.dumps(result))
"""


def test_speculators_loads_the_vocab_files_as_it_builds_them(corpus: Corpus, tmp_path: Path,  # noqa: F811
                                                            tiny_model_dir: Path) -> None:
    """`corpus vocab --out DIR` writes what speculators' trainer loads from its data directory, equal to what the
    trainer computes from the same token_freq.pt (d2t and t2d byte for byte): a draft vocabulary smaller than
    the supervised tokens (ties decided by id) and one larger (made up with unsupervised ids)."""
    python = speculators_python()
    expected = by_hand(corpus, tmp_path / "by-hand")
    sizes = (16, len(expected) + 40)
    for size in sizes:
        report = draft_vocab(corpus.root, tmp_path / "vocab", size=size)
        assert report.coverage["target_vocab_size"] == 6016  # the config's vocab_size, not the tokenizer's 6,0xx
    assert sorted(p.name for p in (tmp_path / "vocab").iterdir()) == sorted(
        ["token_freq.pt", *(f"{kind}-{size}.npy" for size in sizes for kind in ("d2t", "t2d"))])
    completed = subprocess.run([str(python), "-c", SPECULATORS_VOCAB, str(tmp_path / "vocab"), str(tmp_path / "fresh"),
                                str(tiny_model_dir), *map(str, sizes)], capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = orjson.loads(completed.stdout.splitlines()[-1])
    for size in sizes:
        loaded = result[str(size)]
        assert loaded["equal"] and loaded["same_bytes"] == [True, True], loaded
        assert loaded["size"] == size == loaded["chosen"] and loaded["dtypes"] == ["torch.int64", "torch.bool"]
        assert loaded["t2d_length"] == loaded["target_vocab_size"] == 6016
        assert {int(k): v for k, v in loaded["token_freq"].items()} == dict(expected)
    d2t, t2d = np.load(tmp_path / "vocab" / "d2t-16.npy"), np.load(tmp_path / "vocab" / "t2d-16.npy")
    chosen = np.arange(16) + d2t  # offsets: target id = draft index + d2t[index]
    assert chosen.tolist() == sorted(sorted(expected, key=lambda i: (-expected[i], i))[:16])
    assert np.flatnonzero(t2d).tolist() == chosen.tolist()


@pytest.mark.parametrize("file_format", ["parquet", "jsonl", "jsonl.zst"])
def test_a_tokens_export_is_counted_as_it_is(corpus: Corpus, tmp_path: Path, file_format: str,  # noqa: F811
                                             tiny_model_dir: Path) -> None:
    """A speculators-tokens export (a directory or one file) gives the counts of the corpus it came from; the
    speculators files need the verifier's vocabulary size from --tokenizer's config.json or given."""
    export_corpus(corpus, "speculators-tokens", tmp_path / "export", file_format=file_format)
    from_corpus = count_frequencies(corpus, corpus_token_rows(corpus)).total
    report = draft_vocab(tmp_path / "export", tmp_path / "counts.npy", size=10)
    counts = np.load(tmp_path / "counts.npy")
    assert np.array_equal(counts, from_corpus[:len(counts)]) and not from_corpus[len(counts):].any()
    assert report.coverage["reasoning_tokens"] is None and report.coverage["by_source"] == {}
    assert "reasoning" not in report.describe() and report.coverage["coverage"] == vocab_report(
        count_frequencies(corpus, corpus_token_rows(corpus)), 10)["coverage"]
    train = draft_vocab(tmp_path / "export" / f"train.{file_format}", tmp_path / "train.json", size=10)
    assert 0 < train.coverage["supervised_tokens"] < report.coverage["supervised_tokens"]
    with pytest.raises(CorpusError, match="give --target-vocab-size"):
        draft_vocab(tmp_path / "export", tmp_path / "speculators", size=10)
    assert not (tmp_path / "speculators").exists()
    given = draft_vocab(tmp_path / "export", tmp_path / "given", size=10, target_vocab_size=6016)
    configured = draft_vocab(tmp_path / "export", tmp_path / "configured", size=10, tokenizer=tiny_model_dir)
    for name in ("d2t-10.npy", "t2d-10.npy"):
        assert (tmp_path / "given" / name).read_bytes() == (tmp_path / "configured" / name).read_bytes()
    assert given.coverage["target_vocab_size"] == configured.coverage["target_vocab_size"] == 6016


def write_token_rows(path: Path, rows: list[dict]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return path


@pytest.mark.parametrize(("rows", "problem"), [
    ([{"input_ids": [1, 2], "loss_mask": [0, 1]}, {"input_ids": [1, 2, 3], "loss_mask": [1, 1]}],
     ":2: input_ids and loss_mask differ in length"),
    ([{"input_ids": [1, 2], "loss_mask": [0, 1]}, {"input_ids": [4]}], ":2: no input_ids or no loss_mask list"),
    ([{"input_ids": [1, -2], "loss_mask": [1, 1]}], ":1: token id -2 is negative"),
    ([{"input_ids": ["a"], "loss_mask": [1]}], ": cannot read the speculators-tokens export"),
    ([{"input_ids": [1], "loss_mask": [0]}], ": no supervised tokens to count"),
])
def test_a_bad_tokens_export_is_named(tmp_path: Path, rows: list[dict], problem: str) -> None:
    source = write_token_rows(tmp_path / "train.jsonl", rows)
    with pytest.raises(CorpusError) as raised:
        draft_vocab(source, tmp_path / "out.npy", size=2)
    assert str(raised.value).startswith(f"{source}{problem}") and not (tmp_path / "out.npy").exists()


def test_vocab_directory_refusals_leave_nothing(tmp_path: Path, tiny_model_dir: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    source = write_token_rows(tmp_path / "train.jsonl", [{"input_ids": [1, 6003], "loss_mask": [1, 1]}])
    with pytest.raises(CorpusError) as raised:  # an id of the tokenizer's past a t2d given shorter than it
        draft_vocab(source, tmp_path / "out", size=2, tokenizer=tiny_model_dir, target_vocab_size=6000)
    assert str(raised.value) == (f"{source}: token id 6,003 is supervised but the verifier's vocabulary has 6,000 "
                                 "tokens: the counts are of another tokenizer")
    with pytest.raises(CorpusError) as raised:
        draft_vocab(source, tmp_path / "out", size=7000, target_vocab_size=6016)
    assert str(raised.value) == ("--draft-vocab-size 7,000 exceeds the vocabulary it is chosen from (6,016 tokens: "
                                 "--target-vocab-size)")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match=r"manifest.json is missing \(interrupted or failed build\?\), and no "
                                          r"speculators-tokens export"):
        draft_vocab(tmp_path / "empty", tmp_path / "elsewhere", size=2)
    write_token_rows(source, [{"input_ids": [1, 5], "loss_mask": [1, 1]}])
    saved = np.save
    calls: list[object] = []

    def fails_second(handle: object, array: np.ndarray) -> None:
        calls.append(handle)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        saved(handle, array)

    monkeypatch.setattr(np, "save", fails_second)
    with pytest.raises(CorpusError, match="No space left on device"):
        draft_vocab(source, tmp_path / "out", size=2, target_vocab_size=6016)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "train.jsonl"]


# --- issue 37: a full disk, ids no vocabulary holds, the counts' length, the draft's bound, the tokenizer ------

def vocab_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corpus_builder", "vocab", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def fill(disk: Path) -> None:
    """Write to ``disk`` until it is full."""
    with (disk / "filler").open("wb", buffering=0) as handle, pytest.raises(OSError, match="No space left"):
        while True:
            handle.write(bytes(1 << 20))


@pytest.mark.parametrize(("out", "named"), [("token_freq.pt", "token_freq.pt"), ("token_freq.npy", "token_freq.npy"),
                                            ("token_freq.json", "token_freq.json"),
                                            ("speculators", "speculators/(token_freq.pt|d2t-50.npy|t2d-50.npy)")])
def test_a_full_disk_is_an_error_naming_the_file_and_leaves_nothing(corpus: Corpus, small_disk: Path,  # noqa: F811
                                                                    out: str, named: str) -> None:
    """torch's own writer turned a full disk into a RuntimeError traceback (the .pt file and speculators' files).
    Which of speculators' three files meets the full disk first depends on the few bytes the filler left."""
    fill(small_disk)
    completed = vocab_cli(corpus.root, "--size", "50", "--out", small_disk / out)
    assert completed.returncode == 2, completed.stderr
    assert re.fullmatch(f"error: {re.escape(str(small_disk))}/{named}: cannot write: No space left on device\n",
                        completed.stderr), completed.stderr
    assert [path.name for path in small_disk.iterdir()] == ["filler"]


@pytest.mark.parametrize("token", [2 ** 40, 10 ** 9, 6007])
@pytest.mark.parametrize("file_format", ["jsonl", "jsonl.zst", "parquet"])
def test_an_id_outside_the_vocabulary_is_named_with_its_line_and_the_vocabulary(tmp_path: Path, tiny_model_dir: Path,
                                                                                token: int, file_format: str) -> None:
    """One huge id in a tokens export made counts as long as it (a MemoryError at 2^40, OOM-killed at 10^9): it is
    found before any count grows, named with its file and line (row, for parquet), the id and the vocabulary."""
    rows = [{"input_ids": [1, 2], "loss_mask": [1, 1]}, {"input_ids": [5, token, 7], "loss_mask": [0, 1, 1]}]
    source = tmp_path / f"train.{file_format}"
    if file_format == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), source)
        where = f"{source}: row 1: "
    else:
        lines = b"\n\n".join(orjson.dumps(row) for row in rows) + b"\n"  # a blank line: the id is on line 3
        source.write_bytes(zstandard.ZstdCompressor().compress(lines) if file_format == "jsonl.zst" else lines)
        where = f"{source}:3: "
    completed = vocab_cli(source, "--tokenizer", tiny_model_dir, "--size", "2", "--out", tmp_path / "out.npy")
    assert completed.returncode == 2
    assert completed.stderr == (f"error: {where}token id {token:,} is supervised but the vocabulary has 6,007 tokens "
                                f"(the tokenizer {tiny_model_dir})\n")
    unknown = vocab_cli(source, "--size", "2", "--out", tmp_path / "out.npy")
    if token >= 1 << 24:
        assert unknown.returncode == 2
        assert unknown.stderr == (f"error: {where}token id {token:,} is supervised: no tokenizer has that many entries"
                                  " (counted without a vocabulary, ids stay under 16,777,216); give --tokenizer DIR, "
                                  "the target's\n")
        assert not (tmp_path / "out.npy").exists()
    else:  # an id some tokenizer may hold: counted, the counts as long as it
        assert unknown.returncode == 0 and len(np.load(tmp_path / "out.npy")) == token + 1
    given = vocab_cli(source, "--target-vocab-size", "6016", "--size", "2", "--out", tmp_path / "given.npy")
    if token >= 6016:
        assert given.stderr == (f"error: {where}token id {token:,} is supervised but the vocabulary has 6,016 tokens "
                                "(--target-vocab-size)\n")
    else:
        assert given.returncode == 0 and len(np.load(tmp_path / "given.npy")) == 6016


def test_a_negative_id_is_named_with_its_line(tmp_path: Path) -> None:
    source = write_token_rows(tmp_path / "train.jsonl", [{"input_ids": [1], "loss_mask": [1]},
                                                         {"input_ids": [-3, 4], "loss_mask": [1, 1]}])
    with pytest.raises(CorpusError) as raised:
        draft_vocab(source, tmp_path / "out.npy", size=2)
    assert str(raised.value) == f"{source}:2: token id -3 is negative"


@pytest.mark.parametrize("file_format", ["jsonl", "parquet"])
def test_the_counts_of_an_export_are_as_long_as_the_tokenizer_given(corpus: Corpus, tmp_path: Path,  # noqa: F811
                                                                    tiny_model_dir: Path, file_format: str) -> None:
    """The .npy is one count per id of the tokenizer, as for a corpus: with --tokenizer an export's counts were as
    long as its largest id plus one. Without one the vocabulary is unknown, and the report says so."""
    export_corpus(corpus, "speculators-tokens", tmp_path / "export", file_format=file_format)
    from_corpus = draft_vocab(corpus.root, tmp_path / "corpus.npy", size=10)
    given = draft_vocab(tmp_path / "export", tmp_path / "export.npy", size=10, tokenizer=tiny_model_dir)
    assert np.array_equal(np.load(tmp_path / "export.npy"), np.load(tmp_path / "corpus.npy"))
    assert len(np.load(tmp_path / "export.npy")) == 6007 == given.coverage["target_vocab_size"]
    assert given.describe().startswith("top 10 of 6,007 tokens covers ")
    alone = draft_vocab(tmp_path / "export", tmp_path / "alone.npy", size=10)
    counts = np.load(tmp_path / "alone.npy")
    assert len(counts) == int(np.flatnonzero(counts)[-1]) + 1 < 6007 and alone.coverage["target_vocab_size"] is None
    assert alone.describe().startswith("top 10 tokens (of a vocabulary --tokenizer would name) covers ")
    assert alone.coverage["coverage"] == given.coverage["coverage"] == from_corpus.coverage["coverage"]


@pytest.mark.parametrize("out", ["freq.npy", "freq.json", "freq.pt", "speculators"])
def test_a_draft_larger_than_the_vocabulary_is_refused_for_every_output(corpus: Corpus, tmp_path: Path,  # noqa: F811
                                                                        out: str) -> None:
    """The frequency file took a draft of any size (its coverage then 100%) where speculators' files refused it:
    both refuse, before counting, naming the vocabulary the draft is chosen from."""
    vocabulary = {"speculators": "6,016 tokens: the vocab_size of "}.get(out, "6,007 tokens: the tokenizer ")
    completed = vocab_cli(corpus.root, "--size", "7000", "--out", tmp_path / out)
    assert completed.returncode == 2
    assert completed.stderr.startswith(f"error: --draft-vocab-size 7,000 exceeds the vocabulary it is chosen from "
                                       f"({vocabulary}")
    assert list(tmp_path.iterdir()) == []
    largest = 6016 if out == "speculators" else 6007
    assert vocab_cli(corpus.root, "--size", str(largest), "--out", tmp_path / out).returncode == 0


@pytest.mark.parametrize(("given", "problem"), [
    ("missing", "--tokenizer: no such directory"),
    ("Org/Model-1B", "--tokenizer: no such directory (it reads like a Hub model id: --tokenizer takes a local "
                     "directory; download the model first, e.g. huggingface-cli download Org/Model-1B "
                     "--local-dir DIR)"),
    ("file", "--tokenizer: not a directory"),
    ("empty", "--tokenizer: no tokenizer.json in this directory"),
])
@pytest.mark.parametrize("source", ["corpus", "export"])
def test_a_tokenizer_that_is_not_a_tokenizer_directory_says_what_it_is(corpus: Corpus, tmp_path: Path,  # noqa: F811
                                                                       given: str, problem: str, source: str) -> None:
    """A mistyped path or a Hub id read as "no chat template"."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    if source == "export":
        export_corpus(corpus, "speculators-tokens", tmp_path / "export")
    read = corpus.root if source == "corpus" else tmp_path / "export"
    tokenizer = given if given == "Org/Model-1B" else str(tmp_path / given)
    completed = subprocess.run([sys.executable, "-m", "corpus_builder", "vocab", str(read), "--tokenizer", tokenizer,
                                "--size", "10", "--out", str(tmp_path / "out.npy")], capture_output=True, text=True)
    assert completed.returncode == 2
    assert completed.stderr.startswith(f"error: {tokenizer}: {problem}"), completed.stderr
    assert not (tmp_path / "out.npy").exists()


# --- the file's figures by hand: per source, reasoning and answer, coverage, the draft's mappings ----------------

def counted_by_hand() -> Frequencies:
    """Two sources over six ids: a (a turn of 4 supervised, its first 2 reasoning, after 1 prompt token; and one
    turn of reasoning alone) and bb (3 answer tokens)."""
    frequencies = Frequencies.empty(6)
    frequencies.add("a", [TurnRow("a/1", 1, [3, 1, 2, 2, 3], 1, 2, True)])
    frequencies.add("bb", [TurnRow("b/1", 1, [4, 4, 5], 0, 0, False)])
    frequencies.add("a", [TurnRow("a/3", 3, [5], 0, 1, True)])
    return frequencies


def test_reasoning_answer_and_sources_are_counted_apart() -> None:
    frequencies = counted_by_hand()
    assert frequencies.total.tolist() == [0, 1, 2, 1, 2, 2] and frequencies.total.dtype == np.int64  # exact counts
    assert frequencies.reasoning is not None and frequencies.reasoning.tolist() == [0, 1, 1, 0, 0, 1]
    assert frequencies.reasoning.dtype == np.int64
    assert {name: [part.tolist() for part in parts] for name, parts in frequencies.by_source.items()} == {
        "a": [[0, 1, 1, 0, 0, 1], [0, 0, 1, 1, 0, 0]], "bb": [[0] * 6, [0, 0, 0, 0, 2, 1]]}
    assert {part.dtype for parts in frequencies.by_source.values() for part in parts} == {np.dtype(np.int64)}


def test_the_report_s_figures_and_text_by_hand() -> None:
    """The top 2 of counts 0,1,2,1,2,2 are ids 2 and 4 (ties to the lower id): 4 of 8 supervised tokens, 1 of 3
    reasoning, 3 of 5 answer; a source without reasoning has no reasoning coverage (not 0%)."""
    report = vocab_report(counted_by_hand(), 2)
    assert report == {
        "draft_vocab_size": 2, "target_vocab_size": 6, "supervised_tokens": 8, "reasoning_tokens": 3,
        "answer_tokens": 5, "distinct_tokens": 5, "coverage": 0.5, "reasoning_coverage": 0.333333,
        "answer_coverage": 0.6, "by_source": {
            "a": {"supervised_tokens": 5, "reasoning_tokens": 3, "answer_tokens": 2, "distinct_tokens": 4,
                  "coverage": 0.4, "reasoning_coverage": 0.333333, "answer_coverage": 0.5},
            "bb": {"supervised_tokens": 3, "reasoning_tokens": 0, "answer_tokens": 3, "distinct_tokens": 2,
                   "coverage": 0.666667, "reasoning_coverage": None, "answer_coverage": 0.666667}}}
    assert format_vocab_report(report) == (
        "top 2 of 6 tokens covers 50.0% of 8 supervised tokens, 33.3% of reasoning tokens, 60.0% of answer tokens "
        "(5 distinct tokens supervised)\n"
        "\n"
        "source   supervised  coverage  reasoning   answer\n"
        "a                 5     40.0%      33.3%    50.0%\n"
        "bb                3     66.7%          -    66.7%")
    named = {**report, "by_source": {"a long source": report["by_source"]["a"]}}
    assert format_vocab_report(named).splitlines()[2:] == [
        "source          supervised  coverage  reasoning   answer",
        "a long source            5     40.0%      33.3%    50.0%"]
    export = {**report, "target_vocab_size": None, "reasoning_tokens": None, "by_source": {}}
    assert format_vocab_report(export) == ("top 2 tokens (of a vocabulary --tokenizer would name) covers 50.0% of 8 "
                                           "supervised tokens (5 distinct tokens supervised)")


def test_speculators_mappings_by_hand(tmp_path: Path) -> None:
    """The draft's ids: the most counted (ties to the lower id), made up with the lowest unsupervised ones, in id
    order; d2t the int64 offsets to them, t2d a bool per target id."""
    counts = np.array([0, 5, 0, 2, 5, 1], dtype=np.int64)
    d2t, t2d = speculators_mappings(counts, 3)
    assert (d2t.tolist(), d2t.dtype, t2d.tolist(), t2d.dtype) == (
        [1, 2, 2], np.int64, [False, True, False, True, True, False], np.bool_)
    assert speculators_mappings(counts, 5)[0].tolist() == [0, 0, 1, 1, 1]  # ids 0, 1, 3, 4, 5
    written = write_speculators_files(counts, tmp_path / "data", 3)
    assert [path.name for path in written] == ["token_freq.pt", "d2t-3.npy", "t2d-3.npy"]
    import torch

    assert torch.load(written[0], weights_only=True) == {1: 5, 3: 2, 4: 5, 5: 1}
    assert np.load(written[1]).tolist() == [1, 2, 2] and np.load(written[1]).dtype == np.int64
    assert np.load(written[2]).tolist() == [False, True, False, True, True, False]


@pytest.mark.parametrize(("config", "size"), [
    ({"vocab_size": 10}, 10), ({"text_config": {"vocab_size": 20}, "vocab_size": 10}, 20),
    ({"text_config": {"hidden_size": 8}, "vocab_size": 10}, 10), ({"vocab_size": 1}, 1),
    ({"vocab_size": 0}, "vocab_size is 0, not a positive integer"),
    ({"vocab_size": True}, "vocab_size is True, not a positive integer"),
    ([10], "vocab_size is None, not a positive integer"),
    ("{", "cannot read the model config: unexpected end of data: line 1 column 2 (char 1)"),
])
def test_the_verifier_s_vocab_size_is_read_as_speculators_reads_it(tmp_path: Path, config: Any,
                                                                   size: int | str) -> None:
    (tmp_path / "config.json").write_bytes(config.encode() if isinstance(config, str) else orjson.dumps(config))
    if isinstance(size, int):
        assert verifier_vocab_size(tmp_path) == size
    else:
        with pytest.raises(CorpusError) as refused:
            verifier_vocab_size(tmp_path)
        assert str(refused.value) == f"{tmp_path / 'config.json'}: {size}"
    assert verifier_vocab_size(tmp_path / "missing") is None


def test_speculators_files_from_a_corpus_in_process(corpus: Corpus, tmp_path: Path,  # noqa: F811
                                                    tiny_model_dir: Path) -> None:
    """What the speculators test checks through its own loader (skipped where speculators is not installed), checked
    here too: t2d as long as the config's vocab_size, the report of the directory and what it wrote."""
    report = draft_vocab(corpus.root, tmp_path / "vocab", size=16)
    assert report.file == tmp_path / "vocab" and report.coverage["target_vocab_size"] == 6016
    assert report.written == tuple(tmp_path / "vocab" / name for name in ("token_freq.pt", "d2t-16.npy", "t2d-16.npy"))
    assert set(report.to_json()) == {"draft_vocab_size", "target_vocab_size", "supervised_tokens", "reasoning_tokens",
                                     "answer_tokens", "distinct_tokens", "coverage", "reasoning_coverage",
                                     "answer_coverage", "by_source", "file", "written"}
    expected = by_hand(corpus, tmp_path / "by-hand")
    d2t, t2d = np.load(tmp_path / "vocab" / "d2t-16.npy"), np.load(tmp_path / "vocab" / "t2d-16.npy")
    chosen = sorted(sorted(expected, key=lambda i: (-expected[i], i))[:16])
    assert (np.arange(16) + d2t).tolist() == chosen and len(t2d) == 6016 and np.flatnonzero(t2d).tolist() == chosen


@pytest.mark.parametrize(("out", "largest", "vocabulary"), [
    ("freq.npy", 6007, "6,007 tokens: the tokenizer {tokenizer}"),
    ("vocab", 6016, "6,016 tokens: the vocab_size of {tokenizer}/config.json"),
])
def test_the_draft_may_be_as_large_as_the_vocabulary_and_no_larger(corpus: Corpus, tmp_path: Path,  # noqa: F811
                                                                   out: str, largest: int, vocabulary: str) -> None:
    tokenizer = corpus_token_rows(corpus).renderer.tokenizer_dir
    assert draft_vocab(corpus.root, tmp_path / out, size=largest).coverage["draft_vocab_size"] == largest
    (tmp_path / "refused").mkdir()
    for size in (largest + 1, None):  # None: the default, 32,000
        with pytest.raises(CorpusError) as refused:
            draft_vocab(corpus.root, tmp_path / "refused" / out, **({} if size is None else {"size": size}))
        assert str(refused.value) == (f"--draft-vocab-size {size or 32000:,} exceeds the vocabulary it is chosen from "
                                      f"({vocabulary.format(tokenizer=tokenizer)})")
    assert list((tmp_path / "refused").iterdir()) == []


def test_an_export_s_vocabulary_may_be_given_by_its_size(tmp_path: Path) -> None:
    source = write_token_rows(tmp_path / "train.jsonl", [{"input_ids": [1, 2], "loss_mask": [1, 1]}])
    report = draft_vocab(source, tmp_path / "out.npy", size=2, target_vocab_size=20)
    assert report.coverage["target_vocab_size"] == 20 and np.load(tmp_path / "out.npy").tolist() == [0, 1, 1] + [0] * 17
    write_token_rows(source, [{"input_ids": [25], "loss_mask": [1]}])
    with pytest.raises(CorpusError) as refused:
        draft_vocab(source, tmp_path / "again.npy", size=2, target_vocab_size=20)
    assert str(refused.value) == f"{source}:1: token id 25 is supervised but the vocabulary has 20 tokens " \
                                 "(--target-vocab-size)"


def test_speculators_files_need_the_verifier_s_vocabulary(tmp_path: Path, tiny_model_dir: Path) -> None:
    source = write_token_rows(tmp_path / "train.jsonl", [{"input_ids": [1, 2], "loss_mask": [1, 1]}])
    with pytest.raises(CorpusError) as refused:
        draft_vocab(source, tmp_path / "vocab", size=2)
    assert str(refused.value) == ("t2d has one entry per token of the verifier's vocabulary (no --tokenizer DIR): give "
                                  "--target-vocab-size N (its config's vocab_size) or --tokenizer with the model's "
                                  "config.json")
    tokenizer = tmp_path / "tokenizer"  # the tokenizer alone, without the model's config.json
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_bytes((tiny_model_dir / "tokenizer.json").read_bytes())
    with pytest.raises(CorpusError) as refused:
        draft_vocab(source, tmp_path / "vocab", size=2, tokenizer=tokenizer)
    assert str(refused.value).startswith(f"t2d has one entry per token of the verifier's vocabulary (no config.json "
                                         f"in {tokenizer}): ")
    with pytest.raises(CorpusError) as refused:  # the tokenizer is an input: nothing is written into it
        draft_vocab(source, tokenizer / "freq.npy", size=2, tokenizer=tokenizer)
    assert str(refused.value) == f"{tokenizer / 'freq.npy'}: --out: this run reads {tokenizer}; writing there would " \
                                 "overwrite its input"
    assert not (tmp_path / "vocab").exists()


def test_a_frequency_file_is_named_by_its_suffix_and_every_speculators_file_is_checked(corpus: Corpus,  # noqa: F811
                                                                                     tmp_path: Path) -> None:
    rule = ("--out: a frequency file must end in one of .npy, .json, .pt (or name a directory for speculators' "
            "token_freq.pt, d2t-N.npy and t2d-N.npy)")
    with pytest.raises(CorpusError) as refused:
        draft_vocab(corpus.root, tmp_path / "freq.txt", size=10)
    assert str(refused.value) == f"{tmp_path / 'freq.txt'}: {rule}"
    with pytest.raises(CorpusError) as refused:
        write_frequencies(np.array([1]), tmp_path / "freq.csv")
    assert str(refused.value) == f"{tmp_path / 'freq.csv'}: {rule}"
    (tmp_path / "vocab" / "t2d-10.npy").mkdir(parents=True)  # a directory where speculators' file goes
    with pytest.raises(CorpusError) as refused:
        draft_vocab(corpus.root, tmp_path / "vocab", size=10)
    assert str(refused.value) == f"{tmp_path / 'vocab' / 't2d-10.npy'}: --out: a directory; give the path of a file " \
                                 "to write"
    nul = str(tmp_path / "out\0x")
    with pytest.raises(CorpusError) as refused:
        draft_vocab(corpus.root, nul, size=10)
    assert str(refused.value) == f"{nul!r}: --out: the output path contains a NUL byte"
    write_frequencies(np.array([0, 5], dtype=np.int32), tmp_path / "freq.npy")
    assert np.load(tmp_path / "freq.npy").dtype == np.int64  # the file's type whatever the counts'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["freq.npy", "vocab"]


def test_a_missing_torch_stops_a_pt_output_before_counting_and_no_other(corpus: Corpus, tmp_path: Path,  # noqa: F811
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    assert draft_vocab(corpus.root, tmp_path / "freq.npy", size=10).written == (tmp_path / "freq.npy",)

    def counted(*_: object) -> None:
        raise AssertionError("counted before torch was found missing")

    monkeypatch.setattr(vocab, "count_frequencies", counted)
    needs = ("writing token_freq.pt (speculators' torch.save of {id: count}) needs torch: pip install torch (or write "
             "a .npy or .json frequency file)")
    for out in ("freq.pt", "vocab"):
        with pytest.raises(CorpusError) as refused:
            draft_vocab(corpus.root, tmp_path / out, size=10)
        assert str(refused.value) == needs


def test_counting_in_batches_of_any_size_gives_the_same_figures(corpus: Corpus,  # noqa: F811
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    rows = corpus_token_rows(corpus)
    whole = count_frequencies(corpus, rows)
    monkeypatch.setattr(vocab, "ROWS_PER_COUNT", 1)  # counted after every conversation
    each = count_frequencies(corpus, rows)
    assert whole.reasoning is not None and each.reasoning is not None
    assert (each.total.tolist(), each.reasoning.tolist()) == (whole.total.tolist(), whole.reasoning.tolist())
    assert {name: [part.tolist() for part in parts] for name, parts in each.by_source.items()} == {
        name: [part.tolist() for part in parts] for name, parts in whole.by_source.items()}


def test_a_corpus_whose_tokenizer_is_not_here_asks_for_one(corpus: Corpus, tmp_path: Path,  # noqa: F811
                                                          tiny_model_dir: Path) -> None:
    copy = Path(shutil.copytree(corpus.root, tmp_path / "corpus"))
    for name in ("recipe.yaml", "audit.json"):  # the path as the recipe gives it, and as the build resolved it
        text = (copy / name).read_text()
        for given in (tiny_model_dir, tiny_model_dir.resolve()):
            text = text.replace(str(given), "/nowhere/tokenizer")
        (copy / name).write_text(text)
    with pytest.raises(CorpusError) as refused:
        draft_vocab(copy, tmp_path / "freq.npy", size=10)
    assert str(refused.value) == f"{copy}: the corpus recipe names no target.tokenizer found here: give --tokenizer DIR"
    draft_vocab(copy, tmp_path / "given.npy", size=10, tokenizer=tiny_model_dir)  # as asked: counted with it
    draft_vocab(corpus.root, tmp_path / "here.npy", size=10)
    assert np.load(tmp_path / "given.npy").tolist() == np.load(tmp_path / "here.npy").tolist()


def test_an_export_s_vocabulary_is_the_tokenizer_given(tmp_path: Path, tiny_model_dir: Path) -> None:
    source = write_token_rows(tmp_path / "train.jsonl", [{"input_ids": [1, 6007], "loss_mask": [1, 1]}])
    with pytest.raises(CorpusError) as refused:
        draft_vocab(source, tmp_path / "out.npy", size=2, tokenizer=tiny_model_dir)
    assert str(refused.value) == (f"{source}:1: token id 6,007 is supervised but the vocabulary has 6,007 tokens "
                                  f"(the tokenizer {tiny_model_dir})")
