"""A file replaced whole (a temporary file beside it, then a rename: a reader sees the old file or the
new one, never a part), and Linux's ``renameat2`` (a rename that never replaces, or one that
exchanges two entries: a directory swapped whole)."""

from __future__ import annotations

import errno
import os

from ..errors import InputError
from .protected import mode_of_replacement
from .walk import DIR_PATH_FLAGS


def atomic_write(path: str | tuple[int, str], data: bytes, durable: bool = True) -> None:
    """Replace a file whole: a temporary file beside it, then a rename (a reader sees the old file or
    the new one, never a part). ``path``: a file of this tool's own (a cache entry), made 0644; or
    ``(dir_fd, name)``: a new name in a directory opened once (an output this run makes), with the
    mode ``replace_at`` gives a new file. ``durable=False`` skips the fsync (caches: losing one costs only time)."""
    if isinstance(path, tuple):  # a new file of a directory this run made
        return replace_at(path[0], path[1], data, durable, checked=None)
    dfd = os.open(os.path.dirname(path) or ".", DIR_PATH_FLAGS)
    try:
        replace_at(dfd, os.path.basename(path), data, durable, mode=0o644)
    finally:
        os.close(dfd)


_UNCHECKED = object()  # replace_at called without what the caller checked


def replace_at(dir_fd: int, name: str, data: bytes, durable: bool = True, mode: int | None = None,
               checked=_UNCHECKED, shown: str | None = None) -> None:
    """``name`` in the open directory ``dir_fd`` replaced whole by ``data`` (a temporary file beside
    it, then a rename); the temporary file is private until then.

    ``mode`` given (a file of this tool's own): the new file gets it and replaces whatever is there.
    Else ``checked`` is what the caller looked at before deciding to write: the regular file there
    (its stat), or None for no file. The new file gets that file's mode (and group) where it is this
    account's own, else those of a new file (``mode_of_replacement``: root's output never keeps
    another account's owner or mode), and replaces exactly that: a file that
    appeared since (where none was), or another file at the name, is never replaced and gives its
    owner or mode to nothing (an InputError naming ``shown``, nothing written). Nothing here looks
    at the name to decide an owner or a mode."""
    import secrets

    if mode is None and checked is _UNCHECKED:
        raise TypeError("replace_at needs the checked file (or None) when no mode is given")
    while True:
        tmp = f".tmp-{secrets.token_hex(6)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=dir_fd)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if mode is not None:
                os.fchmod(fd, mode)
            else:
                mode_of_replacement(fd, checked)
            if durable:
                os.fsync(fd)
        if mode is not None:
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        elif checked is None:
            if not _rename_new(dir_fd, tmp, name):
                raise _changed(shown or name, "a file appeared there after it was checked")
        else:
            now = _lstat(dir_fd, name)
            if now is None or not os.path.samestat(now, checked):
                raise _changed(shown or name, "the file there is not the one that was checked")
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def _changed(shown: str, why: str) -> InputError:
    return InputError(shown, None, f"not written: {why} (another process, maybe of another account, changed "
                      "the name meanwhile); nothing was written", "write to a path of your own, or try again")


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2  # renameat2's flags (Linux)


def renameat2(dir_fd: int, src: str, dst: str, flags: int) -> bool:
    """Linux ``renameat2`` within one open directory; False where this system or file system has no
    such rename (the caller does without), an OSError for any other failure."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(dir_fd, os.fsencode(src), dir_fd, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), dst)


def _rename_new(dir_fd: int, tmp: str, name: str) -> bool:
    """``tmp`` renamed to ``name`` only where no entry has that name; False when one has. Without
    RENAME_NOREPLACE, a hard link (which never replaces) then the temporary name's removal."""
    try:
        if renameat2(dir_fd, tmp, name, RENAME_NOREPLACE):
            return True
    except FileExistsError:
        return False
    try:
        os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    except FileExistsError:
        return False
    except OSError:  # a file system without hard links either: look, then rename at once
        if _lstat(dir_fd, name) is not None:
            return False
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return True
    os.unlink(tmp, dir_fd=dir_fd)
    return True
