"""Generate and score one benchmark: the body of `marble evaluate`.

Sampling is the stock `StableDiffusion3Pipeline.__call__` (FlowMatch Euler, docs/algorithm.md §10) up to
the latents; we decode them with training's `decode_latents` (fp32 VAE: `load_pipeline`
keeps the VAE in fp32 while the transformer may run in fp16/bf16, and the stock decode
would mix dtypes), then quantise to 8 bits (`images.quantize_8bit`): the scored image is
the one a lossless file holds.

Determinism: the reference sets no seed, so its runs differ. Here each sample's initial
noise comes from its own CPU generator seeded by `sample_seed(seed, prompt_id, repeat)`,
so the noise does not depend on batch composition, rank count or device. Pixels are
bit-identical for identical runs; a different batch composition or thread count changes
float reduction order and may move a pixel by a level or two (tested).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import torch
from tqdm import tqdm

from marble import rewards as registry
from marble.config import RewardSpec
from marble.data.records import compute_masks
from marble.evaluation import images as image_io
from marble.evaluation.prompts import EvalSample, batches, sample_seed, shard
from marble.evaluation.results import ResultsError, is_scored, json_scores, read_results, same_prompt
from marble.models import load_pipeline
from marble.models.loading import cast_pipeline
from marble.models.encode import decode_latents
from marble.models.loading import load_text_to_image
from marble.models.lora import load_lora_into_pipeline, merge_lora
from marble.rewards import build_scorers, reward_device
from marble.runtime import distributed as dist
from marble.runtime.io import append_jsonl, remove_atomic_leftovers
from marble.runtime.precision import DTYPES, enable_tf32

RESULTS_FILE = "evaluation_results.jsonl"
log = logging.getLogger(__name__)


# The reference's evaluation.py encodes prompts with 256 T5 tokens (Flow-GRPO's and
# DiffusionNFT's training-time evaluation use 128); both numerics modes pass it explicitly.
T5_LENGTH = 256


def load_eval_pipeline(model_path: str, mixed_precision: str, device, lora: str | Path | None,
                       model_type: str = "sd3", numerics: str = "marble"):
    """numerics="reference": load in fp32, merge the LoRA into the fp32 transformer, then cast
    (the reference's order); "marble": load cast, run the LoRA unmerged on the cast weights."""
    if model_type == "generic":  # a base row through its own pipeline (no LoRA: parse_args)
        return load_text_to_image(model_path, dtype=DTYPES[mixed_precision], device=device)
    reference = numerics == "reference"
    pipe = load_pipeline(model_path, dtype=torch.float32 if reference else DTYPES[mixed_precision], device=device)
    if lora is not None:
        load_lora_into_pipeline(pipe, str(lora))
        if reference:
            merge_lora(pipe.transformer)
    if reference:
        cast_pipeline(pipe, DTYPES[mixed_precision], device)  # the VAE stays fp32, as in marble mode
    pipe.set_progress_bar_config(disable=True)
    return pipe


def load_base(args, device, lora):
    """The evaluation's pipeline; a hub id that neither the cache nor the hub holds is one line
    (diffusers raises a bare OSError, errno unset: not a disk error) naming --model_path."""
    try:
        return load_eval_pipeline(args.model_path, args.mixed_precision, device, lora,
                                  getattr(args, "model_type", "sd3"), getattr(args, "numerics", "marble"))
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) or exc.errno is not None:
            raise
        first = str(exc).split(". ")[0][:200]
        raise FileNotFoundError(f"base model {args.model_path} not found: not a folder here, and the hub "
                                f"did not give it ({first}); pass --model_path a model folder") from None


