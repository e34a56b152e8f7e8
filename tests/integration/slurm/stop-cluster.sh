#!/usr/bin/env bash
# Stops the daemons start-cluster.sh DIR started, by the pids it recorded (never by name):
# SIGTERM, up to 10 s, then SIGKILL. Safe to run twice or on a half-started cluster.
set -uo pipefail
dir=$(realpath -m "${1:?usage: stop-cluster.sh DIR}")
pids=()
for f in "$dir"/pids/slurmd.*.pid "$dir"/pids/slurmctld.pid "$dir"/pids/munged.pid; do
  [ -f "$f" ] || continue
  pid=$(tr -dc 0-9 < "$f")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && { kill -TERM "$pid" 2>/dev/null; pids+=("$pid"); }
done
for _ in $(seq 100); do
  alive=0
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
  [ $alive -eq 0 ] && exit 0
  sleep 0.1
done
for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
exit 0
