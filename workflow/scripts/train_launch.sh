#!/usr/bin/env bash
# Start `marble train` the right way for where the job runs.
#   train_launch.sh MPI_LAUNCHER -- <marble train arguments>
# MPI_LAUNCHER is the rule's `mpi` resource: "srun" for a multi-node SLURM job (the
# executor plugin then leaves the launch to us), "" otherwise. The plugin's jobstep strips
# every SLURM_* variable but the job id, so the rule passes the geometry as MARBLE_NODES,
# MARBLE_TASKS and MARBLE_CPUS_PER_TASK; srun then sets SLURM_* for each task.
#  - SLURM:    srun starts the job's tasks (one per node, also for one node, so the
#              time-limit signal reaches them); each runs torchrun_slurm.sh.
#  - no SLURM: plain `marble train` (torchrun --standalone when GPUs > 1).
set -euo pipefail
launcher=""
if [ "${1:-}" != "--" ]; then
    launcher="${1:-}"
    shift || true
fi
[ "${1:-}" = "--" ] && shift
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
gpus="${MARBLE_GPUS_PER_NODE:-0}"

# One trainer per run folder: `marble train` itself takes the run's TRAINING.lock (pid,
# host, SLURM job id; marble/training/run_lock.py), so every launch path meets it.
# This script only keeps every attempt's output in the run folder: Snakemake's jobstep
# recreates the rule's log when SLURM requeues the job, so logs/train/<run>.log holds
# the last attempt only, <run>/train.log all of them.
run_dir=""
prev=""
for arg in "$@"; do
    [ "$prev" = "--output-dir" ] && run_dir="$arg"
    prev="$arg"
done
if [ -n "$run_dir" ]; then
    mkdir -p "$run_dir"
    exec > >(tee -a "$run_dir/train.log") 2>&1
    # (No restart count: the plugin's jobstep clears SLURM_* but the job id.)
    # A leading newline: a killed attempt may have left a progress bar without one.
    printf '\n'
    echo "train_launch: $(date -u +%FT%TZ) start${SLURM_JOB_ID:+ (job $SLURM_JOB_ID)}"
fi

# Inside SLURM the trainer always runs in a job step of its own (srun), also for one
# node: `--signal=USR1@N` (time limit) reaches job steps, not the batch shell that runs
# the plugin's jobstep, so without a step a one-node run would end in TIMEOUT.
if [ -n "${SLURM_JOB_ID:-}" ] && [ -z "$launcher" ]; then
    launcher=srun
fi
if [ -n "${SLURM_JOB_ID:-}" ] && [ -n "$launcher" ]; then
    # In an image (--sdm apptainer) the site's SLURM client is not there unless bound in.
    if ! command -v "$launcher" >/dev/null 2>&1; then
        where="${APPTAINER_CONTAINER:-${SINGULARITY_CONTAINER:-}}"
        echo "train_launch: '$launcher' is not on PATH${where:+ inside the container $where}: a SLURM" \
            "training job starts its trainers with it; bind the site's SLURM client into the image" \
            "(apptainer-args, docs/container.md)" >&2
        exit 2
    fi
    nodes="${MARBLE_NODES:-1}"
    ntasks="${MARBLE_TASKS:-$nodes}"
    per_node=()
    [ "$ntasks" = "$nodes" ] && per_node=(--ntasks-per-node=1)
    echo "train_launch: $ntasks torchrun node(s) on $nodes host(s) via $launcher (job $SLURM_JOB_ID)"
    "$launcher" --nodes="$nodes" --ntasks="$ntasks" "${per_node[@]}" \
        --cpus-per-task="${MARBLE_CPUS_PER_TASK:-1}" --kill-on-bad-exit=1 \
        bash "$here/torchrun_slurm.sh" "$@"
elif [ "$gpus" -gt 1 ]; then
    torchrun --standalone --nnodes 1 --nproc_per_node "$gpus" -m marble.train "$@"
else
    marble train "$@"
fi
