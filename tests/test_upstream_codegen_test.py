"""The cases the upstream diff adds to PyTorch's codegen tests (tools/test/test_codegen.py): a
NativeFunction built from a schema string, assertions on the definition the codegen emits. They fail
on the unpatched codegen and pass on the fixed one, run with pytest from checkout-layout trees of
released wheels (this machine's torch, and the newest release when its wheel is at hand); Debian's
real source tree is tests/test_real_checkout.py's."""

from __future__ import annotations

import glob
import os
import sys

import pytest

from tests.conftest import ROOT
from testbed.trees import find_torch_wheel, tree_from_wheel
from testbed.upstream_tree import codegen_test_hunks, codegen_tests_before_after, make_tree
from torchgen_patch.errors import InputError
from torchgen_patch.upstream import codegen_test as ct

FAIL_UNPATCHED = {"fix": {"test_out_with_no_returns", "test_foreach_inplace", "test_fused_inplace"},
                  "error": {"test_mutating_ops_with_no_returns_are_refused", "test_allowlisted_op_is_accepted"}}
PASS_UNPATCHED = {"fix": {"test_functional_op_gets_no_kernel"}, "error": set()}


def _before_after(root: str, mode: str, run_cli, work) -> dict:
    rc, diff_text, err = run_cli("diff", "--pytorch-root", root, "--mode", mode)
    assert rc == 0, err
    assert f"+++ b/{ct.CODEGEN_TEST}\n" in codegen_test_hunks(diff_text)
    # pytest of this environment; PYTHONPATH puts the tree's torchgen and tools before the installed ones
    return codegen_tests_before_after(root, diff_text, sys.executable, str(work))


def _assert_fail_then_pass(r: dict, mode: str) -> None:
    prefix = "TestGenInplaceOrViewType."
    assert set(r["cases"]) == {prefix + t for t in FAIL_UNPATCHED[mode] | PASS_UNPATCHED[mode]}
    assert {t for t in r["cases"] if r["before"][t] == "failed"} == {prefix + t for t in FAIL_UNPATCHED[mode]}
    assert all(r["after"][t] == "passed" for t in r["after"]), r["after"]
    assert {t: v for t, v in r["before"].items() if t not in r["cases"]} == \
        {t: v for t, v in r["after"].items() if t not in r["cases"]}


@pytest.mark.parametrize("mode", ["fix", "error"])
def test_cases_fail_unpatched_and_pass_fixed_on_this_torchs_tree(tmp_path, run_cli, mode):
    root = make_tree(str(tmp_path / "tree"))
    assert not os.path.exists(os.path.join(root, ct.CODEGEN_TEST))  # a wheel ships no tools/test/
    _assert_fail_then_pass(_before_after(root, mode, run_cli, tmp_path), mode)
    with open(os.path.join(root, ct.CODEGEN_TEST)) as fh:
        assert fh.read() == ct.new_file(mode)


def _newest_wheel() -> str | None:
    local = sorted(glob.glob(os.path.join(ROOT, ".cache", "wheels", "torch-2.15.0-*.whl")))
    return find_torch_wheel("2.15.0") or (local[0] if local else None)


@pytest.mark.parametrize("mode", ["fix", "error"])
def test_cases_fail_unpatched_and_pass_fixed_on_the_newest_release(tmp_path, run_cli, mode):
    wheel = _newest_wheel()
    if wheel is None:
        pytest.skip("no torch 2.15.0 wheel here (TORCHGEN_PATCH_TORCH_WHEEL_2_15_0, or .cache/wheels/)")
    root = tree_from_wheel(wheel, str(tmp_path / "tree"))
    _assert_fail_then_pass(_before_after(root, mode, run_cli, tmp_path), mode)


SOURCE = '''from __future__ import annotations

import unittest

import yaml
from tools.autograd import gen_autograd_functions, load_derivatives

from torchgen import dest
from torchgen.api.types import CppSignatureGroup
from torchgen.model import Location, NativeFunction


class TestA(unittest.TestCase):
    def test_a(self) -> None:
        pass


class TestB(unittest.TestCase):
    def test_b(self) -> None:
        pass


# the last statement
X = 1
'''


def test_cases_go_after_the_last_class_with_their_imports_merged():
    new = ct.edited(SOURCE, "fix")
    assert new.startswith(SOURCE.split("from tools.autograd")[0])
    assert ("from tools.autograd import (\n    gen_autograd_functions,\n    gen_inplace_or_view_type,\n"
            "    load_derivatives,\n)\n\nfrom torchgen import dest\n"
            "from torchgen.api.autograd import NativeFunctionWithDifferentiabilityInfo\n"
            "from torchgen.api.types import CppSignatureGroup\n"
            "from torchgen.model import Location, NativeFunction\n") in new
    head, tail = new.split("class TestB")
    assert tail.index("class TestGenInplaceOrViewType") < tail.index("# the last statement")
    assert new.endswith("\n\n\n# the last statement\nX = 1\n") and ct.CASES["fix"] in new
    compile(new, "test_codegen.py", "exec")


def test_cases_added_once_and_only_after_a_class():
    with pytest.raises(InputError, match="already has TestGenInplaceOrViewType"):
        ct.edited(ct.edited(SOURCE, "fix"), "error")
    with pytest.raises(InputError, match="defines no test class"):
        ct.edited("import unittest\n", "fix")
    with pytest.raises(InputError, match="not valid Python"):
        ct.edited("class (:\n", "fix")
