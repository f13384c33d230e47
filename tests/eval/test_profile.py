"""``corpus eval --profile FILE``: each head's speculation_profile.json in the shape ModelOpt's tooling reads, its
figures those of the run, its conditions what was measured, and ModelOpt's own checks passed."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from corpus_builder.eval import load_run, read_profile, speculation_profile
from corpus_builder.testing.fault_server import FaultServer, Scripted

from .conftest import write_jsonl
from .runs import synthetic_run
from .test_eval_faults import corpus_cli

K = 3
ACCEPTING = [0, 1, 3, 1, 2]
ANSWER = " ".join(f"w{i}" for i in range(23))  # 24 tokens
# the keys of ModelOpt's build_profile, schema 1.0
KEYS = {"schema_version", "measured", "method", "draft_checkpoint", "target_model", "num_speculative_tokens",
        "block_size", "max_supported_k", "verification_method", "conditional_accept_rates", "marginal_accept_rates",
        "mean_accept_length", "mean_accept_length_per_request", "accept_length_model", "accept_length_by_k",
        "acceptance_length_histogram", "per_category", "measurement_conditions", "validation"}
# ours beside them: each request's own, then their mean
PER_REQUEST_KEYS = {"marginal_accept_rates_per_request", "acceptance_length_histogram_per_request"}


SERVER_INFO = {"speculative_config": {"method": "eagle3", "model": "/heads/h1", "num_speculative_tokens": K},
               "model_config": {"model": "/models/fault-model", "revision": "r1"}}


def test_a_profile_per_head_in_modelopts_shape(tmp_path: Path) -> None:
    pack = write_jsonl(tmp_path / "pack" / "pack.jsonl", [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "x"}], "source": "s"}
        for i in range(len(ACCEPTING))])
    answers = {f"q{i}": Scripted(ANSWER, accepting) for i, accepting in enumerate(ACCEPTING)}
    profile = tmp_path / "out" / "speculation_profile.json"
    profile.parent.mkdir()
    with FaultServer(speculative_tokens=K, answers=answers, per_request_metrics=True, server_info=SERVER_INFO) as a, \
            FaultServer(speculative_tokens=K, accepted_per_draft=1) as b:
        completed = corpus_cli("eval", str(pack), "--endpoint", a.base_url, "--endpoint", b.base_url,
                               "--temperature", "0", "--mode", "non-thinking", "--save-dir", str(tmp_path / "runs"),
                               "--profile", str(profile))
    assert completed.returncode == 0, completed.stderr
    assert f"wrote {profile}\n" in completed.stderr and f"wrote {profile.with_name('speculation_profile-B.json')}" \
        in completed.stderr
    written = orjson.loads(profile.read_bytes())
    assert set(written) == KEYS | PER_REQUEST_KEYS
    run = load_run(next((tmp_path / "runs").glob("*.json")))
    assert written == orjson.loads(orjson.dumps(speculation_profile(run, "A")))  # the saved run gives it again
    [figure] = [f for f in run.figures if f.endpoint == "A" and f.group == "all"]
    assert written["measured"] is True and written["schema_version"] == "1.0"
    assert (written["method"], written["num_speculative_tokens"], written["max_supported_k"]) == ("eagle3", K, K)
    assert written["draft_checkpoint"] == {"id": "heads/h1", "method": "eagle3"}  # never the machine's full path
    assert written["target_model"]["id"] == "models/fault-model" and written["target_model"]["revision"] == "r1"
    assert written["marginal_accept_rates"] == pytest.approx(figure.acceptance_by_position, abs=1e-6)
    assert written["conditional_accept_rates"] == pytest.approx(figure.conditional_by_position, abs=1e-6)
    assert written["mean_accept_length"] == pytest.approx(figure.mean_acceptance_length_pooled, abs=1e-6)
    assert written["mean_accept_length_per_request"] == pytest.approx(figure.mean_acceptance_length_per_request,
                                                                      abs=1e-6)
    assert written["accept_length_model"] == "chain_analytic"
    # each request accepts alike at every step here: its own marginal is 1 up to its length, then 0
    assert written["marginal_accept_rates_per_request"] == pytest.approx([4 / 5, 2 / 5, 1 / 5])
    assert written["acceptance_length_histogram_per_request"] == pytest.approx({"1": 0.2, "2": 0.4, "3": 0.2,
                                                                               "4": 0.2})
    assert written["per_category"]["non-thinking"]["marginal_accept_rates_per_request"] == pytest.approx(
        [4 / 5, 2 / 5, 1 / 5])
    # keyed by acceptance length (the target's own token included): steps that accepted j drafted tokens at j + 1
    steps = [-(-24 // (accepting + 1)) for accepting in ACCEPTING]
    expected = {str(j + 1): sum(s for s, accepting in zip(steps, ACCEPTING, strict=True) if accepting == j)
                for j in range(K + 1)}
    assert written["acceptance_length_histogram"] == expected
    lengths = {int(length): count for length, count in expected.items()}
    assert sum(length * count for length, count in lengths.items()) / sum(lengths.values()) == pytest.approx(
        written["mean_accept_length"])  # ModelOpt's per-step mean of the histogram
    assert written["validation"]["mean_consistency"]["passed"] is True
    assert written["validation"]["marginal_monotonicity"] == {"passed": True, "violations": []}
    conditions = written["measurement_conditions"]
    assert conditions["pack_sha256"] == run.pack.sha256 and conditions["temperature"] == 0
    assert conditions["slices"] == ["all", "length:<512", "source:s", "turn:1"]
    assert set(written["per_category"]) == {"non-thinking", "non-thinking source:s", "non-thinking length:<512",
                                            "non-thinking turn:1"}
    other = orjson.loads(profile.with_name("speculation_profile-B.json").read_bytes())
    assert other["method"] is None and other["accept_length_model"] == "measured_per_k"
    assert other["marginal_accept_rates"] == [1.0, 0.0, 0.0] and other["mean_accept_length"] == 2.0
    with pytest.raises(KeyError, match="no head C in the run"):
        speculation_profile(run, "C")


def test_profiles_from_a_saved_run_without_measuring(tmp_path: Path) -> None:
    """`corpus eval --profile FILE --from-run RUN`: each head's profile as the run gives it, in the shape `corpus
    publish --profile` takes; nothing else may come with it, and neither the run nor a bad run is written over."""
    saved = tmp_path / "run.json"
    saved.write_bytes(orjson.dumps(synthetic_run().to_json()))
    profile = tmp_path / "out" / "speculation_profile.json"
    profile.parent.mkdir()
    written = corpus_cli("eval", "--profile", str(profile), "--from-run", str(saved))
    assert written.returncode == 0, written.stderr
    other = profile.with_name("speculation_profile-B.json")
    assert written.stderr == f"wrote {profile}\nwrote {other}\n" and written.stdout == ""
    run = load_run(saved)
    for head, path in (("A", profile), ("B", other)):
        assert orjson.loads(path.read_bytes()) == orjson.loads(orjson.dumps(speculation_profile(run, head)))
        assert read_profile(path).mean_accept_length == speculation_profile(run, head)["mean_accept_length"]
    assert read_profile(profile).head == "heads/A" and read_profile(other).method is None

    for args in (("--from-run", str(saved)), ("--profile", str(profile), "--from-run", str(saved), "--json"),
                 ("pack.jsonl", "--profile", str(profile), "--from-run", str(saved))):
        refused = corpus_cli("eval", *args)
        assert refused.returncode == 2 and "--from-run takes a saved run and --profile FILE, nothing else" in \
            refused.stderr, refused.stderr
    before = saved.read_bytes()
    onto_the_run = corpus_cli("eval", "--profile", str(saved), "--from-run", str(saved))
    assert onto_the_run.returncode == 2 and saved.read_bytes() == before, onto_the_run.stderr
    not_a_run = tmp_path / "profile-of-nothing.json"
    not_a_run.write_text('{"format": "something else"}')
    bad = corpus_cli("eval", "--profile", str(tmp_path / "p.json"), "--from-run", str(not_a_run))
    assert bad.returncode == 2 and f"{not_a_run}: not a saved eval run" in bad.stderr, bad.stderr
    assert not (tmp_path / "p.json").exists()
