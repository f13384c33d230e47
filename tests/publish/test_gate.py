"""The publish gate trusts nothing the build wrote: each test plants one tampering that a single check must
report, in its own words, and asserts the whole failure list, so a check deleted, weakened or made to
object to a sound corpus fails a test here. The expected numbers are recounted from the shards by the test."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from corpus_builder.errors import CorpusError
from corpus_builder.publish import CorpusDocuments, GateFailed, check_corpus
from corpus_builder.publish.gate import MAX_LISTED_PER_CHECK, GateReport, require_gate
from tests.publish.conftest import edit_json, rewrite_shard, seal_shard

TRAIN = [f"data/train-0000{i}-of-00003.parquet" for i in range(3)]
VALIDATION = "data/validation-00000-of-00001.parquet"
SHARDS = [*TRAIN, VALIDATION]
TOKEN = "hf_" + "GateMetadataTokenDoNotLeak0123456789"  # concatenated: no credential-shaped literal in the tree


def _rows(corpus: Path, path: str) -> list[dict[str, Any]]:
    return list(pq.read_table(corpus / path).to_pylist())


def _reasons(row: dict[str, Any]) -> bool:
    return any(m["reasoning"] for m in row["messages"] if m["role"] == "assistant")


def _where(path: str, index: int, row: dict[str, Any]) -> str:
    return f"{path}#{index} (id {row['id']})"


def _first(corpus: Path, thinking: bool) -> tuple[str, int, dict[str, Any]]:
    """The first row whose turns carry reasoning (or carry none): its shard, index and row."""
    return next((path, index, row) for path in SHARDS for index, row in enumerate(_rows(corpus, path))
                if _reasons(row) is thinking)


def _recount(corpus: Path) -> dict[str, int]:
    """The conversations and thinking ones of the shards present, counted from their turns."""
    rows = [row for path in SHARDS if (corpus / path).exists() for row in _rows(corpus, path)]
    return {"conversations": len(rows), "thinking_conversations": sum(map(_reasons, rows))}


def test_an_untouched_corpus_passes_and_the_report_counts_the_shards(corpus: Path) -> None:
    report = require_gate(corpus)
    assert report.failures == [] and report.findings == []
    recount = _recount(corpus)
    assert (report.overall.conversations, report.overall.thinking) == (recount["conversations"],
                                                                       recount["thinking_conversations"])
    assert report.thinking_share == recount["thinking_conversations"] / recount["conversations"]
    by_split = {split: (counts.conversations, counts.thinking) for split, counts in report.by_split.items()}
    assert by_split == {split: (sum(len(_rows(corpus, p)) for p in SHARDS if p.startswith(f"data/{split}-")),
                                sum(_reasons(r) for p in SHARDS if p.startswith(f"data/{split}-")
                                    for r in _rows(corpus, p)))
                        for split in ("train", "validation")}


def test_a_report_of_no_rows_has_no_thinking_share(corpus: Path) -> None:
    assert GateReport(CorpusDocuments.load(corpus)).thinking_share == 0.0


def test_a_failing_gate_raises_with_every_failure_and_exit_code_1(corpus: Path) -> None:
    edit_json(corpus, "audit.json", lambda audit: audit.update(conversations=-1, thinking_conversations=-1))
    with pytest.raises(GateFailed) as failure:
        require_gate(corpus)
    assert failure.value.exit_code == 1 and len(failure.value.failures) == 2
    assert failure.value.failures == check_corpus(corpus).failures
    assert "refusing to publish: 2 check failure(s)" in str(failure.value) and str(corpus) in str(failure.value)
    assert all(line in str(failure.value) for line in failure.value.failures)


# --------------------------------------------------------------------------------------------------
# Row checks: duplicate ids, the split column, the thinking flag


@pytest.mark.parametrize(("original", "copy"), [((TRAIN[0], 0), (TRAIN[0], 1)), ((TRAIN[0], 3), (VALIDATION, 2))],
                         ids=["same shard", "another shard"])
def test_a_duplicate_id_is_reported_where_it_recurs(corpus: Path, original: tuple[str, int],
                                                    copy: tuple[str, int]) -> None:
    duplicated = _rows(corpus, original[0])[original[1]]["id"]
    rewrite_shard(corpus, copy[0], lambda rows: rows[copy[1]].update(id=duplicated))
    assert check_corpus(corpus).failures == [f"rows: {copy[0]}#{copy[1]} (id {duplicated}): duplicate id"]


def test_a_row_whose_split_is_not_its_shards_is_reported(corpus: Path) -> None:
    rewrite_shard(corpus, TRAIN[1], lambda rows: rows[3].update(split="validation"))
    row = _rows(corpus, TRAIN[1])[3]
    assert check_corpus(corpus).failures == [f"rows: {_where(TRAIN[1], 3, row)}: split 'validation' in a 'train' shard"]
    # The row is counted in its shard's split, which the manifest declares: no other check objects.


@pytest.mark.parametrize("thinking", [True, False], ids=["reasoning row says none", "plain row says reasoning"])
def test_a_thinking_column_that_contradicts_the_turns_is_reported(corpus: Path, thinking: bool) -> None:
    path, index, row = _first(corpus, thinking)
    rewrite_shard(corpus, path, lambda rows: rows[index].update(thinking=not thinking))
    # Only the row check objects: the counts that audit.json and the share are held to come from the turns.
    assert check_corpus(corpus).failures == [
        f"rows: {_where(path, index, row)}: thinking column says {not thinking}, turns say {thinking}"]


def test_reasoning_on_a_user_turn_or_an_empty_trace_does_not_make_a_thinking_row(corpus: Path) -> None:
    path, index, _ = _first(corpus, False)

    def mutate(rows: list[dict[str, Any]]) -> None:
        rows[index]["messages"][0]["reasoning"] = "The user thought about it."
        rows[index]["messages"][-1]["reasoning"] = ""

    rewrite_shard(corpus, path, mutate)
    assert check_corpus(corpus).failures == []


@pytest.mark.parametrize("thinking", [True, False], ids=["reasoning removed", "reasoning added"])
def test_the_thinking_count_is_recounted_from_the_turns_not_the_column(corpus: Path, thinking: bool) -> None:
    """Turns and column changed together, as a consistent edit of the shard would: audit.json is stale."""
    path, index, _ = _first(corpus, thinking)
    before = _recount(corpus)["thinking_conversations"]

    def mutate(rows: list[dict[str, Any]]) -> None:
        rows[index]["messages"][-1]["reasoning"] = None if thinking else "Thought of it."
        rows[index]["thinking"] = not thinking

    rewrite_shard(corpus, path, mutate)
    after = _recount(corpus)["thinking_conversations"]
    assert after == before + (-1 if thinking else 1)
    assert check_corpus(corpus).failures == [
        f"audit.json: thinking_conversations is {before}, shards have {after} (re-run the build)"]


def test_the_thinking_share_is_recounted_from_the_turns(corpus: Path) -> None:
    """Reasoning stripped from rows whose column still says thinking: the share check counts the turns."""
    minimum = CorpusDocuments.load(corpus).min_thinking_share
    assert minimum is not None
    recount = _recount(corpus)
    # Strip reasoning from just enough rows that the share from the turns falls below the recipe's minimum.
    keep = int(minimum * recount["conversations"]) - 1
    strip = recount["thinking_conversations"] - keep
    stripped: list[str] = []
    for path in SHARDS:
        def mutate(rows: list[dict[str, Any]]) -> None:
            for row in rows:
                if len(stripped) < strip and _reasons(row):
                    row["messages"][-1]["reasoning"] = None
                    stripped.append(row["id"])

        rewrite_shard(corpus, path, mutate)
    failures = check_corpus(corpus).failures
    share = f"{keep / recount['conversations']:.1%}"
    assert [line for line in failures if line.startswith("thinking share: ")] == [
        f"thinking share: thinking share {share} is below the minimum {minimum:.1%} ({keep:,} of "
        f"{recount['conversations']:,} conversations carry reasoning)"]
    assert sum(line.startswith("rows: ") and "thinking column says True, turns say False" in line
               for line in failures) == strip


@pytest.mark.parametrize("count", [MAX_LISTED_PER_CHECK, MAX_LISTED_PER_CHECK + 7], ids=["at the cap", "over it"])
def test_a_check_lists_the_first_failures_and_counts_the_rest(corpus: Path, count: int) -> None:
    flipped: list[str] = []
    for path in SHARDS:
        def mutate(rows: list[dict[str, Any]], path: str = path) -> None:
            for index, row in enumerate(rows):
                if len(flipped) < count:
                    row["thinking"] = not row["thinking"]
                    flipped.append(f"rows: {_where(path, index, row)}: thinking column says {row['thinking']}, "
                                   f"turns say {not row['thinking']}")

        rewrite_shard(corpus, path, mutate)
    more = [f"rows: ... and {count - MAX_LISTED_PER_CHECK} more"] if count > MAX_LISTED_PER_CHECK else []
    assert check_corpus(corpus).failures == flipped[:MAX_LISTED_PER_CHECK] + more


# --------------------------------------------------------------------------------------------------
# Schema checks: each failing row is named and left out of the counts


def _counts_without(corpus: Path, path: str, left_out: int = 1) -> list[str]:
    """The manifest and audit lines a corpus gets when ``left_out`` plain rows of ``path`` are not counted."""
    recount = _recount(corpus)["conversations"]
    split = "train" if path in TRAIN else "validation"
    declared = json.loads((corpus / "manifest.json").read_text())["splits"][split]["rows"]
    return [f"manifest: split {split!r} declares {declared} rows, shards have {declared - left_out}",
            f"manifest: declares {recount} conversations, shards have {recount - left_out}",
            f"audit.json: conversations is {recount}, shards have {recount - left_out} (re-run the build)"]


@pytest.mark.parametrize(("column", "value", "problem"), [
    ("provenance", "{not json", "provenance is not valid JSON"),
    ("tools", "[{not json", "tools is not valid JSON"),
    ("id", "not-a-row-id", "id: 'not-a-row-id' does not match '^[0-9a-f]{20}(-[0-9]+)?$'"),
    ("provenance", '{"source_line": "three"}', "provenance/source_line: 'three' is not of type 'integer'"),
    ("tools", '[{"type": "function"}]', "tools/0: 'function' is a required property"),
    ("provenance", None, "provenance: None is not of type 'object'"),
    ("provenance", "", "provenance: None is not of type 'object'"),  # empty: no provenance, not bad JSON
])
def test_a_row_that_breaks_the_schema_is_named_and_not_counted(corpus: Path, column: str, value: str | None,
                                                               problem: str) -> None:
    path, index, row = _first(corpus, False)  # a plain row: leaving it out changes no thinking count
    expected_counts = _counts_without(corpus, path)
    rewrite_shard(corpus, path, lambda rows: rows[index].update({column: value}))
    where = _where(path, index, {**row, "id": value if column == "id" else row["id"]})
    assert check_corpus(corpus).failures == [f"schema: {where}: {problem}", *expected_counts]


def test_a_schema_message_is_cut_at_200_characters(corpus: Path) -> None:
    path, index, _ = _first(corpus, False)
    expected_counts = _counts_without(corpus, path)
    long_id = "a" * 1000
    rewrite_shard(corpus, path, lambda rows: rows[index].update(id=long_id))
    message = f"{long_id!r} does not match '^[0-9a-f]{{20}}(-[0-9]+)?$'"[:200]
    assert check_corpus(corpus).failures == [f"schema: {_where(path, index, {'id': long_id})}: id: {message}",
                                             *expected_counts]


def test_a_schema_failure_of_the_whole_row_is_located_at_the_row(corpus: Path) -> None:
    path = TRAIN[2]  # a shard of plain rows: leaving them out changes no thinking count
    rows = _rows(corpus, path)
    assert not any(map(_reasons, rows))
    expected_counts = _counts_without(corpus, path, len(rows))
    rewrite_shard(corpus, path, lambda rows: [row.update(note=None) for row in rows], keep_schema=False)
    assert check_corpus(corpus).failures == [
        f"schema: {_where(path, index, row)}: (row): Additional properties are not allowed ('note' was unexpected)"
        for index, row in enumerate(rows)] + expected_counts


def test_every_turn_of_a_long_generation_record_is_validated(corpus: Path) -> None:
    """Only integer arrays are sampled: a list of many turns is validated whole."""
    path, index, row = _first(corpus, False)
    expected_counts = _counts_without(corpus, path)
    turn = {"message_index": 1, "endpoint": "http://127.0.0.1:8000/v1", "finish_reason": "stop",
            "prompt_token_ids": None, "token_ids": None}
    turns = [turn] * 11 + [{key: value for key, value in turn.items() if key != "endpoint"}]
    provenance = json.dumps({**json.loads(row["provenance"]), "generation": {"turns": turns}})
    rewrite_shard(corpus, path, lambda rows: rows[index].update(provenance=provenance))
    assert check_corpus(corpus).failures == [
        f"schema: {_where(path, index, row)}: provenance/generation/turns/11: 'endpoint' is a required property",
        *expected_counts]


def test_long_integer_arrays_are_type_checked_before_they_are_sampled(corpus: Path) -> None:
    path, index, row = _first(corpus, False)
    expected_counts = _counts_without(corpus, path)
    provenance = json.loads(row["provenance"])

    def turns(token_ids: list[Any]) -> str:
        turn = {"message_index": 1, "endpoint": "http://127.0.0.1:8000/v1", "finish_reason": "stop",
                "prompt_token_ids": list(range(40)), "token_ids": token_ids}
        return json.dumps({**provenance, "generation": {"turns": [turn]}})

    rewrite_shard(corpus, path, lambda rows: rows[index].update(provenance=turns(list(range(100)))))
    assert check_corpus(corpus).failures == []  # long token-id arrays are valid when every item is an integer
    for bad, shown in (("three", "'three' is not of type 'integer'"), (True, "True is not of type 'integer'")):
        rewrite_shard(corpus, path, lambda rows, bad=bad: rows[index].update(provenance=turns([*range(9), bad])))
        assert check_corpus(corpus).failures == [
            f"schema: {_where(path, index, row)}: provenance/generation/turns/0/token_ids/9: {shown}",
            *expected_counts]


# --------------------------------------------------------------------------------------------------
# File checks


def test_a_shard_that_cannot_be_read_is_reported_not_raised(corpus: Path) -> None:
    """A shard whose bytes are not parquet, sealed into the manifest: the file check cannot count its rows and
    the row pass cannot read them; both say so, and the gate goes on to list every other failure."""
    expected_counts = _counts_without(corpus, TRAIN[2], len(_rows(corpus, TRAIN[2])))
    (corpus / TRAIN[2]).write_bytes(b"PAR1 not a parquet file PAR1")
    seal_shard(corpus, TRAIN[2])
    failures = check_corpus(corpus).failures
    assert [line.split(": cannot read shard: ")[0] for line in failures[:2]] == [f"files: {TRAIN[2]}",
                                                                                  f"rows: {TRAIN[2]}"]
    assert failures[2:] == expected_counts


def test_a_directory_where_a_shard_should_be_is_reported_not_raised(corpus: Path) -> None:
    (corpus / VALIDATION).unlink()
    (corpus / VALIDATION).mkdir()
    failures = check_corpus(corpus).failures
    assert [line for line in failures if line.startswith("files: ")][-1].startswith(
        f"files: {VALIDATION}: cannot read shard: ")
    assert not any(line.startswith("rows: ") for line in failures)


@pytest.mark.parametrize("path", ["../outside.parquet", "data/sub/x.parquet", "data/x.jsonl", "/tmp/x.parquet"])
def test_a_manifest_path_outside_data_is_refused_before_anything_is_read(corpus: Path, path: str) -> None:
    edit_json(corpus, "manifest.json", lambda manifest: manifest["files"][1].update(path=path))
    failures = check_corpus(corpus).failures
    assert failures[0] == f"files: {path!r}: manifest path is not data/<name>.parquet"
    # The file checks stop there (no line about the shard the manifest no longer lists); the rows are not read.
    assert not any(line.startswith("files: ") for line in failures[1:]) and "cannot read" not in str(failures)


@pytest.mark.parametrize("missing", [TRAIN[2], VALIDATION], ids=["not the last", "the last"])
def test_a_missing_shard_is_reported_by_the_file_check_and_the_others_are_still_read(corpus: Path,
                                                                                     missing: str) -> None:
    expected_counts = _counts_without(corpus, missing, len(_rows(corpus, missing)))
    thinking = _recount(corpus)["thinking_conversations"]
    (corpus / missing).unlink()
    after = _recount(corpus)["thinking_conversations"]
    audit = [f"audit.json: thinking_conversations is {thinking}, shards have {after} (re-run the build)"]
    assert check_corpus(corpus).failures == [f"files: {missing}: shard listed in manifest.json is missing",
                                             *expected_counts, *(audit if after != thinking else [])]


# --------------------------------------------------------------------------------------------------
# Metadata checks: audit.json's figures, the manifest's rows, the thinking share setting


@pytest.mark.parametrize("key", ["conversations", "thinking_conversations"])
@pytest.mark.parametrize("change", [1, -1, None], ids=["one more", "one fewer", "removed"])
def test_audit_figures_that_differ_from_the_recount_are_reported(corpus: Path, key: str, change: int | None) -> None:
    actual = _recount(corpus)[key]
    shown = None if change is None else actual + change
    edit_json(corpus, "audit.json", lambda audit: audit.update({key: shown}) if change else audit.pop(key))
    assert check_corpus(corpus).failures == [f"audit.json: {key} is {shown}, shards have {actual} (re-run the build)"]


@pytest.mark.parametrize("split", ["train", "validation"])
def test_a_split_that_declares_other_rows_than_its_shards_is_reported(corpus: Path, split: str) -> None:
    rows = sum(len(_rows(corpus, path)) for path in SHARDS if path.startswith(f"data/{split}-"))
    edit_json(corpus, "manifest.json", lambda manifest: manifest["splits"][split].update(rows=rows + 1))
    assert check_corpus(corpus).failures == [f"manifest: split {split!r} declares {rows + 1} rows, shards have {rows}"]


def test_a_declared_split_without_shards_must_declare_no_rows(corpus: Path) -> None:
    edit_json(corpus, "manifest.json", lambda manifest: manifest["splits"].update(test={"rows": 0, "shards": 0}))
    assert check_corpus(corpus).failures == []
    edit_json(corpus, "manifest.json", lambda manifest: manifest["splits"].update(test={"rows": 5, "shards": 1}))
    assert check_corpus(corpus).failures == ["manifest: split 'test' declares 5 rows, shards have 0"]


def test_a_manifest_conversation_count_that_differs_is_reported(corpus: Path) -> None:
    actual = _recount(corpus)["conversations"]
    edit_json(corpus, "manifest.json", lambda manifest: manifest.update(conversations=actual - 1))
    assert check_corpus(corpus).failures == [f"manifest: declares {actual - 1} conversations, shards have {actual}"]


def _set_minimum(corpus: Path, value: str) -> None:
    recipe = (corpus / "recipe.yaml").read_text()
    assert recipe.count("min_thinking_share: ") == 1
    (corpus / "recipe.yaml").write_text(re.sub(r"min_thinking_share: .*\n", f"min_thinking_share: {value}\n", recipe))


@pytest.mark.parametrize(("value", "shown"), [("1.5", "1.5"), ("-0.1", "-0.1"), ("true", "True"), ("'0.5'", "'0.5'")])
def test_a_minimum_thinking_share_that_is_not_a_share_is_reported(corpus: Path, value: str, shown: str) -> None:
    _set_minimum(corpus, value)
    assert CorpusDocuments.load(corpus).min_thinking_share is None
    assert check_corpus(corpus).failures == [
        f"thinking share: recipe.yaml: checks.min_thinking_share is {shown}, not a share from 0 to 1"]


def test_the_ends_of_the_share_range_are_shares(corpus: Path) -> None:
    _set_minimum(corpus, "0")
    assert CorpusDocuments.load(corpus).min_thinking_share == 0.0 and check_corpus(corpus).failures == []
    _set_minimum(corpus, "1")
    assert CorpusDocuments.load(corpus).min_thinking_share == 1.0
    [failure] = check_corpus(corpus).failures
    assert failure.startswith("thinking share: thinking share ") and "is below the minimum 100.0%" in failure


def test_settings_are_read_through_mappings_only(corpus: Path) -> None:
    documents = CorpusDocuments.load(corpus)
    assert documents.setting("checks", "min_thinking_share") == 0.3
    assert documents.setting("target", "model") == "Org/Model-1B"
    assert documents.setting("name", "model") is None  # a string on the way: no setting, no error
    assert documents.setting("nope", "min_thinking_share") is None


# --------------------------------------------------------------------------------------------------
# Secrets in the metadata files


def _plant_in_recipe(corpus: Path) -> None:
    recipe = (corpus / "recipe.yaml").read_text()
    (corpus / "recipe.yaml").write_text(recipe.replace("for publish tests.", f"for publish tests. {TOKEN}"))


@pytest.mark.parametrize(("name", "plant"), [
    ("recipe.yaml", _plant_in_recipe),
    ("manifest.json", lambda corpus: edit_json(corpus, "manifest.json", lambda m: m["tool"].update(note=TOKEN))),
    ("audit.json", lambda corpus: edit_json(corpus, "audit.json", lambda a: a.update(note=f"built with {TOKEN}"))),
    ("manifest.json", lambda corpus: edit_json(corpus, "manifest.json", lambda m: m.update({TOKEN: 1}))),
], ids=["recipe", "manifest", "audit", "manifest key"])
def test_a_secret_in_a_metadata_file_is_reported_without_its_value(corpus: Path, name: str, plant: Any) -> None:
    plant(corpus)
    report = check_corpus(corpus)
    [failure] = report.failures
    assert failure.startswith(f"secrets: {name} text: hf_token ({len(TOKEN)} chars at offset ")
    assert TOKEN[3:] not in failure and [finding.row_id for finding in report.findings] == [name]


def test_url_logins_in_metadata_are_not_findings_since_the_upload_strips_them(corpus: Path) -> None:
    recipe = (corpus / "recipe.yaml").read_text()
    (corpus / "recipe.yaml").write_text(recipe.replace("endpoints: []", "endpoints: ['http://alice:pw@gpu-box:8000/v1']"))
    assert check_corpus(corpus).failures == []


def test_secrets_in_rows_and_metadata_are_all_listed(corpus: Path) -> None:
    _plant_in_recipe(corpus)
    path, index, row = _first(corpus, True)
    rewrite_shard(corpus, path, lambda rows: rows[index]["messages"][-1].update(reasoning=f"use {TOKEN}"))
    report = check_corpus(corpus)
    assert [(f.row_id, f.field, f.kind) for f in report.findings] == [
        (row["id"], "messages[1].reasoning", "hf_token"), ("recipe.yaml", "text", "hf_token")]
    assert report.failures == [f"secrets: {finding}" for finding in report.findings]


@pytest.mark.parametrize(("write", "problem"), [
    (lambda path: path.unlink(), "file not found"),
    (lambda path: (path.unlink(), path.mkdir()), "is a directory, not a recipe file"),
    (lambda path: path.write_bytes(b"name: \xff\n"), "not valid UTF-8"),
    (lambda path: path.write_text("# nothing\n"), "the recipe is empty"),
    (lambda path: path.write_text("sources: [unclosed\n"), "YAML syntax error"),
], ids=["missing", "a directory", "not UTF-8", "empty", "bad YAML"])
def test_a_recipe_that_cannot_be_read_stops_the_gate_naming_the_file(corpus: Path, write: Any, problem: str) -> None:
    path = corpus / "recipe.yaml"
    write(path)
    with pytest.raises(CorpusError) as failure:
        check_corpus(corpus)
    assert failure.value.problem == "the corpus recipe cannot be read as a plain YAML mapping"
    assert failure.value.file == str(path) and not isinstance(failure.value, GateFailed)
    [detail] = failure.value.details
    assert detail.startswith(f"{path}") and problem in detail
