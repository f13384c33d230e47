"""Recipe checks the schema cannot express: cross-field rules, files that must exist, derived defaults."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..trainer_formats import IN_TARGET_TOKENS
from .model import CANDIDATE_AT_THRESHOLD, band_layout, least_permutations
from .schema import recipe_schema
from .yaml_reader import KeyPath, Parsed, Problem


def match_source_pattern(base_dir: Path, pattern: str) -> list[Path]:
    """Files a source's path pattern names (a path or a glob, `**` allowed), relative to base_dir, sorted;
    each file once, by its real path (a symlink loop or a link to a file already matched adds nothing).

    One rule for the recipe check and the readers, so a recipe that validates reads the same files.
    """
    # The recipe's own directory may contain glob characters: only the pattern may expand.
    full = pattern if os.path.isabs(pattern) else os.path.join(glob.escape(str(base_dir)), pattern)
    by_real_path: dict[str, str] = {}
    for match in _glob(full):
        if os.path.isfile(match):
            real = os.path.realpath(match)
            known = by_real_path.get(real)
            if known is None or _name_rank(match) < _name_rank(known):
                by_real_path[real] = match
    return sorted(Path(match) for match in by_real_path.values())


def _name_rank(path: str) -> tuple[bool, int, str]:
    """Which of a file's names provenance shows: its own name before a symlink to it, then the shortest
    (data/x.jsonl, not data/loop/loop/x.jsonl)."""
    return os.path.islink(path), path.count(os.sep), path


def _glob(pattern: str) -> Iterator[str]:
    """``glob.glob(pattern, recursive=True)``, except that ``**`` enters every real directory once: glob follows
    symlinks into directories without end, so one loop repeats each file 41 times and two never finish."""
    parts = pattern.split(os.sep)
    if "**" not in parts:
        yield from glob.iglob(pattern)  # no recursion: the pattern's own depth bounds the walk
        return
    at = parts.index("**")
    rest = parts[at + 1:] or ["*"]  # a trailing ** matches every file below
    prefix = os.sep.join(parts[:at]) or (os.sep if pattern.startswith(os.sep) else os.curdir)
    for top in glob.iglob(prefix):
        for directory in _real_directories(top):
            yield from _glob(os.path.join(glob.escape(directory), *rest))


def _real_directories(top: str) -> Iterator[str]:
    """``top`` and every directory below it, each real directory once (by its first name); hidden ones are
    skipped, as glob's ``**`` skips them."""
    seen: set[str] = set()
    pending = [top]
    while pending:
        directory = pending.pop()
        real = os.path.realpath(directory)
        if real in seen or not os.path.isdir(directory):
            continue
        seen.add(real)
        yield directory
        try:
            with os.scandir(directory) as entries:
                children = sorted(entry.path for entry in entries
                                  if not entry.name.startswith(".") and entry.is_dir())
        except OSError:
            continue  # unreadable: glob skips it too
        pending += reversed(children)  # depth first, in name order


def _section(document: object, *keys: str) -> dict[str, object]:
    """document[k1][k2]... when each step is a mapping, else {}: checks must survive invalid documents,
    since the schema's own problems are reported alongside theirs."""
    for key in keys:
        document = document.get(key) if isinstance(document, dict) else None
    return document if isinstance(document, dict) else {}


def fill_derived(document: dict[str, Any]) -> dict[str, Any]:
    """Defaults computed from other settings (the schema's descriptions state them)."""
    generation = _section(document, "target", "generation")
    max_tokens = generation.get("max_tokens")
    if generation.get("on_length") == "retry" and "retry_max_tokens" not in generation and isinstance(
        max_tokens, int
    ):
        generation["retry_max_tokens"] = 2 * max_tokens
    return document


def _looks_up(path: Path, check: Callable[[Path], bool]) -> bool:
    """``check(path)``, a path the system cannot even look up (a name too long, a NUL byte) being absent."""
    try:
        return check(path)
    except (OSError, ValueError):
        return False


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(written: str) -> bool:
    """ORG/NAME, as the Hub names a model."""
    return bool(_HUB_ID.match(written))


