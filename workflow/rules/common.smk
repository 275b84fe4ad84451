import json
import os
import shlex
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version, validate

from marble import rewards as wf_rewards
from marble.workflow import checkpoints as wf_ckpts
from marble.workflow import claim as wf_claim
from marble.workflow import configs as wf_configs
from marble.workflow import evaluation as wf_eval
from marble.workflow import plan as wf_plan
from marble.workflow import digests as wf_digests
from marble.workflow import runs as wf_runs
from marble.workflow import slurm as wf_slurm
from marble.workflow.interrupts import (
    forward_interrupt_to_jobs,
    release_locks_uninterrupted,
)

min_version("8.20")

# `kill -INT <snakemake pid>` stops the jobs too, not Snakemake alone (marble/workflow/interrupts.py).
forward_interrupt_to_jobs()
# A Ctrl-C while Snakemake deletes its locks would leave one behind (the same module).
release_locks_uninterrupted()


# A --configfile replaces the embedded default instead of merging into it (Snakemake
# would merge dicts, so the tiny `runs:` would leak into the paper config).
if not workflow.config_settings.configfiles:

    configfile: "config.yaml"


# config/paper.yaml & co. are overlays on config/eval.yaml (`overlay_on:`): the base goes beneath
# them here, so one --configfile is complete, never the schema's default eval protocol.
# the lowest layer, for the file names of schema errors
_BASE = config.get(wf_configs.OVERLAY_KEY)
_FILES = [str(f) for f in workflow.config_settings.configfiles] or ["config.yaml"]
_CONFIG_LAYERS = ([_BASE] if _BASE else []) + _FILES
# Snakemake reads a --configfile with a YAML reader that keeps the last of a key given twice:
# each file is read again with marble's (marble.config_parse.load_yaml), which refuses it.
for _layer in _CONFIG_LAYERS:
    try:
        wf_configs.read_yaml(_layer)
    except SystemExit as err:
        raise WorkflowError(f"config {err}") from None
wf_configs.compose_in_place(config)
try:
    validate(config, "../schemas/config.schema.yaml")
except WorkflowError as err:  # one line, naming the config file that sets the bad key
    from marble.workflow.doctor_checks import schema_error_line

    raise WorkflowError(
        f"config error: {schema_error_line(str(err), _CONFIG_LAYERS)}"
    ) from None

# The config's own rewards (`rewards:`, by import path): registered here and, through the
# environment, in every job (marble/rewards/user.py): register() would last this process only.
try:
    wf_rewards.register_config(config["rewards"])
except ValueError as err:
    raise WorkflowError(f"config error: {err}") from None

MODE = config["mode"]
MODEL_DIR = config["model_dir"]
RAW_DIR = config["raw_dir"]
# Each benchmark's prompt file by content: the evaluations' input (an edit in place leaves the
# folder's date alone), brought up to date whenever this file is read (marble.workflow.digests).
# Only by the main process: a job re-reading this file on a node must not redate a digest
# while another job is still writing what it covers.
PROMPT_DIGESTS = wf_digests.PROMPT_DIGEST_DIR
# (a Snakemake without the attribute runs jobs in the main process)
MAIN_PROCESS = getattr(workflow, "is_main_process", True)
if MAIN_PROCESS:
    wf_digests.sync_prompt_digests(RAW_DIR, PROMPT_DIGESTS)

# Every input folder a rule reads (base models, reward checkpoints, raw prompts, embeddings,
# LoRA folders, the judge) by content, for the same reason: `digest_of(folder)` is the digest
# file a rule takes beside the folder, brought up to date the first time this process names
# it (the declarations of rules at parse time, input functions while the DAG is built; both before
# Snakemake compares dates). DIGEST_FOLDERS maps it back for rule folder_digest.
DIGEST_FOLDERS = {}


def digest_of(folder):
    path = wf_digests.folder_digest_path(folder)
    if path not in DIGEST_FOLDERS and MAIN_PROCESS:
        wf_digests.sync_folder_digests([folder])
    DIGEST_FOLDERS[path] = folder
    return path


def digests_of(folders):
    return [digest_of(f) for f in folders]


