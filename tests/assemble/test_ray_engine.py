"""`corpus build --engine ray`: the same corpus as the local engine, on a real Ray cluster the module starts.

The cluster is the one the engine starts without a named one (``ray_cluster.start_cluster``, on loopback alone; which
cluster, and its sockets, are tests/assemble/test_ray_cluster.py's), with ``num_cpus=2``: a new head node in this
process's session with two worker processes, never an existing cluster on the machine (another test run's or a
user's), and what CI's two cores hold; a second node (``ray start``) would add a raylet and a GCS client on the
same two cores and test nothing the two worker processes do not (every stage is a task on the workers, every
group-by and join a shuffle between them). RAY_AUTH_MODE=disabled: the cluster is private to the test, no token to
set up.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from corpus_builder.assemble import build_corpus
from corpus_builder.assemble.collect import MixtureShort
from corpus_builder.audit import audit_corpus
from corpus_builder.errors import CorpusError
from corpus_builder.layout import Corpus, iter_ledger
from corpus_builder.recipe import load_recipe
from corpus_builder.testing.fault_server import Fault, FaultServer
from tests.support.chats import served
from tests.support.messy import write_messy
from tests.support.ray_cluster import imported_ray, local_cluster
from tests.support.real_data import write_rows

ray = imported_ray()

MODEL = "tiny-target"  # the loopback server's


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    with local_cluster():
        yield


@pytest.fixture(scope="module")
def messy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("messy")
    write_messy(root)
    return root


def write_recipe(path: Path, data: Path, *, dedup: str = "exact", engine: str | None = None,
                 tokenizer: Path | None = None, checks: str = "", mixture: str | None = None,
                 sharegpt: str = "", eval_pack: str | None = None) -> Path:
    """The messy sources' recipe; ``tokenizer``: the target's, ``checks``: more checks (``key: value, ``),
    ``mixture``: the mixture section (the reasoning source joins the others), ``sharegpt``: more keys of its
    source (``, key: value``), ``eval_pack``: the eval section."""
    near_duplicates = "near_duplicates: {threshold: 0.8}, " if dedup == "exact" else ""
    target_tokenizer = f", tokenizer: {tokenizer}" if tokenizer else ""
    path.write_text(
        "name: ray-corpus\n"
        f"target: {{model: tiny/target{target_tokenizer}}}\n"
        + (f"engine: {engine}\n" if engine else "")
        + (f"mixture: {mixture}\n" if mixture else "")
        + (f"eval: {eval_pack}\n" if eval_pack else "")
        + "sources:\n"
        f"  - {{name: chitchat, kind: replay, path: {data}/chitchat.jsonl}}\n"
        f"  - {{name: sharegpt, kind: replay, path: {data}/sharegpt.jsonl, mapping: {{style: sharegpt}}{sharegpt}}}\n"
        f"  - {{name: mirror, kind: replay, path: {data}/mirror.jsonl}}\n"
        + (f"  - {{name: reasoning, kind: replay, path: {data}/reasoning.jsonl}}\n" if mixture else "")
        +
        f"checks: {{{checks}{near_duplicates}dedup: {dedup}}}\n"
        f"decontamination: {{eval_sets: [{{name: held, path: {data}/eval.jsonl, fields: [question]}}]}}\n"
        "split: {validation_fraction: 0.2, seed: 3}\n"
        "output: {dir: out, rows_per_shard: 40}\n",
        encoding="utf-8")
    return path


def rows_by_split(corpus: Path, directory: str = "data") -> dict[str, list[bytes]]:
    """The rows of the corpus's shards (or its eval pack's) by split, each split's sorted."""
    by_split: dict[str, list[bytes]] = {}
    for shard in sorted((corpus / directory).glob("*.parquet")):
        for row in pq.read_table(shard).to_pylist():
            by_split.setdefault(row["split"], []).append(orjson.dumps(row, option=orjson.OPT_SORT_KEYS))
    return {split: sorted(rows) for split, rows in by_split.items()}


def manifest_figures(corpus: Path) -> dict[str, Any]:
    """The manifest but where shards are cut: their files and the shard count of each split."""
    manifest = orjson.loads((corpus / "manifest.json").read_bytes())
    manifest.pop("files")
    manifest["splits"] = {split: counts["rows"] for split, counts in manifest["splits"].items()}
    return manifest


