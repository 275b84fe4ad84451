# marble: MARBLE multi-reward RL on DiffusionNFT, as a Snakemake workflow.
#   snakemake -c2                      tiny default: nothing -> report, CPU, no network
#   snakemake -c2 eval_only            evaluate known checkpoints, refresh the summary
#   snakemake --profile slurm all --configfile config/paper.yaml
#   snakemake --profile slurm paper_tables --configfile config/paper.yaml   (-n: plan + GPU-hours)
# See docs/workflow.md.


include: "workflow/rules/common.smk"
include: "workflow/rules/digests.smk"
include: "workflow/rules/download.smk"
include: "workflow/rules/datasets.smk"
include: "workflow/rules/pretrain.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/paper_tables.smk"
include: "workflow/rules/claim.smk"
include: "workflow/rules/zoo.smk"


from marble.workflow import preflight as wf_preflight
from marble.workflow import slurm_capacity as wf_capacity

PREFLIGHT = "results/preflight.txt"
# the resolved config the doctor checked, and a nonce renewed whenever the gate file is missing
PREFLIGHT_CONFIG = "results/preflight.config.json"
PREFLIGHT_REQUEST = "results/preflight.request"


localrules:
    all,
    preflight,
    dvc_views,
    prepare,
    train,
    evaluate,
    eval_only,
    report,
    rho_ablation,
    harmony,
    cost,
    paper_tables,
    claim,
    zoo,


# Compute nodes are often offline: downloads run where Snakemake runs (the login node).
if MODE == "paper" and config["cluster"]["local_downloads"]:

    localrules:
        download_model,
        download_reward_ckpts,
        download_prompts,


rule all:
    input:
        "results/preflight.txt",
        "results/report/report.md",
        "results/eval/summary.csv",
        "results/dvc",
        TABLE1_TARGETS,


# Before anything is downloaded or queued, the submit host checks that this config can
# run (marble doctor: rewards, checkpoints, torch pairing, GPU arch, HF_TOKEN, disk,
# cluster:). A failure stops the run with a table naming each missing piece and its fix;
# files the workflow downloads itself are only warned about (--downloads-pending).
# Its input is the resolved configuration (marble.workflow.preflight): a changed config
# reruns it; every other rule waits for its output (the gate at the end of this file).
_DUE = wf_preflight.prepare_gate(
    PREFLIGHT,
    PREFLIGHT_CONFIG,
    PREFLIGHT_REQUEST,
    config,
    execute=wf_preflight.executes(sys.argv[1:], wf_plan.is_dry_run(sys.argv[1:])),
    configfiles=workflow.config_settings.configfiles or [],
    # The named targets (eval_only, train, ...): the doctor checks the SLURM jobs they submit;
    # a DVC stage names the whole pipeline's (marble.workflow.dvc_sync).
    targets=wf_capacity.named_targets(
        os.environ.get("MARBLE_PREFLIGHT_TARGETS", "").split()
        or getattr(workflow.dag_settings, "targets", None)
        or sys.argv[1:]
    ),
)
if _DUE and wf_plan.is_dry_run(sys.argv[1:]):
    print(f"preflight: marble doctor runs first ({_DUE})", file=sys.stderr)


checkpoint preflight:
    input:
        config=PREFLIGHT_CONFIG,
        request=PREFLIGHT_REQUEST,
    output:
        PREFLIGHT,
    log:
        "logs/preflight.log",
    priority: 1000
    conda:
        "workflow/envs/marble.yaml"  # relative to this file (MARBLE_ENV is to common.smk)
    # The doctor reads the snapshot (the resolved config and the --configfile list): no params,
    # whose change would be a rerun trigger even in a dry run (marble.workflow.preflight).
    shell:
        "marble doctor --downloads-pending --snapshot {input.config:q} > {output:q} 2> {log:q}"
        " || {{ cat {output:q} {log:q}; exit 1; }}; cat {output:q}"


# The stages of dvc.yaml, one target each.
rule prepare:
    input:
        "results/preflight.txt",
        MODEL_DIR,
        RAW_DIR,
        config["reward_ckpt_dir"],
        expand(f"{DATASET_DIR}/{{split}}.parquet", split=["train", "test"]),
        [EMBED_DIR] if config["dataset"]["embed"] else [],


rule train:
    input:
        expand("results/runs/{run}/train_summary.json", run=RUNS),


rule evaluate:
    input:
        "results/eval/summary.csv",
        TABLE1_TARGETS,


rule eval_only:
    input:
        "results/eval/summary.csv",
        ["results/eval/paper_comparison.md"] if EVAL["published"] else [],
        TABLE1_TARGETS,


rule report:
    input:
        "results/report/report.md",
        "results/dvc",


# The gate: every rule (all of the above, and any include added above this line) waits for
# the preflight checkpoint's output (marble.workflow.preflight). ancient(): an existing gate
# file never makes a finished job rerun; nothing downloads, fetches or is submitted before
# the doctor passed (tests/test_preflight.py walks each target's DAG and runs it with stub
# SLURM). A dry run never makes it due (it would hide the plan): it prints why the doctor
# runs first instead (marble.workflow.preflight.prepare_gate).
wf_preflight.gate_rules(
    workflow.rules,
    "preflight",
    lambda: ancient(lambda wildcards: checkpoints.preflight.get().output[0]),
    workflow.modifier.path_modifier,
)
