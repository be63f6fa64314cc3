"""Reading inputs and writing outputs, with errors as ``InputError``.

Writes are atomic (a temporary file in the same directory, then a rename: a
reader sees the old file or the new one, never a part) and, for generated
files, only when the content changed (torchgen's FileManager convention).
"""

from __future__ import annotations

import os
import stat

from .errors import InputError, one_line


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


def atomic_write(path: str, data: bytes, durable: bool = True) -> None:
    """``durable=False`` skips the fsync (caches: losing one costs only time)."""
    import tempfile

    d = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=d)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


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


def _target(path: str) -> str:
    """Where a write to ``path`` lands: a symlink's final target (the link itself is never
    replaced), else ``path``. A link to a device or FIFO stays as it is: it is opened, and
    ``/dev/stdout``'s target (``/proc/self/fd/1``) names nothing a path can reopen."""
    if not os.path.islink(path):
        return path
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return path
    except OSError:
        pass
    return os.path.realpath(path)


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
    files, dirs = {}, {}
    for i in inputs:
        if not i:
            continue
        k = _key(i)
        if k is not None:
            (dirs if os.path.isdir(i) else files)[k] = i
    target = os.path.abspath(_target(path))
    hit = files.get(_key(target)) if not os.path.isdir(target) else None
    p = target
    while hit is None:
        hit = dirs.get(_key(p))
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    if hit is not None:
        said = f"would overwrite {display(hit)}, an input of this run" if _key(hit) == _key(target) else \
            f"lies inside {display(hit)}, which this run reads"
        raise InputError(path, None, f"{what} {said}", "write it somewhere else")


def check_output_dir(path: str, inputs=(), what: str = "output directory") -> None:
    """Refuse, before any work is done, an output directory that cannot be made or written."""
    path = _target(path)
    p = os.path.abspath(path)
    while not os.path.exists(p):  # the nearest existing ancestor decides
        p = os.path.dirname(p)
    if p == os.path.abspath(path) and not os.path.isdir(p):
        raise InputError(path, None, "output path exists and is not a directory")
    if not os.path.isdir(p):
        raise InputError(path, None, f"cannot create output directory: {display(p)} is not a directory")
    if not os.access(p, os.W_OK | os.X_OK):
        raise InputError(path, None, "output directory is not writable" if p == os.path.abspath(path)
                         else f"cannot create output directory: {display(p)} is not writable")
    check_not_input(path, inputs, what)


def check_output_file(path: str, what: str = "output", create_dir: bool = False, inputs=()) -> None:
    """Refuse, before any work is done, an output file that cannot be written or is an input.
    ``-`` (standard output), a character device or a FIFO are written through; a symlink is
    judged by its target. ``create_dir``: its directory may be missing (it will be made)."""
    if path == STDOUT:
        return
    target = _target(path)
    if os.path.isdir(target):
        raise InputError(path, None, f"{what} is a directory, expected a file name")
    try:
        mode = os.stat(target).st_mode
    except OSError:
        mode = None
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
        raise InputError(path, None, f"cannot write {what}: not a regular file, character device or FIFO")
    check_not_input(path, inputs, what)
    if mode is not None and not stat.S_ISREG(mode):
        if not os.access(target, os.W_OK):
            raise InputError(path, None, f"cannot write {what}: permission denied")
        return
    d = os.path.dirname(os.path.abspath(target))
    if create_dir:
        return check_output_dir(d)
    if not os.path.isdir(d):
        raise InputError(path, None, f"cannot write {what}: directory {display(d)} does not exist")
    if not os.access(d, os.W_OK | os.X_OK):
        raise InputError(path, None, f"cannot write {what}: directory {display(d)} is not writable")


def write_output(path: str, data: bytes, what: str = "output", inputs=(), if_changed: bool = False,
                 create_dir: bool = False) -> bool:
    """The one writer of a user-named output file (a report, a diff, a baseline, a fragment).

    ``-``: standard output. A character device or FIFO (``/dev/null``, ``/dev/stdout``, a pipe):
    written through, never replaced. A symlink: its target is written (atomically when it is a
    regular file); the link stays. A regular file: replaced atomically (with ``if_changed``, only
    when the content differs). An output that is one of ``inputs`` is refused before anything
    is written. Returns whether anything was written."""
    import sys

    check_output_file(path, what, create_dir, inputs)
    if path == STDOUT:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return True
    target = _target(path)
    try:
        mode = os.stat(target).st_mode
    except OSError:
        mode = None
    try:
        if mode is not None and not stat.S_ISREG(mode):
            fd = os.open(target, os.O_WRONLY)  # a device or FIFO: through it, as a shell's `>` would
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            return True
        if create_dir:
            os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
        if if_changed:
            return write_if_changed(target, data)
        atomic_write(target, data)
        return True
    except OSError as e:
        raise InputError(path, None, f"cannot write {what}: {e.strerror}") from None


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
