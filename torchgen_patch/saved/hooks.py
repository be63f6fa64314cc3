"""The check itself: a pair of saved-tensor hooks (``torch.autograd.graph.saved_tensors_hooks``)
that record each saved tensor's version and fingerprint at pack and compare them at unpack.

- Version moved: autograd's own error, word for word (``moved.py``): hooks switch autograd's own
  check off, so the hooks redo it.
- Version kept, contents changed: a ``Finding``.

Two implementations of the same hooks, one suite of tests run on both (``native.py``):

- **native** (the default wherever a C++ compiler is there; the library is built once and cached
  like the kernels, loaded by the same trust rules): pack and unpack are C++, the fingerprint is read
  in place on CPU (vectorized, on torch's intra-op threads) and on CUDA by a kernel launched from C++,
  once a saved tensor where it is saved and once a backward node where it uses them; the program's
  frame is kept as a code object and an instruction offset, made a line only when a finding needs it.
- **python** (``_PythonHooks`` here): the same decisions in Python, for a machine where nothing can be
  compiled and for tensors the native hooks leave to it (tensor subclasses, devices other than CPU
  and CUDA).

Both call back into the ``Check`` for what is rare: a moved version, a changed tensor, a tensor not
judged. The hooks compose with the program's own. A program pushing hooks of its own while the
check is on (activation checkpointing, ``save_on_cpu``, tensor parallelism's input resharding) gets
them wrapped: its pack runs inside the check's, and at unpack the check looks at what backward uses.
Where its hooks give back the memory that was saved (kept by reference), the original tensor (through
a weak reference) or its base is checked as without hooks; where they give back a copy (offloaded and
brought back, compressed, recomputed), a write to the original since is harmless, and the copy is
compared with what was saved (``compose.py``): other bits are a finding only where the very bits are
the hooks' contract (activation checkpointing's recomputation), else not judged (lossy hooks, bf16 or
fp8 activation compression, give a correct program such contents).
Hooks already on the stack when the check starts are wrapped the same way. torch.func transforms,
which refuse any saved-tensor hooks, run with the check's own hooks lifted for their duration
(autograd's own version check is in force there).

On CPU each comparison is made at unpack; on any other device the fingerprints stay on the device
and the comparisons of one backward pass are read back once, at its end (the engine's final
callback), so no tensor costs a synchronisation. What waits for that read keeps no tensor alive.
"""

from __future__ import annotations

from typing import Any

from ..errors import say
from ..vocabulary import CheckMode
from . import attribute, ctxattr, engine, fleet, moved, native, untraced
from .compose import ACTIVE, QUIETED, Passed, alive, patch_graph, quiet_unpacks, unpatch_graph, weak_ref
from .finding import Finding, SavedTensorChanged
from .fingerprint import IN_BACKWARD, Skip, fingerprint, plain_types
from .render import line, message, summary
from .sample import Sampler

SAVER = "written by the op that saved it (batch norm's running statistics)"
LOSSY = "returned by the program's own hooks as a copy with other contents than were saved (lossy compression)"


