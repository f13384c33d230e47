"""The `corpus` command: parse arguments, call the library, print, choose the exit code.

Exit codes: 0 success; 1 the data fails a check (thinking share, publish gate); 2 a problem the user
must fix (bad recipe, unreadable file, bad arguments); 3 the machinery failed (generation incomplete, a server
gone). ``EXIT_CODES`` says what each command means by each: its ``--help`` and the CLI reference
(``corpus_builder.reference``) are written from it. Heavy modules are imported inside commands so
`corpus --help`, `corpus validate` and `corpus audit` start fast.
"""

from __future__ import annotations

import io
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ._version import __version__
from .errors import CorpusError
from .trainer_formats import BENCH_FORMAT, BENCH_TURNS, EXPORT_FORMATS, FILE_FORMATS

if TYPE_CHECKING:
    from .eval import Run
    from .recipe.model import Engine

EXIT_OK = 0
EXIT_CHECKS_FAILED = 1
EXIT_USAGE = 2
EXIT_INCOMPLETE = 3  # the machinery failed (rows out of retries, a server gone): nothing written or reported
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT

# What each command's exit codes mean: the single table the commands' --help (their epilog) and the generated CLI
# reference read. EXIT_ANY holds the codes every command shares.
EXIT_ANY: tuple[tuple[int, str], ...] = (
    (EXIT_USAGE, "bad arguments (click's usage errors)"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C); a build run again resumes from its journal"),
)
EXIT_CODES: dict[str, tuple[tuple[int, str], ...]] = {
    "validate": (
        (EXIT_OK, "the recipe is valid"),
        (EXIT_USAGE, "problems, each printed as file:line:col: key.path: problem"),
    ),
    "build": (
        (EXIT_OK, "the corpus was written (--dry-run: the plan found no problem)"),
        (EXIT_CHECKS_FAILED, "a corpus check failed (e.g. checks.min_thinking_share), the declared mixture cannot be "
                             "met (without --allow-short) or every row was dropped (without --allow-empty)"),
        (EXIT_USAGE, "bad input: the recipe, a source, an unwritable path or a full disk, another build writing the "
                     "directory (--dry-run: a problem found in the plan)"),
        (EXIT_INCOMPLETE, "generation incomplete (rows out of retries, the server gone): nothing written, every "
                          "finished turn journaled; rerun to resume"),
    ),
    "audit": (
        (EXIT_OK, "the statistics were printed and every check passed"),
        (EXIT_CHECKS_FAILED, "the thinking share is below --min-thinking-share, the secrets scan found a credential, "
                             "or a divergence exceeds --max-divergence (also: more unreadable traffic rows than "
                             "--max-skipped-share, unless --allow-skipped)"),
        (EXIT_USAGE, "unreadable input (traffic without one readable row too), or traffic served by another model "
                     "without --allow-other-models"),
    ),
    "publish": (
        (EXIT_OK, "published (--dry-run: the card and the files printed, nothing sent)"),
        (EXIT_CHECKS_FAILED, "the gate refused the corpus (the reasons are printed)"),
        (EXIT_USAGE, "bad input (the repository id, a public repository without --public, a --profile that is not a "
                     "measured speculation profile), the published files do not read back as the corpus, or a build "
                     "is writing the directory"),
    ),
    "export": (
        (EXIT_OK, "the export was written"),
        (EXIT_USAGE, "bad input, or an export that would hold no rows (nothing written)"),
    ),
    "vocab": (
        (EXIT_OK, "the frequencies were written and the coverage printed"),
        (EXIT_USAGE, "bad input, or no supervised token (nothing written)"),
    ),
    "eval": (
        (EXIT_OK, "the run was measured and saved (--compare: the runs compared; --from-run: the profiles written)"),
        (EXIT_CHECKS_FAILED, "more of the pack was lost than --max-lost-share allows: unreadable rows (before any "
                             "request), or prompts a server refused (after the run, which is saved and printed)"),
        (EXIT_USAGE, "a server does not speculate, does not serve --model, serves another target or is shared by "
                     "another client, bad input, or the finished run cannot be saved (it is printed)"),
        (EXIT_INCOMPLETE, "a server failed during the run or counted what no speculating server counts: nothing is "
                          "reported"),
    ),
}


