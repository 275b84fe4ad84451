"""Generate and score one benchmark: the body of `marble evaluate`.

Sampling is the stock `StableDiffusion3Pipeline.__call__` (FlowMatch Euler, docs/algorithm.md
§10) up to
the latents; we decode them ourselves in fp32 because `load_pipeline` keeps the VAE in
fp32 while the transformer may run in fp16/bf16, and the stock decode would mix dtypes.

Determinism: the reference sets no seed, so its runs differ. Here each sample's initial
noise comes from its own CPU generator seeded by `sample_seed(seed, prompt_id, repeat)`,
so the noise does not depend on batch composition, rank count or device. Pixels are
bit-identical for identical runs; a different batch composition or thread count changes
float reduction order and may move a pixel by a level or two (tested).
"""

from __future__ import annotations

import io
import math
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tqdm import tqdm

from marble import distributed as dist
from marble.evaluation.prompts import EvalSample, batches, sample_seed, shard
from marble.evaluation.results import is_scored, json_scores, read_results
from marble.io import append_jsonl, write_bytes

DTYPES = {"no": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
RESULTS_FILE = "evaluation_results.jsonl"


def image_path(output_dir: Path, sample_id: int) -> Path:
    return output_dir / "images" / f"{sample_id:05d}.png"


def load_eval_pipeline(model_path: str, mixed_precision: str, device, lora: str | Path | None):
    from marble.models import load_pipeline

    pipe = load_pipeline(model_path, dtype=DTYPES[mixed_precision], device=device)
    if lora is not None:
        from marble.models.lora import load_lora_into_pipeline

        load_lora_into_pipeline(pipe, str(lora))
    pipe.set_progress_bar_config(disable=True)
    return pipe


@torch.no_grad()
def decode_latents(pipe, latents: torch.Tensor) -> torch.Tensor:
    """Latents -> float images [N, 3, H, W] in [0, 1] on the CPU, quantised to 8 bits.

    Quantising here makes scores from memory equal scores from the saved PNGs
    (`--skip_generation` re-scores exactly what a direct run scored).
    """
    vae = pipe.vae
    latents = latents.to(device=vae.device, dtype=torch.float32)
    latents = latents / vae.config.scaling_factor + vae.config.shift_factor
    images = vae.decode(latents, return_dict=False)[0]
    images = (images / 2 + 0.5).clamp(0, 1).float().cpu()
    return torch.round(images * 255) / 255


@torch.no_grad()
def generate_images(pipe, samples: list[EvalSample], args) -> torch.Tensor:
    generators = [torch.Generator("cpu").manual_seed(sample_seed(args.seed, s.prompt_id, s.repeat))
                  for s in samples]
    latents = pipe(
        prompt=[s.prompt for s in samples],  # a copy: the pipeline never sees our records
        num_inference_steps=args.num_inference_steps,
        guidance_scale=args.guidance_scale,
        height=args.resolution,
        width=args.resolution,
        generator=generators,
        output_type="latent",
    ).images
    return decode_latents(pipe, latents)


def save_images(images: torch.Tensor, samples: list[EvalSample], output_dir: Path) -> None:
    arrays = (images * 255).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
    for array, sample in zip(arrays, samples):
        buffer = io.BytesIO()
        Image.fromarray(array).save(buffer, format="PNG")
        write_bytes(image_path(output_dir, sample.sample_id), buffer.getvalue())


def load_images(samples: list[EvalSample], output_dir: Path) -> torch.Tensor:
    tensors = []
    for sample in samples:
        path = image_path(output_dir, sample.sample_id)
        if not path.is_file():
            raise FileNotFoundError(f"--skip_generation: image {path} of sample {sample.sample_id} is missing")
        array = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255.0
        tensors.append(torch.from_numpy(array).permute(2, 0, 1))
    return torch.stack(tensors)


def build_rewards(names: list[str], options: dict[str, dict]) -> dict:
    from marble import rewards

    return {name: rewards.build(name, **options.get(name, {})) for name in names}


def score_images(rewards: dict, images: torch.Tensor, samples: list[EvalSample]) -> list[dict]:
    """Per sample: {reward: float (NaN = unscorable/not applicable)}; GenEval adds its detail."""
    from marble import rewards as registry

    prompts = [s.prompt for s in samples]
    metadata = [dict(s.metadata) for s in samples]
    detailed = {n: r for n, r in rewards.items() if hasattr(r, "evaluate_detail")}
    plain = {n: r for n, r in rewards.items() if n not in detailed}
    scores, _ = registry.score_all(plain, images, prompts, metadata) if plain else ({}, {})
    out = [{name: float(values[i]) for name, values in scores.items()} for i in range(len(samples))]
    for name, reward in detailed.items():
        for row, detail in zip(out, reward.evaluate_detail(images, prompts, metadata)):
            row[name] = float(detail.get("score", math.nan))
            row.update({k: float(detail[k]) for k in ("accuracy", "strict_accuracy") if k in detail})
    return out


def not_applicable(rewards: dict, sample: EvalSample) -> list[str]:
    return [n for n, r in rewards.items() if not r.applies(sample.prompt, dict(sample.metadata))]


def process_batch(pipe, rewards, batch, previous: dict[int, dict], args, output_dir: Path):
    """Generate (or reload) and score one batch; returns result rows and phase timings."""
    timing = {"generation_s": 0.0, "scoring_s": 0.0, "generated": 0}
    if not batch:
        return [], timing
    start = time.perf_counter()
    # Reload rather than regenerate when the image exists: --skip_generation, or a resumed
    # run whose earlier pass generated this sample (e.g. --no_score, or fewer rewards).
    reuse = args.skip_generation or all(
        s.sample_id in previous and image_path(output_dir, s.sample_id).is_file() for s in batch)
    if reuse:
        images = load_images(batch, output_dir)
    else:
        images = generate_images(pipe, batch, args)
        timing["generated"] = len(batch)
        if args.save_images:
            save_images(images, batch, output_dir)
    timing["generation_s"] = time.perf_counter() - start
    start = time.perf_counter()
    scores = [{} for _ in batch] if args.no_score else score_images(rewards, images, batch)
    timing["scoring_s"] = time.perf_counter() - start
    rows = []
    for sample, new_scores in zip(batch, scores):
        old = previous.get(sample.sample_id, {})
        path = image_path(output_dir, sample.sample_id)
        rows.append({
            "sample_id": sample.sample_id, "prompt_id": sample.prompt_id, "prompt": sample.prompt,
            "metadata": dict(sample.metadata),
            "scores": {**(old.get("scores") or {}), **json_scores(new_scores)},
            "not_applicable": [] if args.no_score else not_applicable(rewards, sample),
            "image_path": str(path) if path.is_file() else None,
        })
    return rows, timing


def pending_samples(samples: list[EvalSample], previous: dict[int, dict], reward_names, args):
    def done(s: EvalSample) -> bool:
        row = previous.get(s.sample_id)
        if row is None:
            return False
        return args.no_score or is_scored(row, reward_names)

    return [s for s in samples if not done(s)]


def run(samples: list[EvalSample], reward_names: list[str], reward_options: dict, lora, args) -> dict:
    """Evaluate `samples` into args.output_dir; rank 0 appends rows. Returns phase timings."""
    info = dist.world()
    output_dir = Path(args.output_dir)
    results_path = output_dir / RESULTS_FILE
    previous = dist.broadcast_object(read_results(results_path) if info.is_main else None)
    todo = pending_samples(samples, previous, reward_names, args)
    mine = batches(shard(todo, info.rank, info.world_size), args.batch_size)
    # Every rank runs the same number of collective rounds (rank 0 has the largest share).
    rounds = math.ceil(math.ceil(len(todo) / info.world_size) / args.batch_size) if todo else 0
    totals = {"generation_s": 0.0, "scoring_s": 0.0, "generated": 0, "pending": len(todo)}
    if rounds == 0:
        return totals
    pipe = None if args.skip_generation else load_eval_pipeline(
        args.model_path, args.mixed_precision, info.device, lora)
    rewards = {} if args.no_score else build_rewards(reward_names, reward_options)
    for index in tqdm(range(rounds), desc=f"evaluate {args.dataset}", disable=not info.is_main):
        batch = mine[index] if index < len(mine) else []
        rows, timing = process_batch(pipe, rewards, batch, previous, args, output_dir)
        for key in ("generation_s", "scoring_s", "generated"):
            totals[key] += timing[key]
        gathered = dist.all_gather_objects(rows)
        if info.is_main:
            for row in sorted((r for part in gathered for r in part), key=lambda r: r["sample_id"]):
                append_jsonl(results_path, row)
    totals["generated"] = int(sum(dist.all_gather_objects(totals["generated"])))
    return totals
