"""Optimizers that step CUDA tensors only: DeepSpeed's fused optimizers (FusedAdam, FusedLamb,
FusedLion: their JIT-built CUDA ops write the parameters through pybind's multi_tensor_applier,
or fused_lamb_cuda.lamb). Each is silent stepped between forward and backward without an
optimizer entry and raises with one (FusedLamb's and FusedLion's ship; FusedAdam's is the shipped
one where the overlay has it, else one given), under install() and under run, and a short
training loop is bit-identical with the entry. The lint's probe steps a class that refuses CPU
tensors again on a CUDA parameter, so the rule finds them. Tests that need a GPU skip without
one; DeepSpeed's need it installed and nvcc to build its ops."""

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
from tests.conftest import ROOT
from tests.support import root_env, script
from tests.test_optim import _raises
from tests.test_optim import _stale as stale_on_cpu
from tests.test_optim import _train as train_on_cpu

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
ONE_OP = ["aten::_foreach_zero_"]  # install() with the Python backend and one kernel: no build needed
FUSED = {"FusedAdam": "deepspeed.ops.adam.fused_adam.FusedAdam", "FusedLamb": "deepspeed.ops.lamb.fused_lamb.FusedLamb",
         "FusedLion": "deepspeed.ops.lion.fused_lion.FusedLion"}
# those with shipped entries whatever else the overlay holds (they run on CUDA only, so only here are they stepped)
SHIPS = ("FusedLamb", "FusedLion")
STEPS = 4



# --- the probe on the accelerator -------------------------------------------------------------------

def _lint(run_cli, module: str, *extra) -> dict:
    rc, out, _ = run_cli("lint", "--runtime", "--import", module, "--namespace", "aten", "--format", "json", *extra)
    return {f["op"].rsplit(".", 1)[1]: f for f in json.loads(out)["findings"] if f["rule"].startswith("optimizer-")}


def test_a_class_a_cpu_parameter_cannot_probe_is_probed_again_on_the_accelerator(run_cli, monkeypatch):
    """The mechanism, on any machine: the accelerator stood in for by the CPU, and a class that
    refuses its first parameter. Where the second probe can tell, its outcome, saying where it was
    probed; where it cannot, the CPU probe's word for word."""
    from tests import optim_device_fixtures as fx
    from torchgen_patch.runtime import optim_probe

    monkeypatch.setattr(fx.RefusesItsFirstParameter, "refused", False)
    monkeypatch.setattr(optim_probe, "_accelerator", lambda: None)
    plain = _lint(run_cli, "tests.optim_device_fixtures")
    assert plain["RefusesItsFirstParameter"]["message"].endswith(
        "not probed: could not be constructed: RuntimeError: expected input to be on cuda")
    monkeypatch.setattr(fx.RefusesItsFirstParameter, "refused", False)
    monkeypatch.setattr(optim_probe, "_accelerator", lambda: "cpu")
    again = _lint(run_cli, "tests.optim_device_fixtures")
    f = again["RefusesItsFirstParameter"]
    assert f["rule"] == "optimizer-step-unseen"
    assert "it writes the parameter outside the dispatcher (C++ bound with pybind, data_ptr, numpy) (probed on a CPU " \
           "parameter; on a CPU one: could not be constructed: RuntimeError: expected input to be on cuda)" \
           in f["message"]
    assert again["NeverConstructs"] == plain["NeverConstructs"]  # refused there too: as it was


