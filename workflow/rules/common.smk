import glob
import json
import os
import re
from pathlib import Path

from snakemake.utils import min_version, validate

from marble.config import load_config

min_version("8.20")


# A --configfile replaces the embedded default instead of merging into it (Snakemake
# would merge dicts, so the tiny `runs:` would leak into the paper config).
if not workflow.config_settings.configfiles:

    configfile: "config.yaml"


validate(config, "../schemas/config.schema.yaml")

MODE = config["mode"]
MODEL_DIR = config["model_dir"]
RAW_DIR = config["raw_dir"]
DATASET_DIR = f"data/datasets/{config['dataset']['name']}"
# Inside the dataset folder, so DVC tracks tables and their embeddings as one output.
EMBED_DIR = f"{DATASET_DIR}/embeddings"
RUNS = config["runs"]
CLUSTER = config["cluster"]
EVAL = config["eval"]
TRAIN = config["train"]
MARBLE_ENV = "../envs/marble.yaml"


wildcard_constraints:
    run=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    ckpt=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    dataset=r"geneval|ocr|pickscore|drawbench",
    split=r"train|test",


# ------------------------------------------------------------------ training runs


def run_overrides(run):
    """The `--set` overrides every run gets: this workflow's model and tables win."""
    sets = [
        f"model.path={MODEL_DIR}",
        f"data.train={DATASET_DIR}/train.parquet",
        f"data.test={DATASET_DIR}/test.parquet",
    ]
    if config["dataset"]["embed"]:
        sets.append(f"data.embed_cache={EMBED_DIR}")
    return sets + list(RUNS[run]["set"])


def run_final_step(run):
    """The last optimizer step of a run: the name of its final checkpoint folder."""
    spec = RUNS[run]
    overrides = run_overrides(run)
    if spec["max_steps"] is not None:
        overrides.append(f"train.max_steps={spec['max_steps']}")
    return load_config(spec["preset"], overrides=overrides).train.max_steps


def final_ckpt(run):
    return f"checkpoint-{run_final_step(run):06d}"


def train_args(wildcards):
    """`marble train` arguments after the preset and output dir, shell-quoted."""
    spec = RUNS[wildcards.run]
    args = [f"--set {shlex_quote(s)}" for s in run_overrides(wildcards.run)]
    if spec["max_steps"] is not None:
        args.append(f"--max-steps {spec['max_steps']}")
    return " ".join(args)


def shlex_quote(text):
    import shlex

    return shlex.quote(str(text))


def train_resources():
    """One SLURM job for the whole run: a task per node, torchrun inside each task.

    `mpi` makes the plugin hand the job shell to us instead of `srun -n1` (we call
    srun ourselves); the plugin refuses `mpi` with a single task, so a one-node run
    keeps the plain path. `tasks_per_gpu=0` stops GPU jobs turning `tasks` into
    `--ntasks-per-gpu`. GPUs go through `gres`, which SLURM counts per node.
    """
    nodes, gpus = TRAIN["nodes"], TRAIN["gpus_per_node"]
    tasks = TRAIN["tasks"] or nodes
    per_node = " --ntasks-per-node=1" if tasks == nodes else ""
    # USR1 reaches job steps (our srun tasks), not a single-task job's batch shell.
    signal = f" --signal=USR1@{TRAIN['requeue_signal_s']}" if tasks > 1 else ""
    res = dict(
        nodes=nodes,
        tasks=tasks,
        cpus_per_task=TRAIN["cpus_per_task"],
        mem_mb=TRAIN["mem_mb"],
        runtime=TRAIN["runtime"],
        tasks_per_gpu=0,
        **cluster_resources(gpus),
    )
    # --requeue itself comes from the profile (slurm-requeue), so the plugin knows.
    extra = f"{signal}{per_node}".strip()
    if extra:
        res["slurm_extra"] = extra
    # "" still keeps the jobstep from wrapping us in `srun -n1` but asks sbatch for nothing.
    res["mpi"] = "srun" if tasks > 1 else ""
    return res


# ------------------------------------------------------------------ checkpoints to evaluate


def scanned_checkpoints():
    """{(run, ckpt): folder} of complete marble checkpoints under eval.scan_dirs.

    Globbed at every parse, so re-running a target picks up checkpoints saved since.
    Two folders with one run name (e.g. two scan dirs, each holding a `marble` run)
    get distinct names: the second is `<run>-<parent folder>` (never silently dropped).
    """
    found = {}
    for root in EVAL["scan_dirs"]:
        for marker in sorted(
            glob.glob(f"{root}/**/checkpoint-*/COMPLETE", recursive=True)
        ):
            folder = Path(marker).parent
            run_dir = (
                folder.parent.parent
                if folder.parent.name == "checkpoints"
                else folder.parent
            )
            name = run_dir.name
            # One of our own runs scanned through another spelling (absolute path).
            same = found.get((name, folder.name))
            if same is not None and os.path.samefile(same, folder):
                continue
            if same is not None:
                base = re.sub(r"[^A-Za-z0-9_.-]", "_", run_dir.parent.name) or "root"
                name, n = f"{name}-{base}", 2
                while (name, folder.name) in found:
                    name, n = f"{run_dir.name}-{base}{n}", n + 1
            found[(name, folder.name)] = str(folder)
    return found


