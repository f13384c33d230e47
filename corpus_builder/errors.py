"""Errors a user can fix (exit code 2) and row-level problems (skipped, counted, reported)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TypedDict

# The userinfo of a URL (``user:password@`` or ``token@`` right after ``scheme://``). It lives in this,
# the lowest leaf, because every error message is scrubbed of it and nothing here may import secrets.py
# (which finds the same credentials, and every other kind, in corpus text).
URL_USERINFO_RE = re.compile(r"(?<=://)[^\s/?#@]+@")
SCRUBBED_USERINFO = "***@"


def scrub_url_credentials(text: str) -> str:
    """``text`` with the userinfo of every URL replaced by ``***@`` (ftp://user:pass@host -> ftp://***@host)."""
    return URL_USERINFO_RE.sub(SCRUBBED_USERINFO, text) if "://" in text else text


class CorpusError(Exception):
    """A problem the user can fix: bad recipe, unreadable file, missing dependency.

    The CLI prints ``str(error)`` without a traceback and exits with code 2. The message names the
    file, the line (when known) and the problem; the credentials of any URL in it are scrubbed here, and
    the CLI removes every other kind of secret before printing.
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
        return scrub_url_credentials(text)


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
    "line_too_long": "a decompressed line longer than any row (skipped without being held in memory)",
    "not_an_object": "row is not a JSON object",
    "missing_messages": "row has no conversation field",
    "bad_messages": "conversation field is not a non-empty list of turn objects",
    "unknown_role": "a turn has a role that is not system/user/assistant/tool (or a known alias)",
    "null_content": "a turn has null content",
    "non_string_content": "a turn's content is not a string",
    "empty_content": "a turn's content is empty",
    "wrong_role_order": "roles do not follow [system] user assistant user assistant ... (an assistant turn's tool "
                        "calls answered by tool turns right after it)",
    "bad_tools": "the row's tools are not a list of function schemas",
    "bad_tool_call": "a tool call has no function name, or arguments that are neither a string nor an object",
    "duplicate_tool_call_id": "two calls of one assistant turn have the same id, so their results cannot be told "
                              "apart",
    "unanswered_tool_call": "a tool call has no result, yet the conversation goes on after it (only a row's last "
                            "turn may call without results: it was logged before they came back)",
    "no_assistant_turn": "a replayed conversation has no assistant turn",
    "no_answer": "a logged request has no answer (the response is missing, holds no choices, or is an error)",
    "folded_prefix": "a logged request whose turns a later request of the same conversation repeats: folded into it "
                     "(the detail names it), so a chat logged once per request is one conversation",
    "duplicate": "the same conversation (normalised text) already kept: the detail names the row it duplicates",
    "near_duplicate": "a near duplicate (MinHash/LSH, checks.near_duplicates) of a kept row the detail names",
    "contaminated": "shares a run of words with an evaluation set (decontamination): the detail names the sets",
    "eval_pack_copy": "a copy or a near copy of a conversation held out in the eval pack (the detail names it): "
                      "training on it would leak the pack",
    "over_length": "longer than the recipe's max_seq_len in target tokens",
    "unclosed_think": "reasoning block opened but never closed",
    "truncated_generation": "the target stopped at max_tokens (finish_reason: length)",
    "generation_error": "the server refused the request (a 4xx refusal: it would fail the same way again)",
    "unfinished": "the request ran out of retries on transient faults (timeouts, resets, 429, 5xx); rerun to resume",
    "not_in_journal": "a journal-only rebuild found no cached generation for this row",
    "tool_choice_undefined": "the source's tool_choice names a function the row's tools do not define (the server "
                             "refuses such a request)",
    "tool_result_unknown": "the target's first turn called a tool differently from the recorded call, so no "
                           "result is known for it (sources[].tool_results: match); later cuts keep the row, flagged",
}


# The flags a kept row can carry (its ``flags`` column): facts about the row, counted in the audit; the checks decide
# what to do with them. The constants that set them live where they are set (records.py, screen/checks.py, audit/).
REPAIR_FLAG = "repaired:RULE:POLICY"
FLAGS: dict[str, str] = {
    "unclosed_think": "a reasoning block opened but never closed (dropped unless checks.on_unclosed_think: keep)",
    "truncated_generation": "the answer stopped at max_tokens (finish_reason: length), kept as "
                            "target.generation.on_length: keep asks",
    "truncated_to_budget": "cut to checks.max_seq_len target tokens (checks.on_over_length: truncate)",
    "tool_result_unknown": "a regenerated tool call that matches no recorded call: the conversation was cut before "
                           "it (sources[].tool_results: match)",
    "invalid_tool_call": "a tool call whose arguments are not a JSON object, or a generated call that names no tool "
                         "of the row or does not fit the tool's schema",
    "invalid_tool_schema": "a tool of the row whose parameters are not a valid JSON Schema",
    "repeated_source_id": "(raw-file audits) the row repeats an earlier row's own id",
    REPAIR_FLAG: "the sources[].repair rule RULE changed the row with POLICY (e.g. repaired:leading_assistant:drop)",
}


@dataclass(frozen=True, slots=True)
class Skipped:
    """A row that did not make it, with where it came from. Goes to the ledger and the audit."""

    source: str
    reason: str
    location: str  # "file:line" or "file#row"
    detail: str = ""
    id: str | None = None


CONTAMINATED = "contaminated"
_EVAL_SETS = "eval sets: "


def contamination_detail(names: tuple[str, ...] | list[str]) -> str:
    """A ``contaminated`` row's detail: the evaluation sets it matches (read back by ``contaminated_sets``)."""
    return _EVAL_SETS + ", ".join(names)


def contaminated_sets(detail: str) -> list[str]:
    return detail.removeprefix(_EVAL_SETS).split(", ") if detail.startswith(_EVAL_SETS) else []


class DropReport(TypedDict):
    skipped: dict[str, int]
    skipped_by_source: dict[str, dict[str, int]]
    contaminated_by_eval_set: dict[str, int]


@dataclass
class DropCounts:
    """Rows skipped or dropped: by reason, by source and reason, and contaminated rows by evaluation set."""

    by_reason: Counter[str] = field(default_factory=Counter)
    by_source: dict[str, Counter[str]] = field(default_factory=dict)
    by_eval_set: Counter[str] = field(default_factory=Counter)

    def add(self, source: str, reason: str, detail: str = "") -> None:
        self.by_reason[reason] += 1
        self.by_source.setdefault(source, Counter())[reason] += 1
        if reason == CONTAMINATED:
            self.by_eval_set.update(contaminated_sets(detail))

    def update(self, other: DropCounts) -> None:
        self.by_reason.update(other.by_reason)
        for source, counts in other.by_source.items():
            self.by_source.setdefault(source, Counter()).update(counts)
        self.by_eval_set.update(other.by_eval_set)

    def report(self) -> DropReport:
        """The audit's fields: ``skipped`` (by reason), ``skipped_by_source``, ``contaminated_by_eval_set``."""
        return {"skipped": dict(sorted(self.by_reason.items())),
                "skipped_by_source": {source: dict(sorted(counts.items()))
                                      for source, counts in sorted(self.by_source.items())},
                "contaminated_by_eval_set": dict(sorted(self.by_eval_set.items()))}

    @classmethod
    def from_report(cls, report: dict[str, Any]) -> DropCounts:
        """The counts an audit recorded (a published corpus has no ledger)."""
        return cls(Counter(report.get("skipped") or {}),
                   {source: Counter(counts) for source, counts in (report.get("skipped_by_source") or {}).items()},
                   Counter(report.get("contaminated_by_eval_set") or {}))
