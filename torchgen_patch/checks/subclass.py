"""Tensor subclasses for verify: a sample's tensors wrapped, so that the verdict
is on the *wrapper's* counter.

- ``wrapper``: ``Wrapper``, a minimal ``__torch_dispatch__`` wrapper subclass
  (the project's own: it unwraps, runs the op on the inner tensors, wraps the
  results). An in-place op moves the inner tensors' counters; only an
  ``ADInplaceOrView`` kernel, which runs on the wrapper before the
  subclass's dispatch, moves the wrapper's.
- ``dtensor``: DTensor on a one-rank process group (gloo on CPU, nccl on
  CUDA; an in-process store, so nothing listens or waits on a port), with
  ``Shard(0)`` placements where the op runs with them, else ``Replicate()``.

An op that the subclass cannot run (it raises even when dispatched below
every ``ADInplaceOrView`` kernel, while the same sample runs on plain
tensors) is NOT_RUN with the subclass's own error, never PASS.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager

SUBCLASSES = ("plain", "wrapper", "dtensor")
PG_TIMEOUT_S = 60  # bound on every process-group operation of verify


class Unavailable(Exception):
    """The subclass cannot be used in this process (no torch.distributed, no process group); says why."""


@functools.cache
def wrapper_type():
    import torch
    from torch.utils._pytree import tree_map_only

    from ..runtime.dispatcher import disabled_torch_function

    class Wrapper(torch.Tensor):
        """One inner tensor behind a wrapper with the same metadata and its own version counter."""

        @staticmethod
        def __new__(cls, inner):
            return torch.Tensor._make_wrapper_subclass(
                cls, inner.shape, strides=inner.stride(), storage_offset=inner.storage_offset(),
                dtype=inner.dtype, layout=inner.layout, device=inner.device, requires_grad=inner.requires_grad)

        def __init__(self, inner):
            self.inner = inner  # type: ignore[method-assign]  # the wrapped tensor, over Tensor.inner

        def __repr__(self):  # type: ignore[override]  # no tensor_contents: nothing of its own to print
            return f"Wrapper({self.inner!r})"

        def __tensor_flatten__(self):
            return ["inner"], None

        @staticmethod
        def __tensor_unflatten__(inner_tensors, meta, outer_size, outer_stride):
            return Wrapper(inner_tensors["inner"])

        __torch_function__ = disabled_torch_function()

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[override]  # the documented form
            args, kwargs = tree_map_only(Wrapper, lambda w: w.inner, (args, kwargs or {}))
            out = func(*args, **kwargs)
            return tree_map_only(torch.Tensor, Wrapper, out)

    return Wrapper


@contextmanager
def one_rank_mesh(device: str, timeout_s: int = PG_TIMEOUT_S):
    """A one-rank DeviceMesh on ``device`` for the duration; the process group is
    always destroyed on the way out. Raises Unavailable with the reason."""
    import torch

    if not torch.distributed.is_available():
        raise Unavailable("torch.distributed is not available in this torch build")
    import datetime

    import torch.distributed as dist

    if dist.is_initialized():
        raise Unavailable("a process group is already initialized in this process")
    backend = "nccl" if device == "cuda" else "gloo"
    try:
        if not dist.is_backend_available(backend):
            raise RuntimeError(f"backend {backend} is not built into this torch")
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=timeout_s))
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device, (1,))
    except Exception as e:  # noqa: BLE001 — whatever the backend raises, the check says it cannot start
        if dist.is_initialized():
            dist.destroy_process_group()
        raise Unavailable(f"cannot start a one-rank {backend} process group: "
                          f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    try:
        yield mesh
    finally:
        dist.destroy_process_group()


def dtensor_api():
    """DTensor's module: torch.distributed.tensor, or torch.distributed._tensor in releases whose
    public module lacks the API (torch 2.4)."""
    import importlib

    public = importlib.import_module("torch.distributed.tensor")
    return public if hasattr(public, "Replicate") else importlib.import_module("torch.distributed._tensor")


def placements(subclass: str) -> tuple[str, ...]:
    """The placements tried in order ("" for subclasses without any)."""
    return ("Shard(0)", "Replicate()") if subclass == "dtensor" else ("",)


def wrap(sample, subclass: str, mesh=None, placement: str = ""):
    """The sample with every tensor (in lists too) wrapped; ``written`` names the wrappers."""
    import torch

    if subclass == "wrapper":
        Wrapper = wrapper_type()
        one = Wrapper
    else:
        api = dtensor_api()
        DTensor, Replicate, Shard = api.DTensor, api.Replicate, api.Shard

        def one(t):
            p = Shard(0) if placement.startswith("Shard") and t.dim() > 0 else Replicate()
            return DTensor.from_local(t, mesh, [p], run_check=False)

    memo: dict[int, object] = {}

    def conv(v):
        if isinstance(v, torch.Tensor):
            if id(v) not in memo:
                memo[id(v)] = one(v)
            return memo[id(v)]
        if isinstance(v, (list, tuple)):
            return type(v)(conv(x) for x in v)
        return v

    return type(sample)(sample.op, [conv(a) for a in sample.args], {k: conv(v) for k, v in sample.kwargs.items()},
                        {k: conv(v) for k, v in sample.written.items()})


def cannot_run(op: str, device: str, subclass: str, mesh, placement: str, call) -> str | None:
    """Why the subclass cannot run ``op`` (its error below every ADInplaceOrView
    kernel, while plain tensors run it), or None when the failure is not the subclass's."""
    from ..runtime.dispatcher import below_inplace_or_view_guard
    from .samples import sample

    plain = sample(op, device)
    try:
        with below_inplace_or_view_guard():
            call(*plain.args, **plain.kwargs)
    except Exception:  # noqa: BLE001 — any failure on plain tensors
        return None  # the op fails on plain tensors too: the sample's or the op's failure, not the subclass's
    s = wrap(sample(op, device), subclass, mesh, placement)
    try:
        with below_inplace_or_view_guard():
            call(*s.args, **s.kwargs)
    except Exception as e:  # noqa: BLE001 — the subclass's failure, whatever it is, is the reason
        return f"{subclass} cannot run it: {type(e).__name__}: {_first_line(e)}"
    return None


def _first_line(e: Exception) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return lines[0].strip() if lines else ""
