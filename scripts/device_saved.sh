#!/usr/bin/env bash
# The saved-tensor check on the GPU machine, from the source tree (no install, no network): the native
# hooks built there, the CUDA tests of the check on both paths, and its benchmark; reports under $OUT
# (default: reports/device). BENCH_ARGS: more arguments for bench/bench_saved.py (--rounds, --models).
set -u
OUT=${OUT:-reports/device}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export TORCHGEN_PATCH_CACHE=${TORCHGEN_PATCH_CACHE:-$HOME/.cache/torchgen-patch}
PY=${PYTHON:-python3}
TV=$($PY -c "import torch; print(torch.__version__.split('+')[0])")
log() { echo "== $*" | tee -a "$OUT/log.txt"; }
log "torch $($PY -c 'import torch; print(torch.__version__, torch.cuda.get_device_name())'), $($PY --version)"
log "the native hooks"
$PY -c "
from torchgen_patch.runtime import checklib
print('not used:' if checklib.prepare('native') else 'loaded', checklib.nvrtc() or 'no NVRTC')
" 2>&1 | tee -a "$OUT/log.txt"
log "the check's CUDA tests"
timeout ${TEST_TIMEOUT:-300} $PY -m pytest -q -rf -p no:cacheprovider tests/test_saved_cuda.py tests/test_saved.py -k "cuda" \
  > "$OUT/pytest-saved-cuda.txt" 2>&1; tail -15 "$OUT/pytest-saved-cuda.txt" | tee -a "$OUT/log.txt"
log "the benchmark"
timeout ${BENCH_TIMEOUT:-420} $PY bench/bench_saved.py --device cuda --report "$OUT/saved-check-cuda-torch$TV.md" \
  --json "$OUT/saved-check-cuda-torch$TV.json" ${BENCH_ARGS:-} 2>&1 | tee -a "$OUT/log.txt"
