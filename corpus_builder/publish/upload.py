"""The one-commit upload: the files of a commit, identified by their bytes, and the commit itself."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from ..hub import REPO_TYPE, HubSession


class UploadedFile(TypedDict):
    """A file of a publish as its report lists it."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class UploadFile:
    """One file of the commit: its path in the repository, its bytes' identity and where they come from."""

    path_in_repo: str
    size: int
    sha256: str
    git_sha1: str  # the git blob id the Hub reports for a file stored outside LFS
    local_path: Path | None = None  # read from disk (shards) ...
    content: bytes | None = None  # ... or held in memory (card, scrubbed metadata)

    @classmethod
    def from_bytes(cls, path_in_repo: str, content: bytes) -> UploadFile:
        return cls(path_in_repo, len(content), hashlib.sha256(content).hexdigest(), _git_sha1_bytes(content),
                   content=content)

    @classmethod
    def from_path(cls, path_in_repo: str, path: Path) -> UploadFile:
        size = path.stat().st_size
        sha256, git = hashlib.sha256(), hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False)
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                sha256.update(chunk)
                git.update(chunk)
        return cls(path_in_repo, size, sha256.hexdigest(), git.hexdigest(), local_path=path)

    def matches(self, remote: object) -> bool:
        """Same bytes as a RepoFile from paths-info/tree: size plus the LFS sha256 or the git blob id."""
        if remote is None or getattr(remote, "size", None) != self.size:
            return False
        lfs = getattr(remote, "lfs", None)
        if lfs is not None:
            return bool(getattr(lfs, "sha256", None) == self.sha256)
        return bool(getattr(remote, "blob_id", None) == self.git_sha1)

    def source(self) -> str | bytes:
        """What the commit operation reads: the local file, or the bytes held in memory."""
        if self.local_path is not None:
            return str(self.local_path)
        assert self.content is not None, "an UploadFile holds a path or bytes"
        return self.content

    def describe(self) -> UploadedFile:
        return {"path": self.path_in_repo, "size": self.size, "sha256": self.sha256}


def _git_sha1_bytes(content: bytes) -> str:
    return hashlib.sha1(f"blob {len(content)}\0".encode() + content, usedforsecurity=False).hexdigest()



def commit_files(session: HubSession, repo_id: str, revision: str, head: str, files: list[UploadFile],
                 stale: list[str], message: str) -> str:
    """Upload ``files`` and delete ``stale`` in ONE commit on top of the current head; returns its oid.

    Shards go through preupload first (LFS/Xet on the real Hub), then one create_commit carries every
    operation, README.md included. ``parent_commit=head`` makes a concurrent change fail (412) instead of
    being overwritten.
    """
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    additions = [CommitOperationAdd(f.path_in_repo, f.source()) for f in files]
    shards = [op for op, f in zip(additions, files, strict=True) if f.local_path is not None]
    if shards:
        session.api.preupload_lfs_files(repo_id, additions=shards, repo_type=REPO_TYPE, revision=revision,
                                        free_memory=False)
    deletions = [CommitOperationDelete(path) for path in stale]
    info = session.api.create_commit(repo_id, [*additions, *deletions], commit_message=message,
                                     repo_type=REPO_TYPE, revision=revision, parent_commit=head)
    return info.oid
