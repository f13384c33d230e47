"""Benchmark: rendering + tokenizing multi-turn conversations with the target's chat template.

Three ways over the same 50k conversations and the same large byte-level BPE (>= 100k entries, trained
offline on local text and cached in .cache/bench-tokenizer):

* floor: the tokenizer's raw ``encode_batch`` on the already-rendered texts (no rendering at all);
* ours: ``TemplateRenderer.count_tokens`` (jinja render + the tiktoken twin of the tokenizer, batch by batch);
* ours_tokenizers: the same with ``CORPUS_TOKEN_COUNTER=tokenizers`` (jinja render + ``encode_batch``);
* naive: ``datasets.Dataset.map`` calling transformers' ``apply_chat_template(tokenize=True)`` per row.

Each is run in its own process (so peak RSS is its own), repeated, alternating the order.

    python benchmarks/bench_render.py [--conversations 50000] [--repeats 3] [--naive-conversations 5000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from corpus_builder.testing.tiny_model import (
    CHAT_TEMPLATE,
    END_OF_TEXT,
    IM_END,
    IM_START,
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
)

REPO = Path(__file__).resolve().parent.parent


VOCAB_SIZE = 131_072
TRAINING_BYTES = 120_000_000
TEXT_SUFFIXES = (".md", ".rst", ".txt", ".py")
BATCH = 1024


def _text_files() -> list[Path]:
    """Local text (documentation and Python sources of the installed packages), in a fixed order."""
    roots = [Path(sysconfig.get_paths()["purelib"]), Path(sysconfig.get_paths()["stdlib"])]
    files = []
    for root in roots:
        files += sorted(p for p in root.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file())
    return files


def _iter_text(limit: int):
    total = 0
    for path in _text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        yield text
        total += len(text)
        if total >= limit:
            return


def build_tokenizer(out_dir: Path) -> Path:
    """Train (once) a byte-level BPE with VOCAB_SIZE entries and the target's chat markers; the chat template
    and the tool-call tags follow the tiny model's (a cached tokenizer gets them without retraining)."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    markers = [AddedToken(t, special=False, normalized=False)
               for t in (THINK_OPEN, THINK_CLOSE, TOOL_CALL_OPEN, TOOL_CALL_CLOSE)]
    if (out_dir / "tokenizer.json").exists():
        cached = PreTrainedTokenizerFast.from_pretrained(str(out_dir))
        added = cached.add_tokens(markers)  # the tags it lacks get new ids after the others
        if added or cached.chat_template != CHAT_TEMPLATE:
            cached.chat_template = CHAT_TEMPLATE
            cached.save_pretrained(out_dir)
        return out_dir
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(_iter_text(TRAINING_BYTES), trainer)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t in (IM_START, IM_END, END_OF_TEXT)])
    tokenizer.add_tokens(markers)
    staging = out_dir.with_name(out_dir.name + ".partial")
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=IM_END, pad_token=END_OF_TEXT,
                            chat_template=CHAT_TEMPLATE, clean_up_tokenization_spaces=False
                            ).save_pretrained(staging)
    staging.rename(out_dir)
    return out_dir


def _words() -> list[str]:
    """Word-like tokens only: a long unbroken string (a URL, a base64 blob) costs BPE quadratic time and would
    measure the tokenizer's worst case, not chat text."""
    words: list[str] = []
    for text in _iter_text(4_000_000):
        words += [w for w in text.split() if len(w) <= 15]
    return words


def iter_conversations(count: int, seed: int = 0):
    """Deterministic multi-turn conversations (1-3 turns, half with reasoning, a third with a system turn)
    made of words from local documentation and sources."""
    from corpus_builder.records import Conversation, Message

    rng = random.Random(seed)
    words = _words()

    def text(low: int, high: int) -> str:
        start = rng.randrange(len(words) - high)
        return " ".join(words[start:start + rng.randint(low, high)])

    for index in range(count):
        messages = [Message("system", text(5, 30))] if index % 3 == 0 else []
        for _ in range(rng.randint(1, 3)):
            messages.append(Message("user", text(10, 80)))
            messages.append(Message("assistant", text(20, 150), text(30, 200) if index % 2 else None))
        yield Conversation(f"{index:020d}", "bench", "replay", messages)


