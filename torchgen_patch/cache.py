"""The cache: content-keyed results (scans, overlays) and built libraries, treated as input.

One module owns the cache root, for every stage that keeps something there (scan, plan,
runtime). A key hashes everything that decides a result: the inputs' bytes, the identity
of the torchgen and autograd codegen that did the work and this tool's own source, so a
result of one world never answers for another.

Nothing is read from or written under the root before it passes the same checks as a
library that is about to be loaded (``check_path``): the root and every directory above
it are owned by this user or root (or an account named in ``$TORCHGEN_PATCH_TRUSTED_OWNERS``)
and writable by nobody else (above the root: unless the sticky bit is set, as on /tmp).
An entry is opened without following a symlink and used only when it is a regular file of
a trusted owner that nobody else can write; what it holds is then validated by its reader
like any input. An entry that fails is ignored (one ``-v`` note) and rebuilt; a root
that fails is an ``EnvironmentProblem`` (exit 3) naming the path and the fix.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import stat

from .errors import EnvironmentProblem
from .files import atomic_write, private_dirs
from .version import __version__

ENV = "TORCHGEN_PATCH_CACHE"
OWNERS_ENV = "TORCHGEN_PATCH_TRUSTED_OWNERS"
_ABSOLUTE: dict[str, str] = {}  # $TORCHGEN_PATCH_CACHE as given -> made absolute the first time it was seen
_CHECKED: set[tuple] = set()  # roots that passed check_path in this process, with their (dev, ino, mode, uid)
_NOTES: list = []  # callables that receive the -v notes (the CLI adds one with -v)


def directory() -> str:
    """The cache root, always absolute: a relative ``$TORCHGEN_PATCH_CACHE`` is resolved against the
    working directory of the first call, once, so a later ``chdir`` or a child process (``run``
    exports the absolute path) never lands elsewhere."""
    raw = os.environ.get(ENV)
    if raw:
        if raw not in _ABSOLUTE:
            _ABSOLUTE[raw] = os.path.abspath(raw)
        return _ABSOLUTE[raw]
    return os.path.join(os.path.abspath(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")),
                        "torchgen-patch")


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


@functools.cache
def tool_fingerprint() -> str:
    h = hashlib.sha256(__version__.encode())
    pkg = os.path.dirname(os.path.abspath(__file__))
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


# ---- who may have written a path ------------------------------------------------------------

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


def owner_name(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def problem(p: str, st: os.stat_result, strict: bool, uids: set[int], owned: str,
            writable: str) -> tuple[str, str] | None:
    """Why ``p`` (with ``st``) may have been written by another account, as (message, hint), or None.
    ``strict``: inside a root (no one else may write, sticky bit or not); ``owned``, ``writable``:
    what torchgen-patch refuses, for each message."""
    if st.st_uid not in uids:
        return (f"{p} is owned by {owner_name(st.st_uid)}, not by you or root: torchgen-patch {owned}",
                f"use a cache of your own ({ENV}), or, if you trust that account with your processes, "
                f"name it in ${OWNERS_ENV}")
    if not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or stat.S_ISLNK(st.st_mode):
        return None
    if not strict and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX:
        return None
    who = "group and others" if st.st_mode & stat.S_IWGRP and st.st_mode & stat.S_IWOTH else \
        "its group" if st.st_mode & stat.S_IWGRP else "others"
    return (f"{p} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}): {writable}",
            f"chmod go-w {p}" + ("" if strict else f", or move the cache ({ENV}) elsewhere"))


def cache_refusal(d: str) -> tuple[str, str]:
    return (f"uses no cache under {d}", f"they could replace what is there, so torchgen-patch uses no cache "
                                        f"under {d}")


def check_path(path: str, root: str, refusal: tuple[str, str]) -> None:
    """``path`` (a file or directory) and every directory above it, after resolving symlinks:
    owned by a trusted account and writable by nobody else (see the module's rules);
    ``root``: where the strict rule starts; ``refusal``: (owned, writable) for ``problem``."""
    real, real_root = os.path.realpath(path), os.path.realpath(root)
    uids = trusted_uids()
    parts = real.split(os.sep)
    for i in range(1, len(parts) + 1):
        p = os.sep.join(parts[:i]) or os.sep
        try:
            st = os.stat(p)
        except OSError as e:
            raise EnvironmentProblem(f"cannot check {p} before torchgen-patch uses it: {e.strerror}") from None
        why = problem(p, st, inside(p, real_root), uids, *refusal)
        if why:
            raise EnvironmentProblem(*why)


def root(create: bool = False) -> str | None:
    """The cache root once it passed ``check_path`` (created private when ``create``), else None
    when it does not exist; a root another account could write is an EnvironmentProblem."""
    d = directory()
    if create:
        try:
            private_dirs(d)
        except OSError:
            return None  # an unwritable cache only makes the next run slower
    try:
        st = os.stat(d)
    except OSError:
        return None
    seen = (d, st.st_dev, st.st_ino, st.st_mode, st.st_uid, os.environ.get(OWNERS_ENV))
    if seen not in _CHECKED:
        check_path(d, d, cache_refusal(d))
        _CHECKED.add(seen)
    return d


def subdir(name: str) -> str:
    """``<root>/<name>``, created private, the root and it checked (EnvironmentProblem if not)."""
    r = root(create=True) or directory()
    d = os.path.join(r, name)
    try:
        private_dirs(d)
    except OSError as e:
        raise EnvironmentProblem(f"cannot create {d}: {e.strerror}",
                                 f"set {ENV} to a writable directory") from None
    check_path(d, r, cache_refusal(r))
    return d


def open_entry(path: str, flags: int = os.O_RDONLY) -> int | None:
    """An fd on the cache file ``path`` (no symlink followed), or None when it is missing or not a
    regular file that a trusted account owns and nobody else can write (a -v note says why)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        note(f"cache entry {path} ignored: {e.strerror}")
        return None
    st = os.fstat(fd)
    why = "not a regular file" if not stat.S_ISREG(st.st_mode) else \
        (problem(path, st, True, trusted_uids(), *cache_refusal(os.path.dirname(path))) or (None,))[0]
    if why:
        os.close(fd)
        note(f"cache entry ignored: {why}")
        return None
    return fd


def read(name: str):
    """The JSON of the entry ``name``, or None (missing, unsafe, damaged: a -v note, never an error).
    The caller validates what it gets like any input."""
    r = root()
    if r is None:
        return None
    path = os.path.join(r, name)
    fd = open_entry(path)
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "rb") as fh:
            return json.loads(fh.read())
    except (OSError, ValueError) as e:
        note(f"cache entry {path} ignored: damaged ({type(e).__name__})")
        return None


