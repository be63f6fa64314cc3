"""Build: compile generated kernels into one shared library against the imported torch, with
ninja, in a private directory; the build never loads what it made.

The library lands in ``<cache>/builds/build-<key>/`` where the key hashes the generated sources,
the flags, the compiler and the torch build. A build runs in a private temporary directory
(0700, made under the checked builds directory's descriptor, holding a lease: a lock of the
live build) from a ``build.ninja`` of relative paths only, run with that directory as its
working directory (set from the descriptor), so no name is resolved twice; the result is
hashed, made writable by its owner only, and renamed into place through the descriptor when it
succeeded (when it failed, the cache remembers that for an hour: ``record.py``), so a crash, a
compiler error or a concurrent build never leaves a half-written library where a later load
would pick it up. The library states its own build (this torch's
version, git hash, C++ ABI, CUDA, and the build key, compiled into it), which ``install()``
reads after ``dlopen`` and before registering anything; its record (``build-info.json``) holds
the library's SHA-256, checked before it is loaded (``load/trust.py``).

The parts: the toolchain found (``toolchain.py``), the key and the library's statement of its build
(``key.py``), the record (``record.py``), build.ninja and ninja's log (``ninja.py``), the compile
(``make.py``) in a process group of its own (``processes.py``), with progress lines
(``progress.py``), an estimate said before it starts (``build_time.py``) and compiler errors mapped
back to kernels (``compiler_errors.py``). ``build()`` is the one entry point, and composes them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import sys
from dataclasses import dataclass

from ...errors import EnvironmentProblem, InputError, require_torch
from ...fs import root as cache_root
from ...fs.dirs import Dir, open_dir, subdir
from ...fs.protected import cache_refusal
from .key import IDENTITY_SOURCE, IDENTITY_SYMBOL, build_key, build_problem, identity_source, torch_identity
from .record import (FAILED_FOR, LIB_PREFIX, RECORD, RECORD_FORMAT, TEMPORARY, complete, failure_name, remember,
                     remembered, remembering, remove_stale)
from .toolchain import (CFLAGS, check_compiler_runs, compiler_path, default_flags, driver_path, ninja_path,
                        python_flags, recorded)

# What only a compile uses (build_time, compiler_errors, ninja, processes, progress, compile) is imported where
# a compile starts: a cached install() finds its library through key.py, record.py and toolchain.py, and never
# loads the compile's modules (nor codegen).

__all__ = ["CFLAGS", "FAILED_FOR", "IDENTITY_SOURCE", "IDENTITY_SYMBOL", "LIB_PREFIX", "Library", "RECORD",
           "RECORD_FORMAT", "TEMPORARY", "build", "build_boxed", "build_problem", "build_saved", "default_flags",
           "identity_source", "python_flags", "recorded", "remembering", "remove_stale", "torch_identity"]


@dataclass(frozen=True)
class Library:
    """What a build gives: the library, and whether it was compiled now. What it is (its build key, torch,
    digest) is its record's to say: ``runtime.artifact_at`` reads it into the one ``Artifact``."""

    path: str  # the shared library
    directory: str
    ops: tuple[str, ...]  # the ops it was built for
    built: bool  # False when the cache already had it


def _builds_root(root: str | None) -> Dir:
    """The checked directory builds go in (created private; nothing is compiled for, or written into,
    a directory another account could write)."""
    if root is None:
        return subdir("builds")
    try:
        return open_dir(root, cache_refusal(root), create=True)
    except InputError as e:  # could not be made (what this machine lacks, EnvironmentProblem, goes on)
        raise _not_writable(root, e.cause or e.message) from None


def _not_writable(root: str, why: str) -> InputError:
    return InputError(root, None, f"build directory is not writable: {why}",
                      f"set {cache_root.ENV} to a cache of your own (a directory you can write)")


def build(files: dict[str, bytes], ops: list[str], shards: int, *, flags: tuple[str, ...] | None = None,
          root: str | None = None, verbose: bool = False, log=None, sources: list[str] | None = None,
          prefix: str = LIB_PREFIX, links: tuple[str, ...] = (), what: str = "the generated kernels",
          compile: bool = True) -> Library:
    """Compile ``files`` (as rendered by render.render) unless the cache has them (``compile`` False: the
    cache's build or an InputError, nothing compiled).
    ``sources``: the files to compile (default: the plan's shards and registration); ``log``: where
    the build says what it does (default: ``sys.stderr`` as it is at the call, never at import);
    ``links``: more link flags (part of the key, as every flag); ``what``: how a compiler error names them."""
    log = sys.stderr if log is None else log
    require_torch("building the kernels")

    compiler = compiler_path()
    flags = default_flags() if flags is None else flags
    key = build_key(files, flags + tuple(links), compiler)
    final = f"build-{key[:24]}"
    name = f"{prefix}_{key[:12]}"
    with _builds_root(root) as builds:
        lib = Library(builds.join(final, f"{name}.so"), builds.join(final), tuple(ops), False)
        if complete(builds, final, key, lib.path):
            return lib
        if not compile:
            raise InputError(None, None, f"{what} are not built, and building was ruled out")
        failed = failure_name(key, driver_path())  # this build in this toolchain, failed before?
        _not_again(failed, what)
        check_compiler_runs(compiler)
        ninja = ninja_path()  # said before "compiling ... with ninja", never after
        with contextlib.ExitStack() as held:
            try:  # a concurrent build of the key waits here
                held.enter_context(builds.lock(f"{final}.lock",
                                               wait_note=f"waiting for another build of {lib.directory}"))
            except EnvironmentProblem as e:
                if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                    raise _not_writable(builds.path, e.cause or e.message) from None
                raise
            if complete(builds, final, key, lib.path):
                return lib
            _not_again(failed, what)  # the build this one waited for failed
            remove_stale(builds)
            from ...codegen import compiled_sources  # the compile path's modules (see _COMPILE_PARTS)
            from .make import compile_into

            try:
                compile_into(builds, files, sources or compiled_sources(shards), flags, name, key, final, compiler,
                             ninja, verbose, log, links, what)
            except InputError as e:  # the compiler said no (its last error line is the cause)
                remember(failed, compiler, e.cause or e.summary())
                raise
    return dataclasses.replace(lib, built=True)


def _not_again(failed: str, what: str) -> None:
    """The remembered failure of this build in this toolchain, raised (where builds are ``remembering``)."""
    error = remembered(failed, what)
    if error is not None:
        raise error


def build_boxed(root: str | None = None, verbose: bool = False, log=None) -> Library:
    """The boxed kernel library (for operators outside native_functions.yaml)."""
    from ...codegen import render_boxed

    return build(render_boxed(), [], 0, root=root, verbose=verbose, log=log, sources=["BoxedADInplaceOrView.cpp"],
                 prefix="torchgen_patch_boxed")


def build_saved(root: str | None = None, verbose: bool = False, log=None, compile: bool = True) -> Library:
    """The saved-tensor check's native hooks (a library that is a Python extension, built as any other;
    ``compile`` False: the cache's build only)."""
    from ...codegen.render import SAVED_UNIT, render_saved

    cflags, links = python_flags()
    return build(render_saved(), [], 0, flags=default_flags() + cflags, root=root, verbose=verbose, log=log,
                 sources=[SAVED_UNIT], prefix="torchgen_patch_saved", links=links,
                 what="the saved-tensor check's native hooks", compile=compile)
