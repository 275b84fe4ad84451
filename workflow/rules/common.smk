import os
from pathlib import Path

from snakemake.utils import min_version, validate

from marble.workflow import checkpoints as wf_ckpts
from marble.workflow import evaluation as wf_eval
from marble.workflow import runs as wf_runs
from marble.workflow import slurm as wf_slurm

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
# The logic lives in marble.workflow (pure, unit-tested); these bind this workflow's config.


def run_overrides(run):
    embed = EMBED_DIR if config["dataset"]["embed"] else None
    return wf_runs.run_overrides(RUNS[run], MODEL_DIR, DATASET_DIR, embed)


def final_ckpt(run):
    return wf_runs.checkpoint_name(wf_runs.final_step(RUNS[run], run_overrides(run)))


def train_args(wildcards):
    return wf_runs.train_args(RUNS[wildcards.run], run_overrides(wildcards.run))


def train_resources():
    return wf_slurm.train_resources(TRAIN, CLUSTER)


def resources_of(section, key="resources"):
    return wf_slurm.job_resources(config[section][key], CLUSTER)


# ------------------------------------------------------------------ checkpoints to evaluate

LORA_DIR = "data/loras"


def scanned_checkpoints():
    return wf_ckpts.scanned_checkpoints(EVAL["scan_dirs"])


def named_checkpoints():
    return wf_ckpts.named_checkpoints(EVAL["checkpoints"])


def hub_loras():
    return wf_ckpts.hub_loras(EVAL["checkpoints"])


def final_checkpoints(only_trained=False):
    """{(run, ckpt): folder} of each configured run's final checkpoint.

    only_trained: just the runs whose final checkpoint is complete (its COMPLETE marker and
    the training summary), so `eval_only` never asks for training, whatever changed in `runs:`.
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
    return wf_ckpts.merge_catalogue(
        final_checkpoints(), scanned_checkpoints(), named_checkpoints()
    )


EVAL_DIR = f"results/eval/{wf_eval.settings_name(EVAL, MODEL_DIR)}"


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
    if folder == wf_ckpts.BASE:
        return {}
    if wf_ckpts.hub_source(folder):
        return {"ready": f"{LORA_DIR}/{wildcards.run}"}
    marker = Path(folder) / "COMPLETE"
    return {"ready": str(marker) if marker.exists() else folder}


def eval_source_args(wildcards):
    source = eval_catalogue().get(
        (wildcards.run, wildcards.ckpt),
        f"results/runs/{wildcards.run}/checkpoints/{wildcards.ckpt}",
    )
    hub_dir = f"{LORA_DIR}/{wildcards.run}" if wf_ckpts.hub_source(source) else None
    return wf_eval.source_args(source, hub_dir)


def eval_launcher():
    return wf_eval.launcher(wf_eval.processes(EVAL))


def eval_args(wildcards):
    return wf_eval.evaluate_args(EVAL, wildcards.dataset)


def summary_inputs(wildcards):
    """`all` trains and evaluates every run; `eval_only` never trains: it takes the
    runs already trained plus the named and scanned checkpoints."""
    keys = set(final_checkpoints(eval_only_requested()))
    keys |= set(scanned_checkpoints()) | set(named_checkpoints())
    return eval_outputs(keys)
