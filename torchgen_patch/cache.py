"""The cache: content-keyed results (scans, overlays, the index of builds) and built libraries,
treated as input; and the one module of the package that touches a cache or build path.

A key hashes everything that decides a result: the inputs' bytes, the identity of the torchgen
and autograd codegen that did the work and this tool's own source, so a result of one world
never answers for another.

A name is not the object it named a moment ago, so nothing here uses a name twice. A directory
is walked from ``/`` one component at a time (``lstat``, then ``open`` with
``O_DIRECTORY|O_NOFOLLOW`` relative to the directory before it), each checked on its own open
descriptor (``Dir``): owned by this user or root (or an account named in
``$TORCHGEN_PATCH_TRUSTED_OWNERS``) and writable by nobody else (above the root, others' write
access only with the sticky bit, as on /tmp). A symlink on the way is followed only when a
trusted account owns it and the kernel's ``protected_symlinks`` rule would follow it (never one
in a sticky world-writable directory that neither you nor that directory's owner owns). Below
the root nothing is followed through a symlink, and every later operation — entries, locks,
temporary builds and their leases, the build itself (run with that directory as its working
directory), the rename of a finished build into place, the sweep of stale ones, the library's
own descriptor — is relative to a checked descriptor.

An entry is used only when it is a regular file of a trusted owner that nobody else can write
and its proof holds (an HMAC with this cache's key: an entry written by anything else than
torchgen-patch, edited, damaged or copied from another cache is not one); what it holds is then
validated by its reader like any input. An entry that fails is ignored (one ``-v`` note) and
rebuilt; a root that fails is an ``EnvironmentProblem`` (exit 3) naming the path and the fix.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import hmac  # bound here, when the package is imported (under run, from the standard library's own directory)
import json
import os
import stat
import time

from .errors import EnvironmentProblem, InputError, ToolError
from .errors import no_descriptor as _descriptors
from .files import MAX_LINKS, loads, may_follow, owner_name
from .version import __version__

ENV = "TORCHGEN_PATCH_CACHE"
OWNERS_ENV = "TORCHGEN_PATCH_TRUSTED_OWNERS"
_ABSOLUTE: dict[str, str] = {}  # $TORCHGEN_PATCH_CACHE as given -> made absolute the first time it was seen
_NOTES: list = []  # callables that receive the -v notes (the CLI adds one with -v)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0)


def _base() -> str:
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
    return os.path.join(_base(), "torchgen-patch")


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
    """This tool's own source (the package's .py and .in files, read as package data)."""
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
    return set(_trusted(os.geteuid(), os.environ.get(OWNERS_ENV, "")))


@functools.lru_cache(maxsize=8)
def _trusted(me: int, named: str) -> frozenset[int]:
    import pwd

    uids = {me, 0}
    for name in filter(None, (n.strip() for n in named.split(","))):
        if name.isdigit():
            uids.add(int(name))
            continue
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            raise EnvironmentProblem(f"${OWNERS_ENV} names '{name}', which is no user of this machine",
                                     "list account names or uids, separated by commas") from None
    return frozenset(uids)


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


def library_refusal(library: str) -> tuple[str, str]:
    return (f"loads no native code from {library}",
            f"they could replace the library, so torchgen-patch does not load {library}")


def _link_problem(link: str, st: os.stat_result, parent: os.stat_result, uids, refusal) -> tuple | None:
    """A symlink is followed only when a trusted account owns it and the kernel's protected_symlinks
    rule would follow it: in a sticky directory others may write, only a link of yours or of the
    directory's owner."""
    why = problem(link, st, False, uids, *refusal)
    if why:
        return why
    if not may_follow(parent, st):
        return (f"{link} is a symlink of {owner_name(st.st_uid)} in the shared directory {os.path.dirname(link)}: "
                f"torchgen-patch follows none there (as the kernel's protected_symlinks rule does not)",
                f"point {ENV} at a directory of your own")
    return None


class Missing(Exception):
    """A path (or a component of it) does not exist."""


# ---- directories by descriptor ------------------------------------------------------------------

