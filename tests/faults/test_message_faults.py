"""Issue 49 (5): where the outcome was right, the message was not, or a wrong input passed.

A run folder gone read-only mid-run (exit 1 and a traceback of the lock release after the right
line), an input file that is a symbolic link loop ("not found"), a LoRA with keys the base lacks
(a Python warning, then a score of part of it), a key given twice in a YAML file (the last value,
silently), `snakemake eval_only` on a fresh project (a job failing on "--eval-dir ... does not
exist")."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file

from marble import evaluate, train
from marble.config import ConfigError, load_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from faults.test_input_errors import a_table, mount_tmpfs, train_argv  # noqa: E402,F401 (a fixture)
from test_workflow_lib import copy_workflow, snakemake  # noqa: E402


@pytest.mark.fault("run folder read-only mid-run (the lock release after the error)")
def test_a_folder_gone_read_only_mid_run_is_one_line_and_exit_2(mount_tmpfs, tmp_path, monkeypatch, capsys,  # noqa: F811
                                                                  fault_trials):
    disk = mount_tmpfs("size=1m")
    (disk / "run").mkdir()

    def run_training(cfg, out_dir, device=None, progress=True, stop=None, fresh=False, adopt=False):
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)  # under the live run
        raise OSError(errno.EROFS, "Read-only file system", str(Path(out_dir) / "metrics.jsonl"))

    monkeypatch.setattr("marble.training.run.run_training", run_training)
    try:
        train.main(train_argv(disk / "run", a_table(tmp_path)))
        code = 0
    except SystemExit as exc:
        code = exc.code
    except OSError as exc:  # the lock release's own error, raised over the run's
        code = f"{type(exc).__name__} from the lock release"
    err = capsys.readouterr().err
    fault_trials.record(code == 2 and "Traceback" not in err and len(err.strip().splitlines()) <= 2
                        and err.startswith("marble train: error: Read-only file system"),
                        f"exit {code}: {err.strip()[:300]}")
    assert not fault_trials.lost, fault_trials.lost


@pytest.mark.fault("input file that is a symbolic link loop (prompts, training table)")
def test_a_symlink_loop_is_named_as_such(tmp_path, capsys, fault_trials):
    (tmp_path / "raw" / "ocr").mkdir(parents=True)
    loop = tmp_path / "raw" / "ocr" / "test.txt"
    loop.symlink_to(loop)
    code = evaluate.main(["--model_path", "never-loaded", "--dataset", "ocr", "--data_dir", str(tmp_path / "raw"),
                          "--output_dir", str(tmp_path / "out"), "--rewards", "toy_brightness", "--skip_generation"])
    err = capsys.readouterr().err.strip()
    fault_trials.record(code == 2 and "symbolic link loop" in err and str(loop) in err, f"prompts: {err}")
    table = tmp_path / "table.parquet"
    table.symlink_to(table)
    argv = ["--preset", "tiny", "--output-dir", str(tmp_path / "run"), "--set", "model.path=random:tiny",
            "--set", f"data.train={table}"]
    with pytest.raises(SystemExit) as exc:
        train.main(argv)
    err = capsys.readouterr().err.strip()
    fault_trials.record(exc.value.code == 2 and "symbolic link loop" in err, f"training table: {err}")
    assert not fault_trials.lost, fault_trials.lost


@pytest.mark.fault("LoRA with keys for modules the base lacks (evaluated in part)")
def test_a_lora_with_keys_the_base_lacks_is_refused(tiny_model_dir, tmp_path, capsys, monkeypatch, fault_trials):
    from diffusers import SD3Transformer2DModel

    monkeypatch.setenv("MARBLE_HASH_CACHE", str(tmp_path / "hashes.json"))
    transformer = SD3Transformer2DModel.from_pretrained(tiny_model_dir / "transformer")
    name, layer = next((n, m) for n, m in transformer.named_modules()
                       if n.endswith("attn.to_q") and isinstance(m, torch.nn.Linear))
    state = {f"transformer.{name}.lora_A.weight": torch.zeros(4, layer.in_features),
             f"transformer.{name}.lora_B.weight": torch.zeros(layer.out_features, 4),
             # a block this base does not have (a LoRA of a deeper variant of the model)
             "transformer.transformer_blocks.99.attn.to_q.lora_A.weight": torch.zeros(4, layer.in_features),
             "transformer.transformer_blocks.99.attn.to_q.lora_B.weight": torch.zeros(layer.out_features, 4)}
    lora = tmp_path / "lora"
    lora.mkdir()
    save_file(state, str(lora / "pytorch_lora_weights.safetensors"))
    (tmp_path / "raw" / "ocr").mkdir(parents=True)
    (tmp_path / "raw" / "ocr" / "test.txt").write_text('a "sign"\n')
    code = evaluate.main(["--model_path", str(tiny_model_dir), "--checkpoint_path", str(lora), "--dataset", "ocr",
                          "--data_dir", str(tmp_path / "raw"), "--output_dir", str(tmp_path / "out"),
                          "--rewards", "toy_brightness", "--num_inference_steps", "2", "--resolution", "32",
                          "--limit", "1", "--allow_other_base"])
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("marble ")]
    fault_trials.record(code == 2 and len(lines) == 1
                        and "2 of its 4 keys name modules the base model lacks" in lines[0]
                        and not (tmp_path / "out" / "average_scores.json").exists(), f"exit {code}: {lines}")
    assert not fault_trials.lost, fault_trials.lost


@pytest.mark.fault("YAML key given twice (a config, a site file for Snakemake)")
def test_a_key_given_twice_in_yaml_is_refused(tmp_path, fault_trials):
    config = tmp_path / "run.yaml"
    config.write_text("train:\n  lr: 0.001\n  batch_size: 4\n  lr: 0.1\n")
    try:
        load_config("tiny", files=[config])
        said = "loaded"
    except ConfigError as exc:
        said = str(exc)
    fault_trials.record("run.yaml: invalid YAML: line 4: duplicate key 'lr' (first at line 2)" in said, said)
    work = copy_workflow(tmp_path / "repo")
    site = yaml.safe_load((work / "config.yaml").read_text())
    text = yaml.safe_dump(site) + "mode: tiny\n"  # `mode` twice at the top level
    (work / "site.yaml").write_text(text)
    proc = snakemake(["-n", "-c1", "all", "--configfile", "site.yaml"], work, check=False)
    fault_trials.record(proc.returncode != 0 and "duplicate key 'mode'" in proc.stdout + proc.stderr
                        and "site.yaml" in proc.stdout + proc.stderr,
                        f"snakemake --configfile: exit {proc.returncode}, {(proc.stdout + proc.stderr).strip()[-300:]}")
    assert not fault_trials.lost, fault_trials.lost


@pytest.mark.fault("snakemake eval_only on a fresh project (nothing trained or named)")
def test_eval_only_with_nothing_to_evaluate_says_so(tmp_path, fault_trials):
    work = copy_workflow(tmp_path / "repo")
    proc = snakemake(["-c1", "eval_only"], work, check=False)  # a real run: it stops at once
    fault_trials.record(proc.returncode != 0 and "nothing to evaluate yet" in proc.stdout + proc.stderr
                        and "eval.checkpoints" in proc.stdout + proc.stderr,
                        f"exit {proc.returncode}: {(proc.stdout + proc.stderr).strip()[-300:]}")
    assert not fault_trials.lost, fault_trials.lost
