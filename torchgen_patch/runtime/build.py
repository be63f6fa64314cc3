"""Build: compile generated kernels into one shared library against the imported torch, with
ninja, in a private directory; the build never loads what it made.

The library lands in ``<cache>/builds/build-<key>/`` where the key hashes the generated sources,
the flags, the compiler and the torch build. A build runs in a private temporary directory
(0700, made under the checked builds directory's descriptor, holding a lease: a lock of the
live build) from a ``build.ninja`` of relative paths only, run with that directory as its
working directory (set from the descriptor), so no name is resolved twice; the result is
hashed, made writable by its owner only, and renamed into place through the descriptor when it
succeeded, so a crash, a compiler error or a concurrent build never leaves a half-written
library where a later load would pick it up. The library states its own build (this torch's
version, git hash, C++ ABI, CUDA, and the build key, compiled into it), which ``install()``
reads after ``dlopen`` and before registering anything; its record (``build-info.json``) holds
the library's SHA-256, checked before it is loaded (``trust.py``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from .. import cache
from .. import files as _files
from ..codegen import compiled_sources
from ..errors import EnvironmentProblem, InputError, require_torch
from ..vocabulary import plural
from .trust import sha256_of

# Never -Werror here: a newer compiler's new warning must not break a user's install. The
# project's own tests add it through TORCHGEN_PATCH_EXTRA_CFLAGS (tests/conftest.py).
CFLAGS = ("-O2", "-Wall", "-Wno-unused-function")


def default_flags() -> tuple[str, ...]:
    """CFLAGS plus the words of $TORCHGEN_PATCH_EXTRA_CFLAGS (part of the cache key, like every flag)."""
    return CFLAGS + tuple(os.environ.get("TORCHGEN_PATCH_EXTRA_CFLAGS", "").split())


LIB_PREFIX = "torchgen_patch_kernels"
RECORD = "build-info.json"
# 3: built with ninja from a private directory; the library states its own build (older builds are never reused)
RECORD_FORMAT = 3
IDENTITY_SOURCE = "torchgen_patch_build.cpp"
IDENTITY_SYMBOL = "torchgen_patch_build"
TEMPORARY = (".build-", ".stale-")  # the prefixes of temporary directories in a builds directory


@dataclass(frozen=True)
class Library:
    path: str  # the shared library
    directory: str
    key: str
    torch_version: str
    ops: tuple[str, ...]
    built: bool  # False when the cache already had it


def torch_identity() -> dict:
    """The running torch build: what a library is compiled against and states, and what a prebuilt
    kernels wheel records."""
    torch = require_torch("building the kernels")
    return {"version": torch.__version__, "git_version": torch.version.git_version,
            "cxx11_abi": bool(torch.compiled_with_cxx11_abi()), "cuda": torch.version.cuda}


def _compiler() -> str:
    """The C++ compiler ($CXX or c++) on PATH."""
    cxx = os.environ.get("CXX", "c++")
    path = shutil.which(cxx)
    if path is None:
        raise EnvironmentProblem(f"no C++ compiler: '{cxx}' is not on PATH",
                         "install g++ (or set CXX), or use --backend python (install(backend='python') in Python)")
    return path


def _compiler_runs(path: str) -> None:
    """Before anything is compiled or written: the compiler answers ``--version``."""
    cxx = os.environ.get("CXX", "c++")
    try:
        r = subprocess.run([path, "--version"], capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as e:
        raise EnvironmentProblem(f"the C++ compiler {path} does not run: {e}",
                                 "install g++ (or set CXX), or use install(backend='python')") from None
    if r.returncode != 0:
        raise EnvironmentProblem(f"the C++ compiler {path} does not run: '{cxx} --version' exits {r.returncode}",
                                 "install g++ (or set CXX), or use install(backend='python')")


def _ninja() -> str:
    """The ninja to build with: on PATH, else the one pip put beside this Python."""
    found = shutil.which("ninja") or shutil.which("ninja", path=os.path.dirname(sys.executable))
    if found is None:
        raise EnvironmentProblem("ninja is not installed (the kernels are built with it)", "pip install ninja")
    return found


def _key(files: dict[str, bytes], flags: tuple[str, ...], compiler: str) -> str:
    torch = require_torch("building the kernels")

    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name] + b"\0")
    h.update(" ".join(flags).encode())
    h.update(compiler.encode())
    h.update(torch.__version__.encode() + torch.__file__.encode())
    h.update(f"record-{RECORD_FORMAT}".encode())
    return h.hexdigest()


def _builds_root(root: str | None) -> cache.Dir:
    """The checked directory builds go in (created private; nothing is compiled for, or written into,
    a directory another account could write)."""
    if root is None:
        return cache.subdir("builds")
    try:
        return cache.open_dir(root, cache.cache_refusal(root), create=True)
    except InputError as e:
        if type(e) is not InputError:
            raise
        raise _not_writable(root, e.message.rsplit(": ", 1)[-1]) from None


def _not_writable(root: str, why: str) -> InputError:
    return InputError(root, None, f"build directory is not writable: {why}",
                      f"set {cache.ENV} to a cache of your own (a directory you can write)")


def build(files: dict[str, bytes], ops: list[str], shards: int, *, flags: tuple[str, ...] | None = None,
          root: str | None = None, verbose: bool = False, log=None, sources: list[str] | None = None,
          prefix: str = LIB_PREFIX, links: tuple[str, ...] = (), what: str = "the generated kernels") -> Library:
    """Compile ``files`` (as rendered by render.render) unless the cache has them.
    ``sources``: the files to compile (default: the plan's shards and registration); ``log``: where
    the build says what it does (default: ``sys.stderr`` as it is at the call, never at import);
    ``links``: more link flags (part of the key, as every flag); ``what``: how a compiler error names them."""
    log = sys.stderr if log is None else log
    torch = require_torch("building the kernels")

    compiler = _compiler()
    flags = default_flags() if flags is None else flags
    key = _key(files, flags + tuple(links), compiler)
    final = f"build-{key[:24]}"
    name = f"{prefix}_{key[:12]}"
    with _builds_root(root) as builds:
        lib = Library(builds.join(final, f"{name}.so"), builds.join(final), key, torch.__version__, tuple(ops), False)
        if _complete(builds, final, key, lib.path):
            return lib
        _compiler_runs(compiler)
        ninja = _ninja()  # said before "compiling ... with ninja", never after
        with contextlib.ExitStack() as held:
            try:  # a concurrent build of the key waits here
                held.enter_context(builds.lock(f"{final}.lock",
                                               wait_note=f"waiting for another build of {lib.directory}"))
            except EnvironmentProblem as e:
                if getattr(e, "errno", None) in (errno.EACCES, errno.EPERM, errno.EROFS):
                    raise _not_writable(builds.path, e.message.rsplit(": ", 1)[-1]) from None
                raise
            if _complete(builds, final, key, lib.path):
                return lib
            remove_stale(builds)
            _compile(builds, files, sources or compiled_sources(shards), flags, name, key, final, compiler, ninja,
                     verbose, log, links, what)
    return Library(lib.path, lib.directory, key, torch.__version__, tuple(ops), True)


def _complete(builds: cache.Dir, final: str, key: str, library: str | None = None) -> bool:
    """Whether ``final`` is a finished build of ``key`` (its record, read as any cache entry, says so).
    A build directory others could write is refused (``library``: named in the refusal), never
    rebuilt behind your back."""
    try:
        d = builds.sub(final, refusal=cache.library_refusal(library) if library else None)
    except cache.Missing:
        return False
    with d:
        try:
            data = _files.loads(d.read(RECORD))
        except (cache.Missing, EnvironmentProblem, OSError, ValueError):  # damaged: rebuilt in its place
            return False
    return isinstance(data, dict) and data.get("key") == key and data.get("format") == RECORD_FORMAT


def remove_stale(root: str | cache.Dir) -> list[str]:
    """Remove the temporary build directories whose lease expired (their build is gone: killed
    mid-build, on this machine or, after a day, on another host sharing the cache)."""
    if isinstance(root, cache.Dir):
        return cache.sweep(root, TEMPORARY)
    try:
        with cache.open_dir(root, cache.cache_refusal(root)) as d:
            return cache.sweep(d, TEMPORARY)
    except cache.Missing:
        return []


def _no_space(e: BaseException | str) -> bool:
    import errno

    return getattr(e, "errno", None) == errno.ENOSPC or "No space left on device" in str(e)


def _disk_full(root: str) -> EnvironmentProblem:
    return EnvironmentProblem(f"no space left on the device of {root} while building the kernels",
                              "free some space, or set TORCHGEN_PATCH_CACHE to a directory on another disk")


# ---- the compiler's processes -----------------------------------------------------------------------

_CHILDREN: dict = {}  # the build processes running now (each the leader of its own group) -> the pid that started it


def _kill_children() -> None:
    """End the build processes this process started (never those of a parent it was forked from)."""
    import signal

    me = os.getpid()
    for proc, owner in list(_CHILDREN.items()):
        if owner != me:
            continue
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except OSError:
            pass


os.register_at_fork(after_in_child=_CHILDREN.clear)  # a child forked mid-build owns none of its parent's


def _die_with_parent() -> None:
    """In a build child: SIGTERM when this process dies, even by SIGKILL (ninja then stops its compilers)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, 15)  # PR_SET_PDEATHSIG, SIGTERM
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def own_process_group():
    """While the block runs: SIGINT/SIGTERM end the build's process group before they act (SIGTERM
    exits 143, after the temporary build is removed), and so does this process's exit."""
    import atexit
    import signal
    import threading

    handlers: dict = {}
    if threading.current_thread() is threading.main_thread():
        def on_signal(signum, frame):
            _kill_children()
            previous = handlers.get(signum)
            if callable(previous):
                previous(signum, frame)
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)

        for sig in (signal.SIGINT, signal.SIGTERM):
            handlers[sig] = signal.signal(sig, on_signal)
    atexit.register(_kill_children)
    try:
        yield
    finally:
        for sig, h in handlers.items():
            signal.signal(sig, h)
        atexit.unregister(_kill_children)


