#!/usr/bin/env bash
# The checks of scripts/check_source_build.sh, run inside the Debian root (as /out/checks.sh, with the
# tool installed in /opt/tgp): every output into /out, each command's exit code and wall time into
# /out/steps.tsv. An empty kernel cache of its own, so the build is timed from nothing.
set -uo pipefail
cd /out
export TORCHGEN_PATCH_CACHE=/out/cache
rm -rf "$TORCHGEN_PATCH_CACHE"
printf 'step\texit\tseconds\n' > steps.tsv

timed() {  # NAME COMMAND...: run it, stdout to NAME.out, stderr to NAME.err
    local name=$1 t0 t1 rc
    shift
    t0=$(date +%s.%N)
    "$@" > "$name.out" 2> "$name.err"
    rc=$?
    t1=$(date +%s.%N)
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(python3 -c "print(round($t1 - $t0, 2))")" >> steps.tsv
}

python3 - > world.json <<'EOF'
import json, platform, subprocess, sysconfig

import torch

config = torch.__config__.show()
def line(word):
    return next((ln.strip() for ln in config.splitlines() if word in ln), "")

dpkg = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Version}\n", "python3-torch", "libtorch-dev", "g++",
                       "ninja-build"], capture_output=True, text=True).stdout.split("\n")
print(json.dumps({
    "torch": torch.__version__, "git_version": torch.version.git_version,
    "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI), "cuda": torch.version.cuda,
    "python": platform.python_version(), "compiler_of_torch": line("C++ Version") or line("GCC"),
    "blas": line("BLAS_INFO"), "lapack": line("LAPACK_INFO"),
    "gxx": subprocess.run(["g++", "--version"], capture_output=True, text=True).stdout.splitlines()[0],
    "ninja": subprocess.run(["ninja", "--version"], capture_output=True, text=True).stdout.strip(),
    "packages": [p for p in dpkg if p], "torch_path": torch.__file__,
    "os": platform.freedesktop_os_release().get("PRETTY_NAME", ""),
}, indent=1, sort_keys=True))
EOF

# a fused optimizer step between forward and backward: unpatched the step moves no version counter and
# backward silently uses the updated parameter; patched, backward raises
cat > program.py <<'EOF'
import json

import torch

w = torch.nn.Parameter(torch.ones(4))
opt = torch.optim.Adam([w], lr=0.1, fused=True)
loss = (w * w).sum()  # saves w for backward
w.grad = torch.ones(4)
v0 = w._version
opt.step()
bumps = w._version - v0
try:
    loss.backward()
    raised = ""
except RuntimeError as e:
    raised = str(e).split("\n")[0][:120]
print(json.dumps({"version_bumps": bumps, "backward_raised": raised}))
EOF

timed lint-version torchgen-patch lint --format json
timed lint torchgen-patch lint --requires-grad --format json
timed build torchgen-patch build
timed build-again torchgen-patch build
timed verify torchgen-patch verify --both --format json -o verify.json
timed verify-requires-grad torchgen-patch verify --check requires-grad --both --format json -o verify-requires-grad.json
timed program-unpatched python3 program.py
timed program-run torchgen-patch run -- python3 program.py
rm -rf "$TORCHGEN_PATCH_CACHE"
cat steps.tsv
