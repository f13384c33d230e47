"""The README, the front door: short, its links to the documentation alive, its test command the one CI runs."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_a_front_page_of_at_most_200_lines() -> None:
    assert len(README.splitlines()) <= 200


def test_every_relative_link_of_the_readme_names_a_file_of_the_repository() -> None:
    targets = [target for target in re.findall(r"\]\(([^)\s]+)\)", README) if "://" not in target]
    assert any(target.startswith("docs/guides/") for target in targets)
    assert [target for target in targets if not (REPO / target.split("#")[0]).is_file()] == []


def test_ci_runs_the_set_up_and_test_commands_the_readme_gives() -> None:
    [block] = re.findall(r"## Set-up \(two commands\)\n\n```bash\n(.*?)```", README, flags=re.S)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.split("#")[0].strip()]
    assert len(commands) == 2
    ci = [line.split("#")[0].strip() for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert all(command in ci for command in commands), commands
