"""Triton kernels launched while a checked step runs, so that a finding can name one as the writer of a
saved tensor (``attribute.finding``): a kernel launched between save and use, outside a backward pass,
with a pointer argument inside the tensor's storage.

Triton calls a launch hook before each launch when one is set, with the launch's metadata (a ``LazyDict``
whose data holds the kernel's ``name``): ``triton.knobs.runtime.launch_enter_hook`` in recent Triton (a
``HookChain`` from 3.5, which the hook is added to and removed from; a plain attribute before it) or
``triton.compiler.CompiledKernel.launch_enter_hook`` in older ones (whichever the Triton imported has,
knobs first). Where the hook is an
attribute, the check's hook is set around the program's own, which it calls after its own, and the
program's is put back when the check's is removed (a hook the program set meanwhile over the check's is
left in place; the check's then only calls the one it wrapped). The hook is set only while a checked
step's window is open (``sample.Sampler``: every step, or the steps drawn) and only where Triton is
imported already (``sys.modules``: the check imports no Triton); a Triton imported later gets it at the
next step drawn, at the next custom Function's call while the window is open (``ctxattr``), or at the
first device tensor a backward pass compares (``hooks``).

Each launch is kept compactly, in the last ``KEEP``: the tick of the clock it took (``attribute.STEPS``,
the clock the saves record, so a launch is known to come after a save), the kernel's name, the program's
frame that launched it and the byte ranges of its tensor arguments (read from the locals of the frame
that launches it: Triton's launcher's ``args``, ``JITFunction.run``'s, an inductor launcher's named
arguments). A finding compares them with the saved tensor's storage. The one ``Launches`` is
``attribute.LAUNCHES``, made there with the clock and the frame walk it uses."""

from __future__ import annotations

import collections
import sys
import threading
from typing import Any

from . import engine

KEEP = 1024  # launches kept, the latest (a long forward launches many kernels before its backward)
_LOOK = 6  # frames above the hook looked at for the launch's tensor arguments


class Launches:
    """The Triton launch hook while a window is open (``open``/``close``, counted per check) and the
    launches it saw: (clock tick, kernel name, the program's frame as (code, line), its tensors' byte ranges).
    ``clock``: what a launch ticks (its ``count``); ``caller`` and ``kind``: ``attribute``'s frame walk and
    kind of code."""

    def __init__(self, clock, caller, kind):
        self.clock, self.caller, self.kind = clock, caller, kind
        self.recent: collections.deque = collections.deque(maxlen=KEEP)
        self._users = 0
        self._lock = threading.Lock()
        self._set: tuple | None = None  # (holder, how, what was there, the hook set) while set

    # --- the window -----------------------------------------------------------------------------

    def open(self) -> None:
        with self._lock:
            self._users += 1
            self._install()

    def close(self) -> None:
        with self._lock:
            self._users = max(self._users - 1, 0)
            if self._users == 0:
                self._remove()

    def ensure(self) -> None:
        """Set the hook where a window is open and Triton was imported since it opened (cheap otherwise)."""
        if self._users and self._set is None and "triton" in sys.modules:
            with self._lock:
                if self._users:
                    self._install()

    @property
    def installed(self) -> bool:
        return self._set is not None

    def _install(self) -> None:
        if self._set is not None:
            return
        holder = _holder()
        if holder is None:
            return
        theirs: Any = getattr(holder, "launch_enter_hook", None)
        if callable(getattr(theirs, "add", None)) and callable(getattr(theirs, "remove", None)):  # a HookChain
            hook = _Hook(self, None)
            theirs.add(hook)
            self._set = (holder, "chain", theirs, hook)
        else:
            hook = _Hook(self, theirs)
            holder.launch_enter_hook = hook
            self._set = (holder, "attribute", theirs, hook)

    def _remove(self) -> None:
        if self._set is None:
            return
        holder, how, theirs, hook = self._set
        self._set = None
        hook.on = False  # a program's hook that chained it calls through it from now on
        if how == "chain":
            theirs.remove(hook)
        elif getattr(holder, "launch_enter_hook", None) is hook:  # not replaced by the program's meanwhile
            holder.launch_enter_hook = theirs

    # --- a launch --------------------------------------------------------------------------------

    def record(self, metadata, frame) -> None:
        """One launch (``frame``: the first frame above the hook), outside a backward pass."""
        if engine.graph_task() != -1:  # a backward pass's own kernels: not between save and use
            return
        ranges = _ranges(frame, self.kind)
        if not ranges:
            return
        where = self.caller(3)
        clock = self.clock
        clock.count += 1  # one clock with the optimizer steps: a save records its tick
        self.recent.append((clock.count, _name(metadata, frame), where[0] or where[1], ranges))

    def since(self, count: int, t, original=None, upto: int | None = None) -> tuple[str | None, Any]:
        """(the name of the first kernel launched after the tick ``count`` (and by ``upto``) with a tensor
        argument inside ``t``'s storage, the program's frame that launched it as (code, line)), or (None, None)."""
        lo, hi = _span(t, original)
        if hi <= lo:
            return None, None
        for n, name, where, ranges in list(self.recent):
            if n > count and (upto is None or n <= upto) and any(a < hi and lo < b for a, b in ranges):
                return name, where
        return None, None


