"""Where the cache lives (``$TORCHGEN_PATCH_CACHE``), the -v notes of what was ignored or removed
there, and the names of things under it (``key``)."""

from __future__ import annotations

import contextlib
import hashlib
import os

ENV = "TORCHGEN_PATCH_CACHE"
OWNERS_ENV = "TORCHGEN_PATCH_TRUSTED_OWNERS"
_ABSOLUTE: dict[str, str] = {}  # $TORCHGEN_PATCH_CACHE as given -> made absolute the first time it was seen
_NOTES: list = []  # callables that receive the -v notes (the CLI adds one with -v)


def cache_base() -> str:
    """$XDG_CACHE_HOME when it is absolute (the XDG spec: a relative one is invalid, ignored), else ~/.cache."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return xdg if xdg and os.path.isabs(xdg) else os.path.abspath(os.path.expanduser("~/.cache"))


def directory() -> str:
    """The cache root, always absolute: a relative ``$TORCHGEN_PATCH_CACHE`` is resolved against the
    working directory of the first call, once, so a later ``chdir`` or a child process (``run``
    exports the absolute path) never lands elsewhere."""
    raw = os.environ.get(ENV)
    if raw:
        if raw not in _ABSOLUTE:
            _ABSOLUTE[raw] = os.path.abspath(raw)
        return _ABSOLUTE[raw]
    return os.path.join(cache_base(), "torchgen-patch")


def note(text: str) -> None:
    """A -v note (a cache entry ignored, a stale build removed): never an error."""
    for sink in _NOTES:
        sink(text)


@contextlib.contextmanager
def notes_to(sink):
    """Send the notes to ``sink`` (a callable taking one line) while the block runs."""
    _NOTES.append(sink)
    try:
        yield
    finally:
        _NOTES.remove(sink)


def key(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()
