#!/usr/bin/env bash
# The CUDA checks, run on the GPU machine from the source tree (no install, no
# network): writes its reports under $OUT (default: reports/device).
set -u
OUT=${OUT:-reports/device}
mkdir -p "$OUT"
# scratch space of this run only (never a fixed /tmp path another account could create first);
# the kernel cache is the user's own (created 0700), for the commands and the tests alike
WORK=$(mktemp -d "${TMPDIR:-/tmp}/torchgen-patch-device.XXXXXXXX") || exit 3
trap 'rm -rf "$WORK"' EXIT
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TORCHGEN_PATCH_NO_VENV=1
export TORCHGEN_PATCH_CACHE=${TORCHGEN_PATCH_CACHE:-$HOME/.cache/torchgen-patch}
PY=${PYTHON:-python3}
TV=$($PY -c "import torch; print(torch.__version__.split('+')[0])")
log() { echo "== $*" | tee -a "$OUT/log.txt"; }
log "torch $($PY -c 'import torch; print(torch.__version__, torch.cuda.get_device_name())')"
log "lint --against-runtime on this torch's own yaml"
{ echo "\$ torchgen-patch lint --against-runtime   (torch $TV)"; $PY -m torchgen_patch lint --against-runtime 2>&1 | tail -3;
  echo; echo "\$ torchgen-patch scan | tail -1"; $PY -m torchgen_patch scan | tail -1;
  echo; echo "\$ torchgen-patch gen --strict --out \$WORK/gen"; $PY -m torchgen_patch gen --strict --out "$WORK/gen" 2>&1;
  echo; echo "\$ torchgen-patch lint --runtime --import torch.distributed.fsdp --namespace fsdp";
  $PY -m torchgen_patch lint --runtime --import torch.distributed.fsdp --namespace fsdp 2>&1; } \
  > "$OUT/lint-scan-torch$TV.txt"
log "repro"
$PY scripts/repro_report.py > "$OUT/repro-torch$TV.md" 2>>"$OUT/log.txt"
log "verify cuda"
$PY -m torchgen_patch verify --both --device cuda --format markdown -o "$OUT/verify-cuda-torch$TV.md" 2>>"$OUT/log.txt"
echo "rc=$?" >> "$OUT/log.txt"
log "verify cpu"
$PY -m torchgen_patch verify --both --device cpu --format markdown -o "$OUT/verify-cpu-torch$TV.md" 2>>"$OUT/log.txt"
echo "rc=$?" >> "$OUT/log.txt"
log "verify --subclass all (cuda, then cpu)"
for d in cuda cpu; do
  $PY -m torchgen_patch verify --both --subclass all --device $d --format markdown \
    -o "$OUT/verify-subclass-$d-torch$TV.md" 2>>"$OUT/log.txt"; echo "rc=$?" >> "$OUT/log.txt"
done
log "compatibility battery (cuda)"
COMPAT_REPORT="$OUT/compat-cuda-torch$TV.md" timeout ${COMPAT_TIMEOUT:-900} $PY -m pytest -q -p no:cacheprovider \
  tests/test_compat.py -k cuda >> "$OUT/log.txt" 2>&1; echo "compat rc=$?" >> "$OUT/log.txt"
if [ "$($PY -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
  log "FSDP2 2 ranks, nccl"
  $PY scripts/fsdp2_two_ranks.py --device cuda --report "$OUT/fsdp2-2ranks-nccl-cuda-torch$TV.md" >> "$OUT/log.txt" 2>&1
  echo "fsdp2 rc=$?" >> "$OUT/log.txt"
else
  log "FSDP2 2 ranks, nccl: not run (fewer than 2 GPUs)"
fi
[ "${SKIP_BENCH:-0}" = 1 ] || { log "bench DTensor foreach (cuda)"; $PY bench/bench_dtensor.py --device cuda --json "$OUT/bench-dtensor-cuda-torch$TV.json" >> "$OUT/log.txt" 2>&1; }
[ "${SKIP_BENCH:-0}" = 1 ] || { log "bench per call (cuda)"; $PY bench/bench_call.py --device cuda --rounds ${ROUNDS:-100} --json "$OUT/bench-call-cuda-torch$TV.json" >> "$OUT/log.txt" 2>&1; }
log "pytest"
timeout ${PYTEST_TIMEOUT:-420} $PY -m pytest -q -ra -p no:cacheprovider tests > "$OUT/pytest-torch$TV.txt" 2>&1
echo "pytest rc=$?" >> "$OUT/log.txt"
tail -5 "$OUT/pytest-torch$TV.txt" >> "$OUT/log.txt"
