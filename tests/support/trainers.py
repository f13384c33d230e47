"""The trainers' own environments, each a virtual environment of its own (their pins clash with ours): the tests
run their code on our files. Missing, a test that needs one is skipped; in CI it fails, as a missing dependency
of any test does."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from corpus_builder.testing.eagle3_head import REPO, SPECULATORS_PYTHON

SPECFORGE_PYTHON = Path(os.environ.get("SPECFORGE_PYTHON") or REPO / ".venv-specforge" / "bin" / "python")


def trainer_python(python: Path, setup_script: str) -> Path:
    """``python`` when that trainer's environment is there, else skip (or fail in CI)."""
    if not python.exists():
        missing = f"{python} is not there: run scripts/{setup_script}"
        if os.environ.get("CI"):
            pytest.fail(missing, pytrace=False)
        pytest.skip(missing)
    return python


def speculators_python() -> Path:
    return trainer_python(SPECULATORS_PYTHON, "speculators_env.sh")


def specforge_python() -> Path:
    return trainer_python(SPECFORGE_PYTHON, "specforge_env.sh")


def speculators_prepare_data(model_dir: Path, data: str, out: Path, render_endpoint: str | None = None, *,
                             seq_length: int, env: dict[str, str | None]) -> list[dict[str, Any]]:
    """Run `speculators prepare-data --data DATA` (a local file, or an hf:// path with ``env`` pointing
    huggingface_hub at a Hub; a None in ``env`` unsets that variable) and read its rows back with its own
    datasets: nothing dropped or truncated."""
    python = speculators_python()
    command = [str(python.parent / "speculators"), "prepare-data", "--model", str(model_dir), "--data", data,
               "--output", str(out), "--seq-length", str(seq_length), "--num-preprocessing-workers", "1"]
    if render_endpoint:
        command += ["--render-endpoint", render_endpoint]
    merged = {**os.environ, "TOKENIZERS_PARALLELISM": "false", **env}
    environment = {name: value for name, value in merged.items() if value is not None}
    completed = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600)
    log = completed.stdout + completed.stderr
    assert completed.returncode == 0, log[:3000] + "\n...\n" + log[-1500:]
    for warning in ("Dropped", "Failed to process", "produced no training rows", "truncated"):
        assert warning not in log, log[-4000:]
    dump = out.with_suffix(".rows.jsonl")
    script = ("import json, sys\nfrom datasets import load_from_disk\n"
              "ds = load_from_disk(sys.argv[1]).with_format(None)\n"
              "open(sys.argv[2], 'w').write(''.join(json.dumps({'input_ids': r['input_ids'], "
              "'loss_mask': r['loss_mask']}) + '\\n' for r in ds))\n")
    subprocess.run([str(python), "-c", script, str(out), str(dump)], check=True, env=environment, timeout=300)
    return [orjson.loads(line) for line in dump.read_bytes().splitlines()]
