"""The paper's tables (rho ablation, gradient harmony, cost) from synthetic run folders with
known answers, beside the published numbers (docs/algorithm.md section E)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from test_report import DOWN, MARBLE_DIAG, UP, WS_DIAG, write_run

from marble.report import paper_tables as pt
from marble.report import published
from marble.report.loading import load_runs
from marble.report.tables_cli import main as tables_main

CURVES = {"bright": UP, "sat": UP, "color": UP}
# Our evaluated Table-1 values per rho run (the summary holds raw scorer outputs: PickScore
# divided by 26, so 0.85 -> 22.1 on the paper's scale).
# GenEval: the task mean (geneval_overall), the aggregate the views take by default (issue 29).
EVALS = {"rho_01": {"geneval_overall": 0.5, "ocr": 0.4, "pickscore": 0.80},
         "rho_05": {"geneval_overall": 0.9, "ocr": 0.8, "pickscore": 0.85},
         "rho_07": {"geneval_overall": 0.95, "ocr": 0.9, "pickscore": 0.875}}
DATASET = {"geneval_overall": "geneval", "ocr": "ocr", "pickscore": "pickscore"}


def _rho_runs(root):
    for name, rho in (("rho_01", 0.1), ("rho_05", 0.5), ("rho_07", 0.7)):
        write_run(root, name, "marble", CURVES, rho=rho)
    write_run(root, "weighted_sum", "weighted_sum", {"bright": UP, "sat": UP, "color": DOWN})
    return root


def _summary(path, evals=EVALS):
    rows = [{"run": run, "checkpoint": ckpt, "dataset": DATASET[m], "metric": m,
             "value": v if ckpt == "checkpoint-10" else 0.0}
            for run, values in evals.items() for m, v in values.items()
            for ckpt in ("checkpoint-5", "checkpoint-10")]
    rows += [{"run": run, "checkpoint": "checkpoint-10", "dataset": DATASET[m], "metric": f"n_{m}",
              "value": 12} for run, values in evals.items() for m in values]
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _cell(frame, row, metric, rho=None):
    pick = (frame["row"] == row) & (frame["metric"] == metric)
    if rho is not None:
        pick &= frame["rho"] == rho
    assert pick.sum() == 1, (row, metric, rho)
    return frame[pick].iloc[0]


def test_a_run_set_aside_by_fresh_is_not_a_run(tmp_path):
    """`marble train --fresh` keeps the replaced run as `.<name>.replaced-<time>` beside the
    new one: the report must not list it as a run of its own."""
    import shutil

    root = _rho_runs(tmp_path / "runs")
    shutil.copytree(root / "rho_07", root / ".rho_07.replaced-20261202T031500Z")
    assert [r.name for r in load_runs(root)] == ["rho_01", "rho_05", "rho_07", "weighted_sum"]


def test_rho_ablation_evaluated_runs_beside_the_published_rows(tmp_path):
    from marble.report.loading import load_eval_summary

    runs = load_runs(_rho_runs(tmp_path / "runs"))
    frame = pt.rho_ablation(runs, load_eval_summary(_summary(tmp_path / "summary.csv")))
    assert sorted(set(frame["row"])) == ["ours: rho_01", "ours: rho_05", "ours: rho_07", "published"]
    assert list(dict.fromkeys(frame["rho"])) == [0.1, 0.3, 0.5, 0.7, 0.9]  # sorted, every published rho
    cell = _cell(frame, "ours: rho_05", "GenEval")
    assert cell["ours"] == pytest.approx(0.9) and cell["published"] == pytest.approx(0.93)
    assert _cell(frame, "ours: rho_05", "PickScore")["ours"] == pytest.approx(22.1)  # x26
    assert _cell(frame, "ours: rho_01", "OCR")["published"] == pytest.approx(0.80)
    assert _cell(frame, "published", "UniRwd", rho=0.9)["published"] == pytest.approx(3.40)
    assert set(frame.loc[frame["row"] != "published", "basis"]) == {"eval: latest checkpoint"}
    # the weighted sum is no row of the rho table; the published rows carry their source
    assert not frame["row"].str.contains("weighted_sum").any()
    assert set(frame.loc[frame["row"] == "published", "source"]) == {published.RHO_SOURCE}
    md = pt.wide_markdown(frame, "rho")
    assert "| 0.5 | ours: rho_05 | 0.9 / 0.93 | 0.8 / 0.95 | 22.1 / 22.02 |" in md


def test_rho_ablation_falls_back_to_training_rewards_for_every_row(tmp_path):
    from marble.report.loading import load_eval_summary

    runs = load_runs(_rho_runs(tmp_path / "runs"))
    partial = {k: v for k, v in EVALS.items() if k != "rho_01"}  # one run not evaluated
    frame = pt.rho_ablation(runs, load_eval_summary(_summary(tmp_path / "s.csv", partial)))
    ours = frame[frame["row"] != "published"]
    assert set(ours["basis"]) == {"training reward: last logged epochs"}
    assert set(ours["metric"]) == {"train bright", "train sat", "train color"}
    assert _cell(frame, "ours: rho_05", "train sat")["ours"] == pytest.approx(np.mean(UP[-2:]))
    assert math.isnan(_cell(frame, "ours: rho_05", "train sat")["published"])


def test_harmony_pooled_per_balancer_beside_the_page(tmp_path):
    root = tmp_path / "runs"
    write_run(root, "weighted_sum", "weighted_sum", CURVES, diag=WS_DIAG)
    write_run(root, "marble", "marble", CURVES, diag=MARBLE_DIAG)
    frame = pt.harmony(load_runs(root))
    anti, cmin, cvar = pt.HARMONY_METRICS.values()
    ws = {m: _cell(frame, "weighted_sum", m) for m in (anti, cmin, cvar)}
    assert ws[anti]["ours"] == pytest.approx(0.5) and ws[anti]["published"] == pytest.approx(0.80)
    assert ws[cmin]["ours"] == pytest.approx(0.025) and ws[cmin]["published"] == pytest.approx(-0.13)
    assert ws[cvar]["ours"] == pytest.approx(0.15) and ws[cvar]["published"] == pytest.approx(0.161)
    mb = {m: _cell(frame, "marble", m) for m in (anti, cmin, cvar)}
    assert mb[anti]["ours"] == 0.0 and mb[anti]["published"] == 0.0
    assert mb[cmin]["ours"] == pytest.approx(0.375) and mb[cmin]["published"] == pytest.approx(0.37)
    assert mb[cvar]["ours"] == pytest.approx(0.01) and mb[cvar]["published"] == pytest.approx(0.006)
    assert set(frame["basis"]) == {"1 run(s), 4 logged diagnostic steps"}


GPU_BENCH = {"device": "cuda:0", "gpu": "NVIDIA H200", "preset": "bench_sd35m",
             "balancers": {"weighted_sum": {"step_s": 2.0, "peak_mb": 60 * 1024},
                           "marble": {"step_s": 2.1, "peak_mb": 66 * 1024},
                           "mgda": {"step_s": 4.0, "peak_mb": 68 * 1024}},
             "ratios": {"marble": {"time": 1.05}, "mgda": {"time": 2.0}},
             "marble_run": {"retain": {"time": 1.25, "peak_mb": 68 * 1024}}}
FLOPS = {"rows": [{"balancer": "weighted_sum", "flops": 1e12, "live_peak_bytes": 100.0},
                  {"balancer": "mgda", "flops": 4e12, "live_peak_bytes": 130.0},
                  {"balancer": "marble", "flops": 1.25e12, "live_peak_bytes": 120.0}]}
WITH, WITHOUT = "MARBLE with amortization, N = 10", "MARBLE without amortization"


def test_cost_measured_on_a_gpu_beside_the_page():
    frame = pt.cost(GPU_BENCH, FLOPS)  # a GPU bench wins over counts
    assert _cell(frame, WITH, pt.SPEED)["ours"] == pytest.approx(0.8)  # marble_run: 1 / 1.25
    assert _cell(frame, WITH, pt.SPEED)["published"] == pytest.approx(0.97)
    assert _cell(frame, WITH, pt.MEMORY)["ours"] == pytest.approx(68.0)
    assert _cell(frame, WITHOUT, pt.SPEED)["ours"] == pytest.approx(0.5)
    assert _cell(frame, WITHOUT, pt.MEMORY)["published"] == pytest.approx(67.0)
    ws = _cell(frame, "Weighted sum (DiffusionNFT)", pt.MEMORY)
    assert ws["ours"] == pytest.approx(60.0) and ws["published"] == pytest.approx(59.0)
    assert set(frame["basis"]) == {"measured: `marble bench step` preset bench_sd35m on NVIDIA H200"}


def test_cost_without_a_gpu_shows_counted_ratios_labelled_or_not_measured():
    frame = pt.cost({**GPU_BENCH, "device": "cpu", "gpu": None}, FLOPS)
    flop = "counted FLOP ratio (weighted sum / this)"
    assert _cell(frame, WITHOUT, flop)["ours"] == pytest.approx(0.25)
    assert _cell(frame, WITH, "counted live-peak ratio (this / weighted sum)")["ours"] == pytest.approx(1.2)
    assert math.isnan(_cell(frame, WITH, pt.SPEED)["ours"])  # never a count in a time column
    assert _cell(frame, WITH, pt.SPEED)["published"] == pytest.approx(0.97)
    assert set(frame["basis"]) == {"counted: `marble bench flops` (operation counts, not a timing)"}
    toy = pt.cost({**GPU_BENCH, "device": "cpu", "gpu": None, "preset": "tiny"}, None)
    assert all("a toy analogue" in b for b in toy["basis"])
    # a CPU bench's peak is the process's RSS: its own metric, never in the paper's GPU column
    # (issue 41: 0.497 "GB" of RSS was drawn beside the paper's 59/67 GB of H200 memory)
    rss, gpu = _cell(toy, WITH, pt.CPU_MEMORY), _cell(toy, WITH, pt.MEMORY)
    assert rss["ours"] == pytest.approx(68.0) and math.isnan(rss["published"])
    assert math.isnan(gpu["ours"]) and gpu["published"] == pytest.approx(67.0)
    nothing = pt.cost(None, None)
    assert set(nothing["basis"]) == {pt.NOT_MEASURED} and nothing["ours"].isna().all()
    assert list(nothing["published"]) == [1.00, 59.0, 0.56, 67.0, 0.97, 67.0]


def test_tables_cli_writes_csv_markdown_and_strict_metrics(tmp_path):
    runs = _rho_runs(tmp_path / "runs")
    out = tmp_path / "tables"
    summary = _summary(tmp_path / "summary.csv")
    assert tables_main(["rho_ablation", "--runs", str(runs), "--eval-summary", str(summary),
                        "--out", str(out)]) == 0
    assert tables_main(["harmony", "--runs", str(runs), "--only", "weighted_sum,rho_07",
                        "--out", str(out)]) == 0
    assert tables_main(["cost", "--out", str(out)]) == 0
    metrics = json.loads((out / "rho_ablation.json").read_text(), parse_constant=pytest.fail)
    assert metrics["rho=0.5 ours: rho_05"]["GenEval"] == pytest.approx(0.9)
    assert set(json.loads((out / "harmony.json").read_text())) == {"marble", "weighted_sum"}
    assert "not measured" in (out / "cost.md").read_text()
    assert pd.read_csv(out / "rho_ablation.csv").shape[0] == 5 * 8 + 3 * 3
    assert tables_main(["paper_tables", "--inputs", str(out / "rho_ablation.md"),
                        str(out / "cost.md"), "--out", str(out)]) == 0
    joined = (out / "paper_tables.md").read_text()
    assert "EMA decay rho ablation" in joined and "Training cost" in joined
    with pytest.raises(SystemExit, match="--only names runs .*: nope"):
        tables_main(["harmony", "--runs", str(runs), "--only", "nope", "--out", str(out)])


def test_table1_view_toy_rewards_averaged_over_datasets(tmp_path):
    from test_report_layout import _wide_eval

    from marble.report.loading import load_eval_summary

    root = tmp_path / "runs"
    write_run(root, "weighted_sum", "weighted_sum", CURVES)
    write_run(root, "marble", "marble", CURVES)
    write_run(root, "marble_s2", "marble", CURVES)
    long = load_eval_summary(_wide_eval(tmp_path / "s.csv", ["weighted_sum", "marble", "marble_s2"]))
    frame = pt.table1(load_runs(root), long)
    # _wide_eval: run i, toy reward j -> 0.1 i + 0.01 j on every dataset; MARBLE = runs 1, 2
    cell = _cell(frame, "marble (+ MARBLE)", "toy_saturation (mean over datasets)")
    assert cell["ours"] == pytest.approx(0.16) and math.isnan(cell["published"])
    assert _cell(frame, "weighted_sum (+ DiffusionNFT (weighted-sum))", "OCR")["published"] == 0.91
    assert set(frame["basis"]) == {"eval: latest checkpoint, mean of 1 run(s)",
                                   "eval: latest checkpoint, mean of 2 run(s)"}


def test_a_table_without_common_metrics_is_shown_as_two_sides(tmp_path):
    """Issue 26: the tiny default's Table 1 has toy metrics of ours and the paper's metrics
    published, none in common: the lead shows two tables saying so, not "– / 0.92" cells."""
    from marble.report.lead import lead_blocks
    from marble.report.render import Table, Text

    frame = pd.DataFrame([
        {"row": "weighted_sum", "metric": "toy_brightness", "ours": 0.5, "published": math.nan,
         "basis": "eval", "source": ""},
        {"row": "weighted_sum", "metric": "OCR", "ours": math.nan, "published": 0.92,
         "basis": "eval", "source": "published: page"}])
    assert not pt.has_overlap(frame)
    assert pt.has_overlap(frame.assign(ours=[0.5, 0.9]))
    assert pt.one_side(frame, "ours").to_dict() == {"toy_brightness": {"weighted_sum": "0.5"}}
    blocks = lead_blocks({"Table 1": frame}, tmp_path, True, lambda name, f: f"{name}.csv")
    tables = [b for b in blocks if isinstance(b, Table)]
    assert len(tables) == 2 and "not measured" in tables[1].caption
    assert "– / 0.92" not in str([t.frame.to_dict() for t in tables])
    assert isinstance(blocks[-1], Text)  # the toy note; no figure of published bars alone
