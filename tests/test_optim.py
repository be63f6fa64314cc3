"""Optimizers that write outside the dispatcher: the overlay's optimizer entries (validated
strictly), applied by install() and run through PyTorch's optimizer step hooks (exactly one bump
per written tensor per step, none where the step moved the version, no other optimizer touched),
the lint's probe step that finds such optimizers, and the shipped entries for DeepSpeed's CPU
optimizers, with the real library."""

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


def _stale(cls, **kw):
    """A parameter saved for backward, then stepped: (param, loss whose backward uses it)."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(8, 8))
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

def test_the_shipped_overlay_names_deepspeeds_cpu_optimizers():
    o = ov.load_runtime(shipped_overlay())
    assert {c: e.writes for c, e in o.optimizers.items()} == {
        "deepspeed.ops.adam.cpu_adam.DeepSpeedCPUAdam": ("params",),
        "deepspeed.ops.adagrad.cpu_adagrad.DeepSpeedCPUAdagrad": ("params",),
        "deepspeed.ops.lion.cpu_lion.DeepSpeedCPULion": ("params",),
        # CUDA only (tests/test_optim_cuda.py)
        "deepspeed.ops.lamb.fused_lamb.FusedLamb": ("params",),
        "deepspeed.ops.lion.fused_lion.FusedLion": ("params",)}
    assert all(e.reason for e in o.optimizers.values())


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
    assert "1 optimizer entries active" in rep.summary()
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
    for (wp, wv), (gp, gv) in zip(want, got):
        assert wv == gv  # no version moved differently: the entry names another class
        assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(wp, gp))


def test_uninstall_removes_the_hooks(entries):
    entries(NumpyWriter="[params]")
    torchgen_patch.uninstall()
    p, loss = _stale(fx.NumpyWriter)
    assert p._version == 0 and not _raises(loss)
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

    from torchgen_patch.runtime import optim

    assert optim._before not in _global_optimizer_pre_hooks.values()
    assert optim._after not in _global_optimizer_post_hooks.values()


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
        cls + "PrintsInC": "optimizer-step-unseen",
        cls + "NeedsConfig": "optimizer-not-probed", cls + "StepFails": "optimizer-not-probed",
        cls + "DoesNothing": "optimizer-not-probed", cls + "_Base": "optimizer-not-probed",
        cls + "StepPerInstance": "optimizer-not-probed"}  # AtenWriter bumps: no finding
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
    assert msg["_Base"].endswith("not probed: its step raised NotImplementedError")  # torch's own Optimizer.step
    assert msg["StepPerInstance"].endswith("not probed: its instances replace step() with a method PyTorch's "
                                           "optimizer step hooks do not wrap, so no overlay entry can cover it")
    assert found[cls + "NumpyWriter"]["path"].endswith(os.path.join("tests", "optim_fixtures.py"))
    assert found[cls + "NumpyWriter"]["line"] == 23
    assert found[cls + "DoesNothing"]["severity"] == "warning"
    assert doc["optimizers"] == {"probed": 11, "covered_by_overlay": []}


def test_a_class_an_entry_covers_is_reported_as_covered(run_cli, tmp_path):
    path = _overlay(tmp_path, {"tests.optim_fixtures.NumpyWriter": "[params]"})
    _, found, doc, _ = _lint_optimizers(run_cli, "--overlay", path)
    assert "tests.optim_fixtures.NumpyWriter" not in found and "tests.optim_fixtures.DataWriter" in found
    assert doc["optimizers"] == {"probed": 11, "covered_by_overlay": ["tests.optim_fixtures.NumpyWriter"]}
    rc, out, _ = run_cli("lint", "--runtime", "--import", "tests.optim_fixtures", "--namespace", "aten",
                         "--overlay", path)
    assert out.splitlines()[-1].endswith("; optimizer classes probed: 11, covered by the overlay: 1 "
                                         "(tests.optim_fixtures.NumpyWriter)")


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


# --- DeepSpeed's CPU optimizers, the real library ------------------------------------------------

if os.environ.get("CI") == "true":  # CI installs it (requirements-dev.txt): never skip there
    import deepspeed  # noqa: F401
else:
    deepspeed = pytest.importorskip("deepspeed")

# (class, keywords): every CPU optimizer of DeepSpeed that has a shipped entry (both adamw_mode settings)
DEEPSPEED = [("deepspeed.ops.adam.DeepSpeedCPUAdam", {"adamw_mode": True}),
             ("deepspeed.ops.adam.DeepSpeedCPUAdam", {"adamw_mode": False}),
             ("deepspeed.ops.adagrad.DeepSpeedCPUAdagrad", {}),
             ("deepspeed.ops.lion.DeepSpeedCPULion", {})]
IDS = ["CPUAdam-adamw", "CPUAdam-adam", "CPUAdagrad", "CPULion"]
# the modules that define them: the lint probes these only (deepspeed.ops.adam's FusedAdam would
# build one more op, and has no shipped entry: DeepSpeed's fused optimizers matter on CUDA)
DEEPSPEED_MODULES = ["deepspeed.ops.adam.cpu_adam", "deepspeed.ops.adagrad.cpu_adagrad", "deepspeed.ops.lion.cpu_lion"]


@pytest.fixture(scope="module")
def deepspeed_ops():
    """DeepSpeed's three CPU ops, built (on first use, once per cache: TORCH_EXTENSIONS_DIR) side by
    side in processes of their own, so the two cores compile at once instead of one op after another."""
    from torch.utils.cpp_extension import _get_build_directory

    todo = [(path, kw) for path, kw in dict(DEEPSPEED).items()
            if not os.path.exists(os.path.join(_get_build_directory(_op_of(path), False), _op_of(path) + ".so"))]
    procs = [subprocess.Popen([sys.executable, "-c", f"import importlib, torch; m, _, n = {path!r}.rpartition('.'); "
                               f"getattr(importlib.import_module(m), n)([torch.nn.Parameter(torch.zeros(1))])"],
                              cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for path, _ in todo]
    for p in procs:
        _, err = p.communicate()
        assert p.returncode == 0, err[-2000:]


def _op_of(path: str) -> str:
    return {"DeepSpeedCPUAdam": "cpu_adam", "DeepSpeedCPUAdagrad": "cpu_adagrad", "DeepSpeedCPULion": "cpu_lion"}[
        path.rsplit(".", 1)[1]]


def _deepspeed(path: str):
    import importlib

    module, _, name = path.rpartition(".")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("path,kw", DEEPSPEED, ids=IDS)
def test_deepspeed_unpatched_the_stepped_parameter_is_used_silently(deepspeed_ops, path, kw):
    p, loss = _stale(_deepspeed(path), **kw)
    assert p._version == 0 and not _raises(loss)


@pytest.mark.parametrize("path,kw", DEEPSPEED, ids=IDS)
def test_deepspeed_with_the_shipped_entries_a_step_before_backward_raises(deepspeed_ops, path, kw):
    rep = torchgen_patch.install(ONE_OP, backend="python")
    try:
        assert len(rep.optimizers) == len(ov.load_runtime(shipped_overlay()).optimizers)
        p, loss = _stale(_deepspeed(path), **kw)
        assert p._version == 1 and _raises(loss)
    finally:
        torchgen_patch.uninstall()


def test_deepspeed_adagrads_sparse_step_moves_the_version_itself_and_is_not_bumped_again(deepspeed_ops):
    cls = _deepspeed("deepspeed.ops.adagrad.DeepSpeedCPUAdagrad")

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


def test_deepspeed_without_the_entries_install_changes_nothing(deepspeed_ops):
    rep = torchgen_patch.install(ONE_OP, backend="python", no_overlay=True)
    try:
        assert rep.optimizers == []
        p, loss = _stale(_deepspeed("deepspeed.ops.adam.DeepSpeedCPUAdam"))
        assert p._version == 0 and not _raises(loss)
    finally:
        torchgen_patch.uninstall()


def _train_deepspeed(steps=6):
    """A small MLP trained with DeepSpeedCPUAdam: the losses, the final parameters' bits and versions."""
    from tests.support import train_mlp

    cls = _deepspeed("deepspeed.ops.adam.DeepSpeedCPUAdam")
    losses, model = train_mlp(lambda params: cls(params, lr=1e-2, weight_decay=0.01), steps)
    return losses, [p.detach().clone().view(torch.int32) for p in model.parameters()], \
        [p._version for p in model.parameters()]


