"""Extension libraries' custom ops, with the real libraries: bitsandbytes' optimizers
write parameters through ops that have no ADInplaceOrView kernel, so a parameter saved
for backward and then stepped is used stale, silently. Patched through
``install(runtime_ops=...)``, autograd refuses; ordinary training is unchanged."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

import torchgen_patch

if os.environ.get("CI") == "true":  # CI installs it (requirements-dev.txt): never skip there
    import bitsandbytes as bnb
else:
    bnb = pytest.importorskip("bitsandbytes")

BNB_OPS = ["bitsandbytes::optimizer_update_32bit", "bitsandbytes::optimizer_update_8bit_blockwise"]
# every optimizer class bitsandbytes exports (40 in 0.50.2; all run on CPU); PytorchLARS is
# written with aten ops, which bump: the control
ALL = sorted(n for n in dir(bnb.optim) if isinstance(getattr(bnb.optim, n), type)
             and issubclass(getattr(bnb.optim, n), torch.optim.Optimizer) and n != "PytorchLARS")
# bitsandbytes' own CPU backend fails these (0.50.2: "output with shape [64] doesn't match the
# broadcast shape [64, 64]" in its 32-bit AdEMAMix kernel); asserted below, so the list stays true
CPU_BROKEN = {"AdEMAMix32bit", "PagedAdEMAMix32bit"}
OPTIMIZERS = [n for n in ALL if n not in CPU_BROKEN]


def _optimizer(name, params):
    kw = {"lr": 0.05}
    if name.startswith(("SGD", "LARS", "PytorchLARS")):
        kw["momentum"] = 0.9
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(bnb.optim, name)(params, **kw)


def _stale_step(name):
    """Save a parameter for backward, step the optimizer, then backward."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(64, 64))  # 4,096 elements: the 8-bit states are used
    opt = _optimizer(name, [p])
    loss = (p * p).sum()
    p.grad = torch.ones_like(p)
    before = p.detach().clone()
    opt.step()
    assert not torch.equal(p.detach(), before)  # the step did write the parameter
    return p, loss


@pytest.mark.parametrize("name", sorted(CPU_BROKEN))
def test_the_optimizers_left_out_still_fail_in_bitsandbytes_itself(name):
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        _stale_step(name)


def test_the_control_written_with_aten_ops_raises_unpatched():
    assert len(OPTIMIZERS) >= 30
    p, loss = _stale_step("PytorchLARS")
    assert p._version > 0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_lint_finds_the_optimizer_ops(run_cli):
    rc, out, _ = run_cli("lint", "--runtime", "--import", "bitsandbytes", "--namespace", "bitsandbytes")
    assert rc == 1
    found = {line.split("] ", 1)[1].split(": ", 1)[0] for line in out.splitlines()[:-1]}
    assert set(BNB_OPS) <= found, out


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_unpatched_the_stale_parameter_is_used_silently(name):
    """The bug, asserted while it exists: no bump, and backward returns a gradient."""
    p, loss = _stale_step(name)
    assert p._version == 0
    loss.backward()  # no error: the gradient is 2 * (the stepped p), not 2 * (the p of the forward)


@pytest.mark.build
@pytest.mark.parametrize("backend", ["cpp", "python"])
def test_patched_every_optimizer_raises(backend):
    rep = torchgen_patch.install(backend=backend, runtime_ops=["bitsandbytes::optimizer_update_*"])
    try:
        assert sorted(rep.registered) == BNB_OPS, rep.summary()
        for name in OPTIMIZERS:
            p, loss = _stale_step(name)
            assert p._version == 1, name
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                loss.backward()
    finally:
        torchgen_patch.uninstall()


def _train(name, steps=5):
    from tests.support import train_mlp

    return train_mlp(lambda params: _optimizer(name, params), steps)[0]


@pytest.mark.build
def test_patched_training_is_identical():
    want = {name: _train(name) for name in OPTIMIZERS}
    torchgen_patch.install(runtime_ops=["bitsandbytes::*"])
    try:
        assert {name: _train(name) for name in OPTIMIZERS} == want
    finally:
        torchgen_patch.uninstall()


# ---------------------------------------------------------------------------
# fbgemm: the CPU table-batched embedding with a fused optimizer (its backward writes
# the table and the optimizer state in place)

