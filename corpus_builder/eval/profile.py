"""A head's acceptance as a ``speculation_profile.json``, the file NVIDIA ModelOpt attaches to a draft checkpoint
(schema "1.0": ``examples/specdec_bench/specdec_bench/speculation_profile.py`` builds it, ``hf_spec_export``'s
reader validates it), so a profile measured here travels with the head.

Built from a run's windows of one head, every mode pooled: the marginal acceptance per draft position is vLLM's
counter by position over the verify steps, the conditional follows from it, the histogram of acceptance lengths
(tokens a step emits, the target's own included: length j + 1 for j accepted drafted tokens) counts steps, the
mean acceptance length is per step (pooled) and per request. ``per_category`` holds each mode and each slice of
the run; ``measurement_conditions`` the target, the speculator, k, the temperature, the pack's hash and the slices.
Paths are reduced to their last two parts (``org/model``): the profile is meant to be published.

``read_profile`` reads a profile back (ours or ModelOpt's), checked against schemas/speculation_profile.schema.json,
for ``corpus publish --profile``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from ..errors import CorpusError
from ..outputs import staged
from .figures import Sums
from .json_values import Json, JsonObject
from .run import Endpoint, Run

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from jsonschema.protocols import Validator

SCHEMA_VERSION = "1.0"
SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schemas" / "speculation_profile.schema.json"
CONSISTENCY_TOLERANCE = 0.02
CHAIN_METHODS = frozenset({"eagle", "eagle1", "eagle2", "eagle3", "draft_model", "mtp"})  # draft a prefix of k + 1


def speculation_profile(run: Run, endpoint: str) -> JsonObject:
    """The profile of head ``endpoint`` (its label) in ``run``."""
    head = next((e for e in run.endpoints if e.label == endpoint), None)
    if head is None:
        raise KeyError(f"no head {endpoint} in the run (heads: {', '.join(e.label for e in run.endpoints)})")
    figures = Sums.of([w for w in run.windows if w.endpoint == endpoint]).figures()
    k = head.speculator.num_speculative_tokens or len(figures.acceptance_by_position)
    marginal = [*figures.acceptance_by_position, *[0.0] * k][:k]  # positions never reached: 0
    conditional = [*figures.conditional_by_position, *[0.0] * k][:k]
    mean = figures.mean_acceptance_length_pooled
    method = head.speculator.method
    steps = figures.drafts
    histogram = {str(accepted + 1): round(share * steps) for accepted, share in
                 enumerate(figures.accepted_histogram)}
    own_marginal, own_histogram = figures.acceptance_by_position_per_request, figures.accepted_histogram_per_request
    return {
        "schema_version": SCHEMA_VERSION,
        "measured": mean is not None,
        "method": method,
        "draft_checkpoint": {"id": _published(head.speculator.model), "method": method},
        "target_model": _target(head),
        "num_speculative_tokens": k,
        "block_size": None,
        "max_supported_k": k,
        "verification_method": "longest_prefix",
        "conditional_accept_rates": [round(x, 6) for x in conditional],
        "marginal_accept_rates": [round(x, 6) for x in marginal],
        "mean_accept_length": _rounded(mean),
        "mean_accept_length_per_request": _rounded(figures.mean_acceptance_length_per_request),
        "accept_length_model": "chain_analytic" if (method or "").lower() in CHAIN_METHODS else "measured_per_k",
        "accept_length_by_k": {str(k): _rounded(mean)} if mean is not None else {},
        "acceptance_length_histogram": histogram,
        # each request's own, then their mean (None: the requests' own counts by position are not known)
        "marginal_accept_rates_per_request": None if own_marginal is None else _rates(own_marginal, k),
        "acceptance_length_histogram_per_request": None if own_histogram is None else {
            str(accepted + 1): round(share, 6) for accepted, share in enumerate(own_histogram)},
        "per_category": {f"{f.mode} {f.group}".removesuffix(" all"): {
            "mean_accept_length": _rounded(f.mean_acceptance_length_pooled),
            "mean_accept_length_per_request": _rounded(f.mean_acceptance_length_per_request),
            "marginal_accept_rates": [round(x, 6) for x in f.acceptance_by_position],
            "marginal_accept_rates_per_request": None if f.acceptance_by_position_per_request is None
            else [round(x, 6) for x in f.acceptance_by_position_per_request], "requests": f.requests}
            for f in run.figures if f.endpoint == endpoint},
        "measurement_conditions": {
            "measured_by": "corpus eval", "engine": f"vllm {head.identity.get('engine_version')}",
            "counted_by": head.counters, "modes": list(run.settings.modes), "temperature": run.settings.temperature,
            "max_tokens": run.settings.max_tokens, "concurrency": run.settings.concurrency,
            "dataset": Path(run.pack.path).name, "pack_sha256": run.pack.sha256, "prompts": run.pack.prompts,
            "requests": figures.requests, "verify_steps": steps, "created": run.created,
            "slices": sorted({f.group for f in run.figures if f.endpoint == endpoint}),
            "length_edges": list(run.settings.length_edges), "loop_threshold": run.settings.loop_threshold},
        "validation": None if mean is None else _validation(mean, marginal),
    }


def write_profile(path: Path, profile: Mapping[str, Json]) -> None:
    """Write a profile (staged, then renamed into place)."""
    with staged(Path(path)) as partial:
        partial.write_bytes(orjson.dumps(profile, option=orjson.OPT_INDENT_2) + b"\n")


def profile_paths(path: Path, labels: list[str]) -> dict[str, Path]:
    """Where each head's profile goes: ``path`` for head A, ``STEM-B.json`` beside it for head B, and so on."""
    return {label: path if index == 0 else path.with_name(f"{path.stem}-{label}{path.suffix}")
            for index, label in enumerate(labels)}


