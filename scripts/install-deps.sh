#!/usr/bin/env bash
# Installs the Debian packages Crucible builds and tests with (or the packages named as
# arguments); does nothing when all are present.
set -euo pipefail
default_packages=(
  build-essential cmake ninja-build pkg-config git
  libopenblas-openmp-dev libopenblas0-openmp libdnnl-dev
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libxxhash-dev libpcre2-dev
  libopenmpi-dev openmpi-bin mpich libmpich-dev
  slurm-wlm munge
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-venv python3-pip python3-torch python3-numpy
  clang libclang-rt-14-dev
)
if [ $# -gt 0 ]; then packages=("$@"); else packages=("${default_packages[@]}"); fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
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
