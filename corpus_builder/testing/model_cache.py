"""Model directories built once into a cache, for the tests, the benchmarks and the quickstart.

A builder writes into a sibling staging directory that replaces the model directory whole at the end
(``replaced_whole``), so an interrupted build never leaves a directory that looks complete; and a model is
built under a lock beside its directory (``ensure_built``), so two processes (two pytest workers, a benchmark)
never build into it at once or see a half-replaced one. A marker file written last records the builder's own
hash (``source_hash``): a cached model is valid only for the builder version that wrote it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def source_hash(module_file: str) -> str:
    """Hash of a builder's source file."""
    return hashlib.sha256(Path(module_file).read_bytes()).hexdigest()


def read_marker(model_dir: Path, name: str) -> dict[str, object] | None:
    """The marker ``name`` in ``model_dir`` as a JSON object, or None when it is missing or unreadable."""
    try:
        marker = json.loads((model_dir / name).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


@contextmanager
def replaced_whole(out_dir: Path) -> Iterator[Path]:
    """A staging directory beside ``out_dir``; when the block ends without an error it replaces ``out_dir``."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        yield staging
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def ensure_built(model_dir: Path, is_current: Callable[[Path], bool], build: Callable[[Path], object]) -> Path:
    """``model_dir``, built by ``build`` unless ``is_current`` says a valid build is there; under a lock file
    beside it."""
    import fcntl

    model_dir = Path(model_dir)
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(model_dir.parent / f"{model_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_current(model_dir):
            build(model_dir)
    return model_dir
