"""`marble evaluate` end to end on the tiny SD3 model (in-process, plus one torchrun run)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from marble import evaluate
from marble.evaluation import runner

TOY = "toy_brightness,toy_saturation,toy_color_match,toy_text_contrast"
GENEVAL = [
    {"tag": "color_attr", "include": [{"class": "cat", "count": 1, "color": "red"}], "prompt": "a red cat"},
    {"tag": "counting", "include": [{"class": "dog", "count": 2}], "prompt": "a photo of two dogs"},
    {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "blue"}], "prompt": "a blue car"},
    {"tag": "single_object", "include": [{"class": "bird", "count": 1}], "prompt": "a bird"},
    {"tag": "two_object", "include": [{"class": "cup", "count": 1}, {"class": "pen", "count": 1}],
     "prompt": "a cup and a pen"},
    {"tag": "position", "include": [{"class": "cat", "count": 1}, {"class": "box", "count": 1,
     "position": ["left of", 0]}], "prompt": "a cat left of a box"},
]
TEXT = ['a sign that says "hello"', "a mountain at dawn", 'a mug printed "marble"', "a quiet harbour",
        'neon "open" sign', "a bowl of fruit", "a red bicycle", "a foggy forest"]


@pytest.fixture(scope="module")
def raw_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("raw")
    (root / "geneval").mkdir()
    (root / "geneval" / "test_metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GENEVAL))
    for name in ("ocr", "pickscore"):
        (root / name).mkdir()
        (root / name / "test.txt").write_text("\n".join(TEXT) + "\n")
    (root / "drawbench").mkdir()  # DrawBench repeats each prompt; repeats must differ
    (root / "drawbench" / "test.txt").write_text("\n".join(TEXT[:2] * 2) + "\n")
    return root


def run_eval(model, raw, out, dataset, *extra) -> dict:
    argv = ["--model_path", str(model), "--dataset", dataset, "--data_dir", str(raw),
            "--output_dir", str(out), "--resolution", "64", "--num_inference_steps", "3",
            "--batch_size", "2", "--rewards", TOY, *map(str, extra)]
    assert evaluate.main(argv) == 0
    return json.loads((Path(out) / "average_scores.json").read_text())


# Two runs score the same 8-bit images; the scorers run in a thread pool, where a kernel's
# thread team (so its summation order) may differ between runs. Scores then agree to
# float32 rounding, not bit for bit: compared at a stated relative tolerance of 1e-6.
SCORE_RTOL = 1e-6


def same_scores(a, b) -> bool:
    """Nested dicts/lists equal, floats within SCORE_RTOL (NaN equals NaN)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_scores(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_scores(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=SCORE_RTOL, abs_tol=1e-12)
    return a == b


def test_same_scores_tolerance():
    assert same_scores({"x": [0.03147393278777599]}, {"x": [0.03147393371909857]})
    assert not same_scores({"x": [0.0314]}, {"x": [0.0315]})
    assert not same_scores({"x": 1.0}, {"y": 1.0}) and same_scores(math.nan, math.nan)


def rows(out) -> list[dict]:
    return [json.loads(line) for line in (Path(out) / "evaluation_results.jsonl").read_text().splitlines()]


def pixels(out) -> dict[str, np.ndarray]:
    return {p.name: np.asarray(Image.open(p)) for p in sorted((Path(out) / "images").iterdir())}


@pytest.fixture
def count_generated(monkeypatch) -> list[int]:
    counts: list[int] = []
    real = runner.generate_images

    def counting(pipe, samples, args):
        counts.append(len(samples))
        return real(pipe, samples, args)

    monkeypatch.setattr(runner, "generate_images", counting)
    return counts


@pytest.mark.parametrize("dataset", ["geneval", "ocr", "pickscore", "drawbench"])
def test_each_dataset_writes_results(tiny_model_dir, raw_dir, tmp_path, dataset):
    out = tmp_path / dataset
    avg = run_eval(tiny_model_dir, raw_dir, out, dataset, "--limit", 4, "--save_images")
    got = rows(out)
    assert [r["sample_id"] for r in got] == [0, 1, 2, 3] and avg["num_samples"] == 4
    assert all(r["metadata"]["source"] == dataset for r in got)
    for r in got:
        assert Path(r["image_path"]).is_file()
        for name, value in r["scores"].items():
            # finite exactly where the reward applies; null (NaN) where it does not
            assert (value is None) == (name in r["not_applicable"]), (name, r)
    assert all(math.isfinite(r["scores"]["toy_brightness"]) for r in got)
    applies_color = [r["scores"]["toy_color_match"] is not None for r in got]
    assert applies_color == ([True, False, True, False] if dataset == "geneval" else [False] * 4)
    assert avg["n_toy_brightness"] == 4 and avg["na_toy_color_match"] == 4 - sum(applies_color)
    info = json.loads((out / "run_info.json").read_text())
    assert info["identity"]["num_inference_steps"] == 3 and info["timing"]["generated"] == 4
    provenance = json.loads((out / "provenance.json").read_text())  # marble.runtime.provenance
    assert provenance["config"]["flags"]["num_inference_steps"] == 3
    assert set(provenance["versions"]) == {"marble", "torch", "diffusers", "transformers", "peft"}
    # The reference's layout by default: images/<id:05d>.jpg and image_prompts.json.
    images = pixels(out)
    assert list(images) == [f"{i:05d}.jpg" for i in range(4)]
    mapping = json.loads((out / "image_prompts.json").read_text())
    assert list(mapping) == list(images)
    assert [m["prompt"] for m in mapping.values()] == [r["prompt"] for r in got]
    assert [m["scores"] for m in mapping.values()] == [r["scores"] for r in got]
    if dataset == "drawbench":  # samples 0 and 2 share a prompt but not their noise
        assert not np.array_equal(images["00000.jpg"], images["00002.jpg"])


def test_generation_decodes_with_the_training_decode_then_quantises(tiny_model_dir, monkeypatch):
    from argparse import Namespace

    from marble.evaluation.prompts import EvalSample
    from marble.models import encode

    assert runner.decode_latents is encode.decode_latents  # training's decode, not a copy
    calls, real = [], encode.decode_latents
    monkeypatch.setattr(runner, "decode_latents",
                        lambda pipe, latents: calls.append(latents.shape) or real(pipe, latents))
    pipe = runner.load_eval_pipeline(str(tiny_model_dir), "no", "cpu", None)
    args = Namespace(seed=0, num_inference_steps=2, guidance_scale=1.0, resolution=64)
    images = runner.generate_images(pipe, [EvalSample(0, "p0", "a cat"), EvalSample(1, "p1", "a dog")], args)
    assert len(calls) == 1 and calls[0][0] == 2  # one decode, training's
    assert images.shape == (2, 3, 64, 64) and torch.equal(images, torch.round(images * 255) / 255)


def test_identical_runs_and_skip_generation_rescore(tiny_model_dir, raw_dir, tmp_path):
    # PNG: lossless, so rescoring the files gives the in-memory scores (JPEG would not).
    png = ("--image_format", "png")
    a = run_eval(tiny_model_dir, raw_dir, tmp_path / "a", "ocr", "--limit", 3, "--save_images", *png)
    b = run_eval(tiny_model_dir, raw_dir, tmp_path / "b", "ocr", "--limit", 3, "--save_images", *png)
    assert same_scores(a, b)
    assert same_scores([r["scores"] for r in rows(tmp_path / "a")], [r["scores"] for r in rows(tmp_path / "b")])
    pa, pb = pixels(tmp_path / "a"), pixels(tmp_path / "b")
    assert list(pa) == ["00000.png", "00001.png", "00002.png"]
    assert all(np.array_equal(pa[k], pb[k]) for k in pa)
    # Score-only from the saved images reproduces the direct scores exactly (8-bit quantised).
    gen_only = tmp_path / "c"
    run_eval(tiny_model_dir, raw_dir, gen_only, "ocr", "--limit", 3, "--no_score", *png)
    assert all(r["scores"] == {} for r in rows(gen_only))
    c = run_eval(tiny_model_dir, raw_dir, gen_only, "ocr", "--limit", 3, "--skip_generation", *png)
    assert same_scores(c, a)


def test_rescore_a_reference_jpg_folder(raw_dir, tmp_path, capsys):
    """A folder as the reference writes it (images/<id:05d>.jpg, PIL's default JPEG save of
    truncated uint8) rescored with --skip_generation: no model is loaded; the scores are the
    rewards' on exactly those decoded JPEGs."""
    from marble import rewards

    out = tmp_path / "reference"
    (out / "images").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(3):
        array = (rng.random((64, 64, 3)) * 255).astype(np.uint8)  # the reference truncates
        Image.fromarray(array).save(out / "images" / f"{i:05d}.jpg")
    argv = ["--model_path", "never-loaded", "--dataset", "ocr", "--data_dir", str(raw_dir), "--output_dir",
            str(out), "--limit", "3", "--batch_size", "2", "--rewards", TOY, "--skip_generation"]
    assert evaluate.main(argv) == 0
    decoded = torch.stack([torch.from_numpy(np.asarray(Image.open(out / "images" / f"{i:05d}.jpg"),
                                                       dtype=np.float32) / 255).permute(2, 0, 1) for i in range(3)])
    for name in TOY.split(","):
        direct = rewards.build(name)(decoded, TEXT[:3], [{"source": "ocr"}] * 3)
        got = [r["scores"][name] for r in rows(out)]
        assert same_scores(got, [None if math.isnan(v) else float(v) for v in direct.tolist()]), name
    assert [r["image_path"] for r in rows(out)] == [str(out / "images" / f"{i:05d}.jpg") for i in range(3)]
    assert list(json.loads((out / "image_prompts.json").read_text())) == [f"{i:05d}.jpg" for i in range(3)]
    argv[argv.index("--limit") + 1] = "4"  # a sample without its image: a clear error
    assert evaluate.main(argv) == 2
    assert re.search(r"00003\.jpg of sample 3 is missing", capsys.readouterr().err)


def test_interrupted_run_resumes(tiny_model_dir, raw_dir, tmp_path, count_generated):
    out = tmp_path / "resume"
    run_eval(tiny_model_dir, raw_dir, out, "pickscore", "--limit", 4)
    assert sum(count_generated) == 4
    full = run_eval(tiny_model_dir, raw_dir, out, "pickscore", "--limit", 8)
    assert sum(count_generated) == 8  # only the 4 new samples were generated
    assert [r["sample_id"] for r in rows(out)] == list(range(8)) and full["num_samples"] == 8
    run_eval(tiny_model_dir, raw_dir, out, "pickscore", "--limit", 8)
    assert sum(count_generated) == 8  # nothing left to do
    ref = run_eval(tiny_model_dir, raw_dir, tmp_path / "fresh", "pickscore", "--limit", 8)
    assert same_scores(ref, full)  # resumed == uninterrupted


def test_an_edited_prompt_is_regenerated_and_scored(tiny_model_dir, raw_dir, tmp_path, count_generated, capsys):
    """Rows are keyed by sample_id, a position in the prompt file: a prompt rewritten in place
    (or another --data_dir) kept the old row, and the rerun reported the old prompt's scores
    with nothing generated. Now the row must have been made for the prompt's content."""
    from marble.evaluation.results import read_results

    raw = tmp_path / "raw"
    shutil.copytree(raw_dir, raw)
    out = tmp_path / "edit"
    first = run_eval(tiny_model_dir, raw, out, "ocr", "--limit", 3)
    info = json.loads((out / "run_info.json").read_text())
    lines = (raw / "ocr" / "test.txt").read_text().splitlines()
    lines[1] = 'a neon sign that says "new"'  # quoted: text contrast now applies to it
    (raw / "ocr" / "test.txt").write_text("\n".join(lines) + "\n")
    edited = run_eval(tiny_model_dir, raw, out, "ocr", "--limit", 3)
    assert count_generated == [2, 1, 1]  # the first run's two batches, then the edited prompt alone
    assert read_results(out / "evaluation_results.jsonl")[1]["prompt"] == 'a neon sign that says "new"'
    fresh = run_eval(tiny_model_dir, raw, tmp_path / "fresh", "ocr", "--limit", 3)
    # The summary is the new prompts', as a first run gives it (the edited prompt was generated in
    # a batch of its own: a pixel may move by a level, runner's docstring), text contrast included.
    assert first["n_toy_text_contrast"] == 2 and edited["n_toy_text_contrast"] == fresh["n_toy_text_contrast"] == 3
    assert all(edited[k] == pytest.approx(fresh[k], abs=2e-3) for k in TOY.split(",")), (edited, fresh)
    assert json.loads((out / "run_info.json").read_text())["prompts"]["digest"] != info["prompts"]["digest"]
    # Saved images of the old prompt are never rescored as the new one's.
    lines[0] = "a lighthouse at night"
    (raw / "ocr" / "test.txt").write_text("\n".join(lines) + "\n")
    argv = ["--model_path", str(tiny_model_dir), "--dataset", "ocr", "--data_dir", str(raw), "--output_dir",
            str(out), "--resolution", "64", "--num_inference_steps", "3", "--batch_size", "2",
            "--rewards", TOY, "--limit", "3", "--skip_generation"]
    capsys.readouterr()
    assert evaluate.main(argv) == 2
    assert "rerun without --skip_generation" in capsys.readouterr().err


def test_changed_flags_refuse_to_mix(tiny_model_dir, raw_dir, tmp_path, capsys):
    out = tmp_path / "mix"
    run_eval(tiny_model_dir, raw_dir, out, "ocr", "--limit", 1)
    argv = ["--model_path", str(tiny_model_dir), "--dataset", "ocr", "--data_dir", str(raw_dir),
            "--output_dir", str(out), "--resolution", "64", "--num_inference_steps", "5", "--rewards", TOY]
    assert evaluate.main(argv) == 2
    assert "num_inference_steps: 3 -> 5" in capsys.readouterr().err


def _lora_transformer(model_dir):
    from marble.models import load_pipeline
    from marble.models.lora import add_lora_adapters

    pipe = load_pipeline(str(model_dir))
    add_lora_adapters(pipe.transformer, rank=4, alpha=4, targets=["to_q", "to_k", "to_v", "to_out.0"], seed=0)
    with torch.no_grad():  # B = 0 at init would make the LoRA a no-op
        torch.manual_seed(1)
        for name, param in pipe.transformer.named_parameters():
            if "lora_B.default" in name:
                param.normal_(0, 0.5)
    return pipe.transformer


def test_lora_folders_load(tiny_model_dir, raw_dir, tmp_path, capsys):
    from marble.models.lora import TRAINABLE, adapter_state, save_lora_diffusers
    from marble.training.checkpoint import checkpoint_dir, save_checkpoint

    transformer = _lora_transformer(tiny_model_dir)
    run_dir = tmp_path / "run"
    save_checkpoint(checkpoint_dir(run_dir, 3), {"step": 3},
                    write_lora=lambda folder: save_lora_diffusers(transformer, folder))
    peft_dir = tmp_path / "peft"
    peft_dir.mkdir()
    from safetensors.torch import save_file

    from marble.models.lora import lora_config_dict

    state = {f"base_model.model.{k}": v.contiguous() for k, v in adapter_state(transformer, TRAINABLE).items()}
    save_file(state, str(peft_dir / "adapter_model.safetensors"))
    (peft_dir / "adapter_config.json").write_text(json.dumps(lora_config_dict(transformer)))

    base = run_eval(tiny_model_dir, raw_dir, tmp_path / "base", "ocr", "--limit", 2)
    by_run = run_eval(tiny_model_dir, raw_dir, tmp_path / "r", "ocr", "--limit", 2, "--checkpoint_path", run_dir)
    by_ckpt = run_eval(tiny_model_dir, raw_dir, tmp_path / "c", "ocr", "--limit", 2,
                       "--checkpoint_path", checkpoint_dir(run_dir, 3))
    by_peft = run_eval(tiny_model_dir, raw_dir, tmp_path / "p", "ocr", "--limit", 2, "--lora_hf_path", peft_dir)
    assert by_run == by_ckpt and by_run["toy_brightness"] != base["toy_brightness"]
    assert by_peft["toy_brightness"] == pytest.approx(by_run["toy_brightness"], abs=1e-6)
    info = json.loads((tmp_path / "r" / "run_info.json").read_text())
    assert info["identity"]["checkpoint"]["path"].endswith("checkpoint-000003")
    (tmp_path / "junk").mkdir()
    argv = ["--model_path", str(tiny_model_dir), "--dataset", "ocr", "--data_dir", str(raw_dir),
            "--checkpoint_path", str(tmp_path / "junk"), "--output_dir", str(tmp_path / "j")]
    assert evaluate.main(argv) == 2
    assert "neither a marble checkpoint" in capsys.readouterr().err


def _peft_folder(transformer, folder: Path, weights: str) -> Path:
    """A peft adapter folder as peft's save_pretrained writes it (safetensors or .bin)."""
    from safetensors.torch import save_file

    from marble.models.lora import TRAINABLE, adapter_state, lora_config_dict

    folder.mkdir(parents=True)
    state = {f"base_model.model.{k}": v.contiguous() for k, v in adapter_state(transformer, TRAINABLE).items()}
    if weights.endswith(".bin"):
        torch.save(state, folder / weights)
    else:
        save_file(state, str(folder / weights))
    (folder / "adapter_config.json").write_text(json.dumps(lora_config_dict(transformer)))
    return folder


def test_bin_adapter_and_hub_references(tiny_model_dir, raw_dir, tmp_path, monkeypatch, capsys):
    """`adapter_model.bin` loads like safetensors; `hf:<repo>[@rev]` (CLI and the workflow's
    --checkpoint_path form) resolves through huggingface_hub's cache, offline."""
    import huggingface_hub.constants as hub

    transformer = _lora_transformer(tiny_model_dir)
    by_safetensors = run_eval(tiny_model_dir, raw_dir, tmp_path / "s", "ocr", "--limit", 2, "--lora_hf_path",
                              _peft_folder(transformer, tmp_path / "peft_st", "adapter_model.safetensors"))
    by_bin = run_eval(tiny_model_dir, raw_dir, tmp_path / "b", "ocr", "--limit", 2, "--checkpoint_path",
                      _peft_folder(transformer, tmp_path / "peft_bin", "adapter_model.bin"))
    assert by_bin == by_safetensors
    # A hub cache as huggingface_hub lays it out: refs/main -> snapshots/<commit>/.
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someone--marble-lora"
    _peft_folder(transformer, repo / "snapshots" / commit, "adapter_model.bin")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)  # any request would raise
    by_hub = run_eval(tiny_model_dir, raw_dir, tmp_path / "h", "ocr", "--limit", 2,
                      "--lora_hf_path", f"hf:someone/marble-lora@{commit}")
    by_branch = run_eval(tiny_model_dir, raw_dir, tmp_path / "w", "ocr", "--limit", 2,
                         "--checkpoint_path", "hf:someone/marble-lora")
    assert by_hub == by_branch == by_safetensors
    for out in ("h", "w"):  # the identity pins the commit that was evaluated, even for a branch
        info = json.loads((tmp_path / out / "run_info.json").read_text())
        assert info["identity"]["checkpoint"] == {"ref": f"hf:someone/marble-lora@{commit}"}
    for ref, message in [("hf:someone/absent", "hub LoRA hf:someone/absent"),
                         ("hf:a/b/c", "not a hub LoRA reference")]:
        argv = ["--model_path", str(tiny_model_dir), "--dataset", "ocr", "--data_dir", str(raw_dir),
                "--lora_hf_path", ref, "--output_dir", str(tmp_path / "x")]
        assert evaluate.main(argv) == 2
        assert message in capsys.readouterr().err


