"""The on-disk corpus: its file names, and reading a built corpus from its files (never from the pipeline's memory).

Layout of a corpus directory::

    data/{split}-{i:05d}-of-{n:05d}.parquet   the rows (schemas/conversation.schema.json)
    manifest.json                             written LAST: a corpus without it is incomplete
    audit.json                                statistics recomputed from the shards and the ledger
    recipe.yaml                               the resolved recipe it was built from
    ledger.jsonl.zst                          every dropped or skipped row with its reason
    journal/                                  cached generations (only when prompt sources were generated)
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from .errors import CorpusError, DropCounts
from .records import Conversation

MANIFEST = "manifest.json"
AUDIT = "audit.json"
RECIPE = "recipe.yaml"
LEDGER = "ledger.jsonl.zst"
DATA = "data"
JOURNAL = "journal"
CORPUS_FILES = (DATA, AUDIT, RECIPE, LEDGER, MANIFEST)
FORMAT_VERSION = 1
BUILD_LOCK = ".build.lock"  # flock held by the one build writing the directory, its pid inside


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_json(path: Path, value: Any) -> None:
    """The corpus's JSON files: indented, keys sorted, so the same content gives the same bytes."""
    path.write_bytes(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")


def _flock_now(fd: int, operation: int) -> bool:
    """Take the flock ``operation`` without waiting: False when another process holds a conflicting one."""
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _lock_holder(fd: int) -> str:
    return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"


@contextmanager
def build_lock(directory: Path) -> Iterator[None]:
    """Hold ``directory`` (created if needed) for one build, exclusively: a second build refuses at once."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / BUILD_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    if not _flock_now(fd, fcntl.LOCK_EX):
        holder = _lock_holder(fd)
        os.close(fd)
        raise CorpusError(f"another corpus build (pid {holder}) is writing to this directory: wait for it to "
                          "finish or build into another --out", file=str(directory))
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)  # releases the lock


def writing_build(directory: Path) -> str | None:
    """The pid ("unknown" until it is written) of the build writing ``directory`` now, or None when none is.
    A shared probe of the build's lock, let go at once: a reader never holds a build up."""
    try:
        fd = os.open(directory / BUILD_LOCK, os.O_RDONLY)
    except OSError:  # no lock file (no build ever wrote here) or no directory: nothing is writing
        return None
    try:
        return None if _flock_now(fd, fcntl.LOCK_SH) else _lock_holder(fd)
    finally:
        os.close(fd)


def iter_ledger(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a ledger file, streamed."""
    import zstandard

    with path.open("rb") as handle, zstandard.ZstdDecompressor().stream_reader(handle) as reader:
        buffer = b""
        while chunk := reader.read(1 << 16):
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line:
                    yield orjson.loads(line)


def open_parquet(path: Path) -> Any:
    """A parquet file opened to be streamed batch by batch (a ``pyarrow.parquet.ParquetFile``); the caller
    turns pyarrow's errors into its own message.

    Without pre-buffering: pyarrow's pre-buffered reader keeps every row group it has read, so memory would
    grow with the file.
    """
    import pyarrow.parquet as pq

    return pq.ParquetFile(path, pre_buffer=False)


def _read_json(path: Path) -> Any:
    try:
        return orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise CorpusError("file is missing", file=str(path)) from None
    except orjson.JSONDecodeError as error:
        raise CorpusError(f"not valid JSON: {error}", file=str(path)) from None


@dataclass(frozen=True)
class Corpus:
    root: Path
    manifest: dict[str, Any]

    @classmethod
    def open(cls, root: Path) -> Corpus:
        root = Path(root)
        if not root.exists():
            raise CorpusError("no such file or directory", file=str(root))
        if not root.is_dir():
            raise CorpusError("not a corpus directory (a built corpus is a directory with manifest.json)",
                              file=str(root))
        if not (root / MANIFEST).exists():
            raise CorpusError("not a complete corpus: manifest.json is missing (interrupted or failed build?)",
                              file=str(root))
        manifest = _read_json(root / MANIFEST)
        if not isinstance(manifest, dict):
            raise CorpusError("not a corpus manifest: the file holds no JSON object", file=str(root / MANIFEST))
        if manifest.get("format_version") != FORMAT_VERSION:
            raise CorpusError(f"unsupported corpus format_version {manifest.get('format_version')!r}",
                              file=str(root / MANIFEST))
        return cls(root, manifest)

    @property
    def files(self) -> list[dict[str, Any]]:
        return list(self.manifest["files"])

    def shard_paths(self, split: str | None = None) -> list[Path]:
        return [self.root / f["path"] for f in self.files if split is None or f["split"] == split]

    def iter_batches(self, *, split: str | None = None, columns: list[str] | None = None,
                     batch_size: int = 4096) -> Iterator[Any]:
        for path in self.shard_paths(split):
            try:
                parquet = open_parquet(path)
            except (OSError, ValueError) as error:
                raise CorpusError(f"cannot read shard: {error}", file=str(path)) from None
            yield from parquet.iter_batches(batch_size=batch_size, columns=columns)

    def iter_conversations(self, *, split: str | None = None) -> Iterator[Conversation]:
        from .rows import batch_to_conversations

        for batch in self.iter_batches(split=split):
            yield from batch_to_conversations(batch)

    def audit(self) -> dict[str, Any]:
        audit: dict[str, Any] = _read_json(self.root / AUDIT)
        return audit

    def ledger_drops(self) -> DropCounts:
        """Drops by reason and source, counted from the ledger; a published copy has no ledger (it lists local
        file locations), so there the counts recorded in audit.json stand in."""
        path = self.root / LEDGER
        if not path.exists():
            if (self.root / AUDIT).exists():
                return DropCounts.from_report(self.audit())
            raise CorpusError("ledger is missing", file=str(path))
        drops = DropCounts()
        for record in iter_ledger(path):
            drops.add(record["source"], record["reason"], record.get("detail") or "")
        return drops

    def verify_files(self) -> list[str]:
        """Every shard present with the manifest's size, sha256 and row count; no extra shards."""
        import pyarrow.parquet as pq

        problems = []
        listed = {f["path"] for f in self.files}
        data_dir = self.root / DATA
        present = {f"{DATA}/{p.name}" for p in data_dir.glob("*.parquet")} if data_dir.is_dir() else set()
        problems += [f"{path}: shard not listed in manifest.json" for path in sorted(present - listed)]
        for entry in self.files:
            path = self.root / entry["path"]
            if not path.exists():
                problems.append(f"{entry['path']}: shard listed in manifest.json is missing")
                continue
            if path.stat().st_size != entry["bytes"]:
                problems.append(f"{entry['path']}: size {path.stat().st_size} != manifest {entry['bytes']}")
            try:
                if file_sha256(path) != entry["sha256"]:
                    problems.append(f"{entry['path']}: sha256 does not match manifest.json")
                    continue
                rows = pq.ParquetFile(path).metadata.num_rows
            except (OSError, ValueError) as error:  # a directory, an unreadable file, bytes that are not parquet
                problems.append(f"{entry['path']}: cannot read shard: {error}")
                continue
            if rows != entry["rows"]:
                problems.append(f"{entry['path']}: {rows} rows != manifest {entry['rows']}")
        return problems
