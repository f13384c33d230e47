"""A minimal, very fast OpenAI-compatible server: every chat completion gets the same instant answer.

It measures the generator's own overhead (client, journal, provenance) with the model taken out: an
asyncio protocol that parses just enough HTTP/1.1 (request line, Content-Length, keep-alive) and
writes a prebuilt response. Also answers /health, /version and /v1/models so ``EndpointPool.check``
works against it.

    python benchmarks/instant_server.py --port 8123 [--uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import os

import orjson

MODEL = "instant-model"

_COMPLETION = orjson.dumps({
    "id": "chatcmpl-instant", "object": "chat.completion", "created": 0, "model": MODEL,
    "prompt_token_ids": [1, 2, 3, 4, 5, 6, 7, 8],
    "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None, "token_ids": [9, 10, 11, 12, 13, 14],
                 "message": {"role": "assistant", "content": "Four.", "reasoning": "2 plus 2 is 4.",
                             "tool_calls": []}}],
    "usage": {"prompt_tokens": 8, "completion_tokens": 6, "total_tokens": 14,
              "completion_tokens_details": {"reasoning_tokens": 4}},
})
_MODELS = orjson.dumps({"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 4096}]})
_VERSION = orjson.dumps({"version": "instant"})


def _response(body: bytes, status: str = "200 OK") -> bytes:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: keep-alive\r\n\r\n")
    return head.encode() + body


RESPONSES = {
    b"/v1/chat/completions": _response(_COMPLETION),
    b"/health": _response(b""),
    b"/version": _response(_VERSION),
    b"/v1/models": _response(_MODELS),
}
NOT_FOUND = _response(b'{"error": {"message": "not found", "code": 404}}', "404 Not Found")


class InstantProtocol(asyncio.Protocol):
    __slots__ = ("buffer", "transport")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buffer[:end]
            length = 0
            marker = head.lower().find(b"content-length:")
            if marker >= 0:
                line_end = head.find(b"\r\n", marker)
                length = int(head[marker + 15: line_end if line_end >= 0 else len(head)])
            total = end + 4 + length
            if len(buffer) < total:
                break
            path = head[head.find(b" ") + 1: head.find(b" ", head.find(b" ") + 1)]
            self.transport.write(RESPONSES.get(path, NOT_FOUND))  # type: ignore[attr-defined]
            buffer = buffer[total:]
        self.buffer = buffer


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(InstantProtocol, host, port, reuse_address=True, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--uvloop", action="store_true", help="serve on uvloop (installed with vllm)")
    parser.add_argument("--cpu", type=int, help="pin the server to this core")
    args = parser.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    if args.uvloop:
        import uvloop
        uvloop.run(serve(args.host, args.port))
    else:
        asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
