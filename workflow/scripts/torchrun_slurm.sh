#!/usr/bin/env bash
# One SLURM task per node: torchrun with a c10d rendezvous on the allocation's first
# host (no hard-coded address), one process per GPU (one on CPU, gloo).
#   torchrun_slurm.sh <marble train arguments>
# Preemption / time limit: the job is submitted with --requeue --signal=USR1@N; task 0
# requeues the job on USR1, and the requeued job resumes from the last complete
# checkpoint (marble train always resumes from its run folder).
set -euo pipefail
: "${SLURM_JOB_ID:?torchrun_slurm.sh runs inside a SLURM job}"
# One torchrun "node" per task of this step: = $SLURM_NNODES on a cluster (one task per
# node); more than the hosts only when a test packs several tasks onto one machine.
nnodes="${SLURM_STEP_NUM_TASKS:-${SLURM_NTASKS:-${SLURM_NNODES:-1}}}"
nproc="${MARBLE_GPUS_PER_NODE:-0}"
[ "$nproc" -gt 0 ] || nproc=1
nodelist="${SLURM_JOB_NODELIST:-${SLURM_NODELIST:-}}"
if [ -n "$nodelist" ]; then
    head_host="$(scontrol show hostnames "$nodelist" | head -n 1)"
else
    head_host="$(hostname)"  # one node, started by the jobstep itself (no srun step)
fi
port="${MARBLE_RDZV_PORT:-29500}"
echo "torchrun_slurm: task ${SLURM_PROCID:-0} of $nnodes on $(hostname -s)," \
    "$nproc proc(s), rendezvous $head_host:$port id $SLURM_JOB_ID"

requeue() {
    echo "torchrun_slurm: USR1 (time limit or preemption): requeue job $SLURM_JOB_ID"
    if [ "${SLURM_PROCID:-0}" = "0" ]; then
        scontrol requeue "$SLURM_JOB_ID" || true
    fi
}
trap requeue USR1

torchrun --nnodes "$nnodes" --nproc_per_node "$nproc" \
    --rdzv_backend c10d --rdzv_endpoint "$head_host:$port" --rdzv_id "$SLURM_JOB_ID" \
    --max_restarts 0 -m marble.train "$@" &
child=$!
# `wait` returns early when a trapped signal arrives: keep waiting for torchrun.
while true; do
    set +e
    wait "$child"
    status=$?
    set -e
    if ! kill -0 "$child" 2>/dev/null; then
        exit "$status"
    fi
done