class Dir:
    """An open directory that passed the checks, and every operation below it, relative to it.
    ``path`` is for messages (and for other processes); no operation here resolves it."""

    __slots__ = ("fd", "path", "refusal")

    def __init__(self, fd: int, path: str, refusal: tuple[str, str]):
        self.fd, self.path, self.refusal = fd, path, refusal

    def __enter__(self) -> Dir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def join(self, *names: str) -> str:
        return os.path.join(self.path, *names)

    def _check(self, name: str, st: os.stat_result) -> None:
        why = problem(self.join(name) if name else self.path, st, True, trusted_uids(), *self.refusal)
        if why:
            raise EnvironmentProblem(*why)

    def lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def names(self) -> list[str]:
        return os.listdir(self.fd)

    def sub(self, name: str, create: bool = False, refusal: tuple[str, str] | None = None) -> Dir:
        """``name`` below this directory (``a/b`` walks each), checked, never through a symlink;
        created private (0700) when ``create``. Missing: ``Missing``. ``refusal``: what a failed
        check refuses (default: this directory's)."""
        refusal = refusal or self.refusal
        here, fd = self, None
        try:
            for part in [p for p in name.split(os.sep) if p]:
                nfd = here._open_sub(part, create)
                nxt = Dir(nfd, here.join(part), refusal)
                try:
                    nxt._check("", os.fstat(nfd))
                except BaseException:
                    nxt.close()
                    raise
                if fd is not None:
                    fd.close()
                here = fd = nxt
            return here if fd is not None else Dir(os.dup(self.fd), self.path, refusal)
        except BaseException:
            if fd is not None:
                fd.close()
            raise

    def _open_sub(self, part: str, create: bool) -> int:
        """The directory ``part`` here, opened (never through a symlink); made private first when
        ``create`` and missing, again as often as it is removed meanwhile (a few times)."""
        for _ in range(_TRIES if create else 1):
            if create:
                try:
                    os.mkdir(part, 0o700, dir_fd=self.fd)
                except FileExistsError:
                    pass
            try:
                return os.open(part, _DIR_FLAGS, dir_fd=self.fd)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise _descriptors(e, self.join(part)) or _not_a_directory(self, part, e) from None
        if create:
            raise EnvironmentProblem(f"{self.join(part)} kept changing while torchgen-patch made it (another process "
                                     "is removing it)")
        raise Missing(self.join(part))

    def open(self, name: str, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
        """An fd on the regular file ``name`` (no symlink followed), checked: a trusted owner, nobody
        else can write. ``Missing`` when absent; EnvironmentProblem when it fails a check."""
        try:
            fd = os.open(name, flags | _FILE_FLAGS, mode, dir_fd=self.fd)
        except FileNotFoundError:
            raise Missing(self.join(name)) from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                st = self.lstat(name)
                why = st is not None and problem(self.join(name), st, True, trusted_uids(), *self.refusal)
                raise EnvironmentProblem(*(why or (f"{self.join(name)} is a symlink: torchgen-patch follows none "
                                                   f"inside {self.path}", f"remove {self.join(name)}"))) from None
            raise _descriptors(e, self.join(name)) or EnvironmentProblem(
                f"cannot open {self.join(name)}: {e.strerror}", cause=e.strerror, errno=e.errno) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise EnvironmentProblem(f"{self.join(name)} is not a regular file", f"remove {self.join(name)}")
            self._check(name, st)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def read(self, name: str) -> bytes:
        fd = self.open(name)
        with os.fdopen(fd, "rb") as fh:
            return fh.read()

    def create(self, name: str, data: bytes, mode: int = 0o644) -> None:
        """A new file ``name`` (never an existing one, never through a symlink) holding ``data``."""
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=self.fd)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)

    def replace(self, name: str, data: bytes, mode: int = 0o644) -> None:
        """``name`` replaced whole: written to a new temporary file here, then renamed over it."""
        tmp = f".tmp-{os.getpid()}-{os.urandom(6).hex()}"
        try:
            self.create(tmp, data, mode)
            os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            raise

    def link_new(self, name: str, data: bytes, mode: int = 0o600) -> bool:
        """Create ``name`` with ``data`` only if it does not exist, never visible half-written:
        a temporary file hard-linked into place. False when another process was first."""
        tmp = f".tmp-{os.getpid()}-{os.urandom(6).hex()}"
        self.create(tmp, data, mode)
        try:
            os.link(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd, follow_symlinks=False)
            return True
        except FileExistsError:
            return False
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)

    def mkdtemp(self, prefix: str) -> Dir:
        """A new private (0700) directory ``prefix`` + random letters here, opened."""
        for _ in range(100):
            name = prefix + os.urandom(5).hex()
            try:
                os.mkdir(name, 0o700, dir_fd=self.fd)
            except FileExistsError:
                continue
            return self.sub(name)
        raise EnvironmentProblem(f"cannot make a temporary directory in {self.path}")

    def rename(self, src: str, dst: str, into: Dir | None = None) -> None:
        os.rename(src, dst, src_dir_fd=self.fd, dst_dir_fd=(into or self).fd)

    def remove(self, name: str) -> None:
        """``name`` and, for a directory, everything below it, never following a symlink."""
        try:  # opened first, as a directory, never through a symlink: what is emptied is what was opened
            fd = os.open(name, _DIR_FLAGS, dir_fd=self.fd)
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            with contextlib.suppress(FileNotFoundError):  # a file, a symlink: the entry itself goes
                os.unlink(name, dir_fd=self.fd)
            return
        with Dir(fd, self.join(name), self.refusal) as d:
            for n in d.names():
                d.remove(n)
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(name, dir_fd=self.fd)

    def owner_writable_only(self) -> None:
        """chmod go-w everything below (a umask of 002 would leave a build group-writable, which
        install refuses); symlinks are left as they are."""
        own = os.fstat(self.fd)
        if own.st_mode & 0o022:
            os.chmod(self.fd, stat.S_IMODE(own.st_mode) & ~0o022)
        for n in self.names():
            st = self.lstat(n)
            if st is None or stat.S_ISLNK(st.st_mode):
                continue
            if stat.S_ISDIR(st.st_mode):
                with self.sub(n) as d:
                    d.owner_writable_only()
            elif st.st_mode & 0o022:
                os.chmod(n, stat.S_IMODE(st.st_mode) & ~0o022, dir_fd=self.fd, follow_symlinks=False)

    @contextlib.contextmanager
    def lock(self, name: str, wait_note: str | None = None):
        """An exclusive lock on the file ``name`` here: created with O_CREAT|O_NOFOLLOW (a symlink
        planted there is refused, not followed), never truncated, and used only when it is a
        regular file of a trusted owner. ``wait_note``: a -v note when another process holds it."""
        import fcntl

        try:
            fd = self.open(name, os.O_RDWR | os.O_CREAT, 0o600)
        except Missing:  # the directory itself went away
            raise EnvironmentProblem(f"cannot open the lock {self.join(name)}: its directory is gone") from None
        except EnvironmentProblem as e:
            if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
            raise EnvironmentProblem(f"cannot use the lock {self.join(name)}: {e.message}",
                                     f"remove {self.join(name)} (it must be a plain file of yours)",
                                     cause=e.cause or e.message, errno=e.errno) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if wait_note:
                    note(wait_note)
                fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield fd
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def run(self, argv: list[str], **popen):
        """``subprocess.Popen(argv)`` with this directory as its working directory, set from the
        descriptor in the child (``fchdir``), never from the name. ``preexec`` (a callable) runs
        after it."""
        import subprocess

        fd, then = self.fd, popen.pop("preexec", None)

        def child():
            os.fchdir(fd)
            if then is not None:
                then()

        return subprocess.Popen(argv, preexec_fn=child, **popen)


