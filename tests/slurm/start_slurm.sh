#!/usr/bin/env bash
# Start a single-host SLURM cluster on localhost (idempotent; needs root).
# Installs slurm-wlm + munge from Debian when missing, writes /etc/slurm/slurm.conf
# with this machine's CPUs and memory (from `slurmd -C`), accounting off, then starts
# munged, slurmctld and slurmd and waits until `sinfo` shows the node idle.
# Exit status: 0 ready, 3 cannot install (no apt / no network), 1 anything else.
set -euo pipefail
log() { echo "start_slurm: $*"; }

if [ "$(id -u)" -ne 0 ]; then log "needs root"; exit 3; fi
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    command -v apt-get >/dev/null || { log "no apt-get to install slurm-wlm"; exit 3; }
    log "installing slurm-wlm munge"
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get install -y -q slurm-wlm munge >/dev/null 2>&1 \
           || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q slurm-wlm munge >/dev/null; }; }; then
        log "apt-get install slurm-wlm munge failed"; exit 3
    fi
fi

host="$(hostname -s)"
# A requeued job may start again only cred_expire + 1 s later (SLURM's default 120 s): 30 s here
# keeps the requeue tests short, and a job step's credential still outlives a slow launch on
# two busy cores. A cluster started before this setting is restarted once to take it.
CRED_EXPIRE=30
if sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
    if scontrol show config 2>/dev/null | grep -q "cred_expire=$CRED_EXPIRE"; then
        log "already running on $host"; exit 0
    fi
    log "restarting: the running cluster lacks cred_expire=$CRED_EXPIRE"
    "$(dirname "$0")/stop_slurm.sh"
    for _ in $(seq 1 30); do { pgrep -x slurmctld || pgrep -x slurmd; } >/dev/null || break; sleep 0.5; done
fi

# munge: key, runtime dir owned by munge, daemon as the munge user.
if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
fi
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
chmod 755 /run/munge
if ! pgrep -u munge munged >/dev/null; then
    runuser -u munge -- munged --force
fi

# slurm.conf from this node's real size.
node_line="$(slurmd -C | head -n 1)"
cpus="$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$node_line")"
mem="$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node_line")"
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=marble-ci
SlurmctldHost=$host
AuthType=auth/munge
AuthInfo=cred_expire=$CRED_EXPIRE
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=600
ReturnToService=2
SlurmUser=root
SlurmdUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
MpiDefault=none
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
log "node $host: CPUs=$cpus RealMemory=$mem"

pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd
for _ in $(seq 1 60); do
    state="$(sinfo -h -o '%T' 2>/dev/null | head -n 1 || true)"
    case "$state" in
        idle|mixed|allocated) log "ready ($state)"; exit 0 ;;
        down*|drain*) scontrol update NodeName="$host" State=RESUME >/dev/null 2>&1 || true ;;
    esac
    sleep 1
done
log "sinfo never showed the node idle"; sinfo || true
tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log || true
exit 1
