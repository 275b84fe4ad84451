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


def job_shapes(config: dict) -> dict[str, dict]:
    """{job name: its SLURM resources} of every kind of job the workflow submits."""
    cluster = config["cluster"]
    shapes = {"train_run": slurm.train_resources(config["train"], cluster)}
    for name, section, key in (("evaluate_ckpt", "eval", "resources"),
                               ("bench_step", "bench", "resources"),
                               ("embed_prompts", "dataset", "embed_resources"),
                               ("report", "report", "resources")):
        block = (config.get(section) or {}).get(key)
        if block:
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
