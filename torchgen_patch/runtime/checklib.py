"""The saved-tensor check's native hooks: built once per torch like the kernels (``build.build_saved``,
cached by content), loaded by the same trust rules (the checked descriptor, the library's statement of
its own build), then handed to the check (``saved.native.use``). Where they cannot be had (no compiler,
no Python headers, a library that must not be loaded), the check runs on its Python path and says why.

The CUDA fingerprint kernel is compiled in the process at its first CUDA tensor, by the NVRTC library
torch's CUDA build ships with (or the CUDA toolkit's); where there is none, CUDA tensors are read by
torch's ops."""

from __future__ import annotations

import ctypes
import glob
import os
import stat

from ..errors import EnvironmentProblem, InputError, ToolError, require_torch

SYMBOL = "torchgen_patch_saved_module"
_LOADED: dict = {}  # the library's path -> its module, once per process


def prepare(path: str | None = None, library: str | None = None, build: bool = True, log=None) -> str | None:
    """Load the native hooks for the check unless ``path`` (or $TORCHGEN_PATCH_CHECK_PATH) asks for the
    Python one; ``library``: a build of them made already (a launcher's), checked and never rebuilt;
    ``build``: compile them where the cache lacks them. Returns why they are not used (None: they are)."""
    from ..saved import native

    if native.chosen(path) == "python":
        return "the Python path was asked for"
    if native.loaded():
        return None
    try:
        module = load(library) if library else _prebuilt_or_built(build, log)
    except (EnvironmentProblem, InputError) as e:
        why = e.summary()  # one line: a compiler's output is its last error line
        native.unavailable(why)
        if native.chosen(path) == "native":
            raise
        return why
    native.use(module, _kernel_source(), nvrtc() if _cuda_built() else "")
    return None


def _cuda_built() -> bool:
    return bool(require_torch("the saved-tensor check").version.cuda)


def _prebuilt_or_built(build: bool, log):
    """The native hooks of the installed prebuilt wheel, else the cache's build (compiled now where it lacks
    them and ``build``, unless that build failed in this toolchain within the hour: ``remembering``). Where
    neither can be had, the error says why the wheel's copy was refused too (as the kernels' does)."""
    from .compile import remembering

    module, refused = _prebuilt()
    if module is not None:
        return module
    try:
        with remembering():
            return load(built(build, log))
    except ToolError as e:
        if refused is None:
            raise
        message = f"{e.summary()}; the installed prebuilt copy was not used: {refused}"
        raise (EnvironmentProblem(message, e.hint) if isinstance(e, EnvironmentProblem) else
               InputError(e.path, e.line, message, e.hint)) from None


def _prebuilt():
    """(The native hooks of the installed prebuilt wheel, made for exactly this torch, loaded; None where it
    holds none that fit), and why a copy it holds was refused (None: none was)."""
    from .prebuilt import saved_library

    found, refused = saved_library()
    if found is None:
        return None, refused
    path, sha256, root, key = found
    return _module(path, lambda: _load(path, sha256, root, key)), None


def saved_build(verbose: bool = False, log=None):
    """The cached build of the native hooks (compiled now when missing) as a checked Artifact: what the
    prebuilt wheel packs beside the kernels."""
    from . import artifact_at
    from .compile import build_saved

    return artifact_at(build_saved(verbose=verbose, log=log).path, manifest=False)


def ready(verbose: bool = False, log=None) -> tuple[str, str | None]:
    """Where the native hooks come from, made ready now (for `enable`), in words, and the cache's build that
    the environment's processes load (None: the prebuilt wheel's copy, which each finds itself); compiled
    now where the cache lacks one (a failure is remembered: ``build.remember``)."""
    from .compile import build_saved
    from .prebuilt import saved_library

    found, _ = saved_library()
    if found is not None:
        return "from the prebuilt wheel", None
    lib = build_saved(verbose=verbose, log=log)
    return "built now" if lib.built else "from the cached build", lib.path


def built(build: bool = True, log=None) -> str:
    """The path of the cached build of the native hooks (compiled now when missing and ``build``; else the
    cache's build, or an InputError that says they are not built)."""
    from .compile import build_saved

    return build_saved(log=log, compile=build).path


def load(library: str):
    """The module of the native hooks at ``library``, a build of them (checked as every library this tool
    loads)."""
    from .load.loader import load_built

    return _module(library, lambda: load_built(library))


def _load(path: str, sha256: str, root: str, key: str | None):
    from .load.loader import load as load_checked

    return load_checked(path, sha256, root, key)


def _module(library: str, open_library):
    """The module the library at ``library`` makes (``open_library``: its checked load), once per process."""
    module = _LOADED.get(library)
    if module is None:
        dll = open_library()
        try:
            make = ctypes.PYFUNCTYPE(ctypes.py_object)((SYMBOL, dll))
        except AttributeError:
            raise EnvironmentProblem(f"{library} is a build of torchgen-patch, but not of the saved-tensor check's "
                                     f"native hooks (it has no {SYMBOL})") from None
        module = _LOADED[library] = make()
    return module


def _kernel_source() -> str:
    from ..codegen import saved_kernel_source

    return saved_kernel_source()


_NVRTC: list = []  # the descriptor the NVRTC library is loaded from (kept open for the process)


def nvrtc() -> str:
    """The NVRTC library for this torch's CUDA (its major version): the one beside torch (its wheels'
    ``nvidia`` packages, or torch/lib), else the CUDA toolkit's; opened through the trust checks (its
    directories and the file owned by a trusted account, writable by nobody else) and named by its
    descriptor, so what is loaded is what was checked. "" where torch has no CUDA or none is usable."""
    from ..fs.load import loadable
    from .load import trust

    torch = require_torch("the saved-tensor check")
    version = torch.version.cuda
    if not version:
        return ""
    if _NVRTC:
        return loadable(_NVRTC[0]) or ""
    major = version.split(".")[0]
    site = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    patterns = [os.path.join(site, "nvidia", "*", "lib", f"libnvrtc.so.{major}*"),
                os.path.join(site, "nvidia", "*", "lib", "libnvrtc.so*"),
                os.path.join(os.path.dirname(torch.__file__), "lib", "libnvrtc*.so*"),
                os.path.join(home, "lib64", f"libnvrtc.so.{major}*"), os.path.join(home, "lib64", "libnvrtc.so")]
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            if "builtins" in os.path.basename(path):
                continue
            try:
                fd = trust.open_library(path, os.path.dirname(path))
            except EnvironmentProblem:
                continue
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                continue
            _NVRTC.append(fd)
            return loadable(fd) or ""
    return ""
