"""Tensors a custom ``torch.autograd.Function`` keeps as attributes of its ``ctx`` (``ctx.w = w`` rather
than ``ctx.save_for_backward(w)``): autograd never saves them, so no saved-tensor hook sees them.

While a check is on, ``torch.autograd.Function.apply`` is wrapped. When a Function's forward returns,
the backward node of its outputs (the ``ctx`` itself) is scanned for tensors: each attribute that is a
tensor, and each tensor one level inside a list, tuple or dict attribute. Each is fingerprinted then, as
it is at forward's return (a Function that writes its own attribute in forward and marks it dirty, or
replaces it by another tensor there, gave it that value by design), and a pre-hook on the node compares
it when backward runs that node. A tensor the Function also passed to ``save_for_backward`` is left to
the saved-tensor hooks (one finding, not two). What is kept of a tensor is a weak reference, its version
and its fingerprint, held by the node's hooks only: it goes when the node goes, backward run or not.

A difference goes the saved tensors' way: counted, judged and said by the ``Check`` (its findings,
exemptions, skip counts, modes). On a device the comparison is made there: in warn mode on the native
path it is copied to the host without waiting and judged once it has run (``_Late``), as the native
hooks judge theirs; in raise mode and on the Python path it is read at the end of the backward pass.
Autograd checks no version of a ctx attribute; one whose version moved since forward was written where
autograd could see it, and is counted as not judged. Where the graph is kept for another backward pass
(``retain_graph``, ``create_graph``), what the node's own backward left is fingerprinted again after it
ran, so a second pass is compared with what the first one left.

The fingerprint: on the native path the native hooks' C++ for a plain CPU tensor (the same read as a
saved tensor's), and the Python path's ``fingerprint()`` for anything else (on CUDA, torch's integer ops,
a 0-d tensor on the device: nothing waits for it); on the Python path, ``fingerprint()`` throughout.
Nothing is wrapped while no check is on, nor under torch.compile's tracing or torch.func's transforms.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any

from ..vocabulary import CheckMode
from . import attribute, engine
from .fingerprint import Skip, fingerprint, plain_types, readable, skip_reason
from .native import REASONS

BUMPED = "ctx attributes whose version moved since forward (autograd checks none)"
NO_READ = "ctx attributes the native fingerprint could not read"
CAPTURED = REASONS[5]  # "saved while a CUDA graph was captured", as the native hooks count it

_CHECKS: list = []  # the checks on (as _On), the latest last
_LIFTED: list = []  # the checks on whose step was not drawn (as _On): their watches made still compare


class _Torch:
    """What the wrappers replaced (torch's own, or another's wrapper), called by them and put back when the
    last check stops; ``wrapped``: they are in place (under a later wrapper of another, as pass-throughs)."""

    def __init__(self):
        self.apply: Any = None
        self.save: Any = None
        self.wrapped = False


_TORCH = _Torch()

_LOCK = threading.Lock()
_TLS = threading.local()  # per thread: a list per apply running, of the tensors its save_for_backward got
_WATCHED: weakref.WeakSet = weakref.WeakSet()  # the nodes hooked (an apply a subclass's __torch_function__ runs again)


def start(check, python) -> None:
    """Fingerprint ctx attributes for ``check`` (``python``: its Python hooks, which count and judge); a check
    lifted (``lift``) goes on where it was."""
    with _LOCK:
        if not any(on.check is check for on in _CHECKS):
            lifted = [on for on in _LIFTED if on.check is check]
            _LIFTED[:] = [on for on in _LIFTED if on.check is not check]
            _CHECKS.append(lifted[0] if lifted else _On(check, python))
        _install()


def lift(check) -> None:
    """Keep no ctx attributes for ``check`` until it starts again (a step the sampled check did not draw):
    nothing is wrapped where no check is on; the watches already made still compare at backward, and what
    is left on a device is judged at ``stop``."""
    with _LOCK:
        _LIFTED.extend(on for on in _CHECKS if on.check is check)
        _CHECKS[:] = [on for on in _CHECKS if on.check is not check]
        if not _CHECKS:
            _uninstall()


def stop(check) -> None:
    """Stop watching for ``check``: its comparisons still on a device are waited for and judged."""
    settle(check)
    with _LOCK:
        _CHECKS[:] = [on for on in _CHECKS if on.check is not check]
        _LIFTED[:] = [on for on in _LIFTED if on.check is not check]
        if not _CHECKS:
            _uninstall()


def settle(check) -> None:
    """Judge ``check``'s comparisons still on a device (warn mode, native path), waiting for them."""
    for on in list(_CHECKS) + list(_LIFTED):
        if on.check is check:
            on.late.settle(True)


def wrapped() -> bool:
    """Whether torch's ``Function.apply`` is wrapped now."""
    import torch

    return torch.autograd.Function.__dict__.get("apply") is _APPLY


# --- the wrappers ---------------------------------------------------------------------------------


