"""A sampled check that starts at the end of the program's first backward pass, not at its start.

A sampled check never draws a program's first step (``sample.py``): its first draw is made at the end of
the first backward pass. Until then it needs nothing but a way to hear of that pass, so ``install()`` (what
``run`` and ``enable`` give every process) arms one here instead of starting it: one callback on the
return of each backward pass (``engine.after_each_backward``), which, the first time a pass returns (on
whichever thread ran it: the check's hooks are then that thread's), makes the check ready (``prepare``:
the native hooks found and loaded, or not), turns it on (its line is said then), makes the first draw,
and takes itself off. A process that runs no backward pass (inference, a tool, a DataLoader worker)
loads, renders and hashes nothing of the check and says nothing of it; where the check cannot start, one
line says why and the program goes on (it fails open)."""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

from ..errors import say
from . import engine, untraced

_PENDING: list = []  # the one start armed in this process, until it runs or is called off
FINDINGS_ENV = "TORCHGEN_PATCH_FINDINGS"  # fleet.ENV, read when the start is armed (fleet is not imported here)


def _on_already():
    """The whole-process check, where one is on (looked up without importing it: a process that has not
    imported it has none)."""
    whole = sys.modules.get("torchgen_patch.saved.whole")
    return whole.current() if whole is not None else None


class Start:
    """The check's start, armed: ``mode``, ``every``, ``quiet`` as ``enable`` takes them; ``prepare`` runs
    first (it may raise: the check then stays off, said in one line); ``findings``: a folder for them
    (``$TORCHGEN_PATCH_FINDINGS``, made absolute when armed: a program may change its directory before its
    first backward pass)."""

    def __init__(self, mode, every: int, quiet: bool, prepare: Callable[[], Any]):
        self.mode, self.every, self.quiet, self.prepare = mode, every, quiet, prepare
        given = os.environ.get(FINDINGS_ENV)
        self.findings: str | None = os.path.abspath(given) if given else None
        self.pid = os.getpid()

    def __call__(self) -> None:
        self.run(draw=True)  # on the thread that ran it: the check's hooks are that thread's (a training loop's)

    def run(self, draw: bool) -> None:
        """The check on now, on this thread, if this start is still armed; ``draw``: the draw due at the end
        of this backward pass, the program's first, made too. Where a check is on already, this start only
        takes itself off (that check made its own draw)."""
        try:
            _PENDING.remove(self)
        except ValueError:  # run already, or called off (two threads' passes returning at once)
            return
        try:
            if _on_already() is None:
                self._start(draw)
        except Exception as e:  # noqa: BLE001 — a check on by default fails open, whatever the cause
            say(f"torchgen-patch: saved-tensor check NOT on in pid {os.getpid()}: {type(e).__name__}: {e}")
        finally:
            engine.stop_after_each_backward(self)  # after enable: the engine's wrapper stays in place

    def _start(self, draw: bool) -> None:
        from . import fleet
        from .whole import enable

        self.prepare()
        check = enable(self.mode, None, self.every, self.quiet)
        fleet.attach(check, self.findings)
        if os.getpid() != self.pid and check.sampler.draw is not None:
            check.sampler.draw.seed(child=True)  # armed in a parent, started in a forked child: draws of its own
        if draw:
            check.sampler.boundary()


def arm(mode, every: int, quiet: bool, prepare: Callable[[], Any]) -> None:
    """Start the check (sampled: ``every`` > 1) at the end of the first backward pass any thread of this
    process runs, on that thread; armed already, or a whole-process check on already, nothing changes."""
    if _PENDING or _on_already() is not None:
        return
    untraced.ensure()  # its start at the first pass's end runs as it is under torch.compile
    start = Start(mode, every, quiet, prepare)
    _PENDING.append(start)
    engine.after_each_backward(start)


def pending() -> Start | None:
    """The start armed and not yet run, if any."""
    return _PENDING[0] if _PENDING else None


def start_now() -> None:
    """The armed start, run now: the program asked for the whole-process check before its first backward
    pass (``enable``), and gets this one, as it would have started; its first draw is at the end of the
    first backward pass, as ever."""
    start = pending()
    if start is not None:
        start.run(draw=False)


def call_off() -> None:
    """A start armed and not yet run never runs (``disable``)."""
    for start in list(_PENDING):
        _PENDING.remove(start)
        engine.stop_after_each_backward(start)
