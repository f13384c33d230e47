"""Counters no speculating server counts are a fault of the server, never a figure: pages cut short, NaN, counters
that go down, a position's sample missing, own counts that accept more than was drafted; measured again, then
exit 3. And the servers whose behaviour depends on the mode or the request: a speculator that drafts in one mode
only, a first window shared with other traffic, a page that is not vLLM's, a model not served, no usage."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from corpus_builder.errors import CorpusError
from corpus_builder.eval import EvalIncomplete, evaluate
from corpus_builder.eval.replay import MAX_REMEASURES
from corpus_builder.testing.fault_server import FaultServer
from tests.eval.runs import text_of

from .conftest import chat_rows, write_jsonl

K = 3


def speculating(accepted: int = 2, **options: Any) -> FaultServer:
    return FaultServer(speculative_tokens=K, accepted_per_draft=accepted, **options)


@pytest.fixture
def pack(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "pack" / "pack.jsonl",
                       chat_rows(2, source="code", task="coding") + chat_rows(1, source="chat"))


def every(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in run["figures"] if f["group"] == "all"]


def metrics_reads(server: FaultServer) -> int:
    return sum(r.path == "/metrics" for r in server.requests)


ALWAYS = dict.fromkeys(range(1, 100))  # every page after the first request


@pytest.mark.parametrize(("fault", "problem"), [
    ("missing_position", "the tokens accepted by position sum to 8, not to the 16 accepted"),
    ("down", "counts that are not whole numbers (finished requests, requests timed)"),
])
def test_impossible_counters_are_measured_again_then_a_fault_not_a_figure(pack: Path, tmp_path: Path, fault: str,
                                                                          problem: str) -> None:
    faults = {key: fault for key in ALWAYS}
    with speculating(page_faults=faults) as server, pytest.raises(EvalIncomplete) as stopped:
        evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs")
    assert stopped.value.exit_code == 3
    message = str(stopped.value)
    assert message.startswith(f"{server.base_url}: counters no speculating server counts, in "
                              f"{MAX_REMEASURES + 1} of {MAX_REMEASURES + 1} measurements of prompt 0")
    assert len(server.chat_requests) == MAX_REMEASURES + 1  # prompt 0, measured again and again
    assert problem in message, message
    assert not (tmp_path / "runs").exists()


def test_a_missing_position_sample_gives_no_figure(pack: Path, tmp_path: Path) -> None:
    """The probe's case: positions 0.91 / 0.00 / 0.87 were reported. Acceptance by position never rises."""
    with speculating(accepted=3, page_faults={key: "missing_position" for key in ALWAYS}) as server, \
            pytest.raises(EvalIncomplete, match="more tokens accepted at position 2 than at position 1"):
        evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs")


@pytest.mark.parametrize("fault", ["missing_position", "down"])
def test_a_fault_that_passes_is_measured_again_and_the_figures_are_exact(pack: Path, tmp_path: Path,
                                                                         fault: str) -> None:
    """The page misses a position, or its counters go down (the probe's rate -0.899), while one request is
    answered: that window and the next (which starts from the faulty reading) are measured again; the figures are
    the server's true ones."""
    with speculating(page_faults={1: fault}) as server:
        run = evaluate(pack, [server.base_url], temperature=0, modes=["thinking"],
                       save_dir=tmp_path / "runs").run.to_json()
    assert run["remeasured_windows"] == 2 and len(server.chat_requests) == 3 + 2
    [figures] = every(run)
    assert figures["acceptance_by_position"] == [1.0, 1.0, 0.0]
    assert figures["acceptance_rate_pooled"] == pytest.approx(2 / 3) and figures["requests"] == 3


@pytest.mark.parametrize("fault", ["cut", "nan"])
def test_an_unreadable_page_is_read_again_and_a_page_that_stays_so_stops_the_eval(pack: Path, tmp_path: Path,
                                                                                   fault: str) -> None:
    with speculating(page_faults={key: fault for key in ALWAYS}) as server, pytest.raises(EvalIncomplete) as stopped:
        evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs")
    problem = "the page is cut short" if fault == "cut" else "a counter that is not a finite number"
    assert str(stopped.value).startswith(f"{server.base_url}: GET /metrics answered a page the eval cannot read: "
                                         f"{problem}")
    assert str(stopped.value).endswith(f"(read {MAX_REMEASURES + 1} times)")
    assert metrics_reads(server) == 1 + MAX_REMEASURES + 1 and len(server.chat_requests) == 1