def _not_a_directory(here: Dir, part: str, e: OSError) -> EnvironmentProblem:
    p = here.join(part)
    if e.errno == errno.ELOOP:
        return EnvironmentProblem(f"{p} is a symlink: torchgen-patch follows none inside {here.path}", f"remove {p}")
    if e.errno == errno.ENOTDIR:
        return EnvironmentProblem(f"{p} is not a directory", f"remove {p}")
    return EnvironmentProblem(f"cannot open {p}: {e.strerror}")


def open_dir(path: str, refusal: tuple[str, str] | None = None, create: bool = False, strict: bool = True) -> Dir:
    """The directory ``path``, walked from ``/`` one component at a time and checked on each
    descriptor (above it the lenient rule, the directory itself the strict one unless ``strict``
    is False: a shared temporary directory that holds private ones), symlinks on the way followed
    only where ``_link_problem`` allows. ``create``: missing components are made private (0700).
    ``Missing`` when it does not exist (and is not to be created)."""
    refusal = refusal or cache_refusal(path)
    uids = trusted_uids()
    todo = [p for p in os.path.abspath(path).split(os.sep) if p]
    stack: list[tuple[int, str, os.stat_result]] = []

    def push(fd: int, here: str) -> None:
        stack.append((fd, here, os.fstat(fd)))

    def check_top() -> None:
        fd, here, st = stack[-1]
        if not stat.S_ISDIR(st.st_mode):
            raise EnvironmentProblem(f"{here} is not a directory",
                                     f"set {ENV} to a directory of yours" if not todo else f"remove {here}")
        why = problem(here, st, strict and not todo, uids, *refusal)
        if why:
            raise EnvironmentProblem(*why)

    try:
        try:
            push(os.open(os.sep, _DIR_FLAGS), os.sep)
        except OSError as e:
            raise _descriptors(e, os.sep) or EnvironmentProblem(f"cannot open /: {e.strerror}") from None
        check_top()
        links = 0
        while todo:
            name = todo.pop(0)
            fd, here, st = stack[-1]
            if name == ".":
                continue
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop()[0])
                continue
            p = os.path.join(here, name)
            nfd, target = _step(fd, name, p, st, uids, refusal, create)
            if target is not None:
                links += 1
                if links > MAX_LINKS:
                    raise EnvironmentProblem(f"{p}: too many symlinks")
                if target.startswith(os.sep):
                    while len(stack) > 1:
                        os.close(stack.pop()[0])
                todo[:0] = [t for t in target.split(os.sep) if t]
                continue
            if nfd is None:
                raise EnvironmentProblem(f"{p} is not a directory", f"set {ENV} to a directory of yours"
                                         if not todo and path == directory() else f"name a directory, not {p}")
            push(nfd, p)
            check_top()
        fd, here, _ = stack.pop()
        return Dir(fd, here, refusal)
    finally:
        for fd, _, _ in stack:
            os.close(fd)


