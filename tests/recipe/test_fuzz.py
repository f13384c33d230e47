"""Trial 4, recipes: a recipe broken at any byte or any key, YAML bombs, foreign tags, deep nesting, huge
scalars, NUL bytes and invalid UTF-8. Every case ends in problems (each located in the file, exit 2 from
`corpus validate`) or a valid recipe; nothing else escapes (no other exception, no hang, no memory blow-up).
See tests/support/fuzz.py for the long variant.
"""

from __future__ import annotations

import math
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from corpus_builder.errors import CorpusError
from corpus_builder.recipe import check_recipe, load_recipe
from tests.recipe.test_recipe import FULL_RECIPE, make_workspace
from tests.support.fuzz import Outcomes, fuzz_settings

OUTCOMES = Outcomes("trial 4, recipes")
FULL_DOCUMENT: dict[str, Any] = yaml.safe_load(FULL_RECIPE)


def _key_paths(value: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    if path:
        yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _key_paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _key_paths(item, (*path, index))


KEY_PATHS = list(_key_paths(FULL_DOCUMENT))
ODD_VALUES: list[Any] = [None, True, -1, 2 ** 70, math.inf, "", "x" * 10_000, [], {}, [[[["deep"]]]],
                         {"nested": {"mapping": 1}}, "\u202e\u0000".replace("\u0000", "\\0"), "hf_" + "Q" * 34]
SCALARS = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40)
           | st.sampled_from(["\x85", "\ufeff", "\u2028", "~", "null", "0x1F", "1e999", "2024-01-01", "yes", "on"]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
# Fragments that break YAML in the ways files break: syntax, aliases, tags, control and non-UTF-8 bytes.
FRAGMENTS = [b"&a ", b"*a", b"!!python/object/apply:os.system [true]", b"!!binary", b"!custom", b"{", b"}",
             b"[", b"]", b": ", b"- ", b"\t", b"\0", b"\xff", b"\xc3", b"\xef\xbb\xbf", b"---\n", b"...\n",
             b"? ", b"|\n", b">-\n", b"%YAML 1.2\n", b"'", b'"', b"\\", b"#", b"\r", b"\n  ", b"<<: *a\n"]


@pytest.fixture(scope="module", autouse=True)
def print_outcomes() -> Iterator[None]:
    yield
    print("\n" + OUTCOMES.report())


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files FULL_RECIPE names, so that a recipe left intact is valid."""
    return make_workspace(tmp_path_factory.mktemp("fuzz"))


def _check(path: Path, prop: str) -> None:
    """The outcome every bad recipe must have: problems, each naming the file, or a valid recipe; and
    load_recipe agrees, raising nothing but CorpusError."""
    recipe, problems = check_recipe(path)
    if recipe is None:
        assert problems and all(str(problem).startswith(str(path)) for problem in problems)
        with pytest.raises(CorpusError):
            load_recipe(path)
        OUTCOMES.record(prop, "problems reported")
    else:
        assert problems == []
        OUTCOMES.record(prop, "valid recipe")


def _set(document: Any, path: tuple[str | int, ...], value: Any, delete: bool) -> None:
    *parents, last = path
    for part in parents:
        document = document[part]
    if delete:
        del document[last]
    else:
        document[last] = value


EDITS = st.lists(st.tuples(st.floats(0, 1), st.integers(0, 40), st.sampled_from(FRAGMENTS) | st.binary(max_size=6)),
                 min_size=1, max_size=4)  # (where, bytes removed, bytes inserted)


@fuzz_settings(80)
@given(edits=EDITS)
def test_a_recipe_broken_at_any_byte_is_reported_not_crashed(workspace: Path,
                                                             edits: list[tuple[float, int, bytes]]) -> None:
    text = bytearray(FULL_RECIPE.encode())
    for where, removed, inserted in edits:  # cut `removed` bytes at `where`, put `inserted` there
        at = int(where * len(text))
        text[at:at + removed] = inserted
    path = workspace / "bytes.yaml"
    path.write_bytes(bytes(text))
    _check(path, "bytes edited")


@fuzz_settings(80)
@given(key=st.sampled_from(KEY_PATHS), value=VALUES, delete=st.booleans())
def test_any_key_set_to_any_value_is_reported_not_crashed(workspace: Path, key: tuple[str | int, ...], value: Any,
                                                          delete: bool) -> None:
    document = yaml.safe_load(FULL_RECIPE)
    _set(document, key, value, delete)
    path = workspace / "values.yaml"
    path.write_text(yaml.safe_dump(document, allow_unicode=True), encoding="utf-8")
    _check(path, "a key's value replaced or removed")


@pytest.mark.parametrize("key", KEY_PATHS, ids=lambda key: ".".join(map(str, key)))
def test_every_key_with_every_odd_value(workspace: Path, key: tuple[str | int, ...]) -> None:
    for value in ODD_VALUES:
        document = yaml.safe_load(FULL_RECIPE)
        _set(document, key, value, delete=False)
        path = workspace / "every-key.yaml"
        path.write_text(yaml.safe_dump(document, allow_unicode=True), encoding="utf-8")
        _check(path, "every key, odd values")


def _billion_laughs(levels: int = 9) -> str:
    lines = ['lol0: &lol0 "lol"']
    for level in range(1, levels + 1):
        lines.append(f"lol{level}: &lol{level} [" + ", ".join([f"*lol{level - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


BAD_RECIPES: dict[str, tuple[bytes, str]] = {
    "billion laughs": (_billion_laughs().encode(), "alias *lol0 is not allowed"),
    "merge key bomb": (b"base: &b {x: 1}\n" + b"".join(b"k%d: {<<: *b}\n" % i for i in range(2000)),
                       "alias *b is not allowed"),
    "python object tag": (b"name: !!python/object/apply:os.system ['touch pwned']\n", "is not allowed"),
    "python name tag": (FULL_RECIPE.replace("name: thinking-mix.v1", "name: !!python/name:os.system").encode(),
                        "tag !!python/name:os.system is not allowed"),
    # libyaml stops flow nesting at 1,000 levels itself; our reader stops any nesting at 32.
    "deep nesting": (b"name: " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "nest"),
    "deep block nesting": (b"".join(b"  " * depth + b"k:\n" for depth in range(500)) + b"  " * 500 + b"k: 1\n",
                           "nested more than 32 levels deep"),
    "huge file": (b"name: x\ndescription: " + b"a" * (2 << 20) + b"\n", "a recipe is at most"),
    "huge scalar under the limit": (FULL_RECIPE.replace("Replay plus", "Replay " + "plus " * 180_000).encode(), ""),
    "NUL byte": (FULL_RECIPE.replace("m: tiny", "m: ti\0ny").replace("model:", "mo\0del:").encode(),
                 "control characters are not allowed"),
    "invalid UTF-8": (FULL_RECIPE.encode().replace(b"Replay plus", b"Replay \xc3\x28 plus"), "not valid UTF-8"),
    "many keys": (b"name: x\n" + b"".join(b"k%d: %d\n" % (i, i) for i in range(5_000)), "unknown key 'k0'"),
    "truncated": (FULL_RECIPE.encode()[: len(FULL_RECIPE) // 2] + b"  - {name: [", "YAML syntax error"),
}


@pytest.mark.parametrize("case", sorted(BAD_RECIPES))
def test_yaml_bombs_tags_and_monsters_are_refused_fast_in_bounded_memory(workspace: Path, case: str) -> None:
    content, fragment = BAD_RECIPES[case]
    path = workspace / f"{case.replace(' ', '-')}.yaml"
    path.write_bytes(content)
    tracemalloc.start()
    try:
        recipe, problems = check_recipe(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * len(content) + (32 << 20), f"peak {peak / 2 ** 20:.0f} MiB for {len(content):,} bytes"
    if fragment:
        assert recipe is None and any(fragment in str(problem) for problem in problems), problems[:3]
    assert not (workspace / "pwned").exists()
    OUTCOMES.record("bombs, tags and monsters", "problems reported" if problems else "valid recipe")


@pytest.mark.parametrize("case", ["billion laughs", "python object tag", "deep nesting", "NUL byte",
                                  "invalid UTF-8", "truncated"])
def test_corpus_validate_exits_2_with_a_message_and_no_traceback(workspace: Path, case: str) -> None:
    content, fragment = BAD_RECIPES[case]
    path = workspace / "cli.yaml"
    path.write_bytes(content)
    completed = subprocess.run([sys.executable, "-m", "corpus_builder", "validate", str(path)],
                               capture_output=True, text=True, timeout=60)
    assert completed.returncode == 2 and "Traceback" not in completed.stderr
    assert fragment in completed.stderr and "problem(s)" in completed.stderr