class _Hook:
    """The check's launch hook; ``theirs``: the hook it was set over, called after it."""

    def __init__(self, launches: Launches, theirs):
        self.launches, self.theirs, self.on = launches, theirs, True

    def __call__(self, metadata, *args, **kwargs):
        if self.on:
            try:
                self.launches.record(metadata, sys._getframe(1))
            except Exception:  # noqa: BLE001 — what the check cannot read of a launch costs the program nothing
                pass
        if self.theirs is not None:
            return self.theirs(metadata, *args, **kwargs)
        return None


def _holder():
    """What holds Triton's launch hook in the Triton imported (None: none imported, or no hook there)."""
    triton = sys.modules.get("triton")
    if triton is None:
        return None
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is not None and hasattr(runtime, "launch_enter_hook"):
        return runtime
    for name in ("triton.compiler", "triton.compiler.compiler"):
        kernel = getattr(sys.modules.get(name), "CompiledKernel", None)
        if kernel is not None and hasattr(kernel, "launch_enter_hook"):
            return kernel
    return None


def _name(metadata, frame) -> str:
    """The kernel's name: the launch metadata's ``name`` (a LazyDict's data, not evaluating what a kernel
    adds to it; a dict; an attribute), else the JIT function's of the frame that launched it."""
    data = getattr(metadata, "data", None)
    if not isinstance(data, dict):
        data = metadata if isinstance(metadata, dict) else None
    name = data.get("name") if data is not None else getattr(metadata, "name", None)
    if name is None and callable(getattr(metadata, "get", None)) and not isinstance(metadata, dict):
        got = metadata.get()
        name = got.get("name") if isinstance(got, dict) else None
    if name is None and frame is not None:
        fn = getattr(frame.f_locals.get("self"), "fn", None)
        name = getattr(fn, "__name__", None)
    return str(name) if name is not None else "an unnamed kernel"


def _ranges(frame, kind) -> frozenset:
    """The byte ranges of the tensor arguments of the launch: of the first frame above the hook (and
    below the program's own code) whose locals hold tensors, one level into tuples, lists and dicts."""
    import torch

    tensor = torch.Tensor
    for _ in range(_LOOK):
        if frame is None:
            return frozenset()
        code = frame.f_code
        if kind(code) & 3 == 2 and not code.co_filename.startswith("<"):
            return frozenset()  # the program's own frame: the launcher's locals were not found
        found = set()
        for value in frame.f_locals.values():
            items = value.values() if isinstance(value, dict) else value if isinstance(value, tuple | list) else \
                (value,)
            for item in items:
                base = item if isinstance(item, tensor) else getattr(item, "base", None)  # a TensorWrapper's
                if isinstance(base, tensor):
                    span = _extent(base)
                    if span is not None:
                        found.add(span)
        if found:
            return frozenset(found)
        frame = frame.f_back
    return frozenset()


def _extent(t) -> tuple[int, int] | None:
    """The bytes a tensor's elements span: [its data pointer, past its last element)."""
    try:
        if t.numel() == 0:
            return None
        lo = t.data_ptr()
        last = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
        return lo, lo + (last + 1) * t.element_size()
    except Exception:  # noqa: BLE001 — no storage of its own (a wrapper subclass, a fake tensor)
        return None


def _span(t, original) -> tuple[int, int]:
    """The saved tensor's storage as a byte range (of the tensor itself, or of the facts kept of it: the
    bytes its elements spanned)."""
    for x in (original, t):
        if x is None:
            continue
        try:
            storage = x.untyped_storage()
            lo = storage.data_ptr()
            if lo:
                return lo, lo + storage.nbytes()
        except Exception:  # noqa: BLE001 — facts kept without the tensor
            continue
    try:
        lo = t.data_ptr()
        return lo, lo + t.numel() * t.element_size()
    except Exception:  # noqa: BLE001 — no pointer known
        return 0, 0

