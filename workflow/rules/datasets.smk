# Assembled tables (prompt records + per-reward masks) and, in paper mode, the
# text-embedding cache that spares the text encoders during training.


rule assemble_split:
    input:
        raw=RAW_DIR,
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
    shell:
        "marble data assemble --raw-dir {input.raw:q} --out-dir {params.out_dir:q}"
        " --split {wildcards.split} --preset {params.preset:q} > {log:q} 2>&1"


rule embed_prompts:
    input:
        train=f"{DATASET_DIR}/train.parquet",
        test=f"{DATASET_DIR}/test.parquet",
        model=MODEL_DIR,
    output:
        directory(EMBED_DIR),
    log:
        "logs/datasets/embed.log",
    benchmark:
        "benchmarks/datasets/embed.tsv"
    conda:
        MARBLE_ENV
    resources:
        **resources_of("eval"),
    shell:
        "marble data embed --table {input.train:q} --table {input.test:q}"
        " --model {input.model:q} --out {output:q} > {log:q} 2>&1"
