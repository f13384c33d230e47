"""Benchmark: `corpus audit CORPUS --against TRAFFIC` on generated serving traffic (issue 14).

What is measured, each in its own process (peak RSS is its own):

* ``facts``: the non-token dimensions (thinking, task, turns, tool calls, script) of every traffic row,
  ``audit.profile.read_profile`` with no tokenizer, on ``--rows`` (10M) and ``--small-rows`` (1M) rows, as
  JSON lines and as parquet: rows/s and peak RSS (the goal: >= 500,000 rows/s, RSS at 10M / 1M <= 1.3);
  next to ``parse``, the audit's JSON parser alone on the same blocks (the floor for JSON lines), and
  ``parse-polars``, polars' ``read_ndjson`` (the parser the audit used before);
* ``tokens``: the token dimensions (render, tokenize, copy-spans, supervised frequencies, with the facts) of
  ``--token-rows`` rows, in conversation tokens/s, against ``floor``: the tokenizer's raw ``encode_batch`` on
  the same conversations already rendered (the goal: >= 0.8x);
* the anchors, the same statistics the way most people would write them: ``pandas`` (``read_json`` in chunks
  and a Python function per row) for the facts, on ``--anchor-rows`` rows; ``datasets`` (``Dataset.map`` with
  transformers' ``apply_chat_template`` per row) for the token lengths, on ``--token-anchor-rows`` rows.

Traffic rows are OpenAI-style request logs (``messages``, ``task``, ``chat_template_kwargs.enable_thinking``),
texts cut from local documentation and sources (so they tokenize like prose and code), generated straight to
disk in the work directory (10M rows are ~30 GB: check ``df -h``). The mix: chat 55% (1-3 exchanges, 8% of
them in Chinese), summarization 10% (2-14k-character documents, answers partly copied), RAG 10%, math 10%,
code 10%, dictation rewrite 5% (answers mostly copied); 60% served with thinking on (with reasoning), 3% with a
tool call. The tokenizer is the 131k-entry byte-level BPE of ``bench_render.py`` (``.cache/bench-tokenizer``).

    python benchmarks/bench_audit.py [--rows 10000000] [--small-rows 1000000] [--token-rows 20000]
                                     [--anchor-rows 1000000] [--token-anchor-rows 3000] [--workdir DIR] [--keep]
                                     [--formats jsonl parquet]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from bench_render import _words, build_tokenizer  # the same tokenizer and text as bench_render

REPO = Path(__file__).resolve().parent.parent

# (task, share, user characters low-high, answer characters low-high, share of the answer copied from the user)
TASKS = (("chat", 0.55, 20, 600, 100, 1500, 0.0), ("summarization", 0.10, 2_000, 14_000, 200, 1_200, 0.4),
         ("rag", 0.10, 1_500, 5_000, 200, 1_000, 0.15), ("math", 0.10, 100, 400, 100, 600, 0.0),
         ("code", 0.10, 200, 1_500, 300, 2_500, 0.1), ("rewrite", 0.05, 200, 1_200, 200, 1_200, 0.8))
THINKING_SHARE, TOOL_SHARE, CHINESE_CHAT_SHARE = 0.6, 0.03, 0.08
PARQUET_ROWS = 65_536
HAN = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处队南给色光门即保治北造百规热领七海口东导器压志世金增争济阶油思术极交受联什认六共权收证改清己美再采转更单风切打白教速花带安场身车例真务具万每目至达走积示议声报斗完类八离华名确才科张信马节话米整空元况今集温传土许步群广石记需段研界拉林律叫且究观越织装影算低持音众书布复容儿须际商非验连断深难近矿千周委素技备半办青省列习响约支般史感劳便团往酸历市克何除消构府称太准精值号率族维划选标写存候毛亲快效斯院查江型眼王按格养易置派层片始却专状育厂京识适属圆包火住调满县局照参红细引听该铁价严"  # noqa: E501


def _text_pool() -> str:
    return " ".join(_words()[:3_000_000])


class TrafficWriter:
    """Rows of the mix above, fast: every text is a slice of one long string (no per-row word joins)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.text = _text_pool()
        self.han = HAN * 40

    def piece(self, low: int, high: int, chinese: bool = False) -> str:
        source = self.han if chinese else self.text
        length = min(len(source) - 1, int(low + (high - low) * self.rng.betavariate(1.3, 3.0)))
        start = self.rng.randrange(len(source) - length)
        return source[start:start + length]

    def row(self, index: int) -> dict[str, Any]:
        rng = self.rng
        task, _, user_low, user_high, answer_low, answer_high, copied = rng.choices(TASKS, [t[1] for t in TASKS])[0]
        thinking = rng.random() < THINKING_SHARE
        chinese = task == "chat" and rng.random() < CHINESE_CHAT_SHARE
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant."}] \
            if rng.random() < 0.3 else []
        exchanges = rng.choices((1, 2, 3), (0.6, 0.25, 0.15))[0] if task == "chat" else 1
        for _ in range(exchanges):
            prompt = self.piece(user_low, user_high, chinese)
            answer = self.piece(answer_low, answer_high, chinese)
            if copied:
                keep = int(len(answer) * copied)
                start = rng.randrange(max(1, len(prompt) - keep))
                answer = prompt[start:start + keep] + " " + answer[keep:]
            turn: dict[str, Any] = {"role": "assistant", "content": answer}
            if thinking:
                turn["reasoning_content"] = self.piece(200, 2_500)
            messages += [{"role": "user", "content": prompt}, turn]
        if rng.random() < TOOL_SHARE:
            call = {"id": f"call-{index}", "type": "function", "function": {"name": "search", "arguments": "{}"}}
            messages[-1] = {**messages[-1], "tool_calls": [call]}
        return {"id": f"req-{index}", "model": "Nanbeige/Nanbeige4.2-3B", "task": task,
                "chat_template_kwargs": {"enable_thinking": thinking}, "messages": messages}


