"""The anchor of the per-call benchmark: PyTorch's own kernels for the benchmarked ops, i.e. what
upstream's autograd codegen emits once `torchgen-patch diff --mode fix` is applied to it, cut
out of its output (testbed/upstream_tree.py) and compiled as a library of their own, registered
and unregistered on demand (``pytorch_shaped_register`` / ``_unregister``), so that it can
alternate with the unpatched op and this project's kernel in one process.

The library is cached under build/ by the torch build, the ops and this tool's source."""

from __future__ import annotations

import ctypes
import hashlib
import os
import sys
import tempfile

from common import ROOT

sys.path.insert(0, ROOT)

PREFIX = "pytorch_shaped"


def _upstream_output(work: str) -> str:
    """Run the installed torch's autograd codegen, patched with this project's fix, into work/out."""
    from testbed.trees import tree_from_installed
    from testbed.upstream_tree import run_codegen
    from torchgen_patch.upstream import patch as up

    root = tree_from_installed(os.path.join(work, "tree"), git=False)  # patched in place: no git needed
    target = os.path.join(root, up.TARGET)
    with open(target) as fh:
        source = fh.read()
    with open(target, "w") as fh:
        fh.write(up.patched(source, "fix", target))
    out = os.path.join(work, "out")
    r = run_codegen(root, out)
    if r.returncode != 0:
        raise RuntimeError("the patched upstream codegen failed:\n" + r.stderr[-3000:])
    return out


def translation_unit(ops: list[str], work: str) -> str:
    from testbed.upstream_tree import kernels_tu, registrations

    out = _upstream_output(work)
    regs = registrations(out)
    names = [op.split("::", 1)[1] for op in ops]
    missing = [n for n in names if n not in regs]
    if missing:
        raise RuntimeError(f"the patched upstream codegen registers no kernel for {missing}")
    return kernels_tu(out, {n: regs[n] for n in names}, toggled=PREFIX)


def load(ops: list[str], log=sys.stderr) -> ctypes.CDLL:
    """The compiled PyTorch-shaped kernels of ``ops`` (aten::name.overload), loaded, nothing registered."""
    import torch
    from torch.utils import cpp_extension

    from torchgen_patch.cache import tool_fingerprint

    # the torch build, the ops, and this tool's source (the upstream patch is part of it)
    key = hashlib.sha256("\0".join([torch.__version__, torch.version.git_version, tool_fingerprint(), *ops])
                         .encode()).hexdigest()[:16]
    d = os.path.join(ROOT, "build", f"bench-pytorch-shaped-{key}")
    src = os.path.join(d, "pytorch_shaped_kernels.cpp")
    if not os.path.exists(src):
        print("pytorch-shaped kernels: running the patched upstream codegen ...", file=log, flush=True)
        with tempfile.TemporaryDirectory(prefix="tgp-upstream-") as work:
            text = translation_unit(ops, work)
        os.makedirs(d, exist_ok=True)
        with open(src + ".tmp", "w") as fh:
            fh.write(text)
        os.replace(src + ".tmp", src)
    from torchgen_patch.runtime.compile import CFLAGS

    print("pytorch-shaped kernels: compiling (cached by ninja) ...", file=log, flush=True)
    name = f"{PREFIX}_{key}"
    cpp_extension.load(name, [src], extra_cflags=[f for f in CFLAGS if f != "-Werror"], build_directory=d,
                       is_python_module=False)
    lib = ctypes.CDLL(os.path.join(d, f"{name}.so"))
    for fn in ("register", "unregister"):
        getattr(lib, f"{PREFIX}_{fn}").restype = None
    return lib
