"""corpus_builder.testing.processes: what a command under test started and left running, whatever else runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from corpus_builder.testing.processes import kill_all, watched

LOOKS_LIKE_VLLM = ("vllm.entrypoints.openai.api_server", "--model", "tiny")


def parent_script(tmp_path: Path, *, stops_its_server: bool) -> list[str]:
    """A command that starts a long-running 'server' in a session of its own (as the launcher does), lets it
    run a second, then exits, stopping it first or not."""
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import subprocess, sys, time
        server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *{LOOKS_LIKE_VLLM!r}],
                                  start_new_session=True)
        time.sleep(1.0)
        if {stops_its_server!r}:
            server.kill()
            server.wait()
    """))
    return [sys.executable, str(script)]


@pytest.mark.parametrize("stops_its_server", [True, False], ids=["stops", "leaks"])
def test_only_what_the_command_started_counts_as_left_behind(tmp_path: Path, stops_its_server: bool) -> None:
    parent = subprocess.Popen(parent_script(tmp_path, stops_its_server=stops_its_server))
    # Started after the command, with a vLLM-like command line, and running when it ends: not its.
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *LOOKS_LIKE_VLLM])
    try:
        with watched(parent) as tree:
            assert parent.wait(timeout=60) == 0
        left = tree.alive()
        assert decoy.poll() is None
        assert decoy.pid not in {process.pid for process in tree.seen}
        assert [" ".join(LOOKS_LIKE_VLLM) in tree.seen[process] for process in left] == ([] if stops_its_server
                                                                                          else [True])
    finally:
        decoy.kill()
        decoy.wait()
        kill_all(tree.alive())
