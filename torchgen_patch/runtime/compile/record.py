"""A build's record (``build-info.json``) and directory: whether a build directory is a finished
build of a key, and the sweep of temporary build directories whose lease expired; and the record of a
build that failed (a negative entry of the cache, ``failed-build-<key>.json``: its reason and when),
which spares a program's processes compiling again what cannot compile in their toolchain."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import time

from ... import cache
from ...errors import EnvironmentProblem, InputError, printable
from ...fs import root as cache_root
from ...fs.decode import loads
from ...fs.dirs import Dir, open_dir
from ...fs.protected import Missing, cache_refusal, library_refusal

LIB_PREFIX = "torchgen_patch_kernels"
RECORD = "build-info.json"
# 3: built with ninja from a private directory; the library states its own build (older builds are never reused)
RECORD_FORMAT = 3
TEMPORARY = (".build-", ".stale-")  # the prefixes of temporary directories in a builds directory


def complete(builds: Dir, final: str, key: str, library: str | None = None) -> bool:
    """Whether ``final`` is a finished build of ``key`` (its record, read as any cache entry, says so).
    A build directory others could write is refused (``library``: named in the refusal), never
    rebuilt behind your back."""
    try:
        d = builds.sub(final, refusal=library_refusal(library) if library else None)
    except Missing:
        return False
    with d:
        try:
            data = loads(d.read(RECORD))
        except (Missing, EnvironmentProblem, OSError, ValueError):  # damaged: rebuilt in its place
            return False
    return isinstance(data, dict) and data.get("key") == key and data.get("format") == RECORD_FORMAT


def remove_stale(root: str | Dir) -> list[str]:
    """Remove the temporary build directories whose lease expired (their build is gone: killed
    mid-build, on this machine or, after a day, on another host sharing the cache)."""
    from ...fs.leases import sweep  # imported here: a cached install() leases no build

    if isinstance(root, Dir):
        return sweep(root, TEMPORARY)
    try:
        with open_dir(root, cache_refusal(root)) as d:
            return sweep(d, TEMPORARY)
    except Missing:
        return []


def sha256_of(fd: int) -> str:
    """The SHA-256 of the file behind the open descriptor ``fd``, read from its start."""
    h = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        h.update(chunk)
        offset += len(chunk)
    return h.hexdigest()


# ---- a build that failed: the negative entry -------------------------------------------------------

FAILED_FOR = 3600  # seconds a failed build is remembered: after an hour a process tries again
_REMEMBERING: contextvars.ContextVar[bool] = contextvars.ContextVar("torchgen_patch_remembering", default=False)


@contextlib.contextmanager
def remembering():
    """While the block runs, a build that failed in this toolchain within ``FAILED_FOR`` is not tried
    again: what a program's process does (a build started on its own). A command (`enable`, `build`)
    always tries; every failed build is remembered."""
    token = _REMEMBERING.set(True)
    try:
        yield
    finally:
        _REMEMBERING.reset(token)


def failure_name(key: str, path: str) -> str:
    """The negative entry of the build of ``key`` (its inputs, flags, compiler and torch) whose compiler's
    driver runs with the PATH ``path``: another PATH, or a build of other inputs, is another entry."""
    return f"failed-build-{cache_root.key(key, path)[:32]}.json"


def remember(name: str, compiler: str, reason: str) -> None:
    """Remember that the build of entry ``name`` failed with ``reason`` (the compiler's last error line), now."""
    cache.write(name, {"format": 1, "compiler": compiler, "reason": reason, "time": int(time.time())})


def remembered(name: str, what: str) -> InputError | None:
    """Where builds are ``remembering``: the error of the build of entry ``name`` that failed less than
    ``FAILED_FOR`` ago, said in one line with its reason and age (None: none, older, or not remembering).
    The entry is read as every cache entry (a trusted owner's file nobody else can write, with this cache's
    proof); one that fails that, or holds anything else, is ignored: the build is tried."""
    if not _REMEMBERING.get():
        return None
    data = cache.read(name)
    if not isinstance(data, dict) or data.get("format") != 1 or type(data.get("time")) is not int or \
            not isinstance(data.get("reason"), str) or not isinstance(data.get("compiler"), str):
        if data is not None:
            cache.invalid(name, "not a failed build's record")
        return None
    age = int(time.time()) - data["time"]
    if not 0 <= age < FAILED_FOR:  # expired (or dated in the future: never trusted to last)
        return None
    left = FAILED_FOR - age
    return InputError(None, None, f"{what} do not compile: {printable(data['reason'])[:300]} (remembered: the build "
                                  f"with {printable(data['compiler'])} failed {_ago(age)} ago; tried again in "
                                  f"{_ago(left)}, at once by `torchgen-patch enable` or with another compiler or PATH)",
                      cause=printable(data["reason"])[:300])


def _ago(seconds: int) -> str:
    return f"{seconds} s" if seconds < 60 else f"{seconds // 60} min"
