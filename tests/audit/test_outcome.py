"""`check_corpus`: what `corpus audit` prints and exits on, from Python, with the command only parsing and printing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

from corpus_builder import AuditOptions, check_corpus
from corpus_builder.cli import cli
from corpus_builder.errors import CorpusError


def corpus_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corpus_builder", *args], capture_output=True, text=True)


def test_the_outcome_is_what_the_command_prints_and_exits_on(corpus: Path, traffic: Path, tmp_path: Path) -> None:
    outcome = check_corpus(corpus, against=str(traffic), max_divergence=0.5, html=tmp_path / "api.html")
    assert outcome.problems and all("exceeds --max-divergence 0.5" in problem for problem in outcome.problems)
    assert outcome.html == tmp_path / "api.html" and outcome.html.stat().st_size > 1_000_000
    printed = corpus_cli("audit", str(corpus), "--against", str(traffic), "--max-divergence", "0.5", "--json")
    assert printed.returncode == 1
    assert json.loads(printed.stdout) == json.loads(json.dumps(outcome.to_json()))
    assert [line.removeprefix("check failed: ") for line in printed.stderr.splitlines()] == outcome.problems
    text = corpus_cli("audit", str(corpus), "--against", str(traffic))
    assert text.returncode == 0 and text.stdout == outcome.describe() + "\n"


def test_a_plain_audit_has_no_comparison_unless_the_page_is_asked_for(corpus: Path, tmp_path: Path) -> None:
    plain = check_corpus(corpus, min_thinking_share=1.0)
    assert plain.comparison is None and plain.html is None and plain.to_json() == plain.report
    assert len(plain.problems) == 1 and plain.problems[0].startswith("thinking share ")
    assert "below the minimum 100.0%" in plain.problems[0]
    paged = check_corpus(corpus, html=tmp_path / "page.html")
    assert paged.comparison is not None and paged.to_json() == paged.report and not paged.problems
    assert paged.html is not None and paged.html.exists()


def test_a_limit_without_traffic_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="--max-divergence needs --against"):
        check_corpus(tmp_path / "missing", max_divergence=0.1)


def test_the_commands_defaults_are_the_apis() -> None:
    """One home per default: the options `corpus audit` declares mean what AuditOptions() means."""
    audit = cli.commands["audit"]
    assert isinstance(audit, click.Command)
    defaults = {param.name: param.default for param in audit.params}
    options = AuditOptions()
    assert (defaults["token_sample"], defaults["copy_span_tokens"], defaults["draft_vocab_size"],
            defaults["max_skipped_share"]) == (options.token_sample, options.span_tokens, options.draft_vocab_size,
                                               options.max_skipped_share)
