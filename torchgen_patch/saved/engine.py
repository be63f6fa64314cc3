"""The one module that talks to autograd's engine (``torch._C._autograd`` and the engine's
bindings), as ``runtime/dispatcher.py`` is the one that talks to the dispatcher: the per-thread
stack of default saved-tensor hooks, the node being run, the graph task and its final callbacks, and
the return of each backward pass to the thread that called it.
Each binding is looked up when called and guarded, so a torch that lacks one (an older release)
gets the documented fallback instead of an AttributeError."""

from __future__ import annotations

import threading

from ..errors import require_torch


def _autograd():
    return require_torch("the saved-tensor check")._C._autograd


def push(pack, unpack) -> None:
    """Push a pair of default saved-tensor hooks on this thread's stack (what
    ``saved_tensors_hooks.__enter__`` does)."""
    _autograd()._push_saved_tensors_default_hooks(pack, unpack)


def pop() -> None:
    _autograd()._pop_saved_tensors_default_hooks()


def top():
    """The hooks on top of this thread's stack as (pack, unpack), None when the stack is empty, or
    ``...`` when this torch cannot say (no ``_top_saved_tensors_default_hooks``)."""
    read = getattr(_autograd(), "_top_saved_tensors_default_hooks", None)
    if read is None:
        return ...
    try:
        return read(True)  # the stack as it is, tracing or not
    except TypeError:  # a release whose binding takes no argument
        return read()


def _sequence_reader():
    read = getattr(_autograd(), "_get_sequence_nr", None)
    return read if read is not None else (lambda: None)


_NEXT: list = []  # the binding, looked up once (this runs for every saved tensor)


def next_sequence_nr() -> int | None:
    """The sequence number the next autograd node made on this thread will get (None: this torch
    cannot say). A tensor saved as an output of the node being made has a grad_fn one below it."""
    if not _NEXT:
        _NEXT.append(_sequence_reader())
    return _NEXT[0]()


def current_node():
    """The autograd node the engine runs on this thread right now (None outside backward)."""
    read = getattr(require_torch("the saved-tensor check")._C, "_current_autograd_node", None)
    return read() if read is not None else None


def graph_task() -> int:
    """The id of the backward pass running on this thread (-1 outside backward)."""
    read = getattr(require_torch("the saved-tensor check")._C, "_current_graph_task_id", None)
    return read() if read is not None else -1


def saving_in_backward() -> bool:
    """Whether a tensor saved now is saved while a backward pass runs on this thread that keeps no graph
    (no ``retain_graph``, no ``create_graph``): a reentrant checkpoint's recomputation, whose saves that pass
    uses and frees before it returns, with no step of the program's between. A pass that keeps its graph
    (double backward) saves for a later one: False there, and where this torch cannot say."""
    return graph_task() != -1 and not keep_graph()


def at_end_of_backward(callback) -> bool:
    """Run ``callback`` once the running backward pass has finished its nodes (the engine's final
    callbacks, as DDP and FSDP use); False when no backward pass is running on this thread."""
    if graph_task() == -1:
        return False
    engine = require_torch("the saved-tensor check").autograd.Variable._execution_engine
    try:
        engine.queue_callback(callback)
    except RuntimeError:  # "Final callbacks can only be installed during backward pass."
        return False
    return True


# --- the end of each backward pass, on the thread that called it -------------------------------------

_AFTER: list = []  # what runs after each backward pass, on the thread that called it (after_each_backward)
_WRAPPED: dict = {}  # module -> torch's _engine_run_backward that the wrapper replaced there
_WRAP_LOCK = threading.Lock()


def after_each_backward(callback) -> None:
    """Run ``callback()`` each time a backward pass returns (``Tensor.backward``, ``torch.autograd.backward``
    or ``grad``, through torch's ``_engine_run_backward``), on the thread that called it, once the engine has
    returned: outside the engine's guard of thread-local state, which puts back this thread's stack of
    saved-tensor hooks as it was when the pass began (hooks pushed or popped in a final callback do not
    stay). A backward pass run inside another one (a reentrant checkpoint's) calls nothing; one that raised
    does. ``stop_after_each_backward`` takes it off; with none left, torch's function is put back."""
    with _WRAP_LOCK:
        if not _AFTER:
            _wrap()
        _AFTER.append(callback)


def stop_after_each_backward(callback) -> None:
    with _WRAP_LOCK:
        if callback in _AFTER:
            _AFTER.remove(callback)
        if not _AFTER:
            _unwrap()


def _wrap() -> None:
    autograd = require_torch("the saved-tensor check").autograd
    for module in (autograd.graph, autograd):
        original = getattr(module, "_engine_run_backward", None)
        if original is not None and not getattr(original, "_calls_after_each_backward", False):
            # (one of ours left under a wrapper of another's that was since taken off already calls back)
            _WRAPPED[module] = original
            module._engine_run_backward = _returning(original)


def _returning(original):
    torch = require_torch("the saved-tensor check")
    task = getattr(torch._C, "_current_graph_task_id", lambda: -1)  # looked up once: this runs every pass
    after = _AFTER

    def _engine_run_backward(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        finally:
            if after and task() == -1:  # the outermost pass on this thread has returned
                for callback in tuple(after):
                    callback()

    _engine_run_backward.__wrapped__ = original  # type: ignore[attr-defined]  # as functools.wraps leaves it
    _engine_run_backward._calls_after_each_backward = True  # type: ignore[attr-defined]  # told apart by _wrap
    return _engine_run_backward


def _unwrap() -> None:
    for module, original in list(_WRAPPED.items()):
        current = getattr(module, "_engine_run_backward", None)
        if getattr(current, "__wrapped__", None) is original:  # still ours (torch.compiler may wrap it too)
            module._engine_run_backward = original
        del _WRAPPED[module]


def wrapped() -> bool:
    """Whether torch's ``_engine_run_backward`` is wrapped now (only while a sampled check is on)."""
    return bool(_WRAPPED)


def keep_graph() -> bool:
    """Whether the running backward pass keeps the graph for another (``retain_graph``, ``create_graph``);
    True where this torch cannot say."""
    read = getattr(_autograd(), "_get_current_graph_task_keep_graph", None)
    return bool(read()) if read is not None else True


def hooks_allowed() -> bool:
    """Whether saved-tensor hooks may be pushed on this thread now: not inside torch.func's transforms,
    which refuse them (``_saved_tensors_hooks_is_enabled``), nor while torch.compile traces."""
    allowed = getattr(_autograd(), "_saved_tensors_hooks_is_enabled", None)
    return (allowed is None or bool(allowed())) and not tracing()


def tracing() -> bool:
    """Whether torch.compile is tracing, or a torch.func transform is active (its tensors are wrappers of
    a level), on this thread."""
    return any(ask() for ask in _askers())


_ASKERS: list = []  # the two bindings, looked up once (asked at every custom Function's call)


def _askers() -> list:
    if not _ASKERS:
        torch = require_torch("the saved-tensor check")
        found = (getattr(getattr(torch, "compiler", None), "is_compiling", None),
                 getattr(torch._C, "_are_functorch_transforms_active", None))
        _ASKERS.extend(ask for ask in found if ask is not None)
        _ASKERS.append(lambda: False)  # looked up: never empty again
    return _ASKERS
