"""Train a small draft model for a target on token rows, on the CPU, outside the product.

The draft is the target's own architecture and tokenizer with fewer layers (the target's config with ``--layers``
1: the tiny model's Qwen3, SmolLM2's Llama) and fresh random weights, trained with next-token cross-entropy on the
supervised tokens of ``{input_ids, loss_mask}`` rows (``corpus export --format speculators-tokens``): a token is
learned where the mask marks it, from everything before it. vLLM serves the result as a ``draft_model``
speculator next to the target (same vocabulary and tokenizer, so the target's tokenizer files are copied beside
the weights).

    python benchmarks/train_draft.py --rows train.jsonl --target .cache/tiny-model --out draft/ [--steps 800]
        [--batch-size 16] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                   "chat_template.jinja")


def read_rows(path: Path, max_len: int) -> list[tuple[list[int], list[int]]]:
    """(input_ids, loss_mask) of every row with a supervised token, cut to ``max_len``."""
    rows = []
    for line in path.read_bytes().splitlines():
        row = orjson.loads(line)
        ids, mask = row["input_ids"][:max_len], row["loss_mask"][:max_len]
        if any(mask[1:]):  # the first token has nothing before it to be predicted from
            rows.append((ids, mask))
    return rows


def draft_config(target: Path, layers: int) -> Any:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(target)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):  # one attention type per layer, checked against the count on load
        config.layer_types = config.layer_types[:layers]
    return config


def train(rows: list[tuple[list[int], list[int]]], config: Any, *, steps: int, batch_size: int, lr: float,
          seed: int, log_every: int) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    shuffle = random.Random(seed)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32)
    model.train()
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps, pct_start=0.05)
    pad = config.pad_token_id
    order: list[int] = []
    started = time.perf_counter()
    for step in range(1, steps + 1):
        if len(order) < batch_size:
            order += shuffle.sample(range(len(rows)), len(rows))
        batch = [rows[order.pop()] for _ in range(batch_size)]
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((batch_size, width), pad, dtype=torch.long)
        labels = torch.full((batch_size, width), -100, dtype=torch.long)  # -100: no loss (transformers' ignore index)
        attention = torch.zeros((batch_size, width), dtype=torch.long)
        for index, (ids, mask) in enumerate(batch):
            input_ids[index, :len(ids)] = torch.tensor(ids)
            attention[index, :len(ids)] = 1
            labels[index, :len(ids)] = torch.tensor([i if m else -100 for i, m in zip(ids, mask, strict=True)])
        hidden = decoder(input_ids=input_ids, attention_mask=attention).last_hidden_state
        # Token t + 1 is predicted at position t; only supervised targets go through the vocabulary head, most of a
        # step's cost with a large vocabulary (the loss is transformers' own: the mean over supervised tokens).
        targets = labels[:, 1:]
        supervised = targets != -100
        loss = torch.nn.functional.cross_entropy(head(hidden[:, :-1][supervised]).float(), targets[supervised])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % log_every == 0 or step == steps:
            print(f"step {step}/{steps} loss {loss.item():.3f} ({time.perf_counter() - started:.0f} s)", flush=True)
    model.eval()
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=Path, required=True, help="speculators-tokens rows (JSON lines)")
    parser.add_argument("--target", type=Path, default=REPO / ".cache" / "tiny-model")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    rows = read_rows(args.rows, args.max_len)
    supervised = sum(sum(mask) for _, mask in rows)
    print(f"{len(rows)} rows, {sum(len(ids) for ids, _ in rows)} tokens, {supervised} supervised", flush=True)
    model = train(rows, draft_config(args.target, args.layers), steps=args.steps, batch_size=args.batch_size,
                  lr=args.lr, seed=args.seed, log_every=max(1, args.steps // 8))
    if args.out.exists():
        shutil.rmtree(args.out)
    model.save_pretrained(args.out)
    for name in TOKENIZER_FILES:
        if (args.target / name).exists():
            shutil.copy2(args.target / name, args.out / name)
    (args.out / "draft-training.json").write_text(json.dumps(
        {"rows": str(args.rows), "row_count": len(rows), "supervised_tokens": supervised, **{
            key: value for key, value in vars(args).items() if key not in ("rows", "out", "target")}}, indent=2) + "\n")
    print(args.out)


if __name__ == "__main__":
    main()
