# The paper's tables beside ours (marble/report/paper_tables.py), one target each:
#   snakemake rho_ablation | harmony | cost | paper_tables   (table1: the Table 1 rules)
# Which runs a table needs is marble.workflow.plan's (bound in common.smk); a run in two
# tables is one job. A dry run prints what the plan costs (common.smk).


rule rho_ablation:
    input:
        runs=table_summaries("rho_ablation"),
        evals=table_evals("rho_ablation"),
    output:
        table_files("rho_ablation"),
    log:
        "logs/tables/rho_ablation.log",
    conda:
        MARBLE_ENV
    params:
        only=",".join(TABLE_RUNS["rho_ablation"]),
        # the settings folder the table's evaluations are in (above each input)
        eval_dir=lambda wc, input: EVAL_DIR,
        out_dir=lambda wc, output: os.path.dirname(output[0]),
    shell:
        "marble tables rho_ablation --runs results/runs --only {params.only:q}"
        " --eval-dir {params.eval_dir:q} --out {params.out_dir:q} > {log:q} 2>&1"


rule harmony:
    input:
        runs=table_summaries("harmony"),
    output:
        table_files("harmony"),
    log:
        "logs/tables/harmony.log",
    conda:
        MARBLE_ENV
    params:
        only=",".join(TABLE_RUNS["harmony"]),
        out_dir=lambda wc, output: os.path.dirname(output[0]),
    shell:
        "marble tables harmony --runs results/runs --only {params.only:q}"
        " --out {params.out_dir:q} > {log:q} 2>&1"


rule cost:
    input:
        bench="results/bench/step.json",
    output:
        table_files("cost"),
    log:
        "logs/tables/cost.log",
    conda:
        MARBLE_ENV
    params:
        flops=f"--flops {FLOPS_JSON}" if os.path.exists(FLOPS_JSON) else "",
        out_dir=lambda wc, output: os.path.dirname(output[0]),
    shell:
        "marble tables cost --bench {input.bench:q} {params.flops}"
        " --out {params.out_dir:q} > {log:q} 2>&1"


rule paper_tables:
    input:
        table1=table1_files(),
        tables=[f"{TABLES_DIR}/{t}.md" for t in ("rho_ablation", "harmony", "cost")],
    output:
        f"{TABLES_DIR}/paper_tables.md",
    log:
        "logs/tables/paper_tables.log",
    conda:
        MARBLE_ENV
    params:
        md=lambda wc, input: [p for p in input if p.endswith(".md")],
        out_dir=lambda wc, output: os.path.dirname(output[0]),
    shell:
        "marble tables paper_tables --inputs {params.md:q} --out {params.out_dir:q}"
        " > {log:q} 2>&1"
