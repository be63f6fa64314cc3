"""A path found one component at a time, then used through the descriptors.

Every output the user names is found by ``find``: from ``/`` (a relative path through the working
directory's own path), each component looked at without following it (``lstat``), each directory
entered with O_NOFOLLOW, so what is written into is the directory that was looked at. A symlink on
the way is followed only where the kernel's ``fs.protected_symlinks`` rule would follow it
(``may_follow``), whatever the sysctl says on this machine; its target is then found the same way.
The write itself is relative to the directory found (``dir_fd=``): no name is resolved twice.

An output goes only into and through directories no other account controls (``foreign_dir``, judged
on the descriptor of each directory as it is entered): one the writer owns, or one of root's that
only root can write, or that has the sticky bit (``/tmp``, where the kernel's rules above hold).
Whoever controls a directory could plant a link or a file at the output's name, or later rename
what is below it.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat

from ..errors import InputError
from .protected import display, foreign_dir, may_follow, may_replace, owner_name

DIR_PATH_FLAGS = os.O_DIRECTORY | os.O_CLOEXEC | getattr(os, "O_PATH", os.O_RDONLY)  # O_PATH: no read right needed
MAX_LINKS = 40  # symlinks in one lookup, the kernel's own limit


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
    asked: str = ""  # the path as the user gave it, and what it is: for the messages of a refusal
    what: str = "output"
    write: bool = False  # an output's: each directory entered is judged (``check_dir``)

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
        """Create the missing directories (0777 less the umask, as ``mkdir -p``), entering each; one
        another account made first is refused (``check_dir``), not written into."""
        if len(self.rest) < 2:
            return
        for comp in self.rest[:-1]:
            try:
                os.mkdir(comp, 0o777, dir_fd=self.dir_fd)
            except FileExistsError:
                pass
            self._enter(comp)
        self.rest, self.st = self.rest[-1:], None

    def check_dir(self) -> None:
        """Refuse (an InputError) to write in or below the open directory ``dir_fd`` when another
        account controls it (``foreign_dir``, judged on the descriptor)."""
        refuse_foreign_dir(os.fstat(self.dir_fd), self.where, self.asked, self.what)

    def _enter(self, comp: str) -> None:
        fd = os.open(comp, DIR_PATH_FLAGS | os.O_NOFOLLOW, dir_fd=self.dir_fd)
        os.close(self.dir_fd)
        self.dir_fd, self.where = fd, os.path.normpath(os.path.join(self.where, comp))
        if self.write:
            self.check_dir()

    def close(self) -> None:
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1

    def __enter__(self) -> "Found":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


HINT = ("write into a directory of your own: whoever owns a directory, or can write it without the sticky "
        "bit, can replace what is written there or plant a link at its name")


def refuse_foreign_dir(st: os.stat_result, where: str, path: str, what: str) -> None:
    """An InputError naming ``path`` when this account's output may not go in or below the directory
    ``where`` (its status ``st``, of an open descriptor where the caller writes through one)."""
    why = foreign_dir(st)
    if why:
        raise InputError(path, None, f"{what}: not writing in or below {display(where)}: {why}", HINT)


def find(path: str, what: str = "output", write: bool = True) -> Found:
    """Follow ``path`` to the entry a write would land on (see the section's comment); a symlink the
    rule does not follow, a loop of them, or a directory that cannot be entered is an InputError
    naming ``path``. ``write`` (every output): each directory entered on the way, the one found
    included, must be one no other account controls (``foreign_dir``); False: a path only read. The
    caller closes what it gets."""
    f, todo = _start(path, what, write)
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
                    raise _not_followed(path, what, here, f.where, st)
                if last and _in_proc(f.dir_fd) and _through(f, comp, here):  # /proc/self/fd/1: its target names no path
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


def _start(path: str, what: str, write: bool) -> tuple[Found, list[str]]:
    """Where a walk of ``path`` starts: ``/`` (an output's relative path through the working
    directory's own path; one only read, from the working directory), judged for an output; and the
    components to walk, a stack (the next one last)."""
    try:
        walked = os.path.join(os.getcwd(), path) if write else path
        absolute = os.path.isabs(walked)
        fd = os.open(os.sep if absolute else os.curdir, DIR_PATH_FLAGS)
    except OSError as e:
        raise InputError(path, None, f"cannot write {what}: {e.strerror}") from None
    f = Found(fd, os.sep if absolute else os.getcwd(), [], "", None, asked=path, what=what, write=write)
    if write:
        try:
            f.check_dir()
        except BaseException:
            f.close()
            raise
    return f, walked.split(os.sep)[::-1]


def _not_followed(path: str, what: str, here: str, where: str, st: os.stat_result) -> InputError:
    return InputError(path, None, f"{what}: not following the symlink {display(here)}: "
                      f"{owner_name(st.st_uid)} owns it, in {display(where)}, a sticky directory "
                      "others can write", "write to a path of your own, or remove the link")


def _through(f: Found, comp: str, here: str) -> bool:
    """Whether the link ``comp`` of ``f``'s directory (one of /proc's) leads to a device or FIFO: then
    ``f`` is that entry, to be written through the link."""
    try:
        to = os.stat(comp, dir_fd=f.dir_fd)
    except OSError:
        to = None
    if to is not None and (stat.S_ISCHR(to.st_mode) or stat.S_ISFIFO(to.st_mode)):
        f.rest, f.path, f.st, f.through = [comp], here, to, True
        return True
    return False


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
