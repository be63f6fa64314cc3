"""Who may have written a path: the kernel's ``fs.protected_symlinks`` and ``fs.protected_regular``
rules (applied whatever the sysctls say here), the accounts trusted with a cache, and the owner and
mode a file that replaces another keeps."""

from __future__ import annotations

import functools
import os
import stat

from ..errors import EnvironmentProblem
from .root import ENV, OWNERS_ENV


def may_follow(dir_st: os.stat_result, link_st: os.stat_result) -> bool:
    """The kernel's ``fs.protected_symlinks`` rule: a symlink in a sticky directory that others can
    write (``/tmp``) is followed only by its owner, or when the directory's owner owns it; anyone
    could have planted any other link there. ``fs.protected_regular`` is the same rule for a file
    opened to be written (``may_replace``)."""
    shared = stat.S_ISVTX | stat.S_IWOTH
    return dir_st.st_mode & shared != shared or link_st.st_uid in (os.geteuid(), dir_st.st_uid)


may_replace = may_follow  # a regular file there is replaced only when it is yours or the directory owner's


def owner_name(uid: int) -> str:
    """An account as messages name it: ``name (uid N)``, or ``uid N`` for one this machine does not know."""
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def display(path: str) -> str:
    from ..errors import display_path

    return display_path(path)


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
    """Give the new file (or directory) ``fd`` the owner and mode of ``old`` (as root, the owner too; a
    file keeps no set-id bit): a copy of a file as it was, or a directory that replaces its own old
    self (an output that replaces a file: ``mode_of_replacement``); with no ``old``, the mode the
    umask gives a new file (0666 & ~umask), as the kernel would."""
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


def mode_of_replacement(fd: int, old: os.stat_result | None) -> None:
    """Give the new file ``fd`` that replaces ``old`` the mode (and group) of ``old`` only when ``old``
    is this account's own file; with no ``old``, or another account's, the mode the umask gives a new
    file, with this account's owner: root's output never keeps another account's owner or mode (that
    account could rewrite the file before root uses it)."""
    keep_owner_and_mode(fd, old if old is not None and old.st_uid == os.geteuid() else None)


def foreign_dir(st: os.stat_result) -> str | None:
    """Why this account's output may not go into the directory ``st``, or None: another account (not
    root) owns it, or root does and its group or others can write it without the sticky bit, and this
    account is not its owner (root included). Its owner, or whoever can write it, could replace what is
    written there, or plant a link or a file at its name before. A sticky directory of root's
    (``/tmp``) is left to ``may_follow`` and ``may_replace``."""
    if st.st_uid == os.geteuid():
        return None
    mode = f"mode {stat.S_IMODE(st.st_mode):04o}"
    if st.st_uid != 0:
        return f"{owner_name(st.st_uid)} owns that directory ({mode}), not you"
    if not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or st.st_mode & stat.S_ISVTX:
        return None
    who = "its group and others" if st.st_mode & stat.S_IWGRP and st.st_mode & stat.S_IWOTH else \
        "its group" if st.st_mode & stat.S_IWGRP else "others"
    return f"{owner_name(st.st_uid)} owns that directory and {who} can write it ({mode}) without the sticky bit"


# ---- who may have written a path ------------------------------------------------------------

def trusted_uids() -> set[int]:
    """This user, root, and the accounts (names or uids, comma-separated) in $TORCHGEN_PATCH_TRUSTED_OWNERS."""
    return set(_trusted(os.geteuid(), os.environ.get(OWNERS_ENV, "")))


@functools.lru_cache(maxsize=8)
def _trusted(me: int, named: str) -> frozenset[int]:
    import pwd

    uids = {me, 0}
    for name in filter(None, (n.strip() for n in named.split(","))):
        if name.isdigit():
            uids.add(int(name))
            continue
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            raise EnvironmentProblem(f"${OWNERS_ENV} names '{name}', which is no user of this machine",
                                     "list account names or uids, separated by commas") from None
    return frozenset(uids)


def inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def problem(p: str, st: os.stat_result, strict: bool, uids: set[int], owned: str,
            writable: str) -> tuple[str, str] | None:
    """Why ``p`` (with ``st``) may have been written by another account, as (message, hint), or None.
    ``strict``: inside a root (no one else may write, sticky bit or not); ``owned``, ``writable``:
    what torchgen-patch refuses, for each message."""
    if st.st_uid not in uids:
        return (f"{p} is owned by {owner_name(st.st_uid)}, not by you or root: torchgen-patch {owned}",
                f"use a cache of your own ({ENV}), or, if you trust that account with your processes, "
                f"name it in ${OWNERS_ENV}")
    if not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or stat.S_ISLNK(st.st_mode):
        return None
    if not strict and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX:
        return None
    who = "group and others" if st.st_mode & stat.S_IWGRP and st.st_mode & stat.S_IWOTH else \
        "its group" if st.st_mode & stat.S_IWGRP else "others"
    return (f"{p} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}): {writable}",
            f"chmod go-w {p}" + ("" if strict else f", or move the cache ({ENV}) elsewhere"))


def cache_refusal(d: str) -> tuple[str, str]:
    return (f"uses no cache under {d}", f"they could replace what is there, so torchgen-patch uses no cache "
                                        f"under {d}")


def library_refusal(library: str) -> tuple[str, str]:
    return (f"loads no native code from {library}",
            f"they could replace the library, so torchgen-patch does not load {library}")


def link_problem(link: str, st: os.stat_result, parent: os.stat_result, uids, refusal) -> tuple | None:
    """A symlink is followed only when a trusted account owns it and the kernel's protected_symlinks
    rule would follow it: in a sticky directory others may write, only a link of yours or of the
    directory's owner."""
    why = problem(link, st, False, uids, *refusal)
    if why:
        return why
    if not may_follow(parent, st):
        return (f"{link} is a symlink of {owner_name(st.st_uid)} in the shared directory {os.path.dirname(link)}: "
                f"torchgen-patch follows none there (as the kernel's protected_symlinks rule does not)",
                f"point {ENV} at a directory of your own")
    return None


class Missing(Exception):
    """A path (or a component of it) does not exist."""