_TRIES = 8  # looks at one name that keeps changing before that is the answer


def _step(fd: int, name: str, p: str, parent: os.stat_result, uids, refusal, create: bool):
    """One component of ``open_dir``: (an open descriptor of the directory ``name`` in ``fd``, None) or
    (None, a symlink's target, the link checked by ``_link_problem``) or (None, None): something
    else is there. Opened first (O_NOFOLLOW), looked at only when that fails: what is checked
    afterwards is the descriptor, never the name again. A name that comes and goes while it is
    looked at (another account's directory in a shared one) is looked at again, a few times, then
    one EnvironmentProblem; a directory that cannot be made is an InputError."""
    for _ in range(_TRIES):
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=fd), None
        except FileNotFoundError:
            if not create:
                raise Missing(p) from None
            try:
                os.mkdir(name, 0o700, dir_fd=fd)
            except FileExistsError:
                pass
            except OSError as e:
                raise InputError(p, None, f"cannot create the directory: {e.strerror}",
                                 f"set {ENV} to a writable directory", cause=e.strerror, errno=e.errno) from None
            continue
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise _descriptors(e, p) or EnvironmentProblem(
                    f"cannot open {p} to check it: {e.strerror}") from None
        try:  # a symlink (ELOOP) or no directory (ENOTDIR): which?
            lst = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISLNK(lst.st_mode):
                if stat.S_ISDIR(lst.st_mode):
                    continue  # a directory again by now
                return None, None
            why = _link_problem(p, lst, parent, uids, refusal)
            if why:
                raise EnvironmentProblem(*why)
            return None, os.readlink(name, dir_fd=fd)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.EINVAL):  # gone, or no link any more
                continue
            raise _descriptors(e, p) or EnvironmentProblem(
                f"cannot check {p} before torchgen-patch uses it: {e.strerror}") from None
    raise EnvironmentProblem(f"{p} kept changing while torchgen-patch checked it (another process is making and "
                             "removing it)", f"point {ENV} at a directory of your own")


def check_path(path: str, root: str, refusal: tuple[str, str]) -> None:
    """``path`` (a file or directory) and every directory above it checked as ``open_dir`` and
    ``Dir.open`` would (``root``: where the strict rule starts)."""
    with open_under(root, os.path.relpath(os.path.abspath(path), os.path.abspath(root)), refusal) as (d, name):
        if name:
            os.close(d.open(name))


@contextlib.contextmanager
def open_under(root: str, rel: str, refusal: tuple[str, str], create: bool = False):
    """(the checked directory that holds ``root/rel``, its last component or '' for root itself)."""
    parts = [p for p in rel.split(os.sep) if p and p != "."]
    if parts and parts[0] == "..":
        raise EnvironmentProblem(f"{os.path.join(root, rel)} is not inside {root}")
    with open_dir(root, refusal, create=create) as r:
        if len(parts) <= 1:
            yield r, (parts[0] if parts else "")
            return
        with r.sub(os.sep.join(parts[:-1]), create=create) as d:
            yield d, parts[-1]


