"""Trust checks before native code is loaded into this process.

A shared library loaded with ``dlopen`` runs with the full rights of the
process, so before ``install()`` loads one (a cached build, the boxed library a
``run`` parent built, or a prebuilt kernels wheel's library) this module checks:

- the library and every directory from the cache ``root`` down to it are owned
  by this user or root (or an account named in ``$TORCHGEN_PATCH_TRUSTED_OWNERS``)
  and writable by nobody else, so no other local account can have replaced it;
- every directory above ``root`` is owned the same way and, when others may
  write it, carries the sticky bit (``/tmp``: nobody can rename what is yours);
- the library is a regular file whose SHA-256 is the one its build recorded,
  so a truncated copy or an edited file is never loaded;
- what is loaded is what was checked: the path is opened once, component by component
  without following symlinks (a symlink on the way only when a trusted account owns it
  and the kernel's protected_symlinks rule would follow it), every check runs on the open
  descriptors (``fs.dirs.Dir``), and the library is loaded from that descriptor, under a name
  no other load used (``fs.load.loadable``), so replacing the path after the check changes nothing.

A failure is an ``EnvironmentProblem`` (exit 3) naming the path and the fix;
nothing is rebuilt in its place. See SECURITY.md.
"""

from __future__ import annotations

import os
import stat

from ...errors import EnvironmentProblem
from ...fs import dirs
from ...fs.protected import Missing, library_refusal
from ..compile.record import sha256_of

__all__ = ["check_path", "check_library", "open_library"]
_VERIFIED: set[tuple] = set()  # (dev, ino, size, mtime_ns, ctime_ns, sha256) hashed in this process


def check_path(path: str, root: str, library: str | None = None) -> None:
    """``path`` (a file or directory) and every directory above it: see the module's rules.
    ``root``: where the strict rule starts (a cache root, a site-packages directory);
    ``library``: the library this check is for, named in the message (default ``path``)."""
    dirs.check_path(path, root, library_refusal(library or path))


def open_library(path: str, root: str, library: str | None = None) -> int:
    """An fd on the regular file ``path``, every directory from ``/`` checked on its own descriptor
    (the strict rule from ``root`` down, none followed through a symlink there): what the fd names
    is the file that was checked, whatever happens to the path afterwards."""
    refusal = library_refusal(library or path)
    try:
        with dirs.open_under(root, os.path.relpath(os.path.abspath(path), os.path.abspath(root)), refusal) \
                as (d, name):
            return d.open(name)
    except Missing as e:
        raise EnvironmentProblem(f"cannot check {e} before loading native code from it: "
                                 "No such file or directory") from None


def verify(fd: int, path: str, expected_sha256: str | None) -> None:
    """Refuse (EnvironmentProblem) the open file ``fd`` (``path``, for messages) unless it is a regular
    file whose SHA-256 is ``expected_sha256`` (what its build recorded)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise EnvironmentProblem(f"{path} is not a regular file: torchgen-patch loads no native code from it")
    if not expected_sha256:
        raise EnvironmentProblem(f"{path} has no SHA-256 in its build record (built by an older torchgen-patch): "
                                 "it cannot be checked, so it is not loaded",
                                 f"remove {os.path.dirname(path)} and build again (torchgen-patch build)")
    seen = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, expected_sha256)
    if seen not in _VERIFIED:  # else: the same file, unchanged since this process hashed it
        actual = sha256_of(fd)
        if actual != expected_sha256:
            raise EnvironmentProblem(
                f"{path} is not the library that was built (sha256 {actual[:16]}, its build recorded "
                f"{expected_sha256[:16]}): damaged (an interrupted copy?) or replaced, so it is not loaded",
                f"remove {os.path.dirname(path)} and build again (torchgen-patch build)")
        _VERIFIED.add(seen)


def check_library(path: str, expected_sha256: str | None, root: str) -> int:
    """Refuse (EnvironmentProblem) to load ``path`` unless it passes the checks of ``open_library``
    under ``root`` and ``verify``. Returns the open descriptor that was checked: load that, never
    the path."""
    fd = open_library(path, root)
    try:
        verify(fd, path, expected_sha256)
        return fd
    except BaseException:
        os.close(fd)
        raise
