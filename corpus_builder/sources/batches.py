"""A file's rows normalised batch after batch, as the readers take them, for a reader that gets them in raw batches
(``sources.raw``) and judges most rows from columns (``corpus audit --against``).

One ``RowNormaliser`` per file fixes the layout (by the first row it recognises, as the readers fix it per file);
the caller hands it the rows it must judge one by one, by index, and gets their conversations (with the mode each
was served in), the rows skipped by reason and, for logged requests, the requests folded into a later one of their
chat (``sources.fold``, shared by a source's files as the build's fold is: a chat may go on in the next day's log).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..errors import BadRow, CorpusError, Skipped
from ..recipe.model import Fold, Mapping
from ..records import Conversation, Provenance, RepairRules
from .fold import Held, PrefixFold, let_out
from .logs import read_exchange
from .mappings import Layout, NormalisedRow, RowNormaliser, row_object
from .raw import RowsAt


class SharedFold:
    """The fold of one source's logged requests, shared by its files, and closed with the last of them."""

    def __init__(self, fold: Fold, files: int) -> None:
        self.fold: PrefixFold[int] | None = PrefixFold(fold.max_open) if fold.enabled else None
        self.files_left = files


@dataclass
class Normalised:
    """What rows gave: their conversations, each with the mode its row says it was served in; the rows skipped, by
    reason; the logged requests folded into a later request of their chat; the logged requests by model."""

    made: list[tuple[bool | None, Conversation]] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    folded: int = 0
    models: Counter[str] = field(default_factory=Counter)


class BatchNormaliser:
    """One file's rows as the source readers take them, batch after batch; its conversations are named
    ``source`` and ``ROW/PART`` (the row's index in its batch, the part a repair split)."""

    def __init__(self, label: str, source: str, mapping: Mapping, repair: RepairRules, *, required: bool = True,
                 fold: SharedFold | None = None, layout: Layout | None = None) -> None:
        self.label = label
        self.source = source
        self.normaliser = RowNormaliser(mapping, "replay", repair=repair)
        self.normaliser.layout = layout  # a range after its file's first: the layout the file's first rows fixed
        self.required = required  # a file without any row is an error, as for the readers
        self.seen = False
        self.fold = fold if fold is not None else SharedFold(Fold(), 1)

    @property
    def layout(self) -> Layout | None:
        """The file's layout, once a row fixed it."""
        return self.normaliser.layout

    def normalise(self, indices: list[int], rows_at: RowsAt, into: Normalised) -> None:
        """The rows at ``indices`` (``rows_at`` gives them as the readers decode them), normalised ``into``."""
        fold = self.fold.fold
        for index, row in zip(indices, rows_at(indices) if indices else [], strict=True):
            if fold is not None and self._logged(row):
                try:
                    exchange = read_exchange(row_object(row))
                except BadRow as bad:
                    into.skipped[bad.reason] += 1
                    continue
                into.models[exchange.model() or ""] += 1
                for held, was_folded in fold.add(exchange, index):
                    into.folded += was_folded
                    if not was_folded:
                        self._let_out(held, into)
                continue
            conversations = self.conversations(index, row)
            if isinstance(conversations, Skipped):
                into.skipped[conversations.reason] += 1
            else:
                into.made.extend((served_mode(row, conversation), conversation) for conversation in conversations)

    def conversations(self, index: int, row: object) -> list[Conversation] | Skipped:
        """The row's conversations as the readers make them (several when a repair splits it), or why it has none."""
        try:
            if isinstance(row, BadRow):
                raise row
            parts = self.normaliser(row)
        except BadRow as bad:
            return Skipped(self.source, bad.reason, f"row {index}", bad.detail)
        fields = row_object(row)  # the normaliser took it: an object
        return [self._conversation(f"{index}/{number}", fields, part) for number, part in enumerate(parts)]

    def finish(self) -> Normalised | None:
        """After the file's last batch: the error of a file without rows, and when it is its source's last file,
        the conversations still open in the fold (None: none)."""
        if self.required and not self.seen:
            raise CorpusError("file has no rows", file=self.label)
        self.fold.files_left -= 1
        fold = self.fold.fold
        if self.fold.files_left or fold is None:
            return None
        closed = Normalised()
        for held in fold.close():
            self._let_out(held, closed)
        return closed if closed.made or closed.skipped else None

    def _logged(self, row: object) -> bool:
        """Whether a row is a logged request, for the fold (a row the layout cannot be told of is not)."""
        try:
            return self.normaliser.layout_of(row).style == "log"
        except BadRow:
            return False

    def _let_out(self, held: Held[int], into: Normalised) -> None:
        """A chat's last request, let out by the fold: its conversations, with what the folded requests left."""
        try:
            parts = let_out(self.normaliser, held)
        except BadRow as bad:
            into.skipped[bad.reason] += 1
            return
        for number, part in enumerate(parts):
            conversation = self._conversation(f"{held.tag}/{number}", held.exchange.row, part)
            into.made.append((served_mode(held.exchange.row, conversation), conversation))

    def _conversation(self, row_id: str, row: dict[str, object], part: NormalisedRow) -> Conversation:
        task = row.get("task")
        return Conversation(id=row_id, source=self.source, origin="replay", messages=part.messages,
                            task=task if isinstance(task, str) else None, flags=part.flags, tools=part.tools,
                            provenance=Provenance(served=part.served))


def served_mode(row: object, conversation: Conversation) -> bool | None:
    """The mode a request says it was served in: a logged request's (``sources.logs``), else
    ``chat_template_kwargs.enable_thinking``, else a top-level ``enable_thinking``."""
    served = conversation.provenance.served
    if served is not None:
        return served.enable_thinking
    fields = row_object(row)  # the normaliser made a conversation of it: an object
    kwargs = fields.get("chat_template_kwargs")
    for value in (kwargs.get("enable_thinking") if isinstance(kwargs, dict) else None, fields.get("enable_thinking")):
        if isinstance(value, bool):
            return value
    return None
