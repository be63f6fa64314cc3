#!/usr/bin/env bash
# Another torch release as a PyTorch checkout, in a venv without torch: a
# checkout-layout tree is assembled from the release's wheel (its torchgen,
# tools/autograd and yaml; nothing of it installed), then scan, lint, gen --strict
# and the codegen diff (applied, and the tree's own codegen run) on it:
#   scripts/check_other_release.sh /path/to/torch-2.14.1-*.whl > reports/checkout-torch2.14.1.txt
set -euo pipefail
WHEEL=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEV=${PYTHON:-$ROOT/.venv/bin/python}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$ROOT"
PY=$("$DEV" -c "import os; from testbed.notorch_venv import make_venv; print(make_venv(os.path.abspath('.cache/notorch-venv'), ['lintrunner']))")
"$DEV" -c "from testbed.trees import tree_from_wheel; tree_from_wheel('$WHEEL', '$W/pytorch')"
T=$W/pytorch
export PYTHONPATH=$ROOT TORCHGEN_PATCH_CACHE=$W/cache
tgp() { "$PY" -m torchgen_patch "$@"; }
echo "wheel: $(basename "$WHEEL"); tree version.txt: $(cat "$T/version.txt"); torch in this venv: $("$PY" -c 'import importlib.util as u; print("none" if u.find_spec("torch") is None else "yes")')"
echo; echo "\$ torchgen-patch scan --pytorch-root TREE | tail -1"; tgp scan --pytorch-root "$T" | tail -1
echo; echo "\$ torchgen-patch lint --pytorch-root TREE | tail -1"; { tgp lint --pytorch-root "$T" || true; } | tail -1
echo; echo "\$ torchgen-patch gen --strict --pytorch-root TREE --out GEN"
tgp gen --strict --pytorch-root "$T" --out "$W/gen" 2>&1 | tail -1 | sed "s|$W/||"
N=aten/src/ATen/native
codegen() { (cd "$T" && PYTHONPATH=$T "$PY" -m tools.autograd.gen_autograd $N/native_functions.yaml $N/tags.yaml "$1" tools/autograd); }
codegen "$W/up0"
tgp diff --pytorch-root "$T" -o "$W/fix.diff"
(cd "$T" && git apply "$W/fix.diff")
echo; echo "\$ torchgen-patch diff --pytorch-root TREE: applied with git apply"
codegen "$W/up1"
before=$(cat "$W"/up0/ADInplaceOrViewType_[0-9].cpp | grep -c 'm.impl(')
after=$(cat "$W"/up1/ADInplaceOrViewType_[0-9].cpp | grep -c 'm.impl(')
echo "the tree's own codegen (run from the tree, no torch): $before ADInplaceOrView registrations unpatched, $after patched (+$((after - before)))"
changed=$(cd "$W" && { diff -rq up0 up1 || true; } | sed "s|$W/||g")
echo "generated files that differ:"; echo "$changed"
echo; echo "\$ torchgen-patch lint --pytorch-root TREE | tail -1   (patched checkout)"; tgp lint --pytorch-root "$T" | tail -1
echo; echo "\$ pytest tools/test/test_codegen.py   (the cases the diff adds; the tree's codegen unpatched, then fixed)"
PYTEST=$("$DEV" -c "import os; from testbed.notorch_venv import make_venv; print(make_venv(os.path.abspath('.cache/notorch-pytest'), ['pytest']))")
"$DEV" - "$T" "$W/fix.diff" "$PYTEST" "$W" <<'PY'
import sys
from testbed.upstream_tree import codegen_tests_before_after
tree, diff, python, work = sys.argv[1:]
r = codegen_tests_before_after(tree, open(diff).read(), python, work)
for side in ("before", "after"):
    label = "unpatched codegen, the cases alone" if side == "before" else "the whole diff"
    print(f"{label}: " + ", ".join(f"{t} {r[side][t]}" for t in r["cases"]))
others = [t for t in r["after"] if t not in r["cases"]]
print(f"the file's other tests: {len(others)} (a tree from a wheel has no tools/test/: the diff creates the file)")
PY
