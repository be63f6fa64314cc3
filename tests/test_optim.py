"""Optimizers that write outside the dispatcher: the overlay's optimizer entries (validated
strictly), applied by install() and run through PyTorch's optimizer step hooks (exactly one bump
per written tensor per step, none where the step moved the version, no other optimizer touched),
the lint's probe step that finds such optimizers, and the shipped entries (DeepSpeed's CPU
optimizers and FusedAdam's CPU build, bitsandbytes' optimizers), with the real libraries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import torchgen_patch
from tests import optim_fixtures as fx
from tests.conftest import ROOT
from tests.support import root_env
from torchgen_patch.plan import overlay as ov
from torchgen_patch.sources import shipped_overlay

ONE_OP = ["aten::_foreach_zero_"]  # install() with the Python backend and one kernel: no build needed


def _overlay(tmp_path, entries: dict[str, str]) -> str:
    """An overlay of optimizer entries (class -> its writes, as yaml flow text)."""
    p = tmp_path / "overlay.yaml"
    p.write_text("optimizers:\n" + "".join(f"  {c}:\n    writes: {w}\n    reason: the fixture's write\n"
                                           for c, w in entries.items()))
    return str(p)


@pytest.fixture
def entries(tmp_path):
    """install() with an overlay of optimizer entries for the fixture classes; uninstalled after."""
    def apply(**writes):
        rep = torchgen_patch.install(ONE_OP, backend="python",
                                     overlay=_overlay(tmp_path, {f"tests.optim_fixtures.{c}": w
                                                                 for c, w in writes.items()}))
        return rep

    yield apply
    torchgen_patch.uninstall()


def _stale(cls, shape=(8, 8), **kw):
    """A parameter saved for backward, then stepped: (param, loss whose backward uses it)."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(*shape))
    opt = cls([p], **kw)
    loss = (p * p).sum()
    p.grad = torch.ones_like(p)
    before = p.detach().clone()
    opt.step()
    assert not torch.equal(before, p.detach())  # the step did write it
    return p, loss


def _raises(loss) -> bool:
    try:
        loss.backward()
    except RuntimeError as e:
        assert "modified by an inplace operation" in str(e), e
        return True
    return False


# --- the overlay's optimizer entries -------------------------------------------------------------

@pytest.mark.parametrize("text,line,message", [
    ("optimizers: []\n", 1, "'optimizers' must be a mapping keyed by optimizer class (module.Class)"),
    ("optimizers:\n  Adam: {writes: [params], reason: r}\n", 2,
     "optimizer class 'Adam' is not a class path (hint: name it as module.Class, e.g. "
     "'deepspeed.ops.adam.cpu_adam.DeepSpeedCPUAdam')"),
    ("optimizers:\n  a.B:\n    write: [params]\n    reason: r\n", 3,
     "unknown key 'write' in entry for 'a.B' (hint: did you mean 'writes'?)"),
    ("optimizers:\n  a.B:\n    writes:\n      - params\n      - stat\n    reason: r\n", 5,
     "unknown 'writes' item 'stat' (hint: did you mean 'state'?)"),
    ("optimizers:\n  a.B: {writes: [params, params], reason: r}\n", 2, "'params' is listed twice in 'writes'"),
    ("optimizers:\n  a.B: {writes: [], reason: r}\n", 2,
     "'writes' must be a non-empty list of strings (hint: from: params, state)"),
    ("optimizers:\n  a.B: {writes: params, reason: r}\n", 2,
     "'writes' must be a non-empty list of strings (hint: from: params, state)"),
    ("optimizers:\n  a.B: {reason: r}\n", 2, "'a.B': an optimizer entry needs 'writes' (hint: writes: [params] "
                                              "or [params, state])"),
    ("optimizers:\n  a.B: {writes: [params], reason: ' '}\n", 2,
     "'a.B': an optimizer entry needs a non-empty 'reason' (hint: what its step writes, and how autograd misses it)"),
    ("optimizers:\n  a.B: {writes: [params], reason: 3}\n", 2, "'reason' must be a string"),
    ("optimizers:\n  a.B: [params]\n", 2, "entry for 'a.B' must be a mapping"),
    ("optimizers:\n  a.B: {writes: [params], reason: r}\n  a.B: {writes: [params], reason: r}\n", 3,
     "duplicate entry for 'a.B' (hint: first at line 2)"),
    ("optimizers: {}\noptimizers: {}\n", 2, "duplicate section 'optimizers'"),
    ("optimizer:\n  a.B: {writes: [params], reason: r}\n", 1, "unknown operator 'optimizer' (hint: did you mean "
                                                              "'optimizers'?)"),
    ("a.B:\n  writes: [params]\n  reason: r\n", 1,
     "unknown operator 'a.B' (hint: an optimizer entry goes in the 'optimizers:' section)"),
])
def test_bad_optimizer_entries_are_errors_at_their_line(run_cli, tmp_path, text, line, message):
    p = tmp_path / "overlay.yaml"
    p.write_text(text)
    rc, out, err = run_cli("lint", "--overlay", p)
    assert (rc, out) == (2, "")
    assert err == f"{p}:{line}: error: {message}\n"


