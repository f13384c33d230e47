"""The eval pack's cut: conversations held out of the replay sources before anything else decides on them.

Each replay source with a share (``Recipe.pack_shares``) gives ``PackShare.held(rows it gives)`` rows,
apportioned over its strata (task, thinking) in proportion to their rows by largest remainders, so the pack
has the source's mix; within a stratum the rows held are those first in a seeded draw on their id
(``draws.pack_priority``). The cut needs every row's stratum before it can choose, and the checks that follow
it need the pack's rows before the first training row, so the replay sources are read three times: to count
and draw (8 bytes a row: each row's draw), to write the pack and index it, and then by the build itself,
which ``PackCut.holds`` keeps the pack's rows out of. The pack is cut from the rows as the sources give them
(read, repaired, taken), before the checks, dedup, the mixture and the split: it is the traffic as served.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TextIO

import numpy as np
import pyarrow.parquet as pq

from ..draws import pack_priority
from ..layout import EVAL, ShardInfo
from ..progress import ProgressLine
from ..recipe.model import Checks, PackShare, Recipe
from ..records import Conversation
from ..rows import batch_to_conversations
from ..screen.pack import PackScreen
from ..sources import replay_stream
from ..sources.parallel import Part
from ..stats.pack import Stratum, stratum
from .mixture import apportion
from .shards import ShardWriter

_INDEX_BATCH = 1024


@dataclass(frozen=True)
class PackCut:
    """Which conversations the pack holds: per stratum, the highest draw held (none held: absent)."""

    seed: int
    cutoffs: dict[Stratum, int]
    strata: dict[Stratum, tuple[int, int]]  # rows the sources give, rows held

    def holds(self, conversation: Conversation) -> bool:
        priority = pack_priority(self.seed, conversation.id)
        if priority > self.last_held:  # most rows: held by no stratum, whichever is theirs (not worked out)
            return False
        cutoff = self.cutoffs.get(stratum(conversation))
        return cutoff is not None and priority <= cutoff

    @cached_property
    def last_held(self) -> int:
        """The highest draw any stratum holds (-1: none)."""
        return max(self.cutoffs.values(), default=-1)


@dataclass(frozen=True)
class EvalPack:
    """The pack a build holds out: its cut, its index (for the checks) and its written shards."""

    cut: PackCut
    screen: PackScreen
    files: list[ShardInfo]
    shares: dict[str, PackShare]

    def describe(self) -> dict[str, object]:
        """The manifest's eval section: the pack's files and how it was cut, source by source and stratum."""
        sources: dict[str, _SourceCut] = {}
        for (source, task, thinking), (rows, held) in sorted(self.cut.strata.items(), key=_stratum_order):
            share = self.shares[source]
            entry = sources.setdefault(source, _SourceCut(share.rows, share.fraction))
            entry.read += rows
            entry.held += held
            entry.strata.append({"task": task, "thinking": thinking, "read": rows, "held": held})
        return {"seed": self.cut.seed, "conversations": sum(info.rows for info in self.files),
                "files": [info.to_dict() for info in self.files],
                "sources": {name: entry.to_dict() for name, entry in sources.items()}}


@dataclass
class _SourceCut:
    """How one source's rows were cut: its share, the rows it gave and held, stratum by stratum."""

    rows: int | None
    fraction: float | None
    read: int = 0
    held: int = 0
    strata: list[dict[str, object]] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {"rows": self.rows, "fraction": self.fraction, "read": self.read, "held": self.held,
                "strata": self.strata}


def _stratum_order(item: tuple[Stratum, object]) -> tuple[str, str, bool]:
    (source, task, thinking), _ = item
    return source, task or "", thinking


@dataclass(frozen=True)
class PackStage:
    """The eval pack's cut in a build's plan: each replay source's share, the seed of the draw, the checks whose
    near rule keeps the corpus apart from the pack."""

    shares: dict[str, PackShare]
    seed: int
    checks: Checks

    @classmethod
    def of(cls, recipe: Recipe) -> PackStage | None:
        """The recipe's pack (None: it holds none out)."""
        shares = recipe.pack_shares()
        if not shares:
            return None
        return cls(shares, recipe.eval.seed if recipe.eval is not None else 0, recipe.checks)


