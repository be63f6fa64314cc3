"""The saved-tensor check through the program's own saved-tensor hooks (activation offloading as
torchtune's ``OffloadActivations`` and TRL do it, ``save_on_cpu``, activation compression), on both
paths, every step and sampled. What backward uses decides the outcome:

- hooks that keep the tensor itself (torchtune's for parameters, small tensors and anything not on a
  GPU; ``save_on_cpu()`` on CPU, whose pack is ``tensor.cpu()``, the tensor itself): backward uses the
  very memory, so a ``.data`` write between forward and backward is found, and a version moved is
  autograd's own error (silent without the check: any hooks switch autograd's own check off);
- hooks that copy at pack (offloading to CPU and back, ``save_on_cpu(pin_memory=True)``): backward uses
  the copy, so a write to the original since is harmless: no finding, no error, and the copy is
  compared with what was saved (the same bits: checked);
- compression (pack keeps a quantized copy): what comes back differs from what was saved by design:
  each such tensor is counted as not judged, with its reason, never a finding.

Every tensor the program's hooks take is either checked or counted with a reason (never dropped)."""

from __future__ import annotations

import pytest
import torch

from tests.test_saved_sample import check_path  # noqa: F401  (the autouse fixture: $TORCHGEN_PATCH_CHECK_PATH)
from torchgen_patch.saved import SavedTensorChanged, check_saved, hooks, sample

SAVED = 6  # x and W1ᵀ (addmm), tanh's output, the activation and W2ᵀ (addmm), the output (pow)
# a step of _train: x (x needs no gradient: no W1ᵀ), the tanh output, the activation and W2ᵀ, mse_loss's two
TRAINED = 6
MODIFIED = "modified by an inplace operation"


def pytest_generate_tests(metafunc):
    if "check_path" in metafunc.fixturenames:
        metafunc.parametrize("check_path", ["native", "python"], indirect=True)


class Offload(torch.autograd.graph.saved_tensors_hooks):
    """Activation offloading in torchtune's style: pack files each tensor in a table under an int id and
    returns the id, unpack takes it out again. ``copy``: a copy on CPU (contiguous, as a pinned buffer
    is; torchtune copies activations on a GPU so), else the tensor itself (torchtune keeps parameters,
    small tensors and anything not on a GPU so)."""

    def __init__(self, copy: bool):
        self.table: dict[int, tuple] = {}
        self.ids = 0

        def pack(t):
            self.ids += 1
            kept = t
            if copy:
                kept = torch.empty(t.shape, dtype=t.dtype, device="cpu")
                kept.copy_(t)
            self.table[self.ids] = (kept, t.device)
            return self.ids

        def unpack(i):
            kept, device = self.table.pop(i)
            return kept.to(device, non_blocking=True)

        super().__init__(pack, unpack)


class Compress(torch.autograd.graph.saved_tensors_hooks):
    """Activation compression: pack keeps a bfloat16 copy, unpack gives it back as the dtype saved."""

    def __init__(self):
        super().__init__(lambda t: (t.dtype, t.to(torch.bfloat16)), lambda p: p[1].to(p[0]))


HOOKS = {
    "offload, kept": lambda: Offload(copy=False),
    "offload, copied": lambda: Offload(copy=True),
    "save_on_cpu": torch.autograd.graph.save_on_cpu,  # on CPU: the tensor itself
    "save_on_cpu, pinned": lambda: torch.autograd.graph.save_on_cpu(pin_memory=True),  # a copy
    "compression": Compress,
}
KEPT = ("offload, kept", "save_on_cpu")  # backward uses the memory that was saved


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


X = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
Y = torch.randn(5, 4, generator=torch.Generator().manual_seed(2))

WRITES = {
    "weight": lambda model, act: model[2].weight.data.mul_(2),
    "activation": lambda model, act: act.data.mul_(2),
}


def _step(model, hooks_of, write=None, bump=False):
    """One forward under the program's hooks, the write (or a version moved), backward: the gradients."""
    x = X.clone().requires_grad_()
    with hooks_of():
        act = model[1](model[0](x))
        loss = model[2](act).pow(2).sum()
    if write:
        WRITES[write](model, act)
    if bump:
        with torch.no_grad():
            model[2].weight.mul_(1)
    loss.backward()
    return [x.grad] + [p.grad for p in model.parameters()]


