"""A failure of the machinery is never reported as success: a dying server, rows out of retries, a second
build on the same directory, a full disk, an output path that cannot be written."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corpus_builder.assemble import build_corpus
from corpus_builder.errors import CorpusError
from corpus_builder.generate import GenerationIncomplete, Journal
from corpus_builder.layout import Corpus, iter_ledger
from corpus_builder.recipe import load_recipe
from corpus_builder.testing.fault_server import Fault, FaultServer
from tests.support.disks import grow, tmpfs
from tests.support.real_data import write_chitchat, write_rows
from tests.support.trials import corpus_rows, shard_hashes

MODEL = "tiny-target"
PROMPTS = 40


def write_recipe(root: Path, endpoint: str, *, out: str = "out", retries: int = 2, outage_s: float = 1.0,
                 extra: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    write_chitchat(root / "replay.jsonl", 20)
    write_rows(root / "prompts.jsonl", [{"messages": [{"role": "user", "content": f"question {i}?"}]}
                                        for i in range(PROMPTS)])
    path = root / "recipe.yaml"
    path.write_text(f"""\
name: failures
target:
  model: {MODEL}
  endpoints: [{endpoint}]
  generation: {{max_tokens: 32, concurrency: 4, timeout_s: 5, max_retries: {retries}, max_outage_s: {outage_s},
                on_length: keep{extra}}}
sources:
  - {{name: replay, kind: replay, path: replay.jsonl}}
  - {{name: prompts, kind: prompts, path: prompts.jsonl}}
