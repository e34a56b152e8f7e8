#!/usr/bin/env bash
# Builds the `crucible` program for `make demo`, quietly: CMake's and the compiler's output goes
# to BUILD_DIR/demo-build.log, the terminal gets a progress line every tenth of the way and one
# line at the end (or the log's last lines on an error).
#   scripts/quiet-build.sh [BUILD_DIR]     (default build)
# A new build folder is configured without the tests (CRUCIBLE_TESTS=OFF: no GoogleTest needed);
# one that `make test` configured keeps its tests.
set -euo pipefail
build=${1:-build}
mkdir -p "$build"
log=$build/demo-build.log
started=$(date +%s)
: > "$log"
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCRUCIBLE_TESTS=OFF >> "$log" 2>&1 || {
    echo "build: cmake failed; the end of $log:" >&2; tail -n 20 "$log" >&2; exit 1; }
fi
set +e
cmake --build "$build" -j "$(nproc)" --target crucible 2>&1 | tee -a "$log" |
  awk '/^\[[0-9]+\/[0-9]+\]/ {
         s = $1; gsub(/[][]/, "", s); split(s, part, "/")
         step = int(10 * part[1] / part[2])
         if (step > shown) { shown = step; printf "build: %d/%d\n", part[1], part[2]; fflush() }
       }'
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
  echo "build: failed; the end of $log:" >&2
  grep -E 'error|Error' "$log" | head -n 10 >&2
  tail -n 10 "$log" >&2
  exit "$status"
fi
echo "build: $build/crucible ready in $(( $(date +%s) - started )) s (log: $log)"
