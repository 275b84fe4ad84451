"""Real Snakemake, real job: a Table 1 base row through its own pipeline (a tiny SD-XL saved in
its on-disk format) on drawbench, scored by UnifiedReward against a fake judge that the
workflow itself starts beside the job (marble.rewards.service) and stops afterwards."""

from __future__ import annotations

import json
import sys

import yaml
from test_workflow_lib import copy_workflow, snakemake

from beds import replicas_t2i


def test_generic_row_scored_by_the_workflow_started_judge(tmp_path):
    work = copy_workflow(tmp_path / "repo")
    model = replicas_t2i.sdxl_repo(tmp_path / "tiny-sdxl")
    raw = work / "data/raw-tiny/drawbench"
    raw.mkdir(parents=True)
    (raw / "test.txt").write_text("a red bicycle\na foggy forest\n")
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["runs"] = {}
    cfg["eval"].update(
        datasets=["drawbench"], limit=2, rewards={"drawbench": ["toy_brightness", "unifiedreward"]},
        checkpoints={"sdxl": "base"},
        protocols={"sdxl": {"model": str(model), "model_type": "generic", "num_inference_steps": 2,
                            "resolution": 32, "guidance_scale": 5.0}},
        unifiedreward={"server": f"{sys.executable} -m beds.fake_sglang --port {{port}} --idle 120",
                       "model": None, "ready_timeout_s": 120})
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    snakemake(["-c1", "eval_only", "--allowed-rules", "evaluate_ckpt", "eval_summary", "eval_only"], work)
    [scores_path] = list((work / "results/eval").glob("n2-r32-g5.0-*/sdxl/base/drawbench/average_scores.json"))
    scores = json.loads(scores_path.read_text())
    assert scores["n_unifiedreward"] == 2 and 0.2 <= scores["unifiedreward"] <= 1.0
    info = json.loads((scores_path.parent / "run_info.json").read_text())
    assert info["flags"]["model_type"] == "generic" and info["scorers"]["unifiedreward"]["class"] == "UnifiedReward"
    [log] = list((work / "logs/eval").rglob("drawbench.log"))
    text = log.read_text()
    assert "marble.rewards.service: ready at http://127.0.0.1:" in text
    summary = (work / "results/eval/summary.csv").read_text()
    assert "sdxl,base,drawbench,unifiedreward" in summary