def test_a_first_page_that_is_not_vllms_is_named_so_not_does_not_speculate(pack: Path, tmp_path: Path) -> None:
    with speculating(page_faults={0: "html"}) as server, pytest.raises(CorpusError) as refused:
        evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs")
    assert str(refused.value) == (f"{server.base_url}: GET /metrics answered a page without vLLM's counters (it "
                                  "begins b'<!DOCTYPE html><html><body>Metrics dashb'): the eval reads a vLLM "
                                  "server's own counters")
    assert not isinstance(refused.value, EvalIncomplete) and server.chat_requests == []


def test_impossible_own_counts_are_measured_again_then_a_fault(pack: Path, tmp_path: Path) -> None:
    """A server whose per-request counts agreed with its page on the first window, then claim more tokens accepted
    than drafted (the probe's rate 1.449): never a figure."""
    later = dict.fromkeys(range(1, 100), "overaccepted")
    with speculating(per_request_metrics=True, own_count_faults=later) as server, \
            pytest.raises(EvalIncomplete) as stopped:
        evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs")
    assert str(stopped.value) == (
        f"{server.base_url}: counters no speculating server counts, in {MAX_REMEASURES + 1} of {MAX_REMEASURES + 1} "
        "measurements of prompt 1: a fault of the server, not a figure\n"
        + "\n".join(["  - its own counts: 41 tokens accepted of 24 drafted"] * (MAX_REMEASURES + 1)))
    assert len(server.chat_requests) == 1 + MAX_REMEASURES + 1


@pytest.mark.parametrize(("faults", "problem"), [
    ({"page_faults": dict.fromkeys(range(1, 100), "overdrafted")},
     "  - 32 tokens drafted in 8 drafts of at most 3 tokens"),
    ({"per_request_metrics": True, "own_count_faults": dict.fromkeys(range(1, 100), "overdrafted")},
     "  - its own counts: 32 tokens drafted in 8 drafts of at most 3 tokens"),
])
def test_more_tokens_drafted_than_the_speculator_drafts_is_a_fault(pack: Path, tmp_path: Path,
                                                                    faults: dict[str, Any], problem: str) -> None:
    with speculating(**faults) as server, pytest.raises(EvalIncomplete) as stopped:
        evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs")
    assert str(stopped.value).splitlines()[1:] == [problem] * (MAX_REMEASURES + 1)


def test_own_counts_wrong_now_and_then_are_measured_again(pack: Path, tmp_path: Path) -> None:
    faults = {1: "overaccepted", 3: "overdrafted"}
    with speculating(per_request_metrics=True, own_count_faults=faults) as server:
        run = evaluate(pack, [server.base_url], temperature=0, modes=["thinking"],
                       save_dir=tmp_path / "runs").run.to_json()
    assert run["remeasured_windows"] == 2 and len(server.chat_requests) == 3 + 2
    assert every(run)[0]["acceptance_rate_pooled"] == pytest.approx(2 / 3)


def test_a_server_that_stops_sending_its_own_counts_stops_the_eval(pack: Path, tmp_path: Path) -> None:
    with speculating(per_request_metrics=True, own_count_faults={2: "missing"}) as server, \
            pytest.raises(EvalIncomplete) as stopped:
        evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs")
    assert str(stopped.value) == (f"{server.base_url}: stopped sending its per-request counts "
                                  "(metrics.speculative_decoding) halfway through the eval")


def test_a_server_that_counts_late_is_waited_for_not_measured_again(pack: Path, tmp_path: Path) -> None:
    with speculating(count_lag_reads=2) as server:
        run = evaluate(pack, [server.base_url], temperature=0, modes=["thinking"],
                       save_dir=tmp_path / "runs").run.to_json()
    assert run["remeasured_windows"] == 0 and len(server.chat_requests) == 3
    assert metrics_reads(server) == 1 + 3 * 3  # each request: two reads of the old counts, then the new
    assert every(run)[0]["acceptance_rate_pooled"] == pytest.approx(2 / 3)


def test_tokens_the_eval_did_not_receive_make_a_window_shared(pack: Path, tmp_path: Path) -> None:
    with speculating(page_faults=dict.fromkeys(range(1, 100), "extra_tokens")) as server, \
            pytest.raises(CorpusError) as refused:
        evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs")
    details = [re.fullmatch(r"  - the server generated (\d+) tokens while the eval received (\d+)", line)
               for line in str(refused.value).splitlines()[1:]]
    assert len(details) == MAX_REMEASURES + 1
    assert all(found is not None and int(found[1]) == int(found[2]) + 1 for found in details), details
    assert not isinstance(refused.value, EvalIncomplete)


