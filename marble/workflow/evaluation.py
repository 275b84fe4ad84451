"""`marble evaluate` as the workflow runs it: the settings folder, the launcher, the arguments."""

from __future__ import annotations

import hashlib
import json
import os
import shlex

from marble.config_parse import load_yaml
from marble.assets.hub_ref import is_hub_ref, parse_hub_ref, pinned_revision  # noqa: F401
from marble.evaluation.datasets import DEFAULT_REWARDS
from marble.rewards import descriptors

# The settings that change the images (and so name the results folder).
IMAGE_SETTINGS = ("num_inference_steps", "guidance_scale", "resolution", "mixed_precision")
# What one row's `eval.protocols.<name>` may set: the image settings, the base model (a folder
# or `hf:owner/repo@commit`) and its pipeline kind, and the datasets it is evaluated on.
PROTOCOL_KEYS = (*IMAGE_SETTINGS, "model", "model_type", "datasets")
MODEL_TYPES = ("sd3", "generic")
HUB_MODEL_DIR = "data/models/hub"

# The reward scored by a served judge (its descriptor's `judge`); `eval.<JUDGE>` configures
# its server and weights.
JUDGE = next(d.name for d in descriptors() if d.judge)


def row_protocol(eval_cfg: dict, name: str) -> dict:
    """The eval settings of one row (run or eval.checkpoints name): `eval.protocols[name]`
    over the global `eval` ones, so each Table 1 row is generated under its own protocol."""
    override = (eval_cfg.get("protocols") or {}).get(name) or {}
    unknown = sorted(set(override) - set(PROTOCOL_KEYS))
    if unknown:
        raise ValueError(f"config eval.protocols.{name}: unknown key(s) {unknown}; known: {list(PROTOCOL_KEYS)}")
    row = {**eval_cfg, "model": None, "model_type": "sd3", **override}
    if row["model_type"] not in MODEL_TYPES:
        raise ValueError(f"config eval.protocols.{name}.model_type: {row['model_type']!r} not in {MODEL_TYPES}")
    return row


def hub_model_folder(model: str) -> str:
    """Where a hub base model `hf:owner/repo@commit` is fetched (one folder per repo and commit)."""
    repo, revision = parse_hub_ref(model)
    return f"{HUB_MODEL_DIR}/{repo.replace('/', '--')}-{(revision or 'main')[:12]}"


def model_folder(row: dict, default_model_dir: str) -> str:
    """The local base-model folder a row evaluates (the workflow's model when the row names none)."""
    model = row.get("model")
    if not model:
        return default_model_dir
    return hub_model_folder(model) if is_hub_ref(model) else model


def hub_models(eval_cfg: dict) -> dict:
    """{folder name under HUB_MODEL_DIR: (ref, is a diffusers pipeline)} of every hub model the
    evaluations need: each row's base model, and the UnifiedReward judge's weights."""
    out = {}
    dropped = {name for name, source in (eval_cfg.get("checkpoints") or {}).items() if source is None}
    for name, spec in (eval_cfg.get("protocols") or {}).items():
        model = None if name in dropped else (spec or {}).get("model")  # a nulled row fetches nothing
        if model and is_hub_ref(model):
            out[hub_model_folder(model).rsplit("/", 1)[1]] = (model, True)
    judge = (eval_cfg.get(JUDGE) or {}).get("model")
    if judge and is_hub_ref(judge):
        out[hub_model_folder(judge).rsplit("/", 1)[1]] = (judge, False)
    return out


def judge_folder(eval_cfg: dict) -> str | None:
    """The UnifiedReward judge's local weights folder (fetched when given as `hf:`), or None."""
    model = (eval_cfg.get(JUDGE) or {}).get("model")
    if not model:
        return None
    return hub_model_folder(model) if is_hub_ref(model) else model


def needs_judge(eval_cfg: dict, dataset: str) -> bool:
    """Whether this dataset's evaluation scores unifiedreward with a workflow-managed judge."""
    names = eval_cfg["rewards"].get(dataset) or DEFAULT_REWARDS[dataset]
    return JUDGE in names and bool((eval_cfg.get(JUDGE) or {}).get("server"))


