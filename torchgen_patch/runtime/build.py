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

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from .. import cache
from ..codegen import compiled_sources
from ..errors import EnvironmentProblem, InputError, printable, require_torch
from ..files import private_dirs
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


def _ninja() -> str | None:
    """The directory to put first on PATH for ninja (the one pip put beside this Python), or None
    when ninja is on PATH; EnvironmentProblem when there is none."""
    if shutil.which("ninja") is not None:
        return None
    here = os.path.dirname(sys.executable)
    if shutil.which("ninja", path=here):
        return here
    raise EnvironmentProblem("ninja is not installed (torch.utils.cpp_extension builds with it)", "pip install ninja")


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


def _builds_root(root: str | None) -> str:
    """The directory builds go in, created private and checked like a cache root (nothing is
    compiled for, or written into, a directory another account could write)."""
    if root is None:
        return cache.subdir("builds")
    try:
        private_dirs(root)
        cache.check_path(root, root, cache.cache_refusal(root))
        probe = tempfile.NamedTemporaryFile(dir=root, prefix=".probe-")
        probe.close()
    except OSError as e:
        raise InputError(root, None, f"build directory is not writable: {e.strerror}",
                         "set TORCHGEN_PATCH_CACHE to a writable directory") from None
    return root


def build(files: dict[str, bytes], ops: list[str], shards: int, *, flags: tuple[str, ...] | None = None,
          root: str | None = None, verbose: bool = False, log=None, sources: list[str] | None = None,
          prefix: str = LIB_PREFIX) -> Library:
    """Compile ``files`` (as rendered by render.render) unless the cache has them.
    ``sources``: the files to compile (default: the plan's shards and registration); ``log``: where
    the build says what it does (default: ``sys.stderr`` as it is at the call, never at import)."""
    log = sys.stderr if log is None else log
    torch = require_torch("building the kernels")

    compiler = _compiler()
    flags = default_flags() if flags is None else flags
    key = _key(files, flags, compiler)
    root = _builds_root(root)
    final = os.path.join(root, f"build-{key[:24]}")
    name = f"{prefix}_{key[:12]}"
    lib = Library(os.path.join(final, f"{name}.so"), final, key, torch.__version__, tuple(ops), False)
    if _complete(final, key):
        return lib
    _compiler_runs(compiler)
    ninja_dir = _ninja()  # said before "compiling ... with ninja", never after
    with cache.lock(os.path.join(root, f"build-{key[:24]}.lock")):  # a concurrent build of the key waits here
        if _complete(final, key):
            return lib
        remove_stale(root)
        _compile(files, sources or compiled_sources(shards), flags, name, key, final, root, verbose, log, ninja_dir)
    return Library(lib.path, final, key, torch.__version__, tuple(ops), True)


def _complete(final: str, key: str) -> bool:
    fd = cache.open_entry(os.path.join(final, RECORD))
    if fd is None:
        return False
    try:
        with os.fdopen(fd, "rb") as fh:
            data = json.loads(fh.read())
        return isinstance(data, dict) and data.get("key") == key
    except (OSError, ValueError):
        return False


_TMP = re.compile(r"\.(?:build|stale)-[0-9a-f]{12}-(?P<pid>[0-9]+)-")


def remove_stale(root: str) -> list[str]:
    """Remove the temporary build directories of runs whose process is gone (killed mid-build)."""
    gone = []
    try:
        names = os.listdir(root)
    except OSError:
        return gone
    for n in names:
        m = _TMP.match(n)
        if m is None or _alive(int(m.group("pid"))):
            continue
        shutil.rmtree(os.path.join(root, n), ignore_errors=True)
        cache.note(f"removed {os.path.join(root, n)}, left by process {m.group('pid')}, which is gone")
        gone.append(n)
    return gone


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _no_space(e: BaseException | str) -> bool:
    import errno

    return getattr(e, "errno", None) == errno.ENOSPC or "No space left on device" in str(e)


def _disk_full(root: str) -> EnvironmentProblem:
    return EnvironmentProblem(f"no space left on the device of {root} while building the kernels",
                              "free some space, or set TORCHGEN_PATCH_CACHE to a directory on another disk")


_CHILDREN: set = set()  # the build processes (each the leader of its own process group) running now


def _kill_children() -> None:
    import signal

    for proc in list(_CHILDREN):
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except OSError:
            pass


def _die_with_parent() -> None:
    """In a build child: SIGTERM when this process dies, even by SIGKILL (ninja then stops its compilers)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, 15)  # PR_SET_PDEATHSIG, SIGTERM
    except (OSError, AttributeError):
        pass


class _Subprocess:
    """``subprocess`` as cpp_extension sees it while a build runs: ``run`` starts the build (ninja) in a
    process group of its own, ended on SIGINT, SIGTERM, exit or this process's death."""

    def __getattr__(self, name):
        return getattr(subprocess, name)

    @staticmethod
    def run(*args, check=False, **kwargs):
        with subprocess.Popen(*args, start_new_session=True, preexec_fn=_die_with_parent, **kwargs) as proc:
            _CHILDREN.add(proc)
            try:
                out, err = proc.communicate()
            except BaseException:
                _kill_children()
                proc.wait()
                raise
            finally:
                _CHILDREN.discard(proc)
        if check and proc.returncode:
            raise subprocess.CalledProcessError(proc.returncode, proc.args, out, err)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@contextlib.contextmanager
