"""The autograd half of the zero-returns hole: out= ops returning nothing whose VariableType
kernel never refuses inputs that require grad, and void in-place ops that skip check_inplace.
Lint asks the tree's own gen_variable_type (both worlds)."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import ROOT
from tests.support import torch_is
from tests.test_checkout import notorch, tree213

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
    # every out= op that returns nothing (torch 2.13: all 95 of them)
    void_out = {r.name for r in default_scan.records if r.kind == "out" and r.returns == 0 and r.written}
    assert unchecked == void_out and (len(unchecked) == 95 or not torch_is("2.13"))
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

    native, _ = subset_yaml(str(tmp_path), ["split_with_sizes_copy", "split_with_sizes_copy.out", "add.out",
                                            "add.Tensor"])
    rc, out, _ = run_cli("lint", "--autograd", "--native-functions", native, "--no-overlay", "--format", "json")
    assert _by_rule(out).get("out-requires-grad-unchecked") == {"aten::split_with_sizes_copy.out"}
    ov = tmp_path / "o.yaml"
    ov.write_text("aten::split_with_sizes_copy.out:\n  action: skip\n  reason: known\n")
    rc, out, _ = run_cli("lint", "--autograd", "--native-functions", native, "--overlay", ov)
    assert rc == 0 and out.startswith("0 finding(s)"), out


def test_autograd_does_not_go_with_runtime(run_cli):
    rc, out, err = run_cli("lint", "--runtime", "--autograd")
    assert rc == 2 and err.count("\n") == 1 and "error:" in err
    rc, out, err = run_cli("lint", "--runtime", "--requires-grad")
    assert (rc, out) == (2, "") and err == ("torchgen-patch: error: --requires-grad asks the yaml's autograd "
                                            "codegen: it does not go with --runtime\n")


def test_both_worlds_give_the_same_autograd_findings(notorch, tree213, tmp_path):
    """The checkout world (a tree of the installed release, a venv with no torch, its own
    tools/autograd/gen_variable_type.py) reports the same ops, at the tree's own lines."""
    import sys

    from tests.test_checkout import tgp

    ref = tgp(sys.executable, "lint", "--autograd", "--format", "json", pythonpath=ROOT, cache=tmp_path / "c")
    got = tgp(notorch, "lint", "--autograd", "--format", "json", "--pytorch-root", tree213, cache=tmp_path / "c")
    assert ref.returncode == got.returncode == 1, ref.stderr + got.stderr

    def rows(out):
        return {(f["rule"], f["op"], f["line"]) for f in json.loads(out)["findings"]
                if f["rule"] in ("out-requires-grad-unchecked", "inplace-check-missing")}

    assert rows(got.stdout) == rows(ref.stdout)
    assert len(rows(ref.stdout)) == 95 + 9 or not torch_is("2.13")


# ---------------------------------------------------------------------------
# The generated kernels refuse (tests/test_requires_grad.py -k cuda on the GPU machine)

CUDA = pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="no CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=[CUDA, pytest.mark.cuda])]


def _unchecked(default_scan) -> list[str]:
    return sorted(r.name for r in default_scan.with_gap("out"))


@pytest.fixture
def kernels(request, default_plan):
    """How to install the plan's kernels for one test: cpp (the compiled library) or python."""
    import torchgen_patch

    backend = request.param
    library = request.getfixturevalue("library").path if backend == "cpp" else None

    def install(**kw):
        rep = torchgen_patch.install(library=library, **kw) if library else \
            torchgen_patch.install(backend="python", **kw)
        assert not rep.refused, rep.summary()
        return rep

    yield install
    torchgen_patch.uninstall()


@pytest.mark.parametrize("outputs", [False, True], ids=["inputs", "outputs"])
@pytest.mark.parametrize("kernels", [pytest.param("cpp", marks=pytest.mark.build), "python"], indirect=True)
@pytest.mark.parametrize("device", DEVICES)
def test_patched_out_ops_refuse_requires_grad_unpatched_are_silent(default_scan, kernels, device, outputs):
    """Every op of the rule, run with its floating inputs (or its outputs) requiring grad in grad mode:
    unpatched the call goes through (SILENT); patched it raises PyTorch's own message, naming the op
    as PyTorch does, before anything is written."""
    import torchgen_patch
    from torchgen_patch.checks import verify as rg

    ops = _unchecked(default_scan)
    assert not torchgen_patch.installed_ops()
    before = {r.op: r for r in rg.run_grad(ops, device, False, outputs)}
    kernels()
    after = {r.op: r for r in rg.run_grad(ops, device, True, outputs)}
    ran = [op for op in ops if before[op].verdict != rg.NOT_RUN]
    assert all(after[op].verdict == rg.NOT_RUN for op in set(ops) - set(ran))
    # 91 of the 95 run on CPU with torch 2.13 (the rest need cuDNN, MPS, MIOpen or have no floating tensor)
    floor = 91 if device == "cpu" and torch_is("2.13") else 80
    assert len(ran) >= floor, [(op, before[op].message) for op in ops if op not in ran]
    silent = {op for op in ran if before[op].verdict == rg.SILENT}
    # unpatched: silent (with outputs requiring grad one op already refuses through the op it calls)
    assert len(silent) >= len(ran) - (0 if not outputs else 1), {op: before[op] for op in ran if op not in silent}
    for op in ran:
        r = after[op]
        assert r.verdict == rg.REFUSE and r.unwritten, r
        name = default_scan.get(op).grad_name
        assert r.message == f"{name}{rg.MESSAGE}", r.message
    assert after["aten::split_with_sizes_copy.out"].message.startswith("split_with_sizes_copy(): ")
    assert after["aten::_foreach_add.Scalar_out"].message.startswith("_foreach_add(): ")