@torch.no_grad()
def generate_images(pipe, samples: list[EvalSample], args) -> torch.Tensor:
    """8-bit-quantised images [N, 3, H, W] in [0, 1] on the CPU."""
    generators = [torch.Generator("cpu").manual_seed(sample_seed(args.seed, s.prompt_id, s.repeat))
                  for s in samples]
    if getattr(args, "model_type", "sd3") == "generic":
        # The pipeline's own sampler and decode, as its users run it; images in [0, 1].
        images = pipe(prompt=[s.prompt for s in samples], num_inference_steps=args.num_inference_steps,
                      guidance_scale=args.guidance_scale, height=args.resolution, width=args.resolution,
                      generator=generators, output_type="pt").images
        return image_io.quantize_8bit(images.float().cpu())
    device = pipe.transformer.device
    precision = getattr(args, "mixed_precision", "no")
    autocast = device.type == "cuda" and precision != "no"  # the reference's autocast, CUDA only
    with torch.autocast(device.type, dtype=DTYPES[precision], enabled=autocast):
        latents = sd3_latents(pipe, samples, generators, args)
        if getattr(args, "numerics", "marble") == "reference":  # the reference decodes in autocast
            return image_io.quantize_8bit(decode_latents(pipe, latents))
    return image_io.quantize_8bit(decode_latents(pipe, latents))


def sd3_latents(pipe, samples, generators, args):
    return pipe(
        prompt=[s.prompt for s in samples],  # a copy: the pipeline never sees our records
        num_inference_steps=args.num_inference_steps,
        guidance_scale=args.guidance_scale,
        height=args.resolution,
        width=args.resolution,
        generator=generators,
        max_sequence_length=T5_LENGTH,
        output_type="latent",
    ).images


def describe_scorers(rewards: dict) -> dict:
    """{reward: {class, device, engine}} for run_info.json: where each scorer ran and with what
    (the OCR engine says whether it is the paper's PaddleOCR or an ONNX stand-in)."""
    out = {}
    for name, reward in rewards.items():
        device = getattr(reward, "device", None)
        # The OCR engine's label, else the loaded model's folder or hub id (transformers models).
        engine = getattr(reward, "engine_label", None) or getattr(getattr(reward, "model", None), "name_or_path", None)
        out[name] = {"class": type(reward).__name__, "device": None if device is None else str(device),
                     "engine": engine}
    return out


def precision_setup(device: torch.device, mixed_precision: str) -> dict:
    """The reference evaluation's numerics on CUDA: TF32 matmuls/convolutions on, and the
    pipeline call under autocast in the chosen half precision. Returns what was set."""
    cuda = device.type == "cuda"
    enable_tf32(device, True)  # training's switch: on CUDA only
    autocast = cuda and mixed_precision != "no"
    return {"device": str(device), "dtype": str(DTYPES[mixed_precision]).removeprefix("torch."), "tf32": cuda,
            "autocast": str(DTYPES[mixed_precision]).removeprefix("torch.") if autocast else None}


def score_images(rewards: dict, images: torch.Tensor, samples: list[EvalSample]) -> tuple[list[dict], list[list[str]]]:
    """Per sample: {reward: float (NaN = unscorable/not applicable)} (GenEval adds its detail),
    and the rewards whose request failed for it (NaN too, but retried by the next run)."""
    prompts = [s.prompt for s in samples]
    metadata = [dict(s.metadata) for s in samples]
    detailed = {n: r for n, r in rewards.items() if hasattr(r, "evaluate_detail")}
    plain = {n: r for n, r in rewards.items() if n not in detailed}
    scores, _ = registry.score_all(plain, images, prompts, metadata) if plain else ({}, {})
    out = [{name: float(values[i]) for name, values in scores.items()} for i in range(len(samples))]
    failed = [[name for name in plain if bool(plain[name].last_failed[i])] for i in range(len(samples))]
    masks = compute_masks(samples, detailed)
    for name, reward in detailed.items():
        # Only the samples the reward applies to (NaN elsewhere), as score_all does.
        idx = [i for i, applies in enumerate(masks[name]) if applies]
        for row in out:
            row[name] = math.nan
        details = reward.evaluate_detail(images[idx], [metadata[i] for i in idx]) if idx else []
        for i, detail in zip(idx, details):
            out[i][name] = float(detail.get("score", math.nan))
            out[i].update({k: float(detail[k]) for k in ("accuracy", "strict_accuracy") if k in detail})
    return out, failed


def merged_failed(old: dict, new_scores: dict, new_failed: list[str]) -> list[str]:
    """Rewards still failed for a row: those failed now, and old failures not rescored now."""
    kept = [name for name in old.get("failed") or [] if name not in new_scores]
    return sorted({*kept, *new_failed})


