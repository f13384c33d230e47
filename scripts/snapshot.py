"""A snapshot of what the build writes, to show that a change leaves every output byte-identical.

Builds a fixed set of recipes with the code of the tree this script lives in, then runs every command that reads
the written corpus, and writes one JSON of digests (and of the small reports whole, so a diff shows what moved):

* ``pinned``: the recipe of tests/assemble/test_pinned.py (recipes/data, exact dedup, a seeded split, small shards);
* ``messy``, ``messy-declared``, ``messy-nodedup``: the suite's real dumps (ShareGPT, chit-chat, tool traffic as
  logged and as glaive dumps it, serving logs folded by chat) with exact and near dedup, decontamination and the
  tiny model's tokenizer (a token budget, truncating); ``-declared`` adds a reasoning source, a declared mixture
  and an eval pack; ``-nodedup`` numbers the copies' ids;
* ``quickstart``: recipes/quickstart.yaml rebuilt from its journal with no server. The journal is made once, by a
  full build that launches the tiny model's vLLM server (about a minute), and kept in ``--cache``.

For each: every shard (its bytes, and a digest of its rows), the rows of each split (sorted: what the Ray engine
must write too, cut into other shards), the eval pack's, the ledger (decompressed), audit.json, manifest.json (its
files apart), recipe.yaml, every export format, ``corpus vocab --json``, ``corpus audit --json`` (alone and
``--against`` a source file) and ``corpus publish --dry-run``. Paths are under ``--work`` (fixed, so that the
recipes, and what they record, are the same from one run to the next).

    PYTHONPATH=. .venv/bin/python scripts/snapshot.py --out before.json [--engine local|ray] [--cases NAME ...]
    PYTHONPATH=. .venv/bin/python scripts/snapshot.py --compare before.json after.json

``--compare`` prints each key that differs and exits 1 when any does. The Ray engine cuts shards where its tasks
end: its snapshot has no ``shard_files``, and a comparison with a local one leaves them out.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import zstandard

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.messy import write_messy  # noqa: E402
from tests.support.real_data import write_chitchat, write_rows  # noqa: E402
from tests.support.serving_logs import logged_conversation  # noqa: E402
from tests.support.tool_chats import glaive_rows, log_rows  # noqa: E402

EXPORTS = ("speculators", "speculators-tokens", "specforge", "messages", "sharegpt")
TINY_MODEL = REPO / ".cache" / "tiny-model"
# Only shards are cut by the engine: everything else must be the same whichever engine wrote the corpus.
ENGINE_CUT = "shard_files"


@dataclass(frozen=True)
class Case:
    recipe: Path
    out: Path
    traffic: Path  # what `corpus audit --against` compares the corpus with
    tokenizer: bool  # the recipe names the target's tokenizer: vocab and the tokens export run
    pack: bool  # the corpus has an eval pack: the vllm-bench export runs


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def row_lines(path: Path) -> list[bytes]:
    return [orjson.dumps(row, option=orjson.OPT_SORT_KEYS) for row in pq.read_table(path).to_pylist()]


def messy_data(root: Path) -> None:
    """The real dumps of the Ray engine's tests (``tests.support.messy``), and tool traffic (logged, and as glaive
    dumps it) and serving logs folded by chat."""
    root.mkdir(parents=True)
    write_messy(root)
    write_rows(root / "tools.jsonl", log_rows() * 2)  # each row twice: the copy is a duplicate
    write_rows(root / "glaive.jsonl", glaive_rows())
    logged: list[dict[str, Any]] = []
    served = write_chitchat(root / "more-chitchat.jsonl", 240)[190:240]  # ten copies of chit-chat rows
    (root / "more-chitchat.jsonl").unlink()
    for index, chat in enumerate(served):
        logged += logged_conversation("nested", chat, session=f"s{index}", thinking=index % 3 == 0)
    write_rows(root / "served.jsonl", logged)


def messy_recipe(root: Path, name: str, *, dedup: str = "exact", tokenizer: bool = True, declared: bool = False
                 ) -> Path:
    data = root / "data"
    model = root.parent / "tiny-model"  # under the work directory: the same path whichever tree runs this
    if not model.exists():
        model.symlink_to(TINY_MODEL)
    near = "near_duplicates: {threshold: 0.8}, " if dedup == "exact" else ""
    budget = "max_seq_len: 2048, on_over_length: truncate, " if tokenizer else ""
    lines = [
        f"name: {name}",
        f"target: {{model: tiny/target{f', tokenizer: {model}' if tokenizer else ''}}}",
        *(["mixture: {total: 300, thinking_share: {target: 0.15, tolerance: 0.02}, seed: 7}",
           "eval: {fraction: 0.15, seed: 3}"] if declared else []),
        "sources:",
        f"  - {{name: chitchat, kind: replay, path: {data}/chitchat.jsonl}}",
        f"  - {{name: sharegpt, kind: replay, path: {data}/sharegpt.jsonl, mapping: {{style: sharegpt}}"
        f"{', target: {count: 80}' if declared else ''}}}",
        f"  - {{name: mirror, kind: replay, path: {data}/mirror.jsonl}}",
        f"  - {{name: tools, kind: replay, path: {data}/tools.jsonl}}",
        f"  - {{name: glaive, kind: replay, path: {data}/glaive.jsonl, mapping: {{style: sharegpt}}}}",
        f"  - {{name: served, kind: replay, path: {data}/served.jsonl, task: chat}}",
        *([f"  - {{name: reasoning, kind: replay, path: {data}/reasoning.jsonl}}"] if declared else []),
        f"checks: {{{budget}{near}dedup: {dedup}}}",
        f"decontamination: {{eval_sets: [{{name: held, path: {data}/eval.jsonl, fields: [question]}}]}}",
        "split: {validation_fraction: 0.2, seed: 3}",
        "output: {dir: out, rows_per_shard: 40}",
    ]
    path = root / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def pinned_case(work: Path, cache: Path) -> Case:
    root = work / "pinned"
    root.mkdir(parents=True)
    data = root / "data"  # under ``work``: the same paths whichever tree runs this
    shutil.copytree(REPO / "recipes" / "data", data)
    recipe = root / "recipe.yaml"
    pinned = REPO / "tests" / "assemble" / "pinned_recipe.yaml"  # the pinned test's own recipe
    recipe.write_text(pinned.read_text(encoding="utf-8").format(data=data), encoding="utf-8")
    return Case(recipe, root / "out", data / "workload-chat.jsonl.zst", tokenizer=False, pack=False)


def messy_case(name: str, **options: Any) -> Callable[[Path, Path], Case]:
    def make(work: Path, cache: Path) -> Case:
        root = work / name
        root.mkdir(parents=True)
        shared = work / "messy-data"
        if not shared.exists():
            messy_data(shared)
        (root / "data").symlink_to(shared)
        recipe = messy_recipe(root, name, **options)
        return Case(recipe, root / "out", shared / "sharegpt.jsonl", tokenizer=options.get("tokenizer", True),
                    pack=options.get("declared", False))
    return make


def quickstart_case(work: Path, cache: Path) -> Case:
    """recipes/quickstart.yaml in a tree of its own under ``work`` (its paths are relative to it), its journal the
    one kept in ``cache`` (made by a build that launches the server when there is none yet)."""
    root = work / "quickstart"
    shutil.copytree(REPO / "recipes", root / "recipes")
    (root / ".cache").mkdir()
    (root / ".cache" / "tiny-model").symlink_to(TINY_MODEL)
    recipe = root / "recipes" / "quickstart.yaml"
    out = root / "out" / "quickstart"
    kept = cache / "quickstart-journal"
    if not kept.is_dir():
        print(f"quickstart: no journal in {kept}: a full build, with a launched server", file=sys.stderr)
        from corpus_builder.assemble import build_corpus
        from corpus_builder.recipe import load_recipe

        build_corpus(load_recipe(recipe), out, engine="local")
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(out / "journal", kept)
        shutil.rmtree(out)
    shutil.copytree(kept, out / "journal")
    return Case(recipe, out, root / "recipes" / "data" / "workload-chat.jsonl.zst", tokenizer=True, pack=False)


CASES: dict[str, Callable[[Path, Path], Case]] = {
    "pinned": pinned_case,
    "messy": messy_case("messy"),
    "messy-declared": messy_case("messy-declared", declared=True),
    "messy-nodedup": messy_case("messy-nodedup", dedup="none", tokenizer=False),
    "quickstart": quickstart_case,
}


def run_cli(*args: str, work: Path) -> dict[str, Any]:
    """A command of the CLI, in this process: its exit code and output (paths under ``work`` written <work>)."""
    from click.testing import CliRunner

    from corpus_builder.cli import cli

    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return {"exit": result.exit_code, "output": result.output.replace(str(work), "<work>")}


def parsed(result: dict[str, Any]) -> Any:
    """A command's JSON output, parsed (its text when it is not JSON)."""
    try:
        return {"exit": result["exit"], "json": orjson.loads(result["output"])}
    except orjson.JSONDecodeError:
        return result