def write(name: str, data) -> None:
    r = root(create=True)
    if r is None:
        return
    try:
        atomic_write(os.path.join(r, name), json.dumps(data, separators=(",", ":")).encode(), durable=False)
    except OSError:
        pass  # a full disk or a read-only cache costs the next run time, nothing else


def invalid(name: str, why: str) -> None:
    """A reader found entry ``name`` fails validation: say so (-v) and let it be rebuilt."""
    note(f"cache entry {os.path.join(directory(), name)} ignored: {why}; rebuilt")


@contextlib.contextmanager
def lock(path: str):
    """An exclusive lock on ``path`` inside a checked cache directory: created with O_CREAT|O_NOFOLLOW
    (a symlink planted there is refused, not followed), never truncated, and used only when it is
    a regular file of a trusted owner."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0),
                     0o600)
    except OSError as e:
        raise EnvironmentProblem(f"cannot open the lock {path}: {e.strerror}",
                                 f"remove {path} (it must be a plain file of yours)") from None
    try:
        st = os.fstat(fd)
        why = None if stat.S_ISREG(st.st_mode) else (f"{path} is not a regular file", f"remove {path}")
        why = why or problem(path, st, True, trusted_uids(), *cache_refusal(os.path.dirname(path)))
        if why:
            raise EnvironmentProblem(*why)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield fd
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
