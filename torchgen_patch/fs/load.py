"""What a library is loaded as: a name ``dlopen`` resolves to exactly the file behind a checked
descriptor, or a private copy of it where there is no ``/proc``."""

from __future__ import annotations

import contextlib
import os

from ..errors import EnvironmentProblem
from .dirs import open_dir
from .protected import library_refusal

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
