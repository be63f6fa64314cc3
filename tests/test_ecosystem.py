"""Extension libraries' custom ops, with the real libraries: bitsandbytes' optimizers
write parameters through ops that have no ADInplaceOrView kernel, so a parameter saved
for backward and then stepped is used stale, silently. Patched through
``install(runtime_ops=...)``, autograd refuses; ordinary training is unchanged."""

from __future__ import annotations

import os

import pytest
import torch

import torchgen_patch
from testbed.ecosystem import (CONTROL, CPU_BROKEN, FUSED, bnb_optimizer, bnb_optimizers, embedding_then_lookup, ids,
                               stale_lookup, tbe)

if os.environ.get("CI") == "true":  # CI installs it (requirements-dev.txt): never skip there
    import bitsandbytes  # noqa: F401
else:
    pytest.importorskip("bitsandbytes")

BNB_OPS = ["bitsandbytes::optimizer_update_32bit", "bitsandbytes::optimizer_update_8bit_blockwise"]
OPTIMIZERS = bnb_optimizers()


def _stale_step(name):
    """Save a parameter for backward, step the optimizer, then backward."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(64, 64))  # 4,096 elements: the 8-bit states are used
    opt = bnb_optimizer(name, [p])
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
    p, loss = _stale_step(CONTROL)
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

    return train_mlp(lambda params: bnb_optimizer(name, params), steps)[0]


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


@pytest.mark.parametrize("optim", FUSED)
def test_fbgemm_unpatched_the_updated_table_is_used_silently(optim):
    emb, w, penalty = stale_lookup(optim)
    assert w._version == 0 and (optim == "EXACT_SGD" or emb.momentum1_host._version == 0)
    penalty.backward()  # no error: a gradient at the table after the update


@pytest.mark.build
@pytest.mark.parametrize("optim", FUSED)
def test_fbgemm_patched_versions_move_and_autograd_raises(optim):
    rep = torchgen_patch.install(runtime_ops=["fbgemm::*"])
    try:
        assert rep.refused.get("fbgemm::bounds_check_indices", "").startswith("skipped by the overlay")
        emb, w, penalty = stale_lookup(optim)
        assert w._version == 1 and (optim == "EXACT_SGD" or emb.momentum1_host._version == 1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            penalty.backward()
    finally:
        torchgen_patch.uninstall()


def _train_tbe(optim: str, steps=4):
    t = tbe(optim)
    i, offsets = ids()
    target = torch.randn(2, 4)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(t(i, offsets), target)
        loss.backward()
        losses.append(loss.item())
    return losses, t.weights_host.detach().clone()


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


def test_fbgemm_bounds_check_indices_is_declared_written_but_not_written():
    """The evidence for the overlay's skip entry: patched blindly (no overlay), every lookup
    bumps the caller's ids, and a program that shares them with F.embedding now fails;
    the evidence recorder shows the ids were never changed."""
    embedding_then_lookup()  # unpatched: fine
    rep = torchgen_patch.install(runtime_ops=["fbgemm::bounds_check_indices"], backend="python", no_overlay=True,
                                 evidence=True)
    try:
        assert rep.registered == ["fbgemm::bounds_check_indices"]
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            embedding_then_lookup()
        never = torchgen_patch.evidence().never_changed()
        assert {(op, arg) for op, arg, n in never} >= {("fbgemm::bounds_check_indices", "indices"),
                                                         ("fbgemm::bounds_check_indices", "offsets")}
    finally:
        torchgen_patch.uninstall()
    # with the shipped overlay it is left out, and the program runs
    rep = torchgen_patch.install(runtime_ops=["fbgemm::*"], backend="python")
    try:
        assert "fbgemm::bounds_check_indices" in rep.refused
        embedding_then_lookup()
    finally:
        torchgen_patch.uninstall()