def test_an_empty_section_has_no_entries(tmp_path):
    p = tmp_path / "overlay.yaml"
    p.write_text("optimizers:\n")
    assert ov.load_runtime(str(p)).optimizers == {}


def test_install_refuses_a_bad_entry_before_applying_any(tmp_path):
    p = tmp_path / "overlay.yaml"
    p.write_text("optimizers:\n  tests.optim_fixtures.NumpyWriter: {writes: [params], reason: r}\n  x: {}\n")
    from torchgen_patch.errors import InputError

    with pytest.raises(InputError, match=r"overlay.yaml:3: error: optimizer class 'x'"):
        torchgen_patch.install(runtime_ops=[], overlay=str(p))
    from torchgen_patch.runtime import optim

    assert optim.active() == []


def test_the_cached_overlay_keeps_its_optimizer_entries(tmp_path, default_scan):
    from tests.support import overlay_of

    path = _overlay(tmp_path, {"tests.optim_fixtures.NumpyWriter": "[params, state]"})
    first, again = overlay_of(path, default_scan), overlay_of(path, default_scan)  # parsed, then from the cache
    assert first.optimizers == again.optimizers
    assert again.optimizers["tests.optim_fixtures.NumpyWriter"].writes == ("params", "state")


# --- applied through the optimizer step hooks ----------------------------------------------------

def test_without_an_entry_a_write_outside_the_dispatcher_is_silent():
    p, loss = _stale(fx.NumpyWriter)
    assert p._version == 0 and not _raises(loss)


def test_an_entry_bumps_each_written_parameter_once_per_step(entries):
    rep = entries(NumpyWriter="[params]")
    assert rep.optimizers == ["tests.optim_fixtures.NumpyWriter"]
    assert "; 1 optimizer entry active" in rep.summary()
    p, loss = _stale(fx.NumpyWriter)
    assert p._version == 1 and _raises(loss)
    opt = fx.NumpyWriter([p])
    for _ in range(3):
        opt.step()
    assert p._version == 4


def test_no_bump_where_the_step_moved_the_version_itself(entries):
    entries(AtenWriter="[params]")
    p, loss = _stale(fx.AtenWriter)
    assert p._version == 1 and _raises(loss)  # the aten op's own bump, and no second one


def test_a_parameter_the_step_skips_is_not_bumped(entries):
    entries(NumpyWriter="[params]")
    a, b = torch.nn.Parameter(torch.randn(4)), torch.nn.Parameter(torch.randn(4))
    opt = fx.NumpyWriter([a, b])
    a.grad = torch.ones(4)  # b has none: the step leaves it alone
    opt.step()
    assert (a._version, b._version) == (1, 0)


def test_parameters_that_share_one_counter_advance_it_once(entries):
    entries(NumpyWriter="[params]")
    base = torch.zeros(8)
    a, b = torch.nn.Parameter(base[:4]), torch.nn.Parameter(base[4:])  # views of one base: one counter
    a.grad, b.grad = torch.ones(4), torch.ones(4)
    fx.NumpyWriter([a, b]).step()
    assert (a._version, b._version) == (1, 1)