split: {{validation_fraction: 0.2, seed: 0}}
output: {{dir: {out}}}
""", encoding="utf-8")
    return path


def test_a_server_that_dies_mid_build_fails_it_and_a_rerun_completes_it(tmp_path: Path) -> None:
    with FaultServer(model=MODEL) as steady:
        reference = build_corpus(load_recipe(write_recipe(tmp_path / "reference", steady.base_url)),
                                 progress=io.StringIO())
    with FaultServer(model=MODEL, die_after=15) as dying:
        recipe = load_recipe(write_recipe(tmp_path / "run", dying.base_url))
        started = time.monotonic()
        with pytest.raises(GenerationIncomplete) as stopped:
            build_corpus(recipe, progress=io.StringIO())
        assert time.monotonic() - started < 30  # stopped by the outage bound, not after every row's retries
        message = str(stopped.value)
        assert "no endpoint has answered" in message and "rerun to resume" in message
        assert f"of {PROMPTS} generated rows unfinished" in message
        out = tmp_path / "run" / "out"
        assert not (out / "manifest.json").exists() and not (out / "data").exists()  # nothing looks complete
        with Journal(out / "journal") as journal:
            kept = len(journal)
        assert 0 < kept <= 15  # the turns answered before the crash, journaled
        dying.die_after = None
        dying.revive()
        before = len(dying.chat_requests)
        result = build_corpus(recipe, progress=io.StringIO())
        assert len(dying.chat_requests) - before == PROMPTS - kept  # only what never finished
    assert corpus_rows(result.out_dir) == corpus_rows(reference.out_dir)  # none lost, none duplicated
    assert result.manifest.section("partial") is None


def test_rows_out_of_retries_fail_the_build_unless_a_partial_corpus_is_accepted(tmp_path: Path) -> None:
    with FaultServer(model=MODEL, by_prompt={"question 7?": Fault("500", times=100)}) as server:
        recipe = load_recipe(write_recipe(tmp_path, server.base_url, retries=1, outage_s=60))
        with pytest.raises(GenerationIncomplete, match="1 generated rows are unfinished"):
            build_corpus(recipe, progress=io.StringIO())
        assert not (tmp_path / "out" / "manifest.json").exists()
        result = build_corpus(recipe, progress=io.StringIO(), allow_partial=True)
        assert result.manifest.section("partial") == {"unfinished_rows": 1}
        assert Corpus.open(result.out_dir).manifest.section("partial") == {"unfinished_rows": 1}
        ledger = [r for r in iter_ledger(result.out_dir / "ledger.jsonl.zst") if r["reason"] == "unfinished"]
        assert len(ledger) == 1 and "HTTP 500" in ledger[0]["detail"] and ledger[0]["location"] == "prompts.jsonl:8"
        # The recipe can accept it too; the other 39 rows come from the journal.
        before = len(server.chat_requests)
        again = build_corpus(load_recipe(write_recipe(tmp_path, server.base_url, retries=1, outage_s=60,
                                                      extra=", allow_partial: true")), progress=io.StringIO())
        assert again.manifest.section("partial") == {"unfinished_rows": 1} and len(server.chat_requests) - before == 2
    from corpus_builder.publish import CorpusDocuments, render_card

    assert "> **Partial corpus**: 1 generated rows are missing" in render_card(CorpusDocuments.load(again.out_dir))


def server_url_unreachable() -> str:
    """A loopback port nothing listens on."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def test_a_second_build_on_the_same_directory_refuses_at_once(tmp_path: Path) -> None:
    with FaultServer(model=MODEL, by_prompt={f"question {i}?": Fault("stall") for i in range(4)},
                     stall_s=1.5) as slow:
        recipe_path = write_recipe(tmp_path, slow.base_url, outage_s=60)
        first = subprocess.Popen([sys.executable, "-m", "corpus_builder", "build", str(recipe_path)],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            while not slow.chat_requests:  # the first build is generating
                time.sleep(0.02)
                assert first.poll() is None, first.stdout.read() if first.stdout else ""
            started = time.monotonic()
            with pytest.raises(CorpusError, match=r"another corpus build \(pid \d+\) is writing to this directory"):
                build_corpus(load_recipe(recipe_path), progress=io.StringIO())
            assert time.monotonic() - started < 1.0
            output = first.communicate(timeout=120)[0]
        finally:
            if first.poll() is None:
                first.kill()
        assert first.returncode == 0, output
    corpus = Corpus.open(tmp_path / "out")
    assert corpus.verify_files() == [] and corpus.manifest.conversations > PROMPTS - 5


def test_a_failed_first_build_leaves_nothing_behind(tmp_path: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path, server_url_unreachable(), outage_s=60))
    with pytest.raises(CorpusError, match="preflight failed"):
        build_corpus(recipe, progress=io.StringIO())
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["a file in the way", "/proc", "a NUL byte"])
def test_an_output_path_that_cannot_be_written_is_a_user_error(tmp_path: Path, where: str) -> None:
    (tmp_path / "blocker").write_text("a file")
    out = {"a file in the way": tmp_path / "blocker" / "out", "/proc": Path("/proc/corpus-out"),
           "a NUL byte": tmp_path / "out\0x"}[where]
    recipe_path = write_recipe(tmp_path, server_url_unreachable())
    (tmp_path / "recipe.yaml").write_text((tmp_path / "recipe.yaml").read_text().replace(
        "  - {name: prompts, kind: prompts, path: prompts.jsonl}\n", ""))
    with pytest.raises(CorpusError):
        build_corpus(load_recipe(recipe_path), out, progress=io.StringIO())
    if where != "a NUL byte":
        completed = subprocess.run([sys.executable, "-m", "corpus_builder", "build", str(recipe_path), "--out",
                                    str(out)], capture_output=True, text=True)
        assert completed.returncode == 2 and "Traceback" not in completed.stderr
        assert completed.stderr.startswith("error: ") and str(out) in completed.stderr


@pytest.fixture()
def small_disk(tmp_path: Path):
    """A 6 MiB tmpfs (a real full disk) that ``grow`` enlarges."""
    with tmpfs(tmp_path / "disk", "6m") as mount:
        yield mount


def test_a_full_disk_mid_build_is_a_clean_error_and_a_rerun_with_space_completes(tmp_path: Path,
                                                                                   small_disk: Path) -> None:
    with FaultServer(model=MODEL) as server:
        recipe_path = write_recipe(tmp_path, server.base_url, out=str(small_disk / "out"), outage_s=60)
        # turns of random hex (half compressible): the build's spool of kept rows (~4 MB) fits in the 6 MiB,
        # the spool and the shards do not, so the disk fills while the corpus is written, after generation
        write_rows(tmp_path / "replay.jsonl", [{"messages": [{"role": "user", "content": f"row {i}"},
                                                             {"role": "assistant", "content": os.urandom(1000).hex()}]}
                                               for i in range(4000)])
        recipe = load_recipe(recipe_path)
        reference = build_corpus(recipe, tmp_path / "reference", progress=io.StringIO())
        requests = len(server.chat_requests)
        with pytest.raises(CorpusError, match="No space left on device") as caught:
            build_corpus(recipe, progress=io.StringIO())
        assert "rerun" in str(caught.value) and "Traceback" not in str(caught.value)
        out = small_disk / "out"
        assert not (out / "manifest.json").exists() and not (out / "data").exists()
        with Journal(out / "journal") as journal:  # it loads, whole: every generation of the failed run
            assert len(journal) == PROMPTS
        grow(small_disk)
        result = build_corpus(recipe, progress=io.StringIO())
        assert len(server.chat_requests) == 2 * requests  # the rerun asked for nothing: all journaled
    assert shard_hashes(result.out_dir) == shard_hashes(reference.out_dir)


