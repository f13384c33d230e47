"""The dataset card (README.md): Hub metadata in YAML front matter, then a mixture card in the manner
of allenai's tulu-3-sft-mixture: per-source composition and licenses, thinking share, the generating
model and its settings, drop counts by reason, the recipe and a ``load_dataset`` snippet.

Everything comes from the corpus's own files (audit.json, manifest.json, recipe.yaml). Local paths
and URL credentials are removed from whatever is shown, and the card is scanned for secrets before upload.
Those files may have been edited by hand: a field of an unexpected type is shown as far as it makes sense
or left out, never a reason to fail, and lists of token ids are summarised, never printed.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

import yaml

from ..errors import REASONS, URL_USERINFO_RE
from ..export.formats import TOKEN_FORMAT, TRAINER_FORMATS
from ..layout import Manifest
from ..secrets import map_strings
from .exports import PublishedExport
from .gate import CorpusDocuments, mapping

if TYPE_CHECKING:
    from .profiles import AttachedProfile

# The Hub's size_categories vocabulary, as (exclusive upper bound, label).
SIZE_CATEGORIES: tuple[tuple[float, str], ...] = (
    (1e3, "n<1K"), (1e4, "1K<n<10K"), (1e5, "10K<n<100K"), (1e6, "100K<n<1M"), (1e7, "1M<n<10M"),
    (1e8, "10M<n<100M"), (1e9, "100M<n<1B"), (1e10, "1B<n<10B"), (1e11, "10B<n<100B"), (1e12, "100B<n<1T"),
    (float("inf"), "n>1T"),
)
# License ids the Hub accepts in card metadata (anything else is published as `other`, named in the body).
HUB_LICENSES = frozenset((
    "apache-2.0", "mit", "openrail", "bigscience-openrail-m", "creativeml-openrail-m",
    "bigscience-bloom-rail-1.0", "bigcode-openrail-m", "afl-3.0", "artistic-2.0", "bsl-1.0", "bsd",
    "bsd-2-clause", "bsd-3-clause", "bsd-3-clause-clear", "c-uda", "cc", "cc0-1.0", "cc-by-2.0",
    "cc-by-2.5", "cc-by-3.0", "cc-by-4.0", "cc-by-sa-3.0", "cc-by-sa-4.0", "cc-by-nc-2.0", "cc-by-nc-3.0",
    "cc-by-nc-4.0", "cc-by-nd-4.0", "cc-by-nc-nd-3.0", "cc-by-nc-nd-4.0", "cc-by-nc-sa-2.0",
    "cc-by-nc-sa-3.0", "cc-by-nc-sa-4.0", "cdla-sharing-1.0", "cdla-permissive-1.0", "cdla-permissive-2.0",
    "wtfpl", "ecl-2.0", "epl-1.0", "epl-2.0", "etalab-2.0", "eupl-1.1", "eupl-1.2", "agpl-3.0", "gfdl",
    "gpl", "gpl-2.0", "gpl-3.0", "lgpl", "lgpl-2.1", "lgpl-3.0", "isc", "lppl-1.3c", "ms-pl", "mpl-2.0",
    "odc-by", "odbl", "openrail++", "osl-3.0", "postgresql", "ofl-1.1", "ncsa", "unlicense", "zlib", "pddl",
    "lgpl-lr", "llama2", "llama3", "llama3.1", "llama3.2", "llama3.3", "gemma", "unknown"
))
DEFAULT_LANGUAGE = ("en",)
LOCAL_PATH = "<local path>"

# Absolute POSIX paths (not the path part of a URL: those follow a host character), home-relative
# paths and Windows drive paths.
_LOCAL_PATH_RE = re.compile(
    r"(?<![\w:/.~-])/(?:[\w.@+-]+/)*[\w.@+-]+/?"
    r"|(?<![\w/])~[\w.-]*(?:/[^\s'\"]*)?"
    r"|\b[A-Za-z]:\\[^\s'\"]*"
)


def scrub_local_paths(text: str) -> str:
    """Replace absolute and home-directory paths with a placeholder and drop credentials from URLs."""
    return _LOCAL_PATH_RE.sub(LOCAL_PATH, URL_USERINFO_RE.sub("", text))


def scrub_value(value: object) -> object:
    """``scrub_local_paths`` applied to every string inside a JSON-like value."""
    return map_strings(scrub_local_paths, value)


def size_category(rows: int) -> str:
    return next(label for bound, label in SIZE_CATEGORIES if rows < bound)


def _text(value: object) -> str | None:
    """A field shown as text: strings as they are, numbers written out, anything else (lists, mappings,
    booleans, null) not shown."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return None


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _figure(value: object) -> str:
    number = _number(value)
    if number is None:
        return "n/a"
    return f"{int(number):,}" if number == int(number) else f"{number:,.4g}"


