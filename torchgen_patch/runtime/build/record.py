"""A build's record (``build-info.json``) and directory: whether a build directory is a finished
build of a key, and the sweep of temporary build directories whose lease expired."""

from __future__ import annotations

import hashlib
import os

from ... import cache
from ... import files as _files
from ...errors import EnvironmentProblem

LIB_PREFIX = "torchgen_patch_kernels"
RECORD = "build-info.json"
# 3: built with ninja from a private directory; the library states its own build (older builds are never reused)
RECORD_FORMAT = 3
TEMPORARY = (".build-", ".stale-")  # the prefixes of temporary directories in a builds directory


def complete(builds: cache.Dir, final: str, key: str, library: str | None = None) -> bool:
    """Whether ``final`` is a finished build of ``key`` (its record, read as any cache entry, says so).
    A build directory others could write is refused (``library``: named in the refusal), never
    rebuilt behind your back."""
    try:
        d = builds.sub(final, refusal=cache.library_refusal(library) if library else None)
    except cache.Missing:
        return False
    with d:
        try:
            data = _files.loads(d.read(RECORD))
        except (cache.Missing, EnvironmentProblem, OSError, ValueError):  # damaged: rebuilt in its place
            return False
    return isinstance(data, dict) and data.get("key") == key and data.get("format") == RECORD_FORMAT


def remove_stale(root: str | cache.Dir) -> list[str]:
    """Remove the temporary build directories whose lease expired (their build is gone: killed
    mid-build, on this machine or, after a day, on another host sharing the cache)."""
    if isinstance(root, cache.Dir):
        return cache.sweep(root, TEMPORARY)
    try:
        with cache.open_dir(root, cache.cache_refusal(root)) as d:
            return cache.sweep(d, TEMPORARY)
    except cache.Missing:
        return []


def sha256_of(fd: int) -> str:
    """The SHA-256 of the file behind the open descriptor ``fd``, read from its start."""
    h = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        h.update(chunk)
        offset += len(chunk)
    return h.hexdigest()
