"""`python -m marble.experiments.claim_cli`: the claim experiment's verdict, report section, figures.

    python -m marble.experiments.claim_cli --runs results/claim/runs --cost results/claim/cost.json
        --benchmarks benchmarks/claim --marble-arm marble_n5 --baseline-arm weighted_sum
        --out results/claim

Writes OUT/verdict.json (keys: docs/claim.md), OUT/per_seed.json (every run's measures:
marble.experiments.claim_per_seed recomputes the headline from it), OUT/claim.md (the section "The claim at CPU
scale") and OUT/figures/{change,anti_aligned_vs_n,cost}.png. Bad input: one line naming
the file, exit 2.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

import pandas as pd

from marble.balancers import min_norm_tolerance
from marble.report import seed_stats as cs
from marble.experiments.claim_design import (load_pilot, multiplicity, pilot_effects, pilot_section,
                                         replication)
from marble.experiments.claim_beyond import beside_questions, beyond_sentence
from marble.experiments.claim_experiment import claim_verdict, measure_claim_run
from marble.experiments.claim_figures import write_figures
from marble.experiments.claim_markdown import claim_markdown
from marble.experiments.claim_per_seed import per_seed_record
from marble.report.loading import (ReportInputError, incomplete_reason, left_out_sentence, load_run,
                                   read_json_file, run_folders)
from marble.report.verdict import specialist_rewards
from marble.runtime.io import write_json, write_text
from marble.experiments.claim_noise import dilution_section, noise_sentences
from marble.runtime.oserrors import not_a_folder, print_write_failure
from marble.workflow.claim import ALONE_PREFIX, CONTROL_PREFIX, parse_run_name


def cpu_seconds(summary: dict, benchmarks: Path | None, run: str) -> float:
    """CPU seconds of a run: its train_summary.json's `cpu_time_s` (the process's own count),
    else its Snakemake benchmark file's `cpu_time` (sampled every 30 s: an undercount of a
    short job), NaN when neither exists."""
    if isinstance(summary.get("cpu_time_s"), (int, float)):
        return float(summary["cpu_time_s"])
    path = None if benchmarks is None else benchmarks / f"{run}.tsv"
    if path is None or not path.is_file():
        return math.nan
    with path.open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    try:
        return float(rows[-1]["cpu_time"])
    except (IndexError, KeyError, ValueError) as exc:
        raise ReportInputError(f"{path}: no cpu_time value ({exc})") from exc


def collect(runs_dir: Path, benchmarks: Path | None):
    """(measures, rewards, specialists, arm settings, cpu seconds per arm, run -> the model it
    started from, {run left out: why})."""
    loaded, left_out = [], {}
    for folder in run_folders(runs_dir):
        try:
            arm, seed = parse_run_name(folder.name)
        except ValueError as exc:
            raise ReportInputError(str(exc)) from exc
        run = load_run(folder)
        reason = incomplete_reason(run)  # a run still training is named in the verdict, never measured
        if reason is None:
            loaded.append((arm, seed, run))
        else:
            left_out[run.name] = reason
    # alone and control arms train other rewards than the claim's
    own = (ALONE_PREFIX, CONTROL_PREFIX)
    main = [r for a, _, r in loaded if not a.startswith(own)]
    if not main:
        raise ReportInputError(f"--runs {runs_dir}: no claim run folders with metrics.jsonl")
    rewards = main[0].reward_names
    pooled = pd.concat([r.metrics for r in main], ignore_index=True)
    specialists = specialist_rewards(pooled, rewards)
    for _, _, run in loaded:
        if run.evals is None:  # the workflow's claim runs evaluate at step 0 and at the end
            raise ReportInputError(f"{run.path}: no eval.jsonl: a claim run needs the held-out "
                                   "evaluation (train.eval_every; marble.workflow.claim sets it)")
    measures = [measure_claim_run(a, s, r.metrics, r.reward_names if a.startswith(own) else rewards,
                                  r.evals, r.max_steps) for a, s, r in loaded]
    settings, cpu, models, machines = {}, {}, {}, {}
    for arm, seed, run in loaded:
        bal = run.config.get("balancer") or {}
        settings[arm] = {"method": bal.get("method"), "amortize_every": bal.get("amortize_every"),
                         "alpha_ema": bal.get("alpha_ema"), "weighting": bal.get("weighting"),
                         "gram_space": bal.get("gram_space"), "cached_weights": bal.get("cached_weights"),
                         "micro_batch": (run.config.get("train") or {}).get("batch_size")}
        cpu.setdefault(arm, []).append(cpu_seconds(run.summary, benchmarks, run.name))
        models[run.name] = (run.config.get("model") or {}).get("path")
        machines[run.name] = run.summary.get("machine")
    return measures, rewards, specialists, settings, cpu, models, left_out, machines


def machines_section(machines: dict[str, dict | None]) -> dict:
    """The machines the runs trained on (issue 47 item 5: the answers moved between CPU
    families): each distinct {cpu_model, cpu_capability} with its run count, `one_machine`, and
    the runs whose train_summary.json records none (trained before it was recorded)."""
    counts: dict[tuple, int] = {}
    unknown = []
    for run, m in sorted(machines.items()):
        if not isinstance(m, dict):
            unknown.append(run)
            continue
        key = (m.get("cpu_model"), m.get("cpu_capability"))
        counts[key] = counts.get(key, 0) + 1
    return {"machines": [{"cpu_model": k[0], "cpu_capability": k[1], "runs": n} for k, n in counts.items()],
            "one_machine": len(counts) == 1 and not unknown, "runs_without_machine": unknown}


def pretrained_models(models: dict[str, str | None]) -> dict:
    """seed -> the pretrained model(s) its runs started from, and whether every seed had its
    own (issue 36 item 5: a verdict that hangs on one starting model is not replicated)."""
    by_seed: dict[int, set] = {}
    for run, path in models.items():
        by_seed.setdefault(parse_run_name(run)[1], set()).add(str(path))
    paths = {s: sorted(p) for s, p in sorted(by_seed.items())}
    firsts = [p[0] for p in paths.values()]
    own = all(len(p) == 1 for p in paths.values()) and len(set(firsts)) == len(firsts)
    return {"per_seed": own, "by_seed": {str(s): p for s, p in paths.items()}}


def min_norm_arms(settings: dict) -> dict[str, float]:
    """arm -> the tolerance of its min-norm full solve, for the arms whose balancer has one
    (a property of the balancer, marble.balancers.min_norm_tolerance: our exact QP, and
    torchjd's Frank-Wolfe MGDA at its looser tolerance; not the other weightings)."""
    out = {}
    for arm, s in settings.items():
        tol = min_norm_tolerance(s["method"], s.get("weighting")) if s["method"] else None
        if tol is not None:
            out[arm] = tol
    return out


def build(args) -> dict:
    measures, rewards, specialists, settings, cpu, models, left_out, machines = collect(args.runs, args.benchmarks)
    control = [m for m in measures if m.arm.startswith(CONTROL_PREFIX)]
    measures = [m for m in measures if not m.arm.startswith(CONTROL_PREFIX)]
    min_norm = min_norm_arms(settings)
    methods = {a: s["method"] for a, s in settings.items()}
    # Issue 36 item 4: the committed pilot fixes (b)'s effects of interest before the run
    pilot = load_pilot(args.pilot)
    fixed = pilot_effects(pilot, args.marble_arm)
    verdict = claim_verdict(measures, rewards, specialists, args.marble_arm, args.baseline_arm,
                            args.effect_fraction, min_norm, methods, fixed)
    costs = read_json_file(args.cost) if args.cost else {}
    micro_batch = {a: s["micro_batch"] for a, s in settings.items()}
    # issue 47 item 3: every run's measures beside the verdict, so its headline recomputes
    # from a committed file (python -m marble.experiments.claim_per_seed FILE)
    args.per_seed = per_seed_record(measures + control, rewards, specialists, marble_arm=args.marble_arm,
                                    baseline_arm=args.baseline_arm, effect_fraction=args.effect_fraction,
                                    min_norm_arms=min_norm, arm_methods=methods, fixed_effects=fixed,
                                    micro_batch=micro_batch, costs=costs)
    # Holm families and (b)'s equivalence test; the verdict on two disjoint seed halves; the
    # power the pilot fixes (or "no pilot").
    verdict["multiplicity"] = multiplicity(measures, rewards, specialists, args.marble_arm,
                                           args.baseline_arm, args.effect_fraction, fixed)
    verdict["replication"] = replication(measures, rewards, specialists, args.marble_arm,
                                         args.baseline_arm, effect_fraction=args.effect_fraction,
                                         min_norm_arms=min_norm, arm_methods=methods,
                                         fixed_effects=fixed)
    verdict["replication"]["pretrained_models"] = pretrained_models(models)
    verdict["pilot"] = pilot_section(pilot, len(verdict["seeds"]))
    # Issue 36 item 3: the micro-batch sweep, the no-conflict control, the dilution; issue 37's
    # question of every arm beside the baseline (each section one Holm family, issue 47)
    verdict.update(beside_questions(measures, control, rewards, specialists, args.marble_arm, args.baseline_arm,
                                    micro_batch, costs, fixed, args.effect_fraction))
    verdict["dilution"] = dilution_section(measures, rewards, specialists,
                                           [a for a in (args.baseline_arm, args.marble_arm) if a in verdict["arms"]])
    verdict["sentences"] += noise_sentences(verdict["noise"], verdict["dilution"])
    verdict["machine"] = machines_section(machines)
    verdict["runs_left_out"] = left_out
    if left_out:
        verdict["sentences"].append(left_out_sentence(left_out))
    verdict["arm_settings"] = {a: settings[a] for a in verdict["arms"]}
    verdict["cost"] = {a: {"counted_flops": (costs.get(a) or {}).get("flops"),
                           "flops_ratio": (costs.get(a) or {}).get("ratio"),
                           "full_solve_micro_steps": (costs.get(a) or {}).get("full_solves"),
                           "cpu_s": cs.t_interval(cpu.get(a, [])).as_json()}
                       for a in verdict["arms"]}
    verdict["sentences"] += [beyond_sentence(a, part) for a, part in verdict["arms_versus_baseline"].items()]
    return verdict


NO_ARMS = "No claim arms in this config (`claim.arms`): the claim is the tiny model's experiment."


def write_no_arms(out: Path) -> int:
    (out / "figures").mkdir(parents=True, exist_ok=True)
    write_json(out / "verdict.json", {"arms": [], "seeds": [], "questions": {}, "sentences": [NO_ARMS]})
    write_text(out / "claim.md", f"## The claim at CPU scale\n\n{NO_ARMS}\n")
    print(NO_ARMS)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m marble.experiments.claim_cli", description=__doc__)
    p.add_argument("--runs", type=Path, default=None)
    p.add_argument("--no-arms", action="store_true",
                   help="the config has no claim arms: write a verdict that says so")
    p.add_argument("--cost", type=Path, default=None, help="marble.experiments.claim_cost output")
    p.add_argument("--benchmarks", type=Path, default=None, help="Snakemake benchmark tsvs")
    p.add_argument("--marble-arm", default="marble_n5")
    p.add_argument("--baseline-arm", default="weighted_sum")
    p.add_argument("--effect-fraction", type=float, default=0.5,
                   help="smallest effect of interest: this fraction of a specialist's change "
                        "trained alone (b) and of the paper's 80%% - 0%% anti-aligned gap (c)")
    p.add_argument("--pilot", type=Path, default=None,
                   help="the committed pilot (config.yaml claim.pilot, docs/claim_pilot.json; "
                        "docs/claim.md); without it the verdict says 'no pilot'")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    problem = not_a_folder(args.out, "--out")  # before the verdict's work, not at its first write
    if problem:
        print(f"marble report claim: error: {problem}", file=sys.stderr)
        return 2
    if args.no_arms:
        return write_no_arms(args.out)
    if args.runs is None:
        p.error("--runs is required (or --no-arms)")
    try:
        verdict = build(args)
    except (ReportInputError, ValueError) as exc:
        print(f"marble report claim: error: {exc}", file=sys.stderr)
        return 2
    try:
        figures = write_figures(verdict, args.out / "figures")
        write_json(args.out / "verdict.json", verdict)
        write_json(args.out / "per_seed.json", args.per_seed)
        write_text(args.out / "claim.md", claim_markdown(verdict, figures))
    except OSError as exc:  # a full disk, an --out that is a file: one line, never a traceback
        return print_write_failure("marble report claim", exc, args.out)
    print("\n".join(verdict["sentences"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
