"""The rules a replay judges each window by, one at a time: what makes counters impossible (a server fault), what
makes a window shared (other traffic), when a page and a response's own counts agree, which endpoints serve one
target, and what is sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from corpus_builder.errors import CorpusError
from corpus_builder.eval.metrics import Counters
from corpus_builder.eval.replay import (
    EvalSettings,
    Server,
    _agree,
    _check_same_target,
    _impossible,
    _shared,
    replay_pack,
)
from corpus_builder.generate.types import TargetIdentity

from .runs import pack_of

# 4 drafts of 3 tokens, 7 accepted: 4 at position 0, 2 at position 1, 1 at position 2; 1 request of 11 tokens
GOOD = Counters(True, 4, 12, 7, (4, 2, 1), 1, 11, 0.5, 1)


def counters(**changed: object) -> Counters:
    fields = {"speculating": True, "drafts": 4.0, "draft_tokens": 12.0, "accepted": 7.0,
              "accepted_by_position": (4.0, 2.0, 1.0), "finished_requests": 1.0, "generation_tokens": 11.0,
              "tpot_sum": 0.5, "tpot_count": 1.0}
    return Counters(**{**fields, **changed})  # type: ignore[arg-type]


def test_counters_a_speculating_server_counts_are_possible() -> None:
    assert _impossible(GOOD, 3) is None and _impossible(GOOD, None) is None
    assert _impossible(counters(accepted=12, accepted_by_position=(4, 4, 4)), 3) is None  # every token accepted
    assert _impossible(counters(drafts=0, draft_tokens=0, accepted=0, accepted_by_position=()), 3) is None
    assert _impossible(counters(accepted_by_position=()), 3) is None  # a page without the positions' counter
    assert _impossible(counters(tpot_sum=0.25), 3) is None  # seconds need not be whole
    assert _impossible(counters(draft_tokens=9), 3) is None  # an n-gram draft may propose fewer tokens


@pytest.mark.parametrize(("changed", "length", "problem"), [
    ({"drafts": -1.0}, 3, "counters went down (drafts): the server restarted, or its page is wrong"),
    ({"finished_requests": -1.0, "generation_tokens": -2.0}, 3,
     "counters went down (finished requests, generated tokens): the server restarted, or its page is wrong"),
    ({"tpot_sum": -0.5}, 3, "counters went down (time per output token): the server restarted, or its page is wrong"),
    ({"accepted_by_position": (4.0, -1.0, 1.0)}, 3,
     "counters went down (accepted at position 1): the server restarted, or its page is wrong"),
    ({"draft_tokens": -12.0, "accepted": -7.0, "tpot_count": -1.0}, 3,
     "counters went down (draft tokens, accepted tokens, requests timed): the server restarted, or its page is wrong"),
    ({"finished_requests": 0.5}, 3, "counts that are not whole numbers (finished requests)"),
    ({"drafts": 4.5, "draft_tokens": 12.5, "accepted": 7.5, "generation_tokens": 11.5, "tpot_count": 1.5}, None,
     "counts that are not whole numbers (drafts, draft tokens, accepted tokens, generated tokens, requests timed)"),
    ({"accepted_by_position": (4.0, 2.5, 0.5)}, 3,
     "counts that are not whole numbers (accepted at position 1, accepted at position 2)"),
    ({"accepted": 13.0, "accepted_by_position": (4.0, 4.0, 5.0)}, 3, "13 tokens accepted of 12 drafted"),
    ({"draft_tokens": 13.0}, 3, "13 tokens drafted in 4 drafts of at most 3 tokens"),
    ({"draft_tokens": 13.0, "accepted": 13.0, "accepted_by_position": (5.0, 4.0, 4.0)}, None,
     "5 tokens accepted at position 0 of 4 drafts"),
    ({"accepted_by_position": (5.0, 1.0, 1.0)}, 3, "5 tokens accepted at position 0 of 4 drafts"),
    ({"accepted_by_position": (4.0, 1.0, 2.0)}, 3, "more tokens accepted at position 2 than at position 1 (2 > 1): a "
                                                    "position's sample is missing or wrong"),
    ({"accepted_by_position": (3.0, 4.0, 0.0)}, 3, "more tokens accepted at position 1 than at position 0 (4 > 3): a "
                                                    "position's sample is missing or wrong"),
    ({"accepted_by_position": (4.0, 0.0, 1.0)}, 3, "more tokens accepted at position 2 than at position 1 (1 > 0): a "
                                                    "position's sample is missing or wrong"),
    ({"accepted_by_position": (4.0, 2.0, 0.0)}, 3, "the tokens accepted by position sum to 6, not to the 7 accepted"),
    ({"accepted_by_position": (4.0, 2.0, 2.0)}, 3, "the tokens accepted by position sum to 8, not to the 7 accepted"),
    ({"accepted_by_position": (4.0, 2.0)}, 3, "the tokens accepted by position sum to 6, not to the 7 accepted"),
])
def test_counters_no_speculating_server_counts_are_named(changed: dict[str, object], length: int | None,
                                                         problem: str) -> None:
    assert _impossible(counters(**changed), length) == problem


def test_a_window_is_shared_when_it_holds_more_than_the_evals_own_requests() -> None:
    assert _shared(GOOD, 1, 11, False) is None
    assert _shared(GOOD, 1, None, False) is None  # no usage: the tokens are not compared
    assert _shared(GOOD, 1, 11, True) == "a request was retried (its failed attempt may be in the counters)"
    assert _shared(GOOD, 2, 11, False) == "the server finished 1 requests while the eval sent 2"
    assert _shared(counters(finished_requests=3.0), 1, 11, True) == \
        "a request was retried (its failed attempt may be in the counters)"
    assert _shared(GOOD, 1, 12, False) == "the server generated 11 tokens while the eval received 12"
    assert _shared(counters(finished_requests=2.0), 1, 12, False) == \
        "the server finished 2 requests while the eval sent 1"


@pytest.mark.parametrize("field", ["drafts", "draft_tokens", "accepted"])
def test_a_page_and_the_own_counts_agree_on_every_drafting_count(field: str) -> None:
    assert _agree(GOOD, GOOD)
    assert _agree(GOOD, counters(finished_requests=2.0, generation_tokens=3.0, tpot_sum=9.0, tpot_count=4.0))
    assert not _agree(GOOD, counters(**{field: getattr(GOOD, field) + 1}))
    assert not _agree(counters(**{field: getattr(GOOD, field) + 1}), GOOD)


@pytest.mark.parametrize("positions", [(5.0, 2.0, 1.0), (4.0, 2.0, 0.0), (4.0, 2.0, 1.0, 1.0), (4.0, 2.0)])
def test_a_page_and_the_own_counts_agree_on_every_position(positions: tuple[float, ...]) -> None:
    assert not _agree(GOOD, counters(accepted_by_position=positions))


def server(label: str, served: str = "m", root: str = "/models/m", revision: str | None = None,
           engine: str = "0.32.0") -> Server:
    identity = TargetIdentity(served, root, None, "bfloat16", engine)
    return Server(label, f"http://{label}", None, served, identity, revision, {})  # type: ignore[arg-type]


def test_heads_are_compared_on_one_target_only() -> None:
    _check_same_target([server("A"), server("B")])
    _check_same_target([server("A", revision="r1"), server("B")])  # one tells its revision, the other does not
    for other in (server("B", served="n"), server("B", root="/models/n"), server("B", engine="0.33.0"),
                  server("B", revision="r2")):
        with pytest.raises(CorpusError) as refused:
            _check_same_target([server("A", revision="r1"), other])
        assert str(refused.value).startswith("the endpoints serve different targets: heads are compared on one "
                                             "target (the same model, revision, served name and engine version)")
        assert refused.value.details[1].startswith("B http://B: ")


def test_what_is_sent_never_a_seed_and_top_k_minus_one() -> None:
    assert EvalSettings().sampling() == {"max_tokens": 1024, "top_k": -1}
    assert EvalSettings(temperature=0.0, top_p=0.9, max_tokens=7).sampling() == {
        "max_tokens": 7, "top_k": -1, "temperature": 0.0, "top_p": 0.9}


def test_a_replay_needs_an_endpoint_and_known_modes() -> None:
    with pytest.raises(CorpusError) as refused:
        replay_pack(pack_of(), [], EvalSettings())
    assert str(refused.value) == ("no endpoint given: --endpoint URL (a vLLM server that serves the target with a "
                                  "speculator)")
    with pytest.raises(CorpusError) as refused:
        replay_pack(pack_of(), ["http://127.0.0.1:9"], EvalSettings(modes=("thinking", "fast", "slow")))
    assert str(refused.value) == "unknown mode(s) ['fast', 'slow'] (expected thinking, non-thinking)"


class Clock:
    """time as the replay reads it, one second a reading: each window of one request takes one second, each read of
    the counters one second; ``monotonic`` stands still unless told (the progress gate)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.still = 0.0

    def perf_counter(self) -> float:
        self.now += 1.0
        return self.now

    def monotonic(self) -> float:
        return self.still


