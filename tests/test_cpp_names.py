"""Argument names that would break the generated C++ (keywords, the template's own names, a
written argument's snapshot) are renamed by a fixed mangling, so gen --strict never writes C++
that cannot compile."""

from __future__ import annotations

import os

import pytest

from tests.support import scan_of
from tests.yaml_fixtures import subset_yaml
from torchgen_patch.codegen import render
from torchgen_patch.plan import make_plan
from torchgen_patch.plan.overlay import empty

REAL = "_cummax_helper(Tensor self, Tensor(a!) values, Tensor(b!) indices, int dim) -> ()"
# the real op's schema with its argument names replaced: the C++ call passes them by position
CASES = {
    "keywords": ("_cummax_helper(Tensor this, Tensor(a!) new, Tensor(b!) template, int delete) -> ()",
                 {"this": "this_", "new": "new_", "template": "template_", "delete": "delete_"}),
    "template_locals": ("_cummax_helper(Tensor ks, Tensor(a!) guard, Tensor(b!) indices, int at) -> ()",
                        {"ks": "ks_", "guard": "guard_", "at": "at_"}),
    "snapshot": ("_cummax_helper(Tensor values_before, Tensor(a!) values, Tensor(b!) indices, int dim) -> ()",
                 {"values_before": "values_before_"}),
}


def _plan(tmp_path, schema):
    native, tags = subset_yaml(str(tmp_path), ["_cummax_helper"], ((REAL, schema),))
    return make_plan(scan_of(native, tags, cache=False), empty(), strict=True), native


@pytest.mark.parametrize("case", sorted(CASES))
def test_names_are_mangled(tmp_path, case):
    schema, renamed = CASES[case]
    plan, _ = _plan(tmp_path, schema)
    (k,) = plan.kernels
    names = [n for _, n in k.formals]
    for old, new in renamed.items():
        assert new in names and old not in names
    assert list(k.call_args) == names  # the call passes what the declaration declares
    text = render(plan, 1)["ADInplaceOrViewPatch_0.cpp"].decode()
    decl = text[text.index("void _cummax_helper("):].split("{", 1)[0]
    for old, new in renamed.items():
        assert f" {new}," in decl or f" {new})" in decl, decl


def test_gen_strict_accepts_mangled_names(tmp_path, run_cli):
    native, _ = subset_yaml(str(tmp_path), ["_cummax_helper"], ((REAL, CASES["keywords"][0]),))
    rc, _, err = run_cli("gen", "--strict", "--native-functions", native, "-o", tmp_path / "g")
    assert rc == 0, err
    text = (tmp_path / "g" / "ADInplaceOrViewPatch_0.cpp").read_text() + \
        (tmp_path / "g" / "ADInplaceOrViewPatch_1.cpp").read_text()
    assert "at::Tensor & new_" in text and "const auto new__before" in text


@pytest.mark.build
def test_mangled_cases_compile(tmp_path):
    """Every mangled case, compiled against the running torch (one library, one shard each)."""
    from torchgen_patch.runtime.build import build

    for case in sorted(CASES):
        (tmp_path / case).mkdir()
        plan, _ = _plan(tmp_path / case, CASES[case][0])
        lib = build(render(plan, 1), plan.ops(), 1)
        assert os.path.isfile(lib.path), case