@pytest.mark.parametrize("kernels", [pytest.param("cpp", marks=pytest.mark.build), "python"], indirect=True)
@pytest.mark.parametrize("device", DEVICES)
def test_no_change_under_no_grad_inference_mode_or_without_requires_grad(kernels, device):
    """FSDP2's case (split_with_sizes_copy out= under no_grad), inference_mode, and plain tensors:
    no error, one bump per written tensor, the same values as unpatched."""
    import torch

    def call(x, mode):
        y, z = torch.empty(2, 1, device=device), torch.empty(2, 1, device=device)
        with mode():
            torch.split_with_sizes_copy(x, [1, 1], dim=1, out=[y, z])
        return y, z

    x = torch.arange(4.0, device=device).reshape(2, 2).requires_grad_()
    want = call(x.detach(), torch.no_grad)
    kernels()
    for mode, inp in ((torch.no_grad, x), (torch.enable_grad, x.detach()), (torch.inference_mode, x.detach())):
        y, z = call(inp, mode)
        assert torch.equal(y, want[0]) and torch.equal(z, want[1])
        if mode is not torch.inference_mode:
            assert (y._version, z._version) == (1, 1)
    with torch.inference_mode():  # inference tensors throughout, grad mode off
        a = torch.ones(2, 2, device=device)
        torch.split_with_sizes_copy(a, [1, 1], dim=1, out=[torch.empty(2, 1, device=device)] * 2)


def test_switches_turn_the_check_off(run_cli, tmp_path, default_scan):
    """Globally (--no-requires-grad-check, install(requires_grad_check=False)) and per op (the
    overlay's 'requires_grad: allow'): the kernel has no refusal; every other kernel keeps it."""
    out = tmp_path / "on"
    assert run_cli("gen", "-o", out)[0] == 0
    text = "".join(p.read_text() for p in sorted(out.glob("ADInplaceOrViewPatch_*.cpp")))
    assert 'torchgen_patch::refuse_requires_grad("split_with_sizes_copy", self, out);' in text
    n = len(default_scan.with_gap("out"))
    assert text.count("torchgen_patch::refuse_requires_grad(") == n and (n == 95 or not torch_is("2.13"))
    off = tmp_path / "off"
    assert run_cli("gen", "-o", off, "--no-requires-grad-check")[0] == 0
    assert "refuse_requires_grad(" not in "".join(p.read_text() for p in off.glob("ADInplaceOrViewPatch_*.cpp"))
    shipped = open(os.path.join(ROOT, "native_functions_overlay.yaml"), encoding="utf-8").read()
    ov = tmp_path / "overlay.yaml"
    ov.write_text(shipped + "\naten::split_with_sizes_copy.out:\n  requires_grad: allow\n")
    one = tmp_path / "one"
    assert run_cli("gen", "-o", one, "--overlay", ov)[0] == 0
    text = "".join(p.read_text() for p in sorted(one.glob("ADInplaceOrViewPatch_*.cpp")))
    assert '"split_with_sizes_copy"' not in text and text.count("torchgen_patch::refuse_requires_grad(") == n - 1
    bad = tmp_path / "bad.yaml"
    bad.write_text("aten::split_with_sizes_copy.out:\n  requires_grad: maybe\n")
    rc, _, err = run_cli("gen", "-o", tmp_path / "x", "--overlay", bad)
    assert rc == 2 and err == f"{bad}:2: error: requires_grad must be one of refuse, allow, not 'maybe'\n"


def test_python_api_switch(default_scan):
    import torch

    import torchgen_patch

    x = torch.ones(2, 2, requires_grad=True)
    try:
        torchgen_patch.install(backend="python", requires_grad_check=False)
        y, z = torch.empty(2, 1), torch.empty(2, 1)
        torch.split_with_sizes_copy(x, [1, 1], dim=1, out=[y, z])  # allowed: the check is off
        assert (y._version, z._version) == (1, 1)
        torchgen_patch.uninstall()
        torchgen_patch.install(backend="python")
        with pytest.raises(RuntimeError, match=r"^split_with_sizes_copy\(\): functions with out=\.\.\. "):
            torch.split_with_sizes_copy(x, [1, 1], dim=1, out=[y, z])
    finally:
        torchgen_patch.uninstall()
