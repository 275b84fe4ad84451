"""Does each job shape of a config fit the cluster? (`marble doctor`, the preflight).

Names are not capacity: a partition that exists can still be one node without GPUs while the
paper's training asks for 2 nodes x 8 GPUs, 64 CPUs, 480 GB and 48 h. For every job shape the
workflow submits (`job_shapes`, from the same `marble.workflow.slurm` mapping the rules use)
the doctor asks SLURM itself, `sbatch --test-only` with that job's own options
(`test_only_args`), and reports SLURM's reason for each shape that does not fit. Without a
controller the check is a warning, never an "ok".

Also the SLURM user: `USER` is often unset in batch shells and containers; `slurm_user`
falls back to the passwd entry of the process.
"""

from __future__ import annotations

import getpass
import os

from marble.workflow import slurm
from marble.workflow import flops as wf_flops
from marble.workflow import plan_price
from marble.workflow.runs import configured

# The SLURM jobs each named target of the Snakefile can submit (the rules of its DAG that are
# not localrules). A run is checked for its target's jobs only: `eval_only` of
# config/paper-eval.yaml submits no training and no bench, and a limit those would not meet is
# no reason to refuse it. A file target, or none, gets every job (`all`).
_EVERY = frozenset({"train_run", "evaluate_ckpt", "bench_step", "embed_prompts", "report"})
_TRAINING = frozenset({"train_run", "embed_prompts"})
TARGET_JOBS = {
    "all": _EVERY, "report": _EVERY, "prepare": frozenset({"embed_prompts"}), "train": _TRAINING,
    "evaluate": _TRAINING | {"evaluate_ckpt"}, "eval_only": frozenset({"evaluate_ckpt"}),
    "rho_ablation": _TRAINING | {"evaluate_ckpt"}, "harmony": _TRAINING | {"evaluate_ckpt"},
    "paper_tables": _EVERY, "cost": frozenset({"bench_step"}),
}


def named_targets(argv) -> list[str]:
    """The targets among Snakemake's (or its command line's) words that TARGET_JOBS names."""
    return sorted({str(a) for a in argv if str(a) in TARGET_JOBS})


def submitted_jobs(config: dict, targets=()) -> set[str]:
    """The kinds of SLURM job `targets` submit under `config`: no training without a configured
    run, no embedding job without dataset.embed."""
    named = named_targets(targets)
    jobs = set().union(*(TARGET_JOBS[t] for t in named)) if named else set(_EVERY)
    if not configured(config.get("runs")):
        jobs -= {"train_run"}
    if not (config.get("dataset") or {}).get("embed"):
        jobs -= {"embed_prompts"}
    return jobs


def job_shapes(config: dict, targets=()) -> dict[str, dict]:
    """{job name: its SLURM resources} of every kind of job `targets` submit (submitted_jobs)."""
    cluster, wanted = config["cluster"], submitted_jobs(config, targets)
    # check=False: a runtime within the signal's lead is the doctor's row (step_fit), not a crash.
    shapes = ({"train_run": slurm.train_resources(config["train"], cluster, check=False)}
              if "train_run" in wanted else {})
    for name, section, key in (("evaluate_ckpt", "eval", "resources"),
                               ("bench_step", "bench", "resources"),
                               ("embed_prompts", "dataset", "embed_resources"),
                               ("report", "report", "resources")):
        block = (config.get(section) or {}).get(key)
        if block and name in wanted:
            shapes[name] = slurm.job_resources(block, cluster)
    return shapes


# The config keys that size each job shape (the fix of a shape that does not fit).
SHAPE_KEYS = {
    "train_run": "train.nodes, train.gpus_per_node, train.cpus_per_task, train.mem_mb, train.runtime",
    "evaluate_ckpt": "eval.resources", "bench_step": "bench.resources",
    "embed_prompts": "dataset.embed_resources", "report": "report.resources",
}
# The key of each job's minutes (its --time).
RUNTIME_KEYS = {"train_run": "train.runtime", "evaluate_ckpt": "eval.resources.runtime",
                "bench_step": "bench.resources.runtime", "embed_prompts": "dataset.embed_resources.runtime",
                "report": "report.resources.runtime"}


def test_only_args(res: dict) -> list[str]:
    """`sbatch --test-only` options for one job's resources (the plugin's own option names:
    nodes, tasks, CPUs per task, memory, minutes, partition, account, gres, constraint)."""
    args = ["sbatch", "--test-only", "--job-name=marble-doctor",
            f"--nodes={res.get('nodes', 1)}", f"--ntasks={res.get('tasks', 1)}",
            f"--cpus-per-task={res['cpus_per_task']}", f"--mem={res['mem_mb']}",
            f"--time={res['runtime']}"]
    for key, flag in (("slurm_partition", "--partition"), ("slurm_account", "--account"),
                      ("gres", "--gres"), ("constraint", "--constraint")):
        if res.get(key):
            args.append(f"{flag}={res[key]}")
    if "--ntasks-per-node=1" in str(res.get("slurm_extra", "")):
        args.append("--ntasks-per-node=1")
    return [*args, "--wrap=true"]