def service_prefix(eval_cfg: dict, dataset: str) -> str:
    """`python -m marble.rewards.service ... --` before an evaluation that needs the judge
    (the sidecar starts, is health-checked, serves this job, stops), else nothing."""
    if not needs_judge(eval_cfg, dataset):
        return ""
    judge = eval_cfg[JUDGE]
    args = ["python -m marble.rewards.service", f"--server {shlex.quote(judge['server'])}"]
    if judge_folder(eval_cfg):
        args.append(f"--model {shlex.quote(judge_folder(eval_cfg))}")
    args.append(f"--ready-timeout {shlex.quote(str(judge.get('ready_timeout_s') or 1800))}")
    return " ".join(args) + " --"


def settings_name(eval_cfg: dict, model_dir: str) -> str:
    """The folder evaluations go to: named by every setting that changes the images.

    A change of steps, guidance, resolution, precision or model writes a new folder (results
    there stay valid), and so does a change of reward options (they change scores); limit and
    rewards are not in it: a larger limit resumes, a new reward re-scores saved images in place.
    """
    settings = {k: eval_cfg[k] for k in IMAGE_SETTINGS}
    settings["model"] = os.path.normpath(model_dir)
    if eval_cfg.get("model_type", "sd3") != "sd3":  # absent for sd3: earlier folder names stay
        settings["model_type"] = eval_cfg["model_type"]
    if eval_cfg.get("numerics", "marble") != "marble":  # other numerics, other images
        settings["numerics"] = eval_cfg["numerics"]
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
    args = [f"--model_type {q(eval_cfg.get('model_type', 'sd3'))}",
            f"--num_inference_steps {q(eval_cfg['num_inference_steps'])}",
            f"--guidance_scale {q(eval_cfg['guidance_scale'])}",
            f"--mixed_precision {q(eval_cfg['mixed_precision'])}",
            f"--numerics {q(eval_cfg.get('numerics', 'marble'))}"]
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


def row_settings(eval_cfg: dict, name: str, default_model_dir: str) -> str:
    """The settings folder of one row's evaluations (its own protocol and model)."""
    row = row_protocol(eval_cfg, name)
    return settings_name(row, model_folder(row, default_model_dir))


def eval_targets(eval_cfg: dict, keys, default_model_dir: str) -> list[str]:
    """average_scores.json of every (run, ckpt) x its row's datasets, each under its row's
    settings folder: `results/eval/<settings>/<run>/<ckpt>/<dataset>/average_scores.json`."""
    out = []
    for run, ckpt in sorted(keys):
        settings = row_settings(eval_cfg, run, default_model_dir)
        out += [f"results/eval/{settings}/{run}/{ckpt}/{ds}/average_scores.json"
                for ds in row_protocol(eval_cfg, run)["datasets"]]
    return out


def published_runs(published: str | None) -> set[str]:
    """The run / eval.checkpoints names the rows of an eval.published file name (`run:`), so
    Table 1 waits for its own rows' evaluations only (not the rho ablation's, say). The rows'
    full validation is marble.report.published.load_published's, run by the table1 job."""
    if not published:
        return set()

    rows = (load_yaml(open(published, encoding="utf-8")) or {}).get("rows") or {}
    return {str(row["run"]) for row in rows.values() if isinstance(row, dict) and "run" in row}


def eval_dirs(targets: list[str]) -> list[str]:
    """The settings folders holding `targets` (results/eval/<settings>), sorted, distinct."""
    return sorted({"/".join(t.split("/")[:3]) for t in targets})


def check_protocol_names(eval_cfg: dict, known, dropped=()) -> None:
    """A protocol for a row nobody evaluates is a typo: a one-line error naming it. `dropped`:
    rows an overlay nulled (`runs.<name>: null`, `eval.checkpoints.<name>: null`); their
    protocols stay in the base config and are no typo."""
    unknown = sorted(set(eval_cfg.get("protocols") or {}) - set(known) - set(dropped))
    if unknown:
        raise ValueError(f"config eval.protocols: {unknown} name no run, eval.checkpoints entry "
                         f"or scanned run (known: {sorted(known)})")
