"""The claim and zoo experiments lead the main report (marble.report.experiments): their
verdict's sentences, every arm's change with its interval, the anti-aligned and cost frames
claim.md shows, the figures; a folder without a verdict says what to run."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from marble.report.build import ReportInputs, build_report
from marble.experiments.claim_experiment import claim_verdict
from marble.experiments.claim_experiment import measure_claim_run as measure_run
from marble.experiments.claim_figures import write_figures
from marble.report.verdict_frames import change_frame


def _verdict() -> dict:
    measures = []
    for seed in (1, 2, 3):
        diag = pd.DataFrame({"step": [1, 2], "anti_aligned": [1, 0], "full_solve": [0, 1],
                             "cos_min": [-0.1, 0.2]})
        for arm, gain in (("weighted_sum", 0.1), ("marble_n5", 0.3 + 0.01 * seed), ("zoo_upgrad", 0.2)):
            evals = pd.DataFrame([{"step": 0, "eval_reward/g": 0.0, "eval_reward/s": 0.0},
                                  {"step": 2, "eval_reward/g": 1.0, "eval_reward/s": gain}])
            measures.append(measure_run(arm, seed, diag, ["g", "s"], evals))
    v = claim_verdict(measures, ["g", "s"], {"s": 0.25}, "marble_n5", "weighted_sum")
    v["arm_settings"] = {"weighted_sum": {"method": "weighted_sum"},
                         "marble_n5": {"method": "marble", "amortize_every": 5, "alpha_ema": 0.7},
                         "zoo_upgrad": {"method": "gramian", "amortize_every": 5, "alpha_ema": 0.7}}
    v["cost"] = {a: {"counted_flops": 1e9, "flops_ratio": 1.0, "full_solve_micro_steps": 6,
                     "cpu_s": {"mean": 30.0, "low": 28.0, "high": 32.0, "n": 3, "sd": 1.0}}
                 for a in v["arms"]}
    return v


def _experiment(folder: Path) -> dict:
    v = _verdict()
    folder.mkdir(parents=True)
    write_figures(v, folder / "figures")
    (folder / "verdict.json").write_text(json.dumps(v), encoding="utf-8")
    return v


def test_the_experiments_lead_the_report_with_every_arm_and_their_figures(tmp_path):
    v = _experiment(tmp_path / "zoo")
    (tmp_path / "runs").mkdir()
    build_report(ReportInputs(runs_dir=tmp_path / "runs", out=tmp_path / "report",
                              experiments=(tmp_path / "claim", tmp_path / "zoo")))
    md = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    headings = [line for line in md.splitlines() if line.startswith("## ")]
    assert headings[0] == "## The claim at CPU scale"  # no verdict there yet: says what to run
    assert headings[1].startswith("## The balancer zoo at CPU scale")
    claim_part, zoo_part = md.split(headings[1])[0], md.split(headings[1])[1].split(headings[2])[0]
    assert "`snakemake -c2 claim`" in claim_part
    for sentence in v["sentences"]:
        assert sentence in zoo_part
    marble_row = change_frame(v).loc["marble_n5"]
    for arm in ("weighted_sum", "marble_n5", "zoo_upgrad"):
        assert f"| {arm} |" in zoo_part
    assert marble_row.iloc[1] in zoo_part  # the specialist's change [interval] as claim.md shows it
    for name in ("change.png", "anti_aligned_vs_n.png", "cost.png"):
        assert (tmp_path / "report" / "figures" / f"zoo_{name}").stat().st_size > 1000
        assert f"figures/zoo_{name}" in zoo_part
    html = (tmp_path / "report" / "report.html").read_text(encoding="utf-8")
    assert html.index("The balancer zoo at CPU scale") < html.index("Runs")
