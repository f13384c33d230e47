"""Benchmark: near-duplicate detection over 200k and 2M conversations with planted duplicates.

Conversations have realistic shapes (1-4 exchanges, a third of the answers with reasoning, ~2 kB; the
lengths of `bench_build_replay.write_sharegpt`) over a Zipf vocabulary of 20,000 words, so unrelated
conversations share few word 5-grams, as real ones do. Among them, at known rates:

* near duplicates (8%): a copy of an earlier conversation with 1-2% of its words substituted, inserted or
  deleted, and a turn re-cased with punctuation added;
* normalisation copies (2%): the same words with other case, punctuation and whitespace (exact rule);
* related conversations (2%), which must be KEPT: a copy with 8-15% of its words edited (shingle
  similarity about 0.3-0.5, far from duplicates but closer than unrelated rows).

Each engine and size runs in a process of its own; the parent samples its RSS every 20 ms (psutil). Only
detection is timed (the conversation's text, normalisation, hashing, index): the generator is not. Recall
is over planted copies (near and normalisation), a hit counting when the row it is reported to duplicate is
of the same family (the original or another copy of it); precision is over every flagged row. The exact
shingle Jaccard similarity of every planted pair is measured to show where the copies lie.

Engines: ``corpus`` (corpus_builder.screen.near_dedup.NearDuplicates, defaults) and ``datasketch``, the same
library the plain way, as the anchor: one ``MinHash(num_perm=128)`` per conversation over the same shingles
(``update_batch``), ``MinHashLSH(threshold=0.8)`` queried then inserted per row. It is slow, so it runs on the
first ``--anchor-size`` rows, and so does ``corpus`` beside it.

Last, decontamination (``corpus_builder.assemble.decontaminate``): every prompt and every response of 30k
conversations checked against evaluation sets of GSM8K's and MT-Bench's sizes, and against 100k texts.

    python benchmarks/bench_dedup.py [--sizes 200000 2000000] [--anchor-size 20000] [--no-decontamination]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil
from bench_build_replay import peak_rss

from corpus_builder.records import Conversation, Message
from corpus_builder.screen.decontaminate import Contamination
from corpus_builder.screen.near_dedup import NearDuplicates
from corpus_builder.screen.normalise import WordRuns, conversation_text, normalise_text, normalise_texts

FRESH, NEAR, NORMALISATION, RELATED = 0, 1, 2, 3
KIND_NAMES = {FRESH: "fresh", NEAR: "near", NORMALISATION: "normalisation", RELATED: "related"}
PLANT_RATES = {NEAR: 0.08, NORMALISATION: 0.02, RELATED: 0.02}
NEAR_EDITS = (0.01, 0.02)  # share of a conversation's words edited in a near copy
RELATED_EDITS = (0.08, 0.15)
VOCABULARY = 20_000
ORIGINALS = 4_096  # recent fresh conversations that copies are made from (a ring: memory stays flat)
BATCH = 10_000
SHINGLE = 5


@dataclass
class Planted:
    """One generated batch and what was planted in it."""

    keys: list[str]
    conversations: list[Conversation]
    kinds: np.ndarray  # uint8 per row
    families: np.ndarray  # int32 per row: the row index of its original (itself for fresh rows)
    similarity: list[tuple[int, float]]  # (kind, exact shingle Jaccard) per planted row


class Generator:
    """Seeded conversations with planted duplicates, streamed in batches."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
        lengths = self.rng.integers(2, 11, size=VOCABULARY)
        self.words = np.array(["".join(self.rng.choice(letters, size=n)) for n in lengths], dtype=object)
        weights = 1.0 / np.arange(1, VOCABULARY + 1) ** 1.07
        self.cumulative = np.cumsum(weights / weights.sum())
        self.originals: list[tuple[int, Conversation]] = []

    def sentence(self, low: int, high: int) -> str:
        ranks = np.searchsorted(self.cumulative, self.rng.random(int(self.rng.integers(low, high + 1))))
        return " ".join(self.words[np.minimum(ranks, VOCABULARY - 1)])

    def fresh(self, index: int) -> Conversation:
        messages = []
        for _ in range(int(self.rng.integers(1, 5))):
            messages.append(Message("user", self.sentence(8, 60)))
            reasoning = self.sentence(20, 80) if self.rng.random() < 0.33 else None
            messages.append(Message("assistant", self.sentence(20, 120), reasoning))
        return Conversation(f"r{index}", "bench", "replay", messages)

    def edited(self, original: Conversation, index: int, share: float) -> Conversation:
        """A copy with ``share`` of its words substituted, inserted or deleted (at least one)."""
        fields = [(m.content, m.reasoning) for m in original.messages]
        words = [text.split() for pair in fields for text in pair if text is not None]
        total = sum(len(w) for w in words)
        for _ in range(max(1, round(share * total))):
            turn = words[int(self.rng.integers(len(words)))]
            at = int(self.rng.integers(len(turn)))
            operation = self.rng.random()
            replacement = str(self.words[min(int(np.searchsorted(self.cumulative, self.rng.random())), VOCABULARY - 1)])
            if operation < 0.5:
                turn[at] = replacement
            elif operation < 0.75 or len(turn) < 2:
                turn.insert(at, replacement)
            else:
                del turn[at]
        rebuilt = iter(" ".join(w) for w in words)
        messages = [Message(m.role, next(rebuilt), next(rebuilt) if m.reasoning is not None else None)
                    for m in original.messages]
        return Conversation(f"r{index}", "bench", "replay", messages)

    def renormalised(self, original: Conversation, index: int) -> Conversation:
        """The same words with other case, punctuation and whitespace."""
        def noisy(text: str) -> str:
            words = (word.capitalize() + ("," if i % 7 == 3 else "") for i, word in enumerate(text.split()))
            return "  ".join(words) + "?!"
        messages = [Message(m.role, noisy(m.content), noisy(m.reasoning) if m.reasoning else None)
                    for m in original.messages]
        return Conversation(f"r{index}", "bench", "replay", messages)

    def batch(self, start: int, count: int) -> Planted:
        keys, conversations, similarity = [], [], []
        kinds = np.zeros(count, dtype=np.uint8)
        families = np.arange(start, start + count, dtype=np.int32)
        draws = self.rng.random(count)
        for offset in range(count):
            index = start + offset
            kind, bound = FRESH, 0.0
            for planted, rate in PLANT_RATES.items():
                bound += rate
                if draws[offset] < bound:
                    kind = planted
                    break
            if kind == FRESH or not self.originals:
                conversation = self.fresh(index)
                if len(self.originals) < ORIGINALS:
                    self.originals.append((index, conversation))
                else:
                    self.originals[int(self.rng.integers(ORIGINALS))] = (index, conversation)
                kind = FRESH
            else:
                family, original = self.originals[int(self.rng.integers(len(self.originals)))]
                if kind == NORMALISATION:
                    conversation = self.renormalised(original, index)
                else:
                    low, high = NEAR_EDITS if kind == NEAR else RELATED_EDITS
                    conversation = self.edited(original, index, float(self.rng.uniform(low, high)))
                    if kind == NEAR:
                        conversation.messages[0].content = conversation.messages[0].content.upper() + "!"
                families[offset] = family
                similarity.append((kind, shingle_jaccard(original, conversation)))
            kinds[offset] = kind
            keys.append(conversation.id)
            conversations.append(conversation)
        return Planted(keys, conversations, kinds, families, similarity)


