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
  without following symlinks (a symlink on the way only when a trusted account owns it),
  every check runs on the open descriptors, and the library is loaded from that
  descriptor (``loadable``), so replacing the path after the check changes nothing.

A failure is an ``EnvironmentProblem`` (exit 3) naming the path and the fix;
nothing is rebuilt in its place. See SECURITY.md.
"""

from __future__ import annotations

import hashlib
import os
import stat

from ..cache import OWNERS_ENV, inside, problem, trusted_uids
from ..cache import owner_name as _owner  # noqa: F401  (the name the tests use)
from ..cache import check_path as _check_path
from ..errors import EnvironmentProblem

__all__ = ["OWNERS_ENV", "inside", "trusted_uids", "check_path", "check_library", "open_library", "sha256_of"]
_VERIFIED: set[tuple] = set()  # (dev, ino, size, mtime_ns, ctime_ns, sha256) hashed in this process
_MAX_LINKS = 40  # symlinks followed on one path, as the kernel's own limit


def _refusal(library: str) -> tuple[str, str]:
    return (f"loads no native code from {library}",
            f"they could replace the library, so torchgen-patch does not load {library}")


def check_path(path: str, root: str, library: str | None = None) -> None:
    """``path`` (a file or directory) and every directory above it: see the module's rules.
    ``root``: where the strict rule starts (a cache root, a site-packages directory);
    ``library``: the library this check is for, named in the message (default ``path``)."""
    _check_path(path, root, _refusal(library or path))


def open_library(path: str, root: str, library: str | None = None) -> int:
    """An fd on ``path``, opened component by component from ``/`` without following a symlink
    (``O_NOFOLLOW``), each directory checked on its own open descriptor; a symlink on the way is
    followed only when a trusted account owns it (its target is then walked the same way). What
    the fd names is the file that was checked, whatever happens to the path afterwards."""
    library = library or path
    refusal, uids = _refusal(library), trusted_uids()
    real_root = os.path.realpath(root)
    todo = [p for p in os.path.abspath(path).split(os.sep) if p]
    here, fd, links = os.sep, os.open(os.sep, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), 0
    try:
        _check_fd(fd, here, real_root, uids, refusal)
        while todo:
            name = todo.pop(0)
            if name == "..":
                todo[:0] = [p for p in os.path.dirname(here).split(os.sep) if p]
                here, fd = _reopen_root(fd)
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError as e:
                raise EnvironmentProblem(f"cannot check {os.path.join(here, name)} before loading native code "
                                         f"from it: {e.strerror}") from None
            if stat.S_ISLNK(st.st_mode):
                link = os.path.join(here, name)
                why = problem(link, st, False, uids, *refusal)
                links += 1
                if why or links > _MAX_LINKS:
                    raise EnvironmentProblem(*(why or (f"{link}: too many symlinks", None)))
                target = os.readlink(name, dir_fd=fd)
                rest = [p for p in target.split(os.sep) if p and p != "."]
                if target.startswith(os.sep):
                    here, fd = _reopen_root(fd)
                    _check_fd(fd, here, real_root, uids, refusal)
                todo[:0] = rest
                continue
            last = not todo
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_NONBLOCK if last else os.O_DIRECTORY)
            try:
                nfd = os.open(name, flags, dir_fd=fd)
            except OSError as e:
                raise EnvironmentProblem(f"cannot open {os.path.join(here, name)} to check it: {e.strerror}") \
                    from None
            os.close(fd)
            fd, here = nfd, os.path.join(here, name)
            _check_fd(fd, here, real_root, uids, refusal)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _reopen_root(fd: int) -> tuple[str, int]:
    os.close(fd)
    return os.sep, os.open(os.sep, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _check_fd(fd: int, here: str, real_root: str, uids: set[int], refusal) -> None:
    why = problem(here, os.fstat(fd), inside(here, real_root), uids, *refusal)
    if why:
        raise EnvironmentProblem(*why)


def sha256_of(path: str | int) -> str:
    """The SHA-256 of a file (a path, or an open descriptor read from its start)."""
    h = hashlib.sha256()
    if isinstance(path, int):
        offset = 0
        while chunk := os.pread(path, 1 << 20, offset):
            h.update(chunk)
            offset += len(chunk)
        return h.hexdigest()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def check_library(path: str, expected_sha256: str | None, root: str) -> int:
    """Refuse (EnvironmentProblem) to load ``path`` unless it passes the checks of ``open_library``
    under ``root``, is a regular file and its SHA-256 is ``expected_sha256`` (what its build
    recorded). Returns the open descriptor that was checked: load that (``loadable``), never the path."""
    fd = open_library(path, root)
    try:
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
        return fd
    except BaseException:
        os.close(fd)
        raise


def loadable(fd: int) -> str:
    """The name under which ``dlopen`` opens exactly the file behind ``fd`` (keep ``fd`` open for as
    long as the library stays loaded: the dynamic loader knows a library by this name)."""
    return f"/proc/self/fd/{fd}"