@contextlib.contextmanager
def library_dir(path: str, refusal: tuple[str, str] | None = None):
    """The checked directory of the file ``path`` (a library, a record), and where its strict rule
    starts: the cache root when ``path`` is inside the cache (every directory from the root down
    strict, none followed through a symlink), else its own directory."""
    path = os.path.abspath(path)
    d, root = os.path.dirname(path), directory()
    start = root if inside(d, root) else d
    with open_under(start, os.path.relpath(path, start), refusal or library_refusal(path)) as (dirs, name):
        yield dirs, start, name


def names_a_build(path: str) -> bool:
    """Whether ``path`` (an index entry's) names a file of a build of this cache: a normalised absolute
    path inside ``<root>/builds/``, the root as named or as the walk from ``/`` reached it (a root
    reached through a symlink names its builds by where they are); whether it is one is for the
    build's own checks to say."""
    if os.path.normpath(path) != path:
        return False
    return any(path.startswith(os.path.join(r, "builds") + os.sep) for r in {directory(), _walked_root()} if r)


_WALKED: dict = {}  # the root as named -> as the walk reached it (kept once it could be opened)


def _walked_root() -> str | None:
    d = directory()
    if d not in _WALKED:
        try:
            root = open_root()
        except ToolError:
            return None
        if root is None:
            return None
        _WALKED[d] = root.path
        root.close()
    return _WALKED[d]


# ---- the root, entries, proofs --------------------------------------------------------------------

def open_root(create: bool = False) -> Dir | None:
    """The cache root, checked (created private when ``create``), or None when it does not exist (or
    cannot be created: an unwritable cache only makes the next run slower); a root another account
    could write is an EnvironmentProblem."""
    d = directory()
    try:
        return open_dir(d, cache_refusal(d), create=create)
    except Missing:
        return None
    except InputError:  # could not create it (one others could write: EnvironmentProblem, raised)
        return None


def subdir(name: str) -> Dir:
    """``<root>/<name>``, created private, the root and it checked (EnvironmentProblem if not)."""
    d = directory()
    try:
        with open_dir(d, cache_refusal(d), create=True) as r:
            return r.sub(name, create=True)
    except InputError as e:  # could not be made
        raise EnvironmentProblem(f"cannot create {os.path.join(d, name)}: {e.cause or e.message}",
                                 f"set {ENV} to a writable directory") from None
    except OSError as e:
        raise EnvironmentProblem(f"cannot create {os.path.join(d, name)}: {e.strerror}",
                                 f"set {ENV} to a writable directory") from None


LOCKS = "locks"


def lock_file(*identity: str) -> int:
    """An open lock file of this user's own for ``identity`` (what it serializes: gen's output in a
    directory others can write, say), in the cache's private ``locks`` directory, where no other
    account can make, hold or remove it; the caller flocks it, and it stays (an empty file). An
    EnvironmentProblem when the cache cannot hold it."""
    name = "lock-" + key(*identity)[:32]
    with subdir(LOCKS) as d:
        try:
            return d.open(name, os.O_RDWR | os.O_CREAT, 0o600)
        except Missing:
            raise EnvironmentProblem(f"cannot open the lock {d.join(name)}: its directory is gone") from None


KEY_FILE = "entries.key"
_PROOF = b"tgp-proof-1 "


def _entry_key(r: Dir, create: bool) -> bytes | None:
    """This cache's key for the entries' proofs: random, made once (a trusted owner's regular file
    that nobody else can write, like any entry), None when there is none (and none can be made).
    Read each time (a few microseconds): a cache removed and made again has a key of its own."""
    for _ in range(2):
        try:
            data = r.read(KEY_FILE)
        except Missing:
            if not create:
                return None
            try:
                r.link_new(KEY_FILE, os.urandom(32).hex().encode(), 0o600)
            except OSError:
                return None
            continue
        except (EnvironmentProblem, OSError) as e:
            note(f"cache key {r.join(KEY_FILE)} not used: {getattr(e, 'message', e)}")
            return None
        if len(data) != 64:
            note(f"cache key {r.join(KEY_FILE)} not used: damaged")
            return None
        return data
    return None


