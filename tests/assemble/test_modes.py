"""Thinking on and off in one corpus, and sampling as a declared mixture: each row draws its mode by its own id,
is asked that way, records it, and a rebuild asks for nothing."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

from corpus_builder.assemble import build_corpus
from corpus_builder.layout import Corpus
from corpus_builder.recipe import load_recipe
from corpus_builder.testing.fault_server import FaultServer
from tests.support.real_data import write_rows

MODEL = "tiny-target"


def write_recipe(root: Path, endpoint: str) -> Path:
    write_rows(root / "prompts.jsonl", [{"messages": [{"role": "user", "content": f"question {i}?"}]}
                                        for i in range(200)])
    (root / "recipe.yaml").write_text(f"""\
name: modes
target:
  model: {MODEL}
  endpoints: [{endpoint}]
  generation:
    max_tokens: 16
    timeout_s: 5
    sampling_mixture: [{{weight: 3}}, {{weight: 1, temperature: 1.0, top_p: 1.0}}]
sources:
  - {{name: asks, kind: prompts, path: prompts.jsonl, thinking_off_share: 0.25}}
split: {{validation_fraction: 0.0}}
output: {{dir: out}}
""", encoding="utf-8")
    return root / "recipe.yaml"


def test_thinking_off_share_and_sampling_mixture_per_row(tmp_path: Path) -> None:
    with FaultServer(model=MODEL) as server:
        recipe = load_recipe(write_recipe(tmp_path, server.base_url))
        result = build_corpus(recipe, progress=io.StringIO())
        sent = {r.body["messages"][-1]["content"]: r.body for r in server.chat_requests}
        asked = len(server.chat_requests)
        again = build_corpus(recipe, progress=io.StringIO())
        assert len(server.chat_requests) == asked  # every mode and sampling is in the journal key
    rows = list(Corpus.open(result.out_dir).iter_conversations())
    assert len(rows) == 200
    modes = Counter(row.provenance.generation.enable_thinking for row in rows)
    assert 30 <= modes[False] <= 70 and modes[True] + modes[False] == 200  # 25% of 200, seeded by id
    temperatures = Counter(row.provenance.generation.sampling["temperature"] for row in rows)
    assert set(temperatures) == {0.6, 1.0} and 25 <= temperatures[1.0] <= 75
    for row in rows:
        generation = row.provenance.generation
        body = sent[row.messages[-2].content]
        assert body["chat_template_kwargs"] == {"enable_thinking": generation.enable_thinking}
        assert (body["temperature"], body["top_p"]) == (generation.sampling["temperature"],
                                                       generation.sampling["top_p"])
        assert row.thinking == generation.enable_thinking  # the fault server reasons only when asked to
    by_mode = Counter()
    for setting in result.audit["generation"]:
        by_mode[setting["enable_thinking"]] += setting["conversations"]
    assert by_mode == modes  # counted apart in the audit
    assert [r.id for r in Corpus.open(again.out_dir).iter_conversations()] == [r.id for r in rows]