def _same(a, b) -> bool:
    return all(torch.equal(u, v) for u, v in zip(a, b, strict=True))


def _whole(c) -> bool:
    """Every tensor used is either checked or counted as not judged, with its reason."""
    return c.checked + sum(c.skipped.values()) == c.unpacked


@pytest.mark.parametrize("write", sorted(WRITES))
@pytest.mark.parametrize("kind", sorted(HOOKS))
def test_a_write_between_forward_and_backward_under_the_programs_hooks(kind, write):
    clean = _step(_model(), HOOKS[kind])
    plain = _step(_model(), HOOKS[kind], write)
    with check_saved("warn") as c:
        checked = _step(_model(), HOOKS[kind], write)
    assert c.unpacked == SAVED and _whole(c), (c.checked, c.skipped)
    if kind in KEPT:  # the gradient is wrong without the check, and the write is found
        assert not _same(plain, clean) and c.findings
        assert write != "weight" or {f.name for f in c.findings} == {"2.weight"}
        return
    # a copy is what backward uses: the write is harmless (the same gradients), so no finding
    assert _same(plain, clean) and _same(checked, clean) and c.findings == []
    if kind == "compression":  # the copy differs from what was saved by design: not judged, said why
        assert c.checked == 0 and c.skipped == {hooks.LOSSY: SAVED}
    else:  # the copy is compared with what was saved (re-laid where it came back contiguous): the same
        assert c.checked == SAVED and c.skipped == {}


@pytest.mark.parametrize("kind", sorted(HOOKS))
def test_a_version_moved_under_the_programs_hooks(kind):
    """Autograd's own error where backward uses the tensor itself (silent without the check, the gradient
    wrong); none where it uses a copy (the program runs as it does without the check)."""
    plain = _step(_model(), HOOKS[kind], bump=True)  # any hooks switch autograd's own version check off
    with check_saved("raise") as c:
        if kind in KEPT:
            with pytest.raises(RuntimeError, match=MODIFIED):
                _step(_model(), HOOKS[kind], bump=True)
            return
        assert _same(_step(_model(), HOOKS[kind], bump=True), plain)
    assert c.findings == [] and _whole(c)


@pytest.mark.parametrize("kind", sorted(HOOKS))
def test_a_write_to_a_kept_tensor_raises_in_raise_mode_and_a_copy_never(kind):
    with check_saved("raise") as c:
        if kind in KEPT:
            with pytest.raises(SavedTensorChanged) as e:
                _step(_model(), HOOKS[kind], "weight")
            assert e.value.finding.name == "2.weight"
            return
        _step(_model(), HOOKS[kind], "weight")
    assert c.findings == []


def _train(kind, check=None, steps=4, write=None):
    """A few steps of AdamW under the program's hooks: the losses, and per step whether the check's hooks
    were on when its forward ran and whether it found something."""
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, steps_seen = [], []
    for _ in range(steps):
        laid, before = check.sampler.laid if check else False, len(check.findings) if check else 0
        opt.zero_grad()
        with HOOKS[kind]():
            act = model[1](model[0](X))
            loss = torch.nn.functional.mse_loss(model[2](act), Y)
        if write:
            WRITES[write](model, act)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        steps_seen.append((laid, len(check.findings) > before if check else False))
    return losses, steps_seen


@pytest.mark.parametrize("kind", sorted(HOOKS))
def test_a_correct_training_under_the_programs_hooks_every_step(kind):
    plain, _ = _train(kind)
    with check_saved("raise") as c:
        checked, _ = _train(kind, c)
    assert checked == plain and c.findings == [] and _whole(c)  # bit for bit
    assert c.unpacked == 4 * TRAINED
    assert c.checked == (0 if kind == "compression" else c.unpacked)