def _proof(k: bytes, name: str, body: bytes) -> bytes:
    return hmac.new(k, name.encode() + b"\0" + body, hashlib.sha256).hexdigest().encode()


def sign(name: str, body: bytes, k: bytes) -> bytes:
    """What an entry file holds: the proof line, then the body."""
    return _PROOF + _proof(k, name, body) + b"\n" + body


def read(name: str):
    """The JSON of the entry ``name``, or None (missing, unsafe, unproven, damaged: a -v note, never
    an error). The caller validates what it gets like any input."""
    r = open_root()
    if r is None:
        return None
    with r:
        try:
            raw = r.read(name)
        except Missing:
            return None
        except EnvironmentProblem as e:
            note(f"cache entry ignored: {e.message}")
            return None
        except OSError as e:
            note(f"cache entry {r.join(name)} ignored: {e.strerror}")
            return None
        k = _entry_key(r, create=False)
        head, _, body = raw.partition(b"\n")
        if k is None or not head.startswith(_PROOF) or not hmac.compare_digest(head[len(_PROOF):],
                                                                                _proof(k, name, body)):
            note(f"cache entry {r.join(name)} ignored: not written by torchgen-patch with this cache's key "
                 "(edited, damaged or from elsewhere)")
            return None
        try:
            return loads(body)
        except ValueError as e:
            note(f"cache entry {r.join(name)} ignored: damaged ({type(e).__name__})")
            return None


def write(name: str, data) -> None:
    r = open_root(create=True)
    if r is None:
        return
    with r:
        try:
            k = _entry_key(r, create=True)
            if k is not None:
                r.replace(name, sign(name, json.dumps(data, separators=(",", ":")).encode(), k))
        except (OSError, EnvironmentProblem):
            pass  # a full disk or a read-only cache costs the next run time, nothing else


def invalid(name: str, why: str) -> None:
    """A reader found entry ``name`` fails validation: say so (-v) and let it be rebuilt."""
    note(f"cache entry {os.path.join(directory(), name)} ignored: {why}; rebuilt")


def bytecode_dir(identity: str) -> str | None:
    """Where a checkout's torchgen keeps its bytecode: beside the result cache, not in it (emptying the
    result cache does not make the checkout's torchgen compile again), and only when it is private
    (bytecode is code). Python itself writes there by name (``sys.pycache_prefix``)."""
    d = os.path.join(_base(), "torchgen-patch-bytecode")
    try:
        with open_dir(d, cache_refusal(d), create=True) as b:
            st = os.fstat(b.fd)
    except (ToolError, Missing, OSError):
        return None
    if st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o022:
        return None
    return os.path.join(d, identity[:24])


# ---- leases: which temporary build is alive -------------------------------------------------------

LEASE = ".lease"
_STALE_AFTER = 24 * 3600  # a lease of another kernel (host) is trusted to be held for a day


_NO_BOOT_STALE = 3600  # a lease that names no kernel, whose process cannot be seen: judged by age, as no lease


def _proc(path: str, link: bool = False) -> str | None:
    """A /proc file's text (or a link's target), None where it cannot be read (no /proc)."""
    try:
        if link:
            return os.readlink(path)
        with open(path, encoding="ascii") as fh:  # a /proc file, not a cache path
            return fh.read().strip() or None
    except OSError:
        return None


@functools.cache
def host_identity() -> dict:
    """The kernel (boot id) and PID namespace this process runs in, and the host's name: a lock is
    authoritative within one kernel; a pid only within one namespace. Without /proc, ``boot`` and
    ``pidns`` are None: no identity, said as such."""
    import socket

    return {"boot": _proc("/proc/sys/kernel/random/boot_id"), "pidns": _proc("/proc/self/ns/pid", link=True),
            "host": socket.gethostname()}


def _gone(info: dict) -> bool:
    """Whether the process a lease names is known to be gone: one of this host and PID namespace (as the
    lease and this process say them, None alike) whose pid no longer exists."""
    me, pid = host_identity(), info.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    if info.get("host") != me["host"] or (info.get("pidns") or None) != me["pidns"]:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive, another account's
    return False


@contextlib.contextmanager
def leased(d: Dir):
    """Hold a lease on the temporary directory ``d`` while the block runs: its ``.lease`` file, locked
    (flock) by this process and saying where it runs (``host_identity``). The lock ends with the
    process, however it ends."""
    import fcntl

    fd = os.open(LEASE, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=d.fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps(dict(host_identity(), pid=os.getpid(), started=time.time())).encode())
        yield
    finally:
        with contextlib.suppress(OSError):  # held to the end: a directory renamed into place keeps none
            os.unlink(LEASE, dir_fd=d.fd)
        os.close(fd)


