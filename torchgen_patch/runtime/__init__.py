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
from ..sources import Options
from ..vocabulary import Origin
from .compile.record import Manifest

__all__ = ["Artifact", "library", "artifact_at", "build_there"]


@dataclass(frozen=True)
class Artifact:
    """A library of kernels for one torch: what it is, what it holds, and where it came from. Its build key
    and SHA-256 are its record's (a build's ``build-info.json``, a prebuilt wheel's record): the one key the
    loaded library must state."""

    path: str  # the shared library
    sha256: str | None  # recorded when it was built (None: not, and not loaded); checked again on the descriptor
    torch: str  # the torch version it was built for
    manifest: Manifest  # the plan it was generated from (codegen's manifest): the (op, schema) of every kernel
    origin: Origin
    root: str  # where the strict trust rule starts (the cache root, the wheel's package, the library's folder)
    key: str | None = None  # the build key its record names, which the loaded library must state
    prebuilt: str | None = None  # the prebuilt kernels' version, for origin PREBUILT
    prebuilt_unused: str | None = None  # why installed prebuilt kernels were not used, if any

    def __post_init__(self) -> None:  # an origin given by its word ("cache", as before it was a type) is that one
        object.__setattr__(self, "origin", Origin.parse(self.origin))

    @property
    def kernels(self) -> tuple[tuple[str, str], ...]:
        """(op, schema) of every kernel in it."""
        return self.manifest.kernels

    @property
    def ops(self) -> list[str]:
        return [op for op, _ in self.kernels]

    @property
    def directory(self) -> str:
        return os.path.dirname(self.path)

    def to_json(self) -> dict:
        """What a launcher hands to another process: the path and the digest to check it by."""
        return {"path": self.path, "sha256": self.sha256, "torch": self.torch, "origin": self.origin.value}


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
            rec = found.record
            return Artifact(found.library, rec.sha256, str(rec.torch.version), rec.plan, Origin.PREBUILT, found.root,
                            key=rec.key, prebuilt=found.version)
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
    art = artifact_at(lib.path, Origin.BUILD if lib.built else Origin.CACHE)
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
        return artifact_at(path, Origin.CACHE)
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


def artifact_at(path: str, origin: Origin | str = Origin.GIVEN, manifest: bool = True) -> Artifact:
    """The build of torchgen-patch at ``path``, its record and manifest read through the trust checks
    (owner, modes, no symlink followed: every directory from the cache root, or the library's own
    directory, down checked on its descriptor) and matched against the running torch.
    ``manifest`` False: a library without one (the boxed library)."""
    from .. import cache
    from ..errors import require_torch
    from ..fs.protected import Missing
    from .compile.record import NO_MANIFEST, BuildRecord, incomplete

    torch = require_torch("installing the kernels")
    path = os.path.abspath(path)
    try:
        with cache.library_dir(path) as (d, root, _):
            record = BuildRecord.read(d, path)
            record.check_torch(path, torch.__version__)
            plan = NO_MANIFEST
            if manifest:
                try:
                    src = d.sub("src")
                except Missing:
                    raise incomplete(path, "src/ is missing") from None
                with src:
                    plan = Manifest.read(src, path)
    except Missing as e:
        raise incomplete(path, f"{os.path.basename(str(e))} is missing") from None
    return Artifact(path, record.sha256, torch.__version__, plan, Origin.parse(origin), root, key=record.key)
