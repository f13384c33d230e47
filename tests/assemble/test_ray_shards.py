"""The Ray engine's writing tasks hand the shard writer rows in the Arrow form the screen gave them
(``ShardWriter.write_table``), never converted: the shards are those of the same rows written as conversations, byte
for byte, wherever the tasks' batches end (tests/assemble/test_ray_engine.py runs them on a cluster)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from corpus_builder.assemble.shards import ShardWriter
from corpus_builder.assemble.split import Splitter
from corpus_builder.recipe.model import Mapping
from corpus_builder.records import Conversation
from corpus_builder.rows import conversations_to_batch
from corpus_builder.sources import iter_file
from tests.support.real_data import write_rows, write_sharegpt
from tests.support.tool_chats import log_rows


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> list[Conversation]:
    """Real ShareGPT rows and logged tool traffic, each split by its id (a tenth in validation)."""
    root = tmp_path_factory.mktemp("rows")
    write_sharegpt(root / "sharegpt.jsonl", 150)
    write_rows(root / "tools.jsonl", log_rows())
    read = [*iter_file(root / "sharegpt.jsonl", mapping=Mapping(style="sharegpt")),
            *iter_file(root / "tools.jsonl", mapping=Mapping())]
    conversations = [row for row in read if isinstance(row, Conversation)]
    splitter = Splitter(0.1, seed=3)
    for row in conversations:
        row.split = splitter.assign(row)
    assert {row.split for row in conversations} == {"train", "validation"}  # the fixture holds what it means to
    assert any(row.tools for row in conversations) and len(conversations) > 100
    return conversations


def shard_bytes(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.glob("*.parquet"))}


@pytest.mark.parametrize("cut", [7, 40, 1000])
def test_rows_in_their_arrow_form_make_the_shards_of_the_same_rows_as_conversations(
        rows: list[Conversation], tmp_path: Path, cut: int) -> None:
    converted = ShardWriter(tmp_path / "converted", rows_per_shard=30, row_group_size=8)
    for row in rows:
        converted.write(row)
    converted_infos = converted.close()
    handed = ShardWriter(tmp_path / "handed", rows_per_shard=30, row_group_size=8)
    table = pa.Table.from_batches([conversations_to_batch(rows)])
    for start in range(0, len(rows), cut):  # a writing task's rows come in batches; a side column beside them
        part = table.slice(start, cut)
        handed.write_table(part.append_column("priority", pa.array(range(len(part)), pa.int64())))
    handed_infos = handed.close()
    assert [(info.split, info.rows, info.sha256) for info in handed_infos] == \
        [(info.split, info.rows, info.sha256) for info in converted_infos]
    assert len(converted_infos) > 4  # shards of both splits, a row group cut at a shard's end
    assert shard_bytes(tmp_path / "handed" / "data") == shard_bytes(tmp_path / "converted" / "data")
