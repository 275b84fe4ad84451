"""`marble evaluate --checkpoint_path RUN --dataset D --output_dir X` with no other flag, on a run
folder laid out as `make demo` leaves it (results/runs/<name> in a project with config.yaml,
data/models/tiny-sd3 and data/raw-tiny); the prompts' content as the results' key; one line,
never a traceback, for an output path that is a file and a base model that is not there."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tiny_tables import three_prompt_table

from marble import evaluate

ROOT = Path(__file__).resolve().parents[1]
TOY_PICKSCORE = ["toy_brightness", "toy_saturation", "toy_color_match"]  # config.yaml eval.rewards.pickscore


def strict_json(text: str) -> dict:
    """json.loads accepts NaN and Infinity unless told not to: here they are errors."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def project(tiny_model_dir, tmp_path_factory) -> Path:
    """A project as `make demo` leaves it: its config.yaml, base model and prompts, and a run
    trained there (relative paths, as the workflow trains) for one step."""
    import os

    from marble.data.tiny_prompts import write_tiny_raw
    from marble.train import main as train_main

    root = tmp_path_factory.mktemp("project")
    shutil.copy2(ROOT / "config.yaml", root / "config.yaml")
    shutil.copytree(tiny_model_dir, root / "data/models/tiny-sd3")
    write_tiny_raw(root / "data/raw-tiny")
    three_prompt_table(root / "train.parquet")
    sets = ["model.path=data/models/tiny-sd3", "data.train=train.parquet", "sampling.num_steps=2",
            "sampling.resolution=32", "sampling.images_per_prompt=2", "sampling.batch_size=6",
            "sampling.num_batches_per_epoch=1", "train.batch_size=3", "train.save_every=1"]
    cwd = os.getcwd()
    os.chdir(root)
    try:
        assert train_main(["--preset", "tiny", "--output-dir", "results/runs/marble", "--no-progress",
                           "--max-steps", "1", *[x for s in sets for x in ("--set", s)]]) == 0
    finally:
        os.chdir(cwd)
    return root


def test_one_flag_scores_a_demo_run_with_its_own_base_prompts_and_protocol(project, monkeypatch, capsys):
    monkeypatch.chdir(project)
    argv = ["--checkpoint_path", "results/runs/marble", "--dataset", "pickscore", "--output_dir", "X"]
    assert evaluate.main(argv) == 0
    out, err = capsys.readouterr()
    printed = strict_json(out)
    assert list(printed) == ["num_samples", *TOY_PICKSCORE] and printed["num_samples"] == 12
    info = json.loads((project / "X/run_info.json").read_text())
    flags = info["flags"]
    # The run's base, the project's prompt folder, and the protocol `snakemake` evaluates it with.
    assert flags["model_path"] == "data/models/tiny-sd3" and flags["data_dir"] == "data/raw-tiny"
    assert (flags["num_inference_steps"], flags["resolution"]) == (8, 64) and info["rewards"] == TOY_PICKSCORE
    assert "--model_path data/models/tiny-sd3 (the run's base, results/runs/marble/inputs.json)" in err
    assert "--data_dir data/raw-tiny (config.yaml raw_dir)" in err
    # A checkpoint folder of the run is the same run; a flag still wins over the record.
    ckpt = "results/runs/marble/checkpoints/checkpoint-000001"
    assert evaluate.main(["--checkpoint_path", ckpt, "--dataset", "pickscore", "--output_dir", "Y",
                          "--rewards", "toy_brightness", "--limit", "2"]) == 0
    assert list(strict_json(capsys.readouterr().out)) == ["num_samples", "toy_brightness"]


def test_stdout_is_strict_json_when_a_mean_is_undefined(project, monkeypatch, capsys):
    """Text contrast applies to quoted prompts only: none of pickscore's, so its mean is NaN,
    printed as null (json.dumps wrote NaN, which no JSON parser takes)."""
    monkeypatch.chdir(project)
    argv = ["--checkpoint_path", "results/runs/marble", "--dataset", "pickscore", "--output_dir", "N",
            "--rewards", "toy_text_contrast", "--limit", "1"]
    assert evaluate.main(argv) == 0
    assert strict_json(capsys.readouterr().out) == {"num_samples": 1, "toy_text_contrast": None}


def test_without_the_projects_protocol_the_run_scores_with_its_training_rewards(project, tmp_path,
                                                                                monkeypatch, capsys):
    """A run trained by hand elsewhere: its base and its own rewards (no scorer to download)."""
    run = tmp_path / "mine"
    shutil.copytree(project / "results/runs/marble", run)
    inputs = json.loads((run / "inputs.json").read_text())
    inputs["model.path"]["path"] = str(project / "data/models/tiny-sd3")
    (run / "inputs.json").write_text(json.dumps(inputs))
    monkeypatch.chdir(tmp_path)
    argv = ["--checkpoint_path", str(run), "--dataset", "ocr", "--output_dir", "o", "--limit", "1",
            "--resolution", "32", "--num_inference_steps", "2"]
    assert evaluate.main(argv) == 2  # no prompts here: the refusal names the flag
    assert capsys.readouterr().err.strip().endswith("pass --data_dir")
    assert evaluate.main([*argv, "--data_dir", str(project / "data/raw-tiny")]) == 0
    trained = ["toy_brightness", "toy_saturation", "toy_text_contrast", "toy_color_match"]
    assert set(strict_json(capsys.readouterr().out)) == {"num_samples", *trained}


def test_refusals_name_the_flag(project, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(project)
    base = ["--checkpoint_path", "results/runs/marble", "--dataset", "pickscore"]
    (tmp_path / "a-file").write_text("")
    for out, said in [(tmp_path / "a-file", "is a file, not a folder: pass another --output_dir"),
                      (tmp_path / "a-file" / "sub", "lies under the file")]:
        assert evaluate.main([*base, "--output_dir", str(out)]) == 2
        err = capsys.readouterr().err  # the notes of where each default came from, then the refusal
        assert said in err.strip().splitlines()[-1] and "Traceback" not in err, err
    for model in ["data/models/gone", "gone", str(tmp_path / "a-file")]:
        assert evaluate.main([*base, "--output_dir", str(tmp_path / "o"), "--model_path", model]) == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last.startswith(f"marble evaluate: base model {model} ") and "pass --model_path" in last
        assert "not found" in last or "is a file" in last
    moved = project / "data/models/moved"
    (project / "data/models/tiny-sd3").rename(moved)
    try:
        assert evaluate.main([*base, "--output_dir", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
    finally:
        moved.rename(project / "data/models/tiny-sd3")
    assert "marble evaluate: base model data/models/tiny-sd3 not found: pass --model_path" in err


def test_a_run_trained_by_marble_train_alone_needs_no_workflow_record(project, tmp_path, monkeypatch, capsys):
    """README's `marble train` then `marble evaluate`, in a project where the workflow never ran
    (no results/preflight.config.json), under a run name config.yaml does not list and a run
    folder outside results/runs/: the one command scores it."""
    monkeypatch.chdir(project)
    assert not (project / "results/preflight.config.json").exists()
    for run in ["results/runs/demo", str(tmp_path / "by_hand")]:
        shutil.copytree(project / "results/runs/marble", run)
        out = tmp_path / "out" / Path(run).name
        argv = ["--checkpoint_path", run, "--dataset", "pickscore", "--output_dir", str(out), "--limit", "2"]
        assert evaluate.main(argv) == 0, capsys.readouterr().err
        assert strict_json(capsys.readouterr().out)["num_samples"] == 2