def _run(d: cache.Dir, argv: list[str], log, verbose: bool) -> tuple[int, str]:
    """``argv`` in ``d`` (its working directory set from the descriptor), in a process group of its
    own that ends with the build; (exit status, its output)."""
    with own_process_group():
        proc = d.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                     start_new_session=True, preexec=_die_with_parent)
        _CHILDREN[proc] = os.getpid()
        try:
            out = []
            for line in proc.stdout:
                out.append(line)
                if verbose:
                    log.write(line.decode(errors="replace"))
                    log.flush()
            proc.wait()
        except BaseException:
            _kill_children()
            proc.wait()
            raise
        finally:
            _CHILDREN.pop(proc, None)
            proc.stdout.close()
    return proc.returncode, b"".join(out).decode(errors="replace")


# ---- flags, build.ninja, the library's statement of its build ------------------------------------

def _std(cpp_extension) -> str:
    """The C++ standard this torch's own extension builds use (C++17 up to some release, C++20 after)."""
    import inspect

    try:
        text = inspect.getsource(cpp_extension._write_ninja_file_to_build_library)
    except (AttributeError, OSError, TypeError):
        text = ""
    m = re.search(r"-std=c\+\+(\d+)", text)
    return f"-std=c++{m.group(1) if m else '17'}"