DATASET_DIR = f"data/datasets/{config['dataset']['name']}"
# Inside the dataset folder, so DVC tracks tables and their embeddings as one output.
EMBED_DIR = f"{DATASET_DIR}/embeddings"
# A run nulled by an overlay (`runs.<name>: null`) is not trained with this config.
RUNS = wf_runs.configured(config["runs"])
CLUSTER = config["cluster"]
EVAL = config["eval"]
TRAIN = config["train"]
MARBLE_ENV = "../envs/marble.yaml"


# The image every rule's command runs in under `--sdm apptainer` (docs/container.md):
# cluster.container, null by default, so a run without that flag (the default and slurm
# profiles) never sees a container. Set before the rules: a global directive covers only
# the rules defined after it.
container: CLUSTER["container"]


wildcard_constraints:
    run=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    ckpt=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    dataset=r"geneval|ocr|pickscore|drawbench",
    settings=r"n[0-9]+-[^/]+",
    hubmodel=r"[^/]+",
    split=r"train|test",


# ------------------------------------------------------------------ training runs
# The logic lives in marble.workflow (pure, unit-tested); these bind this workflow's config.


def run_overrides(run):
    embed = EMBED_DIR if config["dataset"]["embed"] else None
    return wf_runs.run_overrides(RUNS[run], MODEL_DIR, DATASET_DIR, embed)


def table1_choice():
    """Table 1's open choices (eval.table1_geneval, eval.table1_prompts) as arguments."""
    return "--geneval {} --prompts {}".format(
        shlex.quote(EVAL["table1_geneval"]), shlex.quote(EVAL["table1_prompts"])
    )


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

    only_trained: just the runs whose final checkpoint is usable (marker and hashes, the
    definition resume uses) and whose training summary exists, so `eval_only` never asks
    for training, whatever changed in `runs:`.
    """
    out = {}
    for run in RUNS:
        folder = f"results/runs/{run}/checkpoints/{final_ckpt(run)}"
        done = only_trained and (
            os.path.exists(f"results/runs/{run}/train_summary.json")
            and wf_ckpts.is_usable(folder)
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


wf_eval.check_protocol_names(
    EVAL,
    {run for run, _ in eval_catalogue()},
    dropped=set(config["runs"]) | set(EVAL["checkpoints"]),
)


# With eval.published (the Table 1 rows), every evaluating target also writes Table 1.
TABLE1_TARGETS = ["results/eval/table1.md"] if EVAL["published"] else []

# The settings folder of rows without their own eval.protocols entry.
EVAL_DIR = f"results/eval/{wf_eval.settings_name(EVAL, MODEL_DIR)}"


def row_protocol(name):
    return wf_eval.row_protocol(EVAL, name)


def row_model_dir(name):
    return wf_eval.model_folder(row_protocol(name), MODEL_DIR)


def eval_outputs(keys):
    return wf_eval.eval_targets(EVAL, keys, MODEL_DIR)


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
        folder = f"{LORA_DIR}/{wildcards.run}"
        return {"ready": folder, "ready_digest": digest_of(folder)}
    ready = wf_ckpts.checkpoint_input(folder)
    if ready != folder:  # a marble checkpoint: its marker holds every file's sha256
        return {"ready": ready}
    return {"ready": folder, "ready_digest": digest_of(folder)}  # a bare LoRA folder


def eval_source_args(wildcards):
    source = eval_catalogue().get(
        (wildcards.run, wildcards.ckpt),
        f"results/runs/{wildcards.run}/checkpoints/{wildcards.ckpt}",
    )
    hub_dir = f"{LORA_DIR}/{wildcards.run}" if wf_ckpts.hub_source(source) else None
    return wf_eval.source_args(source, hub_dir)


def judge_input(dataset):
    """The judge's weights, for the evaluations that start it (marble.rewards.service)."""
    folder = wf_eval.judge_folder(EVAL)
    if not (folder and wf_eval.needs_judge(EVAL, dataset)):
        return []
    return [folder, digest_of(folder)]


def eval_launcher():
    return wf_eval.launcher(wf_eval.processes(EVAL))