def _batches(iterable, size: int):
    batch = []
    for item in iterable:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def run_mode(mode: str, count: int, tokenizer_dir: Path) -> dict:
    """One measurement in this process: seconds of the timed part, tokens counted, peak RSS."""
    from corpus_builder.tokens import TemplateRenderer

    if mode == "ours_tokenizers":
        os.environ["CORPUS_TOKEN_COUNTER"] = "tokenizers"
    renderer = TemplateRenderer(tokenizer_dir)
    tokens = 0
    elapsed = 0.0
    if mode in ("ours", "ours_tokenizers"):
        for batch in _batches(iter_conversations(count), BATCH):
            start = time.perf_counter()
            tokens += sum(renderer.count_tokens(batch))
            elapsed += time.perf_counter() - start
    elif mode in ("floor", "floor_fast"):
        encode = renderer.tokenizer.encode_batch if mode == "floor" else renderer.tokenizer.encode_batch_fast
        for batch in _batches(iter_conversations(count), BATCH):
            # Not timed: the floor starts from text. The whole conversation as served for its last turn.
            texts = [renderer.render_through(c, len(c.messages) - 1) for c in batch]
            start = time.perf_counter()
            tokens += sum(len(e.ids) for e in encode(texts, add_special_tokens=False))
            elapsed += time.perf_counter() - start
    elif mode == "naive":
        from datasets import Dataset
        from transformers import AutoTokenizer

        hf_tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        rows = [{"messages": [{"role": m.role, "content": m.content,
                               **({"reasoning_content": m.reasoning} if m.reasoning else {})} for m in c.messages]}
                for c in iter_conversations(count)]
        dataset = Dataset.from_list(rows)
        start = time.perf_counter()
        counted = dataset.map(lambda row: {"n": len(hf_tokenizer.apply_chat_template(
            row["messages"], tokenize=True, return_dict=False))}, remove_columns=["messages"], keep_in_memory=True)
        elapsed = time.perf_counter() - start
        tokens = sum(counted["n"])
    else:
        raise SystemExit(f"unknown mode {mode}")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"mode": mode, "conversations": count, "seconds": elapsed, "tokens": tokens, "peak_rss_mb": peak_mb}


def _child(mode: str, count: int, tokenizer_dir: Path) -> dict:
    completed = subprocess.run([sys.executable, __file__, "--child", mode, "--conversations", str(count),
                                "--tokenizer", str(tokenizer_dir)], capture_output=True, text=True, check=True)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=50_000)
    parser.add_argument("--naive-conversations", type=int, default=5_000,
                        help="The naive way is slow: measured on fewer conversations (rates are per second).")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokenizer", type=Path, default=REPO / ".cache" / "bench-tokenizer")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    if args.child:
        print(json.dumps(run_mode(args.child, args.conversations, args.tokenizer)))
        return
    tokenizer_dir = build_tokenizer(args.tokenizer)
    from tokenizers import Tokenizer

    entries = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    print(f"tokenizer: byte-level BPE, {entries:,} entries; load average before: {os.getloadavg()}")
    plan = [("floor", args.conversations), ("floor_fast", args.conversations), ("ours", args.conversations),
            ("ours", args.conversations // 5), ("ours_tokenizers", args.conversations),
            ("naive", args.naive_conversations)]
    results: dict[tuple[str, int], list[dict]] = {}
    for repeat in range(args.repeats):
        for mode, count in (plan if repeat % 2 == 0 else plan[::-1]):
            results.setdefault((mode, count), []).append(_child(mode, count, tokenizer_dir))
    print(f"load average after: {os.getloadavg()}")
    rates = {}
    for (mode, count), runs in results.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        tokens = runs[0]["tokens"]
        rates[(mode, count)] = count / seconds
        print(f"{mode:<15} {count:>7,} conv  {count / seconds:>10,.0f} conv/s  {tokens / seconds:>12,.0f} tok/s  "
              f"median of {len(runs)}: {seconds:.2f} s  peak RSS {max(r['peak_rss_mb'] for r in runs):,.0f} MB")
    ours = rates[("ours", args.conversations)]
    print(f"ours / floor (encode_batch): {ours / rates[('floor', args.conversations)]:.2f}x; "
          f"ours / encode_batch_fast: {ours / rates[('floor_fast', args.conversations)]:.2f}x; "
          f"ours / naive: {ours / rates[('naive', args.naive_conversations)]:.1f}x")


if __name__ == "__main__":
    main()
