"""The ids rows are written under: the compact set of ``UniqueIds`` gives what a set of the ids themselves gives."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from corpus_builder.screen import near_dedup
from corpus_builder.screen.ids import UniqueIds
from corpus_builder.screen.near_dedup import FirstSeen
from tests.support.fuzz import fuzz_settings


def unique_ids(row_ids: list[str]) -> list[str]:
    """The rule itself, one id at a time against the ids given: the k-th copy of an id gets its first free suffix."""
    given: set[str] = set()
    assigned = []
    for row_id in row_ids:
        new_id, copy = row_id, 0
        while new_id in given:
            copy += 1
            new_id = f"{row_id}-{copy}"
        given.add(new_id)
        assigned.append(new_id)
    return assigned


# few distinct ids, some of them another's suffixed copy: copies, and suffixes that collide with own ids
IDS = st.lists(st.sampled_from(["a", "a-1", "a-2", "a-1-1", "b", "b-1", "c"]), max_size=40)


@fuzz_settings(200)
@given(row_ids=IDS, cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=6))
def test_the_ids_do_not_depend_on_the_batches(row_ids: list[str], cuts: list[int]) -> None:
    ids = UniqueIds()
    bounds = [0, *sorted(min(cut, len(row_ids)) for cut in cuts), len(row_ids)]
    assigned = [new_id for start, end in pairwise(bounds)
                for new_id in ids.assign_all(row_ids[start:end])]
    assert assigned == unique_ids(row_ids)


def test_a_suffixed_copy_skips_an_id_given_in_the_same_batch_and_before() -> None:
    ids = UniqueIds()
    assert ids.assign_all(["x", "x-1"]) == ["x", "x-1"]
    assert ids.assign_all(["x", "x-2", "x", "x-2"]) == ["x-2", "x-2-1", "x-3", "x-2-2"]


def test_ids_beyond_one_run_are_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(near_dedup, "RUN_ENTRIES", 8)  # many capped runs
    ids = UniqueIds()
    for start in range(0, 200, 10):
        assert ids.assign_all([f"r{row}" for row in range(start, start + 10)]) == [
            f"r{row}" for row in range(start, start + 10)]
    assert ids.assign_all(["r0", "r199", "r200"]) == ["r0-1", "r199-1", "r200"]


def test_a_set_of_hashes_finds_what_it_holds() -> None:
    held = FirstSeen(whole_hashes=True, rows=False)
    held.add_absent(np.array([5, 1 << 63, 3], dtype=np.uint64))
    held.add_absent(np.array([7], dtype=np.uint64))
    assert held.find(np.array([3, 4, 1 << 63, 7], dtype=np.uint64)).tolist() == [0, -1, 0, 0]
    assert held.nbytes == 4 * 8


@pytest.mark.parametrize("batch", [1, 7, 40])
def test_copies_beyond_the_suffixes_looked_up_at_once(batch: int) -> None:
    """Copies of an id past the first SUFFIX_LOOKAHEAD suffixes, known from earlier batches and within one, some
    suffixes taken by rows' own ids: the rule's ids."""
    row_ids = ["z", "z-9", "z-12", *["z"] * 30, "z-9", "y", *["y"] * 11]
    ids = UniqueIds()
    assigned = [new_id for start in range(0, len(row_ids), batch)
                for new_id in ids.assign_all(row_ids[start:start + batch])]
    assert assigned == unique_ids(row_ids)
