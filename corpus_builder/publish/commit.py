"""One publish: the corpus gated, its trainer exports and speculation profiles written, the card rendered and
scanned, then every file uploaded in ONE commit to a dataset repository and read back (``publish_corpus``); a dry run
stops before the network."""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from ..errors import CorpusError
from ..eval import ProfileFile, corpus_pack_sha256
from ..hub import HubSession, RetryPolicy, resolve_endpoint, resolve_token
from ..layout import AUDIT, MANIFEST, RECIPE, no_build_writing
from ..recipe.model import ExportSpec
from ..secrets import scan_text
from .card import render_card, scrub_local_paths, scrub_value
from .exports import EXPORTS_PREFIX, PublishedExport, recipe_exports, write_exports
from .gate import CorpusDocuments, GateFailed, require_gate
from .profiles import PROFILES_PREFIX, AttachedProfile, attach_profiles, read_profiles
from .upload import UploadedFile, UploadFile, commit_files

log = logging.getLogger(__name__)
CARD = "README.md"
# What a publish owns in the repository: a file there that this publish does not upload is deleted.
MANAGED_PREFIXES = ("data/", EXPORTS_PREFIX, PROFILES_PREFIX)


class PublishJson(TypedDict):
    """``corpus publish --json``: the outcome, and every file with its size and sha256."""

    repo_id: str
    url: str
    revision: str
    private: bool
    dry_run: bool
    commit: str | None
    committed: bool
    uploaded: list[str]
    deleted: list[str]
    notes: list[str]
    files: list[UploadedFile]


@dataclass
class PublishReport:
    repo_id: str
    endpoint: str
    revision: str
    private: bool
    dry_run: bool
    files: list[UploadFile]
    card: str
    commit: str | None = None  # the head after publishing (None for a dry run)
    committed: bool = False  # False when the remote already had exactly these files
    uploaded: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"{self.endpoint}/datasets/{self.repo_id}"

    def to_dict(self) -> PublishJson:
        return {"repo_id": self.repo_id, "url": self.url, "revision": self.revision, "private": self.private,
                "dry_run": self.dry_run, "commit": self.commit, "committed": self.committed,
                "uploaded": self.uploaded, "deleted": self.deleted, "notes": self.notes,
                "files": [f.describe() for f in self.files]}

    def describe(self) -> str:
        """What the CLI prints: the files (path, size, sha256) and the outcome; a dry run adds the card."""
        visibility = "private" if self.private else "public"
        width = max(len(f.path_in_repo) for f in self.files)
        lines = [f"{'would upload' if self.dry_run else 'files'} to {self.url} ({visibility}, "
                 f"revision {self.revision}):"]
        lines += [f"  {f.path_in_repo:<{width}}  {f.size:>12,} B  sha256 {f.sha256}" for f in self.files]
        if self.dry_run:
            lines += ["", "--- README.md ---", self.card]
        elif self.committed:
            lines.append(f"committed {len(self.uploaded)} file(s), deleted {len(self.deleted)}: {self.commit}")
        else:
            lines.append(f"unchanged: the repository already holds these files (head {self.commit})")
        return "\n".join(lines + self.notes)


def _metadata_file(path_in_repo: str, path: Path) -> UploadFile:
    """recipe.yaml / manifest.json / audit.json, with local paths and URL credentials removed."""
    raw = path.read_bytes()
    if path.suffix == ".json":
        document = json.loads(raw)
        cleaned = scrub_value(document)
        content = raw if cleaned == document else json.dumps(cleaned, indent=2, ensure_ascii=False).encode()
    else:
        content = scrub_local_paths(raw.decode("utf-8")).encode("utf-8")
    return UploadFile.from_bytes(path_in_repo, content)


def prepare_upload(docs: CorpusDocuments, repo_id: str | None = None, exports: Sequence[PublishedExport] = (),
                   profiles: Sequence[AttachedProfile] = ()) -> tuple[list[UploadFile], str]:
    """(files in commit order, card text): the shards as they are, the trainer exports, the speculation profiles,
    the card and the scrubbed metadata."""
    card = render_card(docs, repo_id, exports, profiles)
    files = [UploadFile.from_path(entry.path, docs.root / entry.path) for entry in docs.manifest.files]
    files += [upload for export in exports for upload in export.uploads]
    files += [attached.upload for attached in profiles]
    files.append(UploadFile.from_bytes(CARD, card.encode("utf-8")))
    files += [_metadata_file(name, docs.root / name) for name in (RECIPE, MANIFEST, AUDIT)]
    return files, card


def _check_card(docs: CorpusDocuments, files: list[UploadFile]) -> None:
    """The card and metadata are new text: scan them like the rows before they leave."""
    findings = [finding for f in files if f.content is not None
                for finding in scan_text(f.content.decode("utf-8", errors="replace"), f.path_in_repo)]
    if findings:
        raise GateFailed(docs.root, [f"secrets: {finding}" for finding in findings])


def check_repo_id(repo_id: str) -> None:
    """Refuse a repository id the Hub would refuse at the first call (or that names no dataset of a user or an
    organisation), before anything is read: the Hub's rules as huggingface_hub's ``validate_repo_id`` holds them
    (ASCII letters, digits, '-', '_' and '.', at most 96 characters for the organisation and for the name, neither
    starting nor ending with '-' or '.', no '--' or '..', no '.git' ending)."""
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise CorpusError(f"--repo must be ORG/NAME (a dataset repository of a user or an organisation), got "
                          f"{repo_id!r}")
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils._validators import validate_repo_id  # huggingface_hub.utils re-exports it untyped

    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise CorpusError(f"--repo {repo_id!r} is not a dataset repository id the Hub takes: ORG/NAME, each of ASCII "
                          "letters, digits, '-', '_' and '.', at most 96 characters, neither starting nor ending with "
                          "'-' or '.', with no '--' or '..', the name not ending in '.git'") from None