def describe(res: dict) -> str:
    """A job shape in words: '2 nodes x gpu:h100:8, 2 tasks x 32 CPUs, 480000 MB, 2880 min'."""
    gres = f" x {res['gres']}" if res.get("gres") else ""
    nodes = res.get("nodes", 1)
    return (f"{nodes} node{'s' if nodes != 1 else ''}{gres}, {res.get('tasks', 1)} task(s) x "
            f"{res['cpus_per_task']} CPUs, {res['mem_mb']} MB, {res['runtime']} min"
            f" on {res.get('slurm_partition') or 'the default partition'}")


def test_only_verdict(returncode: int, stderr: str) -> tuple[bool, str]:
    """(fits, SLURM's words) from `sbatch --test-only`: it prints 'Job ... to start at ...' on
    stderr when the job could run, an `sbatch: error: ...` line when it never could."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line.split("error:", 1)[1].strip() for line in lines if "error:" in line]
    if returncode == 0 and not errors:
        return True, (lines[-1] if lines else "accepted")
    return False, "; ".join(errors) or (lines[-1] if lines else f"sbatch exited {returncode}")


def slurm_user() -> str:
    """The user SLURM knows this process as: USER, else LOGNAME, else the passwd entry."""
    return os.environ.get("USER") or os.environ.get("LOGNAME") or getpass.getuser()


# Hugging Face repositories whose download needs an accepted licence and HF_TOKEN.
GATED_REPOS = {
    "stabilityai/stable-diffusion-3.5-medium": "SD3.5 Medium",
    "stabilityai/stable-diffusion-3.5-large": "SD3.5 Large",
    "black-forest-labs/FLUX.1-dev": "FLUX.1-Dev",
}


def gated_to_fetch(hub_models: dict, present: set[str]) -> list[str]:
    """The gated repos among {folder: (ref, pipeline)} (`marble.workflow.evaluation.hub_models`)
    whose folder is not in `present` (still to be fetched): each needs HF_TOKEN."""
    out = []
    for folder, (ref, _) in sorted(hub_models.items()):
        repo = ref.split(":", 1)[-1].split("@", 1)[0]
        if repo in GATED_REPOS and folder not in present:
            out.append(repo)
    return out


def plan_step_s(config: dict, root) -> tuple[float, str] | None:
    """(seconds of the slowest configured run's optimizer step, which run) from the plan's own
    figures (marble.workflow.plan_price: counted FLOPs over the measured or assumed throughput,
    a run's own median time/step_s once it has one); None without a run to time."""
    import json
    from pathlib import Path

    bench_file = Path(root) / "results/bench/step.json"  # the plan's default bench
    try:
        bench = json.loads(bench_file.read_text()) if bench_file.is_file() else None
    except ValueError:
        bench = None
    ctx, slowest = plan_price.context(config, Path(root), bench), None
    for name in configured(config.get("runs")):
        try:
            job = plan_price.training_job("train_run", name, ctx)
        except wf_flops.Missing:
            continue  # a shape the FLOP table lacks: the plan names it, no step time here
        steps = job.detail.get("steps") or 0
        if steps <= 0:
            continue
        step_flops = sum(v for k, v in job.flops.items() if k != "held-out evaluation") / max(job.processes, 1)
        seconds = step_flops / job.throughput.flops_per_s / steps
        if slowest is None or seconds > slowest[0]:
            slowest = (seconds, name)
    return slowest


def min_train_runtime(signal_s: int, step_s: float) -> int:
    """The shortest train.runtime (minutes) that leaves one step after the signal lead, with
    the step counted twice (a model load and a step in flight, both unmeasured here)."""
    return -(-int(signal_s + 2 * step_s) // 60) + 1


def step_fit(runtime: int, signal_s: int, step: tuple[float, str] | None) -> tuple[bool | None, str]:
    """(fits, words): whether a training attempt of `runtime` minutes leaves one step of the
    plan after the requeue signal's lead (else it requeues without progress)."""
    if runtime * 60 <= signal_s:
        return False, (f"train.runtime {runtime} min is not longer than train.requeue_signal_s {signal_s} s: "
                       "every attempt is warned at its start and requeues without a step")
    if step is None:
        return None, "no planned step time (no configured run the FLOP table counts)"
    seconds, name = step
    left = runtime * 60 - signal_s
    if left < 2 * seconds:
        return False, (f"{left} s after the {signal_s} s signal lead < one {name} step with its load "
                       f"(~{seconds:.0f} s per step in the plan, counted twice): requeues without progress")
    return True, f"{left} s per attempt after the signal lead, {name} step ~{seconds:.0f} s in the plan"