def test_a_retried_request_makes_its_window_measured_again(pack: Path, tmp_path: Path) -> None:
    from corpus_builder.testing.fault_server import Fault

    with speculating(by_index={1: Fault("500")}) as server:
        run = evaluate(pack, [server.base_url], temperature=0, modes=["thinking"],
                       save_dir=tmp_path / "runs").run.to_json()
    assert run["remeasured_windows"] == 1 and len(server.chat_requests) == 3 + 2  # the failed try, and again
    assert every(run)[0]["requests"] == 3 and every(run)[0]["acceptance_rate_pooled"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("lag", [0, 1])
def test_a_counters_page_that_fails_mid_run_stops_the_eval(pack: Path, tmp_path: Path, lag: int) -> None:
    """At once, or on the read that waits for a late count."""
    with speculating(page_faults={1: "status"}, count_lag_reads=lag) as server, \
            pytest.raises(EvalIncomplete) as stopped:
        evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs")
    assert str(stopped.value) == f"{server.base_url}: GET /metrics answered HTTP 503"
    assert metrics_reads(server) == 1 + 1 + lag


def test_a_phase_others_keep_sharing_is_named(pack: Path, tmp_path: Path) -> None:
    with speculating(foreign=dict.fromkeys(range(100), 1)) as server, pytest.raises(CorpusError) as refused:
        evaluate(pack, [server.base_url], temperature=0, concurrency=3, save_dir=tmp_path / "runs")
    assert str(refused.value).startswith(f"{server.base_url}: other traffic reached the server in every measurement "
                                         "of the thinking phase: ")
    assert str(refused.value).splitlines()[1] == "  - the server finished 6 requests while the eval sent 3"


def test_the_time_per_output_token_is_the_requests_own_or_the_pages(pack: Path, tmp_path: Path) -> None:
    """A per-request server's first window, measured both ways, takes the requests' own timing too (10 ms), as
    every later window does; a server counted by its page gives the page's (20 ms)."""
    with speculating(per_request_metrics=True) as server:
        own = evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs").run.to_json()
    with speculating() as server:
        paged = evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs").run.to_json()
    assert [f["tpot_ms"] for f in own["figures"]] == [pytest.approx(10.0)] * len(own["figures"])
    assert [f["tpot_ms"] for f in paged["figures"]] == [pytest.approx(20.0)] * len(paged["figures"])


def test_a_shared_first_window_does_not_skip_the_agreement_check(pack: Path, tmp_path: Path) -> None:
    """Another client's request lands in the first window of a server whose own counts misreport: the eval decides
    how to count only on a window no one else shared, where the two accounts disagree: it counts by its page."""
    with speculating(accepted=1, per_request_metrics=True, misreported=1, foreign={0: 1}) as server:
        run = evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs").run.to_json()
    assert run["endpoints"][0]["counters"] == "/metrics" and run["remeasured_windows"] == 1
    assert [f["acceptance_rate_pooled"] for f in every(run)] == [pytest.approx(1 / 3)] * 2


def test_a_speculator_that_drafts_in_one_mode_only_keeps_the_mode_it_measured(pack: Path, tmp_path: Path) -> None:
    """An n-gram speculator drafts only where the output repeats the prompt: nothing in thinking mode here."""
    with speculating(drafts_in=(False,)) as server:
        run = evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs").run.to_json()
    thinking, plain = every(run)
    assert (thinking["mode"], thinking["drafts"], thinking["acceptance_rate_pooled"]) == ("thinking", 0, None)
    assert (plain["mode"], plain["acceptance_rate_pooled"]) == ("non-thinking", pytest.approx(2 / 3))
    assert "no drafts: A in thinking mode (an n-gram speculator drafts only where the output repeats the prompt): " \
           "no acceptance figures there" in run["notes"]
    long = write_jsonl(tmp_path / "long.jsonl", [*chat_rows(2), {"messages": [{"role": "user", "content": "w " * 90}]}])
    with speculating(drafts_in=(), max_model_len=60) as server, pytest.raises(CorpusError) as refused:
        evaluate(long, [server.base_url], temperature=0, save_dir=tmp_path / "runs", max_lost_share=0.5)
    assert str(refused.value) == (f"{server.base_url}: does not speculate: its speculative-decoding counters did not "
                                  "move over 2 request(s) in thinking or non-thinking mode")


def test_a_model_the_server_does_not_serve_is_refused(pack: Path, tmp_path: Path) -> None:
    with speculating() as server, pytest.raises(CorpusError) as refused:
        evaluate(pack, [server.base_url], temperature=0, model="other-model", save_dir=tmp_path / "runs")
    assert str(refused.value) == (f"{server.base_url} does not serve the model 'other-model' (it serves "
                                  "'fault-model'): name the model the server serves with --model")
    assert server.chat_requests == []


@pytest.mark.parametrize("temperature", ["nan", "inf", "-1"])
def test_a_temperature_that_is_not_a_finite_number_is_refused(pack: Path, tmp_path: Path, temperature: str) -> None:
    with speculating() as server:
        completed = subprocess.run([sys.executable, "-m", "corpus_builder", "eval", str(pack), "--endpoint",
                                    server.base_url, "--temperature", temperature, "--save-dir", str(tmp_path / "r")],
                                   capture_output=True, text=True)
        with pytest.raises(CorpusError, match="a sampling temperature is a finite number, 0 or more"):
            evaluate(pack, [server.base_url], temperature=float(temperature), save_dir=tmp_path / "r")
    assert completed.returncode == 2 and "Invalid value for '--temperature'" in completed.stderr
    assert server.chat_requests == []


def test_a_corpus_recipe_edited_to_hold_nan_is_refused_naming_the_key(tmp_path: Path) -> None:
    """A temperature of NaN is never sent as null: a corpus's recipe.yaml edited to hold one is refused as read."""
    from .test_pack import fake_corpus

    corpus = fake_corpus(tmp_path / "corpus")
    (corpus / "recipe.yaml").write_text("target:\n  model: fault-model\n  generation: {temperature: .nan}\n")
    with speculating() as server, pytest.raises(CorpusError) as refused:
        evaluate(corpus, [server.base_url], modes=["thinking"])
    assert "recipe.yaml:3:29: target.generation.temperature: '.nan' is not a finite number" in str(refused.value)
    assert server.requests == []


def test_answers_without_usage_have_no_speed_rather_than_zero(pack: Path, tmp_path: Path) -> None:
    with speculating(usage=False) as server:
        run = evaluate(pack, [server.base_url], temperature=0, modes=["thinking"],
                       save_dir=tmp_path / "runs").run.to_json()
    [figures] = every(run)
    assert (figures["output_tokens"], figures["output_tokens_per_s"]) == (None, None)
    assert figures["acceptance_rate_pooled"] == pytest.approx(2 / 3)
    row = next(line for line in text_of(run).splitlines() if line.startswith("| thinking | A"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert (figures["output_tokens_per_s_per_request"], cells[5], cells[12], cells[13]) == (None, "n/a", "n/a", "n/a")
    # output tokens, output tok/s pooled and per request


def test_a_counters_page_that_stops_answering_mid_run_stops_the_eval(pack: Path, tmp_path: Path) -> None:
    with speculating(page_faults={1: "reset"}) as server, pytest.raises(EvalIncomplete) as stopped:
        evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs")
    found = re.fullmatch(rf"{re.escape(server.base_url)}: /metrics did not answer \((\w+): .*\): the server is gone "
                         "or stuck", str(stopped.value))
    assert found is not None and found[1] in ("ServerDisconnectedError", "ClientOSError"), str(stopped.value)


def test_a_first_counters_page_that_fails_is_not_a_vllm_server(pack: Path, tmp_path: Path) -> None:
    with speculating(page_faults={0: "status"}) as server, pytest.raises(CorpusError) as refused:
        evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs")
    assert str(refused.value) == (f"{server.base_url}: GET /metrics answered HTTP 503: the eval reads the server's own "
                                  "counters (a vLLM server)")
    assert not isinstance(refused.value, EvalIncomplete)


def test_a_server_serving_several_names_is_sent_the_one_asked_for(pack: Path, tmp_path: Path) -> None:
    with speculating(also_serves=("second-name",)) as server:
        run = evaluate(pack, [server.base_url], temperature=0, modes=["thinking"], model="second-name",
                       save_dir=tmp_path / "runs").run.to_json()
        with pytest.raises(CorpusError, match="the endpoints serve more than one model: name the one to use"):
            evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs")
    assert [r.body["model"] for r in server.chat_requests] == ["second-name"] * 3
    assert run["endpoints"][0]["identity"]["served_model"] == "second-name"


def test_endpoints_past_the_alphabet_are_labelled_by_number(tmp_path: Path) -> None:
    one = write_jsonl(tmp_path / "one.jsonl", chat_rows(1))
    with speculating() as server:
        run = evaluate(one, [server.base_url] * 28, temperature=0, modes=["thinking"],
                       save_dir=tmp_path / "runs").run.to_json()
    labels = [endpoint["label"] for endpoint in run["endpoints"]]
    assert labels[:2] == ["A", "B"] and labels[25:] == ["Z", "E26", "E27"]
