#!/usr/bin/env bash
# Writes autograd cannot see, on the GPU machine, in one command (no network; the source tree as
# it is, the wheels of .whl/ beside it): installs the wheels into a scratch folder, builds what
# the runs load (the kernels, DeepSpeed's ops) side by side, then runs scripts/unseen_writes.py and
# the CUDA tests together, then the saved-tensor check's benchmark alone. Every step runs under a
# timeout taken from one budget (BUDGET seconds, default 520), so the whole stays under 9 minutes;
# a step that runs out of time leaves what it wrote. Writes at most 8 files into $OUT:
#   unseen-writes-DEVICE-torchV.md/.json, saved-check-DEVICE-torchV.md/.json, pytest-DEVICE-unseen-torchV.txt,
#   device-unseen-log.txt
# FULL_SUITE=1 runs the whole test suite instead of the CUDA tests (about 2.5 minutes more); BENCH_LIMIT: the
# seconds the benchmark may take (default 110, within the budget).
# DEVICE=cpu runs the same steps on CPU (a dry run on a machine without a GPU: the CUDA rows say
# not run, the CUDA tests skip, the benchmark is the CPU one): ROUNDS and JOBS make it shorter.
set -u
DEVICE=${DEVICE:-cuda}
JOBS=${JOBS:-10}
OUT=${OUT:-reports/device}
mkdir -p "$OUT"
BUDGET=${BUDGET:-520}
START=$SECONDS
PY=${PYTHON:-python3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/torchgen-patch-unseen.XXXXXXXX") || exit 3
trap 'rm -rf "$WORK"' EXIT
LOG="$OUT/device-unseen-log.txt"
log() { echo "== [$((SECONDS - START)) s] $*" | tee -a "$LOG"; }
# seconds a step may take: at most $1, and never past the budget less $2 (what later steps need)
limit() { local left=$((BUDGET - (SECONDS - START) - ${2:-0})); [ "$left" -lt "$1" ] && echo $((left > 10 ? left : 10)) || echo "$1"; }

log "torch $($PY -c 'import torch; print(torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device")' 2>&1)"
if ls .whl/*.whl >/dev/null 2>&1; then
  timeout 60 $PY -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" .whl/*.whl >>"$LOG" 2>&1
  log "wheels installed (rc=$?): $(cd .whl && ls *.whl | tr '\n' ' ')"
else
  log "no .whl/ here: DeepSpeed and liger-kernel rows will say not run unless installed"
fi
export PYTHONPATH="$WORK/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TORCHGEN_PATCH_NO_VENV=1
# one cache of kernels and one of torch extensions (DeepSpeed's ops) for the script, the tests and the bench
# (this run's own, unless the caller names them: a dry run reuses its builds)
export TORCHGEN_PATCH_CACHE="${TORCHGEN_PATCH_CACHE:-$WORK/tgp-cache}" TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$WORK/torch_extensions}"
# DeepSpeed's JIT builds read the architecture list: the same in every process, so none rebuilds
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$($PY -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())' 2>/dev/null || echo 9.0)}
# DeepSpeed 0.19's JIT builder reads each entry as numbers (and +PTX): 9.0a (torch's builds accept it) as 9.0
TORCH_CUDA_ARCH_LIST=$(echo "$TORCH_CUDA_ARCH_LIST" | sed -E 's/\b([0-9]+\.[0-9]+)[a-z]+\b/\1/g')
TV=$($PY -c "import torch; print(torch.__version__.split('+')[0])")
log "nvcc: $( (${CUDA_HOME:-/usr/local/cuda}/bin/nvcc --version || nvcc --version) 2>/dev/null | tail -1); TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST"

log "build: the kernels and DeepSpeed's ops, side by side"
BUILD_LIMIT=$(limit 240 280)
timeout $((BUILD_LIMIT + 15)) $PY scripts/unseen_writes.py --device "$DEVICE" --part prepare --deadline "$BUILD_LIMIT" \
  --report "$WORK/prepare.md" --json "$WORK/prepare.json" >>"$LOG" 2>&1
log "build rc=$?: $(grep '^built: ' "$LOG" | tail -1)"
# a build stopped at the deadline leaves torch's lock file, on which every later load would wait
# forever: in this run's own folder none is building now, so remove them (the next load resumes)
if [ "$TORCH_EXTENSIONS_DIR" = "$WORK/torch_extensions" ]; then
  find "$TORCH_EXTENSIONS_DIR" -name lock -type f -print -delete 2>/dev/null | sed 's/^/removed a stale lock: /' >>"$LOG"
fi

log "unseen-writes script and the CUDA tests, side by side"
SCRIPT_LIMIT=$(limit 300 100)
timeout $((SCRIPT_LIMIT + 20)) $PY scripts/unseen_writes.py --device "$DEVICE" --deadline "$SCRIPT_LIMIT" --jobs "$JOBS" \
  --report "$OUT/unseen-writes-$DEVICE-torch$TV.md" --json "$OUT/unseen-writes-$DEVICE-torch$TV.json" >>"$LOG" 2>&1 &
SCRIPT=$!
if [ "${FULL_SUITE:-0}" = 1 ]; then TESTS=(tests); else
  TESTS=(-m cuda tests/test_saved.py tests/test_saved_cuda.py tests/test_optim.py tests/test_optim_cuda.py tests/test_compat.py); fi
XDIST=(-n "${PYTEST_JOBS:-12}"); [ "${PYTEST_JOBS:-12}" = 0 ] && XDIST=()  # 0: one process (no pytest-xdist)
timeout "$SCRIPT_LIMIT" $PY -m pytest "${XDIST[@]}" -q -ra -p no:cacheprovider "${TESTS[@]}" \
  > "$OUT/pytest-$DEVICE-unseen-torch$TV.txt" 2>&1
log "pytest rc=$?: $(tail -1 "$OUT/pytest-$DEVICE-unseen-torch$TV.txt")"
wait $SCRIPT
log "unseen-writes rc=$?: $(grep '^wrote ' "$LOG" | tail -1)"

log "bench: the saved-tensor check on $DEVICE"
timeout "$(limit "${BENCH_LIMIT:-110}" 5)" $PY bench/bench_saved.py --device "$DEVICE" --rounds "${ROUNDS:-11}" \
  --report "$OUT/saved-check-$DEVICE-torch$TV.md" --json "$OUT/saved-check-$DEVICE-torch$TV.json" >>"$LOG" 2>&1
log "bench rc=$?"
log "done in $((SECONDS - START)) s; files: $(ls "$OUT" | tr '\n' ' ')"
