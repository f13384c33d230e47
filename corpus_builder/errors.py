"""Errors a user can fix (exit code 2) and row-level problems (skipped, counted, reported)."""

from __future__ import annotations

from dataclasses import dataclass


class CorpusError(Exception):
    """A problem the user can fix: bad recipe, unreadable file, missing dependency.

    The CLI prints ``str(error)`` without a traceback and exits with code 2. The message names the
    file, the line (when known) and the problem; it never contains secrets.
    """

    def __init__(self, problem: str, *, file: str | None = None, line: int | None = None,
                 details: list[str] | None = None) -> None:
        self.problem = problem
        self.file = file
        self.line = line
        self.details = details or []
        super().__init__(self.render())

    def render(self) -> str:
        where = ""
        if self.file is not None:
            where = f"{self.file}:{self.line}: " if self.line is not None else f"{self.file}: "
        text = f"{where}{self.problem}"
        if self.details:
            text += "\n" + "\n".join(f"  - {d}" for d in self.details)
        return text


class MissingDependency(CorpusError):
    """An optional extra is needed for this step."""

    def __init__(self, module: str, extra: str, purpose: str) -> None:
        super().__init__(f"{purpose} needs the '{module}' package: pip install 'corpus-builder[{extra}]'")


class BadRow(Exception):
    """A data row that is skipped and counted; ``reason`` is a short stable key (see REASONS)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


# The stable vocabulary of skip/drop reasons, shared by readers, checks, the ledger and the audit.
REASONS: dict[str, str] = {
    "invalid_json": "line is not valid JSON",
    "invalid_utf8": "line is not valid UTF-8",
    "not_an_object": "row is not a JSON object",
    "missing_messages": "row has no conversation field",
    "bad_messages": "conversation field is not a non-empty list of turn objects",
    "unknown_role": "a turn has a role that is not system/user/assistant",
    "null_content": "a turn has null content",
    "non_string_content": "a turn's content is not a string",
    "empty_content": "a turn's content is empty",
    "wrong_role_order": "roles do not follow [system] user assistant user assistant ...",
    "no_assistant_turn": "a replayed conversation has no assistant turn",
    "duplicate": "same conversation already kept (dedup)",
    "over_length": "longer than the recipe's max_seq_len in target tokens",
    "unclosed_think": "reasoning block opened but never closed",
    "truncated_generation": "the target stopped at max_tokens (finish_reason: length)",
    "generation_error": "the server refused the request permanently",
    "not_in_journal": "a journal-only rebuild found no cached generation for this row",
}


@dataclass(frozen=True, slots=True)
class Skipped:
    """A row that did not make it, with where it came from. Goes to the ledger and the audit."""

    source: str
    reason: str
    location: str  # "file:line" or "file#row"
    detail: str = ""
    id: str | None = None
