# One training job per configured run. The declared output is only the summary file:
# Snakemake deletes declared outputs before a job starts, and the run folder holds the
# checkpoints a re-run resumes from.

# In both modes (tiny: a placeholder folder, datasets.smk), so `snakemake all` creates every
# path that dvc.yaml's train and evaluate stages depend on.
REWARD_INPUT = [config["reward_ckpt_dir"]]


if not EVAL_ONLY:

    rule train_run:
        input:
            model=MODEL_DIR,
            model_digest=digest_of(MODEL_DIR),
            train=f"{DATASET_DIR}/train.parquet",
            test=f"{DATASET_DIR}/test.parquet",
            embed=[EMBED_DIR] if config["dataset"]["embed"] else [],
            embed_digest=digests_of([EMBED_DIR] if config["dataset"]["embed"] else []),
            rewards=REWARD_INPUT,
            rewards_digest=digests_of(REWARD_INPUT),
        output:
            "results/runs/{run}/train_summary.json",
        log:
            "logs/train/{run}.log",
        benchmark:
            "benchmarks/train/{run}.tsv"
        conda:
            MARBLE_ENV
        threads: TRAIN["cpus_per_task"]
        resources:
            **train_resources(),
        params:
            preset=lambda wc: RUNS[wc.run]["preset"],
            run_dir=lambda wc, output: os.path.dirname(output[0]),
            args=train_args,
            gpus=TRAIN["gpus_per_node"],
            port=TRAIN["port"] or "",  # "": torchrun_slurm.sh derives it from the job id
            reward_ckpts=reward_ckpts,
        shell:
            "MARBLE_REWARD_CKPTS={params.reward_ckpts:q} MARBLE_GPUS_PER_NODE={params.gpus:q} MARBLE_RDZV_PORT={params.port:q}"
            " MARBLE_NODES={resources.nodes:q} MARBLE_TASKS={resources.tasks:q}"
            " MARBLE_CPUS_PER_TASK={resources.cpus_per_task:q}"
            " bash workflow/scripts/train_launch.sh {resources.mpi:q} --"
            " --preset {params.preset:q} --output-dir {params.run_dir:q} {params.args}"
            " >> {log:q} 2>&1"
