# Cost of the balancers (one timed step each) and the final report.

from marble.workflow import report_captions

# Tiny mode times the workflow's own model; the paper preset times a random-init
# SD3.5M-sized model (no download needed).
BENCH_MODEL = [MODEL_DIR] if MODE == "tiny" else []
# The bench's ratios are a few percent apart: on a laptop (tiny mode) it waits for the
# evaluations so that no other job shares the CPU while it times (the report and the DVC
# views wait for the bench anyway). A cluster gives it its own allocation instead.
BENCH_AFTER = ["results/eval/summary.csv"] if MODE == "tiny" else []


rule bench_step:
    input:
        model=BENCH_MODEL,
        model_digest=digests_of(BENCH_MODEL),
        after=BENCH_AFTER,
    output:
        "results/bench/step.json",
    log:
        "logs/bench/step.log",
    benchmark:
        "benchmarks/bench/step.tsv"
    conda:
        MARBLE_ENV
    threads: config["bench"]["resources"]["cpus_per_task"]
    resources:
        **resources_of("bench"),
    params:
        preset=config["bench"]["preset"],
        repeats=config["bench"]["repeats"],
        model=lambda wc, input: wf_runs.option("--model", input.model),
    shell:
        "marble bench step --preset {params.preset:q} {params.model} --repeats {params.repeats:q}"
        " --threads {threads:q}"
        " --json {output:q}"
        " > {log:q} 2>&1"


rule make_report:
    input:
        runs=expand("results/runs/{run}/train_summary.json", run=RUNS),
        summary="results/eval/summary.csv",
        bench="results/bench/step.json",
        # every Table 1 row, from all its settings folders (the table1 rule's)
        table1=["results/eval/table1.csv"] if TABLE1_TARGETS else [],
    output:
        md="results/report/report.md",
        html=report(
            "results/report/report.html",
            caption="../report/report.rst",
            category="Report",
        ),
        # Every figure and table, each with its caption (marble.workflow.report_captions).
        figures=report(
            directory("results/report/figures"),
            patterns=["{name}.png"],
            caption="../report/figure.rst",
            category="Figures",
        ),
        tables=report(
            directory("results/report/tables"),
            patterns=["{name}.csv"],
            caption="../report/table.rst",
            category="Tables",
        ),
    log:
        "logs/report/report.log",
    benchmark:
        "benchmarks/report/report.tsv"
    conda:
        MARBLE_ENV
    resources:
        **resources_of("report"),
    params:
        out_dir=lambda wc, output: os.path.dirname(output.md),
        eval_dir=EVAL_DIR,
        flops=f"--flops {FLOPS_JSON}" if os.path.exists(FLOPS_JSON) else "",
        table1=lambda wc, input: wf_runs.option("--table1", input.table1),
        # The claim and zoo experiments lead the report once they ran (`snakemake -c2 claim`):
        # read as they are, never inputs, so `all` does not rerun a 45-minute experiment.
        experiments=" ".join(
            f"--experiment {shlex.quote(d)}"
            for d in (wf_claim.CLAIM_DIR, wf_claim.ZOO_DIR)
            if os.path.isfile(os.path.join(d, "verdict.json"))
        ),
        # read by the caption templates only (a changed caption rebuilds the report)
        captions=report_captions.captions(workflow.basedir),
    shell:
        "marble report --runs results/runs --eval-summary {input.summary:q}"
        " --bench {input.bench:q} {params.flops} {params.table1} {params.experiments}"
        " --eval-dir {params.eval_dir:q}"
        " --out {params.out_dir:q}"
        " > {log:q} 2>&1"


# Flat files for DVC (dvc.yaml: metrics and plots): one metrics file per table,
# per-reward training curves and per-run eval bars.
rule dvc_views:
    input:
        runs=expand("results/runs/{run}/train_summary.json", run=RUNS),
        summary="results/eval/summary.csv",
        bench="results/bench/step.json",
        table1=TABLE1_TARGETS,
    output:
        directory("results/dvc"),
    log:
        "logs/report/dvc_views.log",
    conda:
        MARBLE_ENV
    resources:
        **resources_of("report"),
    params:
        table1="--table1 results/eval/table1.json" if TABLE1_TARGETS else "",
    shell:
        "python workflow/scripts/dvc_views.py --runs results/runs"
        " --eval-summary {input.summary:q} --bench {input.bench:q} --out {output:q}"
        " {params.table1} > {log:q} 2>&1"
