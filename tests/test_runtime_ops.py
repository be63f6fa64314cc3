"""Issue 9: mutating custom ops of any namespace, found in the live registry and
patched with one boxed kernel (or the Python fallback)."""

import os
import subprocess
import sys

import pytest
import torch

import testbed.custom_ops  # noqa: F401  (defines tgp_test::*)
import torchgen_patch
from tests.conftest import ROOT
from testbed.fsdp import fsdp2
from torchgen_patch.runtime.dispatcher import registered_at

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
OPS = ["tgp_test::write_one", "tgp_test::write_list", "tgp_test::write_opt"]
FSDP2, FSDP2_OPS = fsdp2()
NO_FSDP2_OPS = pytest.mark.skipif(not FSDP2_OPS, reason=f"this torch's FSDP2 ({FSDP2}) defines no fsdp:: operators")


def test_runtime_lint_finds_the_custom_ops(run_cli):
    rc, out, _ = run_cli("lint", "--runtime", "--import", "testbed.custom_ops", "--namespace", "tgp_test")
    assert rc == 1
    lines = out.strip().splitlines()
    assert lines[-1] == "3 finding(s) in the live operator registry; left out by the overlay: 0"
    import re

    assert sorted(re.search(r"\[VERSIONCOUNTER\] (\S+): writes out and has no ADInplaceOrView kernel", line)
                  .group(1) for line in lines[:-1]) == sorted(OPS)
    # defined before the lint ran (this module imports them): the location is the dispatcher's
    # record of the library's creation, which torch 2.4 gets wrong ("/dev/null:241", an import
    # frame): there the location is unknown, never a wrong file
    recorded = os.path.isfile(registered_at("tgp_test::write_one")[0])
    assert all((os.path.join("testbed", "custom_ops.py") in line) == recorded for line in lines[:-1])


@NO_FSDP2_OPS
def test_runtime_lint_finds_fsdp_op(run_cli):
    rc, out, _ = run_cli("lint", "--runtime", "--import", FSDP2, "--namespace", "fsdp",
                         "--format", "json")
    import json

    ops = {f["op"] for f in json.loads(out)["findings"]}
    assert rc == 1 and "fsdp::split_with_sizes_copy" in ops


def test_runtime_lint_bad_import(run_cli):
    rc, _, err = run_cli("lint", "--runtime", "--import", "no_such_module_xyz")
    assert rc == 2 and err == ("torchgen-patch: error: --import no_such_module_xyz: ModuleNotFoundError: "
                               "No module named 'no_such_module_xyz'\n")


def _calls(device):
    x = torch.randn(3, device=device)
    one = torch.empty(3, device=device)
    torch.ops.tgp_test.write_one(x, one)
    lst = [torch.empty(3, device=device), torch.empty(3, device=device)]
    torch.ops.tgp_test.write_list(x, lst)
    opt = torch.empty(3, device=device)
    torch.ops.tgp_test.write_opt(x, opt)
    torch.ops.tgp_test.write_opt(x, None)  # the optional written argument passed as None
    torch.ops.tgp_test.write_opt(x)
    assert torch.equal(one, x) and torch.equal(lst[1], x) and torch.equal(opt, x)
    return one._version, [t._version for t in lst], opt._version


def _fsdp_call(device):
    x = torch.randn(2, 2, device=device)
    y, z = torch.empty(2, 1, device=device), torch.empty(2, 1, device=device)
    torch.ops.fsdp.split_with_sizes_copy(x, [1, 1], dim=1, out=[y, z])
    return y._version, z._version


