#!/bin/bash
# Rank 0 runs the command (crucible train, one rank until training is distributed); every other
# rank stands in for a data-parallel peer: it lives as long as rank 0 and ends with it. Rank 0's
# trainer pid goes to $CRUCIBLE_RUN_DIR/trainer-<attempt>.pid so a test can kill it mid-run.
set -u
done_file="$CRUCIBLE_RUN_DIR/.rank0-done-$CRUCIBLE_ATTEMPT"
if [ "$CRUCIBLE_RANK" = 0 ]; then
  "$@" &
  pid=$!
  echo "$pid" > "$CRUCIBLE_RUN_DIR/trainer-$CRUCIBLE_ATTEMPT.pid"
  trap 'kill -TERM $pid' TERM
  wait "$pid"; rc=$?
  [ $rc -gt 128 ] && [ -e /proc/$pid ] && { wait "$pid"; rc=$?; }  # woken by the trap: wait again
  touch "$done_file"
  exit $rc
fi
trap 'exit 143' TERM
while [ ! -e "$done_file" ]; do sleep 0.1; done
