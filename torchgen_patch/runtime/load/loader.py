"""Load: a library this tool built (or a prebuilt wheel's), checked by the trust rules and loaded from the
very descriptor that was checked, once per file; before it is used it must state its own build."""

from __future__ import annotations

import ctypes
import os

from ...errors import EnvironmentProblem, one_line
from .state import REGISTRY


def _dlopen(name: str) -> ctypes.CDLL:
    return ctypes.CDLL(name)


def load(path: str, sha256: str | None, root: str, key: str | None = None) -> ctypes.CDLL:
    """The library at ``path``, checked (trust.check_library) and loaded from the very descriptor that
    was checked, once per file, under a name no earlier load used (``loadable``); before it is
    used, the library must state that it is the build ``key`` (its record's) for exactly this torch
    (``build.build_problem``): no record can say otherwise."""
    from ..compile import build_problem
    from . import trust

    fd = trust.check_library(path, sha256, root)
    try:
        st = os.fstat(fd)
        dll = REGISTRY.libraries.get((st.st_dev, st.st_ino))
        if dll is not None:
            return dll
        dll = _open_checked(fd, path)
        why = build_problem(_stated(dll), key, path)
        if why:
            _close(dll)
            raise EnvironmentProblem(f"{why}: it is not registered",
                                     "install the kernels made for this torch (`torchgen-patch wheel` with it), or "
                                     f"remove {os.path.dirname(path)} and build again (torchgen-patch build)")
        REGISTRY.libraries[(st.st_dev, st.st_ino)] = dll
        return dll
    finally:
        os.close(fd)


def _open_checked(fd: int, path: str) -> ctypes.CDLL:
    """``dlopen`` of the file behind ``fd``: through /proc/self/fd, or a private copy where this system
    has none. A failure that is the process's (no free descriptor) is said as such."""
    import errno

    from ...fs.load import loadable, private_copy

    name = loadable(fd)
    try:
        if name is not None:
            return _dlopen(name)
        with private_copy(fd, path) as copy:  # no /proc: a copy of the checked descriptor's bytes
            return _dlopen(copy)
    except OSError as e:
        text = one_line(str(e))
        if getattr(e, "errno", None) in (errno.EMFILE, errno.ENFILE) or "Too many open files" in text:
            raise EnvironmentProblem(f"cannot load {path}: this process has no free file descriptor to open it "
                                     "with (too many open files)",
                                     "close descriptors the program does not need, or raise the limit (ulimit -n)") \
                from None
        raise EnvironmentProblem(f"cannot load {path}: {text}",
                                 f"remove {os.path.dirname(path)} and build again (torchgen-patch build)") from None


def _stated(dll: ctypes.CDLL) -> bytes | None:
    """What the library says of its own build (``torchgen_patch_build()``), or None if it says nothing."""
    from ..compile import IDENTITY_SYMBOL

    try:
        fn = getattr(dll, IDENTITY_SYMBOL)
    except AttributeError:
        return None
    fn.restype, fn.argtypes = ctypes.c_char_p, []
    return fn()


def _close(dll: ctypes.CDLL) -> None:
    import _ctypes

    try:
        _ctypes.dlclose(dll._handle)
    except (OSError, AttributeError):
        pass


def load_built(library: str) -> ctypes.CDLL:
    """A build of torchgen-patch (the boxed library, say), its record read through the trust checks."""
    from .. import artifact_at

    art = artifact_at(library, manifest=False)
    return load(art.path, art.sha256, art.root, art.key)