def _toolchain_flags() -> tuple[list[str], list[str]]:
    """(compile flags, link flags) for a library that torch loads, as torch's extension builds make
    them: torch's headers as system headers, its C++ ABI, position-independent code, its libraries."""
    torch = require_torch("building the kernels")
    from torch.utils import cpp_extension

    includes = [x for p in cpp_extension.include_paths() for x in ("-isystem", p)]
    cflags = [f"-D_GLIBCXX_USE_CXX11_ABI={int(bool(torch.compiled_with_cxx11_abi()))}", *includes, "-Isrc",
              "-fPIC", _std(cpp_extension)]
    ldflags = ["-shared", *[f"-L{p}" for p in cpp_extension.library_paths()], "-lc10", "-ltorch_cpu", "-ltorch"]
    return cflags, ldflags


def _ninja_quote(words: list[str]) -> str:
    import shlex

    return " ".join(shlex.quote(w) for w in words).replace("$", "$$")


def build_ninja(compiler: str, cflags: list[str], ldflags: list[str], units: list[str], library: str) -> str:
    """A build.ninja of relative paths only (``src/<unit>`` → ``<unit>.o`` → ``library``): run in its
    directory, the build resolves no name outside it but the toolchain's."""
    objects = [os.path.splitext(u)[0] + ".o" for u in units]
    lines = ["ninja_required_version = 1.3", f"cxx = {_ninja_quote([compiler])}", f"cflags = {_ninja_quote(cflags)}",
             f"ldflags = {_ninja_quote(ldflags)}", "",
             "rule compile", "  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out", "  depfile = $out.d",
             "  deps = gcc", "  description = compile $in", "",
             "rule link", "  command = $cxx $in $ldflags -o $out", "  description = link $out", ""]
    lines += [f"build {o}: compile src/{u}" for u, o in zip(units, objects, strict=True)]
    lines += [f"build {library}: link {' '.join(objects)}", f"default {library}", ""]
    return "\n".join(lines)


