"""Paths a command writes, checked before anything is written.

Every output path (``audit --html``, ``export --out``, ``vocab --out``, ...) goes through one guard: it must
name a place the user can write, it must not be anything the same run reads, and it must not fall inside a
built corpus (writing there would corrupt the corpus: its manifest, shards or ledger). Each refusal is a
``CorpusError`` naming the path, so the CLI exits 2 with nothing written. ``staged`` then writes a file so
that it appears complete or not at all.
"""

from __future__ import annotations

import glob
import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from .errors import CorpusError
from .layout import holds_corpus


def _resolved(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _input_paths(inputs: Iterable[Path | str | None]) -> list[Path]:
    """The real paths a run reads: globs expanded, Hub references (``hf://``) and missing paths left out."""
    paths = []
    for given in inputs:
        if given is None or str(given).startswith("hf://"):
            continue
        text = str(given)
        matches = glob.glob(text, recursive=True) if glob.has_magic(text) else [text]
        paths += [_resolved(Path(match)) for match in matches if os.path.lexists(match)]
    return paths


def enclosing_corpus(path: Path) -> Path | None:
    """The built corpus directory that holds ``path`` (or is it), if any: one with its manifest, or one a build is
    writing (``layout.holds_corpus``)."""
    for directory in (path, *path.parents):
        if holds_corpus(directory):
            return directory
    return None


def _within(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


def check_output_path(path: Path | str, *, what: str, inputs: Iterable[Path | str | None] = (),
                      directory: bool = False, rebuilds_corpus: bool = False) -> Path:
    """``path`` as given, once it is safe to write: a regular file (or, with ``directory``, a directory) or
    nothing yet, in an existing writable directory, not one of ``inputs`` nor inside one, and not inside a
    built corpus. ``what`` names the option in the messages (e.g. "--html"). With ``rebuilds_corpus`` (the
    build's output directory) the path may be a built corpus's own directory: the build replaces that corpus."""
    text = str(path)
    if not text.strip():
        raise CorpusError(f"{what}: the output path is empty")
    if "\0" in text:
        raise CorpusError(f"{what}: the output path contains a NUL byte", file=repr(text))
    given = Path(text)
    # "missing/../x" names x, but creating it would make "missing" first: refuse what no directory backs
    for index, part in enumerate(given.parts):
        if part == ".." and not Path(*given.parts[:index]).is_dir():
            raise CorpusError(f"{what}: '..' after {Path(*given.parts[:index])}, which is not a directory", file=text)
    kind = "directory" if directory else "file"
    if os.path.lexists(given):
        mode = os.stat(given).st_mode if given.exists() else 0
        if directory and not stat.S_ISDIR(mode):
            raise CorpusError(f"{what}: exists and is not a directory", file=text)
        if not directory and not stat.S_ISREG(mode):
            found = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise CorpusError(f"{what}: {found}; give the path of a {kind} to write", file=text)
    target = _resolved(given)
    corpus = enclosing_corpus(target)
    if corpus is not None and not (rebuilds_corpus and corpus == target):
        raise CorpusError(f"{what}: inside the built corpus {corpus}; writing there would corrupt it: "
                          f"choose a path outside it", file=text)
    for source in _input_paths(inputs):
        if _within(target, source):
            raise CorpusError(f"{what}: this run reads {source}; writing there would overwrite its input",
                              file=text)
    parent = target if directory and target.is_dir() else target.parent
    existing = next((p for p in (parent, *parent.parents) if p.exists()), None)
    if existing is None or not existing.is_dir():
        raise CorpusError(f"{what}: {existing} is not a directory", file=text)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise CorpusError(f"{what}: {existing} is not writable", file=text)
    if not directory and existing != parent:
        raise CorpusError(f"{what}: the directory {parent} does not exist", file=text)
    return given


@contextmanager
def staged(path: Path) -> Iterator[Path]:
    """Where to write ``path``: a partial file beside it, renamed to ``path`` when the block succeeds and removed
    when it fails, so ``path`` is complete or untouched. An OSError becomes a CorpusError naming ``path``."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.unlink(missing_ok=True)  # a stale partial (or a link left there) is never written through
        yield partial
        os.replace(partial, path)
    except BaseException as error:
        with suppress(OSError):
            partial.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise CorpusError(f"cannot write: {error.strerror or error}", file=str(path)) from error
        raise


@contextmanager
def made_directory(path: Path) -> Iterator[Path]:
    """``path`` made (with its missing parents) for the block that writes into it; when the block fails, the
    directories made for it are removed again (deepest first; one that holds anything else stays), so a failed
    write leaves no empty directory behind. An OSError making it becomes a CorpusError naming ``path``."""
    made = [directory for directory in (path, *path.parents) if not directory.exists()]
    try:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise CorpusError(f"cannot create the directory: {error.strerror or error}", file=str(path)) from error
        yield path
    except BaseException:
        for directory in made:
            with suppress(OSError):
                directory.rmdir()
        raise
