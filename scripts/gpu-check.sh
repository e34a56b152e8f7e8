#!/usr/bin/env bash
# The one prepared check for a lent GPU machine (one H200; CUDA toolkit, CMake, ninja, PyTorch
# in /opt/torch/.venv; none of Crucible's dev packages). Here: `make gpu-pack`
# (scripts/pack-gpu-build.sh, which prints the glibc the pack needs); then the device call, from
# the repository root:
#   run(command="scripts/gpu-check.sh", carry=["gpu-pack"], timeout_s=420)
# The script ends by itself within GPU_CHECK_DEADLINE_S (default 390 s): with the machine's start
# (1-2 min) that is about 9 of the 15 minutes, which leaves more than 4 for a second run. Give the
# machine back (give_back) unless you rerun at once.
#
# It prints `ldd --version` and stops at once when the device's glibc is older than the pack's,
# or when a library is not found (naming it). Then, each stage capped at the smaller of its own
# cap and what is left of the deadline (a stage with under 10 s left is reported as skipped):
# test_gpu (CRUCIBLE_GPU_REQUIRED=1, CUDA_LAUNCH_BLOCKING=1: no GPU is a FAIL, a kernel fault
# names its kernel); `crucible smoke --portable --device cuda` against the CPU's golden; 50 steps
# of a small `tiny` on cuda and on cpu (loss curves within tolerance), two cuda runs (same
# weights_xxh3), a cuda resume (bit-exact), checkpoints across devices (cuda -> cpu, cpu -> cuda);
# the frozen-RMSNorm detector under master_dtype = "bfloat16" on cuda (and silent under fp32,
# both runs exiting 0); and bench/gpu_train.py on `base` (a 60 s budget, a 90 s cap).
# After every stage $OUT/summary.txt and $OUT/logs.tar.gz are rewritten, so a run cut off by the
# tool's limit still brings back what it had done. A failing stage does not stop the next.
#
# Crucible runs through a wrapper ($WORK/bin/crucible) that sets LD_LIBRARY_PATH for itself (the
# packed Debian libraries, then the toolkit's); Python (the benchmark's PyTorch peer) keeps the
# environment it was started with.
#
# Knobs (for the dry run here, tests/integration/test_gpu_check.py): GPU_CHECK_DEADLINE_S,
# GPU_PACK (the pack folder, default gpu-pack), OUT (default ./gpu-check-out).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
DEADLINE=${GPU_CHECK_DEADLINE_S:-390}
PACK=${GPU_PACK:-gpu-pack}
mkdir -p "$OUT"
WORK=$(mktemp -d)
# The run tool returns at most 8 files from $OUT: the logs go into one archive, rewritten often.
LOGS=$WORK/logs
mkdir -p "$LOGS"
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
save() {  # the summary and the logs so far, each replaced atomically
  cp "$SUMMARY" "$LOGS/summary.txt"
  tar -C "$LOGS" -czf "$OUT/.logs.tar.gz" . 2>/dev/null && mv -f "$OUT/.logs.tar.gz" "$OUT/logs.tar.gz"
  [[ -f $LOGS/bench/gpu_train.json ]] && cp "$LOGS/bench/gpu_train.json" "$OUT/"
  return 0
}
finish() {
  say "gpu-check: $(grep -c FAIL "$SUMMARY") failing checks ($SECONDS s of the ${DEADLINE} s deadline)"
  save
  rm -rf "$WORK"
  exit "${1:-0}"
}
# Killed by the tool (SIGTERM) or by hand: what was done still comes back.
running=
trap '[[ -n $running ]] && kill "$running" 2>/dev/null
      say "gpu-check: stopped by a signal after $SECONDS s"; finish 143' TERM INT
