"""Reading inputs and writing outputs, with errors as ``InputError``.

Writes are atomic (a temporary file in the same directory, then a rename: a
reader sees the old file or the new one, never a part) and, for generated
files, only when the content changed (torchgen's FileManager convention).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat

from .errors import EnvironmentProblem, InputError, ToolError, one_line


def read_bytes(path: str, what: str) -> bytes:
    if not os.path.exists(path):
        raise InputError(path, None, f"{what} not found")
    if os.path.isdir(path):
        raise InputError(path, None, f"{what} is a directory, expected a file")
    try:
        # O_NONBLOCK: a FIFO does not block the open; then only a regular file is read (a FIFO,
        # a device such as /dev/zero behind a symlink, would block or never end)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise InputError(path, None, f"cannot read {what}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(path, None, f"{what} is not a regular file")
        try:
            return fh.read()
        except OSError as e:
            raise InputError(path, None, f"cannot read {what}: {e.strerror}") from None


def decode(path: str, data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise InputError(path, line, f"{what} is not valid UTF-8 (byte 0x{data[e.start]:02x})") from None


def read_text(path: str, what: str) -> str:
    return decode(path, read_bytes(path, what), what)


MAX_JSON_DEPTH = 64  # the tool's own JSON nests 4 levels; named where a document nests too deeply to decode


def loads(data: bytes | str):
    """``json.loads`` whose every failure is a ``ValueError`` (a ``json.JSONDecodeError`` with the line):
    a document nested deeper than the decoder's recursion allows (``[[[[...``, 100,000 deep) is one too,
    at the line where it passes MAX_JSON_DEPTH levels, never a RecursionError."""
    import json

    try:
        return json.loads(data)
    except RecursionError:
        pass
    import re

    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    depth, pos = 0, 0
    for m in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[{]|[\]}]', text):
        if m.group() in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                pos = m.start()
                break
        elif m.group() in "]}":
            depth -= 1
    raise json.JSONDecodeError(f"nested more than {MAX_JSON_DEPTH} levels deep", text, pos) from None


def load_json(data: bytes | str, path: str, what: str, hint: str | None = None):
    """The JSON document ``data`` read from ``path``, or an InputError at its line."""
    try:
        return loads(data)
    except ValueError as e:
        raise InputError(path, getattr(e, "lineno", None), f"{what} is not valid JSON: "
                         f"{getattr(e, 'msg', None) or one_line(e)}", hint) from None


def private_dirs(path: str) -> None:
    """``os.makedirs`` where every directory it creates is private to this user (0700):
    caches hold code this tool loads, so no other account may put anything in them."""
    missing = []
    p = os.path.abspath(path)
    while not os.path.isdir(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            if not os.path.isdir(d):
                raise


def atomic_write(path: str | tuple[int, str], data: bytes, durable: bool = True) -> None:
    """Replace a file whole: a temporary file beside it, then a rename (a reader sees the old file or
    the new one, never a part). ``path``: a file of this tool's own (a cache entry), made 0644; or
    ``(dir_fd, name)``: a new name in a directory opened once (an output this run makes), with the
    mode ``replace_at`` gives a new file. ``durable=False`` skips the fsync (caches: losing one costs only time)."""
    if isinstance(path, tuple):  # a new file of a directory this run made
        return replace_at(path[0], path[1], data, durable, checked=None)
    dfd = os.open(os.path.dirname(path) or ".", _DIR)
    try:
        replace_at(dfd, os.path.basename(path), data, durable, mode=0o644)
    finally:
        os.close(dfd)


def write_if_changed(path: str, data: bytes) -> bool:
    """Write only when the content differs; return whether it was written."""
    try:
        with open(path, "rb") as fh:
            if fh.read() == data:
                return False
    except OSError:
        pass
    atomic_write(path, data)
    return True


STDOUT = "-"  # an output named '-' is standard output

# ---- outputs: a path found one component at a time, then used through the descriptors ----------
#
# Every output the user names is found by ``find``: from ``/`` (or the working directory), each
# component looked at without following it (``lstat``), each directory entered with O_NOFOLLOW, so
# what is written into is the directory that was looked at. A symlink on the way is followed only
# where the kernel's ``fs.protected_symlinks`` rule would follow it (``may_follow``), whatever the
# sysctl says on this machine; its target is then found the same way. The write itself is relative
# to the directory found (``dir_fd=``): no name is resolved twice.

_DIR = os.O_DIRECTORY | os.O_CLOEXEC | getattr(os, "O_PATH", os.O_RDONLY)  # O_PATH: no read right needed
MAX_LINKS = 40  # symlinks in one lookup, the kernel's own limit


def may_follow(dir_st: os.stat_result, link_st: os.stat_result) -> bool:
    """The kernel's ``fs.protected_symlinks`` rule: a symlink in a sticky directory that others can
    write (``/tmp``) is followed only by its owner, or when the directory's owner owns it; anyone
    could have planted any other link there. ``fs.protected_regular`` is the same rule for a file
    opened to be written (``may_replace``)."""
    shared = stat.S_ISVTX | stat.S_IWOTH
    return dir_st.st_mode & shared != shared or link_st.st_uid in (os.geteuid(), dir_st.st_uid)


may_replace = may_follow  # a regular file there is replaced only when it is yours or the directory owner's


@dataclasses.dataclass
class Found:
    """Where a path leads. ``dir_fd``: the deepest directory on the way that exists (open; ``where``
    is its path); ``rest``: the components below it (``rest[0]`` an entry of ``dir_fd``; more than one:
    ``rest[0]`` and those below it are missing); ``path``: the final entry's absolute path (symlinks
    resolved); ``st``: that entry (never a symlink), None when it is missing; ``blocked``: the path of
    a non-directory met on the way (what follows it cannot exist); ``through``: the entry is a link of
    /proc to a device or FIFO (``/dev/stdout`` leads to ``/proc/self/fd/1``, whose target names no
    path), to be opened through that one link; every other chain of links is followed hop by hop to
    the device, FIFO or file at its end."""

    dir_fd: int
    where: str
    rest: list[str]
    path: str
    st: os.stat_result | None
    blocked: str | None = None
    through: bool = False

    @property
    def name(self) -> str:
        return self.rest[0]

    def check_replace(self, path: str, what: str) -> None:
        """Refuse to replace a regular file, or write into a FIFO, another account owns in a sticky
        directory others can write (``fs.protected_regular`` and ``fs.protected_fifos``, whatever the
        sysctls say here): anyone could have planted it there, to read what is written (a FIFO), or to
        have the file that replaces it keep their owner and mode (as root, theirs)."""
        st = self.st
        if st is not None and (stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode)) and not self.through \
                and not may_replace(os.fstat(self.dir_fd), st):
            verb = "replacing" if stat.S_ISREG(st.st_mode) else "writing into the FIFO"
            raise InputError(path, None, f"{what}: not {verb} {display(self.path)}: {owner_name(st.st_uid)} "
                             f"owns it, in {display(self.where)}, a sticky directory others can write",
                             "write to a path of your own, or remove the file")

    @property
    def missing_dirs(self) -> bool:
        return len(self.rest) > 1 or self.blocked is not None

    def make_dirs(self) -> None:
        """Create the missing directories (0777 less the umask, as ``mkdir -p``), entering each."""
        if len(self.rest) < 2:
            return
        for comp in self.rest[:-1]:
            try:
                os.mkdir(comp, 0o777, dir_fd=self.dir_fd)
            except FileExistsError:
                pass
            self._enter(comp)
        self.rest, self.st = self.rest[-1:], None

    def _enter(self, comp: str) -> None:
        fd = os.open(comp, _DIR | os.O_NOFOLLOW, dir_fd=self.dir_fd)
        os.close(self.dir_fd)
        self.dir_fd, self.where = fd, os.path.normpath(os.path.join(self.where, comp))

    def close(self) -> None:
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1

    def __enter__(self) -> "Found":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def find(path: str, what: str = "output") -> Found:
    """Follow ``path`` to the entry a write would land on (see the section's comment); a symlink the
    rule does not follow, a loop of them, or a directory that cannot be entered is an InputError
    naming ``path``. The caller closes what it gets."""
    absolute = os.path.isabs(path)
    try:
        fd = os.open(os.sep if absolute else os.curdir, _DIR)
    except OSError as e:
        raise InputError(path, None, f"cannot write {what}: {e.strerror}") from None
    f = Found(fd, os.sep if absolute else os.getcwd(), [], "", None)
    todo = path.split(os.sep)[::-1]  # a stack: the next component last
    links = 0
    try:
        while True:
            while todo and todo[-1] in ("", os.curdir):
                todo.pop()
            if not todo:  # the path ends in a directory already entered: name it from its parent
                return _named(f)
            comp = todo.pop()
            last = all(c in ("", os.curdir) for c in todo)
            if comp == os.pardir:
                f._enter(os.pardir)
                continue
            here = os.path.join(f.where, comp)
            try:
                st = os.stat(comp, dir_fd=f.dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                rest = os.path.normpath(os.path.join(comp, *todo[::-1])).split(os.sep)
                if rest[0] == os.pardir:  # the path climbs back out of what is missing
                    todo = rest[::-1]
                    continue
                f.rest, f.path = rest, os.path.join(f.where, *rest)
                return f
            if stat.S_ISLNK(st.st_mode):
                if not may_follow(os.fstat(f.dir_fd), st):
                    raise InputError(path, None, f"{what}: not following the symlink {display(here)}: "
                                     f"{owner_name(st.st_uid)} owns it, in {display(f.where)}, a sticky directory "
                                     "others can write", "write to a path of your own, or remove the link")
                if last and _in_proc(f.dir_fd):  # /proc/self/fd/1: its target names no path
                    try:
                        to = os.stat(comp, dir_fd=f.dir_fd)
                    except OSError:
                        to = None
                    if to is not None and (stat.S_ISCHR(to.st_mode) or stat.S_ISFIFO(to.st_mode)):
                        f.rest, f.path, f.st, f.through = [comp], here, to, True
                        return f
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
                link = os.readlink(comp, dir_fd=f.dir_fd)
                if os.path.isabs(link):
                    f._enter(os.sep)
                todo += link.split(os.sep)[::-1]
                continue
            if last or not stat.S_ISDIR(st.st_mode):
                f.rest = [comp, *[c for c in todo[::-1] if c not in ("", os.curdir)]]
                f.path = os.path.join(f.where, *f.rest)
                f.st = st if last else None
                f.blocked = None if last else here
                return f
            f._enter(comp)
    except OSError as e:
        f.close()
        raise InputError(path, None, f"cannot write {what}: {e.strerror}") from None
    except BaseException:
        f.close()
        raise


def _in_proc(dir_fd: int) -> bool:
    """Whether the open directory is one of /proc's (where a process's descriptors are links whose
    targets, ``pipe:[N]``, name no path: they are opened as links, and nobody can plant one there)."""
    try:
        return os.fstat(dir_fd).st_dev == os.stat("/proc/self/fd").st_dev
    except OSError:
        return False


def _named(f: Found) -> Found:
    """``f`` ends in the directory it has entered (a path ending in ``.``, ``..`` or ``/``): the same
    directory as an entry of its parent."""
    if f.where == os.sep:
        f.rest, f.path, f.st = [os.curdir], os.sep, os.fstat(f.dir_fd)
        return f
    own, name = os.fstat(f.dir_fd), os.path.basename(f.where)
    f._enter(os.pardir)
    f.rest, f.path = [name], os.path.join(f.where, name)
    st = os.stat(name, dir_fd=f.dir_fd, follow_symlinks=False)
    if not os.path.samestat(st, own):
        raise OSError(errno.ENOENT, f"{f.path} changed while it was looked up")
    f.st = st
    return f


def owner_name(uid: int) -> str:
    """An account as messages name it: ``name (uid N)``, or ``uid N`` for one this machine does not know."""
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def umask() -> int:
    """The process's umask, read without changing it (os.umask sets it, for an instant, in every
    thread): /proc/self/status on Linux, else the two calls."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    m = os.umask(0o22)
    os.umask(m)
    return m


