"""What a finding says beyond the tensor's bits: the program's own frames of the forward and the
backward call, the module path of a parameter or buffer, the optimizer steps that ran between
save and use, the rank. Everything here but the frame walk and the step counter runs only when a
finding is made."""

from __future__ import annotations

import collections
import gc
import os
import sys
import sysconfig
import threading
import weakref
from types import CodeType, FrameType

from ..errors import display_path
from ..vocabulary import Writer
from .finding import Finding, Frame
from .launches import Launches
from .writer import holds, inside

# --- frames ---------------------------------------------------------------------------------


def _library_dirs() -> tuple[str, ...]:
    import torch

    dirs = {os.path.dirname(os.path.abspath(torch.__file__)),
            os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}  # this package
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            dirs.add(os.path.abspath(p))
    for p in sys.path:
        if os.path.basename(p) in ("site-packages", "dist-packages"):
            dirs.add(os.path.abspath(p))
    return tuple(sorted(d.rstrip(os.sep) + os.sep for d in dirs))


_LIBS: tuple[str, ...] | None = None
_TORCH_OR_OURS: tuple[str, ...] | None = None
_CALLS: frozenset = frozenset()  # torch's code that calls a module's forward (Module._call_impl, its inner())
# code object -> 2 (the program's own), 1 (a library outside torch), 0 (torch, this package), plus CALLS for
# the code that calls a module's forward
_PROGRAM: dict = {}
CALLS = 4


def _kind(code) -> int:
    global _LIBS, _TORCH_OR_OURS, _CALLS  # noqa: PLW0603 (the process's torch and library paths, found at first use)
    if _LIBS is None:
        import torch

        _TORCH_OR_OURS = tuple(os.path.dirname(os.path.abspath(p)) + os.sep for p in (
            torch.__file__, os.path.dirname(os.path.abspath(__file__))))
        _LIBS = _library_dirs()
        impl = torch.nn.Module._call_impl.__code__
        _CALLS = frozenset([impl, *(c for c in impl.co_consts if isinstance(c, CodeType))])
    name = code.co_filename
    if name.startswith("<frozen") or name.startswith(_TORCH_OR_OURS):
        return CALLS if code in _CALLS else 0
    return 1 if os.path.abspath(name).startswith(_LIBS) else 2


def kind_of_code(code) -> int:
    """2: the program's own code, 1: a library outside torch, 0: torch or this package, CALLS (4):
    torch's code that calls a module's forward (cached)."""
    kind = _PROGRAM.get(code)
    if kind is None:
        kind = _PROGRAM[code] = _kind(code)
    return kind


def caller(depth: int = 2):
    """Where the current call came from, cheaply, to be made a Frame only if a finding needs it: the
    innermost frame of the program's own code, the innermost frame outside torch and this package,
    and the innermost frame of the program's own code that no module's call runs (outside every
    module's own ``forward``: where the program called its model), each as (code, line), or None."""
    try:
        f: FrameType | None = sys._getframe(depth)
    except ValueError:  # called from less deep than that
        return None, None, None
    site = program = None
    while f is not None:
        code = f.f_code
        kind = _PROGRAM.get(code)
        if kind is None:
            kind = _PROGRAM[code] = _kind(code)
        if kind & 3:
            if site is None:
                site = (code, f.f_lineno)
            if kind & 3 == 2:
                if program is None:
                    program = (code, f.f_lineno)
                back = f.f_back
                if back is None or not kind_of_code(back.f_code) & CALLS:
                    return program, site, (code, f.f_lineno)
        f = f.f_back
    return program, site, None


def frame(where) -> Frame | None:
    if where is None:
        return None
    code, line = where
    return Frame(display_path(code.co_filename), line or 0, code.co_name)


def backward_call():
    """The program's frame of the backward call running now: the thread blocked in the engine's
    ``run_backward`` (this one, or the one whose backward a device thread serves)."""
    here = caller(3)[0]
    if here is not None:
        return here
    for f in sys._current_frames().values():
        probe: FrameType | None = f
        while probe is not None and probe.f_code.co_name != "_engine_run_backward":
            probe = probe.f_back
        if probe is not None:
            g: FrameType | None = probe
            while g is not None:
                if kind_of_code(g.f_code) & 3 == 2:
                    return g.f_code, g.f_lineno
                g = g.f_back
    return None


