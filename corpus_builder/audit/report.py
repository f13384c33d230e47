"""The audit as people read it (`--json` gives the machine form)."""

from __future__ import annotations

from typing import Any

from ..build.stats import GROUPINGS

MISMATCHES_SHOWN = 5


def _share(value: float) -> str:
    return f"{100 * value:.1f}%"


def format_report(report: dict[str, Any]) -> str:
    """A readable table for people; `--json` gives the machine form."""
    lines = [
        f"conversations        {report['conversations']:>10,}",
        f"thinking             {report['thinking_conversations']:>10,}  ({_share(report['thinking_share'])})",
        f"turns                {report['turns']:>10,}",
        f"characters           {report['characters']:>10,}",
        f"reasoning share of assistant text  {_share(report['reasoning_char_share'])}",
    ]
    for grouping in GROUPINGS:
        section = report.get(f"by_{grouping}") or {}
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
    if report.get("flags"):
        lines += ["", "flags kept on rows"]
        lines += [f"  {flag:<22} {count:>9,}" for flag, count in report["flags"].items()]
    if report.get("tokens"):
        lines += ["", *_format_tokens(report["tokens"])]
    secrets = report.get("secrets")
    if secrets and secrets["findings"]:
        lines += ["", f"secrets: {secrets['findings']:,} found ({secrets['by_kind']}); first ones:"]
        lines += [f"  {example}" for example in secrets["examples"]]
    return "\n".join(lines)


def _format_tokens(tokens: dict[str, Any]) -> list[str]:
    budget = tokens["max_seq_len"]
    lines = [f"target tokens per conversation (as served; budget {budget if budget is not None else 'none'})"]
    sections = {"all": tokens, **{f"{grouping} {key}": section for grouping in ("source", "split")
                                  for key, section in tokens[f"by_{grouping}"].items()}}
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
