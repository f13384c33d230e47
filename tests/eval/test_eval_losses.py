"""A pack as users write it, measured whole or its losses told: rows that end with a question, rows that cannot
be read, prompts a server refuses; and where the run is saved (never in the pack's own folder, checked before the
first request, never lost once finished)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from corpus_builder.errors import CorpusError
from corpus_builder.eval import PackLosses, RunNotSaved, acceptance_sections, compare, evaluate, format_run, load_run
from corpus_builder.testing.fault_server import FaultServer
from tests.support.disks import tmpfs

from .conftest import chat_rows, write_jsonl
from .test_pack import fake_corpus

K = 3


def speculating(accepted: int = 2, **options: Any) -> FaultServer:
    return FaultServer(speculative_tokens=K, accepted_per_draft=accepted, **options)


def corpus_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corpus_builder", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})


def sent_turns(server: FaultServer) -> list[list[tuple[str, str]]]:
    return [[(m["role"], m["content"]) for m in r.body["messages"]] for r in server.chat_requests]


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


# ---- a pack of prompts is evaluated whole -----------------------------------------------------------------------

def test_a_pack_of_questions_and_answered_chats_is_measured_whole_with_each_rows_task(tmp_path: Path) -> None:
    rows = [{"task": "writing", "messages": [user("write a haiku")]},
            {"task": "math", "messages": [user("what is 2 + 2?"), assistant("4"), user("and times 3?")]},
            {"messages": [user("hello"), assistant("hi")]}]
    pack = write_jsonl(tmp_path / "mt.jsonl", rows)
    with speculating() as server:
        run = evaluate(pack, [server.base_url], temperature=0, modes=["thinking"],
                       save_dir=tmp_path / "runs").run.to_json()
    assert [r.body["model"] for r in server.chat_requests] == ["fault-model"] * 3
    assert sent_turns(server) == [[("user", "write a haiku")],
                                  [("user", "what is 2 + 2?"), ("assistant", "4"), ("user", "and times 3?")],
                                  [("user", "hello")]]
    requests = {f["group"]: f["requests"] for f in run["figures"]}
    assert requests == {"all": 3, "source:mt.jsonl": 3, "task:math": 1, "task:writing": 1, "length:<512": 3,
                        "turn:1": 2, "turn:2": 1}  # the chat's second answer is its turn 2
    assert run["pack"]["rows"] == 3 and run["pack"]["unreadable_rows"] == {} and run["skipped_prompts"] == []
    assert not any("lost" in note for note in run["notes"])


def test_unreadable_rows_past_the_allowed_share_stop_the_eval_before_any_request(tmp_path: Path) -> None:
    pack = write_jsonl(tmp_path / "p.jsonl", [*chat_rows(3), {"messages": "nope"}])
    told: list[str] = []
    with speculating() as server, pytest.raises(PackLosses) as refused:
        evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs", progress=told.append)
    assert server.chat_requests == [] and refused.value.exit_code == 1
    assert "1 of the pack's 4 rows cannot be read (25.0%: bad_messages 1), over --max-lost-share 0" in \
        str(refused.value) and str(pack) in str(refused.value)
    assert told == [f"pack {pack}: 1 of its 4 rows lost, unreadable: bad_messages 1"]
    with speculating() as server:
        result = evaluate(pack, [server.base_url], temperature=0, modes=["thinking"], save_dir=tmp_path / "runs",
                          max_lost_share=0.25)
    assert result.problems == () and len(server.chat_requests) == 3
    assert result.run.to_json()["pack"]["unreadable_rows"] == {"bad_messages": 1}
    assert result.run.to_json()["pack"]["rows"] == 4
    assert "1 of the pack's 4 rows lost, unreadable: bad_messages 1" in result.run.to_json()["notes"]
    with speculating() as server:
        cli = corpus_cli("eval", str(pack), "--endpoint", server.base_url, "--temperature", "0",
                         "--save-dir", str(tmp_path / "cli"))
    assert cli.returncode == 1 and "--max-lost-share" in cli.stderr and "Traceback" not in cli.stderr
    assert cli.stderr.count("bad_messages 1") == 2  # told, then refused
    assert not (tmp_path / "cli").exists()


def test_a_prompt_over_a_servers_context_is_left_out_of_every_head_and_counted(tmp_path: Path) -> None:
    """Head A's context is smaller than B's: B measured the long prompt before A refused it (the order rotates),
    so B's window of it goes too; in the next mode no head is sent it. The run is saved, the loss told."""
    long = {"messages": [user("word " * 80), assistant("x")]}
    pack = write_jsonl(tmp_path / "p.jsonl", [*chat_rows(1), long, *chat_rows(2)[1:]])
    told: list[str] = []
    with speculating(max_model_len=50) as a, speculating() as b:
        result = evaluate(pack, [a.base_url, b.base_url], temperature=0, save_dir=tmp_path / "runs",
                          progress=told.append)
    run = result.run.to_json()
    assert len(a.chat_requests) == 3 + 2 and len(b.chat_requests) == 3 + 2
    [skip] = run["skipped_prompts"]
    assert skip == {"prompt": 1, "id": run["prompts"][1]["id"], "source": "p.jsonl", "endpoint": "A",
                    "mode": "thinking", "reason": skip["reason"]}
    assert skip["reason"].startswith(f"{a.base_url}: HTTP 400: This model's maximum context length is 50 tokens.")
    assert {(f["endpoint"], f["mode"]): f["requests"] for f in run["figures"] if f["group"] == "all"} == \
        dict.fromkeys([("A", "thinking"), ("B", "thinking"), ("A", "non-thinking"), ("B", "non-thinking")], 2)
    assert sorted(w["prompt"] for w in run["windows"]) == [0, 0, 0, 0, 2, 2, 2, 2]
    assert next(r for r in run["ratios"] if (r["mode"], r["group"], r["figure"]) ==
                ("thinking", "all", "acceptance_rate_pooled"))["pairs"] == 2
    assert result.problems == ("1 of the pack's 3 rows lost (33.3%: 1 prompt(s) refused by a server, 0 row(s) "
                               "unreadable), over --max-lost-share 0",)
    assert load_run(result.saved).to_json() == run
    assert any(message.startswith(f"thinking: {a.base_url} refused prompt 1 (source p.jsonl)") for message in told)
    assert any(note.startswith("1 prompt(s) refused by a server") for note in run["notes"])


