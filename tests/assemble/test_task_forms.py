"""What crosses between a cluster's tasks, in its typed forms: records (rows and skip records) with the build's side
columns, the statistics of the rows a task wrote, an audit part's profile. Each comes back as it went, so the Ray
engine's corpus and audit are the local engine's (tests/assemble/test_ray_engine.py, tests/audit/test_audit_ray.py run
them on a cluster)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pytest

from corpus_builder.assemble.plan import Plan
from corpus_builder.audit.inputs import traffic_units
from corpus_builder.audit.profile import Profile, read_profile
from corpus_builder.errors import Skipped
from corpus_builder.recipe import load_recipe
from corpus_builder.recipe.model import Mapping
from corpus_builder.records import Conversation, Provenance
from corpus_builder.rows import batch_to_records, conversations_to_batch, records_to_batch
from corpus_builder.screen.near_dedup import Signatures
from corpus_builder.screen.screened import Screened
from corpus_builder.sources import iter_file
from corpus_builder.stats.corpus import CorpusStats
from corpus_builder.stats.tokens import TokenFigures
from corpus_builder.tokens import TokenFacts, TokenMismatch
from tests.support.real_data import write_rows, write_sharegpt
from tests.support.serving_logs import logged_conversation
from tests.support.tool_chats import glaive_rows, log_rows


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> list[Conversation | Skipped]:
    """Real ShareGPT records (repairs, skips among the rows), tool traffic logged and as glaive dumps it, and a
    served log whose requests fold (their skip records between the rows)."""
    root = tmp_path_factory.mktemp("forms")
    write_sharegpt(root / "sharegpt.jsonl", 120)
    write_rows(root / "tools.jsonl", log_rows())
    write_rows(root / "glaive.jsonl", glaive_rows())
    write_rows(root / "served.jsonl", [row for index, chat in enumerate(log_rows()) for row in logged_conversation(
        "nested", chat, session=f"s{index}")])
    read: list[Conversation | Skipped] = []
    for name, mapping in (("sharegpt.jsonl", Mapping(style="sharegpt")), ("tools.jsonl", Mapping()),
                          ("glaive.jsonl", Mapping(style="sharegpt")), ("served.jsonl", Mapping())):
        read += list(iter_file(root / name, mapping=mapping))
    kinds = Counter(type(item).__name__ for item in read)
    assert kinds["Skipped"] >= 5 and kinds["Conversation"] >= 100  # the fixture holds what it means to
    assert any(isinstance(item, Conversation) and item.tools for item in read)
    return read


def test_records_come_back_from_their_arrow_form_in_order(records: list[Conversation | Skipped]) -> None:
    assert batch_to_records(records_to_batch(records)) == records
    skips = [record for record in records if isinstance(record, Skipped)]
    assert batch_to_records(records_to_batch(skips)) == skips
    assert batch_to_records(records_to_batch([])) == []


def facts(index: int) -> TokenFacts:
    mismatches = (TokenMismatch(f"row-{index}", 1, 7, "completion", [1, 2], [1, 3], "a b", "a c"),) if index % 3 else ()
    return TokenFacts(100 + index, 50 + index, index, 2, mismatches)


@pytest.mark.parametrize("near", [True, False], ids=["near", "exact"])
def test_a_screened_batch_comes_back_from_its_arrow_form_with_its_side_columns(
        records: list[Conversation | Skipped], tmp_path: Path, near: bool) -> None:
    """The records, each row's token facts (a truncated row's none) and its dedup signatures, skip records null;
    each record's priority beside."""
    (tmp_path / "recipe.yaml").write_text(
        "name: forms\ntarget: {model: m}\nsources: [{name: s, kind: replay, path: s.jsonl}]\n"
        f"checks: {{dedup: exact{', near_duplicates: {threshold: 0.8}' if near else ''}}}\noutput: {{dir: out}}\n")
    write_rows(tmp_path / "s.jsonl", [])
    plan = Plan.of(load_recipe(tmp_path / "recipe.yaml"), None)
    assert plan.dedup is not None
    index = plan.dedup.index()
    rows = [record for record in records if isinstance(record, Conversation)]
    batch = Screened(records, index.signatures(rows), [facts(i) if i % 5 else None for i in range(len(rows))])
    priorities = np.arange(len(records), dtype=np.int64) * 3 + (5 << 32)
    table = batch.to_arrow(priorities)
    back = Screened.from_arrow(table)
    assert back.records == records and back.facts == batch.facts
    assert table.column("priority").to_pylist() == priorities.tolist()
    rows_only = table.filter(pa.compute.is_null(table.column("skip_reason")))
    signatures = Signatures.from_arrow(rows_only)
    assert batch.signatures is not None
    for name in ("hashes", "present", "sketches"):
        assert np.array_equal(getattr(signatures, name), getattr(batch.signatures, name))
    skipped = table.filter(pa.compute.is_valid(table.column("skip_reason")))
    assert skipped.column("hashes").null_count == len(skipped) == skipped.column("facts").null_count
    assert ("sketch" in table.column_names) is near


