"""Benchmark: reading serving traffic as it is captured (logged request/response pairs, a chat logged once per
request, the prefix fold) against reading the same conversations written once each in ``messages`` form.

Both files are made from the same conversations (1-4 exchanges, a third with reasoning); the log holds each chat's
requests in order, the chats interleaved over a window of ``--concurrent`` open chats, each request repeating the
history without the answers' reasoning (as clients send it), in the nested ``{request, response}`` shape. Each
read is the source readers' (``iter_file``), consumed and counted, in a child process so its peak RSS is its own;
the orjson parse of each file's lines alone is measured too, the fold's floor (``FLOOR``) and what any fold costs at
the least (``ORACLE``). The reads alternate within each repeat so machine noise hits them alike; medians of the wall
time and of the CPU time (the child's own, steadier on a shared machine) are reported.

    python benchmarks/bench_logs.py [--conversations 200000] [--repeats 3] [--memory 10000000] [--workdir DIR]
                                    [--compare-with TREE]

``--memory N``: also read a log of N logged requests (written once, streamed) with the fold and report the peak
RSS against a log a tenth of its size (flat memory: the fold holds only open conversations). ``--compare-with TREE``:
also the folded read with the code of another checkout (main's), alternated with the rest in the same run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypedDict

import orjson

WORDS = ["the", "model", "drafts", "tokens", "and", "the", "target", "verifies", "them", "in", "one", "forward",
         "pass", "so", "acceptance", "depends", "on", "how", "close", "the", "draft", "distribution", "is", "to",
         "the", "target", "distribution", "on", "real", "traffic"]


def _sentence(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def conversations(count: int, seed: int = 0, scale: float = 1.0) -> Iterator[list[dict[str, Any]]]:
    """1-4 exchanges, a third with reasoning; ``scale`` shortens the texts (the memory check's smaller file)."""
    rng = random.Random(seed)

    def text(low: int, high: int) -> str:
        return _sentence(rng, max(1, round(low * scale)), max(1, round(high * scale)))

    for index in range(count):
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"#{index} " + text(8, 60)}]
        reasoned = rng.random() < 0.33
        for turn in range(rng.randint(1, 4)):
            if turn:
                messages.append({"role": "user", "content": text(8, 60)})
            answer: dict[str, Any] = {"role": "assistant", "content": text(20, 120)}
            if reasoned:
                answer["reasoning_content"] = text(20, 80)
            messages.append(answer)
        yield messages


LAST = "last"  # marks a chat's last request as the log is made (taken off before it is written)


