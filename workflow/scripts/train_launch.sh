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

# One trainer per run folder. A Snakemake restart (rerun-incomplete) may resubmit a run
# whose first job is still running: the lock names the owner, and a live owner (in
# squeue, or a live process on this host) makes this launch refuse. A requeued job has
# the same SLURM job id as the lock and goes on; a dead owner's lock is taken over.
run_dir=""
prev=""
for arg in "$@"; do
    [ "$prev" = "--output-dir" ] && run_dir="$arg"
    prev="$arg"
done
owner_alive() {  # kind id host
    case "$1" in
        slurm) [ "$2" != "${SLURM_JOB_ID:-}" ] &&
            [ -n "$(squeue -h -j "$2" -o %T 2>/dev/null | grep -Ev 'COMPLET|CANCEL|FAIL|TIMEOUT|PREEMPT' || true)" ] ;;
        pid) [ "$3" = "$(hostname)" ] && kill -0 "$2" 2>/dev/null ;;
        *) return 1 ;;
    esac
}
if [ -n "$run_dir" ]; then
    mkdir -p "$run_dir"
    lock="$run_dir/TRAINING.lock"
    if [ -s "$lock" ]; then
        read -r kind id host < "$lock" || true
        if owner_alive "$kind" "$id" "$host"; then
            echo "train_launch: $run_dir is being trained by $kind $id on $host (see $lock);" \
                "not starting a second trainer. Wait for it, or cancel it first." >&2
            exit 75
        fi
    fi
    if [ -n "${SLURM_JOB_ID:-}" ]; then
        echo "slurm $SLURM_JOB_ID $(hostname)" > "$lock"
    else
        echo "pid $$ $(hostname)" > "$lock"
    fi
    # No exec below: this shell stays to drop the lock when training ends.
    trap 'rm -f "$lock"' EXIT
    # The run folder keeps every attempt's output: Snakemake's jobstep recreates the
    # rule's log when SLURM requeues the job, so logs/train/<run>.log holds the last one.
    exec > >(tee -a "$run_dir/train.log") 2>&1
    # (No restart count: the plugin's jobstep clears SLURM_* but the job id.)
    # A leading newline: a killed attempt may have left a progress bar without one.
    printf '\n'
    echo "train_launch: $(date -u +%FT%TZ) start${SLURM_JOB_ID:+ (job $SLURM_JOB_ID)}, lock $lock"
fi

if [ -n "${SLURM_JOB_ID:-}" ] && [ -n "$launcher" ]; then
    nodes="${MARBLE_NODES:-1}"
    ntasks="${MARBLE_TASKS:-$nodes}"
    per_node=()
    [ "$ntasks" = "$nodes" ] && per_node=(--ntasks-per-node=1)
    echo "train_launch: $ntasks torchrun node(s) on $nodes host(s) via $launcher (job $SLURM_JOB_ID)"
    "$launcher" --nodes="$nodes" --ntasks="$ntasks" "${per_node[@]}" \
        --cpus-per-task="${MARBLE_CPUS_PER_TASK:-1}" --kill-on-bad-exit=1 \
        bash "$here/torchrun_slurm.sh" "$@"
elif [ -n "${SLURM_JOB_ID:-}" ]; then
    bash "$here/torchrun_slurm.sh" "$@"
elif [ "$gpus" -gt 1 ]; then
    torchrun --standalone --nnodes 1 --nproc_per_node "$gpus" -m marble.train "$@"
else
    marble train "$@"
fi
