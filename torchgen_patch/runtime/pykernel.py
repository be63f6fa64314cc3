"""The Python fallback kernel: the same exactly-one-bump rule as the
generated C++ kernels, registered through torch.library."""

from __future__ import annotations


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


def make_kernel(opov, written: list[str]):
    """The ADInplaceOrView kernel for ``opov`` whose arguments named ``written`` are written."""
    from torch.autograd.graph import increment_version

    from .dispatcher import below_inplace_or_view

    after, below = below_inplace_or_view()
    where = _positions(opov, written)

    def kernel(keyset, *args, **kwargs):
        ts = [t for p, n, k in where for t in _tensors(_get(args, kwargs, p, n, k))]
        before = [_version(t) for t in ts]
        with below():
            opov.redispatch(keyset & after, *args, **kwargs)
        for t, v in zip(ts, before):
            if t.is_inference() or t._version == v:
                increment_version(t)

    return kernel
