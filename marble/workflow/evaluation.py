"""`marble evaluate` as the workflow runs it: the settings folder, the launcher, the arguments."""

from __future__ import annotations

import hashlib
import json
import os
import shlex

# The settings that change the images (and so name the results folder).
IMAGE_SETTINGS = ("num_inference_steps", "guidance_scale", "resolution", "mixed_precision")


def settings_name(eval_cfg: dict, model_dir: str) -> str:
    """The folder evaluations go to: named by every setting that changes the images.

    A change of steps, guidance, resolution, precision or model writes a new folder (results
    there stay valid), and so does a change of reward options (they change scores); limit and
    rewards are not in it: a larger limit resumes, a new reward re-scores saved images in place.
    """
    settings = {k: eval_cfg[k] for k in IMAGE_SETTINGS}
    settings["model"] = os.path.normpath(model_dir)
    if eval_cfg["reward_options"]:  # absent when empty: folder names of earlier runs stay
        settings["reward_options"] = eval_cfg["reward_options"]
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]
    res = eval_cfg["resolution"] or "native"
    return (f"n{eval_cfg['num_inference_steps']}-r{res}-g{eval_cfg['guidance_scale']}"
            f"-{eval_cfg['mixed_precision']}-{digest}")


def processes(eval_cfg: dict) -> int:
    """Processes per evaluation job: eval.processes, else one per requested GPU, else 1."""
    gpus = eval_cfg["resources"]["gpus"] or 0
    n = eval_cfg["processes"] or max(1, gpus)
    if gpus and n > gpus:  # every rank takes cuda:LOCAL_RANK
        raise ValueError(f"config eval.processes={n} > eval.resources.gpus={gpus}: "
                         "each evaluation process needs its own GPU")
    return n


def launcher(n_processes: int) -> str:
    """`marble evaluate`, or torchrun on this node when a job runs several ranks
    (--standalone: a free local rendezvous port, so concurrent jobs do not collide)."""
    if n_processes == 1:
        return "marble evaluate"
    return f"torchrun --standalone --nnodes 1 --nproc_per_node {int(n_processes)} -m marble.evaluate"


def _quoted(value) -> str:
    """Every config value is quoted for the shell (a schema-checked number stays as written)."""
    return shlex.quote(str(value))


def evaluate_args(eval_cfg: dict, dataset: str) -> str:
    """The protocol and reward arguments of `marble evaluate` for one dataset, shell-quoted."""
    q = _quoted
    args = [f"--num_inference_steps {q(eval_cfg['num_inference_steps'])}",
            f"--guidance_scale {q(eval_cfg['guidance_scale'])}",
            f"--mixed_precision {q(eval_cfg['mixed_precision'])}"]
    if eval_cfg["limit"] is not None:
        args.append(f"--limit {q(eval_cfg['limit'])}")
    if eval_cfg["resolution"] is not None:
        args.append(f"--resolution {q(eval_cfg['resolution'])}")
    if eval_cfg["save_images"]:
        args.append("--save_images")
    rewards = eval_cfg["rewards"].get(dataset)
    if rewards:
        args.append(f"--rewards {shlex.quote(','.join(rewards))}")
    if eval_cfg["reward_options"]:  # inline JSON, quoted for the shell
        options = json.dumps(eval_cfg["reward_options"], sort_keys=True)
        args.append(f"--reward_options {shlex.quote(options)}")
    return " ".join(args)


def source_args(source: str, hub_lora_dir: str | None) -> str:
    """The `marble evaluate` arguments naming what to evaluate: nothing for the base model,
    `--lora_hf_path DIR` for a fetched hub LoRA, else `--checkpoint_path FOLDER`."""
    if source == "base":
        return ""
    if hub_lora_dir is not None:
        return f"--lora_hf_path {shlex.quote(hub_lora_dir)}"
    return f"--checkpoint_path {shlex.quote(source)}"
