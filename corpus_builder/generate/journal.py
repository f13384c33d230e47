"""Append-only, crash-safe journal of finished generations: the source of truth for resume and rebuilds.

Layout: ``journal_dir/segment-NNNNNN.zst``, one segment per run, never appended to after the run ends.
A segment is a plain zstd stream (``zstd -dc`` reads it) made of pairs:

* a 12-byte zstd *skippable* frame whose 4-byte payload is the length of the data frame that follows
  (decoders skip it; it lets the loader jump from frame to frame without decompressing to find ends);
* a checksummed zstd data frame holding newline-terminated records ``{"k": "<hex key>", "v": {...}}``.

One frame is written per batch of finished generations (the scheduler writes after each batch of
completions), so a SIGKILL loses at most the batch being written; ``fsync`` runs at a bounded interval
(it only matters for power loss: data handed to ``write`` survives the death of the process). On load, a
short or corrupt final pair is ignored and the run continues in a NEW segment, never after garbage.

The in-memory index maps a 16-byte key to one packed int (segment, frame offset, frame length): about
180 bytes per cached generation whatever its size; records are read back from disk when asked for,
through a small cache of decompressed frames.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import mmap
import os
import struct
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path

import orjson
import zstandard

from ..errors import CorpusError

SEGMENT_GLOB = "segment-*.zst"
LOCK_NAME = "lock"
_SKIPPABLE_MAGIC = 0x184D2A5B  # one of the 16 zstd skippable-frame magics (0x184D2A50..5F)
_LENGTH_FRAME = struct.Struct("<III")  # magic, payload size (4), length of the next data frame
_KEY_PREFIX = b'{"k":"'
_KEY_SLICE = slice(len(_KEY_PREFIX), len(_KEY_PREFIX) + 32)  # the hex key at the start of every line
_OFFSET_BITS = 40  # frame offsets up to 1 TiB per segment
_LENGTH_BITS = 32
_FRAME_CACHE_SIZE = 64  # decompressed frames kept for lookups; replay in input order stays local
_MAX_FRAME_BYTES = 1 << 20  # a batch larger than this is split into several frames
DEFAULT_FSYNC_INTERVAL_S = 1.0


def turn_key(messages: Sequence[Mapping[str, object]], sampling: Mapping[str, object], *, model: str,
             revision: str | None, enable_thinking: bool, sample_index: int, conversation: str | None = None,
             tools: Mapping[str, object] | None = None) -> bytes:
    """What determines one generation: the exact request messages (regenerated history included), the
    sampling sent, the model and its revision, thinking mode, the sample index, the conversation it belongs
    to (its id; None when identical turns of different conversations share one generation) and the tools
    sent with it (``{"tools", "tool_choice"}``; None for a request without tools, whose key is what it was
    before tools existed). Never input order."""
    fields: list[object] = [model, revision, enable_thinking, sample_index, sampling, messages]
    if conversation is not None:
        fields.append(conversation)
    if tools is not None:
        fields.append(tools)  # a dict: never mistaken for the conversation id, a string
    payload = orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(payload, digest_size=16, person=b"corpus-turn").digest()


class Journal:
    """Use as a context manager: loads every segment, locks the directory, writes a new segment."""

    def __init__(self, directory: Path, *, fsync_interval_s: float = DEFAULT_FSYNC_INTERVAL_S) -> None:
        self.directory = Path(directory)
        self.fsync_interval_s = fsync_interval_s
        self._index: dict[bytes, int] = {}
        self._pending: dict[bytes, bytes] = {}  # written this batch, not yet in a frame
        self._segments: list[Path] = []
        self._read_fds: dict[int, int] = {}
        self._frames: OrderedDict[int, bytes] = OrderedDict()
        self._dctx = zstandard.ZstdDecompressor()
        self._cctx = zstandard.ZstdCompressor(level=3, write_checksum=True)
        self._lock_fd: int | None = None
        self._write_fd: int | None = None
        self._write_segment = -1
        self._write_offset = 0
        self._last_fsync = 0.0
        self._write_failed = False
        self.loaded_records = 0
        self.ignored_tail_bytes = 0  # bytes of a torn final frame ignored on load (0 when clean)

    # -- lifecycle ---------------------------------------------------------------------------------

    def __enter__(self) -> Journal:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise CorpusError(f"cannot create the journal directory: {error.strerror}",
                              file=str(self.directory)) from error
        self._lock_fd = os.open(self.directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as error:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise CorpusError("the generation journal is in use by another run",
                              file=str(self.directory)) from error
        # Numbered names sort by age; a key is written once (append skips keys already known).
        self._segments = sorted(self.directory.glob(SEGMENT_GLOB))
        for number, path in enumerate(self._segments):
            self._load_segment(number, path)

    def close(self) -> None:
        if self._lock_fd is not None and not self._write_failed:
            self.flush()
        if self._write_fd is not None:  # a segment exists only once something was written
            with contextlib.suppress(OSError):  # a failed write was reported already; the data is whole
                os.fsync(self._write_fd)
            os.close(self._write_fd)
            self._write_fd = None
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()
        self._frames.clear()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    # -- reading -----------------------------------------------------------------------------------

    def _load_segment(self, number: int, path: Path) -> None:
        size = path.stat().st_size
        if size == 0:
            return
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            offset = self._index_frames(number, data, size)
        self.ignored_tail_bytes += size - offset

    def _index_frames(self, number: int, data: mmap.mmap, size: int) -> int:
        """Index every whole frame of one segment; returns where the intact part ends."""
        offset = 0
        while offset < size:
            header_end = offset + _LENGTH_FRAME.size
            if header_end > size:
                break
            magic, payload_size, length = _LENGTH_FRAME.unpack_from(data, offset)
            if magic != _SKIPPABLE_MAGIC or payload_size != 4 or header_end + length > size:
                break
            try:
                frame = self._dctx.decompress(data[header_end:header_end + length])
            except zstandard.ZstdError:
                break
            location = (number << (_OFFSET_BITS + _LENGTH_BITS)) | (header_end << _LENGTH_BITS) | length
            for line in frame.splitlines():
                self._index[bytes.fromhex(line[_KEY_SLICE].decode())] = location
                self.loaded_records += 1
            offset = header_end + length
        return offset

    def __len__(self) -> int:
        return len(self._index) + len(self._pending)

    def __contains__(self, key: bytes) -> bool:
        return key in self._index or key in self._pending

    def get(self, key: bytes) -> dict[str, object] | None:
        """The record stored under ``key``, or None."""
        location = self._index.get(key)
        if location is None:
            line = self._pending.get(key)
            return None if line is None else _record(line)
        frame = self._read_frame(location)
        start = frame.find(_KEY_PREFIX + key.hex().encode())
        return _record(frame[start:frame.index(b"\n", start)])

    def _read_frame(self, location: int) -> bytes:
        frame = self._frames.get(location)
        if frame is not None:
            self._frames.move_to_end(location)
            return frame
        number = location >> (_OFFSET_BITS + _LENGTH_BITS)
        offset = (location >> _LENGTH_BITS) & ((1 << _OFFSET_BITS) - 1)
        length = location & ((1 << _LENGTH_BITS) - 1)
        fd = self._read_fds.get(number)
        if fd is None:
            fd = self._read_fds[number] = os.open(self._segments[number], os.O_RDONLY)
        frame = self._dctx.decompress(os.pread(fd, length, offset))
        self._frames[location] = frame
        if len(self._frames) > _FRAME_CACHE_SIZE:
            self._frames.popitem(last=False)
        return frame

    # -- writing -----------------------------------------------------------------------------------

    def append(self, key: bytes, record: dict[str, object]) -> None:
        """Buffer one record; it reaches the disk at the next ``flush`` (call it once per batch)."""
        if key in self._index or key in self._pending:
            return  # the same generation finished twice in one run (duplicate prompts): keep the first
        self._pending[key] = b"".join((_KEY_PREFIX, key.hex().encode(), b'","v":', orjson.dumps(record),
                                       b"}\n"))

    def flush(self) -> None:
        """Write the buffered records as one frame (or a few, for a very large batch)."""
        if not self._pending or self._write_failed:
            return
        fd = self._write_fd if self._write_fd is not None else self._start_segment()
        batch: list[tuple[bytes, bytes]] = []
        size = 0
        for item in self._pending.items():
            batch.append(item)
            size += len(item[1])
            if size >= _MAX_FRAME_BYTES:
                self._write_frame(fd, batch)
                batch, size = [], 0
        if batch:
            self._write_frame(fd, batch)
        self._pending.clear()
        now = time.monotonic()
        if now - self._last_fsync >= self.fsync_interval_s:
            try:
                os.fsync(fd)
            except OSError as error:
                raise self._write_error(error) from error
            self._last_fsync = now

    def _write_all(self, fd: int, data: bytes) -> None:
        """Every byte or an error: a short write (a full disk) is continued, a failed one is cut back so the
        segment ends on its last complete frame, and the run stops with CorpusError."""
        written = 0
        try:
            while written < len(data):
                count = os.write(fd, data[written:])
                if count <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                written += count
        except OSError as error:
            self._write_failed = True  # nothing more is written this run: the rows built on it were not yielded
            with contextlib.suppress(OSError):  # if even this fails, the loader ignores the torn tail
                os.ftruncate(fd, self._write_offset)
            raise self._write_error(error, "; it stays valid up to the last finished generation") from error

    def _write_error(self, error: OSError, state: str = "") -> CorpusError:
        """The error that stops the run when the segment being written fails; ``state``: what is left of it."""
        return CorpusError(f"cannot write the journal: {error.strerror or error}{state}: fix this and rerun to resume",
                           file=str(self._segments[self._write_segment]))

    def _start_segment(self) -> int:
        last = int(self._segments[-1].stem.split("-")[1]) if self._segments else 0
        path = self.directory / f"segment-{last + 1:06d}.zst"
        self._write_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._segments.append(path)
        self._write_segment = len(self._segments) - 1
        self._write_offset = 0
        self._last_fsync = time.monotonic()
        return self._write_fd

    def _write_frame(self, fd: int, batch: list[tuple[bytes, bytes]]) -> None:
        frame = self._cctx.compress(b"".join(line for _, line in batch))
        header = _LENGTH_FRAME.pack(_SKIPPABLE_MAGIC, 4, len(frame))
        self._write_all(fd, header + frame)
        data_offset = self._write_offset + len(header)
        location = ((self._write_segment << (_OFFSET_BITS + _LENGTH_BITS)) | (data_offset << _LENGTH_BITS)
                    | len(frame))
        for key, _ in batch:
            self._index[key] = location
        self._write_offset = data_offset + len(frame)


def _record(line: bytes) -> dict[str, object]:
    """The value of one journal line ``{"k": key, "v": record}``."""
    record: dict[str, object] = orjson.loads(line)["v"]
    return record
