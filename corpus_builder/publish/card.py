"""The dataset card (README.md): Hub metadata in YAML front matter, then a mixture card in the manner
of allenai's tulu-3-sft-mixture: per-source composition and licenses, thinking share, the generating
model and its settings, drop counts by reason, the recipe and a ``load_dataset`` snippet.

Everything comes from the corpus's own files (audit.json, manifest.json, recipe.yaml). Local paths
and URL credentials are removed from whatever is shown, and the card is scanned for secrets before upload.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import yaml

from ..errors import REASONS
from .gate import CorpusDocuments

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
# paths and Windows drive paths; and user:password@ in URLs.
_LOCAL_PATH_RE = re.compile(
    r"(?<![\w:/.~-])/(?:[\w.@+-]+/)*[\w.@+-]+/?"
    r"|(?<![\w/])~[\w.-]*(?:/[^\s'\"]*)?"
    r"|\b[A-Za-z]:\\[^\s'\"]*"
)
_URL_CREDENTIALS_RE = re.compile(r"(?<=://)[^/\s@]+@")


def scrub_local_paths(text: str) -> str:
    """Replace absolute and home-directory paths with a placeholder and drop credentials from URLs."""
    return _LOCAL_PATH_RE.sub(LOCAL_PATH, _URL_CREDENTIALS_RE.sub("", text))


def scrub_value(value: Any) -> Any:
    """``scrub_local_paths`` applied to every string inside a JSON-like value."""
    if isinstance(value, str):
        return scrub_local_paths(value)
    if isinstance(value, dict):
        return {key: scrub_value(item) for key, item in value.items()}
    if isinstance(value, list):
        return [scrub_value(item) for item in value]
    return value


def size_category(rows: int) -> str:
    return next(label for bound, label in SIZE_CATEGORIES if rows < bound)


def _hub_license(license_name: str | None) -> str | None:
    if not license_name:
        return None
    normalised = license_name.strip().lower()
    return normalised if normalised in HUB_LICENSES else None


def _sources(docs: CorpusDocuments) -> list[dict[str, Any]]:
    """One entry per recipe source, joined with its counts from audit.json (recipe order)."""
    by_source = docs.audit.get("by_source") or {}
    entries = []
    for spec in docs.recipe.get("sources") or ():
        stats = by_source.get(spec.get("name"), {})
        hub_id = (spec.get("hub") or {}).get("id")
        entries.append({
            "name": spec.get("name"),
            "hub_id": hub_id,
            "kind": spec.get("kind"),
            "origin": stats.get("origin") or ("generated" if spec.get("kind") == "prompts" else "replay"),
            "task": stats.get("task") or spec.get("task"),
            "license": spec.get("license") or stats.get("license"),
            "conversations": stats.get("conversations", 0),
            "thinking_share": stats.get("thinking_share", 0.0),
        })
    return entries


def card_license(docs: CorpusDocuments) -> tuple[str, list[str]]:
    """(metadata license, distinct declared licenses): the one Hub id when all sources agree, else
    ``other`` (named in the body), ``unknown`` when no source declares one."""
    declared = [entry["license"] for entry in _sources(docs)]
    distinct = sorted({name for name in declared if name})
    if not distinct:
        return "unknown", []
    if len(distinct) == 1 and None not in declared:
        return _hub_license(distinct[0]) or "other", distinct
    return "other", distinct


def _data_files(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    by_split: dict[str, list[str]] = {}
    for entry in manifest.get("files") or ():
        by_split.setdefault(entry["split"], []).append(entry["path"])
    order = sorted(by_split, key=lambda split: (split != "train", split))
    return [{"split": split, "path": sorted(by_split[split])} for split in order]


def card_metadata(docs: CorpusDocuments) -> dict[str, Any]:
    """The YAML front matter, following the Hub's dataset card metadata fields."""
    sources = _sources(docs)
    license_id, _ = card_license(docs)
    tags = ["speculative-decoding", "eagle3", "draft-model", "corpus-builder"]
    if any(entry["origin"] == "generated" for entry in sources):
        tags += ["synthetic", "on-policy"]
    if docs.audit.get("thinking_conversations"):
        tags.append("reasoning")
    conversations = docs.manifest.get("conversations", docs.audit.get("conversations", 0))
    return {
        "pretty_name": docs.manifest.get("name") or docs.recipe.get("name"),
        "license": license_id,
        "language": list(DEFAULT_LANGUAGE),
        "annotations_creators": ["machine-generated"],
        "task_categories": ["text-generation"],
        "size_categories": [size_category(int(conversations))],
        "source_datasets": [entry["hub_id"] or entry["name"] for entry in sources],
        "tags": tags,
        "configs": [{"config_name": "default", "default": True, "data_files": _data_files(docs.manifest)}],
    }


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    def cell(value: Any) -> str:
        return str(value if value is not None else "").replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    return lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows] + [""]


def _flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [item for key, sub in value.items() for item in _flatten(sub, f"{prefix}{key}.")]
    return [(prefix.rstrip("."), value)]


def _generation_settings(docs: CorpusDocuments) -> list[dict[str, Any]]:
    generation = docs.audit.get("generation")
    if isinstance(generation, dict):
        return [generation]
    return list(generation or ())


