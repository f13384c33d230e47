"""`corpus audit --against TRAFFIC --engine ray`: the local audit's figures, the traffic read on a real Ray cluster the
module starts (``ray_cluster.start_cluster(num_cpus=2)``, as tests/assemble/test_ray_engine.py starts it, and why).

The traffic is messy on purpose: real ShareGPT records (repairs, skips), rows served in thinking and non-thinking
mode with tasks and turn counts on the buckets' edges, tool calls, bad lines, a parquet file and a .json document,
and serving logs of multi-turn chats logged per request across two daily files (the fold follows a chat across
them); and one .jsonl file of many (small) chunks, which the tasks read in ranges. Every comparison is of the whole
outcome: the JSON, the printed text, the failed checks and the page.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from corpus_builder import build_corpus, load_recipe
from corpus_builder.audit import AuditOptions, AuditOutcome, check_corpus
from corpus_builder.audit.inputs import read_parts, traffic_units
from corpus_builder.errors import CorpusError
from corpus_builder.sources import raw
from corpus_builder.sources.readers import UTF8_BOM
from tests.audit.test_traffic_logs import logged_traffic
from tests.support.ray_cluster import imported_ray, local_cluster
from tests.support.real_data import write_chitchat, write_rows, write_sharegpt
from tests.support.serving_logs import logged_conversation

from .fixtures import chat_row, corpus_rows, dialogue_row, mixed_traffic, summary_row, write_jsonl

ray = imported_ray()

TOKEN_SAMPLE = 60  # fewer than every side's rows: the sample, and the share the driver decides, are exercised
MAX_SKIPPED_SHARE = 0.01  # below the messy traffic's: its figures describe the readable part, and the check fails
PLOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
SMALL_CHUNK = 8 << 10  # bytes a chunk of a .jsonl file holds, for a test file of many chunks
BAD_LINES = b'not json\n[1, 2]\n{"messages": []}\n{"id": 3}\n{"messages": "not a list"}\n'


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """The cluster's address, for a CLI that joins it."""
    with local_cluster() as address:
        yield address


