"""The on-disk corpus: its file names, and reading a built corpus from its files (never from the pipeline's memory).

``LAYOUT`` lists every entry of a corpus directory and what it holds (the documentation's layout reference is
written from it): the shards ``data/{split}-{i:05d}-of-{n:05d}.parquet``, then ``manifest.json`` written LAST (a
corpus without it is incomplete), ``audit.json``, ``recipe.yaml``, ``ledger.jsonl.zst``, the eval pack and the journal.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from .errors import CorpusError, DropCounts
from .records import Conversation

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

T = TypeVar("T")

MANIFEST = "manifest.json"
AUDIT = "audit.json"
RECIPE = "recipe.yaml"
LEDGER = "ledger.jsonl.zst"
DATA = "data"
JOURNAL = "journal"
EVAL = "eval"  # the eval pack's shards, and its split's name
CORPUS_FILES = (DATA, AUDIT, RECIPE, LEDGER, EVAL, MANIFEST)
FORMAT_VERSION = 1
SHARD_NAME = "{split}-{index:05d}-of-{count:05d}.parquet"  # a shard's name in data/ (in eval/ the split is "eval")

# Every entry of a corpus directory, in the order a reader meets them, and what it holds.
LAYOUT: tuple[tuple[str, str], ...] = (
    (f"{DATA}/{SHARD_NAME}", "the rows, one conversation each (schemas/conversation.schema.json; `provenance` and "
                             "`tools` as JSON text), zstd-compressed parquet, `output.rows_per_shard` rows a shard"),
    (MANIFEST, "written last, so a directory without it is not a complete corpus: the format version, the tool's "
               "version, the recipe's sha256, rows per split, each shard's rows, bytes and sha256, the checks' "
               "results, and what some builds add (dedup, decontamination, the declared mixture and any shortfall, an "
               "accepted partial generation, the targets that generated rows, the eval pack)"),
    (AUDIT, "the statistics of exactly the rows written (`corpus audit --json` prints the same): thinking share "
            "overall and by source, split and origin, drops by reason and source, flags, lengths in target tokens, "
            "the served-ids check"),
    (RECIPE, "the recipe the corpus was built from, resolved (every default filled in)"),
    (LEDGER, "every row skipped or dropped, one JSON object a line: source, reason, location (file:line or "
             "file#row), detail, id"),
    (f"{EVAL}/{SHARD_NAME.replace('{split}', EVAL)}",
     "the eval pack held out of the replay sources (only when the recipe has `eval`); `corpus eval CORPUS` replays "
     "it; never uploaded by `corpus publish`"),
    (f"{JOURNAL}/", "the generations, keyed by everything that decides them (only when prompt sources were "
                    "generated): kept across rebuilds, so a rebuild or a resumed build asks the server only for what "
                    "is missing"),
)
BUILD_LOCK = ".build.lock"  # flock held by the one build writing the directory, its pid inside


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """One shard as the manifest lists it."""

    path: str  # relative to the corpus directory, e.g. data/train-00000-of-00002.parquet
    split: str
    rows: int
    bytes: int
    sha256: str

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "split": self.split, "rows": self.rows, "bytes": self.bytes,
                "sha256": self.sha256}


@dataclass(frozen=True, slots=True)
class SplitCount:
    rows: int
    shards: int


# The manifest's sections that only some builds write, each a JSON object or list as the build describes it.
_SECTIONS: dict[str, type] = {"dedup": dict, "decontamination": dict, "mixture": dict, "short": list,
                              "partial": dict, "targets": list, "eval": dict}
_FIELDS = ("format_version", "tool", "name", "recipe_sha256", "conversations", "splits", "files",
           "thinking_conversations", "checks")


@dataclass
class Manifest:
    """``manifest.json``, typed: what a build wrote (its shards, split counts, conversations) and how (the corpus
    checks, and the sections some builds add: dedup and decontamination, the declared mixture and its
    shortfalls, an accepted partial generation, the targets that generated rows). A build writes every field;
    ``from_json`` needs the format version and the shards only (the rest defaults, the count to the shards'
    rows) and checks every field it reads, so a hand-edited or foreign manifest is refused naming the key;
    ``to_json`` writes it."""

    files: list[ShardInfo]
    conversations: int
    name: str | None = None
    recipe_sha256: str | None = None
    thinking_conversations: int | None = None
    splits: dict[str, SplitCount] = field(default_factory=dict)
    checks: dict[str, Any] = field(default_factory=dict)
    tool: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    sections: dict[str, Any] = field(default_factory=dict)  # the optional sections present (and unknown keys)
    pack_files: list[ShardInfo] = field(default_factory=list)  # the eval pack's shards (the eval section's files)

    def section(self, key: str) -> Any:
        """An optional section (``_SECTIONS``), or None when the build did not write it."""
        return self.sections.get(key)

    def to_json(self) -> dict[str, Any]:
        return {"format_version": self.format_version, "tool": self.tool, "name": self.name,
                "recipe_sha256": self.recipe_sha256, "conversations": self.conversations,
                "splits": {split: {"rows": count.rows, "shards": count.shards} for split, count in self.splits.items()},
                "files": [info.to_dict() for info in self.files], "thinking_conversations": self.thinking_conversations,
                "checks": self.checks, **self.sections}

    @classmethod
    def from_json(cls, document: object, file: str) -> Manifest:
        def fail(key: str, problem: str) -> CorpusError:
            return CorpusError(f"not a corpus manifest: {key} {problem}", file=file)

        def typed(value: object, kind: type[T], key: str, what: str) -> T:
            # bool is an int to Python, never a count or a name in a manifest
            if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
                raise fail(key, f"is not {what}")  # never the value: a hand edit may have put anything there
            return value

        def count(value: object, key: str) -> int:
            number = typed(value, int, key, "a count")
            if number < 0:
                raise fail(key, "is negative, not a count")
            return number

        if not isinstance(document, dict):
            raise CorpusError("not a corpus manifest: the file holds no JSON object", file=file)
        if document.get("format_version") != FORMAT_VERSION:
            raise CorpusError(f"unsupported corpus format_version {document.get('format_version')!r}", file=file)
        def shards(value: object, key: str) -> list[ShardInfo]:
            files = []
            for i, entry in enumerate(typed(value, list, key, "a list of shards")):
                where = f"{key}[{i}]"
                typed(entry, dict, where, "a shard entry")
                for name in ("path", "split", "sha256"):
                    typed(entry.get(name), str, f"{where}.{name}", "a string")
                files.append(ShardInfo(entry["path"], entry["split"], count(entry.get("rows"), f"{where}.rows"),
                                       count(entry.get("bytes"), f"{where}.bytes"), entry["sha256"]))
            return files

        if "files" not in document:
            raise fail("files", "is missing")
        files = shards(document["files"], "files")
        splits = {}
        for split, entry in typed(document.get("splits", {}), dict, "splits", "a mapping of splits").items():
            typed(entry, dict, f"splits.{split}", "a mapping of rows and shards")
            splits[split] = SplitCount(count(entry.get("rows"), f"splits.{split}.rows"),
                                       count(entry.get("shards"), f"splits.{split}.shards"))
        # Keys of neither kind (a later version's, a hand edit's) are kept as they are: the publish gate scans them.
        sections = {key: value for key, value in document.items() if key not in _FIELDS}
        for key, kind in _SECTIONS.items():
            if key in sections:
                typed(sections[key], kind, key, "a JSON object" if kind is dict else "a list")
        def optional(key: str, kind: type[T], what: str) -> T | None:
            return typed(document[key], kind, key, what) if document.get(key) is not None else None

        thinking = document.get("thinking_conversations")
        pack = sections.get("eval")
        return cls(files, count(document.get("conversations", sum(info.rows for info in files)), "conversations"),
                   optional("name", str, "a string"), optional("recipe_sha256", str, "a string"),
                   count(thinking, "thinking_conversations") if thinking is not None else None, splits,
                   optional("checks", dict, "a JSON object") or {}, optional("tool", dict, "a JSON object") or {},
                   FORMAT_VERSION, sections, shards(pack.get("files", []), "eval.files") if pack is not None else [])


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_json(path: Path, value: object) -> None:
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
    """The pid ("unknown" until it is written) of the build writing ``directory`` now, or None when none is (or
    when it is this process's: a build reads what it wrote, for its exports). A shared probe of the build's lock,
    let go at once: a reader never holds a build up."""
    try:
        fd = os.open(directory / BUILD_LOCK, os.O_RDONLY)
    except OSError:  # no lock file (no build ever wrote here) or no directory: nothing is writing
        return None
    try:
        if _flock_now(fd, fcntl.LOCK_SH):
            return None
        holder = _lock_holder(fd)
        return None if holder == str(os.getpid()) else holder
    finally:
        os.close(fd)


class BuildRunning(CorpusError):
    """A build is writing the directory a command reads: its files come and go (the manifest last), so what is read
    may be half the old corpus and half the new one, or look broken. The build is named, not the corpus."""

    def __init__(self, directory: Path, pid: str) -> None:
        super().__init__(f"a build is writing {directory} now (pid {pid}); wait for it to finish, then run the "
                         "command again")


def check_no_build(directory: Path) -> None:
    """Refuse a directory a build is writing now (``BuildRunning``): every command that reads a corpus asks first
    (``Corpus.open``), and again when a read fails (the build may have started meanwhile)."""
    pid = writing_build(directory)
    if pid is not None:
        raise BuildRunning(directory, pid)


@contextmanager
def no_build_writing(directory: Path) -> Iterator[None]:
    """``check_no_build`` before the block, and for any CorpusError the block raises: a build that started while
    the block read the directory is named instead of the damage it did."""
    check_no_build(directory)
    try:
        yield
    except CorpusError as error:
        if not isinstance(error, BuildRunning) and (pid := writing_build(directory)) is not None:
            raise BuildRunning(directory, pid) from error
        raise


def holds_corpus(directory: Path) -> bool:
    """Whether ``directory`` is a built corpus, or one a build is writing (whose manifest may not be there yet:
    ``Corpus.open`` names the build)."""
    return (directory / MANIFEST).is_file() or writing_build(directory) is not None


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


def open_parquet(path: Path) -> pq.ParquetFile:
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


def _shard_batches(root: Path, shards: list[ShardInfo], what: str, columns: list[str] | None,
                   batch_size: int) -> Iterator[pa.RecordBatch]:
    """The batches of a corpus's parquet shards in turn, each shard checked first against the manifest (its size and
    sha256: a flipped byte may decode to other text without any error); a shard that differs, or cannot be opened
    or read, is a CorpusError naming it (or the build writing the corpus now, which explains it)."""
    import pyarrow

    with no_build_writing(root):
        for shard in shards:
            path = root / shard.path
            _check_shard(path, shard, what)
            try:
                yield from open_parquet(path).iter_batches(batch_size=batch_size, columns=columns)
            except (pyarrow.ArrowException, OSError, ValueError) as error:  # ValueError: a string that is not UTF-8
                raise CorpusError(f"cannot read {what}: {error}", file=str(path)) from None


def _check_shard(path: Path, shard: ShardInfo, what: str) -> None:
    try:
        size = path.stat().st_size
        same = size == shard.bytes and file_sha256(path) == shard.sha256
    except OSError as error:
        raise CorpusError(f"cannot read {what}: {error.strerror or error}", file=str(path)) from None
    if not same:
        changed = f"{size:,} bytes, not the {shard.bytes:,} of manifest.json" if size != shard.bytes \
            else "its sha256 is not manifest.json's"
        raise CorpusError(f"the {what} was changed or damaged since the build ({changed}): restore it, or build the "
                          "corpus again (generations are reused from its journal)", file=str(path))


@dataclass(frozen=True)
class Corpus:
    root: Path
    manifest: Manifest

    @classmethod
    def open(cls, root: Path) -> Corpus:
        root = Path(root)
        if not root.exists():
            raise CorpusError("no such file or directory", file=str(root))
        if not root.is_dir():
            raise CorpusError("not a corpus directory (a built corpus is a directory with manifest.json)",
                              file=str(root))
        check_no_build(root)
        if not (root / MANIFEST).exists():
            raise CorpusError("not a complete corpus: manifest.json is missing (interrupted or failed build?)",
                              file=str(root))
        manifest = Manifest.from_json(_read_json(root / MANIFEST), str(root / MANIFEST))
        return cls(root, manifest)

    @property
    def files(self) -> list[ShardInfo]:
        return list(self.manifest.files)

    def iter_batches(self, *, split: str | None = None, columns: list[str] | None = None,
                     batch_size: int = 4096) -> Iterator[pa.RecordBatch]:
        shards = [info for info in self.files if split is None or info.split == split]
        yield from _shard_batches(self.root, shards, "shard", columns, batch_size)

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

    def pack_conversations(self) -> Iterator[Conversation]:
        """The eval pack's rows, as the build wrote them (none when the corpus has no pack)."""
        from .rows import batch_to_conversations

        for batch in _shard_batches(self.root, self.manifest.pack_files, "eval pack shard", None, 4096):
            yield from batch_to_conversations(batch)

    def verify_files(self) -> list[str]:
        """Every shard (the eval pack's too) present with the manifest's size, sha256 and row count; no extra
        shards."""
        import pyarrow.parquet as pq

        problems = []
        entries = [*self.files, *self.manifest.pack_files]
        listed = {f.path for f in entries}
        present = {f"{directory}/{p.name}" for directory in (DATA, EVAL) if (self.root / directory).is_dir()
                   for p in (self.root / directory).glob("*.parquet")}
        problems += [f"{path}: shard not listed in manifest.json" for path in sorted(present - listed)]
        for entry in entries:
            path = self.root / entry.path
            if not path.exists():
                problems.append(f"{entry.path}: shard listed in manifest.json is missing")
                continue
            if path.stat().st_size != entry.bytes:
                problems.append(f"{entry.path}: size {path.stat().st_size} != manifest {entry.bytes}")
            try:
                if file_sha256(path) != entry.sha256:
                    problems.append(f"{entry.path}: sha256 does not match manifest.json")
                    continue
                rows = pq.ParquetFile(path).metadata.num_rows
            except (OSError, ValueError) as error:  # a directory, an unreadable file, bytes that are not parquet
                problems.append(f"{entry.path}: cannot read shard: {error}")
                continue
            if rows != entry.rows:
                problems.append(f"{entry.path}: {rows} rows != manifest {entry.rows}")
        return problems