@pytest.mark.parametrize("kind", sorted(HOOKS))
def test_a_correct_training_under_the_programs_hooks_sampled(kind, monkeypatch):
    """The default sampling's mechanism (every=N) with a seed that draws several of 12 steps."""
    monkeypatch.setenv(sample.ENV, "3")
    plain, _ = _train(kind, steps=12)
    c = check_saved("warn", every=3).start()
    try:
        checked, seen = _train(kind, c, steps=12)
    finally:
        c.stop()
    drawn = sum(laid for laid, _ in seen)
    assert checked == plain and c.findings == [] and drawn >= 2 and _whole(c)
    assert c.unpacked == drawn * TRAINED and c.checked == (0 if kind == "compression" else c.unpacked)


@pytest.mark.parametrize("kind", sorted(HOOKS))
def test_a_write_every_step_sampled_is_found_exactly_on_the_steps_drawn_where_it_matters(kind, monkeypatch):
    monkeypatch.setenv(sample.ENV, "3")
    c = check_saved("warn", every=3).start()
    try:
        _, seen = _train(kind, c, steps=12, write="weight")
    finally:
        c.stop()
    assert sum(laid for laid, _ in seen) >= 2 and _whole(c)
    assert [found for _, found in seen] == [laid and kind in KEPT for laid, _ in seen], seen


@pytest.mark.parametrize("kind", sorted(HOOKS))
def test_hooks_pushed_before_the_check_started_are_judged_the_same(kind):
    """The check started inside the program's block (``run`` turning it on under hooks already pushed): the
    same outcome as hooks pushed over it."""
    plain = _step(_model(), HOOKS[kind], "weight")
    model, x = _model(), X.clone().requires_grad_()
    with HOOKS[kind]():
        with check_saved("warn") as c:
            loss = model(x).pow(2).sum()
            model[2].weight.data.mul_(2)
            loss.backward()
    assert c.unpacked == SAVED and _whole(c)
    assert bool(c.findings) == (kind in KEPT)
    if kind not in KEPT:
        assert _same([x.grad] + [p.grad for p in model.parameters()], plain)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: run on a GPU machine")
@pytest.mark.parametrize("pinned", [False, True], ids=["save_on_cpu", "pinned"])
def test_on_cuda_offloading_to_cpu_is_a_copy_and_a_write_since_is_harmless(pinned):
    """On a GPU ``save_on_cpu`` always copies to CPU (pinned or not) and brings the copy back in backward
    (``non_blocking`` where pinned): a write to the weight since is no finding, the copy is checked."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).cuda()
    x = X.cuda()
    with check_saved("raise") as c:
        with torch.autograd.graph.save_on_cpu(pin_memory=pinned):
            loss = model(x).pow(2).sum()
        model[2].weight.data.mul_(2)
        loss.backward()
    assert c.findings == [] and c.checked == c.unpacked > 0


class _Streamed(torch.autograd.graph.saved_tensors_hooks):
    """torchtune's ``OffloadActivations`` with streams: pack copies to pinned CPU memory on a side stream,
    unpack brings the copy back on another and has the compute stream wait for it."""

    def __init__(self):
        self.table: dict[int, tuple] = {}
        self.ids = 0
        side, back = torch.cuda.Stream(), torch.cuda.Stream()

        def pack(t):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                kept = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                kept.copy_(t, non_blocking=True)
            i = self.ids = self.ids + 1
            self.table[i] = (kept, side.record_event(), t)  # t: alive until the copy has run
            return i

        def unpack(i):
            kept, copied, _ = self.table.pop(i)
            back.wait_event(copied)
            with torch.cuda.stream(back):
                t = kept.to("cuda", non_blocking=True)
            torch.cuda.current_stream().wait_stream(back)
            t.record_stream(torch.cuda.current_stream())
            return t

        super().__init__(pack, unpack)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: run on a GPU machine")
def test_on_cuda_offloading_on_streams_as_torchtune_does_is_checked_and_a_write_since_harmless():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).cuda()
    x = X.cuda()
    with check_saved("raise") as c:
        with _Streamed():
            loss = model(x).pow(2).sum()
        torch.cuda.synchronize()
        model[2].weight.data.mul_(2)
        loss.backward()
    assert c.findings == [] and c.checked == c.unpacked > 0
