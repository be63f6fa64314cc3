"""Runtime: build the generated kernels against the running torch, install them
into its dispatcher (C++ or Python backend), and read its live registry.

``library(opts)`` is the one composer of this stage: plan → render → build (or the
installed prebuilt kernels, or the cache) → the checked ``Artifact``, the value every
command and the Python API register from. Nothing else sequences those steps."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from dataclasses import dataclass

from ..errors import EnvironmentProblem, InputError
from ..sources import Options

__all__ = ["Artifact", "library", "artifact_at"]


@dataclass(frozen=True)
class Artifact:
    """A library of kernels for one torch: what it is, what it holds, and where it came from."""

    path: str  # the shared library
    sha256: str  # recorded when it was built; checked again on the descriptor that is loaded
    torch: str  # the torch version it was built for
    kernels: tuple[tuple[str, str], ...]  # (op, schema) of every kernel in it
    origin: str  # "prebuilt" (an installed kernels wheel) | "cache" | "build" (compiled now) | "given"
    root: str  # where the strict trust rule starts (the cache root, the wheel's package, the library's folder)
    manifest: dict  # the plan it was generated from (codegen's manifest)
    prebuilt: str | None = None  # the prebuilt kernels' version, for origin "prebuilt"
    prebuilt_unused: str | None = None  # why installed prebuilt kernels were not used, if any

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
                            tuple(found.kernels()), "prebuilt", found.root, found.record["plan"], found.version)
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
        from .build import build as compile_library

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
    source), the overlay, the templates, the shards, and the build's flags, compiler and torch."""
    from .. import cache
    from ..codegen.render import templates_dir
    from ..errors import require_torch
    from ..files import read_bytes
    from ..scan import key_of
    from ..sources import resolve
    from .build import _compiler, default_flags

    torch = require_torch("building the kernels")
    src = resolve(opts)
    d = templates_dir()
    templates = [n.encode() + b"\0" + read_bytes(os.path.join(d, n), "template") for n in sorted(os.listdir(d))
                 if n.endswith(".j2")]
    overlay = read_bytes(src.overlay, "overlay") if src.overlay else b""
    return cache.key(key_of(src), overlay, *templates, str(shards), *default_flags(), _compiler(), torch.__version__,
                     torch.__file__, f"requires_grad_check={opts.requires_grad_check}")


def _indexed(index: str) -> Artifact | None:
    """The cached build an index entry names, checked like any build (None: no entry, or a damaged one)."""
    from .. import cache

    data = cache.read(index)
    path = data.get("library") if isinstance(data, dict) else None
    builds = os.path.join(cache.directory(), "builds") + os.sep
    if not isinstance(path, str) or os.path.normpath(path) != path or not path.startswith(builds) \
            or not os.path.isfile(path):
        if data is not None:
            cache.invalid(index, "it names no build of this cache")
        return None
    try:
        return artifact_at(path, "cache")
    except InputError as e:  # an incomplete build: built again (a library that fails its checks is refused)
        cache.invalid(index, e.message)
        return None


def artifact_at(path: str, origin: str = "given") -> Artifact:
    """The build of torchgen-patch at ``path``, its record and manifest read through the trust checks
    (owner, modes, no symlink followed: trust.py) and matched against the running torch."""
    from ..codegen.render import MANIFEST
    from ..errors import require_torch
    from .build import RECORD

    torch = require_torch("installing the kernels")
    d = os.path.dirname(os.path.abspath(path))
    root = _root_of(d)
    info = _checked_json(os.path.join(d, RECORD), root, path)
    manifest = _checked_json(os.path.join(d, "src", MANIFEST), root, path)
    if not isinstance(info, dict) or not isinstance(manifest, dict):
        raise InputError(path, None, "not a complete torchgen-patch build (its record or manifest is no mapping)")
    if info.get("torch") != torch.__version__:
        raise InputError(path, None, f"built for torch {info.get('torch')}, this is torch {torch.__version__}",
                         "rebuild with `torchgen-patch build`")
    try:
        kernels = tuple((k["op"], k["schema"]) for k in manifest.get("kernels", ()))
    except (KeyError, TypeError) as e:
        raise InputError(path, None, f"not a complete torchgen-patch build (its manifest lacks {e})") from None
    return Artifact(path, info.get("sha256"), info["torch"], kernels, origin, root, manifest)


def _root_of(d: str) -> str:
    """Where the strict trust rule starts for a library in ``d``: the cache root when it is inside it."""
    from ..cache import directory, inside

    cache = os.path.realpath(directory())
    return cache if inside(os.path.realpath(d), cache) else d


def _checked_json(path: str, root: str, library: str):
    """The JSON in ``path``, read from a descriptor opened without following symlinks and checked
    like the library (owner, modes, every directory from ``root`` down)."""
    from . import trust

    try:
        fd = trust.open_library(path, root, library)
    except EnvironmentProblem as e:
        if e.message.startswith(("cannot check", "cannot open")):
            raise InputError(library, None, f"not a complete torchgen-patch build ({os.path.basename(path)} "
                                            "is missing)") from None
        raise
    try:
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise ValueError("not a regular file")
            return json.loads(fh.read())
    except (OSError, ValueError) as e:
        raise InputError(library, None, f"not a complete torchgen-patch build ({os.path.basename(path)}: "
                                        f"{e})") from None
