"""The skip reasons and flags reference: every reason a row is skipped or dropped (``errors.REASONS``, the keys the
ledger, the audit and the card count) and every flag a kept row can carry (``errors.FLAGS``), with the repair
rules and policies that make up a ``repaired:RULE:POLICY`` flag (the recipe schema's ``sources[].repair``), and the
row checks of the screen as registered (``screen.row_checks.ROW_CHECKS``): what each measures, decides and drops a row
for."""

from __future__ import annotations

from ..errors import FLAGS, REASONS, REPAIR_FLAG
from ..recipe.schema import deref, recipe_schema
from ..screen.row_checks import ROW_CHECKS
from .markdown import cell, table


def render_skip_reasons() -> str:
    parts = [
        "# Skip reasons and flags",
        "A row that does not make it into the corpus is skipped (it could not be read as a conversation) or dropped "
        "(a check, dedup, decontamination or the generation decided against it). Each is written to the corpus's "
        "`ledger.jsonl.zst` with one of these reasons, its location and a detail, and counted by reason and source "
        "in `audit.json` (`skipped`, `skipped_by_source`), the audit's text and the dataset card. The keys are "
        "stable.",
        table(("reason", "meaning"), [(f"`{reason}`", cell(meaning)) for reason, meaning in REASONS.items()]),
        "## Row checks",
        "The screen judges every row with these checks, in this order, each on the rows the ones before it kept "
        "(`corpus_builder/screen/row_checks.py`; the eval pack's own rows are held out first). A check measures "
        "before it decides, so the measuring runs where the rows are read.",
        table(("check", "measures", "decides", "skip reason"),
              [(f"`{check.__name__}`", cell(check.measures), cell(check.decides), f"`{check.reason}`")
               for check in ROW_CHECKS]),
        "## Flags",
        "A kept row may carry flags (its `flags` column): facts about the row, counted in `audit.json` (`flags`, "
        "and per source in `by_source.NAME.flags`).",
        table(("flag", "meaning"), [(f"`{flag}`", cell(meaning)) for flag, meaning in FLAGS.items()]),
        f"The repair rules and their policies (each `{REPAIR_FLAG}` flag is one of these; `skip` switches a rule "
        "off and flags nothing):",
        table(("rule", "policies that flag a row"), _repair_rules()),
    ]
    return "\n\n".join(parts) + "\n"


def _repair_rules() -> list[tuple[str, str]]:
    schema = recipe_schema()
    source = deref(schema["properties"]["sources"]["items"], schema)
    repair = deref(source["properties"]["repair"], schema)
    return [(f"`{rule}`", ", ".join(f"`{policy}`" for policy in deref(sub, schema)["enum"] if policy != "skip"))
            for rule, sub in repair["properties"].items()]
