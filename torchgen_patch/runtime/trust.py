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
  so a truncated copy or an edited file is never loaded.

A failure is an ``EnvironmentProblem`` (exit 3) naming the path and the fix;
nothing is rebuilt in its place. See SECURITY.md.
"""

from __future__ import annotations

import hashlib
import os
import stat

from ..errors import EnvironmentProblem

OWNERS_ENV = "TORCHGEN_PATCH_TRUSTED_OWNERS"
_VERIFIED: set[tuple] = set()  # (path, dev, ino, size, mtime_ns, ctime_ns, sha256) hashed in this process


def trusted_uids() -> set[int]:
    """This user, root, and the accounts (names or uids, comma-separated) in $TORCHGEN_PATCH_TRUSTED_OWNERS."""
    import pwd

    uids = {os.geteuid(), 0}
    for name in filter(None, (n.strip() for n in os.environ.get(OWNERS_ENV, "").split(","))):
        if name.isdigit():
            uids.add(int(name))
            continue
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            raise EnvironmentProblem(f"${OWNERS_ENV} names '{name}', which is no user of this machine",
                                     "list account names or uids, separated by commas") from None
    return uids


def _owner(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def check_path(path: str, root: str, library: str | None = None) -> None:
    """``path`` (a file or directory) and every directory above it: see the module's rules.
    ``root``: where the strict rule starts (a cache root, a site-packages directory);
    ``library``: the library this check is for, named in the message (default ``path``)."""
    library = library or path
    real, real_root = os.path.realpath(path), os.path.realpath(root)
    uids = trusted_uids()
    parts = real.split(os.sep)
    for i in range(1, len(parts) + 1):
        p = os.sep.join(parts[:i]) or os.sep
        try:
            st = os.stat(p)
        except OSError as e:
            raise EnvironmentProblem(f"cannot check {p} before loading native code from it: {e.strerror}") from None
        if st.st_uid not in uids:
            raise EnvironmentProblem(
                f"{p} is owned by {_owner(st.st_uid)}, not by you or root: torchgen-patch loads no native code "
                f"from {library}",
                f"use a cache of your own (TORCHGEN_PATCH_CACHE), or, if you trust that account with your "
                f"processes, name it in ${OWNERS_ENV}")
        others_write = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if not others_write:
            continue
        strict = inside(p, real_root)
        if strict or not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
            who = "group and others" if st.st_mode & stat.S_IWGRP and st.st_mode & stat.S_IWOTH else \
                "its group" if st.st_mode & stat.S_IWGRP else "others"
            raise EnvironmentProblem(
                f"{p} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}): they could replace the "
                f"library, so torchgen-patch does not load {library}",
                f"chmod go-w {p}" + ("" if strict else ", or move the cache (TORCHGEN_PATCH_CACHE) elsewhere"))


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def check_library(path: str, expected_sha256: str | None, root: str) -> None:
    """Refuse (EnvironmentProblem) to load ``path`` unless it passes ``check_path`` under ``root``,
    is a regular file and its SHA-256 is ``expected_sha256`` (what its build recorded)."""
    check_path(path, root)
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise EnvironmentProblem(f"{path} is not a regular file: torchgen-patch loads no native code from it")
    if not expected_sha256:
        raise EnvironmentProblem(f"{path} has no SHA-256 in its build record (built by an older torchgen-patch): "
                                 "it cannot be checked, so it is not loaded",
                                 f"remove {os.path.dirname(path)} and build again (torchgen-patch build)")
    seen = (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns,
            expected_sha256)
    if seen in _VERIFIED:  # the same file, unchanged since this process hashed it
        return
    actual = sha256_of(path)
    if actual != expected_sha256:
        raise EnvironmentProblem(
            f"{path} is not the library that was built (sha256 {actual[:16]}, its build recorded "
            f"{expected_sha256[:16]}): damaged (an interrupted copy?) or replaced, so it is not loaded",
            f"remove {os.path.dirname(path)} and build again (torchgen-patch build)")
    _VERIFIED.add(seen)
