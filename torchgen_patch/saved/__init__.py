"""The saved-tensor check: writes autograd cannot see, found in any program.

Every tensor autograd saves for backward gets its version and a fingerprint of its contents when
it is saved (on its own device, without a copy); when backward uses it, a version that moved
raises autograd's own error (as without the check), and contents that changed while the version
did not make a ``Finding`` (``finding.py``): the tensor, the node that saved it, the program's
frames of the forward and the backward call, who may have written it. ``warn`` prints one line
per distinct finding and a count at the end; ``raise`` raises ``SavedTensorChanged`` at the first.

    with check_saved("raise"):        # a block
        ...
    enable("warn")                    # the rest of the process (install(check_saved=), run --check-saved)

The stage's modules: ``hooks.py`` (the hooks and their composition with the program's own),
``ctxattr.py`` (tensors a custom Function keeps as ``ctx`` attributes), ``fingerprint.py``,
``moved.py`` (autograd's own error), ``attribute.py`` (frames, names, optimizer steps, rank),
``finding.py`` (the value), ``render.py`` (its renderers) and ``engine.py`` (the one module that
talks to autograd's engine)."""

from __future__ import annotations

from ..vocabulary import CheckMode
from .finding import Finding, Frame, SavedTensorChanged

__all__ = ["CheckMode", "Finding", "Frame", "SavedTensorChanged", "check_saved", "disable", "enable", "mode_of"]


def mode_of(mode) -> CheckMode:
    """``mode`` as a CheckMode; any other value is refused (ValueError) before anything runs."""
    try:
        return CheckMode(mode)
    except ValueError:
        raise ValueError(f"check_saved mode must be 'warn' or 'raise', not {mode!r}") from None


def check_saved(mode="warn", path=None):
    """A check of saved tensors, as a context manager (``with check_saved("raise"):``) or for the rest
    of the process (``check_saved("warn").start()``); ``.findings`` lists what it found. ``path``:
    ``native``, ``python`` or None (the native hooks where they are loaded, ``native.py``)."""
    from .hooks import Check

    return Check(mode_of(mode), path)


def enable(mode="warn", path=None):
    """Turn the check on for the rest of the process, on this thread (the one that imports torch);
    ``warn`` prints the count when the process exits."""
    from .hooks import enable as on

    return on(mode_of(mode), path)


def disable() -> None:
    """Turn off what ``enable`` turned on."""
    from .hooks import disable as off

    off()