def _composition(docs: CorpusDocuments, total: int) -> list[str]:
    rows = [[f"`{e['hub_id']}`" if e["hub_id"] else f"{e['name']} (local)", e["origin"], e["task"] or "",
             e["license"] or "not declared", f"{e['conversations']:,}",
             _pct(e["conversations"] / total if total else None), _pct(e["thinking_share"])]
            for e in _sources(docs)]
    return ["## Composition", "",
            *_table(["source", "origin", "task", "license", "conversations", "share", "thinking"], rows)]


def _thinking(docs: CorpusDocuments) -> list[str]:
    audit = docs.audit
    lines = ["## Thinking share", "",
             f"{audit.get('thinking_conversations', 0):,} of {audit.get('conversations', 0):,} conversations "
             f"({_pct(audit.get('thinking_share'))}) carry a reasoning trace, stored per assistant turn in "
             "`messages[].reasoning` (never inside `content`).", ""]
    minimum = docs.min_thinking_share
    if minimum is not None:
        lines += [f"The recipe requires at least {_pct(minimum)}; the publish gate recounted it from the shards.", ""]
    rows = [[split, f"{s.get('conversations', 0):,}", f"{s.get('thinking_conversations', 0):,}",
             _pct(s.get("thinking_share"))] for split, s in (audit.get("by_split") or {}).items()]
    return lines + _table(["split", "conversations", "thinking", "share"], rows)


def _tokens(docs: CorpusDocuments) -> list[str]:
    tokens = docs.audit.get("tokens")
    if not tokens:
        return []
    rows = [[f"`{key}`", f"{value:,}" if isinstance(value, int) else value] for key, value in _flatten(tokens)]
    return ["## Token statistics", "", "Counted with the target model's tokenizer.", "",
            *_table(["statistic", "value"], rows)]


def _generation(docs: CorpusDocuments) -> list[str]:
    target = docs.recipe.get("target") or {}
    lines = ["## Target model and generation", "",
             f"- Target model: `{target.get('model', 'not recorded')}`"
             + (f" (revision `{target['revision']}`)" if target.get("revision") else "")]
    settings = _generation_settings(docs)
    if not settings:
        return [*lines, "- No assistant turn was generated: every source was replayed as written.", ""]
    for setting in settings:
        count = f" ({setting['conversations']:,} conversations)" if "conversations" in setting else ""
        lines += [
            f"- Generated by `{setting.get('model')}`{count}: revision `{setting.get('model_revision') or 'n/a'}`, "
            f"engine `{setting.get('engine_version') or 'n/a'}`, thinking "
            f"{'enabled' if setting.get('enable_thinking') else 'disabled'}",
            f"  - sampling: `{json.dumps(setting.get('sampling') or {}, sort_keys=True)}`",
        ]
    finish = docs.audit.get("finish_reasons")
    if finish:
        lines.append("- Finish reasons of generated turns: "
                     + ", ".join(f"`{reason}` {count:,}" for reason, count in finish.items()))
    return [*lines, ""]


def _drops(docs: CorpusDocuments) -> list[str]:
    skipped = Counter(docs.audit.get("skipped") or {})
    flags = docs.audit.get("flags") or {}
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
                  *_table(["flag", "rows"], [[f"`{f}`", f"{c:,}"] for f, c in flags.items()])]
    return lines


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
        by_license.setdefault(entry["license"] or "not declared", []).append(entry["hub_id"] or entry["name"])
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


def render_card(docs: CorpusDocuments, repo_id: str | None = None) -> str:
    """README.md for the corpus: YAML front matter the Hub validates, then the mixture card body."""
    manifest, audit = docs.manifest, docs.audit
    name = manifest.get("name") or docs.recipe.get("name") or "corpus"
    total = int(audit.get("conversations") or manifest.get("conversations") or 0)
    tool = manifest.get("tool") or {}
    splits = [entry["split"] for entry in _data_files(manifest)]
    split_rows = [[split, f"{info.get('rows', 0):,}", info.get("shards", "")]
                  for split, info in (manifest.get("splits") or {}).items()]
    body = [
        f"# {name}", "",
        *([docs.recipe["description"].strip(), ""] if docs.recipe.get("description") else []),
        f"A training corpus for speculative-decoding draft models (EAGLE-3 and similar) of "
        f"`{(docs.recipe.get('target') or {}).get('model', 'the target model')}`, built by "
        f"{tool.get('name', 'corpus-builder')} {tool.get('version', '')}"
        + (f" on {manifest['created']}" if manifest.get("created") else "") + f": {total:,} conversations.", "",
        *_composition(docs, total),
        *_thinking(docs),
        *_tokens(docs),
        *_generation(docs),
        *_drops(docs),
        "## Files", "",
        *_table(["split", "conversations", "shards"], split_rows),
        "`manifest.json` lists every shard with its row count, size and sha256; `audit.json` holds the full "
        "statistics; `recipe.yaml` is the recipe the corpus was built from "
        f"(sha256 of the resolved recipe: `{manifest.get('recipe_sha256', 'n/a')}`).", "",
        *_usage(repo_id, splits),
        *_license_section(docs),
        "## Recipe", "", "```yaml", scrub_local_paths(docs.recipe_text).rstrip(), "```", "",
    ]
    front = yaml.safe_dump(card_metadata(docs), sort_keys=False, allow_unicode=True, width=1000)
    return "---\n" + front + "---\n\n" + scrub_local_paths("\n".join(body)).rstrip() + "\n"


def parse_front_matter(card: str) -> dict[str, Any]:
    """The YAML metadata of a card (for checks and tests)."""
    if not card.startswith("---\n"):
        return {}
    end = card.index("\n---\n", 4)
    return yaml.safe_load(card[4:end]) or {}