def names_hub_model(base_dir: Path, written: str) -> bool:
    """A tokenizer setting that names a Hub model rather than a directory: ORG/NAME where no ORG directory is
    next to the recipe (models/tok with a models/ folder here is a path, mistyped or not)."""
    return is_hub_id(written) and not _looks_up(local_path(base_dir, written).parent, Path.is_dir)


def tokenizer_is_hub(base_dir: Path, written: str) -> bool:
    """``target.tokenizer`` read as a Hub model id: no such directory next to the recipe, and a Hub name."""
    return not _looks_up(local_path(base_dir, written), Path.is_dir) and names_hub_model(base_dir, written)


def needs_target_tokens(document: object) -> bool:
    """The recipe counts in the target's tokens (checks.max_seq_len or an export in them, ``IN_TARGET_TOKENS``)."""
    return bool(_target_token_uses(document))


def _target_token_uses(document: object) -> list[tuple[KeyPath, str]]:
    """Each setting that counts in the target's tokens, with why it needs the tokenizer."""
    uses: list[tuple[KeyPath, str]] = []
    for section in ("output", "publish"):
        exports = _section(document, section).get("exports")
        uses += [((section, "exports", index, "format"), f"{export['format']} rows are in the target's tokens: "
                                                        "set target.tokenizer")
                 for index, export in enumerate(exports if isinstance(exports, list) else [])
                 if isinstance(export, dict) and export.get("format") in IN_TARGET_TOKENS]
    if "max_seq_len" in _section(document, "checks"):
        uses.append((("checks", "max_seq_len"), "max_seq_len counts tokens in the target's tokenizer: "
                                                "set target.tokenizer (a directory, or a Hub model id)"))
    return uses


def local_path(base_dir: Path, written: str) -> Path:
    """A path setting as the tools use it: relative to the recipe's directory unless absolute."""
    return base_dir / written


def cross_field_problems(document: Mapping[str, object], base_dir: Path, parsed: Parsed) -> list[Problem]:
    problems: list[Problem] = []

    def report(path: KeyPath, message: str, at_key: bool = False) -> None:
        problems.append(parsed.problem(path, message, at_key))

    target = _section(document, "target")
    written_sources = document.get("sources")
    sources: list[object] = written_sources if isinstance(written_sources, list) else []

    first_use: dict[str, int] = {}
    for index, source in enumerate(sources):
        if not isinstance(source, dict):
            continue
        name = source.get("name")
        if isinstance(name, str):
            if name in first_use:
                report(("sources", index, "name"), f"source name '{name}' is already used by "
                                                   f"sources[{first_use[name]}]; names must be unique")
            else:
                first_use[name] = index
        written = source.get("path")
        patterns: list[tuple[KeyPath, str]]
        if isinstance(written, str):
            patterns = [(("sources", index, "path"), written)]
        elif isinstance(written, list):
            patterns = [(("sources", index, "path", i), pattern)
                        for i, pattern in enumerate(written) if isinstance(pattern, str)]
        else:
            patterns = []
        for key_path, pattern in patterns:
            if not match_source_pattern(base_dir, pattern):
                report(key_path, f"no file matches '{pattern}' (looked in {base_dir})")
        mapping = _section(source, "mapping")
        if mapping.get("style") == "field" and "field" not in mapping:
            report(("sources", index, "mapping"), "mapping style 'field' needs mapping.field "
                                                  "(the field that holds the prompt text)", at_key=True)

    tokenizer = target.get("tokenizer")
    if isinstance(tokenizer, str) and not tokenizer_is_hub(base_dir, tokenizer):
        directory = local_path(base_dir, tokenizer)
        if not _looks_up(directory, Path.is_dir):
            report(("target", "tokenizer"), f"tokenizer directory not found: {directory} (nor is it a Hub model id, "
                                            "ORG/NAME)")
        elif not _looks_up(directory / "tokenizer.json", Path.is_file):
            report(("target", "tokenizer"), f"tokenizer directory has no tokenizer.json: {directory}")
    model = target.get("model")
    if tokenizer is None and not (isinstance(model, str) and is_hub_id(model)):
        for key_path, message in _target_token_uses(document):
            report(key_path, message)

    launch = _section(target, "launch")
    model_dir = launch.get("model_dir")
    if isinstance(model_dir, str) and not _looks_up(local_path(base_dir, model_dir), Path.is_dir):
        report(("target", "launch", "model_dir"),
               f"model directory not found: {local_path(base_dir, model_dir)}")

    prompt_sources = [s.get("name") for s in sources if isinstance(s, dict) and s.get("kind") == "prompts"]
    if prompt_sources and not (target.get("endpoints") or launch or target.get("backend") == "engine"):
        names = ", ".join(f"'{n}'" for n in prompt_sources)
        report(("target",), f"prompts source(s) {names} need the target to generate: set target.endpoints, "
                            "target.launch, or target.backend: engine", at_key=True)

    generation = _section(target, "generation")
    retry_budget, budget = generation.get("retry_max_tokens"), generation.get("max_tokens")
    if (generation.get("on_length") == "retry" and isinstance(retry_budget, int)
            and isinstance(budget, int) and retry_budget <= budget):
        report(("target", "generation", "retry_max_tokens"),
               f"retry_max_tokens ({retry_budget}) must be larger than max_tokens ({budget}): "
               "the retry exists to give a truncated generation more room")
    problems += _mixture_problems(document, sources, parsed)
    problems += _dedup_problems(document, first_use, base_dir, parsed)
    problems += _eval_pack_problems(document, sources, parsed)
    return problems


