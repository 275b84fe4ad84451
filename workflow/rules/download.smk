# Inputs: the model, reward checkpoints and raw prompt files. Tiny mode builds the
# model from configs and generates prompts (no network); paper mode downloads.


if MODE == "tiny":

    # The tiny model itself: workflow/rules/pretrain.smk (built, then taught to draw).

    rule make_tiny_prompts:
        output:
            directory(RAW_DIR),
        log:
            "logs/download/raw.log",
        benchmark:
            "benchmarks/download/raw.tsv"
        conda:
            MARBLE_ENV
        resources:
            **resources_of("report"),
        shell:
            "marble data tiny --out {output:q} > {log:q} 2>&1"

else:

    rule download_model:
        output:
            directory(MODEL_DIR),
        log:
            "logs/download/model.log",
        benchmark:
            "benchmarks/download/model.tsv"
        conda:
            MARBLE_ENV
        resources:
            **resources_of("report"),
        params:
            offline="--offline" if config["offline"] else "",
        shell:
            "marble download model --out {output:q} {params.offline} > {log:q} 2>&1"

    rule download_reward_ckpts:
        output:
            directory(config["reward_ckpt_dir"]),
        log:
            "logs/download/rewards.log",
        benchmark:
            "benchmarks/download/rewards.tsv"
        conda:
            MARBLE_ENV
        resources:
            **resources_of("report"),
        params:
            offline="--offline" if config["offline"] else "",
        shell:
            "marble download rewards --out {output:q} {params.offline} > {log:q} 2>&1"

    rule download_prompts:
        output:
            directory(RAW_DIR),
        log:
            "logs/download/raw.log",
        benchmark:
            "benchmarks/download/raw.tsv"
        conda:
            MARBLE_ENV
        resources:
            **resources_of("report"),
        params:
            offline="--offline" if config["offline"] else "",
        shell:
            "marble download datasets --out {output:q} {params.offline} > {log:q} 2>&1"