def test_bad_flags_are_clear(capsys):
    with pytest.raises(SystemExit):
        evaluate.main(["--model_type", "flux", "--dataset", "ocr"])
    assert "invalid choice: 'flux' (choose from 'sd3', 'generic')" in capsys.readouterr().err


def test_torchrun_two_ranks_equal_one(tiny_model_dir, raw_dir, tmp_path):
    one = tmp_path / "one"
    run_eval(tiny_model_dir, raw_dir, one, "ocr", "--limit", 5, "--save_images", "--image_format", "png")
    two = tmp_path / "two"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "marble.evaluate", "--model_path", str(tiny_model_dir), "--dataset", "ocr",
           "--data_dir", str(raw_dir), "--output_dir", str(two), "--resolution", "64",
           "--num_inference_steps", "3", "--batch_size", "2", "--rewards", TOY, "--limit", "5",
           "--save_images", "--image_format", "png"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r1, r2 = rows(one), rows(two)
    assert [r["sample_id"] for r in r2] == list(range(5))  # none dropped, none duplicated
    # Same per-sample noise; batches differ ([0,1] vs [0,2]) and so does the thread count,
    # which changes float reduction order: pixels may move by a level or two, no more.
    for a, b in zip(r1, r2):
        assert a["prompt_id"] == b["prompt_id"] and a["scores"].keys() == b["scores"].keys()
        for name, value in a["scores"].items():
            assert (value is None and b["scores"][name] is None) or value == pytest.approx(b["scores"][name], abs=1e-4)
    p1, p2 = pixels(one), pixels(two)
    assert list(p1) == list(p2)
    for key in p1:
        diff = np.abs(p1[key].astype(int) - p2[key].astype(int))
        assert diff.max() <= 2 and diff.mean() < 0.05, (key, diff.max(), diff.mean())
    assert json.loads((two / "run_info.json").read_text())["world_size"] == 2
    shutil.rmtree(two)