def _apply(cls, *args, **kwargs):
    original = _TORCH.apply.__get__(None, cls)
    on = _CHECKS[-1] if _CHECKS else None
    if on is None or not on.check.active or engine.tracing():
        return original(*args, **kwargs)
    attribute.LAUNCHES.ensure()  # a Triton imported since the checked step began (a library's kernels load lazily)
    frames = _TLS.__dict__.setdefault("saved", [])
    frames.append([])
    try:
        out = original(*args, **kwargs)
    finally:
        saved = frames.pop()
    _watch(on, cls, out, saved)
    return out


def _save_for_backward(ctx, *tensors):
    frames = _TLS.__dict__.get("saved")
    if frames:
        frames[-1].extend(tensors)
    return _TORCH.save(ctx, *tensors)


_APPLY = classmethod(_apply)


def _install() -> None:
    import torch

    if _TORCH.wrapped:
        return
    function, ctx = torch.autograd.Function, torch.autograd.function.FunctionCtx
    _TORCH.apply, _TORCH.save = function.__dict__["apply"], ctx.save_for_backward
    function.apply = _APPLY  # type: ignore[assignment]  # put back by _uninstall
    ctx.save_for_backward = _save_for_backward  # type: ignore[method-assign]  # put back by _uninstall
    _TORCH.wrapped = True


def _uninstall() -> None:
    """Put torch's own back, unless another wrapper was installed over this one since: then this one
    stays under it, passing every call through while no check is on."""
    import torch

    function, ctx = torch.autograd.Function, torch.autograd.function.FunctionCtx
    ours = function.__dict__.get("apply") is _APPLY and ctx.save_for_backward is _save_for_backward
    if not _TORCH.wrapped or not ours:
        return
    function.apply = _TORCH.apply  # type: ignore[method-assign]  # torch's own, put back
    ctx.save_for_backward = _TORCH.save  # type: ignore[method-assign]  # torch's own, put back
    _TORCH.wrapped = False


# --- at forward's return ----------------------------------------------------------------------------


def _watch(on, cls, out, saved) -> None:
    """Fingerprint the tensor attributes of the ctx of ``cls`` whose outputs are ``out``, and hook its node."""
    ctx = _node(cls, out)
    if ctx is None or ctx in _WATCHED:  # no output needs a gradient (no backward will run), or hooked already
        return
    tensors = _attributes(ctx)
    if not tensors:
        return
    left = {_view(t) for t in saved if _is_tensor(t)}
    where = attribute.caller(2)
    kept = [k for k in (_keep(on.check, t, where) for t in tensors if _view(t) not in left) if k is not None]
    if kept:
        ctx.register_prehook(_Watch(on, kept).compare)
        _WATCHED.add(ctx)


def _node(cls, out):
    for t in out if isinstance(out, (tuple, list)) else (out,):
        if _is_tensor(t):
            node = t.grad_fn
            if node is not None and getattr(node, "_forward_cls", None) is cls:
                return node
    return None


def _attributes(ctx) -> list:
    """The tensors ``ctx`` keeps: attributes, and one level inside list, tuple and dict attributes (each once)."""
    try:
        values = list(vars(ctx).values())
    except TypeError:  # no __dict__
        return []
    out, seen = [], set()
    for value in values:
        inner = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else (value,)
        for t in inner:
            if _is_tensor(t) and id(t) not in seen:
                seen.add(id(t))
                out.append(t)
    return out


def _is_tensor(t) -> bool:
    import torch

    return isinstance(t, torch.Tensor)


def _view(t):
    """What makes two tensors the same view of the same memory (a detached alias is the same), else their id."""
    try:
        return t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype, t.device
    except Exception:  # noqa: BLE001 — no storage of its own (a wrapper subclass)
        return id(t)


class _Kept:
    """What is kept of one ctx attribute: the fields of a saved tensor's record that a finding reads, a weak
    reference to the tensor (``original``), and whether the native hooks read its fingerprint."""

    __slots__ = ("original", "version", "fp", "native", "leaf", "output", "output_nr", "where", "steps", "ptr")

    def __init__(self, check, t, original, where):
        self.original, self.leaf, self.output, self.output_nr = original, t.is_leaf, False, 0
        self.where, self.steps = where, attribute.STEPS.count
        try:
            self.ptr: int | None = t.data_ptr()
        except Exception:  # noqa: BLE001 — a wrapper subclass has no pointer of its own
            self.ptr = None
        self.read(check, t)

    def read(self, check, t) -> None:
        self.version: int = t._version
        self.native, self.fp = _fingerprint(check, t)


def _keep(check, t, where) -> _Kept | None:
    try:
        original = weakref.ref(t)
    except TypeError:  # a tensor no weak reference can point at: not kept
        return None
    return _Kept(check, t, original, where)


def _fingerprint(check, t) -> tuple[bool, Any]:
    """(whether the native hooks read it, the fingerprint's parts or a Skip)."""
    hooks = check.native
    if hooks is not None and type(t) in _plain() and t.is_cpu and skip_reason(t) is None and t.numel() and \
            readable(t):
        value = hooks.fingerprint(t)
        if value is not None:
            return True, (value,)
    if _capturing(t):
        return False, Skip(CAPTURED)
    return False, fingerprint(t)


