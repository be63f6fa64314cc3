"""The one file-lock protocol of the tool: an exclusive ``flock`` on an open descriptor, tried at once,
then waited for (with what the caller says while it waits); released by ``release`` or when the
descriptor closes. Every lock of the tool (the cache's, a build's lease, gen's) takes it here."""

from __future__ import annotations

import contextlib

try:
    import fcntl
except ImportError:  # no flock (Windows): callers go on without serialization, said where it matters
    fcntl = None  # type: ignore[assignment]  # the platform has no such module

AVAILABLE = fcntl is not None


def take(fd: int, wait: bool = True, waiting=contextlib.nullcontext) -> bool:
    """Lock ``fd`` exclusively: True once held; where another process holds it, False at once when
    ``wait`` is False, else held after waiting inside ``waiting()`` (a context: a note, a timer)."""
    assert fcntl is not None, "take() where flock exists (AVAILABLE)"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        if not wait:
            return False
    with waiting():
        fcntl.flock(fd, fcntl.LOCK_EX)
    return True


def release(fd: int) -> None:
    assert fcntl is not None, "release() where flock exists (AVAILABLE)"
    fcntl.flock(fd, fcntl.LOCK_UN)
