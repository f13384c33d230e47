"""The audit as people read it (`--json` gives the machine form)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..stats.corpus import AuditReport, PackMix, ServedReport, TotalsReport
from ..stats.tokens import TokenReport, TokenTotalsReport

MISMATCHES_SHOWN = 5


def _share(value: float) -> str:
    return f"{100 * value:.1f}%"


SCREENING_REASONS = ("duplicate", "near_duplicate", "contaminated")


def _format_screening(report: AuditReport) -> list[str]:
    """Dedup and decontamination drops by source and rule, contamination by evaluation set, and (raw files)
    near duplicates counted but not dropped."""
    lines: list[str] = []
    by_source = {source: [counts.get(reason, 0) for reason in SCREENING_REASONS]
                 for source, counts in (report.get("skipped_by_source") or {}).items()}
    by_source = {source: counts for source, counts in by_source.items() if any(counts)}
    if by_source:
        width = max(6, *(len(source) for source in by_source))
        lines += ["", f"{'source':<{width}}  {'duplicate':>9}  {'near dup':>9}  {'contaminated':>12}"]
        lines += [f"{source:<{width}}  {exact:>9,}  {near:>9,}  {dirty:>12,}"
                  for source, (exact, near, dirty) in by_source.items()]
    if report.get("contaminated_by_eval_set"):
        lines += ["", "contaminated rows by eval set: " + ", ".join(
            f"{name} {count:,}" for name, count in report["contaminated_by_eval_set"].items())]
    near = report.get("near_duplicates")
    if near:
        lines += ["", f"near duplicates       {near['rows']:>9,}  (similarity >= {near['threshold']}; kept here, "
                      "dropped by a build with checks.near_duplicates)"]
    return lines


def format_report(report: AuditReport) -> str:
    """A readable table for people; `--json` gives the machine form."""
    lines = [
        f"conversations        {report['conversations']:>10,}",
        f"thinking             {report['thinking_conversations']:>10,}  ({_share(report['thinking_share'])})",
        f"turns                {report['turns']:>10,}",
        f"characters           {report['characters']:>10,}",
        f"reasoning share of assistant text  {_share(report['reasoning_char_share'])}",
    ]
    if report.get("tool_call_conversations"):
        lines.insert(2, f"tool calls           {report['tool_call_conversations']:>10,}  "
                        f"({_share(report['tool_call_share'])})")
    sections: list[tuple[str, Mapping[str, TotalsReport]]] = [
        ("source", report["by_source"]), ("split", report["by_split"]), ("origin", report["by_origin"])]
    for grouping, section in sections:
        if not section:
            continue
        width = max(len(grouping), *(len(k) for k in section))
        lines += ["", f"{grouping:<{width}}  {'conversations':>13}  {'thinking':>9}  {'share':>7}  {'turns':>9}"]
        for key, totals in section.items():
            lines.append(f"{key:<{width}}  {totals['conversations']:>13,}  {totals['thinking_conversations']:>9,}  "
                         f"{_share(totals['thinking_share']):>7}  {totals['turns']:>9,}")
    if report.get("skipped"):
        lines += ["", "skipped/dropped rows by reason"]
        lines += [f"  {reason:<22} {count:>9,}" for reason, count in report["skipped"].items()]
    lines += _format_screening(report)
    if report.get("flags"):
        width = max(22, *(len(flag) for flag in report["flags"]))
        lines += ["", "flags kept on rows"]
        lines += [f"  {flag:<{width}} {count:>9,}" for flag, count in report["flags"].items()]
    modes = _generation_modes(report.get("generation"))
    if modes:
        lines += ["", "generated rows by thinking mode: " + ", ".join(f"{mode} {count:,}" for mode, count in modes)]
    if report.get("served"):
        lines += ["", *_format_served(report["served"])]
    mixture = (report.get("checks") or {}).get("mixture")
    if mixture:
        lines += ["", *_format_mixture(mixture)]
    if report.get("eval_pack"):
        lines += ["", *_format_pack(report["eval_pack"])]
    if report.get("tokens"):
        lines += ["", *_format_tokens(report["tokens"])]
    secrets = report.get("secrets")
    if secrets and secrets["findings"]:
        lines += ["", f"secrets: {secrets['findings']:,} found ({secrets['by_kind']}); first ones:"]
        lines += [f"  {example}" for example in secrets["examples"]]
    return "\n".join(lines)


def _format_served(served: ServedReport) -> list[str]:
    """Replayed logged requests: thinking as served beside reasoning present, per source."""
    width = max(6, *(len(source) for source in served["by_source"]))
    lines = ["replayed rows by thinking as served (logged requests), beside reasoning present",
             f"  {'source':<{width}}  {'served on':>9}  {'reasoning':>9}  {'served off':>10}  {'reasoning':>9}  "
             f"{'unrecorded':>10}"]
    for source, modes in served["by_source"].items():
        lines.append(f"  {source:<{width}}  {modes['on']:>9,}  {modes['on_with_reasoning']:>9,}  {modes['off']:>10,}  "
                     f"{modes['off_with_reasoning']:>9,}  {modes['unrecorded']:>10,}")
    if served["models"]:
        lines.append("  served by: " + ", ".join(f"{model} {count:,}" for model, count in served["models"].items()))
    return lines


def _generation_modes(generation: list[dict[str, object]] | None) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for setting in generation or ():
        mode = "thinking on" if setting.get("enable_thinking") else "thinking off"
        conversations = setting.get("conversations", 0)
        counts[mode] = counts.get(mode, 0) + (conversations if isinstance(conversations, int) else 0)
    return sorted(counts.items()) if len(counts) > 1 else []


def _format_mixture(mixture: dict[str, Any]) -> list[str]:
    """Declared vs reached, per source, and the thinking share."""
    sources = mixture["sources"]
    width = max(6, *(len(name) for name in sources))
    lines = [f"{'source':<{width}}  {'declared':>9}  {'reached':>9}  {'passed checks':>13}  {'generated':>9}"]
    for name, source in sources.items():
        declared = "all" if source["declared"] is None else f"{source['declared']:,}"
        generated = f"{source['generated_rows']:,}" if source["generated_rows"] else "-"
        lines.append(f"{name:<{width}}  {declared:>9}  {source['reached']:>9,}  {source['available']:>13,}  "
                     f"{generated:>9}")
    share = mixture["thinking_share"]
    if share["target"] is not None:
        lines.append(f"thinking share: declared {_share(share['target'])} +- {_share(share['tolerance'])}, "
                     f"reached {_share(share['reached'])}")
    lines += [f"short: {item}" for item in mixture["shortfalls"]]
    return lines


def _format_pack(pack: PackMix) -> list[str]:
    """The eval pack's mix beside the corpus's, by source and by task."""
    lines = [f"eval pack (held out of the corpus): {pack['conversations']:,} conversations, "
             f"{_share(pack['thinking_share'])} thinking"]
    for grouping, entries in (("source", pack["by_source"]), ("task", pack["by_task"])):
        width = max(len(grouping), *(len(name) for name in entries))
        lines.append(f"  {grouping:<{width}}  {'pack':>7}  {'share':>7}  {'corpus':>7}  {'thinking':>8}  "
                     f"{'corpus':>7}")
        lines += [f"  {name:<{width}}  {e['conversations']:>7,}  {_share(e['share']):>7}  "
                  f"{_share(e['corpus_share']):>7}  {_share(e['thinking_share']):>8}  "
                  f"{_share(e['corpus_thinking_share']):>7}" for name, e in entries.items()]
    return lines


def _format_tokens(tokens: TokenReport) -> list[str]:
    budget = tokens["max_seq_len"]
    lines = [f"target tokens per conversation (as served; budget {budget if budget is not None else 'none'})"]
    sections: dict[str, TokenTotalsReport] = {
        "all": tokens, **{f"{grouping} {key}": section for grouping, by in (("source", tokens["by_source"]),
                                                                            ("split", tokens["by_split"]))
                          for key, section in by.items()}}
    width = max(len(name) for name in sections)
    lines.append(f"  {'':<{width}}  {'p50':>7}  {'p90':>7}  {'p99':>7}  {'max':>7}  {'reasoning':>9}  {'over':>6}")
    for name, section in sections.items():
        over = section["over_budget"]
        lines.append(f"  {name:<{width}}  {section['p50']:>7,}  {section['p90']:>7,}  {section['p99']:>7,}  "
                     f"{section['max']:>7,}  {_share(section['reasoning_token_share']):>9}  "
                     f"{'-' if over is None else f'{over:,}':>6}")
    mismatches = tokens["mismatches"]
    severity = ""
    if mismatches["count"]:
        severity = " (fatal)" if tokens["token_mismatch"] == "fail" else " (warning)"
    lines.append(f"served-ids check: {mismatches['count']:,} of {mismatches['checked_turns']:,} generated turns "
                 f"do not re-render to their served tokens{severity}")
    for turn in mismatches["turns"][:MISMATCHES_SHOWN]:
        lines.append(f"  {turn['id']} turn {turn['message_index']} at token {turn['position']} ({turn['part']}): "
                     f"served {turn['served_text']!r} vs rendered {turn['rendered_text']!r}")
    if mismatches["count"] > MISMATCHES_SHOWN:
        lines.append(f"  ... {mismatches['count'] - MISMATCHES_SHOWN:,} more in `corpus audit --json` "
                     "(tokens.mismatches)")
    return lines