def identity_source(key: str) -> bytes:
    """The translation unit that makes a library state its own build: what it was compiled against,
    as the building Python saw it (torch's version, git hash, C++ ABI, CUDA) and as torch's headers
    and the compiler saw it, and its build key. Read back by ``install`` after ``dlopen``."""
    stated = json.dumps({"key": key, "torch": torch_identity()}, sort_keys=True)
    return (
        "// @generated by torchgen-patch: the build this library is (read after dlopen, before registration).\n"
        "#include <string>\n#include <torch/version.h>\n\n"
        "#define TORCHGEN_PATCH_STR2(x) #x\n#define TORCHGEN_PATCH_STR(x) TORCHGEN_PATCH_STR2(x)\n"
        "#if defined(_GLIBCXX_USE_CXX11_ABI) && _GLIBCXX_USE_CXX11_ABI\n#define TORCHGEN_PATCH_ABI \"true\"\n"
        "#elif defined(_GLIBCXX_USE_CXX11_ABI)\n#define TORCHGEN_PATCH_ABI \"false\"\n"
        "#else\n#define TORCHGEN_PATCH_ABI \"null\"\n#endif\n\n"
        f'extern "C" const char* {IDENTITY_SYMBOL}() {{\n'
        f'  return "{{\\"stated\\": " R"tgp({stated})tgp" ", \\"headers\\": {{\\"version\\": \\""\n'
        '      TORCHGEN_PATCH_STR(TORCH_VERSION_MAJOR) "." TORCHGEN_PATCH_STR(TORCH_VERSION_MINOR) "."\n'
        '      TORCHGEN_PATCH_STR(TORCH_VERSION_PATCH) "\\", \\"cxx11_abi\\": " TORCHGEN_PATCH_ABI "}}";\n'
        "}\n").encode()


def build_problem(stated: str | bytes | None, key: str | None, path: str) -> str | None:
    """Why a library whose ``torchgen_patch_build()`` said ``stated`` must not be registered in this
    torch (None: it is the build of ``key`` for exactly this torch). No record can say otherwise."""
    if stated is None:
        return (f"{path} does not say which torch it was built against (made by an older torchgen-patch, or "
                "not by torchgen-patch)")
    try:
        info = _files.loads(stated)
        said, headers = info["stated"], info["headers"]
    except (ValueError, KeyError, TypeError):
        return f"{path} states its build in a form this torchgen-patch does not read"
    if key is not None and said.get("key") != key:
        return (f"the library loaded for {path} is the build {str(said.get('key'))[:24]}, not {key[:24]} that was "
                "checked")
    here = torch_identity()
    differ = [f"{k} {said.get('torch', {}).get(k)!r} (this torch: {here[k]!r})" for k in here
              if said.get("torch", {}).get(k) != here[k]]
    base = here["version"].split("+")[0]
    if headers.get("version") != base:
        differ.append(f"headers of torch {headers.get('version')} (this torch: {base})")
    if headers.get("cxx11_abi") is not None and headers.get("cxx11_abi") != here["cxx11_abi"]:
        differ.append(f"C++11 ABI {headers.get('cxx11_abi')} (this torch: {here['cxx11_abi']})")
    if differ:
        return f"{path} was built against another torch: " + "; ".join(differ)
    return None


# ---- the build -------------------------------------------------------------------------------------

