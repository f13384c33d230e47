"""The HTML report opened in a real headless Chromium: no network, no console error, every plot drawn."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .browser import DRAWN, PLOTS, chromium, require_chromium, visit


def expected_plots(report: dict[str, Any]) -> int:
    """One per compared dimension but the token frequencies, the divergence summary, four length
    histograms, thinking by source and split, drop and repair reasons, copy-spans and vocabulary coverage."""
    compared = [name for name in report.get("divergence", {}) if name != "token_frequencies"]
    return (len(compared) + 1 if compared else 0) + 4 + 4


@pytest.mark.parametrize("against", [True, False], ids=["against-traffic", "corpus-only"])
def test_the_report_opens_offline_with_every_plot_drawn(corpus: Path, traffic: Path, tmp_path: Path,
                                                        against: bool) -> None:
    require_chromium()
    page = tmp_path / "report.html"
    args = ["audit", str(corpus), "--html", str(page), "--json"] + (["--against", str(traffic)] if against else [])
    completed = subprocess.run([sys.executable, "-m", "corpus_builder", *args], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout) if against else {}
    url = page.resolve().as_uri()
    with chromium() as tools:
        seen = visit(tools, url, f"document.readyState === 'complete' && {DRAWN}")
        plots = tools.evaluate(f"document.querySelectorAll('{PLOTS}').length")
        svgs = tools.evaluate(f"document.querySelectorAll('{PLOTS} svg.main-svg').length")
        text = tools.evaluate("document.body.innerText")
    assert seen.requests == [url]  # the page itself, nothing else: plotly.js and the data are inline
    assert seen.console_errors == [] and seen.exceptions == []
    assert plots == expected_plots(report)
    assert svgs >= plots
    if against:
        assert "recipe.yaml (matched to the traffic)" in text and "thinking" in text
        assert "prompt-lookup (n-gram) speculation" in text
