#!/usr/bin/env bash
# Static checks against another torch release's torchgen, taken from its wheel
# without installing it (scan, lint, gen --strict, and the codegen diff applied and
# run): e.g. scripts/check_other_release.sh /path/to/torch-2.14.1-*.whl
set -euo pipefail
WHEEL=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
unzip -q "$WHEEL" 'torchgen/*' -d "$W/site"
export PYTHONPATH=$W/site:$ROOT TORCHGEN_PATCH_CACHE=$W/cache
echo "wheel: $(basename "$WHEEL")"
echo "\$ torchgen-patch scan | tail -1"; $PY -m torchgen_patch scan | tail -1
echo "\$ torchgen-patch gen --strict"; $PY -m torchgen_patch gen --strict --out "$W/gen" 2>&1 | tail -1 | sed "s|$W/||"
T=$W/tree
mkdir -p "$T/tools" "$T/aten/src"
cp -r "$W/site/torchgen/packaged/autograd" "$T/tools/autograd"
cp -r "$W/site/torchgen/packaged/ATen" "$T/aten/src/ATen"
touch "$T/tools/__init__.py"
(cd "$T" && git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm tree)
N=aten/src/ATen/native
(cd "$T" && PYTHONPATH=$T:$W/site $PY -m tools.autograd.gen_autograd $N/native_functions.yaml $N/tags.yaml "$W/up0" tools/autograd)
$PY -m torchgen_patch diff --pytorch-root "$T" -o "$W/fix.diff"
(cd "$T" && git apply "$W/fix.diff")
echo "\$ torchgen-patch diff --pytorch-root TREE: applied"
(cd "$T" && PYTHONPATH=$T:$W/site $PY -m tools.autograd.gen_autograd $N/native_functions.yaml $N/tags.yaml "$W/up1" tools/autograd)
before=$(cat "$W"/up0/ADInplaceOrViewType_[0-9].cpp | grep -c 'm.impl(')
after=$(cat "$W"/up1/ADInplaceOrViewType_[0-9].cpp | grep -c 'm.impl(')
echo "upstream ADInplaceOrView registrations: $before unpatched, $after patched (+$((after - before)))"
changed=$(cd "$W" && { diff -rq up0 up1 || true; } | sed "s|$W/||g")
echo "generated files that differ:"; echo "$changed"