def shingle_jaccard(first: Conversation, second: Conversation) -> float:
    """The exact Jaccard similarity of two conversations' shingle sets (what MinHash estimates)."""
    runs = WordRuns(normalise_texts([conversation_text(first), conversation_text(second)]))
    hashes, offsets = runs.hashes(SHINGLE, whole_if_shorter=True)
    a, b = set(hashes[:offsets[1]].tolist()), set(hashes[offsets[1]:].tolist())
    return len(a & b) / len(a | b)


class PlainDatasketch:
    """The anchor: datasketch driven the plain way, one MinHash object per conversation."""

    def __init__(self) -> None:
        try:
            from datasketch import MinHash, MinHashLSH
        except ImportError as error:
            raise SystemExit("the anchor needs datasketch: .venv/bin/pip install 'datasketch>=2.0'") from error

        self.minhash = MinHash
        self.lsh = MinHashLSH(threshold=0.8, num_perm=128)

    def offer(self, keys: list[str], texts: list[str]) -> list[str | None]:
        found: list[str | None] = []
        for key, text in zip(keys, texts, strict=True):
            words = normalise_text(text).split()
            shingles = {" ".join(words[i:i + SHINGLE]) for i in range(max(1, len(words) - SHINGLE + 1))}
            signature = self.minhash(num_perm=128)
            signature.update_batch([s.encode() for s in shingles])
            candidates = self.lsh.query(signature)
            if candidates:
                found.append(min(candidates, key=lambda k: int(k[1:])))
            else:
                self.lsh.insert(key, signature)
                found.append(None)
        return found


