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
    enable("warn", every=32)          # sampled: each step checked with probability 1/32 (sample.py)

The stage's modules: ``hooks.py`` (the hooks and their composition with the program's own),
``ctxattr.py`` (tensors a custom Function keeps as ``ctx`` attributes), ``fingerprint.py``,
``moved.py`` (autograd's own error), ``attribute.py`` (frames, names, optimizer steps, rank), ``writer.py``
(whether a stepped optimizer holds a tensor), ``launches.py`` (Triton's launches while a step is checked),
``finding.py`` (the value), ``render.py`` (its renderers),
``fleet.py`` (each finding also a line in a folder the processes of a job share), ``sample.py`` (the check
sampled by step), ``later.py`` (a sampled check started at the end of the first backward pass), ``whole.py`` (the one
whole-process check) and
``engine.py`` (the one module that talks to autograd's engine)."""

from __future__ import annotations

from ..vocabulary import CheckMode
from .finding import Finding, Frame, SavedTensorChanged
from .sample import DEFAULT_EVERY, every_of

__all__ = ["DEFAULT_EVERY", "CheckMode", "Finding", "Frame", "SavedTensorChanged", "check_saved", "disable", "enable",
           "enable_at_first_backward", "every_of", "findings_to", "mode_of"]


def mode_of(mode) -> CheckMode:
    """``mode`` as a CheckMode; any other value is refused (ValueError) before anything runs."""
    try:
        return CheckMode(mode)
    except ValueError:
        raise ValueError(f"check_saved mode must be 'warn' or 'raise', not {mode!r}") from None


def check_saved(mode="warn", path=None, every=1, findings=None):
    """A check of saved tensors, as a context manager (``with check_saved("raise"):``) or for the rest
    of the process (``check_saved("warn").start()``); ``.findings`` lists what it found. ``path``:
    ``native``, ``python`` or None (the native hooks where they are loaded, ``native.py``). ``every``:
    each backward pass's forward checked with probability 1/every, no hooks at all on the others
    (``sample.py``; 1: every step). ``findings``: a folder where each finding is also a line of this
    process's file (``fleet.py``; default ``$TORCHGEN_PATCH_FINDINGS``, where set), for
    ``torchgen-patch findings``."""
    from . import fleet
    from .hooks import Check

    check = Check(mode_of(mode), path, every_of(every))
    fleet.attach(check, findings)
    return check


def enable(mode="warn", path=None, every=1, findings=None, quiet=False):
    """Turn the check on for the rest of the process, on this thread (the one that imports torch), or
    return the one on already (or armed by ``install()`` to start at the first backward pass: started now);
    the count is printed when the process exits (in either mode). ``every``: sampled by step, as
    ``check_saved``'s; ``quiet``: it does not say it is on. ``findings``: as ``check_saved``'s (given to a
    check already on, its findings go there from now on)."""
    from . import fleet
    from .later import start_now
    from .whole import enable as on

    mode, every = mode_of(mode), every_of(every)
    start_now()  # one armed by install(): the check on is that one
    check = on(mode, path, every, quiet)
    fleet.attach(check, findings)
    return check


def enable_at_first_backward(mode, every: int, quiet=False, prepare=lambda: None) -> None:
    """``enable(mode, every=every, quiet=quiet)`` at the end of the first backward pass this thread runs, after
    ``prepare()`` (``later.py``): for a sampled check (``every`` > 1), whose first draw is made there anyway;
    until then the process carries one callback on the return of each backward pass and nothing else. Where
    ``prepare`` or the start fails, one line says why and the program goes on."""
    from .later import arm

    arm(mode_of(mode), every_of(every), quiet, prepare)


def findings_to(folder) -> None:
    """The whole-process check's findings, from now on, also as lines of a file in ``folder`` (``fleet.py``),
    whether it is on already or armed to start at the first backward pass."""
    from . import fleet, later

    start = later.pending()
    if start is not None:
        start.findings = folder
        return
    from .whole import current

    check = current()
    if check is not None:
        fleet.attach(check, folder)


def disable() -> None:
    """Turn off what ``enable`` turned on, and a start armed by ``enable_at_first_backward``."""
    from .whole import disable as off
    from .later import call_off

    call_off()
    off()
