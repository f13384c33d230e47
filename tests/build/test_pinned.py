"""The bytes of a small corpus are pinned: a refactor that changes any shard fails here.

The recipe replays the two data files shipped in recipes/data with a seeded split into several shards. The
sha256s were taken from the code before the stage-package redesign and are unchanged by it. A deliberate
change of the row form or of the split updates them here, in the same commit. The rows themselves (every
column, in shard order) are pinned as one digest that does not depend on how pyarrow encodes parquet; the
file bytes are compared under the pyarrow release they were taken with.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson
import pyarrow
import pyarrow.parquet as pq

from corpus_builder.build import build
from corpus_builder.recipe import load_recipe

DATA = Path(__file__).resolve().parents[2] / "recipes" / "data"
PYARROW = "26.0.1"
SHARDS = {
    "data/train-00000-of-00004.parquet": "2cd4390a8e3d643d12150775f5a9ebb1a29b8150efb92f83a8e7d58ea133ee4f",
    "data/train-00001-of-00004.parquet": "63dcb25ffbd7a8d06da5a2e76a67d76e225cbf96d6f4fdb8843941b401c08482",
    "data/train-00002-of-00004.parquet": "7b10f5150045896a1e2b337a5fb7d07e9670a6c76ad7b4fe7dc16aa874633e5c",
    "data/train-00003-of-00004.parquet": "7e4aa88582a5359204e930b093f17d143a5bb7ab7a999ad5dded8adf0ea151dd",
    "data/validation-00000-of-00001.parquet": "defaf7b423c3212552e42eae10fe8043c44eec2cee510e7ae7cb08f5ca39882c",
}
ROWS = "6b4fe3cb2f1580c16ffd16b31df723fb380c21c7755f52b9fc35807e856aae2e"


def test_shard_bytes_are_pinned(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"""\
name: pinned
target: {{model: pinned/target}}
sources:
  - {{name: chat, kind: replay, path: {DATA / "workload-chat.jsonl.zst"}, task: chat, license: MIT}}
  - {{name: gsm8k, kind: replay, path: {DATA / "gsm8k-prompts.parquet"}, mapping: {{style: gsm8k}}, task: math}}
checks: {{dedup: exact}}
split: {{validation_fraction: 0.2, seed: 7}}
output: {{dir: out, rows_per_shard: 20}}
""", encoding="utf-8")
    result = build(load_recipe(recipe))
    written = {entry["path"]: hashlib.sha256((result.out_dir / entry["path"]).read_bytes()).hexdigest()
               for entry in result.manifest["files"]}
    rows = hashlib.sha256()
    for entry in result.manifest["files"]:
        for row in pq.read_table(result.out_dir / entry["path"]).to_pylist():
            rows.update(orjson.dumps(row, option=orjson.OPT_SORT_KEYS) + b"\n")
    assert result.manifest["conversations"] == 84
    assert rows.hexdigest() == ROWS
    if pyarrow.__version__ == PYARROW:
        assert written == SHARDS