def test_without_a_gpu_the_probe_is_not_run_again(run_cli, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    from tests import optim_device_fixtures as fx

    monkeypatch.setattr(fx.RefusesItsFirstParameter, "refused", False)
    found = _lint(run_cli, "tests.optim_device_fixtures")
    assert found["CudaOnlyDataWriter"]["message"].endswith("not probed: its step raised RuntimeError: expected "
                                                           "input to be on cuda")
    assert found["RefusesItsFirstParameter"]["rule"] == "optimizer-not-probed"


@pytest.mark.cuda
@needs_cuda
def test_on_cuda_a_class_that_refuses_cpu_tensors_is_found(run_cli, monkeypatch):
    from tests import optim_device_fixtures as fx

    monkeypatch.setattr(fx.RefusesItsFirstParameter, "refused", False)
    f = _lint(run_cli, "tests.optim_device_fixtures")["CudaOnlyDataWriter"]
    assert f["rule"] == "optimizer-step-unseen"
    assert "through aten::add_.Tensor on an alias whose version counter is its own (p.data) (probed on a CUDA " \
           "parameter; on a CPU one: its step raised RuntimeError: expected input to be on cuda)" in f["message"]


# --- DeepSpeed's fused optimizers ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def fused_ops():
    """DeepSpeed's three fused ops, built for CUDA side by side (each in a process of its own, on
    first use; TORCH_EXTENSIONS_DIR keeps them), skipping where DeepSpeed or nvcc is missing."""
    pytest.importorskip("deepspeed")
    cases = script("unseen_writes_cases")
    try:
        cases.need_nvcc()
    except cases.NotRun as e:
        pytest.skip(str(e))
    builders = {"fused_adam": "FusedAdamBuilder", "fused_lamb": "FusedLambBuilder", "fused_lion": "FusedLionBuilder"}
    jobs = str(max(1, (os.cpu_count() or 2) // len(builders)))
    procs = [subprocess.Popen([sys.executable, "-c", "import warnings; warnings.simplefilter('ignore'); "
                               f"import deepspeed.ops.op_builder as b; b.{b}().load()"], cwd=ROOT,
                              env=root_env(MAX_JOBS=jobs), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for b in builders.values()]
    for p in procs:
        _, err = p.communicate()
        assert p.returncode == 0, err[-2000:]


def _class(name: str):
    import importlib

    module, _, cls = FUSED[name].rpartition(".")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(importlib.import_module(module), cls)


@pytest.fixture(scope="module")
def overlays(tmp_path_factory):
    """name -> (its entry ships, an overlay without it, one with it): the shipped overlay's copies."""
    made = script("unseen_writes")._overlays(str(tmp_path_factory.mktemp("overlays")), list(FUSED.values()))
    return {n: made[p] for n, p in FUSED.items()}


def _stale(cls):
    """tests/test_optim.py's parameter saved for backward, then stepped, made on CUDA."""
    with torch.device("cuda"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return stale_on_cpu(cls)


def _train(cls):
    """tests/test_optim.py's small MLP, trained on CUDA with ``cls``: the losses, the final
    parameters' bits and versions."""
    with torch.device("cuda"):
        return train_on_cpu(cls, {}, STEPS)


def test_the_shipped_overlay_has_fused_lambs_and_fused_lions_entries(overlays):
    assert all(overlays[n][0] for n in SHIPS)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("name", sorted(FUSED))
def test_a_fused_step_before_backward_is_silent_without_its_entry_and_raises_with_it(fused_ops, overlays, name):
    _, without, with_ = overlays[name]
    seen = {}
    for overlay in (without, with_):
        rep = torchgen_patch.install(ONE_OP, backend="python", overlay=overlay)
        try:
            assert (FUSED[name] in rep.optimizers) == (overlay == with_)
            p, loss = _stale(_class(name))
            seen[overlay == with_] = p._version, _raises(loss)
        finally:
            torchgen_patch.uninstall()
    assert seen == {False: (0, False), True: (1, True)}


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("name", sorted(FUSED))
def test_training_with_a_fused_optimizer_is_bit_identical_with_its_entry(fused_ops, overlays, name):
    cls = _class(name)
    want_losses, want_bits, want_versions = _train(cls)
    torchgen_patch.install(ONE_OP, backend="python", overlay=overlays[name][2])
    try:
        losses, bits, versions = _train(cls)
    finally:
        torchgen_patch.uninstall()
    assert losses == want_losses and all(torch.equal(a, b) for a, b in zip(want_bits, bits, strict=True))
    assert versions == [v + STEPS for v in want_versions]  # one bump a step, nothing else


STALE = textwrap.dedent("""
    import importlib, warnings
    import torch
    warnings.filterwarnings("ignore")
    module, _, name = {path!r}.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(8, 8, device="cuda"))
    opt = cls([p])
    loss = (p * p).sum()
    p.grad = torch.ones_like(p)
    opt.step()
    try:
        loss.backward()
        print("stale silent", flush=True)
    except RuntimeError as e:
        print("stale", "raises" if "modified by an inplace" in str(e) else e, flush=True)
""")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("name", sorted(FUSED))
def test_under_run_a_fused_step_before_backward_raises_with_its_entry(fused_ops, overlays, name):
    _, without, with_ = overlays[name]
    got = {}
    for overlay in (without, with_):
        r = subprocess.run([sys.executable, "-m", "torchgen_patch", "run", "--backend", "python", "--op", ONE_OP[0],
                            "--overlay", overlay, "--", sys.executable, "-c", STALE.format(path=FUSED[name])],
                           cwd=ROOT, env=root_env(), capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
        got[overlay == with_] = [ln.split(" ", 1)[1] for ln in r.stdout.splitlines() if ln.startswith("stale ")]
    assert got == {False: ["silent"], True: ["raises"]}


@pytest.mark.cuda
@needs_cuda
def test_on_cuda_the_lint_finds_deepspeeds_fused_optimizers_and_the_entries_cover_them(run_cli, fused_ops):
    modules = ("deepspeed.ops.adam.fused_adam", "deepspeed.ops.lamb.fused_lamb", "deepspeed.ops.lion.fused_lion")
    args = ["lint", "--runtime", *[a for m in modules for a in ("--import", m)], "--namespace", "aten",
            "--format", "json"]
    _, out, _ = run_cli(*args, "--no-overlay")
    unseen = {f["op"]: f["message"] for f in json.loads(out)["findings"] if f["rule"] == "optimizer-step-unseen"}
    assert set(unseen) == set(FUSED.values())
    assert all("outside the dispatcher" in m and "(probed on a CUDA parameter; on a CPU one: " in m
               for m in unseen.values())
    _, out, _ = run_cli(*args)
    doc = json.loads(out)
    covered = set(doc["optimizers"]["covered_by_overlay"])
    assert {FUSED[n] for n in SHIPS} <= covered
    left = {f["op"] for f in doc["findings"] if f["rule"] == "optimizer-step-unseen"}
    assert left == set(FUSED.values()) - covered  # FusedAdam's, where no entry ships
