"""The saved-tensor check under activation checkpointing (``torch.utils.checkpoint``), reentrant and not, on
both paths: a write to a checkpointed block's input between forward and backward is found, a checkpointed
training finds nothing and its losses are bit-identical with the check on and off, and what a reentrant
checkpoint's recomputation saves inside backward is counted as not read, with its reason, never dropped."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from tests import test_saved_sample
from torchgen_patch.saved import SavedTensorChanged, check_saved
from torchgen_patch.saved.fingerprint import IN_BACKWARD

check_path = test_saved_sample.check_path  # the path of each test ($TORCHGEN_PATCH_CHECK_PATH), autouse
MODES = pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])


def pytest_generate_tests(metafunc):
    """Every test on both paths (native and Python)."""
    if "check_path" in metafunc.fixturenames:
        metafunc.parametrize("check_path", ["native", "python"], indirect=True)


class Block(torch.nn.Module):
    """x + W2 tanh(W1 (2 x)): no op inside it saves its input (a scalar product, an addition), so a write to
    that input is found through what checkpointing itself saves of a region's inputs."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.up, self.down = torch.nn.Linear(width, 2 * width), torch.nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x * 2)))


class Net(torch.nn.Module):
    """Three blocks, each checkpointed (``reentrant``: torch's reentrant checkpoint, else the default), the
    input of each kept in ``inputs`` (what a test writes to)."""

    def __init__(self, reentrant: bool | None):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(3))
        self.reentrant = reentrant
        self.inputs: list = []

    def forward(self, x):
        self.inputs = []
        for block in self.blocks:
            self.inputs.append(x)
            x = block(x) if self.reentrant is None else checkpoint(block, x, use_reentrant=self.reentrant)
        return x.pow(2).mean()


def _net(reentrant):
    torch.manual_seed(0)
    return Net(reentrant), torch.randn(4, 8, requires_grad=True)


@MODES
@pytest.mark.parametrize("which", [0, 1], ids=["the model's input", "a block's input"])
def test_a_write_to_a_checkpointed_blocks_input_between_forward_and_backward_is_found(reentrant, which, request):
    net, x = _net(reentrant)
    with check_saved("raise") as check:
        loss = net(x)
        net.inputs[which].data.mul_(-1)  # no version counter sees it
        with pytest.raises(SavedTensorChanged):
            loss.backward()
    assert check.path == request.getfixturevalue("check_path")


def _train(reentrant, check: str | None, steps: int = 4) -> tuple[list[float], object]:
    net, x = _net(reentrant)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    losses = []
    with (check_saved(check) if check else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)) as c:
        for _ in range(steps):
            opt.zero_grad()
            loss = net(x)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses, c


@MODES
def test_a_checkpointed_training_finds_nothing_and_its_losses_are_bit_identical(reentrant):
    plain, _ = _train(None, None)
    off, _ = _train(reentrant, None)
    on, check = _train(reentrant, "raise")
    assert on == off == plain  # bit-identical (floats compared exactly)
    assert check.findings == [] and check.checked > 0


def _saves_of_a_block() -> int:
    """The tensors one block's forward saves (what a recomputation saves again)."""
    n = [0]

    def pack(t):
        n[0] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        Block()(torch.randn(4, 8, requires_grad=True))
    return n[0]


def test_a_reentrant_checkpoints_recomputation_is_counted_as_not_read_with_its_reason():
    """Its saves are made and used inside one backward pass that keeps no graph: counted, not read; the
    forward's own saves (each region's input, the loss's) and the RNG state each region keeps on ctx are read and
    compared."""
    net, x = _net(True)
    with check_saved("raise") as check:
        net(x).backward()
    assert check.skipped == {IN_BACKWARD: 3 * _saves_of_a_block()}
    assert check.checked == 3 + 1 + 3  # the regions' inputs, what pow saves, each region's RNG state on ctx
    assert check.unpacked == check.checked + 3 * _saves_of_a_block()


def test_a_non_reentrant_checkpoints_forward_saves_are_read_and_its_recomputation_is_no_save_of_the_checks():
    """Non-reentrant checkpointing's own hooks take the forward's saves: the check wraps them and reads each;
    what the recomputation saves goes to checkpointing's recomputation hooks, never to the check."""
    net, x = _net(False)
    with check_saved("raise") as check:
        net(x).backward()
    assert check.skipped == {}
    assert check.checked == check.unpacked == 3 * _saves_of_a_block() + _saves_around_the_regions()


def _saves_around_the_regions() -> int:
    """What the checkpointed net's forward saves outside its regions: pow's, and what checkpointing keeps of each
    region's inputs (torch 2.13: the input; 2.11: also an empty tensor it makes), under hooks pushed around it."""
    n = [0]

    def pack(t):
        n[0] += 1
        return t

    net, x = _net(False)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net(x)
    return n[0]


def test_what_a_backward_pass_that_keeps_its_graph_saves_is_still_read():
    """``create_graph``: what backward saves is used by a later backward pass, with the program's steps in
    between; a write there is found (a tensor saved in backward is left unread only where the pass keeps no graph)."""
    torch.manual_seed(0)
    w = torch.randn(5, requires_grad=True)
    x = torch.randn(5, requires_grad=True)
    with check_saved("raise") as check:
        (g,) = torch.autograd.grad(torch.sin(x * w).sum(), x, create_graph=True)
        w.data.mul_(2)  # saved by the first pass for the second, not by the forward alone
        with pytest.raises(SavedTensorChanged):
            g.sum().backward()
    assert IN_BACKWARD not in check.skipped


def test_the_saves_under_checkpointings_own_hooks_are_read_by_the_native_code_where_it_is_loaded(monkeypatch, request):
    """The tensors saved under the program's hooks are recorded on the Python side; on the native path their
    CPU fingerprints are the native code's (the Python one, read with numpy, costs several times more)."""
    from torchgen_patch.saved import hooks

    calls = []
    real = hooks.fingerprint
    monkeypatch.setattr(hooks, "fingerprint", lambda t: calls.append(t) or real(t))
    net, x = _net(False)
    with check_saved("raise") as check:
        net(x).backward()
    assert check.checked > 0
    assert (len(calls) == 0) if request.getfixturevalue("check_path") == "native" else (len(calls) == 2 * check.checked)