def _entries(value: object) -> list[tuple[str, Mapping[str, object]]]:
    """(name, statistics) of a by-name section (by_split, by_source), each statistics a mapping."""
    return [(str(name), mapping(item)) for name, item in mapping(value).items()]


def _hub_license(license_name: str | None) -> str | None:
    if not license_name:
        return None
    normalised = license_name.strip().lower()
    return normalised if normalised in HUB_LICENSES else None


@dataclass(frozen=True)
class _Source:
    """A recipe source as the card shows it: the recipe's entry joined with its counts from audit.json."""

    name: str
    hub_id: str | None
    kind: str | None
    origin: str
    task: str | None
    license: str | None
    conversations: int
    thinking_share: float | None


def _sources(docs: CorpusDocuments) -> list[_Source]:
    """One entry per recipe source (a mapping in the sources list), joined with its counts from audit.json
    (recipe order); a source without a usable name is named by its place in the list."""
    by_source = mapping(docs.audit.get("by_source"))
    written = docs.recipe.get("sources")
    entries = []
    for index, spec in enumerate(written if isinstance(written, list) else []):
        if not isinstance(spec, dict):
            continue
        name = _text(spec.get("name")) or f"sources[{index}]"
        stats = mapping(by_source.get(name))
        kind = _text(spec.get("kind"))
        entries.append(_Source(
            name=name,
            hub_id=_text(mapping(spec.get("hub")).get("id")),
            kind=kind,
            origin=_text(stats.get("origin")) or ("generated" if kind == "prompts" else "replay"),
            task=_text(stats.get("task")) or _text(spec.get("task")),
            license=_text(spec.get("license")) or _text(stats.get("license")),
            conversations=_count(stats.get("conversations")),
            thinking_share=_number(stats.get("thinking_share")),
        ))
    return entries


def card_license(docs: CorpusDocuments) -> tuple[str, list[str]]:
    """(metadata license, distinct declared licenses): the one Hub id when all sources agree, else
    ``other`` (named in the body), ``unknown`` when no source declares one."""
    declared = [entry.license for entry in _sources(docs)]
    distinct = sorted({name for name in declared if name})
    if not distinct:
        return "unknown", []
    if len(distinct) == 1 and None not in declared:
        return _hub_license(distinct[0]) or "other", distinct
    return "other", distinct


class _DataFiles(TypedDict):
    split: str
    path: list[str]


def _data_files(manifest: Manifest) -> list[_DataFiles]:
    by_split: dict[str, list[str]] = {}
    for entry in manifest.files:  # the gate has checked every entry
        by_split.setdefault(entry.split, []).append(entry.path)
    order = sorted(by_split, key=lambda split: (split != "train", split))
    return [{"split": split, "path": sorted(by_split[split])} for split in order]


