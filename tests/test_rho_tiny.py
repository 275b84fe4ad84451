"""The rho ablation's tiny analogue end to end: three tiny MARBLE runs differing only in
`balancer.alpha_ema` and a weighted-sum run (3 steps each, in-process), then the paper's
tables and the report from their folders."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from test_trainer import read_metrics, small_args, table_path  # noqa: F401 (fixture)

from marble.report.cli import main as report_main
from marble.report.tables_cli import main as tables_main
from marble.train import main as train_main

RHOS = (0.1, 0.5, 0.9)


@pytest.fixture(scope="module")
def tiny_rho_runs(tiny_model_dir, table_path, tmp_path_factory):  # noqa: F811
    runs = tmp_path_factory.mktemp("rho") / "runs"
    for rho in RHOS:
        argv = small_args(tiny_model_dir, table_path, runs / f"rho_{rho:g}".replace(".", ""),
                          extra=(f"balancer.alpha_ema={rho}", "balancer.diagnostics_every=1"))
        assert train_main(argv + ["--max-steps", "3"]) == 0
    argv = small_args(tiny_model_dir, table_path, runs / "weighted_sum", "weighted_sum",
                      extra=("balancer.diagnostics_every=1",))
    assert train_main(argv + ["--max-steps", "3"]) == 0
    return runs


def test_tiny_rho_runs_differ_in_their_alpha_cache(tiny_rho_runs):
    """amortize_every=2: step 3's full solve mixes into the cache with weight 1 - rho."""
    caches = {}
    for rho in RHOS:
        last = read_metrics(tiny_rho_runs / f"rho_{rho:g}".replace(".", ""))[-1]
        caches[rho] = [v for k, v in sorted(last.items()) if k.startswith("alpha_cache/")]
        assert caches[rho] and sum(caches[rho]) == pytest.approx(1.0, abs=1e-4)
    assert caches[0.1] != caches[0.9]


def test_tiny_rho_ablation_table_and_report(tiny_rho_runs, tmp_path):
    out = tmp_path / "tables"
    assert tables_main(["rho_ablation", "--runs", str(tiny_rho_runs), "--out", str(out)]) == 0
    table = pd.read_csv(out / "rho_ablation.csv")
    ours = table[table["row"] != "published"]
    assert sorted(set(ours["rho"])) == list(RHOS)
    assert set(ours["row"]) == {"ours: rho_01", "ours: rho_05", "ours: rho_09"}  # no weighted_sum
    assert set(ours["basis"]) == {"training reward: last logged epochs"}
    assert ours["ours"].notna().all() and len(ours) == 3 * 4  # 4 toy rewards each
    assert len(table) - len(ours) == 5 * 8  # every published row beside them
    md = (out / "rho_ablation.md").read_text()
    print(md)  # the tiny rho table, for the closing note
    assert "| 0.5 | ours: rho_05 | – |" in md and "| 0.7 | published | – / 0.94 |" in md
    assert tables_main(["harmony", "--runs", str(tiny_rho_runs), "--out", str(out)]) == 0
    harmony = json.loads((out / "harmony.json").read_text())
    assert set(harmony) == {"marble", "weighted_sum"}
    assert all(v is not None for v in harmony["weighted_sum"].values())
    report = tmp_path / "report"
    assert report_main(["--runs", str(tiny_rho_runs), "--out", str(report)]) == 0
    html = (report / "report.html").read_text()
    # toy metrics share no column with the paper's: ours and published as two tables (lead.py)
    # (the report opens with its verdict, marble.report.glance; the tables follow it)
    ours_at = html.index("rho ablation, ours (toy metrics of the tiny run")
    assert html.index("<h2>Verdict</h2>") < ours_at < html.index("rho ablation, published (not measured here)")