HUB_PREFIX = "hf:"
LORA_DIR = "data/loras"


def hub_lora(source):
    """(repo id, revision) of an `hf:owner/repo[@revision]` entry, else None."""
    if not source.startswith(HUB_PREFIX):
        return None
    repo, _, revision = source[len(HUB_PREFIX) :].partition("@")
    return repo, revision or "main"


def checkpoint_label(source):
    """The <checkpoint> folder name of an eval.checkpoints entry."""
    if source == "base":
        return "base"
    hub = hub_lora(source)
    if hub:
        return re.sub(r"[^A-Za-z0-9_.-]", "_", f"hub-{hub[1]}")
    return Path(source).name or "lora"


def named_checkpoints():
    """{(name, label): source} from eval.checkpoints: a marble or peft/diffusers LoRA
    folder, `hf:owner/repo[@revision]` (a public LoRA, fetched on the login node), or
    `base` (the base model, no LoRA)."""
    return {
        (name, checkpoint_label(str(source))): str(source)
        for name, source in EVAL["checkpoints"].items()
    }


def final_checkpoints(only_trained=False):
    """{(run, ckpt): folder} of each configured run's final checkpoint.

    only_trained: just the runs whose final checkpoint is complete (its COMPLETE
    marker and the training summary), so `eval_only` never asks for training, whatever
    changed in `runs:`.
    """
    out = {}
    for run in RUNS:
        folder = f"results/runs/{run}/checkpoints/{final_ckpt(run)}"
        done = os.path.exists(f"{folder}/COMPLETE") and os.path.exists(
            f"results/runs/{run}/train_summary.json"
        )
        if only_trained and not done:
            continue
        out[(run, final_ckpt(run))] = folder
    return out


def eval_only_requested():
    targets = getattr(workflow.dag_settings, "targets", None)
    if targets is None:
        # At parse time Snakemake has not handed over the targets yet: the command line.
        import sys

        targets = sys.argv[1:]
    return "eval_only" in set(targets)


# Under `snakemake eval_only` train.smk defines no training job, so nothing it asks for can start
# a training job (a 2x8-GPU, 48 h job under the profile).
EVAL_ONLY = eval_only_requested()


def eval_catalogue():
    """Every checkpoint this workflow knows, with a clear error on a name clash."""
    catalogue = dict(final_checkpoints())
    for key, folder in {**scanned_checkpoints(), **named_checkpoints()}.items():
        old = catalogue.get(key, folder)
        if old != folder and not (
            os.path.exists(old) and os.path.samefile(old, folder)
        ):
            raise ValueError(
                f"config: checkpoint {key[0]}/{key[1]} names two folders: "
                f"{catalogue[key]} and {folder}; rename one in eval.checkpoints"
            )
        catalogue.setdefault(key, folder)
    return catalogue


def eval_settings_name():
    """The folder evaluations go to: named by every setting that changes the images.

    A change of steps, guidance, resolution, precision or model writes a new folder
    (results there stay valid), and so does a change of reward options (they change
    scores); limit and rewards are not in it: a larger limit resumes, a new reward
    re-scores the saved images in place.
    """
    import hashlib
    import json

    keys = ["num_inference_steps", "guidance_scale", "resolution", "mixed_precision"]
    settings = {k: EVAL[k] for k in keys}
    settings["model"] = os.path.normpath(MODEL_DIR)
    if EVAL["reward_options"]:  # absent when empty: folder names of earlier runs stay
        settings["reward_options"] = EVAL["reward_options"]
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[
        :8
    ]
    res = EVAL["resolution"] or "native"
    return (
        f"n{EVAL['num_inference_steps']}-r{res}-g{EVAL['guidance_scale']}"
        f"-{EVAL['mixed_precision']}-{digest}"
    )


EVAL_DIR = f"results/eval/{eval_settings_name()}"


def eval_outputs(keys):
    return [
        f"{EVAL_DIR}/{run}/{ckpt}/{ds}/average_scores.json"
        for run, ckpt in sorted(keys)
        for ds in EVAL["datasets"]
    ]


