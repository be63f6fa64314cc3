"""The toolchain a build uses: the C++ compiler and ninja found (and made to answer before anything
is written), and the flags of a library torch loads, as torch's own extension builds make them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from ...errors import EnvironmentProblem, require_torch

# Never -Werror here: a newer compiler's new warning must not break a user's install. The
# project's own tests add it through TORCHGEN_PATCH_EXTRA_CFLAGS (tests/conftest.py).
CFLAGS = ("-O2", "-Wall", "-Wno-unused-function")


def default_flags() -> tuple[str, ...]:
    """CFLAGS plus the words of $TORCHGEN_PATCH_EXTRA_CFLAGS (part of the cache key, like every flag)."""
    return CFLAGS + tuple(os.environ.get("TORCHGEN_PATCH_EXTRA_CFLAGS", "").split())



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
