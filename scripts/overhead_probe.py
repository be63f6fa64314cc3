"""Where does a patched CUDA `_foreach_add_` spend its extra time? Times the
unpatched op, the default kernel (snapshot + conditional bump) and the
always-bump template (no snapshot) side by side, paired rounds."""

import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import torchgen_patch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from bench_call import per_call  # noqa: E402

dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
ts = [torch.randn(1, device=dev) for _ in range(2)]


def fn():
    torch._foreach_add_(ts, 1.0)


def pc(n=5000):
    return per_call(fn, n, sync) * 1e6


ov = os.path.join(tempfile.mkdtemp(), "o.yaml")
with open(ov, "w") as fh:
    fh.write("aten::_foreach_add_.Scalar:\n  template: kernel_always_bump.cpp.j2\n")
variants = {"unpatched": None, "snapshot kernel": {}, "always-bump kernel": {"overlay": ov}}
for kw in variants.values():
    if kw is not None:
        torchgen_patch.install(["aten::_foreach_add_.Scalar"], **kw)
        torchgen_patch.uninstall()
res = {k: [] for k in variants}
for _ in range(40):
    for name, kw in variants.items():
        if kw is not None:
            torchgen_patch.install(["aten::_foreach_add_.Scalar"], **kw)
        res[name].append(pc())
        if kw is not None:
            torchgen_patch.uninstall()
base = res["unpatched"]
for name, xs in res.items():
    ratios = [x / b for x, b in zip(xs, base, strict=True)]
    print(f"{dev} _foreach_add_ 2x1: {name}: median {statistics.median(xs):.3f} us, "
          f"paired ratio {statistics.median(ratios):.3f}")