def card_metadata(docs: CorpusDocuments) -> dict[str, object]:
    """The YAML front matter, following the Hub's dataset card metadata fields."""
    sources = _sources(docs)
    license_id, _ = card_license(docs)
    tags = ["speculative-decoding", "eagle3", "draft-model", "corpus-builder"]
    if any(entry.origin == "generated" for entry in sources):
        tags += ["synthetic", "on-policy"]
    if docs.audit.get("thinking_conversations"):
        tags.append("reasoning")
    conversations = docs.manifest.conversations  # the gate has matched it with the shards
    return {
        "pretty_name": _corpus_name(docs),
        "license": license_id,
        "language": list(DEFAULT_LANGUAGE),
        "annotations_creators": ["machine-generated"],
        "task_categories": ["text-generation"],
        "size_categories": [size_category(conversations)],
        "source_datasets": [entry.hub_id or entry.name for entry in sources],
        "tags": tags,
        "configs": [{"config_name": "default", "default": True, "data_files": _data_files(docs.manifest)}],
    }


def _corpus_name(docs: CorpusDocuments) -> str:
    return docs.manifest.name or _text(docs.recipe.get("name")) or "corpus"


def _pct(value: object) -> str:
    """A share as a percentage, or n/a where there is no number."""
    number = _number(value)
    return "n/a" if number is None else f"{100 * number:.1f}%"


def _table(header: list[str], rows: Sequence[Sequence[object]]) -> list[str]:
    def cell(value: object) -> str:
        return str(value if value is not None else "").replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    return lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows] + [""]


def _generation_settings(docs: CorpusDocuments) -> list[Mapping[str, object]]:
    generation = docs.audit.get("generation")
    if isinstance(generation, dict):
        return [generation]
    return [setting for setting in generation if isinstance(setting, dict)] if isinstance(generation, list) else []


def _composition(docs: CorpusDocuments, total: int) -> list[str]:
    rows = [[f"`{e.hub_id}`" if e.hub_id else f"{e.name} (local)", e.origin, e.task or "",
             e.license or "not declared", f"{e.conversations:,}",
             _pct(e.conversations / total if total else None), _pct(e.thinking_share)]
            for e in _sources(docs)]
    return ["## Composition", "",
            *_table(["source", "origin", "task", "license", "conversations", "share", "thinking"], rows)]


def _thinking(docs: CorpusDocuments) -> list[str]:
    audit = docs.audit
    lines = ["## Thinking share", "",
             f"{_figure(audit.get('thinking_conversations'))} of {_figure(audit.get('conversations'))} "
             f"conversations ({_pct(audit.get('thinking_share'))}) carry a reasoning trace, stored per "
             "assistant turn in `messages[].reasoning` (never inside `content`).", ""]
    minimum = docs.min_thinking_share
    if minimum is not None:
        lines += [f"The recipe requires at least {_pct(minimum)}; the publish gate recounted it from the shards.", ""]
    rows = [[split, _figure(stats.get("conversations")), _figure(stats.get("thinking_conversations")),
             _pct(stats.get("thinking_share"))]
            for split, stats in _entries(audit.get("by_split"))]
    return lines + _table(["split", "conversations", "thinking", "share"], rows)


# The token statistics the card shows, as (audit.json key, label); audit.json holds more (the turns whose
# served ids differ, listed with their token ids), which is for audit.json readers, never for the card.
_TOKEN_TOTALS = (("conversations", "conversations"), ("tokens", "tokens"),
                 ("supervised_tokens", "supervised (loss-masked) tokens"), ("reasoning_tokens", "reasoning tokens"))
_TOKEN_LENGTHS = ("p50", "p90", "p99", "max")


def _lengths(stats: Mapping[str, object]) -> str:
    return " / ".join(_figure(stats.get(key)) for key in _TOKEN_LENGTHS)


