"""Build a random EAGLE-3 head for a target (the tiny model) with speculators, for a vLLM server to speculate with.

speculators (0.9.0) lives in its own virtual environment (``scripts/speculators_env.sh``: its pins would replace
the project's torch), so the head is built by this file run as a script in that venv's interpreter: stdlib
imports only at module level. The head is speculators' own ``Eagle3DraftModel`` built from the target's config,
one decoder layer, full vocabulary, random weights drawn from ``seed``; vLLM (``{"method": "eagle3", "model":
HEAD}``) serves it as ``Eagle3Qwen3ForCausalLM``, sharing the target's embeddings and output layer.

speculators' default auxiliary layers (2, n/2, n-3) do not exist in a 2-layer target, and it refuses the head
until they are given: here every layer's output and the final hidden state (``[0, 1, 2]`` for the tiny model).
The saved config records the target by its absolute path (vLLM and speculators read the target's config there).

``build_eagle3_head(target_dir, out_dir)`` from Python; ``python -m corpus_builder.testing.eagle3_head TARGET
OUT_DIR`` from a shell.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPECULATORS_PYTHON = Path(os.environ.get("SPECULATORS_PYTHON") or REPO / ".venv-speculators" / "bin" / "python")
SEED = 1234
SPECULATIVE_TOKENS = 3
HEAD_LAYERS = 1
INSIDE = "--inside-speculators"


def build_eagle3_head(target_dir: Path, out_dir: Path, *, seed: int = SEED, python: Path = SPECULATORS_PYTHON) -> Path:
    """Build the head for ``target_dir`` into ``out_dir`` (replaced if present) with speculators run by ``python``;
    return ``out_dir``. Written to a sibling temporary directory and moved into place, so an interrupted build
    leaves nothing that looks complete. Raises FileNotFoundError when ``python`` does not exist and RuntimeError
    (with the tail of speculators' output) when the build fails."""
    if not Path(python).exists():
        raise FileNotFoundError(f"speculators is not installed ({python}): run scripts/speculators_env.sh")
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        command = [str(python), __file__, INSIDE, str(Path(target_dir).resolve()), str(staging), str(seed)]
        completed = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                                   timeout=600)
        if completed.returncode != 0:
            raise RuntimeError(f"speculators could not build an EAGLE-3 head for {target_dir} (exit "
                               f"{completed.returncode}):\n{completed.stderr[-3000:]}")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def _build_inside(target_dir: Path, out_dir: Path, seed: int) -> None:
    """Runs in the speculators venv."""
    import torch
    from speculators.models.eagle3.core import Eagle3DraftModel  # type: ignore[import-not-found]  # its own venv
    from transformers import AutoConfig

    torch.manual_seed(seed)
    layer_config = AutoConfig.from_pretrained(target_dir)
    target_layers = layer_config.num_hidden_layers
    layer_config.num_hidden_layers = HEAD_LAYERS
    if layer_config.layer_types:  # one attention type per layer, checked against the count where vLLM loads it
        layer_config.layer_types = layer_config.layer_types[:HEAD_LAYERS]
    head = Eagle3DraftModel.from_training_args(
        layer_config, verifier_name_or_path=str(target_dir), target_layer_ids=list(range(target_layers + 1)),
        draft_vocab_size=layer_config.vocab_size, norm_before_residual=True, ttt_steps=SPECULATIVE_TOKENS)
    head.save_pretrained(out_dir)


def main(argv: list[str]) -> int:
    if argv[:1] == [INSIDE]:  # build_eagle3_head's subprocess, in the speculators venv
        _build_inside(Path(argv[1]), Path(argv[2]), int(argv[3]))
        return 0
    if len(argv) != 2:
        print("usage: python -m corpus_builder.testing.eagle3_head TARGET_DIR OUT_DIR", file=sys.stderr)
        return 2
    print(build_eagle3_head(Path(argv[0]), Path(argv[1])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
