#!/usr/bin/env bash
# One SLURM task per node: torchrun with a c10d rendezvous on the allocation's first
# host (no hard-coded address), one process per GPU (one on CPU, gloo).
#   torchrun_slurm.sh <marble train arguments>
# Time limit: the job is submitted with --requeue --signal=USR1@N. On USR1 this script asks
# the training processes to stop: they finish the optimizer step in flight, write a
# checkpoint and exit with marble.training.stopping.EXIT_REQUEUE (75). Because torchrun
# reports a failed worker as status 1, they also write $MARBLE_REQUEUE_FILE; when torchrun
# returns with that file present (or that status), task 0 runs `scontrol requeue`, and the
# requeued job resumes from that checkpoint (marble train always resumes from its run folder).
# TERM is a cancel (scancel, an admin, Snakemake's Ctrl-C, a preemption): the trainers
# checkpoint and stop the same way, but nothing here requeues, so a cancelled job stays
# cancelled (under PreemptMode=REQUEUE slurmctld requeues a preempted job itself).
set -euo pipefail
child=""
pending=""
cancelled=""

# The workers are torchrun's direct children (each in its own session, so a process group
# signal would miss them); marble.training.stopping flags the signal in each of them.
signal_workers() {
    if [ -n "$child" ] && [ -n "$pending" ]; then pkill "-$pending" -P "$child" 2>/dev/null || true; fi
}
forward() {
    if [ "$1" = TERM ]; then
        # Remembered: a TERM after the time-limit USR1 (a cancel during that stop) still
        # means no requeue.
        cancelled=1
        echo "torchrun_slurm: TERM (scancel or preemption): asking training to checkpoint and stop, no requeue"
    else
        echo "torchrun_slurm: USR1 (time limit): asking training to checkpoint and stop, then requeue"
    fi
    pending="$1"
    signal_workers
}
# Trapped from the start: SLURM may send USR1 up to a minute before the time it was asked
# for, so it can come before torchrun has started its workers (or before they install their
# handler, while USR1 is still ignored): kept as pending and sent again below until torchrun
# ends. A repeat is harmless: the workers only record it.
trap 'forward USR1' USR1
trap 'forward TERM' TERM
# The requeue exit code from its one home (the environment that runs `-m marble.train` below;
# torch-free, ~0.1 s): a number written here too could drift from what the trainer exits with.
EXIT_REQUEUE="$(python -c 'from marble.training.stopping import EXIT_REQUEUE; print(EXIT_REQUEUE)')"
: "${SLURM_JOB_ID:?torchrun_slurm.sh runs inside a SLURM job}"
# One torchrun "node" per task of this step: = $SLURM_NNODES on a cluster (one task per
# node); more than the hosts only when a test packs several tasks onto one machine.
nnodes="${SLURM_STEP_NUM_TASKS:-${SLURM_NTASKS:-${SLURM_NNODES:-1}}}"
nproc="${MARBLE_GPUS_PER_NODE:-0}"
[ "$nproc" -gt 0 ] || nproc=1
nodelist="${SLURM_JOB_NODELIST:-${SLURM_NODELIST:-}}"
if [ -n "${MARBLE_RDZV_HOST:-}" ]; then
    head_host="$MARBLE_RDZV_HOST"  # looked up outside a container (slurm/train.sbatch)
elif [ -n "$nodelist" ]; then
    head_host="$(scontrol show hostnames "$nodelist" | head -n 1)"
else
    head_host="$(hostname)"  # one node, started by the jobstep itself (no srun step)
fi
# The rendezvous port: train.port when set, else derived from the job id, so two runs
# whose first node is the same host do not meet in one c10d store (a fixed 29500 did).
# 20000-29999 stays below Linux's ephemeral range (32768+), where outgoing connections
# take their ports; two jobs share a port only when their ids agree modulo 10000.
port="${MARBLE_RDZV_PORT:-}"
if [ -z "$port" ]; then
    port=$(( 20000 + ${SLURM_JOB_ID%%_*} % 10000 ))
fi
echo "torchrun_slurm: task ${SLURM_PROCID:-0} of $nnodes on $(hostname -s)," \
    "$nproc proc(s), rendezvous $head_host:$port id $SLURM_JOB_ID"

requeue_file="${TMPDIR:-/tmp}/marble-requeue.$SLURM_JOB_ID.${SLURM_PROCID:-0}.$$"
rm -f "$requeue_file"
export MARBLE_REQUEUE_FILE="$requeue_file"
# torchrun must survive USR1 (its default action is to die): an ignored signal stays ignored
# across exec (a trapped one does not), and the workers install their own handler.
( trap '' USR1; exec torchrun --nnodes "$nnodes" --nproc_per_node "$nproc" \
    --rdzv_backend c10d --rdzv_endpoint "$head_host:$port" --rdzv_id "$SLURM_JOB_ID" \
    --max_restarts 0 -m marble.train "$@" ) &
child=$!
signal_workers  # a signal that came before torchrun existed
# `wait` returns early when a trapped signal arrives: keep waiting for torchrun.
# With a signal pending, wake every 2 s to send it again until torchrun has ended.
while true; do
    set +e
    if [ -n "$pending" ] && kill -0 "$child" 2>/dev/null; then
        sleep 2 &
        wait $!
        signal_workers
        set -e
        continue
    fi
    wait "$child"
    status=$?
    set -e
    if ! kill -0 "$child" 2>/dev/null; then
        break
    fi
done
stopped="$(cat "$requeue_file" 2>/dev/null || echo "status $status")"
if [ -n "$cancelled" ]; then
    rm -f "$requeue_file"
    echo "torchrun_slurm: training stopped after a TERM ($stopped): job $SLURM_JOB_ID not requeued"
    exit "$status"
fi
if [ "$status" = "$EXIT_REQUEUE" ] || [ -e "$requeue_file" ]; then
    # The trainer's own line says whether a checkpoint was written ("step N SIGUSR1 with a
    # checkpoint" / "... without a checkpoint"): repeated, never assumed.
    echo "torchrun_slurm: training stopped for the time limit ($stopped): requeue job $SLURM_JOB_ID"
    rm -f "$requeue_file"
    # Task 0 requeues; the others exit 0 so srun --kill-on-bad-exit cannot kill task 0
    # before it has.
    if [ "${SLURM_PROCID:-0}" = "0" ]; then
        scontrol requeue "$SLURM_JOB_ID" || exit "$EXIT_REQUEUE"
    fi
    exit 0
fi
exit "$status"