def _tokens(docs: CorpusDocuments) -> list[str]:
    tokens = docs.audit.get("tokens")
    if not isinstance(tokens, dict) or not tokens:
        return []
    rows = [[label, _figure(tokens.get(key))] for key, label in _TOKEN_TOTALS]
    rows.append(["tokens per conversation (p50 / p90 / p99 / max)", _lengths(tokens)])
    rows.append(["reasoning share of supervised tokens", _pct(tokens.get("reasoning_token_share"))])
    limit = _number(tokens.get("max_seq_len"))
    if limit is not None:
        rows.append([f"conversations over max_seq_len {_figure(limit)}", _figure(tokens.get("over_budget"))])
    mismatches = mapping(tokens.get("mismatches"))
    if mismatches:
        rows.append(["generated turns whose re-render differs from the served token ids",
                     f"{_figure(mismatches.get('count'))} of {_figure(mismatches.get('checked_turns'))}"])
    lines = ["## Token statistics", "", "Counted with the target model's tokenizer.", "",
             *_table(["statistic", "value"], rows)]
    source_rows = [[name, _figure(stats.get("conversations")), _figure(stats.get("tokens")), _lengths(stats),
                    _pct(stats.get("reasoning_token_share"))]
                   for name, stats in _entries(tokens.get("by_source"))]
    if source_rows:
        lines += _table(["source", "conversations", "tokens", "p50 / p90 / p99 / max", "reasoning share"],
                        source_rows)
    return lines


def _generation(docs: CorpusDocuments) -> list[str]:
    revision = _text(docs.setting("target", "revision"))
    lines = ["## Target model and generation", "",
             f"- Target model: `{_text(docs.setting('target', 'model')) or 'not recorded'}`"
             + (f" (revision `{revision}`)" if revision else "")]
    settings = _generation_settings(docs)
    if not settings:
        return [*lines, "- No assistant turn was generated: every source was replayed as written.", ""]
    for setting in settings:
        count = f" ({_figure(setting['conversations'])} conversations)" if "conversations" in setting else ""
        served = ", ".join(f"{label} `{_text(setting.get(key))}`" for key, label in _SERVED
                           if _text(setting.get(key)))
        lines += [
            f"- Generated by `{setting.get('model')}`{count}: revision `{setting.get('model_revision') or 'n/a'}`, "
            f"engine `{setting.get('engine_version') or 'n/a'}`, thinking "
            f"{'enabled' if setting.get('enable_thinking') else 'disabled'}",
            *([f"  - served as: {served}"] if served else []),
            f"  - sampling: `{json.dumps(setting.get('sampling') or {}, sort_keys=True)}`",
        ]
    targets = docs.manifest.section("targets")
    if isinstance(targets, list) and len(targets) > 1:
        lines.append(f"- **{len(targets)} different served targets** generated rows of this corpus (the recipe "
                     "accepted the mix: `target.allow_mixed_targets`); each row's provenance names its own.")
    finish = mapping(docs.audit.get("finish_reasons"))
    if finish:
        lines.append("- Finish reasons of generated turns: "
                     + ", ".join(f"`{reason}` {_figure(count)}" for reason, count in finish.items()))
    return [*lines, ""]


_SERVED = (("served_model", "name"), ("model_root", "model"), ("quantization", "quantization"), ("dtype", "dtype"))


def _completeness(docs: CorpusDocuments) -> list[str]:
    """A corpus written although it is incomplete says so first."""
    lines = []
    partial = mapping(docs.manifest.section("partial"))
    if partial:
        lines += [f"> **Partial corpus**: {_figure(partial.get('unfinished_rows'))} generated rows are missing "
                  "(their requests ran out of retries; the build was told to write it anyway).", ""]
    short = docs.manifest.section("short")
    if isinstance(short, list) and short:
        lines += ["> **Short of its recipe**: the corpus misses what the recipe declares (written anyway):", ""]
        lines += [f"> - {_text(item) or item}" for item in short] + [""]
    return lines


