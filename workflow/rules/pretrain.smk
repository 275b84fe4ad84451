# Tiny mode: build the tiny SD3 from configs and teach it to draw toy pictures of the
# training prompts (marble.models.pretrain), so RL has images that respond to it. A
# cached artefact like any other: change `pretrain:` in config.yaml and it reruns.

if MODE == "tiny":

    rule pretrain_tiny_model:
        input:
            table=f"{DATASET_DIR}/train.parquet",
        output:
            directory(MODEL_DIR),
        log:
            "logs/download/model.log",
        benchmark:
            "benchmarks/download/model.tsv"
        conda:
            MARBLE_ENV
        threads: 1
        resources:
            **resources_of("report"),
        params:
            vae=config["pretrain"]["vae_steps"],
            flow=config["pretrain"]["flow_steps"],
            seed=config["pretrain"]["seed"],
        shell:
            "marble models pretrain --table {input.table:q} --out {output:q}"
            " --vae-steps {params.vae:q} --flow-steps {params.flow:q} --seed {params.seed:q}"
            " --threads {threads} > {log:q} 2>&1"