def test_state_entries_bump_the_state_the_step_found(entries):
    entries(StatefulNumpyWriter="[params, state]")
    p = torch.nn.Parameter(torch.randn(4))
    p.grad = torch.ones(4)
    opt = fx.StatefulNumpyWriter([p])
    opt.step()  # creates its momentum buffer: new, nothing can have saved it
    assert (p._version, opt.state[p]["momentum"]._version) == (1, 0)
    opt.step()
    assert (p._version, opt.state[p]["momentum"]._version) == (2, 1)


def test_an_entry_may_name_a_class_where_it_is_re_exported(tmp_path, entries, monkeypatch):
    import types

    alias = types.ModuleType("tests.optim_alias")
    alias.Writer = fx.NumpyWriter
    monkeypatch.setitem(sys.modules, "tests.optim_alias", alias)
    rep = torchgen_patch.install(ONE_OP, backend="python", overlay=_overlay(tmp_path, {"tests.optim_alias.Writer":
                                                                                        "[params]"}))
    assert rep.optimizers == ["tests.optim_alias.Writer"]
    p, _ = _stale(fx.NumpyWriter)
    assert p._version == 1


def test_other_optimizers_are_untouched_and_results_bit_identical(entries):
    def train(cls, **kw):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        opt = cls(m.parameters(), **kw)
        x, y = torch.randn(32, 16), torch.randn(32, 1)
        for _ in range(4):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
        return [p.detach().clone() for p in m.parameters()], [p._version for p in m.parameters()]

    cases = [(torch.optim.AdamW, {"lr": 0.01}), (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
             (fx.DataWriter, {})]
    want = [train(c, **kw) for c, kw in cases]
    entries(NumpyWriter="[params]")
    got = [train(c, **kw) for c, kw in cases]
    for (wp, wv), (gp, gv) in zip(want, got, strict=True):
        assert wv == gv  # no version moved differently: the entry names another class
        assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(wp, gp, strict=True))


def test_uninstall_removes_the_hooks(entries):
    entries(NumpyWriter="[params]")
    torchgen_patch.uninstall()
    p, loss = _stale(fx.NumpyWriter)
    assert p._version == 0 and not _raises(loss)
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

    from torchgen_patch.runtime import optim

    assert optim.before_step not in _global_optimizer_pre_hooks.values()
    assert optim.after_step not in _global_optimizer_post_hooks.values()


def test_the_bump_takes_one_tensor_at_a_time_where_torch_takes_no_list(monkeypatch):
    """torch 2.4's ``_increment_version`` takes one tensor (later releases a list): each is bumped once."""
    from torchgen_patch.runtime import dispatcher

    real = torch._C._increment_version

    def one(t):
        if not isinstance(t, torch.Tensor):
            raise TypeError("_increment_version(): incompatible function arguments")
        real((t,)) if torch_takes_lists() else real(t)

    def torch_takes_lists():
        try:
            real(())
            return True
        except TypeError:
            return False

    monkeypatch.setattr(torch._C, "_increment_version", one)
    a, b = torch.zeros(2), torch.zeros(2)
    dispatcher.version_bumper()((a, b))
    assert (a._version, b._version) == (1, 1)


def test_inference_tensors_have_no_counter_and_are_left_alone(entries):
    entries(NumpyWriter="[params]")
    with torch.inference_mode():
        p = torch.randn(4)
    p.grad = torch.ones(4)
    fx.NumpyWriter([p]).step()  # no error: nothing to bump


# --- lint --runtime --import: the probe step ------------------------------------------------------

def _lint_optimizers(run_cli, *extra):
    rc, out, err = run_cli("lint", "--runtime", "--import", "tests.optim_fixtures", "--namespace", "aten",
                           "--format", "json", *extra)
    doc = json.loads(out)
    found = {f["op"]: f for f in doc["findings"] if f["rule"].startswith("optimizer-")}
    return rc, found, doc, err


