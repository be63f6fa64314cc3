"""How the check's hooks compose with the program's own saved-tensor hooks: each push of the check's
hooks is a layer on this thread's stack; a program's hooks pushed over it (``saved_tensors_hooks``,
patched while a check is on) are wrapped by it, and torch.func's ``disable_saved_tensors_hooks`` lifts
the check's own hooks for its duration. See ``hooks.py``'s docstring for what is judged where."""

from __future__ import annotations

import contextlib
import threading
import weakref

from . import engine, native


@contextlib.contextmanager
def quiet_unpacks():
    """While the check reads what a node saved (batch norm's statistics), its own unpack hooks return
    tensors unchecked."""
    QUIETED.append(True)
    native.quiet(True)
    try:
        yield
    finally:
        native.quiet(False)
        QUIETED.pop()


QUIETED: list = []


def _same_layout(t, layout) -> bool:
    try:
        return (tuple(t.shape), t.stride(), t.dtype, t.device) == (layout[0], layout[1], layout[3], layout[4])
    except Exception:  # noqa: BLE001 — not a strided tensor
        return False


def _shares(t, saved) -> bool:
    """Whether ``t``, what the program's hooks gave back, is the memory that was saved (``saved``, alive:
    the tensor itself or its base): hooks that kept it by reference, or an alias of it. False: a copy
    (offloading to CPU and back, compression, a recomputation). Where a storage cannot be read (a wrapper
    subclass), the same memory is assumed, as a tensor that lives is what to look at."""
    if t is saved:
        return True
    try:
        return t.device == saved.device and t.untyped_storage().data_ptr() == saved.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 — a wrapper subclass has no storage of its own
        return True


def _as_saved(t, layout):
    """``t`` in the layout that was saved, for its fingerprint to be compared: itself, or a copy of it into
    that layout where the hooks gave it back in another (``save_on_cpu`` keeps a transposed weight as a
    contiguous copy); None where it cannot be (another shape, dtype or device, an overlapping layout)."""
    if _same_layout(t, layout):
        return t
    shape, stride, _, dtype, device = layout
    try:
        if (tuple(t.shape), t.dtype, t.device) != (shape, dtype, device):
            return None
        import torch

        out = torch.empty_strided(shape, stride, dtype=dtype, device=device)
        out.copy_(t)
    except Exception:  # noqa: BLE001 — not a strided tensor, or an overlapping layout copy_ refuses
        return None
    return out


def alive(ref):
    return ref() if ref is not None else None


def weak_ref(t):
    try:
        return weakref.ref(t)
    except TypeError:
        return None


class _Layer:
    """One push of the check's hooks: its own (``inner_pack`` None: the implementation's hooks) or
    around the program's (the Python implementation's record and verify)."""

    def __init__(self, check, own, inner_pack, inner_unpack, recomputes: bool = False):
        self.check, self.inner_pack, self.inner_unpack = check, inner_pack, inner_unpack
        self.replaced = False
        self.recomputes = recomputes  # activation checkpointing's: what they return is meant to be what was saved
        self.own = own
        if inner_pack is None:  # autograd calls the implementation's own hooks, nothing in between
            self.pack, self.unpack = own.pack, own.unpack  # type: ignore[method-assign]  # the implementation's own
            _OWN[id(own)] = self

    def pack(self, t):
        c = self.check
        s = c._python.record(t, own=False) if c.active else None
        return _Composed(s, self.inner_pack(t))

    def unpack(self, packed):
        c = self.check
        if not isinstance(packed, _Composed):  # saved before the program's hooks were wrapped
            return c._python.unpack(packed)
        t = self.inner_unpack(packed.inner)
        s = packed.saved
        if s is None or not c.active or QUIETED:
            return t
        hooks = c._python
        original, base = alive(s.original), alive(s.base)
        if original is not None and _shares(t, original):  # the hooks gave back what was saved: look at it
            hooks.verify(s, original, original)
        elif original is None and base is not None and _shares(t, base):  # a view that died, of a base that
            shape, stride, offset = s.layout[:3]  # lives (a transposed weight): the same view
            hooks.verify(s, base.detach().as_strided(shape, stride, offset), None)
        else:  # a copy: what backward uses is it, not the original (a write to that since is harmless)
            self._compare_copy(s, t, original)
        return t

    def _compare_copy(self, s, t, original) -> None:
        """What the program's hooks gave back is a copy (offloaded and brought back, decompressed,
        recomputed): compared with what was saved; other contents are a finding only where giving back
        the very bits is the hooks' contract (``recomputes``), else not judged (lossy compression)."""
        hooks = self.check._python
        same = _as_saved(t, s.layout)
        if same is None:
            hooks.unpacked += 1
            hooks.skip("returned by the program's own hooks in another layout")
            return
        hooks.verify(s, same, original, returned=True, judged=self.recomputes or _copy_of_now(same, original))