def _compile(builds: cache.Dir, files, units, flags, name, key, final, compiler, ninja, verbose, log,
             links=(), what="the generated kernels") -> None:
    torch = require_torch("building the kernels")
    library = f"{name}.so"
    tmp = None
    try:
        tmp = builds.mkdtemp(f".build-{key[:12]}-{os.getpid()}-")
        with tmp, cache.leased(tmp):
            with tmp.sub("src", create=True) as src:
                for fname, data in sorted(files.items()):
                    src.create(fname, data)
                src.create(IDENTITY_SOURCE, identity_source(key))
            units = list(units) + [IDENTITY_SOURCE]
            cflags, ldflags = _toolchain_flags()
            ldflags += list(links)
            tmp.create("build.ninja", build_ninja(compiler, cflags + list(flags), ldflags, units, library).encode())
            sizes = {u: len(files[u]) if u in files else len(identity_source(key)) for u in units}
            guess = estimate(builds, sizes)
            print(f"torchgen-patch: compiling {plural(len(units), 'translation unit')} with ninja (torch "
                  f"{torch.__version__})" + (f"; {guess}" if guess else "") + " ...", file=log, flush=True)
            t0 = time.monotonic()
            jobs = os.environ.get("MAX_JOBS", "").strip()
            argv = [ninja] + (["-v"] if verbose else []) + (["-j", jobs] if jobs.isdigit() else [])
            with Progress(tmp, units, log):
                rc, out = _run(tmp, argv, log, verbose)
            if rc != 0:
                if _no_space(out):
                    raise _disk_full(builds.path)
                raise InputError(None, None, f"{what} do not compile:\n" + explain(out, files))
            seconds = round(time.monotonic() - t0, 1)
            fd = tmp.open(library)
            try:
                digest = sha256_of(fd)
            finally:
                os.close(fd)
            times = ninja_times(tmp)
            tmp.owner_writable_only()
            record = {"format": RECORD_FORMAT, "key": key, "torch": torch.__version__, "library": library,
                      "sha256": digest, "flags": list(flags), "seconds": seconds,
                      "jobs": int(jobs) if jobs.isdigit() else os.cpu_count() or 1,
                      "link_seconds": times.get(library),
                      # "units" stays a count, as older versions of this tool read it from a shared cache
                      "units": len(units),
                      "unit_times": {u: {"bytes": sizes[u], "seconds": times.get(os.path.splitext(u)[0] + ".o")}
                                     for u in units}}
            tmp.create(RECORD, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode(), 0o644)
            if builds.lstat(final) is not None and not _complete(builds, final, key, builds.join(final, library)):
                with builds.mkdtemp(f".stale-{key[:12]}-{os.getpid()}-") as aside, cache.leased(aside):
                    builds.rename(final, "old", into=aside)
                builds.remove(os.path.basename(aside.path))
            try:
                builds.rename(os.path.basename(tmp.path), final)
            except OSError:
                if not _complete(builds, final, key, builds.join(final, library)):  # another's is equally good
                    raise
        print(f"torchgen-patch: built {builds.join(final)} in {time.monotonic() - t0:.1f} s", file=log, flush=True)
    except OSError as e:
        if _no_space(e):
            raise _disk_full(builds.path) from None
        raise EnvironmentProblem(f"cannot build in {builds.path}: {e.strerror or e}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                builds.remove(os.path.basename(tmp.path))  # gone already when it became the build


def ninja_times(d: cache.Dir) -> dict[str, float]:
    """Each output's own build time in seconds, from ninja's log in ``d`` (``.ninja_log``)."""
    try:
        text = d.read(".ninja_log").decode(errors="replace")
    except (cache.Missing, EnvironmentProblem, OSError):
        return {}
    out = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) >= 4 and parts[0].isdigit() and parts[1].isdigit():
            out[parts[3]] = round((int(parts[1]) - int(parts[0])) / 1000, 1)
    return out


def estimate(builds: cache.Dir | str, units: dict[str, int] | int) -> str | None:
    """How long the build of ``units`` (name -> bytes) will take, said before it starts, from the
    units earlier builds in this directory recorded (their own compile times, ninja's): a unit
    built before under its name takes what it took then (the size difference at the rate the
    earlier units give), another one what units of its size took; scheduled on as many workers as
    those builds had, plus their link time. None (no estimate) where no earlier build here
    recorded its units: there is nothing honest to say."""
    if isinstance(builds, str):
        try:
            with cache.open_dir(builds, cache.cache_refusal(builds)) as d:
                return estimate(d, units)
        except cache.Missing:
            return None
    if isinstance(units, int):
        units = {str(i): 0 for i in range(units)}
    seen: dict[str, list[tuple[int, float]]] = {}
    links, jobs, n = [], [], 0
    try:
        names = [n for n in builds.names() if n.startswith("build-") and not n.endswith(".lock")]
    except OSError:
        names = []
    for name in names:
        try:
            with builds.sub(name) as d:
                info = _files.loads(d.read(RECORD))  # a record is input like any cache entry
        except (cache.Missing, EnvironmentProblem, OSError, ValueError):
            continue
        if not isinstance(info, dict) or not isinstance(info.get("unit_times"), dict):
            continue
        n += 1
        for u, t in info["unit_times"].items():
            if isinstance(t, dict) and type(t.get("bytes")) is int and isinstance(t.get("seconds"), (int, float)):
                seen.setdefault(u, []).append((t["bytes"], float(t["seconds"])))
        if isinstance(info.get("link_seconds"), (int, float)):
            links.append(float(info["link_seconds"]))
        if type(info.get("jobs")) is int and info["jobs"] > 0:
            jobs.append(info["jobs"])
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
    return f"about {max(1, round(total))} s, going by {plural(n, 'earlier build')} here"


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


