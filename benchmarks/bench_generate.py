"""Client overhead: requests/s of corpus-builder's generation against an instant loopback server, beside a
bare asyncio + aiohttp client and speculators 0.9.0's ``regenerate-responses``.

The instant server (benchmarks/instant_server.py) answers every chat completion at once, so what is left
is each client's own cost per request. Server and client are pinned to one core each (taskset); every
client run is a fresh process, and the order of the clients rotates from round to round so a burst of
load elsewhere on the machine does not always hit the same one.

Clients (all send the same body: messages, sampling, ``chat_template_kwargs``, ``return_token_ids``):

* ``corpus``: ``corpus_builder.generate.generate()`` as ``corpus build`` calls it: journal (zstd, flushed per
  batch), provenance rows, token ids, ordered output, on uvloop when installed (it is, with vLLM);
* ``bare``: one aiohttp session, orjson, a fixed set of workers, no journal, no routing, no retries, on
  the standard asyncio loop (the floor the issue quotes); ``bare-uvloop``: the same on uvloop;
  ``bare-specbody``: the bare client sending speculators' body (no ``n``, ``max_tokens`` 100000 beside
  ``max_completion_tokens``), to tell the server's share of a difference from the client's;
* ``corpus-drop``: ``corpus`` with ``history_reasoning: drop``: earlier turns go back without their
  reasoning, as speculators sends them (shorter second-turn prompts);
* ``speculators``: its own CLI code path (``speculators regenerate-responses --dataset FILE.jsonl --endpoint
  URL --model TOKENIZER_DIR``) run by the .venv-speculators interpreter (scripts/speculators_env.sh); its
  timing starts after its tokenizer and dataset are loaded, as its own summary line does.

    python benchmarks/bench_generate.py [--requests 20000] [--concurrency 64] [--rounds 5]

bench_saturation.py reuses the client runners below against a real vLLM server.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SPECULATORS_PYTHON = Path(os.environ.get("SPECULATORS_VENV", REPO / ".venv-speculators")) / "bin" / "python"
TOKENIZER_DIR = REPO / ".cache" / "tiny-model"  # speculators loads a tokenizer from --model (a local dir)
CLIENTS = ("corpus", "corpus-drop", "bare", "bare-uvloop", "bare-specbody", "speculators")
SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
CLIENT_CORE, SERVER_CORE = 0, 1


@dataclass
class Workload:
    """What every client is asked to do: the same prompts, sampling and concurrency."""

    url: str  # base URL, ".../v1"
    model: str  # served model name
    prompts: Path  # JSONL: {"id", "messages": [system?, user, user...]}
    concurrency: int
    max_tokens: int
    ignore_eos: bool = False
    enable_thinking: bool = True

    def sampling(self) -> dict[str, Any]:
        extra = {"ignore_eos": True} if self.ignore_eos else {}
        return {**SAMPLING, "max_tokens": self.max_tokens, **extra}

    def to_args(self) -> list[str]:
        """Options of ``bench_generate.py client`` (prefixed: speculators' own options follow them)."""
        args = ["--work-url", self.url, "--work-model", self.model, "--work-prompts", str(self.prompts),
                "--work-concurrency", str(self.concurrency), "--work-max-tokens", str(self.max_tokens)]
        return args + (["--work-ignore-eos"] if self.ignore_eos else [])


@dataclass
class Measurement:
    client: str
    requests: int
    output_tokens: int
    wall_s: float
    cpu_s: float  # CPU time of the client process over the same span
    failed_rows: int = 0

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.wall_s

    @property
    def requests_per_cpu_s(self) -> float:
        return self.requests / self.cpu_s

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s


# ---- prompts ------------------------------------------------------------------------------------------

def write_prompts(path: Path, count: int, turns: int) -> None:
    """The prompt file every client reads (speculators takes ``messages`` rows from local JSONL)."""
    from corpus_builder.testing.prompts import make_prompts

    with path.open("w", encoding="utf-8") as out:
        for prompt in make_prompts(count, turns=turns, source="bench"):
            messages = [{"role": m.role, "content": m.content} for m in prompt.messages]
            out.write(json.dumps({"id": prompt.id, "messages": messages}) + "\n")


def read_prompts(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


# ---- clients (each runs in its own process: ``bench_generate.py client NAME ...``) --------------------

def run_corpus(work: Workload, history_reasoning: str = "keep") -> Measurement:
    """corpus-builder's generate(): the path ``corpus build`` takes for a prompts source."""
    from corpus_builder.errors import Skipped
    from corpus_builder.generate import generate
    from corpus_builder.recipe import GenerationSettings, OutputSpec, Recipe, Target
    from corpus_builder.records import Conversation, Message, Provenance

    # on_length "keep": with ignore_eos every turn stops at max_tokens, and the two-turn rows must go on.
    settings = GenerationSettings(enable_thinking=work.enable_thinking, max_tokens=work.max_tokens,
                                  concurrency=work.concurrency, timeout_s=600.0, max_retries=2, on_length="keep",
                                  history_reasoning=history_reasoning,
                                  extra_sampling={"ignore_eos": True} if work.ignore_eos else {}, **SAMPLING)
    recipe = Recipe(name="bench", target=Target(model=work.model, generation=settings), sources=(),
                    output=OutputSpec(dir=Path("unused")))
    prompts = [Conversation(id=row["id"], source="bench", origin="prompt", task="chat", license="MIT",
                            messages=[Message(m["role"], m["content"]) for m in row["messages"]],
                            provenance=Provenance(source_file=str(work.prompts), source_line=line))
               for line, row in enumerate(read_prompts(work.prompts), start=1)]
    requests = tokens = failed = 0
    with tempfile.TemporaryDirectory(prefix="bench-journal-") as journal_dir:
        wall, cpu = time.perf_counter(), time.process_time()
        for row in generate(prompts, recipe, Path(journal_dir), endpoints=[work.url]):
            if isinstance(row, Skipped):
                failed += 1
                continue
            turns = row.provenance.generation.turns
            requests += len(turns)
            tokens += sum(turn["completion_tokens"] or 0 for turn in turns)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return Measurement("corpus" if history_reasoning == "keep" else "corpus-drop", requests, tokens, wall, cpu,
                       failed)


def speculators_body(work: Workload) -> dict[str, Any]:
    """The fixed part of the body regenerate-responses sends for ``speculators_args``: no ``n``, its own
    ``max_tokens`` (the conversation cap) beside the per-turn ``max_completion_tokens``."""
    return {**SAMPLING, "max_completion_tokens": work.max_tokens,
            "chat_template_kwargs": {"enable_thinking": work.enable_thinking},
            **({"ignore_eos": True} if work.ignore_eos else {}),
            "model": work.model, "max_tokens": 100000, "return_token_ids": True}


async def _bare(work: Workload, rows: list[dict[str, Any]], fixed: dict[str, Any]) -> tuple[int, int, int]:
    """Workers pull conversations; each user turn is one request (``fixed`` + the messages) whose history
    holds the earlier answers (with their reasoning, as corpus-builder's default ``history_reasoning: keep``
    sends it)."""
    import asyncio

    import aiohttp
    import orjson

    chat_url = f"{work.url}/chat/completions"
    headers = {"Content-Type": "application/json"}
    totals = [0, 0, 0]  # requests, output tokens, failed conversations
    queue = iter(rows)

    async def worker(session: aiohttp.ClientSession) -> None:
        for row in queue:
            history: list[dict[str, Any]] = []
            for message in row["messages"]:
                history.append(message)
                if message["role"] != "user":
                    continue
                async with session.post(chat_url, data=orjson.dumps({**fixed, "messages": history}),
                                        headers=headers) as response:
                    raw = await response.read()
                if response.status != 200:
                    totals[2] += 1
                    break
                doc = orjson.loads(raw)
                answer = doc["choices"][0]["message"]
                totals[0] += 1
                totals[1] += doc["usage"]["completion_tokens"]
                sent = {"role": "assistant", "content": answer.get("content") or ""}
                if answer.get("reasoning"):
                    sent["reasoning_content"] = answer["reasoning"]
                history = [*history, sent]

    connector = aiohttp.TCPConnector(limit=work.concurrency)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(work.concurrency)))
    return totals[0], totals[1], totals[2]


