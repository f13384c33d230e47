"""The recipe declares the corpus and the build meets it: per-source targets after every drop (top-ups from a
prompt pool, fewer or more replay rows), a thinking share within its tolerance, or a report before writing."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from corpus_builder.build import build
from corpus_builder.build.collect import MixtureShort
from corpus_builder.layout import Corpus
from corpus_builder.recipe import load_recipe
from corpus_builder.testing.fault_server import Fault, FaultServer
from corpus_builder.testing.trials import shard_hashes
from tests.support.real_data import write_rows

MODEL = "tiny-target"


def write_sources(root: Path, *, prompts: int = 60, replay_thinking: int = 40, replay_plain: int = 60) -> None:
    write_rows(root / "prompts.jsonl", [{"messages": [{"role": "user", "content": f"question {i}?"}]}
                                        for i in range(prompts)])
    rows = [{"messages": [{"role": "user", "content": f"log {i}"},
                          {"role": "assistant", "content": f"<think>why {i}</think>answer {i}"}]}
            for i in range(replay_thinking)]
    rows += [{"messages": [{"role": "user", "content": f"chat {i}"}, {"role": "assistant", "content": f"reply {i}"}]}
             for i in range(replay_plain)]
    write_rows(root / "replay.jsonl", rows)


def write_recipe(root: Path, endpoint: str, *, prompts_target: str = "{count: 20}", replay_target: str = "",
                 mixture: str = "{}", thinking_off: float = 0.0) -> Path:
    replay = f", target: {replay_target}" if replay_target else ""
    (root / "recipe.yaml").write_text(f"""\
name: declared
target:
  model: {MODEL}
  endpoints: [{endpoint}]
  generation: {{max_tokens: 16, timeout_s: 5, max_retries: 1}}
sources:
  - {{name: replay, kind: replay, path: replay.jsonl{replay}}}
  - {{name: asks, kind: prompts, path: prompts.jsonl, target: {prompts_target}, thinking_off_share: {thinking_off}}}
