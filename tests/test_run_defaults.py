"""What `marble evaluate --checkpoint_path RUN` takes from the run and its project (torch-free
parts): the paper path keeps the reference's rewards, a run of another base falls back to its
own rewards, and the prompt digest is rewritten exactly when its file changes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from marble.evaluation.datasets import DEFAULT_REWARDS
from marble.evaluation.run_record import RunRecordError, run_folder
from marble.workflow.digests import sync_prompt_digests as sync_digests
from marble.workflow.run_defaults import run_defaults


def _run(root: Path, name: str, base: str, rewards: list[str]) -> Path:
    run = root / "results/runs" / name
    (run / "checkpoints/checkpoint-000002/lora").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"model": {"path": base},
                                                     "rewards": [{"name": r} for r in rewards]}))
    (run / "inputs.json").write_text(json.dumps({"model.path": {"path": base, "fingerprint": "tree:x"}}))
    return run


def _snapshot(root: Path, eval_cfg: dict) -> None:
    """results/preflight.config.json as the workflow writes it (resolved config)."""
    config = {"model_dir": "data/models/sd35m", "raw_dir": "data/raw", "eval": eval_cfg}
    (root / "results/preflight.config.json").write_text(json.dumps({"config": config, "configfiles": []}))


def test_paper_workflow_arguments_keep_the_reference_rewards(tmp_path):
    """The workflow passes every image flag, --model_path and --data_dir, and --rewards only when
    eval.rewards names some: with none (the paper protocol) the reference's per-dataset set stays."""
    run = _run(tmp_path, "marble", "data/models/sd35m", ["pickscore", "hpsv2"])
    (tmp_path / "data/models/sd35m").mkdir(parents=True)
    _snapshot(tmp_path, {"rewards": {}, "num_inference_steps": 40, "resolution": None})
    given = {"model_path", "data_dir", "num_inference_steps", "guidance_scale", "mixed_precision", "numerics",
             "checkpoint_path", "dataset", "output_dir"}
    model = str(tmp_path / "data/models/sd35m")
    values, notes = run_defaults(run, "drawbench", given, model)
    assert values == {"rewards": ",".join(DEFAULT_REWARDS["drawbench"])}, values
    assert notes == [f"--rewards {values['rewards']} (results/preflight.config.json eval protocol of marble)"]
    # A row's own rewards (eval.rewards.<dataset>) win over the reference's.
    _snapshot(tmp_path, {"rewards": {"drawbench": ["clipscore"]}})
    assert run_defaults(run, "drawbench", given, model)[0] == {"rewards": "clipscore"}
    # Another base than the project's: the run's own rewards, and a damaged record is not read
    # for a flag that was given.
    (run / "inputs.json").write_text("{torn")
    assert run_defaults(run, "drawbench", given, str(tmp_path))[0] == {"rewards": "pickscore,hpsv2"}


def test_a_run_of_another_base_scores_with_its_own_rewards(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = _run(tmp_path, "mine", "data/models/other", ["toy_brightness", "toy_saturation"])
    (tmp_path / "data/models/other").mkdir(parents=True)
    (tmp_path / "data/raw/ocr").mkdir(parents=True)
    (tmp_path / "data/raw/ocr/test.txt").write_text("a sign\n")
    _snapshot(tmp_path, {"rewards": {}})
    values, _ = run_defaults(run, "ocr", {"dataset"})
    assert values == {"model_path": "data/models/other", "data_dir": "data/raw",
                      "rewards": "toy_brightness,toy_saturation"}
    with pytest.raises(RunRecordError, match=r"prompts for geneval not found .*: pass --data_dir$"):
        run_defaults(run, "geneval", {"dataset"})
    assert run_folder(run / "checkpoints/checkpoint-000002/lora") == run
    assert run_folder(run / "checkpoints") is None


def test_digest_is_rewritten_exactly_when_the_prompt_file_changes(tmp_path):
    raw, out = tmp_path / "raw", tmp_path / "digests"
    (raw / "ocr").mkdir(parents=True)
    (raw / "ocr/test.txt").write_text("a\nb\n")
    assert sync_digests(raw, out) == ["ocr"]  # the other datasets have no prompt file here
    os.utime(out / "ocr.sha256", (1, 1))
    assert sync_digests(raw, out) == [] and (out / "ocr.sha256").stat().st_mtime == 1
    (raw / "ocr/test.txt").write_text("a\nc\n")
    assert sync_digests(raw, out) == ["ocr"] and (out / "ocr.sha256").stat().st_mtime > 1