def _copy_of_now(copy, original) -> bool:
    """Whether ``copy`` holds the live original's bits as they are now: a copy the hooks made at unpack
    (``t.clone()`` there), which a write since the save reaches, so other contents than were saved are a
    finding; a copy made at pack, or a lossy one, differs from an original written since, or is not judged."""
    if original is None:
        return False
    try:
        o = original.detach()
        return (o.shape, o.dtype, o.device) == (copy.shape, copy.dtype, copy.device) and bool(
            (o == copy).all() if not o.is_floating_point() else (o.eq(copy) | (o.isnan() & copy.isnan())).all())
    except Exception:  # noqa: BLE001 — a subclass or layout that cannot be compared: not judged, as before
        return False


class Passed:
    __slots__ = ("t",)

    def __init__(self, t):
        self.t = t


class _Composed:
    __slots__ = ("saved", "inner")

    def __init__(self, saved, inner):
        self.saved, self.inner = saved, inner


_TLS = threading.local()


def _mirror() -> list:
    """This thread's stack as the check saw it pushed, for a torch that cannot say what is on top
    (before 2.8): the check's own pushes and those made through ``saved_tensors_hooks`` while it is on."""
    return _TLS.__dict__.setdefault("stack", [])


def _top():
    """(pack, unpack) on top of this thread's stack of saved-tensor hooks, or None."""
    top = engine.top()
    if top is ...:
        mirror = _mirror()
        return mirror[-1] if mirror else None
    return top


def _push(pack, unpack) -> None:
    engine.push(pack, unpack)
    if engine.top() is ...:
        _mirror().append((pack, unpack))


def _pop() -> None:
    engine.pop()
    mirror = _mirror()
    if mirror and engine.top() is ...:
        mirror.pop()


def lay(check, own) -> _Layer:
    """Push ``check``'s hooks (``own``: the implementation's) on this thread's stack, around the hooks on
    top of it, if any (the program's, which it then wraps); returns the layer."""
    top = _top()
    layer = _Layer(check, own, *(top or (None, None)))
    if top:
        _pop()
    _push(layer.pack, layer.unpack)
    layer.replaced = bool(top)
    return layer


def layable() -> bool:
    """Whether a check's hooks can be laid on this thread's stack between steps: nothing of a check is on top
    (nothing at all, or the program's own hooks, which the layer then wraps as ``lay`` does)."""
    return _layer_of(_top()) is None


def lift(layer: _Layer) -> bool:
    """Take ``layer`` off this thread's stack between steps, where it is on top (the program's hooks it
    wrapped, if any, go back in its place); False, and nothing done, where hooks the program pushed over
    it are there (they keep their place, wrapped by it, until they come off)."""
    if _layer_of(_top()) is not layer:
        return False
    remove(layer)
    return True


def remove(layer: _Layer) -> None:
    """Take ``layer`` off this thread's stack wherever it is: the hooks the program pushed over it are put
    back as they were (no pass-through stays behind: any hooks on the stack switch autograd's own version
    check off), and the program's hooks it wrapped, if any, go back in its place."""
    above = []
    while _top() is not None and _layer_of(_top()) is not layer:
        above.append(_top())
        _pop()
    if _top() is not None:
        _pop()
        if layer.replaced:
            _push(layer.inner_pack, layer.inner_unpack)
    for hooks in reversed(above):
        _push(*hooks)
    _OWN.pop(id(layer.own), None)