def test_a_phase_that_answered_a_prompt_another_head_refused_is_measured_again(tmp_path: Path) -> None:
    long = {"messages": [user("word " * 80), assistant("x")]}
    pack = write_jsonl(tmp_path / "p.jsonl", [*chat_rows(1), long, *chat_rows(2)[1:]])
    with speculating() as a, speculating(max_model_len=50) as b:
        result = evaluate(pack, [a.base_url, b.base_url], temperature=0, concurrency=3, save_dir=tmp_path / "runs",
                          max_lost_share=0.5)
    # thinking: A's phase (3), B's (2 answered of 3), A's again without the refused prompt (2); non-thinking: 2 each
    assert (len(a.chat_requests), len(b.chat_requests)) == (3 + 2 + 2, 3 + 2)
    assert [(w["endpoint"], w["mode"], w["requests"]) for w in result.run.to_json()["windows"]] == [
        ("A", "non-thinking", 2), ("A", "thinking", 2), ("B", "thinking", 2), ("B", "non-thinking", 2)]
    assert result.problems == ()


def test_the_command_exits_1_for_a_refused_prompt_and_0_when_the_share_is_allowed(tmp_path: Path) -> None:
    long = {"messages": [user("word " * 80), assistant("x")]}
    pack = write_jsonl(tmp_path / "p.jsonl", [*chat_rows(3), long])
    args = ["eval", str(pack), "--temperature", "0", "--mode", "thinking", "--json"]
    with speculating(max_model_len=50) as server:
        strict = corpus_cli(*args, "--endpoint", server.base_url, "--save-dir", str(tmp_path / "strict"))
        allowed = corpus_cli(*args, "--endpoint", server.base_url, "--save-dir", str(tmp_path / "allowed"),
                             "--max-lost-share", "0.25")
    assert strict.returncode == 1 and "check failed: 1 of the pack's 4 rows lost (25.0%" in strict.stderr
    assert orjson.loads(strict.stdout)["skipped_prompts"][0]["prompt"] == 3  # printed and saved all the same
    assert len(list((tmp_path / "strict").glob("*.json"))) == 1
    assert allowed.returncode == 0 and "check failed" not in allowed.stderr, allowed.stderr
    assert "refused prompt 3" in allowed.stderr


def test_a_pack_every_prompt_of_which_is_refused_is_an_error_not_a_run(tmp_path: Path) -> None:
    pack = write_jsonl(tmp_path / "p.jsonl", [{"messages": [user("word " * 80)]}])
    with speculating(max_model_len=50) as server, pytest.raises(CorpusError) as refused:
        evaluate(pack, [server.base_url], temperature=0, save_dir=tmp_path / "runs", max_lost_share=1)
    assert str(refused.value).startswith(f"every prompt of the pack was refused: A refused prompt 0 (thinking): "
                                         f"{server.base_url}: HTTP 400: This model's maximum context length is 50 "
                                         "tokens")
    assert not (tmp_path / "runs").exists()


# ---- where the run is saved ----------------------------------------------------------------------------------