@pytest.mark.parametrize("backend", [pytest.param("cpp", marks=pytest.mark.build), "python"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[CUDA, pytest.mark.cuda])])
def test_boxed_kernel_bumps_exactly_once(backend, device):
    assert _calls(device) == (0, [0, 0], 0)
    fsdp = FSDP2_OPS[:1]  # [] where FSDP2 has no ops of its own (torch 2.4): the custom ops alone
    # FSDP2's op calls aten's split_with_sizes_copy.out, which bumps on CPU (through copy_)
    # and not on CUDA: the original report, one level down
    assert not fsdp or _fsdp_call(device) == ((1, 1) if device == "cpu" else (0, 0))
    rep = torchgen_patch.install(runtime_ops=OPS + fsdp, backend=backend)
    try:
        assert sorted(rep.registered) == sorted(OPS + fsdp) and not rep.refused
        assert _calls(device) == (1, [1, 1], 1)
        assert not fsdp or _fsdp_call(device) == (1, 1)
        again = torchgen_patch.install(runtime_ops=OPS, backend=backend)
        assert again.registered == [] and sorted(again.already) == sorted(OPS)
    finally:
        torchgen_patch.uninstall()
    assert _calls(device) == (0, [0, 0], 0)


def test_runtime_refusals():
    rep = torchgen_patch.install(runtime_ops=["tgp_test::read_only", "tgp_test::nope", "aten::add.out"],
                                 backend="python")
    try:
        assert rep.registered == []
        assert rep.refused == {
            "tgp_test::read_only": "its schema writes no argument",
            "tgp_test::nope": "this process has no such operator (import the module that defines it first)",
            "aten::add.out": "already has an ADInplaceOrView kernel",
        }
    finally:
        torchgen_patch.uninstall()


@pytest.mark.build
@NO_FSDP2_OPS
def test_fsdp2_trains_identically_with_its_ops_patched(library):
    from tests.test_fsdp import _free_port, _train

    script = open(os.path.join(ROOT, "tests", "test_fsdp.py")).read()
    code = script[script.index('SCRIPT = r"""') + len('SCRIPT = r"""'):script.index('""".replace')]
    code = code.replace("ROOT", repr(ROOT)).replace(
        "    rep = torchgen_patch.install()",
        f"    import {FSDP2}\n"
        f"    rep = torchgen_patch.install(runtime_ops={FSDP2_OPS!r})")
    losses = [_train("cpu", patched, _free_port(), script=code) for patched in (False, True)]
    assert losses[0] == losses[1] and len(losses[0]) == 5


# ---------------------------------------------------------------------------
# ops that write an argument and return something; noisy imports; define sites; patterns


@pytest.mark.build
@pytest.mark.parametrize("backend", ["cpp", "python"])
def test_returned_values_pass_through_the_kernel(backend):
    import tests.custom_ops_ret  # noqa: F401

    x = torch.arange(3.0)
    rep = torchgen_patch.install(backend=backend, runtime_ops=["tgp_ret::*"])
    try:
        assert sorted(rep.registered) == ["tgp_ret::many", "tgp_ret::one", "tgp_ret::pair"], rep.summary()
        out = torch.empty(3)
        r = torch.ops.tgp_ret.one(x, out)
        assert torch.equal(r, x * 2) and out._version == 1
        a, b = torch.ops.tgp_ret.pair(x, out)
        assert torch.equal(a, x * 2) and torch.equal(b, x * 3) and out._version == 2
        rs = torch.ops.tgp_ret.many(x, out)
        assert [t.tolist() for t in rs] == [(x * k).tolist() for k in (2, 3, 4)] and out._version == 3
    finally:
        torchgen_patch.uninstall()


