"""Composite z-score (spec E, Table 1) and the evaluation summary tables."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from marble.evaluation.summary import collect, composite_zscore, main, render_markdown, wide_table

COLUMNS = ["GenEval", "OCR", "PickScore", "CLIPScore", "HPSv2.1", "Aesthetic", "ImgRwd", "UniRwd"]
TABLE1 = {  # spec E, MARBLE project page
    "SD-XL": [0.55, 0.14, 22.42, 0.287, 0.280, 5.60, 0.76, 2.93],
    "SD3.5-L": [0.71, 0.68, 22.91, 0.289, 0.288, 5.50, 0.96, 3.25],
    "FLUX.1-Dev": [0.66, 0.59, 22.84, 0.295, 0.274, 5.71, 0.96, 3.27],
    "SD3.5-M (w/o CFG)": [0.24, 0.12, 20.51, 0.237, 0.204, 5.13, -0.58, 2.02],
    "SD3.5-M + CFG": [0.63, 0.59, 22.34, 0.285, 0.279, 5.36, 0.85, 3.03],
    "+ FlowGRPO (GenEval)": [0.95, 0.66, 22.51, 0.293, 0.274, 5.32, 1.06, 3.18],
    "+ FlowGRPO (OCR)": [0.66, 0.92, 22.41, 0.290, 0.280, 5.32, 0.95, 3.15],
    "+ FlowGRPO (PickScore)": [0.54, 0.68, 23.50, 0.280, 0.316, 5.90, 1.29, 3.37],
    "+ DiffusionNFT (sequential)": [0.94, 0.91, 23.80, 0.293, 0.331, 6.01, 1.49, 3.49],
    "+ DiffusionNFT (weighted-sum)": [0.92, 0.91, 21.53, 0.267, 0.300, 6.15, 1.16, 3.04],
    "+ MARBLE": [0.94, 0.96, 22.83, 0.286, 0.355, 6.59, 1.53, 3.52],
}


def test_composite_reproduces_table1():
    df = pd.DataFrame.from_dict(TABLE1, orient="index", columns=COLUMNS)
    composite = composite_zscore(df).round(2)
    assert composite["+ MARBLE"] == 1.12
    assert composite["+ DiffusionNFT (sequential)"] == 1.02
    assert composite["+ DiffusionNFT (weighted-sum)"] == 0.18
    assert composite["SD3.5-M (w/o CFG)"] == -2.32
    # The sample std (ddof=1) would not reproduce the page: population std is the rule.
    sample_std = ((df - df.mean()) / df.std(ddof=1)).mean(axis=1).round(2)
    assert sample_std["+ MARBLE"] != 1.12


def test_composite_hand_calculation_and_nan_rules():
    df = pd.DataFrame({"a": [1.0, 3.0, math.nan], "b": [2.0, 2.0, 2.0], "c": [0.0, 1.0, 2.0]},
                      index=["x", "y", "z"])
    out = composite_zscore(df)
    # a over (1, 3): mean 2, pop std 1 -> z = -1, +1; b has no spread -> left out;
    # c over (0, 1, 2): mean 1, pop std sqrt(2/3).
    s = math.sqrt(2 / 3)
    assert out["x"] == pytest.approx((-1 + -1 / s) / 2)
    assert out["y"] == pytest.approx((1 + 0) / 2)
    assert out["z"] == pytest.approx(1 / s)
    assert composite_zscore(df.iloc[:1]).isna().all()  # one row: no z-score at all


def write_scores(root, run, ckpt, dataset, scores):
    path = root / run / ckpt / dataset / "average_scores.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(scores))


def test_summary_tables_paper_and_toy_columns(tmp_path):
    ev = tmp_path / "eval"
    for run, pick, gen in [("marble", 0.88, 0.9), ("wsum", 0.84, 0.5)]:
        write_scores(ev, run, "checkpoint-000010", "pickscore",
                     {"pickscore": pick, "n_pickscore": 4, "nan_pickscore": 0, "unifiedreward": 0.6,
                      "n_unifiedreward": 4, "toy_brightness": gen, "n_toy_brightness": 4})
        write_scores(ev, run, "checkpoint-000010", "drawbench",
                     {"unifiedreward": 0.7, "n_unifiedreward": 4})
        write_scores(ev, run, "checkpoint-000010", "geneval",
                     {"geneval": gen, "n_geneval": 4, "accuracy": gen - 0.1, "geneval_overall": None,
                      "toy_color_match": None, "n_toy_color_match": 0})
    long = collect(ev)
    assert set(long.columns) == {"run", "checkpoint", "dataset", "metric", "value"}
    assert len(long[(long.run == "marble") & (long.metric == "pickscore")]) == 1
    table, decimals = wide_table(long)
    row = table.loc["marble/checkpoint-000010"]
    assert row["PickScore"] == pytest.approx(0.88 * 26)
    assert row["UniRwd"] == pytest.approx(0.7 * 5)  # drawbench is preferred for UnifiedReward
    assert row["GenEval"] == pytest.approx(0.8)  # overall is null on a subset -> sample accuracy
    assert "toy_brightness (pickscore)" in table.columns
    assert "toy_color_match (geneval)" not in table.columns  # all-NaN columns are dropped
    assert table["Composite"]["marble/checkpoint-000010"] == pytest.approx(1.0)  # UniRwd has no spread
    md = render_markdown(table, decimals)
    assert "| marble/checkpoint-000010 | 0.80 | 22.88 | 3.50 |" in md and "+1.00" in md


def test_cli_writes_csv_and_markdown(tmp_path, capsys):
    write_scores(tmp_path / "eval", "r", "c", "ocr", {"ocr": 0.5, "n_ocr": 2})
    assert main(["--eval-dir", str(tmp_path / "eval"), "--out-csv", str(tmp_path / "s.csv"),
                 "--out-md", str(tmp_path / "t.md")]) == 0
    assert pd.read_csv(tmp_path / "s.csv").query("metric == 'ocr'")["value"].tolist() == [0.5]
    assert "| r/c | 0.50 |" in (tmp_path / "t.md").read_text()
    # one line, exit 2, never a traceback (issue 38)
    capsys.readouterr()
    assert main(["--eval-dir", str(tmp_path / "none"), "--out-csv", "x", "--out-md", "y"]) == 2
    assert "--eval-dir" in capsys.readouterr().err
