"""SLURM resources for the workflow's jobs, from the `cluster:` and `train:` config sections.

The Snakemake SLURM executor turns these into sbatch options: `slurm_partition`,
`slurm_account`, `gres`, `constraint`, `nodes`, `tasks`, `slurm_extra`, `mpi`.
"""

from __future__ import annotations


def cluster_resources(cluster: dict, gpus: int | None) -> dict:
    """Partition, account, GPU type and constraint from `cluster:` (schema-checked words, so
    safe on the sbatch line). GPU jobs take `gpu_partition` and the constraint."""
    out = {}
    partition = (cluster["gpu_partition"] or cluster["partition"]) if gpus else None
    partition = partition or cluster["partition"]
    if partition:
        out["slurm_partition"] = partition
    if cluster["account"]:
        out["slurm_account"] = cluster["account"]
    if gpus:
        kind = f"{cluster['gpu_type']}:" if cluster["gpu_type"] else ""
        out["gres"] = f"gpu:{kind}{gpus}"
        if cluster["constraint"]:
            out["constraint"] = cluster["constraint"]
    return out


def job_resources(resources: dict, cluster: dict) -> dict:
    """A one-task job's resources from a `<section>.resources` block (eval, report, ...)."""
    out = dict(cpus_per_task=resources["cpus_per_task"], mem_mb=resources["mem_mb"],
               runtime=resources["runtime"])
    out.update(cluster_resources(cluster, resources["gpus"]))
    return out


def train_resources(train: dict, cluster: dict, check: bool = True) -> dict:
    """One SLURM job for the whole run: a task per node, torchrun inside each task.

    `mpi` makes the plugin hand the job shell to us instead of `srun -n1` (we call srun
    ourselves); the plugin refuses `mpi` with a single task, so a one-node run gets `mpi=""`,
    which also keeps the jobstep from wrapping us (train_launch.sh then calls srun).
    `tasks_per_gpu=0` stops GPU jobs turning `tasks` into `--ntasks-per-gpu`. GPUs go through
    `gres`, which SLURM counts per node.
    """
    nodes, gpus = train["nodes"], train["gpus_per_node"]
    tasks = train["tasks"] or nodes
    per_node = " --ntasks-per-node=1" if tasks == nodes else ""
    # Every training job asks for the time-limit signal, one node too: USR1 reaches job
    # steps, and train_launch.sh always starts the trainer in one (srun) inside SLURM.
    # 0 turns it off (the job then ends in TIMEOUT; the next submission resumes).
    signal_s = train["requeue_signal_s"]
    signal = f" --signal=USR1@{signal_s}" if signal_s > 0 else ""
    # What the schema cannot say (two keys): a job no longer than the signal's lead is warned
    # at its start, every attempt, and requeues without a step for ever. `check=False`: the
    # doctor, which reports it as a row with the plan's step time instead of stopping.
    if check and signal_s > 0 and train["runtime"] * 60 <= signal_s:
        raise ValueError(
            f"train.runtime: {train['runtime']} min is not longer than train.requeue_signal_s "
            f"({signal_s} s): every training job would be warned at its start and requeue without "
            f"a step; set train.runtime above {-(-signal_s // 60)} min (`marble doctor` checks it "
            "against the plan's step time) or lower train.requeue_signal_s")
    res = dict(nodes=nodes, tasks=tasks, cpus_per_task=train["cpus_per_task"],
               mem_mb=train["mem_mb"], runtime=train["runtime"], tasks_per_gpu=0,
               **cluster_resources(cluster, gpus))
    # --requeue itself comes from the profile (slurm-requeue), so the plugin knows.
    extra = f"{signal}{per_node}".strip()
    if extra:
        res["slurm_extra"] = extra
    # "" still keeps the jobstep from wrapping us in `srun -n1` but asks sbatch for nothing.
    res["mpi"] = "srun" if tasks > 1 else ""
    return res