def test_a_commit_cut_short_never_leaves_a_directory_that_looks_complete(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Whichever file move fails (shards renamed in staging, then data, audit, recipe, ledger and manifest moved
    into place), the directory holds either the earlier corpus, whole, or no manifest at all."""
    from corpus_builder.assemble import pipeline

    recipe_path = write_recipe(tmp_path, server_url_unreachable())
    (tmp_path / "recipe.yaml").write_text((tmp_path / "recipe.yaml").read_text().replace(
        "  - {name: prompts, kind: prompts, path: prompts.jsonl}\n", ""))
    build_corpus(load_recipe(recipe_path), progress=io.StringIO())
    earlier = corpus_rows(tmp_path / "out")
    write_chitchat(tmp_path / "replay.jsonl", 25)  # the next build differs
    real_replace = os.replace
    calls = {"n": 0, "failing": 0}

    def replace(source: object, destination: object) -> None:
        calls["n"] += 1
        if calls["n"] == calls["failing"]:
            raise OSError(28, "No space left on device", str(destination))
        real_replace(source, destination)  # type: ignore[arg-type]

    monkeypatch.setattr(pipeline.os, "replace", replace)
    build_corpus(load_recipe(recipe_path), tmp_path / "count", progress=io.StringIO())
    moves = calls["n"]
    assert moves >= 7  # two shards (train, validation) and five corpus files
    for failing in range(1, moves + 1):
        calls.update(n=0, failing=failing)
        with pytest.raises(CorpusError, match="No space left on device"):
            build_corpus(load_recipe(recipe_path), progress=io.StringIO())
        out = tmp_path / "out"
        if (out / "manifest.json").exists():
            assert Corpus.open(out).verify_files() == [] and corpus_rows(out) == earlier, f"move {failing} of {moves}"
    calls.update(n=0, failing=0)
    build_corpus(load_recipe(recipe_path), progress=io.StringIO())  # a rerun completes
    assert Corpus.open(tmp_path / "out").verify_files() == [] and corpus_rows(tmp_path / "out") != earlier


def test_a_full_temporary_directory_fails_the_build_cleanly(tmp_path: Path) -> None:
    """The exact dedup keeps its row keys in a temporary file (``TMPDIR``): a full disk there fails the build with
    the user error naming the directory, and nothing is written; a rerun with room completes."""
    write_rows(tmp_path / "replay.jsonl", [{"messages": [{"role": "user", "content": f"question {i}?"},
                                                         {"role": "assistant", "content": f"answer {i}."}]}
                                           for i in range(20_000)])
    (tmp_path / "recipe.yaml").write_text(f"""\
name: full-tmp
target: {{model: {MODEL}}}
sources:
  - {{name: replay, kind: replay, path: replay.jsonl}}
output: {{dir: out}}
""", encoding="utf-8")
    command = [sys.executable, "-m", "corpus_builder", "build", str(tmp_path / "recipe.yaml")]
    with tmpfs(tmp_path / "tmp", "64k") as small:  # 20,000 keys of ~30 bytes do not fit
        failed = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "TMPDIR": str(small)})
    assert failed.returncode == 2, failed.stderr
    assert failed.stderr.startswith(f"error: {small}: ") and "No space left on device" in failed.stderr
    assert "Traceback" not in failed.stderr
    assert not (tmp_path / "out" / "manifest.json").exists() and not (tmp_path / "out" / "data").exists()
    completed = subprocess.run(command, capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
    assert len(corpus_rows(tmp_path / "out")) == 20_000
