"""Build: compile generated kernels into one shared library against the
imported torch, with torch.utils.cpp_extension and ninja.

The library lands in ``<cache>/build-<key>/`` where the key hashes the
generated sources, the flags, the compiler and the torch build. A build runs
in a private temporary directory renamed into place only when it succeeded,
so a crash, a compiler error or a concurrent build never leaves a
half-written library where a later load would pick it up. The cache's
directories are created private (0700), the finished build is made writable
by its owner only, and its record (``build-info.json``) holds the library's
SHA-256, which ``install()`` checks before loading it (``trust.py``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass

from ..codegen import compiled_sources
from ..errors import EnvironmentProblem, InputError, require_torch
from ..files import private_dirs
from ..scan.cache import directory as cache_dir
from .trust import sha256_of

# Never -Werror here: a newer compiler's new warning must not break a user's install. The
# project's own tests add it through TORCHGEN_PATCH_EXTRA_CFLAGS (tests/conftest.py).
CFLAGS = ("-O2", "-Wall", "-Wno-unused-function")


def default_flags() -> tuple[str, ...]:
    """CFLAGS plus the words of $TORCHGEN_PATCH_EXTRA_CFLAGS (part of the cache key, like every flag)."""
    return CFLAGS + tuple(os.environ.get("TORCHGEN_PATCH_EXTRA_CFLAGS", "").split())


LIB_PREFIX = "torchgen_patch_kernels"
RECORD = "build-info.json"
RECORD_FORMAT = 2  # 2: the record holds the library's sha256 (older builds are never reused)


@dataclass(frozen=True)
class Library:
    path: str  # the shared library
    directory: str
    key: str
    torch_version: str
    ops: tuple[str, ...]
    built: bool  # False when the cache already had it


def _compiler() -> str:
    cxx = os.environ.get("CXX", "c++")
    path = shutil.which(cxx)
    if path is None:
        raise EnvironmentProblem(f"no C++ compiler: '{cxx}' is not on PATH",
                         "install g++ (or set CXX), or use --backend python (install(backend='python') in Python)")
    return path


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


def build(files: dict[str, bytes], ops: list[str], shards: int, *, flags: tuple[str, ...] | None = None,
          root: str | None = None, verbose: bool = False, log=sys.stderr, sources: list[str] | None = None,
          prefix: str = LIB_PREFIX) -> Library:
    """Compile ``files`` (as rendered by render.render) unless the cache has them.
    ``sources``: the files to compile (default: the plan's shards and registration)."""
    torch = require_torch("building the kernels")

    compiler = _compiler()
    flags = default_flags() if flags is None else flags
    key = _key(files, flags, compiler)
    root = root or os.path.join(cache_dir(), "builds")
    final = os.path.join(root, f"build-{key[:24]}")
    name = f"{prefix}_{key[:12]}"
    lib = Library(os.path.join(final, f"{name}.so"), final, key, torch.__version__, tuple(ops), False)
    if _complete(final, key):
        return lib
    try:
        private_dirs(root)
        probe = tempfile.NamedTemporaryFile(dir=root, prefix=".probe-")
        probe.close()
    except OSError as e:
        raise InputError(root, None, f"build directory is not writable: {e.strerror}",
                         "set TORCHGEN_PATCH_CACHE to a writable directory") from None
    with open(os.path.join(root, f"build-{key[:24]}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent build of the same key waits here
        try:
            if _complete(final, key):
                return lib
            _compile(files, sources or compiled_sources(shards), flags, name, key, final, root, verbose, log)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return Library(lib.path, final, key, torch.__version__, tuple(ops), True)


def _complete(final: str, key: str) -> bool:
    try:
        with open(os.path.join(final, RECORD)) as fh:
            return json.load(fh).get("key") == key
    except (OSError, ValueError):
        return False


def _compile(files, source_names, flags, name, key, final, root, verbose, log) -> None:
    torch = require_torch("building the kernels")
    from torch.utils import cpp_extension

    tmp = tempfile.mkdtemp(prefix=f".build-{key[:12]}-", dir=root)
    try:
        src = os.path.join(tmp, "src")
        os.makedirs(src)
        for fname, data in files.items():
            with open(os.path.join(src, fname), "wb") as fh:
                fh.write(data)
        sources = [os.path.join(src, s) for s in source_names]
        print(f"torchgen-patch: compiling {len(sources)} translation units with ninja "
              f"(torch {torch.__version__}); {estimate(root, len(sources))} ...", file=log, flush=True)
        t0 = time.monotonic()
        saved_path = os.environ.get("PATH", "")
        here = os.path.dirname(sys.executable)
        if shutil.which("ninja") is None:
            if not shutil.which("ninja", path=here):
                raise EnvironmentProblem("ninja is not installed (torch.utils.cpp_extension builds with it)",
                                 "pip install ninja")
            os.environ["PATH"] = here + os.pathsep + saved_path  # the ninja pip put beside this Python
        try:
            with Progress(tmp, source_names, log):
                cpp_extension.load(
                    name=name,
                    sources=sources,
                    extra_cflags=list(flags),
                    extra_include_paths=[src],
                    build_directory=tmp,
                    verbose=verbose,
                    is_python_module=False,
                )
        except (RuntimeError, OSError, ImportError) as e:
            raise InputError(None, None, "the generated kernels do not compile:\n" + explain(str(e), src)) from None
        finally:
            os.environ["PATH"] = saved_path
        _owner_writable_only(tmp)
        with open(os.path.join(tmp, RECORD), "w") as fh:
            json.dump({"key": key, "torch": torch.__version__, "library": f"{name}.so",
                       "sha256": sha256_of(os.path.join(tmp, f"{name}.so")), "flags": list(flags),
                       "seconds": round(time.monotonic() - t0, 1), "units": len(sources)},
                      fh, indent=2, sort_keys=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if not _complete(final, key):  # someone else's finished build is equally good
                raise
        print(f"torchgen-patch: built {final} in {time.monotonic() - t0:.1f}s", file=log, flush=True)
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def estimate(root: str, units: int) -> str:
    """How long the build will take, said before it starts: from the last build in this cache
    (its seconds per translation unit), else from the figures measured on a 2-core machine."""
    last = None
    try:
        names = [n for n in os.listdir(root) if n.startswith("build-") and not n.endswith(".lock")]
    except OSError:
        names = []
    for n in names:
        try:
            with open(os.path.join(root, n, RECORD)) as fh:
                info = json.load(fh)
            mtime = os.path.getmtime(os.path.join(root, n, RECORD))
        except (OSError, ValueError):
            continue
        if isinstance(info.get("seconds"), (int, float)) and info.get("units") and (last is None or mtime > last[0]):
            last = (mtime, info["seconds"] / info["units"])
    if last is not None:
        return f"about {max(1, round(last[1] * units))} s, going by the last build here"
    return f"about {10 * units}-{25 * units} s on 2 cores, less with more"


class Progress:
    """On a terminal (not in CI), a line per translation unit as its object file appears in the
    build directory; elsewhere nothing. A context manager around the compile."""

    def __init__(self, directory: str, sources: list[str], log):
        self.directory, self.log = directory, log
        self.pending = {os.path.splitext(os.path.basename(s))[0]: os.path.basename(s) for s in sources}
        self.total = len(self.pending)
        self.on = bool(getattr(log, "isatty", lambda: False)()) and not os.environ.get("CI")
        self.t0 = time.monotonic()
        self._stop = None

    def poll(self) -> None:
        try:
            objects = {os.path.splitext(n)[0] for n in os.listdir(self.directory) if n.endswith(".o")}
        except OSError:
            return
        for stem in sorted(objects & set(self.pending)):
            done = self.total - len(self.pending) + 1
            print(f"torchgen-patch: [{done}/{self.total}] compiled {self.pending.pop(stem)} "
                  f"({time.monotonic() - self.t0:.0f} s)", file=self.log, flush=True)

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


def _owner_writable_only(top: str) -> None:
    """chmod go-w the whole build (a umask of 002 would leave it group-writable, which install refuses)."""
    for base, dirs, names in os.walk(top):
        for p in [base] + [os.path.join(base, n) for n in names]:
            mode = os.lstat(p).st_mode
            if not os.path.islink(p) and mode & 0o022:
                os.chmod(p, mode & ~0o022 & 0o7777)


_DIAG = re.compile(r"(?P<file>[^\s:]+\.(?:cpp|h)):(?P<line>\d+):(?:\d+:)? (?:fatal )?error: (?P<msg>.*)")
_KERNEL = re.compile(r"^// (?P<op>\S+)  \((?P<yaml>[^)]+)\)$")


def explain(output: str, src_dir: str) -> str:
    """Map compiler errors back to the kernel (op and yaml line) they are in."""
    lines = []
    for m in _DIAG.finditer(output):
        path = m.group("file")
        if not os.path.isabs(path):
            path = os.path.join(src_dir, os.path.basename(path))
        op = _kernel_at(path, int(m.group("line")))
        where = f"{os.path.basename(path)}:{m.group('line')}"
        lines.append(f"  {where}: error: {m.group('msg')}" + (f"  [in the kernel of {op}]" if op else ""))
    if not lines:
        tail = "\n".join(output.strip().splitlines()[-15:])
        return "  " + tail.replace("\n", "\n  ")
    return "\n".join(dict.fromkeys(lines))


def _kernel_at(path: str, line: int) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read().splitlines()[:line]
    except OSError:
        return None
    for row in reversed(text):
        m = _KERNEL.match(row)
        if m:
            return f"{m.group('op')} ({m.group('yaml')})"
    return None


def build_boxed(root: str | None = None, verbose: bool = False, log=sys.stderr) -> Library:
    """The boxed kernel library (for operators outside native_functions.yaml)."""
    from ..codegen import render_boxed

    return build(render_boxed(), [], 0, root=root, verbose=verbose, log=log, sources=["BoxedADInplaceOrView.cpp"],
                 prefix="torchgen_patch_boxed")
