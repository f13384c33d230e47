"""The Python API end to end: write a recipe, build the corpus, audit it, gate on it, export it, read it back.

    python examples/api_end_to_end.py [WORKDIR]   # runs in WORKDIR (default: a new temporary directory)

Every command of the CLI is a function of corpus_builder; this is `corpus validate`, `build`, `audit`, `export`
and a loop over the written rows, with no server (replay sources only).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from corpus_builder import Corpus, CorpusError, audit_corpus, build_corpus, check_corpus, export_corpus, load_recipe

# Twenty small chats: half answer with their reasoning in a <think> block, half without.
ROWS = [json.dumps({"messages": [{"role": "user", "content": f"What is {i} + {i}?"},
                                 {"role": "assistant", "content": f"<think>{i} doubled.</think>{2 * i}" if i % 2
                                  else str(2 * i)}]}) for i in range(20)]
RECIPE = """
name: api-example
target: {model: my-org/my-target}
sources:
  - {name: chats, kind: replay, path: chats.jsonl, task: chat, license: MIT}
split: {validation_fraction: 0.2}
output: {dir: out/api-example}
"""


def main(workdir: Path) -> int:
    (workdir / "chats.jsonl").write_text("\n".join(ROWS) + "\n")
    (workdir / "recipe.yaml").write_text(RECIPE)
    try:
        recipe = load_recipe(workdir / "recipe.yaml")
    except CorpusError as error:  # every problem, as file:line:col: key.path: problem
        print(error, file=sys.stderr)
        return 2
    result = build_corpus(recipe)  # staged, then moved into place
    print(f"built {result.manifest.conversations} conversations, {result.audit['thinking_share']:.0%} thinking, "
          f"into {result.out_dir.relative_to(workdir)}")
    report = audit_corpus(result.out_dir)  # recomputed from the files
    print(f"audit: {report['conversations']} conversations, splits {sorted(report['by_split'])}")
    outcome = check_corpus(result.out_dir, min_thinking_share=0.5)  # `corpus audit --min-thinking-share 0.5`
    print("checks:", outcome.problems or "all passed")
    exported = export_corpus(result.out_dir, "speculators", workdir / "out" / "speculators")
    print(exported.describe())
    for conversation in Corpus.open(result.out_dir).iter_conversations():
        print(conversation.id, conversation.thinking, [message.role for message in conversation.messages])
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit(main(Path(sys.argv[1]).resolve()))
    with tempfile.TemporaryDirectory() as scratch:
        sys.exit(main(Path(scratch)))
