"""`corpus audit CORPUS --against TRAFFIC --engine ray`: the traffic side of the comparison on a Ray cluster.

Imported only when an audit asks for the Ray engine (``import corpus_builder`` and the local engine never import
Ray). The traffic's units (``inputs.traffic_units``: its files, a recipe's sources, a Hub split) are cut into the
parts the local engine reads one after the other (``inputs.read_parts``); each part is read by a task of a Ray
Data ``map_batches`` with the local engine's own ``profile.read_part`` (the readers' rules, repairs and skips, the
fold of logged requests, the facts, the token measures of the sampled rows), and the driver merges the parts'
profiles (``Profile.merge``). Every figure is a sum over rows, so the comparison, its text and its page are the
local audit's.

A part is a whole file, or a range of a large plain .jsonl file: the file's chunks as a reading of the whole file
cuts them (``inputs._range_units``), so each chunk has the same rows in the same order, and the ranges after the
first start with the layout the file's first rows fix, as the readers fix it for the whole file. The token sample is
keyed by a row's place among its file's rows (counted after the readers' repairs and the fold), which a range does
not know: when the sample is not every row, the ranges are first read without the token pass to count their rows
(the ranges are read twice), and each is then read with its first row's place. The share itself is decided on the
driver, from the first chunk of the traffic, as the local engine decides it. Logged requests fold into one
conversation per chat, and a chat may go on anywhere in its file or in the next day's log: a file of logged requests
is never cut, and the files of a source whose fold follows chats across them are one part, read whole and in order
by one task, when one of them holds logged requests (``read_parts``). So a source of serving logs is read by one
task, however many files it has; .jsonl.zst, .json and parquet files are read whole too.

A part that meets a problem the user can fix (a file without rows, a corrupt stream, a .json document that is not
JSON) returns it; the driver raises the first in reading order, the one the local engine stops at. The traffic and
the tokenizer must be on storage every node sees (one machine, or a shared filesystem).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import partial

import numpy as np
import pyarrow as pa
import ray
import ray.data

from ..errors import CorpusError
from ..ray_cluster import PARTS_PER_CPU, connect
from .inputs import Unit, read_parts, traffic_units
from .profile import Profile, TokenSample, read_part
from .token_pass import TokenMeter


def read_traffic_on_ray(traffic: str, meter: TokenMeter | None, *, token_sample: int, seed: int = 0,
                        address: str | None = None) -> Profile:
    """The traffic's profile (``profile.read_profile``'s), its parts read on the cluster at ``address`` (None:
    RAY_ADDRESS, else a cluster on this machine)."""
    units = traffic_units(traffic)
    sample = _decided_sample(traffic, meter, token_sample, seed)
    connect(address)
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))  # type: ignore[no-untyped-call]
    parts = read_parts(units, cut=PARTS_PER_CPU * cpus)
    if meter is not None and sample.share != 1 and any(part[0].first_row is None for part in parts):
        parts = _placed(parts, _read_on_ray(traffic, parts, _ranges(parts), None, sample))
    profile = Profile.empty(traffic, meter)
    for read in _read_on_ray(traffic, parts, list(range(len(parts))), meter, sample).values():
        if isinstance(read, str):
            raise CorpusError(read)
        profile.merge(read)
    return profile


def _ranges(parts: list[list[Unit]]) -> list[int]:
    """The parts that are ranges of a file cut in several: a range after its file's first, and the one before."""
    follows = [part[0].first_row is None for part in parts]
    return [index for index in range(len(parts)) if follows[index] or (index + 1 < len(parts) and follows[index + 1])]


def _placed(parts: list[list[Unit]], counted: dict[int, Profile | str]) -> list[list[Unit]]:
    """The parts with each range after its file's first placed: its first row's place is the rows that the ranges
    before it gave (``counted``: the ranges, read without the token pass). A range that met a problem is placed
    anywhere: read again, it meets the problem again."""
    placed: list[list[Unit]] = []
    following = 0
    for index, part in enumerate(parts):
        unit = part[0]
        if unit.first_row is None:
            unit = replace(unit, first_row=following)
            part = [unit]
        read = counted.get(index)
        if read is not None:
            following = (unit.first_row or 0) + (read.rows_read if isinstance(read, Profile) else 0)
        placed.append(part)
    return placed


def _read_on_ray(label: str, parts: list[list[Unit]], numbers: list[int], meter: TokenMeter | None,
                 sample: TokenSample) -> dict[int, Profile | str]:
    """The parts ``numbers`` read, a task each, in order: each its profile, or the problem its reading met."""
    results = ray.data.from_items([{"part": number} for number in numbers],
                                  override_num_blocks=max(1, len(numbers))).map_batches(
        partial(_read_parts, label=label, parts=parts, meter=meter, sample=sample), batch_size=1,
        batch_format="numpy")
    read: dict[int, Profile | str] = {}
    for table in ray.get(results.to_arrow_refs()):
        for index in range(len(table)):
            row = table.slice(index, 1)
            problem = row.column("problem")[0].as_py()
            read[row.column("part")[0].as_py()] = problem if problem is not None else Profile.from_arrow(row)
    return dict(sorted(read.items()))


def _decided_sample(traffic: str, meter: TokenMeter | None, token_sample: int, seed: int) -> TokenSample:
    """The token sample of the traffic, its share decided by the first chunk read, as the local engine decides it;
    the chunk is read from units of its own (reading a file's first chunk moves its source's fold)."""
    units = traffic_units(traffic)
    sample = TokenSample.of(units, token_sample, seed)
    if meter is None or sample.share is not None:
        return sample
    for unit in units:
        first = next(unit.chunks(), None)  # the rest is never read (the dropped generator closes its file)
        if first is not None:
            sample.decide(first.rows, first.bytes)
            break
    return sample


def _read_parts(batch: dict[str, np.ndarray], *, label: str, parts: Sequence[Sequence[Unit]],
                meter: TokenMeter | None, sample: TokenSample) -> pa.Table:
    """Each part's profile (``Profile.to_arrow``), or the problem that stopped its reading (and an empty profile)."""
    tables = []
    for number in batch["part"].tolist():
        problem = None
        try:
            profile = read_part(label, parts[number], meter, sample)
        except CorpusError as error:
            problem, profile = str(error), Profile.empty(label, meter)
        tables.append(profile.to_arrow().append_column("part", pa.array([number], pa.int64())).append_column(
            "problem", pa.array([problem], pa.string())))
    return pa.concat_tables(tables)
