"""A Hugging Face Hub stand-in on 127.0.0.1 for tests: the endpoints the real ``huggingface_hub`` client
(2.x) calls to create a repository, commit files and read them back.

Repositories live in memory (visibility, branches, every commit with a full file snapshot). Every request
is recorded (method, path, headers, body) for assertions, and faults can be injected: an HTTP status (with
headers such as Retry-After) for the next N requests whose path contains a string, a dropped connection
(optionally after the request took effect, like a commit whose response is lost), another writer's commit
landing just before a request (so a commit on the old head gets a real 412), or a storage fault that
answers a commit with success but keeps one of its files wrong (dropped or altered).

Preupload answers ``uploadMode: "regular"`` for every file, so the client inlines contents in the
commit's NDJSON and no LFS/Xet server is needed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

SIZE_CATEGORIES = ("n<1K", "1K<n<10K", "10K<n<100K", "100K<n<1M", "1M<n<10M", "10M<n<100M", "100M<n<1B",
                   "1B<n<10B", "10B<n<100B", "100B<n<1T", "n>1T")
GITATTRIBUTES = b"*.parquet filter=lfs diff=lfs merge=lfs -text\n"
_REPO_API = re.compile(r"^/api/(models|datasets|spaces)/([^/]+)/([^/]+)(?:/(.*))?$")
_RESOLVE = re.compile(r"^/(?:(datasets|spaces)/)?([^/]+)/([^/]+)/resolve/([^/]+)/(.+)$")


def git_blob_id(content: bytes) -> str:
    return hashlib.sha1(f"blob {len(content)}\0".encode() + content, usedforsecurity=False).hexdigest()


@dataclass
class Commit:
    oid: str
    message: str
    files: dict[str, bytes]  # the full tree after this commit
    parent: str | None


@dataclass
class Repo:
    repo_id: str
    repo_type: str
    private: bool
    commits: list[Commit] = field(default_factory=list)  # every commit on every branch, in order
    branches: dict[str, str] = field(default_factory=dict)  # name -> head oid

    def commit(self, revision: str) -> Commit | None:
        oid = self.branches.get(revision, revision)
        return next((c for c in self.commits if c.oid == oid), None)

    def files(self, revision: str = "main") -> dict[str, bytes]:
        found = self.commit(revision)
        return dict(found.files) if found else {}

    def advance(self, branch: str, message: str, files: dict[str, bytes]) -> Commit:
        """A new commit of the tree ``files`` on ``branch`` (created when new), after the branch's head."""
        commit = Commit(uuid.uuid4().hex + "00000000", message, files, self.branches.get(branch))
        self.commits.append(commit)
        self.branches[branch] = commit.oid
        return commit


@dataclass
class RecordedRequest:
    method: str
    path: str  # with the query string
    headers: dict[str, str]
    body: bytes


@dataclass
class Fault:
    method: str
    path_contains: str
    times: int
    status: int | None = None  # answer with this status (and message) ...
    message: str = ""
    drop: bool = False  # ... or close the connection without an answer
    after_apply: bool = False  # for drop: let the request take effect first
    headers: dict[str, str] = field(default_factory=dict)  # sent with the status
    race: bool = False  # ... or let another writer commit to the branch first, then handle the request