class Check:
    """A saved-tensor check in one mode; ``start()``/``stop()`` or a ``with`` block. ``path``:
    ``"native"``, ``"python"``, or None for the native hooks where they are loaded (``native.py``);
    ``every``: each step checked with probability 1/every (``sample.py``)."""

    def __init__(self, mode: CheckMode, path: str | None = None, every: int = 1):
        untraced.ensure()  # its hooks and callbacks run as they are under torch.compile
        self.mode = mode
        self.sampler = Sampler(self, every)
        self._findings: list[Finding] = []
        self._distinct: set = set()
        self._python = _PythonHooks(self)
        self._native = native.hooks(self, self._python, path)
        self.active = False
        self._settles_at_exit = False

    @property
    def findings(self) -> list[Finding]:
        """What it found (in warn mode, the device comparisons of passes that ended are waited for first)."""
        if self._native is not None:
            self._native.settle(True)
        ctxattr.settle(self)
        return self._findings

    @property
    def path(self) -> str:
        """Which implementation runs: ``native`` or ``python``."""
        return "native" if self._native is not None else "python"

    @property
    def native(self):
        """The native hooks this check runs (None on the Python path), for benchmarks and diagnostics."""
        return self._native

    @property
    def checked(self) -> int:
        """Saved tensors compared at use (a tensor a node writes itself, or lossy hooks gave back, is not)."""
        return (self._python.checked + (self._native.checked if self._native is not None else 0)
                - self._python.judged_out)

    @property
    def unpacked(self) -> int:
        """Saved tensors used by backward while the check was on (checked or not)."""
        return self._python.unpacked + (self._native.unpacked if self._native is not None else 0)

    @property
    def skipped(self) -> dict[str, int]:
        out = dict(self._python.skipped)
        if self._native is not None:
            for reason, n in native.skip_counts(self._native).items():
                out[reason] = out.get(reason, 0) + n
        return out

    # --- turning on and off ---------------------------------------------------------------

    def start(self) -> "Check":
        """Push the check's hooks on this thread's stack (around the hooks on top of it, if any)."""
        if self.active:
            return self
        self._python.prepare()  # numpy and the key now, not in the middle of a forward pass
        patch_graph()
        own = self._native if self._native is not None else self._python
        self.sampler.start(own)  # on this thread's stack now, or from the first step drawn
        attribute.STEPS.start()
        if self.mode == CheckMode.WARN and self._native is not None and not self._settles_at_exit:
            import atexit
            import weakref

            atexit.register(native.settle_at_exit, weakref.ref(self))  # a last pass's findings, said before exit
            self._settles_at_exit = True
        self.active = True
        own.active = True
        self._python.active = True
        ACTIVE.append(self)
        return self

    def stop(self) -> None:
        """Take the hooks off again (a layer the program pushed hooks over is left in place as a pass-through)."""
        if not self.active:
            return
        self.active = False
        ACTIVE.remove(self)
        attribute.STEPS.stop()
        self.sampler.stop()
        ctxattr.stop(self)
        try:
            for hooks in (self._native, self._python):
                if hooks is not None:
                    for task in hooks.tasks():
                        hooks.flush(task)
            if self._native is not None:
                self._native.settle(True)
        finally:
            for hooks in (self._native, self._python):
                if hooks is not None:
                    hooks.active = False
            if not ACTIVE:
                unpatch_graph()

    def __enter__(self) -> "Check":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        if self.mode == CheckMode.WARN:
            self.print_summary()

    # --- what it found ------------------------------------------------------------------------

    def print_summary(self, where: str = "") -> None:
        say(summary(len(self.findings), len(self._distinct), self.checked, self.skipped, where, self.sampler.counts()))

    def to_json(self) -> str:
        from .render import to_json

        return to_json(self.findings)

    # --- the implementations' callbacks (what is rare) --------------------------------------------

    def _moved(self, s, t, now: int, original) -> None:
        """``t``'s version moved from ``s.version`` to ``now``: autograd's own error."""
        raise RuntimeError(moved.version_error(
            t, s.version, now, leaf=s.leaf, output=s.output, output_nr=s.output_nr, node=engine.current_node(),
            grad_fn=original.grad_fn if original is not None else None))

    def _changed(self, s, t, original, node, returned: bool = False) -> None:
        """At unpack (the native hooks): ``t``'s contents differ from what was saved."""
        if attribute.written_by_its_saver(node, t, quiet_unpacks):
            self._python.not_judged(SAVER)
            return
        self.found(s, t, original, node, attribute.backward_call(), returned)

    def _same_bits(self, t, saved: int) -> bool:
        """Whether ``t`` (a layout the native code does not read) still has the fingerprint ``saved``."""
        parts = fingerprint(t)
        return not isinstance(parts, Skip) and len(parts) == 1 and int(parts[0]) & ((1 << 64) - 1) == saved

    def _changed_late(self, s, facts, original, node, returned: bool = False, where=..., upto=None) -> None:
        """At the end of backward, or later: a device comparison said a tensor changed (``facts``: what
        was kept of it; ``original``: the tensor itself, if still alive; ``where`` and ``upto``: the backward
        call and the optimizer step count at the end of its pass, where it is judged later)."""
        self.found(s, facts, original, node, attribute.backward_call() if where is ... else where, returned, upto)

    def _at_end_of_backward(self, task: int) -> bool:
        """The native hooks' comparisons of ``task`` are read when it ends; False: no backward pass
        runs (read them now). In warn mode the pass does not wait for the device: its comparisons are
        judged once they have run (at a later pass's end, or when the findings are asked for), as of
        its end (its backward call, the optimizer steps taken by then)."""
        hooks = self._native
        attribute.LAUNCHES.ensure()  # a Triton imported since the step began (once a pass, where a device runs)

        def read() -> None:
            if self.mode == CheckMode.WARN:
                hooks.flush(task, (attribute.backward_call(), attribute.STEPS.count))
            else:
                hooks.flush(task)

        if engine.at_end_of_backward(read):
            return True
        hooks.flush(task)
        return False

    def _saver_statistics(self, node) -> tuple[int, ...]:
        return attribute.saver_statistics(node, quiet_unpacks)

    def _skip_layout(self, layout: str) -> None:
        self._python.skip(f"{layout.replace('torch.', '')} tensors")

    def _skip_saver(self) -> None:
        self._python.not_judged(SAVER)

    def _facts(self, shape, dtype, device, version, ptr, numel, element, requires_grad, storage=0):
        return _Facts.of(shape, dtype, device, version, ptr, numel, element, requires_grad, storage)

    def found(self, s, t, original, node, backward, returned: bool = False, upto: int | None = None) -> None:
        """Make the finding for ``s`` (``t``: the tensor now, or the facts kept of it); raise it or say it."""
        f = attribute.finding(s, t, original, node, backward, returned, upto)
        self._findings.append(f)
        fleet.write(self, f)  # a line in the fleet's folder (--findings), where one is set
        first = f.key() not in self._distinct
        self._distinct.add(f.key())
        if self.mode == CheckMode.RAISE:
            raise SavedTensorChanged(f, message(f))
        if first:
            say(line(f))