def _eval_pack_problems(document: Mapping[str, object], sources: list[object], parsed: Parsed) -> list[Problem]:
    """The eval pack is cut from replayed traffic: a prompts source's answers do not exist until generated."""
    problems = [parsed.problem(("sources", index, "eval"), "only replay sources are held out in the eval pack: a "
                               "prompts source's answers are generated by the build", at_key=True)
                for index, source in enumerate(sources)
                if isinstance(source, dict) and "eval" in source and source.get("kind") != "replay"]
    if "eval" in document and not any(isinstance(s, dict) and s.get("kind") == "replay" for s in sources):
        problems.append(parsed.problem(("eval",), "the eval pack is held out of replay sources, and the recipe has "
                                       "none", at_key=True))
    return problems


def _dedup_problems(document: Mapping[str, object], source_names: dict[str, int], base_dir: Path, parsed: Parsed
                    ) -> list[Problem]:
    """Dedup priorities name sources; evaluation sets have unique names and files that are there."""
    problems = []
    checks = _section(document, "checks")
    priority = checks.get("dedup_priority")
    for index, name in enumerate(priority if isinstance(priority, list) else []):
        if isinstance(name, str) and name not in source_names:
            known = ", ".join(f"'{n}'" for n in source_names) or "none"
            problems.append(parsed.problem(("checks", "dedup_priority", index),
                                           f"no source is named '{name}' (sources: {known})"))
    if "near_duplicates" in checks and checks.get("dedup") == "none":
        problems.append(parsed.problem(("checks", "near_duplicates"), "near duplicates compare the text dedup "
                                       "compares: set checks.dedup to exact or prompt", at_key=True))
    problems += _near_duplicate_problems(_section(checks, "near_duplicates"), parsed)
    decontamination = _section(document, "decontamination")
    ngram, min_words = decontamination.get("ngram", 13), decontamination.get("min_words", 8)
    if isinstance(ngram, int) and isinstance(min_words, int) and min_words > ngram:
        problems.append(parsed.problem(("decontamination", "min_words"), f"min_words ({min_words}) cannot be more "
                                       f"than ngram ({ngram}): a text of ngram words is always a run"))
    eval_sets = decontamination.get("eval_sets")
    seen: dict[str, int] = {}
    for index, spec in enumerate(eval_sets if isinstance(eval_sets, list) else []):
        if not isinstance(spec, dict):
            continue
        name, path = spec.get("name"), spec.get("path")
        if isinstance(name, str):
            if name in seen:
                problems.append(parsed.problem(("decontamination", "eval_sets", index, "name"),
                                               f"eval set name '{name}' is already used by eval_sets[{seen[name]}]"))
            seen.setdefault(name, index)
        if isinstance(path, str) and not _looks_up(local_path(base_dir, path), Path.is_file):
            problems.append(parsed.problem(("decontamination", "eval_sets", index, "path"),
                                           f"file not found: {local_path(base_dir, path)}"))
    return problems


