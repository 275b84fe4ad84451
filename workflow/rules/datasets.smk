# Assembled tables (prompt records + per-reward masks) and, in paper mode, the
# text-embedding cache that spares the text encoders during training.


rule assemble_split:
    input:
        raw=RAW_DIR,
        raw_digest=digest_of(RAW_DIR),
    output:
        table=f"{DATASET_DIR}/{{split}}.parquet",
        summary=f"{DATASET_DIR}/{{split}}_summary.csv",
    log:
        "logs/datasets/assemble_{split}.log",
    benchmark:
        "benchmarks/datasets/assemble_{split}.tsv"
    conda:
        MARBLE_ENV
    resources:
        **resources_of("report"),
    params:
        out_dir=lambda wc, output: os.path.dirname(output.table),
        preset=config["dataset"]["preset"],
        # dataset.rewards: masks for these (a config's own reward too), else the preset's
        rewards=wf_runs.option(
            "--rewards", ",".join(config["dataset"]["rewards"] or [])
        ),
    shell:
        "marble data assemble --raw-dir {input.raw:q} --out-dir {params.out_dir:q}"
        " --split {wildcards.split} --preset {params.preset:q} {params.rewards} > {log:q} 2>&1"


rule embed_prompts:
    input:
        train=f"{DATASET_DIR}/train.parquet",
        test=f"{DATASET_DIR}/test.parquet",
        model=MODEL_DIR,
        model_digest=digest_of(MODEL_DIR),
    output:
        directory(EMBED_DIR),
    log:
        "logs/datasets/embed.log",
    benchmark:
        "benchmarks/datasets/embed.tsv"
    conda:
        MARBLE_ENV
    threads: config["dataset"]["embed_resources"]["cpus_per_task"]
    resources:
        **resources_of("dataset", "embed_resources"),
    params:
        device=config["dataset"]["embed_device"],
        dtype=config["dataset"]["embed_dtype"],
    shell:
        "marble data embed --table {input.train:q} --table {input.test:q}"
        " --model {input.model:q} --out {output:q}"
        " --device {params.device:q} --dtype {params.dtype:q} > {log:q} 2>&1"


if MODE == "tiny":

    # The toy rewards need no checkpoints; the folder exists so the prepare stage
    # (dvc.yaml) has the same outputs in both modes.
    rule tiny_reward_ckpts:
        output:
            directory(config["reward_ckpt_dir"]),
        log:
            "logs/download/rewards.log",
        conda:
            MARBLE_ENV
        shell:
            "mkdir -p {output:q} && echo 'toy rewards: no checkpoints'"
            " > {output:q}/README.txt 2> {log:q}"