@dataclass(frozen=True, slots=True)
class ProfileFile:
    """A speculation profile read from a file and checked: the document as it is, and what a card shows of it."""

    path: Path
    content: bytes  # the file's bytes, as checked
    document: Mapping[str, object]  # as read, checked against the schema
    head: str | None  # the draft checkpoint's id
    method: str | None
    k: int
    temperature: float | None  # None: the profile does not record it
    mean_accept_length: float  # per verify step (pooled)
    mean_accept_length_per_request: float | None
    pack_sha256: str | None  # the pack it was measured on (None: not recorded)


def read_profile(path: Path) -> ProfileFile:
    """The profile at ``path``, a measured one in ModelOpt's schema 1.0 (``SCHEMA_PATH``, and a rate per drafted
    position, k of them); CorpusError naming the file and the line (malformed JSON) or each key that breaks it."""
    where = str(path)
    try:
        content = Path(path).read_bytes()
        document = json.loads(content)
    except OSError as error:
        raise CorpusError(f"cannot read the speculation profile: {error.strerror}", file=where) from None
    except UnicodeDecodeError:
        raise CorpusError("the speculation profile is not UTF-8 text", file=where) from None
    except json.JSONDecodeError as error:
        raise CorpusError(f"the speculation profile is not JSON: {error.msg} (column {error.colno})", file=where,
                          line=error.lineno) from None
    problems = [f"{_key_path(error.absolute_path)}: {error.message}"
                for error in sorted(_profile_validator().iter_errors(document), key=lambda e: list(map(str, e.path)))]
    if not problems:
        k = document["num_speculative_tokens"]
        problems = [f"{key}: {len(document[key])} rates, not one per drafted position (num_speculative_tokens {k})"
                    for key in ("marginal_accept_rates", "conditional_accept_rates") if len(document[key]) != k]
    if problems:
        raise CorpusError(f"not a measured speculation profile (ModelOpt's schema {SCHEMA_VERSION}): "
                          f"{len(problems)} problem(s)", file=where, details=problems)
    conditions = document["measurement_conditions"]
    checkpoint = document.get("draft_checkpoint") or {}
    return ProfileFile(Path(path), content, document, checkpoint.get("id"), document["method"],
                       document["num_speculative_tokens"], conditions.get("temperature"),
                       document["mean_accept_length"], document["mean_accept_length_per_request"],
                       conditions.get("pack_sha256"))


@cache
def _profile_validator() -> Validator:
    import jsonschema

    schema = orjson.loads(SCHEMA_PATH.read_bytes())
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema)


def _key_path(parts: Iterable[str | int]) -> str:
    """``marginal_accept_rates[1]``, ``measurement_conditions.temperature``; ``(the document)`` for the top."""
    text = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in parts).lstrip(".")
    return text or "(the document)"


def _validation(mean: float, marginal: list[float]) -> JsonObject:
    """ModelOpt's two checks: the mean per step is 1 + the sum of the marginals, which never rise."""
    implied = 1.0 + sum(marginal)
    violations = [{"position": i, "value": marginal[i], "previous": marginal[i - 1]}
                  for i in range(1, len(marginal)) if marginal[i] > marginal[i - 1] + 1e-9]
    return {"mean_consistency": {"implied_mean_accept_length": round(implied, 6),
                                 "reported_mean_accept_length": round(mean, 6),
                                 "abs_delta": round(abs(implied - mean), 6), "tolerance": CONSISTENCY_TOLERANCE,
                                 "passed": abs(implied - mean) <= CONSISTENCY_TOLERANCE},
            "marginal_monotonicity": {"passed": not violations, "violations": violations}}


def _target(head: Endpoint) -> dict[str, str | None]:
    identity = head.identity
    return {"id": _published(identity.get("model_root")) or identity.get("served_model"),
            "served_model": identity.get("served_model"), "revision": identity.get("revision"),
            "dtype": identity.get("dtype"), "quantization": identity.get("quantization")}


def _published(path: str | None) -> str | None:
    """A path as it may be published: its last two parts (``org/model``), never the machine's layout."""
    parts = [part for part in str(path or "").replace("\\", "/").split("/") if part]
    return "/".join(parts[-2:]) or None


def _rates(values: tuple[float, ...], k: int) -> list[float]:
    """One rate per drafted position, k of them (positions never reached: 0)."""
    return [round(x, 6) for x in [*values, *[0.0] * k][:k]]


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
