"""A run folder refuses a resumed config that differs on a key that changes the result."""

from __future__ import annotations

import pytest
import yaml

from marble.config import dump_yaml, load_config
from marble.training.run_dir import RESULT_NEUTRAL_KEYS, TrainError, check_run_dir


def test_neutral_keys_may_change_others_are_named_with_both_values(tmp_path):
    saved = yaml.safe_load(dump_yaml(load_config("tiny")))
    saved["train"]["max_steps"] += 5  # neutral: resuming for longer
    saved["logging"]["backends"] = ["tensorboard"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved), encoding="utf-8")
    check_run_dir(tmp_path, load_config("tiny"))  # no error
    saved["train"]["lr"] = 123.0
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved), encoding="utf-8")
    with pytest.raises(TrainError) as err:
        check_run_dir(tmp_path, load_config("tiny"))
    message = str(err.value)
    assert "train.lr: 123.0 in the run folder" in message and "train.max_steps:" not in message
    # the message names exactly the keys that may change (docs/training.md lists the same set)
    assert all(key in message for key in RESULT_NEUTRAL_KEYS)
    assert "--fresh" in message  # the way to start over, when that is what the user wants


def test_set_aside_renames_a_run_to_a_hidden_timestamped_sibling(tmp_path):
    """`marble train --fresh`: one rename, nothing deleted, nothing to do for no run."""
    from datetime import datetime, timezone

    from marble.training.run_dir import set_aside

    when = datetime(2026, 12, 2, 3, 15, 0, tzinfo=timezone.utc)
    run = tmp_path / "runs" / "marble"
    assert set_aside(run, when) is None  # nothing there
    run.mkdir(parents=True)
    assert set_aside(run, when) is None and run.is_dir()  # an empty folder holds no run
    for n in (1, 2):
        (run / "checkpoints").mkdir(parents=True)
        (run / "metrics.jsonl").write_text(f"run {n}\n")
        aside = set_aside(run, when)
        assert not run.exists() and (aside / "metrics.jsonl").read_text() == f"run {n}\n"
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [
        ".marble.replaced-20261202T031500Z", ".marble.replaced-20261202T031500Z-2"]


def test_the_refusals_of_a_run_folder_name_fresh(tmp_path):
    from marble.training.inputs import INPUTS_FILE, check_inputs, recorded_inputs

    (tmp_path / INPUTS_FILE).write_text('{"data.train": {"path": "t", "fingerprint": "sha256:a"}}')
    with pytest.raises(TrainError, match="--fresh to keep this run aside"):
        check_inputs(tmp_path, {"data.train": {"path": "t", "fingerprint": "sha256:b"}})
    (tmp_path / INPUTS_FILE).write_text("[1, 2]")
    with pytest.raises(TrainError, match="--fresh"):
        recorded_inputs(tmp_path)


def test_a_folder_written_before_a_key_existed_resumes_at_its_default_only():
    """A key added to marble after the run folder was written: its default is the behaviour
    the folder had (the rule for adding keys), so asking for the default resumes; asking for
    anything else is a config change, named."""
    from marble.config import load_config, to_dict
    from marble.training.run_dir import config_differences

    old = to_dict(load_config("tiny"))
    del old["balancer"]["full_solve"]  # as if written before the key existed
    assert config_differences(old, to_dict(load_config("tiny"))) == []
    changed = to_dict(load_config("tiny", overrides=["balancer.full_solve=recompute"]))
    assert config_differences(old, changed) == ["balancer.full_solve"]


def test_run_identity_is_the_result_keys_base_table_and_seed():
    from marble.training.run_dir import run_identity

    inputs = {"model.path": {"path": "m", "fingerprint": "tree:ab"},
              "data.train": {"path": "t", "fingerprint": "sha256:cd"}}
    cfg = load_config("tiny")
    ident = run_identity(cfg, inputs)
    assert ident["base"] == "tree:ab" and ident["train_table"] == "sha256:cd" and ident["seed"] == 42
    # how long / how often, and where the inputs lie: the same run
    moved = {k: {**v, "path": "/elsewhere/" + v["path"]} for k, v in inputs.items()}
    assert run_identity(load_config("tiny", overrides=["train.max_steps=99", "train.save_every=3"]), moved) == ident
    assert run_identity(load_config("tiny", overrides=["train.lr=0.5"]), inputs)["config"] != ident["config"]
    assert run_identity(load_config("tiny_gdpo"), inputs)["config"] != ident["config"]
    assert run_identity(load_config("tiny", overrides=["train.seed=7"]), inputs)["seed"] == 7
    assert run_identity(cfg, {"model.path": {"ref": "random:tiny"}})["base"] == "random:tiny"