def _declared(docs: CorpusDocuments) -> list[str]:
    """Declared vs reached, when the recipe declares the corpus (mixture)."""
    mixture = mapping(docs.manifest.section("mixture"))
    if not mixture:
        return []
    rows = []
    for name, source in _entries(mixture.get("sources")):
        declared = source.get("declared")
        rows.append([name, "every kept row" if declared is None else _figure(declared),
                     _figure(source.get("reached")), _figure(source.get("available")),
                     _figure(source.get("generated_rows")) if source.get("generated_rows") else ""])
    lines = ["## Declared and reached", "",
             "The recipe declares this corpus; the build met it after every check, dedup and decontamination "
             "drop (prompt sources topped up from their pools, replay rows taken by a seeded order).", "",
             *_table(["source", "declared", "reached", "passed the checks", "rows generated"], rows)]
    share = mapping(mixture.get("thinking_share"))
    if share.get("target") is not None:
        lines += [f"Thinking share: declared {_pct(share.get('target'))} +- "
                  f"{_pct(share.get('tolerance'))}, reached {_pct(share.get('reached'))}.", ""]
    return lines


def _drops(docs: CorpusDocuments) -> list[str]:
    skipped = Counter({reason: _count(count) for reason, count in mapping(docs.audit.get("skipped")).items()})
    flags = mapping(docs.audit.get("flags"))
    lines = ["## Dropped and truncated rows", ""]
    if not skipped and not flags:
        return [*lines, "No row was dropped or truncated.", ""]
    if skipped:
        lines += [f"{sum(skipped.values()):,} rows were dropped or skipped; each is listed with its reason in "
                  "the build's ledger.", "",
                  *_table(["reason", "rows", "meaning"],
                          [[f"`{r}`", f"{c:,}", REASONS.get(r, "")] for r, c in skipped.most_common()])]
    if flags:
        lines += ["Rows kept with a flag (column `flags`):", "",
                  *_table(["flag", "rows"], [[f"`{f}`", _figure(c)] for f, c in flags.items()])]
    return lines


def _screening(docs: CorpusDocuments) -> list[str]:
    """How rows were deduplicated, and which evaluation sets the corpus was checked against."""
    dedup = mapping(docs.manifest.section("dedup"))
    if not dedup:
        return []
    rule = _text(dedup.get("rule"))
    near = mapping(dedup.get("near_duplicates"))
    lines = ["## Dedup and decontamination", ""]
    if rule == "none":
        lines += ["Rows were not deduplicated.", ""]
    else:
        compared = "user and system turns" if rule == "prompt" else "conversations"
        method = f"identical {compared} (normalised text: case, sentence punctuation and whitespace do not count)"
        if near:
            method += (f" and near duplicates (MinHash/LSH, threshold {_number(near.get('threshold'))}, "
                       f"{_count(near.get('shingle'))}-word shingles)")
        priority = [name for name in dedup.get("priority") or () if isinstance(name, str)]
        lines += [f"Duplicates dropped across sources: {method}; prompt sources were deduplicated on their prompts "
                  "before generation. Of duplicates, the row kept is the one of the source first in: "
                  f"{', '.join(f'`{name}`' for name in priority)}.", ""]
    screened = mapping(docs.manifest.section("decontamination"))
    # A set is shown as checked only with the texts it put in the index: those of at least min_words words.
    listed = [(entry, _count(entry.get("texts")) - _count(entry.get("too_short")))
              for entry in map(mapping, screened.get("eval_sets") or ()) if entry]
    checked = [(entry, used) for entry, used in listed if used > 0]
    unused = [_text(entry.get("name")) or "?" for entry, used in listed if used <= 0]
    if not checked:
        return [*lines, "The corpus was not checked against evaluation sets.", ""]
    found = mapping(docs.audit.get("contaminated_by_eval_set"))
    lines += [f"Checked against evaluation sets, prompts before generation and every row after it: a row sharing a "
              f"{_count(screened.get('ngram'))}-word run with a set (normalised text) was dropped.", "",
              *_table(["evaluation set", "from", "texts", "rows dropped"],
                      [[_text(entry.get("name")) or "", _text(entry.get("from")) or "", f"{used:,}",
                        _figure(found.get(_text(entry.get("name")) or "", 0))] for entry, used in checked])]
    if unused:
        lines += [f"Not checked: {', '.join(unused)} contributed no text to the check.", ""]
    return lines


