# `snakemake -c2 zoo` (docs/balancers.md): the claim experiment's machinery with the balancer
# zoo's arms (config.yaml `zoo:`, the claim section's schema): every torchjd weighting, GDPO
# and the per-reward advantage sum beside MARBLE and the weighted sum, same paired seeds,
# steps and statistics. Results in results/zoo; separate from `claim` and `all`.

# The claim section's defaults beneath `zoo:`; a config without `zoo:` (the paper ones)
# plans no zoo arms.
ZOO = wf_claim.zoo_section(config)
ZOO_DIR = wf_claim.ZOO_DIR
ZOO_RUNS = wf_claim.runs(ZOO)
ZOO_ARMS = wf_claim.arms(ZOO)


wildcard_constraints:
    zoorun=r"[A-Za-z0-9][A-Za-z0-9_.]*-s[0-9]+",


# The zoo keeps the shared pretrained model (claim_run's input names a claim run).
use rule claim_run as zoo_run with:
    input:
        model=MODEL_DIR,
        model_digest=digest_of(MODEL_DIR),
        train=f"{DATASET_DIR}/train.parquet",
        test=f"{DATASET_DIR}/test.parquet",
    output:
        f"{ZOO_DIR}/runs/{{zoorun}}/train_summary.json",
    log:
        "logs/zoo/{zoorun}.log",
    benchmark:
        "benchmarks/zoo/{zoorun}.tsv"
    params:
        preset=lambda wc: ZOO_RUNS[wc.zoorun]["preset"],
        run_dir=lambda wc, output: os.path.dirname(output[0]),
        args=lambda wc: wf_runs.train_args(
            ZOO_RUNS[wc.zoorun],
            wf_runs.run_overrides(ZOO_RUNS[wc.zoorun], MODEL_DIR, DATASET_DIR, None),
        ),


rule zoo_cost:
    input:
        model=MODEL_DIR,
        model_digest=digest_of(MODEL_DIR),
    output:
        flops=f"{ZOO_DIR}/flops.json",
        cost=f"{ZOO_DIR}/cost.json",
    log:
        "logs/zoo/cost.log",
    conda:
        MARBLE_ENV
    params:
        arms=json.dumps(ZOO_ARMS, sort_keys=True),
    # the rows that price every zoo arm, from the arms' cadences (marble.balancers.cadence)
    shell:
        "rows=$(python -m marble.experiments.claim_cost --print-rows --arms {params.arms:q}"
        " --model {input.model:q} 2> {log:q})"
        " && marble bench flops --preset tiny --set model.path={input.model:q}"
        ' --rows "$rows" --runs tiny --json {output.flops:q} >> {log:q} 2>&1'
        " && python -m marble.experiments.claim_cost --flops {output.flops:q} --arms {params.arms:q}"
        " --model {input.model:q} --out {output.cost:q} >> {log:q} 2>&1"


rule zoo:
    input:
        runs=expand(f"{ZOO_DIR}/runs/{{r}}/train_summary.json", r=ZOO_RUNS),
        cost=f"{ZOO_DIR}/cost.json",
    output:
        verdict=f"{ZOO_DIR}/verdict.json",
        md=f"{ZOO_DIR}/claim.md",
        figures=directory(f"{ZOO_DIR}/figures"),
    log:
        "logs/zoo/report.log",
    conda:
        MARBLE_ENV
    params:
        marble_arm=ZOO["marble_arm"],
        baseline=ZOO["baseline_arm"],
        effect=ZOO["effect_of_interest"],
        # the runs sit beside cost.json (an arm-less config has no run inputs to take it from)
        runs=lambda wc, input: os.path.join(os.path.dirname(input.cost), "runs"),
        out=lambda wc, output: os.path.dirname(output.verdict),
    shell:
        "python -m marble.experiments.claim_cli --runs {params.runs:q} --cost {input.cost:q}"
        " --benchmarks benchmarks/zoo --marble-arm {params.marble_arm:q}"
        " --baseline-arm {params.baseline:q} --effect-fraction {params.effect:q}"
        " --out {params.out:q} > {log:q} 2>&1"