def assert_same_corpus(local: Path, on_ray: Path) -> None:
    assert rows_by_split(local) == rows_by_split(on_ray)
    assert rows_by_split(local, "eval") == rows_by_split(on_ray, "eval")
    assert list(iter_ledger(local / "ledger.jsonl.zst")) == list(iter_ledger(on_ray / "ledger.jsonl.zst"))
    assert manifest_figures(local) == manifest_figures(on_ray)
    assert (local / "audit.json").read_bytes() == (on_ray / "audit.json").read_bytes()
    assert audit_corpus(local, secrets=False) == audit_corpus(on_ray, secrets=False)


@pytest.fixture(scope="module")
def local_corpus(messy: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("local")
    build_corpus(load_recipe(write_recipe(root / "recipe.yaml", messy)), root / "corpus", allow_empty=False)
    return root / "corpus"


@pytest.mark.parametrize("partition_rows", [None, 40])
def test_the_ray_engine_writes_the_local_engine_s_corpus(cluster: None, messy: Path, local_corpus: Path,
                                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         partition_rows: int | None) -> None:
    """``partition_rows``: rows a partition holds, fewer than the verdicts (Ray Data's sort of them, not one task's)."""
    from corpus_builder.assemble import ray_data

    if partition_rows is not None:
        monkeypatch.setattr(ray_data, "ROWS_PER_PARTITION", partition_rows)
    recipe = load_recipe(write_recipe(tmp_path / "recipe.yaml", messy, engine="ray"))
    result = build_corpus(recipe, tmp_path / "corpus")
    reasons = result.audit["skipped"]
    # the fixture exercises what it means to: repairs, both dedup rules, decontamination
    assert reasons["duplicate"] >= 25 and reasons["near_duplicate"] >= 20 and reasons["contaminated"] >= 10
    assert result.audit["flags"]
    assert_same_corpus(local_corpus, tmp_path / "corpus")
    assert not list((tmp_path / "corpus" / "data").glob(".ray-*"))


def test_the_dedup_verdicts_are_the_same_however_the_buckets_are_cut_into_blocks(messy: Path, tmp_path: Path
                                                                               ) -> None:
    """The shuffle hands each task whole buckets, cut as the cluster's partitions fall: each block's verdicts, each
    row's least kept, must be those of every bucket in one block, whatever the cut and the entries' order."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from corpus_builder.assemble.plan import Plan
    from corpus_builder.screen.dedup import heads_of, least_verdicts
    from corpus_builder.sources.parallel import measured_rows

    plan = Plan.of(load_recipe(write_recipe(tmp_path / "recipe.yaml", messy)), None)
    dedup = plan.dedup
    assert dedup is not None
    checker = plan.screen.checker(None)
    batches = []
    for part in plan.read.parts(1):
        for measured in measured_rows(part(), checker.measure):
            screened = checker.screened(measured.items, measured.measurement)
            batches.append(screened.to_arrow(np.arange(len(screened.records)) + 10_000 * len(batches)))
    table = pa.concat_tables(batches)
    rows = table.filter(pc.is_null(table.column("skip_reason")))
    entries = dedup.entries(rows, rows.column("id").to_pylist())
    whole = dedup.judge_groups(entries)
    rules = Counter(head.duplicate.rule for head in heads_of(whole.column("rank"), whole.column("head")) if head)
    assert rules["exact"] >= 25 and rules["near"] >= 20
    rng = np.random.default_rng(0)
    given_twice = 0
    for blocks in (2, 3, 7):
        keys = np.asarray(entries.column("key"))
        cut = [entries.take(pa.array(rng.permutation(np.flatnonzero(keys % blocks == block))))
               for block in range(blocks)]
        given = pa.concat_tables(dedup.judge_groups(block) for block in cut)
        given_twice += len(given) - len(set(given.column("priority").to_pylist()))
        assert least_verdicts(given).to_pylist() == whole.to_pylist()
    assert given_twice  # some row has verdicts from buckets in two blocks: its least is taken
    assert not len(dedup.judge_groups(pa.table({})))


def test_without_dedup_the_copies_are_numbered_as_the_local_engine_numbers_them(cluster: None, messy: Path,
                                                                               tmp_path: Path) -> None:
    """Ids are content keys: the first of two copies in one source keeps its id, the second gets suffix -1."""
    recipe = load_recipe(write_recipe(tmp_path / "recipe.yaml", messy, dedup="none"))
    build_corpus(recipe, tmp_path / "local")
    build_corpus(recipe, tmp_path / "ray", engine="ray")
    ids = [orjson.loads(row)["id"] for rows in rows_by_split(tmp_path / "ray").values() for row in rows]
    assert len(ids) == len(set(ids)) and sum(row_id.endswith("-1") for row_id in ids) >= 25
    assert_same_corpus(tmp_path / "local", tmp_path / "ray")


def test_the_ray_engine_budgets_and_measures_rows_in_the_target_s_tokens_as_the_local_engine(
        cluster: None, messy: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    """The budget drops and truncates the same rows (each task loads the tokenizer once), the token statistics
    add up to the same audit (the facts measured in the screen, the truncated rows measured where written)."""
    recipe = load_recipe(write_recipe(tmp_path / "recipe.yaml", messy, tokenizer=tiny_model_dir,
                                      checks="max_seq_len: 2048, on_over_length: truncate, "))
    local = build_corpus(recipe, tmp_path / "local")
    build_corpus(recipe, tmp_path / "ray", engine="ray")
    # the fixture exercises what it means to: rows over the budget by their tokens and by their characters alone
    # dropped, others truncated to it, every row written measured
    over_length = [row["detail"] for row in iter_ledger(tmp_path / "local" / "ledger.jsonl.zst")
                   if row["reason"] == "over_length"]
    assert len(over_length) >= 10 and any(detail.startswith("at least") for detail in over_length)
    assert local.audit["flags"]["truncated_to_budget"] >= 10
    tokens = local.audit["tokens"]
    assert tokens["conversations"] == local.manifest.conversations and 0 < tokens["max"] <= 2048
    assert_same_corpus(tmp_path / "local", tmp_path / "ray")


MIXTURE = "{total: 260, thinking_share: {target: 0.1, tolerance: 0.01}, seed: 7}"


def test_the_ray_engine_takes_a_declared_mixture_as_the_local_engine(cluster: None, messy: Path,
                                                                     tiny_model_dir: Path, tmp_path: Path) -> None:
    """A total below what passes the checks, a source's count and a thinking share: the same seeded take of the
    rows the budget, dedup and decontamination leave, and the same report in the manifest."""
    recipe = load_recipe(write_recipe(tmp_path / "recipe.yaml", messy, tokenizer=tiny_model_dir,
                                      checks="max_seq_len: 2048, on_over_length: truncate, ", mixture=MIXTURE,
                                      sharegpt=", target: {count: 80}"))
    local = build_corpus(recipe, tmp_path / "local")
    build_corpus(recipe, tmp_path / "ray", engine="ray")
    mixture = local.manifest.sections["mixture"]
    sources = mixture["sources"]
    # the fixture exercises what it means to: every source gives fewer rows than pass the checks, the reasoning
    # source's kinds steered to the share, rows dropped by the checks and truncated before the take
    assert local.manifest.conversations == 260 and not mixture["shortfalls"]
    assert all(source["reached"] < source["available"] for name, source in sources.items() if name != "mirror")
    reasoning = sources["reasoning"]
    assert sources["sharegpt"]["reached"] == 80 and 0 < reasoning["thinking"] < 0.6 * reasoning["reached"]
    assert abs(mixture["thinking_share"]["reached"] - 0.1) <= 0.01
    assert local.audit["skipped"]["over_length"] and local.audit["flags"]["truncated_to_budget"]
    assert local.audit["skipped"]["duplicate"] and local.audit["skipped"]["contaminated"]
    assert_same_corpus(tmp_path / "local", tmp_path / "ray")


def test_the_ray_engine_holds_out_the_eval_pack_as_the_local_engine(cluster: None, messy: Path,
                                                                   tmp_path: Path) -> None:
    """The pack cut on the driver, its rows left out of the corpus by every screen task and its copies dropped
    (the mirror's exact copies of chit-chat, its near copies of ShareGPT), under a declared mixture."""
    recipe = load_recipe(write_recipe(tmp_path / "recipe.yaml", messy, eval_pack="{fraction: 0.15, seed: 3}",
                                      mixture=MIXTURE))
    local = build_corpus(recipe, tmp_path / "local")
    build_corpus(recipe, tmp_path / "ray", engine="ray")
    # the fixture exercises what it means to: a pack of every source, copies of its rows in the others
    pack = local.manifest.sections["eval"]
    assert all(source["held"] for source in pack["sources"].values()) and local.audit["eval_pack"]
    assert local.audit["skipped"]["eval_pack_copy"] >= 2
    assert_same_corpus(tmp_path / "local", tmp_path / "ray")


def test_a_mixture_the_rows_cannot_meet_stops_the_ray_build_before_anything_is_written(
        cluster: None, messy: Path, tmp_path: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path / "recipe.yaml", messy, mixture="{total: 5000}"))
    with pytest.raises(MixtureShort, match="cannot be met: nothing was written") as raised:
        build_corpus(recipe, tmp_path / "corpus", engine="ray")
    assert any("mixture.total declares 5,000" in line for line in raised.value.details)
    assert not (tmp_path / "corpus").exists()


def test_a_corpus_without_a_duplicate_is_the_local_engine_s(cluster: None, tmp_path: Path) -> None:
    """Dedup on and no bucket of two rows: no row has a verdict, and the writing tasks' blocks no verdict column."""
    write_rows(tmp_path / "logs.jsonl", [{"messages": [{"role": "user", "content": f"question {index}"},
                                                       {"role": "assistant", "content": f"answer {index}"}]}
                                         for index in range(10)])
    (tmp_path / "recipe.yaml").write_text(
        f"name: unique\ntarget: {{model: {MODEL}}}\nsources:\n  - {{name: logs, kind: replay, path: logs.jsonl}}\n"
        "split: {validation_fraction: 0.25, seed: 1}\noutput: {dir: out}\n", encoding="utf-8")
    recipe = load_recipe(tmp_path / "recipe.yaml")
    local = build_corpus(recipe, tmp_path / "local")
    build_corpus(recipe, tmp_path / "ray", engine="ray")
    assert local.manifest.conversations == 10
    assert_same_corpus(tmp_path / "local", tmp_path / "ray")


def exchange(index: int, *, thinking: bool = False) -> dict[str, Any]:
    answer = f"<think>\nwhy {index}\n</think>\n\nanswer {index % 5}" if thinking else f"answer {index}"
    return {"id": f"r{index}", "conversations": [{"from": "human", "value": f"question {index % 7}"},
                                                 {"from": "gpt", "value": answer}]}


def covered_recipe(tmp_path: Path, *, more: str = "") -> Path:
    """A plan the columnar path covers: .jsonl turn lists, the exact dedup alone (``more``: a second source's
    file)."""
    second = f"  - {{name: more, kind: replay, path: {more}, task: chat}}\n" if more else ""
    (tmp_path / "recipe.yaml").write_text(
        f"name: covered\ntarget: {{model: {MODEL}}}\nsources:\n"
        "  - {name: chats, kind: replay, path: rows.jsonl, mapping: {style: sharegpt}, task: chat}\n"
        f"{second}checks: {{dedup: exact}}\nsplit: {{validation_fraction: 0.3, seed: 3}}\n"
        "output: {dir: out, rows_per_shard: 7}\n", encoding="utf-8")
    return tmp_path / "recipe.yaml"


def test_a_plan_the_columnar_path_covers_takes_it_on_ray_with_the_local_engine_s_bytes(
        cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Ray engine's screen tasks read the columnar path's blocks, of a file cut into parts (each numbering its
    lines from the file's start): the rows the kernels leave (tool turns, an unclosed think block, a repair, a bad
    line, each part's first row) take the row path in their place, exact copies within and across the parts are
    dropped, and the corpus, ledger and audit are the local engine's (which reads the file as one part)."""
    monkeypatch.setattr("corpus_builder.sources.readers.MIN_RANGE_BYTES", 1500)  # read on the driver
    needing_rows = [
        {"conversations": [{"from": "gpt", "value": "hello"}, {"from": "human", "value": "hi"},
                           {"from": "gpt", "value": "ok"}]},  # a leading assistant turn: repaired
        {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "<think>open"}]},
        {"conversations": [{"from": "human", "value": "q"}, {"from": "tool", "value": "r"},
                           {"from": "gpt", "value": "done"}]},
    ]
    lines = [orjson.dumps(exchange(index % 45, thinking=index % 3 == 1)) for index in range(60)]
    lines[10:10] = [orjson.dumps(row) for row in needing_rows]
    lines[31] = b"{broken"
    (tmp_path / "rows.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    recipe = load_recipe(covered_recipe(tmp_path))
    said_locally = io.StringIO()
    build_corpus(recipe, tmp_path / "local", progress=said_locally)
    on_ray = io.StringIO()
    result = build_corpus(recipe, tmp_path / "ray", engine="ray", progress=on_ray)
    assert_same_corpus(tmp_path / "local", tmp_path / "ray")
    assert result.audit["skipped"]["duplicate"] >= 15 and result.audit["skipped"]["invalid_json"] == 1
    assert "columnar path: 58 rows by the kernels, 5 by the row path" in said_locally.getvalue()
    kernels, row_path = (int(figure.replace(",", "")) for figure in re.findall(
        r"columnar path: ([\d,]+) rows by the kernels, ([\d,]+) by the row path", on_ray.getvalue())[0])
    parts = row_path - 4  # each part's first row fixes its layout
    assert kernels + row_path == 63 and parts > 1


def test_a_copy_s_suffixed_id_that_is_another_row_s_own_id_fails_the_ray_build(cluster: None) -> None:
    """Rows a, a and a-1 (ids are content keys: no build makes this, the check is run on its inputs): the second a,
    numbered a-1, would be written under the third row's own id, which the Ray engine cannot number as the local
    engine does; found in whichever partition of the ids' entries holds it."""
    from corpus_builder.assemble import ray_data
    from corpus_builder.screen.ids import id_entries, numbered_copies

    first = id_entries(pa.table({"priority": pa.array([0, 1, 2], pa.int64()), "id": ["a", "b", "c"]}))
    second = id_entries(pa.table({"priority": pa.array([3, 4, 5], pa.int64()), "id": ["a", "d", "a-1"]}))
    numbered = numbered_copies(pa.concat_tables([first, second]))
    assert numbered.to_pylist() == [{"priority": 3, "id": "a-1"}]
    pieces = [[ray.put(first), ray.put(pa.table({}))], [ray.put(second)]]  # two partitions' pieces, one empty
    with pytest.raises(CorpusError, match=r"^the Ray engine cannot number repeated ids: a-1 is both a row's own id"):
        ray_data._copies([ray.put(numbered)], pieces)
    pieces[1] = [ray.put(second.filter(pc.not_equal(second.column("raw_id"), "a-1")))]
    assert ray_data._copies([ray.put(numbered)], pieces) == {3: "a-1"}


def test_a_file_without_rows_is_the_row_path_s_error_on_ray(cluster: None, tmp_path: Path) -> None:
    """A source file of blank lines, read by the columnar path's blocks in a Ray task: the row path's error."""
    (tmp_path / "rows.jsonl").write_bytes(b"\n".join(orjson.dumps(exchange(index)) for index in range(30)) + b"\n")
    (tmp_path / "more.jsonl").write_bytes(b"\n  \n\t\n" * 50)
    with pytest.raises(CorpusError, match=r"more\.jsonl: file has no rows"):
        build_corpus(load_recipe(covered_recipe(tmp_path, more="more.jsonl")), tmp_path / "ray", engine="ray")
    assert not (tmp_path / "ray").exists()


def test_the_tasks_dropped_records_merge_in_the_ledger_s_order(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Each writing task's file of dropped records is sorted by place, the tasks' priorities overlapping (a task
    holds rows of every part when the input is rebatched): the merge gives every record once, in place order, in
    rounds when there are more files than it opens at once."""
    from corpus_builder.assemble import ray_data

    monkeypatch.setattr(ray_data, "MERGED_AT_ONCE", 2)
    places = [[0, priority] for priority in range(0, 60, 3)] + [[1, order, priority] for order in (0, 1)
                                                                  for priority in range(5)]
    files = []
    for task in range(5):  # every fifth place, overlapping the others' ranges
        records = sorted([place, "s", "duplicate", f"f:{index}", "", f"id{index}"]
                         for index, place in enumerate(places) if index % 5 == task)
        files.append(tmp_path / f"task-{task}.jsonl")
        files[-1].write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in records))
    merged = list(ray_data.merged_dropped(files, tmp_path / "scratch"))
    expected = sorted((place, index) for index, place in enumerate(places))
    assert [record[2] for record in merged] == [f"f:{index}" for _, index in expected]
    assert len(list((tmp_path / "scratch").iterdir())) == 3 + 2  # five files in rounds of two: 3 files, then 2


# Prompts the loopback server answers (``served``) as a replayed row has it: a generated row of ``asks`` evicts the
# replayed copy of a source it outranks (exactly, or near: the prompt edited past the 60 characters its answer
# repeats), but not a copy that is a near duplicate of an earlier row itself, and is dropped as a duplicate of the
# copy of a source that outranks it.
EVICTED_PROMPT = "Which harbor lies past the copper canyon?"
OUTRANKED_PROMPT = "Where do falcons nest in the winter?"


def near_prompt(tag: str) -> tuple[str, str]:
    """A long prompt (its words ending in ``tag``), and the same with one word changed past its first 60
    characters."""
    words = [f"{word}{index % 7}{tag}" for index, word in enumerate(
        ("river meadow lantern copper violet harbor engine pencil thunder garden " * 8).split())]
    edited = list(words)
    edited[60] = "changed"
    return " ".join(words), " ".join(edited)


@pytest.fixture(scope="module")
def asked(messy: Path) -> Path:
    """Beside the messy sources: prompts (the first user turns of real chit-chat rows, a few of them alike, a
    conversation the eval set holds, the planted prompts and a copy of one in other case) and the replayed copies of
    their answers."""
    chats = [orjson.loads(line) for line in (messy / "chitchat.jsonl").read_bytes().splitlines()]
    (near, edited_near), (dropped, edited_dropped) = near_prompt("n"), near_prompt("d")
    prompts = [row["messages"][0]["content"] for row in chats[120:150]] + [
        " ".join(turn["content"] for turn in chats[150]["messages"]),
        EVICTED_PROMPT, near, dropped, OUTRANKED_PROMPT, EVICTED_PROMPT.upper().rstrip("?")]
    write_rows(messy / "asks.jsonl", [{"messages": [{"role": "user", "content": text}]} for text in prompts])
    write_rows(messy / "trusted.jsonl", [served(OUTRANKED_PROMPT)])
    write_rows(messy / "served.jsonl", [served(EVICTED_PROMPT), served(edited_near), served(edited_dropped),
                                        served(dropped), served("a prompt nobody asks")])
    return messy


def write_prompts_recipe(path: Path, data: Path, endpoint: str, *, mixture: str | None = None,
                         asks: str = "") -> Path:
    """Replay and prompt sources in this rank: trusted (outranks the generated rows), asks (the prompts, ``asks``:
    more keys of the source), chit-chat and served (the generated rows outrank them)."""
    path.write_text(
        "name: ray-prompts\n"
        f"target: {{model: {MODEL}, endpoints: [{endpoint}], generation: {{max_tokens: 64, timeout_s: 5, "
        "max_retries: 1}}\n"
        + (f"mixture: {mixture}\n" if mixture else "")
        + "sources:\n"
        f"  - {{name: trusted, kind: replay, path: {data}/trusted.jsonl}}\n"
        f"  - {{name: asks, kind: prompts, path: {data}/asks.jsonl{asks}}}\n"
        f"  - {{name: chitchat, kind: replay, path: {data}/chitchat.jsonl}}\n"
        f"  - {{name: served, kind: replay, path: {data}/served.jsonl}}\n"
        "checks: {near_duplicates: {threshold: 0.8}, dedup: exact}\n"
        f"decontamination: {{eval_sets: [{{name: held, path: {data}/eval.jsonl, fields: [question]}}]}}\n"
        "split: {validation_fraction: 0.2, seed: 3}\n"
        "output: {dir: out, rows_per_shard: 40}\n",
        encoding="utf-8")
    return path


def test_the_ray_engine_generates_prompt_sources_and_evicts_as_the_local_engine(cluster: None, asked: Path,
                                                                                tmp_path: Path) -> None:
    """The driver's session asks the server what the local engine asks; the generated rows evict the replayed
    copies they outrank, exact and near, and are dropped as copies of the row that outranks them."""
    with FaultServer(model=MODEL) as server:
        recipe = load_recipe(write_prompts_recipe(tmp_path / "recipe.yaml", asked, server.base_url))
        local = build_corpus(recipe, tmp_path / "local", progress=io.StringIO())
        asked_locally = len(server.chat_requests)
        build_corpus(recipe, tmp_path / "ray", engine="ray", progress=io.StringIO())
        assert len(server.chat_requests) == 2 * asked_locally
    ledger = list(iter_ledger(tmp_path / "local" / "ledger.jsonl.zst"))
    ids = {(row.source, row.messages[0].content): row.id for row in Corpus.open(local.out_dir).iter_conversations()}
    # the fixture exercises what it means to: both evictions, named by the row kept instead, the copy dropped as a
    # near duplicate before any row was generated (the generated row kept, the row it duplicates too), a generated
    # row dropped as a copy of a row that outranks it, a duplicate and a contaminated prompt before any request
    evicted = {(record["reason"], record["detail"]) for record in ledger if record["source"] == "served"}
    (near, _), (dropped, edited_dropped) = near_prompt("n"), near_prompt("d")
    assert evicted == {("duplicate", f"duplicate of {ids['asks', EVICTED_PROMPT]} (source asks)"),
                       ("near_duplicate", f"near duplicate of {ids['asks', near]} (source asks)"),
                       ("near_duplicate", f"near duplicate of {ids['served', edited_dropped]} (source served)")}
    assert ("asks", dropped) in ids and ("asks", OUTRANKED_PROMPT) not in ids
    reasons = Counter((record["source"], record["reason"]) for record in ledger)
    assert reasons[("asks", "duplicate")] >= 2 and reasons[("asks", "contaminated")] == 1
    assert_same_corpus(tmp_path / "local", tmp_path / "ray")


def test_the_ray_engine_generates_a_declared_corpus_in_the_local_engine_s_rounds(cluster: None, asked: Path,
                                                                                 tmp_path: Path) -> None:
    """A quarter of the prompts are answered without closing their think block (dropped): the rounds top the
    source up as the local engine's do. The local build, given the Ray build's journal, asks the server nothing:
    the Ray build asked for every row the local rounds ask for, and journaled it."""
    faults = {row["messages"][0]["content"]: Fault("unclosed", times=100)
              for row in [orjson.loads(line) for line in (asked / "asks.jsonl").read_bytes().splitlines()][::4]}
    with FaultServer(model=MODEL, by_prompt=faults) as server:
        recipe = load_recipe(write_prompts_recipe(tmp_path / "recipe.yaml", asked, server.base_url,
                                                  mixture="{total: 120, seed: 7}", asks=", target: {count: 20}"))
        build_corpus(recipe, tmp_path / "ray", engine="ray", progress=io.StringIO())
        asked_on_ray = len(server.chat_requests)
        shutil.copytree(tmp_path / "ray" / "journal", tmp_path / "local" / "journal")
        local = build_corpus(recipe, tmp_path / "local", progress=io.StringIO())
        assert len(server.chat_requests) == asked_on_ray
    # the fixture exercises what it means to: the first round falls short, a second tops it up to the count
    mixture = local.manifest.sections["mixture"]
    assert mixture["sources"]["asks"]["reached"] == 20 and not mixture["shortfalls"]
    assert asked_on_ray > 20 and mixture["sources"]["asks"]["generated_rows"] == asked_on_ray
    assert local.audit["skipped"]["unclosed_think"] >= 5
    assert_same_corpus(tmp_path / "local", tmp_path / "ray")


def test_the_ray_engine_lists_the_served_ids_mismatches_as_the_local_engine(
        cluster: None, asked: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    """Measured in the target's tokens, every turn the loopback server generates differs from the ids it says it
    served. Two prompt sources, the later in the recipe first in dedup (so generated first), a split: audit.json
    lists the mismatches by row id and turn, not in the order the rows reached the statistics (the local writer's
    row groups of each split; on the cluster, the writing tasks', each a block of rows by priority)."""
    chats = [orjson.loads(line) for line in (asked / "chitchat.jsonl").read_bytes().splitlines()]
    write_rows(tmp_path / "later.jsonl", [{"messages": row["messages"][:1]} for row in chats[100:112]])
    with FaultServer(model=MODEL) as server:
        (tmp_path / "recipe.yaml").write_text(
            "name: ray-mismatches\n"
            f"target: {{model: {MODEL}, tokenizer: {tiny_model_dir}, endpoints: [{server.base_url}], "
            "generation: {max_tokens: 64, timeout_s: 5, max_retries: 1}}\n"
            "sources:\n"
            f"  - {{name: asks, kind: prompts, path: {asked}/asks.jsonl}}\n"
            f"  - {{name: chitchat, kind: replay, path: {asked}/chitchat.jsonl}}\n"
            "  - {name: later, kind: prompts, path: later.jsonl}\n"
            "checks: {dedup: exact, dedup_priority: [later]}\n"
            "split: {validation_fraction: 0.2, seed: 3}\n"
            "output: {dir: out, rows_per_shard: 16}\n", encoding="utf-8")
        recipe = load_recipe(tmp_path / "recipe.yaml")
        local = build_corpus(recipe, tmp_path / "local", progress=io.StringIO())
        build_corpus(recipe, tmp_path / "ray", engine="ray", progress=io.StringIO())
    # the fixture exercises what it means to: a mismatch for every generated row written, of both sources and splits
    rows = {row.id: row for row in Corpus.open(local.out_dir).iter_conversations()}
    turns = [(mismatch["id"], mismatch["message_index"]) for mismatch in local.audit["tokens"]["mismatches"]["turns"]]
    assert sorted({row_id for row_id, _ in turns}) == sorted(row_id for row_id, row in rows.items()
                                                             if row.source != "chitchat")
    assert {(rows[row_id].source, rows[row_id].split) for row_id, _ in turns} == {
        (source, split) for source in ("asks", "later") for split in ("train", "validation")}
    assert turns == sorted(turns)
    assert_same_corpus(tmp_path / "local", tmp_path / "ray")


def worker_pids() -> set[int]:
    """The pids of this cluster's worker processes, as Ray reports them to tasks that run there."""

    @ray.remote(num_cpus=1)
    def pid() -> int:
        time.sleep(0.2)  # hold the worker, so the next task goes to the other
        return os.getpid()

    return set(ray.get([pid.remote() for _ in range(4)]))


def test_a_worker_killed_mid_build_leaves_the_same_corpus_or_a_failed_build(cluster: None, messy: Path,
                                                                             local_corpus: Path,
                                                                             tmp_path: Path) -> None:
    pids = worker_pids()
    baseline = {pid: _cpu_seconds(pid) for pid in pids}
    assert all(seconds >= 0 for seconds in baseline.values())
    killed: list[int] = []

    def kill_when_tasks_run() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            # a worker that has worked a third of a second since the build began: it runs the build's tasks
            busy = [pid for pid in pids if _cpu_seconds(pid) - baseline[pid] > 0.3]
            for pid in busy[:1]:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.05)

    killer = threading.Thread(target=kill_when_tasks_run, daemon=True)
    recipe = load_recipe(write_recipe(tmp_path / "recipe.yaml", messy))
    killer.start()
    try:
        build_corpus(recipe, tmp_path / "corpus", engine="ray")
    except Exception:  # a loud failure is allowed: nothing may look like a finished corpus then
        assert not (tmp_path / "corpus" / "manifest.json").exists()
    else:
        assert_same_corpus(local_corpus, tmp_path / "corpus")
    killer.join()
    assert killed, "no worker ran long enough to be killed"


def _cpu_seconds(pid: int) -> float:
    """CPU time a process has used (user + system), -1 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return -1.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_cli_without_ray_says_how_to_install_it(messy: Path, tmp_path: Path) -> None:
    """Ray hidden from the interpreter (a module that fails to import, first on the path)."""
    shadow = tmp_path / "shadow" / "ray"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no ray here', name='ray')\n")
    recipe = write_recipe(tmp_path / "recipe.yaml", messy)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow.parent), *sys.path])}
    done = subprocess.run([sys.executable, "-m", "corpus_builder", "build", str(recipe), "--engine", "ray"],
                          capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 2, done.stderr
    assert "pip install 'corpus-builder[ray]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_package_and_a_local_build_never_import_ray(messy: Path, tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "recipe.yaml", messy, dedup="none")
    script = ("import sys; from pathlib import Path; import corpus_builder, corpus_builder.cli; "
              "from corpus_builder.assemble import build_corpus; from corpus_builder.recipe import load_recipe; "
              f"build_corpus(load_recipe(Path({str(recipe)!r})), Path({str(tmp_path / 'out')!r})); "
              "print(sorted(name for name in sys.modules if name == 'ray' or name.startswith('ray.')))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    assert (tmp_path / "out" / "manifest.json").exists()


def test_an_address_without_the_ray_engine_is_a_usage_error(messy: Path, tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "recipe.yaml", messy)
    done = subprocess.run([sys.executable, "-m", "corpus_builder", "build", str(recipe), "--address", "auto"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "--address names a Ray cluster: it needs --engine ray" in done.stderr
    assert not (tmp_path / "out").exists()
