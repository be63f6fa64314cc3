"""How long a build will take, said before it starts, from what earlier builds here recorded."""

from __future__ import annotations

import os

from ...errors import EnvironmentProblem, InputError
from ...fs.dirs import Dir, open_dir
from ...fs.protected import Missing, cache_refusal
from ...vocabulary import plural
from .record import BuildRecord


def estimate(builds: Dir | str, units: dict[str, int] | int) -> str | None:
    """How long the build of ``units`` (name -> bytes) will take, said before it starts, from the
    units earlier builds in this directory recorded (their own compile times, ninja's): a unit
    built before under its name takes what it took then (the size difference at the rate the
    earlier units give), another one what units of its size took; scheduled on as many workers as
    those builds had, plus their link time; all of it scaled by how much busier the machine is now
    than it was during those builds (``crowding``). None (no estimate) where no earlier build here
    recorded its units: there is nothing honest to say."""
    if isinstance(builds, str):
        try:
            with open_dir(builds, cache_refusal(builds)) as d:
                return estimate(d, units)
        except Missing:
            return None
    if isinstance(units, int):
        units = {str(i): 0 for i in range(units)}
    seen, links, jobs, then, n = _earlier(builds)
    points = [p for ps in seen.values() for p in ps]
    if not points:
        return None
    a, b = _fit(points)
    lo, hi = min(t for _, t in points), max(t for _, t in points)

    def one(unit: str, size: int) -> float:
        if unit in seen:
            old, t = min(seen[unit], key=lambda p: abs(p[0] - size))
            return max(0.1, t + b * (size - old))
        return min(hi, max(lo, a + b * size))

    times = sorted((one(u, size) for u, size in units.items()), reverse=True)
    workers = [0.0] * max(1, min(len(times), max(jobs) if jobs else 1))
    for t in times:  # longest first, each on the worker that is free first
        workers[workers.index(min(workers))] += t
    total = max(workers) + (sum(links) / len(links) if links else 0.0)
    now = crowding(load_now(), len(workers), os.cpu_count() or 1)
    total *= now / (sum(then) / len(then) if then else 1.0)
    return f"about {max(1, round(total))} s, going by {plural(n, 'earlier build')} here"


def _earlier(builds: Dir):
    """What the earlier builds in ``builds`` recorded: (unit name -> [(bytes, seconds)], link times,
    worker counts, how crowded each was, how many builds)."""
    seen: dict[str, list[tuple[int, float]]] = {}
    links, jobs, then, n = [], [], [], 0
    try:
        names = [n for n in builds.names() if n.startswith("build-") and not n.endswith(".lock")]
    except OSError:
        names = []
    for name in names:
        try:
            with builds.sub(name) as d:
                timings = BuildRecord.read(d, d.path).timings  # a record is input like any cache entry
        except (Missing, EnvironmentProblem, InputError, OSError):
            continue
        if timings is None:
            continue
        n += 1
        for u, t in timings.unit_times:
            seen.setdefault(u, []).append((t.bytes, t.seconds or 0.0))
        if timings.link_seconds is not None:
            links.append(timings.link_seconds)
        if timings.jobs is not None:
            jobs.append(timings.jobs)
        if timings.load is not None and timings.cpus is not None:
            busy = min(timings.jobs or 1, timings.units or 1)  # the workers that build had at once
            then.append(crowding(timings.load, busy, timings.cpus))
    return seen, links, jobs, then, n


def _fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(a, b) of seconds = a + b * bytes through ``points`` (least squares; the rate never negative)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    if var == 0:
        return my, 0.0
    b = max(0.0, sum((x - mx) * (y - my) for x, y in points) / var)
    return my - b * mx, b




def load_now() -> float:
    """The machine's load (runnable processes, the last minute's mean); 0 where the system has none."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def crowding(load: float, jobs: int, cpus: int) -> float:
    """How much slower than alone a build of ``jobs`` workers runs beside ``load`` other runnable
    processes on ``cpus`` processors: each gets its share of them, never more than one."""
    return max(1.0, (load + jobs) / cpus)
