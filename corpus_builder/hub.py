"""Talking to a Hugging Face Hub (or a compatible server): endpoint, token, retries, downloads.

``huggingface_hub`` is imported inside the functions that need it, so the rest of the tool stays light.
Every error from it is re-raised as CorpusError with the token scrubbed from its text.
"""

from __future__ import annotations

import logging
import os
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from .errors import CorpusError, MissingDependency
from .layout import AUDIT, MANIFEST, RECIPE, Manifest

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"
REPO_TYPE = "dataset"
RETRY_STATUS = frozenset({408, 412, 429, 500, 502, 503, 504})
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded retries with full-jitter exponential backoff."""

    attempts: int = 6
    base_delay_s: float = 1.0
    max_delay_s: float = 30.0

    def delay(self, attempt: int) -> float:
        return random.uniform(0, min(self.max_delay_s, self.base_delay_s * 2 ** attempt))


def resolve_endpoint(endpoint: str | None) -> str:
    """The explicit endpoint, else HF_ENDPOINT read now (huggingface_hub reads it only at import)."""
    return (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def resolve_token(token: str | None) -> str:
    """``token=``, else HF_TOKEN, else the Hub's token file; CorpusError when there is none."""
    if token:
        return token
    if os.environ.get("HF_TOKEN"):
        return os.environ["HF_TOKEN"]
    try:
        from huggingface_hub import get_token
    except ImportError:
        raise MissingDependency("huggingface_hub", "hub", "publishing") from None
    found = get_token()
    if not found:
        raise CorpusError("no Hub token: set HF_TOKEN, run `hf auth login`, or pass a token")
    return found


def hub_endpoint(endpoint: str | None, purpose: str) -> str:
    """The endpoint to talk to (``resolve_endpoint``), once huggingface_hub is known to be installed (else
    MissingDependency naming ``purpose``); for any endpoint but huggingface.co, with the client's telemetry
    off."""
    try:
        from huggingface_hub import constants
    except ImportError:
        raise MissingDependency("huggingface_hub", "hub", purpose) from None
    resolved = resolve_endpoint(endpoint)
    if resolved != DEFAULT_ENDPOINT:
        # With telemetry on, the client's user agent fetches an "agent harness" list from the endpoint
        # it read at import time (huggingface.co): a request to a host the user did not name.
        constants.HF_HUB_DISABLE_TELEMETRY = True
    return resolved