def not_applicable(rewards: dict, sample: EvalSample) -> list[str]:
    return [n for n, mask in compute_masks([sample], rewards).items() if not mask[0]]


def process_batch(pipe, rewards, batch, previous: dict[int, dict], args, output_dir: Path):
    """Generate (or reload) and score one batch; returns result rows and phase timings."""
    timing = {"generation_s": 0.0, "scoring_s": 0.0, "generated": 0, "replaced_images": 0}
    if not batch:
        return [], timing
    start = time.perf_counter()
    current = {s.sample_id: same_prompt(previous.get(s.sample_id), s.prompt_id, s.prompt) for s in batch}
    images, digests, generated, replaced = batch_images(pipe, batch, previous, current, args, output_dir)
    timing.update(generated=len(batch) if generated else 0, replaced_images=len(replaced),
                  generation_s=time.perf_counter() - start)
    start = time.perf_counter()
    scores, failed = ([{} for _ in batch], [[] for _ in batch]) if args.no_score else \
        score_images(rewards, images, batch)
    timing["scoring_s"] = time.perf_counter() - start
    rows = []
    for sample, new_scores, new_failed in zip(batch, scores, failed):
        old = previous.get(sample.sample_id, {})
        kept = old if current[sample.sample_id] else {}  # a row of another prompt: nothing of it is kept
        digest = digests.get(sample.sample_id)
        rows.append({
            # The next revision of a rescored sample (results.read_results: a repeat without it is an edit).
            "sample_id": sample.sample_id, "rev": old.get("rev", 1) + 1 if old else 1,
            "prompt_id": sample.prompt_id, "prompt": sample.prompt,
            "metadata": dict(sample.metadata),
            "scores": {**(kept.get("scores") or {}), **json_scores(new_scores)},
            "not_applicable": [] if args.no_score else not_applicable(rewards, sample),
            # A failed request is stored as missing (null, named here), never as a score.
            "failed": merged_failed(kept, new_scores, new_failed),
            # The file that holds the scored image (saved now, or reloaded) and its sha256; a
            # file this run neither wrote nor read is not this row's image.
            "image_path": str(image_io.image_path(output_dir, sample.sample_id, args.image_format))
            if digest else None,
            "image_sha256": digest,
        })
    return rows, timing


def batch_images(pipe, batch, previous: dict[int, dict], current: dict[int, bool], args, output_dir: Path):
    """(images, sample_id -> sha256 of the file holding each image, generated?, replaced ids).

    Reload rather than regenerate when the image exists: --skip_generation, or a resumed
    run whose earlier pass generated this sample (e.g. --no_score, or fewer rewards).
    Only lossless files are reused on resume: a JPEG would score differently from the
    in-memory image an uninterrupted run scores. And only while each file still holds the
    image its row recorded (`image_sha256`): one replaced at that path (copied from another
    run or checkpoint, edited) was scored as this sample's. A row of an earlier release
    records no digest: its file cannot be vouched for, so it is regenerated too. A batch is
    regenerated whole, in the composition of the first pass, so its pixels are those of an
    uninterrupted run (runner docstring)."""
    fmt, ids = args.image_format, [s.sample_id for s in batch]
    found = image_io.file_digests(ids, output_dir, fmt)
    recorded = {i: (previous.get(i) or {}).get("image_sha256") for i in ids}
    replaced = [i for i in ids if current[i] and None not in (found[i], recorded[i]) and found[i] != recorded[i]]
    if args.skip_generation:  # the user asks to score the files that are there: scored, and named
        stale_images(batch, previous, current, output_dir, fmt)
        if replaced:
            log.warning("--skip_generation: scoring the saved images of samples %s as they are, but they are "
                        "not the images their rows recorded (sha256 differs: replaced, copied in or edited)",
                        replaced)
        return image_io.load_images(ids, output_dir, fmt), found, False, replaced
    if fmt == "png" and all(current[i] and found[i] is not None and found[i] == recorded[i] for i in ids):
        return image_io.load_images(ids, output_dir, fmt), found, False, []
    if replaced:
        log.warning("regenerating samples %s: their saved images are not the images their rows recorded "
                    "(sha256 differs: replaced, copied in or edited)", replaced)
    images = generate_images(pipe, batch, args)
    digests = image_io.save_images(images, ids, output_dir, fmt) if args.save_images else {}
    return images, digests, True, replaced


