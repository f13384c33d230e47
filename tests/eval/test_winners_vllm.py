"""Which drafter wins where, on real vLLM (CPU) servers serving the real small model (SmolLM2-135M-Instruct, the
``real_model_dir`` fixture): one speculating with n-gram prompt lookup, one with a draft model (SmolLM2 drafting for
itself: the suite serves no smaller model of its tokenizer), on a pack of copy-heavy long prompts (a document to
repeat verbatim) and short chats.

Only what the eval guarantees is asserted, never a figure a near-tie could flip: each slice's cell names a winner
whose B / A interval excludes 1 on its side, or a tie whose interval holds 1, or says it has no interval; both
endpoints' counters are read (each response's own counts); the routing is stated. Two servers for the module
(about 3 GB each), both at once.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from corpus_builder.eval import Run, evaluate, format_run
from corpus_builder.generate.launcher import launched_server
from corpus_builder.recipe import LaunchSpec
from corpus_builder.testing.real_model import SERVER_ARGS

from ..conftest import REAL_SERVED_MODEL
from .conftest import write_jsonl

pytestmark = pytest.mark.vllm

K = 3
PER_REQUEST_COUNTS = ("--per-request-spec-decode-metrics", "summary", "--enable-per-request-metrics")
DOCUMENTS = 12  # long prompts, then as many short chats: 10 or more a slice, for an interval
DOCUMENT_CHARS = 2400  # about 600 to 800 SmolLM2 tokens of Python source: over 512, within the 2,048 context
QUESTIONS = ("What is the capital of France?", "Name three primary colours.", "How many legs has a spider?",
             "What does a thermometer measure?", "Say hello in Spanish.", "Which planet is closest to the sun?",
             "What is two plus two?", "What colour is the sky on a clear day?", "Name a fruit that is yellow.",
             "What do bees make?", "How many days are in a week?", "What is ice made of?")


def documents() -> list[str]:
    """Long documents that exist on any machine with Python: the opening of stdlib modules' sources."""
    import argparse
    import calendar
    import csv
    import difflib
    import fractions
    import heapq
    import json as json_module
    import shlex
    import string
    import textwrap
    import uuid
    import zipfile

    modules = (argparse, calendar, csv, difflib, fractions, heapq, json_module, shlex, string, textwrap, uuid, zipfile)
    return [inspect.getsource(module)[:DOCUMENT_CHARS] for module in modules][:DOCUMENTS]


def serve(model: Path, speculative: dict[str, object], log_path: Path) -> Iterator[str]:
    spec = LaunchSpec(model_dir=model, args=(*SERVER_ARGS, "--speculative-config", json.dumps(speculative),
                                             *PER_REQUEST_COUNTS),
                      env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "1"}, startup_timeout_s=600.0)
    with launched_server(spec, REAL_SERVED_MODEL, log_path=log_path, reasoning_parser=None) as server:
        yield server.url


@pytest.fixture(scope="module")
def draft_model(real_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from serve(real_model_dir, {"method": "draft_model", "model": str(real_model_dir),
                                      "num_speculative_tokens": K},
                     tmp_path_factory.mktemp("draft-model") / "server.log")


@pytest.fixture(scope="module")
def ngram(real_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from serve(real_model_dir, {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4,
                                      "prompt_lookup_min": 2},
                     tmp_path_factory.mktemp("ngram") / "server.log")


def pack_rows() -> list[dict[str, object]]:
    ask = "Repeat this document verbatim, from its first line:"
    copy = [{"messages": [{"role": "user", "content": f"{ask}\n\n{text}"}], "source": "documents",
             "task": "summarization"} for text in documents()]
    chats = [{"messages": [{"role": "user", "content": question}], "source": "chat", "task": "chat"}
             for question in QUESTIONS]
    return copy + chats


WINNER = re.compile(r"(?P<who>A \(draft_model\)|B \(ngram\)|tie): B / A (?P<ratio>\d+\.\d{3}) "
                    r"(?:\[(?P<low>\d+\.\d{3}), (?P<high>\d+\.\d{3})\]"
                    r"|\(no interval: (?P<few>\d+) prompts, under 10\))")


def check_cell(cell: str) -> None:
    """A winner whose interval excludes 1 on its side, a tie whose interval holds 1, or a slice without one."""
    match = WINNER.fullmatch(cell)
    assert match, cell
    who, low, high = match["who"], match["low"], match["high"]
    if low is None or high is None:
        assert who == "tie" and int(match["few"]) < 10, cell
    elif who.startswith("B"):
        assert float(low) > 1, cell
    elif who.startswith("A"):
        assert float(high) < 1, cell
    else:
        assert float(low) <= 1 <= float(high), cell


def test_which_drafter_wins_where_on_real_servers(draft_model: str, ngram: str, real_model_dir: Path,
                                                  tmp_path: Path) -> None:
    pack = write_jsonl(tmp_path / "pack" / "pack.jsonl", pack_rows())
    result = evaluate(pack, [draft_model, ngram], temperature=0, max_tokens=64, modes=["non-thinking"],
                      save_dir=tmp_path / "runs")
    run: Run = result.run
    assert result.problems == ()
    # the speculators as the servers tell them; both counted by each response's own counts, every prompt answered
    assert [(e.speculator.method, e.speculator.num_speculative_tokens) for e in run.endpoints] == [
        ("draft_model", K), ("ngram", K)]
    assert [e.counters for e in run.endpoints] == ["per request", "per request"]
    for label in "AB":
        assert sorted(w.prompt for w in run.windows if w.endpoint == label) == list(range(2 * DOCUMENTS))
    # each response's own counts by position (its summary histogram) kept, and a window counted by them
    for window in run.windows:
        [answer] = window.answers
        assert answer.accepted_by_position == window.counters.accepted_by_position
        assert len(answer.accepted_by_position or ()) == K
    whole = {f.endpoint: f for f in run.figures if f.group == "all"}
    assert whole["A"].drafts > 0 and whole["B"].drafts > 0  # the eval refuses a server that drafted nothing
    assert whole["A"].mean_acceptance_length_per_request is not None
    assert whole["A"].accepted_histogram_per_request is not None and whole["B"].accepted_histogram_per_request
    # the documents are long, the chats short, as the server counted them
    lengths = {answer.prompt: answer.input_tokens for w in run.windows for answer in w.answers}
    assert all(512 <= (lengths[i] or 0) < 2048 for i in range(DOCUMENTS))
    assert all(0 < (lengths[i] or 0) < 512 for i in range(DOCUMENTS, 2 * DOCUMENTS))

    text = format_run(run).splitlines()
    start = next(i for i, line in enumerate(text) if line.startswith("which drafter wins where"))
    header = [c.strip() for c in text[start + 1].strip("|").split("|")]
    assert header == ["mode", "group", "requests", "mean acceptance length (pooled)",
                      "mean acceptance length (per request)", "output tok/s (pooled)", "output tok/s (per request)"]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text[start + 3:] if line.startswith("|")]
    groups = {row[1]: row for row in rows}
    assert {"all", "task:summarization", "task:chat", "length:<512", "length:512-2k"} <= groups.keys()
    assert groups["task:summarization"][2] == groups["task:chat"][2] == str(DOCUMENTS)
    for row in rows:
        for cell in row[3:]:
            check_cell(cell)
    routing = [line for line in text if line.startswith("routing, ")]
    assert len(routing) == 1 and routing[0].startswith("routing, non-thinking mode: ")
    assert re.search(r"everything else: (A \(draft_model\)|B \(ngram\)|no winner \(tie\))", routing[0])