def keep_owner_and_mode(fd: int, old: os.stat_result | None) -> None:
    """Give the new file (or directory) ``fd`` the owner and mode of the one ``old`` it replaces (as
    root, the owner too: root writing a user's file leaves it the user's; a file keeps no set-id
    bit); with no ``old``, the mode the umask gives a new file (0666 & ~umask), as the kernel would."""
    if old is None:
        os.fchmod(fd, 0o666 & ~umask())
        return
    if (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
        try:
            os.fchown(fd, old.st_uid if os.geteuid() == 0 else -1, old.st_gid)
        except PermissionError:
            pass  # a group this account is not in: the file keeps this account's group
    mode = stat.S_IMODE(old.st_mode)
    os.fchmod(fd, mode if stat.S_ISDIR(old.st_mode) else mode & ~(stat.S_ISUID | stat.S_ISGID))


_UNCHECKED = object()  # replace_at called without what the caller checked


def replace_at(dir_fd: int, name: str, data: bytes, durable: bool = True, mode: int | None = None,
               checked=_UNCHECKED, shown: str | None = None) -> None:
    """``name`` in the open directory ``dir_fd`` replaced whole by ``data`` (a temporary file beside
    it, then a rename); the temporary file is private until then.

    ``mode`` given (a file of this tool's own): the new file gets it and replaces whatever is there.
    Else ``checked`` is what the caller looked at before deciding to write: the regular file there
    (its stat), or None for no file. The new file gets that file's owner and mode (as root, its owner
    too; ``keep_owner_and_mode``), or those of a new file, and replaces exactly that: a file that
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
                keep_owner_and_mode(fd, checked)
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


def _target(path: str) -> str:
    """Where a write to ``path`` lands (``find``): a symlink's final target where the rule follows it
    (the link itself is never replaced), else ``path`` made absolute. A link to a device or FIFO
    stays as it is: it is written through."""
    with find(path) as f:
        return f.path


def _key(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def check_not_input(path: str, inputs=(), what: str = "output") -> None:
    """Refuse an output that is one of the run's inputs, or lies inside an input directory, by
    device and inode (a symlink, a hard link or a relative spelling of an input is caught too).
    ``inputs``: paths of files and directories the run reads; missing ones are ignored."""
    if path == STDOUT or not inputs:
        return
    files, dirs = {}, {}  # type: dict, dict  # (device, inode) -> the input's path
    for i in inputs:
        if not i:
            continue
        k = _key(i)
        if k is not None:
            (dirs if os.path.isdir(i) else files)[k] = i
    with find(path, what) as f:
        target, st = f.path, f.st
    key = (st.st_dev, st.st_ino) if st is not None else None
    hit = files.get(key) if st is not None and not stat.S_ISDIR(st.st_mode) else None
    p = target
    while hit is None:
        hit = dirs.get(key if p == target and key else _key(p))
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    if hit is not None:
        said = f"would overwrite {display(hit)}, an input of this run" if _key(hit) == key else \
            f"lies inside {display(hit)}, which this run reads"
        raise InputError(path, None, f"{what} {said}", "write it somewhere else")


def check_output_dir(path: str, inputs=(), what: str = "output directory") -> None:
    """Refuse, before any work is done, an output directory that cannot be made or written."""
    with find(path, what) as f:
        if f.blocked:
            raise InputError(path, None, f"cannot create output directory: {display(f.blocked)} is not a directory")
        if f.st is not None and not stat.S_ISDIR(f.st.st_mode):
            raise InputError(path, None, "output path exists and is not a directory")
        if f.st is not None and not os.access(f.path, os.W_OK | os.X_OK):
            raise InputError(path, None, "output directory is not writable")
        if f.st is None and not os.access(f.where, os.W_OK | os.X_OK):
            raise InputError(path, None, f"cannot create output directory: {display(f.where)} is not writable")
    check_not_input(path, inputs, what)


def check_output_file(path: str, what: str = "output", create_dir: bool = False, inputs=()) -> None:
    """Refuse, before any work is done, an output file that cannot be written or is an input.
    ``-`` (standard output), a character device or a FIFO are written through; a symlink is
    judged by its target (where ``find`` follows it). ``create_dir``: its directory may be missing
    (it will be made)."""
    if path == STDOUT:
        return
    with find(path, what) as f:
        st, target, missing = f.st, f.path, f.missing_dirs
        f.check_replace(path, what)
    mode = st.st_mode if st is not None else None
    if mode is not None and stat.S_ISDIR(mode):
        raise InputError(path, None, f"{what} is a directory, expected a file name")
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
        raise InputError(path, None, f"cannot write {what}: not a regular file, character device or FIFO")
    check_not_input(path, inputs, what)
    if mode is not None and not stat.S_ISREG(mode):
        if not os.access(path, os.W_OK):
            raise InputError(path, None, f"cannot write {what}: permission denied")
        return
    d = os.path.dirname(target)
    if create_dir:
        return check_output_dir(d)
    if missing:
        raise InputError(path, None, f"cannot write {what}: directory {display(d)} does not exist")
    if not os.access(d, os.W_OK | os.X_OK):
        raise InputError(path, None, f"cannot write {what}: directory {display(d)} is not writable")


def write_output(path: str, data: bytes, what: str = "output", inputs=(), if_changed: bool = False,
                 create_dir: bool = False) -> bool:
    """The one writer of a user-named output file (a report, a diff, a baseline, a fragment).

    ``-``: standard output. A character device or FIFO (``/dev/null``, ``/dev/stdout``, a pipe):
    written through, never replaced. A symlink: its target is written (atomically when it is a
    regular file) where ``find`` follows it, else refused; the link stays. A regular file:
    replaced atomically (with ``if_changed``, only when the content differs), keeping its mode (and,
    as root, its owner); a new file gets the mode the umask gives. Everything after the lookup is
    relative to the directory it found. An output that is one of ``inputs`` is refused before
    anything is written. Returns whether anything was written."""
    import sys

    check_output_file(path, what, create_dir, inputs)
    if path == STDOUT:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return True
    with find(path, what) as f:
        try:
            if f.st is not None and not stat.S_ISREG(f.st.st_mode):
                f.check_replace(path, what)
                return _write_through(f, data, path, what)
            if f.missing_dirs:
                if not create_dir or f.blocked:
                    raise InputError(path, None, f"cannot write {what}: directory "
                                     f"{display(os.path.dirname(f.path))} does not exist")
                f.make_dirs()
            f.check_replace(path, what)
            if if_changed and f.st is not None and _holds(f.dir_fd, f.name, data):
                return False
            replace_at(f.dir_fd, f.name, data, checked=f.st, shown=f.path)
            return True
        except OSError as e:
            raise write_failed(path, f"cannot write {what}", e) from None


FULL = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG)  # the machine's, not the input's


def write_failed(path: str, said: str, e: OSError) -> ToolError:
    """A failed write as the error the user sees: ``FILE: error: SAID: STRERROR``; a full disk, a quota
    or an I/O error is the environment (exit 3), anything else the output's (exit 2)."""
    if e.errno in FULL:
        problem = EnvironmentProblem(f"{said}: {e.strerror}", "free space on that file system, or write elsewhere")
        problem.path = path
        return problem
    return InputError(path, None, f"{said}: {e.strerror}")


def _write_through(f: Found, data: bytes, path: str, what: str) -> bool:
    """A device or FIFO, written as a shell's ``>`` would (opened without O_CREAT or O_TRUNC, so
    whatever the name holds by then is never replaced), once the opened file is the one ``find`` found."""
    fd = os.open(f.name, os.O_WRONLY | os.O_CLOEXEC | (0 if f.through else os.O_NOFOLLOW), dir_fd=f.dir_fd)
    with os.fdopen(fd, "wb") as fh:
        st = os.fstat(fd)
        if not (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)) or not os.path.samestat(st, f.st):  # type: ignore[arg-type]  # the caller's f.st is set
            raise InputError(path, None, f"cannot write {what}: {display(f.path)} changed while it was checked; "
                             "nothing was written")
        fh.write(data)
    return True