def _lease_expired(d: Dir, now: float) -> tuple[bool, str]:
    """(whether the temporary directory ``d`` may be removed, who left it). Its lease is expired when
    nobody holds its lock and it was taken in this kernel; a lease of another kernel (another
    host, a container on another machine, a boot before this one) whose lock is free here only
    after a day (locks may not cross hosts). A lease that names no kernel (taken where /proc could
    not be read) when its process is gone from this host and PID namespace, or after an hour; a
    directory without a lease after an hour."""
    import fcntl

    age = now - os.fstat(d.fd).st_mtime
    try:
        fd = os.open(LEASE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=d.fd)
    except FileNotFoundError:
        return age > 3600, "a process that left no lease"
    except OSError:
        return False, ""
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False, ""  # held: the build is alive
        try:
            info = loads(os.pread(fd, 4096, 0) or b"{}")
        except ValueError:
            info = {}
        if not isinstance(info, dict) or "pid" not in info:
            return age > 60, "a process that died while starting"  # written right after the lock is taken
        who = f"process {info.get('pid')} on {info.get('host') or 'an unknown host'}"
        boot, mine = info.get("boot") or None, host_identity()["boot"]
        if boot is None:  # no kernel to judge the free lock by: the pid and the age
            return _gone(info) or age > _NO_BOOT_STALE, who
        return boot == mine or age > _STALE_AFTER, who  # mine None: this kernel cannot be told from its
    finally:
        os.close(fd)


def sweep(d: Dir, prefixes: tuple[str, ...]) -> list[str]:
    """Remove the temporary directories (names starting with ``prefixes``) under ``d`` whose lease
    expired; returns their names."""
    gone, now = [], time.time()  # type: list[str], float
    try:
        names = d.names()
    except OSError:
        return gone
    for n in sorted(names):
        if not n.startswith(prefixes):
            continue
        try:
            with d.sub(n) as t:
                expired, who = _lease_expired(t, now)
        except (EnvironmentProblem, Missing, OSError):
            continue
        if expired:
            try:
                d.remove(n)
            except OSError as e:  # something of another process's in it, or in its way: the next sweep tries again
                note(f"could not remove {d.join(n)}, left by {who}: {e.strerror}")
                continue
            note(f"removed {d.join(n)}, left by {who}, which is gone")
            gone.append(n)
    return gone


# ---- what a library is loaded as ---------------------------------------------------------------

_LOADS = [0]  # how many libraries this process has loaded through ``loadable``


def loadable(fd: int) -> str | None:
    """A name under which ``dlopen`` opens exactly the file behind ``fd`` and no library loaded
    before: ``/proc/self/fd/N``, spelt differently for each load (the dynamic loader returns an
    already-loaded object whose name matches, and a program may close and reuse descriptor numbers).
    None where this system has no ``/proc/self/fd`` (load a private copy: ``private_copy``)."""
    if not os.path.isdir("/proc/self/fd"):
        return None
    _LOADS[0] += 1
    return f"/proc/self/fd/{'./' * _LOADS[0]}{fd}"


@contextlib.contextmanager
def private_copy(fd: int, name: str):
    """Where ``/proc/self/fd`` is missing: the file behind ``fd`` copied into a new private directory
    (0700, in the temporary directory), its path for ``dlopen`` while the block runs (the copy is
    removed after: the loaded mapping stays)."""
    import tempfile

    base = tempfile.gettempdir()
    try:
        tmp = open_dir(base, library_refusal(name), strict=False)
    except EnvironmentProblem as e:  # the temporary directory is the problem, not the cache
        raise EnvironmentProblem(f"{e.message} (without /proc the library is loaded from a private copy made in "
                                 f"the temporary directory {base})", "set TMPDIR to a directory of your own") from None
    with tmp:
        with tmp.mkdtemp("torchgen-patch-load-") as d:
            out = os.open("lib.so", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o500,
                          dir_fd=d.fd)
            try:
                offset = 0
                while chunk := os.pread(fd, 1 << 20, offset):
                    os.write(out, chunk)
                    offset += len(chunk)
            finally:
                os.close(out)
            try:
                yield d.join("lib.so")
            finally:
                tmp.remove(os.path.basename(d.path))