if os.environ.get("CI") == "true":
    import fbgemm_gpu  # noqa: F401
else:
    pytest.importorskip("fbgemm_gpu")

FUSED = ["EXACT_SGD", "EXACT_ROWWISE_ADAGRAD"]


def _tbe(optim: str):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return SplitTableBatchedEmbeddingBagsCodegen(
            embedding_specs=[(10, 4, EmbeddingLocation.HOST, ComputeDevice.CPU)],
            optimizer=getattr(EmbOptimType, optim), learning_rate=0.1)


def _ids():
    return torch.tensor([1, 2, 3, 7], dtype=torch.int64), torch.tensor([0, 2, 4], dtype=torch.int64)


def _stale_lookup(optim: str):
    """A penalty on the table saved for backward, then a lookup whose backward updates the
    table in place (the fused optimizer), then the penalty's backward."""
    tbe = _tbe(optim)
    w = tbe.weights_host
    penalty = (w * w).sum()
    tbe(*_ids()).sum().backward()
    return tbe, w, penalty


@pytest.mark.parametrize("optim", FUSED)
def test_fbgemm_unpatched_the_updated_table_is_used_silently(optim):
    tbe, w, penalty = _stale_lookup(optim)
    assert w._version == 0 and (optim == "EXACT_SGD" or tbe.momentum1_host._version == 0)
    penalty.backward()  # no error: a gradient at the table after the update


@pytest.mark.build
@pytest.mark.parametrize("optim", FUSED)
def test_fbgemm_patched_versions_move_and_autograd_raises(optim):
    rep = torchgen_patch.install(runtime_ops=["fbgemm::*"])
    try:
        assert rep.refused.get("fbgemm::bounds_check_indices", "").startswith("skipped by the overlay")
        tbe, w, penalty = _stale_lookup(optim)
        assert w._version == 1 and (optim == "EXACT_SGD" or tbe.momentum1_host._version == 1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            penalty.backward()
    finally:
        torchgen_patch.uninstall()


def _train_tbe(optim: str, steps=4):
    tbe = _tbe(optim)
    ids, offsets = _ids()
    target = torch.randn(2, 4)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(tbe(ids, offsets), target)
        loss.backward()
        losses.append(loss.item())
    return losses, tbe.weights_host.detach().clone()


@pytest.mark.build
@pytest.mark.parametrize("optim", FUSED)
def test_fbgemm_patched_training_is_identical(optim):
    want = _train_tbe(optim)
    torchgen_patch.install(runtime_ops=["fbgemm::*"])
    try:
        got = _train_tbe(optim)
    finally:
        torchgen_patch.uninstall()
    assert got[0] == want[0] and torch.equal(got[1], want[1])


def _embedding_then_lookup():
    """A program that feeds the same ids to F.embedding (which saves them for backward)
    and to an fbgemm lookup."""
    emb = torch.nn.Embedding(10, 4)
    ids, offsets = _ids()
    y = emb(ids)
    _tbe("EXACT_SGD")(ids, offsets)
    y.sum().backward()


def test_fbgemm_bounds_check_indices_is_declared_written_but_not_written():
    """The evidence for the overlay's skip entry: patched blindly (no overlay), every lookup
    bumps the caller's ids, and a program that shares them with F.embedding now fails;
    the evidence recorder shows the ids were never changed."""
    _embedding_then_lookup()  # unpatched: fine
    rep = torchgen_patch.install(runtime_ops=["fbgemm::bounds_check_indices"], backend="python", no_overlay=True,
                                 evidence=True)
    try:
        assert rep.registered == ["fbgemm::bounds_check_indices"]
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            _embedding_then_lookup()
        never = torchgen_patch.evidence().never_changed()
        assert {(op, arg) for op, arg, n in never} >= {("fbgemm::bounds_check_indices", "indices"),
                                                         ("fbgemm::bounds_check_indices", "offsets")}
    finally:
        torchgen_patch.uninstall()
    # with the shipped overlay it is left out, and the program runs
    rep = torchgen_patch.install(runtime_ops=["fbgemm::*"], backend="python")
    try:
        assert "fbgemm::bounds_check_indices" in rep.refused
        _embedding_then_lookup()
    finally:
        torchgen_patch.uninstall()