def scrub(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


class HubSession:
    """One HfApi for one endpoint and token, whose calls retry transient failures and never leak the token."""

    def __init__(self, endpoint: str | None, token: str | None, retry: RetryPolicy | None = None) -> None:
        self.endpoint = hub_endpoint(endpoint, "publishing")
        import huggingface_hub  # installed: hub_endpoint checked

        self.token = token
        self.retry = retry or RetryPolicy()
        self.api = huggingface_hub.HfApi(endpoint=self.endpoint, token=token or False)

    def error(self, problem: str, error: BaseException) -> CorpusError:
        return CorpusError(scrub(f"{problem}: {type(error).__name__}: {error}", self.token), file=self.endpoint)

    def _transient(self, error: BaseException) -> bool:
        import httpx2
        from huggingface_hub.errors import HfHubHTTPError

        if isinstance(error, HfHubHTTPError):
            response = getattr(error, "response", None)
            return response is not None and response.status_code in RETRY_STATUS
        return isinstance(error, httpx2.TransportError)

    def call(self, what: str, action: Callable[[], T]) -> T:
        """Run ``action``; transient failures (412/429/5xx, dropped connections) are retried with backoff."""
        for attempt in range(self.retry.attempts):
            try:
                return action()
            except CorpusError:
                raise
            except Exception as error:  # every client error is re-raised, scrubbed
                if not self._transient(error) or attempt == self.retry.attempts - 1:
                    raise self.error(f"{what} failed", error) from None
                wait = self.retry.delay(attempt)
                log.warning("%s: %s, retrying in %.1fs", what, scrub(type(error).__name__, self.token), wait)
                time.sleep(wait)
        raise AssertionError("unreachable")

    def ensure_repo(self, repo_id: str, *, private: bool, revision: str) -> Any:
        self.call("create repository", lambda: self.api.create_repo(
            repo_id, repo_type=REPO_TYPE, private=private, exist_ok=True))
        if revision != "main":
            self.call("create branch", lambda: self.api.create_branch(
                repo_id, branch=revision, repo_type=REPO_TYPE, exist_ok=True))
        return self.call("read repository", lambda: self.api.repo_info(repo_id, repo_type=REPO_TYPE,
                                                                       revision=revision))

    def head(self, repo_id: str, revision: str) -> str:
        """The commit ``revision`` points at (not retried: call it inside ``call``)."""
        sha = self.api.repo_info(repo_id, repo_type=REPO_TYPE, revision=revision).sha
        if not isinstance(sha, str):
            raise CorpusError(f"the Hub reported no commit for {repo_id}@{revision}", file=self.endpoint)
        return sha

    def list_files(self, repo_id: str, revision: str) -> dict[str, Any]:
        """Every file of the repository at ``revision`` (not retried: call it inside ``call``)."""
        from huggingface_hub import RepoFile

        tree = self.api.list_repo_tree(repo_id, recursive=True, repo_type=REPO_TYPE, revision=revision)
        return {item.path: item for item in tree if isinstance(item, RepoFile)}


# What rendering and counting in the target's tokens need from a model repository: never the weights.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "generation_config.json", "config.json")


def fetch_tokenizer(repo_id: str, revision: str | None, *, endpoint: str | None = None) -> Path:
    """The tokenizer and chat template files of a Hub model, downloaded into huggingface_hub's cache (only
    those files) and returned as a local directory. In offline mode (HF_HUB_OFFLINE=1) the cache answers."""
    resolved = hub_endpoint(endpoint, f"the tokenizer of {repo_id} from the Hub")
    import huggingface_hub  # installed: hub_endpoint checked

    token = _optional_token(None)
    try:
        local = huggingface_hub.snapshot_download(repo_id, repo_type="model", revision=revision,
                                                  allow_patterns=list(TOKENIZER_FILES), token=token or False,
                                                  endpoint=resolved)
    except Exception as error:  # not found, offline without a cached copy, no network: all fixable by the user
        raise CorpusError(scrub(f"cannot fetch the tokenizer of {repo_id}"
                                f"{f'@{revision}' if revision else ''} from the Hub: {type(error).__name__}: "
                                f"{error}", token),
                          details=["set target.tokenizer to a local directory, or fetch it once with network "
                                   "(offline mode then reads the cache)"]) from None
    if not (Path(local) / "tokenizer.json").is_file():
        raise CorpusError(f"the Hub model {repo_id} has no tokenizer.json", file=str(local))
    return Path(local)


def fetch_corpus(repo_id: str, destination: Path, *, endpoint: str | None = None, token: str | None = None,
                 revision: str = "main", retry: RetryPolicy | None = None) -> Path:
    """Download a published corpus (manifest, audit, recipe, card and every shard the manifest lists)
    into ``destination``, pinned to one commit, and return it: a corpus directory for audit and the gate."""
    import orjson

    session = HubSession(endpoint, _optional_token(token), retry)
    destination = Path(destination)
    commit = session.call("read repository", lambda: session.head(repo_id, revision))

    def fetch(path_in_repo: str) -> Path:
        return Path(session.call(f"download {path_in_repo}", lambda: session.api.hf_hub_download(
            repo_id, path_in_repo, repo_type=REPO_TYPE, revision=commit, local_dir=destination)))

    manifest_path = fetch(MANIFEST)
    manifest = Manifest.from_json(orjson.loads(manifest_path.read_bytes()), f"{repo_id}/{MANIFEST}")
    for name in (AUDIT, RECIPE, "README.md"):
        fetch(name)
    for entry in manifest.files:
        fetch(entry.path)
    return destination


@contextmanager
def download_corpus(uri: str, *, endpoint: str | None = None, token: str | None = None,
                    retry: RetryPolicy | None = None) -> Iterator[Path]:
    """``hf://datasets/ORG/NAME[@REVISION]`` (or ORG/NAME) downloaded into a temporary corpus directory,
    removed on exit."""
    repo_id, revision = parse_hf_uri(uri) if uri.startswith("hf://") else (uri, "main")
    with tempfile.TemporaryDirectory(prefix="corpus-remote-") as temporary:
        yield fetch_corpus(repo_id, Path(temporary), endpoint=endpoint, token=token, revision=revision, retry=retry)


def _optional_token(token: str | None) -> str | None:
    """Downloads work without a token for public repositories."""
    try:
        return resolve_token(token)
    except CorpusError:
        return None


def parse_hf_uri(uri: str) -> tuple[str, str]:
    """``hf://datasets/ORG/NAME[@REVISION]`` -> (repo id, revision)."""
    prefix = "hf://datasets/"
    if not uri.startswith(prefix):
        raise CorpusError("expected hf://datasets/ORG/NAME[@REVISION]", file=uri)
    repo, _, revision = uri[len(prefix):].partition("@")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise CorpusError("expected hf://datasets/ORG/NAME[@REVISION]", file=uri)
    return repo, revision or "main"
