"""The check itself: a pair of saved-tensor hooks (``torch.autograd.graph.saved_tensors_hooks``)
that record each saved tensor's version and fingerprint at pack and compare them at unpack.

- Version moved: autograd's own error, word for word (``moved.py``): hooks switch autograd's own
  check off, so the hooks redo it.
- Version kept, contents changed: a ``Finding``.

The hooks compose with the program's own. A program pushing hooks of its own while the check is
on (activation checkpointing, ``save_on_cpu``, tensor parallelism's input resharding) gets them
wrapped: its pack runs inside the check's, and at unpack the check looks at the original tensor,
through a weak reference, when it is still alive (what its hooks return may be a copy or a
recomputation); a tensor that died meanwhile cannot have been written. Hooks already on the
stack when the check starts are wrapped the same way. torch.func transforms, which refuse any
saved-tensor hooks, run with the check's own hooks lifted for their duration (autograd's own
version check is in force there).

On CPU each comparison is made at unpack; on any other device the fingerprints stay on the
device and the comparisons of one backward pass are read back once, at its end (the engine's
final callback), so no tensor costs a synchronisation.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref

from ..errors import say
from ..vocabulary import CheckMode
from . import attribute, engine, moved
from .fingerprint import Skip, _Numpy, fingerprint
from .finding import Finding, SavedTensorChanged
from .render import line, message, summary


class _Saved:
    """What the check keeps of one saved tensor. ``ref``: the tensor unpack returns: the tensor
    itself, as autograd keeps it, except for an output of the node that saves it, where a detached
    alias (same storage, same version counter) is kept, as autograd keeps one: holding the output
    itself would hold its grad_fn, that node, in a cycle."""

    __slots__ = ("ref", "original", "version", "fp", "leaf", "output", "output_nr", "where", "steps", "ptr", "base",
                 "layout")


class Check:
    """A saved-tensor check in one mode; ``start()``/``stop()`` or a ``with`` block."""

    def __init__(self, mode: CheckMode):
        self.mode = mode
        self.findings: list[Finding] = []
        self.checked = 0
        self.skipped: dict[str, int] = {}
        self._distinct: set = set()
        self._pending: dict[int, list] = {}  # graph task -> device comparisons to read at its end
        self.active = False

    # --- turning on and off ---------------------------------------------------------------

    def start(self) -> "Check":
        """Push the check's hooks on this thread's stack (around the hooks on top of it, if any)."""
        if self.active:
            return self
        _Numpy.load()  # numpy and the fingerprint's weights now, not in the middle of a forward pass
        _patch()
        top = _top()
        layer = _Layer(self, *(top or (None, None)))
        if top:
            _pop()
        _push(layer.pack, layer.unpack)
        layer.replaced = bool(top)
        self._layer = layer
        attribute.STEPS.start()
        self.active = True
        _ACTIVE.append(self)
        return self

    def stop(self) -> None:
        """Take the hooks off again (a layer the program pushed hooks over is left in place as a pass-through)."""
        if not self.active:
            return
        self.active = False
        _ACTIVE.remove(self)
        attribute.STEPS.stop()
        layer = self._layer
        if _layer_of(_top()) is layer:
            _pop()
            if layer.replaced:  # the program's hooks it wrapped go back as they were
                _push(layer.inner_pack, layer.inner_unpack)
        for task in list(self._pending):
            self._flush(task)
        if not _ACTIVE:
            _unpatch()

    def __enter__(self) -> "Check":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        if self.mode == CheckMode.WARN:
            self.print_summary()

    # --- what it found ------------------------------------------------------------------------

    def print_summary(self, where: str = "") -> None:
        say(summary(len(self.findings), len(self._distinct), self.checked, self.skipped, where))

    def to_json(self) -> str:
        from .render import to_json

        return to_json(self.findings)

    # --- pack and unpack --------------------------------------------------------------------------

    def record(self, t, own: bool) -> _Saved:
        """What to keep of ``t`` at pack. ``own``: the check's own hooks keep the tensor (as autograd
        would); composed with the program's, only a weak reference to it."""
        s = _Saved()
        s.leaf = t.is_leaf
        s.version = t._version
        s.output, s.output_nr = False, 0
        if not s.leaf:
            nxt = engine.next_sequence_nr()
            s.output = nxt is None or t.grad_fn._sequence_nr() == nxt - 1
            s.output_nr = t.output_nr
        if own:
            s.ref = t.detach() if s.output else t
            s.original = _weak(t) if s.output else None
            s.base = s.layout = None
        else:  # composed with the program's hooks: what to look at in backward if the tensor has died
            s.ref, s.original = None, _weak(t)
            s.base = _weak(t._base) if t._base is not None else None
            s.layout = (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.device)
        s.fp = fingerprint(t)
        s.where = attribute.caller(3)
        s.steps = attribute.STEPS.count
        try:
            s.ptr = t.data_ptr()
        except Exception:  # noqa: BLE001 — a wrapper subclass has no pointer of its own
            s.ptr = None
        return s

    def verify(self, s: _Saved, t, original, returned: bool = False) -> None:
        """At unpack: ``t`` is the saved tensor as it is now (the one kept, or the original itself);
        ``original``: the tensor that was saved, if still alive (its grad_fn and identity).
        ``returned``: ``t`` is what the program's own hooks gave back (a copy, a recomputation),
        whose version says nothing."""
        if not self.active:
            return
        now = t._version
        if now != s.version and not returned:
            raise RuntimeError(moved.version_error(
                t, s.version, now, leaf=s.leaf, output=s.output, output_nr=s.output_nr, node=engine.current_node(),
                grad_fn=original.grad_fn if original is not None else None))
        if isinstance(s.fp, Skip):
            self._skip(s.fp)
            return
        fp = fingerprint(t)
        if isinstance(fp, Skip):  # readable when saved, not now (its storage was freed): not judged
            self._skip(fp)
            return
        self.checked += 1
        host = [a != b for a, b in zip(s.fp, fp) if isinstance(a, int)]
        device = [(a, b) for a, b in zip(s.fp, fp) if not isinstance(a, int)]
        if any(host) or len(s.fp) != len(fp):
            self.found(s, t, original, engine.current_node(), attribute.backward_call(), returned)
        elif device:
            self._defer(s, t, original, device, returned)

    def _skip(self, skip: Skip) -> None:
        self.skipped[skip.reason] = self.skipped.get(skip.reason, 0) + 1

    def _defer(self, s: _Saved, t, original, pairs, returned: bool) -> None:
        """A device comparison, read with the others of its backward pass once that pass has finished."""
        import torch

        changed = pairs[0][0] != pairs[0][1] if len(pairs) == 1 else torch.stack([a != b for a, b in pairs]).any()
        node = engine.current_node()
        task = engine.graph_task()
        entry = (changed, s, _Facts(t), _weak(original) if original is not None else None, node, returned)
        if task in self._pending:
            self._pending[task].append(entry)
        elif engine.at_end_of_backward(lambda: self._flush(task)):
            self._pending[task] = [entry]
        elif bool(changed):  # no backward pass to wait for (an unpack outside backward): read it now
            self.found(s, t, original, node, attribute.backward_call(), returned)

    def _flush(self, task: int) -> None:
        import torch

        entries = self._pending.pop(task, [])
        if not entries:
            return
        flags = torch.stack([e[0] for e in entries]).tolist()  # the one read of this backward pass
        where = attribute.backward_call() if any(flags) else None
        for changed, (_, s, facts, original, node, returned) in zip(flags, entries):
            if changed:
                self.found(s, facts, _alive(original), node, where, returned)

    def found(self, s: _Saved, t, original, node, backward, returned: bool = False) -> None:
        """Make the finding for ``s`` (``t``: the tensor now, or the facts kept of it); raise it or say it."""
        if attribute.written_by_its_saver(node, t):
            self._skip(Skip("written by the op that saved it (batch norm's running statistics)"))
            return
        name, owner, view = attribute.module_name(t, original)
        optimizer, holds = attribute.STEPS.since(s.steps, t, original)
        try:
            moved_storage = s.ptr is not None and t.data_ptr() != s.ptr
        except Exception:  # noqa: BLE001 — no pointer of its own
            moved_storage = False
        program, site = s.where
        f = Finding(shape=tuple(t.shape), dtype=str(t.dtype).replace("torch.", ""), device=str(t.device),
                    version=int(t._version), name=name, owner=owner, view=view,
                    node=node.name() if node is not None else None,
                    forward=attribute.frame(program), site=attribute.frame(site) if site != program else None,
                    backward=attribute.frame(backward),
                    writers=attribute.writers(holds, moved_storage, name is not None or s.leaf, returned),
                    optimizer=optimizer, rank=attribute.rank())
        self.findings.append(f)
        first = f.key() not in self._distinct
        self._distinct.add(f.key())
        if self.mode == CheckMode.RAISE:
            raise SavedTensorChanged(f, message(f))
        if first:
            say(line(f))


