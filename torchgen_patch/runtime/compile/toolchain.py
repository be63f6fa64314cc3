"""The toolchain a build uses: the C++ compiler and ninja found (and made to answer before anything
is written), the PATH the compiler's driver runs with (where it finds the assembler and the linker:
the PATH the compiler was found on), and the flags of a library torch loads, as torch's own extension
builds make them.

All of it comes from the environment ($CXX, $PATH, $TORCHGEN_PATCH_EXTRA_CFLAGS; no PATH at all: the
system's default one, as ``shutil.which`` searches), except in an enabled environment's process started
with a cleared environment (no PATH): it uses the toolchain `enable` ran with (``recorded``), so it
builds, and finds the builds, as `enable` did."""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

from ...errors import EnvironmentProblem, require_torch

# Never -Werror here: a newer compiler's new warning must not break a user's install. The
# project's own tests add it through TORCHGEN_PATCH_EXTRA_CFLAGS (tests/conftest.py).
CFLAGS = ("-O2", "-Wall", "-Wno-unused-function")


@dataclass(frozen=True)
class Compiler:
    """A toolchain as `enable` records it: the C++ compiler (an absolute path), the PATH its driver runs
    with, and the extra flags ($TORCHGEN_PATCH_EXTRA_CFLAGS's words)."""

    cxx: str
    path: str
    extra_flags: tuple[str, ...]

    def table(self) -> dict[str, str]:
        """Its form in a launch spec (a table of strings)."""
        return {"cxx": self.cxx, "path": self.path, "cflags": " ".join(self.extra_flags)}

    @classmethod
    def from_table(cls, table: dict[str, str] | None) -> Compiler | None:
        """The toolchain a launch spec's table records (None: none, or not one this tool wrote)."""
        if not table or set(table) != {"cxx", "path", "cflags"} or not os.path.isabs(table["cxx"]):
            return None
        return cls(table["cxx"], table["path"], tuple(table["cflags"].split()))


_RECORDED: contextvars.ContextVar[Compiler | None] = contextvars.ContextVar("torchgen_patch_toolchain", default=None)


@contextlib.contextmanager
def recorded(table: dict[str, str] | None):
    """While the block runs, builds use the toolchain ``table`` records (an enabled environment's) where
    this process's environment has no PATH (a cleared one: it names no toolchain of its own) and the
    recorded compiler is still an executable file; else (None, a PATH of its own, the compiler gone) the
    environment's own."""
    found = None if "PATH" in os.environ else Compiler.from_table(table)
    if found is not None and not (os.path.isfile(found.cxx) and os.access(found.cxx, os.X_OK)):
        found = None
    token = _RECORDED.set(found)
    try:
        yield
    finally:
        _RECORDED.reset(token)


def here() -> Compiler | None:
    """The environment's own toolchain, for `enable` to record (None: no compiler found)."""
    path = _environment_path()
    cxx = shutil.which(os.environ.get("CXX", "c++"), path=path)
    if cxx is None:
        return None
    return Compiler(os.path.abspath(cxx), path, tuple(os.environ.get("TORCHGEN_PATCH_EXTRA_CFLAGS", "").split()))


def _environment_path() -> str:
    """$PATH, or where there is none the system's default search path (``shutil.which``'s)."""
    path = os.environ.get("PATH")
    if path is not None:
        return path
    try:
        return os.confstr("CS_PATH") or os.defpath
    except (AttributeError, ValueError):
        return os.defpath


def driver_path() -> str:
    """The PATH the compiler's driver runs with: the one the compiler was found on."""
    found = _RECORDED.get()
    return found.path if found is not None else _environment_path()


def driver_env() -> dict[str, str]:
    """The environment a compile runs in: this process's, with the driver's PATH."""
    return dict(os.environ, PATH=driver_path())


def default_flags() -> tuple[str, ...]:
    """CFLAGS plus the words of $TORCHGEN_PATCH_EXTRA_CFLAGS, or the recorded toolchain's (part of the
    cache key, like every flag)."""
    found = _RECORDED.get()
    if found is not None:
        return CFLAGS + found.extra_flags
    return CFLAGS + tuple(os.environ.get("TORCHGEN_PATCH_EXTRA_CFLAGS", "").split())


def compiler_path() -> str:
    """The C++ compiler: the recorded toolchain's, else $CXX (or c++) on PATH."""
    found = _RECORDED.get()
    if found is not None:
        return found.cxx
    cxx = os.environ.get("CXX", "c++")
    path = shutil.which(cxx, path=_environment_path())
    if path is None:
        raise EnvironmentProblem(f"no C++ compiler: '{cxx}' is not on PATH",
                         "install g++ (or set CXX), or use --backend python (install(backend='python') in Python)")
    return path


def check_compiler_runs(path: str) -> None:
    """Before anything is compiled or written: the compiler answers ``--version``."""
    cxx = os.environ.get("CXX", "c++")
    try:
        r = subprocess.run([path, "--version"], capture_output=True, timeout=60, stdin=subprocess.DEVNULL,
                           env=driver_env())
    except (OSError, subprocess.SubprocessError) as e:
        raise EnvironmentProblem(f"the C++ compiler {path} does not run: {e}",
                                 "install g++ (or set CXX), or use install(backend='python')") from None
    if r.returncode != 0:
        raise EnvironmentProblem(f"the C++ compiler {path} does not run: '{cxx} --version' exits {r.returncode}",
                                 "install g++ (or set CXX), or use install(backend='python')")


def ninja_path() -> str:
    """The ninja to build with: on PATH, else the one pip put beside this Python."""
    found = shutil.which("ninja", path=driver_path()) or shutil.which("ninja", path=os.path.dirname(sys.executable))
    if found is None:
        raise EnvironmentProblem("ninja is not installed (the kernels are built with it)", "pip install ninja")
    return found


def _std(cpp_extension) -> str:
    """The C++ standard this torch's own extension builds use (C++17 up to some release, C++20 after)."""
    import inspect

    try:
        text = inspect.getsource(cpp_extension._write_ninja_file_to_build_library)
    except (AttributeError, OSError, TypeError):
        text = ""
    m = re.search(r"-std=c\+\+(\d+)", text)
    return f"-std=c++{m.group(1) if m else '17'}"


def toolchain_flags() -> tuple[list[str], list[str]]:
    """(compile flags, link flags) for a library that torch loads, as torch's extension builds make
    them: torch's headers as system headers, its C++ ABI, position-independent code, its libraries."""
    torch = require_torch("building the kernels")
    from torch.utils import cpp_extension

    includes = [x for p in cpp_extension.include_paths() for x in ("-isystem", p)]
    cflags = [f"-D_GLIBCXX_USE_CXX11_ABI={int(bool(torch.compiled_with_cxx11_abi()))}", *includes, "-Isrc",
              "-fPIC", _std(cpp_extension)]
    ldflags = ["-shared", *[f"-L{p}" for p in cpp_extension.library_paths()], "-lc10", "-ltorch_cpu", "-ltorch"]
    return cflags, ldflags


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
