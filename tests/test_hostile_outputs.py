"""Every path a command writes, against hostile values (issue 18): each is checked against the command's inputs
and the corpus before anything is written.

The output options are read from the CLI itself: every Path-typed parameter of every command is classified
below as an output (swept) or an input, so an option added later is swept, or fails here until it is
classified. Each output option is given the corpus's own files (manifest, a shard, the ledger), the command's
inputs, a directory where a file is expected or a regular file where a directory is, a null device, an empty
string and a missing parent: every one must end in exit 2 with a message naming the path, and leave the
workspace (corpus, inputs, everything else) byte for byte as it was. A hypothesis walk over paths made of the
workspace's own names (``..``, ``.``, the corpus and its files, the inputs) checks the same wherever it lands:
refused with nothing changed, or written outside the corpus and the inputs with nothing else changed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import click
import orjson
import pytest
from hypothesis import Phase, assume, given, settings
from hypothesis import strategies as st

from corpus_builder.assemble import build_corpus
from corpus_builder.cli import cli, main
from corpus_builder.layout import LEDGER, MANIFEST, Corpus
from corpus_builder.recipe import load_recipe
from corpus_builder.testing.fault_server import FaultServer
from tests.eval.runs import synthetic_run
from tests.support.chats import synthetic_chats
from tests.support.fuzz import fuzz_settings

RECIPE = """\
name: hostile
target: {model: tiny-target, tokenizer: ../tok}
sources:
  - {name: log, kind: replay, path: log.jsonl}
split: {validation_fraction: 0.3, seed: 1}
output: {dir: ../out}
"""


@dataclass(frozen=True)
class Workspace:
    """A private copy of everything the commands read: a recipe and its source, a tokenizer, serving traffic,
    the corpus the recipe builds, an empty directory, a plain file and a null device."""

    root: Path

    @property
    def recipe(self) -> Path:
        return self.root / "src" / "recipe.yaml"

    @property
    def source(self) -> Path:
        return self.root / "src" / "log.jsonl"

    @property
    def tokenizer(self) -> Path:
        return self.root / "tok"

    @property
    def traffic(self) -> Path:
        return self.root / "traffic.jsonl"

    @property
    def corpus(self) -> Path:
        return self.root / "out"

    @property
    def runs(self) -> tuple[Path, Path]:
        """Two saved eval runs, for `corpus eval --compare`."""
        return self.root / "runs" / "a.json", self.root / "runs" / "b.json"

    @property
    def shard(self) -> Path:
        return self.corpus / Corpus.open(self.corpus).files[0].path

    @property
    def null_device(self) -> Path:
        """A character device that discards what is written, like /dev/null: as root a node of its own here, so
        a command that replaced it would not replace the machine's; otherwise /dev/null, which only root can."""
        return self.root / "null" if os.geteuid() == 0 else Path("/dev/null")

    def snapshot(self) -> dict[str, str]:
        """Every entry under the workspace: a file by its sha256, a directory, a link or a device by its kind."""
        found = {}
        for path in sorted(self.root.rglob("*")):
            mode = path.lstat().st_mode
            if stat.S_ISREG(mode):
                found[str(path.relative_to(self.root))] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:  # a directory, a link (with its target), a device: by kind
                link = os.readlink(path) if stat.S_ISLNK(mode) else ""
                found[str(path.relative_to(self.root))] = f"{stat.S_IFMT(mode):o} {link}"
        return found


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    (root / "src").mkdir()
    shutil.copytree(tiny_model_dir, root / "tok", ignore=shutil.ignore_patterns("*.safetensors"))
    rows = synthetic_chats(12, max_turns=2, system="Be brief.", system_every=4,
                           question=lambda i, turn: f"question {i}.{turn}", answer=lambda i, turn: f"answer {i}.{turn}",
                           reasoning=lambda i, turn: f"thought {i}")
    (root / "src" / "log.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    (root / "traffic.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows[:6]))
    (root / "src" / "recipe.yaml").write_text(RECIPE, encoding="utf-8")
    build_corpus(load_recipe(root / "src" / "recipe.yaml"))
    (root / "a-directory").mkdir()
    (root / "plain.txt").write_text("a plain file\n")
    (root / "runs").mkdir()
    for name, shift in (("a.json", 0.0), ("b.json", -0.2)):
        (root / "runs" / name).write_bytes(orjson.dumps(synthetic_run(shift=shift).to_json()))
    # one head: its profile is the one file --profile names (a second head's goes beside it, checked alike)
    (root / "runs" / "one-head.json").write_bytes(orjson.dumps(synthetic_run(heads={"A": (0.8, "eagle3")}).to_json()))
    return root


