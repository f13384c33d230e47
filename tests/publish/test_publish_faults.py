"""Trial 5: publishing through a Hub that drops connections (preupload, commit, reads), answers 412 and 429,
and races another writer. Every seeded fault schedule ends, after retries and re-runs of the same command
(as many as its faults can cause), in exactly ONE commit of the corpus whose read-back matches it, and the
token is in no request but its Authorization header, no log line, card, commit message, error or file.

The fast variant runs a few schedules; the long one runs as many as CORPUS_PUBLISH_TRIALS says and prints
the outcome counts (RELIABILITY.md):

    CORPUS_PUBLISH_TRIALS=300 .venv/bin/python -m pytest -q -s tests/publish/test_publish_faults.py
"""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from corpus_builder.errors import CorpusError
from corpus_builder.publish import publish_corpus
from corpus_builder.testing.hub_server import HubServer
from tests.publish.conftest import FAST, TOKEN

TRIALS = int(os.environ.get("CORPUS_PUBLISH_TRIALS") or 12)
REPO = "org/trial"
MAX_KINDS, MAX_TIMES = 4, 3  # a schedule injects up to 4 kinds of fault, each into up to 3 requests
# What a user does after an error: run the same command again. A run fails only when one call meets a fault
# on every one of its FAST.attempts, so a schedule's faults can fail at most this many runs.
RERUNS = MAX_KINDS * MAX_TIMES // FAST.attempts

# (name, injection): each injection hits the next 1..3 matching requests.
FAULTS: list[tuple[str, Callable[[HubServer, int], None]]] = [
    ("preupload dropped", lambda hub, n: hub.drop("POST", "/preupload/", times=n)),
    ("preupload 429", lambda hub, n: hub.fail("POST", "/preupload/", 429, times=n, headers={"Retry-After": "1"})),
    ("commit dropped before it applies", lambda hub, n: hub.drop("POST", "/commit/", times=n)),
    ("commit response lost", lambda hub, n: hub.drop("POST", "/commit/", times=n, after_apply=True)),
    ("commit 412", lambda hub, n: hub.fail("POST", "/commit/", 412, times=n)),
    ("commit 429", lambda hub, n: hub.fail("POST", "/commit/", 429, times=n, headers={"Retry-After": "1"})),
    ("another writer commits first", lambda hub, n: hub.race("POST", "/commit/", times=n)),
    ("head read 503", lambda hub, n: hub.fail("GET", "/revision/", 503, times=n)),
    ("tree read dropped", lambda hub, n: hub.drop("GET", "/tree/", times=n)),
    ("create answered, response lost", lambda hub, n: hub.drop("POST", "/api/repos/create", times=n,
                                                               after_apply=True)),
]


def _schedule(seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [(name, rng.randint(1, MAX_TIMES)) for name, _ in rng.sample(FAULTS, rng.randint(1, MAX_KINDS))]


def _our_commits(hub: HubServer) -> list[Any]:
    return [commit for commit in hub.repo(REPO).commits if commit.message.startswith("Publish ")]


def _token_places(hub: HubServer, texts: list[str], directories: list[Path]) -> list[str]:
    """Every place the token shows up, but the Authorization header it belongs in."""
    token = TOKEN.encode()
    places = [f"request {r.method} {r.path}" for r in hub.requests
              if token in r.body or TOKEN in r.path
              or any(TOKEN in value for name, value in r.headers.items() if name.lower() != "authorization")]
    for repo in hub.repos.values():
        places += [f"commit {c.oid}" for c in repo.commits if TOKEN in c.message]
        places += [f"file {path}" for c in repo.commits for path, content in c.files.items() if token in content]
    places += [f"text {text[:60]!r}" for text in texts if TOKEN in text]
    places += [str(path) for directory in directories for path in directory.rglob("*")
               if path.is_file() and token in path.read_bytes()]
    return places


@pytest.fixture
def client_backoff_not_waited(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """huggingface_hub's own retries (1 s, 2 s, 4 s ... or Retry-After) still run, without the waiting."""
    import huggingface_hub.utils._http as client_http

    waits: list[float] = []
    monkeypatch.setattr(client_http, "time", SimpleNamespace(sleep=waits.append))
    return waits


def test_every_fault_schedule_ends_in_one_verified_commit_and_no_token_anywhere(
        corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        client_backoff_not_waited: list[float]) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    caplog.set_level(logging.DEBUG)
    outcomes: Counter[str] = Counter()
    for seed in range(TRIALS):
        schedule = _schedule(seed)
        with HubServer(token=TOKEN) as hub:
            for name, times in schedule:
                dict(FAULTS)[name](hub, times)
            errors: list[str] = []
            report = None
            for _ in range(1 + RERUNS):
                try:
                    report = publish_corpus(corpus, REPO, endpoint=hub.url, token=TOKEN, retry=FAST)
                    break
                except CorpusError as error:
                    errors.append(str(error))
            assert report is not None, (seed, schedule, errors)
            commits = _our_commits(hub)
            assert len(commits) == 1, (seed, schedule, [c.message for c in commits])
            assert hub.repo(REPO).branches["main"] == commits[0].oid  # on top of any other writer's commit
            files = hub.repo(REPO).files()
            for sent in report.files:
                assert files[sent.path_in_repo] == (sent.content or (corpus / sent.path_in_repo).read_bytes())
            leaks = _token_places(hub, [*errors, report.describe(), report.card, caplog.text],
                                  [corpus, tmp_path / "hf-home"])
            assert leaks == [], (seed, leaks)
        outcomes[f"published after {len(errors)} failed run(s)"] += 1
        outcomes["exactly one commit"] += 1
        outcomes["schedules with a real 412 (another writer)"] += any(
            name == "another writer commits first" for name, _ in schedule)
    outcomes["client backoff waits skipped"] = len(client_backoff_not_waited)
    print(f"\ntrial 5: {TRIALS} fault schedules: {dict(sorted(outcomes.items()))}; token found 0 times")


def test_the_cli_publishes_through_faults_without_printing_the_token(corpus: Path, hub: HubServer,
                                                                     tmp_path: Path) -> None:
    hub.drop("POST", "/preupload/")
    hub.race("POST", "/commit/")  # a real 412: the next commit starts from a stale head
    hub.drop("POST", "/commit/", after_apply=True)
    env = {**{k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_ENDPOINT")},
           "HF_HOME": str(tmp_path / "home"), "HF_TOKEN": TOKEN}
    completed = subprocess.run([sys.executable, "-m", "corpus_builder", "publish", str(corpus), "--repo", REPO,
                                "--endpoint", hub.url], capture_output=True, text=True, env=env, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert len(_our_commits(hub)) == 1 and "committed" in completed.stdout
    assert _token_places(hub, [completed.stdout, completed.stderr], [corpus, tmp_path / "home"]) == []
