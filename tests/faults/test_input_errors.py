"""Every bad input is one line naming the key, file or line: config ranges, string keys,
resolved paths, max_steps below the last checkpoint, a full disk and a read-only run folder
(real tmpfs mounts, when root), evaluation prompt files as strict as assembly, bad images."""

from __future__ import annotations

import errno
import json
import os
import subprocess

import pytest
import torch

from marble import evaluate, train
from marble.config import ConfigError, dump_yaml, load_config
from marble.runtime.oserrors import describe_write_failure, print_write_failure


@pytest.mark.parametrize("override,key", [
    ("train.batch_size=0", "train.batch_size"), ("sampling.num_steps=-3", "sampling.num_steps"),
    ("sampling.resolution=0", "sampling.resolution"), ("train.lr=nan", "train.lr"),
    ("train.max_steps=-5", "train.max_steps"), ("sampling.batch_size=0", "sampling.batch_size"),
    ("train.adam_betas=[0.9, .inf]", "train.adam_betas[1]"), ("train.ema_decay=2", "train.ema_decay"),
    ("train.keep_checkpoints=-1", "train.keep_checkpoints"),
])
def test_out_of_range_values_name_their_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config("tiny", overrides=[override])
    assert f"`{key}`" in str(err.value) and "\n" not in str(err.value)


def test_keep_checkpoints_zero_keeps_every_checkpoint_and_is_accepted():
    """0 is a documented value (keep all: prune_checkpoints does nothing), not out of range."""
    assert load_config("tiny", overrides=["train.keep_checkpoints=0"]).train.keep_checkpoints == 0


