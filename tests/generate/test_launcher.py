"""The local-server launcher: lifecycle with a stand-in server (fast), then the real vLLM server on the
tiny model (health, models, token ids, reasoning split, chat template, stop and failure paths)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from corpus_builder.errors import CorpusError
from corpus_builder.generate.launcher import (
    STOP_GRACE_S,
    free_port,
    launched_server,
    port_is_free,
    running_server,
)
from corpus_builder.recipe import LaunchSpec

REPO = Path(__file__).resolve().parents[2]


def stand_in_server(tmp_path: Path, port: int) -> list[str]:
    """A static HTTP server whose GET /health answers 200 (the directory holds a file named health)."""
    root = tmp_path / "www"
    root.mkdir(exist_ok=True)
    (root / "health").write_text("ok")
    return [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(root)]


def get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, response.read()


def post_json(url: str, body: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False


def descendants() -> set[int]:
    """The pids of this process's descendants (launched servers and their workers)."""
    import psutil

    return {child.pid for child in psutil.Process().children(recursive=True)}


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (alive := [p for p in pids if pid_alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


# --------------------------------------------------------------------------------------------------
# Lifecycle with a stand-in server


def test_running_server_serves_then_stops(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "server.log"
    before = descendants()
    with running_server(stand_in_server(tmp_path, port), port, log_path=log, startup_timeout_s=30) as server:
        assert server.url == f"http://127.0.0.1:{port}/v1"
        assert get(server.url.removesuffix("/v1") + "/health")[0] == 200
        pids = list(descendants() - before)
        assert pids
    assert not wait_gone(pids)
    assert port_is_free(port)
    assert "GET /health" in log.read_text()  # the server's output went to the log, not the terminal


def test_exception_inside_the_block_stops_the_server(tmp_path: Path) -> None:
    port, before = free_port(), descendants()
    with pytest.raises(RuntimeError, match="boom"), \
            running_server(stand_in_server(tmp_path, port), port, startup_timeout_s=30):
        pids = list(descendants() - before)
        raise RuntimeError("boom")
    assert not wait_gone(pids)
    assert port_is_free(port)


def test_server_exiting_during_startup_reports_the_log_tail(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "import sys; print('error: unrecognized arguments: --bogus'); sys.exit(2)"]
    log = tmp_path / "server.log"
    with pytest.raises(CorpusError) as raised, \
            running_server(command, free_port(), log_path=log, startup_timeout_s=30):
        pytest.fail("the block must not run")
    message = str(raised.value)
    assert "exited with code 2 before it was ready" in message
    assert "unrecognized arguments: --bogus" in message and str(log) in message


def test_startup_timeout_kills_the_hanging_server(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    command = [sys.executable, "-c", f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); "
                                     "print('loading', flush=True); time.sleep(600)"]
    with pytest.raises(CorpusError, match=r"did not answer .*/health within 1 s") as raised, \
            running_server(command, free_port(), startup_timeout_s=1):
        pytest.fail("the block must not run")
    assert "loading" in str(raised.value)
    assert not wait_gone([int(marker.read_text())])


def test_busy_fixed_port_is_refused(tmp_path: Path) -> None:
    port = free_port()
    with running_server(stand_in_server(tmp_path, port), port, startup_timeout_s=30), \
            pytest.raises(CorpusError, match=f"port {port} .* already in use"), \
            running_server(stand_in_server(tmp_path, port), port, startup_timeout_s=30):
        pass


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_signal_to_the_parent_stops_the_server(tmp_path: Path, signum: int) -> None:
    port = free_port()
    script = tmp_path / "parent.py"
    # A shell without job control starts background jobs with SIGINT ignored, and Python keeps an ignored
    # SIGINT ignored: restore the interactive default so Ctrl-C is tested however pytest was started.
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys, time
        import psutil
        from corpus_builder.generate.launcher import running_server
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with running_server({stand_in_server(tmp_path, port)!r}, {port}, startup_timeout_s=30):
            pids = [p.pid for p in psutil.Process().children(recursive=True)]
            print(" ".join(map(str, pids)), flush=True)
            time.sleep(600)
    """))
    parent = subprocess.Popen([sys.executable, str(script)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert pids, "the parent did not start the server"
        parent.send_signal(signum)
        # The launcher gives the server STOP_GRACE_S to exit on SIGTERM before it kills it: allow for that.
        code = parent.wait(timeout=STOP_GRACE_S + 60)
    finally:
        if parent.poll() is None:
            parent.kill()
    # SystemExit(143) for SIGTERM; an uncaught KeyboardInterrupt ends Python by re-raising SIGINT.
    assert code == (143 if signum == signal.SIGTERM else -signal.SIGINT)
    assert not wait_gone(pids)
    assert port_is_free(port)


def test_launch_refuses_options_the_launcher_owns(tmp_path: Path) -> None:
    spec = LaunchSpec(model_dir=tmp_path, args=("--port=9000", "--served-model-name", "x"))
    with pytest.raises(CorpusError, match="must not set --port, --served-model-name"), \
            launched_server(spec, "tiny"):
        pass


def test_launch_needs_an_existing_model_dir(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="model directory not found"), \
            launched_server(LaunchSpec(model_dir=tmp_path / "missing"), "tiny"):
        pass


# --------------------------------------------------------------------------------------------------
# The real vLLM server on the tiny model


def chat(server: Any, messages: list[dict[str, str]], **extra: Any) -> dict[str, Any]:
    body = {"model": server.model, "messages": messages, "max_tokens": 128, "return_token_ids": True, **extra}
    return post_json(server.base_url + "/chat/completions", body)


@pytest.mark.vllm
def test_real_server_health_and_models(vllm_server: Any) -> None:
    assert get(vllm_server.base_url.removesuffix("/v1") + "/health")[0] == 200
    models = json.loads(get(vllm_server.base_url + "/models")[1])
    assert [m["id"] for m in models["data"]] == [vllm_server.model]


@pytest.mark.vllm
def test_real_server_thinking_returns_tokens_and_reasoning(vllm_server: Any) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(vllm_server.model_dir / "tokenizer.json"))
    think_close = tokenizer.token_to_id("</think>")
    answers = [chat(vllm_server, [{"role": "user", "content": f"What is {i} + {i}?"}],
                    chat_template_kwargs={"enable_thinking": True}, seed=i) for i in range(8)]
    for answer in answers:
        prompt = tokenizer.decode(answer["prompt_token_ids"], skip_special_tokens=False)
        assert prompt.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
        assert prompt.endswith("<|im_start|>assistant\n<think>\n")
        assert answer["choices"][0]["token_ids"]
    # The tiny model closes its reasoning in most generations (see corpus_builder/testing/tiny_model.py).
    closed = [a for a in answers if think_close in a["choices"][0]["token_ids"]]
    assert closed, "no generation closed its think block"
    for answer in closed:
        message, ids = answer["choices"][0]["message"], answer["choices"][0]["token_ids"]
        reasoning = message.get("reasoning", message.get("reasoning_content"))
        head = tokenizer.decode(ids[:ids.index(think_close)], skip_special_tokens=False)
        assert (reasoning or "").strip() == head.strip()  # </think> first: empty reasoning, null


@pytest.mark.vllm
def test_real_server_thinking_off(vllm_server: Any) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(vllm_server.model_dir / "tokenizer.json"))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    answer = chat(vllm_server, messages, chat_template_kwargs={"enable_thinking": False})
    message = answer["choices"][0]["message"]
    assert message.get("reasoning") is None and message.get("reasoning_content") is None
    prompt = tokenizer.decode(answer["prompt_token_ids"], skip_special_tokens=False)
    assert prompt == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                      "<|im_start|>assistant\n<think>\n\n</think>\n\n")  # no default system prompt added


@pytest.mark.vllm
def test_real_server_reaches_every_generation_path(vllm_server: Any) -> None:
    """The tiny model's contract with the generator tests: reasoning that closes, answers that stop,
    and now and then a generation cut at max_tokens (about 11 % of them: none in 64 has p < 0.1 %)."""
    import asyncio

    import aiohttp

    async def run() -> list[dict[str, Any]]:
        async with aiohttp.ClientSession() as session:
            async def one(i: int) -> dict[str, Any]:
                body = {"model": vllm_server.model, "max_tokens": 128,
                        "messages": [{"role": "user", "content": f"Question {i}"}],
                        "chat_template_kwargs": {"enable_thinking": True}}
                async with session.post(vllm_server.base_url + "/chat/completions", json=body) as response:
                    return await response.json()
            return await asyncio.gather(*(one(i) for i in range(64)))

    choices = [answer["choices"][0] for answer in asyncio.run(run())]
    closed = sum(bool(c["message"]["reasoning"]) and c["message"]["content"] is not None for c in choices)
    stopped = sum(c["finish_reason"] == "stop" for c in choices)
    cut = sum(c["finish_reason"] == "length" for c in choices)
    assert closed >= len(choices) // 2 and stopped >= len(choices) // 2 and cut >= 1, (closed, stopped, cut)


@pytest.mark.vllm
@pytest.mark.slow  # starts a server of its own
def test_real_server_is_stopped_on_exception(tiny_model_dir: Path, tmp_path: Path) -> None:
    spec = LaunchSpec(model_dir=tiny_model_dir, args=("--enforce-eager", "--max-model-len", "512"))
    before = descendants()  # e.g. the session's servers
    with pytest.raises(RuntimeError, match="inside the block"), \
            launched_server(spec, "tiny-stop", log_path=tmp_path / "server.log") as server:
        port = int(server.url.rsplit(":", 1)[1].split("/")[0])
        pids = list(descendants() - before)
        assert len(pids) >= 2  # the API server and its engine core
        raise RuntimeError("inside the block")
    assert not wait_gone(pids, timeout=30)
    assert port_is_free(port)


@pytest.mark.vllm
def test_real_server_with_bad_args_fails_with_the_log_tail(tiny_model_dir: Path, tmp_path: Path) -> None:
    spec = LaunchSpec(model_dir=tiny_model_dir, args=("--max-model-len", "not-a-number"))
    with pytest.raises(CorpusError, match="exited with code") as raised, \
            launched_server(spec, "tiny-bad", log_path=tmp_path / "server.log"):
        pytest.fail("the block must not run")
    assert "not-a-number" in str(raised.value)
