"""The collector's pace while rows stream: raised for replay and generation, restored after."""

from __future__ import annotations

import gc

from corpus_builder.collector import STREAM_GC_THRESHOLD, rare_collections
from corpus_builder.generate import generate
from corpus_builder.testing.fault_server import FaultServer
from tests.support.generate_run import make_prompts, make_recipe


def test_overlapping_streams_restore_the_thresholds_when_the_last_ends():
    original = gc.get_threshold()
    first, second = rare_collections(), rare_collections()
    first.__enter__()
    try:
        second.__enter__()
    finally:
        first.__exit__(None, None, None)  # generators may end in any order
    try:
        assert gc.get_threshold()[0] == STREAM_GC_THRESHOLD
    finally:
        second.__exit__(None, None, None)
    assert gc.get_threshold() == original


def test_generation_runs_with_rare_collections_and_restores_them(tmp_path):
    original = gc.get_threshold()
    seen = []
    with FaultServer(model="fault-model") as server:
        rows = generate(make_prompts(3), make_recipe("fault-model"), tmp_path, endpoints=[server.base_url])
        for _ in rows:
            seen.append(gc.get_threshold()[0])
    assert seen == [STREAM_GC_THRESHOLD] * 3
    assert gc.get_threshold() == original
