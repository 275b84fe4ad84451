#!/usr/bin/env bash
# Start `marble train` the right way for where the job runs.
#   train_launch.sh MPI_LAUNCHER -- <marble train arguments>
# MPI_LAUNCHER is the rule's `mpi` resource: "srun" for a multi-node SLURM job (the
# executor plugin then leaves the launch to us), "" otherwise. The plugin's jobstep strips
# every SLURM_* variable but the job id, so the rule passes the geometry as MARBLE_NODES,
# MARBLE_TASKS and MARBLE_CPUS_PER_TASK; srun then sets SLURM_* for each task.
#  - SLURM, several tasks: srun starts the job's tasks (one per node); each runs torchrun_slurm.sh.
#  - SLURM, one node:   the plugin already runs us inside a job step: torchrun here.
#  - no SLURM:          plain `marble train` (torchrun --standalone when GPUs > 1).
set -euo pipefail
launcher=""
if [ "${1:-}" != "--" ]; then
    launcher="${1:-}"
    shift || true
fi
[ "${1:-}" = "--" ] && shift
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
gpus="${MARBLE_GPUS_PER_NODE:-0}"

if [ -n "${SLURM_JOB_ID:-}" ] && [ -n "$launcher" ]; then
    nodes="${MARBLE_NODES:-1}"
    ntasks="${MARBLE_TASKS:-$nodes}"
    per_node=()
    [ "$ntasks" = "$nodes" ] && per_node=(--ntasks-per-node=1)
    echo "train_launch: $ntasks torchrun node(s) on $nodes host(s) via $launcher (job $SLURM_JOB_ID)"
    exec "$launcher" --nodes="$nodes" --ntasks="$ntasks" "${per_node[@]}" \
        --cpus-per-task="${MARBLE_CPUS_PER_TASK:-1}" --kill-on-bad-exit=1 \
        bash "$here/torchrun_slurm.sh" "$@"
elif [ -n "${SLURM_JOB_ID:-}" ]; then
    exec bash "$here/torchrun_slurm.sh" "$@"
elif [ "$gpus" -gt 1 ]; then
    exec torchrun --standalone --nnodes 1 --nproc_per_node "$gpus" -m marble.train "$@"
else
    exec marble train "$@"
fi
