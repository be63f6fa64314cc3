"""Locks no other account can make, hold or remove: a lock file in the cache's private ``locks``
directory (``lock_file``), and gen's lock on its output directory (``output_lock``: beside it where only
this user can write there, else one of those)."""

from __future__ import annotations

import contextlib
import os
import stat
import sys

from ..errors import EnvironmentProblem, InputError, ToolError
from . import flock
from .dirs import subdir
from .protected import Missing, display, owner_name
from .root import key

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


LOCK = ".torchgen-patch-lock"  # .DIR.torchgen-patch-lock: gen's lock beside DIR, where only the user can write
WAIT_S = 1.0  # after this long waiting for the lock, a line says so


@contextlib.contextmanager
def output_lock(parent: int, base: str, shown: str, log=None, required: bool = True):
    """gen's lock on the output ``base`` of the open directory ``parent``, in a place no other
    account can write: where ``parent`` is this user's and nobody else can write it, the file
    ``.base`` + LOCK there (``_beside``); anywhere else (a sticky shared directory, a group's, another
    account's), a lock file in this user's cache, named by ``parent``'s device and inode and ``base``
    (``lock_file``), so nothing another account makes in ``parent`` is used, or can stop a gen.
    After WAIT_S a line tells ``log``. ``required`` False: where no lock of one's own can be had,
    none is taken."""
    if not flock.AVAILABLE:  # no flock (Windows): no serialization, the swap is still whole
        yield
        return
    up = os.fstat(parent)
    if up.st_uid == os.geteuid() and not up.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        with _beside(parent, base, shown, log, required):
            yield
        return
    try:
        fd = lock_file("gen", str(up.st_dev), str(up.st_ino), base)
    except ToolError as e:
        if not required:
            yield
            return
        raise EnvironmentProblem(f"cannot take gen's lock for {display(shown)}, kept in the cache as "
                                 f"others can write {display(os.path.dirname(shown))}: {e.message}",
                                 e.hint) from None
    try:
        _wait(fd, shown, log)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _beside(parent: int, base: str, shown: str, log, required: bool):
    """The lock file ``.base`` + LOCK in ``parent``, a directory only this user can write (created
    O_EXCL|O_NOFOLLOW, 0600; one owned by another account, or no regular file, is refused). The
    holder removes the file when done; a waiter that finds its file gone takes the new one."""
    name = f".{base}{LOCK}"
    path = os.path.join(os.path.dirname(shown), name)
    while True:
        fd = _open_lock(parent, name, path, required)
        if fd is None:
            yield
            return
        _wait(fd, shown, log)
        try:
            now = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            now = None
        if now is not None and os.path.samestat(now, os.fstat(fd)):
            break
        os.close(fd)  # the run we waited for removed it: take the one there now
    try:
        yield
    finally:
        try:
            os.unlink(name, dir_fd=parent)
        except OSError:
            pass
        os.close(fd)


def _open_lock(parent: int, name: str, path: str, required: bool) -> int | None:
    while True:
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=parent)
            break
        except FileExistsError:
            pass
        except OSError as e:
            if not required:
                return None
            raise InputError(path, None, f"cannot create gen's lock: {e.strerror}",
                             "write the output into a directory you can write") from None
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed meanwhile: make it
        why = None if stat.S_ISREG(st.st_mode) else "is not a regular file"
        if why is None and st.st_uid not in (os.geteuid(), 0):
            why = f"is owned by {owner_name(st.st_uid)}, not by you"
        if why is None:
            try:
                fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0),
                             dir_fd=parent)
            except FileNotFoundError:
                continue
            except OSError as e:
                why = f"cannot be opened ({e.strerror})"
            else:
                now = os.fstat(fd)
                if stat.S_ISREG(now.st_mode) and now.st_uid in (os.geteuid(), 0):
                    break
                os.close(fd)
                why = "changed while it was opened"
        if not required:
            return None
        raise InputError(path, None, f"gen's lock {why}: another account could stall or race every gen "
                         "into this directory", f"remove {display(path)}, or write the output "
                         "into a directory of your own")
    return fd


def _wait(fd: int, shown: str, log) -> None:
    """Lock ``fd`` (flock.take); a line to ``log`` (default: stderr) once it has waited WAIT_S."""
    flock.take(fd, waiting=lambda: _saying_after(WAIT_S, f"waiting for another gen into {display(shown)}", log))


@contextlib.contextmanager
def _saying_after(seconds: float, text: str, log):
    import threading

    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    timer = threading.Timer(seconds, say, [text])
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
