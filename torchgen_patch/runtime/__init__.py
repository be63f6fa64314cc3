"""Runtime: build the generated kernels against the running torch, install them
into its dispatcher (C++ or Python backend), and read its live registry. Three parts,
each with one entry point: build (``build.build``), load (``load.register``) and launch
(``launch.prepare``, then ``launch.run_program``).

``library(opts)`` is the one composer of this stage: plan → render → build (or the
installed prebuilt kernels, or the cache) → the checked ``Artifact``, the value every
command and the Python API register from. Nothing else sequences those steps."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from ..errors import EnvironmentProblem, InputError, ToolError
from ..fs.decode import loads
from ..sources import Options

__all__ = ["Artifact", "library", "artifact_at", "build_there"]


@dataclass(frozen=True)
class Artifact:
    """A library of kernels for one torch: what it is, what it holds, and where it came from."""

    path: str  # the shared library
    sha256: str | None  # recorded when it was built (None: not, and not loaded); checked again on the descriptor
    torch: str  # the torch version it was built for
    kernels: tuple[tuple[str, str], ...]  # (op, schema) of every kernel in it
    origin: str  # "prebuilt" (an installed kernels wheel) | "cache" | "build" (compiled now) | "given"
    root: str  # where the strict trust rule starts (the cache root, the wheel's package, the library's folder)
    manifest: dict  # the plan it was generated from (codegen's manifest)
    prebuilt: str | None = None  # the prebuilt kernels' version, for origin "prebuilt"
    prebuilt_unused: str | None = None  # why installed prebuilt kernels were not used, if any
    key: str | None = None  # the build key its record names, which the loaded library must state

    @property
    def ops(self) -> list[str]:
        return [op for op, _ in self.kernels]

    @property
    def directory(self) -> str:
        return os.path.dirname(self.path)

    def to_json(self) -> dict:
        """What a launcher hands to another process: the path and the digest to check it by."""
        return {"path": self.path, "sha256": self.sha256, "torch": self.torch, "origin": self.origin}


def library(opts: Options, *, plan=None, shards: int = 2, build: bool = True, prebuilt: bool = True,
            verbose: bool = False, log=None) -> Artifact:
    """The library of ``opts``'s kernels for the running torch: the installed prebuilt kernels when
    they fit exactly (``prebuilt``), else the cached build of ``plan`` (made from ``opts`` when not
    given), compiled now when the cache lacks it (unless ``build=False``: InputError). A launcher
    may call this in a process of its own: ``Artifact.path`` and ``.sha256`` are what it hands on."""
    unused = None
    if prebuilt:
        from .prebuilt import DIST, lookup

        found, unused = lookup(opts)
        if found is not None:
            return Artifact(found.library, found.sha256, found.record["torch"]["version"],
                            tuple(found.kernels()), "prebuilt", found.root, found.record["plan"], found.version,
                            key=found.record.get("key"))
        if not build:
            raise InputError(None, None, f"no usable prebuilt kernels: {unused or DIST + ' is not installed'}; "
                                         "and building was ruled out (build=False, --no-build)",
                             f"pip install the {DIST} wheel made for this torch (`torchgen-patch wheel`)")
    index = None
    try:
        if plan is None and not opts.no_cache:  # the no-change rebuild: keyed on the inputs, nothing rendered
            index = f"library-{_inputs_key(opts, shards)[:32]}.json"
            hit = _indexed(index)
            if hit is not None:
                return dataclasses.replace(hit, prebuilt_unused=unused)
        if plan is None:
            from ..pipeline import plan as make

            _, plan = make(opts)
        from ..codegen import render
        from .compile import build as compile_library

        lib = compile_library(render(plan, shards), plan.ops(), shards, verbose=verbose, log=log)
    except EnvironmentProblem as e:  # no compiler, say: the prebuilt kernels' reason is the useful part
        if unused is None:
            raise
        raise EnvironmentProblem(f"{e.message}; the installed prebuilt kernels were not used: {unused}",
                                 e.hint) from None
    art = artifact_at(lib.path, "build" if lib.built else "cache")
    if index is not None:
        from .. import cache

        cache.write(index, {"library": art.path})
    return dataclasses.replace(art, prebuilt_unused=unused)


def _inputs_key(opts: Options, shards: int) -> str:
    """Everything that decides the library of ``opts``: the scan's key (yaml, toolchain, this tool's
    source), the overlay, the templates and plain sources (``template_files``), the shards, and the
    build's flags, compiler and torch."""
    from ..codegen.render import template_files
    from ..errors import require_torch
    from ..files import read_bytes
    from ..fs import root as cache_root
    from ..scan import key_of
    from ..sources import resolve
    from .compile.toolchain import compiler_path, default_flags

    torch = require_torch("building the kernels")
    src = resolve(opts)
    templates = [n.encode() + b"\0" + data for n, data in sorted(template_files().items())]
    overlay = read_bytes(src.overlay, "overlay") if src.overlay else b""
    return cache_root.key(key_of(src), overlay, *templates, str(shards), *default_flags(), compiler_path(),
                          torch.__version__, torch.__file__, f"requires_grad_check={opts.requires_grad_check}")