def _layer_of(hooks):
    """The check's layer whose hooks these are (None: the program's)."""
    if not hooks:
        return None
    pack = hooks[0]
    owner = getattr(pack, "__self__", None)
    if isinstance(owner, _Layer):
        return owner
    layer = _OWN.get(id(owner))
    return layer if layer is not None and pack == layer.pack else None


_OWN: dict = {}  # id of an implementation whose own hooks are pushed -> its layer


ACTIVE: list = []  # the checks on (hooks.Check), any thread
_PATCHED: dict = {}  # what the check replaced in torch.autograd.graph, to put back
_PATCH_LOCK = threading.Lock()


def _composing_enter(self):
    """``saved_tensors_hooks.__enter__`` while a check is on: a program's hooks pushed over the check's
    are wrapped by it (checkpoint's recomputation hooks are not: what they save is used at once)."""
    layer = _layer_of(_top())
    if layer is None or not layer.check.active or type(self).__name__ == "_recomputation_hook":
        _push(self.pack_hook, self.unpack_hook)
        return
    inner = _Layer(layer.check, None, self.pack_hook, self.unpack_hook, type(self).__name__ == "_checkpoint_hook")
    _push(inner.pack, inner.unpack)


def _composing_exit(self, *args) -> None:
    """The program's block ends: its hooks come off. Where a check started inside the block wrapped them,
    the check's layer stays, unwrapped."""
    layer = _layer_of(_top())
    if layer is not None and layer.replaced and layer.inner_pack == self.pack_hook and layer.check.active:
        _pop()
        _OWN.pop(id(layer.own), None)
        own = _Layer(layer.check, layer.own, None, None)
        layer.check.sampler.layer = own
        _push(own.pack, own.unpack)
        return
    _pop()


@contextlib.contextmanager
def _lifting_disable(error_message: str):
    """``disable_saved_tensors_hooks`` (torch.func's transforms refuse saved-tensor hooks) while a check
    is on: the check's own hooks are lifted for the duration, as if it were off there."""
    lifted = []
    while True:
        layer = _layer_of(_top())
        if layer is None or layer.inner_pack is not None:
            break
        _pop()
        lifted.append(layer)
    if _top():  # the program's own hooks are there too: refused as without the check
        for layer in reversed(lifted):
            _push(layer.pack, layer.unpack)
        lifted = []
    try:
        with _PATCHED["disable"](error_message):
            yield
    finally:
        for layer in reversed(lifted):
            _push(layer.pack, layer.unpack)


def patch_graph() -> None:
    import torch.autograd.graph as graph

    with _PATCH_LOCK:
        if _PATCHED:
            return
        _PATCHED["enter"] = graph.saved_tensors_hooks.__enter__
        _PATCHED["exit"] = graph.saved_tensors_hooks.__exit__
        _PATCHED["disable"] = graph.disable_saved_tensors_hooks
        graph.saved_tensors_hooks.__enter__ = _composing_enter  # type: ignore[method-assign]  # put back by unpatch_graph
        graph.saved_tensors_hooks.__exit__ = _composing_exit  # type: ignore[method-assign]  # put back by unpatch_graph
        graph.disable_saved_tensors_hooks = _lifting_disable


def unpatch_graph() -> None:
    import torch.autograd.graph as graph

    with _PATCH_LOCK:
        if not _PATCHED:
            return
        graph.saved_tensors_hooks.__enter__ = _PATCHED.pop("enter")  # type: ignore[method-assign]  # torch's own
        graph.saved_tensors_hooks.__exit__ = _PATCHED.pop("exit")  # type: ignore[method-assign]  # torch's own
        graph.disable_saved_tensors_hooks = _PATCHED.pop("disable")


def patched() -> bool:
    """Whether the check has anything of torch replaced now (nothing, while no check is on)."""
    return bool(_PATCHED)
