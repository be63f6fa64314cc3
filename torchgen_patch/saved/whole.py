"""The one whole-process check: what ``install()``, ``run`` and ``enable`` turn on for the rest of a process
(``enable``), the count it says at exit, and its end (``disable``, ``uninstall()``)."""

from __future__ import annotations

import os

from ..errors import say
from ..vocabulary import CheckMode
from . import attribute, native, sample
from .hooks import Check

_PROCESS: Check | None = None  # the check install() and run turned on, for the whole process


def current() -> Check | None:
    """The whole-process check, while it is on."""
    return _PROCESS if _PROCESS is not None and _PROCESS.active else None


def enable(mode: CheckMode, path: str | None = None, every: int = 1, quiet: bool = False) -> Check:
    """Turn the check on for the rest of the process (on this thread: the one that imports torch, or under
    ``install()``'s sampled default the one that ran the first backward pass) and
    say so once, on stderr (``quiet``: not); a second call returns the check already on (in its mode and
    sampling)."""
    global _PROCESS  # noqa: PLW0603 (the one whole-process check, turned on and off here)
    import atexit

    if _PROCESS is not None and _PROCESS.active:
        return _PROCESS
    _PROCESS = Check(mode, path, every).start()
    if not quiet:
        say(f"torchgen-patch: saved-tensor check on ({sample.words(mode, every)}) in pid {os.getpid()} "
            f"({attribute.who()}): {native.describe(_PROCESS)}")
    atexit.register(_at_exit, _PROCESS)  # in raise mode too: the findings a program caught are counted
    return _PROCESS


def _at_exit(check: Check) -> None:
    """The count at exit, from a process whose backward used a saved tensor, or ran at all where the check
    is sampled (a launcher that ran none says nothing)."""
    counts = check.sampler.counts()
    if not check.unpacked and not check.findings and not (counts and counts[1] > 1):  # > 1: a backward ran
        return
    where = f" in pid {os.getpid()}"
    r = attribute.rank()
    check.print_summary(where + (f" (rank {r})" if r is not None else ""))


def disable() -> None:
    """Turn off the whole-process check (``uninstall()``)."""
    global _PROCESS  # noqa: PLW0603 (the one whole-process check, turned on and off here)
    if _PROCESS is not None:
        _PROCESS.stop()
        _PROCESS = None
