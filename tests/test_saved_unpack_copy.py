"""the program's own hooks keep the saved tensor by reference and make their copy at unpack
(``t.clone()``, a dtype round trip, ``contiguous()`` of a transposed weight): the copy is read from the
original as it is at backward, so a ``.data`` write between forward and backward reaches the gradient.
Such a write must still be a finding; counting it as "a lossy copy, not judged" misses a wrong gradient."""

from __future__ import annotations

import pytest
import torch

from tests.test_saved_offload import SAVED, _model, _same, _step, _whole
from tests.test_saved_sample import check_path  # noqa: F401  (the autouse fixture: $TORCHGEN_PATCH_CHECK_PATH)
from torchgen_patch.saved import check_saved


def pytest_generate_tests(metafunc):
    if "check_path" in metafunc.fixturenames:
        metafunc.parametrize("check_path", ["native", "python"], indirect=True)


UNPACK_COPIES = {
    "clone at unpack": lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t.clone()),
    "float64 round trip at unpack": lambda: torch.autograd.graph.saved_tensors_hooks(
        lambda t: t, lambda t: t.to(torch.float64).to(t.dtype)),
    "contiguous at unpack": lambda: torch.autograd.graph.saved_tensors_hooks(
        lambda t: t, lambda t: t.contiguous() if not t.is_contiguous() else t.clone()),
}


@pytest.mark.parametrize("kind", sorted(UNPACK_COPIES))
def test_a_write_read_by_a_copy_made_at_unpack_is_found(kind):
    hooks_of = UNPACK_COPIES[kind]
    clean = _step(_model(), hooks_of)
    plain = _step(_model(), hooks_of, "weight")
    assert not _same(plain, clean)  # the gradient is wrong: the copy was made after the write
    with check_saved("warn") as c:
        _step(_model(), hooks_of, "weight")
    assert c.unpacked == SAVED and _whole(c)
    assert {f.name for f in c.findings} == {"2.weight"}, (c.findings, c.skipped)