mixture: {mixture}
split: {{validation_fraction: 0.2, seed: 0}}
output: {{dir: out}}
""", encoding="utf-8")
    return root / "recipe.yaml"


def unclosed_every(step: int, count: int) -> dict[str, Fault]:
    """Prompts whose answer never leaves its think block: the default check drops those rows."""
    return {f"question {i}?": Fault("unclosed", times=100) for i in range(0, count, step)}


def test_drops_are_topped_up_from_the_pool_and_a_rerun_asks_for_nothing(tmp_path: Path) -> None:
    write_sources(tmp_path)
    with FaultServer(model=MODEL, by_prompt=unclosed_every(4, 60)) as server:  # a quarter of the pool is dropped
        recipe = load_recipe(write_recipe(tmp_path, server.base_url))
        result = build(recipe, progress=io.StringIO())
        asked = len(server.chat_requests)
        again = build(recipe, progress=io.StringIO())
        assert len(server.chat_requests) == asked  # every round is in the journal
    rows = list(Corpus.open(result.out_dir).iter_conversations())
    generated = [row for row in rows if row.source == "asks"]
    assert len(generated) == 20  # the declared count, after the drops
    dropped = Counter(r["reason"] for r in _ledger(result.out_dir) if r["source"] == "asks")
    assert dropped["unclosed_think"] == asked - 20  # every extra request replaced a drop, none wasted
    assert asked <= 20 + -(-dropped["unclosed_think"] * 11 // 10)
    declared = result.manifest["mixture"]["sources"]["asks"]
    assert (declared["declared"], declared["reached"], declared["generated_rows"]) == (20, 20, asked)
    assert result.manifest["mixture"]["sources"]["replay"]["reached"] == 100  # no target: every kept row
    assert shard_hashes(again.out_dir) == shard_hashes(result.out_dir)  # same recipe and journal: the same bytes


def test_an_exhausted_pool_fails_before_writing_unless_short_is_allowed(tmp_path: Path) -> None:
    write_sources(tmp_path, prompts=30)
    with FaultServer(model=MODEL, by_prompt=unclosed_every(3, 30)) as server:
        recipe_path = write_recipe(tmp_path, server.base_url, prompts_target="{count: 25}")
        with pytest.raises(MixtureShort) as short:
            build(load_recipe(recipe_path), progress=io.StringIO())
        message = str(short.value)
        assert "source 'asks': 20 rows pass every check, 25 declared (30 generated, the pool is exhausted)" in message
        assert "asks: 20 rows reached of 25 declared" in message
        assert not (tmp_path / "out" / "manifest.json").exists()
        completed = subprocess.run([sys.executable, "-m", "corpus_builder", "build", str(recipe_path)],
                                   capture_output=True, text=True)
        assert completed.returncode == 1 and "cannot be met" in completed.stderr  # exit 1: the corpus falls short
        assert "Traceback" not in completed.stderr
        written = subprocess.run([sys.executable, "-m", "corpus_builder", "build", str(recipe_path), "--allow-short"],
                                 capture_output=True, text=True)
        assert written.returncode == 0, written.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["short"] == ["source 'asks': 20 rows pass every check, 25 declared (30 generated, the pool "
                                 "is exhausted)"]
    assert manifest["mixture"]["sources"]["asks"]["reached"] == 20


@pytest.mark.parametrize("per_split", [False, True])
def test_a_thinking_share_is_met_with_thinking_off_prompts_in_the_mix(tmp_path: Path, per_split: bool) -> None:
    """Replay has 40% thinking rows, the prompts a third thinking off: the build takes the replay rows that
    bring the whole (and, per split, each split) within 45% +- 2%."""
    write_sources(tmp_path, prompts=90, replay_thinking=120, replay_plain=180)
    mixture = f"{{thinking_share: {{target: 0.45, tolerance: 0.02, per_split: {str(per_split).lower()}}}, seed: 2}}"
    with FaultServer(model=MODEL) as server:
        result = build(load_recipe(write_recipe(tmp_path, server.base_url, prompts_target="{count: 60}",
                                                replay_target="{count: 140}", mixture=mixture, thinking_off=0.33)),
                       progress=io.StringIO())
    rows = list(Corpus.open(result.out_dir).iter_conversations())
    assert len(rows) == 200 and Counter(row.source for row in rows) == {"replay": 140, "asks": 60}
    share = sum(row.thinking for row in rows) / len(rows)
    assert abs(share - 0.45) <= 0.02
    assert abs(result.audit["thinking_share"] - share) < 1e-9
    off = sum(not row.provenance["generation"]["enable_thinking"] for row in rows if row.source == "asks")
    assert 10 <= off <= 30  # thinking off rows are in the mix, and counted as such
    if per_split:
        for split in ("train", "validation"):
            in_split = [row for row in rows if row.split == split]
            assert abs(sum(row.thinking for row in in_split) / len(in_split) - 0.45) <= 0.02, split
    assert result.manifest["mixture"]["thinking_share"]["reached"] == pytest.approx(share, abs=1e-6)


def test_shares_of_the_final_corpus(tmp_path: Path) -> None:
    write_sources(tmp_path, prompts=40)
    with FaultServer(model=MODEL) as server:
        result = build(load_recipe(write_recipe(tmp_path, server.base_url, prompts_target="{share: 0.25}",
                                                replay_target="{share: 0.75}", mixture="{total: 80}")),
                       progress=io.StringIO())
        assert len(server.chat_requests) == 20  # no more asked than the share needs
    assert Counter(row.source for row in Corpus.open(result.out_dir).iter_conversations()) == {"replay": 60,
                                                                                                "asks": 20}


def test_a_top_up_moves_no_other_row_across_the_split(tmp_path: Path) -> None:
    write_sources(tmp_path)
    with FaultServer(model=MODEL) as server:
        first = build(load_recipe(write_recipe(tmp_path, server.base_url)), progress=io.StringIO())
        before = {row.id: row.split for row in Corpus.open(first.out_dir).iter_conversations()}
        more = build(load_recipe(write_recipe(tmp_path, server.base_url, prompts_target="{count: 25}")),
                     progress=io.StringIO())
    after = {row.id: row.split for row in Corpus.open(more.out_dir).iter_conversations()}
    assert set(before) < set(after) and all(after[row_id] == split for row_id, split in before.items())


def _ledger(out: Path) -> list[dict]:
    from corpus_builder.layout import iter_ledger

    return list(iter_ledger(out / "ledger.jsonl.zst"))




@pytest.mark.parametrize(("edit", "problem"), [
    (", take: {count: 5}", "remove take"),
    (", thinking_off_share: 0.2", "only prompts sources are generated"),
])
def test_a_declared_corpus_that_cannot_be_computed_is_refused_by_validate(tmp_path: Path, edit: str,
                                                                          problem: str) -> None:
    write_sources(tmp_path)
    recipe = write_recipe(tmp_path, "http://127.0.0.1:9/v1", replay_target="{count: 10}")
    recipe.write_text(recipe.read_text().replace("replay.jsonl, target: {count: 10}",
                                                 f"replay.jsonl, target: {{count: 10}}{edit}"))
    completed = subprocess.run([sys.executable, "-m", "corpus_builder", "validate", str(recipe)],
                               capture_output=True, text=True)
    assert completed.returncode == 2 and problem in completed.stderr


def test_shares_without_room_are_refused(tmp_path: Path) -> None:
    write_sources(tmp_path)
    recipe = write_recipe(tmp_path, "http://127.0.0.1:9/v1", prompts_target="{share: 0.5}",
                          replay_target="{share: 0.5}")
    completed = subprocess.run([sys.executable, "-m", "corpus_builder", "validate", str(recipe)],
                               capture_output=True, text=True)
    assert completed.returncode == 2 and "set mixture.total" in completed.stderr


def test_the_card_shows_declared_vs_reached_and_marks_a_short_corpus(tmp_path: Path) -> None:
    from corpus_builder.publish import CorpusDocuments, render_card

    write_sources(tmp_path, prompts=30)
    with FaultServer(model=MODEL, by_prompt=unclosed_every(3, 30)) as server:
        result = build(load_recipe(write_recipe(tmp_path, server.base_url, prompts_target="{count: 25}")),
                       progress=io.StringIO(), allow_short=True)
    card = render_card(CorpusDocuments.load(result.out_dir))
    assert "> **Short of its recipe**" in card and "25 declared (30 generated, the pool is exhausted)" in card
    assert "## Declared and reached" in card and "| asks | 25 | 20 | 20 | 30 |" in card
