"""Identity by content on the tiny SD3, in one process (issue 32): a run whose reward is NaN
throughout fails; its base model replaced under the same path refuses the resume; its LoRA
evaluated on another base is refused, on its own base at another path it evaluates; a LoRA
that matches nothing or has another base's shapes is one line, never the base model."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from marble import evaluate
from marble.data.records import PromptRecord, to_frame
from marble.rewards.toy import ToyBrightness
from marble.train import main as train_main

LORA_FILE = "pytorch_lora_weights.safetensors"


def train_argv(model, table, out):
    sets = [f"model.path={model}", f"data.train={table}", "sampling.num_steps=2",
            "sampling.resolution=32", "sampling.images_per_prompt=2", "sampling.batch_size=6",
            "sampling.num_batches_per_epoch=1", "train.batch_size=6", "train.save_every=1",
            "rewards=[{name: toy_brightness}, {name: toy_saturation}]"]
    return ["--preset", "tiny", "--output-dir", str(out), "--no-progress", "--max-steps", "1",
            *[x for s in sets for x in ("--set", s)]]


def eval_argv(model, checkpoint, raw, out):
    return ["--model_path", str(model), "--checkpoint_path", str(checkpoint), "--dataset", "ocr",
            "--data_dir", str(raw), "--output_dir", str(out), "--rewards", "toy_brightness",
            "--num_inference_steps", "2", "--resolution", "32", "--limit", "1"]


def one_line(capsys) -> str:
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("marble ")]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.fault("reward NaN throughout; base replaced; LoRA of another base or matching nothing")
def test_content_identity_end_to_end(tiny_model_dir, tmp_path, capsys, monkeypatch, fault_trials):
    monkeypatch.setenv("MARBLE_HASH_CACHE", str(tmp_path / "hashes.json"))
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    rows = [PromptRecord.make("a castle at dawn", "pickscore"), PromptRecord.make('a "sign"', "ocr"),
            PromptRecord.make("a photo of a dog", "geneval",
                              {"tag": "single_object", "include": [{"class": "dog", "count": 1}]})]
    table = tmp_path / "train.parquet"
    to_frame(rows, {"toy_brightness": [True] * 3, "toy_saturation": [True] * 3}).to_parquet(table)
    run = tmp_path / "run"

    # 1. A reward NaN on every step: exit 2, one line, no train_summary.json for the workflow.
    with monkeypatch.context() as patch:
        patch.setattr(ToyBrightness, "score", lambda self, images, prompts, metadata:
                      torch.full((len(images),), float("nan")))
        with pytest.raises(SystemExit) as exc:
            train_main(train_argv(model, table, run))
    line = one_line(capsys)
    fault_trials.record(exc.value.code == 2 and "reward 'toy_brightness' was NaN on every logged step" in line
                        and not (run / "train_summary.json").exists(), "reward NaN throughout")

    # 2. The base model replaced under the same path: the resume is refused, naming it.
    weights = next((model / "transformer").glob("*.safetensors"))
    tensors = load_file(str(weights))
    tensors = {k: (v + 1 if i == 0 else v) for i, (k, v) in enumerate(sorted(tensors.items()))}
    save_file(tensors, str(weights))
    with pytest.raises(SystemExit):
        train_main(train_argv(model, table, run))
    fault_trials.record("model.path" in one_line(capsys), "base model replaced, resume")

    # 3. Its LoRA on the replaced base: refused before anything loads or is written.
    raw = tmp_path / "raw"
    (raw / "ocr").mkdir(parents=True)
    (raw / "ocr" / "test.txt").write_text('a "sign"\n')
    assert evaluate.main(eval_argv(model, run, raw, tmp_path / "e1")) == 2
    fault_trials.record("trained on base" in one_line(capsys) and not (tmp_path / "e1").exists(),
                        "LoRA evaluated on another base")
    # Copied out of its run, the checkpoint folder (its identity.json) and its lora/ alone (the
    # weights' metadata) still name their base: refused on the replaced one, in one line.
    ckpt = sorted((run / "checkpoints").glob("checkpoint-*"))[-1]
    shutil.copytree(ckpt, tmp_path / "out" / "ckpt")
    shutil.copytree(ckpt / "lora", tmp_path / "out" / "lora")
    for name, where in (("ckpt", "identity.json"), ("lora", "its weights' metadata")):
        assert evaluate.main(eval_argv(model, tmp_path / "out" / name, raw, tmp_path / f"e-{name}")) == 2
        line = one_line(capsys)
        fault_trials.record("trained on base" in line and where in line and "--allow_other_base" in line
                            and not (tmp_path / f"e-{name}").exists(), f"{name} copied out of its run, other base")
    # The named override: evaluated on this base on purpose.
    assert evaluate.main(eval_argv(model, tmp_path / "out" / "lora", raw, tmp_path / "e-any")
                         + ["--allow_other_base"]) == 0
    capsys.readouterr()
    # On its own base at another path (a moved model folder): evaluates; the rerun is done.
    assert evaluate.main(eval_argv(tiny_model_dir, run, raw, tmp_path / "e2")) == 0
    info = json.loads((tmp_path / "e2" / "run_info.json").read_text())
    assert info["identity"]["checkpoint"]["fingerprint"].startswith("tree:")
    capsys.readouterr()

    # 4. A LoRA matching no layer, and one of another base's shapes: one line, exit 2.
    lora = next((run / "checkpoints").glob("checkpoint-*")) / "lora" / LORA_FILE
    good = load_file(str(lora))
    for name, state, needle in [
        ("nothing", {k.replace("transformer_blocks", "unet_blocks"): v for k, v in good.items()},
         "matches a layer of the base model"),
        ("shape", {k: (torch.zeros(v.shape[0], v.shape[1] + 1) if "lora_A" in k else v) for k, v in good.items()},
         "belongs to another base model"),
    ]:
        folder = tmp_path / f"lora-{name}"
        folder.mkdir()
        save_file(state, str(folder / LORA_FILE))
        assert evaluate.main(eval_argv(tiny_model_dir, folder, raw, tmp_path / f"e-{name}")) == 2
        fault_trials.record(needle in one_line(capsys), f"LoRA matching {name}")
    assert not fault_trials.lost, fault_trials.lost