def cut_eval_pack(stage: PackStage, parts: Callable[[int], list[Part]], rows_per_shard: int, staging: Path,
                  stream: TextIO) -> EvalPack:
    """Cut the eval pack from the replay sources' ``parts`` (``ReadStage.parts``) and write it into ``staging``'s
    eval/, ``rows_per_shard`` a shard."""
    shares = stage.shares
    cut = plan_cut(shares, stage.seed, _source_rows(parts, shares, "eval pack: draw", stream))
    screen = PackScreen(stage.checks, cut.holds)
    writer = ShardWriter(staging, rows_per_shard, directory=EVAL)
    held: list[Conversation] = []
    # rows written per stratum: copies of one conversation share its draw, so a stratum can hold more than its quota
    written = dict.fromkeys(cut.strata, 0)
    try:
        for row in _source_rows(parts, shares, "eval pack: write", stream):
            if cut.holds(row):
                row.split = EVAL
                writer.write(row)
                written[stratum(row)] += 1
                held.append(row)
                if len(held) >= _INDEX_BATCH:
                    screen.add(held)
                    held = []
        screen.add(held)
    except BaseException:
        writer.abort()
        raise
    strata = {stratum: (rows, written[stratum]) for stratum, (rows, _) in cut.strata.items()}
    files = writer.close()
    if not files:  # a share that rounds to no row: the manifest says so, and no empty eval/ is left
        writer.data_dir.rmdir()
    return EvalPack(PackCut(cut.seed, cut.cutoffs, strata), screen, files, shares)


def read_pack_screen(checks: Checks, cut: PackCut, files: Sequence[Path]) -> PackScreen:
    """The pack's screen indexed again from its written shards, in the order they were written: what a process
    that did not cut the pack checks rows against (a Ray task: an index holds memory maps, it cannot travel)."""
    screen = PackScreen(checks, cut.holds)
    for path in files:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=_INDEX_BATCH):
            screen.add(batch_to_conversations(batch))
    return screen


def plan_cut(shares: dict[str, PackShare], seed: int, rows: Iterator[Conversation]) -> PackCut:
    """The cut of ``rows`` (the replay sources' conversations) that gives each source its share, drawn with
    ``seed``."""
    draws: dict[Stratum, array[int]] = {}
    for row in rows:
        key = stratum(row)
        drawn = draws.get(key)
        if drawn is None:
            drawn = draws[key] = array("Q")
        drawn.append(pack_priority(seed, row.id))
    cutoffs: dict[Stratum, int] = {}
    strata: dict[Stratum, tuple[int, int]] = {}
    for source, share in shares.items():
        sizes = {key: len(drawn) for key, drawn in sorted(draws.items(), key=_stratum_order) if key[0] == source}
        for key, quota in apportion(share.held(sum(sizes.values())), sizes).items():
            strata[key] = (sizes[key], quota)
            if quota:
                ordered = np.frombuffer(draws[key], dtype=np.uint64)
                cutoffs[key] = int(np.partition(ordered, quota - 1)[quota - 1])
    return PackCut(seed, cutoffs, strata)


def _source_rows(parts: Callable[[int], list[Part]], shares: dict[str, PackShare], phase: str, stream: TextIO
                 ) -> Iterator[Conversation]:
    """The conversations of the replay sources the pack is cut from, as the build reads them."""
    progress = ProgressLine(phase, stream=stream)
    for measured in replay_stream(parts, _unmeasured):
        progress.advance(len(measured.items))
        yield from (item for item in measured.items if isinstance(item, Conversation) and item.source in shares)
    progress.finish()


def _unmeasured(batch: list[Conversation]) -> None:
    """The cut needs no measurement of the rows."""