def test_the_runs_seconds_and_progress_follow_the_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from corpus_builder.eval import evaluate, replay
    from corpus_builder.testing.fault_server import FaultServer

    from .conftest import chat_rows, write_jsonl

    clock = Clock()
    monkeypatch.setattr(replay, "time", clock)
    pack = write_jsonl(tmp_path / "p.jsonl", chat_rows(2))
    told: list[str] = []

    def progress(message: str) -> None:
        told.append(message)
        clock.still += 6.0  # each message: six seconds later

    with FaultServer(speculative_tokens=3, accepted_per_draft=2) as server:
        run = evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs",
                       progress=progress).run.to_json()
    assert [w["seconds"] for w in run["windows"]] == [1.0] * 4
    assert run["metrics_reads"] == {"count": 5, "seconds": 5.0}
    # a message at most every ten seconds, "done" always: 1/2 at 0 s is too soon, 2/2 at 0 s too, done (6 s),
    # then 1/2 at 6 s is too soon after it, 2/2 too; done (12 s)
    assert told == ["thinking: done", "non-thinking: done"]
    tokens = sum(w["output_tokens"] for w in run["windows"][:2])
    assert run["figures"][0]["output_tokens_per_s"] == tokens / 2.0
    with FaultServer(speculative_tokens=3, accepted_per_draft=2, per_request_metrics=True) as server:
        own = evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs",
                       progress=progress).run.to_json()
    assert [w["seconds"] for w in own["windows"]] == [1.0] * 4
    assert own["metrics_reads"] == {"count": 2, "seconds": 2.0}  # before the run, after its first window
    clock.still = 100.0
    told.clear()
    monkeypatch.setattr(replay, "PROGRESS_EVERY_S", 6.0)
    with FaultServer(speculative_tokens=3, accepted_per_draft=2) as server:
        evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs", concurrency=2, progress=progress)
    # A's thinking phase ends at 100 s, no later than the last message (the start): not told; done always; A's
    # non-thinking phase ends six seconds after the last message: told
    assert told == ["thinking: done", "non-thinking: A done", "non-thinking: done"]


def test_every_prompt_is_told_when_the_gate_is_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from corpus_builder.eval import evaluate, replay
    from corpus_builder.testing.fault_server import FaultServer

    from .conftest import chat_rows, write_jsonl

    monkeypatch.setattr(replay, "PROGRESS_EVERY_S", 0.0)
    told: list[str] = []
    with FaultServer(speculative_tokens=3, accepted_per_draft=2) as server:
        evaluate(write_jsonl(tmp_path / "p.jsonl", chat_rows(2)), [server.base_url], temperature=0,
                 modes=["non-thinking"], save_dir=tmp_path / "runs", progress=told.append)
    assert told == ["non-thinking: 1/2 prompts", "non-thinking: 2/2 prompts", "non-thinking: done"]