def run_bare(work: Workload, *, uvloop: bool, speculators_request: bool = False) -> Measurement:
    """The bare client; with ``speculators_request`` it sends speculators' body instead of corpus's."""
    import asyncio

    rows = read_prompts(work.prompts)
    fixed = speculators_body(work) if speculators_request else {
        "model": work.model, **work.sampling(), "chat_template_kwargs": {"enable_thinking": work.enable_thinking},
        "return_token_ids": True, "n": 1}
    runner = asyncio.run
    if uvloop:
        import uvloop as uvloop_module
        runner = uvloop_module.run
    wall, cpu = time.perf_counter(), time.process_time()
    requests, tokens, failed = runner(_bare(work, rows, fixed))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    name = "bare-specbody" if speculators_request else "bare-uvloop" if uvloop else "bare"
    return Measurement(name, requests, tokens, wall, cpu, failed)


def speculators_args(work: Workload, outfile: Path) -> list[str]:
    """regenerate-responses' options for the workload. The length cap goes in as
    ``max_completion_tokens`` (vLLM prefers it over ``max_tokens``) because regenerate-responses counts a
    conversation as truncated, and stops it, when prompt + completion tokens exceed ``--max-tokens``:
    with ``--max-tokens 128`` a two-turn conversation would never reach its second turn."""
    sampling = {key: value for key, value in speculators_body(work).items()
                if key not in ("model", "max_tokens", "return_token_ids")}
    return ["--endpoint", f"{work.url}/chat/completions", "--model", str(TOKENIZER_DIR), "--dataset",
            str(work.prompts), "--concurrency", str(work.concurrency), "--max-tokens", "100000",
            "--sampling-params", json.dumps(sampling), "--outfile", str(outfile), "--max-retries", "2"]


