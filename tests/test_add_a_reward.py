"""A new reward is one module plus its descriptor (docs/ARCHITECTURE.md, "Add a reward"):
registered through `marble.rewards.register` alone, `tests/reward_probe.py` passes the
doctor, is priced by the cost model behind `marble plan`, counted by `marble bench flops`,
trained on by the tiny trainer and scored by `marble evaluate`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from reward_probe import DESCRIPTOR, NAME
from tiny_tables import three_prompt_table

from marble import rewards
from marble.config import load_config

ROOT = Path(__file__).resolve().parents[1]
# Two of the tiny preset's toy rewards and the probe: K = 3.
REWARDS = f"rewards=[{{name: toy_brightness}}, {{name: toy_saturation}}, {{name: {NAME}}}]"


@pytest.fixture
def probe():
    rewards.register(DESCRIPTOR)
    yield DESCRIPTOR
    rewards.unregister(NAME)


def test_unregistered_it_is_unknown_everywhere():
    from marble.workflow import flops

    assert NAME not in rewards.available()
    with pytest.raises(KeyError, match=f"unknown reward '{NAME}'"):
        flops.scorer_flops(NAME)  # never priced as 0 or as another reward
    with pytest.raises(ValueError, match="already registered"):
        rewards.register(DESCRIPTOR.__class__("toy_brightness", "x:Y", flops=0.0))


def test_the_doctor_checks_and_builds_it(probe, tmp_path, capsys, monkeypatch):
    from marble import doctor

    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo: a laptop
    root = tmp_path / "wf"
    (root / "workflow/schemas").mkdir(parents=True)
    shutil.copy2(ROOT / "workflow/schemas/config.schema.yaml", root / "workflow/schemas")
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["runs"] = {"probe": {"preset": "tiny", "set": [REWARDS]}}
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    assert doctor.main(["--root", str(root)]) == 0, capsys.readouterr().out
    assert f"reward {NAME}" in capsys.readouterr().out
    monkeypatch.setitem(rewards.REGISTRY, NAME, DESCRIPTOR.__class__(
        NAME, DESCRIPTOR.target, flops=0.0, modules=("no_such_module_x",)))
    assert doctor.main(["--root", str(root)]) == 1  # its own modules, from its descriptor
    assert "missing module(s) no_such_module_x" in capsys.readouterr().out


def test_the_plan_prices_its_scoring_from_the_descriptor(probe):
    from marble.workflow import cost
    from marble.workflow.flops import load_table

    cfg = load_config("tiny", overrides=[REWARDS])
    images = cfg.sampling.batch_size * cfg.sampling.num_batches_per_epoch  # one process's step
    # the images of a step x the probe's 7 MFLOP (the toy rewards state 0)
    assert cost.rollout_flops(cfg, load_table())["rollout scoring"] == pytest.approx(images * 7.0e6)


def test_bench_flops_counts_a_run_with_it(probe):
    from marble.tools.bench_flops import bench_flops

    res = bench_flops(load_config("tiny", overrides=[REWARDS]), rows=("weighted_sum",), runs=())
    assert res["rows"]["weighted_sum"]["flops"] > 0


def test_a_tiny_training_and_an_evaluation_score_it(probe, tiny_model_dir, tmp_path):
    from marble import evaluate
    from marble.train import main as train_main

    table = three_prompt_table(tmp_path / "train.parquet")
    sets = [f"model.path={tiny_model_dir}", f"data.train={table}", "sampling.num_steps=2",
            "sampling.resolution=32", "sampling.images_per_prompt=2", "sampling.batch_size=6",
            "sampling.num_batches_per_epoch=1", "train.batch_size=3", REWARDS]
    run = tmp_path / "run"
    assert train_main(["--preset", "tiny", "--output-dir", str(run), "--no-progress", "--max-steps", "1",
                       *[x for s in sets for x in ("--set", s)]]) == 0
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(NAME in key for key in metrics[-1]), sorted(metrics[-1])

    out, raw = tmp_path / "eval", tmp_path / "raw"
    (raw / "ocr").mkdir(parents=True)
    (raw / "ocr" / "test.txt").write_text("a red door\na blue sea\n")
    (out / "images").mkdir(parents=True)
    for i, colour in enumerate([(255, 0, 0), (0, 0, 255)]):
        Image.fromarray(np.full((16, 16, 3), colour, dtype=np.uint8)).save(out / "images" / f"{i:05d}.png")
    assert evaluate.main(["--model_path", "never-loaded", "--dataset", "ocr", "--data_dir", str(raw),
                          "--output_dir", str(out), "--batch_size", "2", "--rewards", NAME,
                          "--skip_generation", "--image_format", "png"]) == 0
    scores = [json.loads(line)["scores"][NAME] for line in
              (out / "evaluation_results.jsonl").read_text().splitlines()]
    assert scores == pytest.approx([1.0, -1.0])