def _near_duplicate_problems(near: Mapping[str, object], parsed: Parsed) -> list[Problem]:
    """Near-duplicate settings with no LSH band layout (the build's rule): checked within the schema's bounds of
    num_perm, the schema reports the others."""
    bounds = recipe_schema()["properties"]["checks"]["properties"]["near_duplicates"]["properties"]["num_perm"]
    threshold, num_perm = near.get("threshold"), near.get("num_perm")
    if not (isinstance(threshold, int | float) and 0 < threshold <= 1 and isinstance(num_perm, int)
            and bounds["minimum"] <= num_perm <= bounds["maximum"]):
        return []
    try:
        band_layout(threshold, num_perm)
        return []
    except ValueError:
        least = least_permutations(threshold, bounds["maximum"])
    fix = (f"this threshold needs num_perm >= {least:,}): raise num_perm or the threshold" if least is not None
           else f"no num_perm up to {bounds['maximum']:,} has one): raise the threshold")
    return [parsed.problem(("checks", "near_duplicates", "threshold"), (
        f"no LSH band layout of {num_perm:,} permutations finds pairs at similarity {threshold:g} with "
        f"probability {CANDIDATE_AT_THRESHOLD:g} ({fix}"))]


def _mixture_problems(document: Mapping[str, object], sources: list[object], parsed: Parsed) -> list[Problem]:
    """A declared corpus must be one that can be computed: targets instead of takes, shares that leave room."""
    problems = []
    shares = []
    for index, source in enumerate(sources):
        if not isinstance(source, dict):
            continue
        target = source.get("target")
        if isinstance(target, dict) and "take" in source:
            problems.append(parsed.problem(("sources", index, "take"), "a source with a target gets the rows the "
                                           "build chooses to meet it: remove take", at_key=True))
        if isinstance(target, dict) and isinstance(target.get("share"), int | float):
            shares.append(float(target["share"]))
        off = source.get("thinking_off_share")
        if isinstance(off, int | float) and off > 0 and source.get("kind") != "prompts":
            problems.append(parsed.problem(("sources", index, "thinking_off_share"), "only prompts sources are "
                                           "generated: a replay source keeps the mode it was served in", at_key=True))
        for setting in ("tool_choice", "tool_results"):
            if setting in source and source.get("kind") != "prompts":
                problems.append(parsed.problem(("sources", index, setting), "only prompts sources are generated: "
                                               "a replay source keeps the tool calls and results it recorded",
                                               at_key=True))
    total = _section(document, "mixture").get("total")
    has_total = isinstance(total, int)
    if sum(shares) > 1 or (sum(shares) == 1 and not has_total) or (
            shares and not has_total and all(isinstance(s, dict) and isinstance(s.get("target"), dict)
                                             and "share" in s["target"] for s in sources)):
        problems.append(parsed.problem(("mixture",), f"the sources' shares add up to {sum(shares):g}: with every "
                                       "source a share, set mixture.total; shares cannot exceed 1", at_key=True))
    elif isinstance(total, int):
        problems += _total_problems(total, sources, shares, parsed)
    return problems


def _total_problems(total: int, sources: list[object], shares: list[float], parsed: Parsed) -> list[Problem]:
    """``mixture.total`` against the targets: the counts and the shares' rows must leave room within it, and
    with every source a target they must make it up (within the one row a share rounds to)."""
    counts = [source["target"]["count"] for source in sources if isinstance(source, dict)
              and isinstance(source.get("target"), dict) and isinstance(source["target"].get("count"), int)]
    open_sources = [source for source in sources if isinstance(source, dict) and "target" not in source]
    counted, share_rows = sum(counts), sum(shares) * total
    left = total - counted - share_rows
    if counted > total:
        message = f"the sources' counts add up to {counted:,}, more than mixture.total ({total:,})"
    elif left <= -1 + 1e-9:
        message = (f"the sources' counts ({counted:,} rows) and shares ({sum(shares):g} of {total:,}: "
                   f"{share_rows:,.1f} rows) add up to more than mixture.total ({total:,})")
    elif left >= 1 - 1e-9 and not open_sources:
        message = (f"every source has a target and they add up to {counted + share_rows:,.1f} rows, not "
                   f"mixture.total ({total:,}): give a source no target to fill the rest, or change the total")
    else:
        return []
    return [parsed.problem(("mixture", "total"), message)]