def test_lint_finds_the_optimizers_whose_step_autograd_cannot_see(run_cli):
    rc, found, doc, _ = _lint_optimizers(run_cli)
    assert rc == 1
    cls = "tests.optim_fixtures."
    assert {op: f["rule"] for op, f in found.items()} == {
        cls + "NumpyWriter": "optimizer-step-unseen", cls + "StatefulNumpyWriter": "optimizer-step-unseen",
        cls + "DataWriter": "optimizer-step-unseen", cls + "NeedsLr": "optimizer-step-unseen",
        cls + "PrintsInC": "optimizer-step-unseen", cls + "NeedsMomentum": "optimizer-step-unseen",
        cls + "NeedsHyperparameters": "optimizer-step-unseen",
        cls + "NeedsConfig": "optimizer-not-probed", cls + "StepFails": "optimizer-not-probed",
        cls + "DoesNothing": "optimizer-not-probed", cls + "_Base": "optimizer-not-probed",
        cls + "StepPerInstance": "optimizer-not-probed", cls + "MomentumDoesNotHelp": "optimizer-not-probed",
        cls + "NeedsName": "optimizer-not-probed"}  # AtenWriter and StepNeedsMomentum bump: no finding
    msg = {op.rsplit(".", 1)[1]: f["message"] for op, f in found.items()}
    assert "without moving its version counter, so autograd cannot see the write: it writes the parameter outside " \
        "the dispatcher (C++ bound with pybind, data_ptr, numpy); " in msg["NumpyWriter"]
    assert "an optimizer entry in the overlay (optimizers: tests.optim_fixtures.NumpyWriter: writes: [params])" \
        in msg["NumpyWriter"]
    assert "through aten::add_.Tensor on an alias whose version counter is its own (p.data)" in msg["DataWriter"]
    assert "not probed: could not be constructed: TypeError:" in msg["NeedsConfig"] and "config" in msg["NeedsConfig"]
    assert msg["StepFails"].endswith("not probed: its step raised RuntimeError: this optimizer needs a distributed "
                                     "group")
    assert msg["DoesNothing"].endswith("not probed: 3 probe steps changed no parameter")
    assert msg["_Base"].endswith("not probed: its step raised NotImplementedError (14 classes probed here derive "
                                 "from it)")  # torch's own Optimizer.step
    assert msg["StepPerInstance"].endswith("not probed: its instances replace step() with a method PyTorch's "
                                           "optimizer step hooks do not wrap, so no overlay entry can cover it")
    assert found[cls + "NumpyWriter"]["path"].endswith(os.path.join("tests", "optim_fixtures.py"))
    assert found[cls + "NumpyWriter"]["line"] == 23
    assert found[cls + "DoesNothing"]["severity"] == "warning"
    assert doc["optimizers"] == {"probed": 16, "covered_by_overlay": []}


def test_the_probe_gives_common_hyperparameters_and_switches_momentum_on(run_cli):
    """A class with no default for a common hyperparameter gets torch's usual value; one that
    refuses its default momentum=0, to construct or to step, is tried again with momentum=0.9; one
    that still fails keeps its defaults' reason, and the retry's beside it."""
    _, found, _, _ = _lint_optimizers(run_cli)
    msg = {op.rsplit(".", 1)[1]: f["message"] for op, f in found.items()}
    assert msg["NeedsLr"].startswith("tests.optim_fixtures.NeedsLr: its step (probed with lr=0.001) changed the "
                                     "parameter without moving its version counter")
    assert "its step (probed with lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.0) changed the " \
        "parameter" in msg["NeedsHyperparameters"]
    assert "NeedsMomentum: its step (probed with momentum=0.9) changed the parameter" in msg["NeedsMomentum"]
    assert "outside the dispatcher" in msg["NeedsMomentum"]
    assert "StepNeedsMomentum" not in msg  # with momentum on, its aten ops bump
    assert msg["MomentumDoesNotHelp"].endswith(
        "not probed: could not be constructed: ValueError: this optimizer needs a mesh (momentum=0); with "
        "momentum=0.9: could not be constructed: ValueError: this optimizer needs a mesh (momentum=0.9)")
    assert msg["NeedsName"].endswith("not probed: could not be constructed: TypeError: NeedsName.__init__() missing "
                                     "1 required positional argument: 'optimizer_name'")


def test_a_class_an_entry_covers_is_reported_as_covered(run_cli, tmp_path):
    path = _overlay(tmp_path, {"tests.optim_fixtures.NumpyWriter": "[params]"})
    _, found, doc, _ = _lint_optimizers(run_cli, "--overlay", path)
    assert "tests.optim_fixtures.NumpyWriter" not in found and "tests.optim_fixtures.DataWriter" in found
    assert doc["optimizers"] == {"probed": 16, "covered_by_overlay": ["tests.optim_fixtures.NumpyWriter"]}
    rc, out, _ = run_cli("lint", "--runtime", "--import", "tests.optim_fixtures", "--namespace", "aten",
                         "--overlay", path)
    assert out.splitlines()[-1].endswith("; optimizer classes probed: 16, covered by the overlay: 1 "
                                         "(tests.optim_fixtures.NumpyWriter)")