def exit_codes(command: str) -> list[tuple[int, str]]:
    """A command's exit codes and their meanings, those every command shares included, in order."""
    codes = dict(EXIT_CODES[command])
    for code, meaning in EXIT_ANY:
        codes[code] = f"{codes[code]}; or {meaning}" if code in codes else meaning
    return sorted(codes.items())


def exit_epilog(command: str) -> str:
    """A command's --help epilog: its exit codes (``\\b`` keeps click from rewrapping them)."""
    return "\b\nExit codes:\n" + "\n".join(f"  {code:>3}  {meaning}" for code, meaning in exit_codes(command))


def _echo_to_user(text: str, *, err: bool = False) -> None:
    """Print a message made from what the user gave (a recipe, a path, an error about them) without any
    credential it holds: URL userinfo and every kind of secret the scan knows are removed."""
    from .secrets import scrub_message

    click.echo(scrub_message(text), err=err)


class Share(click.FloatRange):
    """A share, 0 to 1. ``nan`` is refused: it passes every range check and fails no comparison, so a limit
    of ``nan`` would never fail."""

    name = "share"

    def __init__(self) -> None:
        super().__init__(0, 1)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        share = super().convert(value, param, ctx)
        if math.isnan(share):
            self.fail(f"{value!r} is not a number from 0 to 1", param, ctx)
        return share


class Temperature(click.FloatRange):
    """A sampling temperature, 0 or more. ``nan`` and ``inf`` are refused: JSON has neither (a request would
    carry null), and ``nan`` passes every range check."""

    name = "temperature"

    def __init__(self) -> None:
        super().__init__(min=0)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        temperature = super().convert(value, param, ctx)
        if not math.isfinite(temperature):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return temperature


def _print_json(value: object) -> None:
    import orjson

    click.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())


class OutputPath(click.Path):
    """A path a command writes. click's Path reads "" as "." (the current directory, which would be written
    into): an empty value goes to the output guard as given instead, which refuses it."""

    def __init__(self) -> None:
        super().__init__(path_type=Path)

    def convert(self, value: str | os.PathLike[str], param: click.Parameter | None, ctx: click.Context | None
                ) -> str | bytes | os.PathLike[str]:
        if isinstance(value, str) and not value.strip():
            from .outputs import check_output_path

            check_output_path(value, what=param.opts[0] if param is not None else "output")  # refuses it
        return super().convert(value, param, ctx)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="corpus")
def cli() -> None:
    """Build, audit and publish training corpora for speculative-decoding draft models."""


@cli.command(epilog=exit_epilog("validate"))
@click.argument("recipe", type=click.Path(path_type=Path))
def validate(recipe: Path) -> None:
    """Check a recipe without doing any work: every problem, with file, line and key."""
    from .recipe import check_recipe

    loaded, problems = check_recipe(recipe, registered_formats=_source_formats)
    if problems:
        for problem in problems:
            _echo_to_user(str(problem), err=True)
        _echo_to_user(f"{recipe}: {len(problems)} problem(s)", err=True)
        sys.exit(EXIT_USAGE)
    assert loaded is not None
    kinds = [s.kind for s in loaded.sources]
    _echo_to_user(f"{recipe}: ok: recipe '{loaded.name}', {len(kinds)} sources "
                  f"({kinds.count('replay')} replay, {kinds.count('prompts')} prompts)")


def _source_formats() -> tuple[str, ...]:
    """The source formats' registry's names, imported only for a recipe that names a format."""
    from .sources.formats import format_names

    return format_names()


