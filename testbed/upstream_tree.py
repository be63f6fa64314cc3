"""A PyTorch source-tree fixture assembled from the installed wheel (see
testbed/trees.py), and helpers to run its codegen and read what it generated."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from testbed.trees import tree_from_installed
from torchgen_patch.upstream.patch import TEST_FILE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_tree(root: str) -> str:
    """A checkout-layout tree of the installed torch (its torchgen, tools/autograd and yaml), under git."""
    return tree_from_installed(root)


def run_codegen(root: str, out: str, python: str = sys.executable) -> subprocess.CompletedProcess:
    """The tree's own autograd codegen, run from the tree with the tree's torchgen."""
    n = os.path.join("aten", "src", "ATen", "native")
    return subprocess.run([python, "-m", "tools.autograd.gen_autograd", f"{n}/native_functions.yaml",
                           f"{n}/tags.yaml", out, "tools/autograd"], cwd=root, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=root))


_REG = re.compile(r'm\.impl\("([^"]+)",\s*TORCH_FN\(ADInplaceOrView::(\w+)\)\s*\);', re.S)


def registrations(out: str) -> dict[str, str]:
    """op name (with overload) -> kernel function, from ADInplaceOrViewType_*.cpp."""
    regs = {}
    for name in sorted(os.listdir(out)):
        if re.fullmatch(r"ADInplaceOrViewType_\d+\.cpp", name):
            regs.update(dict(_REG.findall(open(os.path.join(out, name)).read())))
    return regs


def kernel_sources(out: str, fns: set[str]) -> dict[str, str]:
    """The definitions of the named kernel functions (from column-0 `... fn(` to the next `}`)."""
    found = {}
    for name in sorted(os.listdir(out)):
        if not re.fullmatch(r"ADInplaceOrViewType_\d+\.cpp", name):
            continue
        text = open(os.path.join(out, name)).read()
        for m in re.finditer(r"^\S[^\n]*?\b(\w+)\(c10::DispatchKeySet ks[^\n]*\{\n.*?^\}\n", text, re.S | re.M):
            if m.group(1) in fns:
                found[m.group(1)] = m.group(0)
    return found


def kernels_tu(out: str, new: dict[str, str], toggled: str | None = None) -> str:
    """A translation unit with the upstream codegen's new kernels and their registration: at load
    (a static TORCH_LIBRARY_IMPL block, as upstream), or with ``toggled`` (a C name prefix) by
    ``extern "C"`` functions ``<toggled>_register()`` and ``<toggled>_unregister()`` instead."""
    bodies = kernel_sources(out, set(new.values()))
    missing = set(new.values()) - set(bodies)
    assert not missing, f"kernel definitions not found: {sorted(missing)}"
    lines = ['#include "torch/csrc/autograd/VariableTypeUtils.h"', "#include <torch/library.h>",
             "#include <ATen/Operators.h>", "", "using namespace at;",
             "using torch::autograd::increment_version;", "", "namespace upstream_kernels {", ""]
    lines += [bodies[fn] for fn in sorted(bodies)]
    lines += ["} // namespace upstream_kernels", ""]
    impls = [f'  m.impl("{op}", TORCH_FN(upstream_kernels::{fn}));' for op, fn in sorted(new.items())]
    if toggled is None:
        lines += ["TORCH_LIBRARY_IMPL(aten, ADInplaceOrView, m) {", *impls, "}", ""]
    else:
        lines += ["#include <memory>", "", "static std::unique_ptr<torch::Library> registered;", "",
                  f'extern "C" void {toggled}_register() {{',
                  "  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, \"aten\", "
                  "c10::DispatchKey::ADInplaceOrView, __FILE__, __LINE__);", "  torch::Library& m = *lib;", *impls,
                  "  registered = std::move(lib);", "}", "",
                  f'extern "C" void {toggled}_unregister() {{ registered.reset(); }}', ""]
    return "\n".join(lines)


def run_test_file(root: str, patched: bool, *args: str, site: str | None = None) -> subprocess.CompletedProcess:
    """The tree's regression test, as PyTorch's CI runs it (from test/), with this tool's kernels
    standing in for the rebuilt torch when ``patched`` (`torchgen-patch run`). ``site``: a directory
    put first on the path (test dependencies a machine lacks, such as expecttest)."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}  # CI=1 makes common_utils act as PyTorch's CI
    prefix = [sys.executable, "-m", "torchgen_patch", "run", "--"] if patched else []
    paths = ([site] if site else []) + ([ROOT] if patched else [])
    if paths:  # the caller's own entries (a site of test dependencies, say) kept after ours
        env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return subprocess.run([*prefix, sys.executable, os.path.basename(TEST_FILE), "-v", *args],
                          cwd=os.path.join(root, os.path.dirname(TEST_FILE)), env=env, capture_output=True,
                          text=True, timeout=1800)


def failed_tests(output: str) -> set[str]:
    return set(re.findall(r"^(?:FAIL|ERROR): (\w+) ", output, re.M))
