"""Issue 6: the diff for PyTorch's own codegen, validated by running that codegen
from a source-tree fixture assembled from the installed wheel."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, torch_is
from tests.upstream_tree import kernels_tu, make_tree, registrations, run_codegen
from torchgen_patch.upstream import patch as up

PATCHES = os.path.join(ROOT, "patches")


def _apply(root, diff_text, check=True):
    p = os.path.join(root, "p.diff")
    with open(p, "w") as fh:
        fh.write(diff_text)
    return subprocess.run(["git", "apply"] + (["--check"] if check else []) + [p], cwd=root,
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def trees(tmp_path_factory, run_cli_module):
    """The unpatched codegen's output and the fix-patched one's, run once."""
    base = tmp_path_factory.mktemp("upstream")
    root = make_tree(str(base / "tree"))
    unpatched = run_codegen(root, str(base / "out0"))
    assert unpatched.returncode == 0, unpatched.stderr
    rc, diff_text, err = run_cli_module("diff", "--pytorch-root", root)
    assert rc == 0, err
    assert _apply(root, diff_text).returncode == 0
    assert _apply(root, diff_text, check=False).returncode == 0
    patched = run_codegen(root, str(base / "out1"))
    assert patched.returncode == 0, patched.stderr
    return root, str(base / "out0"), str(base / "out1"), diff_text


@pytest.fixture(scope="module")
def run_cli_module():
    import contextlib
    import io

    from torchgen_patch import cli

    def run(*argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main([str(a) for a in argv])
        return rc, out.getvalue(), err.getvalue()

    return run


def test_diff_is_relative_and_git_applies(trees):
    root, _, _, diff_text = trees
    assert diff_text.startswith(f"--- a/{up.TARGET}\n+++ b/{up.TARGET}\n")
    assert root not in diff_text


def test_second_application_is_refused(trees, run_cli):
    root, _, _, diff_text = trees
    r = _apply(root, diff_text)
    assert r.returncode != 0 and "patch does not apply" in r.stderr
    rc, out, err = run_cli("diff", "--pytorch-root", root)
    assert rc == 2 and err == (f"{os.path.join(root, up.TARGET)}: error: already applied (mode fix) "
                               "(hint: nothing to do; `--check` reports it)\n")
    assert run_cli("diff", "--pytorch-root", root, "--check")[:2] == (0, f"{up.TARGET}: patched (mode fix)\n")


def _files(d):
    out = {}
    for dirpath, _, names in os.walk(d):
        for n in names:
            p = os.path.join(dirpath, n)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = fh.read()
    return out


def test_only_the_inplace_or_view_files_change(trees):
    _, out0, out1, _ = trees
    a, b = _files(out0), _files(out1)
    assert sorted(a) == sorted(b) and len(a) > 20
    changed = sorted(n for n in a if a[n] != b[n])
    assert changed == ["ADInplaceOrViewTypeEverything.cpp", "ADInplaceOrViewType_0.cpp", "ADInplaceOrViewType_1.cpp"]


def test_new_kernels_are_exactly_the_plan(trees, default_scan):
    _, out0, out1, _ = trees
    new = set(registrations(out1)) - set(registrations(out0))
    assert set(registrations(out0)) <= set(registrations(out1))
    # the plan before the overlay: every missing op (the overlay only skips unsupported ones)
    assert {f"aten::{n}" for n in new} == {r.name for r in default_scan.by_verdict("missing")}


@pytest.mark.build
def test_upstream_kernels_compile_and_pass_the_version_tests(trees, tmp_path, default_plan):
    _, out0, out1, _ = trees
    regs0, regs1 = registrations(out0), registrations(out1)
    new = {op: fn for op, fn in regs1.items() if op not in regs0}
    src = tmp_path / "upstream_kernels.cpp"
    src.write_text(kernels_tu(out1, new))
    code = f"""
