"""Requests/s of EndpointPool.complete against the instant server, beside a bare aiohttp loop.

The server runs in a subprocess pinned to one core, the client pinned to another, so the figure is
the client's own cost per request. Usage:

    python benchmarks/bench_pool.py [--requests 20000] [--concurrency 64] [--uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import orjson

from corpus_builder.generate.client import EndpointPool
from corpus_builder.generate.types import TurnRequest

SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 256}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_requests(count: int) -> list[TurnRequest]:
    system = {"role": "system", "content": "You are a helpful assistant."}
    return [TurnRequest(messages=(system, {"role": "user", "content": f"What is {i} plus 2? Think first."}),
                        sampling=SAMPLING, enable_thinking=True, model="instant-model") for i in range(count)]


async def run_pool(url: str, requests: list[TurnRequest], concurrency: int) -> tuple[float, float]:
    async with EndpointPool([url], timeout_s=30, max_retries=2, concurrency=concurrency) as pool:
        await pool.check()
        queue = iter(requests)

        async def worker() -> None:
            for request in queue:
                await pool.complete(request)

        return await timed(worker, len(requests), concurrency)


async def run_bare(url: str, requests: list[TurnRequest], concurrency: int) -> tuple[float, float]:
    """The floor: one session, orjson, no routing, no retries, no result object."""
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        queue = iter(requests)
        chat = f"{url}/chat/completions"
        headers = {"Content-Type": "application/json"}

        async def worker() -> None:
            for request in queue:
                body = orjson.dumps({"model": request.model, "messages": request.messages, **request.sampling,
                                     "chat_template_kwargs": {"enable_thinking": True},
                                     "return_token_ids": True, "n": 1})
                async with session.post(chat, data=body, headers=headers) as resp:
                    orjson.loads(await resp.read())

        return await timed(worker, len(requests), concurrency)


async def timed(worker: Callable[[], Awaitable[None]], count: int, concurrency: int) -> tuple[float, float]:
    """(requests per wall second, requests per CPU second of this process). On a shared machine the
    second is the steadier figure: it is what the client sustains when it has its core to itself."""
    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return count / (time.perf_counter() - wall), count / (time.process_time() - cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--uvloop", action="store_true", help="run the client on uvloop")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    port = free_port()
    server_script = Path(__file__).with_name("instant_server.py")
    server = subprocess.Popen([sys.executable, str(server_script), "--port", str(port), "--uvloop",
                               "--cpu", "1"])
    try:
        os.sched_setaffinity(0, {0})
        url = f"http://127.0.0.1:{port}/v1"
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        requests = make_requests(args.requests)
        runner = asyncio.run
        if args.uvloop:
            import uvloop
            runner = uvloop.run
        for round_index in range(args.rounds):
            bare, bare_cpu = runner(run_bare(url, requests, args.concurrency))
            pool, pool_cpu = runner(run_pool(url, requests, args.concurrency))
            print(f"round {round_index + 1}: bare aiohttp {bare:,.0f} req/s ({bare_cpu:,.0f}/CPU-s)   "
                  f"EndpointPool {pool:,.0f} req/s ({pool_cpu:,.0f}/CPU-s)", flush=True)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