def files_digest(directory: Path) -> dict[str, Any]:
    """Every file under ``directory``: its bytes, and its lines sorted (the same rows in another order)."""
    digests = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.name.endswith(".zst"):
            data = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()
        entry = {"sha256": digest(data), "bytes": len(data)}
        if path.suffix in (".jsonl", ".zst"):
            entry["sorted_lines"] = digest(b"\n".join(sorted(data.splitlines())))
        elif path.suffix == ".parquet":
            entry["sorted_rows"] = digest(b"\n".join(sorted(row_lines(path))))
        digests[str(path.relative_to(directory))] = entry
    return digests


def rows_by_split(corpus: Path, directory: str) -> dict[str, Any]:
    by_split: dict[str, list[bytes]] = {}
    for shard in sorted((corpus / directory).glob("*.parquet")):
        for line in row_lines(shard):
            by_split.setdefault(orjson.loads(line)["split"], []).append(line)
    return {split: {"rows": len(lines), "sorted_rows": digest(b"\n".join(sorted(lines)))}
            for split, lines in sorted(by_split.items())}


def snapshot_case(case: Case, engine: str, work: Path) -> dict[str, Any]:
    from corpus_builder.assemble import build_corpus
    from corpus_builder.recipe import load_recipe

    build_corpus(load_recipe(case.recipe), case.out, engine=engine, progress=io.StringIO())  # type: ignore[arg-type]
    out = case.out
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    files = manifest.pop("files")
    for split in manifest["splits"].values():
        split.pop("shards")  # how many: the engine's cut
    snapshot: dict[str, Any] = {
        "rows": rows_by_split(out, "data"),
        "eval_rows": rows_by_split(out, "eval"),
        "ledger": files_digest(out)["ledger.jsonl.zst"],
        "audit.json": orjson.loads((out / "audit.json").read_bytes()),
        "manifest.json": manifest,
        "recipe.yaml": digest((out / "recipe.yaml").read_bytes()),
    }
    if engine == "local":
        snapshot[ENGINE_CUT] = {entry["path"]: {"sha256": entry["sha256"], "rows": entry["rows"],
                                                "row_digest": digest(b"\n".join(row_lines(out / entry["path"])))}
                                for entry in files}
    exports: dict[str, Any] = {}
    for fmt in EXPORTS:
        if fmt == "speculators-tokens" and not case.tokenizer:
            continue
        target = work / "exports" / out.parent.name / fmt
        result = run_cli("export", str(out), "--format", fmt, "--out", str(target), work=work)
        exports[fmt] = {"exit": result["exit"], "files": files_digest(target) if target.exists() else None}
    if case.pack:
        target = work / "exports" / out.parent.name / "vllm-bench"
        result = run_cli("export", str(out), "--format", "vllm-bench", "--out", str(target), work=work)
        exports["vllm-bench"] = {"exit": result["exit"], "files": files_digest(target) if target.exists() else None}
    snapshot["exports"] = exports
    if case.tokenizer:
        snapshot["vocab --json"] = parsed(run_cli("vocab", str(out), "--json", "--draft-vocab-size", "4096", "--out",
                                                  str(work / "exports" / out.parent.name / "freq.npy"), work=work))
    snapshot["audit --json"] = parsed(run_cli("audit", str(out), "--json", work=work))
    snapshot["audit --json --against"] = parsed(run_cli("audit", str(out), "--json", "--against", str(case.traffic),
                                                        "--allow-other-models", "--engine", engine, work=work))
    published = run_cli("publish", str(out), "--repo", "snapshot/corpus", "--dry-run", work=work)
    # the shards' names and digests (in the list and the card, and so the card's and manifest's own digests) are
    # the engine's cut: the rest must be the same
    snapshot["publish --dry-run"] = {"exit": published["exit"], "output": [
        line for line in published["output"].splitlines()
        if not any(name in line for name in ("data/train-", "data/validation-", "README.md ", "manifest.json "))]}
    if engine == "local":
        snapshot[ENGINE_CUT]["publish --dry-run"] = digest(published["output"].encode())
    return snapshot