def test_marble_train_reports_a_bad_value_in_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        train.main(["--preset", "tiny", "--output-dir", "unused", "--set", "train.batch_size=0"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "`train.batch_size` = 0 must be > 0" in err and len(err.splitlines()) == 1


def test_string_keys_stay_strings():
    assert load_config("tiny", overrides=["model.revision=0123456"]).model.revision == "0123456"
    assert load_config("tiny", overrides=["model.revision='1e3'"]).model.revision == "1e3"
    assert load_config("tiny", overrides=["model.revision=null"]).model.revision is None


def run_folder(path, cfg):
    """A run folder's identity files as the trainer writes them (inputs.json: none of the
    tiny preset's inputs exist here, so an empty record; check_run_dir reads only its keys)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(dump_yaml(cfg))
    (path / "inputs.json").write_text("{}")
    return path


def test_a_path_spelled_relative_or_absolute_is_the_same_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    saved = load_config("tiny", overrides=["data.train=data/train.parquet"])
    run = run_folder(tmp_path / "run", saved)
    train.check_run_dir(run, load_config("tiny", overrides=[f"data.train={tmp_path}/data/train.parquet"]))
    with pytest.raises(train.TrainError, match="data.train"):
        train.check_run_dir(run, load_config("tiny", overrides=["data.train=data/other.parquet"]))


def test_max_steps_below_the_last_checkpoint_is_an_error(tmp_path):
    from marble.training.checkpoint import checkpoint_dir, save_checkpoint

    cfg = load_config("tiny", overrides=["train.max_steps=10"])
    run = run_folder(tmp_path / "run", cfg)
    save_checkpoint(checkpoint_dir(run, 10), {"step": 10}, keep=None)
    train.check_run_dir(run, cfg)  # equal: done, legitimately
    with pytest.raises(train.TrainError, match=r"last checkpoint is step 10, past `train.max_steps` = 5"):
        train.check_run_dir(run, load_config("tiny", overrides=["train.max_steps=5"]))


@pytest.fixture
def mount_tmpfs(tmp_path):
    """mount(options) -> a fresh tmpfs folder (root only; skipped where mounting is refused)."""
    mounted = []

    def mount(options: str):
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
                                               capture_output=True).returncode:
            pytest.skip("needs root and tmpfs mounts")
        mounted.append(point)
        return point

    yield mount
    for point in reversed(mounted):
        subprocess.run(["umount", "-l", str(point)], check=False)


def test_a_full_disk_during_torch_save_says_no_space_and_names_the_folder(mount_tmpfs):
    disk = mount_tmpfs("size=256k")
    with pytest.raises(RuntimeError) as err:  # torch's own message names neither
        torch.save({"w": torch.zeros(1 << 18)}, disk / "state.pt")
    assert "No space left" not in str(err.value)
    assert describe_write_failure(err.value, disk) == f"No space left on device: {disk}"


def a_table(folder):
    """A valid one-prompt table: `marble train` reads its inputs before writing (preflight)."""
    from marble.data.records import PromptRecord, to_frame

    path = folder / "train.parquet"
    to_frame([PromptRecord.make("a cat", "pickscore")], {}).to_parquet(path)
    return path


def train_argv(out, table):
    return ["--preset", "tiny", "--output-dir", str(out), "--set", "model.path=random:tiny",
            "--set", f"data.train={table}"]


def test_disk_full_during_a_checkpoint_is_one_line_from_marble_train(mount_tmpfs, tmp_path, monkeypatch, capsys):
    from marble.training import checkpoint

    disk = mount_tmpfs("size=256k")
    table = a_table(tmp_path)

    def run_training(cfg, out_dir, device=None, progress=True, stop=None, fresh=False,
                     adopt=False):  # the real signature
        checkpoint.save_checkpoint(checkpoint.checkpoint_dir(out_dir, 1), {"w": torch.zeros(1 << 18)}, keep=None)

    monkeypatch.setattr("marble.training.run.run_training", run_training)
    with pytest.raises(SystemExit) as exc:
        train.main(train_argv(disk / "run", table))
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err == f"marble train: error: No space left on device: {disk / 'run'}"


def test_a_read_only_run_folder_is_one_line(mount_tmpfs, tmp_path, capsys):
    disk = mount_tmpfs("size=1m")
    (disk / "run").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    table = a_table(tmp_path)
    with pytest.raises(SystemExit) as exc:
        train.main(train_argv(disk / "run", table))
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1
    # The first write is the run's lock (beside the run when no project holds it).
    assert err.startswith("marble train: error: Read-only file system: ") and str(disk) in err


def eval_argv(raw, out, dataset, *extra):
    return ["--model_path", "never-loaded", "--dataset", dataset, "--data_dir", str(raw), "--output_dir",
            str(out), "--rewards", "toy_brightness", "--skip_generation", *extra]


@pytest.mark.parametrize("dataset,content,where", [
    ("drawbench", b"a cat\n\na dog\n", "drawbench/test.txt:2: empty prompt"),
    ("ocr", b'a "sign"\nb\xffad\n', "ocr/test.txt:2: invalid UTF-8"),
    ("geneval", (json.dumps({"prompt": "a cat", "tag": "single_object", "include": [{"class": "cat", "count": 1}]})
                 + "\n" + json.dumps({"prompt": "two dogs", "tag": "counting"}) + "\n").encode(),
     "test_metadata.jsonl:2: missing or empty `include`"),
])
def test_evaluation_prompt_files_are_as_strict_as_assembly(tmp_path, capsys, dataset, content, where):
    name = "test_metadata.jsonl" if dataset == "geneval" else "test.txt"
    (tmp_path / dataset).mkdir()
    (tmp_path / dataset / name).write_bytes(content)
    assert evaluate.main(eval_argv(tmp_path, tmp_path / "out", dataset)) == 2
    err = capsys.readouterr().err.strip()
    assert where in err and str(tmp_path) in err and len(err.splitlines()) == 1


def test_a_corrupt_saved_image_names_its_file(tmp_path, capsys):
    (tmp_path / "ocr").mkdir()
    (tmp_path / "ocr" / "test.txt").write_text("a cat\n")
    (tmp_path / "out" / "images").mkdir(parents=True)
    (tmp_path / "out" / "images" / "00000.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    assert evaluate.main(eval_argv(tmp_path, tmp_path / "out", "ocr")) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "marble evaluate" in line]
    assert len(lines) == 1 and "00000.jpg of sample 0 cannot be decoded" in lines[0]


@pytest.mark.parametrize("flag,value", [("--resolution", "0"), ("--num_inference_steps", "-3"),
                                        ("--guidance_scale", "nan")])
def test_evaluate_flags_out_of_range_name_the_flag(tmp_path, capsys, flag, value):
    with pytest.raises(SystemExit) as exc:
        evaluate.main(eval_argv(tmp_path, tmp_path / "out", "ocr", flag, value))
    assert exc.value.code == 2 and f"{flag} must be" in capsys.readouterr().err


def test_a_full_disk_during_evaluation_is_one_line_naming_the_file(mount_tmpfs, tmp_path, capsys):
    import numpy as np
    from PIL import Image

    disk = mount_tmpfs("size=64k")
    (tmp_path / "ocr").mkdir()
    (tmp_path / "ocr" / "test.txt").write_text("a cat\n")
    (disk / "out" / "images").mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(disk / "out" / "images" / "00000.jpg")
    with open(disk / "filler", "wb", buffering=0) as fh:  # fill the disk to the last block
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError:
            pass
    assert evaluate.main(eval_argv(tmp_path, disk / "out", "ocr")) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "marble evaluate" in line]
    assert len(lines) == 1 and lines[0].startswith("marble evaluate: No space left on device: ")
    assert str(disk / "out") in lines[0]


def test_a_string_key_yaml_read_as_a_number_says_quote_it(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  revision: 0123456\n")
    with pytest.raises(ConfigError, match=r"`model.revision` must be a string, but YAML read a number \(42798\)"):
        load_config("tiny", files=[path])


def test_a_full_disk_under_safetensors_says_no_space_and_names_the_folder(mount_tmpfs):
    from safetensors.torch import save_file

    disk = mount_tmpfs("size=64k")
    with pytest.raises(Exception) as err:  # a plain Exception naming no file
        save_file({"w": torch.zeros(1 << 18)}, str(disk / "adapters.safetensors"))
    assert describe_write_failure(err.value, disk) == f"No space left on device: {disk}"
    assert describe_write_failure(KeyError("x"), disk) is None


def test_print_write_failure_prints_one_line_returns_the_status_and_reraises_the_rest(tmp_path, capsys):
    """The six commands' shared block: one `<prog>: error: <reason>: <path>` line and their exit status."""
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "report.md"))
    assert print_write_failure("marble report", full, tmp_path, suffix="; nothing was written") == 2
    assert capsys.readouterr().err == \
        f"marble report: error: No space left on device: {tmp_path / 'report.md'}; nothing was written\n"
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    with pytest.raises(NotADirectoryError) as err:  # a real write through a path that is a file
        (afile / "out.csv").write_text("x")
    assert print_write_failure("marble data tiny", err.value, afile, status=1) == 1
    assert capsys.readouterr().err == ("marble data tiny: error: Not a directory (a file stands where a folder "
                                       f"must be): {afile / 'out.csv'}\n")
    exists = FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(afile))  # not a write failure
    with pytest.raises(FileExistsError) as raised:
        print_write_failure("marble tables cost", exists, afile)
    assert raised.value is exists and capsys.readouterr().err == ""
