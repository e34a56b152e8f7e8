#!/usr/bin/env bash
# Packs a CUDA build made here for the lent GPU machine (which has the CUDA toolkit, CMake and
# PyTorch but none of Crucible's Debian dev packages, and no package registry):
#   scripts/pack-gpu-build.sh [BUILD_DIR] [PACK_DIR]     (defaults: build gpu-pack)
# PACK_DIR/crucible-gpu.tar.gz holds bin/ (crucible, crucible-rank, test_gpu), `commit`, `glibc`
# (the newest glibc the pack needs, printed here too) and lib/: the shared libraries they load that are not the base system's (glibc, libstdc++, libgcc_s), the CUDA driver's (libcuda)
# or the CUDA toolkit's (libcublasLt is ~540 MB and the device's toolkit has it). PACK_DIR must
# be ignored by git (.gitignore lists gpu-pack/; another name goes in .git/info/exclude) and named in the `carry` list of the
# device run; scripts/gpu-check.sh unpacks it. Fails when the pack exceeds 50 MiB (64 MiB travel).
set -euo pipefail
BUILD=${1:-build}
PACK=${2:-gpu-pack}
cd "$(git rev-parse --show-toplevel)"
for binary in crucible crucible-rank test_gpu; do
  [[ -x $BUILD/$binary ]] || { echo "pack-gpu-build: $BUILD/$binary is missing: build with the CUDA toolkit (cmake -DCRUCIBLE_CUDA=ON) first" >&2; exit 2; }
done
rm -rf "$PACK"
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$PACK" "$STAGE/bin" "$STAGE/lib"
cp "$BUILD/crucible" "$BUILD/crucible-rank" "$BUILD/test_gpu" "$STAGE/bin/"
strip --strip-debug "$STAGE"/bin/* 2>/dev/null || true
system='^(linux-vdso|ld-linux|libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libcuda|libcublas|libcublasLt|libcudart|libnvidia)[.-]'
for binary in "$STAGE"/bin/*; do
  ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ $name =~ $system ]] && continue
    cp -L -n "$path" "$STAGE/lib/$name"
  done
done
[[ $(realpath "$PACK") != "$PWD"/* ]] || git check-ignore -q "$PACK/crucible-gpu.tar.gz" ||
  echo "pack-gpu-build: warning: $PACK is not ignored by git; add /$PACK/ to .git/info/exclude" >&2
# The build's identity, for the device log.
{ git rev-parse HEAD | tr -d '\n'; git diff --quiet HEAD -- 2>/dev/null || printf ' (with uncommitted changes)'; echo; } \
  > "$STAGE/commit"
# The newest glibc symbol version any packed binary or library needs (every binary links MPI,
# and through it Debian 12's libevent_core, GLIBC_2.36): gpu-check.sh compares it with the
# device's `ldd --version` and stops in one line when the device's is older.
glibc=$(for file in "$STAGE"/bin/* "$STAGE"/lib/*; do objdump -T "$file" 2>/dev/null; done |
        grep -oE 'GLIBC_[0-9]+(\.[0-9]+)+' | sed 's/^GLIBC_//' | sort -u -V | tail -1)
echo "${glibc:-unknown}" > "$STAGE/glibc"
needer=$(for file in "$STAGE"/bin/* "$STAGE"/lib/*; do
           if objdump -T "$file" 2>/dev/null | grep "GLIBC_$glibc[^.0-9]" > /dev/null; then basename "$file"; fi
         done |
         head -3 | tr '\n' ' ')
echo "pack-gpu-build: the pack needs glibc ${glibc:-unknown} or newer (GLIBC_$glibc in: ${needer% })"
libraries=$(ls "$STAGE/lib" | wc -l)
tar -C "$STAGE" -czf "$PACK/crucible-gpu.tar.gz" bin lib commit glibc
bytes=$(du -sb "$PACK" | cut -f1)
echo "pack-gpu-build: $PACK is $((bytes / 1048576)) MiB ($libraries libraries): carry [\"$PACK\"]"
if (( bytes > 50 * 1048576 )); then
  echo "pack-gpu-build: $PACK is over 50 MiB; the device run carries at most 64 MiB in all" >&2
  exit 1
fi
