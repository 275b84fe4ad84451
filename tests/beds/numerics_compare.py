"""The two evaluation numerics modes side by side on the paper-mini replicas (issue 29 item 3).

    python -m beds.numerics_compare [--prompts 8] [--steps 4] [--resolution 64]

Builds the tiny SD3.5-M replica, its hub-LoRA replica (FlowGRPO's peft format, random B) and a
tiny CLIP (beds.replicas), then generates the same prompts and seeds through
evaluation's own path (runner.load_eval_pipeline + generate_images, fp16) in `--numerics
marble` and `--numerics reference`, and scores both with PickScore and CLIPScore on the tiny
CLIP. Prints the 8-bit pixel difference and each score's mean per mode. On a CPU the runner
runs no autocast (CUDA only), so the VAE half of the reference mode is measured separately:
the same latents decoded in fp32 and under a forced fp16 CPU autocast. Numbers from random
tiny weights: they size the effect of the numerics, not of the paper's models.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from argparse import Namespace
from pathlib import Path

import torch

from marble.evaluation.prompts import EvalSample
from marble.evaluation.runner import sd3_latents, generate_images, load_eval_pipeline
from marble.models.encode import decode_latents
from marble.rewards.clip_family import ClipScore, PickScore
from beds import replicas

PROMPTS = ["a red apple on a table", "two dogs in the snow", "a sign that says hello", "a blue car",
           "a cat next to a lamp", "three green balls", "a castle at night", "a bowl of soup"]


def _samples(n: int) -> list[EvalSample]:
    return [EvalSample(i, f"p{i}", PROMPTS[i % len(PROMPTS)]) for i in range(n)]


def _scores(images: torch.Tensor, prompts: list[str], clip: Path) -> dict[str, float]:
    out = {}
    for cls in (PickScore, ClipScore):
        scores = cls(model=str(clip), processor=str(clip))(images, prompts)
        out[cls.name] = float(torch.as_tensor(scores).float().mean())
    return out


def compare(root: Path, n: int, steps: int, resolution: int) -> dict:
    replicas.sd3_repo(root / "sd3", seed=0)
    replicas.sd3_peft_lora_repo(root / "lora", seed=23)
    replicas.clip_repo(root / "clip", seed=1)
    samples, prompts = _samples(n), [s.prompt for s in _samples(n)]
    images, out = {}, {}
    for mode in ("marble", "reference"):
        args = Namespace(seed=42, num_inference_steps=steps, guidance_scale=4.5, resolution=resolution,
                         mixed_precision="fp16", numerics=mode, model_type="sd3")
        pipe = load_eval_pipeline(str(root / "sd3"), "fp16", torch.device("cpu"), root / "lora", "sd3", mode)
        images[mode] = generate_images(pipe, samples, args)
        out[mode] = _scores(images[mode], prompts, root / "clip")
    levels = (images["reference"] - images["marble"]).abs() * 255
    out["pixels_8bit"] = {"mean_abs": float(levels.mean()), "max_abs": float(levels.max()),
                          "share_changed": float((levels > 0.5).float().mean())}
    out["vae_autocast"] = _vae_only(pipe, samples, args)
    return out


def _vae_only(pipe, samples, args) -> dict[str, float]:
    """The same latents decoded as marble mode does (fp32) and under a fp16 autocast (the
    reference's decode), forced on the CPU, where the runner itself runs no autocast."""
    generators = [torch.Generator("cpu").manual_seed(42 + i) for i in range(len(samples))]
    latents = sd3_latents(pipe, samples, generators, args)
    fp32 = decode_latents(pipe, latents)
    with torch.autocast("cpu", dtype=torch.float16):
        half = decode_latents(pipe, latents)
    diff = (half - fp32).abs() * 255
    return {"mean_abs_8bit": float(diff.mean()), "max_abs_8bit": float(diff.max())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m beds.numerics_compare",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--resolution", type=int, default=64)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(compare(Path(tmp), args.prompts, args.steps, args.resolution), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
