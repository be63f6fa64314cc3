"""The compile itself: sources written into a private leased directory, ninja run there, the result
hashed, recorded and renamed into place through the builds directory's descriptor."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time

from ...errors import EnvironmentProblem, InputError, require_torch
from ...fs.dirs import Dir
from ...fs.leases import leased
from ...vocabulary import plural
from .build_time import estimate, load_now
from .compiler_errors import explain, last_error
from .key import IDENTITY_SOURCE, identity_source
from .ninja import build_ninja, ninja_times
from .processes import run_in_group
from .progress import Progress
from .record import RECORD, RECORD_FORMAT, BuildRecord, Timings, UnitTime, complete, sha256_of
from .toolchain import toolchain_flags, driver_env


def compile_into(builds: Dir, files, units, flags, name, key, final, compiler, ninja, verbose, log,
                 links=(), what="the generated kernels") -> None:
    """Compile ``units`` of ``files`` into ``builds/final/<name>.so`` (the build of ``key``)."""
    library = f"{name}.so"
    tmp = None
    try:
        tmp = builds.mkdtemp(f".build-{key[:12]}-{os.getpid()}-")
        with tmp, leased(tmp):
            units, sizes = _stage(tmp, files, list(units), flags, key, compiler, library, links)
            jobs = os.environ.get("MAX_JOBS", "").strip()
            load = load_now()  # before the build adds its own
            t0 = _run_ninja(builds, tmp, files, units, sizes, [ninja] + (["-v"] if verbose else [])
                       + (["-j", jobs] if jobs.isdigit() else []), verbose, log, what)
            seconds = round(time.monotonic() - t0, 1)
            _record(tmp, library, key, flags, seconds, int(jobs) if jobs.isdigit() else os.cpu_count() or 1,
                    units, sizes, load)
            _move_into_place(builds, tmp, final, key, library)
        print(f"torchgen-patch: built {builds.join(final)} in {time.monotonic() - t0:.1f} s", file=log, flush=True)
    except OSError as e:
        if _no_space(e):
            raise _disk_full(builds.path) from None
        raise EnvironmentProblem(f"cannot build in {builds.path}: {e.strerror or e}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                builds.remove(os.path.basename(tmp.path))  # gone already when it became the build


def _stage(tmp: Dir, files, units: list[str], flags, key, compiler, library, links):
    """The sources and build.ninja written into ``tmp``; (the units to compile, each one's size)."""
    with tmp.sub("src", create=True) as src:
        for fname, data in sorted(files.items()):
            src.create(fname, data)
        identity = identity_source(key)
        for fname, data in sorted(identity.items()):
            src.create(fname, data)
    units = units + [IDENTITY_SOURCE]
    cflags, ldflags = toolchain_flags()
    ldflags += list(links)
    tmp.create("build.ninja", build_ninja(compiler, cflags + list(flags), ldflags, units, library).encode())
    return units, {u: len(files[u]) if u in files else len(identity[u]) for u in units}


def _run_ninja(builds: Dir, tmp: Dir, files, units, sizes, argv, verbose, log, what) -> float:
    """ninja run in ``tmp``, said before it starts (with an estimate where earlier builds allow one);
    when it started (``time.monotonic()``)."""
    torch = require_torch("building the kernels")
    guess = estimate(builds, sizes)
    print(f"torchgen-patch: compiling {plural(len(units), 'translation unit')} with ninja (torch "
          f"{torch.__version__})" + (f"; {guess}" if guess else "") + " ...", file=log, flush=True)
    t0 = time.monotonic()
    with Progress(tmp, units, log):
        rc, out = run_in_group(tmp, argv, log, verbose, driver_env())
    if rc != 0:
        if _no_space(out):
            raise _disk_full(builds.path)
        # the whole story for a person at the command line; in one line, the compiler's last error line
        last = last_error(out)
        raise InputError(None, None, f"{what} do not compile:\n" + explain(out, files), cause=last,
                         brief=f"{what} do not compile: {last}")
    return t0


def _record(tmp: Dir, library, key, flags, seconds, jobs, units, sizes, load: float) -> None:
    """The library hashed, its directory made writable by its owner only, and its record written."""
    torch = require_torch("building the kernels")
    fd = tmp.open(library)
    try:
        digest = sha256_of(fd)
    finally:
        os.close(fd)
    times = ninja_times(tmp)
    tmp.owner_writable_only()
    timings = Timings(seconds, jobs, round(load, 2), os.cpu_count() or 1,  # how busy the machine was: the scale
                      times.get(library), len(units),
                      tuple((u, UnitTime(sizes[u], times.get(os.path.splitext(u)[0] + ".o"))) for u in units))
    record = BuildRecord(library, digest, key, format=RECORD_FORMAT, torch=torch.__version__, flags=tuple(flags),
                         timings=timings).to_json()
    tmp.create(RECORD, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode(), 0o644)


def _move_into_place(builds: Dir, tmp: Dir, final, key, library) -> None:
    """``tmp`` renamed to ``final``: a damaged build there is moved aside first; a finished one another
    process renamed there first is as good as this one."""
    if builds.lstat(final) is not None and not complete(builds, final, key, builds.join(final, library)):
        with builds.mkdtemp(f".stale-{key[:12]}-{os.getpid()}-") as aside, leased(aside):
            builds.rename(final, "old", into=aside)
        builds.remove(os.path.basename(aside.path))
    try:
        builds.rename(os.path.basename(tmp.path), final)
    except OSError:
        if not complete(builds, final, key, builds.join(final, library)):  # another's is equally good
            raise


def _no_space(e: BaseException | str) -> bool:
    return getattr(e, "errno", None) == errno.ENOSPC or "No space left on device" in str(e)


def _disk_full(root: str) -> EnvironmentProblem:
    return EnvironmentProblem(f"no space left on the device of {root} while building the kernels",
                              "free some space, or set TORCHGEN_PATCH_CACHE to a directory on another disk")