def _holds(dir_fd: int, name: str, data: bytes) -> bool:
    """Whether the regular file ``name`` in ``dir_fd`` holds exactly ``data``."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0), dir_fd=dir_fd)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as fh:
        return stat.S_ISREG(os.fstat(fd).st_mode) and fh.read() == data


def display(path: str) -> str:
    from .errors import display_path

    return display_path(path)


MAX_DEPTH = 64  # PyTorch's yaml nests 3 levels; libyaml's own limit, where it has one, is 1,000


def check_depth(path: str, text: str, what: str) -> None:
    """Refuse ``text`` nested more than MAX_DEPTH collections deep, before anything composes it:
    a loader's composer recurses once per level, and PyYAML's C one on a libyaml without a depth
    limit (seen on the GPU machine: Python 3.12, torch 2.11's environment) dies with SIGSEGV. The
    parser's events come from a state machine, not recursion; walking them costs about a fifth
    of a load."""
    import yaml

    depth = 0
    try:
        for ev in yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            if isinstance(ev, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise InputError(path, ev.start_mark.line + 1, f"malformed YAML: {what} nested more than "
                                     f"{MAX_DEPTH} levels deep (exceeded maximum nesting depth)")
            elif isinstance(ev, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError:
        return  # the loader reports it, in its own words


def yaml_error(path: str, text: str, e) -> InputError:
    """A PyYAML error as an InputError at its line (MarkedYAMLError or ReaderError)."""
    import yaml

    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        return InputError(path, mark.line + 1 if mark else None, f"malformed YAML: {e.problem or e.context}")
    if isinstance(e, yaml.reader.ReaderError):
        line = text.count("\n", 0, e.position) + 1 if isinstance(e.position, int) else None
        return InputError(path, line, f"malformed YAML: {e.reason} (character {e.character!r})")
    return InputError(path, None, f"malformed YAML: {one_line(e)}")
