"""The Python fallback kernel: the same exactly-one-bump rule as the
generated C++ kernels, registered through torch.library."""

from __future__ import annotations

from typing import NamedTuple


class EvidenceRow(NamedTuple):
    """One written argument of one operator: calls seen, and in how many its data changed."""

    op: str
    arg: str
    calls: int
    changed: int


class NeverChanged(NamedTuple):
    """A written argument no call changed: ``(op, arg, calls)``, by name or unpacked."""

    op: str
    arg: str
    calls: int


def _positions(opov, written: list[str]) -> list[tuple[int, str, bool]]:
    """(schema position, name, kwarg-only) of each written argument."""
    args = opov._schema.arguments
    want = set(written)
    return [(i, a.name, a.kwarg_only) for i, a in enumerate(args) if a.name in want]


def _get(args, kwargs, pos, name, kwarg_only):
    if name in kwargs:
        return kwargs[name]
    if not kwarg_only and pos < len(args):
        return args[pos]
    return None


def _tensors(value) -> list:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [t for t in value if t is not None]
    return [value]


def _version(t) -> int:
    return -1 if t.is_inference() else t._version


class Evidence:
    """Per operator and written argument: how many calls, and in how many the argument's
    data actually changed. A schema can declare an argument written (``Tensor(a!)``) that
    the kernel rewrites only sometimes, or never: bumping it then costs the program an
    autograd error where nothing was overwritten. This is the evidence to decide by."""

    def __init__(self) -> None:
        self.calls: dict[tuple[str, str], list[int]] = {}  # (op, arg) -> [calls, calls that changed it]

    def add(self, op: str, arg: str, changed: bool | None) -> None:
        """``changed`` None: could not be told (meta or fake tensors): not counted."""
        if changed is None:
            return
        c = self.calls.setdefault((op, arg), [0, 0])
        c[0] += 1
        c[1] += int(changed)

    def rows(self) -> list[EvidenceRow]:
        return [EvidenceRow(op, arg, n, ch) for (op, arg), (n, ch) in sorted(self.calls.items())]

    def never_changed(self) -> list[NeverChanged]:
        """Each argument declared written but never changed in any call seen: ``op``, ``arg``, ``calls``."""
        return [NeverChanged(r.op, r.arg, r.calls) for r in self.rows() if r.calls and not r.changed]


def _snapshot(ts: list) -> list:
    return [t.detach().clone() for t in ts]


def _changed(before, after) -> bool | None:
    """Bit for bit (NaN == NaN, 0.0 != -0.0); None when the data cannot be read (meta, fake)."""
    import torch

    if before.shape != after.shape or before.dtype != after.dtype:
        return True
    try:
        a = before.contiguous().reshape(-1).view(torch.uint8)
        b = after.detach().contiguous().reshape(-1).view(torch.uint8)
        return not torch.equal(a, b)
    except Exception:  # noqa: BLE001 — meta/fake tensors, or a layout without bytes to compare
        return None


OUT_REQUIRES_GRAD = ("(): functions with out=... arguments don't support automatic differentiation, but one of "
                     "the arguments requires grad.")  # PyTorch's own message (throw_error_out_requires_grad)


def make_kernel(opov, written: list[str], evidence: Evidence | None = None,
                refuse: tuple[str, tuple[str, ...]] | None = None):
    """The ADInplaceOrView kernel for ``opov`` whose arguments named ``written`` are written.
    ``evidence``: also record, per call, which written arguments' data changed (a copy of
    each is taken before the call: for finding out, not for production).
    ``refuse`` (the name PyTorch prints, the arguments to check): in grad mode, refuse before the
    call when one of those requires grad, as the generated C++ kernel does."""
    import torch
    from torch.autograd.graph import increment_version

    from .dispatcher import below_inplace_or_view

    after, below = below_inplace_or_view()
    where = _positions(opov, written)

    name = opov._schema.name + (f".{opov._schema.overload_name}" if opov._schema.overload_name else "")
    checked = _positions(opov, list(refuse[1])) if refuse else []
    message = refuse[0] + OUT_REQUIRES_GRAD if refuse else ""

    def kernel(keyset, *args, **kwargs):
        if checked and torch.is_grad_enabled() and any(
                t.requires_grad for p, n, k in checked for t in _tensors(_get(args, kwargs, p, n, k))):
            raise RuntimeError(message)
        ts = [t for p, n, k in where for t in _tensors(_get(args, kwargs, p, n, k))]
        before = [_version(t) for t in ts]
        if evidence is not None:
            named = [(n, _tensors(_get(args, kwargs, p, n, k))) for p, n, k in where]
            copies = [(n, list(zip(group, _snapshot(group), strict=True))) for n, group in named]
        with below():
            result = opov.redispatch(keyset & after, *args, **kwargs)
        if evidence is not None:
            for n, pairs in copies:
                seen = [_changed(b, t) for t, b in pairs]
                evidence.add(name, n, None if None in seen else any(seen))
        for t, v in zip(ts, before, strict=True):
            if t.is_inference() or t._version == v:
                increment_version(t)
        return result  # an op may write arguments and return something too (custom ops do)

    return kernel