left() { echo $((DEADLINE - SECONDS)); }
stage() {  # stage NAME SECONDS COMMAND...: runs it capped, logs to $LOGS/NAME.log; sets $rc
  local name=$1 seconds=$2
  shift 2
  local remaining
  remaining=$(left)
  (( remaining - 5 < seconds )) && seconds=$((remaining - 5))
  if (( seconds < 10 )); then
    say "$name: FAIL skipped (deadline: $remaining s left)"
    rc=125
    save
    return $rc
  fi
  local start=$SECONDS
  # timeout runs programs, not shell functions: the command runs in a bash that is given this
  # script's train function and the variables it reads.
  local definitions
  definitions="$(declare -f train)"$'\n'"$(declare -p TINY CRUCIBLE WORK 2>/dev/null)"
  # In the background and waited for, so that a signal to this script runs its trap at once.
  timeout "$seconds" bash -c "$definitions"$'\n''"$@"' stage "$@" > "$LOGS/$name.log" 2>&1 &
  running=$!
  wait "$running"
  rc=$?
  running=
  local verdict="FAIL rc=$rc"
  [[ $rc == 0 ]] && verdict=PASS
  [[ $rc == 124 ]] && verdict="FAIL timed out at its ${seconds} s cap"
  say "$name: $verdict ($((SECONDS - start)) s, $name.log$(tail_of "$name" "$rc"))"
  save
  return $rc
}
tail_of() {  # on failure, the log's last line, so the summary alone says why
  [[ $2 == 0 ]] && return
  local last
  last=$(grep -v '^\s*$' "$LOGS/$1.log" | tail -1 | cut -c1-160)
  [[ -n $last ]] && printf ': %s' "$last"
}

say "glibc here: $(ldd --version 2>&1 | head -1)"
tar -C "$WORK" -xzf "$PACK/crucible-gpu.tar.gz" || { say "unpack: FAIL (run make gpu-pack here first)"; finish 1; }
say "build commit $(cat "$WORK/commit"), tree $(git rev-parse HEAD 2>/dev/null || echo unknown)"
needed=$(cat "$WORK/glibc" 2>/dev/null || echo unknown)
have=$(ldd --version 2>&1 | head -1 | grep -oE '[0-9]+\.[0-9]+$')
if [[ $needed != unknown && -n $have ]] &&
   [[ $(printf '%s\n%s\n' "$needed" "$have" | sort -V | head -1) != "$needed" ]]; then
  say "glibc: FAIL the pack needs GLIBC_$needed, this machine has $have: build the pack on an older system"
  finish 1
fi
say "glibc: PASS the pack needs GLIBC_$needed, this machine has $have"

# cuBLASLt: ldconfig's, the toolkit's, or the pip wheels' (nvidia-cublas under /opt or /usr/local).
CUDA_LIBS=
add_dir() { [[ -n $1 && -d $1 && :$CUDA_LIBS: != *:$1:* ]] && CUDA_LIBS=${CUDA_LIBS:+$CUDA_LIBS:}$1; }
found=$(ldconfig -p 2>/dev/null | awk '/libcublasLt\.so\.13 /{print $NF; exit}')
[[ -n $found ]] && add_dir "$(dirname "$found")"
for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -e $dir/libcublasLt.so.13 ]] && add_dir "$dir"
done
if [[ -z $CUDA_LIBS ]]; then
  found=$(find /usr/local /opt -name 'libcublasLt.so.13*' -not -path '*/proc/*' 2>/dev/null | head -1)
  [[ -n $found ]] && add_dir "$(dirname "$found")"
fi
say "cuBLASLt: ${CUDA_LIBS:-not found under ldconfig, /usr/local or /opt}"
# Crucible's library path is its own: the wrappers set it, nothing else sees it.
mkdir -p "$WORK/run"
for binary in crucible crucible-rank test_gpu; do
  cat > "$WORK/run/$binary" <<EOF
#!/usr/bin/env bash
export LD_LIBRARY_PATH="$WORK/lib${CUDA_LIBS:+:$CUDA_LIBS}\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$WORK/bin/$binary" "\$@"
EOF
  chmod +x "$WORK/run/$binary"
done
CRUCIBLE=$WORK/run/crucible
nvidia-smi > "$LOGS/nvidia-smi.txt" 2>&1; head -15 "$LOGS/nvidia-smi.txt"
LD_LIBRARY_PATH="$WORK/lib${CUDA_LIBS:+:$CUDA_LIBS}" ldd "$WORK/bin/crucible" "$WORK/bin/test_gpu" \
  > "$LOGS/ldd.txt" 2>&1
