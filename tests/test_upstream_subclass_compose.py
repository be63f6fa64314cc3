"""The kernels beside a subclass fix that bumps after Python dispatch (the approach of a fix that bumps
the version counters of a tensor subclass's written arguments once ``__torch_dispatch__`` returns, for
foreach operators): with both, every written wrapper advances exactly once per call, and the tensors
inside it exactly as under PyTorch's own generated in-place kernel (``add_`` on the same wrapper: not at
all, as the subclass's ``__torch_dispatch__`` runs below ADInplaceOrView), never twice. The subclass fix
is emulated here, faithfully to where it acts, by a TorchDispatchMode that bumps after dispatch; the
kernels are this project's C++ kernels, the same rule the patched codegen emits."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torchgen_patch
from torchgen_patch.checks import subclass as sc

OPS = ["aten::_foreach_add_.Scalar", "aten::_foreach_mul_.List"]


def _written(func, args, kwargs) -> list:
    """The tensors the call writes (every tensor of a written Tensor[])."""
    out = []
    values = list(args) + [kwargs.get(a.name) for a in func._schema.arguments[len(args):]]
    for a, value in zip(func._schema.arguments, values, strict=True):
        if a.alias_info is not None and a.alias_info.is_write and value is not None:
            out += list(value) if isinstance(value, (list, tuple)) else [value]
    return out


class BumpAfterDispatch(TorchDispatchMode):
    """The subclass fix: once dispatch below Python returns from a foreach operator that mutates and returns
    nothing, every written argument that is a tensor subclass gets one version bump, unconditionally."""

    def __init__(self):
        super().__init__()
        self.bumped = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func._schema.name.startswith("aten::_foreach_") and not func._schema.returns:
            for t in _written(func, args, kwargs):
                if isinstance(t, torch.Tensor) and type(t) is not torch.Tensor:
                    torch.autograd.graph.increment_version(t)
                    self.bumped += 1
        return out


def _wrapper_case(mesh=None):
    Wrapper = sc.wrapper_type()
    inner = [torch.ones(4) for _ in range(3)]
    return [Wrapper(t) for t in inner], inner


def _dtensor_case(mesh):
    api = sc.dtensor_api()
    inner = [torch.ones(4) for _ in range(3)]
    ts = [api.DTensor.from_local(t, mesh, [api.Replicate()], run_check=False) for t in inner]
    return ts, [t._local_tensor for t in ts]


def _advance(make, mesh, op: str, kernels: bool, subclass_fix: bool, library) -> tuple[list[int], list[int], int]:
    """How far each wrapper and each inner tensor advanced in one call; how often the emulated fix bumped."""
    ts, inner = make(mesh)
    others = [torch.full((4,), 2.0) for _ in ts]
    if make is _dtensor_case:
        api = sc.dtensor_api()
        others = [api.DTensor.from_local(o, mesh, [api.Replicate()], run_check=False) for o in others]
    before = [t._version for t in ts], [t._version for t in inner]
    mode = BumpAfterDispatch()
    if kernels:
        rep = torchgen_patch.install(library=library.path)
        assert set(OPS) <= set(rep.registered)
    try:
        with mode if subclass_fix else contextlib.nullcontext():
            if op == "aten::_foreach_add_.Scalar":
                torch._foreach_add_(ts, 1.0)
            else:
                torch._foreach_mul_(ts, others)
    finally:
        if kernels:
            torchgen_patch.uninstall()
    wrappers = [t._version - b for t, b in zip(ts, before[0], strict=True)]
    return wrappers, [t._version - b for t, b in zip(inner, before[1], strict=True)], mode.bumped


def _inner_under_generated_kernel(make, mesh) -> list[int]:
    """How far the tensors inside the wrappers advance under PyTorch's generated in-place kernel (add_)."""
    ts, inner = make(mesh)
    before = [t._version for t in inner]
    for t in ts:
        t.add_(1.0)
    assert [t._version for t in ts] == [1] * len(ts)
    return [t._version - b for t, b in zip(inner, before, strict=True)]


@contextlib.contextmanager
def _mesh(subclass: str):
    if subclass == "wrapper":
        yield None
        return
    try:
        with sc.one_rank_mesh("cpu") as mesh:
            yield mesh
    except sc.Unavailable as e:
        pytest.skip(f"DTensor: {e}")


@pytest.mark.build
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("subclass", ["wrapper", "dtensor"])
def test_with_both_fixes_every_written_tensor_advances_once(library, subclass, op):
    make = _wrapper_case if subclass == "wrapper" else _dtensor_case
    with _mesh(subclass) as mesh:
        ref = _inner_under_generated_kernel(make, mesh)
        assert ref in ([0] * 3, [1] * 3)
        wrappers, inner, bumped = _advance(make, mesh, op, kernels=True, subclass_fix=True, library=library)
        assert bumped == 3  # the emulated fix did act: the kernel saw each wrapper already moved
        assert (wrappers, inner) == ([1, 1, 1], ref)
        # either alone gives one bump too; neither leaves the wrappers where they were
        assert _advance(make, mesh, op, kernels=True, subclass_fix=False, library=library)[:2] == ([1] * 3, ref)
        assert _advance(make, mesh, op, kernels=False, subclass_fix=True, library=library)[:2] == ([1] * 3, ref)
        assert _advance(make, mesh, op, kernels=False, subclass_fix=False, library=library)[0] == [0, 0, 0]


def test_the_emulated_fix_bumps_written_subclass_arguments_only():
    Wrapper = sc.wrapper_type()
    w, plain = Wrapper(torch.ones(2)), torch.ones(2)
    other = Wrapper(torch.ones(2))
    mode = BumpAfterDispatch()
    with mode:
        torch._foreach_add_([w, plain], [other, other])
    assert mode.bumped == 1 and w._version == 1 and other._version == 0
    with mode:
        torch.add(w, 1)  # not a foreach operator: nothing
    assert mode.bumped == 1
