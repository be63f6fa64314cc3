"""What `torchgen-patch status` checks of an enabled environment beyond what its two files say: whether
another account could have changed what every Python of the environment runs (the site-packages
directory, and the files enable wrote there: their owner and mode), and whether the build the launch
spec names passes the checks each process makes before it loads native code (``runtime/load/trust.py``),
made here on the same descriptors, the library never loaded. ``enable`` refuses a site-packages
directory that ``unsafe_site`` names; the environment's files are read in ``enable.state``."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from ...errors import EnvironmentProblem, InputError, ToolError


def _writers(mode: int) -> str:
    """Who besides the owner may write a file of ``mode`` ("" when nobody)."""
    group, others = mode & stat.S_IWGRP, mode & stat.S_IWOTH
    return "its group and others" if group and others else "its group" if group else "others" if others else ""


def unsafe_site(site: str, st: os.stat_result) -> tuple[str, str] | None:
    """Why the site-packages directory ``site`` (with ``st``) lets another account change what every
    Python of the environment runs, as (message, hint), or None: writable by its group or by others
    (sticky or not: an account that may create files there may add a ``.pth`` file of its own, and,
    where the sticky bit is not set, replace the files enable writes)."""
    who = _writers(st.st_mode)
    if not who:
        return None
    replace = "" if st.st_mode & stat.S_ISVTX else "replace the files `torchgen-patch enable` writes, or "
    return (f"{site} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}): any account that may write it "
            f"could {replace}add a .pth file there, which every Python of this environment runs",
            f"chmod go-w {site}")


def unsafe_file(st: os.stat_result, owner: int, site: str) -> str | None:
    """Why a file enable writes in ``site`` (with ``st``: the descriptor's that was read), otherwise as
    enable writes it, may have been changed by another account, or None: the one account that writes
    it is ``owner`` (the site-packages directory's), and nobody else may write it."""
    from ...fs.protected import owner_name

    if st.st_uid != owner:
        return (f"{owner_name(st.st_uid)} owns it, not {owner_name(owner)}, who owns {site}: that account may "
                "have replaced it, and can change what every Python of this environment runs")
    who = _writers(st.st_mode)
    if who:
        return (f"it is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}): any account that may write it can "
                "change what every Python of this environment runs")
    return None


@dataclass(frozen=True)
class NamedBuild:
    """What the build a launch spec names is to a process of the environment: ``there`` (a process
    loads it), ``gone`` or ``unusable`` (``error``: why; another torch's, incomplete: a process finds
    or builds one by the cache's key instead), or ``refused`` (``error``: the check that refuses it,
    which each process makes too)."""

    verdict: str  # "there", "gone", "unusable", "refused", or "unchecked" (no torch here: ``error``)
    error: ToolError | None = None


def named_build(library: str) -> NamedBuild:
    """The verdict on the build ``library`` (a launch spec's), read through the checks a process makes
    before it loads it: the record and directories (``artifact_at``), then the library itself (owner,
    mode, a regular file, the SHA-256 its build recorded) on its descriptor, never loaded."""
    from ...errors import require_torch
    from ...vocabulary import Origin
    from .. import artifact_at, build_there
    from ..load import trust

    try:
        require_torch("checking the build it names")
    except EnvironmentProblem as e:  # a process that never imports torch never loads it
        return NamedBuild("unchecked", e)
    try:
        art = artifact_at(library, Origin.CACHE)
        fd = trust.check_library(art.path, art.sha256, art.root)
    except EnvironmentProblem as e:
        return NamedBuild("refused", e)
    except InputError as e:  # not there, or not a build of this torch: a process looks for one by its key
        return NamedBuild("unusable" if build_there(library) else "gone", e)
    os.close(fd)
    return NamedBuild("there")