if grep -q "not found" "$LOGS/ldd.txt"; then
  say "ldd: FAIL $(grep 'not found' "$LOGS/ldd.txt" | awk '{print $1}' | sort -u | tr '\n' ' ')not found"
  finish 1
fi
say "ldd: PASS every library found"
save

stage test_gpu 120 env CUDA_LAUNCH_BLOCKING=1 CRUCIBLE_GPU_REQUIRED=1 "$WORK/run/test_gpu" --gtest_output=xml:"$LOGS/test_gpu.xml"
# The portable exact mode on the GPU against the golden the CPU made, bit for bit; the run's own
# log comes along when it fails (smoke names a path under $WORK, which is removed).
stage smoke_portable_cuda 90 "$CRUCIBLE" smoke --portable --device cuda \
  --golden tests/golden/smoke-portable.json --work-dir "$WORK/smoke_portable"
[[ -f $WORK/smoke_portable/train.log ]] && cp "$WORK/smoke_portable/train.log" "$LOGS/smoke_portable_train.log"

# A small tiny: 50 steps, seq 256, batch 4, no validation; the cpu run is the reference curve.
TINY=(-c configs/tiny.toml --set training.steps=50 --set training.seq_len=256
      --set training.local_batch_size=4 --set checkpoint.interval=25)
train() {  # train NAME DEVICE [--set ...]
  local name=$1 device=$2
  shift 2
  "$CRUCIBLE" train "${TINY[@]}" --set training.device="$device" --set job.dump_folder="$WORK/$name" "$@"
}
xxh() { grep -o 'weights_xxh3=[0-9a-f]*' "$LOGS/$1.log" | tail -1; }
stage train_cuda 45 train cuda cuda
stage train_cpu 90 train cpu cpu
stage train_cuda_again 45 train cuda_again cuda
stage train_cuda_bf16 45 train cuda_bf16 cuda --set training.mixed_precision_param=bfloat16
python3 - "$LOGS" > "$LOGS/curves.txt" 2>&1 <<'PY'
import re, sys, pathlib
out = pathlib.Path(sys.argv[1])
def losses(name):
    text = (out / f"{name}.log").read_text() if (out / f"{name}.log").exists() else ""
    return [float(m) for m in re.findall(r"^step=\d+ loss=(\S+)", text, re.M)]
cpu = losses("train_cpu")
for name, tol in (("train_cuda", 2e-3), ("train_cuda_bf16", 3e-2)):
    gpu = losses(name)
    if not cpu or len(gpu) != len(cpu):
        print(f"{name} curve: FAIL {len(gpu)} steps vs {len(cpu)} on cpu"); continue
    worst = max(abs(a - b) / abs(b) for a, b in zip(gpu, cpu))
    print(f"{name} curve: {'PASS' if worst <= tol else 'FAIL'} worst relative loss difference {worst:.2e} "
          f"(tolerance {tol}) final cuda {gpu[-1]:.6f} cpu {cpu[-1]:.6f}")
PY
cat "$LOGS/curves.txt" | tee -a "$SUMMARY"
a=$(xxh train_cuda) b=$(xxh train_cuda_again)
say "cuda run to run: $([[ -n $a && $a == "$b" ]] && echo PASS || echo FAIL) (${a:-none} vs ${b:-none})"
save

# Resume on cuda: the straight run wrote ckpt/step-25; a copy resumed from it must end the same.
if [[ -d $WORK/cuda/ckpt/step-25 ]]; then
  cp -r "$WORK/cuda" "$WORK/cuda_resumed" && rm -rf "$WORK/cuda_resumed/ckpt/step-50"
  stage train_cuda_resumed 45 train cuda_resumed cuda --resume "$WORK/cuda_resumed/ckpt/step-25"
  c=$(xxh train_cuda_resumed)
  say "cuda resume: $([[ -n $c && $c == "$a" ]] && echo PASS || echo FAIL) (${c:-none} vs ${a:-none})"