def _eval_pack(docs: CorpusDocuments) -> list[str]:
    """The eval pack held out of the corpus: how many conversations, from which sources, and that it is kept."""
    pack = mapping(docs.manifest.section("eval"))
    if not pack:
        return []
    sources = _entries(pack.get("sources"))
    copies = _count(mapping(docs.audit.get("skipped")).get("eval_pack_copy"))
    return ["## Eval pack", "",
            f"{_count(pack.get('conversations')):,} conversations were held out of the replay sources as an eval "
            "pack (seeded, stratified by source, task and thinking), before the checks, dedup, the mixture and the "
            f"split; {copies:,} training rows that were copies or near copies of a pack row were dropped. The pack "
            "is not published: `corpus eval` replays it against speculating servers.", "",
            *_table(["source", "rows read", "held out"],
                    [[f"`{name}`", _figure(entry.get("read")), _figure(entry.get("held"))] for name, entry in sources])]


def _profiles(profiles: Sequence[AttachedProfile]) -> list[str]:
    """The heads trained on this corpus and measured on its pack, each with its profile's figures and conditions."""
    if not profiles:
        return []

    def pack(attached: AttachedProfile) -> str:
        if attached.profile.pack_sha256 is None:
            return "not recorded"
        return {True: "yes", False: "**no**: another pack", None: "cannot tell: this corpus has no eval pack"}[
            attached.pack_matches]

    rows = [[f"`{a.upload.path_in_repo}`", f"`{a.profile.head}`" if a.profile.head else "not recorded",
             a.profile.method or "not told", a.profile.k, _figure(a.profile.temperature),
             f"{a.profile.mean_accept_length:.3f}", _figure(a.profile.mean_accept_length_per_request),
             f"`{a.profile.pack_sha256[:12]}`" if a.profile.pack_sha256 else "not recorded", pack(a)]
            for a in profiles]
    return ["## Speculation profiles", "",
            "Draft heads trained on this corpus, measured on its eval pack: each profile (NVIDIA ModelOpt's "
            "`speculation_profile.json`, schema 1.0, e.g. from `corpus eval --profile`) is published beside the "
            "corpus. Mean acceptance length is the tokens a verify step emits (the target's own included): pooled "
            "over every verify step, and per request (each request's own mean, then their mean).", "",
            *_table(["profile", "head", "speculator", "k", "temperature", "mean acceptance length (pooled)",
                     "mean acceptance length (per request)", "pack sha256", "measured on this corpus's eval pack"],
                    rows)]


def _license_section(docs: CorpusDocuments) -> list[str]:
    license_id, distinct = card_license(docs)
    if license_id not in ("other", "unknown"):
        return ["## License", "", f"All sources are released under `{distinct[0]}`.", ""]
    lines = ["## License", ""]
    if license_id == "unknown":
        return [*lines, "No source declares a license; check each source's terms before use.", ""]
    lines += ["This mixture combines sources under different terms; each row's `license` column names its "
              "source's license. Use of a subset is subject to the licenses of the sources it contains:", ""]
    by_license: dict[str, list[str]] = {}
    for entry in _sources(docs):
        by_license.setdefault(entry.license or "not declared", []).append(entry.hub_id or entry.name)
    return lines + [f"- `{name}`: {', '.join(names)}" for name, names in sorted(by_license.items())] + [""]


def _usage(repo_id: str | None, splits: list[str]) -> list[str]:
    repo = repo_id or "ORG/NAME"
    split = "train" if "train" in splits else (splits[0] if splits else "train")
    return ["## Usage", "", "```python", "from datasets import load_dataset", "",
            f'corpus = load_dataset("{repo}", split="{split}")',
            "row = corpus[0]",
            'for turn in row["messages"]:  # role, content, reasoning (None when the turn has none)',
            '    print(turn["role"], turn["reasoning"] is not None, turn["content"][:80])',
            "```", "",
            "Columns: `id`, `source`, `origin` (replay or generated), `task`, `license`, `messages` "
            "(list of `{role, content, reasoning}`), `thinking`, `flags`, `split`, `provenance` (JSON string: "
            "source position and, for generated rows, the generation settings and token ids).", ""]