# --- parameters and buffers -------------------------------------------------------------------


def module_name(t, original=None) -> tuple[str | None, str | None, bool]:
    """(the module path of the parameter or buffer ``t`` is, or is a view of; the class of the
    outermost module holding it; whether ``t`` is a view of it), from the modules alive in the
    process; (None, None, False) when it is none of them."""
    import torch

    module = torch.nn.Module
    gc.collect()  # models that are garbage already are no other copy to tell this one from
    modules = [o for o in gc.get_objects() if issubclass(type(o), module)]
    children = {id(c) for m in modules for c in m.children()}
    roots = [getattr(m, "_orig_mod", m) for m in modules if id(m) not in children]  # torch.compile's wrapper: its model
    roots.sort(key=lambda m: -sum(1 for _ in m.parameters()))
    target = original if original is not None else t
    best = None
    paths = {}  # id of a root -> its names of parameters and buffers
    for root in roots:
        named = list(root.named_parameters(remove_duplicate=False)) + list(root.named_buffers(remove_duplicate=False))
        paths[id(root)] = {name for name, _ in named}
        for name, p in named:
            if p is target:
                return name, _owner(root, name, roots, paths), False
        for name, p in named:
            if best is None and inside(target, p):
                best = name, root, True
    if best is None:
        return None, None, False
    return best[0], _owner(best[1], best[0], roots, paths), True


def _owner(root, name: str, roots, paths: dict) -> str:
    """How a finding names the model that holds ``name``: its class, and its id where another model of
    that class has a parameter or buffer of the same path (a teacher and its student copy)."""
    cls = type(root).__name__
    for other in roots:
        if other is not root and type(other).__name__ == cls:
            if id(other) not in paths:
                paths[id(other)] = {n for n, _ in other.named_parameters(remove_duplicate=False)} | \
                    {n for n, _ in other.named_buffers(remove_duplicate=False)}
            if name in paths[id(other)]:
                return f"{cls} at 0x{id(root):x}"
    return cls


# --- optimizer steps ----------------------------------------------------------------------------


