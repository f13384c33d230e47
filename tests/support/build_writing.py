"""A real second process holding a build's lock on a directory, as `corpus build` does while it writes there: what
publish, audit, vocab, export and eval must name instead of reading a corpus half replaced."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HOLD_BUILD_LOCK = """
import sys
from pathlib import Path
from corpus_builder.layout import build_lock
with build_lock(Path(sys.argv[1])):
    print("holding", flush=True)
    sys.stdin.read()
"""


@contextmanager
def build_writing(directory: Path) -> Iterator[subprocess.Popen[str]]:
    """A real second process holding the build's lock on ``directory`` until the block ends."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_BUILD_LOCK, str(directory)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n", holder.communicate()[0]
        yield holder
    finally:
        holder.communicate(timeout=30)  # closes its stdin: the holder lets go and exits
