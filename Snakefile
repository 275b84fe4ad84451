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


localrules:
    all,
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


# Compute nodes are often offline: downloads run where Snakemake runs (the login node).
if MODE == "paper" and config["cluster"]["local_downloads"]:

    localrules:
        download_model,
        download_reward_ckpts,
        download_prompts,


rule all:
    input:
        "results/report/report.md",
        "results/eval/summary.csv",
        "results/dvc",
        TABLE1_TARGETS,


# The stages of dvc.yaml, one target each.
rule prepare:
    input:
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
