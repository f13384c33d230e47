"""Which drafter wins where: per mode and slice, the head with the higher mean acceptance length and output tok/s
where the interval excludes a tie, and the routing that implies (fault servers: one drafts long copy-heavy prompts
well, the other short chats)."""

from __future__ import annotations

import html
import re
from pathlib import Path

from corpus_builder.eval import evaluate, format_run
from corpus_builder.eval.html import write_run_page
from corpus_builder.testing.fault_server import FaultServer, Scripted

from .conftest import write_jsonl
from .runs import page_tables

K = 3
ANSWER = " ".join(f"w{i}" for i in range(23))
LONG = 12  # long prompts (copy-heavy: the n-gram head accepts all it drafts there), then short chats
SHORT = 12
TIED = 3  # a task too small for an interval


def prompt(kind: str, index: int) -> str:
    return f"{kind} {index} " + ("copy " * 600 if kind == "summarize" else "")


def rows() -> list[dict[str, object]]:
    kinds = [("summarize", "summarization", i) for i in range(LONG)] + [("chat", "chat", i) for i in range(SHORT)]
    kinds += [("math", "math", i) for i in range(TIED)]
    return [{"messages": [{"role": "user", "content": prompt(kind, i)}, {"role": "assistant", "content": "x"}],
             "source": "traffic", "task": task} for kind, task, i in kinds]


def server(method: str, long: int, short: int) -> FaultServer:
    answers = {prompt("summarize", i): Scripted(ANSWER, long) for i in range(LONG)}
    answers |= {prompt("chat", i): Scripted(ANSWER, short) for i in range(SHORT)}
    answers |= {prompt("math", i): Scripted(ANSWER, 1) for i in range(TIED)}
    info = {"speculative_config": {"method": method, "model": f"/heads/{method}", "num_speculative_tokens": K}}
    return FaultServer(speculative_tokens=K, answers=answers, server_info=info, max_model_len=8192)


def test_the_winner_per_slice_and_the_routing_it_implies(tmp_path: Path) -> None:
    pack = write_jsonl(tmp_path / "pack" / "pack.jsonl", rows())
    with server("eagle3", 1, 3) as eagle, server("ngram", 3, 0) as ngram:
        run = evaluate(pack, [eagle.base_url, ngram.base_url], temperature=0, modes=["non-thinking"],
                       length_edges=(512,), save_dir=tmp_path / "runs").run
    text = format_run(run).splitlines()
    table = text[next(i for i, line in enumerate(text) if line.startswith("which drafter wins where")) + 3:]
    cells = {row[1]: row for row in ([c.strip() for c in line.strip("|").split("|")] for line in table
                                     if line.startswith("|"))}
    won = {group: row[3].partition(":")[0] for group, row in cells.items()}  # mean acceptance length, pooled
    assert won["task:summarization"] == "B (ngram)" and won["length:>=512"] == "B (ngram)"
    assert won["task:chat"] == "A (eagle3)" and won["length:<512"] == "A (eagle3)"
    assert won["task:math"] == "tie"  # 3 prompts: no interval, so no winner
    assert won["all"] == "A (eagle3)"
    # each cell names B / A with its interval, or why it has none; both means are given
    assert re.fullmatch(r"B \(ngram\): B / A \d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]", cells["task:summarization"][3])
    assert cells["task:math"][3] == "tie: B / A 1.000 (no interval: 3 prompts, under 10)"
    # per request (each prompt weighs alike: A 4, 2, 2 and B 1, 4, 2 accepted lengths on chat, summary, math) the
    # whole pack is B / A (12 + 48 + 6) / (48 + 24 + 6): a tie at 27 prompts, where pooled (by verify steps) A wins
    assert cells["all"][4].startswith("tie: B / A 0.846 [")
    assert cells["task:chat"][4].startswith("A (eagle3): ") and cells["task:summarization"][4].startswith("B (ngram): ")
    assert text[-1] == ("routing, non-thinking mode: task:summarization: B (ngram); length:>=512: B (ngram); "
                        "everything else: A (eagle3) (per request: tie)")
    page = tmp_path / "run.html"
    write_run_page(page, run, "run", "eval")
    shown = dict(page_tables(page.read_text()))["acceptance-winners"]
    assert {row[1]: row[3] for row in shown[1:]} == {group: row[3] for group, row in cells.items()}
    assert html.escape(text[-1]) in page.read_text()


def test_one_head_has_no_winners(tmp_path: Path) -> None:
    pack = write_jsonl(tmp_path / "pack" / "pack.jsonl", rows()[:2])
    with server("eagle3", 1, 3) as eagle:
        run = evaluate(pack, [eagle.base_url], temperature=0, modes=["non-thinking"],
                       save_dir=tmp_path / "runs").run
    assert not any(line.startswith(("which drafter", "routing")) for line in format_run(run).splitlines())
