"""Load a recipe: read the positioned YAML, validate it against the schema, fill defaults, run the
cross-field checks and map the result onto the typed ``Recipe``. Every problem found is reported at once.

Importing this package stays cheap (no jsonschema until a recipe is validated; nothing heavy at all):
`corpus --help` and `corpus validate` depend on it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from ..errors import CorpusError
from ..records import RepairRules
from .crosscheck import cross_field_problems, fill_derived, is_hub_id, local_path, needs_target_tokens, tokenizer_is_hub
from .model import (
    Checks,
    Decontamination,
    EvalPackSpec,
    EvalSet,
    ExportSpec,
    Fold,
    GenerationSettings,
    HubRef,
    LaunchSpec,
    Mapping,
    Mixture,
    NearDuplicateSettings,
    OutputSpec,
    PackShare,
    PublishSpec,
    Recipe,
    SourceSpec,
    SourceTarget,
    SplitSpec,
    Take,
    Target,
    ThinkingShare,
)
from .schema import fill_defaults, recipe_schema, schema_problems, source_format_problems
from .yaml_reader import Parsed, Problem, parse_yaml, read_recipe_text


def check_recipe(path: Path, registered_formats: Callable[[], Sequence[str]] | None = None
                 ) -> tuple[Recipe | None, list[Problem]]:
    """Read, validate and type a recipe. Returns (recipe, []) or (None, every problem found). ``registered_formats``:
    the source formats' names, to check a source's ``format`` with the rest (the registry is above the recipe:
    without them, ``sources.formats.check_source_formats`` checks a loaded recipe's)."""
    path = Path(path)
    file = str(path)
    text, problems = read_recipe_text(path, file)
    if text is None:
        return None, problems
    parsed = parse_yaml(text, file)
    if parsed.data is None:
        return None, parsed.problems
    base_dir = path.resolve().parent
    # Derived defaults need the plain ones first; the second pass puts them in the schema's key order.
    document = fill_defaults(fill_derived(fill_defaults(parsed.data, recipe_schema())), recipe_schema())
    found = parsed.problems + schema_problems(parsed) + cross_field_problems(document, base_dir, parsed)
    if registered_formats is not None:
        found += source_format_problems(document, parsed, registered_formats)
    problems = sorted(dict.fromkeys(found), key=lambda p: (p.line or 0, p.column or 0, p.path))
    if problems:
        return None, problems
    return _to_recipe(document, base_dir, path.resolve(), parsed), []


def load_recipe(path: Path) -> Recipe:
    """The typed recipe, or CorpusError listing every problem (the CLI turns it into exit code 2)."""
    recipe, problems = check_recipe(path)
    if recipe is None:
        raise CorpusError("recipe is invalid", file=str(path), details=[str(p) for p in problems])
    return recipe


def resolved_yaml(recipe: Recipe) -> str:
    """The validated document with every default filled, as YAML; paths stay as written."""
    return yaml.safe_dump(recipe.document, sort_keys=False, allow_unicode=True, width=100)


def recipe_sha256(recipe: Recipe) -> str:
    """Hash of the canonical resolved document: key order, layout, implicit defaults and the engine do not change
    it."""
    # The engine that runs a build changes no row of it: the same recipe on either is one recipe.
    document = {key: value for key, value in recipe.document.items() if key != "engine"}
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()



def _to_recipe(document: dict[str, Any], base_dir: Path, path: Path, written: Parsed) -> Recipe:
    target_doc = document["target"]
    launch_doc = target_doc.get("launch")
    tokenizer = target_doc.get("tokenizer")
    tokenizer_dir, tokenizer_hub = _tokenizer(base_dir, tokenizer, target_doc["model"], document)
    target = Target(
        model=target_doc["model"],
        revision=target_doc.get("revision"),
        tokenizer=tokenizer_dir,
        tokenizer_hub=tokenizer_hub,
        trust_remote_code=target_doc["trust_remote_code"],
        endpoints=tuple(target_doc["endpoints"]),
        launch=LaunchSpec(**{
            **launch_doc,
            "model_dir": local_path(base_dir, launch_doc["model_dir"]),
            "args": tuple(launch_doc["args"]),
        }) if launch_doc is not None else None,
        backend=target_doc["backend"],
        allow_mixed_targets=target_doc["allow_mixed_targets"],
        generation=GenerationSettings(**{**target_doc["generation"],
                                         "sampling_mixture": tuple(target_doc["generation"]["sampling_mixture"])}),
    )
    sources = tuple(_to_source(source) for source in document["sources"])
    output = document["output"]
    return Recipe(
        name=document["name"],
        description=document.get("description"),
        target=target,
        sources=sources,
        output=OutputSpec(dir=local_path(base_dir, output["dir"]), rows_per_shard=output["rows_per_shard"],
                          exports=tuple(ExportSpec(**spec) for spec in output["exports"])),
        checks=_to_checks(document["checks"]),
        split=SplitSpec(**document["split"]),
        mixture=_to_mixture(document["mixture"]),
        decontamination=_to_decontamination(document.get("decontamination"), base_dir),
        eval=_to_eval_pack(document.get("eval")),
        engine=document.get("engine", "local"),
        publish=PublishSpec(exports=tuple(ExportSpec(**spec) for spec in (document.get("publish") or {}).get(
            "exports", []))),
        base_dir=base_dir,
        path=path,
        document=document,
        written=written,
    )


def _tokenizer(base_dir: Path, written: str | None, model: str, document: dict[str, Any]
               ) -> tuple[Path | None, str | None]:
    """(local directory, Hub model id) of the target's tokenizer: ``target.tokenizer`` as a directory when one
    is there, else as a Hub id; without it, ``target.model`` from the Hub when the recipe counts in the
    target's tokens (checks.max_seq_len or a speculators-tokens export)."""
    if written is not None:
        return (None, written) if tokenizer_is_hub(base_dir, written) else (local_path(base_dir, written), None)
    return (None, model) if needs_target_tokens(document) and is_hub_id(model) else (None, None)


def _to_checks(checks: dict[str, Any]) -> Checks:
    near = checks.get("near_duplicates")
    return Checks(**{**checks, "near_duplicates": NearDuplicateSettings(**near) if near is not None else None,
                     "dedup_priority": tuple(checks["dedup_priority"])})


def _to_decontamination(written: dict[str, Any] | None, base_dir: Path) -> Decontamination | None:
    if written is None:
        return None
    eval_sets = tuple(EvalSet(name=spec["name"], path=local_path(base_dir, spec["path"]) if "path" in spec else None,
                              hub=HubRef(**spec["hub"]) if "hub" in spec else None,
                              fields=tuple(spec.get("fields", ()))) for spec in written["eval_sets"])
    return Decontamination(eval_sets=eval_sets, ngram=written["ngram"], min_words=written["min_words"])


def _to_eval_pack(written: dict[str, Any] | None) -> EvalPackSpec | None:
    if written is None:
        return None
    return EvalPackSpec(PackShare(written.get("rows"), written.get("fraction")), written["seed"])


def _to_mixture(mixture: dict[str, Any]) -> Mixture:
    thinking = mixture.get("thinking_share")
    plain = {k: v for k, v in mixture.items() if k != "thinking_share"}
    return Mixture(**plain, thinking_share=ThinkingShare(**thinking) if thinking is not None else None)


def _openai_tool_choice(written: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """The one form a tool_choice is sent and recorded in, OpenAI's (vLLM takes it): a mode as it is, a named
    function, written short (``{function: NAME}``) or as OpenAI's own, as ``{"type": "function", "function":
    {"name": NAME}}``."""
    if not isinstance(written, dict):
        return written
    function = written["function"]
    return {"type": "function", "function": {"name": function if isinstance(function, str) else function["name"]}}


def _to_source(source: dict[str, Any]) -> SourceSpec:
    written = source.get("path")
    plain = {k: v for k, v in source.items()
             if k not in ("path", "hub", "mapping", "take", "repair", "target", "tool_choice", "eval", "fold")}
    return SourceSpec(
        **plain,
        tool_choice=_openai_tool_choice(source.get("tool_choice")),
        paths=(written,) if isinstance(written, str) else tuple(written or ()),
        hub=HubRef(**source["hub"]) if "hub" in source else None,
        mapping=Mapping(**source["mapping"]),
        take=Take(**source["take"]) if "take" in source else None,
        repair=RepairRules(**source["repair"]),
        target=SourceTarget(**source["target"]) if "target" in source else None,
        eval=PackShare(**source["eval"]) if "eval" in source else None,
        fold=Fold(**source.get("fold", {})),
    )