def run_child(engine: str, size: int, seed: int) -> dict[str, Any]:
    """Detect duplicates in ``size`` generated rows; figures as a JSON-able dict."""
    generator = Generator(seed)
    index: Any = NearDuplicates() if engine == "corpus" else PlainDatasketch()
    families = np.zeros(size, dtype=np.int32)
    planted = Counter[str]()
    found = Counter[str]()
    flagged = correct = 0
    rules = Counter[str]()
    similarity: dict[str, list[float]] = {"near": [], "normalisation": [], "related": []}
    related_flagged: list[float] = []
    seconds = 0.0
    rss_before = psutil.Process().memory_info().rss
    for start in range(0, size, BATCH):
        batch = generator.batch(start, min(BATCH, size - start))
        families[start:start + len(batch.keys)] = batch.families
        began = time.perf_counter()
        texts = [conversation_text(c) for c in batch.conversations]
        decisions = index.offer(batch.keys, texts)
        seconds += time.perf_counter() - began
        planted_similarity = iter(batch.similarity)
        for offset, decision in enumerate(decisions):
            kind = int(batch.kinds[offset])
            jaccard = next(planted_similarity)[1] if kind != FRESH else None
            if jaccard is not None:
                similarity[KIND_NAMES[kind]].append(jaccard)
            if kind in (NEAR, NORMALISATION):
                planted[KIND_NAMES[kind]] += 1
            if decision is None:
                continue
            of = decision if isinstance(decision, str) else decision.of
            rules[decision.rule if not isinstance(decision, str) else "near"] += 1
            flagged += 1
            same_family = families[int(of[1:])] == batch.families[offset]
            if kind in (NEAR, NORMALISATION) and same_family:
                correct += 1
                found[KIND_NAMES[kind]] += 1
            elif kind == RELATED and jaccard is not None:
                related_flagged.append(jaccard)
    copies = sum(planted.values())
    return {
        "engine": engine, "size": size, "seconds": seconds, "per_second": size / seconds,
        "recall": sum(found.values()) / copies, "precision": correct / flagged if flagged else 1.0,
        "recall_by_kind": {kind: found[kind] / planted[kind] for kind in planted},
        "flagged": flagged, "correct": correct, "planted": dict(planted), "rules": dict(rules),
        "related": len(similarity["related"]), "related_flagged": len(related_flagged),
        "similarity": {kind: quantiles(values) for kind, values in similarity.items()},
        "related_flagged_similarity": quantiles(related_flagged),
        "state_bytes": getattr(index, "nbytes", None), "rss_before_mib": rss_before / 2**20,
    }


def quantiles(values: list[float]) -> list[float]:
    """min, median, max (empty when there are none)."""
    return [float(np.min(values)), float(np.median(values)), float(np.max(values))] if values else []


