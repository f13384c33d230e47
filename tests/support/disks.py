"""A real small disk for the tests that fill one: a tmpfs mounted for the test. Mounting needs root; where it
cannot mount the test is skipped, and under CI that fails it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """``mount`` (made here) as a tmpfs of ``size`` (e.g. "6m") for the block, unmounted after it."""
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True)
    if mounted.returncode != 0:
        reason = f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}"
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def grow(mount: Path, size: str = "256m") -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mount)], check=True)