def own_process_group(module):
    """While the block runs: ``module.subprocess`` is ``_Subprocess``, and SIGINT/SIGTERM end the
    build's process group before they act (SIGTERM exits 143, after the temporary build is removed)."""
    import atexit
    import signal
    import threading

    saved = module.subprocess
    module.subprocess = _Subprocess()
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        def on_signal(signum, frame):
            _kill_children()
            previous = handlers[signum]
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
        module.subprocess = saved
        for sig, h in handlers.items():
            signal.signal(sig, h)
        atexit.unregister(_kill_children)


def _compile(files, source_names, flags, name, key, final, root, verbose, log, ninja_dir) -> None:
    torch = require_torch("building the kernels")
    from torch.utils import cpp_extension

    tmp = None
    try:
        tmp = tempfile.mkdtemp(prefix=f".build-{key[:12]}-{os.getpid()}-", dir=root)
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
        if ninja_dir:
            os.environ["PATH"] = ninja_dir + os.pathsep + saved_path
        try:
            with own_process_group(cpp_extension), Progress(tmp, source_names, log):
                cpp_extension.load(name=name, sources=sources, extra_cflags=list(flags), extra_include_paths=[src],
                                   build_directory=tmp, verbose=verbose, is_python_module=False)
        except subprocess.CalledProcessError as e:  # cpp_extension asking the compiler about itself
            raise EnvironmentProblem(f"{printable(str(e.cmd))} failed (exit {e.returncode}) while building the "
                                     "kernels", "check the C++ compiler (CXX) and ninja") from None
        except (RuntimeError, OSError, ImportError) as e:
            if _no_space(e):
                raise _disk_full(root) from None
            raise InputError(None, None, "the generated kernels do not compile:\n" + explain(str(e), src)) from None
        finally:
            os.environ["PATH"] = saved_path
        _versioned_name(tmp, name)
        _owner_writable_only(tmp)
        with open(os.path.join(tmp, RECORD), "w") as fh:
            json.dump({"key": key, "torch": torch.__version__, "library": f"{name}.so",
                       "sha256": sha256_of(os.path.join(tmp, f"{name}.so")), "flags": list(flags),
                       "seconds": round(time.monotonic() - t0, 1), "units": len(sources)},
                      fh, indent=2, sort_keys=True)
        if os.path.lexists(final) and not _complete(final, key):  # a damaged earlier build: out of the way
            aside = tempfile.mkdtemp(prefix=f".stale-{key[:12]}-{os.getpid()}-", dir=root)
            os.rename(final, os.path.join(aside, "old"))
            shutil.rmtree(aside, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if not _complete(final, key):  # someone else's finished build is equally good
                raise
        print(f"torchgen-patch: built {final} in {time.monotonic() - t0:.1f}s", file=log, flush=True)
    except OSError as e:
        if _no_space(e):
            raise _disk_full(root) from None
        raise EnvironmentProblem(f"cannot build in {root}: {e.strerror or e}") from None
    finally:
        if tmp and os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def _versioned_name(tmp: str, name: str) -> None:
    """cpp_extension names a second build of one name in a process ``<name>_v1.so``: give it its name."""
    lib = os.path.join(tmp, f"{name}.so")
    if not os.path.exists(lib):
        made = sorted(n for n in os.listdir(tmp) if re.fullmatch(re.escape(name) + r"_v[0-9]+\.so", n))
        if made:
            os.rename(os.path.join(tmp, made[-1]), lib)


def estimate(root: str, units: int) -> str:
    """How long the build will take, said before it starts: from the last build in this cache
    (its seconds per translation unit), else from the figures measured on a 2-core machine."""
    last = None
    try:
        names = [n for n in os.listdir(root) if n.startswith("build-") and not n.endswith(".lock")]
    except OSError:
        names = []
    for n in names:
        fd = cache.open_entry(os.path.join(root, n, RECORD))  # a record is input like any cache entry
        if fd is None:
            continue
        try:
            mtime = os.fstat(fd).st_mtime
            with os.fdopen(fd, "rb") as fh:
                info = json.loads(fh.read())
        except (OSError, ValueError):
            continue
        if not isinstance(info, dict):
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


def build_boxed(root: str | None = None, verbose: bool = False, log=None) -> Library:
    """The boxed kernel library (for operators outside native_functions.yaml)."""
    from ..codegen import render_boxed

    return build(render_boxed(), [], 0, root=root, verbose=verbose, log=log, sources=["BoxedADInplaceOrView.cpp"],
                 prefix="torchgen_patch_boxed")