def test_the_statistics_of_rows_written_in_parts_merge_from_json_into_those_of_one_writer(
        records: list[Conversation | Skipped]) -> None:
    """Every count the audit reports (by source, split, origin, flags, strata, the served modes and models, the
    generation settings), from parts sent as JSON, is the one accumulator's of every row."""
    rows = [record for record in records if isinstance(record, Conversation)]
    for index, row in enumerate(rows):
        row.split = "validation" if index % 4 == 0 else "train"
        if index % 7 == 0:  # generated rows: the generation settings and finish reasons are counted
            row.origin = "generated"
            row.provenance = Provenance.from_json({"generation": {
                "model": "m", "enable_thinking": index % 2 == 0,
                "turns": [{"finish_reason": "stop" if index % 3 else "length"}]}})
    whole = CorpusStats()
    merged = CorpusStats()
    for start in range(0, len(rows), 17):
        part = rows[start:start + 17]
        batch = conversations_to_batch(part)
        whole.add_rows(part, batch)
        written = CorpusStats()
        written.add_rows(part, batch)
        merged.merge(CorpusStats.from_json(orjson.loads(orjson.dumps(written.to_json()))))
    report = whole.report()
    assert merged.report() == report
    assert report["generation"] and report["served"] and report["flags"] and len(report["by_split"]) == 2


def test_token_figures_merge_from_json_into_those_of_one_accumulator(records: list[Conversation | Skipped]) -> None:
    rows = [record for record in records if isinstance(record, Conversation)]
    whole = TokenFigures()
    merged = TokenFigures()
    for start in range(0, len(rows), 23):
        part = TokenFigures()
        for index, row in enumerate(rows[start:start + 23], start):
            whole.add(row, facts(index), over=index % 11 == 0)
            part.add(row, facts(index), over=index % 11 == 0)
        merged.merge(TokenFigures.from_json(orjson.loads(orjson.dumps(part.to_json()))))
    assert merged == whole and whole.mismatches and whole.overall.over_budget


def test_an_audit_part_s_profile_comes_back_from_its_arrow_form(tmp_path: Path) -> None:
    """The count tables (their types too), the skips, the folded requests and the models that served them."""
    write_sharegpt(tmp_path / "sharegpt.jsonl", 80)
    write_rows(tmp_path / "served.jsonl", [row for index, chat in enumerate(log_rows()) for row in logged_conversation(
        "nested", chat, session=f"s{index}")])
    for name in ("sharegpt.jsonl", "served.jsonl"):
        profile = read_profile(name, traffic_units(str(tmp_path / name)), None, token_sample=0)
        back = Profile.from_arrow(profile.to_arrow())
        assert back.facts.frame().equals(profile.facts.frame())
        assert (back.label, back.skipped, back.rows_read, back.folded, back.models, back.tokens) == (
            profile.label, profile.skipped, profile.rows_read, profile.folded, profile.models, None)
    assert profile.folded and profile.models