def test_a_module_of_optimizers_alone_needs_no_operator_in_its_namespace(run_cli):
    """``--namespace`` filters the operators: a module that defines optimizers and no operator
    (DeepSpeed's ops.lion, say) is linted under its own namespace; with no optimizer there, a
    namespace of no operator is still refused."""
    rc, out, err = run_cli("lint", "--runtime", "--import", "tests.optim_fixtures", "--namespace",
                           "optim_fixtures", "--format", "json")
    assert rc == 1, err
    doc = json.loads(out)
    rules_ = {f["rule"] for f in doc["findings"]}
    assert rules_ and all(r.startswith("optimizer-") for r in rules_) and doc["optimizers"]["probed"] == 16
    rc, out, err = run_cli("lint", "--runtime", "--import", "json", "--namespace", "optim_fixtures")
    assert rc == 2 and "--namespace 'optim_fixtures': no operator of the live registry is in it" in err
    # a misspelt namespace beside a module of optimizers is refused still (torch's own optimizers count too)
    for imports in (["tests.optim_fixtures"], ["torch"]):
        rc, out, err = run_cli("lint", "--runtime", *[a for m in imports for a in ("--import", m)], "--namespace",
                               "optim_fixturez")
        assert rc == 2 and "--namespace 'optim_fixturez': no operator of the live registry is in it" in err, imports


def test_an_entry_that_names_no_optimizer_class_is_a_finding_at_its_line(run_cli, tmp_path):
    """A misspelt class of an imported module, a name that is no optimizer class: findings at the
    entry's line; a module not imported (the library may be absent) is not looked at."""
    path = _overlay(tmp_path, {"torch.optim.adamw.AdamW": "[params]", "torch.optim.adamw.AdamWW": "[params]",
                               "torch.optim.adamw.adamw": "[params]", "notamodule.Foo": "[params]"})
    rc, out, err = run_cli("lint", "--runtime", "--namespace", "aten", "--overlay", path, "--format", "json")
    assert rc == 1, err
    found = {f["op"]: f for f in json.loads(out)["findings"] if f["rule"] == "optimizer-entry-unknown"}
    assert sorted(found) == ["torch.optim.adamw.AdamWW", "torch.optim.adamw.adamw"]
    assert found["torch.optim.adamw.AdamWW"]["line"] == 5 and found["torch.optim.adamw.adamw"]["line"] == 8
    assert found["torch.optim.adamw.AdamWW"]["message"] == (
        "torch.optim.adamw.AdamWW: the optimizer entry names nothing: torch.optim.adamw has no AdamWW, so it never "
        "applies; name the class as its module defines it")
    assert "a function of torch.optim.adamw, not an optimizer class" in found["torch.optim.adamw.adamw"]["message"]


def test_without_import_no_optimizer_is_probed(run_cli):
    rc, out, _ = run_cli("lint", "--runtime", "--namespace", "aten", "--format", "json")
    doc = json.loads(out)
    assert "optimizers" not in doc and not any(f["rule"].startswith("optimizer-") for f in doc["findings"])