def _arrow_schema() -> Any:
    import pyarrow as pa

    call = pa.struct([("id", pa.string()), ("type", pa.string()),
                      ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
    turn = pa.struct([("role", pa.string()), ("content", pa.string()), ("reasoning_content", pa.string()),
                      ("tool_calls", pa.list_(call))])
    return pa.schema([("id", pa.string()), ("model", pa.string()), ("task", pa.string()),
                      ("chat_template_kwargs", pa.struct([("enable_thinking", pa.bool_())])),
                      ("messages", pa.list_(turn))])


def generate(paths: list[tuple[Path, int]], seed: int) -> dict[str, float]:
    """Write the first ``n`` rows of one stream to each (path, n): the small files are prefixes of the big one.
    A ``.parquet`` path gets the same rows as zstd parquet (row groups of ``PARQUET_ROWS``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer = TrafficWriter(seed)
    schema = _arrow_schema()
    lines = [(path.open("wb", buffering=1 << 22), count) for path, count in paths if path.suffix == ".jsonl"]
    tables = [(pq.ParquetWriter(path, schema, compression="zstd"), count) for path, count in paths
              if path.suffix == ".parquet"]
    pending: list[dict[str, Any]] = []
    start = time.perf_counter()
    dumps = orjson.dumps
    total = max(count for _, count in paths)
    for index in range(total):
        row = writer.row(index)
        line = dumps(row) + b"\n"
        for handle, count in lines:
            if index < count:
                handle.write(line)
        if tables:
            pending.append(row)
            if len(pending) == PARQUET_ROWS or index == total - 1:
                table = pa.Table.from_pylist(pending, schema=schema)
                first = index + 1 - len(pending)
                for table_writer, count in tables:
                    if first < count:
                        table_writer.write_table(table.slice(0, count - first))
                pending = []
    for handle, _ in lines:
        handle.close()
    for table_writer, _ in tables:
        table_writer.close()
    return {"seconds": time.perf_counter() - start}


# --- measurements, each run in a child process ----------------------------------------------------------


def measure_parse(path: Path, parser: str) -> dict[str, Any]:
    """A parse of the same blocks against the same schema and nothing else: ``arrow``, the audit's own parser
    (pyarrow's JSON reader, checked UTF-8, as a polars frame), is what the facts cannot beat; ``polars``
    (``read_ndjson``) is what the audit used before."""
    import polars as pl

    from corpus_builder.audit.frames import RAW_SCHEMA
    from corpus_builder.audit.inputs import _arrow_schema, _frame
    from corpus_builder.sources.raw import CHUNK_BYTES, arrow_lines

    def parse(data: bytes) -> int:
        if parser == "polars":
            return pl.read_ndjson(data, schema=RAW_SCHEMA, ignore_errors=True).height
        frame = _frame(arrow_lines(data, _arrow_schema()))
        assert frame is not None, "a block pyarrow refuses"
        return frame.height

    start = time.perf_counter()
    rows = 0
    pending = b""
    with path.open("rb") as handle:
        while block := handle.read(CHUNK_BYTES):
            cut = block.rfind(b"\n") + 1
            data, pending = pending + block[:cut], block[cut:]
            rows += parse(data)
    return {"rows": rows, "seconds": time.perf_counter() - start}


def measure_facts(path: Path) -> dict[str, Any]:
    from corpus_builder.audit.inputs import traffic_units
    from corpus_builder.audit.profile import read_profile

    start = time.perf_counter()
    profile = read_profile(str(path), traffic_units(str(path)), None, token_sample=0)
    seconds = time.perf_counter() - start
    return {"rows": profile.rows_read, "seconds": seconds, "groups": profile.facts.frame().height}


def _conversations(path: Path, limit: int) -> list[Any]:
    from corpus_builder.records import Conversation
    from corpus_builder.sources import iter_file

    out = []
    for item in iter_file(path):
        if isinstance(item, Conversation):
            out.append(item)
            if len(out) == limit:
                break
    return out


def measure_tokens(path: Path, tokenizer: Path) -> dict[str, Any]:
    from corpus_builder.audit.inputs import traffic_units
    from corpus_builder.audit.profile import read_profile
    from corpus_builder.audit.token_pass import TokenMeter
    from corpus_builder.tokens import TemplateRenderer

    meter = TokenMeter(TemplateRenderer(tokenizer))
    start = time.perf_counter()
    profile = read_profile(str(path), traffic_units(str(path)), meter, token_sample=0)
    seconds = time.perf_counter() - start
    assert profile.tokens is not None
    exact = profile.tokens.exact.frame()
    conversation = exact.filter(exact["measure"] == "conversation_tokens")
    tokens = int((conversation["tokens"] * conversation["count"]).sum())
    return {"rows": profile.rows_read, "seconds": seconds, "tokens": tokens}


def measure_floor(path: Path, tokenizer: Path, rows: int) -> dict[str, Any]:
    from corpus_builder.tokens import TemplateRenderer

    renderer = TemplateRenderer(tokenizer)
    texts = [view for conversation in _conversations(path, rows)
             for view in renderer.budget_views(conversation)]
    start = time.perf_counter()
    tokens = 0
    for low in range(0, len(texts), 1024):
        tokens += sum(len(e.ids) for e in renderer.tokenizer.encode_batch(texts[low:low + 1024],
                                                                           add_special_tokens=False))
    return {"rows": rows, "seconds": time.perf_counter() - start, "tokens": tokens}


def _pandas_row(messages: Any) -> tuple[bool, int, bool, str]:
    """thinking, assistant turns, tool call, script of the first user turn: what a person writes per row."""
    import unicodedata

    thinking = any(m.get("role") == "assistant"
                   and (m.get("reasoning_content") or "</think>" in (m.get("content") or "")) for m in messages)
    turns = sum(m.get("role") == "assistant" for m in messages)
    tools = any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)
    first = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")[:200]
    letters = [unicodedata.name(c, "").split(" ")[0] for c in first if c.isalpha()]
    script = max(set(letters), key=letters.count).lower() if letters else "other"
    return thinking, turns, tools, script


def measure_pandas(path: Path) -> dict[str, Any]:
    import pandas as pd

    start = time.perf_counter()
    rows = 0
    counts: dict[tuple[Any, ...], int] = {}
    for frame in pd.read_json(path, lines=True, chunksize=50_000):
        facts = frame["messages"].apply(_pandas_row)
        keys = pd.DataFrame(facts.tolist(), columns=["thinking", "turns", "tools", "script"])
        keys["task"] = frame["task"].to_numpy()
        keys["served"] = frame["chat_template_kwargs"].map(lambda k: (k or {}).get("enable_thinking")).to_numpy()
        for key, count in keys.value_counts().items():
            counts[key] = counts.get(key, 0) + int(count)
        rows += len(frame)
    return {"rows": rows, "seconds": time.perf_counter() - start, "groups": len(counts)}


def measure_datasets(path: Path, tokenizer: Path, rows: int) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import AutoTokenizer

    hf_tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
    records = [{"messages": [{"role": m.role, "content": m.content,
                              **({"reasoning_content": m.reasoning} if m.reasoning else {})} for m in c.messages]}
               for c in _conversations(path, rows)]
    dataset = Dataset.from_list(records)
    start = time.perf_counter()
    counted = dataset.map(lambda row: {"n": len(hf_tokenizer.apply_chat_template(
        row["messages"], tokenize=True, return_dict=False))}, remove_columns=["messages"], keep_in_memory=True)
    seconds = time.perf_counter() - start
    return {"rows": rows, "seconds": seconds, "tokens": int(sum(counted["n"]))}


def peak_rss_mb() -> float:
    """This process's peak resident memory. Not ``ru_maxrss``: Linux carries it over an exec from the parent
    (this script's parent holds the text pool), while ``VmHWM`` belongs to the new address space."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_main(kind: str, path: Path, tokenizer: Path, rows: int) -> None:
    measures = {"facts": lambda: measure_facts(path), "parse": lambda: measure_parse(path, "arrow"),
                "parse-polars": lambda: measure_parse(path, "polars"),
                "tokens": lambda: measure_tokens(path, tokenizer),
                "floor": lambda: measure_floor(path, tokenizer, rows), "pandas": lambda: measure_pandas(path),
                "datasets": lambda: measure_datasets(path, tokenizer, rows)}
    result = measures[kind]()
    result["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps({"kind": kind, "file": path.name, **result}))


def child(kind: str, path: Path, tokenizer: Path, rows: int = 0) -> dict[str, Any]:
    completed = subprocess.run([sys.executable, __file__, "--child", kind, "--file", str(path), "--tokenizer",
                                str(tokenizer), "--child-rows", str(rows)], capture_output=True, text=True,
                               env={**os.environ, "TOKENIZERS_PARALLELISM": "true"})
    if completed.returncode:
        raise SystemExit(f"{kind} on {path.name} failed:\n{completed.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    result["load_after"] = os.getloadavg()[0]
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--small-rows", type=int, default=1_000_000)
    parser.add_argument("--token-rows", type=int, default=20_000)
    parser.add_argument("--anchor-rows", type=int, default=1_000_000)
    parser.add_argument("--token-anchor-rows", type=int, default=3_000)
    parser.add_argument("--workdir", type=Path, help="Where the traffic is generated (default: a temp dir).")
    parser.add_argument("--keep", action="store_true", help="Keep the generated traffic.")
    parser.add_argument("--formats", nargs="+", choices=("jsonl", "parquet"), default=["jsonl", "parquet"],
                        help="Traffic file formats to generate and audit (the anchors and token runs need jsonl).")
    parser.add_argument("--tokenizer", type=Path, default=REPO / ".cache" / "bench-tokenizer")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-rows", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child, args.file, args.tokenizer, args.child_rows)
        return
    tokenizer = build_tokenizer(args.tokenizer)
    workdir = Path(tempfile.mkdtemp(prefix="bench-audit-", dir=args.workdir))
    try:
        free = shutil.disk_usage(workdir).free
        print(f"work directory {workdir}: {free / 1e9:.0f} GB free; load average {os.getloadavg()}", flush=True)
        big, small, tokens = (workdir / f"traffic{suffix}.jsonl" for suffix in ("", "-small", "-tokens"))
        big_parquet, small_parquet = workdir / "traffic.parquet", workdir / "traffic-small.parquet"
        files = {"jsonl": [(big, args.rows), (small, args.small_rows), (tokens, args.token_rows)],
                 "parquet": [(big_parquet, args.rows), (small_parquet, args.small_rows)]}
        made = generate([entry for fmt in args.formats for entry in files[fmt]], seed=0)
        first = big if "jsonl" in args.formats else big_parquet
        size = first.stat().st_size
        print(f"generated {args.rows:,} rows as {', '.join(args.formats)} in {made['seconds']:.0f} s; {first.name} "
              f"{size / 1e9:.1f} GB ({size / args.rows:,.0f} B/row)", flush=True)
        results = []
        if "jsonl" in args.formats:
            results += [child("facts", small, tokenizer), child("facts", big, tokenizer),
                        child("parse", small, tokenizer), child("parse-polars", small, tokenizer)]
        if "parquet" in args.formats:
            results += [child("facts", small_parquet, tokenizer), child("facts", big_parquet, tokenizer)]
        if "jsonl" in args.formats:
            results += [child("pandas", small if args.anchor_rows >= args.small_rows else big, tokenizer),
                        child("tokens", tokens, tokenizer), child("floor", tokens, tokenizer, args.token_rows),
                        child("datasets", tokens, tokenizer, args.token_anchor_rows)]
        summary(results, size / args.rows)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def summary(results: list[dict[str, Any]], bytes_per_row: float) -> None:
    print("\n| what | rows | seconds | rows/s | MB/s | tokens/s | peak RSS (MB) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        rate = r["rows"] / r["seconds"]
        tokens = f"{r['tokens'] / r['seconds']:,.0f}" if "tokens" in r else ""
        print(f"| {r['kind']} ({r['file']}) | {r['rows']:,} | {r['seconds']:.1f} | {rate:,.0f} | "
              f"{rate * bytes_per_row / 1e6:,.0f} | {tokens} | {r['peak_rss_mb']:,.0f} |")
    by = {r["kind"]: r for r in results}
    for suffix in (".jsonl", ".parquet"):
        facts = [r for r in results if r["kind"] == "facts" and r["file"].endswith(suffix)]
        if len(facts) == 2:
            print(f"\n{suffix}: peak RSS {facts[1]['rows']:,} / {facts[0]['rows']:,} rows: "
                  f"{facts[1]['peak_rss_mb'] / facts[0]['peak_rss_mb']:.2f}x")
    facts = [r for r in results if r["kind"] == "facts" and r["file"].endswith(".jsonl")]
    if "tokens" in by and "floor" in by:
        ratio = (by["tokens"]["tokens"] / by["tokens"]["seconds"]) / (by["floor"]["tokens"] / by["floor"]["seconds"])
        print(f"token dimensions / raw encode_batch: {ratio:.2f}x")
    if "pandas" in by and facts:
        ours = facts[-1]["rows"] / facts[-1]["seconds"]
        print(f"facts / pandas: {ours / (by['pandas']['rows'] / by['pandas']['seconds']):.1f}x")
    if "datasets" in by and "tokens" in by:
        ours = by["tokens"]["tokens"] / by["tokens"]["seconds"]
        print(f"token dimensions / datasets.map: {ours / (by['datasets']['tokens'] / by['datasets']['seconds']):.1f}x")


if __name__ == "__main__":
    main()