class Steps:
    """Counts optimizer steps through torch's global step post-hook while a check is on, keeping the
    last few: (count, the optimizer (weakly), its class path, the program's frame of its ``step()`` call).
    ``count`` is the clock a save records: Triton's launches tick it too (``launches.py``), so that what
    ran after a save is told apart from what ran before it."""

    def __init__(self):
        self.count = 0
        self.recent: collections.deque = collections.deque(maxlen=32)
        self._users = 0
        self._handle = None
        self._lock = threading.Lock()

    def _hook(self, optimizer, args, kwargs) -> None:
        self.count += 1
        cls = type(optimizer)
        where = caller(2)
        self.recent.append((self.count, weakref.ref(optimizer), f"{cls.__module__}.{cls.__qualname__}",
                            where[0] or where[1]))

    def start(self) -> None:
        with self._lock:
            self._users += 1
            if self._handle is None:
                from torch.optim.optimizer import register_optimizer_step_post_hook

                self._handle = register_optimizer_step_post_hook(self._hook)

    def stop(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._handle is not None:
                self._handle.remove()
                self._handle = None

    def since(self, count: int, t, original=None, upto: int | None = None) -> tuple[str | None, bool, Frame | None]:
        """(the class of an optimizer that stepped after ``count`` (and by ``upto``), preferring one that
        holds ``t`` (``writer.holds``); whether it holds it; where its last such step was called)."""
        stepped = [(ref(), cls, where) for n, ref, cls, where in self.recent
                   if n > count and (upto is None or n <= upto)]
        for opt, cls, _ in stepped:
            if opt is not None and holds(opt, t, original):
                last = [where for o, _, where in stepped if o is opt][-1]
                return cls, True, frame(last)
        return (stepped[-1][1], False, None) if stepped else (None, False, None)


STEPS = Steps()
LAUNCHES = Launches(STEPS, caller, kind_of_code)  # Triton's launches, on the same clock (launches.py)


# --- writes that are the saver's own --------------------------------------------------------------

_BATCH_NORM = ("NativeBatchNormBackward", "CudnnBatchNormBackward", "MiopenBatchNormBackward",
               "BatchNormWithUpdateBackward")


def written_by_its_saver(node, t, quiet) -> bool:
    """Whether ``t`` is what the op that saved it writes itself, after saving it, by design: batch
    norm's running statistics (``running_mean``, ``running_var``), updated in place by the op in
    training mode without a version bump (backward in training mode does not read them). Only there:
    in eval mode backward reads them, and a frozen affine weight is no statistic. Such a change is
    no finding."""
    if node is None or t.dim() != 1:
        return False
    try:
        return t.data_ptr() in saver_statistics(node, quiet)
    except RuntimeError:  # no pointer of its own
        return False


def saver_statistics(node, quiet) -> tuple[int, ...]:
    """The data pointers of the statistics ``node`` updates itself (batch norm in training mode, with
    tracked statistics); () for any other node. ``quiet``: a context in which the check's hooks give
    back what a node saved without checking it."""
    name = node.name()
    if not name.startswith(_BATCH_NORM):
        return ()
    if not name.startswith("BatchNormWithUpdate") and getattr(node, "_saved_training", False) is not True:
        return ()
    out = []
    with quiet():
        for attr in ("_saved_running_mean", "_saved_running_var"):
            try:
                stat = getattr(node, attr)
            except RuntimeError:  # released after use
                continue
            if stat is not None:
                out.append(stat.data_ptr())
    return tuple(out)


# --- rank and writers ---------------------------------------------------------------------------


def rank() -> int | None:
    import torch

    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    value = os.environ.get("RANK")
    return int(value) if value and value.isdigit() else None


def writers(optimizer_holds: bool, storage_moved: bool, parameter: bool, returned: bool = False,
            launched: bool = False) -> tuple[Writer, ...]:
    """Who may have written a saved tensor, most likely first (``parameter``: it is a parameter or
    buffer, or a view of one, where `.data` writes are the usual way; ``returned``: the contents
    compared are what the program's own saved-tensor hooks gave back; ``launched``: a Triton kernel
    launched between save and use had a pointer into its storage). An optimizer that stepped between
    save and use and holds the tensor is named alone: the check knows that writer (its storage moving,
    FSDP2's copy gathered again, is then no other writer). A Triton kernel is named first, before the
    other kinds: it had the tensor's memory, but whether it wrote there no launch says."""
    out = [Writer.HOOKS] if returned else []
    if optimizer_holds:
        return (*out, Writer.OPTIMIZER)
    if launched:
        out.append(Writer.TRITON)
    if storage_moved:
        out.append(Writer.STORAGE)
    out += [Writer.DATA, Writer.ALIAS, Writer.KERNEL] if parameter else [Writer.ALIAS, Writer.KERNEL, Writer.DATA]
    return tuple(out)


def who() -> str:
    """Which process a line is about, as the kernels' line says it: its program, its rank."""
    argv0 = (getattr(sys, "argv", None) or [""])[0]
    r = rank()
    return ", ".join(["python -c" if argv0 == "-c" else os.path.basename(argv0) or "python",
                      *([f"rank {r}"] if r is not None else [])])


def finding(s, t, original, node, backward, returned: bool = False, upto: int | None = None) -> Finding:
    """The finding for the save ``s`` (its version, where it was saved, the step count then): ``t``, the
    tensor now or the facts kept of it; ``original``, the tensor saved, if alive; ``node``, the node that
    used it; ``backward``, the backward call's frame; ``returned``: the program's own hooks gave ``t``
    back; ``upto``: the step count by the end of its backward pass, where it is judged later."""
    name, owner, view = module_name(t, original)
    optimizer, holds_it, step = STEPS.since(s.steps, t, original, upto)
    kernel, launched = (None, None) if holds_it else LAUNCHES.since(s.steps, t, original, upto)
    try:
        moved_storage = s.ptr is not None and t.data_ptr() != s.ptr
    except Exception:  # noqa: BLE001 — no pointer of its own
        moved_storage = False
    program, site, call = s.where
    return Finding(shape=tuple(t.shape), dtype=str(t.dtype).replace("torch.", ""), device=str(t.device),
                   version=int(t._version), name=name, owner=owner, view=view,
                   node=node.name() if node is not None else None, forward=frame(program),
                   site=frame(site) if site != program else None, call=frame(call) if call != program else None,
                   backward=frame(backward), writers=writers(holds_it, moved_storage, name is not None or s.leaf,
                                                             returned, kernel is not None),
                   optimizer=optimizer, step=step, kernel=kernel, launch=frame(launched), rank=rank())