@contextmanager
def engine_cluster(engine: str) -> Iterator[None]:
    """The Ray engine's builds join one local cluster of two workers started here (as the tests start theirs)."""
    if engine != "ray":
        yield
        return
    sys.path.insert(0, str(REPO))
    from tests.support.ray_cluster import local_cluster

    with local_cluster():
        yield


def compare(before: Path, after: Path) -> int:
    """Print every key whose value differs (``shard_files`` only when both snapshots have them)."""
    old, new = orjson.loads(before.read_bytes()), orjson.loads(after.read_bytes())
    differences = list(_differences(old, new, ""))
    for line in differences:
        print(line)
    print(f"{len(differences)} difference(s)")
    return 1 if differences else 0


def _differences(old: Any, new: Any, where: str) -> Iterator[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            if key == ENGINE_CUT and (key not in old or key not in new):
                continue
            if key not in old or key not in new:
                yield f"{where}/{key}: only in {'after' if key not in old else 'before'}"
            else:
                yield from _differences(old[key], new[key], f"{where}/{key}")
    elif old != new:
        yield f"{where}: {str(old)[:200]} != {str(new)[:200]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="the snapshot's JSON")
    parser.add_argument("--engine", choices=["local", "ray"], default="local")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--work", type=Path, default=Path("/tmp/corpus-snapshot"),
                        help="where the recipes and corpora are written (emptied first)")
    parser.add_argument("--cache", type=Path, default=REPO / ".cache" / "snapshot",
                        help="where the quickstart's journal is kept")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        parser.error("--out is required (or --compare)")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    snapshot: dict[str, Any] = {}
    with engine_cluster(args.engine):
        for name in args.cases:
            print(f"snapshot: {name} ({args.engine})", file=sys.stderr)
            snapshot[name] = snapshot_case(CASES[name](args.work, args.cache), args.engine, args.work)
    args.out.write_bytes(orjson.dumps(snapshot, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