@cli.command(epilog=exit_epilog("build"))
@click.argument("recipe", type=click.Path(path_type=Path))
@click.option("--out", type=OutputPath(), help="Output directory (overrides output.dir).")
@click.option("--dry-run", is_flag=True, help="Check the recipe, the sources and the endpoints; generate nothing.")
@click.option("--allow-partial", is_flag=True,
              help="Write the corpus even when generated rows are unfinished (marked in the manifest and card).")
@click.option("--allow-short", is_flag=True,
              help="Write the corpus even when it misses what the recipe declares (marked in the manifest and card).")
@click.option("--allow-empty", is_flag=True,
              help="Write the corpus even when every row was dropped (without it, exit 1 and nothing written).")
@click.option("--engine", type=click.Choice(["local", "ray"]),
              help="What runs the build (overrides the recipe's engine): this machine, or a Ray cluster through Ray "
                   "Data (pip install 'corpus-builder[ray]'); the same corpus.")
@click.option("--address", metavar="HOST:PORT",
              help="With --engine ray: the cluster to join, by its head's address (default: RAY_ADDRESS, else a "
                   "cluster the command starts on this machine, on loopback).")
def build(recipe: Path, out: Path | None, dry_run: bool, allow_partial: bool, allow_short: bool,
          allow_empty: bool, engine: Engine | None, address: str | None) -> None:
    """Build the corpus a recipe describes."""
    from .recipe import load_recipe

    loaded = load_recipe(recipe)
    if address is not None and (engine or loaded.engine) != "ray":
        raise CorpusError("--address names a Ray cluster: it needs --engine ray (or engine: ray in the recipe)")
    if dry_run:
        from .assemble import format_plan, plan_build

        plan = plan_build(loaded, out, allow_short=True if allow_short else None, engine=engine, address=address)
        click.echo(f"dry run of recipe '{loaded.name}': nothing is generated or written\n")
        click.echo(format_plan(plan))
        if plan.problems:
            sys.exit(EXIT_USAGE)
        return
    from .assemble import build_corpus
    from .audit import format_report

    result = build_corpus(loaded, out, allow_partial=True if allow_partial else None,
                          allow_short=True if allow_short else None, allow_empty=allow_empty, engine=engine,
                          address=address)
    click.echo(format_report(result.audit), err=True)
    click.echo(f"\nwrote {result.manifest.conversations:,} conversations to {result.out_dir}", err=True)
    if result.problems:
        for problem in result.problems:
            click.echo(f"check failed: {problem}", err=True)
        sys.exit(EXIT_CHECKS_FAILED)


@cli.command(epilog=exit_epilog("audit"))
@click.argument("path")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--min-thinking-share", type=Share(), help="Exit 1 when the share is below this.")
@click.option("--endpoint", help="Hub endpoint for hf:// paths.")
@click.option("--no-secrets", is_flag=True, help="Skip the secrets scan (Hub tokens, API keys, private keys...).")
@click.option("--against", "traffic", metavar="TRAFFIC",
              help="Compare the corpus with serving traffic: a file or glob (.jsonl, .jsonl.zst, .json, .parquet), "
                   "a recipe .yaml (its sources and task tags) or hf://datasets/ORG/NAME[/SPLIT].")
@click.option("--max-divergence", type=Share(),
              help="With --against: exit 1 when any dimension's total variation distance exceeds this.")
@click.option("--max-skipped-share", type=Share(), default=0.05, show_default=True,
              help="With --against: past this share of unreadable traffic rows every figure is said to describe the "
                   "readable part only, and --max-divergence fails.")
@click.option("--allow-skipped", is_flag=True,
              help="With --max-divergence: do not fail for traffic rows skipped past --max-skipped-share.")
@click.option("--allow-other-models", is_flag=True,
              help="With --against: compare traffic served by another model than the corpus's target (refused by "
                   "default: a draft is judged against its own target's traffic).")
