"""The generic text-to-image path of `marble evaluate` (Table 1's SD-XL and FLUX.1 base rows):
tiny pipelines built from configs, saved in their real on-disk format, evaluated end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marble import evaluate
from beds import replicas_t2i

PROMPTS = ["a red bicycle", 'a sign that says "hello"', "a foggy forest"]


@pytest.fixture(scope="module")
def raw_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("raw")
    (root / "ocr").mkdir()
    (root / "ocr" / "test.txt").write_text("\n".join(PROMPTS) + "\n")
    return root


@pytest.mark.parametrize("kind", ["sdxl", "flux"])
def test_generic_pipeline_evaluates_from_its_saved_folder(kind, raw_dir, tmp_path):
    model = getattr(replicas_t2i, f"{kind}_repo")(tmp_path / kind)
    index = json.loads((model / "model_index.json").read_text())
    assert index["_class_name"] == {"sdxl": "StableDiffusionXLPipeline", "flux": "FluxPipeline"}[kind]
    out = tmp_path / "eval"
    argv = ["--model_path", str(model), "--model_type", "generic", "--dataset", "ocr",
            "--data_dir", str(raw_dir), "--output_dir", str(out), "--resolution", "32",
            "--num_inference_steps", "2", "--guidance_scale", "3.5", "--batch_size", "3",
            "--rewards", "toy_brightness", "--save_images", "--image_format", "png"]
    assert evaluate.main(argv) == 0
    scores = json.loads((out / "average_scores.json").read_text())
    assert scores["n_toy_brightness"] == len(PROMPTS)
    assert 0.0 <= scores["toy_brightness"] <= 1.0
    assert len(list((out / "images").glob("*.png"))) == len(PROMPTS)
    info = json.loads((out / "run_info.json").read_text())
    assert info["flags"]["model_type"] == "generic"
    # Where it ran and how (recorded beside the flags): the CPU here, no autocast, no TF32.
    assert info["numerics"] == {"device": "cpu", "dtype": "float32", "tf32": False, "autocast": None,
                                "mode": "marble"}  # eval.numerics: the default outside the paper path
    assert info["scorers"]["toy_brightness"]["device"] is None


def test_generic_refuses_a_lora(tmp_path):
    with pytest.raises(SystemExit):
        evaluate.parse_args(["--model_type", "generic", "--dataset", "ocr",
                             "--lora_hf_path", "hf:owner/lora@" + "a" * 40])
