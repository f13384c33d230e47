"""`corpus publish --profile FILE`: a head's speculation profile uploaded beside the corpus it was trained on and
named in the card, with whether it was measured on that corpus's eval pack; a bad profile refused before anything
is sent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from corpus_builder.errors import CorpusError
from corpus_builder.eval import read_pack, speculation_profile
from corpus_builder.eval.profile import write_profile
from corpus_builder.publish import publish_corpus
from corpus_builder.testing.hub_server import HubServer
from tests.eval.runs import synthetic_run
from tests.publish.conftest import FAST, TOKEN

SECTION = "## Speculation profiles"


def profile_file(path: Path, pack_of_corpus: Path | None = None, head: str = "A") -> dict[str, Any]:
    """Head ``head``'s profile of a synthetic run (on the eval pack of ``pack_of_corpus``, else on another pack),
    written at ``path``."""
    run = synthetic_run(read_pack(pack_of_corpus) if pack_of_corpus is not None else None)
    profile = speculation_profile(run, head)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_profile(path, profile)
    return profile


def card_rows(card: str) -> dict[str, list[str]]:
    """The profiles table of a card: each row's cells by the profile's path."""
    section = card.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in section.splitlines()
            if line.startswith("| `")]
    return {row[0].strip("`"): row for row in rows}


def test_profiles_are_uploaded_beside_the_corpus_and_named_in_its_card(packed_corpus: Path, hub: HubServer,
                                                                       tmp_path: Path) -> None:
    mine = profile_file(tmp_path / "mine" / "speculation_profile.json", packed_corpus)
    other = profile_file(tmp_path / "other" / "speculation_profile-B.json", head="B")
    report = publish_corpus(packed_corpus, "org/tiny", endpoint=hub.url, token=TOKEN, retry=FAST,
                            profiles=[tmp_path / "mine" / "speculation_profile.json",
                                      tmp_path / "other" / "speculation_profile-B.json"])
    files = hub.repo("org/tiny").files()
    assert orjson.loads(files["speculation_profiles/speculation_profile.json"]) == mine
    assert orjson.loads(files["speculation_profiles/speculation_profile-B.json"]) == other
    rows = card_rows(files["README.md"].decode())
    assert rows["speculation_profiles/speculation_profile.json"] == [
        "`speculation_profiles/speculation_profile.json`", "`heads/A`", "eagle3", "3", "0",
        f"{mine['mean_accept_length']:.3f}", f"{mine['mean_accept_length_per_request']:.4g}",
        f"`{mine['measurement_conditions']['pack_sha256'][:12]}`", "yes"]
    assert mine["mean_accept_length"] != mine["mean_accept_length_per_request"]  # the two means told apart
    row_b = rows["speculation_profiles/speculation_profile-B.json"]
    assert row_b[1:3] == ["not recorded", "not told"] and row_b[-1] == "**no**: another pack"
    assert row_b[-2] == f"`{other['measurement_conditions']['pack_sha256'][:12]}`"
    assert report.notes == ["note: speculation_profiles/speculation_profile-B.json was measured on another pack than "
                            "this corpus's eval pack"]
    # published again without them: the profiles are the publish's own files, so they go, and the card's section
    publish_corpus(packed_corpus, "org/tiny", endpoint=hub.url, token=TOKEN, retry=FAST)
    files = hub.repo("org/tiny").files()
    assert not [path for path in files if path.startswith("speculation_profiles/")]
    assert SECTION not in files["README.md"].decode()


def corpus_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_TOKEN": TOKEN}
    return subprocess.run([sys.executable, "-m", "corpus_builder", *args], capture_output=True, text=True, env=env)


def test_a_dry_run_shows_the_profile_and_a_corpus_without_a_pack_cannot_tell(corpus: Path, packed_corpus: Path,
                                                                             hub: HubServer, tmp_path: Path) -> None:
    profile = tmp_path / "speculation_profile.json"
    profile_file(profile, packed_corpus)
    shown = corpus_cli("publish", str(corpus), "--repo", "org/tiny", "--endpoint", hub.url, "--dry-run",
                       "--profile", str(profile))
    assert shown.returncode == 0, shown.stderr
    assert hub.requests == []
    assert "  speculation_profiles/speculation_profile.json  " in shown.stdout
    card = shown.stdout.split("--- README.md ---", 1)[1]
    assert card_rows(card)["speculation_profiles/speculation_profile.json"][-1] == \
        "cannot tell: this corpus has no eval pack"


def _edit(key: str, value: Any) -> Callable[[dict[str, Any]], str]:
    def edit(profile: dict[str, Any]) -> str:
        profile[key] = value
        return json.dumps(profile, indent=2)
    return edit


BAD_PROFILES = {
    "not JSON": (lambda profile: '{\n  "schema_version": "1.0",\n  "measured": tru\n}',
                 ":3: the speculation profile is not JSON: Expecting value"),
    "a rate that is text": (_edit("marginal_accept_rates", [0.5, "x", 0.1]),
                            "  - marginal_accept_rates[1]: 'x' is not of type 'number'"),
    "a rate over 1": (_edit("conditional_accept_rates", [0.5, 1.5, 0.1]),
                      "  - conditional_accept_rates[1]: 1.5 is greater than the maximum of 1"),
    "rates not one per position": (_edit("marginal_accept_rates", [0.5, 0.2]),
                                   "  - marginal_accept_rates: 2 rates, not one per drafted position "
                                   "(num_speculative_tokens 3)"),
    "a stub": (_edit("measured", False), "  - measured: True was expected"),
    "another schema": (_edit("schema_version", "2.0"), "  - schema_version: '1.0' was expected"),
    "no mean": (lambda profile: json.dumps({k: v for k, v in profile.items() if k != "mean_accept_length"}),
                "  - (the document): 'mean_accept_length' is a required property"),
}


@pytest.mark.parametrize("case", sorted(BAD_PROFILES))
def test_a_bad_profile_is_refused_with_its_place_before_anything_is_sent(packed_corpus: Path, hub: HubServer,
                                                                        tmp_path: Path, case: str) -> None:
    write, expected = BAD_PROFILES[case]
    good = tmp_path / "good.json"
    profile = profile_file(good, packed_corpus)
    bad = tmp_path / "bad.json"
    bad.write_text(write(profile))
    refused = corpus_cli("publish", str(packed_corpus), "--repo", "org/tiny", "--endpoint", hub.url,
                         "--profile", str(good), "--profile", str(bad))
    assert refused.returncode == 2, refused.stderr
    assert str(bad) in refused.stderr and expected in refused.stderr, refused.stderr
    assert hub.requests == [] and hub.repos == {}


def test_two_profiles_of_one_name_are_refused(packed_corpus: Path, tmp_path: Path) -> None:
    for folder in ("one", "two"):
        profile_file(tmp_path / folder / "speculation_profile.json", packed_corpus)
    with pytest.raises(CorpusError, match=r"two profiles named speculation_profile\.json .* rename one"):
        publish_corpus(packed_corpus, "org/tiny", dry_run=True,
                       profiles=[tmp_path / "one" / "speculation_profile.json",
                                 tmp_path / "two" / "speculation_profile.json"])