def run_speculators_inside(argv: list[str]) -> Measurement:
    """Runs in the .venv-speculators interpreter: speculators' CLI with two timing marks, taken right
    after its dataset is opened and when it logs its summary (the span its own req/s figure covers).
    The model name it sends is the tokenizer path; the servers here do not check it."""
    import importlib

    from speculators.cli import app

    # The package re-exports the command function under the module's name: fetch the module itself.
    regen = importlib.import_module("speculators.cli.regenerate_responses")

    marks: dict[str, Any] = {}
    load_input_dataset, log_summary = regen.load_input_dataset, regen._log_summary

    def timed_load(*args: Any, **kwargs: Any) -> Any:
        loaded = load_input_dataset(*args, **kwargs)
        marks["start"] = (time.perf_counter(), time.process_time())
        return loaded

    def timed_summary(stats: dict[str, Any]) -> None:
        marks["end"] = (time.perf_counter(), time.process_time())
        marks["stats"] = dict(stats)
        log_summary(stats)

    regen.load_input_dataset, regen._log_summary = timed_load, timed_summary
    app(args=["regenerate-responses", *argv], standalone_mode=False)
    stats = marks["stats"]
    return Measurement("speculators", stats["requests"], stats["completion_tokens"],
                       marks["end"][0] - marks["start"][0], marks["end"][1] - marks["start"][1], stats["errors"])


def client_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_generate.py client")
    parser.add_argument("name", choices=CLIENTS)
    parser.add_argument("--work-url", required=True)
    parser.add_argument("--work-model", required=True)
    parser.add_argument("--work-prompts", type=Path, required=True)
    parser.add_argument("--work-concurrency", type=int, required=True)
    parser.add_argument("--work-max-tokens", type=int, required=True)
    parser.add_argument("--work-ignore-eos", action="store_true")
    args, rest = parser.parse_known_args(argv)
    work = Workload(args.work_url, args.work_model, args.work_prompts, args.work_concurrency,
                    args.work_max_tokens, args.work_ignore_eos)
    if args.name == "speculators":
        result = run_speculators_inside(rest)
    elif args.name in ("corpus", "corpus-drop"):
        result = run_corpus(work, "drop" if args.name == "corpus-drop" else "keep")
    else:
        result = run_bare(work, uvloop=args.name == "bare-uvloop", speculators_request=args.name == "bare-specbody")
    print("RESULT " + json.dumps(result.__dict__), flush=True)


# ---- the driver -------------------------------------------------------------------------------------

