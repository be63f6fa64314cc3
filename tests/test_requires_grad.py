"""The autograd half of the zero-returns hole: out= ops returning nothing whose VariableType
kernel never refuses inputs that require grad, and void in-place ops that skip check_inplace.
Lint asks the tree's own gen_variable_type (both worlds)."""

from __future__ import annotations

import json

from tests.test_checkout import notorch, tree213  # noqa: F401  (fixtures)

# What torch 2.13's own codegen writes (its VariableType_*.cpp): add.out refuses, these never do.
SOME_UNCHECKED_OUT = {"aten::split_with_sizes_copy.out", "aten::split_copy.Tensor_out", "aten::unbind_copy.int_out",
                      "aten::unsafe_split.Tensor_out", "aten::_foreach_add.Scalar_out", "aten::_foreach_exp.out"}
UNCHECKED_INPLACE = {"aten::_amp_foreach_non_finite_check_and_unscale_", "aten::_fused_adam_",
                     "aten::_fused_adam_.tensor_lr", "aten::_fused_adamw_", "aten::_fused_adamw_.tensor_lr",
                     "aten::_fused_sgd_", "aten::_fused_sgd_.tensor_lr", "aten::_fused_adagrad_",
                     "aten::_fused_adagrad_.tensor_lr"}


def _by_rule(out: str) -> dict[str, set[str]]:
    rules: dict[str, set[str]] = {}
    for f in json.loads(out)["findings"]:
        rules.setdefault(f["rule"], set()).add(f["op"])
    return rules


def test_lint_autograd_reports_both_finding_classes(run_cli, default_scan):
    rc, out, err = run_cli("lint", "--autograd", "--format", "json")
    assert rc == 1, err
    rules = _by_rule(out)
    unchecked = rules["out-requires-grad-unchecked"]
    assert SOME_UNCHECKED_OUT <= unchecked and "aten::add.out" not in unchecked
    # every one is an out= op that returns nothing (torch 2.13: all 95 of them)
    void_out = {r.name for r in default_scan.records if r.kind == "out" and r.returns == 0 and r.written}
    assert unchecked <= void_out and len(unchecked) == 95
    # in-place foreach ops record history (check_inplace); the fused optimizers and the AMP unscale do not
    assert rules["inplace-check-missing"] == UNCHECKED_INPLACE
    assert "aten::_foreach_add_.Scalar" not in rules["inplace-check-missing"]
    # the version-counter findings are unchanged by the flag
    rc0, out0, _ = run_cli("lint", "--format", "json")
    assert rules["missing-inplace-or-view-kernel"] == _by_rule(out0)["missing-inplace-or-view-kernel"]
    assert set(_by_rule(out0)) == {"missing-inplace-or-view-kernel"}


def test_autograd_rules_in_every_format(run_cli):
    rc, out, _ = run_cli("lint", "--autograd")
    line = next(x for x in out.splitlines() if "aten::split_with_sizes_copy.out: out= op that returns nothing" in x)
    assert ": error: [VERSIONCOUNTER] " in line and "never refuses an input or output that requires grad" in line
    assert any(": warning: [VERSIONCOUNTER] aten::_fused_adam_: in-place op" in x for x in out.splitlines())
    _, out, _ = run_cli("lint", "--autograd", "--format", "sarif")
    run = json.loads(out)["runs"][0]
    ids = {r["id"] for r in run["tool"]["driver"]["rules"]}
    assert {"VERSIONCOUNTER/out-requires-grad-unchecked", "VERSIONCOUNTER/inplace-check-missing"} <= ids
    assert any(r["ruleId"] == "VERSIONCOUNTER/out-requires-grad-unchecked" for r in run["results"])
    _, out, _ = run_cli("lint", "--autograd", "--format", "lintrunner")
    names = {json.loads(x)["name"] for x in out.splitlines()}
    assert {"out-requires-grad-unchecked", "inplace-check-missing"} <= names
    _, out, _ = run_cli("lint", "--autograd", "--format", "github")
    assert any(x.startswith("::error ") and "split_with_sizes_copy.out" in x and "requires grad" in x
               for x in out.splitlines())


def test_overlay_skip_accepts_autograd_findings(run_cli, tmp_path):
    from tests.yaml_fixtures import subset_yaml

    native, _ = subset_yaml(str(tmp_path), ["split_with_sizes_copy", "split_with_sizes_copy.out", "add.out", "add.Tensor"])
    rc, out, _ = run_cli("lint", "--autograd", "--native-functions", native, "--no-overlay", "--format", "json")
    assert _by_rule(out).get("out-requires-grad-unchecked") == {"aten::split_with_sizes_copy.out"}
    ov = tmp_path / "o.yaml"
    ov.write_text("aten::split_with_sizes_copy.out:\n  action: skip\n  reason: known\n")
    rc, out, _ = run_cli("lint", "--autograd", "--native-functions", native, "--overlay", ov)
    assert rc == 0 and out.startswith("0 finding(s)"), out


def test_autograd_does_not_go_with_runtime(run_cli):
    rc, out, err = run_cli("lint", "--runtime", "--autograd")
    assert rc == 2 and err.count("\n") == 1 and "error:" in err


def test_both_worlds_give_the_same_autograd_findings(notorch, tree213, tmp_path):
    """The checkout world (a tree of the installed release, a venv with no torch, its own
    tools/autograd/gen_variable_type.py) reports the same ops, at the tree's own lines."""
    import sys

    from tests.conftest import ROOT
    from tests.test_checkout import tgp

    ref = tgp(sys.executable, "lint", "--autograd", "--format", "json", pythonpath=ROOT, cache=tmp_path / "c")
    got = tgp(notorch, "lint", "--autograd", "--format", "json", "--pytorch-root", tree213, cache=tmp_path / "c")
    assert ref.returncode == got.returncode == 1, ref.stderr + got.stderr

    def rows(out):
        return {(f["rule"], f["op"], f["line"]) for f in json.loads(out)["findings"]
                if f["rule"] in ("out-requires-grad-unchecked", "inplace-check-missing")}

    assert rows(got.stdout) == rows(ref.stdout) and len(rows(ref.stdout)) == 95 + 9