@click.option("--html", "html_path", type=click.Path(),
              help="Write a self-contained HTML report (plots; corpus vs traffic with --against; the acceptance of "
                   "the runs saved of the corpus's eval pack).")
@click.option("--tokenizer", type=click.Path(path_type=Path),
              help="Target tokenizer directory for the token dimensions (default: the corpus recipe's).")
@click.option("--token-sample", type=click.IntRange(min=0), default=100_000, show_default=True,
              help="Conversations per side measured in target tokens, spread over the input (0: all).")
@click.option("--copy-span-tokens", type=click.IntRange(min=1), default=8, show_default=True,
              help="Shortest run of tokens copied from the prompt that counts as a copy-span.")
@click.option("--draft-vocab-size", type=click.IntRange(min=1), default=32000, show_default=True,
              help="Draft vocabulary size whose coverage of the traffic is reported.")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="With --against: what reads the traffic: this machine, or a Ray cluster through Ray Data (pip "
                   "install 'corpus-builder[ray]'); the same figures.")
@click.option("--address", metavar="HOST:PORT",
              help="With --engine ray: the cluster to join, by its head's address (default: RAY_ADDRESS, else a "
                   "cluster the command starts on this machine, on loopback).")
def audit(path: str, as_json: bool, min_thinking_share: float | None, endpoint: str | None, no_secrets: bool,
          traffic: str | None, max_divergence: float | None, max_skipped_share: float, allow_skipped: bool,
          allow_other_models: bool, html_path: str | None, tokenizer: Path | None, token_sample: int,
          copy_span_tokens: int, draft_vocab_size: int, engine: Engine, address: str | None) -> None:
    """Statistics of a built corpus, a raw source file, or hf://datasets/ORG/NAME; with --against, how far a
    built corpus is from serving traffic, dimension by dimension, and the recipe changes that close the gap.

    """
    from .audit import AuditOptions, check_corpus

    options = AuditOptions(tokenizer=tokenizer, token_sample=token_sample, span_tokens=copy_span_tokens,
                           draft_vocab_size=draft_vocab_size, endpoint=endpoint, max_skipped_share=max_skipped_share,
                           allow_other_models=allow_other_models, engine=engine, address=address)
    if html_path is not None:
        from .eval import acceptance_sections  # the page's later stage: the audit itself knows nothing of the eval
    outcome = check_corpus(path, against=traffic, html=html_path, options=options,
                           min_thinking_share=min_thinking_share, max_divergence=max_divergence,
                           allow_skipped=allow_skipped, secrets=not no_secrets,
                           sections=acceptance_sections(path) if html_path is not None else ())
    if as_json:
        _print_json(outcome.to_json())
    else:
        click.echo(outcome.describe())
    if outcome.html is not None:
        click.echo(f"wrote {outcome.html}", err=True)
    for problem in outcome.problems:
        click.echo(f"check failed: {problem}", err=True)
    if outcome.problems:
        sys.exit(EXIT_CHECKS_FAILED)


@cli.command(epilog=exit_epilog("publish"))
@click.argument("corpus_dir", metavar="CORPUS", type=click.Path(path_type=Path))
@click.option("--repo", required=True, help="Dataset repository ORG/NAME.")
@click.option("--public", is_flag=True, help="Make the repository public (private by default).")
@click.option("--revision", default="main", show_default=True, help="Branch to commit to.")
@click.option("--endpoint", help="Hub endpoint (default: HF_ENDPOINT or huggingface.co).")
@click.option("--dry-run", is_flag=True, help="Print what would be uploaded and the card; send nothing.")
@click.option("--export", "exports", multiple=True, metavar="FORMAT[:FILE_FORMAT]",
              help="Also upload this trainer export at exports/FORMAT/{split}.FILE_FORMAT (jsonl unless given; "
                   f"formats: {', '.join(EXPORT_FORMATS)}), named in the card with its training command; repeat for "
                   "more. Default: the corpus recipe's publish.exports.")
