"""`corpus publish` with trainer exports: a published corpus is a training input as it is. The exports go up in the
same commit at exports/{format}/{split}.{file format}, the card names each with its command, and speculators' own
`prepare-data` reads the tokens file straight from the (loopback) Hub as it reads the local export."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from corpus_builder.assemble import build_corpus
from corpus_builder.errors import CorpusError
from corpus_builder.export import export_corpus
from corpus_builder.publish import ExportSpec, publish_corpus
from corpus_builder.recipe import load_recipe
from corpus_builder.testing.hub_server import HubServer
from tests.publish.conftest import FAST, RECIPE, TOKEN
from tests.support.trainers import speculators_prepare_data

TOKENS_TRAIN = "exports/speculators-tokens/train.jsonl"


def _publish(corpus: Path, hub: HubServer, **kwargs: Any) -> Any:
    return publish_corpus(corpus, "org/tiny", endpoint=hub.url, token=TOKEN, retry=FAST, **kwargs)


def _commits(hub: HubServer) -> list[Any]:
    return [c for c in hub.repo("org/tiny").commits if c.message != "initial commit"]


def test_exports_go_up_in_the_same_commit_with_their_commands_in_the_card(
        corpus: Path, hub: HubServer, tiny_model_dir: Path, tmp_path: Path) -> None:
    specs = [ExportSpec("speculators-tokens"), ExportSpec("messages"), ExportSpec("speculators-tokens", "parquet")]
    report = _publish(corpus, hub, exports=specs, tokenizer=tiny_model_dir)
    files = hub.repo("org/tiny").files()
    assert len(_commits(hub)) == 1
    for spec in specs:
        local = export_corpus(corpus, spec.format, tmp_path / f"{spec.format}-{spec.file_format}",
                              file_format=spec.file_format, tokenizer=tiny_model_dir)
        for split, info in local.files.items():
            if spec.file_format == "jsonl":  # parquet bytes carry the writer's metadata; jsonl is byte for byte
                assert files[f"exports/{spec.format}/{split}.jsonl"] == info.path.read_bytes()
            else:
                assert f"exports/{spec.format}/{split}.parquet" in files
    card = files["README.md"].decode()
    assert "## Train a head on it" in card and report.card == card
    assert (f"speculators prepare-data --model Org/Model-1B --data hf://datasets/org/tiny/{TOKENS_TRAIN} "
            "--output ./data --seq-length 8192\n") in card
    assert ("specforge train -c CONFIG.yaml model.target_model_path=Org/Model-1B "
            f"data.prompts_path={TOKENS_TRAIN}") in card
    assert ("python examples/speculative_decoding/main.py --config general/speculative_decoding/eagle3 "
            "model.model_name_or_path=Org/Model-1B data.data_path=hf://datasets/org/tiny/exports/messages/train.jsonl"
            in card)
    assert "| `speculators-tokens` | train | `exports/speculators-tokens/train.parquet` |" in card
    # Published again without exports: the repository mirrors the publish, so they go in one commit.
    again = _publish(corpus, hub)
    assert sorted(again.deleted) == sorted(path for path in files if path.startswith("exports/"))
    assert not any(path.startswith("exports/") for path in hub.repo("org/tiny").files())
    assert "## Train a head on it" not in hub.repo("org/tiny").files()["README.md"].decode()
    assert len(_commits(hub)) == 2


def test_the_recipes_publish_exports_are_the_default(tmp_path: Path, hub: HubServer, tiny_model_dir: Path) -> None:
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(
        {"messages": [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": f"hello {i}"}]}) + "\n"
        for i in range(20)))
    recipe = RECIPE.replace("target: {model: Org/Model-1B, revision: abc123}",
                            f"target: {{model: Org/Model-1B, revision: abc123, tokenizer: {tiny_model_dir}}}")
    recipe = recipe.replace("  - {name: math, kind: replay, path: math.jsonl, license: Apache-2.0, task: math}\n", "")
    recipe = recipe.replace("checks: {min_thinking_share: 0.3}", "") + (
        "publish:\n  exports:\n    - {format: speculators-tokens}\n    - {format: specforge, file_format: jsonl.zst}\n")
    (tmp_path / "recipe.yaml").write_text(recipe)
    built = build_corpus(load_recipe(tmp_path / "recipe.yaml")).out_dir
    report = _publish(built, hub)
    published = {path for path in hub.repo("org/tiny").files() if path.startswith("exports/")}
    assert published == {f"exports/{fmt}/{split}" for fmt, split in (
        ("speculators-tokens", "train.jsonl"), ("speculators-tokens", "validation.jsonl"),
        ("specforge", "train.jsonl.zst"), ("specforge", "validation.jsonl.zst"))}
    assert "data.train_data_path" not in report.card  # SpecForge reads JSONL: no command for a .zst file
    overridden = _publish(built, hub, exports=[ExportSpec("messages")])
    assert {path for path in hub.repo("org/tiny").files() if path.startswith("exports/")} == {
        "exports/messages/train.jsonl", "exports/messages/validation.jsonl"} and overridden.committed


def test_export_problems_stop_the_publish_before_any_request(corpus: Path, hub: HubServer) -> None:
    with pytest.raises(CorpusError, match="speculators-tokens needs the target's tokenizer"):
        _publish(corpus, hub, exports=[ExportSpec("speculators-tokens")])
    completed = subprocess.run([sys.executable, "-m", "corpus_builder", "publish", str(corpus), "--repo", "org/tiny",
                                "--endpoint", hub.url, "--export", "speculators:csv"], capture_output=True, text=True)
    assert completed.returncode == 2 and "--export speculators:csv: unknown file format 'csv'" in completed.stderr
    (corpus / "recipe.yaml").write_text((corpus / "recipe.yaml").read_text() + "publish: {exports: [{format: x}]}\n")
    with pytest.raises(CorpusError, match=r"recipe.yaml: publish.exports\[0\]: unknown export format 'x'"):
        _publish(corpus, hub)
    assert hub.requests == []


def test_speculators_prepares_the_published_tokens_file_as_the_local_one(
        corpus: Path, hub: HubServer, tiny_model_dir: Path, tmp_path: Path) -> None:
    """speculators 0.9.0's `prepare-data --data hf://datasets/org/tiny/exports/...` (its Hub client pointed at the
    loopback Hub by HF_ENDPOINT, no token: the repository is public) gives the rows it gives for the local export."""
    _publish(corpus, hub, exports=[ExportSpec("speculators-tokens")], tokenizer=tiny_model_dir, public=True)
    local = export_corpus(corpus, "speculators-tokens", tmp_path / "local", tokenizer=tiny_model_dir)
    ours = [orjson.loads(line) for line in local.files["train"].path.read_bytes().splitlines()]
    hub_env: dict[str, str | None] = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home"), "HF_TOKEN": None,
                                      "HF_HUB_OFFLINE": None, "HF_DATASETS_OFFLINE": None}
    from_hub = speculators_prepare_data(tiny_model_dir, f"hf://datasets/org/tiny/{TOKENS_TRAIN}", tmp_path / "hub",
                                        seq_length=4096, env=hub_env)
    from_file = speculators_prepare_data(tiny_model_dir, str(local.files["train"].path), tmp_path / "file",
                                         seq_length=4096, env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    key = lambda row: (tuple(row["input_ids"]), tuple(row["loss_mask"]))  # noqa: E731  (its rows are shuffled)
    assert Counter(map(key, from_hub)) == Counter(map(key, from_file)) == Counter(map(key, ours))
    downloads = [r for r in hub.requests if r.method == "GET" and f"/resolve/main/{TOKENS_TRAIN}" in r.path]
    assert downloads and all("authorization" not in {k.lower() for k in r.headers} for r in downloads)


def test_a_format_registered_as_one_record_is_exported_published_and_carded(
        corpus: Path, hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A format is its record alone: registered in TRAINER_FORMATS (nothing else touched), the export writes its
    rows, the publish uploads them and the card prints its note and its command on the published file."""
    import pyarrow as pa

    from corpus_builder.export import formats

    def convert(_token_rows: object) -> formats.Converter:
        return lambda conversations, skipped: iter([{"id": c.id} for c in conversations])

    ids = formats.TrainerFormat("ids", pa.schema([("id", pa.string())]), convert, "each conversation's id alone",
                                ("train-ids --data {hub_url} --model {target}",))
    monkeypatch.setitem(formats.TRAINER_FORMATS, "ids", ids)
    local = export_corpus(corpus, "ids", tmp_path / "ids")
    written = [orjson.loads(line) for line in local.files["train"].path.read_bytes().splitlines()]
    assert written and all(list(row) == ["id"] for row in written)
    report = _publish(corpus, hub, dry_run=True, exports=[ExportSpec("ids")])
    assert {f.path_in_repo for f in report.files} >= {f"exports/ids/{split}.jsonl" for split in local.files}
    assert "- `ids`: each conversation's id alone." in report.card
    assert "train-ids --data hf://datasets/org/tiny/exports/ids/train.jsonl --model Org/Model-1B" in report.card
