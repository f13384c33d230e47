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
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from corpus_builder import draft_vocab
from corpus_builder.errors import CorpusError
from corpus_builder.export import corpus_token_rows, export_corpus
from corpus_builder.export.vocab import count_frequencies, top_k, vocab_report, write_frequencies
from corpus_builder.layout import Corpus
from tests.build.test_failures import small_disk  # noqa: F401  (a 6 MiB tmpfs: a real full disk)
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
