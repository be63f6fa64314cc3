"""What a build directory records, as values, and the directory itself: the build's record
(``build-info.json``: ``BuildRecord``) and the plan of the kernels in it (codegen's manifest, as the
runtime reads it: ``Manifest``), each with one ``parse`` that checks every field it is used for and
one JSON form; whether a build directory is a finished build of a key, and the sweep of temporary
build directories whose lease expired; and the record of a build that failed (a negative entry of the
cache, ``failed-build-<key>.json``: its reason and when), which spares a program's processes
compiling again what cannot compile in their toolchain."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any

from ... import cache
from ...errors import EnvironmentProblem, InputError, printable
from ...fs import root as cache_root
from ...fs.decode import loads
from ...fs.dirs import Dir, open_dir
from ...fs.protected import Missing, cache_refusal, library_refusal

LIB_PREFIX = "torchgen_patch_kernels"
RECORD = "build-info.json"
# 3: built with ninja from a private directory; the library states its own build (older builds are never reused)
RECORD_FORMAT = 3
TEMPORARY = (".build-", ".stale-")  # the prefixes of temporary directories in a builds directory
INCOMPLETE = "not a complete torchgen-patch build"


def incomplete(path: str, why: str) -> InputError:
    """The one-line refusal of the build at ``path`` whose directory or records are not whole (``why``)."""
    return InputError(path, None, f"{INCOMPLETE} ({why})")


def read_json(d: Dir, name: str, library: str) -> Any:
    """The JSON of ``name`` in the checked directory ``d`` of the build of ``library``: a regular file of a
    trusted owner that nobody else can write, opened without following a symlink."""
    try:
        data = d.read(name)
    except Missing:
        raise incomplete(library, f"{name} is missing") from None
    except OSError as e:
        raise incomplete(library, f"{name}: {e.strerror}") from None
    try:
        return loads(data)
    except ValueError as e:
        raise incomplete(library, f"{name}: {e}") from None


@dataclass(frozen=True)
class LibraryRecord:
    """What every record says of its library (a build's, a prebuilt wheel's, the wheel's saved-tensor hooks):
    its file name, its SHA-256 (checked on the descriptor before it is loaded; None: an older build that
    recorded none, which is refused when loaded) and its build key, which the loaded library must state."""

    library: str
    sha256: str | None
    key: str | None

    def to_json(self) -> dict[str, Any]:
        return {"library": self.library, "sha256": self.sha256, "key": self.key}


@dataclass(frozen=True)
class UnitTime:
    """One translation unit of a build: its size and what it took to compile (None: ninja said nothing)."""

    bytes: int
    seconds: float | None


@dataclass(frozen=True)
class Timings:
    """What a build took, and on how busy a machine: what the estimate of later builds goes by
    (``build_time.py``). Read leniently: a part of another type is absent (None), never an error,
    since the estimate says nothing rather than something wrong."""

    seconds: float | None
    jobs: int | None
    load: float | None
    cpus: int | None
    link_seconds: float | None
    units: int | None  # a count, as older versions of this tool read it from a shared cache
    unit_times: tuple[tuple[str, UnitTime], ...]

    @classmethod
    def parse(cls, raw: dict) -> Timings | None:
        """The timings of the record ``raw`` (a mapping), or None where it has no table of units; a unit
        whose size or time is not a number is left out."""
        units = raw.get("unit_times")
        if not isinstance(units, dict):
            return None
        times = tuple((u, UnitTime(t["bytes"], _number(t.get("seconds")))) for u, t in units.items()
                      if isinstance(t, dict) and _size(t.get("bytes")) and _number(t.get("seconds")) is not None)
        return cls(_number(raw.get("seconds")), _positive(raw.get("jobs")), _number(raw.get("load")),
                   _positive(raw.get("cpus")), _number(raw.get("link_seconds")), _positive(raw.get("units")), times)

    def to_json(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "jobs": self.jobs, "load": self.load, "cpus": self.cpus,
                "link_seconds": self.link_seconds, "units": self.units,
                "unit_times": {u: {"bytes": t.bytes, "seconds": t.seconds} for u, t in self.unit_times}}


def _number(value) -> float | None:
    """A finite number a float holds exactly enough (a count of seconds): None for another type, NaN,
    an infinity or an integer too large (``float`` of it raised OverflowError)."""
    if type(value) is int:
        return float(value) if abs(value) <= _LARGEST else None
    return value if type(value) is float and math.isfinite(value) else None


def _positive(value) -> int | None:
    return value if type(value) is int and 0 < value <= _LARGEST else None


def _size(value) -> bool:
    return type(value) is int and 0 <= value <= _LARGEST


_LARGEST = 2 ** 53  # every integer up to it is a float exactly: what the estimate computes with


@dataclass(frozen=True, kw_only=True)
class BuildRecord(LibraryRecord):
    """A build's record (``build-info.json``), written by the compile once its library is hashed and read by
    every reader of a build: whether it is finished (``format``, ``key``), which torch it was built for, the
    library's digest, and what it took (``timings``)."""

    format: int | None = None
    torch: str | None = None  # the torch version it was built for (None: the record names none)
    flags: tuple[str, ...] = ()
    timings: Timings | None = None

    @classmethod
    def parse(cls, data: Any, path: str) -> BuildRecord:
        """The record ``data`` (decoded JSON) of the build of ``path``, every field that is read checked:
        an InputError naming ``path`` where it is not a build's record."""
        if not isinstance(data, dict):
            raise incomplete(path, "its record or manifest is no mapping")
        for name, kinds in (("format", int), ("key", str), ("torch", str), ("library", str), ("sha256", str)):
            value = data.get(name)
            if value is not None and (not isinstance(value, kinds) or isinstance(value, bool)):
                raise incomplete(path, f"{RECORD}: {name!r} is {type(value).__name__}")
        flags = data.get("flags", [])
        if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
            raise incomplete(path, f"{RECORD}: 'flags' is not a list of strings")
        library = data.get("library") or ""  # read by no one: a record that names none is still a build's
        return cls(library, data.get("sha256"), data.get("key"), format=data.get("format"), torch=data.get("torch"),
                   flags=tuple(flags), timings=Timings.parse(data))

    @classmethod
    def read(cls, d: Dir, path: str) -> BuildRecord:
        """The record in the checked build directory ``d`` of the library ``path``."""
        return cls.parse(read_json(d, RECORD, path), path)

    def check_torch(self, path: str, version: str) -> None:
        """Refuse (InputError) the build of ``path`` unless it was built for the torch ``version``."""
        if self.torch != version:
            raise InputError(path, None, f"built for torch {self.torch}, this is torch {version}",
                             "rebuild with `torchgen-patch build`")

    def finished(self, key: str) -> bool:
        """Whether this is the record of a finished build of ``key`` in this tool's format."""
        return self.key == key and self.format == RECORD_FORMAT

    def to_json(self) -> dict[str, Any]:
        timings = self.timings.to_json() if self.timings is not None else {}
        return {**super().to_json(), "format": self.format, "torch": self.torch, "flags": list(self.flags), **timings}


@dataclass(frozen=True)
class Manifest:
    """The plan a library was generated from (codegen's manifest, ``src/torchgen_patch_manifest.json``) as the
    runtime reads it: the (op, schema) of every kernel in the library. The rest of the document travels
    untouched (a prebuilt wheel's record holds all of it): ``to_json`` gives it back as it was read."""

    kernels: tuple[tuple[str, str], ...]
    text: str  # the whole document, as canonical JSON

    @classmethod
    def parse(cls, data: Any, path: str) -> Manifest:
        """The manifest ``data`` (decoded JSON) of the build of ``path``: an InputError naming ``path``
        where it is not a mapping or a kernel lacks its op or schema."""
        if not isinstance(data, dict):
            raise incomplete(path, "its record or manifest is no mapping")
        try:
            return cls.of(data)
        except (KeyError, TypeError) as e:
            raise incomplete(path, f"its manifest lacks {e}") from None

    @classmethod
    def of(cls, data: dict) -> Manifest:
        """The manifest ``data``; a KeyError naming what a kernel lacks, a TypeError for a field of
        another type (for a reader that says so in words of its own: a wheel's record)."""
        if not isinstance(data, dict):
            raise TypeError(f"a plan as a table, not {type(data).__name__}")
        kernels = data["kernels"]
        if not isinstance(kernels, list):
            raise TypeError(f"a list of kernels, not {type(kernels).__name__}")
        for k in kernels:
            if not isinstance(k, dict):
                raise TypeError(f"a kernel as a table, not {type(k).__name__}")
            for name in ("op", "schema"):
                if not isinstance(k[name], str):
                    raise TypeError(f"a kernel's {name} as a string, not {type(k[name]).__name__}")
        return cls(tuple((k["op"], k["schema"]) for k in kernels), json.dumps(data, sort_keys=True))

    @classmethod
    def read(cls, d: Dir, path: str) -> Manifest:
        """The manifest in the checked source directory ``d`` of the build of ``path``."""
        from ...codegen.render import MANIFEST

        return cls.parse(read_json(d, MANIFEST, path), path)

    def to_json(self) -> dict[str, Any]:
        return loads(self.text)


NO_MANIFEST = Manifest((), '{"kernels": []}')  # a library without one (the boxed library, the saved-tensor hooks)


def complete(builds: Dir, final: str, key: str, library: str | None = None) -> bool:
    """Whether ``final`` is a finished build of ``key`` (its record, read as any cache entry, says so).
    A build directory others could write is refused (``library``: named in the refusal), never
    rebuilt behind your back."""
    try:
        d = builds.sub(final, refusal=library_refusal(library) if library else None)
    except Missing:
        return False
    with d:
        try:
            return BuildRecord.read(d, library or d.path).finished(key)
        except (EnvironmentProblem, InputError):  # damaged: rebuilt in its place
            return False


def remove_stale(root: str | Dir) -> list[str]:
    """Remove the temporary build directories whose lease expired (their build is gone: killed
    mid-build, on this machine or, after a day, on another host sharing the cache)."""
    from ...fs.leases import sweep  # imported here: a cached install() leases no build

    if isinstance(root, Dir):
        return sweep(root, TEMPORARY)
    try:
        with open_dir(root, cache_refusal(root)) as d:
            return sweep(d, TEMPORARY)
    except Missing:
        return []


def sha256_of(fd: int) -> str:
    """The SHA-256 of the file behind the open descriptor ``fd``, read from its start."""
    h = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        h.update(chunk)
        offset += len(chunk)
    return h.hexdigest()


# ---- a build that failed: the negative entry -------------------------------------------------------

FAILED_FOR = 3600  # seconds a failed build is remembered: after an hour a process tries again
_REMEMBERING: contextvars.ContextVar[bool] = contextvars.ContextVar("torchgen_patch_remembering", default=False)


@contextlib.contextmanager
def remembering():
    """While the block runs, a build that failed in this toolchain within ``FAILED_FOR`` is not tried
    again: what a program's process does (a build started on its own). A command (`enable`, `build`)
    always tries; every failed build is remembered."""
    token = _REMEMBERING.set(True)
    try:
        yield
    finally:
        _REMEMBERING.reset(token)


def failure_name(key: str, path: str) -> str:
    """The negative entry of the build of ``key`` (its inputs, flags, compiler and torch) whose compiler's
    driver runs with the PATH ``path``: another PATH, or a build of other inputs, is another entry."""
    return f"failed-build-{cache_root.key(key, path)[:32]}.json"


def remember(name: str, compiler: str, reason: str) -> None:
    """Remember that the build of entry ``name`` failed with ``reason`` (the compiler's last error line), now."""
    cache.write(name, {"format": 1, "compiler": compiler, "reason": reason, "time": int(time.time())})


def remembered(name: str, what: str) -> InputError | None:
    """Where builds are ``remembering``: the error of the build of entry ``name`` that failed less than
    ``FAILED_FOR`` ago, said in one line with its reason and age (None: none, older, or not remembering).
    The entry is read as every cache entry (a trusted owner's file nobody else can write, with this cache's
    proof); one that fails that, or holds anything else, is ignored: the build is tried."""
    if not _REMEMBERING.get():
        return None
    data = cache.read(name)
    if not isinstance(data, dict) or data.get("format") != 1 or type(data.get("time")) is not int or \
            not isinstance(data.get("reason"), str) or not isinstance(data.get("compiler"), str):
        if data is not None:
            cache.invalid(name, "not a failed build's record")
        return None
    age = int(time.time()) - data["time"]
    if not 0 <= age < FAILED_FOR:  # expired (or dated in the future: never trusted to last)
        return None
    left = FAILED_FOR - age
    return InputError(None, None, f"{what} do not compile: {printable(data['reason'])[:300]} (remembered: the build "
                                  f"with {printable(data['compiler'])} failed {_ago(age)} ago; tried again in "
                                  f"{_ago(left)}, at once by `torchgen-patch enable` or with another compiler or PATH)",
                      cause=printable(data["reason"])[:300])


def _ago(seconds: int) -> str:
    return f"{seconds} s" if seconds < 60 else f"{seconds // 60} min"