def run_measured(engine: str, size: int, seed: int) -> dict[str, Any]:
    """One child process; its figures and peak RSS (sampled every 20 ms)."""
    process = subprocess.Popen([sys.executable, __file__, "--child", engine, "--sizes", str(size), "--seed", str(seed)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = peak_rss(process)
    out, err = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"{engine} {size} failed: {err.decode()[-3000:]}")
    result: dict[str, Any] = json.loads(out)
    result["peak_rss_mib"] = peak / 2**20
    return result


def show(result: dict[str, Any]) -> None:
    state = (f"  state {result['state_bytes'] / 2**20:.1f} MiB ({result['state_bytes'] / result['size']:.0f} B/row)"
             if result["state_bytes"] else "")
    print(f"{result['engine']:>10} {result['size']:>9,}: {result['per_second']:9,.0f} conv/s  "
          f"peak RSS {result['peak_rss_mib']:7.1f} MiB  recall {result['recall']:.4f}  "
          f"precision {result['precision']:.4f}  RSS before detection {result['rss_before_mib']:.1f} MiB{state}",
          flush=True)
    print(f"{'':>21} recall by kind {result['recall_by_kind']}  rules {result['rules']}  "
          f"related flagged {result['related_flagged']}/{result['related']} "
          f"(similarity min/median/max {result['related_flagged_similarity']})", flush=True)
    print(f"{'':>21} planted similarity min/median/max {result['similarity']}", flush=True)


def time_decontamination(seed: int) -> None:
    """Decontamination of a 30k-row corpus (every prompt, every response) against evaluation sets of GSM8K's
    and MT-Bench's sizes, then against 100k evaluation texts; two planted contaminations must be found."""
    generator = Generator(seed + 1)
    gsm8k = [generator.sentence(40, 120) for _ in range(1_319)]
    mt_bench = [generator.sentence(8, 12) for _ in range(80)] + [generator.sentence(15, 60) for _ in range(80)]
    large = [generator.sentence(50, 300) for _ in range(100_000)]
    rows = generator.batch(0, 30_000).conversations
    prompts = [conversation_text(row, "prompt") for row in rows]
    responses = [" ".join(m.content for m in row.messages if m.role == "assistant") for row in rows]
    prompts[11] += " " + gsm8k[5]
    responses[22] = mt_bench[3] + " " + responses[22]
    for label, sets in [("GSM8K + MT-Bench sizes", [("gsm8k", gsm8k), ("mt-bench", mt_bench)]),
                        ("100k evaluation texts", [("large", large + gsm8k[5:6] + mt_bench[3:4])])]:
        began = time.perf_counter()
        index = Contamination(sets)
        built = time.perf_counter() - began
        began = time.perf_counter()
        found = [i for i, names in enumerate(index.matches(prompts)) if names]
        found += [len(prompts) + i for i, names in enumerate(index.matches(responses)) if names]
        checked = time.perf_counter() - began
        if found != [11, len(prompts) + 22]:
            raise SystemExit(f"decontamination found rows {found}, planted 11 and {len(prompts) + 22}")
        print(f"decontamination, {label}: index {index.nbytes / 2**20:.1f} MiB built in {built:.2f} s; "
              f"{len(prompts):,} prompts + {len(responses):,} responses checked in {checked:.2f} s "
              f"({(len(prompts) + len(responses)) / checked:,.0f} texts/s), both planted rows found", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[200_000, 2_000_000])
    parser.add_argument("--anchor-size", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-decontamination", action="store_true", help="skip the decontamination timing")
    parser.add_argument("--child", choices=["corpus", "datasketch"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_child(args.child, args.sizes[0], args.seed)))
        return
    results = [run_measured(engine, args.anchor_size, args.seed) for engine in ("datasketch", "corpus")]
    for result in results:
        show(result)
    by_size = {}
    for size in args.sizes:
        result = run_measured("corpus", size, args.seed)
        show(result)
        by_size[size] = result
    anchor, ours = results
    print(f"\ncorpus / datasketch at {args.anchor_size:,}: {ours['per_second'] / anchor['per_second']:.1f}x conv/s, "
          f"peak RSS {ours['peak_rss_mib'] / anchor['peak_rss_mib']:.2f}x")
    if len(by_size) >= 2:
        small, large = min(by_size), max(by_size)
        print(f"peak RSS {large:,} / {small:,}: {by_size[large]['peak_rss_mib'] / by_size[small]['peak_rss_mib']:.2f}x")
    if not args.no_decontamination:
        time_decontamination(args.seed)


if __name__ == "__main__":
    main()