def tool_row(i: int, *, thinking: bool) -> dict[str, Any]:
    """A chat that calls a tool, gets its result and answers, served in the given mode."""
    call = {"id": f"call_{i}", "type": "function",
            "function": {"name": "get_weather", "arguments": orjson.dumps({"city": f"city {i}"}).decode()}}
    answer: dict[str, Any] = {"role": "assistant", "content": f"It is sunny in city {i}."}
    if thinking:
        answer["reasoning_content"] = f"The tool said city {i} is sunny."
    return {"task": "tools", "chat_template_kwargs": {"enable_thinking": thinking},
            "tools": [{"type": "function", "function": {
                "name": "get_weather", "description": "the weather of a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
            "messages": [{"role": "user", "content": f"what is the weather in city {i}?"},
                         {"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": f"call_{i}", "content": "sunny"}, answer]}


@pytest.fixture(scope="module")
def messy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("messy-traffic")
    write_sharegpt(root / "sharegpt.jsonl", 150)
    served = mixed_traffic() + [tool_row(i, thinking=i % 3 == 0) for i in range(12)]
    write_jsonl(root / "served.jsonl", served, extra=BAD_LINES)
    write_rows(root / "chitchat.parquet", write_chitchat(root / "chitchat.jsonl", 80))
    (root / "docs.json").write_bytes(orjson.dumps([summary_row(600 + i, thinking=i % 2 == 1) for i in range(15)]))
    (root / "logs").mkdir()
    logged = logged_traffic()
    logged += [row for i in range(4) for row in logged_conversation(
        "litellm_spend_logs", tool_row(900 + i, thinking=i % 2 == 0), thinking=i % 2 == 0)]
    write_jsonl(root / "logs" / "day1.jsonl", logged[:25])  # chats go on in the next day's log
    write_jsonl(root / "logs" / "day2.jsonl", logged[25:], extra=b'{"request": {"messages": []}}\n')
    (root / "traffic.yaml").write_text(
        "name: serving\n"
        "target: {model: tiny/target}\n"
        "sources:\n"
        "  - {name: sharegpt, kind: replay, path: sharegpt.jsonl, task: chat, mapping: {style: sharegpt}}\n"
        "  - {name: served, kind: replay, path: served.jsonl}\n"
        "  - {name: chitchat, kind: replay, path: chitchat.parquet, task: chat}\n"
        "  - {name: docs, kind: replay, path: docs.json, task: summarization}\n"
        "  - {name: logs, kind: replay, path: 'logs/day*.jsonl', task: chat}\n"
        "output: {dir: out}\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def untokenized_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A corpus whose recipe names no tokenizer: the comparison leaves the token dimensions out."""
    root = tmp_path_factory.mktemp("untokenized")
    chats, docs = corpus_rows()
    write_jsonl(root / "chat.jsonl", chats + [dialogue_row(i, turns=3, thinking=True) for i in range(20)])
    write_jsonl(root / "docs.jsonl", docs)
    (root / "recipe.yaml").write_text(
        "name: untokenized\n"
        "target: {model: tiny/target}\n"
        "sources:\n"
        "  - {name: chats, kind: replay, path: chat.jsonl, task: chat, license: MIT}\n"
        "  - {name: docs, kind: replay, path: docs.jsonl, task: summarization, license: MIT}\n"
        "output: {dir: out}\n", encoding="utf-8")
    return build_corpus(load_recipe(root / "recipe.yaml")).out_dir


def audited(corpus: Path, traffic: Path | str, html: Path, **engine: Any) -> AuditOutcome:
    return check_corpus(corpus, against=str(traffic), html=html, max_divergence=0.2, secrets=False,
                        options=AuditOptions(token_sample=TOKEN_SAMPLE, max_skipped_share=MAX_SKIPPED_SHARE, **engine))


def assert_same_outcome(local: AuditOutcome, on_ray: AuditOutcome) -> None:
    assert on_ray.to_json() == local.to_json()
    assert on_ray.describe() == local.describe()
    assert on_ray.problems == local.problems
    assert local.html is not None and on_ray.html is not None
    assert page(on_ray.html) == page(local.html)


def page(path: Path) -> str:
    """The HTML report but for the ids plotly draws at random for its figures' elements."""
    return PLOT_ID.sub("<id>", path.read_text(encoding="utf-8"))


def test_the_traffic_is_cut_in_parts_and_the_logs_of_one_source_stay_together(messy: Path) -> None:
    parts = [[unit.label for unit in part] for part in read_parts(traffic_units(str(messy / "traffic.yaml")))]
    assert parts == [["sharegpt.jsonl"], ["served.jsonl"], ["chitchat.parquet"], ["docs.json"],
                     ["day1.jsonl", "day2.jsonl"]]
    # a glob of files that hold no logged request: one part each
    assert len(read_parts(traffic_units(str(messy / "*.jsonl")))) == 3


@pytest.mark.parametrize("traffic", ["traffic.yaml", "logs/day*.jsonl", "*.jsonl"])
def test_the_ray_audit_gives_the_local_audit_s_figures(cluster: str, corpus: Path, messy: Path, traffic: str,
                                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local = audited(corpus, messy / traffic, tmp_path / "local.html")
    import corpus_builder.audit.traffic as comparison

    read_here = comparison.read_profile

    def corpus_only(label: str, *args: Any, **kwargs: Any) -> Any:
        assert label == str(corpus), "the traffic was read by the local engine"
        return read_here(label, *args, **kwargs)

    monkeypatch.setattr(comparison, "read_profile", corpus_only)
    on_ray = audited(corpus, messy / traffic, tmp_path / "ray.html", engine="ray")
    assert_same_outcome(local, on_ray)
    side = local.to_json()["traffic"]  # type: ignore[index]
    # what the traffic exercises: token dimensions (on a sample but of the logs' 24 chats), skipped rows, and (the
    # logs) the fold and tools; both modes
    assert side["lengths"]
    if traffic != "logs/day*.jsonl":
        assert side["token_sample"]["conversations"] < side["token_sample"]["of"]
        assert sum(side["skipped"].values()) >= 5 and local.to_json()["readable"]["partial"]  # type: ignore[index]
        assert any("--allow-skipped" in problem for problem in local.problems)
    if traffic != "*.jsonl":
        assert side["folded_prefix"] > 0
        assert side["counts"]["tool_calls"]["with tool calls"] >= 4
    assert {"thinking", "non-thinking"} <= set(side["counts"]["thinking"])


def test_without_a_tokenizer_the_ray_audit_gives_the_local_audit_s_figures(cluster: str, untokenized_corpus: Path,
                                                                          messy: Path, tmp_path: Path) -> None:
    local = audited(untokenized_corpus, messy / "traffic.yaml", tmp_path / "local.html")
    on_ray = audited(untokenized_corpus, messy / "traffic.yaml", tmp_path / "ray.html", engine="ray")
    assert_same_outcome(local, on_ray)
    report: Any = local.to_json()
    assert report["tokenizer"] is None and "lengths" not in report["traffic"]
    assert report["traffic"]["folded_prefix"] > 0 and report["readable"]["skipped"] > 0


@pytest.fixture(scope="module")
def large(messy: Path) -> Path:
    """One file of many chunks (with ``SMALL_CHUNK`` bytes a chunk): messages rows (served in either mode, tools)
    alternating with ShareGPT records, which the layout the file's first row fixes (messages) skips, and bad lines;
    a byte order mark first."""
    rows = [orjson.dumps(row) + b"\n" for row in mixed_traffic() + [tool_row(i, thinking=i % 3 == 0) for i in range(12)]
            + write_chitchat(messy / "chit.jsonl", 120)]
    records = (messy / "sharegpt.jsonl").read_bytes().splitlines(keepends=True)
    lines = [line for index, row in enumerate(rows) for line in (row, *records[index:index + 1])]
    lines[40:40] = BAD_LINES.splitlines(keepends=True)
    path = messy / "large.jsonl"
    path.write_bytes(UTF8_BOM + b"".join(lines))
    return path


@pytest.mark.parametrize("token_sample", [TOKEN_SAMPLE, 0])
def test_a_large_file_cut_in_ranges_gives_the_local_audit_s_figures(cluster: str, corpus: Path, large: Path,
                                                                   token_sample: int, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Read by tasks a range each; with a sample, the ranges are counted first for their rows' places in the file."""
    monkeypatch.setattr(raw, "CHUNK_BYTES", SMALL_CHUNK)
    parts = read_parts(traffic_units(str(large)), cut=8)
    assert len(parts) == 8 and [part[0].first_row for part in parts] == [0] + [None] * 7
    options = AuditOptions(token_sample=token_sample, max_skipped_share=MAX_SKIPPED_SHARE)
    local = check_corpus(corpus, against=str(large), html=tmp_path / "local.html", options=options, secrets=False)
    on_ray = check_corpus(corpus, against=str(large), html=tmp_path / "ray.html", secrets=False,
                          options=dataclasses.replace(options, engine="ray"))
    assert_same_outcome(local, on_ray)
    side: Any = local.to_json()
    sample = side["traffic"]["token_sample"]
    assert (sample["conversations"] < sample["of"]) == (token_sample > 0)
    assert side["traffic"]["skipped"]["missing_messages"] >= 100  # the ShareGPT records, in every range


def test_a_log_is_never_cut(messy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(raw, "CHUNK_BYTES", SMALL_CHUNK)
    assert len(raw.block_bounds(messy / "logs" / "day1.jsonl")) >= 3  # two chunks or more
    assert len(read_parts(traffic_units(str(messy / "logs" / "day1.jsonl")), cut=8)) == 1


def corpus_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corpus_builder", *map(str, args)], capture_output=True, text=True,
                          check=False)


def test_the_cli_joins_the_cluster_and_prints_the_local_json(cluster: str, corpus: Path, messy: Path) -> None:
    arguments = ("audit", corpus, "--against", messy / "traffic.yaml", "--json", "--no-secrets", "--token-sample", "0")
    local = corpus_cli(*arguments)
    on_ray = corpus_cli(*arguments, "--engine", "ray", "--address", cluster)
    assert local.returncode == on_ray.returncode == 0, on_ray.stderr
    assert on_ray.stdout == local.stdout


def cut_zstd(path: Path, rows: list[dict[str, Any]]) -> Path:
    """A .jsonl.zst whose stream ends early (an incomplete download): its first blocks read, then the error."""
    import zstandard

    whole = zstandard.ZstdCompressor().compress(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    path.write_bytes(whole[:-16])
    return path


def error_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    """What the CLI says of the problem (Ray logs its own lines around it)."""
    assert done.returncode == 2 and "Traceback" not in done.stderr and not done.stdout
    return [line for line in done.stderr.splitlines() if line.startswith("error: ")]


def the_error(corpus: Path, traffic: str, address: str) -> str:
    """The problem the local audit and the Ray audit stop at: the same."""
    arguments = ("audit", corpus, "--against", traffic, "--no-secrets")
    [local] = error_lines(corpus_cli(*arguments))
    assert error_lines(corpus_cli(*arguments, "--engine", "ray", "--address", address)) == [local]
    return local


def test_a_bad_traffic_file_is_the_local_audit_s_error(cluster: str, corpus: Path, tmp_path: Path) -> None:
    """Files read by separate tasks, both cut short: the first in reading order is the one reported, as the local
    audit stops at it; a file that cannot be read from its start (a .json document that is not JSON, a file without
    rows) is read in order with the others, and reported with its line."""
    chats = [chat_row(i, thinking=i % 2 == 0, served=True) for i in range(3000)]
    write_jsonl(tmp_path / "a-good.jsonl", chats[:10])
    cut_zstd(tmp_path / "b-cut.jsonl.zst", chats)
    cut_zstd(tmp_path / "c-cut.jsonl.zst", chats)
    traffic = str(tmp_path / "*.json*")
    assert len(read_parts(traffic_units(traffic))) == 3
    assert the_error(corpus, traffic, cluster).startswith("error: b-cut.jsonl.zst: truncated zstd stream")
    (tmp_path / "b-cut.jsonl.zst").unlink()
    (tmp_path / "c-cut.jsonl.zst").unlink()
    (tmp_path / "d-broken.json").write_bytes(b'[{"messages": []},\n {"messages": ]')
    assert the_error(corpus, traffic, cluster).startswith("error: d-broken.json:2: not valid JSON")
    (tmp_path / "b-empty.jsonl").write_bytes(b"\n\n")
    assert the_error(corpus, traffic, cluster) == "error: b-empty.jsonl: file has no rows"


def test_an_address_that_is_not_one_is_a_usage_error(corpus: Path, messy: Path) -> None:
    """Named by --address or by RAY_ADDRESS: refused as the build refuses it, before Ray is asked to join it."""
    arguments = ("audit", corpus, "--against", messy / "served.jsonl", "--no-secrets", "--engine", "ray")
    for named_by, more, address in (("--address", ("--address", "head:port"), None), ("RAY_ADDRESS", (), "head:port")):
        env = {name: value for name, value in os.environ.items() if name != "RAY_ADDRESS"}
        env.update({"RAY_ADDRESS": address} if address is not None else {})
        done = subprocess.run([sys.executable, "-m", "corpus_builder", *map(str, arguments), *more],
                              capture_output=True, text=True, env=env, check=False)
        assert error_lines(done) == [f"error: {named_by} head:port: not a Ray cluster's address: a Ray head's address "
                                     "is HOST:PORT, as `ray start --head` prints it (port 6379 by default)"]


def test_an_address_without_the_ray_engine_is_a_usage_error(corpus: Path, messy: Path) -> None:
    done = corpus_cli("audit", corpus, "--against", messy / "served.jsonl", "--address", "auto")
    assert done.returncode == 2
    assert "--address names a Ray cluster: it needs --engine ray" in done.stderr and "Traceback" not in done.stderr
    with pytest.raises(CorpusError, match="needs --engine ray"):
        AuditOptions(address="auto")


def test_the_ray_engine_needs_traffic_to_read(corpus: Path) -> None:
    done = corpus_cli("audit", corpus, "--engine", "ray", "--html", corpus.parent / "page.html")
    assert done.returncode == 2
    assert "--engine ray reads the traffic of a comparison: it needs --against TRAFFIC" in done.stderr
    assert not (corpus.parent / "page.html").exists()


def test_the_cli_without_ray_says_how_to_install_it(corpus: Path, messy: Path, tmp_path: Path) -> None:
    """Ray hidden from the interpreter (a module that fails to import, first on the path)."""
    shadow = tmp_path / "shadow" / "ray"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no ray here', name='ray')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow.parent), *sys.path])}
    done = subprocess.run([sys.executable, "-m", "corpus_builder", "audit", str(corpus), "--against",
                           str(messy / "served.jsonl"), "--engine", "ray"],
                          capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 2, done.stderr
    assert "pip install 'corpus-builder[ray]'" in done.stderr
    assert "Traceback" not in done.stderr and not done.stdout


def test_the_package_and_a_local_audit_never_import_ray(corpus: Path, messy: Path) -> None:
    script = ("import sys; import corpus_builder, corpus_builder.cli; "
              "from corpus_builder.audit import AuditOptions, audit_against; "
              f"audit_against({str(corpus)!r}, {str(messy / 'traffic.yaml')!r}, AuditOptions(token_sample=0)); "
              "print(sorted(name for name in sys.modules if name == 'ray' or name.startswith('ray.')))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
