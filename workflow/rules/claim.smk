# `snakemake -c2 claim` (docs/claim.md): MARBLE's claim at CPU scale. config.yaml's
# `claim:` section lists the arms (one line each) and the seeds; every arm x seed trains
# on the tiny model with the same data plan per seed, then `marble report claim` writes
# results/claim/verdict.json, claim.md and the figures. Separate from `all`: the demo
# stays the quick first look.

from marble.workflow import claim as wf_claim

CLAIM = config["claim"]
CLAIM_DIR = wf_claim.CLAIM_DIR
CLAIM_RUNS = wf_claim.runs(CLAIM)
CLAIM_ARMS = wf_claim.arms(CLAIM)
# the pretrained model of each claim run (`claim.pretrain_per_seed`: one per seed, tiny mode)
CLAIM_MODELS = {
    r: wf_claim.model_dir(CLAIM if MODE == "tiny" else {}, r, MODEL_DIR)
    for r in CLAIM_RUNS
}


wildcard_constraints:
    claimrun=r"[A-Za-z0-9][A-Za-z0-9_.]*-s[0-9]+",


# Issue 36 item 5 (`claim.pretrain_per_seed`): each seed's runs start from their own tiny
# model, pretrained as the demo's (same steps) with the seed as its key, so the seeds vary
# the starting point too; the demo keeps MODEL_DIR.
if MODE == "tiny":

    rule claim_pretrain_model:
        input:
            table=f"{DATASET_DIR}/train.parquet",
        output:
            directory(wf_claim.seed_model_pattern(MODEL_DIR)),
        log:
            "logs/claim/model-s{seed}.log",
        wildcard_constraints:
            seed=r"[0-9]+",
        conda:
            MARBLE_ENV
        threads: 1
        resources:
            **resources_of("report"),
        params:
            vae=config["pretrain"]["vae_steps"],
            flow=config["pretrain"]["flow_steps"],
        shell:
            "marble models pretrain --table {input.table:q} --out {output:q}"
            " --vae-steps {params.vae:q} --flow-steps {params.flow:q} --seed {wildcards.seed:q}"
            " --threads {threads} > {log:q} 2>&1"


rule claim_run:
    input:
        model=lambda wc: CLAIM_MODELS[wc.claimrun],
        model_digest=lambda wc: digest_of(CLAIM_MODELS[wc.claimrun]),
        train=f"{DATASET_DIR}/train.parquet",
        test=f"{DATASET_DIR}/test.parquet",
    output:
        f"{CLAIM_DIR}/runs/{{claimrun}}/train_summary.json",
    log:
        "logs/claim/{claimrun}.log",
    benchmark:
        "benchmarks/claim/{claimrun}.tsv"
    conda:
        MARBLE_ENV
    threads: 1
    params:
        preset=lambda wc: CLAIM_RUNS[wc.claimrun]["preset"],
        run_dir=lambda wc, output: os.path.dirname(output[0]),
        args=lambda wc: wf_runs.train_args(
            CLAIM_RUNS[wc.claimrun],
            wf_runs.run_overrides(
                CLAIM_RUNS[wc.claimrun], CLAIM_MODELS[wc.claimrun], DATASET_DIR, None
            ),
        ),
    shell:
        "OMP_NUM_THREADS=1 marble train --preset {params.preset:q} --output-dir {params.run_dir:q}"
        " {params.args} > {log:q} 2>&1"


# Counted cost of each arm (marble bench flops rows, priced with each arm's cadence).
rule claim_cost:
    input:
        model=MODEL_DIR,
        model_digest=digest_of(MODEL_DIR),
    output:
        flops=f"{CLAIM_DIR}/flops.json",
        cost=f"{CLAIM_DIR}/cost.json",
    log:
        "logs/claim/cost.log",
    conda:
        MARBLE_ENV
    params:
        # every reported arm, the sweep's and the control's too (each its own cost row)
        arms=json.dumps(wf_claim.priced_arms(CLAIM), sort_keys=True),
    # the rows come from the arms' own cadences (claim_cost --print-rows), so an arm of a new
    # kind is priced instead of failing after every training
    shell:
        "rows=$(python -m marble.experiments.claim_cost --print-rows --arms {params.arms:q}"
        " --model {input.model:q} 2> {log:q})"
        " && marble bench flops --preset tiny --set model.path={input.model:q}"
        ' --rows "$rows" --runs tiny --json {output.flops:q} >> {log:q} 2>&1'
        " && python -m marble.experiments.claim_cost --flops {output.flops:q} --arms {params.arms:q}"
        " --model {input.model:q} --out {output.cost:q} >> {log:q} 2>&1"


# A config without arms (config/paper.yaml: the claim is the tiny model's experiment)
# writes a verdict that says so, so `dvc repro` of the paper config has its claim stage.
rule claim:
    input:
        runs=expand(f"{CLAIM_DIR}/runs/{{r}}/train_summary.json", r=CLAIM_RUNS),
        cost=[f"{CLAIM_DIR}/cost.json"] if CLAIM_ARMS else [],
        # the committed pilot is an input: a new pilot recomputes the verdict's power
        pilot=[CLAIM["pilot"]] if CLAIM_ARMS and CLAIM.get("pilot") else [],
    output:
        verdict=f"{CLAIM_DIR}/verdict.json",
        # every run's measures: the headline recomputes from it (docs/claim.md); none without arms
        per_seed=[f"{CLAIM_DIR}/per_seed.json"] if CLAIM_ARMS else [],
        md=f"{CLAIM_DIR}/claim.md",
        figures=directory(f"{CLAIM_DIR}/figures"),
    log:
        "logs/claim/report.log",
    conda:
        MARBLE_ENV
    params:
        marble_arm=CLAIM["marble_arm"],
        baseline=CLAIM["baseline_arm"],
        effect=CLAIM["effect_of_interest"],
        out=lambda wc, output: os.path.dirname(output.verdict),
        inputs=lambda wc, input: (
            shlex.join(
                [
                    "--runs",
                    os.path.dirname(os.path.dirname(input.runs[0])),
                    "--cost",
                    input.cost[0],
                    "--benchmarks",
                    "benchmarks/claim",
                    *(["--pilot", input.pilot[0]] if input.pilot else []),
                ]
            )
            if CLAIM_ARMS
            else "--no-arms"
        ),
    shell:
        "python -m marble.experiments.claim_cli {params.inputs} --marble-arm {params.marble_arm:q}"
        " --baseline-arm {params.baseline:q} --effect-fraction {params.effect:q}"
        " --out {params.out:q} > {log:q} 2>&1"
