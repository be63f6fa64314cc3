"""The check sampled by step (``every=N``): each backward pass's forward is checked with probability
1/N, and a step that is not drawn has no saved-tensor hooks on the stack at all: what it costs is the
draw. ``every=1`` (the default of the Python API) is the check of every step.

Where a step begins: at the end of a backward pass, once the engine has returned to the thread that
called it (``engine.after_each_backward``), the check draws for the next forward and lays its hooks on
that thread's stack or lifts them. Not in the engine's final callbacks: the engine puts the thread's
stack of hooks back as it was when the pass began once they have run, and on CUDA they may run on a
device thread. The first step is never drawn: a process that runs no backward pass (inference, evaluation
with grad mode on) never has the hooks, and pays nothing but the check's start. Every backward pass is a draw
(gradient accumulation, several losses, a ``retain_graph`` pass run again): draws are independent of each
other and of any count of steps, so no schedule of the program (evaluation every k steps, an
accumulation of k micro-batches) can stay out of phase with them. A tensor saved while the hooks were
off is not checked; one saved while they were on is compared at use whenever that comes (its unpack hook
is bound when it is saved), so a pass run again on a retained graph, or hooks lifted in between, loses
nothing.

The draw: ``random.Random`` seeded per process from ``os.urandom`` (a forked child seeds afresh), so
no program can predict which steps are checked. ``$TORCHGEN_PATCH_CHECK_SEED`` seeds it instead, for
tests (a forked child then seeds from that seed and its pid).

A write that recurs every step between forward and backward is found at the first step drawn: within
k steps with probability 1 - (1 - 1/N)^(k-1), and with R ranks, each drawing on its own, 1 - (1 - 1/N)^(R(k-1))
(docs/unseen-writes.md)."""

from __future__ import annotations

import os
import random
import threading
import weakref
from typing import Any

ENV = "TORCHGEN_PATCH_CHECK_SEED"
DEFAULT_EVERY = 32  # what a training run is asked to use: ≤ 1.01 × a step where the full check costs ≤ 1.3 ×


def words(mode, every: int) -> str:
    """The check as its lines name it: ``off``, ``warn, every step``, ``warn, 1 step in 32``."""
    if mode is None:
        return "off"
    return f"{mode}, " + ("every step" if every == 1 else f"1 step in {every}")


def every_of(every) -> int:
    """``every`` as a whole number ≥ 1; any other value is refused (ValueError) before anything runs."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"the saved-tensor check's every must be a whole number of steps >= 1, not {every!r}")
    return every


class Draw:
    """True with probability 1/``every`` at each call (to within 2^-53: a uniform double below 1/every),
    independently, from a generator of this process."""

    def __init__(self, every: int):
        self.every = every
        self.draws = 0
        self.drawn = 0
        self._random = random.Random()
        self.seed()
        _DRAWS.add(self)

    def seed(self, child: bool = False) -> None:
        given = os.environ.get(ENV)
        if given:
            self._random.seed(f"{given}:{os.getpid()}" if child else given)
        else:
            self._random.seed(os.urandom(32))

    def __call__(self) -> bool:
        self.draws += 1
        hit = self._random.random() * self.every < 1
        self.drawn += hit
        return hit


_DRAWS: weakref.WeakSet = weakref.WeakSet()


def _seed_children() -> None:
    for draw in list(_DRAWS):
        draw.seed(child=True)


os.register_at_fork(after_in_child=_seed_children)


class Sampler:
    """Where a check's hooks are: on the stack of the thread that started it for every step (``every``
    1), or for the steps drawn. ``layer``: its layer, while laid (``compose.py`` replaces it where a block
    of the program's hooks that it wrapped ends)."""

    def __init__(self, check, every: int):
        self.check = check
        self.every = every_of(every)
        self.draw = Draw(every) if every > 1 else None
        self.layer: Any = None  # compose.lay's
        self.laid = False
        self._own = None
        self._thread: int | None = None
        self._compose: Any = None  # the modules that lay the hooks and call back at the end of backward,
        self._ctxattr: Any = None  # keep the tensors of custom Functions' ctx,
        self._engine: Any = None  # imported when the check starts,
        self._launches: Any = None  # and see Triton's launches while a step is checked

    def start(self, own) -> None:
        """The check starts, with ``own`` (its implementation's hooks): laid now (every step), or once a step is
        drawn, never before the first backward pass has ended."""
        from . import attribute, compose, ctxattr, engine  # here, not above: every_of and DEFAULT_EVERY stay light

        self._compose, self._engine, self._ctxattr, self._launches = compose, engine, ctxattr, attribute.LAUNCHES
        self._own, self._thread = own, threading.get_ident()
        if self.draw is None:
            self._lay()
        else:  # the first draw is at the end of the first backward pass: a process that runs none has no hooks
            engine.after_each_backward(self.boundary)

    def stop(self) -> None:
        if self.draw is not None:
            self._engine.stop_after_each_backward(self.boundary)
        if self.laid:
            self._compose.remove(self.layer)
            self._launches.close()
            self.laid = False

    def _lay(self) -> None:
        self.layer = self._compose.lay(self.check, self._own)
        self.laid = True
        self._ctxattr.start(self.check, self.check._python)  # the tensors custom Functions keep on ctx too
        self._launches.open()  # Triton's launches, where Triton is imported (launches.py)

    def boundary(self) -> None:
        """A backward pass this thread called has returned: the draw for the next forward. Where the
        stack cannot change between steps (the program's own hooks pushed over the check's, another check
        on top), it stays as it is until it can: a step then checked that was not drawn is still sound."""
        if threading.get_ident() != self._thread or self.draw is None or not self._engine.hooks_allowed():
            return  # (a pass inside torch.func's transforms, which refuse hooks: no draw, the next pass draws)
        drawn = self.draw()
        if drawn and not self.laid and self._compose.layable():
            self._lay()
        elif drawn and self.laid:
            self._launches.ensure()  # a Triton imported since the window opened
        elif not drawn and self.laid and self._compose.lift(self.layer):
            self.laid = False
            self._ctxattr.lift(self.check)
            self._launches.close()

    def counts(self) -> tuple[int, int, int] | None:
        """(draws that drew, draws, N) so far: one draw at the end of each backward pass;
        None where every step is checked."""
        return None if self.draw is None else (self.draw.drawn, self.draw.draws, self.every)