def test_a_pack_files_run_is_saved_under_the_current_directory_not_in_the_packs_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "dataset"
    pack = write_jsonl(data / "p.jsonl", chat_rows(2))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with speculating() as server:
        result = evaluate(pack, [server.base_url], temperature=0, modes=["thinking"])
    assert result.saved.parent == work / "eval" / "results"
    assert sorted(p.name for p in data.rglob("*")) == ["p.jsonl"]  # nothing written in the pack's folder


@pytest.mark.parametrize("given", ["the pack's folder", "a directory pack"])
def test_save_dir_in_the_packs_own_folder_is_refused_before_any_request(tmp_path: Path, given: str) -> None:
    pack = write_jsonl(tmp_path / "dataset" / "p.jsonl", chat_rows(2))
    path = pack if given == "the pack's folder" else pack.parent
    with speculating() as server, pytest.raises(CorpusError) as refused:
        evaluate(path, [server.base_url], temperature=0, save_dir=tmp_path / "dataset")
    assert str(refused.value) == (f"{tmp_path / 'dataset'}: --save-dir: the pack's own folder: a run saved there "
                                  "would be read as part of the pack by the next eval of it; choose another")
    assert server.requests == []


def test_a_file_in_the_way_of_the_default_results_folder_is_named_so_not_as_save_dir(tmp_path: Path) -> None:
    corpus = fake_corpus(tmp_path / "corpus")
    (tmp_path / "eval").write_text("a file, not a folder")
    with speculating() as server, pytest.raises(CorpusError) as refused:
        evaluate(corpus, [server.base_url], temperature=0)
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'eval' / 'results'}: the results directory (by default "
                              f"{tmp_path / 'eval' / 'results'}; --save-dir chooses another): ")
    assert "--save-dir:" not in message and server.requests == []


def test_a_saved_run_is_readable_by_all_like_every_other_output(tmp_path: Path) -> None:
    pack = write_jsonl(tmp_path / "p.jsonl", chat_rows(1))
    previous = os.umask(0o022)
    try:
        with speculating() as server:
            saved = evaluate(pack, [server.base_url], temperature=0, modes=["thinking"], save_dir=tmp_path / "r").saved
    finally:
        os.umask(previous)
    assert saved.stat().st_mode & 0o777 == 0o644


def fill(disk: Path) -> None:
    """Write to ``disk`` until it is full."""
    with (disk / "filler").open("ab") as filler:
        try:
            while True:
                filler.write(b"\0" * 65536)
                filler.flush()
        except OSError:
            pass


def test_a_full_disk_is_found_before_the_first_request(tmp_path: Path) -> None:
    pack = write_jsonl(tmp_path / "p.jsonl", chat_rows(2))
    with tmpfs(tmp_path / "disk", "256k") as disk:
        fill(disk)
        with speculating() as server, pytest.raises(CorpusError) as refused:
            evaluate(pack, [server.base_url], temperature=0, save_dir=disk / "runs")
        assert server.requests == []
        assert str(refused.value) == f"{disk / 'runs'}: --save-dir: cannot save a run there: No space left on device"
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]  # the check made nothing that stays


def test_a_run_the_full_disk_cannot_take_at_the_end_is_printed_and_fails(tmp_path: Path) -> None:
    """The disk fills while the eval runs (another writer): the finished run is not lost silently: the API holds it
    in the error, the command prints it (as JSON with --json) and exits 2."""
    pack = write_jsonl(tmp_path / "p.jsonl", chat_rows(2))
    with tmpfs(tmp_path / "disk", "256k") as disk:
        with speculating(on_chat=lambda index: fill(disk) if index == 1 else None) as server, \
                pytest.raises(RunNotSaved) as unsaved:
            evaluate(pack, [server.base_url], temperature=0, modes=["thinking"], save_dir=disk / "runs")
        assert unsaved.value.exit_code == 2 and "No space left on device" in str(unsaved.value)
        assert unsaved.value.run.to_json()["figures"][0]["requests"] == 2
        (disk / "filler").unlink()
        with speculating(on_chat=lambda index: fill(disk) if index == 1 else None) as server:
            cli = corpus_cli("eval", str(pack), "--endpoint", server.base_url, "--temperature", "0", "--mode",
                             "thinking", "--json", "--save-dir", str(disk / "runs"))
        assert cli.returncode == 2 and "Traceback" not in cli.stderr
        assert orjson.loads(cli.stdout)["figures"][0]["acceptance_rate_pooled"] == pytest.approx(2 / 3)
        assert "the run is finished but cannot be saved: No space left on device" in cli.stderr
        assert not list((disk / "runs").glob("*.json")) and not list((disk / "runs").glob(".*"))