def _training(docs: CorpusDocuments, repo_id: str | None, exports: Sequence[PublishedExport]) -> list[str]:
    """The trainer files published beside the corpus and the command that trains on each."""
    if not exports:
        return []
    repo = repo_id or "ORG/NAME"
    target = _text(docs.setting("target", "model")) or "TARGET"
    lines = ["## Train a head on it", "",
             "The corpus in trainer formats, written from these shards when they were published:", "",
             *_table(["format", "split", "file", "rows"],
                     [[f"`{export.format}`", split, f"`{path}`", _figure(rows)]
                      for export in exports for split, (path, rows) in export.files.items()])]
    for export in exports:
        commands = export.training_commands(repo, target)
        lines += [f"- `{export.format}`: {TRAINER_FORMATS[export.format].card_note}."]
        if commands:
            lines += ["", "  ```bash", *(f"  {command}" for command in commands), "  ```"]
    return [*lines, "",
            "`corpus vocab` writes speculators' draft-vocabulary files (`token_freq.pt`, `d2t-N.npy`, `t2d-N.npy`) "
            f"from the `{TOKEN_FORMAT}` file into the directory `speculators train --data-path` reads.", ""]


def render_card(docs: CorpusDocuments, repo_id: str | None = None, exports: Sequence[PublishedExport] = (),
                profiles: Sequence[AttachedProfile] = ()) -> str:
    """README.md for the corpus: YAML front matter the Hub validates, then the mixture card body (with the trainer
    ``exports`` and the speculation ``profiles`` published beside it, if any)."""
    manifest = docs.manifest
    total = manifest.conversations  # the gate has matched it with the shards and audit.json
    tool = manifest.tool
    created = _text(manifest.section("created"))
    description = (_text(docs.recipe.get("description")) or "").strip()
    splits = [entry["split"] for entry in _data_files(manifest)]
    split_rows = [[split, _figure(info.rows), _figure(info.shards)] for split, info in manifest.splits.items()]
    body = [
        f"# {_corpus_name(docs)}", "",
        *([description, ""] if description else []),
        f"A training corpus for speculative-decoding draft models (EAGLE-3 and similar) of "
        f"`{_text(docs.setting('target', 'model')) or 'the target model'}`, built by "
        f"{_text(tool.get('name')) or 'corpus-builder'} {_text(tool.get('version')) or ''}"
        + (f" on {created}" if created else "") + f": {total:,} conversations.", "",
        *_completeness(docs),
        *_composition(docs, total),
        *_declared(docs),
        *_thinking(docs),
        *_tokens(docs),
        *_generation(docs),
        *_drops(docs),
        *_screening(docs),
        *_eval_pack(docs),
        *_profiles(profiles),
        "## Files", "",
        *_table(["split", "conversations", "shards"], split_rows),
        "`manifest.json` lists every shard with its row count, size and sha256; `audit.json` holds the full "
        "statistics; `recipe.yaml` is the recipe the corpus was built from "
        f"(sha256 of the resolved recipe: `{manifest.recipe_sha256 or 'n/a'}`).", "",
        *_usage(repo_id, splits),
        *_training(docs, repo_id, exports),
        *_license_section(docs),
        "## Recipe", "", "```yaml", scrub_local_paths(docs.recipe_text).rstrip(), "```", "",
    ]
    front = yaml.safe_dump(card_metadata(docs), sort_keys=False, allow_unicode=True, width=1000)
    return "---\n" + front + "---\n\n" + scrub_local_paths("\n".join(body)).rstrip() + "\n"


def parse_front_matter(card: str) -> Mapping[str, object]:
    """The YAML metadata of a card (for checks and tests)."""
    if not card.startswith("---\n"):
        return {}
    end = card.index("\n---\n", 4)
    return mapping(yaml.safe_load(card[4:end]))