@dataclass
class StorageFault:
    """The next commits that carry ``path`` succeed, but the stored tree loses it or holds other bytes."""

    path: str
    times: int
    lose: bool  # drop the file from the commit; else flip its first byte


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as separate writes: no 40 ms delayed-ACK stalls
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: tests read server.requests instead

    def _dispatch(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        hub = self.server.hub
        hub.record(RecordedRequest(self.command, self.path, dict(self.headers.items()), body))
        fault = hub.take_fault(self.command, self.path)
        if fault is not None and fault.race:
            hub.commit_elsewhere(self.path)
        if fault is not None and fault.status is not None:
            return self._json(fault.status, {"error": fault.message or f"injected {fault.status}"}, fault.headers)
        if fault is not None and fault.drop and not fault.after_apply:
            return self._drop()
        status, payload, headers = hub.handle(self.command, self.path, dict(self.headers.items()), body)
        if fault is not None and fault.drop:
            return self._drop()
        if isinstance(payload, bytes):
            return self._send(status, payload, headers)
        return self._json(status, payload, headers)

    do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _dispatch

    def _drop(self) -> None:
        self.close_connection = True
        self.connection.shutdown(2)

    def _json(self, status: int, payload: object, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(payload).encode(), {"Content-Type": "application/json", **(headers or {})})

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        headers = headers or {}
        for key, value in headers.items():
            self.send_header(key, value)
        if "Content-Length" not in headers:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    hub: HubServer


class HubServer:
    """Start with ``with HubServer(token=...) as hub:``; ``hub.url`` is the endpoint."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token
        self.repos: dict[tuple[str, str], Repo] = {}
        self.requests: list[RecordedRequest] = []
        self.faults: list[Fault] = []
        self.storage_faults: list[StorageFault] = []
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.hub = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # Test controls

    def fail(self, method: str, path_contains: str, status: int, times: int = 1, message: str = "",
             headers: dict[str, str] | None = None) -> None:
        self.faults.append(Fault(method, path_contains, times, status=status, message=message,
                                 headers=dict(headers or {})))

    def drop(self, method: str, path_contains: str, times: int = 1, after_apply: bool = False) -> None:
        self.faults.append(Fault(method, path_contains, times, drop=True, after_apply=after_apply))

    def race(self, method: str, path_contains: str, times: int = 1) -> None:
        """Before each of the next ``times`` matching requests, another writer commits to the same branch."""
        self.faults.append(Fault(method, path_contains, times, race=True))

    def commit_elsewhere(self, raw_path: str) -> None:
        """Another writer's commit (a NOTES.md edit) on the repository and branch a request path names."""
        match = _REPO_API.match(urlsplit(raw_path).path)
        if match is None:
            return
        kind, org, name, rest = match.groups()
        with self._lock:
            repo = self.repos.get((kind[:-1], f"{org}/{name}"))
            branch = unquote((rest or "").split("/")[1]) if (rest or "").count("/") >= 1 else "main"
            if repo is None or branch not in repo.branches:
                return
            head = repo.commit(branch)
            files = {**(head.files if head else {}), "NOTES.md": f"edited on the Hub {uuid.uuid4().hex}\n".encode()}
            repo.advance(branch, "Edit NOTES.md", files)

    def corrupt(self, path: str, times: int = 1, lose: bool = False) -> None:
        """The next ``times`` commits that carry ``path`` store it wrong (or lose it) and still answer 200."""
        self.storage_faults.append(StorageFault(path, times, lose))

    def add_repo(self, repo_id: str, files: dict[str, bytes], repo_type: str = "model", private: bool = False) -> Repo:
        """A repository that already holds ``files`` on main (e.g. a model's tokenizer for a build to fetch)."""
        repo = Repo(repo_id, repo_type, private=private)
        repo.advance("main", "upload", {".gitattributes": GITATTRIBUTES, **files})
        with self._lock:
            self.repos[(repo_type, repo_id)] = repo
        return repo

    def repo(self, repo_id: str, repo_type: str = "dataset") -> Repo:
        return self.repos[(repo_type, repo_id)]

    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.times > 0 and fault.method == method and fault.path_contains in path:
                    fault.times -= 1
                    return fault
        return None

    # The Hub's behaviour

    def _authorized(self, headers: dict[str, str]) -> bool:
        if self.token is None:
            return True
        auth = {k.lower(): v for k, v in headers.items()}.get("authorization", "")
        return auth == f"Bearer {self.token}"

    def handle(self, method: str, raw_path: str, headers: dict[str, str],
               body: bytes) -> tuple[int, object, dict[str, str]]:
        parts = urlsplit(raw_path)
        path, query = parts.path, parse_qs(parts.query)
        authorized = self._authorized(headers)
        with self._lock:
            if path == "/api/agent-harnesses":
                return 404, {"error": "not found"}, {}
            if path == "/api/repos/create" and method == "POST":
                return self._create(json.loads(body), authorized)
            if path == "/api/validate-yaml" and method == "POST":
                return self._validate_yaml(json.loads(body))
            if match := _REPO_API.match(path):
                kind, org, name, rest = match.groups()
                return self._repo_api(method, kind[:-1], f"{org}/{name}", rest or "", query, body, authorized)
            if match := _RESOLVE.match(path):
                kind, org, name, revision, file_path = match.groups()
                return self._resolve(method, kind[:-1] if kind else "model", f"{org}/{name}", unquote(revision),
                                     unquote(file_path), authorized)
        return 404, {"error": f"no route for {method} {path}"}, {}

    def _create(self, payload: dict[str, Any], authorized: bool) -> tuple[int, object, dict[str, str]]:
        if not authorized:
            return 401, {"error": "Invalid credentials"}, {}
        repo_type = payload.get("type") or "model"
        repo_id = f"{payload['organization']}/{payload['name']}" if payload.get("organization") else payload["name"]
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        url = f"{self.url}/{prefix}{repo_id}"
        if (repo_type, repo_id) in self.repos:
            return 409, {"error": "You already created this repo", "url": url}, {}
        repo = Repo(repo_id, repo_type, private=payload.get("visibility", "public") == "private")
        repo.advance("main", "initial commit", {".gitattributes": GITATTRIBUTES})
        self.repos[(repo_type, repo_id)] = repo
        return 200, {"url": url, "name": repo_id}, {}

    def _validate_yaml(self, payload: dict[str, Any]) -> tuple[int, object, dict[str, str]]:
        errors = [{"message": message} for message in validate_card_metadata(payload.get("content", ""))]
        return (400 if errors else 200), {"errors": errors, "warnings": []}, {}

    def _find(self, repo_type: str, repo_id: str, authorized: bool) -> Repo | None:
        repo = self.repos.get((repo_type, repo_id))
        if repo is None or (repo.private and not authorized):
            return None  # the Hub hides private repositories from strangers
        return repo

    def _repo_api(self, method: str, repo_type: str, repo_id: str, rest: str, query: dict[str, list[str]],
                  body: bytes, authorized: bool) -> tuple[int, object, dict[str, str]]:
        repo = self._find(repo_type, repo_id, authorized)
        if repo is None:
            return 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}
        action, _, tail = rest.partition("/")
        if method in ("POST", "PUT", "DELETE") and not authorized:
            return 401, {"error": "Invalid credentials"}, {}
        if action == "" or action == "revision":
            commit = repo.commit(unquote(tail) if action else "main")
            if commit is None:
                return 404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"}
            return 200, {"id": repo_id, "sha": commit.oid, "private": repo.private,
                         "siblings": [{"rfilename": p} for p in sorted(commit.files)]}, {}
        if action == "branch" and method == "POST":
            branch = unquote(tail)
            if branch in repo.branches:
                return 409, {"error": "Reference already exists"}, {}
            repo.branches[branch] = repo.branches["main"]
            return 200, {}, {}
        revision, _, sub_path = tail.partition("/")
        commit = repo.commit(unquote(revision))
        if commit is None:
            return 404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"}
        if action == "preupload":
            files = json.loads(body)["files"]
            return 200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False,
                                    "oid": git_blob_id(commit.files[f["path"]]) if f["path"] in commit.files else None}
                                   for f in files]}, {}
        if action == "commit":
            return self._commit(repo, unquote(revision), body)
        if action == "tree":
            return self._tree(commit, unquote(sub_path), query.get("recursive", ["false"])[0].lower() == "true")
        if action == "paths-info":
            wanted = parse_qs(body.decode()).get("paths", [])
            return 200, [_file_entry(p, commit.files[p]) for p in wanted if p in commit.files], {}
        return 404, {"error": f"no route for {action}"}, {}

    def _commit(self, repo: Repo, branch: str, body: bytes) -> tuple[int, object, dict[str, str]]:
        if branch not in repo.branches:
            return 404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"}
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        header = lines[0]["value"]
        head = repo.branches[branch]
        if header.get("parentCommit") and header["parentCommit"] != head:
            return 412, {"error": "A commit has happened since. Please refresh and try again."}, {}
        current = repo.commit(head)
        files = dict(current.files) if current is not None else {}
        for line in lines[1:]:
            key, value = line["key"], line["value"]
            if key == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif key == "deletedFile":
                files.pop(value["path"], None)
            elif key == "deletedFolder":
                files = {p: c for p, c in files.items() if not p.startswith(value["path"].rstrip("/") + "/")}
            else:
                return 400, {"error": f"{key} is not supported by this test server"}, {}
        self._damage(files, {line["value"]["path"] for line in lines[1:] if line["key"] == "file"})
        commit = repo.advance(branch, header["summary"], files)
        prefix = "" if repo.repo_type == "model" else f"{repo.repo_type}s/"
        return 200, {"commitOid": commit.oid, "commitUrl": f"{self.url}/{prefix}{repo.repo_id}/commit/{commit.oid}",
                     "pullRequestUrl": None}, {}

    def _damage(self, files: dict[str, bytes], committed: set[str]) -> None:
        """Apply the storage faults that match a file of this commit (the caller holds the lock)."""
        for fault in self.storage_faults:
            if fault.times > 0 and fault.path in committed:
                fault.times -= 1
                if fault.lose:
                    files.pop(fault.path)
                else:
                    content = files[fault.path]
                    files[fault.path] = bytes([content[0] ^ 0xFF]) + content[1:] if content else b"\0"

    def _tree(self, commit: Commit, sub_path: str, recursive: bool) -> tuple[int, object, dict[str, str]]:
        prefix = sub_path.strip("/") + "/" if sub_path.strip("/") else ""
        entries: dict[str, object] = {}
        for path, content in sorted(commit.files.items()):
            if not path.startswith(prefix):
                continue
            *folders, _ = path[len(prefix):].split("/")
            if recursive or not folders:
                entries[path] = _file_entry(path, content)
            for depth in range(1, (len(folders) if recursive else min(len(folders), 1)) + 1):
                folder = prefix + "/".join(folders[:depth])
                entries.setdefault(folder, {"type": "directory", "oid": git_blob_id(folder.encode()), "path": folder})
        if prefix and not entries:
            return 404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"}
        return 200, list(entries.values()), {}

    def _resolve(self, method: str, repo_type: str, repo_id: str, revision: str, file_path: str,
                 authorized: bool) -> tuple[int, object, dict[str, str]]:
        repo = self._find(repo_type, repo_id, authorized)
        if repo is None:
            return 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}
        commit = repo.commit(revision)
        if commit is None:
            return 404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"}
        if file_path not in commit.files:
            return 404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"}
        content = commit.files[file_path]
        headers = {"ETag": f'"{git_blob_id(content)}"', "X-Repo-Commit": commit.oid,
                   "Content-Type": "application/octet-stream", "Content-Length": str(len(content))}
        return 200, content, headers