def _requests(messages: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    last = max(index for index, turn in enumerate(messages) if turn["role"] == "assistant")
    for index, turn in enumerate(messages):
        if turn["role"] != "assistant":
            continue
        history = [{"role": m["role"], "content": m["content"]} for m in messages[:index]]
        yield {"request": {"model": "target", "messages": history, "chat_template_kwargs": {"enable_thinking": True},
                           "temperature": 0.6},
               "response": {"model": "target", "choices": [{"index": 0, "message": turn, "finish_reason": "stop"}],
                            "usage": {"prompt_tokens": 100, "completion_tokens": 50}},
               LAST: index == last}


def logged_requests(chats: Iterator[list[dict[str, Any]]], concurrent: int, seed: int,
                    opened: Callable[[list[dict[str, Any]]], None] | None = None) -> Iterator[dict[str, Any]]:
    """The requests of ``chats``, each chat's in order, the chats interleaved at random over ``concurrent`` open at
    once; ``opened`` sees each conversation as its chat opens."""
    rng = random.Random(seed)
    open_chats: list[Iterator[dict[str, Any]]] = []
    while True:
        while len(open_chats) < concurrent:
            messages = next(chats, None)
            if messages is None:
                break
            if opened is not None:
                opened(messages)
            open_chats.append(_requests(messages))
        if not open_chats:
            return
        chat = rng.randrange(len(open_chats))
        request = next(open_chats[chat], None)
        if request is None:
            open_chats[chat] = open_chats[-1]
            open_chats.pop()
            continue
        yield request


def write_files(workdir: Path, count: int, concurrent: int, seed: int = 0) -> tuple[Path, Path, int]:
    """The conversations once each (messages form), and as a log of their requests; the log's request count. Beside
    the log, ``kept_lines`` names the line of each chat's last request (the one a fold keeps)."""
    plain, logged = workdir / f"messages-{count}.jsonl", workdir / f"log-{count}.jsonl"
    requests = 0
    with plain.open("wb") as messages_file, logged.open("wb") as log_file, \
            kept_lines(logged).open("w") as kept_file:
        def opened(messages: list[dict[str, Any]]) -> None:
            messages_file.write(orjson.dumps({"messages": messages}) + b"\n")

        for request in logged_requests(conversations(count, seed), concurrent, seed + 1, opened):
            if request.pop(LAST):
                kept_file.write(f"{requests + 1}\n")
            log_file.write(orjson.dumps(request) + b"\n")
            requests += 1
    return plain, logged, requests


def kept_lines(log: Path) -> Path:
    return log.with_suffix(".kept")


# The least a fold written in per-row Python can do (the benchmark's nested shape only, no sessions, no gaps, no
# normalisation): parse each request, take its messages and its answer, key its history and the request before it
# (each turn serialised by orjson in C, hashed with the answer's text), one dict of open chats bounded as the
# readers' is. Not the readers' semantics: what any per-row fold costs at the least.
FLOOR = "floor"
# The least any fold can cost, whatever it is written in: told which requests it keeps (``kept_lines``), it only
# scans each request's line natively (msgspec, the messages and the answer as raw bytes, no Python objects for
# their contents), writes the ledger entry of each folded request, and reads the kept requests as the readers do
# with the fold off (parse, read the exchange, normalise, how it was served, the conversation record).
ORACLE = "oracle"
COMPARED = "compared"  # the folded read with another checkout's code (``--compare-with``)
CHILD = """
import json, resource, sys, time
import orjson
path, mode = sys.argv[1], sys.argv[2]
started, cpu_started = time.perf_counter(), time.process_time()
rows = conversations = 0
parts = {}
if mode == "parse":
    with open(path, "rb") as handle:
        for line in handle:
            orjson.loads(line)
            rows += 1
elif mode == "floor":  # the least a fold can do per request in Python: see FLOOR
    from collections import OrderedDict
    from operator import itemgetter
    from corpus_builder.collector import rare_collections
    role, opened = itemgetter("role"), OrderedDict()
    with open(path, "rb") as handle, rare_collections():
        for line in handle:
            row = orjson.loads(line)
            messages = row["request"]["messages"]
            history = tuple(map(orjson.dumps, messages))
            roles = list(map(role, messages))
            if "assistant" in roles:
                last = len(roles) - 1 - roles[::-1].index("assistant")
                opened.pop(hash((history[:last], messages[last]["content"])), None)
            opened[hash((history, row["response"]["choices"][0]["message"]["content"]))] = row
            if len(opened) > 50_000:  # the readers' default fold.max_open
                opened.popitem(last=False)
                conversations += 1
            rows += 1
    conversations += len(opened)
elif mode == "oracle":  # see ORACLE
    import msgspec
    from pathlib import Path
    from corpus_builder.collector import rare_collections
    from corpus_builder.recipe.model import Fold, SourceSpec
    from corpus_builder.sources.fold import folded_skip
    from corpus_builder.sources import iter_source

    class Request(msgspec.Struct):
        messages: list[msgspec.Raw]

    class Choice(msgspec.Struct):
        message: msgspec.Raw
        finish_reason: str | None = None

    class Response(msgspec.Struct):
        choices: list[Choice]

    class Logged(msgspec.Struct):
        request: Request
        response: Response

    scan = msgspec.json.Decoder(Logged)
    kept = {int(line) for line in open(path[:-len(".jsonl")] + ".kept")}
    kept_file = Path(path[:-len(".jsonl")] + ".kept.jsonl")  # beside the log, in the benchmark's directory
    with open(path, "rb") as handle, kept_file.open("wb") as out:
        out.writelines(line for number, line in enumerate(handle, 1) if number in kept)
    spec = SourceSpec(name="log", kind="replay", paths=(str(kept_file),), fold=Fold(enabled=False))
    started, cpu_started = time.perf_counter(), time.process_time()
    with open(path, "rb") as handle, rare_collections():
        for number, line in enumerate(handle, 1):
            scan.decode(line)
            if number not in kept:
                folded_skip("log", f"log.jsonl:{number}", f"log.jsonl:{number + 1}")
            rows += 1
        scanned = time.perf_counter()
        for item in iter_source(spec, kept_file.parent):
            conversations += hasattr(item, "messages")
    parts = {"scan_and_ledger": scanned - started, "kept_read": time.perf_counter() - scanned}
else:
    from corpus_builder.sources import iter_file
    started, cpu_started = time.perf_counter(), time.process_time()  # its imports are no read's, as the oracle's
    for item in iter_file(path):
        rows += 1
        conversations += hasattr(item, "messages")
elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
print(json.dumps({"seconds": elapsed, "cpu": cpu, "rows": rows, "conversations": conversations, "parts": parts,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


class Measured(TypedDict):
    """One read, as its child process reports it."""

    seconds: float
    cpu: float
    rows: int
    conversations: int
    parts: dict[str, float]
    rss_mb: float


def measure(path: Path, mode: str, tree: Path | None = None) -> Measured:
    """One read in a child process; ``tree``: the checkout whose code it runs (None: this one, as imported)."""
    env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree)}
    completed = subprocess.run([sys.executable, "-c", CHILD, str(path), mode], capture_output=True, text=True,
                               check=True, env=env)
    result: Measured = json.loads(completed.stdout)
    return result


def _cpu_list(results: list[Measured]) -> str:
    return ", ".join(f"{result['cpu']:.2f}" for result in results)


def write_log_only(path: Path, requests: int, concurrent: int) -> None:
    """A log of ``requests`` logged requests of shorter chats, streamed to disk (never held)."""
    with path.open("wb") as handle:
        for request in itertools.islice(logged_requests(conversations(requests, 11, scale=0.1), concurrent, 5),
                                        requests):
            request.pop(LAST)
            handle.write(orjson.dumps(request) + b"\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=200_000)
    parser.add_argument("--concurrent", type=int, default=1_000, help="chats open at once in the log")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory", type=int, default=0, help="logged requests of the memory check (0: none)")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--compare-with", type=Path, help="another checkout (main's): its folded read of the log "
                        "too, alternated with the others (CPU seconds side by side in one run)")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-logs-"))
    workdir.mkdir(parents=True, exist_ok=True)
    plain, logged, requests = write_files(workdir, args.conversations, args.concurrent)
    print(f"{args.conversations:,} conversations: messages form {plain.stat().st_size / 1e6:.0f} MB; "
          f"log of {requests:,} requests {logged.stat().st_size / 1e6:.0f} MB")
    order: list[tuple[str, Path, str, Path | None]] = [
        ("messages", plain, "read", None), ("log", logged, "read", None), ("parse", logged, "parse", None),
        ("parse msg", plain, "parse", None), (FLOOR, logged, FLOOR, None), (ORACLE, logged, ORACLE, None)]
    if args.compare_with is not None:
        order.insert(2, (COMPARED, logged, "read", args.compare_with.resolve()))
    runs: dict[str, list[Measured]] = {name: [] for name, *_ in order}
    for repeat in range(args.repeats):
        for name, path, mode, tree in order if repeat % 2 == 0 else order[::-1]:
            runs[name].append(measure(path, mode, tree))
    medians = {name: statistics.median(r["seconds"] for r in results) for name, results in runs.items()}
    cpu = {name: statistics.median(r["cpu"] for r in results) for name, results in runs.items()}
    for name, results in runs.items():
        print(f"{name:<9} {medians[name]:7.2f} s (median of {len(results)}), CPU {cpu[name]:6.2f} s, "
              f"{args.conversations / medians[name]:>9,.0f} conversations/s, "
              f"{results[0]['rows'] / medians[name]:>9,.0f} rows/s, "
              f"peak RSS {max(r['rss_mb'] for r in results):.0f} MB")
    oracle_parts = {part: statistics.median(run["parts"][part] for run in runs[ORACLE])
                    for part in runs[ORACLE][0]["parts"]}
    print("the oracle's parts: " + ", ".join(f"{part} {seconds:.2f} s" for part, seconds in oracle_parts.items()))
    assert runs["log"][0]["conversations"] == runs["messages"][0]["conversations"] == args.conversations
    assert runs[FLOOR][0]["conversations"] == runs[ORACLE][0]["conversations"] == args.conversations
    print(f"log vs messages form, conversations/s: {medians['messages'] / medians['log']:.2f}x; "
          f"log read vs its own JSON parse: {medians['parse'] / medians['log']:.2f}x; "
          f"bytes per conversation: {logged.stat().st_size / plain.stat().st_size:.2f}x")
    # What a log read costs at the least beyond its fold: each conversation normalised as the messages read does it
    # (that read less its own parse).
    normalised = medians["messages"] - medians["parse msg"]
    print(f"ceilings, conversations/s against the messages form: a free fold (the log's parse plus the "
          f"normalisation) {medians['messages'] / (medians['parse'] + normalised):.2f}x; the floor fold "
          f"{medians['messages'] / (medians[FLOOR] + normalised):.2f}x; any fold (the oracle) "
          f"{medians['messages'] / medians[ORACLE]:.2f}x")
    print(f"the readers' fold against any fold (the oracle), conversations/s: {medians[ORACLE] / medians['log']:.2f}x "
          f"wall, {cpu[ORACLE] / cpu['log']:.2f}x CPU")
    if args.compare_with is not None:
        assert runs[COMPARED][0]["conversations"] == args.conversations
        print(f"{args.compare_with}'s fold against the oracle: {medians[ORACLE] / medians[COMPARED]:.2f}x wall, "
              f"{cpu[ORACLE] / cpu[COMPARED]:.2f}x CPU; this fold's CPU against it: {cpu['log'] / cpu[COMPARED]:.2f}x "
              f"(CPU s of each run: this {_cpu_list(runs['log'])}; compared {_cpu_list(runs[COMPARED])}; "
              f"oracle {_cpu_list(runs[ORACLE])})")
    if args.memory:
        small, large = workdir / "memory-small.jsonl", workdir / "memory-large.jsonl"
        write_log_only(small, args.memory // 10, args.concurrent)
        write_log_only(large, args.memory, args.concurrent)
        low, high = measure(small, "read"), measure(large, "read")
        print(f"memory: {args.memory // 10:,} requests {low['rss_mb']:.0f} MB, {args.memory:,} requests "
              f"{high['rss_mb']:.0f} MB peak RSS ({high['rss_mb'] / low['rss_mb']:.2f}x), "
              f"{high['seconds']:.0f} s for the large one")


if __name__ == "__main__":
    main()
