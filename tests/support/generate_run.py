"""Builders shared by the generation tests, and a script that runs one generation in its own process
(the crash/resume test SIGKILLs it mid-run).

    python -m tests.support.generate_run BASE_URL MODEL JOURNAL_DIR OUT_FILE COUNT TURNS MAX_TOKENS

appends one JSON line per yielded row, flushed as it goes: ``{"id", "skipped": reason or null, "row":
the row or null}``. BASE_URL ``engine`` runs the in-process vLLM engine on the model directory MODEL.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from corpus_builder.recipe import GenerationSettings, OutputSpec, Recipe, Target
from corpus_builder.testing.prompts import make_prompts


def make_recipe(model: str, **generation: Any) -> Recipe:
    """A recipe whose only relevant part is the target; ``generation`` overrides GenerationSettings."""
    settings = {"timeout_s": 30.0, "max_retries": 2, "concurrency": 8, **generation}
    return Recipe(name="test", target=Target(model=model, generation=GenerationSettings(**settings)),
                  sources=(), output=OutputSpec(dir=Path("unused")))


def script_recipe(model: str, max_tokens: int) -> Recipe:
    """The recipe of the script below (the tests rebuild with the same one). Truncated turns are kept so
    every row reaches its last turn."""
    return make_recipe(model, max_tokens=max_tokens, concurrency=4, on_length="keep")


def main(argv: list[str]) -> None:
    import orjson

    from corpus_builder.errors import Skipped
    from corpus_builder.generate import generate

    base_url, model, journal_dir, out_file, count, turns, max_tokens = argv
    recipe = script_recipe(model, int(max_tokens))
    prompts = make_prompts(int(count), turns=int(turns))
    if base_url == "engine":  # the tiny model's hand-set weights need float32
        rows = generate(prompts, recipe, Path(journal_dir), endpoints=[], backend="engine",
                        engine_kwargs={"dtype": "float32", "max_model_len": 2048, "enforce_eager": True})
    else:
        rows = generate(prompts, recipe, Path(journal_dir), endpoints=[base_url])
    with open(out_file, "ab") as out:
        for row in rows:
            skipped = isinstance(row, Skipped)
            line = {"id": row.id, "skipped": row.reason if skipped else None,
                    "row": None if skipped else row.to_row()}
            out.write(orjson.dumps(line) + b"\n")
            out.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