def stale_images(batch, previous: dict[int, dict], current: dict[int, bool], output_dir: Path, fmt: str) -> None:
    """--skip_generation rescored saved images: refuse those a row says were made for another prompt."""
    for sample in batch:
        row = previous.get(sample.sample_id)
        if row is not None and not current[sample.sample_id]:
            raise ResultsError(
                f"{image_io.image_path(output_dir, sample.sample_id, fmt)} was generated for the prompt "
                f"{row.get('prompt')!r}, but sample {sample.sample_id} is now {sample.prompt!r} (the prompt file "
                "changed): rerun without --skip_generation to generate it")


def pending_samples(samples: list[EvalSample], previous: dict[int, dict], reward_names, args):
    def done(s: EvalSample) -> bool:
        row = previous.get(s.sample_id)
        if not same_prompt(row, s.prompt_id, s.prompt):  # absent, or made for an edited prompt
            return False
        return args.no_score or is_scored(row, reward_names)

    return [s for s in samples if not done(s)]


def run(samples: list[EvalSample], reward_names: list[str], reward_options: dict, lora, args,
        on_ready=None) -> dict:
    """Evaluate `samples` into args.output_dir; rank 0 appends rows. Returns phase timings.

    `on_ready()` runs once the pipeline and the scorers are built, before the first row is
    written (`marble evaluate` writes run_info.json there: a start that fails to load
    leaves nothing that refuses the corrected command)."""
    info = dist.world()
    output_dir = Path(args.output_dir)
    results_path = output_dir / RESULTS_FILE
    if info.is_main:  # before the broadcast: no rank writes yet
        for stale in [*remove_atomic_leftovers(output_dir),
                      *remove_atomic_leftovers(output_dir / "images")]:
            log.warning("removed %s (left by a killed write)", stale)
    previous = dist.broadcast_object(read_results(results_path) if info.is_main else None)
    todo = pending_samples(samples, previous, reward_names, args)
    mine = batches(shard(todo, info.rank, info.world_size), args.batch_size)
    # Every rank runs the same number of collective rounds (rank 0 has the largest share).
    rounds = math.ceil(math.ceil(len(todo) / info.world_size) / args.batch_size) if todo else 0
    totals = {"generation_s": 0.0, "scoring_s": 0.0, "generated": 0, "replaced_images": 0, "pending": len(todo)}
    if rounds == 0:
        return totals
    scorer_device = reward_device(getattr(args, "reward_device", "auto"), info.local_rank,
                                  cuda=info.device.type == "cuda")
    totals["numerics"] = precision_setup(info.device, args.mixed_precision)
    totals["numerics"]["mode"] = getattr(args, "numerics", "marble")
    pipe = None if args.skip_generation else load_base(args, info.device, lora)
    specs = [RewardSpec(name=name, options=dict(reward_options.get(name, {}))) for name in reward_names]
    rewards = {} if args.no_score else build_scorers(specs, scorer_device)
    totals["scorers"] = describe_scorers(rewards)
    if on_ready is not None:
        on_ready()
    for index in tqdm(range(rounds), desc=f"evaluate {args.dataset}", disable=not info.is_main):
        batch = mine[index] if index < len(mine) else []
        rows, timing = process_batch(pipe, rewards, batch, previous, args, output_dir)
        for key in ("generation_s", "scoring_s", "generated", "replaced_images"):
            totals[key] += timing[key]
        gathered = dist.all_gather_objects(rows)
        if info.is_main:
            for row in sorted((r for part in gathered for r in part), key=lambda r: r["sample_id"]):
                append_jsonl(results_path, row)
    for key in ("generated", "replaced_images"):
        totals[key] = int(sum(dist.all_gather_objects(totals[key])))
    return totals
