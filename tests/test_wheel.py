"""The wheel: installed without extras, every module it ships imports and the `corpus` command runs.

The wheel goes into a bare venv (no system site-packages) with pip --no-deps; its core dependencies, and
theirs, are linked in file by file from this environment (so the test needs no network and installs nothing),
and nothing else is: an import of something only an extra brings (psutil, transformers, vllm, datasets...)
fails there as it would for a user who ran `pip install corpus-builder`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from corpus_builder._version import __version__

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

IMPORT_EACH = """
import importlib, json, sys, traceback
failures = {}
for name in sys.argv[2:]:
    try:
        module = importlib.import_module(name)
    except BaseException as error:
        failures[name] = "".join(traceback.format_exception_only(error)).strip()
    else:
        if not module.__file__.startswith(sys.argv[1]):
            failures[name] = f"imported from {module.__file__}, not the venv"
print(json.dumps(failures))
"""


def build_wheel(tmp_path: Path) -> Path:
    """The wheel of a copy of the checkout (setuptools writes build/ and *.egg-info beside its input)."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "corpus_builder", source / "corpus_builder", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--wheel-dir", str(tmp_path / "dist"), str(source)], check=True)
    [wheel] = (tmp_path / "dist").glob("corpus_builder-*.whl")
    return wheel


def core_requirements(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as opened:
        [name] = [n for n in opened.namelist() if n.endswith(".dist-info/METADATA")]
        lines = opened.read(name).decode().splitlines()
    requirements = [Requirement(line.split(":", 1)[1]) for line in lines if line.startswith("Requires-Dist:")]
    return [r for r in requirements if r.marker is None or r.marker.evaluate({"extra": ""})]


def dependency_closure(requirements: list[Requirement]) -> list[metadata.Distribution]:
    """The installed distributions these requirements need, with what they need in turn (markers and extras
    evaluated as pip would here)."""
    found: dict[str, metadata.Distribution] = {}
    expanded: set[tuple[str, str]] = set()  # (distribution, extra) pairs whose requirements are wanted
    wanted = list(requirements)
    while wanted:
        requirement = wanted.pop()
        try:
            distribution = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            pytest.fail(f"{requirement} (a core dependency or one of theirs) is not installed here")
        name = distribution.metadata["Name"]
        found[name] = distribution
        for extra in {"", *requirement.extras} - {e for n, e in expanded if n == name}:
            expanded.add((name, extra))
            needs = [Requirement(line) for line in distribution.requires or ()]
            wanted.extend(r for r in needs if r.marker is None or r.marker.evaluate({"extra": extra}))
    return list(found.values())


def link_into(site_packages: Path, distribution: metadata.Distribution) -> None:
    """Symlink each file the distribution installed under site-packages (not its scripts, not bytecode)."""
    assert distribution.files is not None, f"{distribution.metadata['Name']} has no RECORD"
    for file in distribution.files:
        if file.parts[0] == ".." or "__pycache__" in file.parts:
            continue
        source = Path(str(distribution.locate_file(file)))
        target = site_packages / file
        if source.exists() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source)


def test_the_wheel_without_extras_imports_every_module_it_ships_but_the_ray_engine(tmp_path: Path) -> None:
    """Every module imports with the core dependencies alone, but the Ray engine itself (assemble/ray_data.py,
    audit/ray_data.py and their connection, ray_cluster.py), which a build or an audit imports only when asked for
    ``--engine ray`` and which then says to install the ``ray`` extra."""
    wheel = build_wheel(tmp_path)
    assert wheel.name.startswith(f"corpus_builder-{__version__}-")  # pyproject.toml's version is the package's
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", str(wheel)], check=True)
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site_packages = Path(subprocess.run([str(python), "-I", "-c", where], capture_output=True, text=True,
                                        check=True).stdout.strip())
    assert site_packages.is_relative_to(venv) and site_packages != Path(sysconfig.get_path("purelib"))
    for distribution in dependency_closure(core_requirements(wheel)):
        link_into(site_packages, distribution)
    checked = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "check"], capture_output=True,
                             text=True)
    assert checked.returncode == 0, checked.stdout  # the linked set is what the wheel needs, complete
    with zipfile.ZipFile(wheel) as opened:
        modules = sorted(name.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
                         for name in opened.namelist() if name.endswith(".py") and not name.endswith("__main__.py"))
    assert "corpus_builder.testing.fault_server" in modules  # the test kit ships; the trials (tests/support) do not
    imported = subprocess.run([str(python), "-I", "-c", IMPORT_EACH, str(site_packages), *modules],
                              capture_output=True, text=True, cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    assert json.loads(imported.stdout) == {
        "corpus_builder.audit.ray_data": "ModuleNotFoundError: No module named 'ray'",
        "corpus_builder.assemble.ray_data": "ModuleNotFoundError: No module named 'ray'",
        "corpus_builder.ray_cluster": "ModuleNotFoundError: No module named 'ray'"}
    for command in ([str(venv / "bin" / "corpus"), "--help"], [str(python), "-I", "-m", "corpus_builder", "--help"]):
        ran = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
        assert ran.returncode == 0 and "build" in ran.stdout, ran.stderr
    shown = subprocess.run([str(venv / "bin" / "corpus"), "--version"], capture_output=True, text=True, cwd=tmp_path)
    assert shown.stdout.split() == ["corpus,", "version", __version__], shown.stderr