@click.option("--tokenizer", type=click.Path(path_type=Path),
              help="Target tokenizer directory for a speculators-tokens export (default: the corpus recipe's).")
@click.option("--profile", "profiles", multiple=True, type=click.Path(path_type=Path), metavar="FILE",
              help="Also upload this speculation_profile.json (ModelOpt's schema 1.0, e.g. from corpus eval --profile) "
                   "of a head trained on the corpus, at speculation_profiles/FILE, named in the card with its figures "
                   "and whether it was measured on the corpus's eval pack; checked before anything else. Repeat for "
                   "more.")
def publish(corpus_dir: Path, repo: str, public: bool, revision: str, endpoint: str | None, dry_run: bool,
            exports: tuple[str, ...], tokenizer: Path | None, profiles: tuple[Path, ...]) -> None:
    """Gate a built corpus, then upload it in one commit (token from HF_TOKEN or the Hub's token file)."""
    from .publish import parse_export, publish_corpus

    specs = [parse_export(text) for text in exports] if exports else None
    report = publish_corpus(corpus_dir, repo, public=public, revision=revision, endpoint=endpoint, dry_run=dry_run,
                            exports=specs, tokenizer=tokenizer, profiles=profiles)
    click.echo(report.describe())


@cli.command(epilog=exit_epilog("export"))
@click.argument("corpus_dir", metavar="CORPUS", type=click.Path(path_type=Path))
@click.option("--format", "fmt", required=True,
              type=click.Choice((*EXPORT_FORMATS, BENCH_FORMAT)),
              help=f"Trainer format, or {BENCH_FORMAT}: an eval pack as vLLM's benchmark dataset.")
@click.option("--out", required=True, type=OutputPath(),
              help="Output directory: one file per split, OUT/{split}.{file format} "
                   f"({BENCH_FORMAT}: OUT/single_turn.jsonl or OUT/multi_turn.json).")
@click.option("--file-format", type=click.Choice(FILE_FORMATS), default="jsonl",
              show_default=True)
@click.option("--tokenizer", type=click.Path(path_type=Path),
              help="Target tokenizer directory (default: the corpus recipe's target.tokenizer).")
@click.option("--turns", type=click.Choice(BENCH_TURNS),
              help=f"{BENCH_FORMAT}: one request per conversation, its turns before the last answer rendered as the "
                   "prompt (single, the default), or every turn replayed in order (multi).")
def export(corpus_dir: Path, fmt: str, out: Path, file_format: str, tokenizer: Path | None, turns: str | None) -> None:
    """Write a built corpus in a trainer's format (rows of one conversation stay in its split's file).

    With --format vllm-bench, CORPUS is an eval pack (a conversations file, a directory of them, or a built corpus,
    whose eval/ is read), written for `vllm bench serve --dataset-name custom` or vLLM's multi-turn benchmark."""
    if fmt == BENCH_FORMAT:
        if file_format != "jsonl":
            raise click.UsageError(f"--file-format does not apply to {BENCH_FORMAT}: vLLM reads JSONL (or JSON)")
        from .eval import export_bench

        click.echo(export_bench(corpus_dir, out, turns=turns or "single", tokenizer=tokenizer).describe())
        return
    if turns is not None:
        raise click.UsageError(f"--turns applies to --format {BENCH_FORMAT} only")
    from .export import export_corpus

    report = export_corpus(corpus_dir, fmt, out, file_format=file_format, tokenizer=tokenizer)
    click.echo(report.describe())


@cli.command(epilog=exit_epilog("vocab"))
@click.argument("corpus_dir", metavar="CORPUS", type=click.Path(path_type=Path))
@click.option("--draft-vocab-size", "--size", "size", type=click.IntRange(min=1), default=32000, show_default=True,
              help="Draft vocabulary size (speculators' --draft-vocab-size): the top N whose coverage is reported.")
