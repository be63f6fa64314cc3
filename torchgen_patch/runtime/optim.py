"""Optimizers whose ``step()`` writes outside the dispatcher (C++ bound with pybind writing through
``data_ptr``, ``p.data``): the overlay's optimizer entries, applied through PyTorch's global
optimizer step hooks (``torch.optim.optimizer.register_optimizer_step_pre_hook`` / ``_post_hook``,
torch >= 2.0), so a class imported after ``install()`` is covered too.

The rule is the kernels' own: before a step of a class that has an entry, the version of every
tensor the entry says it writes is taken; after it, each of them whose version did not move is
bumped once (``torch.autograd.graph.increment_version``), and none whose version the step itself
moved. Tensors that share one counter (views of one base) advance it once. Any other optimizer
costs one dictionary look-up per step and is left as it is; nothing but version counters
changes, so results are bit-identical.

What an entry's ``writes`` name, per parameter of the optimizer's param groups that has a
gradient before or after the step (the step skips the others): ``params``, the parameter;
``state``, the tensors of ``optimizer.state[p]`` that existed before the step (one it creates
is new: nothing can have saved it).
"""

from __future__ import annotations

import sys
import threading

_LOCK = threading.Lock()
_ENTRIES: dict = {}  # class path -> plan.overlay.OptimizerEntry
_BY_CLASS: dict = {}  # class -> its entry or None, resolved at its first step
_PENDING: dict[int, tuple] = {}  # id(optimizer) -> _snapshot's lists (tensor, version, ...) of the step running
_HANDLES: list = []  # the two hooks' handles while any entry is active
_UNRESOLVED = object()
_TENSOR: list = []  # torch.Tensor, once an entry is active
_BUMP: list = []  # bumps each tensor of a list once (dispatcher.version_bumper)


def activate(entries: dict) -> list[str]:
    """Apply ``entries`` (class path -> OptimizerEntry; added to those already active, an entry for
    the same class replaced) and return the class paths active now, sorted."""
    with _LOCK:
        _ENTRIES.update(entries)
        _BY_CLASS.clear()
        if _ENTRIES and not _HANDLES:
            import torch
            from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

            from .dispatcher import version_bumper

            _TENSOR[:], _BUMP[:] = [torch.Tensor], [version_bumper()]
            _HANDLES.extend((register_optimizer_step_pre_hook(before_step),
                             register_optimizer_step_post_hook(after_step)))
        return sorted(_ENTRIES)


def deactivate() -> list[str]:
    """Remove the hooks and every entry; returns the class paths that were active."""
    with _LOCK:
        gone = sorted(_ENTRIES)
        for h in _HANDLES:
            h.remove()
        _HANDLES.clear()
        _ENTRIES.clear()
        _BY_CLASS.clear()
        _PENDING.clear()
        return gone


def active() -> list[str]:
    return sorted(_ENTRIES)


def entry_for(cls):
    """The active entry that covers ``cls`` (None if none), resolved once per class."""
    entry = _BY_CLASS.get(cls, _UNRESOLVED)
    if entry is _UNRESOLVED:
        entry = _BY_CLASS[cls] = covering(_ENTRIES, cls)
    return entry


def covering(entries: dict, cls):
    """The entry of ``entries`` that names ``cls``: by the module that defines it, or by a module
    already imported that exports this very class under the entry's name; None if none."""
    entry = entries.get(f"{cls.__module__}.{cls.__qualname__}")
    if entry is None:
        for path, e in entries.items():  # the overlay's order
            module, _, name = path.rpartition(".")
            if getattr(sys.modules.get(module), name, None) is cls:
                return e
    return entry


def before_step(optimizer, args, kwargs) -> None:
    """The hook before every optimizer step while an entry is active: what the step may write, and
    its versions, kept when an entry covers the optimizer's class."""
    entry = _BY_CLASS.get(type(optimizer), _UNRESOLVED)
    if entry is _UNRESOLVED:
        entry = entry_for(type(optimizer))
    if entry is not None:
        _PENDING[id(optimizer)] = _snapshot(optimizer, entry.writes)


def after_step(optimizer, args, kwargs) -> None:
    """The hook after every optimizer step while an entry is active: each tensor kept before it
    whose version did not move, bumped once (a parameter the step skipped is not)."""
    todo = _PENDING.pop(id(optimizer), None)
    if todo is None:
        return
    bump = _BUMP[0]
    for t, version, p, had_grad in zip(*todo, strict=True):
        # one at a time: a tensor that shares its counter with one bumped just now has moved already;
        # a tensor of a parameter the step skipped (no gradient before it or after it) was not written
        if t._version == version and (had_grad or p.grad is not None):
            bump((t,))


def _snapshot(optimizer, writes: tuple[str, ...]) -> tuple[list, list, list, list]:
    """What the step may write: the tensors, their versions now, the parameter each belongs to and
    whether that had a gradient."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    had_grad = [p.grad is not None for p in params]
    tensors, owners, grads = (params, params, had_grad) if "params" in writes else ([], [], [])
    if "state" in writes:
        state, tensor = optimizer.state, _TENSOR[0]
        more = [(t, p, g) for p, g in zip(params, had_grad, strict=True) for t in (state.get(p) or {}).values()
                if isinstance(t, tensor)]
        tensors, owners, grads = tensors + [m[0] for m in more], owners + [m[1] for m in more], \
            grads + [m[2] for m in more]
    try:
        versions = [t._version for t in tensors]
    except RuntimeError:  # an inference tensor among them: it has no version counter to move
        keep = [i for i, t in enumerate(tensors) if not t.is_inference()]
        tensors, owners, grads = [tensors[i] for i in keep], [owners[i] for i in keep], [grads[i] for i in keep]
        versions = [t._version for t in tensors]
    return tensors, versions, owners, grads