def _file_entry(path: str, content: bytes) -> dict[str, object]:
    return {"type": "file", "oid": git_blob_id(content), "size": len(content), "path": path}


def validate_card_metadata(card: str) -> list[str]:
    """The subset of the Hub's README.md metadata rules that a dataset card from this tool must meet."""
    if not card.startswith("---\n"):
        return []
    end = card.find("\n---\n", 4)
    if end < 0:
        return ["front matter is not closed"]
    try:
        metadata = yaml.safe_load(card[4:end]) or {}
    except yaml.YAMLError as error:
        return [f"front matter is not valid YAML: {error}"]
    if not isinstance(metadata, dict):
        return ["front matter is not a mapping"]
    errors = [f'"size_categories" has an invalid value {value!r}'
              for value in metadata.get("size_categories") or () if value not in SIZE_CATEGORIES]
    for config in metadata.get("configs") or ():
        if not isinstance(config, dict) or not isinstance(config.get("config_name"), str):
            errors.append('"configs" entries need a config_name')
            continue
        for data_file in config.get("data_files") or ():
            if not isinstance(data_file, dict) or "split" not in data_file or "path" not in data_file:
                errors.append(f'"configs[{config["config_name"]}].data_files" entries need split and path')
    if sum(bool(c.get("default")) for c in metadata.get("configs") or () if isinstance(c, dict)) > 1:
        errors.append('only one config can be "default"')
    return errors
