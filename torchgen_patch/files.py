"""Reading inputs and writing outputs, with errors as ``InputError``.

Writes are atomic (a temporary file in the same directory, then a rename: a
reader sees the old file or the new one, never a part) and, for generated
files, only when the content changed (torchgen's FileManager convention).
"""

from __future__ import annotations

import errno
import os
import stat

from .errors import EnvironmentProblem, InputError, ToolError, one_line
from .fs.decode import loads
from .fs.protected import display
from .fs.walk import Found, find, refuse_foreign_dir


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


def write_if_changed(path: str, data: bytes) -> bool:
    """Write only when the content differs; return whether it was written."""
    try:
        with open(path, "rb") as fh:
            if fh.read() == data:
                return False
    except OSError:
        pass
    from .fs import atomic  # imported at its first use: a cached install() writes nothing

    atomic.atomic_write(path, data)
    return True


STDOUT = "-"  # an output named '-' is standard output

# ---- outputs: every output the user names is found by ``find`` (fs.walk), then written through the
# directory it found (``dir_fd=``): no name is resolved twice.


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
    """Refuse, before any work is done, an output directory that cannot be made or written, or that
    another account controls (``find``'s rules: it, or a directory on the way to it)."""
    with find(path, what) as f:
        if f.blocked:
            raise InputError(path, None, f"cannot create output directory: {display(f.blocked)} is not a directory")
        if f.st is not None and not stat.S_ISDIR(f.st.st_mode):
            raise InputError(path, None, "output path exists and is not a directory")
        if f.st is not None:
            refuse_foreign_dir(f.st, f.path, path, what)
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
    replaced atomically (with ``if_changed``, only when the content differs), keeping its mode where
    it is this account's own; a new file, or one replacing another account's, gets the mode the
    umask gives and this account's owner. Everything after the lookup is relative to the directory
    it found, which no other account may control (``find``). An output that is one of ``inputs`` is
    refused before anything is written. Returns whether anything was written."""
    import sys

    from .fs import atomic  # imported at its first use: a cached install() writes nothing

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
            atomic.replace_at(f.dir_fd, f.name, data, checked=f.st, shown=f.path)
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