def eval_inputs(wildcards):
    """A configured run's final checkpoint waits for its training summary (the same
    input whatever the target, so Snakemake's input trigger never flips between `all`
    and `eval_only`; under eval_only no rule makes it, see train.smk); others must exist.
    """
    key = (wildcards.run, wildcards.ckpt)
    if key in final_checkpoints():
        return {"ready": f"results/runs/{wildcards.run}/train_summary.json"}
    catalogue = eval_catalogue()
    if key not in catalogue:
        raise ValueError(
            f"no checkpoint {key[0]}/{key[1]}: not a configured run's final checkpoint, "
            f"not in eval.checkpoints, not found under eval.scan_dirs"
        )
    folder = catalogue[key]
    if folder == "base":
        return {}
    if hub_lora(folder):
        return {"ready": f"{LORA_DIR}/{wildcards.run}"}
    marker = Path(folder) / "COMPLETE"
    return {"ready": str(marker) if marker.exists() else folder}


def eval_source_args(wildcards):
    """`marble evaluate` arguments naming what to evaluate (shell-quoted)."""
    source = eval_catalogue().get(
        (wildcards.run, wildcards.ckpt),
        f"results/runs/{wildcards.run}/checkpoints/{wildcards.ckpt}",
    )
    if source == "base":
        return ""
    if hub_lora(source):
        return f"--lora_hf_path {shlex_quote(f'{LORA_DIR}/{wildcards.run}')}"
    return f"--checkpoint_path {shlex_quote(source)}"


def hub_loras():
    """{name: (repo, revision)} of the hub LoRAs in eval.checkpoints."""
    return {
        name: hub_lora(str(source))
        for name, source in EVAL["checkpoints"].items()
        if hub_lora(str(source))
    }


def eval_processes():
    """Processes per evaluation job: eval.processes, else one per requested GPU, else 1."""
    gpus = EVAL["resources"]["gpus"] or 0
    processes = EVAL["processes"] or max(1, gpus)
    if gpus and processes > gpus:  # every rank takes cuda:LOCAL_RANK
        raise ValueError(
            f"config eval.processes={processes} > eval.resources.gpus={gpus}: "
            "each evaluation process needs its own GPU"
        )
    return processes


def eval_launcher():
    """`marble evaluate`, or torchrun on this node when an evaluation job runs several ranks
    (--standalone: a free local rendezvous port, so concurrent jobs do not collide)."""
    n = eval_processes()
    if n == 1:
        return "marble evaluate"
    return f"torchrun --standalone --nnodes 1 --nproc_per_node {n} -m marble.evaluate"


def eval_args(wildcards):
    args = [
        f"--num_inference_steps {EVAL['num_inference_steps']}",
        f"--guidance_scale {EVAL['guidance_scale']}",
        f"--mixed_precision {EVAL['mixed_precision']}",
    ]
    if EVAL["limit"] is not None:
        args.append(f"--limit {EVAL['limit']}")
    if EVAL["resolution"] is not None:
        args.append(f"--resolution {EVAL['resolution']}")
    if EVAL["save_images"]:
        args.append("--save_images")
    rewards = EVAL["rewards"].get(wildcards.dataset)
    if rewards:
        args.append(f"--rewards {shlex_quote(','.join(rewards))}")
    if EVAL["reward_options"]:  # inline JSON, quoted for the shell
        options = json.dumps(EVAL["reward_options"], sort_keys=True)
        args.append(f"--reward_options {shlex_quote(options)}")
    return " ".join(args)


def summary_inputs(wildcards):
    """`all` trains and evaluates every run; `eval_only` never trains: it takes the
    runs already trained plus the named and scanned checkpoints."""
    keys = set(final_checkpoints(eval_only_requested()))
    keys |= set(scanned_checkpoints()) | set(named_checkpoints())
    return eval_outputs(keys)


def cluster_resources(gpus):
    """SLURM partition, account, GPU type and constraint from `cluster:` (schema-checked
    words, so safe on the sbatch line). GPU jobs take gpu_partition and the constraint.
    """
    out = {}
    partition = (CLUSTER["gpu_partition"] or CLUSTER["partition"]) if gpus else None
    partition = partition or CLUSTER["partition"]
    if partition:
        out["slurm_partition"] = partition
    if CLUSTER["account"]:
        out["slurm_account"] = CLUSTER["account"]
    if gpus:
        kind = f"{CLUSTER['gpu_type']}:" if CLUSTER["gpu_type"] else ""
        out["gres"] = f"gpu:{kind}{gpus}"
        if CLUSTER["constraint"]:
            out["constraint"] = CLUSTER["constraint"]
    return out


def resources_of(section, key="resources"):
    res = config[section][key]
    out = dict(
        cpus_per_task=res["cpus_per_task"], mem_mb=res["mem_mb"], runtime=res["runtime"]
    )
    out.update(cluster_resources(res["gpus"]))
    return out
