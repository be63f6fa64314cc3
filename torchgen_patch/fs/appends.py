"""A folder of files that processes append lines to, each process a file of its own: one made new in a
checked directory (``new_file``: never an existing file, never through a symlink), each line added by one
``write`` (``append``: a line is there whole or not at all), and the files read back as input
(``read_folder``: any account's, each a regular file no larger than a bound, never through a symlink,
never waiting on a FIFO)."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import InputError
from .dirs import Dir

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY | getattr(os, "O_NONBLOCK", 0)


def new_file(d: Dir, stem: str, suffix: str) -> tuple[int, str]:
    """(a descriptor open for appending on a new file of ``d``, its name): ``stem + suffix``, or with a
    few random letters before ``suffix`` when that name is taken (a process of an earlier run with
    the same id). The mode is 0600 less the umask's bits. OSError where none can be made."""
    for attempt in range(8):
        name = stem + (f"-{os.urandom(3).hex()}" if attempt else "") + suffix
        try:
            return os.open(name, _NEW, 0o600, dir_fd=d.fd), name
        except FileExistsError:
            continue
    raise OSError(errno.EEXIST, f"every name tried for {stem}{suffix} is taken")


def append(fd: int, line: bytes, size: int) -> int:
    """Add ``line`` to the file behind ``fd`` (opened to append, written by this process alone, ``size``
    bytes long now) in one ``write``; the new size. A write that took part of the line is undone (the
    file cut back to ``size``) and raised as an OSError, so the next line does not join a broken one."""
    written = os.write(fd, line)
    if written == len(line):
        return size + written
    try:
        os.ftruncate(fd, size)
    except OSError as e:
        raise OSError(e.errno, f"a line was written in part and could not be taken back ({e.strerror})") from None
    raise OSError(errno.ENOSPC, f"only {written} of {len(line)} bytes of a line were written")


@dataclass(frozen=True)
class Entry:
    """A file of the folder: its name and its bytes, or why it was not read (``problem``)."""

    name: str
    data: bytes = b""
    problem: str | None = None


def read_folder(path: str, suffix: str, limit: int) -> Iterator[Entry]:
    """Every entry of the directory ``path`` whose name ends with ``suffix``, in name order, read whole:
    a regular file of at most ``limit`` bytes, opened without following a symlink or waiting on a FIFO;
    any other entry comes with its ``problem``. An InputError when ``path`` is no directory that can be
    read (the files in it are input, whoever owns them)."""
    try:
        dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        what = "not a directory" if e.errno == errno.ENOTDIR else f"cannot read the directory: {e.strerror}"
        raise InputError(path, None, what, cause=e.strerror, errno=e.errno) from None
    try:
        try:
            names = sorted(n for n in os.listdir(dfd) if n.endswith(suffix))
        except OSError as e:
            raise InputError(path, None, f"cannot read the directory: {e.strerror}", cause=e.strerror,
                             errno=e.errno) from None
        for name in names:
            yield _read(dfd, name, limit)
    finally:
        os.close(dfd)


def _read(dfd: int, name: str, limit: int) -> Entry:
    try:
        fd = os.open(name, _READ, dir_fd=dfd)
    except OSError as e:
        return Entry(name, problem="a symlink: not followed" if e.errno == errno.ELOOP else
                     f"cannot open it: {e.strerror}")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return Entry(name, problem="not a regular file: not read")
        if st.st_size > limit:
            return Entry(name, problem=f"larger than {limit} bytes: not read")
        data = bytearray()
        while chunk := os.read(fd, 1 << 20):  # a file still growing: no more than ``limit`` all the same
            data += chunk
            if len(data) > limit:
                return Entry(name, problem=f"larger than {limit} bytes: not read")
        return Entry(name, bytes(data))
    except OSError as e:
        return Entry(name, problem=f"cannot read it: {e.strerror}")
    finally:
        os.close(fd)