@pytest.mark.parametrize("fmt", ["text", "json", "lintrunner", "sarif", "github"])
def test_a_module_that_prints_on_import_does_not_corrupt_the_report(fmt):
    import json

    r = subprocess.run([sys.executable, "-m", "torchgen_patch", "lint", "--runtime", "--import", "tests.noisy_ops",
                        "--namespace", "tgp_noisy", "--format", fmt], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == (0 if fmt == "lintrunner" else 1), r.stderr
    assert "a note printed to stdout" in r.stderr and "a note printed" not in r.stdout
    if fmt in ("json", "sarif"):
        json.loads(r.stdout)
    elif fmt == "lintrunner":
        assert [json.loads(line)["name"] for line in r.stdout.splitlines()] == ["missing-inplace-or-view-kernel"]
    elif fmt == "github":
        assert r.stdout.startswith("::error file=")
    else:
        assert r.stdout.splitlines()[-1] == "1 finding(s) in the live operator registry; left out by the overlay: 0"


def test_python_defined_op_is_located_at_its_define_call():
    """torch.library.define creates the op's library inside torch/library.py; the finding
    points at the define call in the extension's own file instead."""
    import json

    r = subprocess.run([sys.executable, "-m", "torchgen_patch", "lint", "--runtime", "--import", "tests.noisy_ops",
                        "--namespace", "tgp_noisy", "--format", "json"], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    (f,) = json.loads(r.stdout)["findings"]
    src = open(os.path.join(ROOT, "tests", "noisy_ops.py")).read().splitlines()
    assert f["path"] == os.path.join("tests", "noisy_ops.py") and src[f["line"] - 1].endswith("# DEFINE-LINE")


def test_unknown_location_is_null_never_a_torch_internal_file(monkeypatch):
    """An op whose only known location is torch's own torch/library.py, or a build path that
    does not exist on this machine (C++ ops of a wheel built elsewhere): path null."""
    import json

    from torchgen_patch.runtime import dispatcher, registry

    for where in (os.path.join(os.path.dirname(torch.__file__), "library.py"), "/__w/pytorch/pytorch/x.cpp"):
        monkeypatch.setattr(dispatcher, "registered_at", lambda op, w=where: (w, 741))
        assert registry.location_of("tgp_test::write_one") == (None, None)
    from torchgen_patch.diagnostics import rules
    from torchgen_patch.diagnostics.render import RENDERERS, Summary

    f = rules.missing_at_runtime(registry.RuntimeOp("ns::op", "ns::op(Tensor(a!) x) -> ()", ("x",),
                                                    registry.location_of("tgp_test::write_one")))
    assert json.loads(RENDERERS["json"]([f], Summary("runtime")))["findings"][0]["path"] is None
    assert json.loads(RENDERERS["lintrunner"]([f], Summary("runtime")))["path"] is None
    assert json.loads(RENDERERS["sarif"]([f], Summary("runtime")))["runs"][0]["results"][0]["locations"] == []
    assert RENDERERS["github"]([f], Summary("runtime")).startswith("::error title=")
    assert RENDERERS["text"]([f], Summary("runtime")).startswith("torchgen-patch: error: [VERSIONCOUNTER] ns::op:")


def test_a_pattern_that_matches_nothing_names_the_namespaces_that_have_such_ops():
    from torchgen_patch.errors import InputError

    with pytest.raises(InputError) as e:
        torchgen_patch.install(runtime_ops=["nosuchlib::*"])
    msg = e.value.render()
    assert msg.startswith("torchgen-patch: error: runtime op pattern 'nosuchlib::*' matches no mutating operator")
    assert "tgp_test" in msg


def test_evidence_compares_bits():
    from torchgen_patch.runtime.pykernel import _changed

    nan = torch.tensor([float("nan"), 1.0])
    assert _changed(nan.clone(), nan) is False  # NaN where NaN was: not a change
    assert _changed(torch.tensor([0.0]), torch.tensor([-0.0])) is True  # the sign bit is data
    assert _changed(torch.tensor(1.0), torch.tensor(1.0)) is False  # 0-dim
    assert _changed(torch.empty(2, device="meta"), torch.empty(2, device="meta")) is None  # cannot tell


def test_evidence_rows_are_labelled_and_still_unpack():
    from torchgen_patch.runtime.pykernel import Evidence

    ev = Evidence()
    for changed in (False, False, None):  # None: could not be told, not counted
        ev.add("ext::lookup", "indices", changed)
    ev.add("ext::lookup", "out", True)
    never = ev.never_changed()
    assert never == [("ext::lookup", "indices", 2)]
    (op, arg, calls), = never  # the old shape unpacks as before
    assert (never[0].op, never[0].arg, never[0].calls) == (op, arg, calls) == ("ext::lookup", "indices", 2)
    assert repr(never[0]) == "NeverChanged(op='ext::lookup', arg='indices', calls=2)"
    assert [(r.arg, r.calls, r.changed) for r in ev.rows()] == [("indices", 2, 0), ("out", 1, 1)]
