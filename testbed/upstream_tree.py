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



def codegen_test_hunks(diff_text: str) -> str:
    """The part of a `diff` that edits (or creates) tools/test/test_codegen.py: the cases alone."""
    from torchgen_patch.upstream.codegen_test import CODEGEN_TEST

    parts = re.split(r"(?m)^(?=--- )", diff_text)
    return "".join(p for p in parts if p.startswith("--- ") and f"+++ b/{CODEGEN_TEST}\n" in p)


def run_codegen_tests(root: str, python: str, junit: str) -> dict[str, str]:
    """The tree's tools/test/test_codegen.py with pytest from the tree's root (its pytest.ini, where it
    has one), in ``python``'s environment (one without torch: the tree's torchgen and tools are used):
    test id (``Class.test``) -> passed, failed or skipped."""
    import xml.etree.ElementTree as ET

    from torchgen_patch.upstream.codegen_test import CODEGEN_TEST

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CI")}
    env["PYTHONPATH"] = root
    r = subprocess.run([python, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--junitxml={junit}", CODEGEN_TEST],
                       cwd=root, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode not in (0, 1) or not os.path.isfile(junit):
        raise RuntimeError(f"pytest {CODEGEN_TEST} exited {r.returncode}: {(r.stdout + r.stderr)[-2000:]}")
    outcomes = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name')}"
        kids = {c.tag for c in case}
        outcomes[name] = "failed" if kids & {"failure", "error"} else "skipped" if "skipped" in kids else "passed"
    os.remove(junit)
    return outcomes


def codegen_tests_before_after(root: str, diff_text: str, python: str, work: str) -> dict:
    """tools/test/test_codegen.py of the tree under git at ``root``: with the diff's cases alone (the codegen
    unpatched), then with the whole diff; the tree is left with the whole diff applied. The cases, and
    each run's outcomes."""
    def git(*argv: str, stdin: str | None = None) -> None:
        r = subprocess.run(["git", *argv], cwd=root, input=stdin, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"git {argv[0]} in {root}: {r.stderr.strip()[-500:]}")

    git("checkout", "-q", ".")
    git("clean", "-qfd")
    git("apply", "-", stdin=codegen_test_hunks(diff_text))
    before = run_codegen_tests(root, python, os.path.join(work, "codegen-tests-before.xml"))
    git("checkout", "-q", ".")
    git("clean", "-qfd")
    git("apply", "-", stdin=diff_text)
    after = run_codegen_tests(root, python, os.path.join(work, "codegen-tests-after.xml"))
    cases = sorted(t for t in after if t.startswith("TestGenInplaceOrViewType."))
    return {"cases": cases, "before": before, "after": after}
