"""Directories by descriptor: a directory is walked from ``/`` one component at a time (``lstat``,
then ``open`` with ``O_DIRECTORY|O_NOFOLLOW`` relative to the directory before it), each checked on
its own open descriptor (``Dir``): owned by this user or root (or an account named in
``$TORCHGEN_PATCH_TRUSTED_OWNERS``) and writable by nobody else (above the root, others' write
access only with the sticky bit, as on /tmp). A symlink on the way is followed only when a trusted
account owns it and the kernel's ``protected_symlinks`` rule would follow it. Below the root nothing
is followed through a symlink, and every later operation (entries, locks, temporary directories,
a process's working directory, renames, removals) is relative to a checked descriptor."""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from ..errors import EnvironmentProblem, InputError
from ..errors import no_descriptor as _descriptors
from . import flock
from .protected import Missing, link_problem, cache_refusal, problem, trusted_uids
from .root import ENV, directory, note
from .walk import MAX_LINKS

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0)


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
            flock.take(fd, waiting=lambda: _noting(wait_note))
            try:
                yield fd
            finally:
                flock.release(fd)
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
    only where ``link_problem`` allows. ``create``: missing components are made private (0700).
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
    (None, a symlink's target, the link checked by ``link_problem``) or (None, None): something
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
            why = link_problem(p, lst, parent, uids, refusal)
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
def _noting(text: str | None):
    """While a lock is waited for: a -v note first, when there is one."""
    if text:
        note(text)
    yield


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
