"""The speculation profiles `corpus publish --profile FILE` attaches: a head trained on this corpus, measured on its
eval pack (``corpus eval --profile``, or ModelOpt's own tooling), travels with the corpus's card.

Each file is checked (``eval.read_profile``: ModelOpt's schema 1.0) before the gate or any request, uploaded as it is
(scanned for secrets with the card; a profile reduces its paths to ``org/model`` itself) at
``speculation_profiles/{its file name}``, and its pack hash compared with the hash of
this corpus's own eval pack, which the card states.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import CorpusError
from ..eval import ProfileFile, read_profile
from .upload import UploadFile

PROFILES_PREFIX = "speculation_profiles/"


@dataclass(frozen=True)
class AttachedProfile:
    """A profile as published: the file checked, its upload, and whether it was measured on this corpus's pack."""

    profile: ProfileFile
    upload: UploadFile
    pack_matches: bool | None  # None: the profile records no pack hash, or the corpus has no eval pack


def read_profiles(paths: Sequence[Path]) -> list[ProfileFile]:
    """Every profile given, checked; CorpusError on the first bad one, or on two that would land on one path."""
    profiles = [read_profile(Path(path)) for path in paths]
    seen: dict[str, Path] = {}
    for profile in profiles:
        name = profile.path.name
        if name in seen and seen[name].resolve() != profile.path.resolve():
            raise CorpusError(f"--profile: two profiles named {name} ({seen[name]} and {profile.path}) would both be "
                              f"uploaded at {PROFILES_PREFIX}{name}: rename one")
        seen[name] = profile.path
    return list({profile.path.name: profile for profile in profiles}.values())


def attach_profiles(profiles: Sequence[ProfileFile], corpus_pack_sha256: str | None) -> list[AttachedProfile]:
    """The uploads of ``profiles``, each compared with the corpus's own pack hash (None: it has no pack)."""
    attached = []
    for profile in profiles:
        known = profile.pack_sha256 is not None and corpus_pack_sha256 is not None
        upload = UploadFile.from_bytes(PROFILES_PREFIX + profile.path.name, profile.content)
        attached.append(AttachedProfile(profile, upload, profile.pack_sha256 == corpus_pack_sha256 if known else None))
    return attached