class _Facts:
    """What a finding needs of a tensor read at the end of backward (the tensor itself may be gone)."""

    def __init__(self, t):
        self.shape, self.dtype, self.device, self._version = t.shape, t.dtype, t.device, t._version
        self.requires_grad = t.requires_grad
        try:
            self._ptr, self._numel, self._size = t.data_ptr(), t.numel(), t.element_size()
        except Exception:  # noqa: BLE001
            self._ptr, self._numel, self._size = None, 0, 0

    def data_ptr(self) -> int:
        if self._ptr is None:
            raise RuntimeError("no data pointer")
        return self._ptr

    def numel(self) -> int:
        return self._numel

    def dim(self) -> int:
        return len(self.shape)

    def element_size(self) -> int:
        return self._size


def _same_layout(t, layout) -> bool:
    try:
        return (tuple(t.shape), t.stride(), t.dtype, t.device) == (layout[0], layout[1], layout[3], layout[4])
    except Exception:  # noqa: BLE001 — not a strided tensor
        return False


def _alive(ref):
    return ref() if ref is not None else None


def _weak(t):
    try:
        return weakref.ref(t)
    except TypeError:
        return None


class _Layer:
    """One push of the check's hooks: its own (``inner_pack`` None) or around the program's."""

    def __init__(self, check: Check, inner_pack, inner_unpack):
        self.check, self.inner_pack, self.inner_unpack = check, inner_pack, inner_unpack
        self.replaced = False

    def pack(self, t):
        c = self.check
        if self.inner_pack is None:
            if not c.active:
                return _Passed(t if t.is_leaf else t.detach())
            return c.record(t, own=True)
        s = c.record(t, own=False) if c.active else None
        return _Composed(s, self.inner_pack(t))

    def unpack(self, packed):
        c = self.check
        if isinstance(packed, _Passed):
            return packed.t
        if isinstance(packed, _Composed):
            t = self.inner_unpack(packed.inner)
            s = packed.saved
            if s is None:
                return t
            original, base = _alive(s.original), _alive(s.base)
            if original is not None:  # alive: the tensor itself is what to look at
                c.verify(s, original, original)
            elif base is not None:  # a view that died, of a base that lives (a transposed weight): the same view
                shape, stride, offset = s.layout[:3]
                c.verify(s, base.detach().as_strided(shape, stride, offset), None)
            elif _same_layout(t, s.layout):  # gone: what the program's hooks returned must be what was saved
                c.verify(s, t, None, returned=True)
            else:
                c._skip(Skip("returned by the program's own hooks in another layout"))
            return t
        c.verify(packed, packed.ref, _alive(packed.original) if packed.output else packed.ref)
        return packed.ref


