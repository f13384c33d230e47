"""An eval of two heads: replay an eval pack against two vLLM servers that serve the target, each with its own
speculator, and print head B over head A with its bootstrap interval, per mode.

    python examples/eval_two_heads.py PACK URL_A URL_B [--save-dir DIR]

PACK is a built corpus with an eval pack (examples/serving_logs.yaml builds one), a directory of conversations files
or one file. URL_A and URL_B are the servers' base URLs (http://host:port/v1), started for instance with

    python -m vllm.entrypoints.openai.api_server --model TARGET --served-model-name NAME \\
        --speculative-config '{"method": "eagle3", "model": "HEAD_A", "num_speculative_tokens": 3}' \\
        --per-request-spec-decode-metrics summary

Greedy (temperature 0), so the two heads are compared token for token. `corpus eval PACK --endpoint URL_A
--endpoint URL_B --temperature 0` does the same from the shell; this is the Python API of the eval stage.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from corpus_builder.eval import evaluate, format_run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Acceptance of head B against head A on an eval pack.")
    parser.add_argument("pack", type=Path)
    parser.add_argument("url_a")
    parser.add_argument("url_b")
    parser.add_argument("--save-dir", type=Path, help="where the run is saved (default: eval/results/ beside a "
                                                      "built corpus, else under the current directory)")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    result = evaluate(args.pack, [args.url_a, args.url_b], temperature=0, max_tokens=args.max_tokens,
                      save_dir=args.save_dir)
    print(format_run(result.run))
    for ratio in result.run.ratios:
        value = ratio.value
        if ratio.group == "all" and value.figure == "acceptance_rate_pooled" and value.ratio is not None:
            interval = ("no interval" if value.low is None or value.high is None  # too few prompts for one
                        else f"95% interval {value.low:.3f} to {value.high:.3f}")
            print(f"{ratio.mode}: head B / head A acceptance rate (pooled) {value.ratio:.3f} ({interval}, "
                  f"{value.pairs} prompts)")
    print(f"saved {result.saved}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