else
  say "cuda resume: FAIL (no ckpt/step-25 from the straight cuda run)"
fi

# Checkpoints across devices (the files are the same format): step-25 of the cuda run resumes on
# cpu and step-25 of the cpu run on cuda; steps 26-50 must follow the writer's curve within the
# cpu-vs-cuda curve tolerance, and the resumed run must list the device change as allowed.
cross() {  # cross NAME WRITER DEVICE SECONDS
  local name=$1 writer=$2 device=$3 seconds=$4
  if [[ -d $WORK/$writer/ckpt/step-25 ]]; then
    cp -r "$WORK/$writer" "$WORK/$name" && rm -rf "$WORK/$name/ckpt/step-50"
    stage "$name" "$seconds" train "$name" "$device" --resume "$WORK/$name/ckpt/step-25"
  else
    say "$name: FAIL (no ckpt/step-25 from the $writer run)"
  fi
}
cross resume_cpu_on_cuda cpu cuda 45
cross resume_cuda_on_cpu cuda cpu 60
python3 - "$LOGS" > "$LOGS/cross_device.txt" 2>&1 <<'PY'
import re, sys, pathlib
out = pathlib.Path(sys.argv[1])
def log(name):
    path = out / f"{name}.log"
    return path.read_text() if path.exists() else ""
def losses(name):
    return {int(s): float(l) for s, l in re.findall(r"^step=(\d+) loss=(\S+)", log(name), re.M)}
for name, writer in (("resume_cuda_on_cpu", "train_cuda"), ("resume_cpu_on_cuda", "train_cpu")):
    got, want = losses(name), losses(writer)
    steps = [s for s in range(26, 51)]
    if not all(s in got and s in want for s in steps):
        print(f"{name} curve: FAIL steps 26-50 missing ({len(got)} resumed, {len(want)} from {writer})")
        continue
    worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in steps)
    allowed = "config changed (allowed): training.device" in log(name)
    ok = worst <= 2e-3 and allowed
    print(f"{name} curve: {'PASS' if ok else 'FAIL'} worst relative loss difference {worst:.2e} vs "
          f"{writer} over steps 26-50 (tolerance 2e-3); device change listed as allowed: {allowed}")
PY
cat "$LOGS/cross_device.txt" | tee -a "$SUMMARY"
save

# The frozen-RMSNorm detector on cuda: fires under bf16 master weights, silent under fp32; both
# runs must end with exit 0 (a crashed fp32 run is not "quiet").
DETECT=(--set model.flavor=debug --set training.steps=12 --set debug.frozen_steps=5
        --set optimizer.lr=1e-3 --set lr_scheduler.warmup_steps=0 --set checkpoint.enable=false)
stage detector_bf16_master 30 train detect_bf16 cuda "${DETECT[@]}" --set training.master_dtype=bfloat16
bf16_rc=$rc
stage detector_fp32_master 30 train detect_fp32 cuda "${DETECT[@]}"
fp32_rc=$rc
fired=$(grep -c "model.norm.weight.*below half a bfloat16 ULP" "$LOGS/detector_bf16_master.log" 2>/dev/null)
quiet=$(grep -c "^warning:" "$LOGS/detector_fp32_master.log" 2>/dev/null)
ok=FAIL
[[ $bf16_rc == 0 && $fp32_rc == 0 && ${fired:-0} -ge 1 && ${quiet:-1} == 0 ]] && ok=PASS
say "frozen-RMSNorm detector on cuda: $ok (bf16 master: exit $bf16_rc, ${fired:-0} warnings on model.norm.weight; fp32 master: exit $fp32_rc, ${quiet:-?} warnings)"
save

# The benchmark: `base` only, a 60 s budget for starting runs and a hard end 10 s before its cap,
# the JSON rewritten after every row. Python with the environment this script was started with.
if [[ -f bench/gpu_train.py ]]; then
  stage bench_gpu_train 90 env CRUCIBLE="$CRUCIBLE" python3 bench/gpu_train.py --flavors base \
    --batch 4 --budget-s 60 --hard-stop-s 80 --out "$LOGS/bench"
fi
finish 0
