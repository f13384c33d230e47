"""`corpus audit --against` serving traffic as it is captured: logged requests of multi-turn chats count once per
chat (the readers' fold), the folded requests are reported apart from the skipped ones, the served mode is the
traffic's thinking, traffic served by another model is refused, and traffic that cannot be read gives no advice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corpus_builder.audit import AuditOptions, audit_against
from corpus_builder.audit.traffic import format_comparison
from corpus_builder.sources import iter_file
from tests.audit.test_traffic_promises import corpus_cli
from tests.support.serving_logs import logged_conversation

from .fixtures import dialogue_row, write_jsonl

SHAPES = ("nested", "litellm_spend_logs", "langfuse_export", "flat_choices")


def logged_traffic(*, shape: str = "nested", model: str = "tiny/target", others: int = 0) -> list[dict[str, Any]]:
    """20 chats of 1 to 4 turns, half served thinking on, logged per request and interleaved turn by turn; then
    ``others`` requests served by another model."""
    chats = [logged_conversation(shape, dialogue_row(700 + i, turns=1 + i % 4, thinking=i % 2 == 0),
                                 thinking=i % 2 == 0, model=model) for i in range(20)]
    rows = [chat[turn] for turn in range(4) for chat in chats if turn < len(chat)]
    rows += [logged_conversation(shape, dialogue_row(800 + i, turns=1, thinking=False), model="other/model")[0]
             for i in range(others)]
    return rows


def test_a_chat_logged_per_request_counts_once(corpus: Path, tmp_path: Path) -> None:
    for shape in SHAPES:
        path = write_jsonl(tmp_path / f"{shape}.jsonl", logged_traffic(shape=shape))
        report = audit_against(corpus, str(path))
        traffic = report["traffic"]
        assert traffic["conversations"] == 20, shape
        assert traffic["folded_prefix"] == sum(1 + i % 4 for i in range(20)) - 20
        assert report["readable"]["skipped"] == 0 and not report["readable"]["partial"]  # folded is not skipped
        # the turns as the chats had them: 5 of each length, not one row per request
        assert traffic["counts"]["turns"] == {"1": 5, "2": 5, "3": 5, "4-5": 5}
        # the readers give the same conversations
        assert sum(1 for item in iter_file(path) if hasattr(item, "messages")) == 20
    text = format_comparison(report)
    assert f"{report['traffic']['folded_prefix']:,} logged requests folded" in text


def test_the_served_mode_is_the_traffics_thinking(corpus: Path, tmp_path: Path) -> None:
    report = audit_against(corpus, str(write_jsonl(tmp_path / "t.jsonl", logged_traffic())))
    assert report["traffic"]["served"] == {"on": 10, "off": 10}
    assert report["traffic"]["thinking_share"] == 0.5
    # Langfuse records no template flag: the traffic's mode is then whether the answers carry reasoning (it keeps none)
    unrecorded = audit_against(corpus, str(write_jsonl(tmp_path / "l.jsonl", logged_traffic(shape="langfuse_export"))))
    assert unrecorded["traffic"]["served"] == {"unrecorded": 20}


def test_traffic_served_by_another_model_is_refused_unless_allowed(corpus: Path, tmp_path: Path) -> None:
    mixed = write_jsonl(tmp_path / "mixed.jsonl", logged_traffic(others=3))
    refused = corpus_cli("audit", corpus, "--against", mixed)
    assert refused.returncode == 2
    assert "other/model (3 requests)" in refused.stderr and "tiny/target" in refused.stderr
    allowed = audit_against(corpus, str(mixed), AuditOptions(allow_other_models=True))
    assert allowed["traffic"]["conversations"] == 23
    assert corpus_cli("audit", corpus, "--against", mixed, "--allow-other-models").returncode == 0
    # the target's own name under another path (its model directory) is the same model
    moved = write_jsonl(tmp_path / "moved.jsonl", logged_traffic(model="/models/tiny/target"))
    assert audit_against(corpus, str(moved))["traffic"]["conversations"] == 20


def test_logs_with_no_readable_row_give_no_advice(corpus: Path, tmp_path: Path) -> None:
    rows = [{"request": {"model": "tiny/target", "messages": [{"role": "user", "content": "q"}]}, "response": None,
             "error": "503"} for _ in range(5)]
    result = corpus_cli("audit", corpus, "--against", write_jsonl(tmp_path / "errors.jsonl", rows))
    assert result.returncode == 2
    assert "no readable traffic rows" in result.stderr and "no_answer 5" in result.stderr
    assert "suggest" not in result.stdout + result.stderr


def test_a_chat_split_across_daily_logs_folds_across_them(corpus: Path, tmp_path: Path) -> None:
    rows = logged_traffic()
    write_jsonl(tmp_path / "day1.jsonl", rows[:25])
    write_jsonl(tmp_path / "day2.jsonl", rows[25:])
    report = audit_against(corpus, str(tmp_path / "day*.jsonl"))
    assert report["traffic"]["conversations"] == 20
