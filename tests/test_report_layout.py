"""The report as a reader opens it: headless Chromium at 1280 px, no sideways scroll, the
paper's tables before any prose, the long per-run tables collapsed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from test_report import BENCH, DOWN, MARBLE_DIAG, UP, WS_DIAG, write_run

from marble.report.cli import main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Measured after load: the page's scroll width, the first table's and the first prose
# paragraph's top, which of them comes first, and any element reaching past the viewport.
PROBE = """<script>
window.addEventListener('load', () => {
  const top = s => { const e = document.querySelector(s);
                     return e ? e.getBoundingClientRect().top + window.scrollY : null; };
  const order = [...document.body.querySelectorAll('table, p.text')];
  const out = {scrollWidth: document.scrollingElement.scrollWidth, innerWidth: window.innerWidth,
               firstTable: top('table'), firstText: top('p.text'),
               firstKind: order.length ? order[0].tagName : null,
               past: [...document.body.querySelectorAll('*')]
                 .filter(e => e.getBoundingClientRect().right > window.innerWidth + 0.5)
                 .map(e => e.tagName)};
  const pre = document.createElement('pre'); pre.id = 'layout-probe';
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
});
</script>"""
DATASETS = ["pickscore", "ocr", "geneval", "drawbench"]
TOY = ["toy_brightness", "toy_saturation", "toy_text_contrast", "toy_color_match"]


def _wide_eval(path: Path, runs: list[str]) -> Path:
    """16 reward columns (4 datasets x 4 toy rewards) plus counts: the demo's wide table."""
    rows = [{"run": run, "checkpoint": "checkpoint-000030", "dataset": d, "metric": m, "value": v}
            for i, run in enumerate(runs) for d in DATASETS for j, r in enumerate(TOY)
            for m, v in ((r, 0.1 * i + 0.01 * j), (f"n_{r}", 12))]
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def report_html(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("layout")
    runs = root / "runs"
    names = ["weighted_sum_with_a_long_descriptive_run_name_seed_2", "marble", "rho_05"]
    write_run(runs, names[0], "weighted_sum", {"bright": UP, "sat": UP, "color": DOWN}, diag=WS_DIAG)
    write_run(runs, names[1], "marble", {"bright": UP, "sat": UP, "color": UP}, diag=MARBLE_DIAG,
              alphas=True)
    write_run(runs, names[2], "marble", {"bright": UP, "sat": UP, "color": UP}, rho=0.5)
    (root / "bench.json").write_text(json.dumps(BENCH))
    out = root / "report"
    assert main(["--runs", str(runs), "--out", str(out), "--eval-summary",
                 str(_wide_eval(root / "summary.csv", names)), "--bench",
                 str(root / "bench.json"), "--window", "2"]) == 0
    return out / "report.html"


def test_long_tables_are_collapsed_and_the_lead_comes_first(report_html):
    html = report_html.read_text()
    sections = re.findall(r"<h2>([^<]+)</h2>|<summary>([^<]+)</summary>", html)
    visible = [h for h, _ in sections if h]
    collapsed = [s for _, s in sections if s]
    assert visible[0].startswith("The paper&#x27;s tables, ours beside them (toy analogues)")
    assert visible[1:] == ["Training curves", "Reward weights (alpha)", "Gradient harmony", "Verdict"]
    assert "Details: evaluation scores per run (Table 1 style)" in collapsed
    assert html.index("<table>") < html.index("<p class='text'>")
    # the eval table's 18 columns come in blocks of at most 10 (each with the run column)
    for table in re.findall(r"<table>.*?</table>", html, re.DOTALL):
        assert table.count("<th>") <= 10


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install -y chromium)")
def test_no_sideways_scroll_at_1280px_and_tables_before_prose(report_html, tmp_path):
    probe = tmp_path / "probe.html"
    probe.write_text(report_html.read_text().replace("</body>", PROBE + "</body>"))
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                          "--window-size=1280,900", "--virtual-time-budget=5000", "--dump-dom",
                          probe.as_uri()], check=False, capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'<pre id="layout-probe">([^<]*)</pre>', dom)
    assert found, dom[-2000:]
    layout = json.loads(found.group(1))
    assert layout["scrollWidth"] <= 1280 and layout["past"] == [], layout
    assert layout["firstKind"] == "TABLE", layout
    assert layout["firstTable"] < 900 < layout["firstText"], layout  # on the first screen