def test_what_a_probed_class_prints_stays_off_the_report():
    r = subprocess.run([sys.executable, "-m", "torchgen_patch", "lint", "--runtime", "--import",
                        "tests.optim_fixtures", "--namespace", "aten", "--format", "json"],
                       cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    json.loads(r.stdout)  # one JSON document: the C-level and Python prints went to stderr
    assert "PrintsInC was created" in r.stderr and "PrintsInC says hello" in r.stderr


# --- the shipped entries, with the real libraries: DeepSpeed's CPU optimizers, bitsandbytes' ------
# (the tests that need DeepSpeed's ops come last: the session builds them meanwhile, deepspeed_ops)

SHIPPED = ov.load_runtime(shipped_overlay()).optimizers
# entries whose classes step CUDA tensors only (DeepSpeed has no CPU build of their ops): they are
# stepped in tests/test_optim_cuda.py, and here only named
CUDA_ONLY = ("deepspeed.ops.lamb.fused_lamb.FusedLamb", "deepspeed.ops.lion.fused_lion.FusedLion")
STEPS = 4  # training steps of the bit-identical comparison


def _cases(library: str):
    """(class, keywords) for every shipped entry of ``library``: DeepSpeedCPUAdam in both adamw_mode
    settings; bitsandbytes' SGD and LARS refuse to run without momentum."""
    for path in SHIPPED:
        name = path.rsplit(".", 1)[1]
        if path.split(".")[0] != library or path in CUDA_ONLY:
            continue
        if name == "DeepSpeedCPUAdam":
            yield from ((path, {"adamw_mode": True}), (path, {"adamw_mode": False}))
        elif library == "bitsandbytes":
            yield path, {"lr": 0.01, **({"momentum": 0.9} if name.startswith(("SGD", "LARS")) else {})}
        else:
            yield path, {}


def _ids(cases):
    return [".".join(p.split(".")[-2:]) + "".join(f"-{k}={v}" for k, v in kw.items() if k == "adamw_mode")
            for p, kw in cases]


BNB, DEEPSPEED = list(_cases("bitsandbytes")), list(_cases("deepspeed"))
DEEPSPEED_ENTRIES = sorted(p for p in SHIPPED if p.startswith("deepspeed.") and p not in CUDA_ONLY)
# the modules that define DeepSpeed's entries' classes: the lint probes these (deepspeed.ops.adam
# would also step its ZenFlow optimizers)
DEEPSPEED_MODULES = sorted({p.rpartition(".")[0] for p in DEEPSPEED_ENTRIES})


def _class(path: str):
    """The class ``path`` names. CI installs every library of a shipped entry (requirements-dev.txt),
    so only elsewhere does a missing one skip; DeepSpeed's classes need its ops (deepspeed_ops)
    before they are stepped."""
    import importlib

    module, _, name = path.rpartition(".")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if os.environ.get("CI") != "true":
            pytest.importorskip(path.split(".")[0])
        return getattr(importlib.import_module(module), name)


def _train(cls, kw, steps=STEPS):
    """A small MLP trained with ``cls``: the losses, the final parameters' bits and versions."""
    from tests.support import train_mlp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        losses, model = train_mlp(lambda params: cls(params, **kw), steps)
    return losses, [p.detach().clone().view(torch.int32) for p in model.parameters()], \
        [p._version for p in model.parameters()]


def _entry_checks(tmp_path, path, kw):
    """With every shipped entry but this one, the stepped parameter is used silently; with the
    shipped overlay (plain install(), as run has it) autograd raises; training gives the same losses
    and bits, each parameter one version further a step. 64x64: bitsandbytes' 8-bit optimizers use
    their 8-bit states."""
    cls = _class(path)
    without = _overlay(tmp_path, {c: "[params]" for c in SHIPPED if c != path})
    seen = {}
    for overlay in (without, None):  # None: the shipped overlay
        rep = torchgen_patch.install(ONE_OP, backend="python", overlay=overlay)
        try:
            assert rep.optimizers == sorted(c for c in SHIPPED if overlay is None or c != path)
            p, loss = _stale(cls, (64, 64), **kw)
            seen[overlay is None] = p._version, _raises(loss), _train(cls, kw)
        finally:
            torchgen_patch.uninstall()
    (version, raises, (want_losses, want_bits, want_versions)), (version_with, raises_with, (losses, bits, versions)) \
        = seen[False], seen[True]
    assert (version, raises) == (0, False) and (version_with, raises_with) == (1, True)
    assert losses == want_losses and all(torch.equal(a, b) for a, b in zip(want_bits, bits, strict=True))
    assert versions == [v + STEPS for v in want_versions]


def test_every_shipped_entry_names_an_optimizer_class_where_it_is_defined():
    assert set(CUDA_ONLY) <= set(SHIPPED)
    assert len(SHIPPED) == len(BNB) + len(DEEPSPEED) - 1 + len(CUDA_ONLY)  # DeepSpeedCPUAdam twice in DEEPSPEED
    for path, entry in SHIPPED.items():
        cls = _class(path)
        assert issubclass(cls, torch.optim.Optimizer) and f"{cls.__module__}.{cls.__qualname__}" == path
        assert entry.writes == ("params",) and entry.reason.strip()


@pytest.mark.parametrize("path,kw", BNB, ids=_ids(BNB))
def test_a_shipped_bitsandbytes_entry_makes_a_step_before_backward_raise_and_changes_no_result(tmp_path, path, kw):
    _entry_checks(tmp_path, path, kw)


def test_with_bitsandbytes_runtime_ops_as_well_each_parameter_moves_once_a_step():
    """run --runtime-op 'bitsandbytes::*' bumps inside the step; the entries then see the version
    moved and add nothing."""
    classes = [(_class(path), kw) for path, kw in BNB]
    rep = torchgen_patch.install(backend="python", runtime_ops=["bitsandbytes::*"])
    try:
        assert "bitsandbytes::optimizer_update_32bit" in rep.registered and rep.optimizers == sorted(SHIPPED)
        for cls, kw in classes:
            p, loss = _stale(cls, (64, 64), **kw)
            assert p._version == 1 and _raises(loss), cls
            versions = _train(cls, kw)[2]
            assert versions == [1 + STEPS] * 4, (cls, versions)  # the layers' initialisation, then a bump a step
    finally:
        torchgen_patch.uninstall()


def _lint_unseen(run_cli, *args) -> tuple[dict, dict]:
    """lint --runtime's optimizer rule, with the shipped overlay and with none: (the doc with it,
    class -> message of each unseen finding without it)."""
    rc, out, _ = run_cli("lint", "--runtime", *args, "--format", "json", "--no-overlay")
    unseen = {f["op"]: f["message"] for f in json.loads(out)["findings"] if f["rule"] == "optimizer-step-unseen"}
    rc, out, _ = run_cli("lint", "--runtime", *args, "--format", "json")
    return json.loads(out), unseen


def test_lint_finds_bitsandbytes_optimizers_and_the_shipped_entries_cover_exactly_them(run_cli):
    """Every class the rule finds unseen has an entry, and nothing else; those it cannot probe are
    bitsandbytes' bases (they need optimizer_name or defaults, which only their subclasses give) and
    its 32-bit AdEMAMix, whose step fails in bitsandbytes' own CPU backend (tests/test_ecosystem.py)."""
    _class("bitsandbytes.optim.Adam")
    doc, unseen = _lint_unseen(run_cli, "--import", "bitsandbytes", "--namespace", "bitsandbytes")
    assert sorted(unseen) == sorted(p for p, _ in BNB) and len(unseen) == 37
    assert all("through bitsandbytes::optimizer_update_32bit" in m for m in unseen.values())
    assert "(probed with lr=0.001, momentum=0.9)" in unseen["bitsandbytes.optim.sgd.SGD8bit"]
    assert not any(f["rule"] == "optimizer-step-unseen" for f in doc["findings"])
    assert sorted(doc["optimizers"]["covered_by_overlay"]) == sorted(unseen)
    not_probed = {f["op"].rsplit(".", 1)[1]: f["message"] for f in doc["findings"]
                  if f["rule"] == "optimizer-not-probed"}
    assert sorted(not_probed) == ["AdEMAMix32bit", "Optimizer1State", "Optimizer2State", "Optimizer8bit",
                                  "PagedAdEMAMix32bit"]
    assert all("doesn't match the broadcast shape" in m for n, m in not_probed.items() if "AdEMAMix" in n)
    assert all("classes probed here derive from it)" in m for n, m in not_probed.items() if n.startswith("Optimizer"))


@pytest.mark.parametrize("path,kw", DEEPSPEED, ids=_ids(DEEPSPEED))
def test_a_shipped_deepspeed_entry_makes_a_step_before_backward_raise_and_changes_no_result(deepspeed_ops, tmp_path,
                                                                                            path, kw):
    if path.endswith(".FusedAdam"):
        _skip_unless_deepspeed_steps_on_cpu(path)
    _entry_checks(tmp_path, path, kw)


def _skip_unless_deepspeed_steps_on_cpu(path: str) -> None:
    """FusedAdam's op is built for DeepSpeed's accelerator: its CPU build only where that is the CPU.
    Elsewhere (a GPU machine) it steps that device's tensors only, and tests/test_optim_cuda.py
    steps it there."""
    from deepspeed.accelerator import get_accelerator

    device = get_accelerator().device_name()
    if device != "cpu":
        pytest.skip(f"{path} steps {device} tensors only where DeepSpeed's accelerator is {device} "
                    "(tests/test_optim_cuda.py steps it there)")


def test_deepspeed_adagrads_sparse_step_moves_the_version_itself_and_is_not_bumped_again(deepspeed_ops):
    cls = _class("deepspeed.ops.adagrad.cpu_adagrad.DeepSpeedCPUAdagrad")

    def step():
        p = torch.nn.Parameter(torch.randn(8, 4))
        p.grad = torch.sparse_coo_tensor(torch.tensor([[1, 3]]), torch.ones(2, 4), (8, 4),
                                         check_invariants=True).coalesce()
        before = p.detach().clone()
        cls([p]).step()  # writes the rows by indexing (index_put_), which bumps
        assert not torch.equal(before, p.detach())
        return p._version

    assert step() == 1
    torchgen_patch.install(ONE_OP, backend="python")
    try:
        assert step() == 1
    finally:
        torchgen_patch.uninstall()


def test_without_the_entries_install_changes_nothing(deepspeed_ops):
    classes = [_class(p) for p in ("deepspeed.ops.adam.cpu_adam.DeepSpeedCPUAdam", "bitsandbytes.optim.adam.Adam8bit")]
    rep = torchgen_patch.install(ONE_OP, backend="python", no_overlay=True)
    try:
        assert rep.optimizers == []
        for cls in classes:
            p, loss = _stale(cls, (64, 64))
            assert p._version == 0 and not _raises(loss), cls
    finally:
        torchgen_patch.uninstall()


STALE_PROGRAM = textwrap.dedent("""
    import importlib, warnings
    import torch
    warnings.filterwarnings("ignore")
    for path, kw in {cases!r}:
        module, _, name = path.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        torch.manual_seed(0)
        p = torch.nn.Parameter(torch.randn(64, 64))
        opt = cls([p], **kw)
        loss = (p * p).sum()
        p.grad = torch.ones_like(p)
        opt.step()
        try:
            loss.backward()
            print("stale", path, kw, "silent", flush=True)
        except RuntimeError as e:
            print("stale", path, kw, "raises" if "modified by an inplace" in str(e) else e, flush=True)
""")


@pytest.mark.build
def test_under_run_a_step_before_backward_raises_with_the_entries_and_is_silent_without(library, deepspeed_ops):
    """DeepSpeedCPUAdam in both modes and two of bitsandbytes' (each library a process imports costs
    seconds: the other classes are the in-process tests' above)."""
    cases = [c for c in DEEPSPEED + BNB if c[0].endswith(("DeepSpeedCPUAdam", ".Adam8bit", ".LARS"))]
    assert len(cases) == 4
    for path, _ in cases:
        _class(path)
    code = STALE_PROGRAM.format(cases=cases)
    env = root_env()

    def run(*flags):
        r = subprocess.run([sys.executable, "-m", "torchgen_patch", "run", *flags, "--", sys.executable, "-c", code],
                           cwd=ROOT, env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return [line.rsplit(" ", 1)[1] for line in r.stdout.splitlines() if line.startswith("stale ")], r.stderr

    with_entries, err = run()
    assert with_entries == ["raises"] * len(cases)
    assert f"; {len(SHIPPED)} optimizer entries active, in pid" in err
    without, err = run("--no-overlay")
    assert without == ["silent"] * len(cases)
    assert "; 0 optimizer entries active, in pid" in err


def test_lint_finds_deepspeeds_cpu_optimizers_and_the_shipped_entries_cover_exactly_them(run_cli, deepspeed_ops):
    doc, unseen = _lint_unseen(run_cli, *[a for m in DEEPSPEED_MODULES for a in ("--import", m)], "--namespace",
                               "aten")
    assert sorted(unseen) == DEEPSPEED_ENTRIES and len(unseen) == 4  # the three CPU optimizers, FusedAdam's CPU build
    assert all("outside the dispatcher" in m for m in unseen.values())
    assert not any(f["rule"] == "optimizer-step-unseen" for f in doc["findings"])
    assert sorted(doc["optimizers"]["covered_by_overlay"]) == DEEPSPEED_ENTRIES