def test_an_unsaved_run_prints_its_tables_without_json(tmp_path: Path) -> None:
    pack = write_jsonl(tmp_path / "p.jsonl", chat_rows(2))
    with tmpfs(tmp_path / "disk", "256k") as disk, \
            speculating(on_chat=lambda index: fill(disk) if index == 1 else None) as server:
        cli = corpus_cli("eval", str(pack), "--endpoint", server.base_url, "--temperature", "0", "--mode",
                         "thinking", "--save-dir", str(disk / "runs"))
    assert cli.returncode == 2
    assert cli.stdout.startswith(f"eval of {pack} (2 prompts") and "| thinking | A    | all" in cli.stdout


def test_the_printed_run_matches_the_saved_one(tmp_path: Path) -> None:
    pack = write_jsonl(tmp_path / "p.jsonl", chat_rows(2))
    with speculating() as server:
        result = evaluate(pack, [server.base_url], temperature=0, modes=["thinking"], save_dir=tmp_path / "r")
    assert format_run(load_run(result.saved)) == format_run(result.run)


# ---- what the run tells of the pack, and saved runs read back ---------------------------------------------------

def test_folded_requests_and_repeated_prompts_are_told_not_called_losses(tmp_path: Path) -> None:
    from tests.support.serving_logs import logged_conversation

    chat = [user("what is 2 + 2?"), assistant("4."), user("and times 3?"), assistant("12.")]
    # the same chat in two sessions: each folds its first request into its second, and the two send the same
    rows = [*logged_conversation("nested", {"messages": chat}, session="a"),
            *logged_conversation("nested", {"messages": chat}, session="b")]
    pack = write_jsonl(tmp_path / "log.jsonl", rows)
    told: list[str] = []
    with speculating() as server:
        result = evaluate(pack, [server.base_url], temperature=0, modes=["thinking"], save_dir=tmp_path / "runs",
                          progress=told.append)
    run = result.run.to_json()
    assert (run["pack"]["folded_requests"], run["pack"]["repeated_prompts"], run["pack"]["unreadable_rows"]) == \
        (2, 1, {})
    assert result.problems == () and len(server.chat_requests) == 2
    assert told[0] == (f"pack {pack}: 2 logged request(s) folded into the later request of their chat; 1 prompt(s) "
                       "send exactly what an earlier one sends, each measured as a prompt")
    assert "2 logged request(s) folded into the later request of their chat, which sends their turns" in run["notes"]
    assert not any("unreadable" in note or "lost" in note for note in run["notes"])


@pytest.mark.parametrize(("edit", "problem"), [
    (lambda run: run.pop("windows"), "windows is missing"),
    (lambda run: run["settings"].pop("max_tokens"), "settings.max_tokens is missing"),
    (lambda run: run["windows"][1].update(drafts=None), "windows[1].drafts is null, not a number"),
    (lambda run: run["prompts"][0].update(task=3), "prompts[0].task is 3, not a string or null"),
])
def test_a_saved_run_missing_a_key_or_holding_a_null_count_is_refused_naming_it(tmp_path: Path, edit: Any,
                                                                              problem: str) -> None:
    """The probe's cases: a run missing a key was a KeyError in --compare; a NaN counter saved as null crashed
    `audit --html` and `eval --compare --html`. Such a run is refused as read, and the audit's section leaves it
    out with the reason."""
    corpus = fake_corpus(tmp_path / "corpus")
    (corpus / "recipe.yaml").write_text("target:\n  model: fault-model\n")
    with speculating() as server:
        good = evaluate(corpus, [server.base_url], temperature=0, modes=["thinking"]).saved
    run = orjson.loads(good.read_bytes())
    edit(run)
    broken = good.with_name("broken.json")
    broken.write_bytes(orjson.dumps(run))
    with pytest.raises(CorpusError) as refused:
        compare(good, broken, html=tmp_path / "page.html")
    assert str(refused.value) == f"{broken}: not a whole saved eval run: {problem}"
    assert not (tmp_path / "page.html").exists()
    [section] = acceptance_sections(corpus)
    assert f"left out: {broken}: not a whole saved eval run: {problem}" in section.body.replace("&quot;", '"')
    cli = corpus_cli("eval", "--compare", str(good), str(broken))
    assert cli.returncode == 2 and "Traceback" not in cli.stderr and problem in cli.stderr


def test_a_rows_tools_are_sent_with_its_prompt(tmp_path: Path) -> None:
    tools = [{"type": "function", "function": {"name": "look", "description": "look it up",
                                                "parameters": {"type": "object", "properties": {}}}}]
    pack = write_jsonl(tmp_path / "p.jsonl", [{"messages": [user("find it")], "tools": tools},
                                              {"messages": [user("no tools")]}])
    with speculating() as server:
        evaluate(pack, [server.base_url], temperature=0, modes=["thinking"], save_dir=tmp_path / "runs")
    assert [r.body.get("tools") for r in server.chat_requests] == [tools, None]
