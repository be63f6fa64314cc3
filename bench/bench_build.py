"""Issue 4: the clean build of all generated kernels against compiling one
translation unit that only includes torch/extension.h (same compiler, the same
flags and include paths cpp_extension uses), side by side; wall time and peak
memory of the whole process tree. Plus the no-change rebuild."""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time

from common import ROOT
from procmem import run_measured

sys.path.insert(0, ROOT)

BUILD_TARGET = 0.7  # clean build vs one torch/extension.h TU (a regression guard)
NO_CHANGE_EXTRA = 0.1  # no-change build: seconds beyond `import torch` alone


def _extension_tu_cmd(workdir: str) -> list[str]:
    import sysconfig

    from torch.utils import cpp_extension

    src = os.path.join(workdir, "ext.cpp")
    with open(src, "w") as fh:
        fh.write("#include <torch/extension.h>\n")
    inc = []
    for p in cpp_extension.include_paths() + [sysconfig.get_paths()["include"]]:
        inc += ["-isystem", p]
    from torchgen_patch.runtime.compile import CFLAGS

    return [os.environ.get("CXX", "c++"), "-std=c++17", "-fPIC", "-D_GLIBCXX_USE_CXX11_ABI=1", *inc, *CFLAGS,
            "-c", src, "-o", os.path.join(workdir, "ext.o")]


def main(n: int = 2) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=ROOT)
    rows = []
    ours_w, ours_m, anchor_w, anchor_m = [], [], [], []
    for _ in range(n):
        cache = tempfile.mkdtemp(prefix="tgp-build-")
        w, m, r = run_measured([sys.executable, "-m", "torchgen_patch", "build"],
                               env=dict(env, TORCHGEN_PATCH_CACHE=cache, MAX_JOBS="2"))
        assert r.returncode == 0, r.stderr
        ours_w.append(w)
        ours_m.append(m)
        work = tempfile.mkdtemp(prefix="tgp-ext-")
        w, m, r = run_measured(_extension_tu_cmd(work), env=env)
        assert r.returncode == 0, r.stderr
        anchor_w.append(w)
        anchor_m.append(m)
        shutil.rmtree(work, ignore_errors=True)
        if _ < n - 1:
            shutil.rmtree(cache, ignore_errors=True)
    for what, xs, ys, unit in (("wall", ours_w, anchor_w, "s"), ("peak memory", ours_m, anchor_m, "B")):
        mx, my = statistics.median(xs), statistics.median(ys)
        ok = mx / my <= BUILD_TARGET
        fmt = (lambda v: f"{v:.1f}s") if unit == "s" else (lambda v: f"{v / 2**20:.0f} MiB")
        print(f"clean build of all kernels vs one torch/extension.h TU, {what}: {fmt(mx)} vs {fmt(my)}  "
              f"ratio {mx / my:.3f}  [target <= {BUILD_TARGET:.2f}: {'met' if ok else 'NOT MET'}]", flush=True)
        rows.append({"name": f"clean build vs extension.h TU ({what})", "median": mx, "anchor_median": my,
                     "ratio": mx / my, "target": BUILD_TARGET, "met": ok, "runs": n})
    # no-change rebuild: the CLI (an interpreter, torch imported) and the API call alone; beside
    # the CLI, `import torch` alone, which the CLI cannot avoid (it builds against that torch)
    ws, ts = [], []
    for _ in range(3):
        w, _, r = run_measured([sys.executable, "-m", "torchgen_patch", "build"],
                               env=dict(env, TORCHGEN_PATCH_CACHE=cache))
        assert r.returncode == 0 and "cache hit" in r.stderr, r.stderr
        ws.append(w)
        ts.append(run_measured([sys.executable, "-c", "import torch"], env=env)[0])
    w, it = statistics.median(ws), statistics.median(ts)
    saved = os.environ.get("TORCHGEN_PATCH_CACHE")
    os.environ["TORCHGEN_PATCH_CACHE"] = cache
    from torchgen_patch.runtime.compile import build
    from torchgen_patch.pipeline import generate
    from torchgen_patch.sources import Options

    _, plan, files = generate(Options())
    t = time.perf_counter()
    lib = build(files, plan.ops(), 2)
    api = time.perf_counter() - t
    assert not lib.built
    ok = w - it <= NO_CHANGE_EXTRA
    print(f"no-change rebuild: CLI {w:.2f}s (interpreter and torch import included; `import torch` alone "
          f"{it:.2f}s, beyond it {w - it:+.2f}s, ratio {w / it:.2f}), build() {api * 1000:.1f} ms  "
          f"[target <= {NO_CHANGE_EXTRA} s beyond import torch: {'met' if ok else 'NOT MET'}]", flush=True)
    rows.append({"name": "no-change rebuild (CLI wall)", "seconds": w, "target_beyond_import_torch": NO_CHANGE_EXTRA,
                 "met": ok, "import_torch_seconds": it, "beyond_import_torch": w - it, "ratio_to_import_torch": w / it})
    rows.append({"name": "no-change rebuild (build() call)", "seconds": api})
    shutil.rmtree(cache, ignore_errors=True)
    if saved is None:
        os.environ.pop("TORCHGEN_PATCH_CACHE", None)
    else:
        os.environ["TORCHGEN_PATCH_CACHE"] = saved
    return rows


if __name__ == "__main__":
    main()
