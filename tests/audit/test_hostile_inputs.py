"""`corpus audit` on hostile input (issue 18): options that can never fail, output paths that would destroy an
input, traffic with no readable rows, and the traffic reader taking exactly the rows the plain audit takes."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from corpus_builder.errors import CorpusError
from corpus_builder.layout import MANIFEST

from .fixtures import known_traffic, write_jsonl


def corpus_cli(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corpus_builder", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd)


@pytest.mark.parametrize("option", ["--min-thinking-share", "--max-divergence"])
@pytest.mark.parametrize("value", ["nan", "NaN", "-nan"])
def test_a_share_option_of_nan_is_refused(tmp_path: Path, option: str, value: str) -> None:
    """nan passes every range check and fails no comparison: as a limit it could never fail."""
    completed = corpus_cli("audit", tmp_path / "corpus", "--against", tmp_path / "traffic.jsonl", option, value)
    assert completed.returncode == 2, completed.stderr
    assert option in completed.stderr and "not a number from 0 to 1" in completed.stderr
    assert "Traceback" not in completed.stderr


@pytest.fixture
def own_corpus(corpus: Path, tmp_path: Path) -> Path:
    """A copy of the session's corpus: a test that fails may write into it."""
    return Path(shutil.copytree(corpus, tmp_path / "corpus"))


def own_tokenizer(tiny_model_dir: Path, directory: Path) -> Path:
    directory.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny_model_dir / name, directory / name)
    return directory


def snapshot(*paths: Path) -> dict[Path, bytes]:
    return {path: path.read_bytes() for root in paths for path in ([root] if root.is_file() else root.rglob("*"))
            if path.is_file()}


@pytest.mark.parametrize("target", ["manifest", "inside-corpus", "traffic", "traffic-glob", "recipe-source",
                                    "tokenizer-file", "inside-tokenizer", "fifo", "directory", "empty"])
def test_html_that_would_destroy_an_input_is_refused_before_the_audit(own_corpus: Path, tiny_model_dir: Path,
                                                                      tmp_path: Path, target: str) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    traffic = write_jsonl(logs / "day-1.jsonl", known_traffic())
    against = str(traffic)
    tokenizer = own_tokenizer(tiny_model_dir, tmp_path / "tokenizer")
    if target == "traffic-glob":
        against = str(logs / "day-*.jsonl")
    if target == "recipe-source":
        against = str(tmp_path / "serving.yaml")
        Path(against).write_text("name: serving\ntarget: {model: tiny/target}\nsources:\n"
                                 "  - {name: app, kind: replay, path: logs/day-1.jsonl, task: chat}\n"
                                 "output: {dir: unused}\n", encoding="utf-8")
    html = {"manifest": own_corpus / MANIFEST, "inside-corpus": own_corpus / "report.html", "traffic": traffic,
            "traffic-glob": traffic, "recipe-source": traffic, "tokenizer-file": tokenizer / "tokenizer.json",
            "inside-tokenizer": tokenizer / "report.html", "fifo": tmp_path / "fifo", "directory": tmp_path / "out",
            "empty": ""}[target]
    if target == "fifo":
        os.mkfifo(html)
    if target == "directory":
        Path(html).mkdir()
    before = snapshot(own_corpus, logs, tokenizer)
    completed = corpus_cli("audit", own_corpus, "--against", against, "--tokenizer", tokenizer, "--html", html)
    assert completed.returncode == 2, completed.stderr
    named = f"error: {html}: --html: " if html else "error: --html: the output path is empty"
    assert completed.stderr.startswith(named)
    assert "Traceback" not in completed.stderr and completed.stdout == ""  # refused before the audit ran
    assert snapshot(own_corpus, logs, tokenizer) == before
    if target == "fifo":
        assert stat.S_ISFIFO(os.stat(html).st_mode)
    assert not list(tmp_path.rglob("*.partial"))


def test_the_default_tokenizer_of_the_corpus_is_an_input_too(own_corpus: Path, tiny_model_dir: Path,
                                                              tmp_path: Path) -> None:
    """The corpus recipe's tokenizer (read when no --tokenizer is given) is as much an input as a given one."""
    tokenizer = own_tokenizer(tiny_model_dir, tmp_path / "tokenizer")
    for name in ("audit.json", "recipe.yaml"):  # the copy's tokenizer is a copy too: a failing test writes there
        recorded = own_corpus / name
        recorded.write_text(recorded.read_text().replace(str(tiny_model_dir.resolve()), str(tokenizer))
                            .replace(str(tiny_model_dir), str(tokenizer)))
    before = snapshot(tokenizer)
    completed = corpus_cli("audit", own_corpus, "--html", tokenizer / "tokenizer.json")
    assert completed.returncode == 2, completed.stderr
    assert f"--html: this run reads {tokenizer}; writing there would overwrite its input" in completed.stderr
    assert snapshot(tokenizer) == before


def test_an_html_path_that_fails_at_write_time_exits_2_and_leaves_no_partial(corpus: Path, tmp_path: Path) -> None:
    """A place the guard cannot tell is unwritable (/proc takes no new files, even from root) fails when the
    page is written: a message naming the path, exit 2, no partial file."""
    completed = corpus_cli("audit", corpus, "--html", "/proc/report.html")
    assert completed.returncode == 2, completed.stderr
    assert "error: /proc/report.html: cannot write the HTML report" in completed.stderr
    assert "Traceback" not in completed.stderr


def test_the_html_writer_turns_a_write_error_into_a_corpus_error_and_removes_its_partial(tmp_path: Path) -> None:
    from corpus_builder.audit import write_html_report

    report = {"corpus": {"label": "c", "conversations": 0, "thinking_share": 0.0, "reasoning_share": 0.0,
                         "by_source": {}, "skipped": {}}}
    target = tmp_path / "taken"
    target.mkdir()
    with pytest.raises(CorpusError) as caught:
        write_html_report(target, report, {}, "title")
    assert str(caught.value).startswith(f"{target}: cannot write the HTML report")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["taken"]