class _Saved:
    """What the Python hooks keep of one saved tensor. ``ref``: the tensor unpack returns: the tensor
    itself, as autograd keeps it, except for an output of the node that saves it, where a detached
    alias (same storage, same version counter) is kept, as autograd keeps one: holding the output
    itself would hold its grad_fn, that node, in a cycle."""

    __slots__ = ("ref", "original", "version", "fp", "leaf", "output", "output_nr", "where", "steps", "ptr", "base",
                 "layout")
    ref: Any  # the tensor, a detached alias of it, or None (composed with the program's hooks)
    original: Any  # a weak reference to the tensor, or None
    version: int
    fp: Any  # fingerprint()'s: its figures, or a Skip
    leaf: bool
    output: bool
    output_nr: int
    where: Any  # attribute.caller()'s
    steps: int
    ptr: int | None
    base: Any  # a weak reference to the tensor's base, or None
    layout: tuple | None


class _Kept:
    """What a finding needs of a save, kept until the end of its backward pass without the tensor."""

    __slots__ = ("version", "leaf", "output", "output_nr", "where", "steps", "ptr")

    def __init__(self, s: _Saved):
        for name in self.__slots__:
            setattr(self, name, getattr(s, name))


class _PythonHooks:
    """The check's hooks in Python (see the module's docstring)."""

    def __init__(self, check: Check):
        self.check = check
        self.checked = 0
        self.unpacked = 0
        self.judged_out = 0  # compared, then not judged (a node's own write, lossy hooks): out of ``checked``
        self.skipped: dict[str, int] = {}
        self.active = False
        self._pending: dict[int, list] = {}  # graph task -> device comparisons to read at its end
        self._plain: frozenset = frozenset()  # the tensor types the native hooks read (prepare())

    def prepare(self) -> None:
        from .fingerprint import Numpy, key

        key()
        Numpy.load()
        self._plain = frozenset(plain_types())

    def fingerprint(self, t):
        """``fingerprint(t)``; of a plain CPU tensor, the native hooks' where loaded (the same number, faster)."""
        native_ = self.check._native
        if native_ is not None and type(t) in self._plain and t.is_cpu:
            value = native_.fingerprint(t)
            if value is not None:
                return (value,)
        return fingerprint(t)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def not_judged(self, reason: str) -> None:
        """A tensor compared (counted in ``checked``) that is not judged after all."""
        self.judged_out += 1
        self.skip(reason)

    # the own layer's hooks

    def pack(self, t):
        return self.record(t, own=True)

    def passed(self, t):
        return Passed(t if t.is_leaf else t.detach())

    def unpack(self, packed):
        if isinstance(packed, Passed):
            return packed.t
        if self.active and not QUIETED:
            self.verify(packed, packed.ref, alive(packed.original) if packed.output else packed.ref)
        return packed.ref

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
            s.original = weak_ref(t) if s.output else None
            s.base = s.layout = None
        else:  # composed with the program's hooks: what to look at in backward if the tensor has died
            s.ref, s.original = None, weak_ref(t)
            s.base = weak_ref(t._base) if t._base is not None else None
            s.layout = (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.device)
        if engine.saving_in_backward():  # used in this pass only: its version is checked, its contents not read
            s.fp, s.where, s.steps, s.ptr = Skip(IN_BACKWARD), (None, None, None), attribute.STEPS.count, None
            return s
        s.fp = self.fingerprint(t)
        s.where = attribute.caller(3)
        s.steps = attribute.STEPS.count
        try:
            s.ptr = t.data_ptr()
        except Exception:  # noqa: BLE001 — a wrapper subclass has no pointer of its own
            s.ptr = None
        return s

    def verify(self, s: _Saved, t, original, returned: bool = False, judged: bool = False) -> None:
        """At unpack: ``t`` is the saved tensor as it is now (the one kept, or the original itself);
        ``original``: the tensor that was saved, if still alive (its grad_fn and identity).
        ``returned``: ``t`` is what the program's own hooks gave back (a copy, a recomputation),
        whose version says nothing: other contents there are not judged, unless ``judged`` (hooks
        whose contract is to give back what was saved: activation checkpointing's recomputation)."""
        self.unpacked += 1
        now = t._version
        if now != s.version and not returned:
            self.check._moved(s, t, now, original)
        if isinstance(s.fp, Skip):
            self.skip(s.fp.reason)
            return
        fp = self.fingerprint(t)
        if isinstance(fp, Skip):  # readable when saved, not now (its storage was freed): not judged
            self.skip(fp.reason)
            return
        self.checked += 1
        host = [a != b for a, b in zip(s.fp, fp, strict=False) if isinstance(a, int) and isinstance(b, int)]
        device = [(a, b) for a, b in zip(s.fp, fp, strict=False) if not isinstance(a, int) and not isinstance(b, int)]
        lossy = returned and not judged
        # moved between devices
        elsewhere = any(isinstance(a, int) != isinstance(b, int) for a, b in zip(s.fp, fp, strict=False))
        if any(host) or len(s.fp) != len(fp) or elsewhere:
            if lossy:
                self.not_judged(LOSSY)
                return
            self.check._changed(s, t, original, engine.current_node(), returned)
        elif device:
            self._defer(s, t, original, device, returned, lossy)

    def _defer(self, s: _Saved, t, original, pairs, returned: bool, lossy: bool) -> None:
        """A device comparison, read with the others of its backward pass once that pass has finished."""
        import torch

        changed = pairs[0][0] != pairs[0][1] if len(pairs) == 1 else torch.stack([a != b for a, b in pairs]).any()
        node = engine.current_node()
        saver = attribute.written_by_its_saver(node, t, quiet_unpacks)  # decided while the node holds what it saved
        task = engine.graph_task()
        entry = (changed, _Kept(s), _Facts(t), weak_ref(original) if original is not None else None, node, returned,
                 SAVER if saver else LOSSY if lossy else None)
        if task in self._pending:
            self._pending[task].append(entry)
            return
        for earlier in [k for k in self._pending if k < task]:  # a pass that raised (its end never came), or
            self.flush(earlier)  # one enclosing this one (a reentrant backward): read now
        self._pending[task] = [entry]
        attribute.LAUNCHES.ensure()  # as the native hooks' once a pass
        if not engine.at_end_of_backward(lambda: self.flush(task)):  # no backward pass to wait for: read it now
            self.flush(task)

    def tasks(self) -> list[int]:
        return list(self._pending)

    def flush(self, task: int) -> None:
        import torch

        entries = self._pending.pop(task, [])
        if not entries:
            return
        flags = torch.stack([e[0] for e in entries]).tolist()  # the one read of this backward pass
        where = attribute.backward_call() if any(flags) else None
        for changed, (_, s, facts, original, node, returned, not_judged) in zip(flags, entries, strict=True):
            if not changed:
                continue
            if not_judged:
                self.not_judged(not_judged)
            else:
                self.check._changed_late(s, facts, alive(original), node, returned, where)


class _Facts:
    """What a finding needs of a tensor read at the end of backward (the tensor itself may be gone);
    ``storage_id``: its storage's identity (``writer.holds``), or None."""

    storage_id = None

    def __init__(self, t=None):
        if t is None:
            return
        self.shape, self.dtype, self.device, self._version = t.shape, t.dtype, t.device, t._version
        self.requires_grad = t.requires_grad
        try:
            self._ptr, self._numel, self._size = t.data_ptr(), t.numel(), t.element_size()
            self.storage_id = t.untyped_storage()._cdata
        except Exception:  # noqa: BLE001 — a wrapper subclass has no pointer of its own
            self._ptr, self._numel, self._size = None, 0, 0

    @classmethod
    def of(cls, shape, dtype, device, version, ptr, numel, element, requires_grad, storage=0) -> "_Facts":
        f = cls()
        f.shape, f.dtype, f.device, f._version = tuple(shape), dtype, device, version
        f.requires_grad, f._ptr, f._numel, f._size = requires_grad, ptr or None, numel, element
        f.storage_id = storage or None
        return f

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
