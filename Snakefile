# marble: MARBLE multi-reward RL on DiffusionNFT, as a Snakemake workflow.
#   snakemake -c2                      tiny default: nothing -> report, CPU, no network
#   snakemake -c2 eval_only            evaluate known checkpoints, refresh the summary
#   snakemake --profile slurm all --configfile config/paper.yaml
#   snakemake --profile slurm paper_tables --configfile config/paper.yaml   (-n: plan + GPU-hours)
# See docs/workflow.md.


include: "workflow/rules/common.smk"
include: "workflow/rules/download.smk"
include: "workflow/rules/datasets.smk"
include: "workflow/rules/pretrain.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/paper_tables.smk"
include: "workflow/rules/claim.smk"


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
rule preflight:
    output:
        "results/preflight.txt",
    log:
        "logs/preflight.log",
    priority: 1000
    conda:
        "workflow/envs/marble.yaml"  # relative to this file (MARBLE_ENV is to common.smk)
    params:
        configfiles=wf_runs.doctor_args(workflow.config_settings.configfiles),
    shell:
        "marble doctor --downloads-pending {params.configfiles} > {output:q} 2> {log:q}"
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