def _capturing(t) -> bool:
    """A CUDA graph is being captured on the current stream (what runs now is recorded, not run)."""
    import torch

    return t.is_cuda and torch.cuda.is_current_stream_capturing()


# --- when backward runs the node -------------------------------------------------------------------


@functools.cache
def _plain() -> frozenset:
    return frozenset(plain_types())


class _Watch:
    """The node's hooks: compare before its backward runs; where the graph is kept for another pass, read
    again after it (a post-hook, added at the first such pass). Holds no tensor and not the node itself."""

    def __init__(self, on: _On, kept: list[_Kept]):
        self.check, self.python, self.late, self.kept = on.check, on.python, on.late, kept
        self.refreshes = False

    def compare(self, grad_outputs):
        if not self.check.active or engine.tracing():
            return None
        for k in self.kept:
            t = k.original()
            if t is not None:  # else the ctx holds it no more: its backward cannot read it
                self._compare(k, t)
        if not self.refreshes and engine.keep_graph():
            node = engine.current_node()
            if node is not None:
                node.register_hook(self.refresh)
                self.refreshes = True
        return None

    def _compare(self, k: _Kept, t) -> None:
        python = self.python
        if t._version != k.version or _capturing(t):
            python.unpacked += 1
            python.skip(BUMPED if t._version != k.version else CAPTURED)
        elif k.native:
            python.unpacked += 1
            now = self.check.native.fingerprint(t)
            if now is None:
                python.skip(NO_READ)
                return
            python.checked += 1
            if now != k.fp[0]:
                self.check.found(k, t, t, engine.current_node(), attribute.backward_call())
        elif not self.late.add(k, t):
            python.verify(k, t, t)  # counts, judges and defers a device comparison as for a saved tensor

    def refresh(self, grad_inputs, grad_outputs):
        if self.check.active and not engine.tracing() and engine.keep_graph():
            for k in self.kept:
                t = k.original()
                if t is not None:
                    k.read(self.check, t)
        return None


class _On:
    """A check that watches ctx attributes, its Python hooks (which count and judge), and its device
    comparisons read without waiting."""

    def __init__(self, check, python):
        self.check, self.python = check, python
        self.late = _Late(check, python)


class _Late:
    """In warn mode on the native path, the CUDA comparisons of ctx attributes are kept as the native hooks
    keep theirs: each copied to the host without waiting, judged once it has run (at the end of a later
    pass that compares ctx attributes, when the findings are asked for, when the check stops), as of the
    end of its own pass. Nothing kept holds a tensor."""

    def __init__(self, check, python):
        self.check, self.python = check, python
        self.entries: list = []  # [flag on the host, event, kept, facts, node name, backward call, steps by its end]
        self.lock = threading.Lock()
        self.task = -1  # the pass whose end is asked to judge what has run

    def add(self, k: _Kept, t) -> bool:
        """Compare ``t`` with what ``k`` kept, on its device; False: not a comparison kept here."""
        import torch

        check, then = self.check, k.fp
        if check.native is None or check.mode != CheckMode.WARN or not t.is_cuda or isinstance(then, Skip) or \
                len(then) != 1 or isinstance(then[0], int) or then[0].device != t.device:
            return False
        now = fingerprint(t)
        if isinstance(now, Skip) or len(now) != 1 or isinstance(now[0], int):
            return False
        self.python.unpacked += 1
        self.python.checked += 1
        flag = torch.empty((), dtype=torch.bool, pin_memory=True)
        flag.copy_(then[0] != now[0], non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(t.device))
        node = engine.current_node()
        entry = [flag, event, k, (tuple(t.shape), t.dtype, t.device, t._version, t.data_ptr(), t.numel(),
                                  t.element_size(), t.requires_grad),
                 node.name() if node is not None else None, attribute.backward_call(), None]
        with self.lock:
            self.entries.append(entry)
            task, self.task = self.task, engine.graph_task()
        if task != self.task:
            engine.at_end_of_backward(self.ended)
        return True

    def ended(self) -> None:
        with self.lock:
            self.task = -1
            for e in self.entries:
                if e[6] is None:
                    e[6] = attribute.STEPS.count
        self.settle(False)

    def settle(self, wait: bool) -> None:
        with self.lock:
            ready = [e for e in self.entries if wait or e[1].query()]
            taken = {id(e) for e in ready}
            self.entries = [e for e in self.entries if id(e) not in taken]
        for flag, event, k, facts, name, where, upto in ready:
            event.synchronize()
            if bool(flag):
                original = k.original()
                t = original if original is not None else self.check._facts(*facts)  # as the native hooks give
                self.check.found(k, t, original, _Named(name), where, False, upto)


class _Named:
    """A backward node that was, as a finding names it."""

    def __init__(self, name: str | None):
        self._name = name

    def name(self) -> str | None:
        return self._name