import json, sys, torch
sys.path.insert(0, {ROOT!r})
from torch.utils import cpp_extension
from torchgen_patch.checks import verify
ops = {json.dumps(default_plan.ops())}
before = verify.run(ops, "cpu", False)
cpp_extension.load("upstream_kernels", [{str(src)!r}], extra_cflags=["-O1", "-w"],
                   build_directory={str(tmp_path)!r}, is_python_module=False)
after = verify.run(ops, "cpu", True)
cuda = verify.run(ops, "cuda", True) if torch.cuda.is_available() else []
print(json.dumps({{"before": verify.counts(before), "after": verify.counts(after),
                  "bad": [r.op for r in after + cuda if r.verdict in verify.FAILING],
                  "cuda": verify.counts(cuda)}}))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, PYTHONPATH=ROOT, MAX_JOBS="2"))
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["bad"] == []
    assert res["before"].get("MISS", 0) > 0
    assert res["after"] == {"PASS": len(default_plan.ops()) - 3, "NOT_RUN": 3}
    import torch

    if torch.cuda.is_available():  # on the GPU machine: the same kernels on CUDA
        assert res["cuda"].get("PASS", 0) >= len(default_plan.ops()) - 6, res["cuda"]


def test_error_mode_fails_the_codegen_listing_the_ops(tmp_path, run_cli, default_scan):
    root = make_tree(str(tmp_path / "tree"))
    rc, diff_text, _ = run_cli("diff", "--pytorch-root", root, "--mode", "error")
    assert rc == 0 and _apply(root, diff_text, check=False).returncode == 0
    r = run_codegen(root, str(tmp_path / "out"))
    assert r.returncode != 0
    missing = default_scan.by_verdict("missing")
    assert f"{len(missing)} operators mutate arguments and return nothing" in r.stderr
    rec = default_scan.get("aten::split_with_sizes_copy.out")
    assert f"native_functions.yaml:{rec.loc.line}: split_with_sizes_copy.out" in r.stderr
    # the allowlist the patch adds accepts them
    path = os.path.join(root, up.TARGET)
    text = open(path).read()
    names = ", ".join(repr(r.name.split("::", 1)[1]) for r in missing)
    text = text.replace("MUTATING_OPS_WITHOUT_INPLACE_OR_VIEW_KERNEL: set[str] = set()",
                        f"MUTATING_OPS_WITHOUT_INPLACE_OR_VIEW_KERNEL: set[str] = {{{names}}}")
    open(path, "w").write(text)
    assert run_codegen(root, str(tmp_path / "out2")).returncode == 0


def test_wrong_shape_fails_clearly(tmp_path, run_cli):
    root = make_tree(str(tmp_path / "tree"))
    path = os.path.join(root, up.TARGET)
    text = open(path).read().replace("def emit_inplace_or_view_body(", "def emit_body_renamed(")
    open(path, "w").write(text)
    rc, out, err = run_cli("diff", "--pytorch-root", root)
    assert rc == 2 and out == ""
    assert err == (f"{path}: error: the codegen does not have the shape this patch expects: function "
                   f"emit_inplace_or_view_body() not found (hint: known to work: {up.KNOWN_GOOD})\n")


def test_not_a_tree(run_cli, tmp_path):
    rc, _, err = run_cli("diff", "--pytorch-root", tmp_path)
    assert rc == 2 and err == f"{tmp_path / up.TARGET}: error: the autograd codegen not found\n"


@pytest.mark.skipif(not torch_is("2.13"), reason="the committed example is torch 2.13's")
@pytest.mark.parametrize("mode", ["fix", "error"])
def test_committed_example_is_current(tmp_path, run_cli, mode):
    """patches/ holds the diffs for torch 2.13; regenerate with `make patches`."""
    root = make_tree(str(tmp_path / "tree"))
    rc, diff_text, _ = run_cli("diff", "--pytorch-root", root, "--mode", mode)
    assert rc == 0
    with open(os.path.join(PATCHES, f"gen_inplace_or_view_type-{mode}-torch2.13.diff")) as fh:
        assert fh.read() == diff_text, "stale example diff: run `make patches`"