@click.option("--out", type=OutputPath(), default=Path("token_freq.npy"), show_default=True,
              help="A directory: speculators' token_freq.pt, d2t-N.npy and t2d-N.npy (put them in the --data-path "
                   "given to speculators train); or a frequency file: .npy (dense int64 by token id), .json or .pt.")
@click.option("--target-vocab-size", type=click.IntRange(min=1),
              help="With --out DIR: the verifier's vocab_size, t2d's length (default: the config.json beside the "
                   "tokenizer). For an export counted without --tokenizer: the vocabulary its ids are held to.")
@click.option("--tokenizer", type=click.Path(path_type=Path),
              help="Target tokenizer directory (default: the corpus recipe's target.tokenizer); its config.json "
                   "gives --target-vocab-size.")
@click.option("--json", "as_json", is_flag=True, help="Print the coverage report as one JSON object.")
def vocab(corpus_dir: Path, size: int, out: Path, target_vocab_size: int | None, tokenizer: Path | None,
          as_json: bool) -> None:
    """Supervised-token frequencies for choosing a draft vocabulary, and the coverage of the top N.

    CORPUS is a built corpus or a speculators-tokens export (its directory, or one .parquet/.jsonl/.jsonl.zst file),
    counted as it is."""
    from .export import draft_vocab

    report = draft_vocab(corpus_dir, out, size=size, tokenizer=tokenizer, target_vocab_size=target_vocab_size)
    if as_json:
        _print_json(report.to_json())
    else:
        click.echo(report.describe())
        click.echo(f"wrote {', '.join(str(path) for path in report.written)}")


@cli.command("eval", epilog=exit_epilog("eval"))
@click.argument("pack", required=False, type=click.Path(path_type=Path))
@click.option("--endpoint", "endpoints", multiple=True, metavar="URL",
              help="A vLLM server serving the target with a speculator (repeat: head A, head B, ...).")
@click.option("--mode", type=click.Choice(["thinking", "non-thinking", "both"]), default="both", show_default=True,
              help="The template's enable_thinking.")
@click.option("--concurrency", type=click.IntRange(min=1), default=1, show_default=True,
              help="Requests in flight per endpoint; above 1 the counters are read per phase only.")
@click.option("--temperature", type=Temperature(),
              help="Sampling temperature (0: greedy); default the recipe's, else the target's.")
@click.option("--max-tokens", type=click.IntRange(min=1),
              help="Output cap per request; default the recipe's, else 1024.")
@click.option("--recipe", type=click.Path(path_type=Path),
              help="Recipe whose target.generation settings apply (default: the corpus's, for a pack in a corpus).")
@click.option("--model", help="Served model name (default: the recipe's target.model, else the one served).")
@click.option("--save-dir", type=OutputPath(),
              help="Where the run is saved (default: eval/results/ beside a built corpus for its pack, else under the "
                   "current directory; never the pack's own folder).")
@click.option("--max-lost-share", type=Share(), default=0.0, show_default=True,
              help="The share of the pack's rows that may be lost (unreadable, or refused by a server) without "
                   "failing: past it, exit 1 (before any request for unreadable rows; after the run, which is "
                   "saved, for refused prompts).")
@click.option("--loop-threshold", type=Share(), default=0.5, show_default=True,
              help="An answer with this share of its tokens or more inside 8-grams seen earlier in it loops: "
                   "counted, and every figure also given without such answers.")
@click.option("--length-edges", default="512,2048,8192,32768", show_default=True, metavar="N,N,...",
              help="The input-length slices' edges, in target tokens (ascending).")
@click.option("--profile", "profile_path", type=OutputPath(),
              help="Write head A's speculation_profile.json there (ModelOpt's schema 1.0; head B's beside it as "
                   "STEM-B.json, ...).")
@click.option("--from-run", "from_run", type=click.Path(path_type=Path), metavar="RUN",
              help="With --profile: write the profiles from this saved run instead of running (nothing is measured).")
