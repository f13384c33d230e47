"""The eval pack's own mix beside the corpus's: per source and per task, the pack's rows, their share of the
pack against the corpus's share, and the thinking share of each. The build computes it from the rows it held
out (audit.json), `corpus audit` again from the pack's shards."""

from __future__ import annotations

from collections.abc import Mapping

from ..records import Conversation
from .corpus import AuditReport, PackEntry, PackMix
from .facts import thinking_mode_of

Stratum = tuple[str, str | None, bool]  # source, task, thinking mode (``facts.thinking_mode``)
NO_TASK = "(no task)"


def stratum(conversation: Conversation) -> Stratum:
    """What the eval pack is stratified by: the row's source, task and thinking mode, the facts' (the mode it was
    served in where it records it: a logged request's, a generated row's; else whether it carries reasoning)."""
    return conversation.source, conversation.task, thinking_mode_of(conversation)


def pack_mix(held: Mapping[Stratum, int], corpus: AuditReport) -> PackMix:
    """The ``eval_pack`` section of an audit: ``held`` counts the pack's rows by stratum."""
    pack_rows = sum(held.values())
    corpus_rows = corpus["conversations"]
    corpus_by_source = {name: (source["conversations"], source["thinking_conversations"], source["task"])
                        for name, source in corpus["by_source"].items()}
    corpus_by_task: dict[str, tuple[int, int]] = {}
    for rows, thinking, task in corpus_by_source.values():
        before = corpus_by_task.get(task or NO_TASK, (0, 0))
        corpus_by_task[task or NO_TASK] = (before[0] + rows, before[1] + thinking)

    def groups(key_of: int) -> dict[str, tuple[int, int]]:
        counted: dict[str, tuple[int, int]] = {}
        for stratum, rows in held.items():
            key = str(stratum[key_of] or NO_TASK)
            before = counted.get(key, (0, 0))
            counted[key] = (before[0] + rows, before[1] + (rows if stratum[2] else 0))
        return counted

    def side_by_side(counted: dict[str, tuple[int, int]], corpus_side: dict[str, tuple[int, int]]
                     ) -> dict[str, PackEntry]:
        names = sorted({*counted, *corpus_side})
        return {name: _entry(*counted.get(name, (0, 0)), pack_rows, *corpus_side.get(name, (0, 0)), corpus_rows)
                for name in names}

    return {
        "conversations": pack_rows,
        "thinking_conversations": sum(rows for (_, _, thinking), rows in held.items() if thinking),
        "thinking_share": _ratio(sum(rows for (_, _, thinking), rows in held.items() if thinking), pack_rows),
        "by_source": side_by_side(groups(0), {name: (rows, thinking)
                                              for name, (rows, thinking, _) in corpus_by_source.items()}),
        "by_task": side_by_side(groups(1), corpus_by_task),
    }


def _entry(rows: int, thinking: int, pack_rows: int, corpus_rows_of: int, corpus_thinking: int, corpus_rows: int
           ) -> PackEntry:
    return {"conversations": rows, "share": _ratio(rows, pack_rows), "corpus_conversations": corpus_rows_of,
            "corpus_share": _ratio(corpus_rows_of, corpus_rows), "thinking_share": _ratio(thinking, rows),
            "corpus_thinking_share": _ratio(corpus_thinking, corpus_rows_of)}


def _ratio(part: int, whole: int) -> float:
    return round(part / whole, 6) if whole else 0.0
