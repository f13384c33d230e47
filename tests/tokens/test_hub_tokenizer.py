"""target.tokenizer may be a Hub model id (by default target.model): only the tokenizer and template files are
fetched, into huggingface_hub's cache, from a loopback Hub; offline, the cache answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from corpus_builder.hub import TOKENIZER_FILES
from corpus_builder.testing.hub_server import HubServer
from tests.support.real_data import write_chitchat

REPO = Path(__file__).resolve().parents[2]


def build(recipe: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corpus_builder", "build", str(recipe)], capture_output=True,
                          text=True, env={**os.environ, **env})


def test_the_tokenizer_comes_from_the_hub_when_the_recipe_names_a_model(tmp_path: Path, tiny_model_dir: Path) -> None:
    files = {name: (tiny_model_dir / name).read_bytes() for name in TOKENIZER_FILES if (tiny_model_dir / name).exists()}
    files["model.safetensors"] = b"weights are never fetched"
    write_chitchat(tmp_path / "chat.jsonl", 20)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("""\
name: hub-tokenizer
target: {model: acme/tiny-target, revision: main}
sources:
  - {name: chat, kind: replay, path: chat.jsonl}
checks: {max_seq_len: 4096}
output: {dir: out}
""", encoding="utf-8")
    assert subprocess.run([sys.executable, "-m", "corpus_builder", "validate", str(recipe)],
                          capture_output=True).returncode == 0  # validating needs no network
    env = {"HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    with HubServer() as hub:
        hub.add_repo("acme/tiny-target", files)
        env["HF_ENDPOINT"] = hub.url
        completed = build(recipe, env)
        assert completed.returncode == 0, completed.stderr[-2000:]
        fetched = [r.path for r in hub.requests if "/resolve/" in r.path]
    assert fetched and not any("model.safetensors" in path for path in fetched)  # only tokenizer files
    audit = json.loads((tmp_path / "out" / "audit.json").read_text())
    assert audit["tokens"]["conversations"] == audit["conversations"] > 0
    assert str(tmp_path / "hf-home") in audit["tokens"]["tokenizer"]
    # The Hub gone and offline mode on: the cache serves the same tokenizer.
    offline = build(recipe, {**env, "HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 0, offline.stderr[-2000:]
    # Nowhere to fetch it from and nothing cached: a clear error, exit 2.
    missing = build(recipe, {**env, "HF_HOME": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1"})
    assert missing.returncode == 2 and "cannot fetch the tokenizer of acme/tiny-target" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_the_shipped_thinking_v2_recipe_needs_no_local_tokenizer() -> None:
    completed = subprocess.run([sys.executable, "-m", "corpus_builder", "validate",
                                str(REPO / "recipes" / "thinking_v2.yaml")], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
