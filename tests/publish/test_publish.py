"""`corpus publish` against a loopback Hub: the gate, one private commit, retries, resume, read-back, card."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import sys
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from corpus_builder.assemble import build_corpus
from corpus_builder.errors import CorpusError
from corpus_builder.hub import DEFAULT_ENDPOINT, download_corpus, fetch_tokenizer, hub_endpoint
from corpus_builder.publish import CorpusDocuments, GateFailed, check_corpus, publish_corpus, render_card
from corpus_builder.publish.card import card_license, parse_front_matter
from corpus_builder.recipe import load_recipe
from corpus_builder.testing.hub_server import SIZE_CATEGORIES, HubServer, validate_card_metadata
from tests.publish.conftest import FAST, TOKEN, edit_json, rewrite_shard
from tests.support.build_writing import build_writing


def _publish(corpus: Path, hub: HubServer, repo: str = "org/tiny", **kwargs: Any) -> Any:
    return publish_corpus(corpus, repo, endpoint=hub.url, token=TOKEN, retry=FAST, **kwargs)


def _commits(hub: HubServer) -> list[Any]:
    return [c for c in hub.repo("org/tiny").commits if c.message != "initial commit"]


def test_publish_is_private_one_commit_with_exact_bytes(corpus: Path, hub: HubServer) -> None:
    report = _publish(corpus, hub)
    repo = hub.repo("org/tiny")
    assert repo.private and report.private and report.committed
    assert len(_commits(hub)) == 1 and repo.branches["main"] == report.commit
    files = repo.files()
    manifest = json.loads((corpus / "manifest.json").read_text())
    shard_paths = [entry["path"] for entry in manifest["files"]]
    assert set(files) == {".gitattributes", "README.md", "recipe.yaml", "manifest.json", "audit.json", *shard_paths}
    for entry in manifest["files"]:
        assert files[entry["path"]] == (corpus / entry["path"]).read_bytes()
        assert hashlib.sha256(files[entry["path"]]).hexdigest() == entry["sha256"]
    assert files["manifest.json"] == (corpus / "manifest.json").read_bytes()
    assert files["README.md"].decode() == report.card
    # One commit request carried everything; the shards went through preupload first.
    posts = [r.path.split("?")[0] for r in hub.requests if r.method == "POST"]
    assert sum(p.endswith("/commit/main") for p in posts) == 1
    assert posts.index("/api/datasets/org/tiny/preupload/main") < posts.index("/api/datasets/org/tiny/commit/main")


def test_card_front_matter_meets_hub_rules(corpus: Path, hub: HubServer) -> None:
    report = _publish(corpus, hub)
    card = hub.repo("org/tiny").files()["README.md"].decode()
    assert validate_card_metadata(card) == []
    metadata = parse_front_matter(card)
    assert metadata["size_categories"] == ["n<1K"] and set(metadata["size_categories"]) <= set(SIZE_CATEGORIES)
    assert metadata["license"] == "other"  # Apache-2.0 and MIT: named in the body instead
    assert "`Apache-2.0`: math" in card and "`MIT`: chat" in card
    assert metadata["source_datasets"] == ["math", "chat"]
    assert metadata["annotations_creators"] == ["machine-generated"]
    assert metadata["task_categories"] == ["text-generation"] and "speculative-decoding" in metadata["tags"]
    [config] = metadata["configs"]
    assert config["config_name"] == "default" and config["default"] is True
    listed = {path for data_file in config["data_files"] for path in data_file["path"]}
    uploaded = {path for path in hub.repo("org/tiny").files() if path.endswith(".parquet")}
    assert listed == uploaded and {f["split"] for f in config["data_files"]} == {"train", "validation"}
    for section in ("## Composition", "## Thinking share", "## Target model and generation",
                    "## Dropped and truncated rows", "## Recipe", 'load_dataset("org/tiny"'):
        assert section in card
    assert str(corpus) not in card and report.card == card


def test_card_license_single_and_size_category(corpus: Path) -> None:
    docs = CorpusDocuments.load(corpus)
    recipe = json.loads(json.dumps(docs.recipe))
    for source in recipe["sources"]:
        source["license"] = "Apache-2.0"
    single = replace(docs, recipe=recipe)
    assert card_license(single) == ("apache-2.0", ["Apache-2.0"])
    big = replace(docs, manifest=replace(docs.manifest, conversations=250_000))
    assert parse_front_matter(render_card(big))["size_categories"] == ["100K<n<1M"]


def test_local_paths_and_url_credentials_are_not_published(corpus: Path, hub: HubServer) -> None:
    recipe = (corpus / "recipe.yaml").read_text()
    recipe = recipe.replace("  revision: abc123\n", "  revision: abc123\n  tokenizer: /home/alice/models/tok\n")
    recipe = recipe.replace("  endpoints: []\n", "  endpoints: ['http://alice:pw@gpu-box:8000/v1']\n")
    (corpus / "recipe.yaml").write_text(recipe)
    report = _publish(corpus, hub)
    files = hub.repo("org/tiny").files()
    for text in (files["recipe.yaml"].decode(), files["README.md"].decode(), report.card):
        assert "/home/alice" not in text and "alice:pw" not in text
        assert "http://gpu-box:8000/v1" in text


def test_token_never_leaves_the_authorization_header(corpus: Path, hub: HubServer,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    report = _publish(corpus, hub)
    # A server error that echoes the token must not bring it into the exception text.
    hub.fail("POST", "/api/repos/create", 400, message=f"bad request for token {TOKEN}")
    with pytest.raises(CorpusError) as failure:
        publish_corpus(corpus, "org/other", endpoint=hub.url, token=TOKEN, retry=FAST)
    assert TOKEN not in str(failure.value) and "***" in str(failure.value)
    assert TOKEN not in report.describe() and TOKEN not in json.dumps(report.to_dict())
    token = TOKEN.encode()
    for request in hub.requests:
        assert token not in request.body and TOKEN not in request.path
        for name, value in request.headers.items():
            assert name.lower() == "authorization" or TOKEN not in value
    assert any({k.lower(): v for k, v in r.headers.items()}.get("authorization") == f"Bearer {TOKEN}"
               for r in hub.requests)
    assert all(token not in content for content in hub.repo("org/tiny").files().values())
    assert TOKEN not in caplog.text


def _tamper_checksum(corpus: Path) -> None:
    with (corpus / "data/train-00000-of-00003.parquet").open("r+b") as handle:
        handle.seek(100)
        byte = handle.read(1)
        handle.seek(100)
        handle.write(bytes([byte[0] ^ 0xFF]))


def _remove_shard(corpus: Path) -> None:
    (corpus / "data/validation-00000-of-00001.parquet").unlink()


def _bad_role(corpus: Path) -> None:
    def mutate(rows: list[dict[str, Any]]) -> None:
        rows[0]["messages"][0]["role"] = "narrator"

    rewrite_shard(corpus, "data/train-00001-of-00003.parquet", mutate)


def _raise_minimum(corpus: Path) -> None:
    recipe = (corpus / "recipe.yaml").read_text()
    (corpus / "recipe.yaml").write_text(recipe.replace("min_thinking_share: 0.3", "min_thinking_share: 0.9"))


def _plant_secret(corpus: Path) -> None:
    def mutate(rows: list[dict[str, Any]]) -> None:
        rows[1]["messages"][-1]["content"] += " my key is hf_" + "Zx9" * 12

    rewrite_shard(corpus, "data/train-00002-of-00003.parquet", mutate)


GATE_CASES = {
    "checksum": (_tamper_checksum, "data/train-00000-of-00003.parquet: sha256 does not match"),
    "missing": (_remove_shard, "data/validation-00000-of-00001.parquet: shard listed in manifest.json is missing"),
    "schema": (_bad_role, "schema: data/train-00001-of-00003.parquet#0"),
    "thinking": (_raise_minimum, "is below the minimum 90.0%"),
    "secret": (_plant_secret, "secrets: "),
}


@pytest.mark.parametrize("case", sorted(GATE_CASES))
def test_gate_blocks_each_failing_check_before_any_request(corpus: Path, hub: HubServer, case: str) -> None:
    tamper, expected = GATE_CASES[case]
    tamper(corpus)
    with pytest.raises(GateFailed) as failure:
        _publish(corpus, hub)
    assert any(expected in line for line in failure.value.failures), failure.value.failures
    assert hub.requests == []
    if case == "secret":
        assert "Zx9Zx9" not in str(failure.value) and "hf_token" in str(failure.value)


def test_gate_lists_every_failure_at_once(corpus: Path) -> None:
    for tamper, _ in GATE_CASES.values():
        tamper(corpus)
    failures = check_corpus(corpus).failures
    for _, expected in GATE_CASES.values():
        assert any(expected in line for line in failures), (expected, failures)


def test_interrupted_publish_succeeds_when_rerun(corpus: Path, hub: HubServer) -> None:
    hub.drop("POST", "/commit/", times=FAST.attempts)
    with pytest.raises(CorpusError, match="commit failed"):
        _publish(corpus, hub)
    assert _commits(hub) == []
    report = _publish(corpus, hub)
    assert report.committed and len(_commits(hub)) == 1


def test_lost_commit_response_makes_no_duplicate_commit(corpus: Path, hub: HubServer) -> None:
    hub.drop("POST", "/commit/", after_apply=True)
    report = _publish(corpus, hub)
    assert report.committed and len(_commits(hub)) == 1
    assert sum("/commit/" in r.path for r in hub.requests) == 1


def test_unchanged_republish_makes_no_commit(corpus: Path, hub: HubServer) -> None:
    first = _publish(corpus, hub)
    before = len(hub.requests)
    second = _publish(corpus, hub)
    assert not second.committed and second.commit == first.commit and len(_commits(hub)) == 1
    assert not any("/commit/" in r.path or "/preupload/" in r.path for r in hub.requests[before:])
    assert "unchanged" in second.describe()


def test_stale_shards_are_deleted_in_the_same_commit(corpus: Path, hub: HubServer) -> None:
    _publish(corpus, hub)
    head = hub.repo("org/tiny").commit("main")
    head.files["data/train-00003-of-00004.parquet"] = b"left over from an earlier, larger corpus"
    report = _publish(corpus, hub)
    assert report.deleted == ["data/train-00003-of-00004.parquet"] and report.uploaded == []
    assert "data/train-00003-of-00004.parquet" not in hub.repo("org/tiny").files()


def test_dry_run_sends_nothing_and_needs_no_token(corpus: Path, hub: HubServer) -> None:
    report = publish_corpus(corpus, "org/tiny", endpoint=hub.url, dry_run=True)
    assert hub.requests == [] and hub.repos == {}
    text = report.describe()
    manifest = json.loads((corpus / "manifest.json").read_text())
    for entry in manifest["files"]:
        assert entry["path"] in text and entry["sha256"] in text and f"{entry['bytes']:,} B" in text
    assert "--- README.md ---" in text and report.card in text and report.commit is None


def test_transient_errors_are_retried(corpus: Path, hub: HubServer) -> None:
    hub.fail("POST", "/api/repos/create", 500)
    hub.fail("GET", "/revision/", 429)
    hub.fail("POST", "/commit/", 412)
    report = _publish(corpus, hub)
    assert report.committed and len(_commits(hub)) == 1
    commit_posts = [r for r in hub.requests if r.method == "POST" and "/commit/" in r.path]
    assert len(commit_posts) == 2


def test_permanent_errors_are_not_retried(corpus: Path, hub: HubServer) -> None:
    hub.fail("POST", "/commit/", 403, times=5)
    with pytest.raises(CorpusError, match="403"):
        _publish(corpus, hub)
    assert sum("/commit/" in r.path for r in hub.requests) == 1


def test_public_flag_and_existing_public_repository(corpus: Path, hub: HubServer) -> None:
    report = _publish(corpus, hub, public=True)
    assert not report.private and not hub.repo("org/tiny").private
    with pytest.raises(CorpusError, match="is public"):
        _publish(corpus, hub)


def test_publish_to_a_branch(corpus: Path, hub: HubServer) -> None:
    report = _publish(corpus, hub, revision="v1")
    repo = hub.repo("org/tiny")
    assert repo.branches["v1"] == report.commit and "README.md" not in repo.files("main")


def test_published_repository_downloads_and_passes_the_gate(corpus: Path, hub: HubServer) -> None:
    _publish(corpus, hub)
    with download_corpus("hf://datasets/org/tiny", endpoint=hub.url, token=TOKEN) as local:
        assert check_corpus(local).failures == []
        assert (local / "manifest.json").read_bytes() == (corpus / "manifest.json").read_bytes()
    assert not local.exists()


def test_missing_token_is_a_clear_error(corpus: Path, hub: HubServer) -> None:
    with pytest.raises(CorpusError, match="no Hub token"):
        publish_corpus(corpus, "org/tiny", endpoint=hub.url)
    assert hub.requests == []


def _corpus_cli(*args: str, token: str | None = TOKEN, home: Path) -> Any:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_ENDPOINT")}
    env["HF_HOME"] = str(home)
    if token:
        env["HF_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "corpus_builder", *args], capture_output=True, text=True, env=env)


def test_cli_publish_gate_exit_codes_and_remote_audit(corpus: Path, hub: HubServer, tmp_path: Path) -> None:
    home = tmp_path / "home"
    dry = _corpus_cli("publish", str(corpus), "--repo", "org/cli", "--endpoint", hub.url, "--dry-run", home=home)
    assert dry.returncode == 0, dry.stderr
    assert "would upload" in dry.stdout and "data/train-00000-of-00003.parquet" in dry.stdout
    assert not hub.requests
    done = _corpus_cli("publish", str(corpus), "--repo", "org/cli", "--endpoint", hub.url, home=home)
    assert done.returncode == 0, done.stderr
    assert TOKEN not in done.stdout + done.stderr
    assert hub.repo("org/cli").private
    audit = _corpus_cli("audit", "hf://datasets/org/cli", "--endpoint", hub.url, "--json", home=home)
    assert audit.returncode == 0, audit.stderr
    assert json.loads(audit.stdout) == {k: v for k, v in json.loads((corpus / "audit.json").read_text()).items()
                                        if k != "checks"}
    _raise_minimum(corpus)
    refused = _corpus_cli("publish", str(corpus), "--repo", "org/cli", "--endpoint", hub.url, home=home)
    assert refused.returncode == 1 and "below the minimum 90.0%" in refused.stderr
    no_token = _corpus_cli("publish", str(corpus), "--repo", "org/x", "--endpoint", hub.url, token=None, home=home)
    assert no_token.returncode in (1, 2) and "Traceback" not in no_token.stderr


@pytest.mark.parametrize(("path", "lose", "problem"), [
    ("README.md", False, "README.md: size or hash differs"),
    ("data/train-00001-of-00003.parquet", True, "data/train-00001-of-00003.parquet: missing"),
])
def test_the_read_back_catches_a_file_the_hub_stored_wrong(corpus: Path, hub: HubServer, path: str, lose: bool,
                                                           problem: str) -> None:
    hub.corrupt(path, lose=lose)  # the commit answers 200; the stored tree is not what was sent
    with pytest.raises(CorpusError, match="does not match the corpus") as failure:
        _publish(corpus, hub)
    assert problem in str(failure.value)
    report = _publish(corpus, hub)  # a re-run sends the wrong file again and verifies it
    [sent] = [f for f in report.files if f.path_in_repo == path]
    assert report.uploaded == [path]
    assert hub.repo("org/tiny").files()[path] == (sent.content or (corpus / path).read_bytes())


def _build_with_secrets(tmp_path: Path, redact: bool) -> Path:
    """A corpus whose rows carry secrets where a dump has them: a token in a row's own id, a PEM key and a
    URL login in the turns."""
    token = "hf_" + "RowIdTokenOfAServingLog0123456789"
    key = ("-----BEGIN EC PRIVATE " + "KEY-----\nMHcCAQEEIBx8hQ0m+9a1W0N3vH0bZp7yC0sX8wq3nY4dZ1a2b3c4oAoGCCqGSM49\n"
           "AwEHoUQDQgAE3ZkQ2x1K0yX8n4sT6o9hJ2mB7cV1eR5tW0aQ3zL8uN6pM4kS2jD1\nfG7hY9cX5vB3nE0qW==\n"
           "-----END EC PRIVATE KEY-----")
    rows = [{"id": f"{token}-{i}", "messages": [
        {"role": "user", "content": f"my key is\n{key}\nand the dump is at ftp://" + "loader:pw@files.example.com/x"},
        {"role": "assistant", "content": f"Rotate it ({i})."}]} for i in range(5)]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "recipe.yaml").write_text(
        "name: leaky\ntarget: {model: m}\nsources:\n  - {name: log, kind: replay, path: log.jsonl}\n"
        f"checks: {{redact_secrets: {str(redact).lower()}}}\nsplit: {{validation_fraction: 0}}\n"
        f"output: {{dir: out-{redact}}}\n")
    return build_corpus(load_recipe(tmp_path / "recipe.yaml")).out_dir


def test_secrets_in_row_ids_and_multi_line_keys_are_redacted_so_the_gate_passes(tmp_path: Path) -> None:
    unredacted = check_corpus(_build_with_secrets(tmp_path, redact=False)).failures
    for field in ("provenance.source_id: hf_token", "messages[0].content: private_key",
                  "messages[0].content: url_credentials"):
        assert any(field in failure for failure in unredacted), (field, unredacted)
    out = _build_with_secrets(tmp_path, redact=True)
    assert check_corpus(out).failures == []
    stored = b"".join(path.read_bytes() for path in (out / "data").glob("*.parquet"))
    rows = [row for path in sorted((out / "data").glob("*.parquet")) for row in pq.read_table(path).to_pylist()]
    for fragment in ("RowIdTokenOfAServingLog", "MHcCAQEE", "fG7hY9cX5vB3nE0qW", "END EC PRIVATE", "loader:pw"):
        assert all(fragment not in json.dumps(row) for row in rows) and fragment.encode() not in stored
    assert json.loads(rows[0]["provenance"])["source_id"].startswith("[REDACTED:hf_token]-")


def _edit_recipe(corpus: Path, edit: Callable[[dict[str, Any]], Any]) -> None:
    import yaml

    document = yaml.safe_load((corpus / "recipe.yaml").read_text())
    edit(document)  # in place
    (corpus / "recipe.yaml").write_text(yaml.safe_dump(document, sort_keys=False))


ODD_RECIPES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "description is a number": lambda d: d.update(description=42),
    "description is a list": lambda d: d.update(description=["a", "b"]),
    "name is a number": lambda d: d.update(name=12),
    "sources is a mapping": lambda d: d.update(sources={"math": 1}),
    "sources is text": lambda d: d.update(sources="math, chat"),
    "a source without a name": lambda d: d["sources"][0].pop("name"),
    "numbers for strings": lambda d: d["sources"][0].update(name=5, license=7, task=3, hub="x", kind=1),
    "a source is a list": lambda d: d["sources"].append(["name", "x"]),
    "target is text": lambda d: d.update(target="Org/Model-1B"),
    "target model is a number": lambda d: d["target"].update(model=123, revision=["r"]),
    "checks is text": lambda d: d.update(checks="strict"),
    "no sources at all": lambda d: d.pop("sources"),
}


@pytest.mark.parametrize("case", sorted(ODD_RECIPES))
def test_a_corpus_recipe_with_odd_fields_still_gets_a_card(corpus: Path, case: str) -> None:
    _edit_recipe(corpus, ODD_RECIPES[case])
    report = publish_corpus(corpus, "org/tiny", dry_run=True)
    assert validate_card_metadata(report.card) == []
    assert all(isinstance(name, str) for name in parse_front_matter(report.card)["source_datasets"])


@pytest.mark.parametrize(("recipe", "message"), [
    ("checks: {min_thinking_share: high}\n", "checks.min_thinking_share is 'high', not a share from 0 to 1"),
    ("- a list\n- not a recipe\n", "cannot be read as a plain YAML mapping"),
    ("name: !!python/object/apply:os.system [echo hi]\n", "tag !!python/object/apply:os.system is not allowed"),
    ("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "c: [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n", "alias *a is not allowed"),
])
def test_a_corpus_recipe_that_cannot_be_trusted_is_a_clear_error(corpus: Path, tmp_path: Path, recipe: str,
                                                                 message: str) -> None:
    (corpus / "recipe.yaml").write_text(recipe)
    with pytest.raises(CorpusError) as failure:
        publish_corpus(corpus, "org/tiny", dry_run=True)
    assert message in str(failure.value)
    completed = _corpus_cli("publish", str(corpus), "--repo", "org/tiny", "--dry-run", home=tmp_path / "home")
    assert completed.returncode in (1, 2) and "Traceback" not in completed.stderr
    assert message in completed.stderr


def test_the_card_summarises_token_statistics_and_never_lists_token_ids(corpus: Path) -> None:
    audit = json.loads((corpus / "audit.json").read_text())
    served = list(range(151_000, 151_400))
    audit["tokens"] = {
        "tokenizer": "/home/alice/tok", "max_seq_len": 4096, "token_mismatch": "warn", "conversations": 60,
        "tokens": 123_456, "p50": 1_800, "p90": 3_900, "p99": 4_090, "max": 4_096, "supervised_tokens": 80_000,
        "reasoning_tokens": 20_000, "reasoning_token_share": 0.25, "over_budget": 2,
        "by_source": {"math": {"conversations": 40, "tokens": 100_000, "p50": 2_000, "p90": 3_950, "p99": 4_090,
                               "max": 4_096, "reasoning_token_share": 0.3}},
        "by_split": {"train": {"conversations": 48, "tokens": 99_000}},
        "mismatches": {"count": 300, "checked_turns": 900,
                       "turns": [{"id": f"row-{i}", "served": served, "rendered": served[::-1]} for i in range(300)]},
    }
    (corpus / "audit.json").write_text(json.dumps(audit))
    card = publish_corpus(corpus, "org/tiny", dry_run=True).card
    section = card[card.index("## Token statistics"):card.index("## Target model")]
    assert "| tokens per conversation (p50 / p90 / p99 / max) | 1,800 / 3,900 / 4,090 / 4,096 |" in section
    assert "| generated turns whose re-render differs from the served token ids | 300 of 900 |" in section
    assert "| conversations over max_seq_len 4,096 | 2 |" in section and "| reasoning share of supervised" in section
    assert "| math | 40 | 100,000 | 2,000 / 3,950 / 4,090 / 4,096 | 30.0% |" in section
    assert "151000" not in card and "151,000" not in card and "row-1" not in card
    assert len(section) < 2_000


@pytest.mark.parametrize(("endpoint", "telemetry_off"), [(DEFAULT_ENDPOINT, False), ("http://127.0.0.1:9/", True)])
def test_an_endpoint_other_than_the_hub_turns_the_clients_telemetry_off(
        endpoint: str, telemetry_off: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", False)
    assert hub_endpoint(endpoint, "testing") == endpoint.rstrip("/")
    assert constants.HF_HUB_DISABLE_TELEMETRY is telemetry_off


def test_fetching_a_tokenizer_from_another_endpoint_downloads_with_telemetry_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", False)
    (tmp_path / "tokenizer.json").write_text("{}")
    seen: dict[str, Any] = {}

    def snapshot_download(repo_id: str, **options: Any) -> str:
        seen.update(options, telemetry_off=constants.HF_HUB_DISABLE_TELEMETRY)
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert fetch_tokenizer("Org/Model", "main", endpoint="http://127.0.0.1:9/") == tmp_path
    assert seen["endpoint"] == "http://127.0.0.1:9" and seen["telemetry_off"] is True


def test_publish_refuses_while_a_build_writes_the_directory_and_says_so(corpus: Path, hub: HubServer,
                                                                         tmp_path: Path) -> None:
    manifest = (corpus / "manifest.json").read_bytes()
    with build_writing(corpus) as holder:
        expected = f"a build is writing {corpus} now (pid {holder.pid}); wait for it to finish"
        for rebuilding in (False, True):
            if rebuilding:  # the build's commit step: the old corpus no longer looks complete
                (corpus / "manifest.json").unlink()
            dry = _corpus_cli("publish", str(corpus), "--repo", "org/tiny", "--endpoint", hub.url, "--dry-run",
                              home=tmp_path / "home")
            assert dry.returncode == 2 and expected in dry.stderr, dry.stderr
            assert "re-run the build" not in dry.stderr and "Traceback" not in dry.stderr
            with pytest.raises(CorpusError) as caught:
                _publish(corpus, hub)
            assert expected in str(caught.value) and not isinstance(caught.value, GateFailed)
        assert hub.requests == []
    (corpus / "manifest.json").write_bytes(manifest)
    assert _publish(corpus, hub, dry_run=True).files  # the build finished: nothing in the way


def test_a_build_that_starts_while_the_gate_reads_is_named_not_the_corpus(corpus: Path, hub: HubServer,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    publishing = sys.modules["corpus_builder.publish.commit"]
    real_gate = publishing.require_gate
    holders: list[subprocess.Popen[str]] = []
    with ExitStack() as later:
        def gate_while_a_build_starts(corpus_dir: Path) -> Any:
            holders.append(later.enter_context(build_writing(corpus)))
            (corpus / "audit.json").write_text('{"conversations": 0}')  # half rewritten: the gate fails
            return real_gate(corpus_dir)

        monkeypatch.setattr(publishing, "require_gate", gate_while_a_build_starts)
        with pytest.raises(CorpusError) as caught:
            _publish(corpus, hub, dry_run=True)
        assert f"a build is writing {corpus} now (pid {holders[0].pid})" in str(caught.value)
        assert not isinstance(caught.value, GateFailed)


def test_a_corpus_with_an_eval_pack_passes_the_gate_and_a_pack_path_outside_eval_is_named(
        packed_corpus: Path, tmp_path: Path) -> None:
    """The pack's shards are checked like the corpus's: where they are (eval/<name>.parquet), then their bytes."""
    corpus = Path(shutil.copytree(packed_corpus, tmp_path / "corpus"))
    pack = json.loads((corpus / "manifest.json").read_text())["eval"]["files"]
    assert pack and check_corpus(corpus).failures == []
    moved = "data/pack-00000-of-00001.parquet"
    (corpus / pack[0]["path"]).rename(corpus / moved)

    def move(manifest: dict[str, Any]) -> None:
        manifest["eval"]["files"][0]["path"] = moved

    edit_json(corpus, "manifest.json", move)
    failures = check_corpus(corpus).failures
    assert any(f"{moved!r}: manifest path is not eval/<name>.parquet" in line for line in failures), failures


HUB_RULES = ("is not a dataset repository id the Hub takes: ORG/NAME, each of ASCII letters, digits, '-', '_' and "
             "'.', at most 96 characters, neither starting nor ending with '-' or '.', with no '--' or '..', the "
             "name not ending in '.git'")


@pytest.mark.parametrize("repo", ["org/my dataset", "org/café", "org/" + "x" * 97, "o" * 97 + "/name", "org/a--b",
                                  "org/a..b", "org/name.git", "org/-name", "org/name.", "org/名前", "org/na\tme"])
def test_a_repository_id_the_hub_refuses_is_refused_before_anything(corpus: Path, hub: HubServer, tmp_path: Path,
                                                                    repo: str) -> None:
    """`--dry-run` accepted ids the Hub's create call refuses (spaces, non-ASCII, 200 characters): they are held to
    the Hub's rules (huggingface_hub's validate_repo_id), before the gate reads a file, with or without --dry-run."""
    for dry_run in (["--dry-run"], []):
        completed = _corpus_cli("publish", str(corpus), "--repo", repo, "--endpoint", hub.url, *dry_run,
                                home=tmp_path / "home")
        assert completed.returncode == 2
        assert completed.stderr == f"error: --repo {repo!r} {HUB_RULES}\n"
    with pytest.raises(CorpusError) as caught:
        publish_corpus(tmp_path / "no-corpus-here", repo, endpoint=hub.url, token=TOKEN, dry_run=True)
    assert str(caught.value) == f"--repo {repo!r} {HUB_RULES}"  # the id first: no corpus was looked at
    assert hub.requests == []


@pytest.mark.parametrize("repo", ["name", "a/b/c", "/name", "org/"])
def test_a_repository_id_without_one_org_and_one_name_is_refused(corpus: Path, hub: HubServer, repo: str) -> None:
    with pytest.raises(CorpusError) as caught:
        _publish(corpus, hub, repo)
    assert str(caught.value) == f"--repo must be ORG/NAME (a dataset repository of a user or an organisation), " \
                                f"got {repo!r}"


@pytest.mark.parametrize("repo", ["o/" + "n" * 96, "O" * 96 + "/Name_1.v2-x", "org/tiny.v1"])
def test_the_longest_and_oddest_ids_the_hub_takes_are_taken(corpus: Path, hub: HubServer, repo: str) -> None:
    assert _publish(corpus, hub, repo, dry_run=True).repo_id == repo
