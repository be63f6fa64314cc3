"""torchgen-patch's hook, its part for the launch spec before the tool's own parse: an enabled
environment's data file read as the spec's text, and why a process has no spec to use, as the line
says it. The hook (``_torchgen_patch_hook.py`` beside this file) loads it by its path at the first
``import torch``, never at interpreter start, and runs it with the standard library only; what it needs
of the hook's state comes with each call.
"""

import os

DATA_MAX = 1 << 20  # the largest data file read as a spec
REPAIR = "`torchgen-patch enable` writes it again, `torchgen-patch disable` removes it"


def read_data(path):
    """(the file's text, None), or (None, why it cannot be the spec). Nothing here can block: a FIFO
    is opened with O_NONBLOCK and not read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as e:
        return None, f"cannot read it: {e.strerror}"
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o170000 != 0o100000:
            return None, "it is not a regular file"
        if st.st_uid != os.stat(os.path.dirname(path)).st_uid or st.st_mode & 0o022:
            return None, (f"it is not as torchgen-patch enable writes it (uid {st.st_uid}, mode "
                          f"{st.st_mode & 0o7777:04o}: another account's, or writable by others)")
        chunks, size = [], 0
        while size <= DATA_MAX:
            chunk = os.read(fd, DATA_MAX + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        return None, f"cannot read it: {e.strerror}"
    finally:
        os.close(fd)
    if size > DATA_MAX:
        return None, f"it is larger than {DATA_MAX} bytes"
    try:
        return b"".join(chunks).decode("utf-8"), None
    except UnicodeDecodeError as e:
        return None, f"it is not UTF-8 ({e.reason} at byte {e.start})"


def unusable(text, broken, source, *, from_file, hint):
    """Why the process has no launch spec to use, as its line says it after ``NOT active in pid N: ``;
    None where it has one. ``text``: the spec's text (None or empty: none); ``broken``: why the data
    file cannot be it (``read_data``'s); ``source``: where it came from, for the line; ``from_file``:
    it is an enabled environment's data file; ``hint``: the line's where the variable of ``run`` is not
    set."""
    if broken and from_file:
        return f"{source}: {broken} (hint: {REPAIR})"
    if not text and from_file:  # an enabled environment's file, empty
        return f"{source}: it is empty (hint: {REPAIR})"  # as every damaged data file: strict is unknown
    if not text:  # the hook came with PYTHONPATH, what to install did not: said, not stopped
        return f"{source} is not set (the process that started this one left it out of its environment) (hint: {hint})"
    return None