class Progress:
    """On a terminal (not in CI), a line per translation unit as ninja finishes it, with its own
    compile time (ninja's log); elsewhere nothing. A context manager around the compile."""

    def __init__(self, directory: cache.Dir, sources: list[str], log):
        self.directory, self.log = directory, log
        self.pending = {os.path.splitext(os.path.basename(s))[0] + ".o": os.path.basename(s) for s in sources}
        self.total = len(self.pending)
        self.on = bool(getattr(log, "isatty", lambda: False)()) and not os.environ.get("CI")
        self._stop: Any = None  # a threading.Event while it watches

    def poll(self) -> None:
        times = ninja_times(self.directory)
        for obj in sorted(set(times) & set(self.pending), key=lambda o: (times[o], o)):
            done = self.total - len(self.pending) + 1
            print(f"torchgen-patch: [{done}/{self.total}] compiled {self.pending.pop(obj)} in {times[obj]:.0f} s",
                  file=self.log, flush=True)

    def __enter__(self):
        if self.on:
            import threading

            self._stop = threading.Event()

            def watch():
                while not self._stop.wait(0.5):
                    self.poll()

            self._thread = threading.Thread(target=watch, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._stop is not None:
            self._stop.set()
            self._thread.join()
            if exc[0] is None:
                self.poll()
        return False


_DIAG = re.compile(r"(?P<file>[^\s:]+\.(?:cpp|h)):(?P<line>\d+):(?:\d+:)? (?:fatal )?error: (?P<msg>.*)")
_KERNEL = re.compile(r"^// (?P<op>\S+)  \((?P<yaml>[^)]+)\)$")


def explain(output: str, files: dict[str, bytes]) -> str:
    """Map compiler errors back to the kernel (op and yaml line) they are in (``files``: the sources)."""
    lines = []
    for m in _DIAG.finditer(output):
        name = os.path.basename(m.group("file"))
        op = _kernel_at(files.get(name, b""), int(m.group("line")))
        where = f"{name}:{m.group('line')}"
        lines.append(f"  {where}: error: {m.group('msg')}" + (f"  [in the kernel of {op}]" if op else ""))
    if not lines:
        tail = "\n".join(output.strip().splitlines()[-15:])
        return "  " + tail.replace("\n", "\n  ")
    return "\n".join(dict.fromkeys(lines))


def _kernel_at(source: bytes, line: int) -> str | None:
    for row in reversed(source.decode("utf-8", errors="replace").splitlines()[:line]):
        m = _KERNEL.match(row)
        if m:
            return f"{m.group('op')} ({m.group('yaml')})"
    return None


def build_boxed(root: str | None = None, verbose: bool = False, log=None) -> Library:
    """The boxed kernel library (for operators outside native_functions.yaml)."""
    from ..codegen import render_boxed

    return build(render_boxed(), [], 0, root=root, verbose=verbose, log=log, sources=["BoxedADInplaceOrView.cpp"],
                 prefix="torchgen_patch_boxed")


def python_flags() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(compile flags, link flags) of a library that is also a Python extension: this Python's headers
    and torch's Python bindings; an EnvironmentProblem where the headers are missing."""
    import sysconfig

    include = sysconfig.get_paths().get("include") or ""
    if not os.path.isfile(os.path.join(include, "Python.h")):
        raise EnvironmentProblem("this Python's headers are not installed "
                                 f"(no Python.h in {include or 'its include path'})",
                                 "install them (python3-dev on Debian and Ubuntu)")
    return ("-isystem", include, "-O3"), ("-ltorch_python",)


def build_saved(root: str | None = None, verbose: bool = False, log=None) -> Library:
    """The saved-tensor check's native hooks (a library that is a Python extension, built as any other)."""
    from ..codegen import render_saved

    cflags, links = python_flags()
    files = render_saved()
    return build(files, [], 0, flags=default_flags() + cflags, root=root, verbose=verbose, log=log,
                 sources=[n for n in sorted(files) if n.endswith(".cpp")], prefix="torchgen_patch_saved", links=links,
                 what="the saved-tensor check's native hooks")
