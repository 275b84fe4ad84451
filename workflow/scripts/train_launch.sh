#!/usr/bin/env bash
# Start `marble train` the right way for where the job runs.
#   train_launch.sh MPI_LAUNCHER -- <marble train arguments>
# MPI_LAUNCHER is the rule's `mpi` resource: "srun" for a multi-node SLURM job (the
# executor plugin then leaves the launch to us), "" otherwise.
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
    ntasks="${SLURM_NTASKS:-$SLURM_NNODES}"
    echo "train_launch: $ntasks torchrun node(s) on ${SLURM_NNODES} host(s) via $launcher (job ${SLURM_JOB_ID})"
    # srun inside a batch script does not inherit --cpus-per-task (SLURM >= 22.05).
    exec "$launcher" --ntasks="$ntasks" \
        --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" --kill-on-bad-exit=1 \
        bash "$here/torchrun_slurm.sh" "$@"
elif [ -n "${SLURM_JOB_ID:-}" ]; then
    exec bash "$here/torchrun_slurm.sh" "$@"
elif [ "$gpus" -gt 1 ]; then
    exec torchrun --standalone --nnodes 1 --nproc_per_node "$gpus" -m marble.train "$@"
else
    exec marble train "$@"
fi
