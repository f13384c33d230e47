"""The row checks are one registry (screen/row_checks.py): the screen applies what is registered, in its order, and
the skip reasons reference lists each check from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest

from corpus_builder.errors import REASONS, Skipped
from corpus_builder.recipe import Checks
from corpus_builder.records import FLAG_TRUNCATED, FLAG_UNCLOSED_THINK, Conversation, Message
from corpus_builder.reference.skip_reasons import render_skip_reasons
from corpus_builder.screen import checks as screen_checks
from corpus_builder.screen.checks import Checker
from corpus_builder.screen.row_checks import (
    ROW_CHECKS,
    CheckSetup,
    Judging,
    OneRowCheck,
    RowCheck,
    TruncatedGeneration,
    UnclosedThink,
)


def row(index: int, *flags: str, system: bool = False) -> Conversation:
    messages = [Message("system", "Be brief.")] if system else []
    messages += [Message("user", f"question {index}"), Message("assistant", f"answer {index}")]
    return Conversation(f"row-{index}", "chat", "replay", messages, flags=list(flags))


def screen(checker: Checker, rows: list[Conversation]) -> list[Conversation | Skipped]:
    return checker.screened(rows, checker.measure(rows)).records


def test_every_registered_check_drops_with_a_reason_of_the_vocabulary_and_the_reference_lists_it() -> None:
    page = render_skip_reasons()
    for check in ROW_CHECKS:
        assert check.reason in REASONS, check
        assert f"| `{check.__name__}` |" in page and f"| `{check.reason}` |" in page
        assert check.measures in page and check.decides in page


@dataclass(frozen=True)
class NoSystemTurn(OneRowCheck):
    reason: ClassVar[str] = "no_system_turn"
    measures: ClassVar[str] = "whether the row opens with a system turn"
    decides: ClassVar[str] = "drop a row without one"

    @classmethod
    def of(cls, setup: CheckSetup) -> NoSystemTurn:
        return cls()

    def judge_row(self, judging: Judging, index: int) -> None:
        if judging.rows[index].messages[0].role != "system":
            judging.drop(index, self.reason, "no system turn")


def test_a_check_registered_is_applied_by_the_screen_in_its_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registering the check is all it takes; it judges only the rows the checks before it kept."""
    monkeypatch.setattr(screen_checks, "ROW_CHECKS", (*ROW_CHECKS, NoSystemTurn))
    rows = [row(0, system=True), row(1), row(2, FLAG_UNCLOSED_THINK), row(3, FLAG_UNCLOSED_THINK, system=True)]
    judged = screen(Checker(Checks(), None), rows)
    assert [(r.reason, r.detail) if isinstance(r, Skipped) else r.id for r in judged] == [
        "row-0", ("no_system_turn", "no system turn"), ("unclosed_think", ""), ("unclosed_think", "")]


def test_a_check_the_settings_switch_off_is_not_applied() -> None:
    rows = [row(0, FLAG_UNCLOSED_THINK), row(1, FLAG_TRUNCATED)]
    default: list[RowCheck] = Checker(Checks(), None).row_checks
    assert [type(check) for check in default] == [UnclosedThink, TruncatedGeneration]
    assert [r.reason for r in screen(Checker(Checks(), None), rows) if isinstance(r, Skipped)] == [
        "unclosed_think", "truncated_generation"]
    lenient = Checker(Checks(on_unclosed_think="keep"), None, keep_truncated=True)
    assert lenient.row_checks == []
    assert screen(lenient, rows) == rows