def publish_corpus(corpus_dir: Path | str, repo_id: str, *, public: bool = False, revision: str = "main",
                   endpoint: str | None = None, token: str | None = None, dry_run: bool = False,
                   retry: RetryPolicy | None = None, exports: Sequence[ExportSpec] | None = None,
                   tokenizer: Path | None = None, profiles: Sequence[Path] = ()) -> PublishReport:
    """Gate, then upload a corpus as ONE commit to a dataset repository (private unless ``public``), with the
    trainer ``exports`` (default: the corpus recipe's ``publish.exports``) written from it at
    exports/{format}/{split}.{file format} (``tokenizer``: for speculators-tokens, as `corpus export`), and the
    speculation ``profiles`` (``speculation_profile.json`` files of heads trained on it) at
    speculation_profiles/{file name}, each named in the card with whether it was measured on the corpus's eval pack.

    Raises CorpusError naming a profile that is not a measured one in ModelOpt's schema before anything else, then
    GateFailed (every failing check) before any network use, CorpusError for Hub errors (token
    scrubbed) and while a build writes the directory. Safe to re-run: files already on the remote with the
    same bytes are not sent again, and an unchanged corpus makes no commit.
    """
    check_repo_id(repo_id)
    checked = read_profiles(profiles)
    # A build rewriting the directory makes the corpus look broken (files missing, counts off): that build is named
    # instead, before anything is read, and when publishing fails (the build may have started meanwhile).
    with no_build_writing(Path(corpus_dir)), tempfile.TemporaryDirectory(prefix="corpus-publish-") as scratch:
        return _gate_and_upload(Path(corpus_dir), repo_id, public=public, revision=revision, endpoint=endpoint,
                                token=token, dry_run=dry_run, retry=retry, exports=exports, tokenizer=tokenizer,
                                profiles=checked, scratch=Path(scratch))


def _gate_and_upload(corpus_dir: Path, repo_id: str, *, public: bool, revision: str, endpoint: str | None,
                     token: str | None, dry_run: bool, retry: RetryPolicy | None,
                     exports: Sequence[ExportSpec] | None, tokenizer: Path | None, profiles: Sequence[ProfileFile],
                     scratch: Path) -> PublishReport:
    gate = require_gate(corpus_dir)
    docs = gate.documents
    specs = tuple(exports) if exports is not None else recipe_exports(docs)
    published = write_exports(docs, specs, scratch, tokenizer)
    attached = attach_profiles(profiles, corpus_pack_sha256(docs.root)) if profiles else []
    files, card = prepare_upload(docs, repo_id, published, attached)
    _check_card(docs, files)
    report = PublishReport(repo_id, resolve_endpoint(endpoint), revision, not public, dry_run, files, card)
    report.notes += [f"note: {EXPORTS_PREFIX}{export.format} leaves out {count:,} conversations: {reason}"
                     for export in published for reason, count in sorted(export.left_out.items())]
    report.notes += [f"note: {a.upload.path_in_repo} was measured on another pack than this corpus's eval pack"
                     for a in attached if a.pack_matches is False]
    if dry_run:
        return report

    session = HubSession(endpoint, resolve_token(token), retry)
    info = session.ensure_repo(repo_id, private=not public, revision=revision)
    if info.private is False and not public:
        raise CorpusError(f"{repo_id} already exists and is public; pass --public to publish into it",
                          file=session.endpoint)
    if info.private and public:
        report.notes.append("note: the repository already exists and stays private (change it on the Hub)")
    report.private = bool(info.private)
    paths = [f.path_in_repo for f in files]
    sent = False  # a commit whose response was lost may have landed: the next attempt then finds no change

    def attempt() -> tuple[str, bool]:
        nonlocal sent
        # Re-read the remote on every attempt: after a dropped connection the commit may have landed.
        head = session.head(repo_id, revision)
        remote = session.list_files(repo_id, head)
        changed = [f for f in files if not f.matches(remote.get(f.path_in_repo))]
        stale = sorted(p for p in remote if p.startswith(MANAGED_PREFIXES) and p not in paths)
        if not changed and not stale:
            return head, sent
        report.uploaded, report.deleted = [f.path_in_repo for f in changed], stale
        message = f"Publish {docs.manifest.name or 'corpus'} ({docs.manifest.conversations:,} conversations)"
        sent = True
        return commit_files(session, repo_id, revision, head, changed, stale, message), True

    report.commit, report.committed = session.call("commit", attempt)
    _verify(session, report)
    return report


def _verify(session: HubSession, report: PublishReport) -> None:
    """Read the repository back at the new head: every file with our size and hash, no stale shard."""
    remote = session.call("read back", lambda: session.list_files(report.repo_id, report.commit or report.revision))
    problems = [f"{f.path_in_repo}: {'missing' if f.path_in_repo not in remote else 'size or hash differs'}"
                for f in report.files if not f.matches(remote.get(f.path_in_repo))]
    expected = {f.path_in_repo for f in report.files}
    problems += [f"{path}: unexpected file" for path in remote if path.startswith(MANAGED_PREFIXES)
                 and path not in expected]
    if problems:
        raise CorpusError("the published repository does not match the corpus", file=report.url, details=problems)
