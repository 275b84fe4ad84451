# Evaluation of every known checkpoint on every configured dataset, then one summary.
# Results live in results/eval/<settings>/<run>/<checkpoint>/<dataset>/, <settings>
# naming every image-changing eval setting (marble.workflow.evaluation.settings_name), so a
# changed setting evaluates into a new folder. Only average_scores.json is declared:
# Snakemake deletes declared outputs before a job, and evaluation_results.jsonl is the
# state `marble evaluate` resumes from (finished samples are skipped).


rule evaluate_ckpt:
    input:
        unpack(eval_inputs),
        model=MODEL_DIR,
        raw=RAW_DIR,
        rewards=REWARD_INPUT,
    output:
        scores=f"{EVAL_DIR}/{{run}}/{{ckpt}}/{{dataset}}/average_scores.json",
    log:
        "logs/eval/{run}/{ckpt}/{dataset}.log",
    benchmark:
        "benchmarks/eval/{run}/{ckpt}/{dataset}.tsv"
    conda:
        MARBLE_ENV
    threads: EVAL["resources"]["cpus_per_task"]
    resources:
        **resources_of("eval"),
    params:
        source=eval_source_args,
        out_dir=lambda wc, output: os.path.dirname(output.scores),
        args=eval_args,
        launcher=eval_launcher(),
        ckpts=f"MARBLE_REWARD_CKPTS={config['reward_ckpt_dir']}",
    shell:
        "{params.ckpts} {params.launcher} {params.source}"
        " --model_path {input.model:q} --model_type sd3 --dataset {wildcards.dataset}"
        " --data_dir {input.raw:q} --output_dir {params.out_dir:q} {params.args}"
        " >> {log:q} 2>&1"


localrules:
    eval_summary,
    fetch_hub_lora,
    paper_comparison,


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
        repo=lambda wc: hub_loras()[wc.run][0],
        revision=lambda wc: hub_loras()[wc.run][1],
    shell:
        "python -c 'import os, sys; from huggingface_hub import snapshot_download;"
        " snapshot_download(sys.argv[1], revision=sys.argv[2], local_dir=sys.argv[3],"
        ' token=os.environ.get("HF_TOKEN"))\''
        " {params.repo:q} {params.revision:q} {output:q} > {log:q} 2>&1"


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
    shell:
        f"python -m marble.evaluation.summary --eval-dir {EVAL_DIR}"
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
        eval_dir=EVAL_DIR,
    shell:
        "python workflow/scripts/published.py --eval-dir {params.eval_dir:q}"
        " --published {input.published:q} --out {output:q} > {log:q} 2>&1"
