"""Every command that reads a built corpus reads its shards through one reader (``layout.Corpus``): a shard damaged
since the build, or a corpus a build is writing now, is a located error (exit 2) in each of them, never a traceback,
a figure of damaged rows, or an output blamed for its input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from corpus_builder.assemble import build_corpus
from corpus_builder.layout import Corpus, file_sha256
from corpus_builder.recipe import load_recipe
from tests.support.build_writing import build_writing

SHARD = "data/train-00000-of-00003.parquet"
PACK_SHARD = "eval/eval-00000-of-00001.parquet"
# The byte offsets flipped (into a shard's header, data pages, page index and footer): some fail to decode
# (zstd, thrift), most decode to other text without any error; every one is found.
OFFSETS = (0.0005, 0.005, 0.02, 0.08, 0.15, 0.5, 0.97, 0.998)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    directory = tmp_path_factory.mktemp("shards")
    rows = [{"messages": [{"role": "user", "content": f"What is {i} + {i}? Say it in words. " * 3},
                          {"role": "assistant", "content": f"It is {2 * i}. " * 20}]} for i in range(300)]
    (directory / "math.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (directory / "recipe.yaml").write_text(
        f"name: shards\ntarget: {{model: tiny-target, tokenizer: {tiny_model_dir}}}\n"
        "sources:\n  - {name: math, kind: replay, path: math.jsonl, license: MIT, task: math}\n"
        "eval: {rows: 20}\nsplit: {validation_fraction: 0.2}\noutput: {dir: out, rows_per_shard: 100}\n")
    out = build_corpus(load_recipe(directory / "recipe.yaml")).out_dir
    assert {info.path for info in Corpus.open(out).files} >= {SHARD} and (out / PACK_SHARD).is_file()
    return out


@pytest.fixture
def corpus(built: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(built, tmp_path / "corpus"))


def corpus_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corpus_builder", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def commands(corpus: Path, out: Path) -> dict[str, list[str | Path]]:
    """Each command that reads the corpus's shards or its pack, with the output it would write under ``out`` (made
    here: it stays empty)."""
    out.mkdir(exist_ok=True)
    return {
        "audit": ["audit", corpus],
        "vocab": ["vocab", corpus, "--size", "50", "--out", out / "freq.npy"],
        "eval": ["eval", corpus, "--endpoint", "http://127.0.0.1:9", "--save-dir", out / "runs"],  # read first
        "vllm-bench": ["export", corpus, "--format", "vllm-bench", "--out", out / "bench"],
        "export": ["export", corpus, "--format", "messages", "--out", out / "messages"],
    }


def flip(path: Path, where: float) -> None:
    data = bytearray(path.read_bytes())
    data[int(where * (len(data) - 1))] ^= 0x55
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", OFFSETS)
def test_a_flipped_byte_in_a_shard_is_named_by_every_command(corpus: Path, tmp_path: Path, where: float) -> None:
    flip(corpus / SHARD, where)
    for name in ("audit", "vocab", "export"):  # the eval and the bench export read the pack alone
        completed = corpus_cli(*commands(corpus, tmp_path / "out")[name])
        assert completed.returncode == 2, (name, completed.stderr)
        assert completed.stderr == (f"error: {corpus / SHARD}: the shard was changed or damaged since the build "
                                    "(its sha256 is not manifest.json's): restore it, or build the corpus again "
                                    "(generations are reused from its journal)\n"), (name, completed.stderr)
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("where", OFFSETS[::2])
def test_a_flipped_byte_in_the_eval_pack_is_named_by_every_command_that_reads_it(corpus: Path, tmp_path: Path,
                                                                                 where: float) -> None:
    flip(corpus / PACK_SHARD, where)
    for name in ("audit", "eval", "vllm-bench"):
        completed = corpus_cli(*commands(corpus, tmp_path / "out")[name])
        assert completed.returncode == 2, (name, completed.stderr)
        assert completed.stderr.startswith(f"error: {corpus / PACK_SHARD}: the eval pack shard was changed or "
                                           "damaged since the build"), (name, completed.stderr)
        assert "Traceback" not in completed.stderr
    assert list((tmp_path / "out").iterdir()) == []


def test_a_shard_cut_short_is_named_with_its_size(corpus: Path, tmp_path: Path) -> None:
    shard = corpus / SHARD
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[:-100])
    completed = corpus_cli("audit", corpus)
    assert completed.returncode == 2
    assert completed.stderr.startswith(f"error: {shard}: the shard was changed or damaged since the build "
                                       f"({size - 100:,} bytes, not the {size:,} of manifest.json)")


def test_a_shard_that_fails_to_decode_with_the_manifests_hash_is_named_not_blamed_on_the_output(
        corpus: Path, tmp_path: Path) -> None:
    """A shard the manifest vouches for that still fails to read (the manifest rewritten with it, a disk's read
    error): the reader names the shard and what pyarrow said; the export used to blame its own output file."""
    shard = corpus / SHARD
    data = bytearray(shard.read_bytes())
    data[int(0.005 * len(data))] ^= 0x55  # in the first data page: zstd refuses it
    shard.write_bytes(bytes(data))
    manifest = json.loads((corpus / "manifest.json").read_text())
    entry = next(entry for entry in manifest["files"] if entry["path"] == SHARD)
    entry["sha256"], entry["bytes"] = file_sha256(shard), shard.stat().st_size
    (corpus / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(OSError):  # pyarrow itself
        pq.read_table(shard)
    for name in ("audit", "vocab", "export"):
        completed = corpus_cli(*commands(corpus, tmp_path / "out")[name])
        assert completed.returncode == 2, (name, completed.stderr)
        assert completed.stderr.startswith(f"error: {shard}: cannot read shard: "), (name, completed.stderr)
        assert "Traceback" not in completed.stderr
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("state", ["rebuilding", "first build"])
def test_every_command_on_a_corpus_a_build_is_writing_names_the_build(corpus: Path, tmp_path: Path,
                                                                      state: str) -> None:
    """A rebuild keeps the old manifest until its commit; a first build has none yet: either way the command names
    the build (publish did; audit, vocab and eval called the corpus broken or read it as it was being replaced)."""
    with build_writing(corpus) as holder:
        if state == "first build":
            (corpus / "manifest.json").unlink()
        expected = f"error: a build is writing {corpus} now (pid {holder.pid}); wait for it to finish, then run the " \
                   "command again\n"
        for name, args in commands(corpus, tmp_path / "out").items():
            completed = corpus_cli(*args)
            assert (completed.returncode, completed.stderr) == (2, expected), name
        pack = corpus_cli("eval", corpus / PACK_SHARD, "--endpoint", "http://127.0.0.1:9")  # a file inside it
        assert (pack.returncode, pack.stderr) == (2, expected)
    assert list((tmp_path / "out").iterdir()) == []
