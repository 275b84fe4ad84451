# Evaluation of every known checkpoint on every configured dataset, then one summary.
# Results live in results/eval/<settings>/<run>/<checkpoint>/<dataset>/, <settings>
# naming every image-changing eval setting (common.smk: eval_settings_name), so a
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
        ckpt=eval_ckpt_path,
        out_dir=lambda wc, output: os.path.dirname(output.scores),
        args=eval_args,
        ckpts=f"MARBLE_REWARD_CKPTS={config['reward_ckpt_dir']}",
    shell:
        "{params.ckpts} marble evaluate --checkpoint_path {params.ckpt:q}"
        " --model_path {input.model:q} --model_type sd3 --dataset {wildcards.dataset}"
        " --data_dir {input.raw:q} --output_dir {params.out_dir:q} {params.args}"
        " >> {log:q} 2>&1"


localrules:
    eval_summary,


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
        f"python -m marble.eval_summary --eval-dir {EVAL_DIR}"
        " --out-csv {output.csv:q} --out-md {output.table:q} > {log:q} 2>&1"