def eval_args(wildcards):
    expected = wf_eval.row_settings(EVAL, wildcards.run, MODEL_DIR)
    if (
        wildcards.settings != expected
    ):  # a folder of another protocol: never mislabel results
        raise ValueError(
            f"{wildcards.run} is evaluated under results/eval/{expected}, "
            f"not results/eval/{wildcards.settings}"
        )
    return wf_eval.evaluate_args(row_protocol(wildcards.run), wildcards.dataset)


def summary_keys():
    """`all` trains and evaluates every run; `eval_only` never trains: it takes the
    runs already trained plus the named and scanned checkpoints."""
    keys = set(final_checkpoints(eval_only_requested()))
    return keys | set(scanned_checkpoints()) | set(named_checkpoints())


# `eval_only` with nothing to evaluate (a fresh project: no run trained, no checkpoint named or
# found) failed inside the summary's job with "--eval-dir ... does not exist": said here instead,
# as the error of a real run and a warning of a dry run (which still shows the plan).
NOTHING_TO_EVALUATE = (
    "eval_only: nothing to evaluate yet: no configured run has finished training "
    "(results/runs/<run>/train_summary.json and a usable final checkpoint), eval.checkpoints "
    "names no checkpoint and eval.scan_dirs finds none; train first (`snakemake -c2 train`) "
    "or name checkpoints in eval.checkpoints"
)
if EVAL_ONLY and not summary_keys():
    if not wf_plan.is_dry_run(sys.argv[1:]):
        raise WorkflowError(NOTHING_TO_EVALUATE)
    print(f"warning: {NOTHING_TO_EVALUATE}", file=sys.stderr)


def summary_inputs(wildcards):
    return eval_outputs(summary_keys())


def table1_inputs(wildcards):
    """The evaluations of the rows eval.published names (Table 1 trains nothing else)."""
    rows = wf_eval.published_runs(EVAL["published"])
    return eval_outputs({key for key in summary_keys() if key[0] in rows})


def summary_dirs():
    """--eval-dir arguments of the summary: every settings folder the evaluations land in."""
    dirs = wf_eval.eval_dirs(eval_outputs(summary_keys())) or [EVAL_DIR]
    return " ".join(f"--eval-dir {shlex.quote(d)}" for d in dirs)


# ------------------------------------------------------------------ the paper's tables

TABLE_RUNS = wf_plan.table_runs(RUNS, MODE)
TABLES_DIR = "results/tables"
# `marble bench flops` (counted FLOPs, no GPU needed) when it exists: cost shows its ratios
# where no GPU timed the bench.
FLOPS_JSON = "results/bench/flops.json"


def table_files(name):
    return [f"{TABLES_DIR}/{name}.{ext}" for ext in ("csv", "md", "json")]


def table_evals(table):
    return eval_outputs({(run, final_ckpt(run)) for run in TABLE_RUNS[table]})


def table_summaries(table):
    return [f"results/runs/{run}/train_summary.json" for run in TABLE_RUNS[table]]


def table1_files():
    """Table 1 composes by its target's name: its files when a `table1` rule exists."""
    if (
        not workflow.is_rule("table1") or not TABLE1_TARGETS
    ):  # no published rows: no Table 1
        return []
    return list(rules.table1.output or rules.table1.input)


# A dry run (`snakemake -n ...`) prints what its jobs cost before anything is submitted: the
# jobs Snakemake lists (this target's, unfinished), priced when it closes its log.
if wf_plan.is_dry_run(sys.argv[1:]):
    from snakemake.logging import logger as _smk_logger

    from marble.workflow import plan_log

    plan_log.attach(_smk_logger, config, Path.cwd())
    # An unpinned hub reference (PIN-A-COMMIT, @main) fails its fetch and the preflight.
    from marble.workflow.doctor_checks import unpinned_hub_references

    for _key, _ref in unpinned_hub_references(config).items():
        print(
            f"warning: {_key} = {_ref} is not pinned to a commit: the preflight fails on it"
            " (pin a 40-hex commit, or null the row)",
            file=sys.stderr,
        )


def reward_ckpts(wildcards, input):
    """MARBLE_REWARD_CKPTS of a job: its own `rewards` input (paper mode), so the path follows
    what the job was given; the configured placeholder otherwise (toy rewards read none).
    """
    return input.rewards[0] if input.rewards else config["reward_ckpt_dir"]