def _indexed(index: str) -> Artifact | None:
    """The cached build an index entry names, checked like any build (None: no entry, or a damaged one)."""
    from .. import cache

    data = cache.read(index)
    path = data.get("library") if isinstance(data, dict) else None
    if not isinstance(path, str) or not cache.names_a_build(path):
        if data is not None:
            cache.invalid(index, "it names no build of this cache")
        return None
    try:
        return artifact_at(path, "cache")
    except ToolError as e:  # an incomplete build: built again (a library that fails its checks is refused)
        cache.invalid(index, e.message)
        return None


def build_there(path) -> bool:
    """Whether ``path`` (a launch spec's, a cached verdict's) names a file of a build of this cache
    that is there now, looked at through the cache's checked directories, never by its name (whether
    it is a complete build for this torch is ``artifact_at``'s to say, where it is loaded)."""
    from .. import cache
    from ..fs.protected import Missing

    if not isinstance(path, str) or not cache.names_a_build(path):
        return False
    try:
        with cache.library_dir(path) as (d, _, name):
            return d.lstat(name) is not None
    except (Missing, ToolError, OSError):  # a directory gone, or one the checks refuse
        return False


def artifact_at(path: str, origin: str = "given", manifest: bool = True) -> Artifact:
    """The build of torchgen-patch at ``path``, its record and manifest read through the trust checks
    (owner, modes, no symlink followed: every directory from the cache root, or the library's own
    directory, down checked on its descriptor) and matched against the running torch.
    ``manifest`` False: a library without one (the boxed library)."""
    from .. import cache
    from ..codegen.render import MANIFEST
    from ..errors import require_torch
    from ..fs.protected import Missing
    from .compile import RECORD

    torch = require_torch("installing the kernels")
    path = os.path.abspath(path)
    try:
        with cache.library_dir(path) as (d, root, _):
            info = _checked_json(d, RECORD, path)
            if manifest:
                with _sub(d, "src", path) as src:
                    plan = _checked_json(src, MANIFEST, path)
            else:
                plan = {"kernels": []}
    except Missing as e:
        raise InputError(path, None, f"not a complete torchgen-patch build ({os.path.basename(str(e))} is "
                                     "missing)") from None
    if not isinstance(info, dict) or not isinstance(plan, dict):
        raise InputError(path, None, "not a complete torchgen-patch build (its record or manifest is no mapping)")
    if info.get("torch") != torch.__version__:
        raise InputError(path, None, f"built for torch {info.get('torch')}, this is torch {torch.__version__}",
                         "rebuild with `torchgen-patch build`")
    try:
        kernels = tuple((k["op"], k["schema"]) for k in plan.get("kernels", ()))
    except (KeyError, TypeError) as e:
        raise InputError(path, None, f"not a complete torchgen-patch build (its manifest lacks {e})") from None
    key = info.get("key") if isinstance(info.get("key"), str) else None
    return Artifact(path, info.get("sha256"), info["torch"], kernels, origin, root, plan, key=key)


def _sub(d, name: str, library: str):
    from ..fs.protected import Missing

    try:
        return d.sub(name)
    except Missing:
        raise InputError(library, None, f"not a complete torchgen-patch build ({name}/ is missing)") from None


def _checked_json(d, name: str, library: str):
    """The JSON of ``name`` in the checked directory ``d``: a regular file of a trusted owner that
    nobody else can write, opened without following a symlink."""
    from ..fs.protected import Missing

    try:
        data = d.read(name)
    except Missing:
        raise InputError(library, None, f"not a complete torchgen-patch build ({name} is missing)") from None
    except OSError as e:
        raise InputError(library, None, f"not a complete torchgen-patch build ({name}: {e.strerror})") from None
    try:
        return loads(data)
    except ValueError as e:
        raise InputError(library, None, f"not a complete torchgen-patch build ({name}: {e})") from None
