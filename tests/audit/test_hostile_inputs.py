"""`corpus audit` on hostile input (issue 18): options that can never fail, output paths that would destroy an
input, traffic with no readable rows, and the traffic reader taking exactly the rows the plain audit takes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def corpus_cli(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corpus_builder", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd)


@pytest.mark.parametrize("option", ["--min-thinking-share", "--max-divergence"])
@pytest.mark.parametrize("value", ["nan", "NaN", "-nan"])
def test_a_share_option_of_nan_is_refused(tmp_path: Path, option: str, value: str) -> None:
    """nan passes every range check and fails no comparison: as a limit it could never fail."""
    completed = corpus_cli("audit", tmp_path / "corpus", "--against", tmp_path / "traffic.jsonl", option, value)
    assert completed.returncode == 2, completed.stderr
    assert option in completed.stderr and "not a number from 0 to 1" in completed.stderr
    assert "Traceback" not in completed.stderr
