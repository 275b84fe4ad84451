# Evaluation of every known checkpoint on every configured dataset, then one summary.
# Results live in results/eval/<settings>/<run>/<checkpoint>/<dataset>/, <settings>
# naming every image-changing eval setting of that row (eval.protocols.<run> over eval:
# marble.workflow.evaluation.row_settings), so a changed setting evaluates into a new folder
# and each Table 1 row is generated under its own protocol. Only average_scores.json is declared:
# Snakemake deletes declared outputs before a job, and evaluation_results.jsonl is the
# state `marble evaluate` resumes from (finished samples are skipped).


from marble.workflow import slurm_eval


rule evaluate_ckpt:
    input:
        unpack(eval_inputs),
        model=lambda wc: row_model_dir(wc.run),
        model_digest=lambda wc: digest_of(row_model_dir(wc.run)),
        raw=RAW_DIR,
        prompts=lambda wc: f"{PROMPT_DIGESTS}/{wc.dataset}.sha256",
        rewards=REWARD_INPUT,
        rewards_digest=digests_of(REWARD_INPUT),
        judge=lambda wc: judge_input(wc.dataset),
    output:
        scores="results/eval/{settings}/{run}/{ckpt}/{dataset}/average_scores.json",
    log:
        "logs/eval/{settings}/{run}/{ckpt}/{dataset}.log",
    benchmark:
        "benchmarks/eval/{settings}/{run}/{ckpt}/{dataset}.tsv"
    conda:
        MARBLE_ENV
    threads: EVAL["resources"]["cpus_per_task"]
    # --time per job from the plan (at least eval.resources.runtime): marble.workflow.slurm_eval
    resources:
        **{**resources_of("eval"), "runtime": slurm_eval.runtime_of(config)},
    params:
        source=eval_source_args,
        out_dir=lambda wc, output: os.path.dirname(output.scores),
        args=eval_args,
        launcher=eval_launcher(),
        service=lambda wc: wf_eval.service_prefix(EVAL, wc.dataset),
        reward_ckpts=reward_ckpts,
    shell:
        "MARBLE_REWARD_CKPTS={params.reward_ckpts:q} {params.service} {params.launcher} {params.source}"
        " --model_path {input.model:q} --dataset {wildcards.dataset}"
        " --data_dir {input.raw:q} --output_dir {params.out_dir:q} {params.args}"
        " >> {log:q} 2>&1"


localrules:
    eval_summary,
    prompt_digest,
    fetch_hub_lora,
    fetch_hub_model,
    paper_comparison,
    table1,


# The digest standing in for a prompt file (written here when missing; the Snakefile rewrites it
# when the file changes, so an edited prompt reruns its evaluations: marble.workflow.digests).
rule prompt_digest:
    input:
        raw=RAW_DIR,
    output:
        f"{PROMPT_DIGESTS}/{{dataset}}.sha256",
    log:
        "logs/eval/prompt_digest_{dataset}.log",
    conda:
        MARBLE_ENV
    shell:
        "python -m marble.workflow.digests prompt {input.raw:q} {wildcards.dataset} --out {output:q}"
        " > {log:q} 2>&1"


# A public LoRA named `hf:owner/repo[@revision]` in eval.checkpoints, fetched where
# Snakemake runs (the login node: compute nodes are often offline), pinned by revision.
rule fetch_hub_lora:
    output:
        directory(f"{LORA_DIR}/{{run}}"),
    log:
        "logs/download/lora_{run}.log",
    conda:
        MARBLE_ENV
    params:
        ref=lambda wc: "hf:{}@{}".format(*hub_loras()[wc.run]),
    shell:
        "python -m marble.assets.hub {params.ref:q} --out {output:q} --require-commit > {log:q} 2>&1"


# A row's base model `hf:owner/repo@commit` (eval.protocols.<row>.model: SD-XL, SD3.5-L,
# FLUX.1-Dev; only the pipeline's components, as model_index.json names them) or the
# UnifiedReward judge (eval.unifiedreward.model), fetched on the login node.
rule fetch_hub_model:
    output:
        directory("data/models/hub/{hubmodel}"),
    log:
        "logs/download/model_{hubmodel}.log",
    conda:
        MARBLE_ENV
    params:
        ref=lambda wc: wf_eval.hub_models(EVAL)[wc.hubmodel][0],
        pipeline=lambda wc: (
            "--pipeline" if wf_eval.hub_models(EVAL)[wc.hubmodel][1] else ""
        ),
    shell:
        "python -m marble.assets.hub {params.ref:q} --out {output:q} --require-commit {params.pipeline}"
        " > {log:q} 2>&1"


rule eval_summary:
    input:
        summary_inputs,
    output:
        csv=report("results/eval/summary.csv", category="Evaluation"),
        table="results/eval/table.md",
    log:
        "logs/eval/summary.log",
    benchmark:
        "benchmarks/eval/summary.tsv"
    conda:
        MARBLE_ENV
    params:
        eval_dirs=summary_dirs(),
    shell:
        "python -m marble.evaluation.summary {params.eval_dirs}"
        " --out-csv {output.csv:q} --out-md {output.table:q} > {log:q} 2>&1"


# Our evaluation of public checkpoints beside the paper's published rows
# (eval.published, e.g. config/paper_published.yaml with config/paper-eval.yaml).
rule paper_comparison:
    input:
        summary="results/eval/summary.csv",
        published=EVAL["published"] or [],
    output:
        "results/eval/paper_comparison.md",
    log:
        "logs/eval/paper_comparison.log",
    conda:
        MARBLE_ENV
    params:
        eval_dirs=summary_dirs(),
        choice=table1_choice(),
    shell:
        "python workflow/scripts/published.py {params.eval_dirs} {params.choice}"
        " --published {input.published:q} --out {output:q} > {log:q} 2>&1"


# Table 1: every configured row (eval.published names each row's run), evaluated under its
# own protocol, beside the published numbers; composites over the same rows. table1.json is
# a DVC metrics file (dvc.yaml).
rule table1:
    input:
        table1_inputs,
        published=EVAL["published"] or [],
    output:
        md="results/eval/table1.md",
        csv="results/eval/table1.csv",
        metrics="results/eval/table1.json",
    log:
        "logs/eval/table1.log",
    conda:
        MARBLE_ENV
    params:
        eval_dirs=summary_dirs(),
        out_dir=lambda wc, output: os.path.dirname(output.md),
        choice=table1_choice(),
    shell:
        "python -m marble.report.table1 {params.eval_dirs} --published {input.published:q}"
        " --out-dir {params.out_dir:q} {params.choice} > {log:q} 2>&1"
