"""Slices the seed asked for: figures by input length (configurable edges, in the target's tokens as the server
counts them) and by turn, each with its count of requests; a slice too small for an interval says so."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from corpus_builder.errors import CorpusError
from corpus_builder.eval import evaluate, format_run, load_run
from corpus_builder.testing.fault_server import FaultServer

from .conftest import write_jsonl
from .test_eval_faults import corpus_cli

K = 3


def chat(words: int, index: int, turns: int = 1) -> dict[str, Any]:
    """A conversation whose last user turn has ``words`` words (the fault server counts a word a token, and 4 a
    message), answered ``turns`` times."""
    messages: list[dict[str, str]] = []
    for turn in range(turns):
        text = f"q{index} t{turn} " + " ".join(["w"] * (words - 2))
        messages += [{"role": "user", "content": text}, {"role": "assistant", "content": f"a{turn}"}]
    return {"messages": messages, "source": "mix"}


@pytest.fixture
def pack(tmp_path: Path) -> Path:
    # 10 short first answers (6 words: 10 tokens), 10 of 50 words (54), 2 of 300 (304), and 3 second answers of a
    # chat (its first turn, its answer and the second turn: 6 + 4, 1 + 4, 6 + 4 = 25 tokens)
    rows = [chat(6, i) for i in range(10)] + [chat(50, 10 + i) for i in range(10)]
    rows += [chat(300, 20 + i) for i in range(2)] + [chat(6, 30 + i, turns=2) for i in range(3)]
    return write_jsonl(tmp_path / "pack" / "pack.jsonl", rows)


def test_figures_by_input_length_and_turn_each_with_its_requests(pack: Path, tmp_path: Path) -> None:
    with FaultServer(speculative_tokens=K, accepted_per_draft=2) as a, \
            FaultServer(speculative_tokens=K, accepted_per_draft=1) as b:
        result = evaluate(pack, [a.base_url, b.base_url], temperature=0, modes=["non-thinking"],
                          length_edges=(20, 100), save_dir=tmp_path / "runs")
    run = result.run
    sent = {tuple(w.answers[0].input_tokens for w in run.windows if w.endpoint == head) for head in "AB"}
    assert sent == {(10,) * 10 + (54,) * 10 + (304,) * 2 + (25,) * 3}  # both heads were sent the same prompts
    requests = {f.group: f.requests for f in run.figures if f.endpoint == "A"}
    assert requests == {"all": 25, "source:mix": 25, "length:<20": 10, "length:20-100": 13, "length:>=100": 2,
                        "turn:1": 22, "turn:2": 3}
    assert [f.group for f in run.figures if f.endpoint == "B"] == list(requests)  # sources, lengths short first, turns
    ratios = {r.group: r.value for r in run.ratios if r.value.figure == "acceptance_rate_pooled"}
    assert ratios["length:<20"].pairs == 10 and ratios["length:<20"].low is not None  # enough for an interval
    assert ratios["length:<20"].ratio == pytest.approx(0.5)
    for small, pairs in (("length:>=100", 2), ("turn:2", 3)):
        assert ratios[small].ratio == pytest.approx(0.5) and ratios[small].pairs == pairs
        assert ratios[small].low is None and ratios[small].high is None
    text = format_run(run).splitlines()
    row = next(line for line in text if line.startswith("| non-thinking | B / A | turn:2 "))
    assert "0.500 (no interval: 3 prompts, under 10)" in row
    row = next(line for line in text if line.startswith("| non-thinking | B / A | length:<20 "))
    assert "0.500 [0.500, 0.500]" in row
    saved = orjson.loads(result.saved.read_bytes())
    assert saved["settings"]["length_edges"] == [20, 100] and [p["turn"] for p in saved["prompts"]][-4:] == [1, 2, 2, 2]
    assert load_run(result.saved) == run


def test_the_default_edges_and_a_bad_edge_list(pack: Path, tmp_path: Path) -> None:
    with FaultServer(speculative_tokens=K, accepted_per_draft=2) as server:
        run = evaluate(pack, [server.base_url], temperature=0, modes=["non-thinking"],
                       save_dir=tmp_path / "runs").run
        completed = corpus_cli("eval", str(pack), "--endpoint", server.base_url, "--length-edges", "30,10",
                               "--save-dir", str(tmp_path / "cli"))
        words = corpus_cli("eval", str(pack), "--endpoint", server.base_url, "--length-edges", "1k")
    assert run.settings.length_edges == (512, 2048, 8192, 32768)
    assert {f.group: f.requests for f in run.figures if f.group.startswith("length:")} == {"length:<512": 25}
    assert completed.returncode == 2 and "--length-edges 30,10: token counts above 0, ascending" in completed.stderr
    assert words.returncode == 2 and "'1k': whole numbers separated by commas" in words.stderr
    with pytest.raises(CorpusError, match="--length-edges 0,5"):
        evaluate(pack, [sys.executable], length_edges=(0, 5))
