"""`corpus audit CORPUS --against TRAFFIC --engine ray`: the traffic side of the comparison on a Ray cluster.

Imported only when an audit asks for the Ray engine (``import corpus_builder`` and the local engine never import
Ray). The traffic's units (``inputs.traffic_units``: its files, a recipe's sources, a Hub split) are cut into the
parts the local engine reads one after the other (``inputs.read_parts``); each part is read by a task of a Ray
Data ``map_batches`` with the local engine's own ``profile.read_part`` (the readers' rules, repairs and skips, the
fold of logged requests, the facts, the token measures of the sampled rows), and the driver merges the parts'
profiles (``Profile.merge``). Every figure is a sum over rows, so the comparison, its text and its page are the
local audit's.

A part is a whole file, never a byte range of one: a row's place in the token sample is its place among the rows
its file gives (counted after the readers' repairs and the fold), which a task reading from the middle of the file
cannot know, and the readers fix a file's layout by its first row. Logged requests fold into one conversation per
chat, and a chat may go on in the next day's log: the files of a source whose fold follows chats across them are
one part, read whole and in order by one task, when one of them holds logged requests (``read_parts``); so a
source of serving logs is read by one task, however many files it has. The token sample's share is decided on the
driver, from the first chunk of the traffic, as the local engine decides it, and every task samples by it.

A part that meets a problem the user can fix (a file without rows, a corrupt stream, a .json document that is not
JSON) returns it; the driver raises the first in reading order, the one the local engine stops at. The traffic and
the tokenizer must be on storage every node sees (one machine, or a shared filesystem).
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from functools import partial

import numpy as np
import pyarrow as pa
import ray.data

from ..build.ray_data import connect
from ..errors import CorpusError
from .inputs import Unit, read_parts, traffic_units
from .profile import Profile, TokenSample, read_part
from .token_pass import TokenMeter


def read_traffic_on_ray(traffic: str, meter: TokenMeter | None, *, token_sample: int, seed: int = 0,
                        address: str | None = None) -> Profile:
    """The traffic's profile (``profile.read_profile``'s), its parts read on the cluster at ``address`` (None:
    RAY_ADDRESS, else a cluster on this machine)."""
    parts = read_parts(traffic_units(traffic))
    sample = _decided_sample(traffic, meter, token_sample, seed)
    profile = Profile.empty(traffic, meter)
    if not parts:
        return profile
    connect(address)
    results = ray.data.from_items([{"part": index} for index in range(len(parts))],
                                  override_num_blocks=len(parts)).map_batches(
        partial(_read_parts, label=traffic, parts=parts, meter=meter, sample=sample), batch_size=1,
        batch_format="numpy").take_all()
    for result in sorted(results, key=lambda result: result["part"]):
        if result["problem"] is not None:
            raise CorpusError(result["problem"])
        profile.merge(pickle.loads(result["profile"]))
    return profile


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
    """Each part's profile, pickled, or the problem that stopped its reading."""
    numbers = batch["part"].tolist()
    problems: list[str | None] = []
    profiles: list[bytes] = []
    for number in numbers:
        try:
            profile = read_part(label, parts[number], meter, sample)
        except CorpusError as error:
            problems.append(str(error))
            profiles.append(b"")
        else:
            problems.append(None)
            profiles.append(pickle.dumps(profile, protocol=pickle.HIGHEST_PROTOCOL))
    return pa.table({"part": pa.array(numbers, pa.int64()), "problem": pa.array(problems, pa.string()),
                     "profile": pa.array(profiles, pa.binary())})
