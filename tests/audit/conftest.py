"""The audit tests' corpora (built once per session on the tiny model's tokenizer) and traffic of a known mix."""

from __future__ import annotations

from pathlib import Path

import pytest

from .fixtures import build_mixed_corpus, build_traffic_corpus, known_traffic, write_jsonl


@pytest.fixture(scope="session")
def corpus(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_traffic_corpus(tmp_path_factory.mktemp("traffic-corpus"), tiny_model_dir)


@pytest.fixture(scope="session")
def mixed_corpus(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_mixed_corpus(tmp_path_factory.mktemp("mixed-corpus"), tiny_model_dir)


@pytest.fixture
def traffic(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "traffic.jsonl", known_traffic())