def test_a_folder_with_checkpoints_but_no_identity_file_is_refused_with_the_fix(tmp_path):
    import json

    from marble.training.run_dir import IDENTITY_FILES, check_run_dir

    cfg = load_config("tiny")
    ckpt = tmp_path / "checkpoints" / "checkpoint-000010"
    ckpt.mkdir(parents=True)
    (ckpt / "COMPLETE").write_text("{}")
    for present in ([], ["config.yaml"], ["inputs.json"]):
        for name in IDENTITY_FILES:
            (tmp_path / name).unlink(missing_ok=True)
        for name in present:
            (tmp_path / name).write_text(dump_yaml(cfg) if name == "config.yaml" else "{}")
        with pytest.raises(TrainError) as err:
            check_run_dir(tmp_path, cfg)
        message = str(err.value)
        assert "\n" not in message and "--adopt-checkpoint" in message and "--fresh" in message
        assert all(f"no {name}" in message for name in IDENTITY_FILES if name not in present), message
        check_run_dir(tmp_path, cfg, adopt=True)  # the named migration
    (ckpt / "identity.json").write_text(json.dumps({"config": "sha256:aa"}))
    check_run_dir(tmp_path, cfg)  # the checkpoint names its run: resume compares it on load
    (tmp_path / "checkpoints").rename(tmp_path / "elsewhere")
    check_run_dir(tmp_path, cfg)  # no checkpoints: a new run


def test_an_output_dir_that_is_a_file_is_one_line_before_anything_loads(tmp_path, capsys):
    from marble.train import main as train_main
    from marble.training.preflight import preflight

    (tmp_path / "afile").write_text("x")
    for out, needle in ((tmp_path / "afile", "is a file"), (tmp_path / "afile" / "run", "lies under")):
        with pytest.raises(TrainError, match=f"--output-dir {out} {needle}"):
            preflight(load_config("tiny"), out)  # the first check: no table or model read
        with pytest.raises(SystemExit) as exc:
            train_main(["--preset", "tiny", "--output-dir", str(out), "--set", "model.path=random:tiny",
                        "--set", f"data.train={tmp_path / 'afile'}"])
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2 and len(err.splitlines()) == 1 and needle in err, err


def test_preflight_refuses_a_checkpoint_of_another_run_before_writing(tmp_path, monkeypatch):
    import json

    import torch
    from safetensors.torch import save_file

    from marble.data.records import PromptRecord, to_frame
    from marble.training.inputs import current_inputs
    from marble.training.preflight import preflight
    from marble.training.run_dir import run_identity

    monkeypatch.setenv("MARBLE_HASH_CACHE", str(tmp_path / "hashes.json"))
    (tmp_path / "model" / "transformer").mkdir(parents=True)
    (tmp_path / "model" / "model_index.json").write_text("{}")
    save_file({"w": torch.zeros(4)}, str(tmp_path / "model" / "transformer" / "w.safetensors"))
    to_frame([PromptRecord.make("a cat", "pickscore")], {"toy_brightness": [True]}).to_parquet(tmp_path / "t.parquet")
    sets = [f"model.path={tmp_path / 'model'}", f"data.train={tmp_path / 't.parquet'}",
            "rewards=[{name: toy_brightness}]"]
    other = load_config("tiny", overrides=[*sets, "train.lr=0.5"])  # another preset's run, copied in
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "checkpoint-000010"
    ckpt.mkdir(parents=True)
    (ckpt / "COMPLETE").write_text("{}")
    (ckpt / "identity.json").write_text(json.dumps(run_identity(other, current_inputs(other))))
    cfg = load_config("tiny", overrides=sets)
    with pytest.raises(TrainError, match=r"checkpoint-000010 is a checkpoint of another run: config sha256:\w+ "
                                         r"in the checkpoint, sha256:\w+ in this run\. .*--adopt-checkpoint"):
        preflight(cfg, run)
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints"]  # nothing written
    preflight(cfg, run, adopt=True)
    preflight(other, run)  # its own run: resumes
