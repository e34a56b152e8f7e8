#!/usr/bin/env bash
# Installs the Debian packages Crucible builds and tests with (or the packages named as
# arguments); does nothing when all are present.
#   scripts/install-deps.sh            everything `make test` needs (Slurm, MPICH, torch, clang, ...)
#   scripts/install-deps.sh --demo     only what `make demo` needs: the compiler and the libraries
#                                      `crucible` links (no test frameworks, schedulers or torch)
#   scripts/install-deps.sh PKG...     the packages named
# apt's and dpkg's output goes to a log file; the terminal gets one line per phase:
#   install-deps: installing 16 packages (NAMES)... done in N s (log: ~/.cache/crucible/install-deps.log)
set -euo pipefail
build_packages=(
  build-essential cmake ninja-build pkg-config git
  libopenblas-openmp-dev libopenblas0-openmp libdnnl-dev
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libxxhash-dev libpcre2-dev
  libopenmpi-dev openmpi-bin python3
  libarchive-dev libncurses-dev libjs-chart.js
)
default_packages=(
  "${build_packages[@]}"
  mpich libmpich-dev
  slurm-wlm munge
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-venv python3-pip python3-torch python3-numpy
  clang libclang-rt-14-dev
  chromium chromium-driver tmux
)
if [ "${1:-}" = "--demo" ]; then
  packages=("${build_packages[@]}")
elif [ $# -gt 0 ]; then
  packages=("$@")
else
  packages=("${default_packages[@]}")
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log_dir=${CRUCIBLE_CACHE:-$HOME/.cache/crucible}
  mkdir -p "$log_dir"
  log=$log_dir/install-deps.log
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  started=$(date +%s)
  printf 'install-deps: installing %d packages (%s)... ' "${#missing[@]}" "${missing[*]}" >&2
  {
    echo "== $(date -u +%FT%TZ) installing ${missing[*]}"
    $sudo apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
  } >> "$log" 2>&1 || {
    echo "FAILED after $(( $(date +%s) - started )) s; the end of $log:" >&2
    tail -n 15 "$log" >&2
    exit 1
  }
  echo "done in $(( $(date +%s) - started )) s (log: $log)" >&2
fi
# Open MPI and MPICH side by side: Debian's alternatives (mpirun, mpiexec, mpicc, the mpi
# headers) stay Open MPI's (priority 50 against MPICH's 40), which the build and the tests
# assume; MPICH is used by its own names (mpiexec.mpich, mpicc.mpich; make build-mpich).
for alternative in mpi mpirun; do
  value=$(update-alternatives --query "$alternative" 2>/dev/null | sed -n 's/^Value: //p')
  case "$value" in
    *openmpi* | "") ;;
    *) echo "install-deps: warning: the '$alternative' alternative is $value, not Open MPI;" \
         "Crucible's default build and tests expect Open MPI (update-alternatives --auto $alternative)" >&2 ;;
  esac
done
