"""The content-keyed cache: a re-run on unchanged inputs skips torchgen.

A key hashes everything that decides a result: the inputs' bytes, the identity
of the torchgen and autograd codegen that did the work (``Toolchain.identity``)
and this tool's own source, so a result of one world never answers for another.
A cache that cannot be read or written only makes the next run slower.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os

from ..version import __version__
from ..files import atomic_write, private_dirs


def directory() -> str:
    return os.environ.get("TORCHGEN_PATCH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "torchgen-patch")


@functools.cache
def tool_fingerprint() -> str:
    h = hashlib.sha256(__version__.encode())
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for base, subdirs, names in os.walk(pkg):
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
        for name in sorted(names):
            if name.endswith((".py", ".in")):
                p = os.path.join(base, name)
                with open(p, "rb") as fh:
                    h.update(os.path.relpath(p, pkg).encode() + b"\0" + fh.read())
    return h.hexdigest()


def key(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()


def read(name: str):
    try:
        with open(os.path.join(directory(), name), encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def write(name: str, data) -> None:
    path = os.path.join(directory(), name)
    try:
        private_dirs(os.path.dirname(path))
        atomic_write(path, json.dumps(data, separators=(",", ":")).encode(), durable=False)
    except OSError:
        pass