class _Passed:
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


def _layer_of(hooks):
    pack = hooks[0] if hooks else None
    owner = getattr(pack, "__self__", None)
    return owner if isinstance(owner, _Layer) else None


_ACTIVE: list[Check] = []  # checks on, any thread
_PATCHED: dict = {}  # what the check replaced in torch.autograd.graph, to put back
_PATCH_LOCK = threading.Lock()


def _composing_enter(self):
    """``saved_tensors_hooks.__enter__`` while a check is on: a program's hooks pushed over the check's
    are wrapped by it (checkpoint's recomputation hooks are not: what they save is used at once)."""
    layer = _layer_of(_top())
    if layer is None or not layer.check.active or type(self).__name__ == "_recomputation_hook":
        _push(self.pack_hook, self.unpack_hook)
        return
    inner = _Layer(layer.check, self.pack_hook, self.unpack_hook)
    _push(inner.pack, inner.unpack)


def _composing_exit(self, *args) -> None:
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


def _patch() -> None:
    import torch.autograd.graph as graph

    with _PATCH_LOCK:
        if _PATCHED:
            return
        _PATCHED["enter"] = graph.saved_tensors_hooks.__enter__
        _PATCHED["exit"] = graph.saved_tensors_hooks.__exit__
        _PATCHED["disable"] = graph.disable_saved_tensors_hooks
        graph.saved_tensors_hooks.__enter__ = _composing_enter
        graph.saved_tensors_hooks.__exit__ = _composing_exit
        graph.disable_saved_tensors_hooks = _lifting_disable


def _unpatch() -> None:
    import torch.autograd.graph as graph

    with _PATCH_LOCK:
        if not _PATCHED:
            return
        graph.saved_tensors_hooks.__enter__ = _PATCHED.pop("enter")
        graph.saved_tensors_hooks.__exit__ = _PATCHED.pop("exit")
        graph.disable_saved_tensors_hooks = _PATCHED.pop("disable")


def patched() -> bool:
    """Whether the check has anything of torch replaced now (nothing, while no check is on)."""
    return bool(_PATCHED)


_PROCESS: Check | None = None  # the check install() and run turned on, for the whole process


def enable(mode: CheckMode) -> Check:
    """Turn the check on for the rest of the process (on this thread, the one that imports torch); a
    second call returns the check already on (in its mode)."""
    global _PROCESS
    import atexit

    if _PROCESS is not None and _PROCESS.active:
        return _PROCESS
    _PROCESS = Check(mode).start()
    if mode == CheckMode.WARN:
        atexit.register(_at_exit, _PROCESS)
    return _PROCESS


def _at_exit(check: Check) -> None:
    where = f" in pid {os.getpid()}"
    r = attribute.rank()
    check.print_summary(where + (f" (rank {r})" if r is not None else ""))


def disable() -> None:
    """Turn off the whole-process check (``uninstall()``)."""
    global _PROCESS
    if _PROCESS is not None:
        _PROCESS.stop()
        _PROCESS = None
