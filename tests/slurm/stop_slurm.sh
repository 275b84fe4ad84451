#!/usr/bin/env bash
# Stop the localhost SLURM started by start_slurm.sh (daemons by their pid files).
set -uo pipefail
for pidfile in /run/slurmd.pid /run/slurmctld.pid; do
    [ -s "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null
done
[ -s /run/munge/munged.pid ] && kill "$(cat /run/munge/munged.pid)" 2>/dev/null
exit 0
