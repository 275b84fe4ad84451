"""`marble evaluate`: generate and score a (LoRA) checkpoint on one benchmark.

Flags follow the reference `scripts/evaluation.py` (docs/algorithm.md §10), so its
invocations work:

    torchrun --nproc_per_node=8 -m marble.evaluate --lora_hf_path ID[@REV] --model_type sd3 \
        --dataset geneval --guidance_scale 4.5 --mixed_precision fp16 --save_images
    python -m marble.evaluate --checkpoint_path runs/x --dataset ocr --guidance_scale 1.0
    python -m marble.evaluate --model_path data/models/hub/sdxl --model_type generic --dataset ocr

A marble run folder (or one of its checkpoints) needs no other flag than --dataset: its base,
the project's prompt folder and the run's eval protocol fill those not given (marble.workflow.run_defaults).

`--model_type generic` evaluates any diffusers text-to-image folder through its own pipeline
(Table 1's SD-XL, SD3.5-L, FLUX.1-Dev rows; no LoRA). Scorers run on --reward_device (auto:
this rank's GPU); on CUDA, TF32 is on and the SD3 transformer runs under autocast in the
--mixed_precision dtype, as the reference evaluation; run_info.json records both.

The reference's layout is read and written: prompts under `dataset/<name>/` (--data_dir),
images as `images/<id:05d>.jpg` (--image_format jpg, so its folders rescore with
--skip_generation), `image_prompts.json`, peft adapters as safetensors or
`adapter_model.bin`, and `hf:<repo id>[@revision]` (or a bare hub id) for a hub LoRA.
Differences from the reference: every sample's noise is seeded from (--seed, prompt id,
repeat index), so reruns give identical images and any rank count the same noise (the
reference sets no seed); the run resumes, skipping samples already in
`evaluation_results.jsonl` that were made for the same prompt text (an edited prompt is
regenerated), and refuses to mix results of different image-changing flags or of a base model or LoRA
whose content changed (compared by fingerprint, marble.evaluation.identity: a moved
project is the same run). One evaluation per output folder (EVALUATION.lock,
marble.training.run_lock); run_info.json is written once the pipeline and scorers load.
Outputs: evaluation_results.jsonl, average_scores.json, image_prompts.json, run_info.json,
images/ (when asked). A remote reward request that failed (e.g. UnifiedReward's server
answered 503) is stored as missing, counted as `failed_<reward>` in average_scores.json,
and retried by the next run; while any remain the exit status is 3 (EXIT_INCOMPLETE, every
output written), so a workflow reruns the job (--allow_failed_requests: exit 0).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from pathlib import Path

import yaml

from marble.config_parse import load_yaml
from marble.evaluation.images import DEFAULT_IMAGE_FORMAT, IMAGE_FORMATS, ImageDecodeError, write_image_prompts
from marble.evaluation.prompts import DATASETS, DEFAULT_BATCH_SIZE, DEFAULT_REWARDS, dataset_file, load_samples
from marble.evaluation.results import (
    ResultsError,
    average_scores,
    check_same_run,
    current_rows,
    identity,
    prompt_set_digest,
    json_safe,
    read_results,
)
from marble.evaluation.checkpoints import resolve_checkpoint
from marble.assets.hub_ref import HUB_PREFIX
from marble.runtime.io import write_json
from marble.runtime.provenance import write_provenance
from marble.training import run_lock

DEFAULT_MODEL = "stabilityai/stable-diffusion-3.5-medium"
MODEL_TYPES = ("sd3", "generic")
NUMERICS = ("reference", "marble")
DEFAULT_DATA_DIR = "dataset"  # the reference reads dataset/<name>/ (its evaluation.py)
# Outputs written, but some samples' remote requests failed (NaN, not scores): not done yet.
EXIT_INCOMPLETE = 3


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="marble evaluate", description=__doc__.split("\n\n")[0])
    lora = p.add_mutually_exclusive_group()
    lora.add_argument("--checkpoint_path", help="marble checkpoint or run folder, or a peft/diffusers LoRA folder")
    lora.add_argument("--lora_hf_path", help="hub LoRA: [hf:]<repo id>[@revision], or a local folder")
    p.add_argument("--model_type", choices=MODEL_TYPES, default="sd3",
                   help="sd3: StableDiffusion3Pipeline (LoRAs load here); generic: the folder's own "
                        "diffusers text-to-image pipeline (SD-XL, FLUX.1, SD3.5-L base rows)")
    p.add_argument("--model_path", default=DEFAULT_MODEL,
                   help="base model: hub id, folder or random:tiny (default: a marble run's own base, else SD3.5 M)")
    p.add_argument("--allow_other_base", action="store_true",
                   help="evaluate a LoRA on a base other than the one its run recorded (refused otherwise)")
    p.add_argument("--dataset", required=True, choices=DATASETS)
    p.add_argument("--data_dir", default=DEFAULT_DATA_DIR,
                   help="raw prompt files (DIR/<dataset>/...; default: a marble run's project raw_dir, else dataset)")
    p.add_argument("--guidance_scale", type=float, default=1.0)
    p.add_argument("--num_inference_steps", type=int, default=40)
    p.add_argument("--mixed_precision", choices=("no", "fp16", "bf16"), default="no")
    p.add_argument("--numerics", choices=NUMERICS, default="marble",
                   help="reference: the reference evaluation's numerics (a hub LoRA merged into the fp32 "
                        "transformer before the cast, the VAE decoded inside the same autocast); marble: "
                        "the LoRA unmerged on the cast transformer, the VAE decoded in fp32 outside it")
    p.add_argument("--resolution", type=int, default=512)
    p.add_argument("--reward_device", default="auto",
                   help="where model-based scorers run: auto (cuda:LOCAL_RANK when CUDA is there, else cpu), "
                        "cpu, cuda (this rank's GPU) or cuda:N")
    p.add_argument("--batch_size", type=int, default=None, help="per rank (default: the reference's per dataset)")
    p.add_argument("--seed", type=int, default=42, help="global seed of the per-sample noise")
    p.add_argument("--save_images", action="store_true")
    p.add_argument("--image_format", choices=IMAGE_FORMATS, default=DEFAULT_IMAGE_FORMAT,
                   help="jpg: the reference's layout (lossy); png: lossless, rescoring is exact")
    p.add_argument("--output_dir", default="./evaluation_output")
    p.add_argument("--no_score", action="store_true", help="generate only (implies --save_images)")
    p.add_argument("--skip_generation", action="store_true", help="score the saved images only")
    p.add_argument("--limit", type=int, default=None, help="first N samples only")
    p.add_argument("--rewards", default=None, help="comma-separated reward list (default: per dataset)")
    p.add_argument("--allow_failed_requests", action="store_true",
                   help=f"exit 0 even when remote reward requests failed (default: exit {EXIT_INCOMPLETE} "
                        "after writing every output, so a workflow reruns the job and the rerun retries them)")
    # $MARBLE_REWARD_OPTIONS (a YAML file) is the base every evaluation starts from: a harness
    # (beds.paper_mini) or a site points all evaluations at its scorer options; the
    # flag (the workflow's eval.reward_options) overrides it option by option.
    p.add_argument("--reward_options", default=None,
                   help="YAML file or inline mapping {reward: {option: value}}, applied over "
                        "$MARBLE_REWARD_OPTIONS")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.model_type != "sd3" and (args.checkpoint_path or args.lora_hf_path):
        parser.error(f"--model_type {args.model_type}: LoRAs load into sd3 pipelines only")
    if args.no_score and args.skip_generation:
        parser.error("--no_score and --skip_generation together leave nothing to do")
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", args.reward_device):
        parser.error(f"--reward_device {args.reward_device!r}: expected auto, cpu, cuda or cuda:N")
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit must be >= 1, got {args.limit}")
    if args.batch_size is not None and args.batch_size < 1:
        parser.error(f"--batch_size must be >= 1, got {args.batch_size}")
    if args.num_inference_steps < 1:
        parser.error(f"--num_inference_steps must be >= 1, got {args.num_inference_steps}")
    if args.resolution < 8 or args.resolution % 8:  # the VAE downsamples by 8
        parser.error(f"--resolution must be a positive multiple of 8, got {args.resolution}")
    if not math.isfinite(args.guidance_scale) or args.guidance_scale < 0:
        parser.error(f"--guidance_scale must be a finite number >= 0, got {args.guidance_scale}")
    args.batch_size = args.batch_size or DEFAULT_BATCH_SIZE[args.dataset]
    # `--checkpoint_path hf:ID[@REV]` (a workflow eval.checkpoints entry) is a hub LoRA.
    if args.checkpoint_path and args.checkpoint_path.startswith(HUB_PREFIX):
        args.lora_hf_path, args.checkpoint_path = args.checkpoint_path, None
    args.save_images = args.save_images or args.no_score
    return args


def given_flags(argv: list[str]) -> set[str]:
    """The options this command line sets itself (a run's own record fills the others)."""
    parser = build_parser()
    for action in parser._actions:  # noqa: SLF001 - argparse has no public way to drop defaults
        action.default = argparse.SUPPRESS
        action.required = False
    return set(vars(parser.parse_known_args(argv)[0]))


def reward_names(args) -> list[str]:
    if args.rewards is None:
        return list(DEFAULT_REWARDS[args.dataset])
    names = [n.strip() for n in args.rewards.split(",") if n.strip()]
    if not names or len(set(names)) != len(names):
        raise SystemExit(f"marble evaluate: --rewards {args.rewards!r} must name distinct rewards")
    from marble.rewards import available  # the registry imports torch: past --help

    unknown = [n for n in names if n not in available()]
    if unknown:
        raise SystemExit(f"marble evaluate: --rewards: {', '.join(map(repr, unknown))} is not a reward "
                         f"(available: {', '.join(available())})")
    return names


def read_reward_options(path: str | None) -> dict[str, dict]:
    """`--reward_options`: a YAML file, or an inline JSON/YAML mapping (`{"ocr": {...}}`,
    as the workflow passes `eval.reward_options`)."""
    if path is None:
        return {}
    try:
        inline = path.lstrip().startswith("{") and not Path(path).exists()
        text = path if inline else Path(path).read_text(encoding="utf-8")
        data = load_yaml(text) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SystemExit(f"marble evaluate: --reward_options {path}: {exc}") from exc
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise SystemExit(f"marble evaluate: --reward_options {path}: expected {{reward: {{option: value}}}}")
    return data


def merged_reward_options(flag: str | None, env: str | None = None) -> dict[str, dict]:
    """$MARBLE_REWARD_OPTIONS, then `--reward_options` over it (per reward, per option)."""
    env = os.environ.get("MARBLE_REWARD_OPTIONS") or None if env is None else env
    merged = {name: dict(opts) for name, opts in read_reward_options(env).items()}
    for name, opts in read_reward_options(flag).items():
        merged.setdefault(name, {}).update(opts)
    return merged


def claim(args, info, run_identity) -> tuple[Path | None, str | None]:
    """Rank 0 locks the output folder (one evaluation per folder: two appended every sample
    twice) and checks it holds this run; every rank gets the verdict (none left waiting).
    Returns (the lock to release or None, the refusal or None)."""
    from marble.runtime import distributed as dist

    message, lock = None, None
    if info.is_main:
        try:
            lock = run_lock.acquire(Path(args.output_dir), name=run_lock.EVAL_LOCK_NAME,
                                    log=lambda line: print(line, file=sys.stderr))
            check_same_run(Path(args.output_dir) / "run_info.json", run_identity)
        except (ResultsError, run_lock.RunLockError) as exc:
            message = str(exc)
        except OSError as exc:  # the lock is the first write: a full or read-only disk
            from marble.runtime.oserrors import describe_write_failure

            message = describe_write_failure(exc, args.output_dir) or f"{args.output_dir}: cannot take its lock ({exc})"
    return lock, dist.broadcast_object(message)


def finish(args, samples, names, record, timing) -> dict:
    """Rank 0: averages over the current sample set, then the final run_info."""
    from marble.evaluation.runner import RESULTS_FILE

    output_dir = Path(args.output_dir)
    current = current_rows(read_results(output_dir / RESULTS_FILE), samples)  # made for today's prompts
    averages = average_scores(current, [] if args.no_score else names)
    write_json(output_dir / "average_scores.json", json_safe(averages))
    write_image_prompts(output_dir, current, args.image_format)
    write_json(output_dir / "run_info.json", {**record, "timing": timing})
    return averages


def exc_message(exc: BaseException, output_dir: str) -> str | None:
    """One line for the input and disk errors a user can act on (None: not one of them)."""
    from marble.runtime.oserrors import describe_write_failure

    from marble.rewards.base import RewardServiceError

    # A dead reward server too: the batches already scored are kept, a rerun continues.
    from marble.models.lora import LoraMismatchError

    if isinstance(exc, (FileNotFoundError, ImageDecodeError, RewardServiceError, ResultsError,
                        LoraMismatchError)):
        return str(exc)
    return describe_write_failure(exc, output_dir)


def warn_failed(averages: dict, names: list[str], output_dir: Path) -> int:
    """One line per reward with failed requests (they are NaN, a rerun retries them); their count."""
    total = 0
    for name in names:
        failed = averages.get(f"failed_{name}", 0)
        total += failed
        if failed:
            print(f"marble evaluate: {failed} {name} requests failed in {output_dir} (stored as missing, "
                  "not scored); rerun the same command to retry them", file=sys.stderr)
    return total


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    from marble.evaluation.checkpoints import CheckpointError
    from marble.evaluation.identity import content_identity
    from marble.runtime import distributed as dist

    from marble.evaluation.preflight import path_problem
    from marble.evaluation.run_record import RunRecordError
    from marble.workflow.run_defaults import fill_from_run

    try:  # a marble run folder: its base, prompts and protocol fill the flags not given
        for note in fill_from_run(args, given_flags(argv)):
            if os.environ.get("RANK", "0") == "0":  # once, not per torchrun rank
                print(f"marble evaluate: {note}", file=sys.stderr)
    except RunRecordError as exc:
        print(f"marble evaluate: {exc}", file=sys.stderr)
        return 2
    problem = path_problem(args)
    if problem is not None:
        print(f"marble evaluate: {problem}", file=sys.stderr)
        return 2
    names = reward_names(args)
    options = merged_reward_options(args.reward_options)
    try:
        lora, checkpoint = resolve_checkpoint(args)
        samples = load_samples(args.data_dir, args.dataset)[: args.limit]
        if not samples:
            raise ValueError(f"{Path(args.data_dir) / args.dataset}: no prompts to evaluate (an empty prompt file)")
        # By content: the base model's and the LoRA's fingerprints (a LoRA of a marble
        # run must come from this base); paths relative to the project.
        base, lora_id = content_identity(args.model_path, lora, checkpoint, args.allow_other_base)
    except (CheckpointError, FileNotFoundError, ValueError) as exc:
        print(f"marble evaluate: {exc}", file=sys.stderr)
        return 2
    info = dist.init_distributed()
    flags = dict(vars(args))
    run_identity = identity({**flags, "model_path": base, "checkpoint": lora_id})
    lock, message = claim(args, info, run_identity)
    try:
        if message is not None:
            print(f"marble evaluate: {message}", file=sys.stderr)
            dist.cleanup()
            return 2
        # The prompts by content (rows are matched to them by prompt_id, results.same_prompt).
        prompts = {"file": str(dataset_file(args.data_dir, args.dataset)), "digest": prompt_set_digest(samples)}
        record = {"identity": run_identity, "flags": flags, "rewards": names, "prompts": prompts,
                  "lora": str(lora) if lora else None, "world_size": info.world_size, "argv": argv}
        return evaluate_and_finish(args, info, samples, names, options, lora, record)
    finally:
        if lock is not None:
            run_lock.release(lock)


def evaluate_and_finish(args, info, samples, names, options, lora, record) -> int:
    from marble.evaluation import runner
    from marble.runtime import distributed as dist

    start = time.perf_counter()
    try:
        def guard() -> None:  # before the first row, so even a crashed run guards its results
            if info.is_main:
                write_json(Path(args.output_dir) / "run_info.json", record)
                write_provenance(args.output_dir, {k: record[k] for k in ("flags", "rewards", "lora")})

        timing = runner.run(samples, names, options, lora, args, on_ready=guard)
    except Exception as exc:  # noqa: BLE001 - re-raised unless a user can act on it
        message = exc_message(exc, args.output_dir)
        if message is None:
            raise
        print(f"marble evaluate: {message}", file=sys.stderr)
        return 2
    # Where and how this run computed (device, dtype, TF32, autocast; each scorer's device and
    # engine): part of the record, beside the flags.
    record.update({k: timing.pop(k) for k in ("numerics", "scorers") if k in timing})
    dist.barrier()
    if info.is_main:
        try:
            averages = finish(args, samples, names, record, {**timing, "wall_s": time.perf_counter() - start})
        except Exception as exc:  # noqa: BLE001 - a full disk in the last write is one line too
            message = exc_message(exc, args.output_dir)
            if message is None:
                raise
            print(f"marble evaluate: {message}", file=sys.stderr)
            return 2
        # Strict JSON: an undefined mean (NaN) is null (json.dumps would print NaN).
        print(json.dumps(json_safe({k: v for k, v in averages.items()
                                    if not k.startswith(("n_", "nan_", "na_", "failed_"))}), indent=1, allow_nan=False))
    failed = dist.broadcast_object(warn_failed(averages, names, Path(args.output_dir)) if info.is_main else None)
    dist.cleanup()
    return EXIT_INCOMPLETE if failed and not args.allow_failed_requests else 0

if __name__ == "__main__":
    raise SystemExit(main())