def run_client(name: str, work: Workload, scratch: Path, *, core: int | None) -> Measurement:
    """One client run in a fresh process (pinned to ``core`` when given); raises with its stderr tail on
    failure."""
    script = str(Path(__file__).resolve())
    if name == "speculators":
        outfile = scratch / f"speculators-{time.monotonic_ns()}.jsonl"
        command = [str(SPECULATORS_PYTHON), script, "client", name, *work.to_args(),
                   *speculators_args(work, outfile)]
    else:
        command = [sys.executable, script, "client", name, *work.to_args()]
    if core is not None:
        command = ["taskset", "-c", str(core), *command]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=scratch, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.splitlines()[-15:])
        raise RuntimeError(f"client {name} failed (exit {done.returncode}):\n{tail}")
    measured = Measurement(**json.loads(lines[-1][len("RESULT "):]))
    if name == "speculators" and measured.failed_rows:
        errors = outfile.with_name(f"{outfile.stem}.errors.jsonl").read_text(encoding="utf-8").splitlines()
        print(f"speculators: {measured.failed_rows} conversations failed, first: {errors[0][:300]}", file=sys.stderr)
    return measured


def rounds(clients: Sequence[str], count: int) -> Iterator[tuple[int, list[str]]]:
    """Round r runs the clients rotated by r, so each client takes each slot in turn."""
    for index in range(count):
        shift = index % len(clients)
        yield index, [*clients[shift:], *clients[:shift]]


def median_ratio(results: dict[str, list[Measurement]], over: str, under: str, metric: str) -> float:
    """Median over rounds of the paired ratio metric(over) / metric(under)."""
    return statistics.median(getattr(a, metric) / getattr(b, metric)
                             for a, b in zip(results[over], results[under], strict=True))


def ensure_tiny_model() -> None:
    """Build the tiny model into the shared cache unless a current build is there (under the lock the test
    suite takes too)."""
    from corpus_builder.testing.tiny_model import ensure_tiny_model as ensure

    ensure(TOKENIZER_DIR)


def check_tools(clients: Sequence[str]) -> None:
    if "speculators" in clients and not SPECULATORS_PYTHON.exists():
        sys.exit(f"{SPECULATORS_PYTHON} not found: run scripts/speculators_env.sh (or drop speculators "
                 "with --clients)")
    if "speculators" in clients:
        ensure_tiny_model()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", default=",".join(CLIENTS), help=f"comma-separated, from {CLIENTS}")
    args = parser.parse_args()
    clients = args.clients.split(",")
    check_tools(clients)

    from instant_server import MODEL

    from corpus_builder.generate.launcher import free_port, running_server

    port = free_port()
    server = ["taskset", "-c", str(SERVER_CORE), sys.executable, str(REPO / "benchmarks" / "instant_server.py"),
              "--port", str(port), "--uvloop"]
    results: dict[str, list[Measurement]] = {name: [] for name in clients}
    with tempfile.TemporaryDirectory(prefix="bench-generate-") as scratch_dir, \
            running_server(server, port, startup_timeout_s=30) as running:
        scratch = Path(scratch_dir)
        prompts = scratch / "prompts.jsonl"
        write_prompts(prompts, args.requests, turns=1)
        work = Workload(running.url, MODEL, prompts, args.concurrency, max_tokens=128)
        print(f"{args.requests} single-turn requests, concurrency {args.concurrency}, client on core "
              f"{CLIENT_CORE}, instant server on core {SERVER_CORE}", flush=True)
        for index, order in rounds(clients, args.rounds):
            line = []
            for name in order:
                measured = run_client(name, work, scratch, core=CLIENT_CORE)
                if measured.requests != args.requests:
                    raise RuntimeError(f"{name} completed {measured.requests} of {args.requests} requests")
                results[name].append(measured)
                line.append(f"{name} {measured.requests_per_s:,.0f} req/s ({measured.requests_per_cpu_s:,.0f}"
                            f"/CPU-s)")
            load = os.getloadavg()[0]
            print(f"round {index + 1} (load {load:.2f}): " + "   ".join(line), flush=True)
    print("\nmedians:")
    for name in clients:
        wall = statistics.median(m.requests_per_s for m in results[name])
        cpu = statistics.median(m.requests_per_cpu_s for m in results[name])
        print(f"  {name:12s} {wall:7,.0f} req/s   {cpu:7,.0f} req/CPU-s   {1000 / cpu:.3f} ms CPU/request")
    if "corpus" in clients:
        for other in clients:
            if other != "corpus":
                print(f"  corpus / {other:12s} {median_ratio(results, 'corpus', other, 'requests_per_s'):.2f}x "
                      f"wall, {median_ratio(results, 'corpus', other, 'requests_per_cpu_s'):.2f}x CPU "
                      "(median of paired ratios)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["client"]:
        client_main(sys.argv[2:])
    else:
        main()