def test_deepspeed_training_is_bit_identical_with_the_entries(deepspeed_ops):
    want_losses, want_bits, want_versions = _train_deepspeed()
    torchgen_patch.install(ONE_OP, backend="python")
    try:
        losses, bits, versions = _train_deepspeed()
    finally:
        torchgen_patch.uninstall()
    assert losses == want_losses and all(torch.equal(a, b) for a, b in zip(want_bits, bits))
    # one bump per step, nothing else changed (the layers' own initialisation wrote each once, both times)
    assert want_versions == [1] * 4 and versions == [1 + 6] * 4


STALE_PROGRAM = textwrap.dedent("""
    import importlib, warnings
    import torch
    warnings.filterwarnings("ignore")
    for path, kw in {cases!r}:
        module, _, name = path.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        torch.manual_seed(0)
        p = torch.nn.Parameter(torch.randn(8, 8))
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
def test_deepspeed_under_run_raises_with_the_entries_and_is_silent_without(library, deepspeed_ops):
    """DeepSpeedCPUAdam in both modes (each DeepSpeed op a process loads costs seconds: the other
    classes are the in-process tests' above)."""
    cases = DEEPSPEED[:2]
    code = STALE_PROGRAM.format(cases=cases)
    env = dict(os.environ, PYTHONPATH=ROOT)

    def run(*flags):
        r = subprocess.run([sys.executable, "-m", "torchgen_patch", "run", *flags, "--", sys.executable, "-c", code],
                           cwd=ROOT, env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return [line.rsplit(" ", 1)[1] for line in r.stdout.splitlines() if line.startswith("stale ")], r.stderr

    with_entries, err = run()
    assert with_entries == ["raises"] * len(cases)
    assert f"; {len(ov.load_runtime(shipped_overlay()).optimizers)} optimizer entries active, in pid" in err
    without, err = run("--no-overlay")
    assert without == ["silent"] * len(cases)
    assert "; 0 optimizer entries active, in pid" in err


def test_lint_finds_deepspeeds_cpu_optimizers_and_the_shipped_entries_cover_them(run_cli, deepspeed_ops):
    args = ("lint", "--runtime", *[a for m in DEEPSPEED_MODULES for a in ("--import", m)], "--namespace", "aten",
            "--format", "json")
    rc, out, _ = run_cli(*args, "--no-overlay")
    unseen = {f["op"]: f["message"] for f in json.loads(out)["findings"] if f["rule"] == "optimizer-step-unseen"}
    assert set(unseen) == {"deepspeed.ops.adam.cpu_adam.DeepSpeedCPUAdam",
                           "deepspeed.ops.adagrad.cpu_adagrad.DeepSpeedCPUAdagrad",
                           "deepspeed.ops.lion.cpu_lion.DeepSpeedCPULion"}
    assert all("outside the dispatcher" in m for m in unseen.values())
    rc, out, _ = run_cli(*args)
    doc = json.loads(out)
    assert not any(f["rule"] == "optimizer-step-unseen" for f in doc["findings"])
    assert sorted(doc["optimizers"]["covered_by_overlay"]) == sorted(unseen)
