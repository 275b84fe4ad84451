# Evaluation of every known checkpoint on every configured dataset, then one summary.
# Results live in results/eval/<run>/<checkpoint>/<dataset>/; a result is redone only
# when missing or older than its checkpoint.


rule evaluate_ckpt:
    input:
        unpack(eval_inputs),
        model=MODEL_DIR,
        raw=RAW_DIR,
        rewards=REWARD_INPUT,
    output:
        scores="results/eval/{run}/{ckpt}/{dataset}/average_scores.json",
        samples="results/eval/{run}/{ckpt}/{dataset}/evaluation_results.jsonl",
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
        ckpt_flag=eval_ckpt_flag,
        out_dir=lambda wc, output: os.path.dirname(output.scores),
        args=eval_args,
        ckpts=f"MARBLE_REWARD_CKPTS={config['reward_ckpt_dir']}",
    shell:
        "{params.ckpts} marble evaluate {params.ckpt_flag} {params.ckpt:q}"
        " --model_path {input.model:q} --model_type sd3 --dataset {wildcards.dataset}"
        " --data_dir {input.raw:q} --output_dir {params.out_dir:q} {params.args}"
        " > {log:q} 2>&1"


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
        "python -m marble.eval_summary --eval-dir results/eval"
        " --out-csv {output.csv:q} --out-md {output.table:q} > {log:q} 2>&1"
