"""A tensor saved while a backward pass that keeps no graph runs is not read (its version is checked, and it
is counted under its reason): such a pass uses and frees what it saves (a reentrant checkpoint's
recomputation). A graph a backward hook builds under ``enable_grad`` for a LATER pass is the exception, a
known limit stated in docs/unseen-writes.md: a ``.data`` write between the two passes reaches the gradient
and is not found. The test below says so (strict: it fails once such a write is found)."""

from __future__ import annotations

import pytest
import torch

from tests.test_saved_sample import check_path  # noqa: F401  (the autouse fixture: $TORCHGEN_PATCH_CHECK_PATH)
from torchgen_patch.saved import check_saved
from torchgen_patch.saved.fingerprint import IN_BACKWARD


def pytest_generate_tests(metafunc):
    if "check_path" in metafunc.fixturenames:
        metafunc.parametrize("check_path", ["native", "python"], indirect=True)


def _run(write: bool):
    torch.manual_seed(0)
    w, a = torch.randn(4, requires_grad=True), torch.randn(4)
    x = torch.randn(4, requires_grad=True)
    later = []

    def hook(grad):  # a graph built during backward, for a later pass (an auxiliary loss, a meta-gradient)
        with torch.enable_grad():
            later.append((w * a).sum())  # mul saves `a` (for w's gradient) while this pass runs
        return grad

    x.register_hook(hook)
    (x * 2).sum().backward()  # the first pass: keeps no graph
    if write:
        a.data.mul_(2)  # no version moves
    later[0].backward()  # a later pass uses the `a` saved in the first one
    return w.grad.clone()


@pytest.mark.xfail(strict=True,
                   reason="a known limit (docs/unseen-writes.md): saves in a backward pass that keeps no graph "
                          "are not read (hooks.record, IN_BACKWARD)")
def test_a_write_to_a_tensor_saved_in_one_backward_pass_and_used_in_a_later_one_is_found():
    assert not torch.equal(_run(False), _run(True))  # the gradient is wrong
    with check_saved("warn") as c:
        _run(True)
    assert c.findings, c.skipped
    assert IN_BACKWARD not in c.skipped, c.skipped  # not a recomputation: used by a later pass
