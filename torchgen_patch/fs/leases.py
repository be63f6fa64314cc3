"""Leases: which temporary build is alive (a lock its process holds, and where that process runs),
and the sweep of the temporary directories whose lease expired."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time

from ..errors import EnvironmentProblem
from . import flock
from .decode import loads
from .dirs import Dir
from .protected import Missing
from .root import note

LEASE = ".lease"
_STALE_AFTER = 24 * 3600  # a lease of another kernel (host) is trusted to be held for a day


_NO_BOOT_STALE = 3600  # a lease that names no kernel, whose process cannot be seen: judged by age, as no lease


def _proc(path: str, link: bool = False) -> str | None:
    """A /proc file's text (or a link's target), None where it cannot be read (no /proc)."""
    try:
        if link:
            return os.readlink(path)
        with open(path, encoding="ascii") as fh:  # a /proc file, not a cache path
            return fh.read().strip() or None
    except OSError:
        return None


@functools.cache
def host_identity() -> dict:
    """The kernel (boot id) and PID namespace this process runs in, and the host's name: a lock is
    authoritative within one kernel; a pid only within one namespace. Without /proc, ``boot`` and
    ``pidns`` are None: no identity, said as such."""
    import socket

    return {"boot": _proc("/proc/sys/kernel/random/boot_id"), "pidns": _proc("/proc/self/ns/pid", link=True),
            "host": socket.gethostname()}


def _gone(info: dict) -> bool:
    """Whether the process a lease names is known to be gone: one of this host and PID namespace (as the
    lease and this process say them, None alike) whose pid no longer exists."""
    me, pid = host_identity(), info.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    if info.get("host") != me["host"] or (info.get("pidns") or None) != me["pidns"]:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive, another account's
    return False


@contextlib.contextmanager
def leased(d: Dir):
    """Hold a lease on the temporary directory ``d`` while the block runs: its ``.lease`` file, locked
    (flock) by this process and saying where it runs (``host_identity``). The lock ends with the
    process, however it ends."""
    fd = os.open(LEASE, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=d.fd)
    try:
        flock.take(fd)
        os.write(fd, json.dumps(dict(host_identity(), pid=os.getpid(), started=time.time())).encode())
        yield
    finally:
        with contextlib.suppress(OSError):  # held to the end: a directory renamed into place keeps none
            os.unlink(LEASE, dir_fd=d.fd)
        os.close(fd)


def _lease_expired(d: Dir, now: float) -> tuple[bool, str]:
    """(whether the temporary directory ``d`` may be removed, who left it). Its lease is expired when
    nobody holds its lock and it was taken in this kernel; a lease of another kernel (another
    host, a container on another machine, a boot before this one) whose lock is free here only
    after a day (locks may not cross hosts). A lease that names no kernel (taken where /proc could
    not be read) when its process is gone from this host and PID namespace, or after an hour; a
    directory without a lease after an hour."""
    age = now - os.fstat(d.fd).st_mtime
    try:
        fd = os.open(LEASE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=d.fd)
    except FileNotFoundError:
        return age > 3600, "a process that left no lease"
    except OSError:
        return False, ""
    try:
        try:
            if not flock.take(fd, wait=False):
                return False, ""  # held: the build is alive
        except OSError:
            return False, ""
        try:
            info = loads(os.pread(fd, 4096, 0) or b"{}")
        except ValueError:
            info = {}
        if not isinstance(info, dict) or "pid" not in info:
            return age > 60, "a process that died while starting"  # written right after the lock is taken
        who = f"process {info.get('pid')} on {info.get('host') or 'an unknown host'}"
        boot, mine = info.get("boot") or None, host_identity()["boot"]
        if boot is None:  # no kernel to judge the free lock by: the pid and the age
            return _gone(info) or age > _NO_BOOT_STALE, who
        return boot == mine or age > _STALE_AFTER, who  # mine None: this kernel cannot be told from its
    finally:
        os.close(fd)


def sweep(d: Dir, prefixes: tuple[str, ...]) -> list[str]:
    """Remove the temporary directories (names starting with ``prefixes``) under ``d`` whose lease
    expired; returns their names."""
    gone, now = [], time.time()  # type: list[str], float
    try:
        names = d.names()
    except OSError:
        return gone
    for n in sorted(names):
        if not n.startswith(prefixes):
            continue
        try:
            with d.sub(n) as t:
                expired, who = _lease_expired(t, now)
        except (EnvironmentProblem, Missing, OSError):
            continue
        if expired:
            try:
                d.remove(n)
            except OSError as e:  # something of another process's in it, or in its way: the next sweep tries again
                note(f"could not remove {d.join(n)}, left by {who}: {e.strerror}")
                continue
            note(f"removed {d.join(n)}, left by {who}, which is gone")
            gone.append(n)
    return gone