@click.option("--compare", "runs", nargs=2, type=click.Path(path_type=Path), metavar="RUN_A RUN_B",
              help="Put two saved runs side by side instead of running.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--html", "html_path", type=OutputPath(),
              help="Write the run's page (with --compare, the two runs'): self-contained HTML, plots inline.")
def eval_command(pack: Path | None, endpoints: tuple[str, ...], mode: str, concurrency: int, temperature: float | None,
                 max_tokens: int | None, recipe: Path | None, model: str | None, save_dir: Path | None,
                 max_lost_share: float, loop_threshold: float, length_edges: str, profile_path: Path | None,
                 from_run: Path | None, runs: tuple[Path, Path] | None, as_json: bool, html_path: Path | None) -> None:
    """Replay an eval pack (a conversations file, a directory of them, or a built corpus's eval/) against vLLM
    servers with speculators: acceptance rate, mean acceptance length and acceptance by position from each server's
    own counters, per mode, source and task; with two or more endpoints, head B / head A with a bootstrap interval."""
    from . import eval as evaluation

    if from_run is not None:
        if profile_path is None or pack is not None or endpoints or runs or as_json or html_path is not None:
            raise click.UsageError("--from-run takes a saved run and --profile FILE, nothing else")
        for profile in evaluation.profiles_from_run(from_run, profile_path):
            click.echo(f"wrote {profile}", err=True)
        return
    if runs:
        if pack is not None or endpoints:
            raise click.UsageError("--compare takes two saved runs and nothing else")
        comparison = evaluation.compare(*runs, html=html_path)
        if as_json:
            _print_json(comparison.to_json())
        else:
            click.echo(evaluation.format_comparison(comparison, (str(runs[0]), str(runs[1]))))
        if html_path is not None:
            click.echo(f"wrote {html_path}", err=True)
        return
    if pack is None or not endpoints:
        raise click.UsageError("give a PACK and at least one --endpoint URL (or --compare RUN_A RUN_B)")
    modes = ("thinking", "non-thinking") if mode == "both" else (mode,)
    try:
        result = evaluation.evaluate(pack, endpoints, modes=modes, concurrency=concurrency, temperature=temperature,
                                     max_tokens=max_tokens, recipe=recipe, model=model, save_dir=save_dir,
                                     html=html_path, max_lost_share=max_lost_share, loop_threshold=loop_threshold,
                                     length_edges=_counts(length_edges, "--length-edges"), profile=profile_path,
                                     progress=lambda message: _echo_to_user(message, err=True))
    except evaluation.RunNotSaved as unsaved:  # never lose a finished run: it is printed, then the error
        _print_run(unsaved.run, as_json)
        raise
    _print_run(result.run, as_json)
    click.echo(f"saved {result.saved}", err=True)
    for written in (result.html, *result.profiles):
        if written is not None:
            click.echo(f"wrote {written}", err=True)
    for problem in result.problems:
        click.echo(f"check failed: {problem}", err=True)
    if result.problems:
        sys.exit(EXIT_CHECKS_FAILED)


def _counts(text: str, option: str) -> tuple[int, ...]:
    """Whole numbers given as N,N,..."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise click.BadParameter(f"{text!r}: whole numbers separated by commas", param_hint=option) from None


def _print_run(run: Run, as_json: bool) -> None:
    from .eval import format_run

    if as_json:
        _print_json(run.to_json())
    else:
        click.echo(format_run(run))

def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as error:
        shown = io.StringIO()  # click's messages quote the arguments given: scrubbed like ours
        error.show(file=shown)
        _echo_to_user(shown.getvalue().rstrip("\n"), err=True)
        sys.exit(EXIT_USAGE if isinstance(error, click.UsageError) else error.exit_code)
    except CorpusError as error:
        _echo_to_user(f"error: {error}", err=True)
        sys.exit(getattr(error, "exit_code", EXIT_USAGE))  # EXIT_INCOMPLETE: generation incomplete, a rerun resumes
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