@pytest.fixture
def workspace(template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return copied(template, tmp_path / "ws", monkeypatch)


def copied(template: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    """A fresh copy of the template, the working directory inside it (relative paths land there)."""
    shutil.copytree(template, root, symlinks=True)
    if os.geteuid() == 0:
        os.mknod(root / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    monkeypatch.chdir(root)
    return Workspace(root.resolve())


Kind = Literal["file", "directory"]


@dataclass(frozen=True)
class OutputOption:
    """How to run a command that writes to a given path, and what that run reads besides the corpus."""

    kind: Kind
    args: Callable[[Workspace, str], list[str]]
    inputs: Callable[[Workspace], dict[str, Path]]
    file_name: str = ""  # a name the option accepts, for a file in a missing directory
    rebuilds_corpus: bool = False  # the corpus's own directory is a legitimate output (a rebuild)
    refused: Callable[[Workspace], dict[str, Path]] | None = None  # other paths the option refuses, by what they are


# (command, option), and what the path names where an option takes a file or a directory: each form is swept.
OUTPUTS: dict[tuple[str, ...], OutputOption] = {
    ("build", "--out"): OutputOption(
        "directory", lambda ws, out: ["build", str(ws.recipe), "--out", out],
        lambda ws: {"the recipe": ws.recipe, "a source file": ws.source, "the tokenizer directory": ws.tokenizer,
                    "the directory of the recipe and its sources": ws.recipe.parent},
        rebuilds_corpus=True),
    ("audit", "--html"): OutputOption(
        "file", lambda ws, out: ["audit", str(ws.corpus), "--no-secrets", "--against", str(ws.traffic),
                                 "--tokenizer", str(ws.tokenizer), "--token-sample", "20", "--html", out],
        lambda ws: {"the traffic file": ws.traffic, "a tokenizer file": ws.tokenizer / "tokenizer.json"},
        file_name="report.html"),
    ("export", "--out"): OutputOption(
        "directory", lambda ws, out: ["export", str(ws.corpus), "--format", "speculators-tokens", "--out", out,
                                      "--tokenizer", str(ws.tokenizer)],
        lambda ws: {"the tokenizer directory": ws.tokenizer}),
    ("eval", "--save-dir"): OutputOption(
        "directory", lambda ws, out: ["eval", str(ws.traffic), "--endpoint", SPECULATING["url"], "--mode",
                                      "non-thinking", "--temperature", "0", "--save-dir", out],
        lambda ws: {"the pack": ws.traffic},
        # a run saved beside the pack would be read as part of it by the next eval of its folder
        refused=lambda ws: {"the pack's own folder": ws.traffic.parent}),
    ("eval", "--html"): OutputOption(
        "file", lambda ws, out: ["eval", str(ws.traffic), "--endpoint", SPECULATING["url"], "--mode",
                                 "non-thinking", "--temperature", "0", "--html", out,
                                 # the run itself is saved outside the workspace the sweep watches
                                 "--save-dir", tempfile.mkdtemp(prefix="eval-runs-")],
        lambda ws: {"the pack": ws.traffic}, file_name="acceptance.html"),
    ("eval", "--html", "with --compare"): OutputOption(
        "file", lambda ws, out: ["eval", "--compare", *map(str, ws.runs), "--html", out],
        lambda ws: {"run A": ws.runs[0], "run B": ws.runs[1]}, file_name="compare.html"),
    ("eval", "--profile", "with --from-run"): OutputOption(
        "file", lambda ws, out: ["eval", "--profile", out, "--from-run", str(ws.root / "runs" / "one-head.json")],
        lambda ws: {"the run": ws.root / "runs" / "one-head.json"}, file_name="speculation_profile.json"),
    ("vocab", "--out"): OutputOption(
        "file", lambda ws, out: ["vocab", str(ws.corpus), "--size", "10", "--out", out, "--tokenizer",
                                 str(ws.tokenizer)],
        lambda ws: {"a tokenizer file": ws.tokenizer / "tokenizer.json"}, file_name="token_freq.npy"),
    ("vocab", "--out", "a directory"): OutputOption(  # speculators' token_freq.pt, d2t-10.npy and t2d-10.npy
        "directory", lambda ws, out: ["vocab", str(ws.corpus), "--size", "10", "--out", out, "--tokenizer",
                                      str(ws.tokenizer)],
        lambda ws: {"the tokenizer directory": ws.tokenizer}),
}
# Path-typed parameters that are read, never written.
INPUTS = frozenset({("validate", "recipe"), ("build", "recipe"), ("audit", "--tokenizer"), ("export", "corpus_dir"),
                    ("export", "--tokenizer"), ("vocab", "corpus_dir"), ("vocab", "--tokenizer"),
                    ("publish", "corpus_dir"), ("publish", "--tokenizer"), ("eval", "pack"), ("eval", "--recipe"),
                    ("eval", "--compare"), ("eval", "--from-run"), ("publish", "--profile")})
# The speculating endpoint `corpus eval` replays its pack against (a scripted server on 127.0.0.1).
SPECULATING: dict[str, str] = {}


@pytest.fixture(scope="module", autouse=True)
def speculating_server() -> Iterator[None]:
    with FaultServer(speculative_tokens=3, accepted_per_draft=2) as server:
        SPECULATING["url"] = server.base_url
        yield
    SPECULATING.clear()

# Hostile values, by what they are; each a function of the workspace (the empty string as it is).
Value = Callable[[Workspace], "Path | str"]
HOSTILE: dict[str, Value] = {
    "the manifest": lambda ws: ws.corpus / MANIFEST,
    "a shard": lambda ws: ws.shard,
    "the ledger": lambda ws: ws.corpus / LEDGER,
    "a null device": lambda ws: ws.null_device,
    "an empty string": lambda ws: "",
}
HOSTILE_FOR: dict[Kind, dict[str, Value]] = {
    "file": {"a directory": lambda ws: ws.root / "a-directory", "the corpus directory": lambda ws: ws.corpus,
             "a missing parent directory": lambda ws: ws.root / "missing" / "out"},
    # A directory option creates its missing parents (`build --out new/corpus`): a file in their place is not.
    "directory": {"a regular file": lambda ws: ws.root / "plain.txt",
                  "a regular file as a parent": lambda ws: ws.root / "plain.txt" / "out",
                  "a directory inside the corpus": lambda ws: ws.corpus / "data",
                  "the corpus directory": lambda ws: ws.corpus},
}


def path_parameters() -> set[tuple[str, str]]:
    """(command, option or argument name) of every Path-typed parameter of the CLI."""
    return {(name, param.opts[0] if isinstance(param, click.Option) else str(param.name))
            for name, command in cli.commands.items() for param in command.params
            if isinstance(param.type, click.Path)}


def hostile_values(key: tuple[str, ...]) -> dict[str, Value]:
    option = OUTPUTS[key]
    values = {**HOSTILE, **HOSTILE_FOR[option.kind]}
    if option.rebuilds_corpus:
        del values["the corpus directory"]  # a rebuild: see test_a_fresh_path_is_written
    if option.kind == "file" and any(other[:2] == key[:2] and OUTPUTS[other].kind == "directory" for other in OUTPUTS):
        del values["a directory"]  # the option's directory form writes there (vocab --out DIR)
    if option.file_name:
        values["a missing parent directory"] = lambda ws: ws.root / "missing" / option.file_name
    names = option.inputs(Workspace(Path("/")))  # the inputs' names only
    values |= {f"its input: {name}": (lambda ws, name=name: option.inputs(ws)[name]) for name in names}
    refused = option.refused
    if refused is not None:
        values |= {name: (lambda ws, name=name: refused(ws)[name]) for name in refused(Workspace(Path("/")))}
    return values


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """`corpus ARGS` in this process: (exit code, standard error); an exception escaping main is exit -1."""
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["corpus", *args])
    try:
        main()
        code = 0
    except SystemExit as exited:
        code = exited.code if isinstance(exited.code, int) else 1
    except Exception:  # a traceback is a finding of the sweep, reported with its case
        return -1, traceback.format_exc()
    return code, capsys.readouterr().err


def test_every_path_parameter_of_the_cli_is_classified() -> None:
    found = path_parameters()
    swept = {key[:2] for key in OUTPUTS}
    unclassified = found - swept - INPUTS
    assert not unclassified, (f"Path-typed parameters neither swept as outputs nor listed as inputs: "
                              f"{sorted(unclassified)}; add each to OUTPUTS (with how to run it) or to INPUTS")
    assert swept | INPUTS <= found, f"classified but gone from the CLI: {sorted(swept | INPUTS - found)}"


CASES = [(key, case) for key in OUTPUTS for case in hostile_values(key)]


@pytest.mark.parametrize(("key", "case"), CASES, ids=[f"{' '.join(key)}: {case}" for key, case in CASES])
def test_a_hostile_output_path_is_refused_before_anything_is_written(
        workspace: Workspace, key: tuple[str, ...], case: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    option = OUTPUTS[key]
    out = str(hostile_values(key)[case](workspace))
    before = workspace.snapshot()
    code, err = run_cli(option.args(workspace, out), capsys, monkeypatch)
    assert code == 2, f"{' '.join(key)} {out!r} ({case}): exit {code}\n{err}"
    named = out if out else key[1]  # an empty path is named by its option
    assert err.startswith("error: ") and named in err and "Traceback" not in err, err
    if not out:
        assert "empty" in err, err
    changed = sorted(name for name in before.keys() | workspace.snapshot().keys()
                     if before.get(name) != workspace.snapshot().get(name))
    assert not changed, f"{' '.join(key)} {out!r} ({case}) changed {changed}"


FRESH: list[tuple[tuple[str, ...], str]] = [(key, "a new path") for key in OUTPUTS] + [
    (key, "the corpus it rebuilds") for key, option in OUTPUTS.items() if option.rebuilds_corpus]


@pytest.mark.parametrize(("key", "case"), FRESH, ids=[f"{' '.join(key)}: {case}" for key, case in FRESH])
def test_a_fresh_path_is_written(workspace: Workspace, key: tuple[str, ...], case: str,
                                 capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep's control: the same command lines succeed on a path that is theirs to write (so a refusal
    above is the path's doing, not the arguments')."""
    option = OUTPUTS[key]
    out = workspace.corpus if case == "the corpus it rebuilds" else workspace.root / "new" / (option.file_name or "dir")
    if option.kind == "file":  # a file is written into a directory that exists (a missing one is refused above)
        out.parent.mkdir()
    before = workspace.snapshot()
    code, err = run_cli(option.args(workspace, str(out)), capsys, monkeypatch)
    assert code == 0, err
    assert out.exists()
    kept = {name: digest for name, digest in before.items() if not (workspace.root / name).is_relative_to(out)}
    assert {name: workspace.snapshot().get(name) for name in kept} == kept


# Paths made of the workspace's own names, relative to it or absolute: they land on the corpus, its files, the
# inputs, the parents of them, or somewhere new.
NAMES = ["out", "data", MANIFEST, LEDGER, "src", "recipe.yaml", "log.jsonl", "tok", "tokenizer.json", "traffic.jsonl",
         "plain.txt", "a-directory", "null", "new", "report.html", "token_freq.npy", "runs", "a.json", "..", "."]
WALKS = st.tuples(st.booleans(), st.lists(st.sampled_from(NAMES), min_size=1, max_size=4), st.booleans())


@pytest.mark.parametrize("key", list(OUTPUTS), ids=[" ".join(key) for key in OUTPUTS])
@settings(parent=fuzz_settings(8), phases=[Phase.explicit, Phase.generate])  # a failing walk reads as drawn
@given(walk=WALKS)
def test_wherever_an_output_path_lands_the_corpus_and_the_inputs_are_untouched(
        template: Path, tmp_path: Path, key: tuple[str, ...], walk: tuple[bool, list[str], bool],
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    absolute, parts, slash = walk
    workspace = copied(template, Path(tempfile.mkdtemp(dir=tmp_path)) / "ws", monkeypatch)
    out = ("" if not absolute else f"{workspace.root}/") + "/".join(parts) + ("/" if slash else "")
    target = Path(os.path.realpath(workspace.root / out))
    assume(target.is_relative_to(workspace.root))  # the walk stays in the workspace
    option = OUTPUTS[key]
    before = workspace.snapshot()
    code, err = run_cli(option.args(workspace, out), capsys, monkeypatch)
    after = workspace.snapshot()
    changed = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    assert code in (0, 2), f"{' '.join(key)} {out!r}: exit {code}\n{err}"
    if code == 2:  # named as given, or as click's Path writes it (no trailing slash, no doubled ones)
        assert out in err or str(Path(out)) in err, err
        assert not changed, f"{' '.join(key)} {out!r}: changed {changed}\n{err}"
        return
    protected = [workspace.corpus, *option.inputs(workspace).values()]
    if option.rebuilds_corpus and target == workspace.corpus:
        protected.remove(workspace.corpus)  # a rebuild replaces the corpus there
    touched = [name for name in changed if any((workspace.root / name).is_relative_to(path) for path in protected)]
    assert not touched, f"{' '.join(key)} {out!r} changed {touched}, of the corpus or the inputs"
    parents = {name for name in after.keys() - before.keys() if target.is_relative_to(workspace.root / name)}
    outside = [name for name in changed if not (workspace.root / name).is_relative_to(target) and name not in parents]
    assert not outside, f"{' '.join(key)} {out!r} changed {outside} outside the output"
